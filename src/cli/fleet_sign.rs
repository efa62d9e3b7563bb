//! Signed declarations in etcd at the command line (issue 44, the fleet): `fleet put --sign`,
//! `fleet rollout start --sign` and `fleet sign`. The manifests are made by `fleet::signed`,
//! the signatures by the operator's own `ssh-keygen -Y sign` (`sign::sign_all`): mesh-host never
//! reads a private key.

use std::ops::ControlFlow;
use std::path::PathBuf;

use super::{EtcdLogin, Usage};
use crate::fleet::signed::{self, META, PROMOTED};
use crate::fleet::Scope;
use crate::system::etcd::{Cond, Etcd, Read, Write};
use crate::trust::{self, Manifest};

/// How `fleet put` and `fleet rollout start` sign what they write.
#[derive(Debug, Clone, clap::Args)]
pub struct SigningArgs {
    /// Sign what is written: a key for `ssh-keygen -Y sign -f` (a private key file, or a `.pub`
    /// whose key is in ssh-agent); repeat it for several signers. The scope's manifest (this
    /// fleet, the scope, a version above the scope's, the expiry, each file's length and
    /// sha256) and its signatures are written in the transaction that writes the files.
    /// Without it, nothing is signed, and nodes run with --allowed-signers refuse it.
    #[arg(long = "sign", value_name = "KEY")]
    pub keys: Vec<PathBuf>,
    /// The manifest's version (above the scope's); by default one above it.
    #[arg(long = "version", value_name = "N", requires = "keys")]
    pub version: Option<u64>,
    /// How long after signing a node still takes it when it first sees it (`90s`, `15m`,
    /// `2h`, `30d`): bounds how long an old signed declaration can be replayed.
    #[arg(long = "expires", value_name = "DURATION", default_value = "30d", value_parser = super::parse_duration)]
    pub expires: std::time::Duration,
    /// The fleet the manifest is for (the nodes' --fleet-name; with --trust-policy, the
    /// policy's).
    #[arg(long, env = "MESH_HOST_FLEET_NAME", value_name = "NAME", default_value = "default")]
    pub fleet_name: String,
    /// The fleet's trust policy (`mesh-host trust init`), the operator's copy: the nodes'
    /// groups for the checks and the waves are those it binds each node to, never those the
    /// nodes report (a node cannot choose its own groups).
    #[arg(long, env = "MESH_HOST_TRUST_POLICY", value_name = "FILE")]
    pub trust_policy: Option<PathBuf>,
    /// `--trust-policy`, once read (`bound`): the roles the signing keys are checked against
    /// before anything is written.
    #[arg(skip)]
    pub policy: Option<trust::Policy>,
}

/// The operator's copy of the trust policy (`--trust-policy FILE` of `fleet put`, `rollout
/// start`, `fleet grant`): read and its root signatures verified (its own root threshold),
/// never taken from etcd. Its expiry is not judged: the operator's tools follow the policy the
/// nodes enforce, which stays in force past it.
pub(super) fn operator_policy(path: &std::path::Path) -> Result<trust::Policy, Usage> {
    let usage = |e: String| Usage(format!("mesh-host: --trust-policy {}: {e}", path.display()));
    let bytes = crate::system::read_input(path, trust::policy::POLICY_LIMIT as u64)
        .map_err(|e| usage(format!("cannot read it: {e}")))?;
    Ok(trust::policy::verify_root(&bytes, None).map_err(usage)?.policy)
}

/// `fleet put`'s and `rollout start`'s check of every node the write reaches (`what`: `this
/// put`, `this rollout`), their groups `--trust-policy`'s when given; the groups it bound.
pub(super) fn check_nodes(
    etcd: &Etcd,
    scope: &Scope,
    wanted: &[(String, Vec<u8>)],
    signing: &mut SigningArgs,
    what: &str,
) -> anyhow::Result<Option<crate::fleet::put::Bound>> {
    let bound = signing.bound()?;
    let checked = crate::fleet::put::check_nodes(etcd, scope, wanted, bound.as_ref());
    match tokio::runtime::Handle::current().block_on(checked)? {
        Ok(_) => Ok(bound),
        Err(refusal) => Err(Usage(refusal.replace("this put", what)).into()),
    }
}

impl SigningArgs {
    /// The groups `--trust-policy` binds each node to, its root signatures verified; the fleet
    /// name taken from it when left at `default`, refused when another. `None` without it.
    pub(super) fn bound(&mut self) -> anyhow::Result<Option<crate::fleet::put::Bound>> {
        let Some(path) = &self.trust_policy else { return Ok(None) };
        let usage = |e: String| Usage(format!("mesh-host: --trust-policy {}: {e}", path.display()));
        let policy = operator_policy(path)?;
        if self.fleet_name == "default" {
            self.fleet_name = policy.fleet.clone();
        } else if self.fleet_name != policy.fleet {
            return Err(usage(format!(
                "it is for fleet {}, not --fleet-name {}",
                policy.fleet, self.fleet_name
            ))
            .into());
        }
        let bound = policy.nodes.iter().cloned().collect();
        self.policy = Some(policy);
        Ok(Some(bound))
    }

    /// With `--trust-policy`, whether the keys of `sigs` (signatures over a manifest for
    /// `scope`, as `sign::sign_all` made them) meet the threshold of the scope's role: refused
    /// before anything is written, naming the scope, the role, its threshold and the keys that
    /// count, rather than written for every node to refuse. Nothing to check without it.
    pub(super) fn meets(&self, scope: &trust::Scope, sigs: &[(String, Vec<u8>)]) -> anyhow::Result<()> {
        let Some(path) = &self.trust_policy else { return Ok(()) };
        let policy = self.policy.as_ref().ok_or_else(|| {
            anyhow::anyhow!("--trust-policy {} was not read before signing", path.display())
        })?;
        let keys = sigs
            .iter()
            .map(|(_, armored)| trust::sshsig::Signature::from_armored(armored).map(|s| s.key))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| anyhow::anyhow!("a signature just made does not read: {e}"))?;
        policy.meets(scope, &keys).map(drop).map_err(|e| {
            Usage(format!("mesh-host: --trust-policy {}: {e}; nothing was written", path.display())).into()
        })
    }
}

/// What `fleet sign` is given.
#[derive(Debug, clap::Args)]
pub struct FleetSign {
    /// etcd's endpoints, comma-separated.
    #[arg(long, env = "MESH_HOST_ETCD", value_name = "ENDPOINTS")]
    pub etcd: String,
    /// TLS and the login to etcd's auth, when they are on.
    #[command(flatten)]
    pub login: EtcdLogin,
    /// Every node's declaration.
    #[arg(long, group = "scope")]
    pub fleet: bool,
    /// The declaration of every node in this group.
    #[arg(long, value_name = "GROUP", group = "scope")]
    pub group: Option<String>,
    /// One node's own declaration.
    #[arg(long, value_name = "NAME", group = "scope")]
    pub node: Option<String>,
    /// A key for `ssh-keygen -Y sign -f` (a private key file, or a `.pub` whose key is in
    /// ssh-agent); repeat it for several signers.
    #[arg(long = "sign", value_name = "KEY", required = true)]
    pub keys: Vec<PathBuf>,
}

/// `fleet put --sign`: the scope's new manifest and its signatures added to `wanted` (keys
/// under the scope's prefix), and what to say of it (`Continue`); or, when the scope holds
/// exactly these files under a manifest of this fleet that lists them, what to say instead of
/// writing anything (`Break`).
pub(super) async fn sign_put(
    etcd: &Etcd,
    scope: &Scope,
    signing: &SigningArgs,
    wanted: &mut Vec<(String, Vec<u8>)>,
) -> anyhow::Result<ControlFlow<String, String>> {
    if let Some(v) = signed::already(etcd, scope, &signing.fleet_name, wanted).await? {
        return Ok(ControlFlow::Break(format!(
            "put: {} already holds exactly this, signed at version {v}; nothing was written (`mesh-host fleet sign` adds a signature)\n",
            scope.describe()
        )));
    }
    let prefix = scope.prefix();
    let above = version_of(signed::current(etcd, &prefix, Read::Linearizable).await?);
    let version =
        signed::next_version(signing.version, above).map_err(|e| Usage(format!("mesh-host: {e}")))?;
    let manifest = signed::manifest(
        &signing.fleet_name,
        signed::scope_of(scope),
        version,
        signing.expires,
        &prefix,
        wanted,
    )
    .map_err(|e| Usage(format!("mesh-host: --sign: {e}")))?;
    let (sigs, by) = super::sign::sign_all(&signing.keys, &manifest, &[])?;
    signing.meets(&signed::scope_of(scope), &sigs)?;
    wanted.extend(signed::keys(&format!("{prefix}{META}"), &manifest, &sigs));
    Ok(ControlFlow::Continue(format!(
        "signed: fleet {}, {}, version {version}, expires in {}, by {}\n",
        signing.fleet_name,
        scope.describe(),
        crate::system::human(signing.expires),
        by.join(", ")
    )))
}

/// A `fleet put` without `--sign` over a scope that is signed: said, since it removes the
/// manifest and its signatures and every node run with `--allowed-signers` refuses it.
pub(super) async fn warn_unsigned(etcd: &Etcd, scope: &Scope) -> anyhow::Result<()> {
    // Serializable: a warning, and the put's transaction checks the scope as it is.
    if let Some(current) = signed::current(etcd, &scope.prefix(), Read::Serializable).await? {
        let version =
            version_of(Some(current)).map_or_else(|| "a manifest".into(), |v| format!("version {v}"));
        eprintln!(
            "mesh-host: {} is signed ({version}); this put without --sign removes its manifest and signatures, and nodes run with --allowed-signers refuse it",
            scope.describe()
        );
    }
    Ok(())
}

/// The version of a manifest read from etcd, if it reads.
fn version_of(current: Option<(Vec<u8>, i64)>) -> Option<u64> {
    current.and_then(|(m, _)| Manifest::parse(&m).ok()).map(|m| m.version)
}

/// `fleet rollout start --sign`: the candidate's manifest (scope `candidate ID SCOPE`) and the
/// one `promote` writes into the scope (scope SCOPE), one version above both the scope's and
/// the last signed rollout's, each signed by every key; `None` without `--sign`.
pub(super) async fn sign_rollout(
    etcd: &Etcd,
    scope: &Scope,
    signing: &SigningArgs,
    id: &str,
    wanted: &[(String, Vec<u8>)],
) -> anyhow::Result<Option<(u64, signed::Keys)>> {
    if signing.keys.is_empty() {
        return Ok(None);
    }
    let prefix = scope.prefix();
    let last = crate::fleet::rollout::snapshot(etcd).await?.last.and_then(|l| l.version);
    let above = version_of(signed::current(etcd, &prefix, Read::Linearizable).await?).max(last);
    let version =
        signed::next_version(signing.version, above).map_err(|e| Usage(format!("mesh-host: {e}")))?;
    let usage = |e: String| Usage(format!("mesh-host: --sign: {e}"));
    let replaces = Box::new(signed::scope_of(scope));
    let candidate = trust::Scope::Candidate { rollout: id.to_owned(), replaces };
    let (fleet, valid) = (&signing.fleet_name, signing.expires);
    let cand = signed::manifest(fleet, candidate, version, valid, &prefix, wanted).map_err(usage)?;
    let promoted =
        signed::manifest(fleet, signed::scope_of(scope), version, valid, &prefix, wanted).map_err(usage)?;
    let (cand_sigs, by) = super::sign::sign_all(&signing.keys, &cand, &[])?;
    signing.meets(&signed::scope_of(scope), &cand_sigs)?;
    let (promoted_sigs, _) = super::sign::sign_all(&signing.keys, &promoted, &[])?;
    let cp = crate::fleet::rollout::candidate_prefix(scope);
    let mut keys = signed::keys(&format!("{cp}{META}"), &cand, &cand_sigs);
    keys.extend(signed::keys(&format!("{cp}{PROMOTED}"), &promoted, &promoted_sigs));
    println!(
        "signed the candidate of rollout {id}: fleet {fleet}, {}, version {version}, expires in {}, by {}",
        scope.describe(),
        crate::system::human(valid),
        by.join(", ")
    );
    Ok(Some((version, keys)))
}

/// `fleet sign`: every key's signature added to the scope's manifest as etcd holds it, provided
/// the scope's files are exactly those it lists, written conditional on the manifest's
/// revision (a manifest replaced meanwhile is not signed unseen).
pub(super) async fn fleet_sign(args: &FleetSign, scope: &Scope) -> anyhow::Result<String> {
    let etcd = args.login.client(&args.etcd)?;
    let prefix = scope.prefix();
    let range = etcd.range_prefix(&prefix, None).await?;
    let parts = signed::split(&prefix, &range.kvs);
    let key = signed::manifest_key(&prefix);
    let (Some(manifest), Some(at)) =
        (parts.manifest, range.kvs.iter().find(|kv| kv.key == key).map(|kv| kv.mod_revision))
    else {
        return Err(Usage(format!(
            "mesh-host: {} holds no manifest ({key}) to sign; put it with `mesh-host fleet put --sign KEY`",
            scope.describe()
        ))
        .into());
    };
    let refuse =
        |why: String| Usage(format!("mesh-host: {}'s manifest {why}; nothing was signed", scope.describe()));
    let parsed = Manifest::parse(manifest).map_err(|e| refuse(format!("does not read: {e}")))?;
    if parsed.scope != signed::scope_of(scope) {
        return Err(refuse(format!("is for the {} declaration, not this one", parsed.scope)).into());
    }
    trust::contents(&parsed, &parts.files)
        .map_err(|e| refuse(format!("does not match the keys in etcd: {e}")))?;
    println!(
        "signing {}: fleet {}, version {}, {} file(s), expires at {} (seconds since the epoch), {} signature(s) there",
        scope.describe(),
        parsed.fleet,
        parsed.version,
        parsed.files.len(),
        parsed.expires,
        parts.signatures.len()
    );
    let (added, by) = super::sign::sign_all(&args.keys, manifest, &parts.signatures)?;
    let writes: Vec<Write> = signed::keys(&format!("{prefix}{META}"), manifest, &added)
        .into_iter()
        .skip(1)
        .map(|(key, value)| Write::Put { key, value, lease: 0 })
        .collect();
    match etcd.txn(&[Cond::WrittenAt(key, at)], &writes).await? {
        Some(revision) => Ok(format!(
            "sign: {} version {} at revision {revision}: signed by {}; {} signature(s) in all\n",
            scope.describe(),
            parsed.version,
            by.join(", "),
            parts.signatures.len() + added.len()
        )),
        None => Err(Usage(format!(
            "mesh-host: {}'s manifest changed in etcd while it was being signed; nothing was written. Look again and sign again",
            scope.describe()
        ))
        .into()),
    }
}
