//! Confirm or go back (issue 25, point 3): a node that applied a new generation read from etcd
//! proves, within the confirmation window (`run --confirm-window`, 60 s by default), that it can
//! still reach etcd: it drops its connection, dials afresh (the endpoint's name resolved again,
//! the TLS files read again) and has its status at the new revision written and acknowledged.
//! If etcd answered before the change and that round trip does not come within the window, the
//! node goes back to the generation it had before by itself, by the same hold `mesh-host
//! rollback` writes (`hold.json`, with a reason and `reverted` set), which the controller, who
//! watches it, applies as an ordinary pass; the status says `reverted` once etcd answers again.
//!
//! A node that could not reach etcd before the change is not armed: only a generation this run
//! of the agent read from etcd is (the read is the proof that etcd answered just before), so a
//! node started offline on its cache applies it and stays; the window would only measure etcd's
//! outage. Why a new connection and not the one held, and what the daemon does with its source
//! meanwhile: docs/decisions.md, "Confirm or go back".
//!
//! The decision is `Window`, pure (its clock is given); `run` is the task around it, started by
//! `daemon` beside the status writer, which does the round trip when asked (`Ack`).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::controller::Applied;
use crate::generations::{Generations, Hold, Reverted};
use crate::system::etcd::Etcd;
use crate::telemetry::{events, Event as _, Metrics};

/// The window when not told otherwise (`--confirm-window`).
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(60);

/// Who a hold the node makes itself says made it.
pub const BY: &str = "mesh-host (confirmation window)";

/// What the node's calls to etcd found: the revision the source last read (the proof that a
/// generation was read from etcd by this run of the agent, so that etcd answered before the
/// change), and why the last call (a read, a status written) failed, while it did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Contact {
    /// The revision of the source's last whole read in this run; `None` before one succeeded.
    pub read: Option<i64>,
    /// Why the last call failed, while it did.
    pub error: Option<String>,
}

impl Contact {
    /// A call answered.
    pub fn answered(&mut self) {
        self.error = None;
    }

    /// A call that failed, and why.
    pub fn failed(&mut self, error: String) {
        self.error = Some(error);
    }
}

/// A status the status writer had acknowledged by etcd: what it said, and the latest ask it was
/// written after (`asked`; the write began after the ask, so after the connection was dropped).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ack {
    /// The latest ask (`Window`'s count) seen before the write began.
    pub asked: u64,
    /// The generation the status said.
    pub generation: Option<u64>,
    /// The revision the status said.
    pub revision: Option<i64>,
}

/// What the controller applied, as the window sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seen {
    /// The generation in force.
    pub generation: Option<u64>,
    /// The revision of the files the last full pass applied (`status::revision_of`): it moves
    /// once the pass of a new generation has ended, not when the generation is put in force.
    pub revision: Option<i64>,
    /// A hold (an operator's rollback, or the node's own) stands.
    pub held: bool,
}

impl Seen {
    /// What `Applied` says.
    pub fn of(a: &Applied) -> Seen {
        Seen {
            generation: a.generation,
            revision: super::status::revision_of(&a.sources),
            held: a.hold.is_some(),
        }
    }
}

/// A window open: a new generation waiting for its round trip.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pending {
    /// The new generation.
    pub generation: u64,
    /// The generation in force before it: the one gone back to.
    pub previous: u64,
    /// The revision it was read at.
    pub revision: i64,
    /// When the window closes.
    pub deadline: Instant,
    /// The ask the status writer is to answer after: an ack from before it proves nothing.
    pub asked: u64,
}

/// What one thing seen did to the window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Nothing to say.
    Nothing,
    /// A window opened: drop the connection and ask the status writer for a round trip.
    Armed(Pending),
    /// A new generation applied without a window, and why.
    NotArmed {
        /// The generation.
        generation: u64,
        /// Why it is not watched.
        why: &'static str,
    },
    /// A hold came (an operator's rollback) while a window was open: the window closes.
    Cancelled(Pending),
}

/// The confirmation window's decision, pure: fed what the controller applied, what etcd
/// acknowledged, and the time.
#[derive(Debug)]
pub struct Window {
    length: Duration,
    /// The generation and revision last seen completed (a pass ended with them).
    current: (Option<u64>, Option<i64>),
    pending: Option<Pending>,
    asked: u64,
}

impl Window {
    /// A window of `length` (zero: none), on a node whose generation in force is `in_force`
    /// (as the state directory says it before the first pass).
    pub fn new(length: Duration, in_force: Option<u64>) -> Window {
        Window { length, current: (in_force, None), pending: None, asked: 0 }
    }

    /// The generation last seen completed (its pass ended), or in force at the start.
    pub fn current(&self) -> Option<u64> {
        self.current.0
    }

    /// When the open window closes.
    pub fn deadline(&self) -> Option<Instant> {
        self.pending.map(|p| p.deadline)
    }

    /// What the controller applied, at `now`; `read` the revision of the source's last read of
    /// etcd in this run. A new generation counts once its pass has ended: its generation and its
    /// revision have both moved (a generation put in force before its pass moves the first
    /// alone). It is armed only when it was read from etcd in this run (`read` at or past its
    /// revision): etcd answered just before the change, whatever the change did to the
    /// connection since. A node that applies its cache without having read it (started offline)
    /// is not.
    pub fn applied(&mut self, seen: Seen, read: Option<i64>, now: Instant) -> Step {
        if seen.held {
            self.current = (seen.generation, seen.revision);
            return self.pending.take().map_or(Step::Nothing, Step::Cancelled);
        }
        let Some(generation) = seen.generation else { return Step::Nothing };
        let (before, before_revision) = self.current;
        if before == Some(generation) {
            self.current.1 = seen.revision;
            return Step::Nothing;
        }
        if seen.revision == before_revision {
            // Put in force, its pass not ended yet.
            return Step::Nothing;
        }
        self.current = (Some(generation), seen.revision);
        // A newer generation replaces a window still open: it was read from etcd after the one
        // before was applied.
        self.pending = None;
        let not = |why| Step::NotArmed { generation, why };
        if self.length.is_zero() {
            return not("the confirmation window is off (--confirm-window 0)");
        }
        let Some(previous) = before else { return not("no generation before it to go back to") };
        let Some(revision) = seen.revision else { return not("its files name no etcd revision") };
        if read.is_none_or(|r| r < revision) {
            return not(
                "it was not read from etcd by this run (etcd did not answer before it either): a node cut off before the change does not go back",
            );
        }
        self.asked += 1;
        let p = Pending { generation, previous, revision, deadline: now + self.length, asked: self.asked };
        self.pending = Some(p);
        Step::Armed(p)
    }

    /// A status acknowledged by etcd: the open window is confirmed (and closed) when it says
    /// the new generation at its revision and was written after the window's ask.
    pub fn acked(&mut self, ack: Ack) -> Option<Pending> {
        let p = self.pending?;
        let confirms =
            ack.asked >= p.asked && ack.generation == Some(p.generation) && ack.revision == Some(p.revision);
        confirms.then(|| self.pending.take()).flatten()
    }

    /// The open window, taken, when it has closed unconfirmed at `now`: the node goes back.
    pub fn expired(&mut self, now: Instant) -> Option<Pending> {
        let p = self.pending?;
        (now >= p.deadline).then(|| self.pending.take()).flatten()
    }
}

/// Why the node went back, as the hold and the status say it.
pub fn reason(p: &Pending, window: Duration, error: Option<&str>) -> String {
    let last = error.map(|e| format!("; last: {e}")).unwrap_or_default();
    format!(
        "no etcd round trip within {} of applying generation {} (revision {}){last}",
        crate::system::human(window),
        p.generation,
        p.revision
    )
}

/// What the task is given.
pub struct Confirm {
    /// The window's length; zero for none.
    pub window: Duration,
    /// The node's generations, where the hold is written.
    pub generations: Generations,
    /// The generation in force before the first pass.
    pub in_force: Option<u64>,
}

/// Follows what the controller applied until `shutdown`: opens a window for each new
/// generation, has it confirmed by the status writer (`ask`, `acked`), and goes back when it
/// closes unconfirmed. Says in `confirmed` the latest generation the node will not go back from
/// by itself (the status carries it: `status::Summary::confirmed`): the one in force at the
/// start, then each one confirmed, or not armed, or whose window a hold closed; while a window
/// is open it stays at the one before. See the module's notes.
#[allow(clippy::too_many_arguments, reason = "what the window follows and tells, each from `daemon`")]
pub async fn run(
    confirm: Confirm,
    etcd: Arc<Etcd>,
    node: String,
    mut applied: watch::Receiver<Applied>,
    contact: watch::Receiver<Contact>,
    mut acked: watch::Receiver<Ack>,
    ask: watch::Sender<u64>,
    confirmed: watch::Sender<Option<u64>>,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) {
    let Confirm { window: length, generations, in_force } = confirm;
    let mut window = Window::new(length, in_force);
    let node = node.as_str();
    confirmed.send_replace(in_force);
    loop {
        let deadline = window.deadline();
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep_until(deadline.unwrap_or_else(Instant::now)), if deadline.is_some() => {
                let Some(p) = window.expired(Instant::now()) else { continue };
                let error = contact.borrow().error.clone();
                go_back(&generations, node, &p, reason(&p, length, error.as_deref()), &metrics).await;
            }
            changed = applied.changed() => {
                if changed.is_err() {
                    return;
                }
                let seen = Seen::of(&applied.borrow_and_update());
                let read = contact.borrow().read;
                match window.applied(seen, read, Instant::now()) {
                    Step::Nothing => {}
                    Step::Armed(p) => {
                        let within = crate::system::human(length);
                        events::FleetConfirm::Armed {
                            node, generation: p.generation, previous: p.previous, revision: p.revision, within: &within,
                        }
                        .emit(&metrics);
                        // A round trip on the connection held would prove nothing of a route
                        // the change broke: a new one is dialled for it.
                        etcd.reconnect().await;
                        ask.send_replace(p.asked);
                    }
                    Step::NotArmed { generation, why } => {
                        events::FleetConfirm::NotArmed { node, generation, why }.emit(&metrics);
                        confirmed.send_replace(Some(generation));
                    }
                    Step::Cancelled(p) => {
                        events::FleetConfirm::Cancelled { node, generation: p.generation }.emit(&metrics);
                        confirmed.send_replace(window.current());
                    }
                }
            }
            changed = acked.changed() => {
                if changed.is_err() {
                    return;
                }
                let ack = *acked.borrow_and_update();
                if let Some(p) = window.acked(ack) {
                    events::FleetConfirm::Confirmed { node, generation: p.generation, revision: p.revision }
                        .emit(&metrics);
                    confirmed.send_replace(Some(p.generation));
                }
            }
        }
    }
}

/// Writes the hold that takes the node back to `p.previous`, as `mesh-host rollback` would
/// (the controller watches it), unless a hold is there already (an operator's, just made).
async fn go_back(generations: &Generations, node: &str, p: &Pending, reason: String, metrics: &Metrics) {
    let hold = Hold {
        generation: p.previous,
        since: crate::system::unix_secs(),
        by: BY.into(),
        reason: Some(reason.clone()),
        reverted: Some(Reverted { from: p.generation, revision: Some(p.revision) }),
    };
    let gens = generations.clone();
    let written = tokio::task::spawn_blocking(move || match gens.hold()? {
        Some(there) => Ok(Some(there)),
        None => gens.set_hold(&hold).map(|()| None),
    })
    .await;
    match written {
        Ok(Ok(None)) => events::FleetConfirm::Reverted {
            node,
            from: p.generation,
            to: p.previous,
            revision: p.revision,
            reason: &reason,
        }
        .emit(metrics),
        Ok(Ok(Some(there))) => events::FleetConfirm::NotReverted {
            node,
            generation: p.generation,
            error: &format!("a hold at generation {} is there already; it stands", there.generation),
        }
        .emit(metrics),
        Ok(Err(e)) => {
            events::FleetConfirm::NotReverted { node, generation: p.generation, error: &e }.emit(metrics)
        }
        Err(e) => {
            events::FleetConfirm::NotReverted { node, generation: p.generation, error: &e }.emit(metrics)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: Duration = Duration::from_secs(60);

    fn seen(generation: u64, revision: i64) -> Seen {
        Seen { generation: Some(generation), revision: Some(revision), held: false }
    }

    /// Generation 2 put in force (its pass not ended), then its pass ended at revision 20.
    /// `read`: the revision the source last read; 20 or more when it read generation 2.
    fn apply_two(w: &mut Window, read: Option<i64>) -> Step {
        let now = Instant::now();
        assert_eq!(w.applied(seen(1, 10), Some(10), now), Step::Nothing, "the generation in force at start");
        assert_eq!(w.applied(seen(2, 10), read, now), Step::Nothing, "in force, its pass not ended");
        w.applied(seen(2, 20), read, now)
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_generation_confirmed_in_time_closes_its_window() {
        let mut w = Window::new(W, Some(1));
        let Step::Armed(p) = apply_two(&mut w, Some(20)) else { panic!("not armed") };
        assert_eq!((p.generation, p.previous, p.revision), (2, 1, 20));
        assert_eq!(w.deadline(), Some(Instant::now() + W));
        // An ack written before the ask proves nothing of the new route.
        let early = Ack { asked: p.asked - 1, generation: Some(2), revision: Some(20) };
        assert_eq!(w.acked(early), None);
        // Nor one of the generation before.
        assert_eq!(w.acked(Ack { asked: p.asked, generation: Some(1), revision: Some(10) }), None);
        tokio::time::advance(W - Duration::from_secs(1)).await;
        assert_eq!(w.expired(Instant::now()), None);
        assert_eq!(w.acked(Ack { asked: p.asked, generation: Some(2), revision: Some(20) }), Some(p));
        tokio::time::advance(W).await;
        assert_eq!(w.expired(Instant::now()), None, "confirmed: nothing to go back from");
        assert_eq!(w.deadline(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_window_that_closes_unconfirmed_goes_back_to_the_generation_before() {
        let mut w = Window::new(W, Some(1));
        let Step::Armed(p) = apply_two(&mut w, Some(20)) else { panic!("not armed") };
        tokio::time::advance(W - Duration::from_millis(1)).await;
        assert_eq!(w.expired(Instant::now()), None);
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(w.expired(Instant::now()), Some(p));
        assert_eq!(w.expired(Instant::now()), None, "once");
        // The hold the node made puts generation 1 in force: no window for it.
        let held = Seen { generation: Some(1), revision: Some(10), held: true };
        assert_eq!(w.applied(held, None, Instant::now()), Step::Nothing);
        assert!(reason(&p, W, Some("refused")).starts_with(
            "no etcd round trip within 1 min of applying generation 2 (revision 20); last: refused"
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn a_node_cut_off_before_the_change_is_not_armed() {
        // Started offline: the source never read etcd.
        assert!(matches!(
            apply_two(&mut Window::new(W, Some(1)), None),
            Step::NotArmed { generation: 2, .. }
        ));
        // Read etcd, but not this generation: it came from the cache.
        let mut w = Window::new(W, Some(1));
        assert!(matches!(apply_two(&mut w, Some(10)), Step::NotArmed { generation: 2, .. }));
        tokio::time::advance(W * 2).await;
        assert_eq!(w.expired(Instant::now()), None);
    }

    #[tokio::test(start_paused = true)]
    async fn no_window_when_off_or_with_nothing_to_go_back_to() {
        assert!(matches!(
            apply_two(&mut Window::new(Duration::ZERO, Some(1)), Some(20)),
            Step::NotArmed { .. }
        ));
        let mut fresh = Window::new(W, None);
        assert!(matches!(
            fresh.applied(seen(1, 10), Some(10), Instant::now()),
            Step::NotArmed { generation: 1, .. }
        ));
        // The generation the node had before it restarted, applied again: not a change.
        let mut restarted = Window::new(W, Some(4));
        assert_eq!(restarted.applied(seen(4, 40), Some(40), Instant::now()), Step::Nothing);
        // A new one read at start-up, etcd reached: armed, back to the one before the restart.
        let mut caught = Window::new(W, Some(4));
        assert!(matches!(
            caught.applied(seen(5, 50), Some(51), Instant::now()),
            Step::Armed(Pending { previous: 4, .. })
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn an_operators_rollback_closes_the_window_and_its_release_opens_one() {
        let mut w = Window::new(W, Some(1));
        let Step::Armed(p) = apply_two(&mut w, Some(20)) else { panic!("not armed") };
        let held = Seen { generation: Some(1), revision: Some(10), held: true };
        assert_eq!(w.applied(held, Some(20), Instant::now()), Step::Cancelled(p));
        assert_eq!(w.deadline(), None);
        // Released: the source's generation 2 in force again, a window for it again.
        assert!(matches!(
            w.applied(seen(2, 20), Some(20), Instant::now()),
            Step::Armed(Pending { previous: 1, .. })
        ));
    }
}
