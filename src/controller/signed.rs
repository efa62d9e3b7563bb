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
use crate::trust::{self, AllowedSigners, Floor, Policy, Reason, Refusal, Scope};

/// What the node trusts: the keys of `--allowed-signers` and how many distinct ones must sign,
/// or a signed policy's roles (`--trust-policy`); and the fleet name a manifest must carry.
#[derive(Clone, Debug)]
pub struct Trust {
    keys: Arc<Keys>,
    /// The allowed_signers file, or the policy file, for messages.
    pub path: PathBuf,
    /// Distinct keys required (`--signatures-required`, at least 1); a policy's roles each
    /// say their own.
    pub required: usize,
    /// The fleet name a manifest must carry (`--fleet-name`, or the policy's).
    pub fleet: String,
}

/// Whose keys count: one list for every scope, or a policy's role per scope.
#[derive(Debug)]
enum Keys {
    Signers(AllowedSigners),
    Policy {
        policy: Policy,
        /// Each role's name, its keys, and what a key outside them is said to be.
        roles: Vec<(String, AllowedSigners, String)>,
        /// Every key the policy names.
        all: AllowedSigners,
        /// No key: a scope no role covers.
        none: AllowedSigners,
    },
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
        let keys = Arc::new(Keys::Signers(signers));
        Ok(Trust { keys, path: path.to_owned(), required, fleet })
    }

    /// Reads the policy file `path` and takes it against the one pinned under `state`
    /// (`trust::policy::adopt`: the same, a first one, or a rotation of the pinned one); with
    /// `pin`, a new one is pinned, durably, before it is used. `fleet` (`--fleet-name`) must be
    /// the policy's unless left at `default`.
    pub fn from_policy(path: &Path, state: &Path, pin: bool, fleet: &str) -> anyhow::Result<Trust> {
        let given = crate::system::read_input(path, trust::policy::POLICY_LIMIT as u64)
            .map_err(|e| anyhow::anyhow!("cannot read the trust policy {}: {e}", path.display()))?;
        let pinned_at = mark_path(state, "policy");
        let pinned = match crate::system::read_input(&pinned_at, trust::policy::POLICY_LIMIT as u64) {
            Ok(bytes) => Some(bytes),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => anyhow::bail!("cannot read the pinned trust policy {}: {e}", pinned_at.display()),
        };
        let now = crate::system::unix_secs();
        let (verified, new) = trust::policy::adopt(pinned.as_deref(), &given, now).map_err(|e| {
            anyhow::anyhow!(
                "the trust policy {} is refused: {e} (pinned: {})",
                path.display(),
                pinned_at.display()
            )
        })?;
        let policy = verified.policy;
        if fleet != "default" && fleet != policy.fleet {
            anyhow::bail!(
                "--fleet-name {fleet} is not fleet {}, which the trust policy {} is for",
                policy.fleet,
                path.display()
            );
        }
        if new && pin {
            crate::system::fs::write_own(&pinned_at, &given).map_err(|e| {
                anyhow::anyhow!("cannot pin the trust policy at {}: {e}", pinned_at.display())
            })?;
        }
        if now >= policy.expires {
            tracing::warn!(
                version = policy.version,
                expires = policy.expires,
                "the trust policy {} expired; it stays in force until a rotation replaces it",
                path.display()
            );
        }
        let v = policy.version;
        let roles = policy
            .roles
            .iter()
            .map(|r| {
                let whose = format!(
                    "role {} of policy version {v} does not list ({} of: {})",
                    r.name,
                    r.threshold,
                    r.keys.join(", ")
                );
                (r.name.clone(), policy.signers(r), whose)
            })
            .collect();
        let (all, none) = (policy.all_signers(), AllowedSigners::default());
        let fleet = policy.fleet.clone();
        let keys = Arc::new(Keys::Policy { policy, roles, all, none });
        Ok(Trust { keys, path: path.to_owned(), required: 1, fleet })
    }

    /// The policy, when the node runs with one.
    pub fn policy(&self) -> Option<&Policy> {
        match &*self.keys {
            Keys::Signers(_) => None,
            Keys::Policy { policy, .. } => Some(policy),
        }
    }

    /// How many distinct keys it trusts.
    pub fn keys(&self) -> usize {
        match &*self.keys {
            Keys::Signers(s) => s.distinct_keys(),
            Keys::Policy { all, .. } => all.distinct_keys(),
        }
    }

    /// What `trust::verify` expects of a manifest read for `scope`, against its mark `floor`:
    /// with a policy, the keys and threshold of the scope's role.
    pub fn expect<'a>(&'a self, scope: &'a Scope, floor: Option<&'a Floor>) -> trust::Expect<'a> {
        let (signers, known, whose, required) = match &*self.keys {
            Keys::Signers(s) => (s, s, "the allowed signers do not list".to_owned(), self.required),
            Keys::Policy { policy, roles, all, none } => {
                match policy.role_for(scope).and_then(|r| roles.iter().find(|(n, ..)| *n == r.name).zip(Some(r))) {
                    Some(((_, signers, whose), role)) => (signers, all, whose.clone(), role.threshold),
                    None => (
                        none,
                        all,
                        format!(
                            "no role of policy version {} lets sign: it has no role for the {scope} declaration",
                            policy.version
                        ),
                        1,
                    ),
                }
            }
        };
        trust::Expect {
            signers,
            known,
            whose,
            required,
            fleet: &self.fleet,
            scope,
            floor,
            now: crate::system::unix_secs(),
        }
    }
}

/// Where the high-water mark of the local directory is kept.
pub fn floor_path(state: &Path) -> PathBuf {
    mark_path(state, "local")
}

/// Where a high-water mark is kept, by its name: `local`, or a scope read from etcd (`fleet`,
/// `group.G`, `node.N`, and `candidate.` before one of those for a rollout's candidate).
pub fn mark_path(state: &Path, name: &str) -> PathBuf {
    crate::store::state_dir(state).join("trust").join(name)
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
    let floor = read_mark(state, "local").map_err(|m| refuse(Reason::Rollback, m))?;
    let named: Vec<(String, &[u8])> = files
        .iter()
        .map(|(p, b)| {
            (p.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned()), b.as_slice())
        })
        .collect();
    let named: Vec<(&str, &[u8])> = named.iter().map(|(n, b)| (n.as_str(), *b)).collect();
    let expect = trust.expect(&Scope::Local, floor.as_ref());
    trust::verify(&trust::Signed { manifest, signatures }, &named, &expect)
}

/// The persisted mark of this name (`mark_path`); `Err` (said) when it is there and cannot be
/// read or is damaged.
pub fn read_mark(state: &Path, name: &str) -> Result<Option<Floor>, String> {
    let path = mark_path(state, name);
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
    persist_mark(state, "local", accepted)
}

/// `persist`, for the mark of this name (`mark_path`).
pub fn persist_mark(state: &Path, name: &str, accepted: &trust::Accepted) -> std::io::Result<()> {
    if !accepted.first_seen {
        return Ok(());
    }
    // A deliberately broken build of the mark's write, for the check the kill rounds make after
    // each round to show that it fails (tests/reliability/kill_rounds.rs): the write is lost,
    // as one never made durable, or made after the pass, would be.
    if crate::system::fs::failpoint_named("trust-mark-lost") {
        return Ok(());
    }
    let path = mark_path(state, name);
    crate::system::fs::write_own(&path, accepted.floor.render().as_bytes()).map_err(|e| {
        std::io::Error::other(format!("cannot keep the high-water mark {}: {e}", path.display()))
    })
}

/// One signed scope of the declaration in force, as `/healthz`, the gauge and the node's status
/// say it: its scope, version, expiry and who signed it (principals and key fingerprints, never
/// a secret). A manifest in force stays in force after it expires (it was judged when first
/// seen; nothing newer has been accepted): this is how that is seen (docs/decisions.md,
/// "Expired in force").
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct InForce {
    /// The scope, as a manifest names it (`fleet`, `group web`, `node web-1`, `local`, or a
    /// rollout's `candidate ...`).
    pub scope: String,
    /// The manifest's version.
    pub version: u64,
    /// When it expires, seconds since the epoch.
    pub expires: u64,
    /// One entry per distinct trusted key that signed it.
    pub signed_by: Vec<String>,
}

impl InForce {
    /// What an accepted manifest says.
    pub fn of(accepted: &trust::Accepted) -> InForce {
        InForce {
            scope: accepted.manifest.scope.to_string(),
            version: accepted.manifest.version,
            expires: accepted.manifest.expires,
            signed_by: accepted.signed_by.clone(),
        }
    }

    /// The gauge's label: the kind of scope (a candidate's is the kind it stands in for), one
    /// of a closed few, never a group's or node's name.
    pub fn kind(&self) -> &'static str {
        let scope = self
            .scope
            .strip_prefix("candidate ")
            .and_then(|s| s.split_once(' '))
            .map_or(self.scope.as_str(), |(_, r)| r);
        match scope.split(' ').next() {
            Some("fleet") => "fleet",
            Some("group") => "group",
            Some("node") => "node",
            Some("local") => "local",
            _ => "other",
        }
    }
}

/// The file in a declaration directory written by a verifier of its own (the fleet's source,
/// into its cache) naming the signed scopes of what it holds: hidden, so never read as a part of
/// the declaration; read only where the daemon's config says its source has such a verifier
/// (`Config::summary`), since anyone who can write a plain directory could write it too.
pub const SUMMARY: &str = ".signed.json";

/// The signed scopes `dir`'s summary names; none when it has no summary or it cannot be read
/// (then nothing is said of who signed it, which is what is known).
pub fn read_summary(dir: &Path) -> Vec<InForce> {
    crate::system::read_input(&dir.join(SUMMARY), 1 << 20)
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .unwrap_or_default()
}

/// Which of `signed` are in force past their expiry at `now`, in words for `/healthz`; `None`
/// when none is.
pub fn expired_note(signed: &[InForce], now: u64) -> Option<String> {
    let expired: Vec<String> = signed
        .iter()
        .filter(|s| now >= s.expires)
        .map(|s| format!("{} version {} expired {} s ago", s.scope, s.version, now - s.expires))
        .collect();
    (!expired.is_empty()).then(|| {
        format!(
            "signed declaration in force past its expiry, still enforced until a newer one is signed and accepted: {}",
            expired.join("; ")
        )
    })
}

/// The trust policy in force (version `version`) past its expiry at `now`, in words for
/// `/healthz`; `None` while it is not. It stays in force (it was judged when first taken, and
/// the node's alternative would be trusting nothing, or an older policy), until a rotation
/// signed by its root keys is installed.
pub fn policy_expired_note(version: u64, expires: u64, now: u64) -> Option<String> {
    (now >= expires).then(|| {
        format!(
            "trust policy version {version} in force past its expiry ({} s ago), still enforced until a rotation is installed (`mesh-host trust rotate`)",
            now - expires
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::metrics::REFUSAL_REASONS;

    #[test]
    fn an_expired_scope_in_force_is_named_and_a_candidate_counts_as_what_it_replaces() {
        let s = |scope: &str, expires| InForce {
            scope: scope.into(),
            version: 3,
            expires,
            signed_by: vec!["alice SHA256:x".into()],
        };
        let signed = [s("fleet", 100), s("group web", 200), s("candidate rollout-1 group web", 50)];
        assert_eq!(signed.iter().map(InForce::kind).collect::<Vec<_>>(), ["fleet", "group", "group"]);
        assert_eq!(s("local", 1).kind(), "local");
        assert_eq!(expired_note(&signed, 49), None);
        let note = expired_note(&signed, 150).unwrap();
        assert!(note.contains("fleet version 3 expired 50 s ago"), "{note}");
        assert!(note.contains("candidate rollout-1 group web version 3 expired 100 s ago"), "{note}");
        assert_eq!(note.matches("expired ").count(), 2, "group web is not expired: {note}");
    }
    use crate::trust::Reason;

    #[test]
    fn every_reason_is_exported_at_zero_by_the_daemon() {
        for reason in [Reason::Signature, Reason::Scope, Reason::Rollback, Reason::Expired, Reason::Contents]
        {
            assert!(REFUSAL_REASONS.contains(&reason.label()), "{}", reason.label());
        }
    }
}
