//! The confirmation window, durable (issue 42, hole 4): the open window is recorded in the
//! state directory (`<state dir>/fleet/window.json`), so that a generation not yet confirmed
//! does not survive a restart of the agent as if it were (an OOM kill, the watchdog, a reboot,
//! a candidate that restarts the agent).
//!
//! The order, as NixOS's `test` (not `switch`) and boot counting have it: the record is written
//! by the source before it writes the cache (so before the controller puts the new generation
//! in force and applies it), completed with the generation and the deadline when the window
//! arms, and removed once it is confirmed, cancelled, not armed after all, or gone back from.
//! An agent that starts and finds a record honours it (`resume`): past its deadline it goes
//! back at once; otherwise it watches the generation again for the time left. Why, and what it
//! does not cover: docs/decisions.md, "Confirm or go back".

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

/// The file's name, in the fleet's directory of the state directory (beside the cache).
pub const FILE: &str = "window.json";

/// The most bytes the record may have: it is a few dozen.
const LIMIT: u64 = 1 << 16;

/// An open window, as the state directory keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The etcd revision of the declaration it is for (read by the agent from etcd: the proof
    /// that etcd answered before the change).
    pub revision: i64,
    /// The generation gone back to.
    pub previous: u64,
    /// The new generation, once its pass ended and the window armed; `None` before.
    #[serde(default)]
    pub generation: Option<u64>,
    /// When the window closes, in seconds since the epoch (the wall clock: it must mean the
    /// same after a restart, or a reboot); `None` until it armed.
    #[serde(default)]
    pub deadline: Option<u64>,
    /// The rollout whose candidate the declaration is, if any.
    #[serde(default)]
    pub rollout: Option<String>,
}

/// The record's file, written by the source and by the confirmation task, one at a time.
#[derive(Debug)]
pub struct WindowFile {
    path: PathBuf,
    lock: Mutex<()>,
}

impl WindowFile {
    /// The file in the fleet's directory `dir` (`<state dir>/fleet`).
    pub fn in_dir(dir: &Path) -> WindowFile {
        WindowFile { path: dir.join(FILE), lock: Mutex::new(()) }
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The record, if there is one. One that cannot be read is said and taken as none (the
    /// agent then applies what it has, as before the record existed).
    pub fn load(&self) -> Option<Record> {
        let bytes = match crate::system::read_input(&self.path, LIMIT) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "cannot read the confirmation window's record; taken as none");
                return None;
            }
        };
        match serde_json::from_slice(&bytes) {
            Ok(record) => Some(record),
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "the confirmation window's record is not one; taken as none");
                None
            }
        }
    }

    /// Writes `record` in place of any, atomically and durably (temporary file, fsync, rename,
    /// fsync of the directory). Blocking.
    pub fn store(&self, record: &Record) -> Result<(), String> {
        let _one = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let bytes = serde_json::to_vec_pretty(record).map_err(|e| e.to_string())?;
        crate::system::fs::write_own(&self.path, &bytes).map_err(|e| {
            format!("cannot write the confirmation window's record {}: {e}", self.path.display())
        })
    }

    /// Removes the record if it is for revision `upto` or an earlier one (a later one was
    /// written since, for a declaration still on its way), durably. Blocking.
    pub fn clear(&self, upto: i64) -> Result<(), String> {
        let _one = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        if self.load().is_some_and(|r| r.revision > upto) {
            return Ok(());
        }
        crate::system::fs::remove_private_file(&self.path).map(|_| ()).map_err(|e| {
            format!("cannot remove the confirmation window's record {}: {e}", self.path.display())
        })
    }
}

/// A window recorded by an earlier run, to watch again: its generation's pass is to end (again)
/// in this run, and is then armed with the deadline it had.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Primed {
    /// The revision of the declaration it is for.
    pub revision: i64,
    /// The generation gone back to.
    pub previous: u64,
    /// The new generation, when the earlier run knew its number.
    pub generation: Option<u64>,
    /// The rollout whose candidate it is, if any.
    pub rollout: Option<String>,
    /// When it closes.
    pub deadline: Instant,
}

/// What an agent does at its start with the window it found recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resume {
    /// None recorded (or the window is off now): the generation in force is kept.
    Fresh,
    /// Its deadline passed unconfirmed: back to `previous` at once, from `generation`.
    GoBack {
        /// The record, as found.
        record: Record,
        /// The generation gone back from.
        generation: u64,
    },
    /// Still open: watched again for the time left. `record` is what to write back (its
    /// deadline set, when the earlier run had not armed it yet).
    Rearm {
        /// The window to watch.
        primed: Primed,
        /// The record, its deadline set.
        record: Record,
    },
}

/// The decision at start, pure: `record` as found, the generation `in_force` as the state
/// directory says it, the window's `length`, and the time (`wall` in seconds since the epoch,
/// `now` the monotonic clock's).
///
/// A record without a deadline is of an agent stopped before the window armed (its pass had not
/// ended): the window is counted from this start, once (the deadline is then written, so a
/// generation that kills the agent at each start is gone back from when it passes).
pub fn resume(
    record: Option<Record>,
    in_force: Option<u64>,
    length: Duration,
    wall: u64,
    now: Instant,
) -> Resume {
    let Some(mut record) = record else { return Resume::Fresh };
    if length.is_zero() {
        return Resume::Fresh;
    }
    let generation = record.generation.or(in_force.filter(|g| *g != record.previous));
    let deadline = record.deadline.unwrap_or_else(|| wall + length.as_secs().max(1));
    record.deadline = Some(deadline);
    if let (true, Some(generation)) = (deadline <= wall, generation) {
        return Resume::GoBack { record, generation };
    }
    let left = Duration::from_secs(deadline.saturating_sub(wall));
    let primed = Primed {
        revision: record.revision,
        previous: record.previous,
        generation,
        rollout: record.rollout.clone(),
        deadline: now + left,
    };
    Resume::Rearm { primed, record }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: Duration = Duration::from_secs(60);
    const WALL: u64 = 1_800_000_000;

    fn armed(deadline: u64) -> Record {
        Record { revision: 20, previous: 1, generation: Some(2), deadline: Some(deadline), rollout: None }
    }

    #[tokio::test(start_paused = true)]
    async fn a_window_whose_deadline_passed_while_the_agent_was_down_goes_back_at_once() {
        let now = Instant::now();
        for deadline in [WALL - 100, WALL] {
            assert_eq!(
                resume(Some(armed(deadline)), Some(2), W, WALL, now),
                Resume::GoBack { record: armed(deadline), generation: 2 }
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_window_still_open_is_watched_again_for_the_time_left() {
        let now = Instant::now();
        let Resume::Rearm { primed, record } = resume(Some(armed(WALL + 25)), Some(2), W, WALL, now) else {
            panic!("not re-armed")
        };
        assert_eq!(record, armed(WALL + 25), "written back as it was");
        assert_eq!((primed.revision, primed.previous, primed.generation), (20, 1, Some(2)));
        assert_eq!(primed.deadline, now + Duration::from_secs(25));
    }

    #[tokio::test(start_paused = true)]
    async fn a_window_not_armed_yet_is_counted_from_this_start_once() {
        let now = Instant::now();
        let written = Record { revision: 20, previous: 1, generation: None, deadline: None, rollout: None };
        // Stopped after the generation was put in force: its number is the one in force.
        let Resume::Rearm { primed, record } = resume(Some(written.clone()), Some(2), W, WALL, now) else {
            panic!("not re-armed")
        };
        assert_eq!(record.deadline, Some(WALL + 60), "the deadline is written, so it is counted once");
        assert_eq!((primed.generation, primed.deadline), (Some(2), now + W));
        // Stopped before: no number yet (the cache's declaration is put in force at this start).
        let Resume::Rearm { primed, .. } = resume(Some(written.clone()), Some(1), W, WALL, now) else {
            panic!("not re-armed")
        };
        assert_eq!(primed.generation, None);
        // The next start, past that deadline, goes back.
        assert!(matches!(
            resume(Some(record), Some(2), W, WALL + 61, now),
            Resume::GoBack { generation: 2, .. }
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn no_record_or_the_window_off_keeps_what_is_in_force() {
        let now = Instant::now();
        assert_eq!(resume(None, Some(2), W, WALL, now), Resume::Fresh);
        assert_eq!(resume(Some(armed(WALL - 1)), Some(2), Duration::ZERO, WALL, now), Resume::Fresh);
    }

    #[test]
    fn the_record_is_written_whole_and_cleared_only_up_to_its_revision() {
        let scratch = tempfile::tempdir().unwrap();
        let file = WindowFile::in_dir(scratch.path());
        assert_eq!(file.load(), None);
        file.store(&armed(WALL)).unwrap();
        assert_eq!(file.load(), Some(armed(WALL)));
        // A later declaration's record is not removed by the decision on an earlier one.
        file.clear(19).unwrap();
        assert_eq!(file.load(), Some(armed(WALL)));
        file.clear(20).unwrap();
        assert_eq!(file.load(), None);
        file.clear(20).unwrap();
    }
}
