//! A call given its timeout, and a member that does not answer one in time told apart: busy
//! (kept) or gone (left).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::rpc::maintenance_client::MaintenanceClient;
use super::{another_may_answer, rpc, Channel, Error, Etcd, CALL_TIMEOUT};

/// How long the member of a call not answered in all but this much of the call timeout has to
/// answer a status request: answered, it is busy, not gone, and the connection is kept
/// (`Etcd::timed`).
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

impl Etcd {
    /// `call`, to the member at the other end of `channel`, given the call timeout. A call not
    /// answered in all but the last `PROBE_TIMEOUT` of it has its member asked meanwhile whether
    /// it answers at all (`still_answers`): one that does is busy, not gone (its apply, or its
    /// leader, behind a fleet's load), and the client keeps it, since the other members of a
    /// busy cluster are as slow and leaving costs a new connection, watch and lease stream: more
    /// load on all of them (issue 43: at 5,000 nodes, a storm of reconnects that kept the
    /// members busy). A member frozen, cut off, or without a leader is `Gone` at the same call
    /// timeout as before, and left.
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
        let answers = tokio::select! {
            answer = &mut call => return Timed::Answered(answer),
            answers = self.still_answers(channel.clone()) => answers,
        };
        match tokio::time::timeout_at(deadline, call).await {
            Ok(answer) => Timed::Answered(answer),
            Err(_) if answers => Timed::Busy,
            Err(_) => Timed::Gone,
        }
    }

    /// Whether the member at the other end of `channel` answers a status request within
    /// `PROBE_TIMEOUT`, and knows a leader.
    async fn still_answers(&self, channel: Channel) -> bool {
        let request = self.request(rpc::StatusRequest {});
        match tokio::time::timeout(PROBE_TIMEOUT, MaintenanceClient::new(channel).status(request)).await {
            Ok(Ok(status)) => status.into_inner().leader != 0,
            // Refused (for a token, say): an answer all the same.
            Ok(Err(status)) => !another_may_answer(&status),
            Err(_) => false,
        }
    }
}

/// How a call ended, given the call timeout (`Etcd::timed`).
pub(super) enum Timed<T> {
    /// Its answer, in time.
    Answered(T),
    /// No answer in time, from a member that answered a status request meanwhile: kept.
    Busy,
    /// No answer in time, and none to the status request: left.
    Gone,
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
    /// The last such refusal, as etcd or the transport said it.
    pub last_refusal: String,
}

/// What this process's clients did with members that did not serve a call, so far.
pub fn counts() -> Counts {
    Counts {
        left_silent: LEFT_SILENT.load(Ordering::Relaxed),
        left_refused: LEFT_REFUSED.load(Ordering::Relaxed),
        kept_busy: KEPT_BUSY.load(Ordering::Relaxed),
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
