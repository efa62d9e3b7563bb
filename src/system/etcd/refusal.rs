//! What etcd's refusals mean, read from its gRPC statuses once, and the operator's patience with
//! a member too busy to take a write.

use super::Error;
use std::time::Duration;

/// What an etcd refusal means, read once from the gRPC status etcd answers with, so that callers
/// match a variant and never etcd's words. The codes are etcd's (`api/v3rpc/rpctypes`); a watch
/// etcd cancels carries its gRPC status written out in `cancel_reason` ("rpc error: code =
/// PermissionDenied desc = ...").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// gRPC 16, Unauthenticated: the token sent is not (or no longer) valid; log in again.
    InvalidToken,
    /// gRPC 7, PermissionDenied: the user's roles do not allow the call.
    PermissionDenied,
    /// gRPC 9, FailedPrecondition, for a role, a user or a lease that is already there.
    AlreadyExists,
    /// gRPC 3, InvalidArgument: a request over one of etcd's limits (`--max-txn-ops`,
    /// `--max-request-bytes`), or one it cannot take as written.
    OverLimit,
    /// gRPC 8, ResourceExhausted: the backend's quota is spent (the NOSPACE alarm).
    NoSpace,
    /// gRPC 8 as well, with "too many requests": the member's apply is more than 5,000 entries
    /// behind its log, and it takes no proposal until it catches up. Refused before anything is
    /// proposed, so asking again later is safe (`while_busy`).
    Busy,
    /// gRPC 11, OutOfRange, for a revision the member has not applied yet (a serializable read
    /// at a revision another member announced).
    FutureRevision,
    /// Anything else, with etcd's gRPC code when it gave one (none in a cancellation's reason
    /// that names no code).
    Other(Option<u64>),
}

/// etcd's words for a role or a user made twice ("etcdserver: role name already exists",
/// "etcdserver: user name already exists"). Code 9 also means "not found" and "authentication is
/// not enabled", so the code alone cannot tell them apart: the fixed message, in this one place,
/// does.
const ALREADY_EXISTS: &str = "name already exists";

/// etcd's words for a lease granted with an id it already has ("etcdserver: lease already
/// exists"), code 9 too.
const LEASE_EXISTS: &str = "lease already exists";

/// etcd's words for a revision compacted away ("etcdserver: mvcc: required revision has been
/// compacted"). Its code, 11 (OutOfRange), also means a revision in the future.
const COMPACTED: &str = "required revision has been compacted";

/// etcd's words for a member whose apply is too far behind its log to take a proposal
/// ("etcdserver: too many requests"), code 8, which also means the quota is spent.
const TOO_MANY_REQUESTS: &str = "too many requests";

/// etcd's words for a revision past the member's own ("etcdserver: mvcc: required revision is a
/// future revision"), code 11 as well.
const FUTURE: &str = "required revision is a future revision";

/// etcd's words for a request its member took and could not finish in its own time ("etcdserver:
/// request timed out", "..., waiting for the applied index took too long", "..., possibly due to
/// previous leader failure", "..., leader transfer took too long"), code 14 (Unavailable), which
/// also means a member stopping or without a leader.
const TIMED_OUT: &str = "etcdserver: request timed out";

/// The one of them that says the member lost its leader's connection: another member may be on
/// the right side of it.
const CONNECTION_LOST: &str = "connection lost";

/// Whether `status` is a live member's word that the cluster is too busy for the request now: a
/// request etcd timed out itself (its apply behind its log; a lease renewal waits at most a
/// second for the leader's apply, and is refused so when a fleet's load holds it back). Every
/// member of the cluster would say the same, so the client keeps the one it has
/// (docs/decisions.md, "A busy member is kept, a silent one left"); before, this was read as a
/// member gone, and each renewal refused so dropped the node's connection and its watch.
pub(super) fn busy_answer(status: &tonic::Status) -> bool {
    status.code() == tonic::Code::Unavailable
        && status.message().starts_with(TIMED_OUT)
        && !status.message().contains(CONNECTION_LOST)
}

impl Refusal {
    /// The refusal that etcd's gRPC `code` and `message` say.
    pub(super) fn of(code: Option<u64>, message: &str) -> Self {
        match code {
            Some(16) => Refusal::InvalidToken,
            Some(7) => Refusal::PermissionDenied,
            Some(9) if message.ends_with(ALREADY_EXISTS) || message.ends_with(LEASE_EXISTS) => {
                Refusal::AlreadyExists
            }
            Some(3) => Refusal::OverLimit,
            Some(8) if message.ends_with(TOO_MANY_REQUESTS) => Refusal::Busy,
            Some(8) => Refusal::NoSpace,
            Some(11) if message.ends_with(FUTURE) => Refusal::FutureRevision,
            code => Refusal::Other(code),
        }
    }

    /// The refusal in a watch's `cancel_reason`: a gRPC status written out as
    /// `rpc error: code = NAME desc = MESSAGE`, its code by name.
    pub(super) fn of_status(reason: &str) -> Self {
        let name = reason.strip_prefix("rpc error: code = ").and_then(|r| r.split(' ').next());
        let desc = reason.split_once(" desc = ").map_or(reason, |(_, d)| d);
        let code = match name {
            Some("Unauthenticated") => Some(16),
            Some("PermissionDenied") => Some(7),
            Some("FailedPrecondition") => Some(9),
            Some("OutOfRange") => Some(11),
            _ => None,
        };
        Refusal::of(code, desc)
    }
}

/// `ask`, and, when the client is `patient` (an operator's command) and a member refuses it for
/// being too busy (`Refusal::Busy`), `ask` again after a pause of 0.5 s doubling to 4 s, each
/// spread by up to a fifth, for up to `READ_PATIENCE` in all, saying so; anything else is
/// returned as it comes. etcd refuses so before it proposes anything, so a write asked again is
/// never made twice. The agent's calls are not asked again here: its loops have their own
/// pauses. Measured need: right after a promote at 5,000 nodes the apply fell 6,000 entries
/// behind and `fleet put`'s write was refused (BENCHMARKS.md, "The fleet at 5,000: a read at
/// the change's revision, and leases that lapsed").
pub(super) async fn while_busy<T, Fut>(
    patient: bool,
    call: &str,
    mut ask: impl FnMut() -> Fut,
) -> Result<T, Error>
where
    Fut: std::future::Future<Output = Result<T, Error>>,
{
    let mut patience = Patience::new();
    loop {
        match ask().await {
            Err(e @ Error::Refused { why: Refusal::Busy, .. }) if patient => {
                let Error::Refused { endpoint, .. } = &e else { unreachable!("matched above") };
                let why = format!(
                    "etcd at {endpoint} is too busy to take {call} (its apply is more than 5,000 entries behind its log)"
                );
                match patience.next(&why) {
                    Some(pause) => tokio::time::sleep(pause).await,
                    None => return Err(e),
                }
            }
            answer => return answer,
        }
    }
}

/// Whether etcd's gRPC `code` and `message` say the revision asked for was compacted away.
pub(super) fn compacted(code: Option<u64>, message: &str) -> bool {
    code == Some(11) && message.ends_with(COMPACTED)
}

/// The refusal a gRPC status says, and etcd's message.
pub(super) fn refusal_of(status: &tonic::Status) -> Refusal {
    Refusal::of(Some(status.code() as u64), status.message())
}

/// How long an operator's paged read goes on asking when no endpoint answers a page
/// (`Etcd::page`): two or three rounds over every endpoint at their 5 s call timeout.
pub(super) const READ_PATIENCE: Duration = Duration::from_secs(30);

/// An operator's patience with a busy cluster (`Etcd::patient`): pauses of 0.5 s doubling to
/// 4 s, each spread by up to a fifth (so that commands started together do not ask in step), for
/// up to `READ_PATIENCE` in all.
pub(super) struct Patience {
    started: tokio::time::Instant,
    pause: Duration,
}

impl Patience {
    pub(super) fn new() -> Patience {
        Patience { started: tokio::time::Instant::now(), pause: Duration::from_millis(500) }
    }

    /// The pause before asking again, said on stderr after `why`; `None` once it would go past
    /// `READ_PATIENCE`.
    pub(super) fn next(&mut self, why: &dyn std::fmt::Display) -> Option<Duration> {
        if self.started.elapsed() + self.pause > READ_PATIENCE {
            return None;
        }
        let pause = crate::system::jittered(self.pause);
        tracing::warn!(
            "{why}; asking again in {} ms (up to {} in all)",
            pause.as_millis(),
            crate::system::human(READ_PATIENCE)
        );
        self.pause = (self.pause * 2).min(Duration::from_secs(4));
        Some(pause)
    }

    /// How long it has waited so far.
    pub(super) fn spent(&self) -> Duration {
        self.started.elapsed()
    }
}
