//! The daemon's etcd source: keeps the cache directory equal to the last declaration etcd held
//! for this node that mesh-host accepts.
//!
//! The loop: read every prefix of the node at one revision; if what was read parses, write it
//! to the cache in one step (the controller's source watcher sees the directory change and puts
//! it in force); then watch every prefix, on one Watch stream, from the next revision. Any
//! change seen, a compacted revision, a watch etcd refuses, or ten minutes of quiet leads to the
//! same thing: a full read again, of every prefix in one transaction; after a change, at that
//! change's revision, from the member that announced it (docs/decisions.md, "A node reads a
//! change where it heard of it"). A stream that breaks (its member gone) is opened again, on
//! the next member if need be, from the revision after the last one it is known to have sent
//! everything up to. Since each read is whole and each watch starts right after the revision
//! read (or seen), nothing written in between is missed, across reconnects and leader changes
//! alike.
//!
//! While etcd cannot be reached, the cache stays as it is and the controller goes on converging
//! on it; a node started while etcd is down applies its last known declaration
//! (docs/decisions.md, "The cache is the declaration source"; docs/sources.md, "Sources: a
//! directory, or etcd through a directory", which also says why every change is a whole read).

use std::path::PathBuf;
use std::time::Duration;

use sha2::Digest as _;
use tokio_util::sync::CancellationToken;

use crate::declaration::Declaration;
use crate::system::etcd::{self, Etcd, Kv, Seen};
use crate::system::jittered;
use crate::telemetry::{events, Event as _, Metrics};

/// Where a node's declaration comes from in etcd.
#[derive(Clone, Debug)]
pub struct Source {
    /// Comma-separated endpoints, `http://127.0.0.1:2379,...`.
    pub endpoints: String,
    /// This node's name, which picks its own declaration and status keys.
    pub node: String,
    /// In the order given: a later group's files come after an earlier one's.
    pub groups: Vec<String>,
    /// With `--allowed-signers`: what every scope read must be signed by, and the state
    /// directory its high-water marks are kept in (`super::signed`).
    pub trust: Option<(crate::controller::signed::Trust, PathBuf)>,
    /// How long the node's presence outlives its last renewal (`run --presence-ttl`): read by
    /// the status writer, which keeps the presence.
    pub presence_ttl: std::time::Duration,
}

/// A read refused whole: the label it is counted under (`invalid`, or a signed declaration's
/// `trust::Reason`), and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refused {
    /// `mesh_host_declaration_refusals_total`'s reason.
    pub reason: &'static str,
    /// Said in full, naming the revision or the scope.
    pub message: String,
}

/// The name of the file in the cache that says where its declaration came from. Hidden, so the
/// controller, which reads the cache as a `declaration.d`, does not take it for a part.
pub const MANIFEST: &str = ".fleet.json";

/// A full read even when no watch said anything: a belt beside the HTTP/2 pings, which end a
/// watch on a connection that died without a word (a cable pulled, a firewall dropping packets)
/// within 15 s; rare, since every node of a fleet makes it (docs/decisions.md, "A whole read
/// every ten minutes"); spread by `jittered`.
const REREAD: Duration = Duration::from_secs(600);

/// The longest wait between tries while etcd cannot be reached.
const BACKOFF_CAP: Duration = Duration::from_secs(30);

/// What one read of etcd found for a node.
#[derive(Debug, Default)]
pub struct Read {
    /// The revision every prefix was read at.
    pub revision: i64,
    /// The keys, in declaration order.
    pub kvs: Vec<Kv>,
    /// While the node is admitted to a rollout: the rollout's id, and the scope's prefix the
    /// candidate's keys stand in for.
    pub rollout: Option<(String, String)>,
    /// The prefixes to watch from the next revision.
    pub watch: Vec<String>,
    /// The prefixes read, in order: the candidate's in place of the scope's it replaces.
    pub prefixes: Vec<String>,
}

/// Reads the node's declaration at one revision, in one read-only transaction: its admission
/// to a rollout and its prefixes, the candidate's in place of the scope's while it is admitted
/// (`super::rollout`). `admitted` is the scope the candidate stood in for at the last read: the
/// transaction reads what that says, and is made once more, with the other prefix, only when
/// the admission it found says otherwise (the read that follows an admission or its end). The
/// candidate is read, and watched, only while the node is admitted, so a rollout's start wakes no
/// node. A node whose etcd role may not read the rollout's keys (granted before rollouts
/// existed) reads as it always did, and watches only its prefixes.
///
/// `at`: the revision of a change the node's watch announced, read serializably from the member
/// that announced it, or, when that member is no longer the one asked and the next has not
/// applied it yet, linearizably at the latest (`read_at`). `None`: the latest, linearizably.
pub async fn read_node(
    etcd: &Etcd,
    node: &str,
    groups: &[String],
    admitted: Option<&str>,
    mut at: Option<i64>,
) -> Result<Read, etcd::Error> {
    use super::rollout;
    let own = super::prefixes(node, groups);
    let (admission, key) = (rollout::admission_prefix(node), rollout::admission_key(node));
    let mut guess = admitted.map(str::to_owned);
    loop {
        let reading: Vec<String> = own
            .iter()
            .map(|p| match rollout::candidate_for(p) {
                Some(candidate) if guess.as_ref() == Some(p) => candidate,
                _ => p.clone(),
            })
            .collect();
        let all: Vec<String> = std::iter::once(admission.clone()).chain(reading.iter().cloned()).collect();
        let range = match read_at(etcd, &all, at).await {
            Err(etcd::Error::Refused { why: etcd::Refusal::PermissionDenied, .. }) => {
                let range = read_at(etcd, &own, at).await?;
                let (watch, prefixes) = (own.clone(), own);
                return Ok(Read { revision: range.revision, kvs: range.kvs, rollout: None, watch, prefixes });
            }
            other => other?,
        };
        // A read again with the other prefix is of the same revision, which this member has.
        at = Some(range.revision);
        let found = range
            .kvs
            .iter()
            .find(|kv| kv.key == key)
            .and_then(|kv| serde_json::from_slice::<rollout::Admission>(&kv.value).ok())
            .filter(|a| own.contains(&a.replaces));
        if found.as_ref().map(|a| &a.replaces) == guess.as_ref() {
            let kvs = range.kvs.into_iter().filter(|kv| !kv.key.starts_with(&admission)).collect();
            let watch = std::iter::once(admission).chain(reading.iter().cloned()).collect();
            let rollout = found.map(|a| (a.rollout, a.replaces));
            return Ok(Read { revision: range.revision, kvs, rollout, watch, prefixes: reading });
        }
        guess = found.map(|a| a.replaces);
    }
}

/// `Etcd::read_prefixes` at `at`; at the latest, linearizably, when the member asked has not
/// applied `at` yet (the connection moved to another since the watch's event) or has compacted
/// it away.
async fn read_at(etcd: &Etcd, prefixes: &[String], at: Option<i64>) -> Result<etcd::Range, etcd::Error> {
    match etcd.read_prefixes(prefixes, at).await {
        Err(etcd::Error::Compacted(_) | etcd::Error::Refused { why: etcd::Refusal::FutureRevision, .. })
            if at.is_some() =>
        {
            etcd.read_prefixes(prefixes, None).await
        }
        other => other,
    }
}

/// The name a key is cached under: a candidate's key under the name of the scope's key it
/// stands in for, so that the candidate, once promoted, is the same generation on the node,
/// and the declaration in force, back after an abort, is the generation the node had
/// (docs/decisions.md, "Rollouts").
fn cached_as(key: &str, replaces: Option<&str>) -> String {
    let candidate = replaces.and_then(super::rollout::candidate_for);
    match (replaces, candidate.and_then(|c| key.strip_prefix(&c).map(str::to_owned))) {
        (Some(scope), Some(name)) => format!("{scope}{name}"),
        _ => key.to_owned(),
    }
}

/// A digest of what was read: keys and values, in order.
fn digest(kvs: &[Kv]) -> String {
    let mut h = sha2::Sha256::new();
    for kv in kvs {
        h.update((kv.key.len() as u64).to_le_bytes());
        h.update(kv.key.as_bytes());
        h.update((kv.value.len() as u64).to_le_bytes());
        h.update(&kv.value);
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// A declaration cached: the revision it was read at, and the rollout whose candidate it is.
type CachedAt = (i64, Option<String>);

/// What the cache holds now, by its manifest: the digest, and the revision and rollout it was
/// read at and for; `None` when there is no cache yet.
fn cached_manifest(cache: &std::path::Path) -> Option<(String, Option<CachedAt>)> {
    let bytes = crate::system::read_input(&cache.join(MANIFEST), 1 << 20).ok()?;
    let manifest: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    let digest = manifest["digest"].as_str().map(str::to_owned)?;
    let rollout = manifest["rollout"].as_str().map(str::to_owned);
    Some((digest, manifest["revision"].as_i64().map(|r| (r, rollout))))
}

/// The `cache` mutant (feature `robust-mutant`, never in a release; I9 in tests/robust/): with
/// `MESH_HOST_MUTANT` naming `cache`, the cache is labelled with the revision of the read
/// before, not the one it holds. Unset, nothing happens.
#[cfg(feature = "robust-mutant")]
fn stale_revision(manifest: &mut serde_json::Value, cache: &std::path::Path) {
    if super::mutant("cache") {
        if let Some((_, Some((was, _)))) = cached_manifest(cache) {
            manifest["revision"] = serde_json::json!(was);
        }
    }
}

/// What the source does for the confirmation window (`super::pending`): before the cache is
/// written with a new declaration, the window it will open is recorded (so it is recorded
/// before the controller puts the generation in force), or, when the declaration ends the
/// node's admission to a rollout, the record of the candidate's window is removed.
pub struct Priming {
    /// The window's record.
    pub file: std::sync::Arc<super::pending::WindowFile>,
    /// The node's generations: the one in force is the one a new one goes back to.
    pub generations: crate::generations::Generations,
}

impl Priming {
    /// Before the declaration read at `revision` (the candidate of `rollout`, if any) is cached;
    /// `last` the rollout of the declaration cached before it, when known. Blocking.
    fn before(&self, revision: i64, rollout: Option<&String>, last: Option<&Option<String>>) {
        let withdrawn = matches!(last, Some(Some(was)) if rollout != Some(was));
        let done = if withdrawn {
            self.file.clear(i64::MAX)
        } else if let Some(previous) = self.generations.in_force() {
            let record = super::pending::Record {
                revision,
                previous,
                generation: None,
                deadline: None,
                rollout: rollout.cloned(),
            };
            self.file.store(&record)
        } else {
            Ok(())
        };
        if let Err(e) = done {
            tracing::warn!(error = %e, "the confirmation window of the declaration read at revision {revision} is not recorded");
        }
    }
}

/// What one read of etcd came to.
#[derive(Debug, PartialEq, Eq)]
pub enum Taken {
    /// The same keys and values as the last read: nothing to do.
    Unchanged,
    /// Accepted and written to the cache, which the controller puts in force.
    Accepted,
    /// Accepted, but the cache could not be written: tried again at the next read.
    NotCached,
    /// Refused whole, with why: the declaration in force stays. Reported once per distinct read
    /// (the reporter in `daemon` counts it and logs it; the status in etcd carries it until a later
    /// declaration is accepted).
    Refused(Refused),
}

/// Decides what one read means for the cache: written when it is a declaration mesh-host
/// accepts and differs from what is cached; refused otherwise. Blocking: a large declaration
/// takes a while to parse and the cache is written with fsyncs.
fn take(
    source: &Source,
    cache: &std::path::Path,
    read: Read,
    seen: &mut Option<String>,
    priming: Option<(&Priming, Option<&Option<String>>)>,
    metrics: &Metrics,
) -> Taken {
    let Read { revision, mut kvs, rollout, prefixes, .. } = read;
    let d = digest(&kvs);
    // The same bytes at a later revision leave the cache as it is: rewriting it would re-apply
    // every node on every unrelated write, and the status's revision stays that of the last
    // change (docs/decisions.md, "Status").
    if seen.as_deref() == Some(d.as_str()) {
        return Taken::Unchanged;
    }
    *seen = Some(d.clone());
    let node = &source.node;
    // Verified before anything of it is parsed; the marks kept before it is cached.
    let mut signed = Vec::new();
    if let Some((trust, state)) = &source.trust {
        let accepted = match super::signed::verify_read(trust, state, &kvs, &prefixes, rollout.as_ref()) {
            Ok(accepted) => accepted,
            Err(r) => {
                let message = format!("the declaration in etcd at revision {revision} is {r}");
                return Taken::Refused(Refused { reason: r.reason.label(), message });
            }
        };
        if let Err(e) = super::signed::persist(state, &accepted) {
            // Not recorded as seen: the next read tries again.
            *seen = None;
            events::FleetSource::NotCached { node, revision, cache, error: &e }.emit(metrics);
            return Taken::NotCached;
        }
        signed = accepted.iter().map(|(_, a)| crate::controller::signed::InForce::of(a)).collect();
    }
    // A manifest and its signatures are never parts of the declaration.
    kvs.retain(|kv| !super::signed::is_meta(&kv.key));
    if kvs.is_empty() {
        // An empty declaration would remove everything the node manages: a node named wrongly,
        // or a fleet wiped by mistake, must not do that. An operator who means it puts a
        // declaration with no resources (docs/decisions.md, "No key at all is refused").
        return Taken::Refused(Refused {
            reason: "invalid",
            message: format!(
                "etcd holds no declaration for node {node} (no key under its fleet, group or node prefixes) at revision {revision}; \
                 refused. To empty a node on purpose, put a declaration with no resources"
            ),
        });
    }
    let named: Vec<(String, Vec<u8>)> = kvs.iter().map(|kv| (kv.key.clone(), kv.value.clone())).collect();
    match Declaration::parse_sources(&named) {
        Ok(declaration) => {
            let keys: Vec<&str> = kvs.iter().map(|kv| kv.key.as_str()).collect();
            let mut manifest = serde_json::json!({
                "node": node, "groups": source.groups, "revision": revision, "digest": d, "keys": keys,
            });
            if let Some((id, _)) = &rollout {
                manifest["rollout"] = serde_json::json!(id);
            }
            #[cfg(feature = "robust-mutant")]
            stale_revision(&mut manifest, cache);
            let replaces = rollout.as_ref().map(|(_, scope)| scope.as_str());
            let mut files: Vec<(String, Vec<u8>)> = named
                .into_iter()
                .enumerate()
                .map(|(i, (key, bytes))| (super::cache_name(revision, i, &cached_as(&key, replaces)), bytes))
                .collect();
            files.push((MANIFEST.into(), manifest.to_string().into_bytes()));
            // Who signed it, for the controller to say once it is in force (`/healthz`, the
            // gauge, the node's status): in the same directory, so it is swapped in with it.
            if !signed.is_empty() {
                let summary = serde_json::to_vec(&signed).unwrap_or_default();
                files.push((crate::controller::signed::SUMMARY.into(), summary));
            }
            let id = rollout.as_ref().map(|(id, _)| id);
            if let Some((priming, last)) = priming {
                priming.before(revision, id, last);
            }
            match crate::system::fs::replace_dir(cache, &files) {
                Ok(()) => {
                    let (resources, keys) = (declaration.resources.len(), kvs.len());
                    events::FleetSource::Accepted { node, revision, resources, keys }.emit(metrics);
                    Taken::Accepted
                }
                Err(e) => {
                    // Not recorded as seen: the next read tries the write again.
                    *seen = None;
                    events::FleetSource::NotCached { node, revision, cache, error: &e }.emit(metrics);
                    Taken::NotCached
                }
            }
        }
        Err(refused) => Taken::Refused(Refused {
            reason: "invalid",
            message: format!("the declaration in etcd at revision {revision} is refused: {refused}"),
        }),
    }
}

/// Runs the source until `shutdown`: see the module's notes. `first` is told when the first read
/// has been taken or has failed, so the controller's first apply is of what etcd holds now
/// rather than of an older cache, without waiting on an etcd that does not answer
/// (docs/decisions.md, "A fresh node waits for etcd at most 10 s"). `refused`
/// holds why the latest declaration read was refused, `None` once one is accepted: the
/// reporter (`daemon`) counts and logs each refusal, and the status writer puts it in the
/// node's status.
#[allow(clippy::too_many_arguments, reason = "what the source's task follows and tells, each from `daemon`")]
pub async fn run(
    source: Source,
    etcd: std::sync::Arc<Etcd>,
    cache: PathBuf,
    first: tokio::sync::oneshot::Sender<()>,
    refused: tokio::sync::watch::Sender<Option<Refused>>,
    contact: std::sync::Arc<tokio::sync::watch::Sender<super::confirm::Contact>>,
    priming: Option<std::sync::Arc<Priming>>,
    metrics: std::sync::Arc<Metrics>,
    shutdown: CancellationToken,
) {
    let mut first = Some(first);
    let mut late = crate::system::fs::failpoint_named("etcd-watch-late");
    let (mut seen, mut last) =
        cached_manifest(&cache).map_or((None, None), |(digest, at)| (Some(digest), at));
    if let Some((revision, rollout)) = last.clone() {
        contact.send_modify(|c| c.cached(revision, rollout));
    }
    // The scope the candidate stood in for at the last read, while admitted.
    let mut admitted: Option<String> = None;
    let mut backoff = Duration::from_millis(250);
    // Whether the last try failed: etcd going away and coming back is logged once each way.
    let mut down = false;
    // The revision of the change the watch announced, read at next; `None`: the latest.
    let mut announced: Option<i64> = None;
    loop {
        let read = match read_next(&etcd, &source, admitted.as_deref(), announced.take()).await {
            Ok(read) => read,
            Err(e) => {
                let certificate_refused = e.certificate_refused();
                events::FleetSource::Unreachable {
                    node: &source.node,
                    error: &e,
                    first: !down,
                    certificate_refused,
                }
                .emit(&metrics);
                // For the confirmation window (`confirm`): whether etcd answered before a change.
                contact.send_modify(|c| c.failed(e.to_string()));
                down = true;
                if let Some(first) = first.take() {
                    let _ = first.send(());
                }
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(jittered(backoff)) => {}
                }
                backoff = (backoff * 2).min(BACKOFF_CAP);
                continue;
            }
        };
        let (revision, watched) = (read.revision, read.watch.clone());
        admitted = read.rollout.as_ref().map(|(_, replaces)| replaces.clone());
        events::FleetSource::Reached { node: &source.node, revision, again: down }.emit(&metrics);
        contact.send_modify(|c| {
            c.answered();
            c.read = Some(revision);
        });
        down = false;
        backoff = Duration::from_millis(250);
        let rollout = read.rollout.as_ref().map(|(id, _)| id.clone());
        let priming = (priming.clone(), last.as_ref().map(|(_, r)| r.clone()));
        let taken;
        (taken, seen) = take_blocking(&source, &cache, read, seen.take(), priming, &metrics).await;
        match taken {
            Taken::Accepted => {
                refused.send_if_modified(|r| r.take().is_some());
                // For the confirmation window: which rollout's candidate, if any, is cached.
                last = Some((revision, rollout.clone()));
                contact.send_modify(|c| c.cached(revision, rollout));
            }
            Taken::Refused(why) => {
                refused.send_replace(Some(why));
            }
            Taken::Unchanged | Taken::NotCached => {}
        }
        if let Some(first) = first.take() {
            let _ = first.send(());
        }
        // The failpoint `etcd-watch-late` holds the first watch back 3 s: the window a test
        // needs to write and compact past the revision just read, so the watch finds that
        // revision compacted away and the whole declaration is read again.
        if std::mem::take(&mut late) {
            tokio::time::sleep(Duration::from_secs(3)).await;
        }

        announced = match wait_for_change(&etcd, &watched, revision, &source.node, &metrics, &shutdown).await
        {
            Next::Stop => return,
            Next::Latest => None,
            Next::At(at) => Some(at),
        };
    }
}

/// `take`, on a blocking thread (it writes the cache): what became of the read, and the digest
/// of the declaration in the cache after it. `priming`: the priming, and the rollout of the
/// declaration cached last.
async fn take_blocking(
    source: &Source,
    cache: &std::path::Path,
    read: Read,
    mut seen: Option<String>,
    priming: (Option<std::sync::Arc<Priming>>, Option<Option<String>>),
    metrics: &std::sync::Arc<Metrics>,
) -> (Taken, Option<String>) {
    let (source, cache, metrics) = (source.clone(), cache.to_owned(), metrics.clone());
    let joined = tokio::task::spawn_blocking(move || {
        let (priming, last) = priming;
        let priming = priming.as_deref().map(|p| (p, last.as_ref()));
        let taken = take(&source, &cache, read, &mut seen, priming, &metrics);
        (taken, seen)
    })
    .await;
    joined.unwrap_or((Taken::NotCached, None))
}

/// `read_node` for the source's loop. The failpoint `etcd-read-late` holds every read of a
/// change the watch announced 3 s: the window a test needs to take the quorum from the member
/// that announced it.
async fn read_next(
    etcd: &Etcd,
    source: &Source,
    admitted: Option<&str>,
    at: Option<i64>,
) -> Result<Read, etcd::Error> {
    if at.is_some() && crate::system::fs::failpoint_named("etcd-read-late") {
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    read_node(etcd, &source.node, &source.groups, admitted, at).await
}

/// What the source reads after a watch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Next {
    /// Shut down.
    Stop,
    /// The latest revision, linearizably: after a compaction, a watch refused or ended, or
    /// `REREAD`'s quiet.
    Latest,
    /// The revision of the change the watch announced, from the member that announced it.
    At(i64),
}

/// Watches every prefix from the revision after `revision` until one speaks (a change, a
/// compaction, a refusal) or `REREAD` passes: then the whole declaration is to be read again,
/// at the change's revision when it was a change (`Next::At`). `Next::Stop` when `shutdown`
/// came first.
///
/// Every prefix is watched on one Watch stream of the client's one connection. When the stream
/// breaks (the member went away, the connection died), it is opened again, on the next member
/// when that one is gone, from the revision after the last one the watch is known to have sent
/// everything up to: the read's, or a later progress notice's. Nothing is missed and nothing is
/// read again that did not change; a watch that cannot be opened again leads to a whole read.
async fn wait_for_change(
    etcd: &Etcd,
    prefixes: &[String],
    revision: i64,
    node: &str,
    metrics: &Metrics,
    shutdown: &CancellationToken,
) -> Next {
    let reread = tokio::time::sleep(jittered(REREAD));
    tokio::pin!(reread);
    let mut from = revision + 1;
    // Streams that broke before etcd created their watchers: a member that takes streams and
    // drops them at once would otherwise be retried ten times a second; past a few, a whole
    // read, with its backoff.
    let mut stillborn = 0;
    loop {
        let mut created = false;
        let mut watch = match etcd.watch_prefixes(prefixes, from).await {
            Ok(watch) => watch,
            Err(e) => return watch_ended(etcd, node, &e, metrics).await,
        };
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return Next::Stop,
                _ = &mut reread => return Next::Latest,
                seen = watch.next() => match seen {
                    Ok(Seen::Created) => {
                        created = true;
                        stillborn = 0;
                        continue;
                    }
                    Ok(Seen::Progress(at)) => {
                        events::FleetSource::Progress { node, revision: at }.emit(metrics);
                        continue;
                    }
                    Ok(Seen::Changed(at, _)) => {
                        events::FleetSource::Changed { node, revision: at }.emit(metrics);
                        return Next::At(at);
                    }
                    Err(etcd::Error::Compacted(at)) => {
                        events::FleetSource::Compacted { node, at }.emit(metrics);
                        return Next::Latest;
                    }
                    Err(e @ etcd::Error::Unreachable { .. }) => {
                        events::FleetSource::WatchEnded { node, error: &e }.emit(metrics);
                        from = from.max(watch.seen() + 1);
                        stillborn += usize::from(!created);
                        if stillborn >= 3 {
                            return Next::Latest;
                        }
                        // A short pause: a member going away ends the stream at once, and
                        // its successor may still be electing a leader.
                        tokio::time::sleep(jittered(Duration::from_millis(100))).await;
                        break;
                    }
                    Err(e) => return watch_ended(etcd, node, &e, metrics).await,
                },
            }
        }
    }
}

/// A watch refused or cancelled: said, and the whole declaration is read again, at the latest.
async fn watch_ended(etcd: &Etcd, node: &str, e: &etcd::Error, metrics: &Metrics) -> Next {
    // A token etcd no longer takes (it expired, or etcd restarted): the next read logs in
    // again.
    if let etcd::Error::Refused { why: etcd::Refusal::InvalidToken, .. }
    | etcd::Error::Cancelled { why: etcd::Refusal::InvalidToken, .. } = e
    {
        etcd.forget_token();
    }
    events::FleetSource::WatchEnded { node, error: e }.emit(metrics);
    // A short pause: a member going away ends every watch at once.
    tokio::time::sleep(jittered(Duration::from_millis(100))).await;
    Next::Latest
}
