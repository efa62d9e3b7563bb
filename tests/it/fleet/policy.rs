//! The trust policy (issue 44, point 4), with the real `ssh-keygen` signing and real agents:
//! `trust init|show|rotate`; a node run with `--trust-policy` that verifies each scope against
//! its role (alice may sign group web only, so her signature over the fleet is refused with the
//! reason) and takes its groups from the policy (a `--group` that differs is refused at start);
//! `fleet put --trust-policy` reaching nodes by the policy's groups; a rotation taken only when
//! signed by the old root keys and the new, never a lower version, on the operator's side and on
//! the node's. A planted private key is searched for in every output.

use serde_json::Value;

use super::signed::{dump, motd, needles_nowhere, refused_with, signed_put, status, untouched};
use super::*;
use crate::signed::{keypair, public, text, tree};

/// A draft naming `keys` (name, private key path) and these role and node lines.
fn draft(s: &Scratch, name: &str, keys: &[(&str, &Path)], lines: &str) -> PathBuf {
    let mut text: String = keys.iter().map(|(n, k)| format!("key {n} {}", public(k))).collect();
    text.push_str(lines);
    let path = s.path(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// `mesh-host trust ARGS` with each `--sign KEY`.
fn trust(s: &Scratch, args: &[&str], keys: &[&Path]) -> Output {
    let mut all: Vec<String> = [&["trust"][..], args].concat().iter().map(|a| a.to_string()).collect();
    for k in keys {
        all.extend(["--sign".to_owned(), k.display().to_string()]);
    }
    s.run(&strs(&all))
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn a_policy_lets_each_key_sign_only_its_scopes_and_binds_the_nodes_groups() {
    let s = Scratch::new();
    let etcd = OwnEtcd::start(&s);
    let url = etcd.url();
    let (root1, root2) = (keypair(&s, "root1"), keypair(&s, "root2"));
    let (alice, bob) = (keypair(&s, "alice"), keypair(&s, "bob"));
    let keys = [
        ("alice", alice.as_path()),
        ("bob", bob.as_path()),
        ("root1", root1.as_path()),
        ("root2", root2.as_path()),
    ];
    let roles = "role root 2 root1 root2\nrole fleet 1 bob\nrole group:web 1 alice\nrole node:* 1 bob\nnode web-1 web\n";
    let d1 = draft(&s, "policy.draft", &keys, roles);
    let policy = s.path("etc/trust-policy");
    let out = policy.to_str().unwrap();
    let mut said: Vec<Output> = Vec::new();

    // A first policy needs its own root threshold: one root of two writes nothing.
    let one = trust(&s, &["init", d1.to_str().unwrap(), "--out", out, "--fleet-name", "prod"], &[&root1]);
    assert_eq!(one.status.code(), Some(2), "{}", text(&one));
    assert!(
        text(&one).contains("signed by 1 of its own root keys (root1), and 2 are required"),
        "{}",
        text(&one)
    );
    assert!(!policy.exists(), "nothing was written");
    let made =
        trust(&s, &["init", d1.to_str().unwrap(), "--out", out, "--fleet-name", "prod"], &[&root1, &root2]);
    assert!(made.status.success(), "{}", text(&made));
    assert!(text(&made).contains("policy version 1 of fleet prod") && text(&made).contains("root1, root2"));
    said.extend([one, made]);
    let shown = trust(&s, &["show", out], &[]);
    assert!(text(&shown).contains("signed by root: root1, root2"), "{}", text(&shown));
    assert!(text(&shown).contains("group:web        1 of alice"), "{}", text(&shown));
    let json: Value = serde_json::from_slice(&trust(&s, &["show", out, "--json"], &[]).stdout).unwrap();
    assert_eq!((json["version"].as_u64(), json["verified"].as_bool()), (Some(1), Some(true)), "{json:#}");
    assert_eq!(json["nodes"]["web-1"], serde_json::json!(["web"]));
    said.push(shown);

    // The node: groups from the policy, each scope signed by its role.
    let fleet_file = motd(&s, "fleet\n");
    said.push(signed_put(&s, &url, &["--fleet"], &fleet_file, &[&bob], &["--trust-policy", out]));
    let web = s.path("in/web.json");
    write_declaration(
        &web,
        json!([{"type": "file", "id": "web", "path": s.p("out/web"), "content": "web\n"}]),
    );
    said.push(signed_put(
        &s,
        &url,
        &["--group", "web"],
        web.to_str().unwrap(),
        &[&alice],
        &["--trust-policy", out],
    ));
    let d = node_with(&s, &url, "web-1", &[], &["--trust-policy", out]);
    assert!(
        wait_for(PATIENCE, || read(&s.path("out/web")) == "web\n"),
        "group web, from the policy:\n{}",
        d.log()
    );
    assert_eq!(read(&s.path("out/motd")), "fleet\n");
    assert_eq!(status(&url, "web-1")["groups"], serde_json::json!(["web"]));
    assert!(read(&s.path("state/trust/policy")).contains("mesh-host policy v1\n"), "pinned");

    // alice over the fleet's scope: a key of the policy, but not of the fleet's role.
    let before = untouched(&s);
    let evil = motd(&s, "alice over the fleet\n");
    said.push(signed_put(&s, &url, &["--fleet"], &evil, &[&alice], &["--trust-policy", out]));
    let m = refused_with(
        &s,
        &url,
        &d,
        "signature",
        "role fleet of policy version 1 does not list (1 of: bob)",
        &before,
    );
    assert!(m.contains("signed by alice, ssh-ed25519 key"), "the key is named: {m}");
    assert_eq!(read(&s.path("out/motd")), "fleet\n");
    let log = d.log();
    drop(d);

    // A --group other than the policy's: refused at start, naming both.
    let out2 = s.run(&[
        "run",
        "--etcd",
        &url,
        "--node",
        "web-1",
        "--group",
        "db",
        "--trust-policy",
        out,
        "--metrics",
        "off",
    ]);
    assert_eq!(out2.status.code(), Some(2), "{}", text(&out2));
    assert!(
        text(&out2).contains("--group db is not what policy version 1 binds node web-1 to (groups web)"),
        "{}",
        text(&out2)
    );
    // --allowed-signers and --trust-policy are one or the other.
    let both = s.run(&["run", "--trust-policy", out, "--allowed-signers", out, "--metrics", "off"]);
    assert_eq!(both.status.code(), Some(2), "{}", text(&both));
    said.extend([out2, both]);

    // The planted keys: in no output, nowhere in etcd, the state or the policy.
    let mut outputs: Vec<(String, Vec<u8>)> =
        said.iter().enumerate().map(|(i, o)| (format!("command {i}"), text(o).into_bytes())).collect();
    outputs.push(("the node's log".into(), log.into_bytes()));
    outputs.extend(dump(&url, "/"));
    outputs.extend(tree(&s.path("state")).into_iter().map(|(p, (b, _, _))| (p.display().to_string(), b)));
    outputs.push(("the policy".into(), std::fs::read(&policy).unwrap()));
    for key in [&root1, &root2, &alice, &bob] {
        needles_nowhere(key, &outputs);
    }
}

#[test]
fn a_policy_rotates_only_when_the_old_roots_and_the_new_sign_it_and_never_goes_back() {
    let s = Scratch::new();
    let (root1, root3, alice) = (keypair(&s, "root1"), keypair(&s, "root3"), keypair(&s, "alice"));
    let v1_draft = draft(
        &s,
        "v1.draft",
        &[("alice", alice.as_path()), ("root1", root1.as_path())],
        "role local 1 alice\nrole root 1 root1\n",
    );
    let v2_draft = draft(
        &s,
        "v2.draft",
        &[("alice", alice.as_path()), ("root3", root3.as_path())],
        "role local 1 alice\nrole root 1 root3\n",
    );
    let installed = s.path("etc/trust-policy");
    let (inst, v1, v2, low) = (installed.to_str().unwrap(), s.p("v1"), s.p("v2"), s.p("low"));
    let init = |d: &Path, out: &str, version: &str, keys: &[&Path]| {
        let args = ["init", d.to_str().unwrap(), "--out", out, "--fleet-name", "prod", "--version", version];
        let o = trust(&s, &args, keys);
        assert!(o.status.success(), "trust init: {}", text(&o));
        o
    };
    let mut said = vec![init(&v1_draft, &v1, "1", &[&root1]), init(&v2_draft, &v2, "2", &[&root3])];
    std::fs::create_dir_all(installed.parent().unwrap()).unwrap();
    std::fs::copy(&v1, &installed).unwrap();

    // A node's first use pins it: apply of a directory alice signed for the local scope.
    let dir = s.path("declaration.d");
    write_declaration(
        &dir.join("10-a.json"),
        json!([{"type": "file", "id": "a", "path": s.p("out/a"), "content": "a\n"}]),
    );
    let signed =
        s.run(&["sign", dir.to_str().unwrap(), "--sign", alice.to_str().unwrap(), "--fleet-name", "prod"]);
    assert!(signed.status.success(), "{}", text(&signed));
    let apply = || s.run(&["apply", dir.to_str().unwrap(), "--trust-policy", inst]);
    let applied = apply();
    assert!(applied.status.success(), "{}", text(&applied));
    assert_eq!(read(&s.path("out/a")), "a\n");
    assert_eq!(std::fs::read(s.path("state/trust/policy")).unwrap(), std::fs::read(&v1).unwrap(), "pinned");
    said.extend([signed, applied]);

    // Signed by the new root only: refused, nothing installed.
    let refused = trust(&s, &["rotate", &v2, "--policy", inst], &[]);
    assert_eq!(refused.status.code(), Some(2), "{}", text(&refused));
    assert!(
        text(&refused).contains("signed by 0 of the old policy's (version 1) root keys"),
        "{}",
        text(&refused)
    );
    assert_eq!(std::fs::read(&installed).unwrap(), std::fs::read(&v1).unwrap(), "the one in force stays");
    // The node refuses it the same way, from its pin.
    std::fs::copy(&v2, &installed).unwrap();
    let node_refused = apply();
    assert_eq!(node_refused.status.code(), Some(2), "{}", text(&node_refused));
    assert!(
        text(&node_refused).contains("of the old policy's (version 1) root keys"),
        "{}",
        text(&node_refused)
    );
    std::fs::copy(&v1, &installed).unwrap();
    said.extend([refused, node_refused]);

    // Signed by the old root too: installed, and the node takes it as a rotation of its pin.
    let rotated = trust(&s, &["rotate", &v2, "--policy", inst], &[&root1]);
    assert!(rotated.status.success(), "{}", text(&rotated));
    assert!(text(&rotated).contains("policy version 2 after version 1"), "{}", text(&rotated));
    let shown = trust(&s, &["show", inst], &[]);
    assert!(
        text(&shown).contains("policy version 2 of fleet prod")
            && text(&shown).contains("signed by root: root3")
    );
    assert!(apply().status.success());
    assert!(
        std::fs::read_to_string(s.path("state/trust/policy")).unwrap().contains("\nversion 2\n"),
        "re-pinned"
    );
    said.extend([rotated, shown]);

    // A lower version, signed by every root: refused by rotate and by the node.
    said.push(init(&v1_draft, &low, "1", &[&root1]));
    let lower = trust(&s, &["rotate", &low, "--policy", inst], &[&root3]);
    assert_eq!(lower.status.code(), Some(2), "{}", text(&lower));
    assert!(text(&lower).contains("its version 1 is not above version 2"), "{}", text(&lower));
    std::fs::copy(&v1, &installed).unwrap();
    let back = apply();
    assert_eq!(back.status.code(), Some(2), "{}", text(&back));
    assert!(text(&back).contains("it is version 1, and version 2 is pinned here"), "{}", text(&back));
    said.extend([lower, back]);

    let mut outputs: Vec<(String, Vec<u8>)> =
        said.iter().enumerate().map(|(i, o)| (format!("command {i}"), text(o).into_bytes())).collect();
    outputs.extend(tree(&s.path("state")).into_iter().map(|(p, (b, _, _))| (p.display().to_string(), b)));
    for f in [&v1, &v2, &low] {
        outputs.push((f.clone(), std::fs::read(f).unwrap()));
    }
    for key in [&root1, &root3, &alice] {
        needles_nowhere(key, &outputs);
    }
}
