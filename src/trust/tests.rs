//! `verify` as a table: one good signed declaration, and each way of breaking it, with the
//! reason and the words each refusal must carry. Keys are ring's; signatures by the real
//! `ssh-keygen` are verified in `tests/it/signed.rs`.

use ring::signature::{Ed25519KeyPair, KeyPair as _};
use sha2::Digest as _;

use super::sshsig::make;
use super::*;

const NOW: u64 = 1_800_000_000;

fn pair(seed: u8) -> Ed25519KeyPair {
    Ed25519KeyPair::from_seed_unchecked(&[seed; 32]).unwrap()
}

fn files() -> Vec<(&'static str, &'static [u8])> {
    vec![("10-base.json", b"{\"version\":1}".as_slice()), ("20-web.json", b"{}".as_slice())]
}

fn manifest(version: u64, scope: Scope, fleet: &str, expires: u64) -> Vec<u8> {
    let files = files()
        .into_iter()
        .map(|(name, bytes)| Listed {
            name: name.into(),
            length: bytes.len() as u64,
            sha256: sha2::Sha256::digest(bytes).into(),
        })
        .collect();
    Manifest { fleet: fleet.into(), scope, version, issued: NOW - 100, expires, files }.render().into_bytes()
}

fn good() -> Vec<u8> {
    manifest(5, Scope::Local, "prod", NOW + 3600)
}

fn sig(pair: &Ed25519KeyPair, message: &[u8]) -> Vec<u8> {
    make::signature(pair, None, NAMESPACE, message).into_bytes()
}

/// alice (seed 1) and bob (seed 2) are trusted; mallory (seed 9) is not; carol's FIDO key
/// (seed 3, application `ssh:`) is.
fn trusted() -> AllowedSigners {
    let text = [
        make::signer_line("alice", pair(1).public_key().as_ref(), None),
        make::signer_line("bob", pair(2).public_key().as_ref(), None),
        make::signer_line("carol", pair(3).public_key().as_ref(), Some(b"ssh:")),
    ]
    .concat();
    AllowedSigners::parse(text.as_bytes()).unwrap()
}

struct Case {
    name: &'static str,
    manifest: Vec<u8>,
    signatures: Vec<Vec<u8>>,
    required: usize,
    floor: Option<Floor>,
    files: Vec<(&'static str, &'static [u8])>,
    /// `None`: accepted.
    refused: Option<(Reason, &'static str)>,
}

fn case(name: &'static str) -> Case {
    let m = good();
    Case {
        name,
        signatures: vec![sig(&pair(1), &m)],
        manifest: m,
        required: 1,
        floor: None,
        files: files(),
        refused: None,
    }
}

fn floor_of(m: &[u8]) -> Floor {
    let version = Manifest::parse(m).unwrap().version;
    Floor { version, manifest_sha256: sha2::Sha256::digest(m).into() }
}

fn cases() -> Vec<Case> {
    let m = good();
    let two = |a: &Ed25519KeyPair, b: &Ed25519KeyPair| vec![sig(a, &m), sig(b, &m)];
    let expired = manifest(6, Scope::Local, "prod", NOW);
    let other_group = manifest(6, Scope::Group("web".into()), "prod", NOW + 10);
    let other_fleet = manifest(6, Scope::Local, "staging", NOW + 10);
    let mut tampered = m.clone();
    tampered.push(b'\n');
    let v4 = manifest(4, Scope::Local, "prod", NOW + 10);
    let v5b = manifest(5, Scope::Local, "prod", NOW + 20);
    let sk = |flags| make::signature(&pair(3), Some((b"ssh:", flags)), NAMESPACE, &m).into_bytes();
    vec![
        case("one trusted key"),
        Case {
            signatures: two(&pair(1), &pair(2)),
            required: 2,
            ..case("two distinct trusted keys for two")
        },
        Case { signatures: vec![sk(0x01)], ..case("a FIDO key that saw a touch") },
        Case {
            signatures: vec![sk(0x00)],
            refused: Some((Reason::Signature, "did not see the user's presence")),
            ..case("a FIDO key without the touch")
        },
        Case {
            signatures: two(&pair(1), &pair(1)),
            required: 2,
            refused: Some((Reason::Signature, "one key counts once")),
            ..case("one key signing twice for a threshold of two")
        },
        Case {
            signatures: vec![sig(&pair(9), &m)],
            refused: Some((Reason::Signature, "which the allowed signers do not list")),
            ..case("an untrusted key")
        },
        Case {
            signatures: vec![sig(&pair(1), &good()[1..])],
            refused: Some((Reason::Signature, "the manifest is not what was signed")),
            ..case("a signature over other bytes")
        },
        Case {
            signatures: vec![make::signature(&pair(1), None, "git", &m).into_bytes()],
            refused: Some((Reason::Signature, "namespace \"git\", not \"mesh-host-declaration@v1\"")),
            ..case("another namespace")
        },
        Case {
            signatures: vec![b"-----BEGIN SSH SIGNATURE-----\nAAAA\n".to_vec()],
            refused: Some((Reason::Signature, "does not end with")),
            ..case("a broken armor")
        },
        Case {
            signatures: vec![],
            refused: Some((Reason::Signature, "signed by no trusted key")),
            ..case("unsigned")
        },
        Case {
            signatures: vec![sig(&pair(1), &tampered)],
            manifest: tampered.clone(),
            refused: Some((Reason::Signature, "signed but cannot be read")),
            ..case("a signed manifest that does not parse")
        },
        Case {
            signatures: vec![sig(&pair(1), &other_group)],
            manifest: other_group,
            refused: Some((Reason::Scope, "is for the group web declaration of fleet prod")),
            ..case("another scope")
        },
        Case {
            signatures: vec![sig(&pair(1), &other_fleet)],
            manifest: other_fleet,
            refused: Some((Reason::Scope, "is for the local declaration of fleet staging")),
            ..case("another fleet")
        },
        Case { floor: Some(floor_of(&m)), ..case("the manifest in force read again") },
        Case {
            floor: Some(floor_of(&manifest(4, Scope::Local, "prod", NOW + 1))),
            ..case("a higher version")
        },
        Case {
            signatures: vec![sig(&pair(1), &v4)],
            manifest: v4,
            floor: Some(floor_of(&m)),
            refused: Some((Reason::Rollback, "version 4 is below version 5")),
            ..case("an older version")
        },
        Case {
            signatures: vec![sig(&pair(1), &v5b)],
            manifest: v5b,
            floor: Some(floor_of(&m)),
            refused: Some((Reason::Rollback, "version 5 was already accepted here with another manifest")),
            ..case("the same version, other bytes")
        },
        Case {
            signatures: vec![sig(&pair(1), &expired)],
            manifest: expired.clone(),
            refused: Some((Reason::Expired, "version 6 expired at 1800000000")),
            ..case("expired when first seen")
        },
        Case {
            signatures: vec![sig(&pair(1), &expired)],
            manifest: expired.clone(),
            floor: Some(floor_of(&expired)),
            ..case("expired, but in force already")
        },
        Case {
            files: vec![("10-base.json", b"{\"version\":2}"), ("20-web.json", b"{}")],
            refused: Some((Reason::Contents, "file 10-base.json is 13 bytes with sha256")),
            ..case("a file edited after signing")
        },
        Case {
            files: vec![("10-base.json", b"{\"version\":1}")],
            refused: Some((
                Reason::Contents,
                "file 20-web.json is in the manifest signed at version 5 but was not read",
            )),
            ..case("a file removed")
        },
        Case {
            files: vec![("10-base.json", b"{\"version\":1}"), ("15-new.json", b"{}"), ("20-web.json", b"{}")],
            refused: Some((Reason::Contents, "file 15-new.json is not in the manifest")),
            ..case("a file added")
        },
    ]
}

#[test]
fn each_way_of_breaking_a_signed_declaration_is_refused_for_its_reason() {
    let signers = trusted();
    for c in cases() {
        let signatures: Vec<(String, Vec<u8>)> = c
            .signatures
            .iter()
            .enumerate()
            .map(|(i, s)| (format!("manifest.{}.sig", i + 1), s.clone()))
            .collect();
        let expect = Expect {
            signers: &signers,
            known: &signers,
            whose: "the allowed signers do not list".into(),
            required: c.required,
            fleet: "prod",
            scope: &Scope::Local,
            floor: c.floor.as_ref(),
            now: NOW,
        };
        let got = verify(&Signed { manifest: &c.manifest, signatures: &signatures }, &c.files, &expect);
        match (got, c.refused) {
            (Ok(accepted), None) => {
                assert_eq!(accepted.floor, floor_of(&c.manifest), "{}", c.name);
                assert_eq!(accepted.first_seen, c.floor.as_ref() != Some(&accepted.floor), "{}", c.name);
            }
            (Err(refusal), Some((reason, says))) => {
                assert_eq!(refusal.reason, reason, "{}: {}", c.name, refusal.message);
                assert!(
                    refusal.message.starts_with("the local declaration of fleet prod: "),
                    "{}: names the scope: {}",
                    c.name,
                    refusal.message
                );
                assert!(refusal.message.contains(says), "{}: {}\n  want: {says}", c.name, refusal.message);
            }
            (got, want) => panic!("{}: got {got:?}, want {want:?}", c.name),
        }
    }
}

#[test]
fn who_signed_is_named_once_per_key() {
    let m = good();
    let signatures = vec![
        ("a".to_owned(), sig(&pair(1), &m)),
        ("b".to_owned(), sig(&pair(2), &m)),
        ("c".to_owned(), sig(&pair(1), &m)),
    ];
    let signers = trusted();
    let expect = Expect {
        signers: &signers,
        known: &signers,
        whose: "the allowed signers do not list".into(),
        required: 2,
        fleet: "prod",
        scope: &Scope::Local,
        floor: None,
        now: NOW,
    };
    let accepted = verify(&Signed { manifest: &m, signatures: &signatures }, &files(), &expect).unwrap();
    assert_eq!(accepted.signed_by.len(), 2);
    assert!(accepted.signed_by[0].starts_with("alice (SHA256:"), "{:?}", accepted.signed_by);
    assert!(accepted.signed_by[1].starts_with("bob (SHA256:"), "{:?}", accepted.signed_by);
}

#[test]
fn a_floor_has_one_text_and_a_damaged_one_is_refused() {
    let floor = floor_of(&good());
    assert_eq!(Floor::parse(floor.render().as_bytes()).unwrap(), floor);
    for bad in ["", "version 5\n", "version x\nmanifest 00\n", &format!("{}extra\n", floor.render())] {
        assert!(Floor::parse(bad.as_bytes()).is_err(), "{bad:?}");
    }
}
