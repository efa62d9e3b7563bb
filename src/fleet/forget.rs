//! `mesh-host fleet forget NODE`: a node that is gone for good leaves etcd's view of the fleet.
//!
//! A node's status key is not bound to a lease (it says what the node last applied, and must
//! outlive a restart), so a decommissioned node would otherwise stay in `fleet status` and in
//! etcd for ever. `forget` deletes its status, its presence (already gone: it is refused while
//! the node is alive) and its admission to an open rollout, and takes it out of that rollout's
//! waves, in one transaction conditional on the presence key being absent and on the rollout's
//! state being as read. Its own declaration keys and its etcd user are left: those are the
//! operator's, and a node started again under the name reads them. Why so: docs/decisions.md,
//! "Rollouts" (the plan is made over live nodes only).

use super::rollout::{admission_prefix, state_key, Refused, State};
use super::status::{alive_key, status_key};
use crate::system::etcd::{Cond, Error, Etcd, Write};

/// `fleet forget NODE`: what was deleted, in words; refused (`Refused`) while the node is alive,
/// or when etcd knows nothing of it.
pub async fn forget(etcd: &Etcd, node: &str) -> anyhow::Result<String> {
    // Never `None`: without `revoked`, a node with nothing to forget is refused.
    let mut out = keys(etcd, node, false).await?.unwrap_or_default();
    out.push_str(&format!(
        ". Its own declaration keys ({}node/{node}/declaration/) and its etcd user are left as they are\n",
        super::ROOT
    ));
    Ok(out)
}

/// `forget`'s deletions, said in words without an end of line. With `revoked` (`fleet revoke`,
/// whose node may well be alive, and is already cut off from etcd), the presence key is
/// deleted too rather than refused, and a node with none of these keys left is `None`.
pub(super) async fn keys(etcd: &Etcd, node: &str, revoked: bool) -> anyhow::Result<Option<String>> {
    let (status, alive, admission) = (status_key(node), alive_key(node), admission_prefix(node));
    // What this command sent when etcd's answer was lost: the keys found gone, it took.
    let mut lost: Option<Error> = None;
    for _ in 0..10 {
        let keys = etcd.range_prefix(&format!("{}node/{node}/", super::ROOT), None).await?;
        let revision = keys.revision;
        let has = |key: &str| keys.kvs.iter().any(|kv| kv.key == key);
        if has(&alive) && !revoked {
            return Err(Refused(format!(
                "node {node} is alive: its presence key {alive} is held by its agent's lease. `fleet forget` is for a node that is gone: stop its agent (its presence ends within its --presence-ttl, {} s by default), then forget it",
                super::status::ALIVE_TTL.as_secs()
            ))
            .into());
        }
        let admitted = etcd.range_prefix(&admission, Some(revision)).await?;
        let state = etcd.range_prefix(&state_key(), Some(revision)).await?;
        let open =
            state.kvs.iter().find(|kv| kv.key == state_key()).and_then(|kv| {
                serde_json::from_slice::<State>(&kv.value).ok().map(|st| (st, kv.mod_revision))
            });
        let in_waves = open.as_ref().is_some_and(|(st, _)| st.waves.iter().flatten().any(|n| n == node));
        if !has(&status) && !has(&alive) && admitted.kvs.is_empty() && !in_waves {
            if lost.is_some() {
                return Ok(Some(format!("forgot node {node} (etcd's first answer was lost; read back at revision {revision}: its keys are gone)")));
            }
            if revoked {
                return Ok(None);
            }
            return Err(Refused(format!(
                "etcd knows no node {node} to forget: no status, presence or rollout admission (at revision {revision})"
            ))
            .into());
        }
        let mut writes = vec![Write::Delete(status.clone()), Write::DeletePrefix(admission.clone())];
        let mut conds = Vec::new();
        if revoked {
            writes.push(Write::Delete(alive.clone()));
        } else {
            conds.push(Cond::Absent(alive.clone()));
        }
        let mut out = format!(
            "forgot node {node}: its status{} and any rollout admission deleted",
            if revoked { ", presence" } else { "" }
        );
        if let Some((mut st, at)) = open.filter(|_| in_waves) {
            for wave in &mut st.waves {
                wave.retain(|n| n != node);
            }
            // A wave left empty stays, so that the count of open waves still means the same.
            writes.push(Write::Put { key: state_key(), value: serde_json::to_vec(&st)?, lease: 0 });
            conds.push(Cond::WrittenAt(state_key(), at));
            out.push_str(&format!("; taken out of the waves of rollout {}", st.id));
        }
        match etcd.txn(&conds, &writes).await {
            Ok(Some(at)) => {
                out.push_str(&format!(" (revision {at})"));
                return Ok(Some(out));
            }
            // The node came back, or the rollout's state moved: looked at again.
            Ok(None) => {}
            Err(e @ Error::Unknown { .. }) => lost = Some(e),
            Err(e) => return Err(e.into()),
        }
    }
    match lost {
        Some(lost) => Err(lost.into()),
        None => anyhow::bail!(
            "node {node}'s keys or the rollout's state kept changing under this command; try again"
        ),
    }
}
