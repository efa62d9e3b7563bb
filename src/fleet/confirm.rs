//! Confirm or go back (issue 25, point 3): a node that applied a new generation read from etcd
//! proves, within the confirmation window (`run --confirm-window`, 60 s by default), that it can
//! still reach etcd: it drops its connection, dials afresh (the endpoint's name resolved again,
//! the TLS files read again) and has etcd answer a linearizable read of its own status key.
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
//! Issue 42: the task says which generation the node will not go back from by itself
//! (`confirmed`, carried by the status for the rollout's gate); a rollout's abort or promote ends
//! its candidate's window, and the generation an abort brings back is not armed (the candidate
//! is no fallback); the open window is recorded in the state directory and honoured after a
//! restart (`pending`).
//!
//! The decision is `Window`, pure (its clock is given); `run` is the task around it, started by
//! `daemon` beside the status writer, which makes the round trip itself (`Trip`) and says what it
//! decided in `confirmed`. The status writer waits a moment for it after a new generation's pass
//! (`status::CONFIRM_WAIT`), so that one write carries the generation and its confirmation.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::pending::{Resume, WindowFile};
use crate::controller::Applied;
use crate::generations::{Generations, Hold, Reverted};
use crate::system::etcd::Etcd;
use crate::telemetry::{events, Event as _, Metrics};

/// The window when not told otherwise (`--confirm-window`).
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(60);

/// The longest a node waits, at random, before the redial that confirms a new generation.
const REDIAL_SPREAD: Duration = Duration::from_secs(1);

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
    /// The declarations the source put in the cache in this run (and the one it found there at
    /// its start), the newest last, a few: the revision each was read at, and the rollout whose
    /// candidate it was read in place of the scope's keys, if any (hole 2 of issue 42: abort and
    /// promote end the confirmation of a candidate).
    pub cached: Vec<(i64, Option<String>)>,
}

/// How many of the cache's declarations `Contact::cached` keeps.
const CACHED_KEPT: usize = 16;

impl Contact {
    /// The source put the declaration read at `revision` in the cache (`rollout`: the rollout
    /// whose candidate it is).
    pub fn cached(&mut self, revision: i64, rollout: Option<String>) {
        self.cached.push((revision, rollout));
        let over = self.cached.len().saturating_sub(CACHED_KEPT);
        self.cached.drain(..over);
    }

    /// Whether the declaration cached at `revision` came as the node's admission to a rollout
    /// was withdrawn (an abort): the one cached before it was that rollout's candidate, and it is
    /// not. Known across a restart too: the declaration found cached at the start is the first.
    pub fn withdrawn_at(&self, revision: Option<i64>) -> bool {
        let Some(i) = revision.and_then(|r| self.cached.iter().rposition(|(c, _)| *c <= r)) else {
            return false;
        };
        let now = &self.cached[i].1;
        i.checked_sub(1)
            .and_then(|b| self.cached.get(b))
            .is_some_and(|(_, before)| before.is_some() && before != now)
    }

    /// The rollout whose candidate the declaration cached at `revision` is (`None`: none, or not
    /// known).
    pub fn rollout_at(&self, revision: Option<i64>) -> Option<String> {
        let revision = revision?;
        self.cached.iter().rev().find(|(r, _)| *r <= revision).and_then(|(_, rollout)| rollout.clone())
    }

    /// A call answered.
    pub fn answered(&mut self) {
        self.error = None;
    }

    /// A call that failed, and why.
    pub fn failed(&mut self, error: String) {
        self.error = Some(error);
    }
}

/// A round trip etcd answered: the window's ask it was made for (`asked`; made after that
/// ask's new connection), and the generation and revision that window was opened for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ack {
    /// The ask (`Window`'s count) the round trip was made for.
    pub asked: u64,
    /// The generation the round trip confirms.
    pub generation: Option<u64>,
    /// The revision the round trip confirms.
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
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pending {
    /// The new generation.
    pub generation: u64,
    /// The generation in force before it: the one gone back to.
    pub previous: u64,
    /// The revision it was read at.
    pub revision: i64,
    /// When the window closes.
    pub deadline: Instant,
    /// The round trip's ask: an ack made for an earlier one proves nothing.
    pub asked: u64,
    /// The rollout whose candidate the generation is, if any: its window ends with the
    /// node's admission (abort) or with the candidate made the scope's declaration (promote).
    pub rollout: Option<String>,
}

/// What one thing seen did to the window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Nothing to say.
    Nothing,
    /// A window opened: drop the connection and make a round trip on a new one.
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
    /// A window was replaced, or none armed: the record of a declaration up to this revision
    /// is done with.
    Settled(Option<i64>),
}

/// The confirmation window's decision, pure: fed what the controller applied, what etcd
/// acknowledged, what the source cached, and the time.
#[derive(Debug)]
pub struct Window {
    length: Duration,
    /// The generation and revision last seen completed (a pass ended with them).
    current: (Option<u64>, Option<i64>),
    /// The rollout whose candidate the current generation is, if any.
    current_rollout: Option<String>,
    pending: Option<Pending>,
    /// A window an earlier run of the agent recorded and did not close (`pending::resume`).
    primed: Option<super::pending::Primed>,
    /// The generation last seen put in force, its pass ended or not.
    in_force: Option<u64>,
    asked: u64,
}

impl Window {
    /// A window of `length` (zero: none), on a node whose generation in force is `in_force`
    /// (as the state directory says it before the first pass).
    pub fn new(length: Duration, in_force: Option<u64>) -> Window {
        Window {
            length,
            current: (in_force, None),
            current_rollout: None,
            pending: None,
            primed: None,
            in_force,
            asked: 0,
        }
    }

    /// A window of `length` on a node that recorded one and restarted before it closed: the
    /// generation it had before is taken as the one in force, so that the recorded one, put in
    /// force again, is a change, armed with the recorded deadline.
    pub fn resumed(length: Duration, primed: super::pending::Primed) -> Window {
        let mut w = Window::new(length, Some(primed.previous));
        w.primed = Some(primed);
        w
    }

    /// The generation last seen completed (its pass ended), or in force at the start.
    pub fn current(&self) -> Option<u64> {
        self.current.0
    }

    /// When the open window closes (or the recorded one, not armed again yet).
    pub fn deadline(&self) -> Option<Instant> {
        self.pending.as_ref().map(|p| p.deadline).or(self.primed.as_ref().map(|p| p.deadline))
    }

    /// What the controller applied, at `now`; `contact` what the source read and cached in this
    /// run. A new generation counts once its pass has ended: its generation and its revision
    /// have both moved (a generation put in force before its pass moves the first alone). It is
    /// armed only when it was read from etcd in this run (the last read at or past its
    /// revision), or by the run before (a window recorded, `resumed`): etcd answered just
    /// before the change, whatever the change did to the connection since. A node that applies
    /// its cache without having read it (started offline) is not. Nor is a generation reached
    /// by the withdrawal of the node's admission to a rollout (an abort): the candidate it
    /// replaces is no fallback.
    pub fn applied(&mut self, seen: Seen, contact: &Contact, now: Instant) -> Step {
        let rollout = contact.rollout_at(seen.revision);
        self.in_force = seen.generation.or(self.in_force);
        if seen.held {
            self.current = (seen.generation, seen.revision);
            self.current_rollout = None;
            self.primed = None;
            return self.pending.take().map_or(Step::Settled(None), Step::Cancelled);
        }
        let Some(generation) = seen.generation else { return Step::Nothing };
        let (before, before_revision) = self.current;
        if before == Some(generation) {
            self.current.1 = seen.revision;
            self.current_rollout = rollout;
            if self.pending.is_some() || self.primed.as_ref().is_some_and(|p| p.previous != generation) {
                return Step::Nothing;
            }
            self.primed = None;
            return Step::Settled(seen.revision);
        }
        if seen.revision == before_revision {
            // Put in force, its pass not ended yet.
            return Step::Nothing;
        }
        let withdrawn = self.current_rollout.as_ref().is_some_and(|r| rollout.as_ref() != Some(r))
            || contact.withdrawn_at(seen.revision);
        #[cfg(feature = "robust-mutant")] // tests/robust only (`window`): an abort's generation armed.
        let withdrawn = withdrawn && !crate::fleet::mutant("window");
        self.current = (Some(generation), seen.revision);
        self.current_rollout.clone_from(&rollout);
        // A newer generation replaces a window still open: it was read from etcd after the one
        // before was applied.
        self.pending = None;
        let primed = self.primed.take();
        let not = |why| Step::NotArmed { generation, why };
        if self.length.is_zero() {
            return not("the confirmation window is off (--confirm-window 0)");
        }
        if withdrawn {
            return not(
                "it came back as the node's admission to a rollout was withdrawn (an abort): the candidate it replaces is no generation to go back to",
            );
        }
        let Some(previous) = before else { return not("no generation before it to go back to") };
        let Some(revision) = seen.revision else { return not("its files name no etcd revision") };
        let recorded =
            primed.filter(|p| p.revision == revision && p.generation.is_none_or(|g| g == generation));
        if recorded.is_none() && contact.read.is_none_or(|r| r < revision) {
            return not(
                "it was not read from etcd by this run (etcd did not answer before it either): a node cut off before the change does not go back",
            );
        }
        self.asked += 1;
        let deadline = recorded.map_or(now + self.length, |p| p.deadline);
        let p = Pending { generation, previous, revision, deadline, asked: self.asked, rollout };
        self.pending = Some(p.clone());
        Step::Armed(p)
    }

    /// What the source cached: an open window for a rollout's candidate is cancelled once the
    /// node reads a later declaration that is not that candidate (its admission withdrawn by an
    /// abort, or the candidate made the scope's declaration by a promote). Returns it.
    pub fn cached(&mut self, contact: &Contact) -> Option<Pending> {
        let ended = |revision: i64, rollout: &Option<String>| {
            rollout.is_some() && contact.cached.iter().any(|(r, c)| *r > revision && c != rollout)
        };
        if let Some(p) = self.primed.take_if(|p| ended(p.revision, &p.rollout)) {
            return self.window_of(p);
        }
        let p = self.pending.as_ref()?;
        ended(p.revision, &p.rollout).then(|| self.pending.take()).flatten()
    }

    /// A recorded window as an open one: its generation is the one the earlier run knew, or the
    /// one put in force in this run; `None` when neither is known.
    fn window_of(&self, p: super::pending::Primed) -> Option<Pending> {
        let generation = p.generation.or(self.in_force.filter(|g| *g != p.previous))?;
        Some(Pending {
            generation,
            previous: p.previous,
            revision: p.revision,
            deadline: p.deadline,
            asked: 0,
            rollout: p.rollout,
        })
    }

    /// A round trip etcd answered: the open window is confirmed (and closed) when it was made
    /// for the window's ask, its generation and its revision.
    pub fn acked(&mut self, ack: Ack) -> Option<Pending> {
        let p = self.pending.as_ref()?;
        let confirms =
            ack.asked >= p.asked && ack.generation == Some(p.generation) && ack.revision == Some(p.revision);
        confirms.then(|| self.pending.take()).flatten()
    }

    /// Whether the open window is the one opened by ask `asked` (a round trip for an earlier
    /// one, closed or replaced since, is not made).
    pub fn waits_for(&self, asked: u64) -> bool {
        self.pending.as_ref().is_some_and(|p| p.asked == asked)
    }

    /// The open window, taken, when it has closed unconfirmed at `now`: the node goes back. A
    /// recorded window whose generation's pass has not ended again in this run closes too, from
    /// its generation (or the one in force, when the earlier run did not know its number).
    pub fn expired(&mut self, now: Instant) -> Option<Pending> {
        if self.pending.as_ref().is_some_and(|p| now >= p.deadline) {
            return self.pending.take();
        }
        let p = self.primed.take_if(|p| now >= p.deadline)?;
        self.window_of(p)
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
    /// The open window's record in the state directory (`pending`).
    pub file: Arc<WindowFile>,
    /// Whether declarations are signed (`--allowed-signers`): then the node never goes back by
    /// itself below the version it accepted for a scope (its high-water mark), so only a
    /// rollout's candidate, whose scope's declaration in force is the one gone back to, is gone
    /// back from (docs/decisions.md, "Issue 44, the fleet").
    pub signed: bool,
}

/// Why a window that closed unconfirmed is not gone back from: the generation before it is
/// below the high-water mark of a signed scope. `None`: it may be.
fn below_floor(signed: bool, p: &Pending) -> Option<String> {
    (signed && p.rollout.is_none()).then(|| {
        format!(
            "declarations are signed, and generation {} holds a version of a scope above the one generation {} holds: a node never goes back below what it accepted (its high-water mark); it stays on generation {}",
            p.generation, p.previous, p.generation
        )
    })
}

/// Before the first pass: the window an earlier run recorded, honoured (`pending::resume`).
/// Past its deadline, the node goes back at once (the hold is written before the controller's
/// first pass, which then applies it); still open, it is watched again for the time left.
/// Returns the window to run with, and the generation the node will not go back from.
pub async fn prepare(confirm: &Confirm, node: &str, metrics: &Metrics) -> (Window, Option<u64>) {
    let file = Arc::clone(&confirm.file);
    let record = tokio::task::spawn_blocking(move || file.load()).await.ok().flatten();
    let wall = crate::system::unix_secs();
    match super::pending::resume(record, confirm.in_force, confirm.window, wall, Instant::now()) {
        Resume::Fresh => {
            // Off now, or nothing recorded: nothing to keep either.
            settle(&confirm.file, i64::MAX).await;
            (Window::new(confirm.window, confirm.in_force), confirm.in_force)
        }
        Resume::GoBack { record, generation } => {
            let p = Pending {
                generation,
                previous: record.previous,
                revision: record.revision,
                deadline: Instant::now(),
                asked: 0,
                rollout: record.rollout,
            };
            if let Some(error) = below_floor(confirm.signed, &p) {
                events::FleetConfirm::NotReverted { node, generation, error: &error }.emit(metrics);
                settle(&confirm.file, p.revision).await;
                return (Window::new(confirm.window, Some(generation)), Some(generation));
            }
            let why = format!("{}, the agent restarted in between", reason(&p, confirm.window, None));
            go_back(&confirm.generations, &confirm.file, node, &p, why, metrics).await;
            (Window::new(confirm.window, Some(p.previous)), Some(p.previous))
        }
        Resume::Rearm { primed, record } => {
            let file = Arc::clone(&confirm.file);
            let written = tokio::task::spawn_blocking(move || file.store(&record)).await;
            if let Ok(Err(e)) = written {
                tracing::warn!(error = %e, "the confirmation window is watched again, but its deadline is not recorded");
            }
            tracing::info!(
                node,
                revision = primed.revision,
                "a confirmation window recorded before the agent restarted is open: confirming its generation by a round trip to etcd within {}, or going back to generation {}",
                crate::system::human(primed.deadline.saturating_duration_since(Instant::now())),
                primed.previous
            );
            let previous = primed.previous;
            (Window::resumed(confirm.window, primed), Some(previous))
        }
    }
}

/// Removes the window's record if it is for revision `upto` or an earlier one; said when it
/// cannot be (a restart would then watch a generation already decided, once more).
async fn settle(file: &Arc<WindowFile>, upto: i64) {
    let file = Arc::clone(file);
    if let Ok(Err(e)) = tokio::task::spawn_blocking(move || file.clear(upto)).await {
        tracing::warn!(error = %e, "a confirmation window is closed, but its record stays");
    }
}

/// Records the window that opened, with its generation and deadline (the wall clock's).
async fn record(file: &Arc<WindowFile>, p: &Pending) {
    let left = p.deadline.saturating_duration_since(Instant::now());
    let record = super::pending::Record {
        revision: p.revision,
        previous: p.previous,
        generation: Some(p.generation),
        deadline: Some(crate::system::unix_secs() + left.as_secs_f64().ceil() as u64),
        rollout: p.rollout.clone(),
    };
    let file = Arc::clone(file);
    if let Ok(Err(e)) = tokio::task::spawn_blocking(move || file.store(&record)).await {
        tracing::warn!(error = %e, "the confirmation window is open, but not recorded: a restart inside it keeps the generation");
    }
}

/// What the window task follows and tells, besides its window.
pub struct Channels {
    /// What the controller applied.
    pub applied: watch::Receiver<Applied>,
    /// What the source and the status writer found of etcd.
    pub contact: watch::Receiver<Contact>,
    /// The latest generation the node will not go back from by itself.
    pub confirmed: watch::Sender<Option<u64>>,
}

/// Follows what the controller applied until `shutdown`: opens a window for each new
/// generation, confirms it by a round trip on a new connection (`Trip`), and goes back when it
/// closes unconfirmed. Says in `confirmed` the latest generation the node will not go back from
/// by itself (the status carries it: `status::Summary::confirmed`): the one in force at the
/// start, then each one confirmed, or not armed, or whose window closed otherwise (a hold, an
/// abort or a promote); while a window is open it stays at the one before. Keeps the window's
/// record (`pending`) as the window goes. See the module's notes.
#[allow(clippy::too_many_arguments, reason = "what the window follows and tells, each from `daemon`")]
pub async fn run(
    confirm: Confirm,
    mut window: Window,
    etcd: Arc<Etcd>,
    node: String,
    channels: Channels,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) {
    let Confirm { window: length, generations, file, signed, .. } = confirm;
    let Channels { mut applied, mut contact, confirmed } = channels;
    let node = node.as_str();
    let status = super::status::status_key(node);
    // The round trip the open window waits for, being made, if any: a future of its own, so
    // that a read etcd does not answer never keeps the window from closing at its deadline.
    let mut making: Option<Making> = None;
    // Why its last try failed, for the hold's reason.
    let mut trip_error: Option<String> = None;
    loop {
        let deadline = window.deadline();
        tokio::select! {
            _ = shutdown.cancelled() => return,
            (t, made) = async { making.as_mut().expect("guarded").await }, if making.is_some() => {
                making = None;
                if !window.waits_for(t.asked) {
                    continue;
                }
                match made {
                    Ok(ack) => {
                        if let Some(p) = window.acked(ack) {
                            events::FleetConfirm::Confirmed { node, generation: p.generation, revision: p.revision }
                                .emit(&metrics);
                            settle(&file, p.revision).await;
                            confirmed.send_replace(Some(p.generation));
                        }
                    }
                    Err(()) => {
                        trip_error.clone_from(&t.error);
                        making = Some(attempt(t, &etcd, &status));
                    }
                }
            }
            _ = tokio::time::sleep_until(deadline.unwrap_or_else(Instant::now)), if deadline.is_some() => {
                let Some(p) = window.expired(Instant::now()) else { continue };
                if let Some(error) = below_floor(signed, &p) {
                    events::FleetConfirm::NotReverted { node, generation: p.generation, error: &error }.emit(&metrics);
                    settle(&file, p.revision).await;
                    confirmed.send_replace(Some(p.generation));
                    continue;
                }
                // The round trip's own error first: the source's last call may have been answered.
                making = None;
                let error = trip_error.take().or_else(|| contact.borrow().error.clone());
                go_back(&generations, &file, node, &p, reason(&p, length, error.as_deref()), &metrics).await;
            }
            changed = contact.changed() => {
                if changed.is_err() {
                    return;
                }
                let now = contact.borrow_and_update().clone();
                if let Some(p) = window.cached(&now) {
                    let why = "the node's admission to its rollout ended (an abort or a promote): the rollout decides";
                    events::FleetConfirm::Cancelled { node, generation: p.generation, why }.emit(&metrics);
                    settle(&file, p.revision).await;
                    confirmed.send_replace(Some(p.generation));
                }
            }
            changed = applied.changed() => {
                if changed.is_err() {
                    return;
                }
                let seen = Seen::of(&applied.borrow_and_update());
                let now = contact.borrow().clone();
                let step = window.applied(seen, &now, Instant::now());
                if let Some(t) = act(step, &window, node, &file, length, &confirmed, &metrics).await {
                    trip_error = None;
                    making = Some(attempt(t, &etcd, &status));
                }
            }
        }
    }
}

/// A try of a round trip, under way: the trip, and what its try gave.
type Making = std::pin::Pin<Box<dyn std::future::Future<Output = (Trip, Result<Ack, ()>)> + Send>>;

/// The next try of `t`, made at its time.
fn attempt(mut t: Trip, etcd: &Arc<Etcd>, status: &str) -> Making {
    let (etcd, status) = (Arc::clone(etcd), status.to_owned());
    Box::pin(async move {
        tokio::time::sleep_until(t.at).await;
        let made = t.make(&etcd, &status).await;
        (t, made)
    })
}

/// The round trip an open window waits for: a linearizable read of the node's own status key
/// (a key its role may read), on a connection dialled after the window opened. Rejected: the
/// status write itself as the round trip, as it was until issue 43. It proves the same (the name
/// resolved, the TLS files read, a member that reaches its quorum, the node's own user let in),
/// but it is a proposal through etcd's log, and the window's decision then needed a second
/// write to say it: at a fleet-wide change, three status writes a node where one is needed
/// (docs/decisions.md, "Confirm or go back").
struct Trip {
    /// The window's ask it is made for.
    asked: u64,
    /// The generation and revision it confirms.
    generation: u64,
    revision: i64,
    /// When it is made, or made again.
    at: Instant,
    /// How many tries failed in a row; the first dials a new connection before it.
    failed: u32,
    /// Why the last try failed, for the hold's reason.
    error: Option<String>,
}

impl Trip {
    /// The round trip for window `p`, made after a wait at random (up to a sixtieth of the
    /// window, 1 s at most: it delays the rollout's gate), so that a fleet-wide change does not
    /// have every node dial at once (issue 43).
    fn new(p: &Pending, length: Duration) -> Trip {
        Trip {
            asked: p.asked,
            generation: p.generation,
            revision: p.revision,
            at: Instant::now() + crate::system::up_to(REDIAL_SPREAD.min(length / 60)),
            failed: 0,
            error: None,
        }
    }

    /// Makes the round trip: the acknowledgement to give the window, or `Err` when etcd did not
    /// answer (then the trip is to be made again at `at`, backed off as a status write is).
    async fn make(&mut self, etcd: &Etcd, status: &str) -> Result<Ack, ()> {
        if self.failed == 0 {
            // A round trip on the connection held would prove nothing of a route the change
            // broke.
            etcd.reconnect().await;
        }
        // The failpoint `etcd-confirm-late` holds the read 30 s, as a member stopped mid-read
        // does (the fleet harness's SIGSTOP): the window's deadline must not wait for it.
        if crate::system::fs::failpoint_named("etcd-confirm-late") {
            tokio::time::sleep(Duration::from_secs(30)).await;
        }
        match etcd.range_between(status, &[], None).await {
            Ok(_) => Ok(Ack {
                asked: self.asked,
                generation: Some(self.generation),
                revision: Some(self.revision),
            }),
            Err(e) => {
                self.failed += 1;
                self.error = Some(e.to_string());
                self.at = Instant::now() + super::status::write_pause(self.failed);
                Err(())
            }
        }
    }
}

/// Does what one step of the window says: a window opened is recorded and its round trip
/// returned, to be made; a decision is said, its record removed, and `confirmed` moved.
async fn act(
    step: Step,
    window: &Window,
    node: &str,
    file: &Arc<WindowFile>,
    length: Duration,
    confirmed: &watch::Sender<Option<u64>>,
    metrics: &Metrics,
) -> Option<Trip> {
    match step {
        Step::Nothing => None,
        Step::Settled(upto) => {
            settle(file, upto.unwrap_or(i64::MAX)).await;
            None
        }
        Step::Armed(p) => {
            // Recorded first: once the log says the window is open, a restart honours it.
            record(file, &p).await;
            let within = crate::system::human(length);
            events::FleetConfirm::Armed {
                node,
                generation: p.generation,
                previous: p.previous,
                revision: p.revision,
                within: &within,
            }
            .emit(metrics);
            Some(Trip::new(&p, length))
        }
        Step::NotArmed { generation, why } => {
            events::FleetConfirm::NotArmed { node, generation, why }.emit(metrics);
            settle(file, window.current.1.unwrap_or(i64::MAX)).await;
            confirmed.send_replace(Some(generation));
            None
        }
        Step::Cancelled(p) => {
            let why = "a rollback's hold came: the hold decides";
            events::FleetConfirm::Cancelled { node, generation: p.generation, why }.emit(metrics);
            settle(file, i64::MAX).await;
            confirmed.send_replace(window.current());
            None
        }
    }
}

/// Writes the hold that takes the node back to `p.previous`, as `mesh-host rollback` would
/// (the controller watches it), unless a hold is there already (an operator's, just made); then
/// the window's record is done with.
async fn go_back(
    generations: &Generations,
    file: &Arc<WindowFile>,
    node: &str,
    p: &Pending,
    reason: String,
    metrics: &Metrics,
) {
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
            // The record stays: the next start tries again.
            events::FleetConfirm::NotReverted { node, generation: p.generation, error: &e }.emit(metrics);
            return;
        }
        Err(e) => {
            events::FleetConfirm::NotReverted { node, generation: p.generation, error: &e }.emit(metrics);
            return;
        }
    }
    settle(file, p.revision).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: Duration = Duration::from_secs(60);

    /// What the source read: its last read at `read`, nothing cached in a rollout.
    fn at(read: Option<i64>) -> Contact {
        Contact { read, ..Contact::default() }
    }

    fn seen(generation: u64, revision: i64) -> Seen {
        Seen { generation: Some(generation), revision: Some(revision), held: false }
    }

    /// Generation 2 put in force (its pass not ended), then its pass ended at revision 20.
    /// `read`: the revision the source last read; 20 or more when it read generation 2.
    fn apply_two(w: &mut Window, read: Option<i64>) -> Step {
        let now = Instant::now();
        assert_eq!(
            w.applied(seen(1, 10), &at(Some(10)), now),
            Step::Settled(Some(10)),
            "the generation in force at start"
        );
        assert_eq!(w.applied(seen(2, 10), &at(read), now), Step::Nothing, "in force, its pass not ended");
        w.applied(seen(2, 20), &at(read), now)
    }

    #[test]
    fn with_signed_declarations_only_a_candidates_window_goes_back() {
        let p = |rollout: Option<&str>| Pending {
            generation: 4,
            previous: 3,
            revision: 9,
            deadline: Instant::now(),
            asked: 0,
            rollout: rollout.map(str::to_owned),
        };
        let said = below_floor(true, &p(None)).unwrap();
        assert!(said.contains("never goes back below") && said.contains("stays on generation 4"), "{said}");
        assert_eq!(below_floor(true, &p(Some("rollout-1"))), None, "back to the declaration in force");
        assert_eq!(below_floor(false, &p(None)), None, "unsigned: as before");
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
        assert_eq!(w.acked(Ack { asked: p.asked, generation: Some(2), revision: Some(20) }), Some(p.clone()));
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
        assert_eq!(w.expired(Instant::now()), Some(p.clone()));
        assert_eq!(w.expired(Instant::now()), None, "once");
        // The hold the node made puts generation 1 in force: no window for it.
        let held = Seen { generation: Some(1), revision: Some(10), held: true };
        assert_eq!(w.applied(held, &at(None), Instant::now()), Step::Settled(None));
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
            fresh.applied(seen(1, 10), &at(Some(10)), Instant::now()),
            Step::NotArmed { generation: 1, .. }
        ));
        // The generation the node had before it restarted, applied again: not a change.
        let mut restarted = Window::new(W, Some(4));
        assert_eq!(restarted.applied(seen(4, 40), &at(Some(40)), Instant::now()), Step::Settled(Some(40)));
        // A new one read at start-up, etcd reached: armed, back to the one before the restart.
        let mut caught = Window::new(W, Some(4));
        assert!(matches!(
            caught.applied(seen(5, 50), &at(Some(51)), Instant::now()),
            Step::Armed(Pending { previous: 4, .. })
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn an_operators_rollback_closes_the_window_and_its_release_opens_one() {
        let mut w = Window::new(W, Some(1));
        let Step::Armed(p) = apply_two(&mut w, Some(20)) else { panic!("not armed") };
        let held = Seen { generation: Some(1), revision: Some(10), held: true };
        assert_eq!(w.applied(held, &at(Some(20)), Instant::now()), Step::Cancelled(p));
        assert_eq!(w.deadline(), None);
        // Released: the source's generation 2 in force again, a window for it again.
        assert!(matches!(
            w.applied(seen(2, 20), &at(Some(20)), Instant::now()),
            Step::Armed(Pending { previous: 1, .. })
        ));
    }

    /// The source's contact after it cached the pre-rollout declaration at 10, the candidate of
    /// rollout `r` at 20, and then `more`.
    fn in_rollout(more: &[(i64, Option<&str>)]) -> Contact {
        let mut c = at(Some(20));
        c.cached(10, None);
        c.cached(20, Some("r".into()));
        for (revision, rollout) in more {
            c.cached(*revision, rollout.map(str::to_owned));
            c.read = Some(*revision);
        }
        c
    }

    #[tokio::test(start_paused = true)]
    async fn the_generation_an_abort_brings_back_is_not_armed_with_the_candidate_as_its_fallback() {
        let mut w = Window::new(W, Some(1));
        let now = Instant::now();
        let candidate = in_rollout(&[]);
        assert_eq!(w.applied(seen(1, 10), &candidate, now), Step::Settled(Some(10)));
        assert_eq!(w.applied(seen(2, 10), &candidate, now), Step::Nothing, "in force, its pass not ended");
        let Step::Armed(p) = w.applied(seen(2, 20), &candidate, now) else { panic!("not armed") };
        assert_eq!(p.rollout.as_deref(), Some("r"));
        assert!(w.acked(Ack { asked: p.asked, generation: Some(2), revision: Some(20) }).is_some());
        // Aborted: generation 1 read again (no admission) at 30.
        let aborted = in_rollout(&[(30, None)]);
        assert_eq!(w.cached(&aborted), None, "no window open");
        assert_eq!(w.applied(seen(1, 20), &aborted, now), Step::Nothing);
        let step = w.applied(seen(1, 30), &aborted, now);
        assert!(
            matches!(step, Step::NotArmed { generation: 1, why } if why.contains("withdrawn")),
            "{step:?}"
        );
        tokio::time::advance(W * 2).await;
        assert_eq!(w.expired(Instant::now()), None);
        // A later declaration, outside any rollout, is armed as ever, back to generation 1.
        let later = in_rollout(&[(30, None), (40, None)]);
        assert!(matches!(w.applied(seen(3, 40), &later, now), Step::Armed(Pending { previous: 1, .. })));
    }

    #[tokio::test(start_paused = true)]
    async fn an_abort_or_a_promote_cancels_the_candidates_open_window() {
        for (name, after) in [("abort", 1), ("promote", 2)] {
            let mut w = Window::new(W, Some(1));
            let now = Instant::now();
            let Step::Armed(p) = w.applied(seen(2, 20), &in_rollout(&[]), now) else {
                panic!("{name}: not armed")
            };
            // Another read of the same candidate cancels nothing.
            assert_eq!(w.cached(&in_rollout(&[(25, Some("r"))])), None, "{name}");
            let ended = in_rollout(&[(30, None)]);
            assert_eq!(w.cached(&ended), Some(p), "{name}");
            assert_eq!(w.deadline(), None, "{name}");
            // The promoted candidate is the same generation: nothing to do.
            let step = w.applied(seen(after, 30), &ended, now);
            if after == 2 {
                assert_eq!(step, Step::Settled(Some(30)), "{name}");
            } else {
                assert!(matches!(step, Step::NotArmed { .. }), "{name}: {step:?}");
            }
            tokio::time::advance(W * 2).await;
            assert_eq!(w.expired(Instant::now()), None, "{name}");
        }
    }

    fn primed(generation: Option<u64>, left: Duration) -> super::super::pending::Primed {
        super::super::pending::Primed {
            revision: 20,
            previous: 1,
            generation,
            rollout: None,
            deadline: Instant::now() + left,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_window_recorded_before_a_restart_is_armed_again_with_its_deadline_even_offline() {
        let left = Duration::from_secs(25);
        let mut w = Window::resumed(W, primed(Some(2), left));
        assert_eq!(w.deadline(), Some(Instant::now() + left));
        // Put in force again (no pass has ended in this run: no revision), then its pass ends:
        // the source never read etcd in this run.
        assert_eq!(
            w.applied(Seen { revision: None, ..seen(2, 0) }, &at(None), Instant::now()),
            Step::Nothing
        );
        let Step::Armed(p) = w.applied(seen(2, 20), &at(None), Instant::now()) else { panic!("not armed") };
        assert_eq!((p.previous, p.deadline), (1, Instant::now() + left));
        tokio::time::advance(left).await;
        assert_eq!(w.expired(Instant::now()), Some(p));
    }

    #[tokio::test(start_paused = true)]
    async fn a_recorded_window_whose_pass_never_ends_again_closes_at_its_deadline() {
        let left = Duration::from_secs(5);
        let mut w = Window::resumed(W, primed(None, left));
        // Its number was not known; the generation put in force is it.
        let in_force = Seen { revision: None, ..seen(2, 0) };
        assert_eq!(w.applied(in_force, &at(None), Instant::now()), Step::Nothing);
        tokio::time::advance(left - Duration::from_millis(1)).await;
        assert_eq!(w.expired(Instant::now()), None);
        tokio::time::advance(Duration::from_millis(1)).await;
        let p = w.expired(Instant::now()).expect("closed");
        assert_eq!((p.generation, p.previous, p.revision), (2, 1, 20));
        assert_eq!(w.deadline(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_recorded_window_ends_when_the_generation_before_it_is_applied() {
        let mut w = Window::resumed(W, primed(None, Duration::from_secs(5)));
        assert_eq!(w.applied(seen(1, 10), &at(None), Instant::now()), Step::Settled(Some(10)));
        assert_eq!(w.deadline(), None);
        tokio::time::advance(W).await;
        assert_eq!(w.expired(Instant::now()), None);
    }

    #[tokio::test(start_paused = true)]
    async fn an_abort_made_while_the_agent_was_down_is_known_from_the_cache_it_found() {
        // Stopped on the candidate (generation 2, cached at 20 for rollout r); aborted meanwhile;
        // the first read at the start caches generation 1 again at 30, and its pass is the first.
        let mut w = Window::new(W, Some(2));
        let mut c = at(Some(30));
        c.cached(20, Some("r".into()));
        c.cached(30, None);
        let step = w.applied(seen(1, 30), &c, Instant::now());
        assert!(
            matches!(step, Step::NotArmed { generation: 1, why } if why.contains("withdrawn")),
            "{step:?}"
        );
        // Without the abort (a put after the rollout was promoted, say), armed as ever.
        let mut w = Window::new(W, Some(2));
        let mut c = at(Some(30));
        c.cached(20, None);
        c.cached(30, None);
        assert!(matches!(
            w.applied(seen(3, 30), &c, Instant::now()),
            Step::Armed(Pending { previous: 2, .. })
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn a_recorded_candidates_window_ends_with_a_promote_read_after_the_restart() {
        let mut p = primed(Some(2), Duration::from_secs(25));
        p.rollout = Some("r".into());
        let mut w = Window::resumed(W, p);
        let mut c = at(Some(30));
        c.cached(20, Some("r".into()));
        assert_eq!(w.cached(&c), None, "the candidate is still what is cached");
        c.cached(30, None);
        let ended = w.cached(&c).expect("cancelled");
        assert_eq!((ended.generation, ended.previous), (2, 1));
        assert_eq!(w.deadline(), None);
        tokio::time::advance(W).await;
        assert_eq!(w.expired(Instant::now()), None);
    }
}
