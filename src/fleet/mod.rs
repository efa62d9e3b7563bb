//! Past one machine: declarations kept in etcd (issue 14).
//!
//! The key layout, under one root (`/mesh-host/`):
//!
//! ```text
//! /mesh-host/fleet/declaration/NAME          every node's
//! /mesh-host/group/G/declaration/NAME        each node in group G
//! /mesh-host/node/N/declaration/NAME         node N's own
//! ```
//!
//! A node's declaration is its prefixes read like a directory: the fleet's keys in name order,
//! then each group's in the order the node names its groups, then its own, all read at one
//! revision. A change for every node is one write under the fleet's prefix.
//!
//! - `source`: the daemon's side. It mirrors what etcd holds for this node into a directory
//!   under the state directory (the cache), only when it is a declaration mesh-host accepts;
//!   the controller reads that directory as it reads a local `declaration.d`.
//! - `status`: the node's status and presence, written back to etcd.
//! - `confirm`: the confirmation window: a new generation from etcd confirmed by a round trip
//!   to etcd on a new connection, or the node goes back to the one before by itself.
//! - `daemon`: the source, the status writer, the refusals' reporter and the confirmation
//!   window started together, by the face, beside the controller.
//! - `put`: `mesh-host fleet put` and `fleet diff`, the operator's side.
//! - `forget`: `mesh-host fleet forget`, a dead node's keys deleted so it leaves every plan.
//! - `access`: what `fleet grant` requires of etcd and grants, and `mesh-host fleet revoke`.
//! - `rollout`: `mesh-host fleet rollout`, a candidate given to the nodes wave by wave, and the
//!   keys a node reads to know whether it is admitted to it (the source reads them).
//! - `signed`: signed declarations (issue 44): each scope's manifest and signatures beside its
//!   keys, written by `fleet put --sign` and `fleet sign`, verified by the source before it
//!   parses anything when the node runs with `--allowed-signers`.
//!
//! Architecture Invariant: the controller knows nothing of etcd. Its declaration source is a
//! directory either way; etcd is one way of writing that directory. The fleet follows the
//! controller (what it applied, its token), never the other way (`tests/tidy.rs`).

pub mod access;
pub mod confirm;
pub mod daemon;
pub mod forget;
pub mod pending;
pub mod put;
pub mod rollout;
pub mod signed;
pub mod source;
pub mod status;

/// The fleet harness's deliberately broken builds (tests/robust/; feature `robust-mutant`, never
/// in a release): whether `MESH_HOST_MUTANT` names mutant `name` (`gate`, `abort`, `fence`,
/// `window`, `cache`, `promote`; a comma-separated list), so that one build holds them all and each run of the
/// harness breaks one thing. The agent's own, `status` and `flap`, read the same variable in
/// `src/controller/worker.rs` (the controller does not reach into the fleet). Unset, the build behaves as the real one.
#[cfg(feature = "robust-mutant")]
pub fn mutant(name: &str) -> bool {
    std::env::var("MESH_HOST_MUTANT").is_ok_and(|m| m.split(',').any(|m| m == name))
}

/// The root every key of mesh-host's lives under.
pub const ROOT: &str = "/mesh-host/";

/// Where in the fleet a declaration is put: the whole fleet, a group, or one node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Every node of the fleet.
    Fleet,
    /// Every node of one group, by the group's name.
    Group(String),
    /// One node, by its name.
    Node(String),
}

impl Scope {
    /// The prefix of this scope's declaration keys.
    pub fn prefix(&self) -> String {
        match self {
            Scope::Fleet => format!("{ROOT}fleet/declaration/"),
            Scope::Group(g) => format!("{ROOT}group/{g}/declaration/"),
            Scope::Node(n) => format!("{ROOT}node/{n}/declaration/"),
        }
    }

    /// How the scope is named in a message.
    pub fn describe(&self) -> String {
        match self {
            Scope::Fleet => "the fleet".into(),
            Scope::Group(g) => format!("group {g}"),
            Scope::Node(n) => format!("node {n}"),
        }
    }
}

/// A node or group name: what goes between slashes in a key. Checked so that a name cannot
/// reach another node's keys (`a/../b`, `a/`) or make a prefix of another's (`web` and `web/x`)
/// (docs/decisions.md, "Keys").
pub fn check_name(what: &str, name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 253
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        && name != "."
        && name != "..";
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{what} {name:?}: a name is 1 to 253 of the letters, digits, '-', '_' and '.', and not '.' or '..'"
        ))
    }
}

/// The name of a node's role in etcd's auth.
pub fn role_of(node: &str) -> String {
    format!("mesh-host-node-{node}")
}

/// Gives node `node` (in `groups`) a user of its own in etcd's auth, with a role that reads
/// only its own, its groups' and the fleet's declaration (and the rollout candidates of those
/// scopes) and writes only its own status and presence. Refused while etcd's auth is off
/// (`access::require_auth`). Idempotent: grants are added again harmlessly, and any other
/// range the role held (a group the node left, the one candidate prefix of older versions) is
/// taken from it; an existing user keeps its password.
/// Without `password` the user has none: the node is known by the CN of its client certificate,
/// which must be its name (etcd's `--client-cert-auth`). The groups are decided here, when the node is granted, not by the node (docs/decisions.md,
/// "Auth: one etcd user per node, named as the node").
pub async fn grant(
    etcd: &crate::system::etcd::Etcd,
    node: &str,
    groups: &[String],
    password: Option<&secrecy::SecretString>,
) -> anyhow::Result<String> {
    access::require_auth(etcd, "fleet grant").await?;
    let role = role_of(node);
    let ranges = access::ranges(node, groups);
    for (permission, key, prefix) in &ranges {
        etcd.grant(&role, permission, key, *prefix).await?;
    }
    let taken = access::narrow(etcd, &role, &ranges).await?;
    let made = etcd.user_with_role(node, password, &role).await?;
    Ok(format!(
        "grant: user {node} ({}) has role {role}: reads the fleet's{}, and its own declaration, the candidates of rollouts for those scopes and its admission to them; writes its status and presence{taken}\n",
        match (made, password) {
            (true, Some(_)) => "made, with a password",
            (true, None) => "made, without a password: known by its certificate's CN",
            (false, _) => "already there, its password unchanged",
        },
        groups.iter().map(|g| format!(", group {g}'s")).collect::<String>()
    ))
}

/// The prefixes a node reads, in the order their keys make its declaration: the fleet's, each
/// group's in the order the node is given them, then its own (docs/decisions.md, "Keys").
pub fn prefixes(node: &str, groups: &[String]) -> Vec<String> {
    let mut out = vec![Scope::Fleet.prefix()];
    out.extend(groups.iter().map(|g| Scope::Group(g.clone()).prefix()));
    out.push(Scope::Node(node.to_owned()).prefix());
    out
}

/// The file name a key is cached under: the revision it was read at, its place in the
/// declaration (so the directory's name order is the declaration's order), then the key made
/// safe for a file name, so a person looking at the cache sees where each part came from.
///
/// The revision is in the name so that no name is ever in two successive caches: a reader that
/// listed the old directory and opens a name after the new one was swapped in finds nothing
/// (and reads again once the source settles), never a mix of old and new files that could parse
/// (docs/sources.md, "Sources: a directory, or etcd through a directory").
pub fn cache_name(revision: i64, index: usize, key: &str) -> String {
    let tail = key.strip_prefix(ROOT).unwrap_or(key);
    let mut safe: String = tail
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '.' { c } else { '_' })
        .take(120)
        .collect();
    if let Some(stem) = safe.strip_suffix(".json") {
        safe = stem.to_owned();
    }
    format!("r{revision:012}-{index:05}-{safe}.json")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_reads_the_fleet_then_its_groups_in_order_then_its_own() {
        assert_eq!(
            prefixes("web-1", &["eu".into(), "web".into()]),
            [
                "/mesh-host/fleet/declaration/",
                "/mesh-host/group/eu/declaration/",
                "/mesh-host/group/web/declaration/",
                "/mesh-host/node/web-1/declaration/",
            ]
        );
    }

    #[test]
    fn names_that_could_reach_another_nodes_keys_are_refused() {
        for bad in ["", ".", "..", "a/b", "a/../b", "web/", "sp ace", "é"] {
            assert!(check_name("--node", bad).is_err(), "{bad:?} was taken");
        }
        for good in ["web-1", "db_2", "eu.west"] {
            check_name("--node", good).unwrap();
        }
    }

    #[test]
    fn cache_files_sort_in_declaration_order_and_name_their_key() {
        assert_eq!(
            cache_name(7, 0, "/mesh-host/fleet/declaration/base.json"),
            "r000000000007-00000-fleet_declaration_base.json"
        );
        assert_eq!(
            cache_name(7, 12, "/mesh-host/node/a/declaration/x y"),
            "r000000000007-00012-node_a_declaration_x_y.json"
        );
        assert!(cache_name(7, 2, "/z") < cache_name(7, 10, "/a"));
    }
}
