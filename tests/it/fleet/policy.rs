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

    // alice over the fleet's scope, with the policy: refused before anything is written,
    // naming the scope, the role, its threshold and the keys that count; and so a candidate
    // bob signs for group web (the candidate's role is its scope's).
    let before = untouched(&s);
    let in_etcd = || {
        [dump(&url, "/mesh-host/fleet/"), dump(&url, "/mesh-host/group/"), dump(&url, "/mesh-host/rollout/")]
    };
    let etcd_before = in_etcd();
    let evil = motd(&s, "alice over the fleet\n");
    let (a, b) = (alice.to_str().unwrap(), bob.to_str().unwrap());
    let put = fleet(&s, &["put", "--etcd", &url, "--fleet", "--sign", a, "--trust-policy", out, &evil]);
    assert_eq!(put.status.code(), Some(2), "{}", text(&put));
    assert!(
        text(&put).contains("the fleet declaration is signed under role fleet of policy version 1, which needs 1 distinct key(s) of: bob; the keys given make 0 (none count); alice (ssh-ed25519 key SHA256:")
            && text(&put).contains("nothing was written"),
        "{}",
        text(&put)
    );
    let start = ["rollout", "start", "--etcd", &url, "--group", "web", "--waves", "100%", "--soak", "1"];
    let cand =
        fleet(&s, &[&start[..], &["--sign", b, "--trust-policy", out, web.to_str().unwrap()]].concat());
    assert_eq!(cand.status.code(), Some(2), "{}", text(&cand));
    assert!(
        text(&cand).contains("the group web declaration is signed under role group:web of policy version 1, which needs 1 distinct key(s) of: alice; the keys given make 0 (none count); bob (ssh-ed25519 key SHA256:"),
        "{}",
        text(&cand)
    );
    assert!(in_etcd() == etcd_before, "a refused put or rollout wrote to etcd");
    said.extend([put, cand]);
    // Put without the policy (the operator's check skipped): the node refuses it, saying why.
    said.push(signed_put(&s, &url, &["--fleet"], &evil, &[&alice], &["--fleet-name", "prod"]));
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
    // `--out` a bare name: written in the working directory (its parent is "").
    let here = assert_cmd::Command::cargo_bin("mesh-host")
        .unwrap()
        .current_dir(s.path(""))
        .args(["--state", s.state().to_str().unwrap(), "trust", "init", v1_draft.to_str().unwrap()])
        .args(["--out", "bare", "--fleet-name", "prod", "--sign", root1.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(here.status.success(), "{}", text(&here));
    assert!(read(&s.path("bare")).starts_with("mesh-host policy v1\n"));
    said.push(here);
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

/// `fleet grant --trust-policy`: the node's role reads the groups the policy binds it to, a
/// `--group` that differs is refused (naming both) and grants nothing, a policy not signed by
/// its root keys is refused. Against a real etcd with auth on.
#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn fleet_grant_takes_the_nodes_groups_from_the_policy_and_refuses_others() {
    let s = Scratch::new();
    let etcd = OwnEtcd::start(&s);
    let url = etcd.url();
    let (root1, alice) = (keypair(&s, "root1"), keypair(&s, "alice"));
    let keys = [("alice", alice.as_path()), ("root1", root1.as_path())];
    let d1 = draft(&s, "policy.draft", &keys, "role root 1 root1\nrole group:* 1 alice\nnode db-1 db eu\n");
    let policy = s.p("trust-policy");
    let made =
        trust(&s, &["init", d1.to_str().unwrap(), "--out", &policy, "--fleet-name", "prod"], &[&root1]);
    assert!(made.status.success(), "{}", text(&made));
    let pw = s.path("root.pw");
    std::fs::write(&pw, "root-secret\n").unwrap();
    assert!(etcdctl(&url, &["user", "add", "root:root-secret"]).status.success());
    assert!(etcdctl(&url, &["auth", "enable"]).status.success());
    let root = ["--etcd-user", "root", "--etcd-password-file", pw.to_str().unwrap()];
    let grant = |more: &[&str]| fleet(&s, &[&["grant", "--etcd", &url][..], &root, more].concat());
    let role = |name: &str| text(&etcdctl(&url, &["--user", "root:root-secret", "role", "get", name]));

    let out = grant(&["--node", "db-1", "--trust-policy", &policy]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("policy version 1 binds node db-1 to groups db,eu"), "{}", text(&out));
    let granted = role("mesh-host-node-db-1");
    assert!(
        granted.contains("/mesh-host/group/db/declaration/")
            && granted.contains("/mesh-host/group/eu/declaration/"),
        "{granted}"
    );
    // A --group the policy does not bind it to: refused, naming both, the role as it was.
    let other = grant(&["--node", "db-1", "--group", "web", "--trust-policy", &policy]);
    assert_eq!(other.status.code(), Some(2), "{}", text(&other));
    assert!(
        text(&other).contains("--group web is not what policy version 1 binds node db-1 to (groups db,eu)")
            && text(&other).contains("nothing was granted"),
        "{}",
        text(&other)
    );
    assert_eq!(role("mesh-host-node-db-1"), granted, "a refused grant changed the role");
    assert!(!granted.contains("/web/"), "{granted}");
    // A node the policy does not name is in no group; the same --group is granted without it.
    let ghost = grant(&["--node", "web-9", "--trust-policy", &policy]);
    assert!(
        text(&ghost).contains("policy version 1 does not name node web-9: it is in no group"),
        "{}",
        text(&ghost)
    );
    assert!(!role("mesh-host-node-web-9").contains("/mesh-host/group/"), "{}", role("mesh-host-node-web-9"));
    // The draft (no signature) is no policy.
    let unsigned = grant(&["--node", "db-1", "--trust-policy", d1.to_str().unwrap()]);
    assert_eq!(unsigned.status.code(), Some(2), "{}", text(&unsigned));
    assert!(text(&unsigned).contains("--trust-policy"), "{}", text(&unsigned));
    assert_eq!(role("mesh-host-node-db-1"), granted);

    let outputs: Vec<(String, Vec<u8>)> = [made, out, other, ghost, unsigned]
        .iter()
        .enumerate()
        .map(|(i, o)| (format!("command {i}"), text(o).into_bytes()))
        .collect();
    for key in [&root1, &alice] {
        needles_nowhere(key, &outputs);
    }
}

/// The trust policy in force past its expiry: still enforced, and said by `/healthz` (healthy,
/// with a note) and the gauge `mesh_host_trust_policy_expires_timestamp_seconds`, before and
/// after a restart (the pinned policy is taken again as it is); until a rotation is installed
/// and the restarted agent takes it against its pin.
#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn a_policy_in_force_past_its_expiry_is_enforced_and_healthz_and_the_gauge_say_so() {
    let s = Scratch::new();
    let etcd = OwnEtcd::start(&s);
    let url = etcd.url();
    let (root1, bob) = (keypair(&s, "root1"), keypair(&s, "bob"));
    let keys = [("bob", bob.as_path()), ("root1", root1.as_path())];
    let d1 = draft(&s, "policy.draft", &keys, "role root 1 root1\nrole fleet 1 bob\n");
    let policy = s.p("trust-policy");
    let args = ["init", d1.to_str().unwrap(), "--out", &policy, "--fleet-name", "prod", "--expires", "6s"];
    let made = trust(&s, &args, &[&root1]);
    assert!(made.status.success(), "{}", text(&made));
    let expires: u64 = read(Path::new(&policy))
        .lines()
        .find_map(|l| l.strip_prefix("expires ").map(|e| e.parse().unwrap()))
        .unwrap();
    let file = motd(&s, "one\n");
    let put = signed_put(&s, &url, &["--fleet"], &file, &[&bob], &["--trust-policy", &policy]);
    let gauge = "mesh_host_trust_policy_expires_timestamp_seconds";
    let mut d = node_with(&s, &url, "web-1", &[], &["--trust-policy", &policy]);
    assert!(wait_for(PATIENCE, || read(&s.path("out/motd")) == "one\n"), "{}", d.log());
    assert_eq!(d.metric(gauge), expires as f64, "{}", d.get("/metrics").unwrap_or_default());
    assert!(wait_for(PATIENCE, || d.answer("/healthz").is_some_and(|(c, _)| c == 200)), "{}", d.log());
    let (code, body) = d.answer("/healthz").unwrap();
    assert!(code == 200 && !body.contains("trust policy"), "not expired yet: {code} {body}");

    let now = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    assert!(wait_for(PATIENCE, || now() > expires + 1), "the policy expired");
    let (code, body) = d.answer("/healthz").unwrap();
    assert_eq!(code, 200, "enforcing it is the node doing its job: {body}");
    assert!(body.contains("trust policy version 1 in force past its expiry"), "{body}");
    std::fs::write(s.path("out/motd"), "edited\n").unwrap();
    assert!(wait_for(PATIENCE, || read(&s.path("out/motd")) == "one\n"), "still enforced:\n{}", d.log());
    assert_eq!(d.terminate(), Some(0), "{}", d.log());
    let log = d.log();
    drop(d);
    // Restarted past its expiry: the pinned policy is taken as it is, and said.
    let d = node_with(&s, &url, "web-1", &[], &["--trust-policy", &policy]);
    assert_eq!(d.metric(gauge), expires as f64);
    assert!(
        wait_for(PATIENCE, || d
            .answer("/healthz")
            .is_some_and(|(c, b)| c == 200 && b.contains("trust policy version 1 in force past its expiry"))),
        "{}",
        d.log()
    );
    let mut outputs = vec![
        ("trust init".to_owned(), text(&made).into_bytes()),
        ("fleet put".to_owned(), text(&put).into_bytes()),
        ("the node's log".to_owned(), log.into_bytes()),
        ("the node's log after".to_owned(), d.log().into_bytes()),
        ("/healthz".to_owned(), d.answer("/healthz").unwrap().1.into_bytes()),
        ("/metrics".to_owned(), d.get("/metrics").unwrap_or_default().into_bytes()),
    ];
    drop(d);

    // The fix: a rotation (version 2, signed by the old root, which is its own too) installed
    // in place, taken by the node at its next start; the gauge moves, the note goes.
    let next = s.p("next");
    let args = ["init", d1.to_str().unwrap(), "--out", &next, "--fleet-name", "prod", "--version", "2"];
    let v2 = trust(&s, &args, &[&root1]);
    assert!(v2.status.success(), "{}", text(&v2));
    let rotated = trust(&s, &["rotate", &next, "--policy", &policy], &[]);
    assert!(rotated.status.success(), "{}", text(&rotated));
    let later: u64 = read(Path::new(&policy))
        .lines()
        .find_map(|l| l.strip_prefix("expires ").map(|e| e.parse().unwrap()))
        .unwrap();
    assert!(later > now(), "version 2 is not expired");
    let d = node_with(&s, &url, "web-1", &[], &["--trust-policy", &policy]);
    assert_eq!(d.metric(gauge), later as f64, "{}", d.log());
    assert!(read(&s.path("state/trust/policy")).contains("\nversion 2\n"), "re-pinned:\n{}", d.log());
    assert!(wait_for(PATIENCE, || d.answer("/healthz").is_some_and(|(c, _)| c == 200)), "{}", d.log());
    let (_, body) = d.answer("/healthz").unwrap();
    assert!(!body.contains("trust policy"), "{body}");
    outputs.extend([
        ("trust init 2".to_owned(), text(&v2).into_bytes()),
        ("trust rotate".to_owned(), text(&rotated).into_bytes()),
        ("the node's log at version 2".to_owned(), d.log().into_bytes()),
    ]);
    outputs.extend(dump(&url, "/"));
    outputs.push(("the policy".into(), std::fs::read(&policy).unwrap()));
    outputs.extend(tree(&s.path("state")).into_iter().map(|(p, (b, _, _))| (p.display().to_string(), b)));
    for key in [&root1, &bob] {
        needles_nowhere(key, &outputs);
    }
}
