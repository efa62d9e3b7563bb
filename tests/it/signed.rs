//! Signed declarations, the local directory (issue 44): signatures made by the real
//! `ssh-keygen -Y sign` verified by mesh-host's own SSHSIG code and cross-checked with
//! `ssh-keygen -Y verify`; `mesh-host sign` and `apply`/`run --allowed-signers` on scratch
//! directories, each refusal (`contents`, `signature`, `rollback`, `expired`, a threshold of two
//! met by one key twice) leaving the machine and the state directory as they were; and a
//! planted private key searched for in every output.
//!
//! The FIDO path (`sk-ssh-ed25519`) needs hardware to sign, so it is tested in
//! `src/trust/tests.rs` with signatures built from a ring key pair in the authenticator's
//! layout, not here.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use mesh_host::trust::sshsig::{Signature, NAMESPACE};
use mesh_host::trust::AllowedSigners;
use serde_json::json;

use crate::support::{wait_for, Daemon, Scratch, PATIENCE};

/// Fails naming the package when OpenSSH's ssh-keygen is not installed.
fn ssh_keygen() -> Command {
    let found = std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join("ssh-keygen").is_file()));
    assert!(found, "ssh-keygen is missing: install openssh-client (tests/testbed/up.sh does)");
    Command::new("ssh-keygen")
}

pub(crate) fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// A new Ed25519 key pair without a passphrase: the private key's path (`.pub` beside it).
pub(crate) fn keypair(s: &Scratch, name: &str) -> PathBuf {
    std::fs::create_dir_all(s.path("keys")).unwrap();
    let key = s.path(&format!("keys/{name}"));
    let out =
        ssh_keygen().args(["-q", "-t", "ed25519", "-N", "", "-C", name, "-f"]).arg(&key).output().unwrap();
    assert!(out.status.success(), "ssh-keygen: {}", text(&out));
    key
}

pub(crate) fn public(key: &Path) -> String {
    std::fs::read_to_string(key.with_extension("pub")).unwrap()
}

/// An allowed_signers file trusting these keys, each under its file name.
pub(crate) fn allowed(s: &Scratch, keys: &[&Path]) -> PathBuf {
    let lines: String = keys
        .iter()
        .map(|k| format!("{}@example.com {}", k.file_name().unwrap().to_string_lossy(), public(k)))
        .collect();
    let path = s.path("allowed_signers");
    std::fs::write(&path, lines).unwrap();
    path
}

/// `ssh-keygen -Y sign` of `message` in `namespace` (extra options such as `-O hashalg=sha256`).
fn ssh_sign(key: &Path, namespace: &str, message: &[u8], extra: &[&str]) -> Vec<u8> {
    let mut child = ssh_keygen()
        .args(["-q", "-Y", "sign", "-n", namespace, "-f"])
        .arg(key)
        .args(extra)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), message).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "ssh-keygen -Y sign: {}", text(&out));
    out.stdout
}

/// `ssh-keygen -Y verify`: OpenSSH's own verdict on the same inputs.
fn openssh_verifies(
    s: &Scratch,
    signers: &Path,
    principal: &str,
    namespace: &str,
    message: &[u8],
    sig: &[u8],
) -> bool {
    let sig_path = s.path("cross.sig");
    std::fs::write(&sig_path, sig).unwrap();
    let mut child = ssh_keygen()
        .args(["-Y", "verify", "-f"])
        .arg(signers)
        .args(["-I", principal, "-n", namespace, "-s"])
        .arg(&sig_path)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), message).unwrap();
    child.wait().unwrap().success()
}

/// Our verdict: the signature parses, verifies over `message` in the declarations' namespace,
/// and its key is one the file trusts.
fn we_verify(signers: &Path, message: &[u8], sig: &[u8]) -> Result<String, String> {
    let signers = AllowedSigners::parse(&std::fs::read(signers).unwrap())?;
    let sig = Signature::from_armored(sig)?;
    sig.verify(NAMESPACE, message)?;
    signers.find(&sig.key).map(|s| s.principals.clone()).ok_or_else(|| "key not trusted".to_owned())
}

#[test]
fn signatures_by_ssh_keygen_verify_here_as_they_do_in_openssh_and_tampering_is_refused_by_both() {
    let s = Scratch::new();
    let alice = keypair(&s, "alice");
    let mallory = keypair(&s, "mallory");
    let signers = allowed(&s, &[&alice]);
    let message = b"mesh-host manifest v1\nfleet f\n";
    for hash in [&[][..], &["-O", "hashalg=sha256"][..]] {
        let sig = ssh_sign(&alice, NAMESPACE, message, hash);
        assert_eq!(we_verify(&signers, message, &sig), Ok("alice@example.com".into()), "{hash:?}");
        assert!(openssh_verifies(&s, &signers, "alice@example.com", NAMESPACE, message, &sig), "{hash:?}");

        let tampered = b"mesh-host manifest v1\nfleet g\n";
        let e = we_verify(&signers, tampered, &sig).unwrap_err();
        assert!(e.contains("does not verify"), "{e}");
        assert!(!openssh_verifies(&s, &signers, "alice@example.com", NAMESPACE, tampered, &sig));
    }

    // Another namespace: the signature is good, but not for declarations.
    let other = ssh_sign(&alice, "file", message, &[]);
    let e = we_verify(&signers, message, &other).unwrap_err();
    assert!(e.contains("namespace \"file\""), "{e}");
    assert!(!openssh_verifies(&s, &signers, "alice@example.com", NAMESPACE, message, &other));

    // Another key: verifies by itself, and neither trusts it.
    let by_mallory = ssh_sign(&mallory, NAMESPACE, message, &[]);
    assert_eq!(we_verify(&signers, message, &by_mallory), Err("key not trusted".into()));
    assert!(!openssh_verifies(&s, &signers, "alice@example.com", NAMESPACE, message, &by_mallory));

    // A key limited to other namespaces in allowed_signers counts for neither.
    std::fs::write(&signers, format!("alice@example.com namespaces=\"git\" {}", public(&alice))).unwrap();
    let sig = ssh_sign(&alice, NAMESPACE, message, &[]);
    assert_eq!(we_verify(&signers, message, &sig), Err("key not trusted".into()));
    assert!(!openssh_verifies(&s, &signers, "alice@example.com", NAMESPACE, message, &sig));
}

/// A declaration directory of one file resource writing `out/a.conf`.
fn declare(s: &Scratch, content: &str) -> PathBuf {
    let dir = s.path("declaration.d");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::create_dir_all(s.path("out")).unwrap();
    let d = json!({"version": 1, "resources": [
        {"type": "file", "id": "a.conf", "path": s.p("out/a.conf"), "content": content},
    ]});
    std::fs::write(dir.join("10-a.json"), serde_json::to_vec_pretty(&d).unwrap()).unwrap();
    dir
}

/// `mesh-host sign DIR --sign KEY...` with more options; asserts it signed.
fn sign(s: &Scratch, dir: &Path, keys: &[&Path], extra: &[&str]) -> Output {
    let mut args = vec!["sign".to_owned(), dir.display().to_string()];
    for k in keys {
        args.extend(["--sign".to_owned(), k.display().to_string()]);
    }
    args.extend(extra.iter().map(|e| (*e).to_owned()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = s.run(&args);
    assert!(out.status.success(), "mesh-host sign: {}", text(&out));
    out
}

/// Each file's bytes, mode and inode, by path.
pub(crate) type Tree = BTreeMap<PathBuf, (Vec<u8>, u32, u64)>;

/// Every file under `dir`: its bytes, mode and inode, to show nothing changed.
pub(crate) fn tree(dir: &Path) -> Tree {
    let mut out = BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for e in entries.flatten() {
            let meta = std::fs::symlink_metadata(e.path()).unwrap();
            if meta.is_dir() {
                todo.push(e.path());
            } else {
                out.insert(e.path(), (std::fs::read(e.path()).unwrap_or_default(), meta.mode(), meta.ino()));
            }
        }
    }
    out
}

/// What an apply may change: the file it writes, and the state directory.
fn machine(s: &Scratch) -> (Tree, Tree) {
    (tree(&s.path("out")), tree(&s.path("state")))
}

/// `apply --allowed-signers FILE` with more options: the exit code and everything it said.
fn apply(s: &Scratch, dir: &Path, signers: &Path, extra: &[&str]) -> (i32, String) {
    let mut args = vec!["apply", dir.to_str().unwrap(), "--allowed-signers", signers.to_str().unwrap()];
    args.extend(extra);
    let out = s.run(&args);
    (out.status.code().unwrap_or(-1), text(&out))
}

/// Applies, expecting a refusal for `reason` that names `says`, with nothing changed.
fn refused(s: &Scratch, dir: &Path, signers: &Path, extra: &[&str], reason: &str, says: &str) -> String {
    let before = machine(s);
    let (code, said) = apply(s, dir, signers, extra);
    assert_eq!(code, 2, "refused, exit 2: {said}");
    assert!(said.contains(&format!("refused ({reason}): the local declaration of fleet default")), "{said}");
    assert!(said.contains(says), "want {says:?} in: {said}");
    assert!(said.contains("nothing was touched"), "{said}");
    assert!(machine(s) == before, "a refused declaration changed the machine or the state: {said}");
    said
}

fn copy_dir(from: &Path, to: &Path) {
    let _ = std::fs::remove_dir_all(to);
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

#[test]
fn apply_takes_a_signed_directory_and_refuses_each_broken_one_touching_nothing() {
    let s = Scratch::new();
    let alice = keypair(&s, "alice");
    let bob = keypair(&s, "bob");
    let mallory = keypair(&s, "mallory");
    let signers = allowed(&s, &[&alice, &bob]);
    let dir = declare(&s, "one\n");
    let conf = s.path("out/a.conf");

    // Unsigned: refused before anything is read of it.
    refused(&s, &dir, &signers, &[], "signature", "has no .mesh-host/manifest");

    // Signed: applied, and the mark kept.
    sign(&s, &dir, &[&alice], &[]);
    let (code, said) = apply(&s, &dir, &signers, &[]);
    assert_eq!(code, 0, "{said}");
    assert_eq!(std::fs::read_to_string(&conf).unwrap(), "one\n");
    let mark = s.path("state/trust/local");
    assert!(std::fs::read_to_string(&mark).unwrap().starts_with("version 1\n"));
    // The same bytes again are not a rollback.
    assert_eq!(apply(&s, &dir, &signers, &[]).0, 0);

    // A file edited after signing.
    let file = dir.join("10-a.json");
    let signed_bytes = std::fs::read(&file).unwrap();
    std::fs::write(&file, String::from_utf8(signed_bytes.clone()).unwrap().replace("one", "two")).unwrap();
    refused(&s, &dir, &signers, &[], "contents", "file 10-a.json is");
    std::fs::write(&file, &signed_bytes).unwrap();

    // Signed by a key the node does not trust.
    declare(&s, "two\n");
    sign(&s, &dir, &[&mallory], &[]);
    refused(&s, &dir, &signers, &[], "signature", "which the allowed signers do not list");

    // Version 3 by alice (2 was mallory's), kept aside; version 4 applied; version 3 replayed.
    sign(&s, &dir, &[&alice], &[]);
    copy_dir(&dir, &s.path("old"));
    declare(&s, "three\n");
    sign(&s, &dir, &[&alice], &[]);
    assert_eq!(apply(&s, &dir, &signers, &[]).0, 0);
    assert_eq!(std::fs::read_to_string(&conf).unwrap(), "three\n");
    copy_dir(&s.path("old"), &dir);
    refused(&s, &dir, &signers, &[], "rollback", "version 3 is below version 4");
    // check and plan refuse it too, reading the mark and writing nothing; plan --json says why.
    let before = machine(&s);
    let check = s.run(&["check", dir.to_str().unwrap(), "--allowed-signers", signers.to_str().unwrap()]);
    assert_eq!(check.status.code(), Some(2), "{}", text(&check));
    assert!(text(&check).contains("refused (rollback)"), "{}", text(&check));
    let plan =
        s.run(&["plan", "--json", dir.to_str().unwrap(), "--allowed-signers", signers.to_str().unwrap()]);
    let shown: serde_json::Value = serde_json::from_slice(&plan.stdout).unwrap();
    assert_eq!(shown["refused"]["reason"], "rollback", "{shown:#}");
    assert!(machine(&s) == before, "check or plan changed the machine or the state");

    // A threshold of two: one key signing twice is one key; two keys meet it.
    declare(&s, "four\n");
    sign(&s, &dir, &[&alice, &alice], &["--version", "10"]);
    refused(&s, &dir, &signers, &["--signatures-required", "2"], "signature", "one key counts once");
    sign(&s, &dir, &[&bob], &["--add"]);
    assert_eq!(apply(&s, &dir, &signers, &["--signatures-required", "2"]).0, 0);
    assert_eq!(std::fs::read_to_string(&conf).unwrap(), "four\n");

    // Expired before it was first seen: signed for one second, applied after it.
    declare(&s, "five\n");
    sign(&s, &dir, &[&alice], &["--expires", "1s"]);
    let manifest = std::fs::read_to_string(dir.join(".mesh-host/manifest")).unwrap();
    let expires: u64 = manifest.lines().find_map(|l| l.strip_prefix("expires ")).unwrap().parse().unwrap();
    let now = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    assert!(wait_for(std::time::Duration::from_secs(5), || now() > expires));
    refused(&s, &dir, &signers, &[], "expired", "version 11 expired at");
}

#[test]
fn the_daemon_refuses_an_edit_after_signing_counts_it_and_takes_the_directory_signed_again() {
    let s = Scratch::new();
    let alice = keypair(&s, "alice");
    let signers = allowed(&s, &[&alice]);
    let dir = declare(&s, "one\n");
    sign(&s, &dir, &[&alice], &[]);
    let conf = s.path("out/a.conf");
    let d = Daemon::start(&s, &dir, &["--allowed-signers", signers.to_str().unwrap()]);
    assert_eq!(std::fs::read_to_string(&conf).unwrap(), "one\n");
    assert!(d.log().contains("declarations are applied only when signed"), "{}", d.log());

    // Edited after signing: refused, counted by its reason (the barrier), nothing touched.
    // Written whole and renamed in, so the daemon never reads it half-written.
    let file = dir.join("10-a.json");
    std::fs::write(s.path("edit.json"), std::fs::read_to_string(&file).unwrap().replace("one", "two"))
        .unwrap();
    std::fs::rename(s.path("edit.json"), &file).unwrap();
    let contents = "mesh_host_declaration_refusals_total{reason=\"contents\"}";
    assert!(wait_for(PATIENCE, || d.metric(contents) >= 1.0), "not refused:\n{}", d.log());
    let counted = d.metric(contents);
    assert_eq!(std::fs::read_to_string(&conf).unwrap(), "one\n", "a refused declaration was applied");
    assert!(d.log().contains("reason=\"contents\"") || d.log().contains("reason=contents"), "{}", d.log());
    assert!(d.log().contains("file 10-a.json is"), "{}", d.log());

    // Signed again: the manifest's change alone is seen, and the edit applied.
    sign(&s, &dir, &[&alice], &[]);
    assert!(
        wait_for(PATIENCE, || std::fs::read_to_string(&conf).is_ok_and(|c| c == "two\n")),
        "the directory signed again was not applied:\n{}",
        d.log()
    );
    assert_eq!(d.metric(contents), counted, "what was signed is not refused");
    assert_eq!(d.metric("mesh_host_declaration_refusals_total"), counted, "no refusal for any other reason");
}

#[test]
fn the_daemon_without_allowed_signers_says_once_that_it_applies_unsigned_declarations() {
    let s = Scratch::new();
    let dir = declare(&s, "one\n");
    let d = Daemon::start(&s, &dir, &[]);
    let said = d.log().matches("declarations are not signed").count();
    assert_eq!(said, 1, "{}", d.log());
    assert_eq!(std::fs::read_to_string(s.path("out/a.conf")).unwrap(), "one\n");
}

/// The 32 secret bytes of an unencrypted OpenSSH Ed25519 private key file: in its private
/// section, a 64-byte string of the seed then the public key.
pub(crate) fn seed_of(private: &Path) -> Vec<u8> {
    use base64::Engine as _;
    let pem = std::fs::read_to_string(private).unwrap();
    let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    let blob = base64::engine::general_purpose::STANDARD.decode(body).unwrap();
    let public_b64 = public(private).split_whitespace().nth(1).unwrap().to_owned();
    let public_blob = base64::engine::general_purpose::STANDARD.decode(public_b64).unwrap();
    let key = &public_blob[public_blob.len() - 32..];
    let at = blob
        .windows(68)
        .position(|w| w[..4] == [0, 0, 0, 64] && &w[36..] == key)
        .expect("the private section of an Ed25519 key");
    blob[at + 4..at + 36].to_vec()
}

#[test]
fn a_planted_signing_key_is_found_in_no_output() {
    use base64::Engine as _;
    let s = Scratch::new();
    let alice = keypair(&s, "alice");
    let signers = allowed(&s, &[&alice]);
    let seed = seed_of(&alice);
    let pem = std::fs::read_to_string(&alice).unwrap();
    let mut needles: Vec<Vec<u8>> = vec![
        seed.clone(),
        seed.iter().map(|b| format!("{b:02x}")).collect::<String>().into_bytes(),
        base64::engine::general_purpose::STANDARD.encode(&seed).into_bytes(),
    ];
    // Every line of the key file's armor long enough to mean something.
    needles.extend(
        pem.lines().filter(|l| !l.starts_with("-----") && l.len() >= 16).map(|l| l.as_bytes().to_vec()),
    );

    let dir = declare(&s, "one\n");
    let mut said = vec![
        sign(&s, &dir, &[&alice], &[]),
        s.run(&["apply", dir.to_str().unwrap(), "--allowed-signers", signers.to_str().unwrap()]),
        s.run(&["plan", dir.to_str().unwrap(), "--allowed-signers", signers.to_str().unwrap()]),
        s.run(&["check", dir.to_str().unwrap(), "--allowed-signers", signers.to_str().unwrap()]),
    ];
    declare(&s, "two\n");
    said.push(s.run(&["apply", dir.to_str().unwrap(), "--allowed-signers", signers.to_str().unwrap()]));
    let d = Daemon::launch(
        &s,
        &dir,
        &["--allowed-signers", signers.to_str().unwrap()],
        &[("MESH_HOST_LOG", "trace")],
    );
    sign(&s, &dir, &[&alice], &[]);
    assert!(wait_for(PATIENCE, || std::fs::read_to_string(s.path("out/a.conf")).is_ok_and(|c| c == "two\n")));
    let metrics = d.get("/metrics").unwrap_or_default();
    drop(d);

    let mut outputs: Vec<(String, Vec<u8>)> = said
        .iter()
        .enumerate()
        .flat_map(|(i, o)| {
            [
                (format!("command {i} stdout"), o.stdout.clone()),
                (format!("command {i} stderr"), o.stderr.clone()),
            ]
        })
        .collect();
    outputs.push(("metrics".into(), metrics.into_bytes()));
    for dir in [s.path("logs"), s.path("state"), s.path("declaration.d"), s.path("out")] {
        outputs.extend(tree(&dir).into_iter().map(|(p, (bytes, _, _))| (p.display().to_string(), bytes)));
    }
    assert!(outputs.iter().any(|(name, _)| name.contains("/logs/")), "the daemon's trace log was searched");
    // The search finds the key where it is: in its own file, armor and seed both.
    let found = |bytes: &[u8], needle: &[u8]| bytes.windows(needle.len()).any(|w| w == needle);
    assert!(needles[3..].iter().all(|n| found(pem.as_bytes(), n)) && needles.len() > 3);
    let decoded: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    let decoded = base64::engine::general_purpose::STANDARD.decode(decoded).unwrap();
    assert!(found(&decoded, &needles[0]), "the seed is found in the key it came from");
    for (name, bytes) in &outputs {
        for needle in &needles {
            assert!(
                !bytes.windows(needle.len()).any(|w| w == needle.as_slice()),
                "the private key is in {name}"
            );
        }
    }
}
