//! etcd's auth, one scenario run over each way a node proves who it is (a password in the clear,
//! and over TLS the CN of its client certificate, with no password at all): a node reads only
//! its own groups and the fleet's keys, writes only its own status, and a node named for another
//! applies nothing of it. And a password login outliving its token.

use std::fmt;

use serde_json::json;

use super::*;
use crate::support::*;

/// How the test and its nodes reach the test's own etcd.
#[derive(Clone, Copy)]
enum Transport {
    /// In the clear.
    Plain,
    /// TLS only, every client showing a certificate signed by the testbed's CA.
    Tls,
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Transport::Plain => "plain",
            Transport::Tls => "TLS",
        })
    }
}

impl Transport {
    /// A member of the test's own, and its URL.
    fn start(self, s: &Scratch) -> (OwnEtcd, String) {
        match self {
            Transport::Plain => {
                let etcd = OwnEtcd::start(s);
                let url = etcd.url();
                (etcd, url)
            }
            Transport::Tls => {
                let etcd = OwnEtcd::start_tls(s);
                let url = etcd.url();
                (etcd, url)
            }
        }
    }

    /// The nodes' names (over TLS, the CNs of the testbed's node certificates, `node-a-cn.pem`
    /// and `node-b-cn.pem`) and the word in the passwords.
    fn names(self) -> (&'static str, &'static str, &'static str) {
        match self {
            Transport::Plain => ("auth-a", "auth-b", "fleet"),
            Transport::Tls => ("node-a", "node-b", "tls"),
        }
    }

    /// How a node proves it is `node`: its password in the clear; over TLS its certificate, whose
    /// CN is its name, and nothing else.
    fn node_args(self, node: &str, password_file: &str) -> Vec<String> {
        match self {
            Transport::Plain => ["--etcd-user", node, "--etcd-password-file", password_file]
                .into_iter()
                .map(str::to_owned)
                .collect(),
            Transport::Tls => tls_args(&format!("{node}-cn")),
        }
    }

    /// etcdctl as `who` (one of the testbed's client certificates); in the clear, as anyone.
    fn etcdctl(self, url: &str, who: &str, args: &[&str]) -> Output {
        match self {
            Transport::Plain => etcdctl(url, args),
            Transport::Tls => etcdctl_tls(url, who, args),
        }
    }

    /// mesh-host's options to connect as `who`: none in the clear.
    fn client(self, who: &str) -> Vec<String> {
        match self {
            Transport::Plain => Vec::new(),
            Transport::Tls => tls_args(who),
        }
    }
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn with_etcds_auth_on_a_node_reads_only_its_own_groups_and_the_fleets_keys_and_writes_only_its_own_status() {
    only_its_own(Transport::Plain);
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn over_tls_node_a_known_by_its_certificates_cn_can_neither_read_bs_declaration_nor_write_bs_status() {
    only_its_own(Transport::Tls);
}

/// The scenario, over `t`.
fn only_its_own(t: Transport) {
    let s = Scratch::new();
    let (_etcd, url) = t.start(&s);
    let url = url.as_str();
    let (a, b, pw) = t.names();
    let (a, b) = (a.to_owned(), b.to_owned());
    let secret = |name: &str, pw: &str| password_file(&s, name, pw);
    let (root_secret, a_secret) = (format!("root-pw-{pw}"), format!("a-pw-{pw}"));
    let (root_pw, a_pw, b_pw) =
        (secret("root.pw", &root_secret), secret("a.pw", &a_secret), secret("b.pw", &format!("b-pw-{pw}")));
    let op = |args: &[&str]| t.etcdctl(url, "operator", args);
    assert!(op(&["user", "add", &format!("root:{root_secret}")]).status.success());
    assert!(op(&["auth", "enable"]).status.success());
    let operator = t.client("operator");
    let root: Vec<&str> =
        [&strs(&operator)[..], &["--etcd-user", "root", "--etcd-password-file", &root_pw]].concat();

    for (node, pw) in [(&a, &a_pw), (&b, &b_pw)] {
        // Over TLS the node's user has no password: it is known by its certificate's CN.
        let password: &[&str] = match t {
            Transport::Plain => &["--node-password-file", pw],
            Transport::Tls => &[],
        };
        let out = fleet(
            &s,
            &[&["grant", "--etcd", url], &root[..], &["--node", node, "--group", "g1"], password].concat(),
        );
        assert!(out.status.success(), "fleet grant ({t}): {}", String::from_utf8_lossy(&out.stderr));
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(said.contains("mesh-host-node-"), "{out:?}");
        if let Transport::Tls = t {
            assert!(said.contains("without a password: known by its certificate's CN"), "{said}");
        }
    }
    let put = |scope: &[&str], name: &str, content: &str| {
        let file = s.path(&format!("in/{name}.json"));
        write_declaration(
            &file,
            json!([{"type": "file", "id": format!("{name}.f"), "path": s.p(name), "content": content}]),
        );
        let out = fleet(&s, &[&["put", "--etcd", url], &root[..], scope, &[file.to_str().unwrap()]].concat());
        assert!(out.status.success(), "fleet put as root ({t}): {}", String::from_utf8_lossy(&out.stderr));
    };
    put(&["--fleet"], "all", "fleet\n");
    put(&["--group", "g1"], "g1", "group\n");
    put(&["--node", &a], "a", "a\n");
    put(&["--node", &b], "b", "b\n");
    // A group neither node is in.
    put(&["--group", "g2"], "g2", "other group\n");

    // Node A: its password in the clear; over TLS its certificate alone, no user nor password.
    // Its declaration applies and its status is written.
    let a_args = t.node_args(&a, &a_pw);
    let as_node_a = strs(&a_args);
    let mut daemon = node_with(&s, url, &a, &["g1"], &as_node_a);
    for (name, content) in [("all", "fleet\n"), ("g1", "group\n"), ("a", "a\n")] {
        assert!(wait_for(PATIENCE, || read(&s.path(name)) == content), "{name} applied:\n{}", daemon.log());
    }
    assert!(!s.path("b").exists(), "B's declaration is not A's");
    assert!(!s.path("g2").exists(), "a group A is not in is not A's");
    let root_login = format!("root:{root_secret}");
    let as_root = |args: &[&str]| op(&[&["--user", &root_login], args].concat());
    let status_a = format!("/mesh-host/node/{a}/status");
    assert!(
        wait_for(PATIENCE, || !as_root(&["get", &status_a]).stdout.is_empty()),
        "node A wrote its status ({t}):\n{}",
        daemon.log()
    );
    assert!(!daemon.log().contains(&a_secret), "the password reached the log");
    assert_eq!(daemon.terminate(), Some(0), "{}", daemon.log());

    // As A (its login; over TLS its certificate alone), etcd refuses B's declaration and B's
    // status, a group A is not in, and A's own declaration; A reads its own group and status.
    let a_login = format!("{a}:{a_secret}");
    let as_a = |args: &[&str]| match t {
        Transport::Plain => t.etcdctl(url, "node-a", &[&["--user", &a_login], args].concat()),
        Transport::Tls => t.etcdctl(url, "node-a-cn", args),
    };
    let denied = |out: &Output| {
        !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("permission denied")
    };
    assert!(
        denied(&as_a(&["get", "--prefix", &format!("/mesh-host/node/{b}/declaration/")])),
        "A read B's declaration"
    );
    assert!(denied(&as_a(&["put", &format!("/mesh-host/node/{b}/status"), "{}"])), "A wrote B's status");
    assert!(
        denied(&as_a(&["get", "--prefix", "/mesh-host/group/g2/declaration/"])),
        "A read a group it is not in"
    );
    assert!(
        as_a(&["get", "--prefix", "/mesh-host/group/g1/declaration/"]).status.success(),
        "A reads its own group"
    );
    assert!(
        denied(&as_a(&["put", &format!("/mesh-host/node/{a}/declaration/x.json"), "{}"])),
        "A wrote its own declaration"
    );
    assert!(as_a(&["get", &status_a]).status.success(), "A reads its own status");

    // mesh-host run as A but named B: it cannot read B's keys, says so, and applies nothing of B's.
    let s2 = Scratch::new();
    let mut impostor = node_with(&s2, url, &b, &[], &as_node_a);
    assert!(
        wait_for(PATIENCE, || impostor.log().contains("permission denied")),
        "etcd's refusal is reported:\n{}",
        impostor.log()
    );
    assert!(!s.path("b").exists(), "nothing of B's applied");
    assert_eq!(impostor.terminate(), Some(0), "{}", impostor.log());
}

/// etcd's simple tokens expire `--auth-token-ttl` after their last use (300 s by default): a
/// node logged in by password logs in again when etcd says its token is no longer good, and
/// retries the call once (etcd-client#45 is the bug of a client that does not). Here the TTL is
/// 2 s, and the change is put after the node was idle for twice that.
#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn a_password_login_outlives_its_token_and_a_change_put_after_it_expired_is_applied() {
    let s = Scratch::new();
    let etcd = OwnEtcd::start_with(&s, false, &["--auth-token-ttl", "2"]);
    let url = etcd.url();
    let secret = |name: &str, pw: &str| password_file(&s, name, pw);
    let (root_pw, node_pw) = (secret("root.pw", "root-pw-ttl"), secret("node.pw", "node-pw-ttl"));
    assert!(etcdctl(&url, &["user", "add", "root:root-pw-ttl"]).status.success());
    assert!(etcdctl(&url, &["auth", "enable"]).status.success());
    let root = ["--etcd-user", "root", "--etcd-password-file", root_pw.as_str()];
    let name = "ttl-a";
    let out = fleet(
        &s,
        &[&["grant", "--etcd", &url], &root[..], &["--node", name, "--node-password-file", &node_pw]]
            .concat(),
    );
    assert!(out.status.success(), "fleet grant: {}", String::from_utf8_lossy(&out.stderr));
    let conf = s.path("ttl.conf");
    let declare = |content: &str| {
        write_declaration(
            &s.path("in/ttl.json"),
            json!([{"type": "file", "id": "ttl.conf", "path": s.p("ttl.conf"), "content": content}]),
        );
        let out = fleet(
            &s,
            &[&["put", "--etcd", &url], &root[..], &["--fleet", s.p("in/ttl.json").as_str()]].concat(),
        );
        assert!(out.status.success(), "fleet put: {}", String::from_utf8_lossy(&out.stderr));
    };
    declare("v1\n");
    let login = ["--etcd-user", name, "--etcd-password-file", node_pw.as_str()];
    let mut daemon = node_with(&s, &url, name, &[], &login);
    assert!(wait_for(PATIENCE, || read(&conf) == "v1\n"), "applied:\n{}", daemon.log());
    let status = format!("/mesh-host/node/{name}/status");
    let written = || {
        let out = etcdctl(&url, &["--user", "root:root-pw-ttl", "get", &status, "--print-value-only"]);
        let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        (status["converged"] == true).then(|| status["revision"].as_i64()).flatten()
    };
    assert!(wait_for(PATIENCE, || written().is_some()), "the status written:\n{}", daemon.log());
    let v1 = written();
    // Then the node is idle, and nothing it sends while idle carries the token (etcd 3.4 does
    // not check a lease's renewal): 5 s idle is more than twice the TTL.
    std::thread::sleep(Duration::from_secs(5));
    declare("v2\n");
    assert!(
        wait_for(PATIENCE, || read(&conf) == "v2\n"),
        "a change after the token expired:\n{}",
        daemon.log()
    );
    assert!(
        daemon.log().contains("no longer takes the token of the last login"),
        "the first token expired and the node logged in again:\n{}",
        daemon.log()
    );
    // And its status, written with a token of a later login.
    assert!(wait_for(PATIENCE, || written() > v1), "the status of v2 written:\n{}", daemon.log());
    assert!(!daemon.log().contains("node-pw-ttl"), "the password reached the log");
    assert_eq!(daemon.terminate(), Some(0), "{}", daemon.log());
}
