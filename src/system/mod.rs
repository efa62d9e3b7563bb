//! The only code that touches the machine.
//!
//! Architecture Invariant: nothing outside `system` opens, writes, chmods, chowns or removes a
//! path, or runs a program. `clippy.toml` disallows the std functions that would, and this
//! module allows them for itself only. Appliers decide; `system` does.
#![allow(clippy::disallowed_methods, reason = "system/ is the one module that touches the machine")]

// Private to the crate, but for what a binary, a bench or a test outside it needs: the
// allocator's policy (main.rs), the container runtime's client and systemd's (benches and a
// test measure them directly). Everything else is reached through the appliers.
pub(crate) mod accounts;
pub(crate) mod command;
pub(crate) mod contents;
pub mod docker;
pub mod durable;
pub(crate) mod etcd;
pub(crate) mod firewall;
pub(crate) mod firewalld;
pub(crate) mod fs;
pub(crate) mod input;
pub(crate) mod journal;
pub(crate) mod keys;
#[allow(unsafe_code, reason = "the allocator's C interface; each block says why it is sound")]
pub mod memory;
pub(crate) mod packages;
pub(crate) mod strict;
pub mod systemd;
pub(crate) mod ufw;
pub(crate) mod users;

pub(crate) use contents::{ContentFile, ContentWriter, Place};
/// The etcd client, for what starts the fleet's tasks outside the crate (the hollow-node bench).
pub use etcd::{counts as etcd_counts, lease_patience, Counts as EtcdCounts, Etcd, TlsFiles};
#[cfg(test)]
pub(crate) use fs::Nanos;
pub(crate) use fs::{Fs, Meta, Sig, Staged};
pub(crate) use packages::Packages;
pub use systemd::Systemd;
pub(crate) use users::OwnerIds;

pub(crate) use input::{read_input, read_source, read_stdin, read_strict_source, stderr_is_journal};
pub(crate) use strict::Trusted;

/// Seconds since the Unix epoch by the wall clock; 0 for a clock set before 1970. The one
/// place the agent reads it for a timestamp (a record's `applied-at`, a status's `written_at`,
/// the health heartbeat).
pub fn unix_secs() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// Milliseconds since the epoch, 0 before it.
pub fn unix_millis() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The agent's soft limit on open descriptors (`RLIMIT_NOFILE`), which its work and its HTTP
/// connections share; 1,024 (the usual default) when it cannot be read. The daemon raises it
/// to the hard limit as it starts (`raise_descriptor_limit`); the unit file sets both
/// (`LimitNOFILE`).
pub fn descriptor_limit() -> u64 {
    nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).map_or(1024, |(soft, _)| soft)
}

/// Raises this process's soft limit on open descriptors to its hard limit, which any process
/// may do (docs/decisions.md, "The daemon raises its own descriptor limit"): `(soft before,
/// soft now, hard)`. A soft limit already at the hard one is left as it is.
pub fn raise_descriptor_limit() -> Result<(u64, u64, u64), nix::Error> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard)?;
    }
    let (now, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    Ok((soft, now, hard))
}

/// The inotify watches one user may hold, as this process is limited (the file watcher's
/// directories and the declaration watcher's count against it, with every other process of
/// the same user): the lower of its user namespace's `user.max_inotify_watches` and the
/// machine's `fs.inotify.max_user_watches` (the initial namespace's; a namespace between the
/// two, if any, is not visible from here). With the knob that sets it, as sysctl names it.
pub fn inotify_watch_limit() -> Option<(u64, &'static str)> {
    let read = |path: &str| std::fs::read_to_string(path).ok()?.trim().parse::<u64>().ok();
    let machine = read("/proc/sys/fs/inotify/max_user_watches").map(|n| (n, "fs.inotify.max_user_watches"));
    let namespace = read("/proc/sys/user/max_inotify_watches").map(|n| (n, "user.max_inotify_watches"));
    match (machine, namespace) {
        // In the initial namespace the two are the same variable: the machine's name is the one
        // an operator knows.
        (Some(m), Some(n)) if n.0 < m.0 => Some(n),
        (Some(m), _) => Some(m),
        (None, n) => n,
    }
}

/// Lowers the calling thread's scheduling priority by `by` nice steps, to 19 at most (Linux
/// keeps a nice value per thread: `setpriority` on a thread id changes that thread alone; a
/// lower priority needs no privilege, whatever the unit's `Nice=`). For work that must never
/// delay the reconciler when both want one of few cores (the attribution thread).
pub(crate) fn lower_this_threads_priority(by: i32) -> std::io::Result<()> {
    let tid = Some(rustix::thread::gettid());
    let now = rustix::process::getpriority_process(tid)?;
    rustix::process::setpriority_process(tid, (now + by).min(19))?;
    Ok(())
}

/// `d` spread by up to a fifth either way, at random: nodes woken together (a fleet-wide write,
/// an etcd member lost under all of them) do not re-read, nor retry, in step (issue 43).
pub fn jittered(d: std::time::Duration) -> std::time::Duration {
    d.mul_f64(0.8 + 0.4 * random())
}

/// A wait from nothing to `most`, at random: what a fleet woken together waits before a call
/// that every node makes (the confirmation's redial).
pub fn up_to(most: std::time::Duration) -> std::time::Duration {
    most.mul_f64(random())
}

/// A positive 63-bit number at random, different at each call: an id a client chooses for
/// etcd (a lease's, so that a grant whose answer was lost can be asked again as the same one).
pub fn random_id() -> i64 {
    use std::hash::BuildHasher as _;
    use std::sync::atomic::{AtomicU64, Ordering};
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |t| t.as_nanos());
    let state = std::collections::hash_map::RandomState::new();
    let id = state.hash_one((nanos, CALLS.fetch_add(1, Ordering::Relaxed), std::process::id()));
    // Never 0, which asks etcd to choose.
    ((id >> 1) as i64).max(1)
}

/// A number from 0 to 1, at random.
fn random() -> f64 {
    use std::hash::BuildHasher as _;
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |t| t.subsec_nanos());
    // The process's randomly keyed hasher: no generator needed for a spread.
    let r = std::collections::hash_map::RandomState::new().hash_one(nanos) % 1001;
    (r as f64) / 1000.0
}

/// A duration as a person reads it in a message: "90 s", "15 min", "1 h".
pub fn human(d: std::time::Duration) -> String {
    let secs = d.as_secs();
    if secs >= 3600 && secs % 3600 == 0 {
        format!("{} h", secs / 3600)
    } else if secs >= 60 && secs % 60 == 0 {
        format!("{} min", secs / 60)
    } else if secs >= 1 && d.subsec_millis() == 0 {
        format!("{secs} s")
    } else {
        format!("{} ms", d.as_millis())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_lowered_thread_alone_is_niced() {
        let before = rustix::process::getpriority_process(None).unwrap();
        let niced = std::thread::spawn(|| {
            super::lower_this_threads_priority(15).unwrap();
            super::lower_this_threads_priority(15).unwrap();
            rustix::process::getpriority_process(Some(rustix::thread::gettid())).unwrap()
        })
        .join()
        .unwrap();
        assert_eq!(niced, (before + 30).min(19), "the thread's own nice, 19 at most");
        assert_eq!(rustix::process::getpriority_process(None).unwrap(), before, "the others' unchanged");
    }

    use std::time::Duration;

    #[test]
    fn durations_read_as_a_person_writes_them() {
        assert_eq!(super::human(Duration::from_secs(3600)), "1 h");
        assert_eq!(super::human(Duration::from_secs(900)), "15 min");
        assert_eq!(super::human(Duration::from_secs(90)), "90 s");
        assert_eq!(super::human(Duration::from_secs(1)), "1 s");
        assert_eq!(super::human(Duration::from_millis(1500)), "1500 ms");
        assert_eq!(super::human(Duration::from_millis(300)), "300 ms");
    }

    #[test]
    fn a_wait_is_spread_by_a_fifth_either_way() {
        use super::{jittered, up_to};
        use std::time::Duration;
        const REREAD: Duration = Duration::from_secs(600);
        let spread: Vec<Duration> = (0..200).map(|_| jittered(REREAD)).collect();
        assert!(spread.iter().all(|d| *d >= REREAD.mul_f64(0.8) && *d <= REREAD.mul_f64(1.2)), "{spread:?}");
        let first = spread[0];
        assert!(spread.iter().any(|d| *d != first), "not all the same");
        let most = Duration::from_secs(5);
        let waits: Vec<Duration> = (0..200).map(|_| up_to(most)).collect();
        assert!(waits.iter().all(|d| *d <= most), "{waits:?}");
        assert!(waits.iter().any(|d| *d < most / 4) && waits.iter().any(|d| *d > most * 3 / 4), "{waits:?}");
    }
}
