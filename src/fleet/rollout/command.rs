//! The operator's commands on an open rollout: `pause`, `resume`, `abort` and `promote`, each
//! one transaction conditional on the state as read, read back when etcd's answer was lost.

use std::collections::BTreeMap;

use super::drive::write_state;
use super::*;
use crate::system::etcd::{Cond, Write};

/// Reads the open rollout's state, changes it with `change`, and writes it back in a
/// transaction conditional on it being as read; read again and tried again when someone wrote
/// it meanwhile. `change` refuses with the message to exit 2 with.
async fn change_state(
    etcd: &Etcd,
    change: impl Fn(&mut State) -> Result<(), String>,
) -> anyhow::Result<(State, Snapshot)> {
    // What this command last sent when etcd's answer was lost: found as written, it took.
    let mut sent: Option<(State, crate::system::etcd::Error)> = None;
    for _ in 0..10 {
        let s = snapshot(etcd).await?;
        let Some((mut state, at)) = s.state.clone() else {
            return Err(sent.map_or_else(|| Refused(no_rollout(&s)).into(), |(_, lost)| lost.into()));
        };
        if let Some((mine, _)) = sent.take_if(|(mine, _)| *mine == state) {
            return Ok((mine, s));
        }
        change(&mut state).map_err(Refused)?;
        match write_state(etcd, &state, at, None).await {
            Ok(true) => return Ok((state, s)),
            Ok(false) => {}
            Err(e) => match e.downcast::<crate::system::etcd::Error>() {
                Ok(lost @ crate::system::etcd::Error::Unknown { .. }) => sent = Some((state, lost)),
                Ok(e) => return Err(e.into()),
                Err(e) => return Err(e),
            },
        }
    }
    gave_up(sent.map(|(_, lost)| lost))
}

/// Whether `last` (the closed rollout etcd holds) is rollout `id` closed by this command's
/// lost write: `closed` starts with `how` ("aborted", "promoted").
fn closed_by(last: Option<&State>, id: &str, how: &str) -> bool {
    last.is_some_and(|l| l.id == id && l.closed.as_deref().is_some_and(|c| c.starts_with(how)))
}

/// What `abort` or `promote` says when it finds no rollout open: done, when the rollout it sent
/// a write for (whose answer was lost) is the one closed as `how`; unknown, when another closed
/// it; refused, when it sent nothing.
fn closed_after(
    sent: Option<(String, crate::system::etcd::Error)>,
    s: &Snapshot,
    how: &str,
    then: &str,
) -> anyhow::Result<String> {
    match sent {
        Some((id, _)) if closed_by(s.last.as_ref(), &id, how) => Ok(format!(
            "rollout {id} {how} (etcd's first answer was lost; read back at revision {}): {then}\n",
            s.revision
        )),
        Some((_, lost)) => Err(lost.into()),
        None => refused(no_rollout(s)),
    }
}

/// The end of a command's ten tries: unknown when its last write's answer was lost, else the
/// state kept changing under it.
fn gave_up<T>(lost: Option<crate::system::etcd::Error>) -> anyhow::Result<T> {
    match lost {
        Some(lost) => Err(lost.into()),
        None => anyhow::bail!("the rollout's state kept changing under this command; try again"),
    }
}

/// `fleet rollout pause`: no further wave opens until `resume`.
pub async fn pause_rollout(etcd: &Etcd) -> anyhow::Result<String> {
    let by = format!("by {} at {}", who(), when(crate::system::unix_secs()));
    let (state, _) = change_state(etcd, |st| {
        if st.paused.is_some() {
            return Err(format!(
                "rollout {} is paused already ({})",
                st.id,
                st.paused.as_deref().unwrap_or_default()
            ));
        }
        st.paused = Some(by.clone());
        Ok(())
    })
    .await?;
    Ok(format!(
        "rollout {} paused at wave {} of {}: no further wave opens; the nodes admitted keep the candidate. `mesh-host fleet rollout resume` goes on\n",
        state.id,
        state.opened,
        state.waves.len()
    ))
}

/// `fleet rollout resume`: ends a pause, and drives the rollout unless a driver already does
/// (a driver killed is replaced this way, once its lease has ended).
pub async fn resume(etcd: &Etcd) -> anyhow::Result<bool> {
    let before = snapshot(etcd).await?;
    if let (Some((st, _)), Some(driver)) = (&before.state, &before.driver) {
        if st.paused.is_none() {
            return refused(format!(
                "rollout {} is not paused and is already driven by {driver}; a second driver is refused. If that driver is gone, its lease ends within {DRIVER_TTL} s: run `mesh-host fleet rollout resume` then",
                st.id
            ));
        }
    }
    let (state, s) = change_state(etcd, |st| {
        if st.halted.is_some() {
            return Err(format!(
                "rollout {} is halted ({}); it cannot go on: `mesh-host fleet rollout abort` sends the nodes that took the candidate back",
                st.id,
                st.halted.as_deref().unwrap_or_default()
            ));
        }
        st.paused = None;
        Ok(())
    })
    .await?;
    if let Some(driver) = &s.driver {
        println!("rollout {}: not paused; its driver, {driver}, carries on", state.id);
        return Ok(true);
    }
    println!("rollout {}: {}; driving it from here", state.id, state.phase());
    drive(etcd).await
}

/// `fleet rollout abort`: every admission withdrawn and the rollout closed, in one
/// transaction: each node that took the candidate reads the declaration in force again, which
/// is the generation it had before (docs/decisions.md, "Rollouts").
pub async fn abort(etcd: &Etcd) -> anyhow::Result<String> {
    // The rollout this command sent an abort for, when etcd's answer was lost.
    let mut sent: Option<(String, crate::system::etcd::Error)> = None;
    for _ in 0..10 {
        let s = snapshot(etcd).await?;
        let Some((mut state, at)) = s.state.clone() else {
            return closed_after(
                sent,
                &s,
                "aborted",
                "the nodes that took the candidate go back to the declaration in force",
            );
        };
        state.closed = Some(format!("aborted by {} at {}", who(), when(crate::system::unix_secs())));
        let writes = [
            Write::DeletePrefix(open_prefix()),
            Write::Put { key: last_key(), value: serde_json::to_vec(&state)?, lease: 0 },
        ];
        #[cfg(feature = "robust-mutant")]
        // tests/robust only (`abort`): the state deleted, not the admissions.
        let writes = if crate::fleet::mutant("abort") {
            [Write::Delete(state_key()), writes[1].clone()]
        } else {
            writes
        };
        let answer = match etcd.txn(&[Cond::WrittenAt(state_key(), at)], &writes).await {
            Err(e) if lost(&e) => {
                sent = Some((state.id.clone(), e));
                continue;
            }
            answer => answer?,
        };
        if let Some(revision) = answer {
            let took: Vec<&String> = s.admitted.keys().collect();
            return Ok(format!(
                "rollout {} aborted at revision {revision}: {} node(s) that took the candidate go back to the declaration in force{}{}\n",
                state.id,
                took.len(),
                if took.is_empty() { "" } else { ": " },
                list(&took)
            ));
        }
    }
    gave_up(sent.map(|(_, lost)| lost))
}

/// `fleet rollout promote`: once every wave passed, the candidate becomes the scope's
/// declaration (its keys exactly the candidate's), and the rollout closes, in one transaction.
pub async fn promote(etcd: &Etcd) -> anyhow::Result<String> {
    let mut sent: Option<(String, crate::system::etcd::Error)> = None;
    for _ in 0..10 {
        let s = snapshot(etcd).await?;
        let Some((mut state, at)) = s.state.clone() else {
            return closed_after(sent, &s, "promoted", "the rollout is closed");
        };
        if !state.done {
            return refused(format!(
                "rollout {} is not through its waves ({}); promote makes the candidate every node's declaration, so it waits for the last gate. `fleet rollout status` shows where it stands; `fleet rollout abort` ends it",
                state.id,
                state.phase()
            ));
        }
        let since = regate(&state, &s.verdicts(&state, crate::system::unix_secs())).map_err(Refused)?;
        state.closed = Some(format!("promoted by {} at {}", who(), when(crate::system::unix_secs())));
        let (writes, kept, removed) = promotion(etcd, &s, &state).await?;
        #[cfg(feature = "robust-mutant")]
        // tests/robust only (`promote`): the rollout closed as promoted, the scope left as it was
        // (the candidate not put in it).
        let writes = if crate::fleet::mutant("promote") {
            let scope = |w: &Write| matches!(w, Write::Put { key, .. } | Write::Delete(key) if key.starts_with(&state.replaces));
            writes.into_iter().filter(|w| !scope(w)).collect()
        } else {
            writes
        };
        let conds = [
            Cond::WrittenAt(state_key(), at),
            Cond::UnchangedSince { prefix: state.replaces.clone(), revision: state.base_revision },
        ];
        let answer = match etcd.txn(&conds, &writes).await {
            Err(e) if lost(&e) => {
                sent = Some((state.id.clone(), e));
                continue;
            }
            answer => answer?,
        };
        if let Some(revision) = answer {
            return Ok(format!(
                "rollout {} promoted at revision {revision}: the candidate is the declaration of {} ({kept} key(s), {removed} removed); the rollout is closed{since}{}\n",
                state.id,
                state.scope().describe(),
                held_after(&state, &s)
            ));
        }
        let again = etcd.range_prefix(&state.replaces, None).await?;
        if again.kvs.iter().any(|kv| kv.mod_revision > state.base_revision) {
            return refused(format!(
                "{} was written in etcd after the rollout started (revision {}), around `fleet put`; promote would write over it, so nothing was written. Abort the rollout and start it again on what is there now",
                state.scope().describe(),
                state.base_revision
            ));
        }
    }
    gave_up(sent.map(|(_, lost)| lost))
}

/// What promote says of the nodes a rollback holds (most often their own going back from the
/// candidate, counted against the budget): the promoted declaration is the generation they went
/// back from, which changes nothing under the hold, so they stay where they are, visibly, until
/// a declaration never seen before or `mesh-host rollback --release` on the node
/// (docs/decisions.md, "Rollouts"). Empty when none is held.
fn held_after(state: &State, s: &Snapshot) -> String {
    let held: Vec<&String> = state
        .waves
        .iter()
        .flatten()
        .filter(|n| {
            s.nodes.get(*n).is_some_and(|seen| {
                seen.reverted.is_some() || seen.status.as_ref().is_some_and(|st| st.applied.hold.is_some())
            })
        })
        .collect();
    if held.is_empty() {
        return String::new();
    }
    format!(
        ". {} node(s) held by a rollback (gone back by themselves, or by an operator) stay held where they went back: {}; they take the candidate on `mesh-host rollback --release` on the node, or with the next declaration never seen before, and `fleet status` does not call them current meanwhile",
        held.len(),
        list(&held)
    )
}

/// The gate once more, at promote: every wave passed it when the driver marked the rollout done,
/// but a node may have gone back, died or refused since. Refused (with the nodes and why) when a
/// node not counted before is no longer good and the budget cannot take it; otherwise the words
/// promote adds about the failures it takes on (empty when none).
pub fn regate(state: &State, verdicts: &BTreeMap<String, Verdict>) -> Result<String, String> {
    let counted = |node: &String| state.failures.iter().any(|f| &f.node == node);
    let since: Vec<(&String, &str)> = verdicts
        .iter()
        .filter(|(node, _)| !counted(node))
        .filter_map(|(node, v)| match v {
            Verdict::Good => None,
            Verdict::Pending(why) | Verdict::Failed(why) => Some((node, why.as_str())),
        })
        .collect();
    if since.is_empty() {
        return Ok(String::new());
    }
    let spent = state.failures.len() + since.len();
    let named: Vec<String> = since.iter().take(8).map(|(n, why)| format!("{n}: {why}")).collect();
    if spent > state.max_failures {
        return Err(format!(
            "rollout {}: {} node(s) no longer pass the gate since the last wave passed, {spent} failure(s) in all, more than --max-failures {}; nothing was written. {}. `fleet rollout abort` sends the nodes back",
            state.id,
            since.len(),
            state.max_failures,
            named.join("; ")
        ));
    }
    Ok(format!(
        "; within --max-failures {}, {} node(s) that no longer pass the gate: {}",
        state.max_failures,
        since.len(),
        named.join("; ")
    ))
}

/// The writes of a promotion: the candidate's keys under the scope's prefix, the scope's other
/// keys deleted, the rollout closed into `rollout/last`; and how many were kept and removed.
async fn promotion(etcd: &Etcd, s: &Snapshot, state: &State) -> anyhow::Result<(Vec<Write>, usize, usize)> {
    let cp = candidate_prefix(&state.scope());
    let candidate = etcd.range_prefix(&cp, Some(s.revision)).await?;
    let mut writes = Vec::new();
    let mut kept = Vec::new();
    for kv in candidate.kvs {
        let name = kv.key.strip_prefix(&cp).unwrap_or(&kv.key);
        // A signed candidate's own manifest stays behind; the one signed for the scope goes in.
        let name = match name.strip_prefix(crate::fleet::signed::PROMOTED) {
            Some(promoted) => format!("{}{promoted}", crate::fleet::signed::META),
            None if name.starts_with(crate::fleet::signed::META) => continue,
            None => name.to_owned(),
        };
        let key = format!("{}{name}", state.replaces);
        kept.push(key.clone());
        writes.push(Write::Put { key, value: kv.value, lease: 0 });
    }
    let removed: Vec<String> = s.scope_keys.iter().filter(|k| !kept.contains(k)).cloned().collect();
    let counts = (kept.len(), removed.len());
    writes.extend(removed.into_iter().map(Write::Delete));
    writes.push(Write::DeletePrefix(open_prefix()));
    writes.push(Write::Put { key: last_key(), value: serde_json::to_vec(state)?, lease: 0 });
    Ok((writes, counts.0, counts.1))
}
