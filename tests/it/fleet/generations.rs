//! Generations on a node fed by etcd (issue 25, point 1): each declaration it takes from etcd is
//! a generation, a rollback holds it, and its status in etcd says so.

use serde_json::json;

use super::*;

fn node_status(s: &Scratch, url: &str, name: &str) -> serde_json::Value {
    let out = fleet(s, &["status", "--etcd", url, "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    v["nodes"].as_array().into_iter().flatten().find(|r| r["node"] == name).cloned().unwrap_or_default()
}

fn put(s: &Scratch, url: &str, content: &str) {
    write_declaration(
        &s.path("in/g.json"),
        json!([{"type": "file", "id": "g.conf", "path": s.p("g.conf"), "content": content}]),
    );
    let out = fleet(s, &["put", "--etcd", url, "--node", "gen-1", s.p("in/g.json").as_str()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn a_node_fed_by_etcd_keeps_its_generations_and_its_status_carries_the_hold() {
    let s = Scratch::new();
    let etcd = OwnEtcd::start(&s);
    let url = etcd.url();
    let conf = s.path("g.conf");
    put(&s, &url, "a\n");
    let daemon = node(&s, &url, "gen-1", &[]);
    assert!(wait_for(PATIENCE, || read(&conf) == "a\n"), "{}", daemon.log());
    put(&s, &url, "b\n");
    assert!(wait_for(PATIENCE, || read(&conf) == "b\n"), "{}", daemon.log());
    assert!(
        wait_for(PATIENCE, || node_status(&s, &url, "gen-1")["status"]["generation"] == 2),
        "{:#}\n{}",
        node_status(&s, &url, "gen-1"),
        daemon.log()
    );
    let out = s.run(&["generations", "--json"]);
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let sources: Vec<&str> =
        listed["generations"].as_array().unwrap().iter().map(|g| g["source"].as_str().unwrap()).collect();
    assert_eq!(sources.len(), 2, "{listed:#}");
    assert!(sources.iter().all(|s| s.ends_with("fleet/declaration.d")), "the fleet's cache: {listed:#}");

    let out = s.run(&["rollback", "--reason", "b is bad"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(wait_for(PATIENCE, || read(&conf) == "a\n"), "{}", daemon.log());
    assert!(
        wait_for(PATIENCE, || node_status(&s, &url, "gen-1")["status"]["hold"]
            .as_str()
            .is_some_and(|h| h.starts_with("held at generation 1 by rollback") && h.contains("b is bad"))),
        "{:#}\n{}",
        node_status(&s, &url, "gen-1"),
        daemon.log()
    );
    assert_eq!(node_status(&s, &url, "gen-1")["status"]["generation"], 1);

    // A new declaration in etcd ends the hold, and the status says so.
    put(&s, &url, "c\n");
    assert!(wait_for(PATIENCE, || read(&conf) == "c\n"), "{}", daemon.log());
    assert!(
        wait_for(PATIENCE, || {
            let st = node_status(&s, &url, "gen-1");
            st["status"]["generation"] == 3 && st["status"]["hold"].is_null()
        }),
        "{:#}\n{}",
        node_status(&s, &url, "gen-1"),
        daemon.log()
    );
}
