//! The allocator's policy: give memory back to the operating system.
//!
//! The daemon parses a declaration (tens of megabytes of transient values for 10,000
//! resources) and then idles for months. By default mimalloc commits arenas eagerly and keeps
//! freed pages for a second or more before purging them; for a long-lived agent on machines
//! people run their own work on, its resident size should be what it holds, not what it once
//! parsed. Measured with 10,000 resources: 64 MiB resident with the defaults, 36 MiB with the purge
//! delay at 0, 28 MiB with eager arena commit off as well.

#[cfg(test)]
use libmimalloc_sys::mi_option_get;
use libmimalloc_sys::{mi_collect, mi_option_set, mi_option_t};

// Positions in mimalloc's `mi_option_e` (the same in its v2 and v3 headers), which this
// version of libmimalloc-sys does not name; a unit test checks them by their defaults.
const ARENA_EAGER_COMMIT: mi_option_t = 4;
const PURGE_DELAY: mi_option_t = 15;

/// Sets the policy. Called first thing in `main`. The purge delay takes effect from here; the
/// arena's eager commit is decided when the allocator starts, before `main`, so the unit file
/// also sets `MIMALLOC_ARENA_EAGER_COMMIT=0` (about 7 MiB less resident with 10,000 resources).
pub fn configure() {
    // SAFETY: setting an option is a plain store into mimalloc's option table, valid at any time.
    unsafe {
        mi_option_set(ARENA_EAGER_COMMIT, 0);
        mi_option_set(PURGE_DELAY, 0);
    }
}

/// Returns freed memory to the operating system now (after a full pass).
pub fn release() {
    // SAFETY: mi_collect only walks the allocator's own free lists; it takes no pointers and is
    // safe to call at any time from any thread.
    unsafe { mi_collect(true) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn option(id: mi_option_t) -> std::ffi::c_long {
        // SAFETY: reading an option is a plain load from mimalloc's option table.
        unsafe { mi_option_get(id) }
    }

    #[test]
    fn the_option_positions_are_the_ones_meant() {
        // The defaults in the bundled mimalloc (v3, src/options.c): arena_eager_commit = 2,
        // purge_delay = 1000 ms. The test binary does not call `configure`, so they still hold.
        assert_eq!(option(ARENA_EAGER_COMMIT), 2);
        assert_eq!(option(PURGE_DELAY), 1000);
    }
}
