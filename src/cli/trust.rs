//! The trust policy at the command line (issue 44, point 4): `mesh-host trust init` makes a
//! signed policy from a draft, `trust show` prints one, `trust rotate` verifies a new one as a
//! rotation of the one installed and installs it. The signatures are the operator's own
//! `ssh-keygen -Y sign` (namespace `mesh-host-policy@v1`): mesh-host never reads a private key.
//! The decisions are `trust::policy`'s.

use std::path::{Path, PathBuf};

use super::{Ended, Usage};
use crate::trust::policy::{self, Policy, Verified, POLICY_LIMIT, POLICY_NAMESPACE};

/// Where `trust rotate` finds the policy in force unless told.
const INSTALLED: &str = "/etc/mesh-host/trust-policy";

/// The trust policy's commands.
#[derive(Debug, clap::Subcommand)]
pub enum TrustCommand {
    /// Make a signed trust policy from a draft (its `key NAME TYPE BASE64`, `role NAME
    /// THRESHOLD KEY...` and `node NAME GROUP...` lines), signed by each --sign key; refused
    /// unless they meet its own root role's threshold. Install it on each node out of band
    /// (never from etcd) and run the node with --trust-policy.
    Init(TrustInit),
    /// Print a policy: its keys, roles, nodes and groups, and who signed it.
    Show {
        /// The signed policy file.
        #[arg(value_name = "FILE")]
        file: PathBuf,
        /// Print it as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Verify a new policy as a rotation of the one in force (signed by a threshold of the old
    /// root keys and of its own, for the same fleet, at a higher version, not expired), adding
    /// each --sign key's signature first, and install it in place of the one in force. Nodes
    /// take it at their next start, verifying it again against the policy they pinned.
    Rotate(TrustRotate),
}

/// What `trust init` is given.
#[derive(Debug, clap::Args)]
pub struct TrustInit {
    /// The draft: key, role and node lines in any order, `#` comments.
    #[arg(value_name = "DRAFT")]
    pub draft: PathBuf,
    /// Where the signed policy is written (refused when something is there).
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,
    /// The fleet it is for: the nodes' manifests must carry this name.
    #[arg(long, env = "MESH_HOST_FLEET_NAME", value_name = "NAME", default_value = "default")]
    pub fleet_name: String,
    /// Its version: 1 for a first policy; above the one in force for a rotation's.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub version: u64,
    /// How long a node takes it when it first sees it (`30d`, `365d`).
    #[arg(long, value_name = "DURATION", default_value = "365d", value_parser = super::parse_duration)]
    pub expires: std::time::Duration,
    /// A key for `ssh-keygen -Y sign -f` (a private key file, or a `.pub` whose key is in
    /// ssh-agent); repeat it for each root key that signs.
    #[arg(long = "sign", value_name = "KEY", required = true)]
    pub keys: Vec<PathBuf>,
}

/// What `trust rotate` is given.
#[derive(Debug, clap::Args)]
pub struct TrustRotate {
    /// The new policy, signed (`trust init --version N`).
    #[arg(value_name = "NEW")]
    pub new: PathBuf,
    /// The policy in force, which NEW replaces.
    #[arg(long, value_name = "FILE", default_value = INSTALLED)]
    pub policy: PathBuf,
    /// A key (the old root keys' holders) whose signature is added to NEW before it is
    /// verified; repeat it.
    #[arg(long = "sign", value_name = "KEY")]
    pub keys: Vec<PathBuf>,
}

/// `mesh-host trust ...`.
pub fn trust(command: TrustCommand) -> anyhow::Result<Ended> {
    match command {
        TrustCommand::Init(args) => init(&args),
        TrustCommand::Show { file, json } => show(&file, json),
        TrustCommand::Rotate(args) => rotate(&args),
    }
}

fn read(path: &Path, what: &str) -> anyhow::Result<Vec<u8>> {
    crate::system::read_input(path, POLICY_LIMIT as u64)
        .map_err(|e| Usage(format!("mesh-host trust: cannot read {what} {}: {e}", path.display())).into())
}

/// Each key's signature of `body`, made by `ssh-keygen` and checked here.
fn sign(keys: &[PathBuf], body: &[u8]) -> anyhow::Result<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    for key in keys {
        let armored = super::sign::ssh_sign_in(key, body, POLICY_NAMESPACE)?;
        crate::trust::sshsig::Signature::from_armored(armored.as_bytes())
            .and_then(|s| s.verify(POLICY_NAMESPACE, body))
            .map_err(|e| {
                anyhow::anyhow!("ssh-keygen's signature with {} does not verify: {e}", key.display())
            })?;
        out.push(armored.into_bytes());
    }
    Ok(out)
}

fn init(args: &TrustInit) -> anyhow::Result<Ended> {
    let usage = |e: String| Usage(format!("mesh-host trust init: {e}"));
    if args.out.exists() {
        return Err(usage(format!(
            "{} exists: a policy is never written over (`mesh-host trust rotate` replaces one in force)",
            args.out.display()
        ))
        .into());
    }
    let draft = read(&args.draft, "the draft")?;
    let draft =
        std::str::from_utf8(&draft).map_err(|_| usage(format!("{} is not UTF-8", args.draft.display())))?;
    let issued = crate::system::unix_secs();
    let expires = issued.saturating_add(args.expires.as_secs().max(1));
    let p = Policy::from_draft(draft, &args.fleet_name, args.version, issued, expires)
        .map_err(|e| usage(format!("{}: {e}", args.draft.display())))?;
    let body = p.render().into_bytes();
    let signed = policy::join(&body, &sign(&args.keys, &body)?);
    let verified =
        policy::verify_root(&signed, Some(issued)).map_err(|e| usage(format!("nothing was written: {e}")))?;
    crate::system::fs::write_own(&args.out, &signed)
        .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", args.out.display()))?;
    println!(
        "wrote {}: policy version {} of fleet {}, {} key(s), {} role(s), {} node(s), expires {} (seconds since the epoch); signed by root {}",
        args.out.display(),
        p.version,
        p.fleet,
        p.keys.len(),
        p.roles.len(),
        p.nodes.len(),
        p.expires,
        verified.signed_by.join(", ")
    );
    Ok(Ended::Converged)
}

fn rotate(args: &TrustRotate) -> anyhow::Result<Ended> {
    let usage = |e: String| Usage(format!("mesh-host trust rotate: {e}"));
    let old = read(&args.policy, "the policy in force")?;
    let old = policy::verify_root(&old, None)
        .map_err(|e| usage(format!("the policy in force {} does not verify: {e}", args.policy.display())))?;
    let new = read(&args.new, "the new policy")?;
    let (body, sigs) = policy::split(&new).map_err(|e| usage(format!("{}: {e}", args.new.display())))?;
    let mut sigs: Vec<Vec<u8>> = sigs.into_iter().map(<[u8]>::to_vec).collect();
    sigs.extend(sign(&args.keys, body)?);
    let signed = policy::join(body, &sigs);
    let verified =
        policy::verify_rotation(&old.policy, &signed, crate::system::unix_secs()).map_err(|e| {
            usage(format!(
                "{} is refused as the next policy after {}: {e}; nothing was installed",
                args.new.display(),
                args.policy.display()
            ))
        })?;
    crate::system::fs::write_own(&args.policy, &signed)
        .map_err(|e| anyhow::anyhow!("cannot install {}: {e}", args.policy.display()))?;
    println!(
        "installed {}: policy version {} after version {}, signed by its root {}; nodes take it at their next start",
        args.policy.display(),
        verified.policy.version,
        old.policy.version,
        verified.signed_by.join(", ")
    );
    Ok(Ended::Converged)
}

fn show(file: &Path, json: bool) -> anyhow::Result<Ended> {
    let bytes = read(file, "the policy")?;
    let (body, _) = policy::split(&bytes).map_err(|e| Usage(format!("mesh-host trust show: {e}")))?;
    let p =
        Policy::parse(body).map_err(|e| Usage(format!("mesh-host trust show: {}: {e}", file.display())))?;
    let verified: Result<Verified, String> = policy::verify_root(&bytes, None);
    let now = crate::system::unix_secs();
    if json {
        let value = serde_json::json!({
            "fleet": p.fleet,
            "version": p.version,
            "issued": p.issued,
            "expires": p.expires,
            "expired": now >= p.expires,
            "verified": verified.is_ok(),
            "signed_by": verified.as_ref().map(|v| v.signed_by.clone()).unwrap_or_default(),
            "refused": verified.as_ref().err(),
            "keys": p.keys.iter().map(|k| serde_json::json!({
                "name": k.name, "type": k.key.kind(), "fingerprint": k.key.fingerprint(),
            })).collect::<Vec<_>>(),
            "roles": p.roles.iter().map(|r| serde_json::json!({
                "name": r.name, "threshold": r.threshold, "keys": r.keys,
            })).collect::<Vec<_>>(),
            "nodes": p.nodes.iter().map(|(n, g)| (n.clone(), serde_json::json!(g))).collect::<serde_json::Map<_, _>>(),
        });
        println!("{}", serde_json::to_string_pretty(&value)?);
        return Ok(Ended::Converged);
    }
    let esc = crate::telemetry::text::escape;
    let mut out = format!(
        "policy version {} of fleet {}: issued {}, expires {}{} (seconds since the epoch)\n",
        p.version,
        p.fleet,
        p.issued,
        p.expires,
        if now >= p.expires { ", EXPIRED" } else { "" }
    );
    match &verified {
        Ok(v) => out.push_str(&format!("signed by root: {}\n", v.signed_by.join(", "))),
        Err(e) => out.push_str(&format!("NOT VERIFIED: {}\n", esc(e))),
    }
    out.push_str("keys:\n");
    for k in &p.keys {
        out.push_str(&format!("  {:<16} {} {}\n", k.name, k.key.kind(), k.key.fingerprint()));
    }
    out.push_str("roles (who signs what: THRESHOLD of KEYS):\n");
    for r in &p.roles {
        out.push_str(&format!("  {:<16} {} of {}\n", r.name, r.threshold, r.keys.join(", ")));
    }
    out.push_str("nodes and their groups:\n");
    for (n, g) in &p.nodes {
        out.push_str(&format!("  {:<16} {}\n", n, if g.is_empty() { "-".to_owned() } else { g.join(", ") }));
    }
    print!("{out}");
    Ok(Ended::Converged)
}
