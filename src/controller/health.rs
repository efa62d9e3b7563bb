//! Whether the agent is doing its job, for `/healthz` and systemd's watchdog.
//!
//! Shared state, and who touches it:
//! - `ready` is set once by `run` when the first apply has finished; read by `/healthz`.
//! - `heartbeat` is written by the worker after every reconcile (finished or panicked); read by
//!   `/healthz` and the watchdog task.
//! - `oldest_apart` is written by the worker when it starts or takes back a reconcile run apart
//!   (the start of the oldest still running, in seconds since the epoch, 0 for none); read by
//!   `/healthz` and the watchdog, so a reconcile stuck apart fails the check even while the
//!   worker goes on finishing others.
//! - `not_in_force` is written by the worker when a declaration is refused while none is in
//!   force, and cleared when one is accepted; read by `/healthz`.
//! - `refused` is written by the worker when a full pass refuses the declaration in force whole
//!   on this machine (a firewall found that the host cannot manage), and cleared when a full
//!   pass no longer does; read by `/healthz`.
//! - `held` is written by the worker when it puts a generation held by a rollback in force, and
//!   cleared when it puts any other in force; read by `/healthz`, which stays healthy and says
//!   so.
//! - `signed` is written by the worker's source when it puts a declaration in force: its signed
//!   scopes (none when unsigned, or not known); read by `/healthz`, which stays healthy and says
//!   which are in force past their expiry.
//! - `policy` is written once by `Daemon::start` when the node runs with `--trust-policy`: the
//!   pinned policy's version and expiry; read by `/healthz`, which stays healthy and says when
//!   it is in force past its expiry.
//!
//! Atomics and a mutex held only to copy a short string: no reader ever waits on the worker.
//!
//! What makes the agent unhealthy, and why, is docs/health.md, "Health".

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// The agent's health, shared between the worker, `/healthz` and the watchdog.
pub struct Health {
    ready: AtomicBool,
    /// Seconds since the epoch of the worker's last finished reconcile.
    heartbeat: AtomicI64,
    /// Seconds since the epoch when the oldest reconcile running apart started; 0 for none.
    oldest_apart: AtomicI64,
    /// Why no declaration is in force; `None` once one is.
    not_in_force: Mutex<Option<String>>,
    /// Why the declaration in force is refused whole on this machine; `None` while it is not.
    refused: Mutex<Option<String>>,
    /// How the node is held by a rollback; `None` while it is not.
    held: Mutex<Option<String>>,
    /// The signed scopes of the declaration in force.
    signed: Mutex<Vec<super::signed::InForce>>,
    /// The trust policy in force: its version and expiry (seconds since the epoch).
    policy: Mutex<Option<(u64, u64)>>,
    /// How long the worker may go without finishing a reconcile (`Config::stale_after`).
    stale_after: Duration,
}

/// `system::unix_secs`, signed for the differences the health check takes.
pub fn now_secs() -> i64 {
    crate::system::unix_secs() as i64
}

impl Health {
    pub fn new(stale_after: Duration) -> Health {
        Health {
            ready: AtomicBool::new(false),
            heartbeat: AtomicI64::new(now_secs()),
            oldest_apart: AtomicI64::new(0),
            not_in_force: Mutex::new(Some("no declaration has been read yet".into())),
            refused: Mutex::new(None),
            held: Mutex::new(None),
            signed: Mutex::new(Vec::new()),
            policy: Mutex::new(None),
            stale_after,
        }
    }

    /// The first apply has finished.
    pub fn ready(&self) {
        self.ready.store(true, Ordering::Relaxed);
    }

    /// The worker finished a reconcile (or survived one that panicked).
    pub fn beat(&self) {
        self.heartbeat.store(now_secs(), Ordering::Relaxed);
    }

    /// When the oldest reconcile running apart started, or `None` when none runs.
    pub fn set_oldest_apart(&self, started: Option<std::time::Instant>) {
        let secs = started.map_or(0, |at| now_secs() - at.elapsed().as_secs() as i64);
        self.oldest_apart.store(secs, Ordering::Relaxed);
    }

    /// Why no declaration is in force, or `None` once one is.
    pub fn set_not_in_force(&self, why: Option<String>) {
        *self.not_in_force.lock().unwrap_or_else(|e| e.into_inner()) = why;
    }

    /// Why the declaration in force is refused whole on this machine, or `None` once it is not.
    pub fn set_refused(&self, why: Option<String>) {
        *self.refused.lock().unwrap_or_else(|e| e.into_inner()) = why;
    }

    /// How the node is held by a rollback, or `None` once it is not.
    pub fn set_held(&self, how: Option<String>) {
        *self.held.lock().unwrap_or_else(|e| e.into_inner()) = how;
    }

    /// The signed scopes of the declaration in force (none when unsigned or not known).
    pub fn set_signed(&self, signed: Vec<super::signed::InForce>) {
        *self.signed.lock().unwrap_or_else(|e| e.into_inner()) = signed;
    }

    /// The trust policy in force (`--trust-policy`): its version and expiry.
    pub fn set_policy(&self, version: u64, expires: u64) {
        *self.policy.lock().unwrap_or_else(|e| e.into_inner()) = Some((version, expires));
    }

    /// How the node is held by a rollback, or `None`.
    pub fn held(&self) -> Option<String> {
        self.held.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// What a healthy `/healthz` adds to its `ok`: the rollback hold, when there is one (a
    /// held node is healthy, and the person reading it at 3 a.m. must still see it is held),
    /// a signed declaration in force past its expiry (enforced still, as designed, and a
    /// sign that nothing newer reaches the node: a freeze, or signers who stopped signing), and
    /// the trust policy in force past its expiry (in force still, until a rotation is installed).
    pub fn note(&self) -> Option<String> {
        let now = crate::system::unix_secs();
        let signed = self.signed.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let policy = *self.policy.lock().unwrap_or_else(|e| e.into_inner());
        let notes: Vec<String> = [
            self.held(),
            super::signed::expired_note(&signed, now),
            policy.and_then(|(version, expires)| super::signed::policy_expired_note(version, expires, now)),
        ]
        .into_iter()
        .flatten()
        .collect();
        (!notes.is_empty()).then(|| notes.join("; "))
    }

    /// Whether the worker has finished something recently enough.
    pub fn alive(&self) -> bool {
        let now = now_secs();
        let limit = self.stale_after.as_secs() as i64;
        let oldest = self.oldest_apart.load(Ordering::Relaxed);
        now - self.heartbeat.load(Ordering::Relaxed) <= limit && (oldest == 0 || now - oldest <= limit)
    }

    /// What `/healthz` says: healthy, or why not.
    pub fn check(&self) -> Result<(), String> {
        if !self.ready.load(Ordering::Relaxed) {
            return Err("starting: the first apply has not finished".into());
        }
        // An agent enforcing nothing is not healthy, even though it runs: a declaration refused
        // at start-up, and none accepted since (issue 12, fault 9; docs/decisions.md, "The
        // daemon").
        if let Some(why) = self.not_in_force.lock().unwrap_or_else(|e| e.into_inner()).as_deref() {
            return Err(format!("no declaration in force: {why}"));
        }
        // In force but applied nowhere: a firewall found that the host cannot manage refuses it
        // whole, and every reconcile with it (docs/decisions.md, "The daemon").
        if let Some(why) = self.refused.lock().unwrap_or_else(|e| e.into_inner()).as_deref() {
            return Err(format!("declaration refused on this machine, nothing of it is applied: {why}"));
        }
        // A worker stuck in one reconcile is the failure this is for.
        if self.alive() {
            return Ok(());
        }
        let now = now_secs();
        let oldest = self.oldest_apart.load(Ordering::Relaxed);
        if oldest != 0 && now - oldest > self.stale_after.as_secs() as i64 {
            return Err(format!(
                "a reconcile run apart from the worker has been running for {} s",
                now - oldest
            ));
        }
        let age = now - self.heartbeat.load(Ordering::Relaxed);
        Err(format!("the worker has not finished a reconcile for {age} s"))
    }
}

/// Pings systemd's watchdog while the worker is alive, until shutdown. A wedged worker stops
/// the pings, and systemd restarts the agent. `None` when the unit has no watchdog. Alive is
/// the same measure as `/healthz`'s, so a step never outlasts the watchdog's patience
/// (docs/health.md, "Health").
pub fn watchdog(health: Arc<Health>, shutdown: CancellationToken) -> Option<tokio::task::JoinHandle<()>> {
    let interval = sd_notify::watchdog_enabled()?;
    Some(tokio::spawn(async move {
        let mut tick = tokio::time::interval(interval / 2);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => {
                    if health.alive() {
                        let _ = sd_notify::notify(&[sd_notify::NotifyState::Watchdog]);
                    }
                }
            }
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn healthy_only_when_ready_in_force_and_beating() {
        let h = Health::new(Duration::from_secs(60));
        assert!(h.check().unwrap_err().starts_with("starting"));
        h.ready();
        assert!(h.check().unwrap_err().starts_with("no declaration in force"));
        h.set_not_in_force(None);
        assert_eq!(h.check(), Ok(()));
        h.heartbeat.store(now_secs() - 61, Ordering::Relaxed);
        assert!(h.check().unwrap_err().contains("has not finished a reconcile for"));
        assert!(!h.alive());
        h.beat();
        assert_eq!(h.check(), Ok(()));
    }

    #[test]
    fn a_trust_policy_past_its_expiry_is_a_note_beside_the_others_never_a_failure() {
        let h = Health::new(Duration::from_secs(60));
        h.ready();
        h.set_not_in_force(None);
        h.set_policy(3, crate::system::unix_secs() + 3600);
        assert_eq!(h.note(), None, "not expired yet");
        h.set_policy(3, crate::system::unix_secs() - 10);
        let note = h.note().unwrap();
        assert!(note.starts_with("trust policy version 3 in force past its expiry"), "{note}");
        h.set_held(Some("held at generation 2 by a rollback".into()));
        let note = h.note().unwrap();
        assert!(note.starts_with("held at generation 2 by a rollback; trust policy version 3"), "{note}");
        assert_eq!(h.check(), Ok(()), "still healthy");
    }

    #[test]
    fn a_declaration_refused_on_this_machine_is_unhealthy_until_it_is_not() {
        let h = Health::new(Duration::from_secs(60));
        h.ready();
        h.set_not_in_force(None);
        h.set_refused(Some("a filter other than ufw or firewalld is in force".into()));
        let why = h.check().unwrap_err();
        assert!(why.starts_with("declaration refused on this machine"), "{why}");
        assert!(why.contains("a filter other than ufw or firewalld"), "{why}");
        h.set_refused(None);
        assert_eq!(h.check(), Ok(()));
    }

    #[test]
    fn a_reconcile_stuck_apart_fails_the_check_though_the_worker_beats() {
        let h = Health::new(Duration::from_secs(60));
        h.ready();
        h.set_not_in_force(None);
        let now = std::time::Instant::now();
        h.set_oldest_apart(now.checked_sub(Duration::from_secs(30)));
        assert_eq!(h.check(), Ok(()), "30 s apart is within the limit");
        h.set_oldest_apart(now.checked_sub(Duration::from_secs(90)));
        h.beat();
        let why = h.check().unwrap_err();
        assert!(why.contains("run apart from the worker has been running for"), "{why}");
        assert!(!h.alive(), "and the watchdog is not pinged");
        h.set_oldest_apart(None);
        assert_eq!(h.check(), Ok(()), "healthy again once it is taken back");
    }
}
