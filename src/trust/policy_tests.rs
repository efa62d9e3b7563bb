//! The policy as tables: one good policy, each way of breaking its text (one row a rule), and
//! each way a first policy, a rotation or the node's adoption of one is refused.

use base64::Engine as _;
use ring::signature::{Ed25519KeyPair, KeyPair as _};

use super::*;
use crate::trust::sshsig::make;

const NOW: u64 = 1_800_000_000;

fn pair(seed: u8) -> Ed25519KeyPair {
    Ed25519KeyPair::from_seed_unchecked(&[seed; 32]).unwrap()
}

/// `key NAME ssh-ed25519 BASE64` for the key of `seed`.
fn key_line(name: &str, seed: u8) -> String {
    let blob = make::key_blob(pair(seed).public_key().as_ref(), None);
    format!("key {name} ssh-ed25519 {}\n", base64::engine::general_purpose::STANDARD.encode(blob))
}

/// alice (1) may sign group web only; bob (2) the fleet and every node; root-1 (11) and
/// root-2 (12) sign the policy, two of them.
fn draft() -> String {
    [
        "# the fleet's signers\n".to_owned(),
        key_line("root-2", 12),
        key_line("alice", 1),
        key_line("bob", 2),
        key_line("root-1", 11),
        "role root 2 root-2 root-1\nrole group:web 1 alice\nrole fleet 1 bob\nrole node:* 1 bob\n".into(),
        "node web-2 web eu\nnode web-1 web\n".into(),
    ]
    .concat()
}

fn good(version: u64) -> Policy {
    Policy::from_draft(&draft(), "prod", version, NOW - 100, NOW + 3600).unwrap()
}

/// The signed file of `policy` by the keys of `seeds`.
fn signed(policy: &Policy, seeds: &[u8]) -> Vec<u8> {
    let body = policy.render().into_bytes();
    let sigs: Vec<Vec<u8>> = seeds
        .iter()
        .map(|s| make::signature(&pair(*s), None, POLICY_NAMESPACE, &body).into_bytes())
        .collect();
    join(&body, &sigs)
}

#[test]
fn a_draft_becomes_one_text_that_reads_back() {
    let p = good(1);
    let text = p.render();
    assert!(text.starts_with("mesh-host policy v1\nfleet prod\nversion 1\n"), "{text}");
    assert!(text.contains("\nrole root 2 root-1 root-2\n"), "a role's keys sorted: {text}");
    assert!(text.ends_with("node web-1 web\nnode web-2 web eu\n"), "nodes sorted, groups kept: {text}");
    assert_eq!(Policy::parse(text.as_bytes()).unwrap(), p);
    assert_eq!(p.groups_of("web-2"), Some(&["web".to_owned(), "eu".to_owned()][..]));
    assert_eq!(p.groups_of("db-1"), None);
    // A .pub file's comment is taken in a draft, never in the policy itself.
    let commented = draft().replace(&key_line("bob", 2), &key_line("bob", 2).replace('\n', " bob@laptop\n"));
    assert_eq!(Policy::from_draft(&commented, "prod", 1, NOW - 100, NOW + 3600).unwrap(), p);
}

#[test]
fn each_rule_of_the_text_refuses_by_line() {
    let good = good(1).render();
    let alice = key_line("alice", 1);
    let cases: Vec<(String, &str)> = vec![
        (good.replace("policy v1", "policy v2"), "it is not a mesh-host policy v1"),
        (good.trim_end().to_owned(), "its last line does not end in a newline"),
        (good.replace("fleet prod", "fleet -prod"), "line 2: the fleet \"-prod\" is not a name"),
        (good.replace("version 1\n", "version 01\n"), "line 3: \"01\" is not a number"),
        (good.replace("issued", "issue"), "line 4 is not its issued line"),
        (good.replace(&format!("expires {}", NOW + 3600), &format!("expires {}", NOW - 100)), "it expires"),
        (good.replace("ssh-ed25519 AAAA", "ssh-ed25519 !AAA"), "line 6: the key alice is not base64"),
        (
            good.replace(&alice, &alice.replace("ssh-ed25519", "ssh-rsa")),
            "line 6: the key alice says ssh-rsa",
        ),
        (
            good.replace(&alice, &format!("{} comment\n", alice.trim_end())),
            "line 6: it is not a key, role or node",
        ),
        (good.replace(&alice, &key_line("bob", 1)), "key bob is not after key bob"),
        (good.replace(&key_line("bob", 2), &key_line("bob", 1)), "key bob is key alice again"),
        (
            good.replace("role group:web 1 alice", "role group:web 0 alice"),
            "the threshold of role group:web is \"0\"",
        ),
        (
            good.replace("role group:web 1 alice", "role group:web 2 alice"),
            "role group:web needs 2 signatures of its 1",
        ),
        (good.replace("role group:web 1 alice", "role group:web 1 carol"), "role group:web names key carol"),
        (good.replace("role group:web 1 alice", "role grp:web 1 alice"), "role \"grp:web\" is not one of"),
        (
            good.replace("role root 2 root-1 root-2", "role root 2 root-2 root-1"),
            "role root's key root-1 is not after",
        ),
        (good.replace("role root 2 root-1 root-2\n", ""), "it has no root role"),
        (
            good.replace(
                "role fleet 1 bob\nrole group:web 1 alice",
                "role group:web 1 alice\nrole fleet 1 bob",
            ),
            "role fleet is not after role group:web",
        ),
        (good.replace("node web-2 web eu", "node web-2 web web"), "node web-2 names group web twice"),
        (good.replace("node web-2 web eu", "node web-0 web"), "node web-0 is not after node web-1"),
        (good.replace("node web-1 web", "node web-1 we/b"), "node web-1's group \"we/b\" is not a name"),
        (format!("{good}\n"), "it is not a key, role or node line"),
        (good.replace("prod", "pröd"), "it holds characters other than ASCII"),
    ];
    for (text, says) in cases {
        let e = Policy::parse(text.as_bytes()).unwrap_err();
        assert!(e.contains(says), "{text:?}\n  said: {e}\n  want: {says}");
    }
    // Every line in its place, but a role after the nodes: not the policy's one text.
    let e = Policy::parse(
        good.replace("role root 2 root-1 root-2\n", "")
            .replace("node web-2", "role root 2 root-1 root-2\nnode web-2")
            .as_bytes(),
    )
    .unwrap_err();
    assert!(e.contains("not in their one order"), "{e}");
}

#[test]
fn each_scope_has_its_role_and_a_node_its_groups() {
    let p = good(1);
    let role = |s: Scope| p.role_for(&s).map(|r| r.name.clone());
    assert_eq!(role(Scope::Fleet).as_deref(), Some("fleet"));
    assert_eq!(role(Scope::Group("web".into())).as_deref(), Some("group:web"));
    assert_eq!(role(Scope::Group("db".into())), None, "no group:* role: nobody signs group db");
    assert_eq!(role(Scope::Node("any".into())).as_deref(), Some("node:*"));
    assert_eq!(role(Scope::Local), None);
    let candidate = Scope::Candidate { rollout: "r".into(), replaces: Box::new(Scope::Group("web".into())) };
    assert_eq!(role(candidate).as_deref(), Some("group:web"), "a candidate is its scope's");
    let alice = p.signers(p.role_for(&Scope::Group("web".into())).unwrap());
    assert_eq!(alice.distinct_keys(), 1);

    assert_eq!(p.bound_groups("web-2", &[]).unwrap(), ["web", "eu"]);
    assert_eq!(p.bound_groups("web-2", &["web".into(), "eu".into()]).unwrap(), ["web", "eu"]);
    assert_eq!(p.bound_groups("db-9", &[]).unwrap(), Vec::<String>::new(), "unlisted: no group");
    let e = p.bound_groups("web-1", &["db".into()]).unwrap_err();
    assert!(e.contains("--group db is not what policy version 1 binds node web-1 to (groups web)"), "{e}");
    let e = p.bound_groups("web-2", &["eu".into(), "web".into()]).unwrap_err();
    assert!(e.contains("(groups web,eu)"), "the order is the policy's too: {e}");
}

/// The public key of `seed`, as a signature made with it carries it.
fn public(seed: u8) -> PublicKey {
    PublicKey::from_blob(&make::key_blob(pair(seed).public_key().as_ref(), None)).unwrap()
}

#[test]
fn the_operators_keys_meet_the_scopes_role_or_are_refused_naming_what_counts() {
    let mut p = good(1);
    let web = Scope::Group("web".into());
    assert_eq!(p.meets(&web, &[public(1)]).unwrap(), ["alice"]);
    assert_eq!(p.meets(&Scope::Fleet, &[public(2), public(1)]).unwrap(), ["bob"], "alice is extra");
    let e = p.meets(&Scope::Fleet, &[public(1)]).unwrap_err();
    assert!(
        e.contains("the fleet declaration is signed under role fleet of policy version 1, which needs 1 distinct key(s) of: bob; the keys given make 0 (none count)")
            && e.contains("; alice (ssh-ed25519 key SHA256:"),
        "{e}"
    );
    let e = p.meets(&Scope::Node("n".into()), &[public(9)]).unwrap_err();
    assert!(e.contains("role node:*") && e.contains("is no key of the policy"), "{e}");
    let e = p.meets(&Scope::Group("db".into()), &[public(1), public(2)]).unwrap_err();
    assert!(e.contains("policy version 1 has no role for the group db declaration"), "{e}");
    // A threshold of 2 is not met by one key signing twice; a candidate is its scope's role.
    p.roles.iter_mut().find(|r| r.name == "group:web").unwrap().keys.push("bob".into());
    p.roles.iter_mut().find(|r| r.name == "group:web").unwrap().threshold = 2;
    let e = p.meets(&web, &[public(1), public(1)]).unwrap_err();
    assert!(e.contains("needs 2 distinct key(s) of: alice, bob; the keys given make 1 (alice)"), "{e}");
    let candidate = Scope::Candidate { rollout: "r".into(), replaces: Box::new(web) };
    assert_eq!(p.meets(&candidate, &[public(2), public(1)]).unwrap(), ["bob", "alice"]);
}

#[test]
fn a_signed_file_is_its_body_then_its_signatures() {
    let p = good(1);
    let file = signed(&p, &[11, 12]);
    let (body, sigs) = split(&file).unwrap();
    assert_eq!(body, p.render().as_bytes());
    assert_eq!(sigs.len(), 2);
    assert_eq!(split(p.render().as_bytes()).unwrap().1.len(), 0, "unsigned");
    let mut trailing = file.clone();
    trailing.extend_from_slice(b"note\n");
    assert!(split(&trailing).unwrap_err().contains("is not SSH signatures"));
}

/// A case: its name, the signed file, the time (`None`: pinned already), and what a refusal says.
type Row = (&'static str, Vec<u8>, Option<u64>, Option<&'static str>);

#[test]
fn a_first_policy_needs_its_own_root_threshold() {
    let p = good(1);
    let cases: Vec<Row> = vec![
        ("both roots", signed(&p, &[11, 12]), Some(NOW), None),
        (
            "one root of two",
            signed(&p, &[11]),
            Some(NOW),
            Some("signed by 1 of its own root keys (root-1), and 2 are required"),
        ),
        ("one root twice", signed(&p, &[11, 11]), Some(NOW), Some("signature 2: root-1 signed already")),
        (
            "a role key, not a root",
            signed(&p, &[11, 1]),
            Some(NOW),
            Some("signature 2: by ssh-ed25519 key SHA256:"),
        ),
        ("expired", signed(&p, &[11, 12]), Some(NOW + 3600), Some("policy version 1 expired at")),
        ("expired, but pinned already", signed(&p, &[11, 12]), None, None),
    ];
    for (name, bytes, now, refused) in cases {
        match (verify_root(&bytes, now), refused) {
            (Ok(v), None) => assert_eq!(v.signed_by, ["root-1", "root-2"], "{name}"),
            (Err(e), Some(says)) => assert!(e.contains(says), "{name}: {e}\n  want: {says}"),
            (got, want) => panic!("{name}: got {got:?}, want {want:?}"),
        }
    }
    // A signature in the declarations' namespace does not count for a policy.
    let body = p.render().into_bytes();
    let decl: Vec<Vec<u8>> = [11, 12]
        .iter()
        .map(|s| make::signature(&pair(*s), None, crate::trust::NAMESPACE, &body).into_bytes())
        .collect();
    let e = verify_root(&join(&body, &decl), Some(NOW)).unwrap_err();
    assert!(e.contains("signed by 0 of its own root keys") && e.contains("namespace"), "{e}");
}

/// Version 2 with new roots: root-3 (13) and root-4 (14), two of them.
fn rotated(version: u64) -> Policy {
    let text = draft()
        .replace(&key_line("root-1", 11), &key_line("root-3", 13))
        .replace(&key_line("root-2", 12), &key_line("root-4", 14))
        .replace("role root 2 root-2 root-1", "role root 2 root-3 root-4");
    Policy::from_draft(&text, "prod", version, NOW - 50, NOW + 7200).unwrap()
}

#[test]
fn a_rotation_needs_the_old_roots_and_the_new_and_a_higher_version() {
    let old = good(3);
    let cases: Vec<(&str, Vec<u8>, Option<&str>)> = vec![
        ("old and new roots", signed(&rotated(4), &[11, 12, 13, 14]), None),
        (
            "the new roots only",
            signed(&rotated(4), &[13, 14]),
            Some("signed by 0 of the old policy's (version 3) root keys"),
        ),
        (
            "the old roots only",
            signed(&rotated(4), &[11, 12]),
            Some("as itself: it is signed by 0 of its own root keys"),
        ),
        (
            "one old root",
            signed(&rotated(4), &[11, 13, 14]),
            Some("signed by 1 of the old policy's (version 3) root keys (root-1)"),
        ),
        (
            "the same version",
            signed(&rotated(3), &[11, 12, 13, 14]),
            Some("its version 3 is not above version 3"),
        ),
        (
            "a lower version",
            signed(&rotated(2), &[11, 12, 13, 14]),
            Some("its version 2 is not above version 3"),
        ),
        (
            "another fleet",
            signed(&Policy::from_draft(&draft(), "staging", 4, NOW - 1, NOW + 9).unwrap(), &[11, 12]),
            Some("it is for fleet staging"),
        ),
    ];
    for (name, bytes, refused) in cases {
        match (verify_rotation(&old, &bytes, NOW), refused) {
            (Ok(v), None) => {
                assert_eq!(v.policy.version, 4, "{name}");
                assert_eq!(v.signed_by, ["root-3", "root-4"], "{name}");
            }
            (Err(e), Some(says)) => assert!(e.contains(says), "{name}: {e}\n  want: {says}"),
            (got, want) => panic!("{name}: got {got:?}, want {want:?}"),
        }
    }
}

#[test]
fn the_node_adopts_a_first_policy_the_same_one_or_a_rotation_never_an_older_one() {
    let v3 = signed(&good(3), &[11, 12]);
    let v4 = signed(&rotated(4), &[11, 12, 13, 14]);
    let (v, pin) = adopt(None, &v3, NOW).unwrap();
    assert_eq!((v.policy.version, pin), (3, true), "first use of a file installed out of band");
    let (v, pin) = adopt(Some(&v3), &v3, NOW + 99_999).unwrap();
    assert_eq!((v.policy.version, pin), (3, false), "pinned already: its expiry was judged then");
    let (v, pin) = adopt(Some(&v3), &v4, NOW).unwrap();
    assert_eq!((v.policy.version, pin), (4, true));
    let e = adopt(Some(&v4), &v3, NOW).unwrap_err();
    assert!(e.contains("it is version 3, and version 4 is pinned here"), "{e}");
    let other3 = signed(&Policy { issued: NOW - 7, ..good(3) }, &[11, 12]);
    let e = adopt(Some(&v3), &other3, NOW).unwrap_err();
    assert!(e.contains("never goes back"), "another policy at the pinned version: {e}");
    let e = adopt(Some(&v3), &signed(&rotated(4), &[13, 14]), NOW).unwrap_err();
    assert!(e.contains("of the old policy's (version 3) root keys"), "{e}");
    let e = adopt(Some(b"junk"), &v3, NOW).unwrap_err();
    assert!(e.contains("the pinned policy does not verify"), "{e}");
}
