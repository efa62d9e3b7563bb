//! etcd's auth, one scenario run over each way a node reaches etcd (in the clear, and over TLS
//! with client certificates): a node logged in as itself reads only its own groups and the
//! fleet's keys, writes only its own status, and a node named for another applies nothing of it.

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
                let url = etcd.tls_url();
                (etcd, url)
            }
        }
    }

    /// The words in the nodes' names and the passwords, as each scenario had them apart.
    fn words(self) -> (&'static str, &'static str) {
        match self {
            Transport::Plain => ("auth", "fleet"),
            Transport::Tls => ("tls", "tls"),
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
fn over_tls_with_etcds_auth_node_a_can_neither_read_bs_declaration_nor_write_bs_status() {
    only_its_own(Transport::Tls);
}

/// The scenario, over `t`.
fn only_its_own(t: Transport) {
    let s = Scratch::new();
    let (_etcd, url) = t.start(&s);
    let url = url.as_str();
    let (word, pw) = t.words();
    let secret = |name: &str, pw: &str| {
        let p = s.path(name);
        std::fs::write(&p, format!("{pw}\n")).unwrap();
        p.display().to_string()
    };
    let (root_secret, a_secret) = (format!("root-pw-{pw}"), format!("a-pw-{pw}"));
    let (root_pw, a_pw, b_pw) =
        (secret("root.pw", &root_secret), secret("a.pw", &a_secret), secret("b.pw", &format!("b-pw-{pw}")));
    let (a, b) = (format!("{word}-a"), format!("{word}-b"));
    let op = |args: &[&str]| t.etcdctl(url, "operator", args);
    assert!(op(&["user", "add", &format!("root:{root_secret}")]).status.success());
    assert!(op(&["auth", "enable"]).status.success());
    let operator = t.client("operator");
    let root: Vec<&str> =
        [&strs(&operator)[..], &["--etcd-user", "root", "--etcd-password-file", &root_pw]].concat();

    for (node, pw) in [(&a, &a_pw), (&b, &b_pw)] {
        let out = fleet(
            &s,
            &[
                &["grant", "--etcd", url],
                &root[..],
                &["--node", node, "--group", "g1", "--node-password-file", pw],
            ]
            .concat(),
        );
        assert!(out.status.success(), "fleet grant ({t}): {}", String::from_utf8_lossy(&out.stderr));
        assert!(String::from_utf8_lossy(&out.stdout).contains("mesh-host-node-"), "{out:?}");
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

    // Node A: its certificate for the connection (over TLS), its login for etcd's user. Its
    // declaration applies and its status is written.
    let a_client = t.client("node-a");
    let as_node_a: Vec<&str> =
        [&strs(&a_client)[..], &["--etcd-user", &a, "--etcd-password-file", &a_pw]].concat();
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

    // With A's certificate and login, etcd refuses B's declaration and B's status, a group A is
    // not in, and A's own declaration; A reads its own group and its own status.
    let a_login = format!("{a}:{a_secret}");
    let as_a = |args: &[&str]| t.etcdctl(url, "node-a", &[&["--user", &a_login], args].concat());
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

    if let Transport::Tls = t {
        // A certificate that names a user (a CN) is refused by etcd's JSON gateway while auth
        // is on: the message says so and what to do.
        let named = tls_args("named");
        let out = fleet(
            &s,
            &[
                &["status", "--etcd", url],
                &strs(&named)[..],
                &["--etcd-user", &a, "--etcd-password-file", &a_pw],
            ]
            .concat(),
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_ne!(out.status.code(), Some(0), "{stderr}");
        assert!(stderr.contains(url) && stderr.contains("without a CN"), "{stderr}");
    }
}
