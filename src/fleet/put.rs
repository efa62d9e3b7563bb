//! `mesh-host fleet put` and `fleet diff`: a declaration file or directory written under one
//! scope's prefix, validated first, in one transaction.
//!
//! The keys are the files' names under the scope's prefix (`base.json` under the fleet is
//! `/mesh-host/fleet/declaration/base.json`), so what a node reads in name order is what the
//! operator's directory holds in name order. A put makes the prefix hold exactly the files:
//! keys for files no longer there are deleted in the same transaction (docs/decisions.md,
//! "`fleet put` makes the scope hold exactly the files put").

use std::fmt::Write as _;
use std::path::PathBuf;

use crate::declaration::{Declaration, Refused};
use crate::system::etcd::{Cond, Etcd, Read, Write};

use super::Scope;

/// Each node's groups as a trust policy binds them (`trust::Policy::nodes`), by node: where
/// `fleet put`'s checks and a rollout's waves read a node's groups when one is given.
pub type Bound = std::collections::BTreeMap<String, Vec<String>>;

/// What a put would change under a prefix, key by key.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Changes {
    /// Keys the put would add.
    pub added: Vec<String>,
    /// Keys whose value the put would change.
    pub changed: Vec<String>,
    /// Keys the put would remove.
    pub removed: Vec<String>,
    /// How many keys it would leave as they are.
    pub unchanged: usize,
}

impl Changes {
    /// Compares what is under the prefix now with what the put writes. Both in key order.
    pub fn between(now: &[(String, Vec<u8>)], wanted: &[(String, Vec<u8>)]) -> Changes {
        let mut c = Changes::default();
        for (key, bytes) in wanted {
            match now.iter().find(|(k, _)| k == key) {
                None => c.added.push(key.clone()),
                Some((_, old)) if old != bytes => c.changed.push(key.clone()),
                Some(_) => c.unchanged += 1,
            }
        }
        c.removed =
            now.iter().filter(|(k, _)| !wanted.iter().any(|(w, _)| w == k)).map(|(k, _)| k.clone()).collect();
        c
    }

    /// Whether the put would change nothing.
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.changed.is_empty() && self.removed.is_empty()
    }

    fn summary(&self) -> String {
        format!(
            "{} added, {} changed, {} removed, {} unchanged",
            self.added.len(),
            self.changed.len(),
            self.removed.len(),
            self.unchanged
        )
    }
}

/// Names the files to put by their keys under the scope's prefix and validates them as one
/// declaration, under the names a node will see, so a refusal names the key it would have had.
/// Returns the keys and bytes to write, in key order. A refusal touches nothing in etcd.
pub fn prepare(scope: &Scope, files: Vec<(PathBuf, Vec<u8>)>) -> Result<Vec<(String, Vec<u8>)>, Refused> {
    let prefix = scope.prefix();
    let mut out: Vec<(String, Vec<u8>)> = files
        .into_iter()
        .map(|(file, bytes)| {
            let name = file.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            (format!("{prefix}{name}"), bytes)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Declaration::parse_sources(&out)?;
    Ok(out)
}

/// Refuses a put that would make some node's whole declaration refused: for each node the
/// scope reaches (every node that reported a status, for the fleet; those that reported the
/// group, for a group; the node itself, for a node), its fleet's, groups' and own keys as they
/// are, with the scope's replaced by what is put, must parse as one declaration (two levels
/// declaring one id, say, would not). Groups are those each node last reported, or, given a
/// trust policy's (`bound`), those it binds each node to: every node it names is checked, and a
/// node's own report is not believed (docs/decisions.md, "The trust policy"). Returns how
/// many nodes were checked, or the refusal, naming the node, as the message to exit 2 with
/// (docs/decisions.md, "`fleet put` validates twice").
pub async fn check_nodes(
    etcd: &Etcd,
    scope: &Scope,
    wanted: &[(String, Vec<u8>)],
    bound: Option<&Bound>,
) -> anyhow::Result<Result<usize, String>> {
    // Serializable: a node whose status is a moment behind is checked with the groups it had
    // reported a moment before; the nodes check again what they read (`Declaration::parse_sources`).
    let all = etcd.range_prefix_read(super::ROOT, Read::Serializable).await?;
    let mut nodes: std::collections::BTreeMap<String, Vec<String>> = std::collections::BTreeMap::new();
    let node_root = format!("{}node/", super::ROOT);
    for kv in &all.kvs {
        let Some(node) = kv.key.strip_prefix(&node_root).and_then(|rest| rest.strip_suffix("/status")) else {
            continue;
        };
        if let Ok(status) = serde_json::from_slice::<super::status::Status>(&kv.value) {
            nodes.insert(node.to_owned(), status.groups);
        }
    }
    if let Some(bound) = bound {
        for (node, groups) in nodes.iter_mut() {
            *groups = bound.get(node).cloned().unwrap_or_default();
        }
        nodes.extend(bound.iter().map(|(n, g)| (n.clone(), g.clone())));
    }
    if let Scope::Node(n) = scope {
        nodes.entry(n.clone()).or_default();
    }
    let target = scope.prefix();
    let mut checked = 0;
    for (node, groups) in &nodes {
        let reached = match scope {
            Scope::Fleet => true,
            Scope::Group(g) => groups.contains(g),
            Scope::Node(n) => n == node,
        };
        if !reached {
            continue;
        }
        let mut sources: Vec<(String, Vec<u8>)> = Vec::new();
        for prefix in super::prefixes(node, groups) {
            if prefix == target {
                sources.extend(wanted.iter().cloned());
            } else {
                sources.extend(
                    all.kvs
                        .iter()
                        .filter(|kv| kv.key.starts_with(&prefix))
                        .map(|kv| (kv.key.clone(), kv.value.clone())),
                );
            }
        }
        // A manifest and its signatures are not parts of the declaration (`super::signed`).
        sources.retain(|(key, _)| !super::signed::is_meta(key));
        if let Err(refused) = Declaration::parse_sources(&sources) {
            return Ok(Err(format!(
                "mesh-host: this put would make the declaration of node {node} (the fleet's keys, {}its own) refused; nothing was written:\n{refused}",
                groups.iter().map(|g| format!("group {g}'s, ")).collect::<String>()
            )));
        }
        checked += 1;
    }
    Ok(Ok(checked))
}

/// What is under the prefix now (read as `read` says), and the revision it was read at.
async fn current(etcd: &Etcd, scope: &Scope, read: Read) -> anyhow::Result<(i64, Vec<(String, Vec<u8>)>)> {
    let range = etcd.range_prefix_read(&scope.prefix(), read).await?;
    Ok((range.revision, range.kvs.into_iter().map(|kv| (kv.key, kv.value)).collect()))
}

/// `fleet diff`: what a put of `wanted` (from `prepare`) would change, with a diff of each changed key.
pub async fn diff(etcd: &Etcd, scope: &Scope, wanted: &[(String, Vec<u8>)]) -> anyhow::Result<String> {
    let (revision, now) = current(etcd, scope, Read::Linearizable).await?;
    let changes = Changes::between(&now, wanted);
    let mut out = String::new();
    for key in &changes.added {
        let _ = writeln!(out, "      add {key}");
    }
    for key in &changes.changed {
        let _ = writeln!(out, "   change {key}");
        let old =
            now.iter().find(|(k, _)| k == key).map(|(_, b)| String::from_utf8_lossy(b)).unwrap_or_default();
        let new = wanted
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, b)| String::from_utf8_lossy(b))
            .unwrap_or_default();
        let diff = similar::TextDiff::from_lines(old.as_ref(), new.as_ref());
        let _ = write!(
            out,
            "{}",
            diff.unified_diff().context_radius(2).header(&format!("{key} (etcd)"), &format!("{key} (put)"))
        );
    }
    for key in &changes.removed {
        let _ = writeln!(out, "   remove {key}");
    }
    let _ = writeln!(
        out,
        "diff: a put to {} would make {}; compared with etcd at revision {revision}; nothing was written",
        scope.describe(),
        changes.summary()
    );
    Ok(out)
}

/// `fleet put`: writes `wanted` (from `prepare`) under the scope's prefix in one transaction, provided nothing
/// under the prefix changed between the read and the write (else nothing is written and the
/// operator is told to look again): a put over someone else's newer write would undo it
/// unseen (docs/decisions.md, "`fleet put` makes the scope hold exactly the files put").
///
/// Refused, naming the rollout, while a rollout is open (`fleet rollout`): checked in the
/// same transaction, so a rollout started between the read and the write refuses it too.
///
/// The reads are serializable first: answered by the member asked from what it has applied,
/// without waiting on the leader, which a cluster busy with thousands of nodes' writes may not
/// do in time (BENCHMARKS.md, "The fleet at 5,000: the put after a promote"). A member behind
/// can only make the transaction's comparison fail, never let it write over a newer key; then
/// the prefix is read once more, linearizably, and the transaction made again on that read
/// (docs/decisions.md, "`fleet put` reads from one member first").
pub async fn put(etcd: &Etcd, scope: &Scope, wanted: Vec<(String, Vec<u8>)>) -> anyhow::Result<String> {
    refuse_during_rollout(etcd, Read::Serializable).await?;
    if let Ok(said) = put_once(etcd, scope, &wanted, Read::Serializable).await? {
        return Ok(said);
    }
    refuse_during_rollout(etcd, Read::Linearizable).await?;
    tracing::info!(
        "{} was not as the member read had it: reading it again from the cluster's latest",
        scope.describe()
    );
    match put_once(etcd, scope, &wanted, Read::Linearizable).await? {
        Ok(said) => Ok(said),
        Err(revision) => {
            refuse_during_rollout(etcd, Read::Linearizable).await?;
            anyhow::bail!(
                "{} changed in etcd after revision {revision}, while this put was being prepared; nothing was written. \
                 Look at `mesh-host fleet diff` and put again",
                scope.describe()
            )
        }
    }
}

/// One read of the scope's prefix (as `read` says) and the transaction on it: what to say, or
/// the revision read when the prefix changed since (or a rollout opened) and nothing was written.
/// A serializable read that finds nothing to change still makes the (empty) transaction: only
/// its comparison tells that the member was not behind.
async fn put_once(
    etcd: &Etcd,
    scope: &Scope,
    wanted: &[(String, Vec<u8>)],
    read: Read,
) -> anyhow::Result<Result<String, i64>> {
    let (revision, now) = current(etcd, scope, read).await?;
    let changes = Changes::between(&now, wanted);
    let already = |at: i64| {
        format!(
            "put: {} already holds exactly this ({} keys) at revision {at}; nothing was written\n",
            scope.describe(),
            wanted.len()
        )
    };
    if changes.is_empty() && read == Read::Linearizable {
        return Ok(Ok(already(revision)));
    }
    let mut ops: Vec<Write> = wanted
        .iter()
        .filter(|(k, _)| changes.added.contains(k) || changes.changed.contains(k))
        .map(|(key, value)| Write::Put { key: key.clone(), value: value.clone(), lease: 0 })
        .collect();
    ops.extend(changes.removed.iter().cloned().map(Write::Delete));
    let conds = [
        Cond::UnchangedSince { prefix: scope.prefix(), revision },
        Cond::Absent(super::rollout::state_key()),
    ];
    Ok(match etcd.txn(&conds, &ops).await? {
        Some(written) if changes.is_empty() => Ok(already(written)),
        Some(written) => {
            Ok(format!("put: {} at revision {written}: {}\n", scope.describe(), changes.summary()))
        }
        None => Err(revision),
    })
}

/// Refuses a put while a rollout is open, naming it: the rollout's candidate is to become the
/// declaration through `promote`, or be withdrawn by `abort`, and a put meanwhile would change
/// under the rollout what its nodes go back to (docs/decisions.md, "Rollouts").
async fn refuse_during_rollout(etcd: &Etcd, read: Read) -> anyhow::Result<()> {
    let open = etcd.range_prefix_read(&super::rollout::state_key(), read).await?;
    let key = super::rollout::state_key();
    match open.kvs.iter().find(|kv| kv.key == key) {
        Some(kv) => {
            let said = serde_json::from_slice::<super::rollout::State>(&kv.value)
                .map(|st| super::rollout::open_message(&st))
                .unwrap_or_else(|_| format!("a rollout is open ({key})"));
            Err(super::rollout::Refused(format!("nothing was put: {said}")).into())
        }
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(k: &str, v: &str) -> (String, Vec<u8>) {
        (k.into(), v.as_bytes().to_vec())
    }

    #[test]
    fn changes_tell_added_changed_removed_and_unchanged_apart() {
        let now = [kv("a", "1"), kv("b", "2"), kv("c", "3")];
        let wanted = [kv("a", "1"), kv("b", "two"), kv("d", "4")];
        let c = Changes::between(&now, &wanted);
        assert_eq!(
            c,
            Changes {
                added: vec!["d".into()],
                changed: vec!["b".into()],
                removed: vec!["c".into()],
                unchanged: 1
            }
        );
        assert!(Changes::between(&now, &now).is_empty());
    }
}
