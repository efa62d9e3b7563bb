//! The signed-declaration parsers (issue 44): the manifest, an armored SSH signature, an
//! allowed_signers file, the high-water mark, the trust policy (its body and its signed
//! file), and the whole decision over them. Any bytes are
//! accepted or refused, never a panic or a hang; a manifest accepted has exactly one text, the
//! one it was read from; and nothing an attacker writes is accepted without a trusted key.
//!
//! The first byte picks the parser, the rest is its input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mesh_host::trust::{self, sshsig, AllowedSigners, Expect, Floor, Manifest, Scope, Signed};

fuzz_target!(|data: &[u8]| {
    let Some((&which, input)) = data.split_first() else { return };
    match which % 6 {
        0 => {
            if let Ok(m) = Manifest::parse(input) {
                assert_eq!(m.render().as_bytes(), input, "a manifest has one text");
                for f in &m.files {
                    assert!(m.listed(&f.name).is_some());
                }
            }
        }
        1 => {
            if let Ok(sig) = sshsig::Signature::from_armored(input) {
                let _ = sig.key.fingerprint();
                let _ = sig.verify(trust::NAMESPACE, b"mesh-host manifest v1\n");
            }
            if let Ok(sig) = sshsig::Signature::from_blob(input) {
                let _ = sig.verify(trust::NAMESPACE, input);
            }
        }
        2 => {
            if let Ok(signers) = AllowedSigners::parse(input) {
                let _ = signers.distinct_keys();
            }
        }
        3 => {
            if let Ok(floor) = Floor::parse(input) {
                assert_eq!(Floor::parse(floor.render().as_bytes()), Ok(floor));
            }
        }
        4 => {
            // A policy has one text; its signed file verifies only over that text, and with no
            // signature made by one of its root keys (which no fuzzer forges) never at all.
            if let Ok(p) = trust::Policy::parse(input) {
                assert_eq!(p.render().as_bytes(), input, "a policy has one text");
                let _ = p.role_for(&Scope::Group("web".into()));
            }
            if let Ok((body, _)) = trust::policy::split(input) {
                assert!(input.starts_with(body));
            }
            // One that verifies (a signed seed mutated where it is not signed) counts only its
            // own root keys, a threshold of them.
            if let Ok(v) = trust::policy::verify_root(input, Some(0)) {
                let root = v.policy.root();
                assert!(v.signed_by.len() >= root.threshold, "{:?}", v.signed_by);
                assert!(v.signed_by.iter().all(|k| root.keys.contains(k)), "{:?}", v.signed_by);
            }
        }
        _ => {
            // The input split into a manifest and a signature at the first NUL: with no
            // trusted key, nothing is ever accepted.
            let at = input.iter().position(|b| *b == 0).unwrap_or(input.len());
            let (manifest, signature) = input.split_at(at);
            let signatures = vec![("fuzz.sig".to_owned(), signature.to_vec())];
            let signers = AllowedSigners::default();
            let expect = Expect {
                signers: &signers,
                known: &signers,
                whose: "the allowed signers do not list".into(),
                required: 1,
                fleet: "f",
                scope: &Scope::Local,
                floor: None,
                now: 0,
            };
            let verdict = trust::verify(&Signed { manifest, signatures: &signatures }, &[], &expect);
            assert!(verdict.is_err(), "accepted without a trusted key");
        }
    }
});
