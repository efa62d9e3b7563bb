//! Signed declarations (issue 44), pure: the manifest a scope's signatures cover (`manifest`),
//! SSH signatures verified in-tree (`sshsig`), the keys an `allowed_signers` file trusts
//! (`signers`), and `verify`, the one decision: given the manifest's bytes, its signatures,
//! what the node trusts and expects, the high-water mark it persisted, the time and the files
//! it read, accept, or refuse for one of five reasons.
//!
//! Architecture Invariant: `trust` names nothing else in the crate and touches nothing. It is
//! handed bytes and a clock reading; reading the files and persisting the mark is its callers'
//! (`controller::signed`, through `system`). The manifest is parsed only after enough distinct
//! trusted keys verified over its exact bytes.

pub mod manifest;
pub mod policy;
pub mod signers;
pub mod sshsig;

use sha2::Digest as _;

pub use manifest::{Listed, Manifest, Scope};
pub use policy::Policy;
pub use signers::AllowedSigners;
pub use sshsig::NAMESPACE;

/// Why a signed declaration is refused: the label of `mesh_host_declaration_refusals_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// Not enough distinct trusted keys verified over the manifest.
    Signature,
    /// The manifest is for another fleet or scope.
    Scope,
    /// Its version is below what this node accepted for the scope, or the same version with
    /// other bytes.
    Rollback,
    /// New to this node and past its expiry.
    Expired,
    /// The files read are not exactly those the manifest lists.
    Contents,
}

impl Reason {
    /// The word in logs and metrics.
    pub fn label(self) -> &'static str {
        match self {
            Reason::Signature => "signature",
            Reason::Scope => "scope",
            Reason::Rollback => "rollback",
            Reason::Expired => "expired",
            Reason::Contents => "contents",
        }
    }
}

/// A refusal: its reason and a message naming the scope and, where one is at fault, the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// Why.
    pub reason: Reason,
    /// Said in full, with what to do.
    pub message: String,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "refused ({}): {}; nothing was touched", self.reason.label(), self.message)
    }
}

impl std::error::Error for Refusal {}

/// The high-water mark a node keeps per scope: the highest version it accepted, and the digest
/// of that manifest's bytes (so the same manifest read again is told from another one that
/// claims the same version). Persisted before the declaration it accepts is put in force.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Floor {
    /// The highest version accepted.
    pub version: u64,
    /// The SHA-256 of the manifest accepted at that version.
    pub manifest_sha256: [u8; 32],
}

impl Floor {
    /// Its one text: `version N\nmanifest HEX\n`.
    pub fn render(&self) -> String {
        format!("version {}\nmanifest {}\n", self.version, manifest::hex(&self.manifest_sha256))
    }

    /// Reads its text; `Err` says why (a damaged mark is refused, never taken for none).
    pub fn parse(bytes: &[u8]) -> Result<Floor, String> {
        let text = std::str::from_utf8(bytes).map_err(|_| "it is not text".to_owned())?;
        let mut lines = text.lines();
        let version = lines.next().and_then(|l| l.strip_prefix("version ")).and_then(|v| v.parse().ok());
        let digest = lines.next().and_then(|l| l.strip_prefix("manifest "));
        match (version, digest, lines.next()) {
            (Some(version), Some(hex), None) => manifest::unhex(hex)
                .map(|manifest_sha256| Floor { version, manifest_sha256 })
                .ok_or_else(|| "its digest is not 64 lowercase hex digits".to_owned()),
            _ => Err("it is not `version N` then `manifest SHA256`".into()),
        }
    }
}

/// A manifest and its signatures, as read: nothing verified yet.
pub struct Signed<'a> {
    /// The manifest's exact bytes.
    pub manifest: &'a [u8],
    /// Each signature's name (its file, for messages) and armored bytes.
    pub signatures: &'a [(String, Vec<u8>)],
}

/// What the node trusts and expects.
pub struct Expect<'a> {
    /// The keys it trusts for this scope.
    pub signers: &'a AllowedSigners,
    /// Every key it knows (a policy's, beyond this scope's role), to name one that signed
    /// where it may not.
    pub known: &'a AllowedSigners,
    /// What a key outside `signers` is, said after "which": `the allowed signers do not
    /// list`, or what the policy's role for the scope takes.
    pub whose: String,
    /// How many distinct keys must have signed (at least 1).
    pub required: usize,
    /// The fleet it is in.
    pub fleet: &'a str,
    /// The scope the manifest was read from.
    pub scope: &'a Scope,
    /// The high-water mark it persisted for that scope; `None` before the first.
    pub floor: Option<&'a Floor>,
    /// Now, in seconds since the epoch.
    pub now: u64,
}

/// A manifest accepted.
#[derive(Debug)]
pub struct Accepted {
    /// The manifest.
    pub manifest: Manifest,
    /// Who signed it, one entry per distinct trusted key (principals, then the fingerprint).
    pub signed_by: Vec<String>,
    /// The mark to persist before it is put in force.
    pub floor: Floor,
    /// False when it is the manifest the floor already names (read again, after a restart):
    /// its expiry was judged when it was first seen.
    pub first_seen: bool,
}

/// The decision, in order: signatures (before anything of the manifest is read), scope,
/// rollback, expiry, contents. `files` are the files read, by their names in the scope.
pub fn verify(signed: &Signed, files: &[(&str, &[u8])], expect: &Expect) -> Result<Accepted, Refusal> {
    let what = format!("the {} declaration of fleet {}", expect.scope, expect.fleet);
    let refuse = |reason, message: String| Refusal { reason, message: format!("{what}: {message}") };
    let signed_by = signatures(signed, expect).map_err(|m| refuse(Reason::Signature, m))?;
    let manifest = Manifest::parse(signed.manifest)
        .map_err(|e| refuse(Reason::Signature, format!("its manifest is signed but cannot be read: {e}")))?;
    if manifest.fleet != expect.fleet || &manifest.scope != expect.scope {
        return Err(refuse(
            Reason::Scope,
            format!(
                "the manifest is for the {} declaration of fleet {}: a signed declaration is applied only where it was signed for",
                manifest.scope, manifest.fleet
            ),
        ));
    }
    let floor =
        Floor { version: manifest.version, manifest_sha256: sha2::Sha256::digest(signed.manifest).into() };
    let first_seen = expect.floor != Some(&floor);
    if let Some(old) = expect.floor.filter(|_| first_seen) {
        if manifest.version <= old.version {
            let how = if manifest.version == old.version {
                "was already accepted here with another manifest".to_owned()
            } else {
                format!("is below version {}, the highest accepted here", old.version)
            };
            return Err(refuse(
                Reason::Rollback,
                format!(
                    "version {} {how}: an older or reused signed declaration is refused; sign the declaration again with a higher version",
                    manifest.version
                ),
            ));
        }
    }
    if first_seen && expect.now >= manifest.expires {
        return Err(refuse(
            Reason::Expired,
            format!(
                "version {} expired at {} (seconds since the epoch; it is now {}): sign it again with a later expiry",
                manifest.version, manifest.expires, expect.now
            ),
        ));
    }
    contents(&manifest, files).map_err(|m| refuse(Reason::Contents, m))?;
    Ok(Accepted { manifest, signed_by, floor, first_seen })
}

/// Counts the distinct trusted keys whose signatures verify over the manifest's bytes; `Err`
/// says, signature by signature, why too few did.
fn signatures(signed: &Signed, expect: &Expect) -> Result<Vec<String>, String> {
    let mut keys: Vec<&[u8]> = Vec::new();
    let mut by = Vec::new();
    let mut notes = Vec::new();
    let mut parsed = Vec::new();
    for (name, armored) in signed.signatures {
        match sshsig::Signature::from_armored(armored) {
            Ok(sig) => parsed.push((name, sig)),
            Err(e) => notes.push(format!("{name}: {e}")),
        }
    }
    for (name, sig) in &parsed {
        if let Err(e) = sig.verify(NAMESPACE, signed.manifest) {
            notes.push(format!("{name}: {e}"));
            continue;
        }
        let Some(signer) = expect.signers.find(&sig.key) else {
            let who = expect.known.find(&sig.key).map_or_else(String::new, |s| format!("{}, ", s.principals));
            notes.push(format!(
                "{name}: signed by {who}{} key {}, which {}",
                sig.key.kind(),
                sig.key.fingerprint(),
                expect.whose
            ));
            continue;
        };
        if keys.contains(&sig.key.blob.as_slice()) {
            notes.push(format!("{name}: by {}, who signed already: one key counts once", signer.principals));
            continue;
        }
        keys.push(&sig.key.blob);
        by.push(format!("{} ({})", signer.principals, sig.key.fingerprint()));
    }
    if by.len() >= expect.required {
        return Ok(by);
    }
    let counted = if by.is_empty() {
        "no trusted key".to_owned()
    } else {
        format!("{} distinct trusted key(s): {}", by.len(), by.join(", "))
    };
    let mut message = format!(
        "its manifest is signed by {counted}, and {} are required ({} signature(s) read)",
        expect.required,
        signed.signatures.len()
    );
    for note in notes {
        message.push_str("; ");
        message.push_str(&note);
    }
    Err(message)
}

/// The files read must be exactly those listed, byte for byte; `Err` names the first that is
/// not.
pub fn contents(manifest: &Manifest, files: &[(&str, &[u8])]) -> Result<(), String> {
    let v = manifest.version;
    for (name, bytes) in files {
        let Some(listed) = manifest.listed(name) else {
            return Err(format!("file {name} is not in the manifest signed at version {v}: a file added after signing is refused; sign the directory again, or remove it"));
        };
        let sha: [u8; 32] = sha2::Sha256::digest(bytes).into();
        if bytes.len() as u64 != listed.length || sha != listed.sha256 {
            return Err(format!(
                "file {name} is {} bytes with sha256 {}, but the manifest signed at version {v} lists {} bytes with sha256 {}: it changed after signing; sign the directory again, or put it back",
                bytes.len(),
                &manifest::hex(&sha)[..16],
                listed.length,
                &manifest::hex(&listed.sha256)[..16]
            ));
        }
    }
    if let Some(missing) = manifest.files.iter().find(|l| !files.iter().any(|(name, _)| *name == l.name)) {
        return Err(format!(
            "file {} is in the manifest signed at version {v} but was not read: a file removed after signing is refused; sign the directory again, or put it back",
            missing.name
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
