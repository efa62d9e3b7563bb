//! `fleet` and `fleet rollout`: their commands and arguments, and the reading of a directory for
//! the fleet. The rollout driver itself is in `fleet::rollout`.

use super::*;

/// What `mesh-host fleet` does.
#[derive(Debug, Subcommand)]
pub enum FleetCommand {
    /// Write a declaration (a file, or a directory of `*.json` files) under one scope: validated
    /// first, written in one transaction, and the scope then holds exactly these files.
    Put(FleetPut),
    /// Show what `fleet put` would change, key by key, with a diff of each changed key.
    Diff(FleetPut),
    /// Add signatures to the manifest a scope holds in etcd (a second operator co-signing
    /// what `fleet put --sign` wrote): refused when the scope's keys no longer match it, and
    /// written only if the manifest is still the one signed.
    Sign(super::FleetSign),
    /// Give a node a user of its own in etcd's auth, whose role reads only its own, its groups'
    /// and the fleet's declaration and writes only its own status and presence. Run as etcd's
    /// root (`--etcd-user root`).
    Grant {
        /// etcd's endpoints, comma-separated.
        #[arg(long, env = "MESH_HOST_ETCD", value_name = "ENDPOINTS")]
        etcd: String,
        /// TLS and the login to etcd's auth, when they are on.
        #[command(flatten)]
        login: EtcdLogin,
        /// The node, and its user's name.
        #[arg(long, value_name = "NAME")]
        node: String,
        /// A group the node reads; repeat it. With --trust-policy, it may be left out: the
        /// groups are the policy's, and one that differs is refused.
        #[arg(long = "group", value_name = "GROUP", value_delimiter = ',')]
        groups: Vec<String>,
        /// The fleet's trust policy (`mesh-host trust init`), the operator's copy, its root
        /// signatures verified: the node's role reads the groups the policy binds it to and no
        /// other, as the node itself run with --trust-policy does.
        #[arg(long, env = "MESH_HOST_TRUST_POLICY", value_name = "FILE")]
        trust_policy: Option<PathBuf>,
        /// A file whose first line is the node's new password, for a node that logs in with
        /// one. Without it the user has no password: the node is known by its client
        /// certificate, whose CN must be its name.
        #[arg(long, value_name = "PATH")]
        node_password_file: Option<PathBuf>,
    },
    /// Every node in a table: alive, the revision applied and the latest it reads, converged,
    /// drift corrected, contested keys, the last error. Exits 1 when a node is not alive,
    /// converged and current.
    Status {
        /// etcd's endpoints, comma-separated.
        #[arg(long, env = "MESH_HOST_ETCD", value_name = "ENDPOINTS")]
        etcd: String,
        /// TLS and the login to etcd's auth, when they are on.
        #[command(flatten)]
        login: EtcdLogin,
        /// Print the rows as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Forget a node that is gone for good: its status, presence and rollout admission are
    /// deleted, so it leaves `fleet status` and every rollout's plan. Refused while the node is
    /// alive (its presence key held).
    Forget {
        /// etcd's endpoints, comma-separated.
        #[arg(long, env = "MESH_HOST_ETCD", value_name = "ENDPOINTS")]
        etcd: String,
        /// TLS and the login to etcd's auth, when they are on.
        #[command(flatten)]
        login: EtcdLogin,
        /// The node's name, as it runs with `--node`.
        #[arg(value_name = "NODE")]
        node: String,
    },
    /// Take a node's access away (decommissioned, or compromised): its etcd user and role
    /// deleted, then its status, presence and rollout admission, as `forget` does, alive or
    /// not. Its own declaration keys are left. Run as etcd's root.
    Revoke {
        /// etcd.
        #[command(flatten)]
        etcd: EtcdArgs,
        /// The node, and its user's name.
        #[arg(long, value_name = "NAME")]
        node: String,
    },
    /// A staged rollout: a candidate declaration given to the nodes wave by wave, each wave
    /// opened when the ones before it report it applied and converged.
    Rollout {
        /// What to do with the rollout.
        #[command(subcommand)]
        command: RolloutCommand,
    },
}

/// etcd, for a command that only reads or writes the rollout's keys.
#[derive(Debug, clap::Args)]
pub struct EtcdArgs {
    /// etcd's endpoints, comma-separated.
    #[arg(long, env = "MESH_HOST_ETCD", value_name = "ENDPOINTS")]
    pub etcd: String,
    /// TLS and the login to etcd's auth, when they are on.
    #[command(flatten)]
    pub login: EtcdLogin,
}

/// What `mesh-host fleet rollout` does.
#[derive(Debug, Subcommand)]
#[allow(clippy::large_enum_variant, reason = "parsed once per command")]
pub enum RolloutCommand {
    /// Validate a declaration as `fleet put` does, write it as a candidate beside the one in
    /// force (no node changes yet), print the waves, and drive them: each wave opens when every
    /// node of the waves before it reports the candidate applied and converged, and stayed so
    /// for --soak. Ends when every wave passed (then promote or abort), or when it halts.
    Start(RolloutStart),
    /// The open rollout: its waves, and each node (admitted, revision applied, converged,
    /// failed, reverted).
    Status {
        /// etcd.
        #[command(flatten)]
        etcd: EtcdArgs,
        /// Print it as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Open no further wave until `resume`; the nodes admitted keep the candidate.
    Pause(EtcdArgs),
    /// End a pause, and drive the rollout from here when no driver does (a driver killed is
    /// replaced so, once its lease has ended).
    Resume(EtcdArgs),
    /// Close the rollout: every node that took the candidate goes back to the declaration in
    /// force, its previous generation.
    Abort(EtcdArgs),
    /// Once every wave passed: the candidate becomes the declaration in force, and the
    /// rollout closes.
    Promote(EtcdArgs),
}

/// What `fleet rollout start` is given.
#[derive(Debug, clap::Args)]
pub struct RolloutStart {
    /// etcd.
    #[command(flatten)]
    pub etcd: EtcdArgs,
    /// A candidate for every node's declaration (the fleet's prefix).
    #[arg(long, group = "scope")]
    pub fleet: bool,
    /// A candidate for the declaration of every node in this group.
    #[arg(long, value_name = "GROUP", group = "scope")]
    pub group: Option<String>,
    /// The nodes each wave reaches, counting the waves before it: counts and percentages,
    /// comma-separated (a share rounded up; the last must be 100%).
    #[arg(long, value_name = "SIZES", default_value = "1,10%,50%,100%")]
    pub waves: String,
    /// Seconds every node of the open waves must stay converged before the next wave opens.
    #[arg(long, value_name = "SECONDS", default_value_t = 60)]
    pub soak: u64,
    /// How many nodes may fail (not converge, be reverted, or miss the deadline) before the
    /// rollout halts.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub max_failures: usize,
    /// Seconds an admitted node has to report the candidate applied and converged.
    #[arg(long, value_name = "SECONDS", default_value_t = 300)]
    pub deadline: u64,
    /// A node for the first waves, before the others (which go by name); repeat it.
    #[arg(long = "canary", value_name = "NODE")]
    pub canaries: Vec<String>,
    /// Signing the candidate (`--sign KEY`): its manifest names the rollout, and the one
    /// `promote` writes into the scope is signed beside it.
    #[command(flatten)]
    pub signing: super::SigningArgs,
    /// A declaration file, or a directory whose `*.json` files are the candidate.
    #[arg(value_name = "FILE-OR-DIR")]
    pub path: PathBuf,
}

/// Where a declaration is put, and what.
#[derive(Debug, clap::Args)]
pub struct FleetPut {
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
    /// Signing what is put (`--sign KEY`).
    #[command(flatten)]
    pub signing: super::SigningArgs,
    /// A declaration file, or a directory whose `*.json` files are put.
    #[arg(value_name = "FILE-OR-DIR")]
    pub path: PathBuf,
}

/// How mesh-host proves itself to etcd: TLS with a client certificate (whose CN etcd's auth
/// takes as the user), or a login to etcd's auth by password.
#[derive(Debug, clap::Args)]
pub struct EtcdLogin {
    /// The etcd user to log in as (a node: its own name, given by `fleet grant`).
    #[arg(long, env = "MESH_HOST_ETCD_USER", value_name = "USER", requires = "etcd_password_file")]
    pub etcd_user: Option<String>,
    /// A file whose first line is that user's password (never on the command line, where
    /// /proc would show it).
    #[arg(long, env = "MESH_HOST_ETCD_PASSWORD_FILE", value_name = "PATH", requires = "etcd_user")]
    pub etcd_password_file: Option<PathBuf>,
    /// The CA certificate (PEM) that etcd's certificate is checked against; needed for
    /// https:// endpoints (the machine's own trust store is not used).
    #[arg(long, env = "MESH_HOST_ETCD_CA", value_name = "FILE")]
    pub etcd_ca: Option<PathBuf>,
    /// This node's client certificate (PEM), shown to etcd when it asks for one
    /// (`--client-cert-auth`). With etcd's auth on and no `--etcd-user`, its CN is the user
    /// etcd knows the node as. Read again at every connection to etcd.
    #[arg(long, env = "MESH_HOST_ETCD_CERT", value_name = "FILE", requires = "etcd_key")]
    pub etcd_cert: Option<PathBuf>,
    /// The private key (PEM) of `--etcd-cert`; refused when others than its owner can read it.
    #[arg(long, env = "MESH_HOST_ETCD_KEY", value_name = "FILE", requires = "etcd_cert")]
    pub etcd_key: Option<PathBuf>,
    /// Speak to etcd over `http://` beyond loopback: declarations, statuses and any password
    /// then cross the network in the clear. Refused without it (docs/decisions.md, "Plaintext
    /// etcd only on loopback").
    #[arg(long, env = "MESH_HOST_ETCD_ALLOW_PLAINTEXT")]
    pub allow_plaintext: bool,
    /// Dial `--etcd`'s endpoints in the order given, the first first (a local member, say).
    /// Without it each client starts at a random one, so a fleet spreads over the members.
    #[arg(long)]
    pub etcd_in_order: bool,
}

impl EtcdLogin {
    /// A client for `endpoints`, over TLS when they are https://, logged in when a user is given:
    /// an operator's, whose password file is theirs to keep.
    /// Its paged reads are patient (`Etcd::patient`): a command asks again rather than fail on
    /// a cluster too busy to answer for a few seconds.
    pub(super) fn client(&self, endpoints: &str) -> anyhow::Result<crate::system::etcd::Etcd> {
        self.client_with(endpoints, None).map(crate::system::etcd::Etcd::patient)
    }

    /// The daemon's client: its password file is checked as strictly as its other sources
    /// (`system::strict`), since it is the node's identity in etcd.
    pub(super) fn node_client(&self, endpoints: &str) -> anyhow::Result<crate::system::etcd::Etcd> {
        self.client_with(endpoints, Some(&crate::system::Trusted::agent()))
    }

    fn client_with(
        &self,
        endpoints: &str,
        strict: Option<&crate::system::Trusted>,
    ) -> anyhow::Result<crate::system::etcd::Etcd> {
        let plain = crate::system::etcd::plaintext_beyond_loopback(endpoints);
        if !plain.is_empty() && !self.allow_plaintext {
            return Err(Usage(format!(
                "mesh-host: --etcd: {} is http:// to a host other than loopback: whoever is on the network between could read every declaration and status, write declarations, and take a password login in the clear. Use https:// with --etcd-ca (and --etcd-cert and --etcd-key when etcd asks for a client certificate); or, on a network you trust, say so with --allow-plaintext",
                plain.join(",")
            ))
            .into());
        }
        let tls = crate::system::etcd::TlsFiles {
            ca: self.etcd_ca.clone(),
            cert: self.etcd_cert.clone(),
            key: self.etcd_key.clone(),
        };
        let mut etcd = crate::system::etcd::Etcd::new(endpoints, &tls)
            .map_err(|e| Usage(format!("mesh-host: --etcd: {e}")))?;
        if self.etcd_in_order {
            etcd = etcd.in_order();
        }
        Ok(match (&self.etcd_user, &self.etcd_password_file) {
            (Some(user), Some(file)) => {
                let password = crate::system::input::read_password(file, strict)
                    .with_context(|| format!("cannot read the etcd password file {}", file.display()))?;
                etcd.with_login(user.clone(), password)
            }
            _ => etcd,
        })
    }
}

impl FleetPut {
    fn scope(&self) -> Result<crate::fleet::Scope, Usage> {
        scope_from(self.fleet, &self.group, &self.node)
    }
}

/// The scope `--fleet`, `--group G` or `--node N` name, exactly one of them.
fn scope_from(
    fleet: bool,
    group: &Option<String>,
    node: &Option<String>,
) -> Result<crate::fleet::Scope, Usage> {
    use crate::fleet::{check_name, Scope};
    let named = |what: &str, name: &str| check_name(what, name).map_err(|e| Usage(format!("mesh-host: {e}")));
    match (fleet, group, node) {
        (true, None, None) => Ok(Scope::Fleet),
        (false, Some(g), None) => named("--group", g).map(|()| Scope::Group(g.clone())),
        (false, None, Some(n)) => named("--node", n).map(|()| Scope::Node(n.clone())),
        _ => Err(Usage("mesh-host: say which scope: one of --fleet, --group G, --node N".into())),
    }
}

pub(super) fn fleet(command: FleetCommand) -> anyhow::Result<Ended> {
    let (mut args, diff) = match command {
        FleetCommand::Rollout { command } => return rollout(command),
        FleetCommand::Put(args) => (args, false),
        FleetCommand::Diff(args) => (args, true),
        FleetCommand::Sign(args) => {
            let scope = scope_from(args.fleet, &args.group, &args.node)?;
            let out =
                tokio::runtime::Handle::current().block_on(super::fleet_sign::fleet_sign(&args, &scope))?;
            print!("{}", escape_lines(&out));
            return Ok(Ended::Converged);
        }
        FleetCommand::Grant { etcd, login, node, groups, trust_policy, node_password_file } => {
            let given = Granted { node, groups, trust_policy, node_password_file };
            return grant(&etcd, &login, given);
        }
        FleetCommand::Revoke { etcd, node } => return revoke(&etcd, &node),
        FleetCommand::Forget { etcd, login, node } => {
            crate::fleet::check_name("NODE", &node).map_err(|e| Usage(format!("mesh-host: {e}")))?;
            let etcd = login.client(&etcd)?;
            let out = tokio::runtime::Handle::current()
                .block_on(crate::fleet::forget::forget(&etcd, &node))
                .map_err(|e| match e.downcast::<crate::fleet::rollout::Refused>() {
                    Ok(refused) => Usage(format!("mesh-host: {refused}")).into(),
                    Err(e) => e,
                })?;
            print!("{}", escape_lines(&out));
            return Ok(Ended::Converged);
        }
        FleetCommand::Status { etcd, login, json } => return status(&etcd, &login, json),
    };
    let scope = args.scope()?;
    let etcd = args.login.client(&args.etcd)?;
    let files = read_for_fleet(&args.path, &scope)?;
    // Validated before anything is read from or written to etcd: a declaration mesh-host would
    // refuse never reaches it (docs/decisions.md, "`fleet put` validates twice").
    let wanted = crate::fleet::put::prepare(&scope, files)?;
    let runtime = tokio::runtime::Handle::current();
    // And as each node it reaches will read it, beside the other levels it reads.
    super::fleet_sign::check_nodes(&etcd, &scope, &wanted, &mut args.signing, "this put")?;
    let mut wanted = wanted;
    let out = if diff {
        runtime.block_on(crate::fleet::put::diff(&etcd, &scope, &wanted))?
    } else {
        if args.signing.keys.is_empty() {
            runtime.block_on(super::fleet_sign::warn_unsigned(&etcd, &scope))?;
        } else {
            let signing = super::fleet_sign::sign_put(&etcd, &scope, &args.signing, &mut wanted);
            match runtime.block_on(signing)? {
                std::ops::ControlFlow::Break(said) => {
                    print!("{}", escape_lines(&said));
                    return Ok(Ended::Converged);
                }
                std::ops::ControlFlow::Continue(said) => print!("{}", escape_lines(&said)),
            }
        }
        runtime.block_on(crate::fleet::put::put(&etcd, &scope, wanted)).map_err(|e| {
            match e.downcast::<crate::fleet::rollout::Refused>() {
                Ok(refused) => Usage(format!("mesh-host: {refused}")).into(),
                Err(e) => e,
            }
        })?
    };
    // A diff of what etcd holds, which any writer of etcd chose.
    print!("{}", escape_lines(&out));
    Ok(Ended::Converged)
}

/// `mesh-host fleet status`: every node's row, as a table or JSON; converged when all are current.
fn status(etcd: &str, login: &EtcdLogin, json: bool) -> anyhow::Result<Ended> {
    let etcd = login.client(etcd)?;
    let (revision, rows) = tokio::runtime::Handle::current().block_on(crate::fleet::status::rows(&etcd))?;
    // On stderr: `--json`'s output stays JSON.
    if let Some(warning) =
        tokio::runtime::Handle::current().block_on(crate::fleet::status::uncompacted(&etcd))
    {
        eprintln!("mesh-host: {warning}");
    }
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({"revision": revision, "nodes": rows}))?
        );
    } else {
        // Each node wrote its own status: the table escapes each field, this the rest.
        print!("{}", escape_lines(&crate::fleet::status::table(revision, &rows)));
    }
    Ok(if rows.iter().all(|r| r.current) { Ended::Converged } else { Ended::Failed })
}

/// What `fleet grant` is given of the node.
struct Granted {
    node: String,
    groups: Vec<String>,
    trust_policy: Option<PathBuf>,
    node_password_file: Option<PathBuf>,
}

/// `mesh-host fleet grant` (`fleet::grant`), its groups `granted_groups`'.
fn grant(etcd: &str, login: &EtcdLogin, given: Granted) -> anyhow::Result<Ended> {
    let Granted { node, groups, trust_policy, node_password_file } = given;
    for (what, name) in std::iter::once(("--node", &node)).chain(groups.iter().map(|g| ("--group", g))) {
        crate::fleet::check_name(what, name).map_err(|e| Usage(format!("mesh-host: {e}")))?;
    }
    let (groups, from) = granted_groups(&node, groups, trust_policy.as_deref())?;
    let etcd = login.client(etcd)?;
    let password = match &node_password_file {
        Some(file) => Some(
            crate::system::input::read_password(file, None)
                .with_context(|| format!("cannot read the node's password file {}", file.display()))?,
        ),
        None => None,
    };
    let out = tokio::runtime::Handle::current()
        .block_on(crate::fleet::grant(&etcd, &node, &groups, password.as_ref()))
        .map_err(refused)?;
    print!("{from}{out}");
    Ok(Ended::Converged)
}

/// The groups `fleet grant` grants `node`: `--group`'s, or with `--trust-policy` those the
/// policy binds it to (a `--group` that differs refused, naming both), so that a role is never
/// granted a group the node is not in; and what to say of where they came from.
fn granted_groups(
    node: &str,
    groups: Vec<String>,
    policy: Option<&Path>,
) -> Result<(Vec<String>, String), Usage> {
    let Some(path) = policy else { return Ok((groups, String::new())) };
    let policy = super::fleet_sign::operator_policy(path)?;
    let bound = policy.bound_groups(node, &groups).map_err(|e| {
        Usage(format!("mesh-host: --trust-policy {}: {e}; nothing was granted", path.display()))
    })?;
    let said = match (policy.groups_of(node), bound.is_empty()) {
        (None, _) => {
            format!("policy version {} does not name node {node}: it is in no group\n", policy.version)
        }
        (Some(_), true) => format!("policy version {} binds node {node} to no group\n", policy.version),
        (Some(_), false) => {
            format!("policy version {} binds node {node} to groups {}\n", policy.version, bound.join(","))
        }
    };
    Ok((bound, said))
}

/// `mesh-host fleet revoke --node N` (`fleet::access::revoke`).
fn revoke(etcd: &EtcdArgs, node: &str) -> anyhow::Result<Ended> {
    crate::fleet::check_name("--node", node).map_err(|e| Usage(format!("mesh-host: {e}")))?;
    let etcd = etcd.login.client(&etcd.etcd)?;
    let out = tokio::runtime::Handle::current()
        .block_on(crate::fleet::access::revoke(&etcd, node))
        .map_err(refused)?;
    print!("{}", escape_lines(&out));
    Ok(Ended::Converged)
}

/// A refusal (`rollout::Refused`) as bad usage, exit 2; any other error as it is.
fn refused(e: anyhow::Error) -> anyhow::Error {
    match e.downcast::<crate::fleet::rollout::Refused>() {
        Ok(refused) => Usage(format!("mesh-host: {refused}")).into(),
        Err(e) => e,
    }
}

/// Reads a declaration file or directory for the fleet, or says why not (exit 2).
pub(super) fn read_for_fleet(
    path: &Path,
    scope: &crate::fleet::Scope,
) -> anyhow::Result<Vec<(PathBuf, Vec<u8>)>> {
    let files = crate::system::read_source(path)
        .map_err(|e| Usage(format!("mesh-host: cannot read the declaration {}: {e}", path.display())))?;
    if files.is_empty() {
        return Err(Usage(format!(
            "mesh-host: {} holds no *.json file to put; to empty {} on purpose, put a declaration with no resources",
            path.display(),
            scope.describe()
        ))
        .into());
    }
    Ok(files)
}

/// `mesh-host fleet rollout ...`. A refusal of the rollout's (one open already, a second
/// driver, promote before the last gate) exits 2, like bad usage; a rollout halted exits 1.
pub(super) fn rollout(command: RolloutCommand) -> anyhow::Result<Ended> {
    use crate::fleet::rollout;
    let runtime = tokio::runtime::Handle::current();
    let ended = |ok: bool| if ok { Ended::Converged } else { Ended::Failed };
    let said = |r: anyhow::Result<Ended>| {
        r.map_err(|e| match e.downcast::<rollout::Refused>() {
            Ok(refused) => Usage(format!("mesh-host: {refused}")).into(),
            Err(e) => e,
        })
    };
    let printed = |out: anyhow::Result<String>| {
        out.map(|text| {
            print!("{}", escape_lines(&text));
            Ended::Converged
        })
    };
    match command {
        RolloutCommand::Start(args) => {
            let scope = match (args.fleet, &args.group) {
                (true, None) => crate::fleet::Scope::Fleet,
                (false, Some(g)) => {
                    crate::fleet::check_name("--group", g).map_err(|e| Usage(format!("mesh-host: {e}")))?;
                    crate::fleet::Scope::Group(g.clone())
                }
                _ => {
                    return Err(
                        Usage("mesh-host: say what the rollout is for: --fleet or --group G".into()).into()
                    )
                }
            };
            for c in &args.canaries {
                crate::fleet::check_name("--canary", c).map_err(|e| Usage(format!("mesh-host: {e}")))?;
            }
            let sizes = rollout::parse_waves(&args.waves).map_err(|e| Usage(format!("mesh-host: {e}")))?;
            let etcd = args.etcd.login.client(&args.etcd.etcd)?;
            let files = read_for_fleet(&args.path, &scope)?;
            // Validated as `fleet put` validates: alone, then as each node will read it.
            let wanted = crate::fleet::put::prepare(&scope, files)?;
            let mut args = args;
            let bound =
                super::fleet_sign::check_nodes(&etcd, &scope, &wanted, &mut args.signing, "this rollout")?;
            let id = rollout::new_id(crate::system::unix_secs());
            let signing = super::fleet_sign::sign_rollout(&etcd, &scope, &args.signing, &id, &wanted);
            let signed = runtime.block_on(signing)?;
            let start = rollout::Start {
                id,
                signed,
                scope,
                wanted,
                sizes,
                canaries: args.canaries,
                soak: args.soak,
                max_failures: args.max_failures,
                deadline: args.deadline,
                bound,
            };
            said(runtime.block_on(rollout::start(&etcd, start)).map(ended))
        }
        RolloutCommand::Status { etcd, json } => {
            let etcd = etcd.login.client(&etcd.etcd)?;
            let report = runtime.block_on(rollout::report(&etcd))?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", escape_lines(&rollout::text(&report)));
            }
            // A script waiting on a rollout stops at a halt.
            Ok(ended(report.state.as_ref().is_none_or(|st| st.halted.is_none())))
        }
        RolloutCommand::Pause(etcd) => {
            let etcd = etcd.login.client(&etcd.etcd)?;
            said(printed(runtime.block_on(rollout::pause_rollout(&etcd))))
        }
        RolloutCommand::Resume(etcd) => {
            let etcd = etcd.login.client(&etcd.etcd)?;
            said(runtime.block_on(rollout::resume(&etcd)).map(ended))
        }
        RolloutCommand::Abort(etcd) => {
            let etcd = etcd.login.client(&etcd.etcd)?;
            said(printed(runtime.block_on(rollout::abort(&etcd))))
        }
        RolloutCommand::Promote(etcd) => {
            let etcd = etcd.login.client(&etcd.etcd)?;
            said(printed(runtime.block_on(rollout::promote(&etcd))))
        }
    }
}
