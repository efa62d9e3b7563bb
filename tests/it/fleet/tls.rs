//! TLS alone: a node converging over client certificates, and what is refused saying why.

use super::*;
use crate::support::*;

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn over_tls_with_client_certificates_a_node_converges_from_etcd_and_reports_its_status() {
    let etcd = need_tls_etcd();
    let s = Scratch::new();
    let name = unique("tls");
    let operator = tls_args("operator");
    let conf = s.path("tls.conf");
    let declare = |content: &str| {
        write_declaration(
            &s.path("in/tls.json"),
            json!([{"type": "file", "id": "tls.conf", "path": s.p("tls.conf"), "content": content}]),
        );
        let out = fleet(
            &s,
            &[
                &["put", "--etcd", etcd],
                &strs(&operator)[..],
                &["--node", &name, s.p("in/tls.json").as_str()],
            ]
            .concat(),
        );
        assert!(out.status.success(), "fleet put over TLS: {}", String::from_utf8_lossy(&out.stderr));
    };
    declare("v1\n");
    let mut daemon = node_with(&s, etcd, &name, &[], &strs(&tls_args("node-a")));
    assert!(wait_for(PATIENCE, || read(&conf) == "v1\n"), "applied over TLS:\n{}", daemon.log());
    // The watch is over TLS too: a change is followed.
    declare("v2\n");
    assert!(wait_for(PATIENCE, || read(&conf) == "v2\n"), "followed over TLS:\n{}", daemon.log());
    let status_key = format!("/mesh-host/node/{name}/status");
    assert!(
        wait_for(PATIENCE, || {
            let out = etcdctl_tls(etcd, "operator", &["get", &status_key, "--print-value-only"]);
            String::from_utf8_lossy(&out.stdout).contains("\"converged\":true")
        }),
        "the status went back over TLS:\n{}",
        daemon.log()
    );
    assert_eq!(daemon.terminate(), Some(0), "{}", daemon.log());
    etcdctl_tls(etcd, "operator", &["del", "--prefix", &format!("/mesh-host/node/{name}/")]);
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
#[allow(clippy::disallowed_methods, reason = "the test makes a key file others can read")]
fn over_tls_a_wrong_ca_a_missing_client_certificate_and_an_exposed_key_are_refused_saying_why() {
    let etcd = need_tls_etcd();
    let s = Scratch::new();
    let name = unique("tls-refused");
    write_declaration(&s.path("in/x.json"), json!([]));
    let put = |tls: &[&str]| {
        fleet(&s, &[&["put", "--etcd", etcd], tls, &["--node", &name, s.p("in/x.json").as_str()]].concat())
    };
    let (ca, cert, key) = (tls_file("ca.pem"), tls_file("operator.pem"), tls_file("operator.key"));

    // etcd's certificate checked against a CA that did not sign it: refused, naming the endpoint.
    let out = put(&["--etcd-ca", &tls_file("other-ca.pem"), "--etcd-cert", &cert, "--etcd-key", &key]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(etcd) && stderr.contains("invalid peer certificate: UnknownIssuer"), "{stderr}");
    assert!(stderr.contains("--etcd-ca"), "the hint names the option: {stderr}");

    // No client certificate: etcd refuses the connection (under TLS 1.3 just after the
    // handshake, so its alert's words do not always reach the client), and the message says
    // that etcd asked for a certificate and what to give. Several times: it must not depend on
    // which of the two the client saw first.
    for _ in 0..5 {
        let out = put(&["--etcd-ca", &ca]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains(etcd), "{stderr}");
        assert!(
            stderr.contains(
                "etcd asked for a client certificate and mesh-host has none: give --etcd-cert and --etcd-key"
            ),
            "{stderr}"
        );
    }

    // An https:// endpoint without a CA: refused before anything is sent (exit 2).
    let out = put(&[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("need --etcd-ca"), "{stderr}");

    // A key others can read is refused, as the sealing key is.
    let exposed = s.path("exposed.key");
    std::fs::copy(&key, &exposed).unwrap();
    std::fs::set_permissions(&exposed, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let out = put(&["--etcd-ca", &ca, "--etcd-cert", &cert, "--etcd-key", exposed.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("readable by others than its owner (mode 0644)"), "{stderr}");

    assert!(
        etcdctl_tls(etcd, "operator", &["get", "--prefix", &format!("/mesh-host/node/{name}/")])
            .stdout
            .is_empty(),
        "nothing was written"
    );

    // A node with the wrong CA never reads anything, and says why in its log.
    let wrong = ["--etcd-ca", &tls_file("other-ca.pem"), "--etcd-cert", &cert, "--etcd-key", &key];
    let mut daemon = node_with(&s, etcd, &name, &[], &wrong);
    assert!(
        wait_for(PATIENCE, || daemon.log().contains("UnknownIssuer")),
        "the node's log says what TLS said:\n{}",
        daemon.log()
    );
    assert_eq!(daemon.terminate(), Some(0), "{}", daemon.log());
}
