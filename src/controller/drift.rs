//! Who made the drift, and what it was: each correction with the writer fanotify saw
//! (`mesh_host_watchers::writers`), kept in a bounded history beside the store
//! (`drift.jsonl`), written by a thread of its own so that the correction never waits for it.
//!
//! What changed is the outcome's words (`content`, `mode 0644 to 0600`) and, for a correction of
//! the content of a world-readable text file that carries no secret, a unified diff of the
//! hand-edit, bounded (`apply::HandEdit`). The diff is made under the same rule as `plan`'s
//! (`apply::file::hidden`): a secret-bearing or non-world-readable file's content never reaches
//! the history; its record says only why there is no diff.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use mesh_host_watchers::writers::{Writer, WriterKind};
use serde::{Deserialize, Serialize};

use crate::apply::HandEdit;

/// The most corrections the history keeps; older ones are dropped.
pub const KEPT: usize = 1000;
/// The most bytes of any one text field kept (a path, a command line, an outcome's words).
const FIELD: usize = 512;

/// Who made a change, as far as it is known.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Who {
    /// The kind of writer (the metric's label), written as its word: `session`, `unit`,
    /// `container` or `unknown`.
    #[serde(with = "kind_word")]
    pub by: WriterKind,
    /// The writer's pid, as the kernel gave it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pid: Option<i32>,
    /// Its command name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub comm: Option<String>,
    /// Its executable.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exe: Option<String>,
    /// Its effective uid.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// That uid's name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// The audit login uid.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loginuid: Option<u32>,
    /// The audit session id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session: Option<u32>,
    /// The systemd unit it ran in.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unit: Option<String>,
    /// The container it ran in: its name when the runtime gave it, else its id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    /// It had exited before it could be looked at.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub exited: bool,
    /// What the event said it changed: `content`, `attributes`, `entry`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub moved: Option<String>,
}

impl Who {
    /// No writer known: fanotify is not in use, or saw nothing for this change.
    pub fn unknown() -> Who {
        Who { by: WriterKind::Unknown, ..Who::default() }
    }

    /// What fanotify saw, with the container's name when it was found.
    pub fn from_writer(w: &Writer, container_name: Option<String>) -> Who {
        Who {
            by: w.kind(),
            pid: Some(w.pid),
            comm: w.comm.clone(),
            exe: w.exe.as_ref().map(|e| cap(&e.display().to_string())),
            uid: w.uid,
            user: w.user.clone(),
            loginuid: w.loginuid,
            session: w.session,
            unit: w.unit.clone(),
            container: container_name
                .or_else(|| w.container.as_ref().map(|id| id.chars().take(12).collect())),
            exited: w.exited,
            moved: Some(w.moved.as_str().into()),
        }
    }

    /// The words a report's detail and a log line say: `vim (pid 4242, user alice uid 1000,
    /// login uid 1000 session 3, in session-3.scope)`, `pid 4242, exited`, `unknown`.
    pub fn describe(&self) -> String {
        let Some(pid) = self.pid else { return "unknown".into() };
        let mut parts = vec![format!("pid {pid}")];
        if self.exited {
            parts.push("exited".into());
        }
        if let Some(exe) = &self.exe {
            parts.push(exe.clone());
        }
        match (&self.user, self.uid) {
            (Some(u), Some(uid)) => parts.push(format!("user {u} uid {uid}")),
            (None, Some(uid)) => parts.push(format!("uid {uid}")),
            _ => {}
        }
        if let Some(s) = self.session {
            match self.loginuid {
                Some(l) => parts.push(format!("login uid {l} session {s}")),
                None => parts.push(format!("session {s}")),
            }
        }
        if let Some(c) = &self.container {
            parts.push(format!("in container {c}"));
        } else if let Some(u) = &self.unit {
            parts.push(format!("in {u}"));
        }
        match &self.comm {
            Some(comm) => format!("{comm} ({})", parts.join(", ")),
            None => parts.join(", "),
        }
    }
}

/// One correction, as the history keeps it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Correction {
    /// When it was put back, in milliseconds since the epoch.
    pub at_ms: u64,
    /// The resource's id.
    pub id: String,
    /// The resource's type.
    #[serde(rename = "type")]
    pub kind: String,
    /// What it names on the machine (for a file, its path).
    pub target: String,
    /// What was found changed, in the outcome's words (never the content).
    pub changed: String,
    /// Who changed it.
    pub who: Who,
    /// From the change seen to its put back, when the daemon was woken for it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub put_back_ms: Option<f64>,
    /// For a correction of a file's content: a unified diff from the declared content (what was
    /// put back) to what the hand-edit left, at most `HandEdit::MAX` bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diff: Option<String>,
    /// For a correction of a file's content with no diff: why (`it carries a secret`, `the file
    /// on the machine is not world-readable, mode 0600`, too large, not text).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diff_omitted: Option<String>,
}

impl Correction {
    /// Keeps what a correction's hand-edit was, as the applier said it.
    pub fn with_edit(mut self, edit: Option<HandEdit>) -> Correction {
        match edit {
            Some(HandEdit::Diff(d)) => self.diff = Some(d),
            Some(HandEdit::Omitted(why)) => self.diff_omitted = Some(why),
            None => {}
        }
        self
    }

    /// Cuts every text field to a bounded size, so that a record is bounded too.
    pub fn bounded(mut self) -> Correction {
        for s in [&mut self.id, &mut self.target, &mut self.changed] {
            *s = cap(s);
        }
        // Bounded where it was made; cut again, in case a record came from elsewhere.
        for s in self.diff.iter_mut() {
            *s = cap_at(s, HandEdit::MAX + 64);
        }
        for s in self.diff_omitted.iter_mut() {
            *s = cap(s);
        }
        self
    }
}

fn cap(s: &str) -> String {
    cap_at(s, FIELD)
}

fn cap_at(s: &str, most: usize) -> String {
    if s.len() <= most {
        return s.to_owned();
    }
    let mut end = most;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// Milliseconds since the epoch as UTC, to the second: `2026-12-01T23:50:01Z`.
pub fn utc(at_ms: u64) -> String {
    let secs = at_ms / 1000;
    let (days, rest) = ((secs / 86400) as i64, secs % 86400);
    // Howard Hinnant's days-to-civil.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rest / 3600, rest / 60 % 60, rest % 60)
}

/// Where the history is kept: `drift.jsonl` beside the store.
pub fn path(state: &Path) -> PathBuf {
    crate::store::state_dir(state).join("drift.jsonl")
}

/// The corrections the history holds, oldest first. A line that does not parse (a torn
/// write cannot happen, the file is replaced whole; a newer agent's record can) is skipped.
pub fn read(state: &Path) -> std::io::Result<Vec<Correction>> {
    match std::fs::read_to_string(path(state)) {
        Ok(text) => Ok(text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// The history's writer: corrections are sent to a thread that keeps the last [`KEPT`] and
/// replaces the file with them at most once a second (atomic, durable, private), so a storm of
/// corrections costs one write a second, and the correction path only a send.
pub struct History {
    tx: Option<mpsc::Sender<Correction>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl History {
    /// Starts the writer, with what the file already holds.
    pub fn start(state: &Path) -> History {
        let file = path(state);
        let mut kept: VecDeque<Correction> = read(state).unwrap_or_default().into();
        while kept.len() > KEPT {
            kept.pop_front();
        }
        let (tx, rx) = mpsc::channel::<Correction>();
        let thread = std::thread::Builder::new()
            .name("drift-history".into())
            .spawn(move || {
                while let Ok(first) = rx.recv() {
                    let mut open = true;
                    push(&mut kept, first);
                    // Gathers what comes in the next second into the same write.
                    let until = std::time::Instant::now() + Duration::from_secs(1);
                    loop {
                        let left = until.saturating_duration_since(std::time::Instant::now());
                        match rx.recv_timeout(left) {
                            Ok(c) => push(&mut kept, c),
                            Err(mpsc::RecvTimeoutError::Timeout) => break,
                            Err(mpsc::RecvTimeoutError::Disconnected) => {
                                open = false;
                                break;
                            }
                        }
                    }
                    let mut text = String::new();
                    for c in &kept {
                        if let Ok(line) = serde_json::to_string(c) {
                            text.push_str(&line);
                            text.push('\n');
                        }
                    }
                    if let Err(e) = crate::system::fs::write_private(&file, text.as_bytes()) {
                        tracing::warn!(path = %file.display(), error = %e, "cannot write the drift history");
                    }
                    if !open {
                        break;
                    }
                }
            })
            .ok();
        History { tx: Some(tx), thread }
    }

    /// Keeps a correction; never blocks.
    pub fn add(&self, c: Correction) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(c.bounded());
        }
    }
}

impl Drop for History {
    /// What was sent is written before the agent exits.
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn push(kept: &mut VecDeque<Correction>, c: Correction) {
    kept.push_back(c);
    while kept.len() > KEPT {
        kept.pop_front();
    }
}

/// `Who::by` in the history: the kind's word, as the metric's label says it; a word not known
/// here (written by a later build) is read as `unknown`.
mod kind_word {
    use mesh_host_watchers::writers::WriterKind;
    use serde::{Deserialize as _, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(kind: &WriterKind, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(kind.as_str())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<WriterKind, D::Error> {
        let word = String::deserialize(d)?;
        Ok(WriterKind::named(&word).unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn correction(i: usize) -> Correction {
        Correction {
            at_ms: i as u64,
            id: format!("f{i}"),
            kind: "file".into(),
            target: "/etc/x".into(),
            changed: "content".into(),
            who: Who::unknown(),
            put_back_ms: Some(1.0),
            diff: None,
            diff_omitted: None,
        }
    }

    #[test]
    fn the_history_is_bounded_and_survives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state.json");
        {
            let h = History::start(&state);
            for i in 0..KEPT + 5 {
                h.add(correction(i));
            }
        }
        let got = read(&state).unwrap();
        assert_eq!(got.len(), KEPT);
        assert_eq!(got[0].id, "f5");
        {
            let h = History::start(&state);
            h.add(correction(9999));
        }
        let got = read(&state).unwrap();
        assert_eq!((got.len(), got.last().unwrap().id.as_str()), (KEPT, "f9999"));
    }

    #[test]
    fn times_are_said_in_utc() {
        assert_eq!(utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc(1_796_169_001_000), "2026-12-01T23:50:01Z");
    }

    #[test]
    fn a_writers_kind_is_kept_as_its_word() {
        let who = Who { by: WriterKind::Container, pid: Some(7), ..Who::default() };
        let json = serde_json::to_value(&who).unwrap();
        assert_eq!(json["by"], "container");
        assert_eq!(serde_json::from_value::<Who>(json).unwrap(), who);
        for kind in WriterKind::ALL {
            let read: Who = serde_json::from_str(&format!(r#"{{"by": "{}"}}"#, kind.as_str())).unwrap();
            assert_eq!(read.by, kind);
        }
        // A word this build does not know (a history written by a later one) reads as unknown.
        let read: Who = serde_json::from_str(r#"{"by": "robot"}"#).unwrap();
        assert_eq!(read.by, WriterKind::Unknown);
    }

    #[test]
    fn a_writer_is_said_in_words() {
        let who = Who {
            by: WriterKind::Session,
            pid: Some(7),
            comm: Some("vim".into()),
            uid: Some(1000),
            user: Some("alice".into()),
            session: Some(3),
            unit: Some("session-3.scope".into()),
            ..Who::default()
        };
        assert_eq!(who.describe(), "vim (pid 7, user alice uid 1000, session 3, in session-3.scope)");
        let who = Who { loginuid: Some(1000), ..who };
        assert_eq!(
            who.describe(),
            "vim (pid 7, user alice uid 1000, login uid 1000 session 3, in session-3.scope)"
        );
        assert_eq!(Who::unknown().describe(), "unknown");
    }
}
