//! A signed local directory (issue 44, its local part): what `--allowed-signers` makes the
//! daemon, and `apply`, `plan` and `check`, do with a declaration directory before it is
//! parsed. The decision is `trust::verify`'s (pure); this reads its inputs (the manifest and
//! signatures under `DIR/.mesh-host/`, the high-water mark under the state directory) through
//! `system`, and persists the mark, durably, before the caller puts the declaration in force.
//!
//! The mark is `<state dir>/trust/local`: the highest version accepted and its manifest's
//! digest. Damaged or unreadable, it refuses everything (`rollback`) until it is fixed; it is
//! never taken for "no mark", which would let an older declaration in.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::system::input::SIGNED_DIR;
use crate::trust::{self, AllowedSigners, Floor, Reason, Refusal, Scope};

/// What the node trusts: the keys of `--allowed-signers`, how many distinct ones must sign,
/// and the fleet name a manifest must carry.
#[derive(Clone, Debug)]
pub struct Trust {
    signers: Arc<AllowedSigners>,
    /// The allowed_signers file, for messages.
    pub path: PathBuf,
    /// Distinct keys required (`--signatures-required`, at least 1).
    pub required: usize,
    /// The fleet name a manifest must carry (`--fleet-name`).
    pub fleet: String,
}

impl Trust {
    /// Reads the allowed_signers file, refusing one that lists no key for declarations or
    /// fewer than `required`: a node that could never accept anything is a mistake to say at
    /// start, not a refusal at every read.
    ///
    /// With `strict` (`run`, `apply`), the file is a source of trust, checked as strictly as
    /// the declaration (`system::strict`) for those users.
    pub fn load(
        path: &Path,
        required: usize,
        fleet: String,
        strict: Option<&crate::system::Trusted>,
    ) -> anyhow::Result<Trust> {
        if let Some(trusted) = strict {
            crate::system::strict::check(path, trusted)
                .map_err(|e| anyhow::anyhow!("cannot read the allowed signers {}: {e}", path.display()))?;
        }
        let bytes = crate::system::read_input(path, trust::signers::SIGNERS_LIMIT)
            .map_err(|e| anyhow::anyhow!("cannot read the allowed signers {}: {e}", path.display()))?;
        let signers = AllowedSigners::parse(&bytes)
            .map_err(|e| anyhow::anyhow!("the allowed signers {}: {e}", path.display()))?;
        let keys = signers.distinct_keys();
        if keys < required {
            anyhow::bail!(
                "the allowed signers {} list {keys} distinct key(s) for declarations (namespace {}), fewer than the {required} --signatures-required: nothing could ever be applied",
                path.display(),
                trust::NAMESPACE
            );
        }
        Ok(Trust { signers: Arc::new(signers), path: path.to_owned(), required, fleet })
    }

    /// How many distinct keys it trusts.
    pub fn keys(&self) -> usize {
        self.signers.distinct_keys()
    }
}

/// Where the high-water mark of the local directory is kept.
pub fn floor_path(state: &Path) -> PathBuf {
    crate::store::state_dir(state).join("trust").join("local")
}

/// The manifest and signatures of a directory source, read now (`None`: no manifest).
pub type SignedFiles = Option<(Vec<u8>, Vec<(String, Vec<u8>)>)>;

/// Reads `DIR/.mesh-host/`'s manifest and signatures.
pub fn read(source: &Path) -> std::io::Result<SignedFiles> {
    crate::system::input::read_signed(
        source,
        trust::manifest::MANIFEST_LIMIT as u64,
        trust::sshsig::SIGNATURE_LIMIT as u64,
    )
}

/// Verifies the files read from `source` against its manifest and signatures (`signed`, read
/// with them) and the persisted mark. `Ok` carries what to `persist` before it is put in force.
pub fn check(
    trust: &Trust,
    source: &Path,
    files: &[(PathBuf, Vec<u8>)],
    signed: &std::io::Result<SignedFiles>,
    state: &Path,
) -> Result<trust::Accepted, Refusal> {
    let what = format!("the local declaration of fleet {}", trust.fleet);
    let refuse = |reason, message: String| Refusal { reason, message: format!("{what}: {message}") };
    if !source.is_dir() {
        return Err(refuse(
            Reason::Signature,
            format!(
                "{} is not a directory: only a directory is signed (its manifest in {SIGNED_DIR}/)",
                source.display()
            ),
        ));
    }
    let (manifest, signatures) = match signed {
        Ok(Some((m, s))) => (m, s),
        Ok(None) => {
            return Err(refuse(
                Reason::Signature,
                format!(
                    "{} has no {SIGNED_DIR}/manifest: it is not signed; sign it with `mesh-host sign {} --sign KEY`",
                    source.display(),
                    source.display()
                ),
            ))
        }
        Err(e) => return Err(refuse(Reason::Signature, format!("cannot read its manifest or signatures: {e}"))),
    };
    let floor = read_floor(state).map_err(|m| refuse(Reason::Rollback, m))?;
    let named: Vec<(String, &[u8])> = files
        .iter()
        .map(|(p, b)| {
            (p.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned()), b.as_slice())
        })
        .collect();
    let named: Vec<(&str, &[u8])> = named.iter().map(|(n, b)| (n.as_str(), *b)).collect();
    let expect = trust::Expect {
        signers: &trust.signers,
        required: trust.required,
        fleet: &trust.fleet,
        scope: &Scope::Local,
        floor: floor.as_ref(),
        now: crate::system::unix_secs(),
    };
    trust::verify(&trust::Signed { manifest, signatures }, &named, &expect)
}

/// The persisted mark; `Err` (said) when it is there and cannot be read or is damaged.
fn read_floor(state: &Path) -> Result<Option<Floor>, String> {
    let path = floor_path(state);
    match crate::system::read_input(&path, 4096) {
        Ok(bytes) => Floor::parse(&bytes).map(Some).map_err(|e| {
            format!(
                "the high-water mark {} is damaged ({e}): nothing is accepted until it is put right; removing it accepts the next signed version, whatever its number",
                path.display()
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("cannot read the high-water mark {}: {e}", path.display())),
    }
}

/// Persists the mark of an accepted manifest, durably (written, synced, renamed, the
/// directory synced), before it is put in force. A manifest read again writes nothing.
pub fn persist(state: &Path, accepted: &trust::Accepted) -> std::io::Result<()> {
    if !accepted.first_seen {
        return Ok(());
    }
    let path = floor_path(state);
    crate::system::fs::write_own(&path, accepted.floor.render().as_bytes()).map_err(|e| {
        std::io::Error::other(format!("cannot keep the high-water mark {}: {e}", path.display()))
    })
}

#[cfg(test)]
mod tests {
    use crate::telemetry::metrics::REFUSAL_REASONS;
    use crate::trust::Reason;

    #[test]
    fn every_reason_is_exported_at_zero_by_the_daemon() {
        for reason in [Reason::Signature, Reason::Scope, Reason::Rollback, Reason::Expired, Reason::Contents]
        {
            assert!(REFUSAL_REASONS.contains(&reason.label()), "{}", reason.label());
        }
    }
}
