//! What a key's reconcile claims, and whether it runs apart: worked out from the declaration in
//! force and the store, for the queue's claims (`queue::Claim`) and the runner's choice of inline
//! or apart (`runner`'s module doc). Pure: the worker asks, with what it owns.

use crate::declaration::{Declaration, Id, Kind};
use crate::store::Store;

/// The ids a reconcile of `id` claims: its closure (as `apply::reconcile_in` selects it), every
/// opening when it reaches one (the filter is one, and the pass records every opening), the
/// container an action in it runs in, the network a container in it joins and the declared
/// files and directories it reads (env-files, mounted paths), and the first gate not passed at its current declaration
/// when anything in it comes after that gate (the pass would not attempt it until the gate
/// passes, so it waits for a gate in flight). Sorted, without repeats; an id not declared
/// claims itself.
pub(super) fn claimed(d: &Declaration, store: &Store, id: &Id) -> Vec<Id> {
    let closure = d.closure([id]);
    let mut ids: Vec<Id> = closure.iter().map(|&i| d.resources[i].id.clone()).collect();
    if ids.is_empty() {
        return vec![id.clone()];
    }
    for &i in &closure {
        let r = &d.resources[i];
        if r.kind() == Kind::Opening {
            ids.extend(d.resources.iter().filter(|o| o.kind() == Kind::Opening).map(|o| o.id.clone()));
        }
        if let Some(name) = r.spec.runs_in() {
            ids.extend(
                d.resources
                    .iter()
                    .filter(|c| c.kind() == Kind::Container && c.target() == name)
                    .map(|c| c.id.clone()),
            );
        }
        if let Some(name) = r.spec.joins() {
            ids.extend(
                d.resources
                    .iter()
                    .filter(|n| n.kind() == Kind::Network && n.target() == name)
                    .map(|n| n.id.clone()),
            );
        }
        // A file a container reads (an env-file, a mounted path) is not corrected while the
        // container is being made from it.
        ids.extend(r.spec.reads().into_iter().filter_map(|p| d.at_path(p)).map(|f| f.id.clone()));
    }
    let last = closure.iter().copied().max().unwrap_or(0);
    let open_gate = d.gates().find(|g| store.get(g.id.as_str()).is_none_or(|rec| rec.declared != g.digest));
    if let Some(gate) = open_gate.filter(|g| g.index() < last) {
        ids.push(gate.id.clone());
    }
    ids.sort();
    ids.dedup();
    ids
}

/// Whether a reconcile of `id` may be slow, so runs apart: its closure reaches anything but
/// files, directories and access paths (a unit, a container, a network, a package, a user, an
/// archive, an action, a process, an opening). Decided by type, not measured (decisions.md).
pub(super) fn slow(d: &Declaration, id: &Id) -> bool {
    d.closure([id])
        .iter()
        .any(|&i| !matches!(d.resources[i].kind(), Kind::File | Kind::Directory | Kind::Access))
}

/// The hash a claim holds for a resource id.
pub(super) fn claim_hash(id: &str) -> u64 {
    use std::hash::{Hash as _, Hasher as _};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    id.hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::queue::Claim;

    /// Two files, one a service restarts on; a container and an action run in it (a gate); a
    /// file after the gate; two openings.
    const DECLARATION: &str = r#"{"version": 1, "resources": [
        {"type": "file", "id": "a.conf", "path": "/srv/a.conf", "content": "x\n"},
        {"type": "file", "id": "a.other", "path": "/srv/a.other", "content": "y\n"},
        {"type": "service", "id": "a.svc", "unit": "a.service", "state": "running", "restart-on": ["a.conf"]},
        {"type": "container", "id": "a.box", "name": "box", "image": "local/busybox:1"},
        {"type": "action", "id": "a.seed", "command": ["seed"], "verify": ["seed", "--check"], "in": "box"},
        {"type": "file", "id": "a.late", "path": "/srv/a.late", "content": "z\n"},
        {"type": "opening", "id": "o.http", "port": 80},
        {"type": "opening", "id": "o.dns", "port": 53, "protocol": "udp"}
    ]}"#;

    fn id(s: &str) -> Id {
        Id::parse(s).unwrap()
    }

    fn ids(list: &[&str]) -> Vec<Id> {
        list.iter().map(|s| id(s)).collect()
    }

    fn declared() -> (Declaration, tempfile::TempDir, crate::store::Writer) {
        let d = Declaration::parse(DECLARATION.as_bytes()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("state.json")).unwrap();
        (d, dir, store)
    }

    /// Records the gate at its current declaration: it has passed.
    fn pass_gate(d: &Declaration, store: &mut Store) {
        let r = d.get(&id("a.seed")).unwrap();
        store.record(
            "a.seed",
            crate::store::Record {
                origin: crate::store::Origin::Declared,
                kind: r.kind(),
                target: r.spec.target_shared(),
                position: r.index() as u32,
                declared: r.digest,
                applied_at: 0,
                wrote: None,
                mode: None,
                owner: None,
                sig: None,
                more: None,
            },
        );
    }

    #[test]
    fn a_file_alone_claims_itself_and_runs_inline() {
        let (d, _dir, mut store) = declared();
        pass_gate(&d, &mut store);
        assert_eq!(claimed(&d, &store, &id("a.other")), ids(&["a.other"]));
        assert!(!slow(&d, &id("a.other")));
    }

    #[test]
    fn a_file_a_service_restarts_on_claims_the_service_and_runs_apart() {
        let (d, _dir, mut store) = declared();
        pass_gate(&d, &mut store);
        assert_eq!(claimed(&d, &store, &id("a.conf")), ids(&["a.conf", "a.svc"]));
        assert!(slow(&d, &id("a.conf")));
        assert_eq!(
            claimed(&d, &store, &id("a.svc")),
            ids(&["a.svc"]),
            "a service claims what restarts on it, not what it restarts on"
        );
        assert!(slow(&d, &id("a.svc")));
    }

    #[test]
    fn an_action_claims_the_container_it_runs_in() {
        let (d, _dir, mut store) = declared();
        pass_gate(&d, &mut store);
        assert_eq!(claimed(&d, &store, &id("a.seed")), ids(&["a.box", "a.seed"]));
    }

    #[test]
    fn what_comes_after_a_gate_not_passed_claims_the_gate_and_no_longer_once_it_passed() {
        let (d, _dir, mut store) = declared();
        assert_eq!(claimed(&d, &store, &id("a.late")), ids(&["a.late", "a.seed"]));
        assert_eq!(
            claimed(&d, &store, &id("a.conf")),
            ids(&["a.conf", "a.svc"]),
            "before the gate: not held by it"
        );
        pass_gate(&d, &mut store);
        assert_eq!(claimed(&d, &store, &id("a.late")), ids(&["a.late"]));
    }

    #[test]
    fn a_container_claims_its_network_and_the_files_it_reads() {
        let d = Declaration::parse(
            br#"{"version": 1, "resources": [
                {"type": "file", "id": "w.env", "path": "/srv/w.env", "content": "A=1\n"},
                {"type": "directory", "id": "w.data", "path": "/srv/w"},
                {"type": "network", "id": "w.net", "name": "wnet"},
                {"type": "container", "id": "w.app", "name": "w", "image": "local/busybox:1",
                 "env-file": ["/srv/w.env"], "volumes": ["/srv/w:/data", "named:/cache"], "network": "wnet"}
            ]}"#,
        )
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("state.json")).unwrap();
        assert_eq!(claimed(&d, &store, &id("w.app")), ids(&["w.app", "w.data", "w.env", "w.net"]));
        assert_eq!(claimed(&d, &store, &id("w.env")), ids(&["w.env"]), "the file alone claims itself");
    }

    #[test]
    fn an_opening_claims_every_opening() {
        let (d, _dir, mut store) = declared();
        pass_gate(&d, &mut store);
        assert_eq!(claimed(&d, &store, &id("o.dns")), ids(&["o.dns", "o.http"]));
        assert!(slow(&d, &id("o.dns")));
    }

    #[test]
    fn an_id_no_longer_declared_claims_itself() {
        let (d, _dir, store) = declared();
        assert_eq!(claimed(&d, &store, &id("gone.file")), ids(&["gone.file"]));
        assert!(!slow(&d, &id("gone.file")));
    }

    #[test]
    fn claims_of_a_file_and_of_the_service_restarting_on_it_meet_and_others_do_not() {
        let (d, _dir, mut store) = declared();
        pass_gate(&d, &mut store);
        let claim = |s: &str| {
            Claim::only(claimed(&d, &store, &id(s)).iter().map(|i| claim_hash(i.as_str())).collect())
        };
        assert!(claim("a.conf").meets(&claim("a.svc")));
        assert!(!claim("a.other").meets(&claim("a.svc")));
        assert!(!claim("a.other").meets(&claim("a.conf")));
    }
}
