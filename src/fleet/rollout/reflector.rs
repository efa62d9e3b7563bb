//! The driver's cache of what etcd holds of nodes and the rollout (issue 43): a reflector, as
//! client-go's informers keep one. Listed once, in pages of 1,000 at one revision; then kept by
//! one watch from the revision after, whose changes are taken one by one (`Snapshot::put`,
//! `Snapshot::delete`); listed again when the watch breaks or its revision was compacted away.
//! So the driver reads the fleet once, and then only what changes, where it read the whole of
//! `/mesh-host/` twice a second before.
//!
//! The watch is one watcher over every key from `/mesh-host/node/` to the end of
//! `/mesh-host/rollout/` (statuses, presence keys, the rollout's state, its admissions, the
//! driver's key): one watcher sends its changes in the order etcd made them, a revision's all in
//! one answer, so the cache is always etcd's keys at one revision, as a read was. Before each
//! look the driver asks etcd its revision now and waits until the cache has reached it (its
//! changes, or a progress notice asked for); a cache that does not within `CATCH_UP` is listed
//! again. So the gate judges what etcd held after its last write, as it did reading it whole
//! (docs/decisions.md, "Rollouts").
//!
//! Declarations are not kept: the candidate's keys are left out of the list, and a node's own
//! declaration keys, which lie among its status and presence keys, are read by a list and
//! dropped (a watch event of one is dropped too). The keys under the scope's prefix, which only
//! `promote` needs, are not there either (`Snapshot::scope_keys` is empty).

use std::time::Duration;

use super::*;
use crate::system::etcd::{self, Event, Seen, Watch};

/// How long the cache may take to reach etcd's revision before it is listed again.
const CATCH_UP: Duration = Duration::from_secs(3);

/// The first key the cache holds.
fn first() -> String {
    format!("{ROOT}node/")
}

/// The prefix whose last key is the last the cache holds.
fn last() -> String {
    format!("{ROOT}rollout/")
}

/// The cache: what was listed, and changed since, at `snapshot.revision`; the watch that keeps
/// it, while it holds.
#[derive(Default)]
pub struct Reflector {
    snapshot: Snapshot,
    watch: Option<Watch>,
}

impl Reflector {
    /// An empty cache: the first `fresh` lists.
    pub fn new() -> Reflector {
        Reflector::default()
    }

    /// The cache brought to etcd's revision now at least: listed when it has no watch, or its
    /// watch cannot bring it there within `CATCH_UP`. An error when etcd cannot be read (the
    /// next call lists again).
    pub async fn fresh(&mut self, etcd: &Etcd) -> Result<&Snapshot, etcd::Error> {
        let now = match etcd.revision(&state_key()).await {
            Ok(now) => now,
            Err(e) => {
                self.watch = None;
                return Err(e);
            }
        };
        if self.watch.is_some() && self.snapshot.revision < now {
            self.catch_up(now).await;
        }
        if self.watch.is_none() || self.snapshot.revision < now {
            self.watch = None;
            self.list(etcd).await?;
        }
        Ok(&self.snapshot)
    }

    /// Reads the watch until the cache is at `now`, asking etcd for a progress notice (a quiet
    /// range sends nothing else); drops the watch when it ends, breaks, or takes too long.
    async fn catch_up(&mut self, now: i64) {
        let Some(watch) = self.watch.as_mut() else { return };
        watch.request_progress();
        let deadline = tokio::time::Instant::now() + CATCH_UP;
        while self.snapshot.revision < now {
            let Some(watch) = self.watch.as_mut() else { return };
            match tokio::time::timeout_at(deadline, watch.next()).await {
                Ok(Ok(seen)) => take(&mut self.snapshot, seen),
                Ok(Err(_)) | Err(_) => {
                    self.watch = None;
                    return;
                }
            }
        }
    }

    /// Lists the cache's keys in pages at one revision (the candidate left out), and watches
    /// them from the next.
    async fn list(&mut self, etcd: &Etcd) -> Result<(), etcd::Error> {
        let candidate = super::candidate_root();
        let mut listed = etcd.range_between(&first(), candidate.as_bytes(), None).await?;
        let after = crate::system::etcd::prefix_end(&candidate);
        let rest = etcd
            .range_between(
                &String::from_utf8_lossy(&after),
                &crate::system::etcd::prefix_end(&last()),
                Some(listed.revision),
            )
            .await?;
        listed.kvs.extend(rest.kvs);
        self.snapshot = Snapshot::of(listed);
        self.watch = Some(etcd.watch_between(&first(), &last(), self.snapshot.revision + 1).await?);
        Ok(())
    }
}

/// What the watch saw, taken into the cache: each change, in order, and the revision reached.
fn take(snapshot: &mut Snapshot, seen: Seen) {
    match seen {
        Seen::Created => {}
        Seen::Progress(at) => snapshot.revision = snapshot.revision.max(at),
        Seen::Changed(at, events) => {
            for event in &events {
                apply(snapshot, event);
            }
            snapshot.revision = snapshot.revision.max(at);
        }
    }
}

/// One change, taken into the cache.
pub fn apply(snapshot: &mut Snapshot, event: &Event) {
    match event {
        Event::Put(kv) => snapshot.put(kv),
        Event::Deleted { key, .. } => snapshot.delete(key),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(key: &str, value: &str, mod_revision: i64) -> Kv {
        Kv { key: key.into(), value: value.as_bytes().to_vec(), mod_revision }
    }

    fn status(node: &str, extra: &str) -> String {
        format!(
            r#"{{"node": "{node}", "groups": ["web"], "revision": 12, "converged": true, "counts": {{}},
            "drift_corrections": 0, "contested": 0, "last_error": null, "written_at": 100,
            "generation": 4, "confirmed": 4{extra}}}"#
        )
    }

    fn state(opened: usize) -> String {
        serde_json::json!({"id": "r", "group": null, "replaces": "/mesh-host/fleet/declaration/",
            "base_revision": 1, "keys": [], "waves": [["a"], ["b"]], "opened": opened, "soak": 0,
            "max_failures": 0, "deadline": 60, "paused": null, "halted": null, "done": false,
            "failures": [], "started_at": 0, "started_by": "me"})
        .to_string()
    }

    const ADMISSION: &str =
        r#"{"rollout": "r", "replaces": "/mesh-host/fleet/declaration/", "wave": 1, "at": 5}"#;

    /// Each case: the keys listed, then the changes the watch sees (a put with its value, or a
    /// deletion: `None`), each at its revision; the cache they make must be what a read of the
    /// keys left after them makes (`Snapshot::of`), and say what the case says.
    #[test]
    fn the_cache_takes_each_change_as_a_read_of_the_keys_after_it_would() {
        type Change = (&'static str, Option<String>);
        type Case = (&'static str, Vec<Kv>, Vec<Change>, fn(&Snapshot) -> bool);
        let a_alive = "/mesh-host/node/a/alive";
        let a_status = "/mesh-host/node/a/status";
        let b_status = "/mesh-host/node/b/status";
        let admitted = "/mesh-host/rollout/open/node/a/admitted";
        let open = "/mesh-host/rollout/open/state";
        let cases: Vec<Case> = vec![
            (
                "a status put: parsed, at its revision",
                vec![kv(a_alive, "1", 2)],
                vec![(a_status, Some(status("a", "")))],
                |s| {
                    s.nodes["a"].status.as_ref().is_some_and(|st| st.applied.converged)
                        && s.nodes["a"].status_revision == 11
                },
            ),
            (
                "the presence's lease ended: the key deleted, the node no longer alive",
                vec![kv(a_alive, "1", 2), kv(a_status, &status("a", ""), 3)],
                vec![(a_alive, None)],
                |s| !s.nodes["a"].alive && s.nodes["a"].status.is_some(),
            ),
            (
                "a node with neither key left is no longer known (fleet forget)",
                vec![kv(a_alive, "1", 2), kv(a_status, &status("a", ""), 3)],
                vec![(a_alive, None), (a_status, None)],
                |s| s.nodes.is_empty(),
            ),
            (
                "a status rewritten without its report of going back: the report goes",
                vec![kv(b_status, &status("b", r#", "reverted": {"generation": 3, "reason": "x"}"#), 3)],
                vec![(b_status, Some(status("b", "")))],
                |s| s.nodes["b"].reverted.is_none(),
            ),
            (
                "a status that does not parse says nothing, but the key is there",
                vec![kv(a_status, &status("a", ""), 3)],
                vec![(a_status, Some("{".into()))],
                |s| s.nodes["a"].status.is_none() && s.nodes["a"].status_revision == 11,
            ),
            (
                "the state written and an admission: both, at their revisions",
                vec![kv(open, &state(0), 3)],
                vec![(open, Some(state(1))), (admitted, Some(ADMISSION.into()))],
                |s| {
                    s.state.as_ref().is_some_and(|(st, at)| st.opened == 1 && *at == 11)
                        && s.admitted["a"].1 == 12
                },
            ),
            (
                "an abort: the admissions and the state deleted, the last one put",
                vec![kv(open, &state(1), 3), kv(admitted, ADMISSION, 4)],
                vec![(admitted, None), (open, None), ("/mesh-host/rollout/last", Some(state(1)))],
                |s| s.state.is_none() && s.admitted.is_empty() && s.last.is_some(),
            ),
            (
                "a node's own declaration and the candidate are not the driver's",
                vec![kv(a_alive, "1", 2)],
                vec![
                    ("/mesh-host/node/a/declaration/x.json", Some("{}".into())),
                    ("/mesh-host/rollout/open/candidate/x.json", Some("{}".into())),
                ],
                |s| s.nodes["a"].status.is_none() && s.state.is_none(),
            ),
            (
                "the driver's key, and its lease ended",
                vec![],
                vec![("/mesh-host/rollout/driver", Some("me".into())), ("/mesh-host/rollout/driver", None)],
                |s| s.driver.is_none(),
            ),
        ];
        for (what, listed, changes, says) in cases {
            let mut cache = Snapshot::of(Range { revision: 10, kvs: listed.clone() });
            let mut keys: BTreeMap<String, Kv> = listed.into_iter().map(|kv| (kv.key.clone(), kv)).collect();
            for (i, (key, value)) in changes.into_iter().enumerate() {
                let revision = 11 + i as i64;
                let event = match value {
                    Some(v) => {
                        keys.insert(key.into(), kv(key, &v, revision));
                        Event::Put(kv(key, &v, revision))
                    }
                    None => {
                        keys.remove(key);
                        Event::Deleted { key: key.into(), revision }
                    }
                };
                take(&mut cache, Seen::Changed(revision, vec![event]));
            }
            let read = Snapshot::of(Range { revision: cache.revision, kvs: keys.into_values().collect() });
            assert_eq!(cache, read, "{what}");
            assert!(says(&cache), "{what}: {cache:#?}");
        }
    }

    /// A relist replaces the cache whole: what was deleted while the watch was down (a node gone,
    /// its lease ended unseen) is gone from it, not kept from before.
    #[test]
    fn a_relist_replaces_the_cache_and_progress_moves_only_its_revision() {
        let before = vec![
            kv("/mesh-host/node/a/alive", "1", 2),
            kv("/mesh-host/node/b/alive", "1", 3),
            kv("/mesh-host/node/b/status", &status("b", ""), 4),
        ];
        let mut cache = Snapshot::of(Range { revision: 10, kvs: before });
        take(&mut cache, Seen::Progress(15));
        assert_eq!((cache.revision, cache.nodes.len()), (15, 2));
        take(&mut cache, Seen::Progress(12));
        assert_eq!(cache.revision, 15, "never back");
        let after = vec![kv("/mesh-host/node/b/status", &status("b", ""), 4)];
        cache = Snapshot::of(Range { revision: 30, kvs: after });
        assert_eq!(cache.nodes.keys().collect::<Vec<_>>(), ["b"]);
        assert!(!cache.nodes["b"].alive, "b's presence ended while the watch was down");
    }
}
