//! The allocator's policy: give memory back to the operating system.
//!
//! The daemon parses a declaration (tens of megabytes of transient values for 10,000
//! resources) and then idles for months. By default mimalloc commits arenas eagerly and keeps
//! freed pages for a second or more before purging them; for a long-lived agent on machines
//! people run their own work on, its resident size should be what it holds, not what it once
//! parsed. Measured with 10,000 resources: 64 MiB resident with the defaults, 36 MiB with the purge
//! delay at 0, 28 MiB with eager arena commit off as well (before the structures were made
//! compact and the content moved out of the heap). A command that exits in moments keeps
//! freed pages a little (10 ms) for reuse, but not for good: at 100,000 files what its threads
//! free and never reuse is most of its peak (`for_a_command`).

use libmimalloc_sys::{mi_option_set, mi_option_t};

// Positions in mimalloc's `mi_option_e` (the same in its v2 and v3 headers), which this
// version of libmimalloc-sys does not name; a unit test checks them by their defaults.
const ARENA_EAGER_COMMIT: mi_option_t = 4;
const PURGE_DELAY: mi_option_t = 15;

/// Every process's policy, set before `main` and before the first allocation (the binary puts
/// this in `.init_array`, which the C runtime runs before Rust's start-up allocates anything):
/// arenas are committed as they are used, not whole when reserved. Whether an arena is
/// committed eagerly is decided when it is reserved, so setting it later in `main` comes too
/// late for the first one, and an environment variable (`MIMALLOC_ARENA_EAGER_COMMIT=0`, which
/// the unit file used to set) makes the resident size depend on how the agent was started.
/// Measured with 10,000 resources: a steady `apply` peaks at 42 to 51 MiB instead of 72 to
/// 78, no slower; the daemon holds about 7 MiB less.
pub extern "C" fn before_main() {
    // SAFETY: setting an option is a plain store into mimalloc's option table, valid at any
    // time, before its own initialisation included (options are read lazily).
    unsafe { mi_option_set(ARENA_EAGER_COMMIT, 0) }
}

/// The daemon's policy: freed memory goes back to the operating system at once. Called first
/// thing in `main` for `run`.
pub fn for_the_daemon() {
    // SAFETY: as above.
    unsafe { mi_option_set(PURGE_DELAY, 0) }
}

/// Whether arenas are committed eagerly (mimalloc's `arena_eager_commit`: 0 off, 1 on, 2 when
/// the system overcommits), for the binary to check that `before_main` ran.
pub fn arena_eager_commit() -> std::ffi::c_long {
    // SAFETY: reading an option is a plain load from mimalloc's option table.
    unsafe { libmimalloc_sys::mi_option_get(ARENA_EAGER_COMMIT) }
}

/// A command's policy (`apply`, `plan`, `check`...): freed memory is purged 10 ms after it is
/// freed, not at once and not never. Purging at once, as the daemon does, made a steady `apply`
/// of 10,000 files 14 % slower: its freed pages were returned and faulted in again, zeroed by
/// the kernel, over and over (half of its samples under perf); a page reused within 10 ms is
/// never returned, and an apply's loop reuses them within microseconds. Never purging, as
/// commands did until then, kept every page any thread had freed: the declaration's text and
/// the store's, freed before the pass, and each validating thread's memory, which no other
/// thread reused. At 100,000 files a steady `apply` peaked at 415 MiB resident with a live heap
/// of 238 MB at most; with 10 ms, at 301 MiB (debug build, docs/memory.md). Do not set it back
/// to -1 without measuring the peak at 100,000.
pub fn for_a_command() {
    // SAFETY: as above.
    unsafe { mi_option_set(PURGE_DELAY, 10) }
}

/// This process's resident set in bytes, from `/proc/self/statm`; `None` where it cannot be read.
pub fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    let page = rustix::param::page_size() as u64;
    Some(pages * page)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn option(id: mi_option_t) -> std::ffi::c_long {
        // SAFETY: reading an option is a plain load from mimalloc's option table.
        unsafe { libmimalloc_sys::mi_option_get(id) }
    }

    #[test]
    fn the_option_positions_are_the_ones_meant() {
        // The defaults in the bundled mimalloc (v3, src/options.c): arena_eager_commit = 2,
        // purge_delay = 1000 ms. The test binary does not call `configure`, so they still hold.
        assert_eq!(option(ARENA_EAGER_COMMIT), 2);
        assert_eq!(option(PURGE_DELAY), 1000);
    }

    #[test]
    fn resident_memory_is_read_from_proc() {
        let before = resident_bytes().expect("/proc/self/statm is readable");
        let held = vec![1u8; 32 << 20];
        let after = resident_bytes().unwrap();
        assert!(after >= before + (30 << 20), "{before} then {after} with 32 MiB touched");
        drop(held);
    }
}
