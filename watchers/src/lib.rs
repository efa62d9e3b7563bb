//! Watchers: see the crate description.
