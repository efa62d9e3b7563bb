//! The history of one run, one JSON object a line (JSONL), every entry stamped with the
//! harness's monotonic clock (`t`, milliseconds since the run began). Six kinds:
//!
//! - `etcd`: what the recorder saw (`etcdctl watch --prefix /mesh-host/ --rev=1 -w json
//!   --prev-kv`), one entry per key event, the revision etcd gave it: the ground truth of writes;
//! - `op`: an operator's command, once as `invoke`, then `ok`, `fail` (a refusal: nothing was
//!   written) or `info` (the outcome is unknown), with its exit code and what it said;
//! - `claim`: what an agent says it did (its JSON log, read from its pipe as it is written);
//! - `sample`: what the harness found in an agent's managed file through `/proc/PID/root`,
//!   independently of the agent (only when it differs from the node's sample before);
//! - `cache`: what a node's cache of its declaration held, read by the harness from its state
//!   directory (only when it changed);
//! - `nemesis`: a fault begun or ended, or what the nemesis found while it was on.

use serde::{Deserialize, Serialize};
use sha2::Digest as _;

/// One line of the history.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Entry {
    /// A key event, as etcd's watch gave it.
    Etcd {
        /// Harness time, ms.
        t: u64,
        /// The revision of the write (the key's mod revision).
        rev: i64,
        /// A put or a delete.
        op: KvOp,
        /// The key.
        key: String,
        /// The value written (a put), as UTF-8 (lossy).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        value: Option<String>,
    },
    /// An operation's invocation or completion.
    Op {
        /// Harness time, ms.
        t: u64,
        /// Pairs an invocation with its completion.
        id: u64,
        /// What this entry says of it.
        phase: Phase,
        /// `put`, `start`, `resume`, `pause`, `abort`, `promote`, `status`, `fleet-status`.
        op: String,
        /// The unique content an operation writes (a put's or a candidate's), when it writes one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        token: Option<String>,
        /// The process's id: what the rollout's records name their author by (`(pid N)`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pid: Option<u32>,
        /// The exit code, on completion (none when killed by a signal).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        code: Option<i32>,
        /// What it printed (stdout, then stderr), on completion.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        out: String,
    },
    /// What an agent says it did.
    Claim {
        /// Harness time, ms.
        t: u64,
        /// The node.
        node: String,
        /// What.
        what: ClaimKind,
        /// The generation it names.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        generation: Option<u64>,
        /// The revision it names.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        revision: Option<i64>,
    },
    /// What the node's managed file held, read by the harness.
    Sample {
        /// Harness time, ms.
        t: u64,
        /// The node.
        node: String,
        /// `digest(content)`.
        digest: String,
        /// The content (its first 80 characters), for a person reading the history.
        content: String,
    },
    /// What a node's cache of its declaration (`fleet/declaration.d` in its state directory)
    /// held, read by the harness: the revision its manifest names, and each key with the bytes
    /// cached for it (only when the manifest differs from the node's cache before).
    Cache {
        /// Harness time, ms.
        t: u64,
        /// The node.
        node: String,
        /// The revision the manifest says the cache was read at.
        revision: i64,
        /// Each key the manifest names, with the value its file holds, in the manifest's order.
        kvs: Vec<(String, String)>,
    },
    /// A fault begun (`start`) or ended (`stop`), or a note on one (`note`).
    Nemesis {
        /// Harness time, ms.
        t: u64,
        /// Begun or ended.
        phase: Edge,
        /// Which fault, in words (`kill -9 etcd m1`).
        fault: String,
    },
}

impl Entry {
    /// Its harness time.
    pub fn t(&self) -> u64 {
        match self {
            Entry::Etcd { t, .. }
            | Entry::Op { t, .. }
            | Entry::Claim { t, .. }
            | Entry::Sample { t, .. }
            | Entry::Cache { t, .. }
            | Entry::Nemesis { t, .. } => *t,
        }
    }
}

/// A put or a delete.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KvOp {
    /// A put.
    Put,
    /// A delete.
    Del,
}

/// An operation's invocation, or how it ended (Jepsen's words).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// Sent.
    Invoke,
    /// Done, and what it says it did is done.
    Ok,
    /// Refused: nothing was written.
    Fail,
    /// Unknown: it may have written, or not.
    Info,
}

/// What an agent's log says.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClaimKind {
    /// A declaration read from etcd was accepted (cached) at `revision`.
    Accepted,
    /// A confirmation window opened for `generation`, read at `revision`.
    Armed,
    /// `generation` (read at `revision`) confirmed.
    Confirmed,
    /// The node went back by itself from `generation`, read at `revision`.
    Reverted,
    /// etcd compacted away the revision the node's watch was to go on from (`revision`): the
    /// node reads its whole declaration again (for the figures; no invariant reads it).
    Reread,
}

/// Begun or ended, or what the harness found while a fault was on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Edge {
    /// Begun.
    Start,
    /// Ended.
    Stop,
    /// Neither: what the nemesis did or measured inside a fault begun and not yet ended (the
    /// revision a compaction took, what a probe of a slow link found).
    Note,
}

/// The digest of a managed file's content, as the sampler and the checker both compute it;
/// `None` (the file absent) is `absent`.
pub fn digest(content: Option<&str>) -> String {
    match content {
        None => "absent".into(),
        Some(c) => {
            let h = sha2::Sha256::digest(c.as_bytes());
            h.iter().take(8).map(|b| format!("{b:02x}")).collect()
        }
    }
}

/// Reads a history written as JSONL; a line that does not parse is an error naming it.
pub fn parse(text: &str) -> Result<Vec<Entry>, String> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| serde_json::from_str(l).map_err(|e| format!("history line {}: {e}: {l}", i + 1)))
        .collect()
}
