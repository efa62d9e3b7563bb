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

/// A certificate and its key made by a CA of the test's own, which etcd does not trust: what a
/// node's certificate revoked (or replaced by a stranger's) looks like to etcd. CN=node-a.
fn stranger_certificate(s: &Scratch) -> (PathBuf, PathBuf) {
    let openssl = |args: &[&str]| {
        let out = Command::new("openssl").args(args).current_dir(s.path("")).output().expect("openssl runs");
        assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    let ec = ["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"];
    openssl(&[&["genpkey"], &ec[..], &["-out", "stranger-ca.key"]].concat());
    openssl(&[
        "req",
        "-x509",
        "-new",
        "-key",
        "stranger-ca.key",
        "-subj",
        "/CN=stranger CA",
        "-days",
        "1",
        "-out",
        "stranger-ca.pem",
    ]);
    openssl(&[&["genpkey"], &ec[..], &["-out", "stranger.key"]].concat());
    openssl(&["req", "-new", "-key", "stranger.key", "-subj", "/CN=node-a", "-out", "stranger.csr"]);
    std::fs::write(s.path("stranger.ext"), "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n")
        .unwrap();
    openssl(&[
        "x509",
        "-req",
        "-in",
        "stranger.csr",
        "-CA",
        "stranger-ca.pem",
        "-CAkey",
        "stranger-ca.key",
        "-CAcreateserial",
        "-days",
        "1",
        "-extfile",
        "stranger.ext",
        "-out",
        "stranger.pem",
    ]);
    let key = s.path("stranger.key");
    std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    (s.path("stranger.pem"), key)
}

/// A node's certificate revoked under it (replaced in place by one etcd does not trust) while
/// etcd restarts: the node says so in its log and in `mesh_host_etcd_certificate_refused`, goes
/// on converging on its cache, and once a good certificate is written in place it reads etcd
/// again and applies what changed meanwhile, without a restart: the key and certificate are read
/// again at every connection.
#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
#[allow(clippy::disallowed_methods, reason = "the test writes the node's certificate files in place")]
fn a_certificate_revoked_under_a_running_node_is_said_and_a_new_one_written_in_place_is_taken_without_a_restart(
) {
    let s = Scratch::new();
    let mut etcd = OwnEtcd::start_tls(&s);
    let url = etcd.url();
    let (cert, key) = (s.path("node.pem"), s.path("node.key"));
    let good = || {
        std::fs::copy(tls_file("node-a.pem"), &cert).unwrap();
        std::fs::copy(tls_file("node-a.key"), &key).unwrap();
    };
    good();
    let conf = s.path("rev.conf");
    let operator = tls_args("operator");
    let declare = |content: &str| {
        write_declaration(
            &s.path("in/rev.json"),
            json!([{"type": "file", "id": "rev.conf", "path": s.p("rev.conf"), "content": content}]),
        );
        let out = fleet(
            &s,
            &[&["put", "--etcd", &url], &strs(&operator)[..], &["--fleet", s.p("in/rev.json").as_str()]]
                .concat(),
        );
        assert!(out.status.success(), "fleet put: {}", String::from_utf8_lossy(&out.stderr));
    };
    declare("v1\n");
    let args = [
        "--etcd-ca",
        &tls_file("ca.pem"),
        "--etcd-cert",
        cert.to_str().unwrap(),
        "--etcd-key",
        key.to_str().unwrap(),
    ];
    let mut daemon = node_with(&s, &url, "node-a", &[], &args);
    assert!(wait_for(PATIENCE, || read(&conf) == "v1\n"), "applied:\n{}", daemon.log());
    assert_eq!(daemon.metric("mesh_host_etcd_certificate_refused"), 0.0, "{}", daemon.log());

    // Revoked: the files hold a stranger's certificate, and etcd restarts, so the node dials
    // again.
    let (stranger, stranger_key) = stranger_certificate(&s);
    std::fs::copy(&stranger, &cert).unwrap();
    std::fs::copy(&stranger_key, &key).unwrap();
    etcd.stop();
    etcd.resume();
    assert!(
        wait_for(Duration::from_secs(30), || daemon.metric("mesh_host_etcd_certificate_refused") == 1.0),
        "the metric says etcd refuses the certificate:\n{}",
        daemon.log()
    );
    assert!(daemon.log().contains("etcd refused the client certificate of --etcd-cert"), "{}", daemon.log());
    assert_eq!(daemon.metric("mesh_host_etcd_up"), 0.0);
    // Meanwhile: a change the node cannot read, and the node converging on its cache.
    declare("v2\n");
    std::fs::write(&conf, "hand-edit\n").unwrap();
    assert!(wait_for(PATIENCE, || read(&conf) == "v1\n"), "converges on its cache:\n{}", daemon.log());

    // A good certificate written in place: taken at the next connection, no restart.
    good();
    assert!(
        wait_for(Duration::from_secs(40), || read(&conf) == "v2\n"),
        "the node took the new certificate and applied what changed:\n{}",
        daemon.log()
    );
    assert_eq!(daemon.metric("mesh_host_etcd_certificate_refused"), 0.0, "{}", daemon.log());
    assert_eq!(daemon.terminate(), Some(0), "{}", daemon.log());
}
