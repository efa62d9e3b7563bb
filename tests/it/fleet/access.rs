//! Who may reach what (issue 44, point 5; the security review's F2 and F4): plaintext etcd
//! beyond loopback refused unless said; `fleet grant` refused while etcd's auth is off; a node's
//! own etcd user denied another group's rollout candidate; `fleet revoke` taking a live node's
//! user, role, status and presence away. Against a real etcd member of the test's own, with
//! auth on, and a real agent.

use super::*;
use crate::signed::text;

/// Every command that speaks to etcd, on an `http://` endpoint that is not loopback.
fn etcd_commands(endpoint: &str) -> Vec<Vec<String>> {
    let own = |args: &[&str]| args.iter().map(|a| a.to_string()).collect::<Vec<_>>();
    vec![
        own(&["run", "--etcd", endpoint, "--node", "n1"]),
        own(&["fleet", "status", "--etcd", endpoint]),
        own(&["fleet", "put", "--etcd", endpoint, "--fleet", "/nonexistent.json"]),
        own(&["fleet", "grant", "--etcd", endpoint, "--node", "n1"]),
        own(&["fleet", "revoke", "--etcd", endpoint, "--node", "n1"]),
        own(&["fleet", "forget", "--etcd", endpoint, "n1"]),
        own(&["fleet", "rollout", "status", "--etcd", endpoint]),
        own(&["fleet", "rollout", "abort", "--etcd", endpoint]),
    ]
}

#[test]
fn plaintext_etcd_beyond_loopback_is_refused_by_run_and_every_fleet_command_unless_allowed() {
    let s = Scratch::new();
    // TEST-NET-1 (RFC 5737): never routed, so nothing here could reach an etcd by accident.
    for args in etcd_commands("http://192.0.2.1:2379") {
        let out = s.run(&strs(&args));
        let said = text(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {said}");
        assert!(
            said.contains("http://192.0.2.1:2379 is http:// to a host other than loopback")
                && said.contains("https:// with --etcd-ca")
                && said.contains("--allow-plaintext"),
            "{args:?} says why and how: {said}"
        );
    }
    // A name is not known to be loopback (it may resolve anywhere), `localhost` is.
    let out = s.run(&["fleet", "status", "--etcd", "http://etcd.internal:2379"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("--allow-plaintext"), "{}", text(&out));
    let out = s.run(&["fleet", "status", "--etcd", &format!("http://localhost:{}", free_port())]);
    assert!(!text(&out).contains("--allow-plaintext"), "loopback by name: {}", text(&out));
    // Said on purpose: the refusal goes, and the command tries etcd (which is not there).
    let out = s.run(&["fleet", "status", "--etcd", "http://192.0.2.1:2379", "--allow-plaintext"]);
    assert!(!text(&out).contains("is http:// to a host other than loopback"), "{}", text(&out));
    assert!(text(&out).contains("192.0.2.1"), "it tried etcd there: {}", text(&out));
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn fleet_grant_is_refused_while_etcds_auth_is_off_and_makes_no_user_or_role() {
    let s = Scratch::new();
    let etcd = OwnEtcd::start(&s);
    let url = etcd.url();
    let out = fleet(&s, &["grant", "--etcd", &url, "--node", "n1", "--group", "web"]);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(said.contains("etcd's auth is off at") && said.contains("etcdctl auth enable"), "{said}");
    let users = text(&etcdctl(&url, &["user", "list"]));
    let roles = text(&etcdctl(&url, &["role", "list"]));
    assert!(!users.contains("n1") && !roles.contains("mesh-host-node-n1"), "{users}{roles}");
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn a_nodes_own_user_reads_only_its_scopes_candidates_and_revoke_takes_a_live_nodes_access_away() {
    let s = Scratch::new();
    let etcd = OwnEtcd::start(&s);
    let url = etcd.url();
    let secret = |name: &str, pw: &str| password_file(&s, name, pw);
    let (root_pw, db_pw, web_pw) =
        (secret("root.pw", "root-secret"), secret("db.pw", "db-secret"), secret("web.pw", "web-secret"));
    let root = ["--etcd-user", "root", "--etcd-password-file", root_pw.as_str()];
    let as_root = |args: &[&str]| {
        let out = etcdctl(&url, &[&["--user", "root:root-secret"], args].concat());
        assert!(out.status.success(), "etcdctl {args:?}: {}", text(&out));
        out
    };
    assert!(etcdctl(&url, &["user", "add", "root:root-secret"]).status.success());
    assert!(etcdctl(&url, &["auth", "enable"]).status.success());
    // db-1's role as an older grant left it: every candidate readable.
    as_root(&["role", "add", "mesh-host-node-db-1"]);
    as_root(&[
        "role",
        "grant-permission",
        "--prefix=true",
        "mesh-host-node-db-1",
        "read",
        "/mesh-host/rollout/open/candidate/",
    ]);

    let grant = |node: &str, group: &str, pw: &str| {
        let out = fleet(
            &s,
            &[
                &["grant", "--etcd", &url],
                &root[..],
                &["--node", node, "--group", group, "--node-password-file", pw],
            ]
            .concat(),
        );
        assert!(out.status.success(), "fleet grant {node}: {}", text(&out));
        text(&out)
    };
    let said = grant("db-1", "db", &db_pw);
    assert!(
        said.contains("taken from it, no longer its: /mesh-host/rollout/open/candidate/"),
        "the older, wider grant is narrowed: {said}"
    );
    grant("web-1", "web", &web_pw);

    // A candidate for each group and one for the fleet, as a rollout's start writes them.
    for scope in ["group/db", "group/web", "fleet"] {
        as_root(&["put", &format!("/mesh-host/rollout/open/candidate/{scope}/app.json"), scope]);
    }
    let read_as = |who: &str, key: &str, prefix: bool| {
        let mut args = vec!["--user", who, "get", key];
        if prefix {
            args.push("--prefix");
        }
        etcdctl(&url, &args)
    };
    let db = "db-1:db-secret";
    let web = "web-1:web-secret";
    let denied = |out: &Output| !out.status.success() && text(out).contains("permission denied");
    let own = read_as(db, "/mesh-host/rollout/open/candidate/group/db/", true);
    assert!(own.status.success() && text(&own).contains("group/db"), "its group's: {}", text(&own));
    let fleet_wide = read_as(db, "/mesh-host/rollout/open/candidate/fleet/", true);
    assert!(fleet_wide.status.success() && text(&fleet_wide).contains("fleet"), "{}", text(&fleet_wide));
    let other = read_as(db, "/mesh-host/rollout/open/candidate/group/web/app.json", false);
    assert!(denied(&other), "db-1 reads web's candidate: {}", text(&other));
    let all = read_as(db, "/mesh-host/rollout/open/candidate/", true);
    assert!(denied(&all), "db-1 reads every candidate: {}", text(&all));
    let theirs = read_as(web, "/mesh-host/rollout/open/candidate/group/web/app.json", false);
    assert!(theirs.status.success() && text(&theirs).contains("group/web"), "{}", text(&theirs));

    // A live node revoked: its user and role go, its status and presence with them, and it
    // cannot write them back. Its own declaration keys stay.
    let conf = s.path("out/db.conf");
    let decl = s.path("in/db.json");
    write_declaration(&decl, json!([{"type": "file", "id": "db.conf", "path": conf, "content": "db\n"}]));
    let out = fleet(
        &s,
        &[&["put", "--etcd", &url], &root[..], &["--node", "db-1", decl.to_str().unwrap()]].concat(),
    );
    assert!(out.status.success(), "{}", text(&out));
    let login = ["--etcd-user", "db-1", "--etcd-password-file", db_pw.as_str()];
    let d = node_with(&s, &url, "db-1", &["db"], &login);
    assert!(wait_for(PATIENCE, || read(&conf) == "db\n"), "{}", d.log());
    let has = |key: &str| !text(&as_root(&["get", key, "--keys-only"])).trim().is_empty();
    assert!(wait_for(PATIENCE, || has("/mesh-host/node/db-1/alive")), "alive: {}", d.log());
    let out = fleet(&s, &[&["revoke", "--etcd", &url], &root[..], &["--node", "db-1"]].concat());
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains("revoked node db-1: user db-1 deleted, role mesh-host-node-db-1 deleted")
            && said.contains("forgot node db-1: its status, presence and any rollout admission deleted")
            && said.contains("Its own declaration keys (/mesh-host/node/db-1/declaration/) are left"),
        "{said}"
    );
    // Never back, over longer than a status write's second and a presence renewal's third of
    // its TTL: the node can no longer write them.
    let back = wait_for(Duration::from_secs(5), || {
        has("/mesh-host/node/db-1/alive") || has("/mesh-host/node/db-1/status")
    });
    assert!(!back, "a revoked node wrote its keys back: {}", d.log());
    assert!(has("/mesh-host/node/db-1/declaration/db.json"), "its declaration is the operator's");
    let users = text(&as_root(&["user", "list"]));
    let roles = text(&as_root(&["role", "list"]));
    assert!(!users.contains("db-1") && !roles.contains("mesh-host-node-db-1"), "{users}{roles}");
    assert!(users.contains("web-1"), "web-1 untouched: {users}");
    let after = read_as(db, "/mesh-host/rollout/open/candidate/group/db/", true);
    assert!(!after.status.success(), "db-1 still logs in: {}", text(&after));
    // Nothing left of it to revoke: refused, saying so.
    let out = fleet(&s, &[&["revoke", "--etcd", &url], &root[..], &["--node", "db-1"]].concat());
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("etcd knows no node db-1 to revoke"), "{}", text(&out));
}
