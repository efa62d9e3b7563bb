//! The checker's own model of what etcd holds and what each node should run: a few dozen lines
//! written from docs/decisions.md ("Fleet", "Rollouts"), not from the agent's code, so that a
//! bug in the agent cannot hide itself in the checker.
//!
//! The harness's nodes have no groups: a node reads the fleet's prefix, then its own; admitted
//! to a rollout, the candidate's prefix in place of the prefix its admission `replaces`. No key
//! at all is a refusal (the node keeps what it runs). The managed file is `app.conf`.

use std::collections::BTreeMap;
use std::rc::Rc;

use serde_json::Value;

use crate::history::digest;

pub const FLEET: &str = "/mesh-host/fleet/declaration/";
/// The candidate of a rollout for the fleet (the harness's only kind).
pub const CANDIDATE: &str = "/mesh-host/rollout/open/candidate/fleet/";
pub const STATE: &str = "/mesh-host/rollout/open/state";
pub const LAST: &str = "/mesh-host/rollout/last";
/// The driver's key, bound to its lease; its value names the driver (`(pid N)`).
pub const DRIVER: &str = "/mesh-host/rollout/driver";
/// The one file each declaration of the harness manages.
pub const MANAGED: &str = "app.conf";

pub fn admission_key(node: &str) -> String {
    format!("/mesh-host/rollout/open/node/{node}/admitted")
}

pub fn status_key(node: &str) -> String {
    format!("/mesh-host/node/{node}/status")
}

pub fn alive_key(node: &str) -> String {
    format!("/mesh-host/node/{node}/alive")
}

pub fn own_prefix(node: &str) -> String {
    format!("/mesh-host/node/{node}/declaration/")
}

/// etcd's keys at one revision: each value and the revision it was written at.
pub type Kv = BTreeMap<String, (Rc<str>, i64)>;

/// A value as JSON, `Null` when it is not JSON (or the key is absent).
pub fn json(kv: &Kv, key: &str) -> Value {
    kv.get(key).and_then(|(v, _)| serde_json::from_str(v).ok()).unwrap_or(Value::Null)
}

/// The content of the managed file in one declaration's value: `Ok(None)` when the declaration
/// does not manage it, `Err` when the value is no declaration (the node refuses it).
pub fn managed_content(value: &str) -> Result<Option<String>, ()> {
    let decl: Value = serde_json::from_str(value).map_err(|_| ())?;
    let resources = decl["resources"].as_array().ok_or(())?;
    let file = resources.iter().find(|r| {
        r["type"] == "file" && r["path"].as_str().is_some_and(|p| p.rsplit('/').next() == Some(MANAGED))
    });
    Ok(file.and_then(|f| f["content"].as_str()).map(str::to_owned))
}

/// What node `node` should run at this revision: the managed file's content (`None`: the
/// declaration does not manage it), or `Err` when the node refuses what it reads (no key at
/// all, a value that is no declaration) and keeps what it had.
pub fn composed(kv: &Kv, node: &str) -> Result<Option<String>, ()> {
    let admission = json(kv, &admission_key(node));
    let replaces = admission["replaces"].as_str();
    let mut content = None;
    let mut keys = 0;
    for prefix in [FLEET.to_owned(), own_prefix(node)] {
        let read = if replaces == Some(prefix.as_str()) { CANDIDATE.to_owned() } else { prefix };
        for (_, (value, _)) in kv.range(read.clone()..).take_while(|(k, _)| k.starts_with(&read)) {
            keys += 1;
            if let Some(c) = managed_content(value)? {
                content = Some(c);
            }
        }
    }
    if keys == 0 {
        return Err(());
    }
    Ok(content)
}

/// `composed`, as the sampler's digest.
pub fn expected_digest(kv: &Kv, node: &str) -> Option<String> {
    composed(kv, node).ok().map(|c| digest(c.as_deref()))
}

/// Whether node `node` passes the rollout's gate at this revision, admitted at `admitted`
/// (docs/decisions.md, "Rollouts", the gate): alive; its status at `admitted` or later,
/// converged, no error, nothing refused, no hold, not reverted, its generation confirmed.
/// `Err` says why not.
pub fn good(kv: &Kv, node: &str, admitted: i64) -> Result<(), String> {
    if !kv.contains_key(&alive_key(node)) {
        return Err("its presence key is gone".into());
    }
    let s = json(kv, &status_key(node));
    if s.is_null() {
        return Err("no status".into());
    }
    let revision = s["revision"].as_i64().unwrap_or(0);
    if revision < admitted {
        return Err(format!("its status says revision {revision}, before its admission at {admitted}"));
    }
    if s["converged"] != true || !s["last_error"].is_null() || !s["refused"].is_null() {
        return Err(format!("its status at revision {revision} is not converged"));
    }
    if !s["hold"].is_null() || !s["reverted"].is_null() {
        return Err("a hold or a revert stands on it".into());
    }
    match (s["generation"].as_u64(), s["confirmed"].as_u64()) {
        (Some(g), Some(c)) if c >= g => Ok(()),
        (g, c) => Err(format!("generation {g:?} not confirmed (confirmed: {c:?})")),
    }
}

/// The nodes the open waves hold to the gate: those of the waves open, not counted as failed.
pub fn required(state: &Value) -> Vec<String> {
    let opened = state["opened"].as_u64().unwrap_or(0) as usize;
    let failed: Vec<&str> =
        state["failures"].as_array().into_iter().flatten().filter_map(|f| f["node"].as_str()).collect();
    state["waves"]
        .as_array()
        .into_iter()
        .flatten()
        .take(opened)
        .flat_map(|w| w.as_array().into_iter().flatten())
        .filter_map(Value::as_str)
        .filter(|n| !failed.contains(n))
        .map(str::to_owned)
        .collect()
}

/// Whether `node` is in one of the waves `state` has open.
pub fn in_open_wave(state: &Value, node: &str) -> bool {
    let opened = state["opened"].as_u64().unwrap_or(0) as usize;
    state["waves"]
        .as_array()
        .into_iter()
        .flatten()
        .take(opened)
        .any(|w| w.as_array().into_iter().flatten().any(|n| n == node))
}
