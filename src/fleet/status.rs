//! Status back to etcd (issue 14, item 2): what a node applied, and whether it is there at all.
//!
//! ```text
//! /mesh-host/node/N/status   JSON: revision applied, converged, outcome counts, drift
//!                            corrections, contested keys, the last error; at most one write
//!                            a second, however busy the node is
//! /mesh-host/node/N/alive    bound to a lease of ALIVE_TTL: gone within that when the node
//!                            dies or is cut off
//! ```
//!
//! The controller's worker publishes a `controller::Applied` after each reconcile on a watch
//! channel, which keeps only the latest: the writer here takes it, writes, waits a second, and
//! takes whatever is latest then. So a busy node costs etcd one write a second, and the last state is always
//! written (ARCHITECTURE.md, "Code map", `fleet/`). What the status holds, and what
//! `revision` and `converged` mean: docs/decisions.md, "Status".

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::controller;
use crate::system::etcd::Etcd;
use crate::telemetry::{events, Event as _, Metrics};

/// How long a node's presence outlives its last word to etcd.
pub const ALIVE_TTL: Duration = Duration::from_secs(10);

/// The least time between two status writes of one node.
const WRITE_EVERY: Duration = Duration::from_secs(1);

/// The longest a new generation's status waits for its confirmation (`confirm`), so that one
/// write says both: the confirmation's redial waits up to 1 s at random, and its round trip is
/// a read. Past it, the status is written without, and once more when the confirmation comes.
/// Before issue 43's bench, a fleet-wide change cost three writes a node (the generation, the
/// round trip, the confirmation), each a proposal through etcd's log; at 5,000 nodes, a burst
/// of 500 a second that etcd on two cores applied at 300.
pub const CONFIRM_WAIT: Duration = Duration::from_secs(3);

/// The most a node's status takes in etcd, in bytes: every status is a revision kept in etcd's
/// history until compaction, read by `fleet status` and the rollout's driver for every node, so
/// it is bounded (docs/decisions.md, "A status is bounded"). A status over it is not written, and the log
/// says why.
pub const STATUS_LIMIT: usize = 32 << 10;

/// The most each free-text field of a status (the last error, a refusal, a hold, a correction,
/// a going back's reason) takes, in bytes; the rest is cut, and the field says so.
pub const FIELD_LIMIT: usize = 4 << 10;

/// `record` with each free-text field cut to `FIELD_LIMIT`, and whether one was.
pub fn bounded(mut record: Status) -> (Status, bool) {
    let mut cut = false;
    let mut trim = |s: &mut String| {
        if s.len() > FIELD_LIMIT {
            let whole = s.len();
            let mut end = FIELD_LIMIT;
            while !s.is_char_boundary(end) {
                end -= 1;
            }
            s.truncate(end);
            s.push_str(&format!(
                "... (cut by the node: {whole} bytes, over the status's bound of {FIELD_LIMIT} a field; the node's log has it whole)"
            ));
            cut = true;
        }
    };
    let a = &mut record.applied;
    for field in [a.last_error.as_mut(), a.hold.as_mut(), a.last_correction.as_mut(), record.refused.as_mut()]
        .into_iter()
        .flatten()
    {
        trim(field);
    }
    if let Some(r) = record.applied.reverted.as_mut() {
        trim(&mut r.reason);
    }
    (record, cut)
}

/// What a node has applied, as its status says it: `controller::Applied` but for the names of
/// the files in force, which the status gives as the revision they were read at. Its own type,
/// not the controller's with serde's attributes, so that what is written to etcd (which
/// `fleet status` reads, across versions) is decided here, where the format is, and a field
/// renamed in the controller cannot change it unseen.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    /// Whether the last full pass, and every reconcile since, succeeded.
    pub converged: bool,
    /// Each outcome word's count in the last full pass.
    pub counts: BTreeMap<String, u64>,
    /// Drift put back since the node started.
    pub drift_corrections: u64,
    /// Read-backs that found someone else had written since the node started (contested keys).
    pub contested: u64,
    /// The last failure, until a full pass succeeds.
    pub last_error: Option<String>,
    /// The last correction since the node started, and who made the change it put back.
    /// Absent from an older node's status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_correction: Option<String>,
    /// The generation in force on the node (`mesh-host generations`). Absent from an older
    /// node's status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<u64>,
    /// How a rollback holds the node, while one does. Absent while it follows its source.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold: Option<String>,
    /// While the node holds a generation it went back to by itself (a new one was not
    /// confirmed by an etcd round trip in its window): which, from which, and why. Absent
    /// otherwise, and from an older node's status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reverted: Option<Reverted>,
    /// The latest generation this node will not go back from by itself: its confirmation window
    /// closed confirmed by an etcd round trip, or no window was armed for it (off, or nothing to go
    /// back to). Absent until then, and from an older node's status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirmed: Option<u64>,
    /// Who signed the declaration in force, scope by scope (a node with `--allowed-signers`).
    /// Absent when it is unsigned or that is not known (a generation held by a rollback), and
    /// from an older node's status.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub signed: Vec<Signed>,
}

/// One signed scope of the declaration in force, as a node's status says it: no secret, only
/// the scope, the manifest's version and expiry, and the keys that signed it (principals and
/// fingerprints).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Signed {
    /// The scope (`fleet`, `group web`, `node web-1`, or a rollout's `candidate ...`).
    pub scope: String,
    /// The manifest's version.
    pub version: u64,
    /// When it expires, seconds since the epoch; still enforced after.
    pub expires: u64,
    /// One entry per distinct trusted key that signed it.
    pub signed_by: Vec<String>,
}

/// A node's own going back, as its status says it (docs/decisions.md, "Confirm or go back").
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reverted {
    /// The generation gone back to, and held.
    pub generation: u64,
    /// The generation gone back from.
    pub from: u64,
    /// The etcd revision of the generation gone back from.
    pub revision: Option<i64>,
    /// Why (`no etcd round trip within 1 min of applying generation 5 (revision 42); last: ...`).
    pub reason: String,
    /// When, in seconds since the epoch.
    pub since: u64,
}

impl From<&controller::Applied> for Summary {
    fn from(a: &controller::Applied) -> Summary {
        Summary {
            converged: a.converged,
            counts: a.counts.clone(),
            drift_corrections: a.drift_corrections,
            contested: a.contested,
            last_error: a.last_error.clone(),
            last_correction: a.last_correction.clone(),
            generation: a.generation,
            hold: a.hold.clone(),
            reverted: a.reverted.as_ref().and_then(|h| {
                h.reverted.as_ref().map(|r| Reverted {
                    generation: h.generation,
                    from: r.from,
                    revision: r.revision,
                    reason: h.reason.clone().unwrap_or_default(),
                    since: h.since,
                })
            }),
            // The confirmation task's to say (`Confirming::confirmed`), not the controller's.
            confirmed: None,
            signed: a
                .signed
                .iter()
                .map(|s| Signed {
                    scope: s.scope.clone(),
                    version: s.version,
                    expires: s.expires,
                    signed_by: s.signed_by.clone(),
                })
                .collect(),
        }
    }
}

/// What is written to a node's status key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    /// The node's name.
    pub node: String,
    /// The groups the node reads, in its order.
    pub groups: Vec<String>,
    /// The etcd revision of the declaration in force; `None` before one from etcd is in force.
    pub revision: Option<i64>,
    /// What its last apply did: whether it converged, its counts, its last error.
    #[serde(flatten)]
    pub applied: Summary,
    /// Why the latest declaration etcd holds for the node was refused; absent once a later one
    /// is accepted. The node goes on enforcing the declaration it applied (`revision`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
    /// The refusal's reason: `invalid`, or a signed declaration's `signature`, `scope`,
    /// `rollback`, `expired` or `contents`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused_reason: Option<String>,
    /// Seconds since the epoch when this was written.
    pub written_at: u64,
}

/// The key of a node's status.
pub fn status_key(node: &str) -> String {
    format!("{}node/{node}/status", super::ROOT)
}

/// The key of a node's presence.
pub fn alive_key(node: &str) -> String {
    format!("{}node/{node}/alive", super::ROOT)
}

/// The revision a declaration read from the cache was read at: every cache file's name starts
/// with it (`super::cache_name`). `None` for a source that is not the fleet's cache.
pub fn revision_of(sources: &[String]) -> Option<i64> {
    let name = std::path::Path::new(sources.first()?).file_name()?.to_str()?;
    let digits = name.strip_prefix('r')?.get(..12)?;
    digits.parse().ok()
}

/// What the status writer shares with the confirmation window (`confirm`): it says whether
/// etcd answered (`contact`), and writes what the window decided (`confirmed`).
pub struct Confirming {
    /// Whether etcd answered the last write.
    pub contact: Arc<watch::Sender<super::confirm::Contact>>,
    /// The latest generation the node will not go back from by itself (`Summary::confirmed`),
    /// as the confirmation task says it: each change is written, the rate limit permitting.
    pub confirmed: watch::Receiver<Option<u64>>,
}

/// Writes the node's status and keeps its presence until `shutdown`.
#[allow(clippy::too_many_arguments, reason = "what the status writer follows and tells, each from `daemon`")]
pub async fn run(
    etcd: Arc<Etcd>,
    node: String,
    groups: Vec<String>,
    presence_ttl: Duration,
    applied: watch::Receiver<controller::Applied>,
    refused: watch::Receiver<Option<super::source::Refused>>,
    confirming: Confirming,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) {
    // Side by side in this task: the writer's calls, each up to the 5 s call timeout on every
    // member in turn when etcd is busy, never hold a renewal back (docs/decisions.md, "A
    // node's presence is kept beside its status, not behind it").
    tokio::select! {
        () = keep_present(&etcd, presence_ttl, &node, &metrics) => {}
        () = write_statuses(&etcd, &node, groups, applied, refused, confirming, &metrics, &shutdown) => {}
    }
}

/// Keeps the node's presence key alive, renewing its lease every third of `ttl`, for ever; a
/// turn that failed (a renewal refused by a busy etcd, a grant or the key not written) is tried
/// again after about a second, not a third of the TTL: three renewals missed in a row lose the
/// lease, and a lost lease costs etcd a revocation, a grant and a write.
async fn keep_present(etcd: &Etcd, ttl: Duration, node: &str, metrics: &Metrics) {
    let alive = alive_key(node);
    let mut presence = Presence::default();
    let every = (ttl / 3).max(Duration::from_secs(1));
    let mut failed = 0;
    loop {
        let kept = keep_presence(etcd, &mut presence, ttl, &alive, node, metrics).await;
        failed = if kept { 0 } else { failed + 1 };
        tokio::time::sleep(presence_pause(every, failed)).await;
    }
}

/// How soon a presence turn that failed is tried again, the first time: doubled at each failure
/// in a row, up to the renewal's own period, and spread at random, so that a fleet that failed
/// together on a busy etcd neither waits out its lease nor asks again all at once.
const RETRY_PRESENCE: Duration = Duration::from_secs(1);

/// The pause before the next presence turn, after `failed` turns failed in a row.
fn presence_pause(every: Duration, failed: u32) -> Duration {
    match failed {
        0 => every,
        n => crate::system::jittered(RETRY_PRESENCE.saturating_mul(1 << (n - 1).min(8))).min(every),
    }
}

/// The pause after a status write: `WRITE_EVERY` after one that was answered, doubled after
/// each that failed in a row up to `BACKOFF_CAP`; with a quarter more at random, so that nodes
/// that failed together do not try again together.
pub(super) fn write_pause(failed: u32) -> Duration {
    let base = WRITE_EVERY.saturating_mul(1 << failed.min(8)).min(BACKOFF_CAP);
    base + crate::system::up_to(base / 4)
}

/// The longest pause between two status writes that failed.
const BACKOFF_CAP: Duration = Duration::from_secs(10);

/// The node's presence lease, as the writer holds it.
#[derive(Default)]
struct Presence {
    /// The lease held.
    lease: Option<Held>,
    /// The id of a lease asked for and not yet known granted: asked for again, the same
    /// (`Etcd::lease_grant_as`).
    asking: Option<i64>,
}

/// The presence lease held.
#[derive(Clone, Copy)]
struct Held {
    id: i64,
    /// Whether the presence key is written with it.
    written: bool,
    /// When the request that last granted or renewed it was sent: etcd holds it at least a TTL
    /// from then, the time a renewal may wait on a busy member.
    renewed: tokio::time::Instant,
}

/// Writes the node's status whenever what it says changes, at most once a second, until
/// `shutdown` or the agent's channels close.
#[allow(clippy::too_many_arguments, reason = "`run`'s, but the presence's")]
async fn write_statuses(
    etcd: &Etcd,
    node: &str,
    groups: Vec<String>,
    mut applied: watch::Receiver<controller::Applied>,
    mut refused: watch::Receiver<Option<super::source::Refused>>,
    confirming: Confirming,
    metrics: &Metrics,
    shutdown: &CancellationToken,
) {
    let Confirming { contact, mut confirmed } = confirming;
    let mut confirmed_open = true;
    // The generation and revision last waited for (`await_confirmation`): each is waited
    // for once.
    let mut waited: (Option<u64>, Option<i64>) = (None, None);
    let status = status_key(node);
    // Whether the last status written was cut: said once, when it starts.
    let mut was_cut = false;
    // Status writes failed in a row, for the pause after the next.
    let mut failed = 0;
    // The status key's revision as this writer last wrote or read it (`write_over`).
    let mut known: Option<i64> = None;
    // Written once at least even when nothing changed: a node that restarts says so.
    applied.mark_changed();
    // The failpoint `status-write-late` holds every status write 6 s: longer than the least
    // presence TTL, for the test that the presence is kept meanwhile.
    let late = crate::system::fs::failpoint_named("status-write-late");
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            changed = refused.changed() => {
                if changed.is_err() {
                    return;
                }
                // Written with what was applied, below, at the next turn.
                applied.mark_changed();
            }
            changed = confirmed.changed(), if confirmed_open => {
                if changed.is_err() {
                    confirmed_open = false;
                    continue;
                }
                // A window closed (or none was armed): written, so that etcd holds it even when
                // it changed just after the round trip that confirmed it.
                applied.mark_changed();
            }
            changed = applied.changed() => {
                if changed.is_err() {
                    return;
                }
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    () = await_confirmation(&applied, &mut confirmed, &mut waited) => {}
                }
                let record = latest(node, &groups, &mut applied, &mut confirmed, &mut refused);
                let Some(bytes) = encoded(record.clone(), &mut was_cut, metrics) else { continue };
                if late {
                    tokio::time::sleep(Duration::from_secs(6)).await;
                }
                match write_unless_there(etcd, &status, &record, bytes, &mut known).await {
                    Ok(true) => {
                        failed = 0;
                        contact.send_modify(super::confirm::Contact::answered);
                    }
                    // Another write landed over the one this writer knew: written again.
                    Ok(false) => applied.mark_changed(),
                    Err(e) => {
                        failed += 1;
                        events::FleetStatus::NotWritten { node, error: &e }.emit(metrics);
                        contact.send_modify(|c| c.failed(e.to_string()));
                        // Written again when etcd answers: the latest is still there to take.
                        applied.mark_changed();
                    }
                }
                // The rate limit: whatever changes meanwhile waits in the channel, merged; longer
                // after writes that failed, so that a fleet does not ask a busy etcd again every
                // second.
                let pause = write_pause(failed);
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(pause) => {}
                }
            }
        }
    }
}

/// Waits, up to `CONFIRM_WAIT`, for the confirmation of a generation the node has not
/// confirmed, so that the next write says it: once for each generation and revision seen
/// (the generation moves alone when it is put in force, the revision when its pass ends; the
/// window opens on both, and a pass is short next to the bound), never for a held generation,
/// which has no window. Returns at once otherwise.
async fn await_confirmation(
    applied: &watch::Receiver<controller::Applied>,
    confirmed: &mut watch::Receiver<Option<u64>>,
    waited: &mut (Option<u64>, Option<i64>),
) {
    let (generation, revision, held) = {
        let now = applied.borrow();
        (now.generation, revision_of(&now.sources), now.hold.is_some())
    };
    if generation.is_none() || (generation, revision) == *waited {
        return;
    }
    *waited = (generation, revision);
    if held || *confirmed.borrow() == generation {
        return;
    }
    // A closed channel (the window's task gone) ends the wait at once, as its timeout does.
    let _ = tokio::time::timeout(CONFIRM_WAIT, confirmed.wait_for(|c| *c == generation)).await;
}

/// The status to write now, from what the agent's channels hold (each marked seen).
fn latest(
    node: &str,
    groups: &[String],
    applied: &mut watch::Receiver<controller::Applied>,
    confirmed: &mut watch::Receiver<Option<u64>>,
    refused: &mut watch::Receiver<Option<super::source::Refused>>,
) -> Status {
    let (revision, mut now) = {
        let now = applied.borrow_and_update();
        (revision_of(&now.sources), Summary::from(&*now))
    };
    now.confirmed = *confirmed.borrow_and_update();
    let refusal = refused.borrow_and_update().clone();
    Status {
        node: node.to_owned(),
        groups: groups.to_vec(),
        revision,
        applied: now,
        refused_reason: refusal.as_ref().map(|r| r.reason.to_owned()),
        refused: refusal.map(|r| r.message),
        written_at: crate::system::unix_secs(),
    }
}

/// `write_over`, but when this writer does not know the key's version (its last write's answer
/// was lost, or it has not written yet) and the key already says what `record` says but its
/// time, nothing is written: the write whose answer was lost landed. On a busy etcd, a status
/// write is often done and its answer later than the call timeout; written again every turn,
/// each a proposal, the same statuses kept the apply behind (at 5,000 hollow nodes after a
/// promote, 400 status transactions a second and the apply 5,000 entries behind).
pub async fn write_unless_there(
    etcd: &Etcd,
    key: &str,
    record: &Status,
    bytes: Vec<u8>,
    known: &mut Option<i64>,
) -> Result<bool, crate::system::etcd::Error> {
    if known.is_none() {
        // The one key (no range end): a node's role may read its status key, nothing beside.
        let range = etcd.range_between(key, &[], None).await?;
        let there = range.kvs.into_iter().find(|kv| kv.key == key);
        *known = Some(there.as_ref().map_or(0, |kv| kv.mod_revision));
        let said = there.and_then(|kv| serde_json::from_slice::<Status>(&kv.value).ok());
        if said.is_some_and(|said| Status { written_at: record.written_at, ..said } == *record) {
            return Ok(true);
        }
    }
    write_over(etcd, key, bytes, known).await
}

/// Writes the node's status at `key` only over the version of it this writer knows (`known`:
/// the revision of its last write, or read from etcd when unknown), and says whether it did.
///
/// A plain put could land late: sent to a member that was stopped before it answered, it is
/// proposed when that member continues, after the newer statuses written meanwhile through
/// another, and etcd keeps the old one until the node next changes (the robustness harness's I8
/// caught it: a status behind the node's files). Conditional on the key's revision, the late
/// write finds the key moved and does nothing. When the condition fails, the revision is read
/// again and the caller writes the latest status once more.
pub async fn write_over(
    etcd: &Etcd,
    key: &str,
    bytes: Vec<u8>,
    known: &mut Option<i64>,
) -> Result<bool, crate::system::etcd::Error> {
    use crate::system::etcd::{Cond, Write};
    let at = match *known {
        Some(at) => at,
        None => {
            // The one key (no range end): a node's role may read its status key, nothing beside.
            let range = etcd.range_between(key, &[], None).await?;
            range.kvs.iter().find(|kv| kv.key == key).map_or(0, |kv| kv.mod_revision)
        }
    };
    let cond = if at == 0 { Cond::Absent(key.to_owned()) } else { Cond::WrittenAt(key.to_owned(), at) };
    let put = Write::Put { key: key.to_owned(), value: bytes, lease: 0 };
    // Unknown until etcd answers: a write whose answer is lost may have landed, and the key's
    // version with it. Known still, the next write's condition would be the old version's, a
    // proposal through etcd's log that can only fail; unknown, the next turn reads the key first
    // (`write_unless_there`), a read, and finds the lost write there.
    *known = None;
    let written = etcd.txn(&[cond], &[put]).await?;
    *known = written;
    Ok(written.is_some())
}

/// The bytes of a status to write: bounded (`bounded`, said once in the log when a field is
/// cut), `None` when it cannot be encoded or is still over `STATUS_LIMIT` (said, not written).
fn encoded(record: Status, was_cut: &mut bool, metrics: &Metrics) -> Option<Vec<u8>> {
    let (record, cut) = bounded(record);
    let node = &record.node;
    if cut && !*was_cut {
        tracing::warn!(node = %node, "the status of node {node} has a field over {FIELD_LIMIT} bytes (a long error or refusal): written cut to that, saying so; the log has it whole");
    }
    *was_cut = cut;
    match serde_json::to_vec(&record) {
        Ok(b) if b.len() > STATUS_LIMIT => {
            tracing::error!(node = %node, "the status of node {node} is {} bytes, over its bound of {STATUS_LIMIT} (docs/decisions.md, \"A status is bounded\"): not written to etcd; its groups or counts are what is large", b.len());
            None
        }
        Ok(b) => Some(b),
        Err(e) => {
            events::FleetStatus::NotEncoded { node, error: &e }.emit(metrics);
            None
        }
    }
}

/// Keeps the node's presence: renews its lease or, when there is none or it expired (cut off
/// for longer than the TTL), takes a new one; and writes the presence key with it when it is
/// not yet written. Returns whether all of that was done.
///
/// A lease whose key could not be written is kept, renewed and written at the next turn, not
/// left to expire while another is taken: each lease left so costs etcd a revocation through
/// its log when it expires, and a busy etcd is when writes fail. For the same reason a grant
/// whose answer was lost is asked again under the same id.
async fn keep_presence(
    etcd: &Etcd,
    presence: &mut Presence,
    ttl: Duration,
    alive: &str,
    node: &str,
    metrics: &Metrics,
) -> bool {
    if let Some(held) = presence.lease.as_mut() {
        let asked = tokio::time::Instant::now();
        // A busy member's late answer is waited for while the lease lasts.
        let patience = crate::system::lease_patience(held.renewed, ttl);
        match etcd.lease_keepalive(held.id, patience).await {
            Ok(true) => held.renewed = asked,
            // Expired (cut off for longer than the TTL): a new lease, the key again.
            Ok(false) => presence.lease = None,
            Err(e) => {
                events::FleetStatus::LeaseNotRenewed { node, error: &e }.emit(metrics);
                return false;
            }
        }
    }
    if presence.lease.is_none() {
        let id = *presence.asking.get_or_insert_with(crate::system::random_id);
        let asked = tokio::time::Instant::now();
        match etcd.lease_grant_as(id, ttl.as_secs() as i64).await {
            Ok(id) => {
                presence.lease = Some(Held { id, written: false, renewed: asked });
                presence.asking = None;
            }
            Err(e) => {
                events::FleetStatus::LeaseNotTaken { node, error: &e }.emit(metrics);
                return false;
            }
        }
    }
    if let Some(held) = presence.lease.as_mut().filter(|h| !h.written) {
        match etcd.put_with_lease(alive, b"1", held.id).await {
            Ok(_) => held.written = true,
            // Kept: written at the next turn (a write whose answer was lost may have landed;
            // writing it again changes nothing).
            Err(e) => {
                events::FleetStatus::PresenceNotWritten { node, error: &e }.emit(metrics);
                return false;
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_write_or_presence_waits_longer_each_time_up_to_a_cap() {
        let second = Duration::from_secs(1);
        // A write answered: a second and up to a quarter more; then doubling, to 10 s.
        for (failed, least) in [(0, 1), (1, 2), (2, 4), (3, 8), (4, 10), (40, 10)] {
            let pause = write_pause(failed);
            let least = second * least;
            assert!(pause >= least && pause <= least + least / 4, "{failed} failed: {pause:?}");
        }
        // A presence kept: its period; failed, a second (spread a fifth), doubling, never over
        // the period.
        let every = Duration::from_secs(10);
        assert_eq!(presence_pause(every, 0), every);
        for (failed, about) in [(1, 1.0), (2, 2.0), (3, 4.0)] {
            let pause = presence_pause(every, failed).as_secs_f64();
            assert!((about * 0.8..=about * 1.2).contains(&pause), "{failed} failed: {pause}");
        }
        assert_eq!(presence_pause(every, 5), every, "capped at the period");
        assert_eq!(presence_pause(every, 400), every, "no overflow");
    }

    /// Issue 43: a new generation's status waits for its confirmation, so that one write says
    /// both; once for each generation and revision, and no longer than `CONFIRM_WAIT`. A held
    /// generation and one confirmed already do not wait.
    #[tokio::test(start_paused = true)]
    async fn a_new_generations_status_waits_for_its_confirmation_once_and_at_most_the_bound() {
        use tokio::time::Instant;
        let at = |generation: u64, revision: i64, held: bool| controller::Applied {
            generation: Some(generation),
            sources: vec![format!("/var/lib/mesh-host/etcd/r{revision:012}.json")],
            hold: held.then(|| "held".to_owned()),
            ..Default::default()
        };
        let (applied_tx, applied) = watch::channel(at(1, 10, false));
        let (confirmed_tx, mut confirmed) = watch::channel(Some(1));
        let confirmed_tx = Arc::new(confirmed_tx);
        let mut waited = (None, None);
        let mut wait = async |applied_now| {
            applied_tx.send_replace(applied_now);
            let start = Instant::now();
            await_confirmation(&applied, &mut confirmed, &mut waited).await;
            start.elapsed()
        };
        assert_eq!(wait(at(1, 10, false)).await, Duration::ZERO, "confirmed already");
        let tx = Arc::clone(&confirmed_tx);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(700)).await;
            tx.send_replace(Some(2));
        });
        assert_eq!(wait(at(2, 10, false)).await, Duration::from_millis(700), "put in force: until confirmed");
        assert_eq!(wait(at(2, 20, false)).await, Duration::ZERO, "its pass ended, confirmed already");
        assert_eq!(wait(at(2, 20, false)).await, Duration::ZERO, "the same pass (a write to try again)");
        assert_eq!(wait(at(3, 30, false)).await, CONFIRM_WAIT, "never confirmed: the bound");
        assert_eq!(wait(at(3, 30, false)).await, Duration::ZERO, "waited for once");
        assert_eq!(wait(at(4, 40, true)).await, Duration::ZERO, "held: no window");
        drop(confirmed_tx);
        assert_eq!(wait(at(5, 50, false)).await, Duration::ZERO, "the window's task gone");
    }

    #[test]
    fn the_revision_applied_is_read_from_the_cache_file_names() {
        let cache = super::super::cache_name(42, 0, "/mesh-host/fleet/declaration/a.json");
        assert_eq!(revision_of(&[format!("/var/lib/mesh-host/fleet/declaration.d/{cache}")]), Some(42));
        assert_eq!(revision_of(&["/etc/mesh-host/declaration.d/10-base.json".into()]), None);
        assert_eq!(revision_of(&[]), None);
    }

    #[test]
    fn the_table_shows_each_nodes_generation_and_a_rollback_hold_under_it() {
        let status = |node: &str, generation: Option<u64>, hold: Option<&str>| Status {
            node: node.into(),
            groups: Vec::new(),
            revision: Some(7),
            applied: Summary {
                converged: true,
                generation,
                hold: hold.map(str::to_owned),
                ..Summary::default()
            },
            refused: None,
            refused_reason: None,
            written_at: 0,
        };
        let row = |node: &str, status: Option<Status>| Row {
            node: node.into(),
            alive: true,
            status,
            latest: Some(7),
            current: true,
        };
        let held = "held at generation 3 by rollback since 2026-12-02T03:00:00Z (by root: bad config)";
        let text = table(
            9,
            &[
                row("a", Some(status("a", Some(4), None))),
                row("b", Some(status("b", Some(3), Some(held)))),
                row("c", Some(status("c", None, None))),
                row("d", None),
            ],
        );
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].contains(" GEN "), "{text}");
        let gen = |line: &str| line.split_whitespace().nth(7).map(str::to_owned);
        assert_eq!(gen(lines[1]).as_deref(), Some("4"), "{text}");
        assert_eq!(gen(lines[2]).as_deref(), Some("3*"), "{text}");
        assert_eq!(gen(lines[3]).as_deref(), Some("-"), "an older node says nothing: {text}");
        assert_eq!(lines[5], format!("b: {held}"), "{text}");
        assert_eq!(lines.len(), 7, "one hold line, then the summary: {text}");
    }

    #[test]
    fn a_status_is_bounded_each_long_field_cut_saying_so() {
        let long = "é".repeat(FIELD_LIMIT);
        let record = Status {
            node: "a".into(),
            groups: Vec::new(),
            revision: Some(1),
            applied: Summary { last_error: Some(long.clone()), ..Summary::default() },
            refused: Some(long),
            refused_reason: None,
            written_at: 0,
        };
        let (record, cut) = bounded(record);
        assert!(cut);
        let error = record.applied.last_error.unwrap();
        assert!(error.len() < FIELD_LIMIT + 200 && error.contains("cut by the node"), "{error}");
        assert!(serde_json::to_vec(&record.refused).unwrap().len() < FIELD_LIMIT + 200);
        let short = Status { refused: Some("short".into()), ..record_of("a") };
        assert_eq!(bounded(short.clone()), (short, false));
    }

    /// Issue 44, point 5: a status is bounded whole, not only field by field. One whose groups
    /// (or counts) make it larger than `STATUS_LIMIT` is not written at all; one just under is.
    #[test]
    fn a_status_over_its_whole_bound_is_not_written() {
        let metrics = Metrics::new();
        let mut was_cut = false;
        let with_groups = |n: usize| Status {
            groups: (0..n).map(|i| format!("group-{i:0>200}")).collect(),
            ..record_of("a")
        };
        let under = encoded(with_groups(100), &mut was_cut, &metrics).expect("about 21 KB is written");
        assert!(under.len() <= STATUS_LIMIT, "{}", under.len());
        assert_eq!(encoded(with_groups(200), &mut was_cut, &metrics), None, "about 42 KB is not");
        // Every field at its own bound at once still fits the whole bound.
        let long = "x".repeat(2 * FIELD_LIMIT);
        let mut full = record_of("a");
        full.refused = Some(long.clone());
        full.applied.last_error = Some(long.clone());
        full.applied.hold = Some(long.clone());
        full.applied.last_correction = Some(long);
        let bytes = encoded(full, &mut was_cut, &metrics).expect("written cut");
        assert!(was_cut && bytes.len() <= STATUS_LIMIT, "{}", bytes.len());
    }

    fn record_of(node: &str) -> Status {
        Status {
            node: node.into(),
            groups: Vec::new(),
            revision: None,
            applied: Summary::default(),
            refused: None,
            refused_reason: None,
            written_at: 0,
        }
    }

    #[test]
    fn a_held_node_is_never_current_whatever_revision_it_names() {
        let status = |hold: Option<&str>| Status {
            node: "a".into(),
            groups: Vec::new(),
            revision: Some(9),
            applied: Summary { converged: true, hold: hold.map(str::to_owned), ..Summary::default() },
            refused: None,
            refused_reason: None,
            written_at: 0,
        };
        let row = |hold| Row {
            node: "a".into(),
            alive: true,
            status: Some(status(hold)),
            latest: Some(7),
            current: false,
        };
        assert!(current(&row(None)));
        assert!(!current(&row(Some("held at generation 3 by the node itself"))));
        assert!(!current(&Row { alive: false, ..row(None) }));
    }

    #[test]
    fn a_node_gone_back_by_itself_says_why_in_its_row_and_under_the_table() {
        let hold = crate::generations::Hold {
            generation: 3,
            since: 1_780_000_000,
            by: super::super::confirm::BY.into(),
            reason: Some("no etcd round trip within 1 min of applying generation 4 (revision 9)".into()),
            reverted: Some(crate::generations::Reverted { from: 4, revision: Some(9) }),
        };
        let applied = controller::Applied {
            generation: Some(3),
            hold: Some(hold.describe("T")),
            reverted: Some(hold.clone()),
            converged: true,
            ..controller::Applied::default()
        };
        let summary = Summary::from(&applied);
        let reverted = summary.reverted.clone().unwrap();
        assert_eq!((reverted.generation, reverted.from, reverted.revision), (3, 4, Some(9)));
        assert_eq!(reverted.reason, hold.reason.clone().unwrap());
        // An operator's hold is not a going back.
        let operator = controller::Applied { reverted: None, ..applied.clone() };
        assert_eq!(Summary::from(&operator).reverted, None);
        let status = Status {
            node: "a".into(),
            groups: Vec::new(),
            revision: Some(7),
            applied: summary,
            refused: None,
            refused_reason: None,
            written_at: 0,
        };
        let json = serde_json::to_value(&status).unwrap();
        assert_eq!(json["reverted"]["generation"], 3, "at the top of the status: {json:#}");
        assert_eq!(json["reverted"]["from"], 4, "{json:#}");
        let row =
            Row { node: "a".into(), alive: true, status: Some(status), latest: Some(9), current: false };
        let text = table(9, &[row]);
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[1].contains(" 3*  reverted from generation 4: no etcd round trip within 1 min"),
            "{text}"
        );
        assert!(
            lines[2].starts_with("a: held at generation 3 by the node itself since T, reverted from generation 4 (revision 9): no etcd"),
            "{text}"
        );
    }
}

/// One node's row in `fleet status`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Row {
    /// The node's name.
    pub node: String,
    /// Whether its presence key is there: its lease is being kept.
    pub alive: bool,
    /// What the node last wrote; `None` when it never wrote a status.
    pub status: Option<Status>,
    /// The newest revision among the keys the node reads (by the groups it last reported).
    pub latest: Option<i64>,
    /// Alive, converged, held by no rollback, and applied at the latest revision or later: what
    /// `fleet status` exits 0 on, so a script can wait on it (docs/decisions.md, "`fleet status` exits 1").
    pub current: bool,
}

/// Past how many revisions kept from revision 1 etcd is said never to compact its history.
pub const UNCOMPACTED: i64 = 10_000;

/// A warning, when etcd has never compacted its history (a read at revision 1 still answers)
/// and holds more than `UNCOMPACTED` revisions of it: `fleet status` and the rollout's driver
/// say it once. `None` otherwise, and when etcd cannot tell.
pub async fn uncompacted(etcd: &Etcd) -> Option<String> {
    match etcd.never_compacted(&alive_key("-")).await {
        Ok((true, now)) if now > UNCOMPACTED => Some(format!(
            "warning: etcd has never compacted its history: it still holds every revision from 1 to {now}. Each status a node writes is one it keeps, and its backend quota (--quota-backend-bytes, 2 GiB by default) fills, after which nodes can neither report nor confirm a change: run every etcd member with --auto-compaction-mode=periodic --auto-compaction-retention=10m (README, \"Fleet\")"
        )),
        _ => None,
    }
}

/// Reads every node's status, presence and the revisions of what each reads, at one revision.
pub async fn rows(etcd: &Etcd) -> Result<(i64, Vec<Row>), crate::system::etcd::Error> {
    let all = etcd.range_prefix(super::ROOT, None).await?;
    let mut nodes: BTreeMap<String, Row> = BTreeMap::new();
    let node_root = format!("{}node/", super::ROOT);
    for kv in &all.kvs {
        let Some(rest) = kv.key.strip_prefix(&node_root) else { continue };
        let Some((node, what)) = rest.split_once('/') else { continue };
        let row = nodes.entry(node.to_owned()).or_insert_with(|| Row {
            node: node.to_owned(),
            alive: false,
            status: None,
            latest: None,
            current: false,
        });
        match what {
            "alive" => row.alive = true,
            // A status that does not parse is shown as none rather than failing the table.
            "status" => row.status = serde_json::from_slice(&kv.value).ok(),
            _ => {}
        }
    }
    // Nodes that only have a declaration and never ran are listed too: an operator wants to see
    // the node that never came up (docs/decisions.md, "`fleet status` exits 1").
    for row in nodes.values_mut() {
        let groups = row.status.as_ref().map(|s| s.groups.clone()).unwrap_or_default();
        let prefixes = super::prefixes(&row.node, &groups);
        row.latest = all
            .kvs
            .iter()
            .filter(|kv| prefixes.iter().any(|p| kv.key.starts_with(p.as_str())))
            .map(|kv| kv.mod_revision)
            .max();
        row.current = current(row);
    }
    Ok((all.revision, nodes.into_values().collect()))
}

/// Whether a node is current: alive, converged, at its latest revision or later, and held by no
/// rollback. A held node (its operator's rollback, or its own going back) applies an older
/// generation than the keys it reads, whatever revision its status names (the hold's generation
/// may carry a later revision than the keys left, as a candidate's does after an abort): never
/// current while the hold stands.
fn current(row: &Row) -> bool {
    row.alive
        && row.status.as_ref().is_some_and(|s| {
            s.applied.converged
                && s.applied.hold.is_none()
                && s.revision.is_some_and(|r| row.latest.is_none_or(|l| r >= l))
        })
}

/// The generation a node's status says is in force, `N*` while a rollback holds it, `-` from a
/// node that does not say (an older agent, or no status).
fn generation(s: Option<&Status>) -> String {
    match s.and_then(|s| s.applied.generation.map(|g| (g, s.applied.hold.is_some()))) {
        Some((g, true)) => format!("{g}*"),
        Some((g, false)) => g.to_string(),
        None => "-".into(),
    }
}

/// The table `fleet status` prints.
pub fn table(revision: i64, rows: &[Row]) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<24} {:<5} {:>8} {:>8} {:<9} {:>6} {:>9} {:>6}  LAST ERROR",
        "NODE", "ALIVE", "APPLIED", "LATEST", "CONVERGED", "DRIFT", "CONTESTED", "GEN"
    );
    let opt = |r: Option<i64>| r.map(|r| r.to_string()).unwrap_or_else(|| "-".into());
    for row in rows {
        let s = row.status.as_ref();
        // A refused declaration first: it is why the node is not at its latest revision.
        // Then a going back of its own: why it is not at its latest revision either.
        let reverted = |s: &Status| {
            s.applied.reverted.as_ref().map(|r| format!("reverted from generation {}: {}", r.from, r.reason))
        };
        let mut error = s
            .and_then(|s| s.refused.clone().or_else(|| reverted(s)).or_else(|| s.applied.last_error.clone()))
            .unwrap_or_default();
        error = error.lines().next().unwrap_or_default().chars().take(80).collect();
        // Each node wrote its status itself: what it says is shown, never sent to the terminal.
        let error = crate::telemetry::text::escape(&error);
        let _ = writeln!(
            out,
            "{:<24} {:<5} {:>8} {:>8} {:<9} {:>6} {:>9} {:>6}  {}",
            crate::telemetry::text::escape(&row.node),
            if row.alive { "yes" } else { "no" },
            opt(s.and_then(|s| s.revision)),
            opt(row.latest),
            match s {
                Some(s) if s.applied.converged => "yes",
                Some(_) => "no",
                None => "-",
            },
            s.map(|s| s.applied.drift_corrections.to_string()).unwrap_or_else(|| "-".into()),
            s.map(|s| s.applied.contested.to_string()).unwrap_or_else(|| "-".into()),
            generation(s),
            error
        );
    }
    // A node held by a rollback applies an older generation, not what etcd holds for it: said
    // under the table, whole, since it is what keeps that node from its latest revision.
    for row in rows {
        if let Some(hold) = row.status.as_ref().and_then(|s| s.applied.hold.as_deref()) {
            let _ = writeln!(
                out,
                "{}: {}",
                crate::telemetry::text::escape(&row.node),
                crate::telemetry::text::escape(hold)
            );
        }
    }
    // Who signed what each node enforces, and what it enforces past its expiry: whole, under the
    // table, since a signer is what an operator looks for after a key is lost or rotated.
    let now = crate::system::unix_secs();
    for row in rows {
        let Some(signed) = row.status.as_ref().map(|s| &s.applied.signed).filter(|s| !s.is_empty()) else {
            continue;
        };
        let scopes: Vec<String> = signed
            .iter()
            .map(|s| {
                let expired = if now >= s.expires { " (EXPIRED, still enforced)" } else { "" };
                format!("{} version {} by {}{expired}", s.scope, s.version, s.signed_by.join(", "))
            })
            .collect();
        let _ = writeln!(
            out,
            "{}: signed: {}",
            crate::telemetry::text::escape(&row.node),
            crate::telemetry::text::escape(&scopes.join("; "))
        );
    }
    let current = rows.iter().filter(|r| r.current).count();
    let _ = writeln!(
        out,
        "fleet: {current} of {} nodes alive, converged and at their latest revision (etcd at revision {revision})",
        rows.len()
    );
    out
}
