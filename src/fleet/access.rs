//! Who may reach what in etcd (issue 44, point 5; security review F2, F4): what `fleet grant`
//! requires of etcd and grants a node, and `mesh-host fleet revoke`, which takes it all back.
//!
//! A node's role, as `fleet grant` leaves it, holds exactly these ranges and no other:
//!
//! ```text
//! READ       /mesh-host/fleet/declaration/                 the fleet's declaration
//! READ       /mesh-host/group/G/declaration/               each of its groups'
//! READ       /mesh-host/node/N/declaration/                its own
//! READ       /mesh-host/rollout/open/candidate/fleet/      a rollout's candidate for the fleet
//! READ       /mesh-host/rollout/open/candidate/group/G/    for each of its groups
//! READ       /mesh-host/rollout/open/node/N/               its admission to a rollout
//! READWRITE  /mesh-host/node/N/status, /mesh-host/node/N/alive
//! ```
//!
//! Architecture Invariant: these ranges are written in one place (`ranges`), and a grant takes
//! from the role whatever range is not among them, so a node moved out of a group, or granted
//! by an older version (which let every node read every candidate), holds no more than this.

use super::rollout::{admission_prefix, candidate_prefix, Refused};
use super::status::{alive_key, status_key};
use super::{prefixes, role_of, Scope};
use crate::system::etcd::{prefix_end, Etcd};

/// One range of a node's role: the permission (`READ`, `READWRITE`), the key, and whether it
/// is every key under it.
pub type Range = (&'static str, String, bool);

/// The ranges of node `node`'s role, in groups `groups` (the module's table).
pub fn ranges(node: &str, groups: &[String]) -> Vec<Range> {
    let mut out: Vec<Range> = prefixes(node, groups).into_iter().map(|p| ("READ", p, true)).collect();
    out.push(("READ", candidate_prefix(&Scope::Fleet), true));
    out.extend(groups.iter().map(|g| ("READ", candidate_prefix(&Scope::Group(g.clone())), true)));
    out.push(("READ", admission_prefix(node), true));
    out.push(("READWRITE", status_key(node), false));
    out.push(("READWRITE", alive_key(node), false));
    out
}

/// Refused (`Refused`, exit 2) while etcd's auth is off, as etcd itself says it: every client
/// can then read and write every key, so a grant would print restrictions that nothing
/// enforces (review F2: etcd takes users and roles while its auth is off).
pub async fn require_auth(etcd: &Etcd, command: &str) -> anyhow::Result<()> {
    if etcd.auth_enabled().await? {
        return Ok(());
    }
    Err(Refused(format!(
        "`{command}`: etcd's auth is off at {}: every client can read and write every node's declaration and status, so a node's role would restrict nothing. Turn it on first: `etcdctl user add root`, then `etcdctl auth enable`, and give this command `--etcd-user root --etcd-password-file FILE` (or a client certificate whose CN is root); README, \"Fleet\"",
        etcd.endpoints()
    ))
    .into())
}

/// Takes from `role` every range not in `wanted`; says how many, in words to follow a
/// sentence (empty when none).
pub async fn narrow(etcd: &Etcd, role: &str, wanted: &[Range]) -> anyhow::Result<String> {
    let keep: Vec<(Vec<u8>, Vec<u8>)> = wanted
        .iter()
        .map(|(_, key, prefix)| (key.as_bytes().to_vec(), if *prefix { prefix_end(key) } else { Vec::new() }))
        .collect();
    let mut taken = Vec::new();
    for (key, end) in etcd.role_ranges(role).await? {
        if !keep.contains(&(key.clone(), end.clone())) {
            etcd.revoke_range(role, &key, &end).await?;
            taken.push(String::from_utf8_lossy(&key).into_owned());
        }
    }
    Ok(if taken.is_empty() {
        String::new()
    } else {
        format!("; taken from it, no longer its: {}", taken.join(", "))
    })
}

/// `fleet revoke --node N`: the node's etcd user and role deleted (its token and certificate
/// stop working at once), then its keys forgotten as `fleet forget` does, presence included,
/// alive or not. Its own declaration keys are left: they are the operator's, signed, and a
/// node installed again under the name reads them (why so, and the rest:
/// docs/decisions.md, "Issue 44, the rest of the fleet's trust"). Refused when etcd knows
/// neither user, role nor keys of the node.
pub async fn revoke(etcd: &Etcd, node: &str) -> anyhow::Result<String> {
    let role = role_of(node);
    // The user first: from here on nothing can log in or be known as the node, whatever fails
    // after.
    let user = etcd.user_delete(node).await?;
    let role_gone = etcd.role_delete(&role).await?;
    let forgot = super::forget::keys(etcd, node, true).await?;
    let said = |done: bool, what: &str| if done { format!("{what} deleted") } else { format!("no {what}") };
    let Some(keys) = forgot.or_else(|| {
        (user || role_gone)
            .then(|| format!("no status, presence or rollout admission of node {node} was left"))
    }) else {
        return Err(Refused(format!(
            "etcd knows no node {node} to revoke: no user {node}, no role {role}, no status, presence or rollout admission"
        ))
        .into());
    };
    Ok(format!(
        "revoked node {node}: {}, {}; {keys}. Its own declaration keys ({}node/{node}/declaration/) are left: delete them with `etcdctl del --prefix {}node/{node}/declaration/` if no node is to read them again\n",
        said(user, &format!("user {node}")),
        said(role_gone, &format!("role {role}")),
        super::ROOT,
        super::ROOT,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nodes_role_reads_its_own_scopes_candidates_and_no_others() {
        let r = ranges("db-1", &["db".into()]);
        let keys: Vec<&str> = r.iter().map(|(_, k, _)| k.as_str()).collect();
        assert!(keys.contains(&"/mesh-host/rollout/open/candidate/fleet/"), "{keys:?}");
        assert!(keys.contains(&"/mesh-host/rollout/open/candidate/group/db/"), "{keys:?}");
        assert!(!keys.iter().any(|k| k.contains("/web/")), "{keys:?}");
        assert!(!keys.contains(&"/mesh-host/rollout/open/candidate/"), "not every candidate: {keys:?}");
        let writes: Vec<&str> =
            r.iter().filter(|(p, _, _)| *p != "READ").map(|(_, k, _)| k.as_str()).collect();
        assert_eq!(writes, ["/mesh-host/node/db-1/status", "/mesh-host/node/db-1/alive"]);
    }
}
