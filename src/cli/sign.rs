//! Signed declarations at the command line (issue 44, the local directory): `--allowed-signers`
//! for `run`, `apply`, `plan` and `check`, and `mesh-host sign DIR --sign KEY`, which writes a
//! directory's manifest and has the operator's own `ssh-keygen -Y sign` sign it (a key file,
//! or the key in ssh-agent when given its `.pub`). mesh-host never reads a private key.

use std::path::{Path, PathBuf};

use anyhow::Context as _;

use super::{Ended, Usage};
use crate::controller::signed::{self, Trust};
use crate::system::input::SIGNED_DIR;
use crate::trust::{self, Listed, Manifest, Scope};

/// How a declaration directory is verified before it is parsed.
#[derive(Debug, Clone, clap::Args)]
pub struct TrustArgs {
    /// An allowed_signers file (OpenSSH's format, as `ssh-keygen -Y verify` and git read it).
    /// With it, a declaration directory is applied only when its manifest
    /// (`DIR/.mesh-host/manifest`, written by `mesh-host sign`) is signed by enough of these
    /// keys, is for this fleet and the local scope, is not older than what this node accepted,
    /// had not expired when first seen, and lists exactly the files read. Without it,
    /// unsigned declarations are applied, as before.
    #[arg(long, env = "MESH_HOST_ALLOWED_SIGNERS", value_name = "FILE")]
    pub allowed_signers: Option<PathBuf>,
    /// A signed trust policy (`mesh-host trust init`), in place of --allowed-signers: each
    /// scope is verified against the keys and threshold of the policy's role for it, the fleet
    /// name is the policy's, and with --etcd the node's groups are those the policy binds it to
    /// (a --group that differs is refused). Pinned in the state directory when first taken; a
    /// later file is taken only as a rotation of the pinned one (signed by a threshold of its
    /// root keys and of its own, at a higher version).
    #[arg(
        long,
        env = "MESH_HOST_TRUST_POLICY",
        value_name = "FILE",
        conflicts_with_all = ["allowed_signers", "signatures_required"]
    )]
    pub trust_policy: Option<PathBuf>,
    /// How many distinct keys of --allowed-signers must have signed (one key signing twice
    /// counts once).
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    pub signatures_required: u16,
    /// The fleet name a signed manifest must carry (`mesh-host sign --fleet-name`): keeps a
    /// directory signed for one fleet (staging) from being applied in another (production).
    #[arg(long, env = "MESH_HOST_FLEET_NAME", value_name = "NAME", default_value = "default")]
    pub fleet_name: String,
}

impl TrustArgs {
    /// What the node trusts; `None` without `--allowed-signers` or `--trust-policy`. A policy
    /// new to `state` is pinned there when `pin` (`run`, `apply`). With `strict`, the file is
    /// checked as a source (`system::strict`).
    pub fn load(
        &self,
        state: &Path,
        pin: bool,
        strict: Option<&crate::system::Trusted>,
    ) -> anyhow::Result<Option<Trust>> {
        if let Some(policy) = &self.trust_policy {
            if let Some(trusted) = strict {
                crate::system::strict::check(policy, trusted).map_err(|e| {
                    Usage(format!(
                        "mesh-host: --trust-policy: cannot read the trust policy {}: {e}",
                        policy.display()
                    ))
                })?;
            }
            let trust = Trust::from_policy(policy, state, pin, &self.fleet_name)
                .map_err(|e| Usage(format!("mesh-host: --trust-policy: {e}")))?;
            return Ok(Some(trust));
        }
        let Some(path) = &self.allowed_signers else { return Ok(None) };
        let trust = Trust::load(path, usize::from(self.signatures_required), self.fleet_name.clone(), strict)
            .map_err(|e| Usage(format!("mesh-host: --allowed-signers: {e}")))?;
        Ok(Some(trust))
    }
}

/// What `run` verifies: `None` without `--allowed-signers`, said once at start either way. With
/// `--etcd`, each scope read from etcd (`fleet::signed`); without, the local directory.
pub(super) fn daemon_trust(
    args: &TrustArgs,
    etcd: bool,
    declaration: &Path,
    state: &Path,
) -> anyhow::Result<Option<Trust>> {
    let Some(trust) = args.load(state, true, Some(&crate::system::Trusted::agent()))? else {
        tracing::warn!(
            "declarations are not signed: whoever can write {} is root here; --allowed-signers FILE applies only what trusted keys signed",
            if etcd { "the fleet's declarations in etcd".to_owned() } else { declaration.display().to_string() }
        );
        return Ok(None);
    };
    if let Some(policy) = trust.policy() {
        tracing::info!(
            trust_policy = %trust.path.display(),
            version = policy.version,
            keys = trust.keys(),
            roles = %policy.roles.iter().map(|r| r.name.as_str()).collect::<Vec<_>>().join(","),
            fleet = %trust.fleet,
            "declarations are applied only when signed as the trust policy's roles say: {} is verified before it is parsed",
            if etcd { "each scope read from etcd".to_owned() } else { declaration.display().to_string() }
        );
        return Ok(Some(trust));
    }
    tracing::info!(
        allowed_signers = %trust.path.display(),
        keys = trust.keys(),
        required = trust.required,
        fleet = %trust.fleet,
        "declarations are applied only when signed: {} is verified before it is parsed",
        if etcd { "each scope read from etcd".to_owned() } else { declaration.display().to_string() }
    );
    Ok(Some(trust))
}

/// The groups a node run with `--etcd` reads, each name checked: with a trust policy, those it
/// binds the node to, never the node's own choice (a `--group` that differs is refused).
pub(super) fn node_groups(
    trust: Option<&Trust>,
    node: &str,
    groups: Vec<String>,
) -> anyhow::Result<Vec<String>> {
    for g in &groups {
        crate::fleet::check_name("--group", g).map_err(|e| Usage(format!("mesh-host: {e}")))?;
    }
    match trust.and_then(Trust::policy) {
        Some(policy) => {
            Ok(policy.bound_groups(node, &groups).map_err(|e| Usage(format!("mesh-host: {e}")))?)
        }
        None => Ok(groups),
    }
}

/// What `check`, `plan` and `apply` verify, whether the high-water mark is kept (`apply`), and
/// whose files are trusted as sources (`apply`, and `plan --run-verify`: docs/decisions.md,
/// "Strict sources").
pub(super) struct Verify {
    trust: Option<Trust>,
    state: PathBuf,
    persist: bool,
    /// The users whose declaration and allowed signers are read, or `None`: not checked.
    pub(super) strict: Option<crate::system::Trusted>,
}

impl Verify {
    /// From the command's arguments; with `strict`, the declaration and the allowed signers
    /// or trust policy are checked as sources (for root, the agent and the operator who ran it
    /// under sudo).
    pub(super) fn of(args: &TrustArgs, state: &Path, persist: bool, strict: bool) -> anyhow::Result<Verify> {
        let strict = strict.then(crate::system::Trusted::operator);
        Ok(Verify {
            trust: args.load(state, persist, strict.as_ref())?,
            state: state.to_owned(),
            persist,
            strict,
        })
    }
}

/// Verifies what a one-shot command read from `source` (`files`), before it is parsed; with
/// `persist` (`apply`), the high-water mark is kept before the pass. A refusal is returned as
/// itself: exit code 2, nothing touched.
pub(super) fn verify_read(
    verify: Option<&Verify>,
    source: &Path,
    files: &[(PathBuf, Vec<u8>)],
) -> anyhow::Result<()> {
    let Some(Verify { trust: Some(trust), state, persist, .. }) = verify else { return Ok(()) };
    if source == Path::new("-") {
        return Err(Usage(
            "mesh-host: --allowed-signers and --trust-policy verify a directory; standard input cannot be signed".into(),
        )
        .into());
    }
    let read = signed::read(source);
    let accepted = signed::check(trust, source, files, &read, state)?;
    if *persist {
        signed::persist(state, &accepted)?;
    }
    tracing::info!(
        version = accepted.manifest.version,
        signed_by = %accepted.signed_by.join(", "),
        "signed declaration verified"
    );
    Ok(())
}

/// What `mesh-host sign` is given.
#[derive(Debug, clap::Args)]
pub struct SignArgs {
    /// The declaration directory: every `*.json` in it is listed in its manifest.
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
    /// A signing key for `ssh-keygen -Y sign -f`: a private key file, or a `.pub` whose key
    /// is in ssh-agent. Repeat it for several signers.
    #[arg(long = "sign", value_name = "KEY", required = true)]
    pub keys: Vec<PathBuf>,
    /// The manifest's version (higher than the one in DIR); by default the one in DIR plus 1.
    #[arg(long, value_name = "N", conflicts_with = "add")]
    pub version: Option<u64>,
    /// How long a node takes it after signing (`90s`, `15m`, `2h`, `30d`): one first seen later
    /// is refused as expired, which bounds how long an old signed directory can be replayed.
    #[arg(long, value_name = "DURATION", default_value = "30d", value_parser = super::parse_duration, conflicts_with = "add")]
    pub expires: std::time::Duration,
    /// The fleet the manifest is for (the nodes' --fleet-name).
    #[arg(long, value_name = "NAME", default_value = "default", conflicts_with = "add")]
    pub fleet_name: String,
    /// Add signatures to DIR's manifest as it is (a second operator co-signing), rather than
    /// writing a new manifest; refused when DIR's files no longer match it.
    #[arg(long)]
    pub add: bool,
}

/// `mesh-host sign`: the manifest written (or kept, with `--add`), each key's signature
/// made by `ssh-keygen` and checked here, both written into `DIR/.mesh-host/` in one step.
pub fn sign(args: SignArgs) -> anyhow::Result<Ended> {
    let dir = &args.dir;
    if !dir.is_dir() {
        return Err(Usage(format!(
            "mesh-host sign: {} is not a directory; only a directory is signed",
            dir.display()
        ))
        .into());
    }
    let files = crate::system::read_source(dir).with_context(|| format!("cannot read {}", dir.display()))?;
    let named: Vec<(String, &[u8])> = files
        .iter()
        .map(|(p, b)| {
            (p.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned()), b.as_slice())
        })
        .collect();
    let previous =
        signed::read(dir).with_context(|| format!("cannot read {}/{SIGNED_DIR}", dir.display()))?;
    let (manifest, mut signatures) = if args.add {
        added_to(dir, previous, &named)?
    } else {
        (new_manifest(&args, previous.as_ref().map(|(m, _)| m.as_slice()), &named)?, Vec::new())
    };
    let parsed = Manifest::parse(&manifest).map_err(|e| Usage(format!("mesh-host sign: {e}")))?;
    let (added, by) = sign_all(&args.keys, &manifest, &signatures)?;
    signatures.extend(added);
    let mut written = vec![("manifest".to_owned(), manifest)];
    written.extend(signatures);
    let target = dir.join(SIGNED_DIR);
    crate::system::fs::replace_dir(&target, &written)
        .with_context(|| format!("cannot write {}", target.display()))?;
    println!(
        "signed {}: fleet {}, version {}, {} files, expires {} (seconds since the epoch), by {}; in {}",
        dir.display(),
        parsed.fleet,
        parsed.version,
        parsed.files.len(),
        parsed.expires,
        by.join(", "),
        target.display()
    );
    Ok(Ended::Converged)
}

/// A new manifest of the files read, one version above DIR's (or `--version`).
fn new_manifest(
    args: &SignArgs,
    previous: Option<&[u8]>,
    named: &[(String, &[u8])],
) -> anyhow::Result<Vec<u8>> {
    use sha2::Digest as _;
    let before = previous.and_then(|m| Manifest::parse(m).ok()).map(|m| m.version);
    let version = match (args.version, before) {
        (Some(v), Some(b)) if v <= b => {
            return Err(Usage(format!(
                "mesh-host sign: --version {v} is not above version {b}, already in {}: a node that saw {b} refuses it as a rollback",
                args.dir.display()
            ))
            .into())
        }
        (Some(v), _) => v,
        (None, b) => b.map_or(1, |b| b + 1),
    };
    let issued = crate::system::unix_secs();
    let mut files = Vec::new();
    for (name, bytes) in named {
        trust::manifest::file_name(name).map_err(|e| Usage(format!("mesh-host sign: {e}")))?;
        files.push(Listed {
            name: name.clone(),
            length: bytes.len() as u64,
            sha256: sha2::Sha256::digest(bytes).into(),
        });
    }
    let manifest = Manifest {
        fleet: args.fleet_name.clone(),
        scope: Scope::Local,
        version,
        issued,
        expires: issued.saturating_add(args.expires.as_secs().max(1)),
        files,
    };
    let bytes = manifest.render().into_bytes();
    Manifest::parse(&bytes).map_err(|e| Usage(format!("mesh-host sign: --fleet-name: {e}")))?;
    Ok(bytes)
}

/// DIR's manifest as it is, and its signatures, for `--add`: refused when it is missing or no
/// longer lists exactly DIR's files.
#[allow(clippy::type_complexity, reason = "the manifest's bytes, and each signature's name and bytes")]
fn added_to(
    dir: &Path,
    previous: signed::SignedFiles,
    named: &[(String, &[u8])],
) -> anyhow::Result<(Vec<u8>, Vec<(String, Vec<u8>)>)> {
    let Some((manifest, signatures)) = previous else {
        return Err(Usage(format!(
            "mesh-host sign --add: {} has no manifest to add to; sign it without --add",
            dir.display()
        ))
        .into());
    };
    let parsed =
        Manifest::parse(&manifest).map_err(|e| Usage(format!("mesh-host sign --add: its manifest: {e}")))?;
    let files: Vec<(&str, &[u8])> = named.iter().map(|(n, b)| (n.as_str(), *b)).collect();
    trust::contents(&parsed, &files)
        .map_err(|e| Usage(format!("mesh-host sign --add: {}: {e}", dir.display())))?;
    Ok((manifest, signatures))
}

/// Each key's signature of `manifest`, made by `ssh-keygen` and checked here, named
/// `manifest.N.sig` after those already there (`existing`); and who signed, for messages.
#[allow(clippy::type_complexity, reason = "each signature's name and bytes, and each signer")]
pub(super) fn sign_all(
    keys: &[PathBuf],
    manifest: &[u8],
    existing: &[(String, Vec<u8>)],
) -> anyhow::Result<(Vec<(String, Vec<u8>)>, Vec<String>)> {
    let mut by = Vec::new();
    let mut added: Vec<(String, Vec<u8>)> = Vec::new();
    for key in keys {
        let armored = ssh_sign(key, manifest)?;
        let sig = trust::sshsig::Signature::from_armored(armored.as_bytes())
            .and_then(|s| s.verify(trust::NAMESPACE, manifest).map(|()| s))
            .map_err(|e| {
                anyhow::anyhow!("ssh-keygen's signature with {} does not verify: {e}", key.display())
            })?;
        by.push(format!("{} key {}", sig.key.kind(), sig.key.fingerprint()));
        let taken = |name: &str| existing.iter().chain(&added).any(|(n, _)| n == name);
        let n = (1..).find(|n| !taken(&format!("manifest.{n}.sig"))).unwrap_or(1);
        added.push((format!("manifest.{n}.sig"), armored.into_bytes()));
    }
    Ok((added, by))
}

/// The operator's `ssh-keygen -Y sign`, the manifest on its standard input and the armored
/// signature on its standard output; its prompts (a passphrase, a touch) reach the terminal.
fn ssh_sign(key: &Path, manifest: &[u8]) -> anyhow::Result<String> {
    ssh_sign_in(key, manifest, trust::NAMESPACE)
}

/// `ssh_sign` in another namespace (a trust policy's, `trust::policy::POLICY_NAMESPACE`).
pub(super) fn ssh_sign_in(key: &Path, manifest: &[u8], namespace: &str) -> anyhow::Result<String> {
    let key_arg = key.to_string_lossy();
    let argv = ["ssh-keygen", "-q", "-Y", "sign", "-f", &key_arg, "-n", namespace];
    let ran = crate::system::command::run_talking(&argv, manifest).map_err(|e| {
        anyhow::anyhow!(
            "{e}; mesh-host sign runs OpenSSH's ssh-keygen (Debian: apt-get install openssh-client)"
        )
    })?;
    if !ran.success() {
        anyhow::bail!(
            "ssh-keygen -Y sign with {} failed ({}); what it said is above",
            key.display(),
            ran.describe()
        );
    }
    Ok(ran.stdout)
}
