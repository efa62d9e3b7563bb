//! `fleet put` and `fleet diff` against the testbed's member.

use super::*;
use crate::support::*;

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn fleet_put_refuses_a_declaration_mesh_host_would_refuse_and_writes_nothing() {
    let etcd = need_testbed_etcd();
    let s = Scratch::new();
    let group = unique("refused");
    let bad = s.path("bad/web.json");
    write_declaration(
        &bad,
        json!([{"type": "file", "id": "web.conf", "path": "relative/path", "content": "x"}]),
    );
    let out = fleet(&s, &["put", "--etcd", etcd, "--group", &group, bad.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "a refusal exits 2: {stderr}");
    // The problem is named under the key it would have had, with the resource and the field.
    assert!(stderr.contains(&format!("/mesh-host/group/{group}/declaration/web.json")), "{stderr}");
    assert!(stderr.contains("web.conf") && stderr.contains("path"), "{stderr}");
    assert_eq!(
        keys_under(etcd, &format!("/mesh-host/group/{group}/")),
        Vec::<String>::new(),
        "nothing reached etcd"
    );

    // A name that would reach other keys is refused before etcd is asked anything.
    let good = s.path("good/web.json");
    write_declaration(&good, json!([]));
    let out = fleet(&s, &["put", "--etcd", etcd, "--node", "a/../b", good.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--node \"a/../b\""));
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn fleet_put_makes_a_scope_hold_exactly_a_directory_in_one_transaction_and_diff_says_what_would_change() {
    let etcd = need_testbed_etcd();
    let s = Scratch::new();
    let group = unique("put");
    let prefix = format!("/mesh-host/group/{group}/declaration/");
    let dir = s.path("decl");
    write_declaration(
        &dir.join("10-a.json"),
        json!([{"type": "file", "id": "a.one", "path": s.p("one"), "content": "1"}]),
    );
    write_declaration(
        &dir.join("20-b.json"),
        json!([{"type": "file", "id": "b.two", "path": s.p("two"), "content": "2"}]),
    );
    let dir_arg = dir.to_str().unwrap();
    let out = fleet(&s, &["put", "--etcd", etcd, "--group", &group, dir_arg]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("2 added, 0 changed, 0 removed"), "{out:?}");
    assert_eq!(keys_under(etcd, &prefix), [format!("{prefix}10-a.json"), format!("{prefix}20-b.json")]);
    // One transaction: both keys carry the same revision.
    let json_out = etcdctl(etcd, &["get", "--prefix", &prefix, "-w", "json"]);
    let got: serde_json::Value = serde_json::from_slice(&json_out.stdout).unwrap();
    let revisions: Vec<i64> =
        got["kvs"].as_array().unwrap().iter().map(|kv| kv["mod_revision"].as_i64().unwrap()).collect();
    assert_eq!(revisions.len(), 2);
    assert_eq!(revisions[0], revisions[1], "written in one transaction: {got}");

    // b changes, a goes: diff says so and writes nothing.
    std::fs::remove_file(dir.join("10-a.json")).unwrap();
    write_declaration(
        &dir.join("20-b.json"),
        json!([{"type": "file", "id": "b.two", "path": s.p("two"), "content": "two"}]),
    );
    let out = fleet(&s, &["diff", "--etcd", etcd, "--group", &group, dir_arg]);
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(shown.contains(&format!("remove {prefix}10-a.json")), "{shown}");
    assert!(shown.contains(&format!("change {prefix}20-b.json")), "{shown}");
    assert!(shown.contains("+") && shown.contains("\"two\""), "a diff of the changed key: {shown}");
    assert!(shown.contains("nothing was written"), "{shown}");
    assert_eq!(keys_under(etcd, &prefix).len(), 2, "diff wrote nothing");

    let out = fleet(&s, &["put", "--etcd", etcd, "--group", &group, dir_arg]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("0 added, 1 changed, 1 removed"), "{out:?}");
    assert_eq!(keys_under(etcd, &prefix), [format!("{prefix}20-b.json")]);
    let out = fleet(&s, &["put", "--etcd", etcd, "--group", &group, dir_arg]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("nothing was written"), "{out:?}");
    etcdctl(etcd, &["del", "--prefix", &format!("/mesh-host/group/{group}/")]);
}
