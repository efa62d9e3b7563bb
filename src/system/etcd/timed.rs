//! A call given its timeout, and a member that does not answer one in time told apart: busy
//! (kept) or gone (left).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::rpc::maintenance_client::MaintenanceClient;
use super::{another_may_answer, rpc, Channel, Error, Etcd, CALL_TIMEOUT};

/// How long the member of a call not answered in all but this much of the call timeout has to
/// answer a status request: answered, it is busy, not gone, and the connection is kept
/// (`Etcd::timed`). Three seconds, sent two seconds into the call: a member at a fleet's load
/// can take more than one to answer even its status (issue 43: at 10,000 hollow nodes, with a
/// second to answer, clients left members 456,000 times for that silence, each time dropping
/// the connection, the watch and the lease's stream, more load on every member). A member
/// frozen or cut off is left at the call timeout all the same.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

impl Etcd {
    /// `call`, to the member at the other end of `channel`, given the call timeout. A call not
    /// answered in all but the last `PROBE_TIMEOUT` of it has its member asked meanwhile whether
    /// it answers at all (`still_answers`): one that does is busy, not gone (its apply, or its
    /// leader, behind a fleet's load), and the client keeps it, since the other members of a
    /// busy cluster are as slow and leaving costs a new connection, watch and lease stream: more
    /// load on all of them (issue 43: at 5,000 nodes, a storm of reconnects that kept the
    /// members busy). A member frozen, cut off, or without a leader is `Gone` at the same call
    /// timeout as before, and left. Each judgement is counted here (`counts`).
    pub(super) async fn timed<T>(
        &self,
        channel: &Channel,
        call: impl std::future::Future<Output = T>,
    ) -> Timed<T> {
        let deadline = tokio::time::Instant::now() + CALL_TIMEOUT;
        let mut call = std::pin::pin!(call);
        if let Ok(answer) = tokio::time::timeout(CALL_TIMEOUT - PROBE_TIMEOUT, &mut call).await {
            return Timed::Answered(answer);
        }
        let probe = tokio::select! {
            answer = &mut call => return Timed::Answered(answer),
            probe = self.still_answers(channel.clone()) => probe,
        };
        // Woken well past the deadline: this process's own timers ran late (its threads busy
        // with other work), so a status request not answered in time says nothing of the
        // member. Kept; a connection truly dead is found by HTTP/2's keep-alive (`KEEPALIVE`).
        let late = tokio::time::Instant::now().saturating_duration_since(deadline) > LATE;
        let judged = match tokio::time::timeout_at(deadline, call).await {
            Ok(answer) => return Timed::Answered(answer),
            Err(_) => match probe {
                Probe::Answers => Timed::Busy,
                Probe::Silent if late => {
                    KEPT_LATE.fetch_add(1, Ordering::Relaxed);
                    Timed::Busy
                }
                Probe::Silent | Probe::Unusable => Timed::Gone,
            },
        };
        count(if matches!(judged, Timed::Busy) { Left::Busy } else { Left::Silent });
        judged
    }

    /// `timed`, and a call its member is judged busy for waited on further, until `until` (when
    /// that is later): for a lease renewal, whose late answer still renews, where a renewal given
    /// up and asked again on a new stream costs the member as much again (issue 43: at 10,000
    /// nodes, most keep-alive streams were closed by their clients this way, and their leases
    /// lapsed). A member gone is left at the call timeout all the same. An answer that came in
    /// this extra time is counted (`Counts::answered_late`).
    pub(super) async fn timed_until<T>(
        &self,
        channel: &Channel,
        call: impl std::future::Future<Output = T>,
        until: tokio::time::Instant,
    ) -> Timed<T> {
        let mut call = std::pin::pin!(call);
        match self.timed(channel, &mut call).await {
            Timed::Busy if until > tokio::time::Instant::now() => {
                match tokio::time::timeout_at(until, call).await {
                    Ok(answer) => {
                        ANSWERED_LATE.fetch_add(1, Ordering::Relaxed);
                        Timed::Answered(answer)
                    }
                    Err(_) => Timed::Busy,
                }
            }
            judged => judged,
        }
    }

    /// What the member at the other end of `channel` says to a status request within
    /// `PROBE_TIMEOUT`.
    async fn still_answers(&self, channel: Channel) -> Probe {
        let request = self.request(rpc::StatusRequest {});
        // The failpoint `etcd-txn-late-status-late` (with `etcd-txn-late`'s transactions held
        // 6 s) holds each status request 2 s before it is sent, inside the probe's time: a member
        // that answers even its status late, as at a fleet's load, for the test that it is kept.
        let late = crate::system::fs::failpoint_named("etcd-txn-late-status-late");
        let status = async move {
            if late {
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            MaintenanceClient::new(channel).status(request).await
        };
        match tokio::time::timeout(PROBE_TIMEOUT, status).await {
            Ok(Ok(status)) if status.get_ref().leader != 0 => Probe::Answers,
            // Answered, knowing no leader: nothing it serves.
            Ok(Ok(_)) => Probe::Unusable,
            // Refused (for a token, say): an answer all the same.
            Ok(Err(status)) if !another_may_answer(&status) => Probe::Answers,
            Ok(Err(_)) => Probe::Unusable,
            Err(_) => Probe::Silent,
        }
    }
}

/// What a member said to a status request while a call waited on it (`Etcd::still_answers`).
enum Probe {
    /// Answered, knowing a leader: busy.
    Answers,
    /// Answered that it cannot serve (no leader, stopping): left.
    Unusable,
    /// Nothing in time.
    Silent,
}

/// How far past a call's deadline this process may wake and still judge a member silent.
const LATE: Duration = Duration::from_millis(250);

/// How a call ended, given the call timeout (`Etcd::timed`).
pub(super) enum Timed<T> {
    /// Its answer, in time.
    Answered(T),
    /// No answer in time, from a member that answered a status request meanwhile: kept.
    Busy,
    /// No answer in time, and none to the status request: left.
    Gone,
}

/// What a member that answered neither a call nor a status request in the call timeout is
/// left for (`Timed::Gone`), naming it.
pub(super) fn silent(endpoint: &str) -> String {
    format!("{endpoint}: no answer in {}", crate::system::human(CALL_TIMEOUT))
}

/// The error of a call to `endpoint` that went unanswered for the call timeout while its member
/// still answered (`Etcd::still_answers`): the connection is kept.
pub(super) fn busy(endpoint: &str, call: &str) -> Error {
    Error::Unreachable {
        endpoints: endpoint.to_owned(),
        message: format!(
            "no answer to {call} in {}, though the member answers: busy, not gone; the connection to it is kept",
            crate::system::human(CALL_TIMEOUT)
        ),
        tls: None,
    }
}

/// The error of a call to `endpoint` that its member timed out itself, saying `message`
/// (`refusal::busy_answer`): the connection is kept.
pub(super) fn busy_said(endpoint: &str, call: &str, message: &str) -> Error {
    Error::Unreachable {
        endpoints: endpoint.to_owned(),
        message: format!(
            "{call} not done in etcd's own time ({message}): busy, not gone; the connection to it is kept"
        ),
        tls: None,
    }
}

/// What the clients of this process did when a member did not serve a call, counted for the
/// hollow-node bench (`benches/fleet_scale.rs`), which runs thousands of clients in one process
/// and reads them as it goes (`counts`).
static LEFT_SILENT: AtomicU64 = AtomicU64::new(0);
static LEFT_REFUSED: AtomicU64 = AtomicU64::new(0);
static KEPT_BUSY: AtomicU64 = AtomicU64::new(0);
static KEPT_LATE: AtomicU64 = AtomicU64::new(0);
static ANSWERED_LATE: AtomicU64 = AtomicU64::new(0);
static LAST_REFUSAL: std::sync::Mutex<String> = std::sync::Mutex::new(String::new());

/// The counts of `counts`.
#[derive(Clone, Debug, Default)]
pub struct Counts {
    /// Members left for saying nothing in a call's time, not even to a status request.
    pub left_silent: u64,
    /// Members left for a refusal that another member may not make (gone, stopping, no leader).
    pub left_refused: u64,
    /// Members kept though a call was not done in time: busy (`timed`, `busy_answer`).
    pub kept_busy: u64,
    /// Of those, members kept only because this process woke too late to judge them (`LATE`).
    pub kept_late: u64,
    /// Of the calls judged busy, those waited on past the call timeout and answered then
    /// (`Etcd::timed_until`: lease renewals).
    pub answered_late: u64,
    /// The last such refusal, as etcd or the transport said it.
    pub last_refusal: String,
}

/// What this process's clients did with members that did not serve a call, so far.
pub fn counts() -> Counts {
    Counts {
        left_silent: LEFT_SILENT.load(Ordering::Relaxed),
        left_refused: LEFT_REFUSED.load(Ordering::Relaxed),
        kept_busy: KEPT_BUSY.load(Ordering::Relaxed),
        kept_late: KEPT_LATE.load(Ordering::Relaxed),
        answered_late: ANSWERED_LATE.load(Ordering::Relaxed),
        last_refusal: LAST_REFUSAL.lock().unwrap_or_else(|e| e.into_inner()).clone(),
    }
}

/// Why a member was left, or kept (`counts`).
pub(super) enum Left<'a> {
    Silent,
    Refused(&'a str),
    Busy,
}

pub(super) fn count(left: Left<'_>) {
    match left {
        Left::Silent => LEFT_SILENT.fetch_add(1, Ordering::Relaxed),
        Left::Refused(said) => {
            *LAST_REFUSAL.lock().unwrap_or_else(|e| e.into_inner()) = said.to_owned();
            LEFT_REFUSED.fetch_add(1, Ordering::Relaxed)
        }
        Left::Busy => KEPT_BUSY.fetch_add(1, Ordering::Relaxed),
    };
}
