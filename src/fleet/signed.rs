//! Signed declarations in etcd (issue 44, the fleet's part): where a scope's manifest and
//! signatures are kept, how the operator's commands write them, and how a node verifies every
//! scope it read before anything of it is parsed.
//!
//! A scope's manifest and signatures are keys under its own declaration prefix, in a hidden
//! directory as in a signed local directory:
//!
//! ```text
//! /mesh-host/group/web/declaration/10-base.json
//! /mesh-host/group/web/declaration/.mesh-host/manifest          scope group web, version 7
//! /mesh-host/group/web/declaration/.mesh-host/manifest.1.sig    one signature per key
//! /mesh-host/rollout/open/candidate/group/web/.mesh-host/manifest      scope candidate ID group web
//! /mesh-host/rollout/open/candidate/group/web/.mesh-host/promoted/...  scope group web, for promote
//! ```
//!
//! So they are written in the transaction that writes the files, read at the revision the
//! files are read at, watched with them, and readable by exactly the nodes that may read the
//! files (no grant changes). The decision is `trust::verify`'s; the marks are the local
//! directory's (`controller::signed`), one per scope (docs/decisions.md, "Issue 44, the
//! fleet").

use std::path::Path;

use crate::controller::signed::{self as marks, Trust};
use crate::system::etcd::{Etcd, Kv, Read};
use crate::trust::{self, Reason, Refusal};

/// The hidden directory under a scope's prefix that holds its manifest and signatures.
pub const META: &str = ".mesh-host/";

/// Under the candidate's prefix: the manifest (and signatures) `promote` writes into the scope.
pub const PROMOTED: &str = ".mesh-host/promoted/";

/// Keys and values to write.
pub type Keys = Vec<(String, Vec<u8>)>;

/// The key of the manifest of the scope whose prefix this is.
pub fn manifest_key(prefix: &str) -> String {
    format!("{prefix}{META}manifest")
}

/// Whether a key is a manifest's or a signature's (anywhere under a `.mesh-host/`), never a
/// declaration's: a node never parses it, and `fleet put` never takes it for a file.
pub fn is_meta(key: &str) -> bool {
    key.contains(&format!("/{META}"))
}

/// The manifest's scope of a fleet scope.
pub fn scope_of(scope: &super::Scope) -> trust::Scope {
    match scope {
        super::Scope::Fleet => trust::Scope::Fleet,
        super::Scope::Group(g) => trust::Scope::Group(g.clone()),
        super::Scope::Node(n) => trust::Scope::Node(n.clone()),
    }
}

/// The fleet scope whose declaration prefix this is.
pub fn from_prefix(prefix: &str) -> Option<super::Scope> {
    let rest = prefix.strip_prefix(super::ROOT)?;
    if rest == "fleet/declaration/" {
        return Some(super::Scope::Fleet);
    }
    let (kind, rest) = rest.split_once('/')?;
    let name = rest.strip_suffix("/declaration/").filter(|n| !n.contains('/'))?;
    match kind {
        "group" => Some(super::Scope::Group(name.to_owned())),
        "node" => Some(super::Scope::Node(name.to_owned())),
        _ => None,
    }
}

/// The name of a scope's high-water mark (`controller::signed::mark_path`).
pub fn mark_name(scope: &trust::Scope) -> String {
    match scope {
        trust::Scope::Fleet => "fleet".into(),
        trust::Scope::Group(g) => format!("group.{g}"),
        trust::Scope::Node(n) => format!("node.{n}"),
        trust::Scope::Local => "local".into(),
        trust::Scope::Candidate { replaces, .. } => format!("candidate.{}", mark_name(replaces)),
    }
}

/// A scope's keys, told apart: its manifest, its signatures (by their names under `META`),
/// and its files (by their names under the prefix). What is under `PROMOTED` is neither.
#[derive(Default)]
pub struct Parts<'a> {
    /// The manifest's bytes, if there is one.
    pub manifest: Option<&'a [u8]>,
    /// Each signature's name and armored bytes.
    pub signatures: Vec<(String, Vec<u8>)>,
    /// Each file's name and bytes.
    pub files: Vec<(&'a str, &'a [u8])>,
}

/// Tells apart the keys under `prefix` among `kvs`.
pub fn split<'a>(prefix: &str, kvs: &'a [Kv]) -> Parts<'a> {
    let mut parts = Parts::default();
    for kv in kvs {
        let Some(name) = kv.key.strip_prefix(prefix) else { continue };
        match name.strip_prefix(META) {
            Some("manifest") => parts.manifest = Some(&kv.value),
            Some(sig) if sig.ends_with(".sig") && !sig.contains('/') => {
                parts.signatures.push((sig.to_owned(), kv.value.clone()))
            }
            Some(_) => {}
            None => parts.files.push((name, &kv.value)),
        }
    }
    parts
}

/// Verifies every scope of one read (`prefixes`, in the order read; the candidate's in place of
/// the scope it replaces while `rollout` says the node is admitted), against the marks
/// persisted under `state`. `Ok`: the marks to persist, by name, before the declaration is put
/// in force. A scope that holds nothing and was never accepted here is not a scope of this
/// node's declaration; every other one must be signed.
pub fn verify_read(
    trust: &Trust,
    state: &Path,
    kvs: &[Kv],
    prefixes: &[String],
    rollout: Option<&(String, String)>,
) -> Result<Vec<(String, trust::Accepted)>, Refusal> {
    let mut out = Vec::new();
    for prefix in prefixes {
        let candidate = prefix.starts_with(&super::rollout::candidate_root());
        let scope = if candidate {
            let (id, replaces) =
                rollout.ok_or_else(|| refusal(Reason::Scope, prefix, "no admission names it"))?;
            if super::rollout::candidate_for(replaces).as_deref() != Some(prefix.as_str()) {
                return Err(refusal(Reason::Scope, prefix, &format!("the admission is for {replaces}")));
            }
            let replaced = from_prefix(replaces).ok_or_else(|| {
                refusal(Reason::Scope, prefix, &format!("it stands in for {replaces}, no scope"))
            })?;
            trust::Scope::Candidate { rollout: id.clone(), replaces: Box::new(scope_of(&replaced)) }
        } else {
            let scope =
                from_prefix(prefix).ok_or_else(|| refusal(Reason::Scope, prefix, "no scope's prefix"))?;
            scope_of(&scope)
        };
        let name = mark_name(&scope);
        let what = format!("the {scope} declaration of fleet {}", trust.fleet);
        let floor = marks::read_mark(state, &name)
            .map_err(|m| Refusal { reason: Reason::Rollback, message: format!("{what}: {m}") })?;
        let parts = split(prefix, kvs);
        let Some(manifest) = parts.manifest else {
            if !candidate && floor.is_none() && parts.files.is_empty() && parts.signatures.is_empty() {
                continue;
            }
            return Err(Refusal {
                reason: Reason::Signature,
                message: format!(
                    "{what}: {} holds no signed manifest ({}): an unsigned declaration is refused; put it with `mesh-host fleet put --sign KEY`",
                    prefix,
                    manifest_key(prefix)
                ),
            });
        };
        let signed = trust::Signed { manifest, signatures: &parts.signatures };
        let accepted = trust::verify(&signed, &parts.files, &trust.expect(&scope, floor.as_ref()))?;
        if let trust::Scope::Candidate { replaces, .. } = &scope {
            in_force_below(state, replaces, &accepted, &what)?;
        }
        out.push((name, accepted));
    }
    Ok(out)
}

/// A candidate is taken only above the version in force for the scope it replaces: once
/// promoted (or passed by a later put), it is a rollback.
fn in_force_below(
    state: &Path,
    replaces: &trust::Scope,
    accepted: &trust::Accepted,
    what: &str,
) -> Result<(), Refusal> {
    let refuse =
        |message: String| Refusal { reason: Reason::Rollback, message: format!("{what}: {message}") };
    let in_force = marks::read_mark(state, &mark_name(replaces)).map_err(refuse)?;
    match in_force {
        Some(f) if accepted.manifest.version <= f.version => Err(refuse(format!(
            "version {} is not above version {}, accepted here for the {replaces} declaration: a candidate older than what it replaces is refused",
            accepted.manifest.version, f.version
        ))),
        _ => Ok(()),
    }
}

fn refusal(reason: Reason, prefix: &str, why: &str) -> Refusal {
    Refusal { reason, message: format!("the keys under {prefix}: {why}") }
}

/// Persists the marks of a read verified (`verify_read`), each durably, before the declaration
/// is put in force.
pub fn persist(state: &Path, accepted: &[(String, trust::Accepted)]) -> std::io::Result<()> {
    for (name, a) in accepted {
        marks::persist_mark(state, name, a)?;
    }
    Ok(())
}

/// The manifest under `prefix` in etcd now (read as `read` says), and the revision it was
/// written at; `None`: none.
pub async fn current(etcd: &Etcd, prefix: &str, read: Read) -> anyhow::Result<Option<(Vec<u8>, i64)>> {
    let key = manifest_key(prefix);
    let range = etcd.range_prefix_read(&key, read).await?;
    Ok(range.kvs.into_iter().find(|kv| kv.key == key).map(|kv| (kv.value, kv.mod_revision)))
}

/// The version a new manifest for a scope takes: `asked` (refused unless above `above`), or
/// one above `above`.
pub fn next_version(asked: Option<u64>, above: Option<u64>) -> Result<u64, String> {
    match (asked, above) {
        (Some(v), Some(b)) if v <= b => Err(format!(
            "--version {v} is not above version {b}, already signed for this scope: a node that saw {b} refuses it as a rollback"
        )),
        (Some(v), _) => Ok(v),
        (None, b) => b.map_or(Some(1), |b| b.checked_add(1)).ok_or_else(|| "no version is above it".to_owned()),
    }
}

/// A manifest of `files` (keys under `prefix`, in key order) for `scope`, as bytes.
pub fn manifest(
    fleet: &str,
    scope: trust::Scope,
    version: u64,
    valid: std::time::Duration,
    prefix: &str,
    files: &[(String, Vec<u8>)],
) -> Result<Vec<u8>, String> {
    use sha2::Digest as _;
    let mut listed = Vec::new();
    for (key, bytes) in files {
        let name = key.strip_prefix(prefix).unwrap_or(key);
        trust::manifest::file_name(name)?;
        listed.push(trust::Listed {
            name: name.to_owned(),
            length: bytes.len() as u64,
            sha256: sha2::Sha256::digest(bytes).into(),
        });
    }
    listed.sort_by(|a, b| a.name.as_bytes().cmp(b.name.as_bytes()));
    let issued = crate::system::unix_secs();
    let m = trust::Manifest {
        fleet: fleet.to_owned(),
        scope,
        version,
        issued,
        expires: issued.saturating_add(valid.as_secs().max(1)),
        files: listed,
    };
    let bytes = m.render().into_bytes();
    trust::Manifest::parse(&bytes).map_err(|e| format!("the manifest would not read back: {e}"))?;
    Ok(bytes)
}

/// The keys a signed scope's manifest and signatures are written to, in `dir`: a scope's
/// prefix and `META`, or the candidate's prefix and `PROMOTED`.
pub fn keys(dir: &str, manifest: &[u8], signatures: &[(String, Vec<u8>)]) -> Vec<(String, Vec<u8>)> {
    let mut out = vec![(format!("{dir}manifest"), manifest.to_vec())];
    out.extend(signatures.iter().map(|(name, bytes)| (format!("{dir}{name}"), bytes.clone())));
    out
}

/// What `fleet put --sign` would find already there: the scope holds exactly `wanted` and a
/// manifest of this fleet and scope that lists exactly them. `Some(version)` then.
pub async fn already(
    etcd: &Etcd,
    scope: &super::Scope,
    fleet: &str,
    wanted: &[(String, Vec<u8>)],
) -> anyhow::Result<Option<u64>> {
    let prefix = scope.prefix();
    let range = etcd.range_prefix(&prefix, None).await?;
    let files: Vec<(&String, &Vec<u8>)> =
        range.kvs.iter().filter(|kv| !is_meta(&kv.key)).map(|kv| (&kv.key, &kv.value)).collect();
    let same = files.len() == wanted.len() && wanted.iter().all(|(k, v)| files.contains(&(k, v)));
    let parts = split(&prefix, &range.kvs);
    let manifest = parts.manifest.and_then(|m| trust::Manifest::parse(m).ok());
    Ok(manifest
        .filter(|m| same && m.fleet == fleet && m.scope == scope_of(scope))
        .filter(|m| trust::contents(m, &parts.files).is_ok())
        .map(|m| m.version))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::Scope;

    #[test]
    fn a_prefix_names_its_scope_and_its_mark() {
        for scope in [Scope::Fleet, Scope::Group("web".into()), Scope::Node("a.b".into())] {
            assert_eq!(from_prefix(&scope.prefix()), Some(scope.clone()));
        }
        assert_eq!(from_prefix("/mesh-host/group/a/b/declaration/"), None);
        assert_eq!(from_prefix("/mesh-host/rollout/open/candidate/"), None);
        let candidate = trust::Scope::Candidate {
            rollout: "r".into(),
            replaces: Box::new(trust::Scope::Group("web".into())),
        };
        assert_eq!(mark_name(&candidate), "candidate.group.web");
        assert_eq!(mark_name(&trust::Scope::Node("n".into())), "node.n");
    }

    #[test]
    fn a_scopes_keys_are_told_apart() {
        let kv = |k: &str| Kv { key: k.into(), value: k.as_bytes().to_vec(), mod_revision: 1 };
        let p = "/mesh-host/fleet/declaration/";
        let kvs = [
            kv("/mesh-host/fleet/declaration/.mesh-host/manifest"),
            kv("/mesh-host/fleet/declaration/.mesh-host/manifest.1.sig"),
            kv("/mesh-host/fleet/declaration/.mesh-host/promoted/manifest"),
            kv("/mesh-host/fleet/declaration/a.json"),
            kv("/mesh-host/node/x/declaration/b.json"),
        ];
        let parts = split(p, &kvs);
        assert!(parts.manifest.is_some());
        assert_eq!(parts.signatures.len(), 1);
        assert_eq!(parts.files.iter().map(|(n, _)| *n).collect::<Vec<_>>(), ["a.json"]);
        assert!(is_meta(&kvs[0].key) && is_meta(&kvs[2].key) && !is_meta(&kvs[3].key));
    }

    /// A node's read, decided: alice (seed 1) trusted, in fleet `prod`, marks under a scratch
    /// state directory.
    struct Node {
        _dir: tempfile::TempDir,
        state: std::path::PathBuf,
        trust: Trust,
    }

    fn node() -> Node {
        use ring::signature::KeyPair as _;
        let dir = tempfile::tempdir().unwrap();
        let signers = dir.path().join("allowed_signers");
        let key = ring::signature::Ed25519KeyPair::from_seed_unchecked(&[1; 32]).unwrap();
        let line = trust::sshsig::make::signer_line("alice", key.public_key().as_ref(), None);
        crate::system::fs::write_own(&signers, line.as_bytes()).unwrap();
        let trust = Trust::load(&signers, 1, "prod".into(), None).unwrap();
        Node { state: dir.path().join("state.json"), _dir: dir, trust }
    }

    /// The keys of `scope` signed by alice at `version` under `prefix`, with one file.
    fn signed(prefix: &str, scope: trust::Scope, version: u64, content: &str) -> Vec<Kv> {
        let key = ring::signature::Ed25519KeyPair::from_seed_unchecked(&[1; 32]).unwrap();
        let files = vec![(format!("{prefix}a.json"), content.as_bytes().to_vec())];
        let m =
            manifest("prod", scope, version, std::time::Duration::from_secs(600), prefix, &files).unwrap();
        let sig = trust::sshsig::make::signature(&key, None, trust::NAMESPACE, &m).into_bytes();
        let mut kvs = files;
        kvs.extend(keys(&format!("{prefix}{META}"), &m, &[("manifest.1.sig".into(), sig)]));
        kvs.into_iter().map(|(key, value)| Kv { key, value, mod_revision: 1 }).collect()
    }

    #[test]
    fn a_read_is_taken_scope_by_scope_against_each_mark() {
        let n = node();
        let (fleet, group) = (Scope::Fleet.prefix(), Scope::Group("web".into()).prefix());
        let prefixes = [fleet.clone(), group.clone()];
        let v1 = signed(&fleet, trust::Scope::Fleet, 1, "{}");
        // A group with no keys and no mark is no part of the declaration.
        let taken = verify_read(&n.trust, &n.state, &v1, &prefixes, None).unwrap();
        assert_eq!(
            taken.iter().map(|(m, a)| (m.as_str(), a.first_seen)).collect::<Vec<_>>(),
            [("fleet", true)]
        );
        persist(&n.state, &taken).unwrap();
        let again = verify_read(&n.trust, &n.state, &v1, &prefixes, None).unwrap();
        assert!(!again[0].1.first_seen, "read again: no new mark");

        // The fleet's keys deleted, once it was accepted: refused, not taken for no scope.
        let e = verify_read(&n.trust, &n.state, &[], &prefixes, None).unwrap_err();
        assert_eq!(e.reason, Reason::Signature, "{e}");
        assert!(e.message.contains("holds no signed manifest"), "{e}");
        // A group written unsigned.
        let mut unsigned = v1.clone();
        unsigned.push(Kv { key: format!("{group}x.json"), value: b"{}".to_vec(), mod_revision: 2 });
        let e = verify_read(&n.trust, &n.state, &unsigned, &prefixes, None).unwrap_err();
        assert_eq!((e.reason, e.message.contains("group web")), (Reason::Signature, true), "{e}");
    }

    #[test]
    fn a_candidate_must_name_its_rollout_and_stand_above_the_declaration_in_force() {
        let n = node();
        let (fleet, cp) = (Scope::Fleet.prefix(), crate::fleet::rollout::candidate_prefix(&Scope::Fleet));
        let v3 = signed(&fleet, trust::Scope::Fleet, 3, "{}");
        persist(&n.state, &verify_read(&n.trust, &n.state, &v3, std::slice::from_ref(&fleet), None).unwrap())
            .unwrap();
        let candidate = |id: &str, version| {
            let scope =
                trust::Scope::Candidate { rollout: id.into(), replaces: Box::new(trust::Scope::Fleet) };
            signed(&cp, scope, version, "{\"c\":1}")
        };
        let admitted = Some(("rollout-1".to_owned(), fleet.clone()));
        let read = |kvs: &[Kv], admission: Option<&(String, String)>| {
            verify_read(&n.trust, &n.state, kvs, std::slice::from_ref(&cp), admission)
        };
        let e = read(&candidate("rollout-1", 4), None).unwrap_err();
        assert_eq!(e.reason, Reason::Scope, "no admission names it: {e}");
        let e = read(&candidate("rollout-0", 4), admitted.as_ref()).unwrap_err();
        assert_eq!(e.reason, Reason::Scope, "another rollout's: {e}");
        let e = read(&candidate("rollout-1", 3), admitted.as_ref()).unwrap_err();
        assert_eq!(e.reason, Reason::Rollback, "{e}");
        assert!(e.message.contains("not above version 3"), "{e}");
        let e = read(&[], admitted.as_ref()).unwrap_err();
        assert_eq!(e.reason, Reason::Signature, "an empty candidate is refused: {e}");
        let taken = read(&candidate("rollout-1", 4), admitted.as_ref()).unwrap();
        assert_eq!(taken[0].0, "candidate.fleet");
    }

    #[test]
    fn versions_only_go_up() {
        assert_eq!(next_version(None, None), Ok(1));
        assert_eq!(next_version(None, Some(4)), Ok(5));
        assert_eq!(next_version(Some(9), Some(4)), Ok(9));
        assert!(next_version(Some(4), Some(4)).unwrap_err().contains("not above version 4"));
        assert!(next_version(None, Some(u64::MAX)).is_err());
    }
}
