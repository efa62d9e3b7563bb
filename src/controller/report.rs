//! What the worker tells of its reconciles: each outcome and failure an event (its log line and
//! its metrics together), the holds said once, the resource counts, and `Applied`, what the
//! node has applied, on a watch channel the fleet follows. `Report` owns that state.
//!
//! Who made each drift a correction put back is found on a thread of its own (`attribution`):
//! the correction's event, its line in the drift history and the fleet's `last_correction` are
//! finished there, after fanotify has said who wrote the path (it may take up to 50 ms to) and
//! the container runtime has named the container, so the next key never waits for either. The
//! thread mutes fanotify for a contested path too, in order after the takes before it, since a
//! mute keeps the writer last taken for its path (`mesh_host_watchers::writers::Taker`).

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use mesh_host_watchers::writers::Taker;
use tokio::sync::watch;

use super::drift;
use crate::apply::{self, Verb};
use crate::declaration::{Declaration, Kind};
use crate::telemetry::{events, Event as _, Metrics};

/// What a node has applied, as the worker last saw it: published on a watch channel
/// (`Report::applied`) only when it moves, for whoever reports it (the fleet's status writer).
/// Carries no secret: counts, and messages the report already logs (which never hold an opened
/// value).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// The names of the files of the declaration in force, as the source listed them.
    pub sources: Vec<String>,
    /// Whether the last full pass, and every reconcile since, succeeded.
    pub converged: bool,
    /// Each outcome word's count in the last full pass.
    pub counts: std::collections::BTreeMap<String, u64>,
    /// Drift put back since the node started.
    pub drift_corrections: u64,
    /// Read-backs that found someone else had written since the node started (contested keys).
    pub contested: u64,
    /// The last failure, until a full pass succeeds.
    pub last_error: Option<String>,
    /// The last correction since the node started, and who made the change it put back
    /// (`app.conf by vim (pid 7, ...)`): names, never content.
    pub last_correction: Option<String>,
    /// The generation in force (`mesh-host generations`), when it could be recorded.
    pub generation: Option<u64>,
    /// How a rollback holds the node (`held at generation N by rollback since T ...`), or
    /// `None` while it follows its source.
    pub hold: Option<String>,
    /// The hold, when the node made it itself (`Hold::reverted` is set): what it went back from
    /// and why. `None` under an operator's rollback and while it follows its source.
    pub reverted: Option<crate::generations::Hold>,
    /// Who signed the declaration in force, scope by scope; empty when it is unsigned or that
    /// is not known (`source::Loaded::signed`).
    pub signed: Vec<super::signed::InForce>,
}

/// The worker's tallies, and the thread that finishes its corrections (the module doc).
pub(super) struct Report {
    metrics: Arc<Metrics>,
    /// What the node has applied (a watch channel: a follower takes the latest at its own
    /// pace, the fleet's status writer at most once a second). Updated only when it moves, so
    /// a quiet node wakes no one. Shared with the attribution thread, which sets
    /// `last_correction`.
    applied: Arc<watch::Sender<Applied>>,
    /// The ids the last full pass (and the reconciles since) reported `held`: a hold is logged
    /// when it begins and when it ends, not at every pass (10,000 held files must not write
    /// 10,000 lines at every resync).
    held: HashSet<String>,
    /// To the attribution thread; `None` once it was told to finish.
    tx: Option<mpsc::Sender<Ask>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// What the attribution thread is asked, in order.
enum Ask {
    /// Find who made the change a correction put back, and tell it.
    Correction(Box<Corrected>),
    /// Mute fanotify for a contested path until then.
    Mute(PathBuf, Instant),
    /// Say so once everything asked before is done (the mutant below waits for it).
    #[cfg(feature = "attribution-mutant")]
    Done(mpsc::Sender<()>),
}

/// The deliberately broken build of `tests/it/drift.rs`'s attribution test (feature
/// `attribution-mutant`, never in a release): with `MESH_HOST_MUTANT` naming `attribution`, a
/// tally waits until the attribution thread has told its corrections, as when attribution ran
/// on the reconciler's path, so the next key waits for fanotify and the runtime again. Unset,
/// the build behaves as the real one.
#[cfg(feature = "attribution-mutant")]
fn attribution_inline() -> bool {
    std::env::var("MESH_HOST_MUTANT").is_ok_and(|m| m.split(',').any(|m| m == "attribution"))
}

/// A correction as the worker saw it, owned, for the attribution thread.
struct Corrected {
    id: String,
    kind: Kind,
    target: String,
    detail: Option<String>,
    hand_edit: Option<apply::HandEdit>,
    /// When the change was seen, for a correction the daemon was woken for.
    seen: Option<Instant>,
    /// From then to the put-back, measured as it was tallied.
    since_seen: Option<Duration>,
    quiet: bool,
    /// When it was tallied, and the same in milliseconds since the epoch.
    at: Instant,
    at_ms: u64,
}

impl Report {
    /// `state`: the state directory, for the drift history; `container_socket`: where
    /// containers are named; `taker`: fanotify's writers, when it can be used (without it every
    /// writer is `unknown`).
    pub(super) fn new(
        state: &std::path::Path,
        container_socket: Option<String>,
        metrics: Arc<Metrics>,
        taker: Option<Taker>,
    ) -> Report {
        let applied = Arc::new(watch::channel(Applied::default()).0);
        let (tx, rx) = mpsc::channel();
        let attribution = Attribution {
            taker,
            names: std::collections::HashMap::new(),
            container_socket,
            history: drift::History::start(state),
            metrics: Arc::clone(&metrics),
            applied: Arc::clone(&applied),
        };
        // The runtime's client (`system::docker`) blocks on the daemon's runtime: entered here.
        let runtime = tokio::runtime::Handle::try_current().ok();
        let thread = std::thread::Builder::new()
            .name("attribution".into())
            .spawn(move || {
                // Its work comes after a put-back and must not delay the next: on a node of two
                // cores, the attribution of one correction beside the next correction raised
                // the put-back's p99 by a third (BENCHMARKS.md, issue 46). Ten nice steps down:
                // when both want a core, the reconciler gets about nine tenths of it.
                if let Err(e) = crate::system::lower_this_threads_priority(10) {
                    tracing::debug!(error = %e, "cannot lower the attribution thread's priority");
                }
                let _entered = runtime.as_ref().map(tokio::runtime::Handle::enter);
                attribution.run(&rx)
            })
            .map_err(|e| tracing::warn!(error = %e, "cannot start the attribution thread; corrections are not told"))
            .ok();
        Report { metrics, applied, held: HashSet::new(), tx: Some(tx), thread }
    }

    /// What the node has applied, as a follower (the fleet's status writer) sees it.
    pub(super) fn applied(&self) -> watch::Receiver<Applied> {
        self.applied.subscribe()
    }

    /// Tells what a report did, once: each change and each failure is an event, and the
    /// latency of a correction is measured from when the change was first seen (`seen`). A
    /// correction goes to the attribution thread, which tells it with who made the change (the
    /// module doc); its hand-edit leaves the report then. `quiet`: the key is contested or was
    /// failing, or a refusal that stands; a hold already said is quiet too.
    pub(super) fn tally(&self, report: &mut apply::Report, seen: Option<tokio::time::Instant>, quiet: bool) {
        let at = Instant::now();
        for o in &mut report.outcomes {
            let quiet = quiet || (o.action == Verb::Held && self.held.contains(&o.id));
            let since_seen = seen.map(|s| s.elapsed());
            if o.action == Verb::Corrected {
                self.ask(Ask::Correction(Box::new(Corrected {
                    id: o.id.clone(),
                    kind: o.kind,
                    target: o.target.clone(),
                    detail: o.detail.clone(),
                    hand_edit: o.hand_edit.take(),
                    seen: seen.map(tokio::time::Instant::into_std),
                    since_seen,
                    quiet,
                    at,
                    at_ms: crate::system::unix_millis(),
                })));
                continue;
            }
            events::ResourceChanged {
                id: &o.id,
                kind: o.kind.as_str(),
                target: &o.target,
                action: o.action.as_str(),
                detail: o.detail.as_deref(),
                since_seen,
                quiet,
                by: None,
            }
            .emit(&self.metrics);
        }
        #[cfg(feature = "attribution-mutant")]
        if attribution_inline() {
            let (done, told) = mpsc::channel();
            self.ask(Ask::Done(done));
            let _ = told.recv();
        }
        for f in report.error.iter().flat_map(|e| &e.failures) {
            // A raced read-back is a contest in progress, which has its own log line.
            events::ResourceFailed {
                id: &f.id,
                kind: f.kind.as_str(),
                target: &f.target,
                message: &f.message,
                quiet: quiet || f.raced,
            }
            .emit(&self.metrics);
        }
    }

    /// Mutes fanotify for `path` until `until`, in order after the corrections told before.
    pub(super) fn mute(&self, path: PathBuf, until: Instant) {
        self.ask(Ask::Mute(path, until));
    }

    fn ask(&self, ask: Ask) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(ask);
        }
    }

    /// Folds a report into what the node has applied. `full` for a full pass, whose counts and
    /// success stand for the whole declaration (and `sources`, the names of its files); a
    /// reconcile of one key only adds to the corrections and can only fail the node.
    pub(super) fn publish(&self, report: &apply::Report, full: bool, sources: &[String]) {
        let corrected = report.outcomes.iter().filter(|o| o.action == Verb::Corrected).count() as u64;
        let failures = report.error.iter().flat_map(|e| &e.failures);
        let contested = failures.clone().filter(|f| f.raced).count() as u64;
        let failed = failures.clone().any(|f| !f.raced);
        self.applied.send_if_modified(|a| {
            let before = a.clone();
            a.drift_corrections += corrected;
            a.contested += contested;
            if full {
                a.counts =
                    report.counts().into_iter().map(|(v, n)| (v.as_str().to_owned(), n as u64)).collect();
                a.converged = report.error.is_none();
                a.last_error = report.error.as_ref().map(|e| e.to_string());
                a.sources = sources.to_vec();
            } else if failed {
                a.converged = false;
                a.last_error = report.error.as_ref().map(|e| e.to_string());
            }
            *a != before
        });
    }

    /// Tells followers of `applied` the generation in force and the hold, when they moved.
    pub(super) fn publish_generation(
        &self,
        generation: Option<u64>,
        hold: Option<String>,
        reverted: Option<crate::generations::Hold>,
        signed: Vec<super::signed::InForce>,
    ) {
        self.applied.send_if_modified(|a| {
            let moved =
                a.generation != generation || a.hold != hold || a.reverted != reverted || a.signed != signed;
            a.generation = generation;
            a.hold = hold;
            a.reverted = reverted;
            a.signed = signed;
            moved
        });
    }

    /// After a full pass: which holds ended (said once each), and what is held now.
    pub(super) fn note_holds(&mut self, report: &apply::Report) {
        let now: HashSet<String> =
            report.outcomes.iter().filter(|o| o.action == Verb::Held).map(|o| o.id.clone()).collect();
        for id in self.held.difference(&now) {
            events::HoldEnded { id }.emit(&self.metrics);
        }
        self.held = now;
    }

    /// After one key's reconcile: what it reported held is held now.
    pub(super) fn add_holds(&mut self, report: &apply::Report) {
        self.held.extend(report.outcomes.iter().filter(|o| o.action == Verb::Held).map(|o| o.id.clone()));
    }

    /// The gauges of resources applied, failed and held, by type, after a full pass.
    pub(super) fn count(&self, declaration: &Declaration, report: &apply::Report) {
        let failed: HashSet<&str> =
            report.error.iter().flat_map(|e| e.failures.iter().map(|f| f.id.as_str())).collect();
        let held: HashSet<&str> =
            report.outcomes.iter().filter(|o| o.action == Verb::Held).map(|o| o.id.as_str()).collect();
        for kind in Kind::ALL {
            let (mut applied, mut failed_n, mut held_n) = (0, 0, 0);
            for r in declaration.resources.iter().filter(|r| r.kind() == kind) {
                if failed.contains(r.id.as_str()) {
                    failed_n += 1;
                } else if held.contains(r.id.as_str()) {
                    held_n += 1;
                } else {
                    applied += 1;
                }
            }
            events::ResourcesCounted { kind: kind.as_str(), applied, failed: failed_n, held: held_n }
                .emit(&self.metrics);
        }
    }

    /// Lets the attribution thread finish what it was asked, and waits for it: every
    /// correction is told and kept in the history before the agent exits.
    pub(super) fn finish(&mut self) {
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Report {
    fn drop(&mut self) {
        self.finish();
    }
}

/// The attribution thread's own state.
struct Attribution {
    taker: Option<Taker>,
    /// Containers' names by id, as the runtime last gave them (`None`: it did not, asked at that
    /// time, and asked again 10 s later): a container rewriting a managed file as fast as it can
    /// costs one question to the runtime (for Podman, a program run), not one per correction.
    /// At most `NAMES` kept; emptied when full.
    names: std::collections::HashMap<String, (Option<String>, Instant)>,
    container_socket: Option<String>,
    /// The corrections kept under the state directory (`mesh-host drift`).
    history: drift::History,
    metrics: Arc<Metrics>,
    applied: Arc<watch::Sender<Applied>>,
}

impl Attribution {
    fn run(mut self, rx: &mpsc::Receiver<Ask>) {
        while let Ok(ask) = rx.recv() {
            match ask {
                Ask::Correction(c) => self.tell(*c),
                #[cfg(feature = "attribution-mutant")]
                Ask::Done(done) => {
                    let _ = done.send(());
                }
                Ask::Mute(path, until) => {
                    if let Some(t) = &self.taker {
                        if let Err(e) = t.mute(&path, until) {
                            tracing::debug!(path = %path.display(), error = %e, "cannot mute for fanotify; its writes wake it during the hold");
                        }
                    }
                }
            }
        }
    }

    /// A correction told: its detail gains who made the change it put back (`...: content; by
    /// sed (pid 4242, ...)`), its event is emitted, the fleet's status names it, and it is kept
    /// in the history with its hand-edit.
    fn tell(&mut self, c: Corrected) {
        let who = self.who(&c.target, c.seen, c.at);
        let text = who.describe();
        let detail = match &c.detail {
            Some(d) => format!("{d}; by {text}"),
            None => format!("by {text}"),
        };
        events::ResourceChanged {
            id: &c.id,
            kind: c.kind.as_str(),
            target: &c.target,
            action: Verb::Corrected.as_str(),
            detail: Some(&detail),
            since_seen: c.since_seen,
            quiet: c.quiet,
            by: Some(by(&who)),
        }
        .emit(&self.metrics);
        let last = Some(format!("{} by {text}", c.id));
        self.applied.send_if_modified(|a| {
            let moved = a.last_correction != last;
            a.last_correction = last;
            moved
        });
        let correction = drift::Correction {
            at_ms: c.at_ms,
            id: c.id,
            kind: c.kind.as_str().to_owned(),
            target: c.target,
            // The outcome's own words, without the writer.
            changed: c.detail.unwrap_or_default(),
            who,
            put_back_ms: c.since_seen.map(|d| d.as_secs_f64() * 1000.0),
            diff: None,
            diff_omitted: None,
        };
        self.history.add(correction.with_edit(c.hand_edit));
    }

    /// Who made the change a correction of `target` put back: the latest writer fanotify saw
    /// at that path since the change was seen (waiting a little for it: its event and
    /// inotify's are read on two threads), or `unknown`. `at`: when the correction was told.
    fn who(&mut self, target: &str, seen: Option<Instant>, at: Instant) -> drift::Who {
        let Some(taker) = &self.taker else { return drift::Who::unknown() };
        let path = std::path::Path::new(target);
        if !path.is_absolute() {
            return drift::Who::unknown();
        }
        let (since, wait) = match seen {
            Some(s) => (s.checked_sub(Duration::from_secs(1)).unwrap_or(s), Duration::from_millis(50)),
            None => (at.checked_sub(Duration::from_secs(60)).unwrap_or(at), Duration::ZERO),
        };
        let Some(w) = taker.take(path, since, wait) else { return drift::Who::unknown() };
        let name = w.container.as_deref().and_then(|id| self.container_name(id));
        drift::Who::from_writer(&w, name)
    }

    /// A container's name, from its id: asked of the runtime the agent already talks to (Docker,
    /// or Podman's Docker-compatible socket), then of the `podman` program, since a Podman
    /// container needs no socket to run.
    fn container_name(&mut self, id: &str) -> Option<String> {
        const NAMES: usize = 256;
        const RETRY: Duration = Duration::from_secs(10);
        match self.names.get(id) {
            Some((Some(name), _)) => return Some(name.clone()),
            Some((None, asked)) if asked.elapsed() < RETRY => return None,
            _ => {}
        }
        let docker = crate::system::docker::connect(self.container_socket.as_deref()).ok();
        let name = docker
            .and_then(|d| d.container(id).ok().flatten())
            .map(|c| c.name)
            .filter(|n| !n.is_empty())
            .or_else(|| crate::system::docker::podman_name(id));
        if self.names.len() >= NAMES {
            self.names.clear();
        }
        self.names.insert(id.to_owned(), (name.clone(), Instant::now()));
        name
    }
}

/// The event's fields of who made a change.
fn by(w: &drift::Who) -> events::By<'_> {
    events::By {
        kind: w.by.as_str(),
        pid: w.pid,
        comm: w.comm.as_deref(),
        exe: w.exe.as_deref(),
        uid: w.uid,
        user: w.user.as_deref(),
        loginuid: w.loginuid,
        session: w.session,
        unit: w.unit.as_deref(),
        container: w.container.as_deref(),
        exited: w.exited,
        moved: w.moved.as_deref(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn corrected(target: &str) -> apply::Report {
        apply::Report {
            outcomes: vec![apply::Outcome {
                id: "a.conf".into(),
                kind: Kind::File,
                target: target.into(),
                action: Verb::Corrected,
                detail: Some("content".into()),
                hand_edit: None,
            }],
            error: None,
            store_error: None,
        }
    }

    /// The writer of a change fanotify never saw is waited for (50 ms), on the attribution
    /// thread: the tally, and so the next key, does not wait; the correction is told after,
    /// named `unknown`, in the fleet's status and in the history.
    #[test]
    #[ignore = "fanotify needs CAP_SYS_ADMIN: run as root with --include-ignored"]
    fn a_correction_is_told_apart_and_the_tally_never_waits_for_its_writer() {
        let dir = tempfile::tempdir().unwrap();
        let writers = mesh_host_watchers::writers::Writers::start().expect("fanotify: run as root");
        let state = dir.path().join("state.json");
        let mut tally = Report::new(&state, None, Arc::new(Metrics::new()), Some(writers.taker()));
        let mut applied = tally.applied();
        let target = dir.path().join("a.conf");
        let mut report = corrected(target.to_str().unwrap());
        let started = Instant::now();
        tally.tally(&mut report, Some(tokio::time::Instant::now()), false);
        tally.publish(&report, false, &[]);
        let took = started.elapsed();
        assert!(took < Duration::from_millis(25), "the tally waited {took:?} for the writer");
        assert_eq!(applied.borrow_and_update().drift_corrections, 1, "counted at once");
        let deadline = Instant::now() + Duration::from_secs(5);
        while applied.borrow().last_correction.is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let told = started.elapsed();
        assert_eq!(applied.borrow().last_correction.as_deref(), Some("a.conf by unknown"));
        assert!(told >= Duration::from_millis(50), "told after the wait for its writer, not {told:?}");
        tally.finish();
        let history = drift::read(&state).unwrap();
        assert_eq!(history.len(), 1, "{history:?}");
        assert_eq!((history[0].id.as_str(), history[0].changed.as_str()), ("a.conf", "content"));
        assert_eq!(history[0].who.describe(), "unknown");
    }

    /// Without fanotify every writer is `unknown`, and what the agent is told is the same.
    #[test]
    fn without_fanotify_a_correction_is_told_by_unknown_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state.json");
        let mut tally = Report::new(&state, None, Arc::new(Metrics::new()), None);
        let applied = tally.applied();
        let mut report = corrected("/srv/a.conf");
        tally.tally(&mut report, None, false);
        tally.finish();
        assert_eq!(applied.borrow().last_correction.as_deref(), Some("a.conf by unknown"));
        let history = drift::read(&state).unwrap();
        assert_eq!(history.len(), 1, "{history:?}");
        assert_eq!(history[0].target, "/srv/a.conf");
    }
}
