//! The runner: the loop that drains the queue, each key run inline or apart on a blocking
//! thread, what ended apart taken back, the queue told how each key ended, panics caught. It
//! knows its reconciler only through [`Reconcile`], as kube-runtime's `Controller` knows its
//! reconciler through a function: the worker is one (`worker`), and the tests' fake another.
//!
//! The concurrency model (issue 15): the runner's task takes keys from the queue and runs each
//! in one of two ways.
//! - **Inline**, on the runner's own task, with the reconciler itself: full passes, a new
//!   declaration, and a key whose reconcile touches only files, directories and access paths
//!   (the key and what restarts or reloads on it). These take milliseconds, as every reconcile
//!   did when the worker was alone.
//! - **Apart**, on a blocking thread of its own, at most `limit` (`workers - 1`) at once: a key
//!   whose reconcile reaches anything that can be slow (a unit's start and its second look, a
//!   container recreated, an image pulled, an action, a package). The reconciler hands out a job
//!   that owns what it needs (for the worker: a copy of the store, `Store::lend`, and its own
//!   connections), and when it ends the reconciler takes it back (for the worker: the records of
//!   exactly the resources it claimed, `Store::take_back`), then the queue is told.
//!
//! What keeps them apart is the queue's claims (`queue::Claim`), which the reconciler works out
//! (`claims`): no key is handed out while its claim meets one in flight, and a claim is held
//! until its reconcile is taken back, not merely ended. So two reconciles never touch one
//! resource, what is taken back never overwrites another's work, and a file waits for the
//! service that restarts on it. A full pass claims everything: it waits for the reconciles in
//! flight to end, and meanwhile no new long reconcile starts behind it (the queue's barrier),
//! while inline keys go on being handed out; it then runs alone. So an hour-long step in flight
//! delays the next full pass (and a new declaration) by what is left of it, and never stops a
//! file from being put back.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::task::{JoinError, JoinSet};
use tokio::time::Instant;

use super::queue::{Claim, Contest, Next, Queue, Stats, Verdict};
use super::trigger::Key;

/// What the runner needs of a reconciler. Every method runs on the runner's task, one at a
/// time, but [`Reconcile::run_apart`], which runs on a blocking thread with only its job.
pub(super) trait Reconcile {
    /// A reconcile run apart, as it leaves: everything it needs, owned.
    type Job: Send + 'static;
    /// A reconcile run apart, as it comes back.
    type Back: Send + 'static;

    /// What the reconcile of `key` may touch, for the queue.
    fn claim_of(&self, key: &Key) -> Claim;
    /// Whether `key` runs apart, when at most `limit` may.
    fn runs_apart(&self, key: &Key, limit: usize) -> bool;
    /// What a reconcile of `key` apart needs, owned; `None` to run it inline after all (there is
    /// nothing to run apart, which the inline reconcile settles at once).
    fn apart(&mut self, key: &Key, seen: Instant) -> Option<Self::Job>;
    /// Runs a job apart, on a blocking thread. A panic here is caught by the runner.
    fn run_apart(job: Self::Job) -> Self::Back;
    /// Takes back what ran apart (`Err`: what its panic said; the job's parts are lost),
    /// started at `started`, and says how the key ended.
    fn take_back(&mut self, key: &Key, started: Instant, back: Result<Self::Back, String>) -> Verdict;
    /// The runtime lost a reconcile apart (its thread went away; never a panic, which is caught
    /// and taken back). `key` is `None` when the runner did not know what it ran.
    fn lost(&mut self, key: Option<&Key>, error: &JoinError);
    /// Reconciles `key` inline and says how it went.
    fn reconcile(&mut self, key: &Key, seen: Instant) -> Verdict;
    /// The inline reconcile of `key` panicked, saying `message`: whatever it may have left
    /// mid-call is dropped; the key is failed.
    fn panicked(&mut self, key: &Key, message: &str) -> Verdict;
    /// The queue was told how `key` ended; what it answered.
    fn done(&mut self, key: &Key, verdict: Verdict, told: Told);
    /// When the oldest reconcile apart still in flight started, if one is.
    fn oldest_apart(&mut self, started: Option<std::time::Instant>);
    /// The queue is closed and nothing runs apart: what the reconciler keeps is persisted,
    /// and the tasks it started are handed over to be stopped.
    fn finish(&mut self) -> Vec<tokio::task::JoinHandle<()>>;
}

/// What the queue answered when it was told how a key ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Told {
    /// The key became contested, or stopped being.
    pub contest: Option<Contest>,
    /// A correction the queue holds off until then (a contest's backoff).
    pub held_until: Option<Instant>,
    /// The queue now.
    pub stats: Stats,
}

/// Drains a queue into a reconciler (the module doc): owns the reconcile work apart in flight.
pub(super) struct Runner<R: Reconcile> {
    r: R,
    queue: Arc<Queue<Key>>,
    apart: JoinSet<Result<R::Back, String>>,
    /// Each reconcile apart in flight: its key and when it started.
    starts: HashMap<tokio::task::Id, (Key, Instant)>,
    /// The most reconciles apart at once (`workers - 1`).
    limit: usize,
}

impl<R: Reconcile> Runner<R> {
    pub(super) fn new(r: R, queue: Arc<Queue<Key>>, limit: usize) -> Runner<R> {
        Runner { r, queue, apart: JoinSet::new(), starts: HashMap::new(), limit }
    }

    /// Drains the queue until it is shut down and nothing is left of it: each key reconciled
    /// (inline or apart), the queue told how it went. Then waits for every reconcile apart, and
    /// lets the reconciler finish (`Reconcile::finish`), stopping the tasks it hands over.
    pub(super) async fn run(mut self) {
        loop {
            // What ended apart is taken back before anything else is handed out, so a stream of
            // inline keys never leaves a finished reconcile's claim held.
            while let Some(joined) = self.apart.try_join_next_with_id() {
                self.joined(joined);
            }
            let (in_flight, limit) = (self.apart.len(), self.limit);
            let r = &self.r;
            let next = self.queue.try_next(
                |key| r.claim_of(key),
                // Long work is refused behind a waiting full pass, so the pass waits only for
                // what already runs; short work goes on.
                |key, _, behind_full| !r.runs_apart(key, limit) || (!behind_full && in_flight < limit),
            );
            match next {
                Next::Key(key, seen, _) => self.start(key, seen),
                Next::Closed if self.apart.is_empty() => break,
                Next::Closed | Next::Wait(_) => {
                    let due = match next {
                        Next::Wait(due) => due,
                        Next::Key(..) | Next::Closed => None,
                    };
                    tokio::select! {
                        _ = self.queue.wait(due) => {}
                        Some(joined) = self.apart.join_next_with_id(), if !self.apart.is_empty() => {
                            self.joined(joined);
                        }
                    }
                }
            }
        }
        for task in self.r.finish() {
            task.abort();
            let _ = task.await;
        }
    }

    /// Runs a key handed out: apart when it runs apart and the reconciler has a job for it,
    /// inline otherwise.
    fn start(&mut self, key: Key, seen: Instant) {
        if self.r.runs_apart(&key, self.limit) {
            if let Some(job) = self.r.apart(&key, seen) {
                let handle = self.apart.spawn_blocking(move || {
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| R::run_apart(job)))
                        .map_err(|payload| panic_message(payload.as_ref()))
                });
                self.starts.insert(handle.id(), (key, Instant::now()));
                self.r.oldest_apart(self.oldest());
                return;
            }
        }
        let verdict = inline(&mut self.r, &key, seen);
        if matches!(key, Key::Declaration | Key::Full) {
            // The declaration may have been replaced: claims are worked out anew.
            self.queue.forget_claims();
        }
        self.done(&key, verdict);
    }

    /// A reconcile apart ended (or its thread was lost): taken back, and the queue told; its
    /// claim is released only then.
    fn joined(&mut self, joined: Result<(tokio::task::Id, Result<R::Back, String>), JoinError>) {
        let id = match &joined {
            Ok((id, _)) => *id,
            Err(e) => e.id(),
        };
        let started = self.starts.remove(&id);
        self.r.oldest_apart(self.oldest());
        match (joined, started) {
            (Ok((_, back)), Some((key, started))) => {
                let verdict = self.r.take_back(&key, started, back);
                self.done(&key, verdict);
            }
            // Panics are caught inside; a join error is the runtime going away.
            (Err(e), Some((key, _))) => {
                self.r.lost(Some(&key), &e);
                self.done(&key, Verdict::Failed);
            }
            (Err(e), None) => self.r.lost(None, &e),
            // Every task is noted as it is spawned, before it can be joined.
            (Ok(_), None) => {}
        }
    }

    /// Tells the queue how a key ended, and the reconciler what the queue answered.
    fn done(&mut self, key: &Key, verdict: Verdict) {
        let contest = self.queue.done(key, verdict);
        let held_until = if verdict == Verdict::Corrected { self.queue.held(key) } else { None };
        let told = Told { contest, held_until, stats: self.queue.stats() };
        self.r.done(key, verdict, told);
    }

    fn oldest(&self) -> Option<std::time::Instant> {
        self.starts.values().map(|(_, at)| *at).min().map(Instant::into_std)
    }
}

/// Reconciles `key` inline, as the runner does, and survives a panic in it: the reconciler is
/// told (`Reconcile::panicked`) and the key fails (issue 12, fault 10). A bug in one applier
/// must not stop the agent from putting back everything else, nor leave it running with a dead
/// runner. On a multi-threaded runtime the reconcile runs in `block_in_place`, so the intake
/// goes on meanwhile; on a current-thread one (the tests', under paused time) it simply runs.
pub(super) fn inline<R: Reconcile>(r: &mut R, key: &Key, seen: Instant) -> Verdict {
    let mut run = || {
        // `AssertUnwindSafe`: what a panic can leave half-done is the reconcile's own work, and
        // `panicked` drops what the reconciler keeps that a panic could leave mid-call.
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| r.reconcile(key, seen))) {
            Ok(verdict) => verdict,
            Err(payload) => r.panicked(key, &panic_message(payload.as_ref())),
        }
    };
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(run),
        _ => run(),
    }
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

#[cfg(test)]
mod tests;
