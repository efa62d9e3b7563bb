//! The runner: the loop that drains the queue, each key run inline on the worker or apart on a
//! blocking thread, taken back and joined, the queue told how it ended, panics caught.
//!
//! The concurrency model (issue 15): the worker's task (the coordinator) takes keys from the
//! queue and runs each in one of two ways.
//! - **Inline**, on the coordinator itself, with the store: full passes, a new declaration, and
//!   a key whose reconcile touches only files, directories and access paths (the key and what
//!   restarts or reloads on it). These take milliseconds, as every reconcile did when the worker
//!   was alone.
//! - **Apart**, on a blocking thread of its own, at most `workers - 1` at once: a key whose
//!   reconcile reaches anything that can be slow (a unit's start and its second look, a
//!   container recreated, an image pulled, an action, a package). It works on a copy of the
//!   store (`Store::lend`) and its own connections (a `Session` from the pool), and when it
//!   ends the coordinator takes back the records of exactly the resources it claimed
//!   (`Store::take_back`), then writes the store as after any reconcile.
//!
//! What keeps them apart is the queue's claims (`queue::Claim`): a key claims its reconcile's
//! closure (the key, whatever restarts or reloads on it, transitively, as `apply::reconcile_in`
//! selects; every opening when one is reached, since the filter is one; the container an
//! action runs in; a container's network and the declared files it reads; and the first gate
//! not yet passed when anything claimed comes after it), and
//! no key is handed out while its claim meets one in flight. So two reconciles never touch one
//! resource, what is taken back never overwrites another's work, and a file waits for the
//! service that restarts on it. A full pass claims everything: it waits for the reconciles in
//! flight to end, and meanwhile no new long reconcile starts behind it (the queue's barrier),
//! while inline keys go on being handed out; it then runs alone, on the store itself. So an
//! hour-long step in flight delays the next full pass (and a new declaration) by what is left
//! of it, and never stops a file from being put back.

use std::sync::Arc;

use tokio::time::Instant;

use super::queue::{Claim, Contest, Next, Queue, Verdict};
use super::trigger::Key;
use super::worker::{failpoint_panic_reconcile, Worker};
use crate::apply::{self, Options};
use crate::declaration::{Declaration, Id, Kind};
use crate::store::Store;
use crate::telemetry::{events, Event as _};

/// A reconcile run apart from the worker, as it leaves: everything it needs, owned.
struct Apart {
    /// Only a resource's key runs apart: its id is the key.
    id: Id,
    seen: Instant,
    /// The ids whose records and holds are taken back: the claim's.
    ids: Vec<Id>,
    declaration: Arc<Declaration>,
    store: Store,
    session: apply::Session,
    options: Options,
}

/// A reconcile run apart, as it comes back.
struct Back {
    /// The resource's id: its key is `Key::Resource(id)`.
    id: Id,
    seen: Instant,
    started: Instant,
    ids: Vec<Id>,
    store: Store,
    /// The report and the session to keep, or what the reconcile's panic said (its session is
    /// then dropped: the panic may have left it mid-call).
    report: Result<(apply::Report, apply::Session), String>,
}

impl Apart {
    /// Runs on a blocking thread; a panic is caught here, as `reconcile_guarded` catches one
    /// inline, and comes back as the key's failure.
    fn run(self) -> Back {
        let started = Instant::now();
        let Apart { id, seen, ids, declaration, mut store, mut session, options } = self;
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            failpoint_panic_reconcile(&id);
            apply::reconcile_in(&mut session, &declaration, std::slice::from_ref(&id), &mut store, &options)
        }));
        let report = match ran {
            Ok(report) => Ok((report, session)),
            Err(payload) => Err(panic_message(payload.as_ref())),
        };
        Back { id, seen, started, ids, store, report }
    }
}

/// Drains the queue until it is shut down: each key reconciled (inline or apart, see the module
/// doc), the queue told how it went, contests and failures said once. Then waits for every
/// reconcile apart, and persists the store.
pub async fn drain(mut worker: Worker, queue: Arc<Queue<Key>>) {
    // Reconciles apart in flight; each one's start, for the health check.
    let mut apart: tokio::task::JoinSet<Back> = tokio::task::JoinSet::new();
    let mut starts: std::collections::HashMap<tokio::task::Id, (Key, std::time::Instant)> =
        std::collections::HashMap::new();
    let limit = worker.config.workers.saturating_sub(1);
    loop {
        // What ended apart is taken back before anything else is handed out, so a stream of
        // inline keys never leaves a finished reconcile's claim held.
        while let Some(joined) = apart.try_join_next_with_id() {
            worker.joined(&queue, &mut starts, joined);
        }
        let in_flight = apart.len();
        let next = queue.try_next(
            |key| worker.claim_of(key),
            // Long work is refused behind a waiting full pass, so the pass waits only for what
            // already runs; short work goes on.
            |key, _, behind_full| !worker.runs_apart(key, limit) || (!behind_full && in_flight < limit),
        );
        match next {
            Next::Key(key, seen, _) => {
                if worker.runs_apart(&key, limit) {
                    if let Some(job) = worker.apart(&key, seen) {
                        let (key, started) = (key.clone(), std::time::Instant::now());
                        let handle = apart.spawn_blocking(move || job.run());
                        starts.insert(handle.id(), (key, started));
                        worker.health.set_oldest_apart(starts.values().map(|(_, at)| *at).min());
                        continue;
                    }
                }
                let verdict = tokio::task::block_in_place(|| worker.reconcile_guarded(&key, seen));
                if matches!(key, Key::Declaration | Key::Full) {
                    // The declaration may have been replaced: claims are worked out anew.
                    queue.forget_claims();
                }
                worker.done(&queue, &key, verdict);
            }
            Next::Closed if apart.is_empty() => break,
            Next::Closed | Next::Wait(_) => {
                let due = match next {
                    Next::Wait(due) => due,
                    Next::Key(..) | Next::Closed => None,
                };
                tokio::select! {
                    _ = queue.wait(due) => {}
                    Some(joined) = apart.join_next_with_id(), if !apart.is_empty() => {
                        worker.joined(&queue, &mut starts, joined);
                    }
                }
            }
        }
    }
    // Intake has stopped and the last reconcile finished: persist what it recorded.
    if let Err(e) = worker.store.save() {
        events::StoreNotWritten { error: &e, when: "on the way out" }.emit(&worker.metrics);
    }
    for task in worker.watcher_tasks() {
        task.abort();
        let _ = task.await;
    }
}

/// The ids a reconcile of `id` claims: its closure (as `apply::reconcile_in` selects it), every
/// opening when it reaches one (the filter is one, and the pass records every opening), the
/// container an action in it runs in, the network a container in it joins and the declared
/// files and directories it reads (env-files, mounted paths), and the first gate not passed at its current declaration
/// when anything in it comes after that gate (the pass would not attempt it until the gate
/// passes, so it waits for a gate in flight). Sorted, without repeats; an id not declared
/// claims itself.
fn claimed(d: &Declaration, store: &Store, id: &Id) -> Vec<Id> {
    let closure = d.closure([id]);
    let mut ids: Vec<Id> = closure.iter().map(|&i| d.resources[i].id.clone()).collect();
    if ids.is_empty() {
        return vec![id.clone()];
    }
    for &i in &closure {
        let r = &d.resources[i];
        if r.kind() == Kind::Opening {
            ids.extend(d.resources.iter().filter(|o| o.kind() == Kind::Opening).map(|o| o.id.clone()));
        }
        if let Some(name) = r.spec.runs_in() {
            ids.extend(
                d.resources
                    .iter()
                    .filter(|c| c.kind() == Kind::Container && c.target() == name)
                    .map(|c| c.id.clone()),
            );
        }
        if let Some(name) = r.spec.joins() {
            ids.extend(
                d.resources
                    .iter()
                    .filter(|n| n.kind() == Kind::Network && n.target() == name)
                    .map(|n| n.id.clone()),
            );
        }
        // A file a container reads (an env-file, a mounted path) is not corrected while the
        // container is being made from it.
        ids.extend(r.spec.reads().into_iter().filter_map(|p| d.at_path(p)).map(|f| f.id.clone()));
    }
    let last = closure.iter().copied().max().unwrap_or(0);
    let open_gate = d.gates().find(|g| store.get(g.id.as_str()).is_none_or(|rec| rec.declared != g.digest));
    if let Some(gate) = open_gate.filter(|g| g.index() < last) {
        ids.push(gate.id.clone());
    }
    ids.sort();
    ids.dedup();
    ids
}

/// Whether a reconcile of `id` may be slow, so runs apart: its closure reaches anything but
/// files, directories and access paths (a unit, a container, a network, a package, a user, an
/// archive, an action, a process, an opening). Decided by type, not measured (decisions.md).
fn slow(d: &Declaration, id: &Id) -> bool {
    d.closure([id])
        .iter()
        .any(|&i| !matches!(d.resources[i].kind(), Kind::File | Kind::Directory | Kind::Access))
}

/// The hash a claim holds for a resource id.
fn claim_hash(id: &str) -> u64 {
    use std::hash::{Hash as _, Hasher as _};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    id.hash(&mut h);
    h.finish()
}

/// What a panic said: its message, when it has one (`panic!` with a literal or a format).
pub(super) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic that carries no message".to_owned()
    }
}

impl Worker {
    /// What the reconcile of `key` may touch, for the queue (see the module doc). Worked out
    /// from the declaration in force and the store as they are now; a key with no declaration
    /// in force, or no longer declared, claims only itself.
    fn claim_of(&self, key: &Key) -> Claim {
        match key {
            Key::Full | Key::Declaration => Claim::Everything,
            Key::Resource(id) => {
                Claim::only(self.claimed(id).iter().map(|id| claim_hash(id.as_str())).collect())
            }
        }
    }

    /// The ids a reconcile of `id` claims, by the declaration in force and the store now
    /// (`claimed`).
    fn claimed(&self, id: &Id) -> Vec<Id> {
        match self.declaration.as_deref() {
            Some(d) => claimed(d, &self.store, id),
            None => vec![id.clone()],
        }
    }

    /// Whether `key` runs apart from the worker (`slow`), when there is room for any (`limit`,
    /// the most that may run apart, is `workers - 1`).
    fn runs_apart(&self, key: &Key, limit: usize) -> bool {
        let (Key::Resource(id), Some(d)) = (key, self.declaration.as_deref()) else { return false };
        limit > 0 && slow(d, id)
    }

    /// What a reconcile of `key` run apart needs, owned; `None` when there is nothing to run
    /// apart (no declaration in force, the id no longer declared, or the declaration refused on
    /// this machine), which the inline path then settles at once.
    fn apart(&mut self, key: &Key, seen: Instant) -> Option<Apart> {
        let Key::Resource(id) = key else { return None };
        // Refused on this machine: nothing runs apart either; the inline path says so.
        if self.refusal.is_some() {
            return None;
        }
        let declaration = self.declaration.clone()?;
        declaration.get(id)?;
        let options = self.options();
        let ids = self.claimed(id);
        Some(Apart {
            id: id.clone(),
            seen,
            ids,
            declaration,
            store: self.store.lend(),
            session: self.spare.pop().unwrap_or_default(),
            options,
        })
    }

    /// Takes back a reconcile run apart: the records it claimed, its session, its report, as
    /// `reconcile` settles one inline.
    fn take_back(&mut self, back: Back) -> Verdict {
        let Back { id, seen, started, ids, store, report } = back;
        let key = Key::Resource(id.clone());
        let verdict = match report {
            Ok((mut report, session)) => {
                let claimed: Vec<&str> = ids.iter().map(Id::as_str).collect();
                self.store.take_back(store, Some(&claimed));
                self.spare.push(session);
                self.conclude_one(&id, &mut report, seen)
            }
            Err(message) => {
                self.store.take_back(store, None);
                events::ReconcilePanicked { id: Some(id.as_str()), key: &key.to_string(), message: &message }
                    .emit(&self.metrics);
                Verdict::Failed
            }
        };
        self.finished(&key, started);
        verdict
    }

    /// A reconcile apart ended (or its thread was lost): taken back, and the queue told.
    fn joined(
        &mut self,
        queue: &Queue<Key>,
        starts: &mut std::collections::HashMap<tokio::task::Id, (Key, std::time::Instant)>,
        joined: Result<(tokio::task::Id, Back), tokio::task::JoinError>,
    ) {
        let id = match &joined {
            Ok((id, _)) => *id,
            Err(e) => e.id(),
        };
        let key = starts.remove(&id).map(|(key, _)| key);
        self.health.set_oldest_apart(starts.values().map(|(_, at)| *at).min());
        match (joined, key) {
            (Ok((_, back)), _) => {
                let key = Key::Resource(back.id.clone());
                let verdict = self.take_back(back);
                self.done(queue, &key, verdict);
            }
            // Panics are caught inside; a join error is the runtime going away. The copy is
            // lost: its work is read from the machine next time.
            (Err(e), Some(key)) => {
                events::ReconcileLost { key: Some(&key.to_string()), error: &e }.emit(&self.metrics);
                self.store.lost();
                self.done(queue, &key, Verdict::Failed);
            }
            (Err(e), None) => events::ReconcileLost { key: None, error: &e }.emit(&self.metrics),
        }
    }

    /// Tells the queue how a key ended, and says a contest or a failure once.
    fn done(&mut self, queue: &Queue<Key>, key: &Key, verdict: Verdict) {
        let name = key.to_string();
        match queue.done(key, verdict) {
            Some(Contest::Began { wait }) => {
                self.quiet.insert(key.clone());
                events::ContestBegan { key: &name, wait }.emit(&self.metrics);
            }
            Some(Contest::Ended) => {
                self.quiet.remove(key);
                events::ContestEnded { key: &name }.emit(&self.metrics);
            }
            None => {}
        }
        if verdict == Verdict::Corrected {
            if let Some(until) = queue.held(key) {
                self.mute(key, until.into_std());
            }
        }
        match verdict {
            Verdict::Failed => {
                self.quiet.insert(key.clone());
            }
            Verdict::Clean if self.quiet.remove(key) => events::Recovered { key: &name }.emit(&self.metrics),
            Verdict::Clean | Verdict::Corrected => {}
        }
        let stats = queue.stats();
        events::QueueSampled {
            depth: stats.depth,
            processing: stats.processing,
            backing_off: stats.backing_off,
            contested: stats.contested,
            retrying: verdict == Verdict::Failed,
        }
        .emit(&self.metrics);
    }

    /// Reconciles one key, as `reconcile` does, and survives a panic in it: the key is failed
    /// with the panic's message, the panic is counted (`mesh_host_panics_total`), and the daemon
    /// goes on (issue 12, fault 10). A bug in one applier must not stop the agent from putting
    /// back everything else, nor leave it running with a dead worker.
    pub fn reconcile_guarded(&mut self, key: &Key, seen: Instant) -> Verdict {
        // `AssertUnwindSafe`: what a panic can leave half-done is the reconcile's own work. The
        // store records a resource only after its read-back, so a record is never ahead of the
        // machine; the declaration in force and the index are replaced whole; the locks are
        // taken through poisoning everywhere. The one piece of state kept across reconciles
        // that a panic could leave mid-protocol, the connections to systemd and the container
        // runtime, is dropped below and made again by the next reconcile that needs them.
        let payload =
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.reconcile(key, seen))) {
                Ok(verdict) => return verdict,
                Err(payload) => payload,
            };
        let message = panic_message(payload.as_ref());
        self.session = apply::Session::default();
        let id = match key {
            Key::Resource(id) => Some(id.as_str()),
            Key::Declaration | Key::Full => None,
        };
        events::ReconcilePanicked { id, key: &key.to_string(), message: &message }.emit(&self.metrics);
        // The worker is alive: it finished this key, if badly.
        self.health.beat();
        Verdict::Failed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two files, one a service restarts on; a container and an action run in it (a gate); a
    /// file after the gate; two openings.
    const DECLARATION: &str = r#"{"version": 1, "resources": [
        {"type": "file", "id": "a.conf", "path": "/srv/a.conf", "content": "x\n"},
        {"type": "file", "id": "a.other", "path": "/srv/a.other", "content": "y\n"},
        {"type": "service", "id": "a.svc", "unit": "a.service", "state": "running", "restart-on": ["a.conf"]},
        {"type": "container", "id": "a.box", "name": "box", "image": "local/busybox:1"},
        {"type": "action", "id": "a.seed", "command": ["seed"], "verify": ["seed", "--check"], "in": "box"},
        {"type": "file", "id": "a.late", "path": "/srv/a.late", "content": "z\n"},
        {"type": "opening", "id": "o.http", "port": 80},
        {"type": "opening", "id": "o.dns", "port": 53, "protocol": "udp"}
    ]}"#;

    fn id(s: &str) -> Id {
        Id::parse(s).unwrap()
    }

    fn ids(list: &[&str]) -> Vec<Id> {
        list.iter().map(|s| id(s)).collect()
    }

    fn declared() -> (Declaration, tempfile::TempDir, crate::store::Writer) {
        let d = Declaration::parse(DECLARATION.as_bytes()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("state.json")).unwrap();
        (d, dir, store)
    }

    /// Records the gate at its current declaration: it has passed.
    fn pass_gate(d: &Declaration, store: &mut Store) {
        let r = d.get(&id("a.seed")).unwrap();
        store.record(
            "a.seed",
            crate::store::Record {
                origin: crate::store::Origin::Declared,
                kind: r.kind(),
                target: r.spec.target_shared(),
                position: r.index() as u32,
                declared: r.digest,
                applied_at: 0,
                wrote: None,
                mode: None,
                owner: None,
                sig: None,
                more: None,
            },
        );
    }

    #[test]
    fn a_file_alone_claims_itself_and_runs_inline() {
        let (d, _dir, mut store) = declared();
        pass_gate(&d, &mut store);
        assert_eq!(claimed(&d, &store, &id("a.other")), ids(&["a.other"]));
        assert!(!slow(&d, &id("a.other")));
    }

    #[test]
    fn a_file_a_service_restarts_on_claims_the_service_and_runs_apart() {
        let (d, _dir, mut store) = declared();
        pass_gate(&d, &mut store);
        assert_eq!(claimed(&d, &store, &id("a.conf")), ids(&["a.conf", "a.svc"]));
        assert!(slow(&d, &id("a.conf")));
        assert_eq!(
            claimed(&d, &store, &id("a.svc")),
            ids(&["a.svc"]),
            "a service claims what restarts on it, not what it restarts on"
        );
        assert!(slow(&d, &id("a.svc")));
    }

    #[test]
    fn an_action_claims_the_container_it_runs_in() {
        let (d, _dir, mut store) = declared();
        pass_gate(&d, &mut store);
        assert_eq!(claimed(&d, &store, &id("a.seed")), ids(&["a.box", "a.seed"]));
    }

    #[test]
    fn what_comes_after_a_gate_not_passed_claims_the_gate_and_no_longer_once_it_passed() {
        let (d, _dir, mut store) = declared();
        assert_eq!(claimed(&d, &store, &id("a.late")), ids(&["a.late", "a.seed"]));
        assert_eq!(
            claimed(&d, &store, &id("a.conf")),
            ids(&["a.conf", "a.svc"]),
            "before the gate: not held by it"
        );
        pass_gate(&d, &mut store);
        assert_eq!(claimed(&d, &store, &id("a.late")), ids(&["a.late"]));
    }

    #[test]
    fn a_container_claims_its_network_and_the_files_it_reads() {
        let d = Declaration::parse(
            br#"{"version": 1, "resources": [
                {"type": "file", "id": "w.env", "path": "/srv/w.env", "content": "A=1\n"},
                {"type": "directory", "id": "w.data", "path": "/srv/w"},
                {"type": "network", "id": "w.net", "name": "wnet"},
                {"type": "container", "id": "w.app", "name": "w", "image": "local/busybox:1",
                 "env-file": ["/srv/w.env"], "volumes": ["/srv/w:/data", "named:/cache"], "network": "wnet"}
            ]}"#,
        )
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("state.json")).unwrap();
        assert_eq!(claimed(&d, &store, &id("w.app")), ids(&["w.app", "w.data", "w.env", "w.net"]));
        assert_eq!(claimed(&d, &store, &id("w.env")), ids(&["w.env"]), "the file alone claims itself");
    }

    #[test]
    fn an_opening_claims_every_opening() {
        let (d, _dir, mut store) = declared();
        pass_gate(&d, &mut store);
        assert_eq!(claimed(&d, &store, &id("o.dns")), ids(&["o.dns", "o.http"]));
        assert!(slow(&d, &id("o.dns")));
    }

    #[test]
    fn an_id_no_longer_declared_claims_itself() {
        let (d, _dir, store) = declared();
        assert_eq!(claimed(&d, &store, &id("gone.file")), ids(&["gone.file"]));
        assert!(!slow(&d, &id("gone.file")));
    }

    #[test]
    fn claims_of_a_file_and_of_the_service_restarting_on_it_meet_and_others_do_not() {
        let (d, _dir, mut store) = declared();
        pass_gate(&d, &mut store);
        let claim = |s: &str| {
            Claim::only(claimed(&d, &store, &id(s)).iter().map(|i| claim_hash(i.as_str())).collect())
        };
        assert!(claim("a.conf").meets(&claim("a.svc")));
        assert!(!claim("a.other").meets(&claim("a.svc")));
        assert!(!claim("a.other").meets(&claim("a.conf")));
    }
}
