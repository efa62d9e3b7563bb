//! Signed declarations from etcd (issue 44, the fleet): `fleet put --sign`, `fleet sign` and
//! `fleet rollout start --sign` against a real etcd member of the test's own, and a real agent
//! run with `--allowed-signers`. Each forgery (a key overwritten with etcdctl, a scope written
//! unsigned, a key the node does not trust, another scope's signed keys, the whole prefix of an
//! older signed declaration restored, an expired manifest, an unsigned candidate, a threshold of
//! two met by one key twice) is refused with the reason in the node's status and its metric, and
//! nothing of the node touched: its managed files, its cache, its marks. A planted private key
//! is searched for in every output.

use std::process::Stdio;

use serde_json::Value;

use super::*;
use crate::signed::{allowed, keypair, seed_of, text, tree, Tree};

/// The node's status in etcd, as JSON (`Null` before it wrote one).
pub(super) fn status(url: &str, node: &str) -> Value {
    let out = etcdctl(url, &["get", &format!("/mesh-host/node/{node}/status"), "--print-value-only"]);
    serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
}

/// Every key and value under `prefix`, decoded.
pub(super) fn dump(url: &str, prefix: &str) -> Vec<(String, Vec<u8>)> {
    use base64::Engine as _;
    let out = etcdctl(url, &["get", "--prefix", prefix, "-w", "json"]);
    let got: Value = serde_json::from_slice(&out.stdout).unwrap();
    let b64 = |v: &Value| base64::engine::general_purpose::STANDARD.decode(v.as_str().unwrap()).unwrap();
    got["kvs"]
        .as_array()
        .map(|kvs| {
            kvs.iter().map(|kv| (String::from_utf8(b64(&kv["key"])).unwrap(), b64(&kv["value"]))).collect()
        })
        .unwrap_or_default()
}

/// Writes one key with etcdctl, as anyone holding an etcd credential could.
fn raw_put(url: &str, key: &str, value: &[u8]) {
    let out = etcdctl(url, &["put", key, "--", std::str::from_utf8(value).unwrap()]);
    assert!(out.status.success(), "etcdctl put: {}", text(&out));
}

/// Makes `to` hold exactly `kvs` (keys under `from`, moved under `to`), as a restore would.
fn restore(url: &str, from: &str, to: &str, kvs: &[(String, Vec<u8>)]) {
    assert!(etcdctl(url, &["del", "--prefix", to]).status.success());
    for (key, value) in kvs {
        raw_put(url, &format!("{to}{}", key.strip_prefix(from).unwrap()), value);
    }
}

/// What a refusal must leave as it was: the managed files, and the node's cache and marks.
pub(super) fn untouched(s: &Scratch) -> (Tree, Tree) {
    let kept = tree(&s.path("state"))
        .into_iter()
        .filter(|(p, _)| {
            let p = p.to_string_lossy();
            p.contains("/fleet/declaration.d/") || p.contains("/trust/")
        })
        .collect();
    (tree(&s.path("out")), kept)
}

/// Waits for the node's status to carry a refusal for `reason` that says `says`; asserts nothing
/// was touched since `before`. Returns the refusal's message.
pub(super) fn refused_with(
    s: &Scratch,
    url: &str,
    d: &Daemon,
    reason: &str,
    says: &str,
    before: &(Tree, Tree),
) -> String {
    let seen = wait_for(PATIENCE, || {
        let st = status(url, "web-1");
        st["refused_reason"] == reason && st["refused"].as_str().is_some_and(|m| m.contains(says))
    });
    let st = status(url, "web-1");
    assert!(seen, "want a refusal ({reason}) saying {says:?}; status: {st:#}\n{}", d.log());
    // The node settles on it: a pass it could have started would show by now.
    std::thread::sleep(Duration::from_millis(300));
    assert!(untouched(s) == *before, "a refused declaration touched the node: {st:#}");
    let message = st["refused"].as_str().unwrap().to_owned();
    assert!(message.contains(&format!("refused ({reason})")), "{message}");
    assert!(d.log().contains("signed declaration refused") && d.log().contains(&message), "logged");
    assert!(
        d.metric(&format!("mesh_host_declaration_refusals_total{{reason=\"{reason}\"}}")) >= 1.0,
        "counted by reason"
    );
    message
}

/// The one declaration file the tests put: `out/motd` with `content`.
pub(super) fn motd(s: &Scratch, content: &str) -> String {
    let path = s.path("in/base.json");
    write_declaration(
        &path,
        json!([{"type": "file", "id": "motd", "path": s.p("out/motd"), "content": content}]),
    );
    path.display().to_string()
}

pub(super) fn signed_put(
    s: &Scratch,
    url: &str,
    scope: &[&str],
    file: &str,
    keys: &[&Path],
    more: &[&str],
) -> Output {
    let mut args: Vec<String> = ["put", "--etcd", url].iter().map(|a| a.to_string()).collect();
    args.extend(scope.iter().map(|a| a.to_string()));
    for k in keys {
        args.extend(["--sign".to_owned(), k.display().to_string()]);
    }
    args.extend(more.iter().map(|a| a.to_string()));
    args.push(file.to_owned());
    let out = fleet(s, &strs(&args));
    assert!(out.status.success(), "fleet put: {}", text(&out));
    out
}

fn signed_node(s: &Scratch, url: &str, signers: &Path, more: &[&str]) -> Daemon {
    let args = [&["--allowed-signers", signers.to_str().unwrap(), "--fleet-name", "prod"][..], more].concat();
    node_with(s, url, "web-1", &[], &args)
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn a_node_applies_only_what_trusted_keys_signed_for_it_and_refuses_every_forgery_touching_nothing() {
    let s = Scratch::new();
    let etcd = OwnEtcd::start(&s);
    let url = etcd.url();
    let (alice, bob, mallory) = (keypair(&s, "alice"), keypair(&s, "bob"), keypair(&s, "mallory"));
    let signers = allowed(&s, &[&alice, &bob]);
    let fleet_prefix = "/mesh-host/fleet/declaration/";
    let own = "/mesh-host/node/web-1/declaration/";
    let conf = s.path("out/motd");
    let mut said: Vec<Output> = Vec::new();
    let name = ["--fleet-name", "prod"];

    // Signed, applied; the put says what it signed.
    let file = motd(&s, "one\n");
    let out = signed_put(&s, &url, &["--fleet"], &file, &[&alice], &name);
    assert!(text(&out).contains("version 1") && text(&out).contains("signed: fleet prod"), "{}", text(&out));
    said.push(out);
    let v1 = dump(&url, fleet_prefix);
    assert_eq!(v1.len(), 3, "the file, the manifest and one signature: {v1:?}");
    let d = signed_node(&s, &url, &signers, &[]);
    assert!(wait_for(PATIENCE, || read(&conf) == "one\n"), "the signed put applied:\n{}", d.log());
    assert!(read(&s.path("state/trust/fleet")).starts_with("version 1\n"), "the mark is kept");
    // Put again as it is: nothing written.
    let out = signed_put(&s, &url, &["--fleet"], &file, &[&alice], &name);
    assert!(text(&out).contains("already holds exactly this, signed at version 1"), "{}", text(&out));
    said.push(out);

    // A declaration key overwritten with etcdctl: its bytes are not what was signed.
    let before = untouched(&s);
    let evil = r#"{"version": 1, "resources": [{"type": "file", "id": "motd", "path": "/tmp/x", "content": "evil"}]}"#;
    raw_put(&url, &format!("{fleet_prefix}base.json"), evil.as_bytes());
    refused_with(&s, &url, &d, "contents", "file base.json is", &before);

    // The scope put unsigned (its manifest and signatures go with the put).
    let file = motd(&s, "unsigned\n");
    let out = fleet(&s, &["put", "--etcd", &url, "--fleet", &file]);
    assert!(out.status.success(), "{}", text(&out));
    said.push(out);
    refused_with(&s, &url, &d, "signature", "holds no signed manifest", &before);

    // Signed by a key the node does not trust.
    let file = motd(&s, "mallory\n");
    said.push(signed_put(
        &s,
        &url,
        &["--fleet"],
        &file,
        &[&mallory],
        &[&name[..], &["--version", "7"]].concat(),
    ));
    refused_with(&s, &url, &d, "signature", "which the allowed signers do not list", &before);

    // Signed again by alice: version 8, above mallory's 7 that etcd held.
    let file = motd(&s, "two\n");
    said.push(signed_put(&s, &url, &["--fleet"], &file, &[&alice], &name));
    assert!(wait_for(PATIENCE, || read(&conf) == "two\n"), "v8 applied:\n{}", d.log());
    assert!(wait_for(PATIENCE, || status(&url, "web-1")["refused"].is_null()), "the refusal cleared");
    assert!(read(&s.path("state/trust/fleet")).starts_with("version 8\n"));

    // Another scope's signed keys, copied under this node's: signed, but for node web-2.
    let other = s.path("in/web-2.json");
    write_declaration(&other, json!([{"type": "file", "id": "w2", "path": s.p("out/w2"), "content": "2"}]));
    said.push(signed_put(&s, &url, &["--node", "web-2"], other.to_str().unwrap(), &[&alice], &name));
    let before = untouched(&s);
    let web2 = dump(&url, "/mesh-host/node/web-2/declaration/");
    restore(&url, "/mesh-host/node/web-2/declaration/", own, &web2);
    refused_with(&s, &url, &d, "scope", "is for the node web-2 declaration", &before);
    assert!(etcdctl(&url, &["del", "--prefix", own]).status.success());
    assert!(wait_for(PATIENCE, || status(&url, "web-1")["refused"].is_null()), "{}", d.log());

    // The whole prefix of version 1 restored (an etcd restore, or a replay).
    let before = untouched(&s);
    restore(&url, fleet_prefix, fleet_prefix, &v1);
    refused_with(&s, &url, &d, "rollback", "version 1 is below version 8", &before);

    // Signed for another fleet.
    let file = motd(&s, "staging\n");
    said.push(signed_put(
        &s,
        &url,
        &["--fleet"],
        &file,
        &[&alice],
        &["--fleet-name", "staging", "--version", "20"],
    ));
    refused_with(&s, &url, &d, "scope", "fleet staging", &before);

    // Expired before the node first saw it: the node is down while it expires.
    drop(d);
    let file = motd(&s, "late\n");
    said.push(signed_put(
        &s,
        &url,
        &["--fleet"],
        &file,
        &[&alice],
        &[&name[..], &["--expires", "1s"]].concat(),
    ));
    let manifest = dump(&url, "/mesh-host/fleet/declaration/.mesh-host/manifest");
    let expires: u64 = String::from_utf8_lossy(&manifest[0].1)
        .lines()
        .find_map(|l| l.strip_prefix("expires ").map(|e| e.parse().unwrap()))
        .unwrap();
    let now = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    assert!(wait_for(PATIENCE, || now() > expires), "the manifest expired");
    let before = untouched(&s);
    let d = signed_node(&s, &url, &signers, &[]);
    refused_with(&s, &url, &d, "expired", "expired at", &before);
    assert_eq!(read(&conf), "two\n", "the declaration in force stays");
    drop(d);

    // A threshold of two: one key signing twice counts once; a second operator's `fleet sign`
    // meets it.
    let d = signed_node(&s, &url, &signers, &["--signatures-required", "2"]);
    let file = motd(&s, "three\n");
    said.push(signed_put(&s, &url, &["--fleet"], &file, &[&alice, &alice], &name));
    refused_with(&s, &url, &d, "signature", "one key counts once", &before);
    let out = fleet(&s, &["sign", "--etcd", &url, "--fleet", "--sign", bob.to_str().unwrap()]);
    assert!(out.status.success(), "fleet sign: {}", text(&out));
    assert!(text(&out).contains("3 signature(s) in all"), "{}", text(&out));
    said.push(out);
    assert!(wait_for(PATIENCE, || read(&conf) == "three\n"), "two distinct keys:\n{}", d.log());
    assert!(wait_for(PATIENCE, || status(&url, "web-1")["refused"].is_null()), "{}", d.log());
    // `fleet sign` over files that no longer match their manifest signs nothing.
    raw_put(&url, &format!("{fleet_prefix}base.json"), evil.as_bytes());
    let out = fleet(&s, &["sign", "--etcd", &url, "--fleet", "--sign", bob.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("does not match the keys in etcd") && text(&out).contains("nothing was signed")
    );
    said.push(out);
    said.push(fleet(&s, &["status", "--etcd", &url]));
    let metrics = d.get("/metrics").unwrap_or_default();
    let log = format!("{}{metrics}", d.log());
    drop(d);

    // The planted key: in none of the commands' outputs, the node's log, etcd, or the state.
    let mut outputs: Vec<(String, Vec<u8>)> =
        said.iter().enumerate().map(|(i, o)| (format!("command {i}"), text(o).into_bytes())).collect();
    outputs.push(("the node's log".into(), log.into_bytes()));
    outputs.extend(dump(&url, "/"));
    outputs.extend(tree(&s.path("state")).into_iter().map(|(p, (b, _, _))| (p.display().to_string(), b)));
    needles_nowhere(&alice, &outputs);
}

/// The private key `key` (its seed, and every line of its file's armor) is in none of `outputs`.
pub(super) fn needles_nowhere(key: &Path, outputs: &[(String, Vec<u8>)]) {
    use base64::Engine as _;
    let seed = seed_of(key);
    let pem = std::fs::read_to_string(key).unwrap();
    let mut needles = vec![
        seed.clone(),
        seed.iter().map(|b| format!("{b:02x}")).collect::<String>().into_bytes(),
        base64::engine::general_purpose::STANDARD.encode(&seed).into_bytes(),
    ];
    needles.extend(
        pem.lines().filter(|l| !l.starts_with("-----") && l.len() >= 16).map(|l| l.as_bytes().to_vec()),
    );
    // The search finds the key where it is (its file's armor, the seed in what it decodes to),
    // so finding it nowhere else means something.
    let found = |bytes: &[u8], needle: &[u8]| bytes.windows(needle.len()).any(|w| w == needle);
    assert!(needles.len() > 3 && needles[3..].iter().all(|n| found(pem.as_bytes(), n)));
    let decoded: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    let decoded = base64::engine::general_purpose::STANDARD.decode(decoded).unwrap();
    assert!(found(&decoded, &needles[0]), "the seed is found in the key it came from");
    assert!(!outputs.is_empty());
    for (name, bytes) in outputs {
        for needle in &needles {
            assert!(
                !bytes.windows(needle.len()).any(|w| w == needle.as_slice()),
                "the private key is in {name}"
            );
        }
    }
}

/// `fleet rollout start` in the background (it drives the rollout until it ends).
fn start_rollout(s: &Scratch, url: &str, file: &str, more: &[&str]) -> std::process::Child {
    Command::new(assert_cmd::cargo::cargo_bin("mesh-host"))
        .arg("--state")
        .arg(s.path("operator-state"))
        .args(["fleet", "rollout", "start", "--etcd", url, "--fleet", "--waves", "100%", "--soak", "1"])
        .args(more)
        .arg(file)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn a_signed_candidate_is_taken_an_unsigned_one_refused_and_abort_and_promote_are_no_rollbacks() {
    let s = Scratch::new();
    let etcd = OwnEtcd::start(&s);
    let url = etcd.url();
    let alice = keypair(&s, "alice");
    let signers = allowed(&s, &[&alice]);
    let conf = s.path("out/motd");
    let name = ["--fleet-name", "prod"];
    let file = motd(&s, "one\n");
    signed_put(&s, &url, &["--fleet"], &file, &[&alice], &name);
    let d = signed_node(&s, &url, &signers, &[]);
    assert!(wait_for(PATIENCE, || read(&conf) == "one\n"), "{}", d.log());
    assert!(wait_for(PATIENCE, || status(&url, "web-1")["converged"] == true));
    // A rollout plans over live nodes: its presence key can come a second after its status.
    assert!(
        wait_for(PATIENCE, || !keys_under(&url, "/mesh-host/node/web-1/alive").is_empty()),
        "{}",
        d.log()
    );
    let mut said: Vec<Output> = Vec::new();

    // An unsigned candidate: the admitted node refuses it; the rollout halts at its deadline.
    let before = untouched(&s);
    let file = motd(&s, "unsigned candidate\n");
    let mut driver = start_rollout(&s, &url, &file, &["--deadline", "3"]);
    // A driver process to start, plan and admit, then the node to read: given longer than one
    // PATIENCE on a loaded machine, and when it never comes, the driver's word is the clue.
    if !wait_for(3 * PATIENCE, || status(&url, "web-1")["refused_reason"] == "signature") {
        let _ = driver.kill();
        let out = driver.wait_with_output().unwrap();
        panic!("the unsigned candidate was never refused; the driver said:\n{}\n{}", text(&out), d.log());
    }
    refused_with(&s, &url, &d, "signature", "candidate", &before);
    let out = driver.wait_with_output().unwrap();
    assert!(!out.status.success(), "halted: {}", text(&out));
    said.push(out);
    let out = fleet(&s, &["rollout", "abort", "--etcd", &url]);
    assert!(out.status.success(), "{}", text(&out));
    said.push(out);
    assert!(wait_for(PATIENCE, || status(&url, "web-1")["refused"].is_null()), "{}", d.log());
    assert_eq!(read(&conf), "one\n");

    // A signed candidate: taken, then aborted: back to version 1, which is no rollback.
    let file = motd(&s, "candidate\n");
    let driver = start_rollout(&s, &url, &file, &["--sign", alice.to_str().unwrap(), "--fleet-name", "prod"]);
    assert!(wait_for(PATIENCE, || read(&conf) == "candidate\n"), "the signed candidate:\n{}", d.log());
    let out = driver.wait_with_output().unwrap();
    assert!(out.status.success(), "every wave passed: {}", text(&out));
    assert!(text(&out).contains("version 2"), "{}", text(&out));
    assert!(read(&s.path("state/trust/candidate.fleet")).starts_with("version 2\n"));
    said.push(out);
    let out = fleet(&s, &["rollout", "abort", "--etcd", &url]);
    assert!(out.status.success(), "{}", text(&out));
    said.push(out);
    assert!(wait_for(PATIENCE, || read(&conf) == "one\n"), "back to the declaration in force:\n{}", d.log());
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        status(&url, "web-1")["refused"].is_null(),
        "an abort is no rollback: {:#}",
        status(&url, "web-1")
    );

    // Another, promoted: the scope then holds the manifest signed for it, version 3.
    let file = motd(&s, "promoted\n");
    let driver = start_rollout(&s, &url, &file, &["--sign", alice.to_str().unwrap(), "--fleet-name", "prod"]);
    let out = driver.wait_with_output().unwrap();
    assert!(out.status.success() && text(&out).contains("version 3"), "{}", text(&out));
    assert_eq!(read(&conf), "promoted\n");
    said.push(out);
    let out = fleet(&s, &["rollout", "promote", "--etcd", &url]);
    assert!(out.status.success(), "{}", text(&out));
    said.push(out);
    let manifest = dump(&url, "/mesh-host/fleet/declaration/.mesh-host/manifest");
    assert!(
        String::from_utf8_lossy(&manifest[0].1).contains("scope fleet\nversion 3\n"),
        "{:?}",
        String::from_utf8_lossy(&manifest[0].1)
    );
    assert!(
        wait_for(PATIENCE, || read(&s.path("state/trust/fleet")).starts_with("version 3\n")),
        "{}",
        d.log()
    );
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        status(&url, "web-1")["refused"].is_null(),
        "a promote is no rollback: {:#}",
        status(&url, "web-1")
    );
    assert_eq!(read(&conf), "promoted\n");
    said.push(fleet(&s, &["rollout", "status", "--etcd", &url]));
    // The planted key: in none of the drivers' and commands' outputs, the node's log and
    // metrics, etcd (the candidates' keys are gone with the rollout; the scope's remain), or
    // the state.
    let mut outputs: Vec<(String, Vec<u8>)> =
        said.iter().enumerate().map(|(i, o)| (format!("command {i}"), text(o).into_bytes())).collect();
    outputs.push(("the node's log".into(), d.log().into_bytes()));
    outputs.push(("the node's metrics".into(), d.get("/metrics").unwrap_or_default().into_bytes()));
    outputs.extend(dump(&url, "/"));
    outputs.extend(tree(&s.path("state")).into_iter().map(|(p, (b, _, _))| (p.display().to_string(), b)));
    needles_nowhere(&alice, &outputs);
}

/// Issue 44, point 3: a manifest in force keeps being enforced after it expires, and the node
/// says so: `/healthz` (healthy, with a note), the gauge of its expiry, and who signed what is
/// in force, in its status and in `fleet status`.
#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn a_manifest_in_force_is_enforced_past_its_expiry_and_healthz_the_gauge_and_fleet_status_say_so() {
    let s = Scratch::new();
    let etcd = OwnEtcd::start(&s);
    let url = etcd.url();
    let alice = keypair(&s, "alice");
    let signers = allowed(&s, &[&alice]);
    let conf = s.path("out/motd");
    let file = motd(&s, "one\n");
    signed_put(&s, &url, &["--fleet"], &file, &[&alice], &["--fleet-name", "prod", "--expires", "6s"]);
    let manifest = dump(&url, "/mesh-host/fleet/declaration/.mesh-host/manifest");
    let expires: u64 = String::from_utf8_lossy(&manifest[0].1)
        .lines()
        .find_map(|l| l.strip_prefix("expires ").map(|e| e.parse().unwrap()))
        .unwrap();
    let d = signed_node(&s, &url, &signers, &[]);
    assert!(wait_for(PATIENCE, || read(&conf) == "one\n"), "{}", d.log());
    assert!(
        wait_for(PATIENCE, || d.metric("mesh_host_declaration_expires_timestamp_seconds{scope=\"fleet\"}")
            == expires as f64),
        "the gauge says when it expires ({expires}):\n{}",
        d.get("/metrics").unwrap_or_default()
    );
    assert!(wait_for(PATIENCE, || !status(&url, "web-1")["signed"].is_null()), "{}", d.log());
    let st = status(&url, "web-1");
    let signed = &st["signed"][0];
    assert_eq!((signed["scope"].as_str(), signed["version"].as_u64()), (Some("fleet"), Some(1)), "{st:#}");
    let by = signed["signed_by"][0].as_str().unwrap_or_default().to_owned();
    assert!(by.contains("alice@example.com") && by.contains("SHA256:"), "who signed it: {st:#}");
    let (code, body) = d.answer("/healthz").unwrap();
    assert!(code == 200 && !body.contains("expir"), "not expired yet: {code} {body}");

    let now = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    assert!(wait_for(PATIENCE, || now() > expires + 1), "the manifest expired");
    let (code, body) = d.answer("/healthz").unwrap();
    assert_eq!(code, 200, "enforcing it is the node doing its job: {body}");
    // Its lead only, to a caller who did not log in (`/healthz` tells the rest to one who did).
    assert!(body.contains("signed declaration in force past its expiry, still enforced"), "{body}");
    // Still enforced: a hand edit is put back.
    std::fs::write(&conf, "edited\n").unwrap();
    assert!(wait_for(PATIENCE, || read(&conf) == "one\n"), "enforced past its expiry:\n{}", d.log());
    let out = fleet(&s, &["status", "--etcd", &url]);
    let table = text(&out);
    assert!(
        table.contains(&format!("web-1: signed: fleet version 1 by {by} (EXPIRED, still enforced)")),
        "{table}"
    );
    let json = fleet(&s, &["status", "--etcd", &url, "--json"]);
    let mut outputs =
        vec![("fleet status".to_owned(), table.into_bytes()), ("--json".into(), text(&json).into_bytes())];
    outputs.push(("/healthz".into(), d.answer("/healthz").unwrap().1.into_bytes()));
    outputs.push(("the node's metrics".into(), d.get("/metrics").unwrap_or_default().into_bytes()));
    outputs.push(("the node's log".into(), d.log().into_bytes()));
    outputs.extend(dump(&url, "/"));
    outputs.extend(tree(&s.path("state")).into_iter().map(|(p, (b, _, _))| (p.display().to_string(), b)));
    needles_nowhere(&alice, &outputs);
}
