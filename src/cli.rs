//! The command line: one function per command. Each returns whether the machine converged;
//! `main` turns that, or an error, into the exit code.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use clap::{Parser, Subcommand};

mod sign;

pub use sign::{SignArgs, TrustArgs};

use crate::apply::{self, ArchiveLimits, Options, Report, Verb};
use crate::declaration::{Declaration, Kind};
use crate::store::{Origin, Store};
use crate::telemetry::text::{escape, escape_lines};

/// What `--help` and the manual page say of the exit codes, decided in `main`.
const EXIT_CODES: &str = "\
Exit codes:
  0  converged (for check, plan, status and schema: all is well)
  1  an apply failed: the report says which resources, why, and how many others
  2  the declaration was refused or could not be read, or the usage was wrong;
     nothing on the machine was touched

Environment:
  MESH_HOST_LOG  the log filter (tracing's EnvFilter syntax), default info
  NO_COLOR       when set and not empty, logs are never coloured";

/// mesh-host makes this machine match a declaration and keeps it there.
#[derive(Debug, Parser)]
#[command(name = "mesh-host", version, about, after_help = EXIT_CODES)]
pub struct Cli {
    /// The state store: what this host applied.
    #[arg(long, global = true, value_name = "PATH", default_value = "/var/lib/mesh-host/state.json")]
    pub state: PathBuf,
    /// The node's sealing key (its age identity): what opens the sealed values of a
    /// declaration. `sealing.key` beside the state store when left out.
    #[arg(long, global = true, value_name = "PATH")]
    pub key: Option<PathBuf>,
    /// Log as JSON lines instead of text.
    #[arg(long, global = true)]
    pub log_json: bool,
    /// The D-Bus address of the systemd to manage, such as
    /// `unix:path=/run/dbus/system_bus_socket`. The system bus when left out.
    #[arg(long, global = true, value_name = "ADDRESS")]
    pub bus: Option<String>,
    /// The container runtime's socket, such as `unix:///run/podman/podman.sock`. Without it,
    /// `DOCKER_HOST`, Docker's default socket and then Podman's system socket are tried.
    #[arg(long, global = true, value_name = "URL")]
    pub container_socket: Option<String>,
    /// How long an action's command or verify, or a run-once or scheduled step, may run before
    /// it is stopped and fails; 0 for no limit.
    #[arg(long, global = true, value_name = "SECONDS", default_value_t = 3600)]
    pub step_timeout: u64,
    /// The most bytes of file content one archive may unpack; an archive claiming more fails
    /// its resource, nothing unpacked.
    #[arg(long, global = true, value_name = "BYTES", default_value_t = ArchiveLimits::default().bytes)]
    pub archive_max_bytes: u64,
    /// The most entries one archive may hold.
    #[arg(long, global = true, value_name = "COUNT", default_value_t = ArchiveLimits::default().entries)]
    pub archive_max_entries: u64,
    /// How many generations (declarations accepted, kept under the state directory for
    /// `mesh-host rollback`) are kept; the oldest go first, never the one held.
    #[arg(long, global = true, value_name = "N", default_value_t = crate::generations::DEFAULT_KEEP,
          value_parser = clap::value_parser!(u16).range(1..))]
    pub keep_generations: u16,
    /// The subcommand to run, with its own arguments.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands; each one's doc comment is the help it prints.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Validate a declaration and summarise it. Touches nothing.
    Check {
        /// The declaration: a file, a directory whose `*.json` files are read in name order as
        /// one declaration (as `run` reads it), or `-` for standard input.
        #[arg(value_name = "DECLARATION")]
        file: PathBuf,
        /// Print the summary, or the refusal, as JSON.
        #[arg(long)]
        json: bool,
        /// Signed declarations.
        #[command(flatten)]
        trust: TrustArgs,
    },
    /// Show what apply would do, with a diff of each file whose content would change. Writes
    /// nothing, not even the state store.
    Plan {
        /// The declaration: a file, a directory of `*.json` files, or `-` for standard input.
        #[arg(value_name = "DECLARATION")]
        file: PathBuf,
        /// Where the declaration came from: `declared` (the mesh) or `bundle` (carried by
        /// hand for a first boot). Orphans are looked for among this origin's records only.
        #[arg(long, value_enum, default_value = "declared")]
        origin: Origin,
        /// Print the plan (the report apply would print, and the diffs), or the refusal, as JSON.
        #[arg(long)]
        json: bool,
        /// Run each action's `verify` (as this user, usually root) to decide whether its
        /// command would run. Without it `plan` runs no command: each action is `undecided`,
        /// "would run verify to decide". Only for a declaration you would apply.
        #[arg(long)]
        run_verify: bool,
        /// Signed declarations.
        #[command(flatten)]
        trust: TrustArgs,
    },
    /// Make the machine match the declaration, once.
    Apply {
        /// The declaration: a file, a directory of `*.json` files, or `-` for standard input.
        #[arg(value_name = "DECLARATION")]
        file: PathBuf,
        /// Where the declaration came from: `declared` (the mesh) or `bundle` (carried by
        /// hand for a first boot). Orphans are looked for among this origin's records only.
        #[arg(long, value_enum, default_value = "declared")]
        origin: Origin,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
        /// List every resource that changed, `created` ones included; by default a summary
        /// per type, then only what was not created.
        #[arg(long, short)]
        verbose: bool,
        /// Signed declarations.
        #[command(flatten)]
        trust: TrustArgs,
    },
    /// Apply, then keep the machine matching: watch the declaration and every managed path,
    /// put back what changes, serve metrics. Stops on SIGTERM or SIGINT.
    Run(RunArgs),
    /// Declarations and status kept in etcd, for a fleet of nodes.
    Fleet {
        /// What to do in the fleet.
        #[command(subcommand)]
        command: FleetCommand,
    },
    /// What is recorded, and whether the machine still holds each file and directory.
    Status {
        /// Print the records and the kept originals as JSON.
        #[arg(long)]
        json: bool,
    },
    /// The generations this node keeps: each declaration it accepted, numbered, with when,
    /// where from, its digest, how its first pass ended, which is in force, and any hold.
    Generations {
        /// Print them as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Apply a kept generation (the one before the generation in force by default) and hold
    /// the node there: a running daemon applies it instead of its source's declaration until
    /// a declaration never seen before arrives, or `--release`. Without a daemon it is applied
    /// at once, as `apply` does.
    Rollback {
        /// The generation to go back to (`mesh-host generations` lists them).
        #[arg(value_name = "GEN", conflicts_with = "release")]
        generation: Option<u64>,
        /// End the hold: the daemon applies its source's declaration again.
        #[arg(long)]
        release: bool,
        /// Why, kept with the hold and shown by `status` and `/healthz`.
        #[arg(long, value_name = "TEXT", conflicts_with = "release")]
        reason: Option<String>,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// The last corrections the daemon made (kept beside the store, at most 1,000): when, the
    /// resource, what was found changed, who changed it (where fanotify could say), and how
    /// long until it was put back. Newest last.
    Drift {
        /// Print them as JSON lines, one correction a line.
        #[arg(long)]
        json: bool,
        /// Only those of the last DURATION (`90s`, `15m`, `2h`, `1d`; a bare number is seconds).
        #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
        since: Option<std::time::Duration>,
        /// Only those of this resource.
        #[arg(long, value_name = "ID")]
        id: Option<String>,
    },
    /// Print the JSON Schema of the declaration.
    Schema,
    /// Make this node's sealing key (an age X25519 identity), mode 0600, and print its public
    /// key (`age1...`), which values for this node are sealed to. Never writes over a key.
    Keygen {
        /// Make a new key and keep the current one as the previous, so values sealed to either
        /// open while the control plane seals them again to the new public key.
        #[arg(long, conflicts_with = "retire_previous")]
        rotate: bool,
        /// Drop the previous key kept by `--rotate`: values sealed to it no longer open.
        #[arg(long)]
        retire_previous: bool,
    },
    /// Print this node's public key (`age1...`).
    Pubkey,
    /// Sign a declaration directory: write its manifest (every `*.json` in it, their sha256
    /// and length, the fleet, a version one above the last, an expiry) and have `ssh-keygen
    /// -Y sign` sign it with each key, into `DIR/.mesh-host/`. Nodes given
    /// `--allowed-signers` apply the directory only so signed.
    Sign(SignArgs),
    /// Seal standard input to a public key (the value never goes on the command line, where
    /// /proc would show it), and print the armored age value for a declaration's `sealed` or
    /// `secrets`.
    Seal {
        /// The node's public key, `age1...` (`mesh-host pubkey` on that node prints it).
        #[arg(long, value_name = "AGE1...")]
        to: String,
    },
    /// Print a shell's completion script for mesh-host, such as
    /// `mesh-host completions bash > /etc/bash_completion.d/mesh-host`.
    Completions {
        /// The shell to complete in.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff), as the package installs it: `mesh-host man | man -l -`.
    Man,
}

/// What `mesh-host fleet` does.
#[derive(Debug, Subcommand)]
pub enum FleetCommand {
    /// Write a declaration (a file, or a directory of `*.json` files) under one scope: validated
    /// first, written in one transaction, and the scope then holds exactly these files.
    Put(FleetPut),
    /// Show what `fleet put` would change, key by key, with a diff of each changed key.
    Diff(FleetPut),
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
        /// A group the node reads; repeat it.
        #[arg(long = "group", value_name = "GROUP", value_delimiter = ',')]
        groups: Vec<String>,
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
    /// A declaration file, or a directory whose `*.json` files are the candidate.
    #[arg(value_name = "FILE-OR-DIR")]
    pub path: PathBuf,
}

/// How `run` runs: its declaration, its pace, and etcd when the declaration comes from there.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// A declaration file, or a directory whose `*.json` files are read as one declaration.
    #[arg(long, value_name = "PATH", default_value = "/etc/mesh-host/declaration.d")]
    pub declaration: PathBuf,
    /// Where the declaration came from: `declared` (the mesh) or `bundle` (carried by
    /// hand for a first boot). Orphans are looked for among this origin's records only.
    #[arg(long, value_enum, default_value = "declared")]
    pub origin: Origin,
    /// Where /metrics and /healthz listen; "off" for nowhere.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9787")]
    pub metrics: String,
    /// Seconds between full resyncs, beside what the watchers report.
    #[arg(long, value_name = "SECONDS", default_value_t = 600)]
    pub resync: u64,
    /// Milliseconds the declaration must be still before it is read.
    #[arg(long, value_name = "MS", default_value_t = 50)]
    pub settle_ms: u64,
    /// How many reconciles may run at once: one for files and full passes, the rest for
    /// slow work (a unit's start, a container, an action) so it never holds a file's
    /// correction behind it. 1 runs every reconcile in turn.
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub workers: u16,
    /// Take the declaration from etcd instead of `--declaration`: comma-separated endpoints,
    /// such as `http://127.0.0.1:2379`. The last declaration accepted from etcd is kept
    /// beside the state store and applied while etcd cannot be reached.
    #[arg(long, env = "MESH_HOST_ETCD", value_name = "ENDPOINTS", requires = "node")]
    pub etcd: Option<String>,
    /// This node's name in the fleet (with `--etcd`).
    #[arg(long, env = "MESH_HOST_NODE", value_name = "NAME", requires = "etcd")]
    pub node: Option<String>,
    /// A group this node is in (with `--etcd`); repeat it, or separate with commas. Groups
    /// are read in the order given, after the fleet's keys and before the node's own.
    #[arg(
        long = "group",
        env = "MESH_HOST_GROUPS",
        value_name = "GROUP",
        value_delimiter = ',',
        requires = "etcd"
    )]
    pub groups: Vec<String>,
    /// Seconds a new generation from etcd has to be confirmed (with `--etcd`): once applied,
    /// the node dials etcd afresh and has its status at the new revision written. If etcd
    /// answered before the change and not within this window, the node goes back to the
    /// generation before by itself, held there as by `mesh-host rollback`, and its status
    /// says `reverted`. 0 turns it off.
    #[arg(
        long,
        env = "MESH_HOST_CONFIRM_WINDOW",
        value_name = "SECONDS",
        default_value_t = crate::fleet::confirm::DEFAULT_WINDOW.as_secs()
    )]
    pub confirm_window: u64,
    /// TLS and the login to etcd's auth, when they are on.
    #[command(flatten)]
    pub login: EtcdLogin,
    /// Signed declarations (a local `--declaration` directory only, for now).
    #[command(flatten)]
    pub trust: TrustArgs,
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
}

impl EtcdLogin {
    /// A client for `endpoints`, over TLS when they are https://, logged in when a user is given.
    fn client(&self, endpoints: &str) -> anyhow::Result<crate::system::etcd::Etcd> {
        let tls = crate::system::etcd::TlsFiles {
            ca: self.etcd_ca.clone(),
            cert: self.etcd_cert.clone(),
            key: self.etcd_key.clone(),
        };
        let etcd = crate::system::etcd::Etcd::new(endpoints, &tls)
            .map_err(|e| Usage(format!("mesh-host: --etcd: {e}")))?;
        Ok(match (&self.etcd_user, &self.etcd_password_file) {
            (Some(user), Some(file)) => {
                let password = crate::system::input::read_password(file)
                    .with_context(|| format!("cannot read the etcd password file {}", file.display()))?;
                etcd.with_login(user.clone(), password)
            }
            _ => etcd,
        })
    }
}

impl FleetPut {
    fn scope(&self) -> Result<crate::fleet::Scope, Usage> {
        use crate::fleet::{check_name, Scope};
        let named =
            |what: &str, name: &str| check_name(what, name).map_err(|e| Usage(format!("mesh-host: {e}")));
        match (self.fleet, &self.group, &self.node) {
            (true, None, None) => Ok(Scope::Fleet),
            (false, Some(g), None) => named("--group", g).map(|()| Scope::Group(g.clone())),
            (false, None, Some(n)) => named("--node", n).map(|()| Scope::Node(n.clone())),
            _ => Err(Usage("mesh-host: say where to put it: one of --fleet, --group G, --node N".into())),
        }
    }
}

/// Bad usage found after parsing: exits 2, like clap's own.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Usage(pub String);

/// How a command ended, when it ran to the end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// The machine matches (or, for read-only commands, all is well).
    Converged,
    /// An apply failed for some resource; the report says which.
    Failed,
}

/// Whether `e` is a write to etcd whose outcome is unknown: sent, and its answer lost. Such a
/// command exits 3 (neither done nor refused: read back with `fleet status` or `fleet rollout
/// status`, and repeat it, which is safe); docs/decisions.md, "Unknown outcomes".
pub fn outcome_unknown(e: &anyhow::Error) -> bool {
    matches!(e.downcast_ref::<crate::system::etcd::Error>(), Some(crate::system::etcd::Error::Unknown { .. }))
}

/// Runs one command to its end, and says whether the machine converged.
pub fn run(mut cli: Cli) -> anyhow::Result<Ended> {
    // The store is reached by descriptors relative to its directory, so it is made absolute
    // once, here, against the directory the command was started in.
    cli.state = std::path::absolute(&cli.state)
        .with_context(|| format!("cannot resolve the state path {}", cli.state.display()))?;
    let reach = Reach {
        bus: cli.bus.clone(),
        socket: cli.container_socket.clone(),
        step_timeout: (cli.step_timeout > 0).then(|| std::time::Duration::from_secs(cli.step_timeout)),
        archive_limits: ArchiveLimits { bytes: cli.archive_max_bytes, entries: cli.archive_max_entries },
        key: key_path(cli.key.as_deref(), &cli.state),
        keep: usize::from(cli.keep_generations),
    };
    let key = reach.key.clone();
    match cli.command {
        Command::Check { file, json, trust } => {
            check(&file, json, &sign::Verify::of(&trust, &cli.state, false)?)
        }
        Command::Plan { file, origin, json, run_verify, trust } => {
            let verify = sign::Verify::of(&trust, &cli.state, false)?;
            plan(&file, origin, Planned { json, run_verify }, &cli.state, reach, &verify)
        }
        Command::Apply { file, origin, json, verbose, trust } => {
            let verify = sign::Verify::of(&trust, &cli.state, true)?;
            apply_cmd(&file, origin, Shown { json, verbose }, &cli.state, reach, &verify)
        }
        Command::Sign(args) => sign::sign(args),
        Command::Status { json } => status(json, &cli.state, &reach.key),
        Command::Generations { json } => generations(json, &cli.state),
        Command::Rollback { generation, release, reason, json } => {
            rollback(Rollback { generation, release, reason, json }, &cli.state, reach)
        }
        Command::Drift { json, since, id } => drift(json, since, id.as_deref(), &cli.state),
        Command::Fleet { command } => fleet(command),
        Command::Run(args) => daemon(args, &cli.state, reach),
        Command::Schema => {
            println!("{}", serde_json::to_string_pretty(&crate::declaration::json_schema())?);
            Ok(Ended::Converged)
        }
        Command::Keygen { rotate, retire_previous } => keygen(&key, rotate, retire_previous),
        Command::Pubkey => pubkey(&key),
        Command::Seal { to } => seal(&to),
        Command::Completions { shell } => {
            let mut command = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut command, "mesh-host", &mut std::io::stdout());
            Ok(Ended::Converged)
        }
        Command::Man => {
            let command = <Cli as clap::CommandFactory>::command();
            clap_mangen::Man::new(command).render(&mut std::io::stdout())?;
            Ok(Ended::Converged)
        }
    }
}

/// Raises the daemon's soft limit on open files to the hard limit, and says so once: before
/// anything opens a descriptor or sizes itself by the limit (the HTTP server's connections), so a
/// daemon started from a shell (1,024) gets what the unit would give it.
fn raise_descriptor_limit() {
    match crate::system::raise_descriptor_limit() {
        Ok((before, soft, hard)) if before < soft => {
            tracing::info!(
                before,
                soft,
                hard,
                "raised the limit on open files from {before} to {soft}, the hard limit"
            )
        }
        Ok((_, soft, hard)) => {
            tracing::info!(soft, hard, "the limit on open files is {soft} (the hard limit is {hard})")
        }
        Err(e) => tracing::warn!(error = %e, "cannot raise the limit on open files; it stays as started"),
    }
}

/// `mesh-host run`: the controller, and the fleet's tasks beside it when the declaration comes
/// from etcd. The face starts both; the controller is handed a directory to read and gives out
/// what it applied, and knows nothing of etcd (`controller`'s module doc).
fn daemon(args: RunArgs, state: &Path, reach: Reach) -> anyhow::Result<Ended> {
    raise_descriptor_limit();
    let RunArgs {
        declaration,
        origin,
        metrics,
        resync,
        settle_ms,
        workers,
        etcd,
        node,
        groups,
        confirm_window,
        login,
        trust,
    } = args;
    let trust = sign::daemon_trust(&trust, etcd.is_some(), &declaration)?;
    let metrics = match metrics.as_str() {
        "off" | "none" => None,
        addr => Some(addr.parse().map_err(|e| Usage(format!("--metrics {addr:?}: {e}")))?),
    };
    let mut declaration = std::path::absolute(&declaration)?;
    let fleet = match (etcd, node) {
        (Some(endpoints), Some(node)) => {
            crate::fleet::check_name("--node", &node).map_err(|e| Usage(format!("mesh-host: {e}")))?;
            for g in &groups {
                crate::fleet::check_name("--group", g).map_err(|e| Usage(format!("mesh-host: {e}")))?;
            }
            let client = login.client(&endpoints)?;
            // The last declaration accepted from etcd, beside the state store: what the
            // controller reads as its source, and what a restart applies while etcd is out of
            // reach (docs/decisions.md, "The cache is the declaration source").
            let dir = crate::store::state_dir(state).join("fleet");
            crate::system::fs::private_dir(&dir)
                .with_context(|| format!("cannot make the fleet cache directory {}", dir.display()))?;
            declaration = dir.join("declaration.d");
            Some((crate::fleet::source::Source { endpoints, node, groups }, client))
        }
        _ => None,
    };
    let config = crate::controller::Config {
        declaration: declaration.clone(),
        state: state.to_owned(),
        origin,
        metrics,
        // A resync of 0 would be a full pass in a loop: one second is the floor.
        resync: std::time::Duration::from_secs(resync.max(1)),
        quiet: std::time::Duration::from_millis(settle_ms),
        queue: crate::controller::queue::Config::default(),
        bus: reach.bus,
        container_socket: reach.socket,
        workers: usize::from(workers),
        step_timeout: reach.step_timeout,
        archive_limits: reach.archive_limits,
        key: reach.key,
        keep_generations: reach.keep,
        trust,
    };
    tokio::runtime::Handle::current().block_on(async move {
        // The controller first: it takes the store's lock, so a second agent on the same state
        // stops before its fleet tasks could write the cache or the node's status.
        let daemon = crate::controller::Daemon::start(config).await?;
        let beside = match fleet {
            Some((source, client)) => {
                let given = crate::fleet::daemon::Beside {
                    shutdown: daemon.shutdown(),
                    metrics: daemon.metrics(),
                    applied: daemon.applied(),
                };
                // Read before the first pass: the generation a new one would go back to.
                let generations = crate::generations::Generations::of(state);
                let fleet_dir = crate::store::state_dir(state).join("fleet");
                let confirm = crate::fleet::confirm::Confirm {
                    window: std::time::Duration::from_secs(confirm_window),
                    in_force: generations.in_force(),
                    generations,
                    file: std::sync::Arc::new(crate::fleet::pending::WindowFile::in_dir(&fleet_dir)),
                };
                crate::fleet::daemon::start(source, client, declaration, confirm, given).await
            }
            None => Vec::new(),
        };
        daemon.run(beside).await
    })?;
    Ok(Ended::Converged)
}

fn fleet(command: FleetCommand) -> anyhow::Result<Ended> {
    let (args, diff) = match command {
        FleetCommand::Rollout { command } => return rollout(command),
        FleetCommand::Put(args) => (args, false),
        FleetCommand::Diff(args) => (args, true),
        FleetCommand::Grant { etcd, login, node, groups, node_password_file } => {
            for (what, name) in
                std::iter::once(("--node", &node)).chain(groups.iter().map(|g| ("--group", g)))
            {
                crate::fleet::check_name(what, name).map_err(|e| Usage(format!("mesh-host: {e}")))?;
            }
            let etcd = login.client(&etcd)?;
            let password =
                match &node_password_file {
                    Some(file) => Some(crate::system::input::read_password(file).with_context(|| {
                        format!("cannot read the node's password file {}", file.display())
                    })?),
                    None => None,
                };
            let out = tokio::runtime::Handle::current().block_on(crate::fleet::grant(
                &etcd,
                &node,
                &groups,
                password.as_ref(),
            ))?;
            print!("{out}");
            return Ok(Ended::Converged);
        }
        FleetCommand::Status { etcd, login, json } => {
            let etcd = login.client(&etcd)?;
            let (revision, rows) =
                tokio::runtime::Handle::current().block_on(crate::fleet::status::rows(&etcd))?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&serde_json::json!({"revision": revision, "nodes": rows}))?
                );
            } else {
                // Each node wrote its own status: the table escapes each field, this the rest.
                print!("{}", escape_lines(&crate::fleet::status::table(revision, &rows)));
            }
            return Ok(if rows.iter().all(|r| r.current) { Ended::Converged } else { Ended::Failed });
        }
    };
    let scope = args.scope()?;
    let etcd = args.login.client(&args.etcd)?;
    let files = read_for_fleet(&args.path, &scope)?;
    // Validated before anything is read from or written to etcd: a declaration mesh-host would
    // refuse never reaches it (docs/decisions.md, "`fleet put` validates twice").
    let wanted = crate::fleet::put::prepare(&scope, files)?;
    let runtime = tokio::runtime::Handle::current();
    // And as each node it reaches will read it, beside the other levels it reads.
    if let Err(refusal) = runtime.block_on(crate::fleet::put::check_nodes(&etcd, &scope, &wanted))? {
        return Err(Usage(refusal).into());
    }
    let out = if diff {
        runtime.block_on(crate::fleet::put::diff(&etcd, &scope, &wanted))?
    } else {
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

/// Reads a declaration file or directory for the fleet, or says why not (exit 2).
fn read_for_fleet(path: &Path, scope: &crate::fleet::Scope) -> anyhow::Result<Vec<(PathBuf, Vec<u8>)>> {
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
fn rollout(command: RolloutCommand) -> anyhow::Result<Ended> {
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
            if let Err(refusal) = runtime.block_on(crate::fleet::put::check_nodes(&etcd, &scope, &wanted))? {
                return Err(Usage(refusal.replace("this put", "this rollout")).into());
            }
            let start = rollout::Start {
                scope,
                wanted,
                sizes,
                canaries: args.canaries,
                soak: args.soak,
                max_failures: args.max_failures,
                deadline: args.deadline,
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

/// Where the node's key is: `--key`, else `sealing.key` beside the store, since the state
/// directory is already the agent's private one (docs/decisions.md, "The key file").
pub fn key_path(key: Option<&Path>, state: &Path) -> PathBuf {
    match key {
        Some(key) => std::path::absolute(key).unwrap_or_else(|_| key.to_owned()),
        None => crate::store::state_dir(state).join(crate::system::keys::DEFAULT_NAME),
    }
}

/// Reads the node's keyring, or says how to make one.
fn keyring(key: &Path) -> anyhow::Result<crate::secrets::Keyring> {
    let text = crate::system::keys::read(key)?.ok_or_else(|| {
        anyhow::anyhow!("this node has no sealing key at {}: make one with `mesh-host keygen`", key.display())
    })?;
    crate::secrets::Keyring::parse(&text)
        .with_context(|| format!("the key file {} is not an age identity file", key.display()))
}

fn keygen(key: &Path, rotate: bool, retire_previous: bool) -> anyhow::Result<Ended> {
    use crate::secrets::Keyring;
    if rotate || retire_previous {
        let current = keyring(key)?;
        let text = if rotate { current.rotate() } else { current.retire_previous()? };
        crate::system::keys::replace(key, &text)?;
        let now = Keyring::parse(&text)?;
        if rotate {
            eprintln!(
                "rotated {}: values sealed to the previous key ({}) still open until `mesh-host keygen --retire-previous`",
                key.display(),
                current.public_key()
            );
        } else {
            eprintln!(
                "retired the previous key of {}: only values sealed to the key below open",
                key.display()
            );
        }
        println!("{}", now.public_key());
    } else {
        let text = Keyring::generate();
        crate::system::keys::create(key, &text)?;
        eprintln!("made the sealing key {} (mode 0600); its public key:", key.display());
        println!("{}", Keyring::parse(&text)?.public_key());
    }
    Ok(Ended::Converged)
}

fn pubkey(key: &Path) -> anyhow::Result<Ended> {
    let ring = keyring(key)?;
    println!("{}", ring.public_key());
    if ring.has_previous() {
        eprintln!("(a previous key is kept as well, until `mesh-host keygen --retire-previous`)");
    }
    Ok(Ended::Converged)
}

/// Seals what is on standard input. The value is held zeroed-on-drop, never logged.
fn seal(to: &str) -> anyhow::Result<Ended> {
    use std::io::Read as _;
    use zeroize::Zeroize as _;
    // Room for an ordinary value up front: a buffer that grows leaves its old copies behind.
    let mut plain = Vec::with_capacity(64 * 1024);
    let read = std::io::stdin().lock().read_to_end(&mut plain);
    let sealed = read.map_err(anyhow::Error::from).and_then(|_| Ok(crate::secrets::seal(to, &plain)?));
    plain.zeroize();
    println!("{}", sealed.context("cannot seal standard input")?.trim_end());
    Ok(Ended::Converged)
}

/// Reads and validates a declaration from what `run` reads (a file, or a directory whose
/// `*.json` files are one declaration) or from standard input when `source` is `-`, so that
/// what `check` and `plan` say of the live `declaration.d` is what the daemon will do with it.
/// A refusal is returned as itself so `main` can give it its own exit code.
pub fn load(source: &Path) -> anyhow::Result<Declaration> {
    load_files(source, None, None).map(|(d, _, _)| d)
}

/// A declaration's files, each named as it was read.
type Named = Vec<(String, Vec<u8>)>;

/// `load`, and the files it read, named as read (`-` for standard input), for the generation
/// the declaration becomes. With `bodies`, each file's declared bytes are moved into a content
/// file in that directory as the file is validated (`controller::contents`), and the file is
/// given back for the pass to read them from; where none can be made, they stay in memory.
/// With `verify`, what was read is verified before anything of it is parsed (`sign`).
fn load_files(
    source: &Path,
    bodies: Option<&Path>,
    verify: Option<&sign::Verify>,
) -> anyhow::Result<(Declaration, Named, Kept)> {
    use crate::system::input::DECLARATION_LIMIT;
    // Usage: the command was pointed at something that is not a declaration to read.
    let unreadable = |e: std::io::Error| {
        let shown =
            if source == Path::new("-") { "on standard input".into() } else { source.display().to_string() };
        Usage(format!("mesh-host: cannot read the declaration {shown}: {e}"))
    };
    if source == Path::new("-") {
        sign::verify_read(verify, source, &[])?;
        let bytes = crate::system::read_stdin(DECLARATION_LIMIT).map_err(unreadable)?;
        let (d, kept) = parse_moving_into(bodies, |keep| Declaration::parse_keeping(&bytes, keep))?;
        return Ok((d, vec![("stdin.json".into(), bytes)], kept));
    }
    let mut files = crate::system::read_source(source).map_err(unreadable)?;
    sign::verify_read(verify, source, &files)?;
    // A single file's problems are named as before, without the file's name on each line: the
    // person just typed it. A directory's name the file each is in, as the daemon's do
    // (docs/decisions.md, "The command line").
    if files.len() == 1 && files[0].0 == source {
        let (path, bytes) = files.pop().expect("one file");
        let (d, kept) = parse_moving_into(bodies, |keep| Declaration::parse_keeping(&bytes, keep))?;
        return Ok((d, vec![(path.display().to_string(), bytes)], kept));
    }
    let named: Vec<(String, Vec<u8>)> =
        files.into_iter().map(|(p, b)| (p.display().to_string(), b)).collect();
    let (d, kept) = parse_moving_into(bodies, |keep| Declaration::parse_sources_keeping(&named, keep))?;
    Ok((d, named, kept))
}

/// The content file a command's declared bytes were moved to, if they were.
type Kept = Option<std::sync::Arc<crate::system::ContentFile>>;

/// Parses with `parse`, moving the bodies into a content file in `bodies` when it is given.
fn parse_moving_into(
    bodies: Option<&Path>,
    parse: impl Fn(
        &(dyn Fn(&mut crate::declaration::Resource) + Sync),
    ) -> Result<Declaration, crate::declaration::Refused>,
) -> Result<(Declaration, Kept), crate::declaration::Refused> {
    let Some(dir) = bodies else { return Ok((parse(&|_| {})?, None)) };
    let (d, file) = crate::controller::contents::parse_moving_with(dir, parse)?;
    match file {
        Ok((file, files)) => {
            tracing::debug!(files, bytes = file.len(), directory = %dir.display(), "declared content kept in an unlinked file for this pass");
            Ok((d, Some(std::sync::Arc::new(file))))
        }
        Err(e) => {
            tracing::debug!(error = %e, directory = %dir.display(), "declared content kept in memory: no content file could be made");
            Ok((d, None))
        }
    }
}

/// Where `apply` keeps the declared bytes while it runs: the state directory, or, before a first
/// apply has made it, the nearest directory above it (the content file is unlinked: nothing is
/// left wherever it is, and the state directory is only made once the declaration is accepted).
fn content_dir(state: &Path) -> Option<&Path> {
    crate::store::state_dir(state).ancestors().find(|d| d.is_dir())
}

/// Loads a declaration for a command that may answer in JSON: under `--json` a refusal, or a
/// source that cannot be read, is also printed on stdout as JSON, so a script reading stdout
/// gets a document whatever happened. The error is still returned, for the exit code (2) and
/// the text on stderr.
fn load_for(source: &Path, json: bool, verify: &sign::Verify) -> anyhow::Result<Declaration> {
    load_files_for(source, json, None, verify).map(|(d, _, _)| d)
}

/// `load_for`, and the files read (`load_files`).
fn load_files_for(
    source: &Path,
    json: bool,
    bodies: Option<&Path>,
    verify: &sign::Verify,
) -> anyhow::Result<(Declaration, Named, Kept)> {
    load_files(source, bodies, Some(verify)).inspect_err(|e| {
        if json {
            if let Some(refusal) = refusal_json(e) {
                println!("{refusal:#}");
            }
        }
    })
}

/// A refusal as JSON: `{"refused": {"message", "problems": [{"source", "index", "id",
/// "field", "message"}], "unlisted"}}`, the same problems the text lists. A declaration that
/// could not be read is one problem with no index. `None` for any other error. A script then
/// needs neither to parse stderr nor to guess (docs/decisions.md, "The command line").
pub fn refusal_json(e: &anyhow::Error) -> Option<serde_json::Value> {
    if let Some(r) = e.downcast_ref::<crate::declaration::Refused>() {
        let problems: Vec<serde_json::Value> = r
            .problems
            .iter()
            .map(|p| {
                serde_json::json!({
                    "source": p.source, "index": p.index, "id": p.id, "field": p.field, "message": p.message,
                })
            })
            .collect();
        let message = r.to_string();
        let message = message.lines().next().unwrap_or_default();
        return Some(serde_json::json!({
            "refused": {"message": message, "problems": problems, "unlisted": r.unlisted}
        }));
    }
    if let Some(r) = e.downcast_ref::<crate::trust::Refusal>() {
        return Some(serde_json::json!({
            "refused": {
                "message": "the signed declaration was refused before it was parsed; nothing on the machine was touched",
                "reason": r.reason.label(),
                "problems": [{"source": null, "index": null, "id": null, "field": null, "message": r.message}],
                "unlisted": 0,
            }
        }));
    }
    let usage = e.downcast_ref::<Usage>()?;
    let message = usage.0.strip_prefix("mesh-host: ").unwrap_or(&usage.0);
    Some(serde_json::json!({
        "refused": {
            "message": "the declaration could not be read; nothing on the machine was touched",
            "problems": [{"source": null, "index": null, "id": null, "field": null, "message": message}],
            "unlisted": 0,
        }
    }))
}

/// How the machine's managers are reached, and how long a step may take: the global options.
struct Reach {
    bus: Option<String>,
    socket: Option<String>,
    step_timeout: Option<std::time::Duration>,
    archive_limits: ArchiveLimits,
    key: PathBuf,
    /// How many generations are kept (`--keep-generations`).
    keep: usize,
}

fn options(origin: Origin, state: &Path, dry_run: bool, reach: Reach) -> Options {
    Options {
        origin,
        dry_run,
        run_verify: false,
        originals: crate::store::originals_dir(state),
        bus: reach.bus,
        container_socket: reach.socket,
        step_timeout: reach.step_timeout,
        archive_limits: reach.archive_limits,
        // Bodies stay in the declaration, but where `apply` moved them out (`one_pass`).
        contents: None,
        key: reach.key,
        progress: None,
    }
}

/// How `apply` shows what it did.
#[derive(Clone, Copy)]
struct Shown {
    json: bool,
    verbose: bool,
}

/// Progress on standard error while a pass runs, for a person at a terminal: how many
/// resources are done, of how many, and the one being applied, on one line rewritten at most
/// ten times a second (a terminal redrawn for each of 10,000 files costs more than the files).
/// `None` when stderr is not a terminal, so logs and pipes never see it (docs/decisions.md, "The
/// command line").
fn terminal_progress() -> Option<apply::Progress> {
    if !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        return None;
    }
    let last = std::sync::Mutex::new(None::<std::time::Instant>);
    Some(apply::Progress(std::sync::Arc::new(move |done, total, id| {
        let mut last = last.lock().unwrap_or_else(|e| e.into_inner());
        if last.is_some_and(|t| t.elapsed() < std::time::Duration::from_millis(100)) {
            return;
        }
        *last = Some(std::time::Instant::now());
        // Ids are `[a-z0-9._-]`: nothing in one can move the cursor.
        eprint!("\r\x1b[2K[{done}/{total}] {id}");
    })))
}

/// Clears the progress line, if one was drawn.
fn clear_progress(progress: &Option<apply::Progress>) {
    if progress.is_some() {
        eprint!("\r\x1b[2K");
    }
}

fn check(file: &Path, json: bool, verify: &sign::Verify) -> anyhow::Result<Ended> {
    let d = load_for(file, json, verify)?;
    let mut by_kind: Vec<(Kind, usize)> = Kind::ALL
        .into_iter()
        .map(|k| (k, d.resources.iter().filter(|r| r.kind() == k).count()))
        .filter(|(_, n)| *n > 0)
        .collect();
    by_kind.sort_by_key(|k| std::cmp::Reverse(k.1));
    let mut modules: Vec<&str> = d.resources.iter().map(|r| r.id.module()).collect();
    modules.sort();
    modules.dedup();
    if json {
        let types: serde_json::Map<String, serde_json::Value> =
            by_kind.iter().map(|(k, n)| (k.to_string(), (*n).into())).collect();
        let summary = serde_json::json!({
            "declaration": file, "resources": d.resources.len(), "types": types, "modules": modules,
            "adoption": d.adoption.as_ref().map(|a| serde_json::json!({"taken": a.taken})),
        });
        println!("{summary:#}");
        return Ok(Ended::Converged);
    }
    let kinds: Vec<String> = by_kind.iter().map(|(k, n)| format!("{n} {k}")).collect();
    println!(
        "{}: valid, {} resources ({}) in {} modules",
        if file == Path::new("-") {
            "standard input".into()
        } else {
            escape(&file.display().to_string()).into_owned()
        },
        d.resources.len(),
        if kinds.is_empty() { "none".to_owned() } else { kinds.join(", ") },
        modules.len()
    );
    if let Some(a) = &d.adoption {
        println!(
            "adoption: modules taken: {}",
            if a.taken.is_empty() { "none".into() } else { a.taken.join(", ") }
        );
    }
    Ok(Ended::Converged)
}

/// How `plan` is asked for: its output, and whether it may run actions' `verify`.
#[derive(Clone, Copy)]
struct Planned {
    json: bool,
    run_verify: bool,
}

fn plan(
    file: &Path,
    origin: Origin,
    asked: Planned,
    state: &Path,
    reach: Reach,
    verify: &sign::Verify,
) -> anyhow::Result<Ended> {
    let json = asked.json;
    let d = load_for(file, json, verify)?;
    let mut store = Store::read_only(state)?;
    let mut opts = options(origin, state, true, reach);
    opts.run_verify = asked.run_verify;
    let (report, diffs) = apply::apply(&d, &mut store, &opts);
    let ended = if report.error.is_some() { Ended::Failed } else { Ended::Converged };
    if json {
        // The report apply would print (each action the one apply would report), and the diffs.
        let mut shown = serde_json::to_value(&report)?;
        let diffs: Vec<serde_json::Value> =
            diffs.0.iter().map(|(path, diff)| serde_json::json!({"path": path, "diff": diff})).collect();
        shown["diffs"] = diffs.into();
        println!("{shown:#}");
        return Ok(ended);
    }
    let mut out = String::new();
    for o in report.outcomes.iter().filter(|o| o.action != Verb::Unchanged) {
        line(&mut out, o.action.planned(), &o.id, &o.target, o.detail.as_deref());
    }
    for (_, diff) in &diffs.0 {
        // A diff is lines by design, of content anyone who could write the file chose.
        out.push_str(&escape_lines(diff));
    }
    if let Some(e) = &report.error {
        for f in &e.failures {
            line(&mut out, "would fail", &f.id, &f.target, Some(&f.message));
        }
    }
    let moving = report.outcomes.iter().filter(|o| o.action.moved()).count();
    let undecided = report.outcomes.iter().filter(|o| o.action == Verb::Undecided).count();
    let _ = write!(out, "plan: {moving} of {} resources would change", d.resources.len());
    if undecided > 0 {
        let _ = write!(out, ", {undecided} would run verify to decide (`--run-verify` runs it)");
    }
    let ran = if asked.run_verify { "only actions' verify was run" } else { "nothing was run" };
    let _ = writeln!(out, "; nothing was written, {ran}");
    print!("{out}");
    Ok(ended)
}

fn apply_cmd(
    file: &Path,
    origin: Origin,
    shown: Shown,
    state: &Path,
    reach: Reach,
    verify: &sign::Verify,
) -> anyhow::Result<Ended> {
    let json = shown.json;
    // The store is read while the declaration is parsed: two independent reads of about 20 and
    // 30 ms at 10,000 resources. A refused declaration is still the error reported, as if the
    // store had never been looked at.
    let t = std::time::Instant::now();
    let (d, store) = std::thread::scope(|scope| {
        let store = scope.spawn(|| {
            let t = std::time::Instant::now();
            let store = Store::read_only(state);
            tracing::debug!(elapsed_ms = t.elapsed().as_secs_f64() * 1e3, "state store opened");
            store
        });
        // The bodies go to a content file as they are parsed: at 100,000 files of 1 KiB they
        // are 102 MB, which in memory beside the declaration's text made the peak of the whole
        // apply (docs/memory.md, "The peak of a start").
        let d = load_files_for(file, json, content_dir(state), verify);
        (d, store.join().expect("opening the store does not panic"))
    });
    let (d, files, kept) = d?;
    // Locked only once the declaration is accepted: a refused one touches nothing.
    let mut store = store?.lock()?;
    let keep = reach.keep;
    let source = if file == Path::new("-") {
        "apply standard input".into()
    } else {
        format!("apply {}", file.display())
    };
    let generation = accept_generation(state, &source, &files, keep);
    drop(files);
    tracing::debug!(
        elapsed_ms = t.elapsed().as_secs_f64() * 1e3,
        resources = d.resources.len(),
        "declaration and store loaded"
    );
    one_pass(&d, kept, &mut store, origin, shown, state, reach, generation)
}

/// One pass of `d` with the store locked, as `apply` and `rollback` run it: the report
/// printed, the store written, and the generation's first pass noted. `contents` holds the
/// declared bytes where they were moved out of `d` (`load_files`).
#[allow(clippy::too_many_arguments, reason = "each is one of the pass's inputs, named at its two callers")]
fn one_pass(
    d: &Declaration,
    contents: Kept,
    store: &mut crate::store::Writer,
    origin: Origin,
    shown: Shown,
    state: &Path,
    reach: Reach,
    generation: Option<u64>,
) -> anyhow::Result<Ended> {
    let json = shown.json;
    let t = std::time::Instant::now();
    let mut opts = options(origin, state, false, reach);
    opts.contents = contents;
    opts.progress = if json { None } else { terminal_progress() };
    let (mut report, _) = apply::apply(d, store, &opts);
    clear_progress(&opts.progress);
    tracing::debug!(elapsed_ms = t.elapsed().as_secs_f64() * 1e3, "pass finished");
    if let Some(n) = generation {
        note_first_pass(state, n, &report);
    }
    // What worked is recorded even when something else failed: the record follows each fact.
    if let Err(e) = store.save() {
        report.store_error = Some(format!("{e}; what this apply did is on the machine but not recorded"));
    }
    for o in &report.outcomes {
        if o.action != Verb::Unchanged {
            // The report on stdout already says this to the person at the terminal; the log
            // line is for journald when apply runs from a timer or a script.
            tracing::debug!(id = %o.id, kind = %o.kind, target = %o.target, action = %o.action, detail = o.detail.as_deref().unwrap_or(""), "resource changed");
        }
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", human(&report, d.resources.len(), shown.verbose));
    }
    Ok(if report.failed() { Ended::Failed } else { Ended::Converged })
}

/// Records what `apply` accepted as a generation (`generations`), and releases a rollback's
/// hold when it is one never seen before, as a daemon would. A record, not a gate: what cannot
/// be recorded is said, and the declaration applied all the same.
fn accept_generation(state: &Path, source: &str, files: &[(String, Vec<u8>)], keep: usize) -> Option<u64> {
    let gens = crate::generations::Generations::of(state);
    let accepted = match gens.accept(source, files, keep) {
        Ok(accepted) => accepted,
        Err(e) => {
            eprintln!(
                "mesh-host: cannot record the declaration as a generation ({e}); it is applied all the same"
            );
            return None;
        }
    };
    if accepted.new {
        match gens.hold() {
            Ok(Some(h)) if gens.release().is_ok() => eprintln!(
                "released the hold at generation {}: this declaration is new (generation {})",
                h.generation, accepted.number
            ),
            _ => {}
        }
    }
    accepted.new.then_some(accepted.number)
}

/// Notes how a new generation's first pass ended.
fn note_first_pass(state: &Path, n: u64, report: &Report) {
    let failed = report.error.as_ref().map(|e| e.failures.len());
    let outcome = crate::generations::outcome(failed, report.error.as_ref().is_some_and(|e| e.refused));
    if let Err(e) = crate::generations::Generations::of(state).first_pass(n, &outcome) {
        eprintln!("mesh-host: cannot note how generation {n}'s first pass ended: {e}");
    }
}

/// `mesh-host generations`.
fn generations(json: bool, state: &Path) -> anyhow::Result<Ended> {
    let gens = crate::generations::Generations::of(state);
    let all = gens.list()?;
    let in_force = gens.in_force();
    let hold = gens.hold()?;
    if json {
        let rows: Vec<serde_json::Value> = all
            .iter()
            .map(|m| {
                let mut row = serde_json::to_value(m).unwrap_or_default();
                row["in-force"] = (Some(m.number) == in_force).into();
                row["held"] = hold.as_ref().is_some_and(|h| h.generation == m.number).into();
                row
            })
            .collect();
        let all = serde_json::json!({"directory": gens.dir(), "in-force": in_force, "hold": hold, "generations": rows});
        println!("{}", serde_json::to_string_pretty(&all)?);
        return Ok(Ended::Converged);
    }
    println!("{:>4}  {:<20}  {:<14}  {:<16}  SOURCE", "GEN", "ACCEPTED", "FIRST PASS", "DIGEST");
    for m in &all {
        let mark = match (Some(m.number) == in_force, hold.as_ref().is_some_and(|h| h.generation == m.number))
        {
            (_, true) => "held",
            (true, false) => "in force",
            (false, false) => "",
        };
        println!(
            "{:>4}  {:<20}  {:<14}  {:<16}  {}{}",
            m.number,
            crate::controller::drift::utc(m.accepted_at * 1000),
            m.first_pass.as_deref().unwrap_or("-"),
            &m.digest[..m.digest.len().min(16)],
            escape(&m.source),
            if mark.is_empty() { String::new() } else { format!("  <- {mark}") }
        );
    }
    println!("{} generations kept in {}", all.len(), gens.dir().display());
    if let Some(h) = &hold {
        println!("{}", escape(&h.describe(&crate::controller::drift::utc(h.since * 1000))));
    }
    Ok(Ended::Converged)
}

/// What `mesh-host rollback` was asked.
struct Rollback {
    generation: Option<u64>,
    release: bool,
    reason: Option<String>,
    json: bool,
}

/// `mesh-host rollback`: the hold written, then the generation applied at once when no daemon
/// holds the store, or left to the daemon, which watches the hold (docs/decisions.md,
/// "Generations and rollback").
fn rollback(asked: Rollback, state: &Path, reach: Reach) -> anyhow::Result<Ended> {
    use crate::generations::{Generations, Hold};
    let gens = Generations::of(state);
    let usage = |e: crate::generations::Error| Usage(format!("mesh-host: rollback: {e}"));
    if asked.release {
        match gens.hold()? {
            Some(h) => {
                gens.release()?;
                println!(
                    "released the hold at generation {}: a daemon applies its source's declaration again",
                    h.generation
                );
            }
            None => println!("no hold to release: the node follows its source"),
        }
        return Ok(Ended::Converged);
    }
    let n = match asked.generation {
        Some(n) => gens.kept(n).map_err(usage)?.number,
        None => gens.previous().map_err(usage)?,
    };
    let files: Vec<(String, Vec<u8>)> =
        gens.files(n)?.into_iter().map(|(p, b)| (p.display().to_string(), b)).collect();
    // Refused as any declaration would be, before the hold is written: a generation this
    // version cannot read is not one to hold the node at.
    let d = Declaration::parse_sources(&files)?;
    drop(files);
    let hold = Hold {
        generation: n,
        since: crate::system::unix_secs(),
        by: crate::generations::operator(),
        reason: asked.reason,
        reverted: None,
    };
    let said = hold.describe(&crate::controller::drift::utc(hold.since * 1000));
    match Store::read_only(state)?.lock() {
        Err(crate::store::Error::Locked { .. }) => {
            gens.set_hold(&hold)?;
            println!(
                "{said}\nthe daemon running on {} applies it now; `mesh-host status` shows it",
                state.display()
            );
            Ok(Ended::Converged)
        }
        Err(e) => Err(e.into()),
        Ok(mut store) => {
            gens.set_hold(&hold)?;
            gens.set_in_force(n)?;
            let shown = Shown { json: asked.json, verbose: false };
            let ended = one_pass(&d, None, &mut store, Origin::Declared, shown, state, reach, None)?;
            eprintln!("{said}");
            Ok(ended)
        }
    }
}

fn line(out: &mut String, word: &str, id: &str, target: &str, detail: Option<&str>) {
    let _ = write!(out, "{word:>13} {} ({})", escape(id), escape(target));
    if let Some(d) = detail {
        // A detail may hold a command's output or a found file's words: one line, escaped.
        let _ = write!(out, ": {}", escape(d));
    }
    out.push('\n');
}

/// The report for a person: the count of each outcome per type, one line per resource that
/// changed in a way worth reading (all that changed with `verbose`; otherwise not `created`, so
/// a first apply of 10,000 files is a few lines, not 10,000), each failure, a summary.
pub fn human(report: &Report, declared: usize, verbose: bool) -> String {
    let mut out = String::new();
    let mut by_kind: Vec<(Kind, Vec<String>)> = Vec::new();
    for kind in Kind::ALL {
        let counts: Vec<String> = Verb::ALL
            .into_iter()
            .map(|a| (a, report.outcomes.iter().filter(|o| o.kind == kind && o.action == a).count()))
            .filter(|(_, n)| *n > 0)
            .map(|(a, n)| format!("{n} {a}"))
            .collect();
        if !counts.is_empty() {
            by_kind.push((kind, counts));
        }
    }
    // A table only where it says more than the last line: more than one type. Only what a
    // person needs to read is listed (docs/decisions.md, "The command line").
    if by_kind.len() > 1 {
        for (kind, counts) in &by_kind {
            let _ = writeln!(out, "{:>13} {}", kind.as_str(), counts.join(", "));
        }
    }
    let shown = |a: Verb| a != Verb::Unchanged && (verbose || a != Verb::Created);
    for o in report.outcomes.iter().filter(|o| shown(o.action)) {
        line(&mut out, o.action.as_str(), &o.id, &o.target, o.detail.as_deref());
    }
    let counts: Vec<String> = report.counts().iter().map(|(a, n)| format!("{n} {a}")).collect();
    let counts = if counts.is_empty() { "nothing to do".to_owned() } else { counts.join(", ") };
    match &report.error {
        None if report.store_error.is_none() => {
            let _ = writeln!(out, "converged: {declared} resources declared; {counts}");
        }
        None => {}
        Some(e) => {
            for f in &e.failures {
                line(&mut out, "failed", &f.id, &f.target, Some(&f.message));
            }
            let _ = writeln!(out, "apply failed: {}", escape_lines(&e.to_string()));
            if !report.outcomes.is_empty() {
                let _ = writeln!(out, "  of the rest: {counts}");
            }
            if !e.gated {
                out.push_str("  everything else was attempted; what is not listed as failed was done\n");
            }
        }
    }
    if let Some(why) = &report.store_error {
        let _ = writeln!(out, "apply failed to record: {}", escape(why));
        if report.error.is_none() {
            let _ = writeln!(out, "  every resource was applied: {counts}");
        }
    }
    out
}

/// `90s`, `15m`, `2h`, `1d`, or a bare number of seconds.
fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let (n, unit) = s.find(|c: char| !c.is_ascii_digit()).map_or((s, ""), |i| s.split_at(i));
    let n: u64 = n.parse().map_err(|_| format!("`{s}` is not a duration (90s, 15m, 2h, 1d)"))?;
    let scale = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86400,
        _ => return Err(format!("`{s}`: the unit is one of s, m, h, d")),
    };
    Ok(std::time::Duration::from_secs(n.saturating_mul(scale)))
}

/// One correction in a line: `2026-12-01T23:50:01Z corrected app.conf (/etc/app.conf):
/// content; by vim (pid 7, ...); put back in 1.2 ms`, then the hand-edit's diff, indented, or
/// why there is none.
fn drift_line(c: &crate::controller::drift::Correction) -> String {
    let when = crate::controller::drift::utc(c.at_ms);
    // Everything in a correction but its time was written by someone else: the path and the
    // diff by whoever edited the file, the writer's name by that process.
    let changed = if c.changed.is_empty() { String::new() } else { format!(": {}", escape(&c.changed)) };
    let took = c.put_back_ms.map(|ms| format!("; put back in {ms:.1} ms")).unwrap_or_default();
    let mut line = format!(
        "{when} corrected {} ({}){changed}; by {}{took}",
        escape(&c.id),
        escape(&c.target),
        escape(&c.who.describe())
    );
    if let Some(why) = &c.diff_omitted {
        line.push_str(&format!("; diff omitted: {}", escape(why)));
    }
    // The hand-edit's diff under its line, indented, so that lines stay one correction each
    // where the diff is absent and a reader's eye finds the next correction where it is not.
    for l in c.diff.iter().flat_map(|d| d.lines()) {
        line.push_str("\n    ");
        line.push_str(&escape_lines(l));
    }
    line
}

fn drift(
    json: bool,
    since: Option<std::time::Duration>,
    id: Option<&str>,
    state: &Path,
) -> anyhow::Result<Ended> {
    let all = crate::controller::drift::read(state)
        .with_context(|| format!("cannot read {}", crate::controller::drift::path(state).display()))?;
    let from = since.map(|d| crate::system::unix_millis().saturating_sub(d.as_millis() as u64));
    let shown =
        all.iter().filter(|c| from.is_none_or(|f| c.at_ms >= f)).filter(|c| id.is_none_or(|i| c.id == i));
    for c in shown {
        if json {
            println!("{}", serde_json::to_string(c)?);
        } else {
            println!("{}", drift_line(c));
        }
    }
    Ok(Ended::Converged)
}

fn status(json: bool, state: &Path, key: &Path) -> anyhow::Result<Ended> {
    let store = Store::read_only(state)?;
    let mut looker = apply::status::Looker::with_key(key);
    let mut rows = Vec::new();
    let mut drifted = 0;
    for (id, rec) in store.records() {
        let holds = looker.holds(rec).map(apply::status::Holds::as_str);
        if holds.is_some_and(|h| h != "holds") {
            drifted += 1;
        }
        rows.push(serde_json::json!({
            "id": id, "type": rec.kind, "target": rec.target, "origin": rec.origin,
            "applied-at": rec.applied_at, "machine": holds,
        }));
    }
    // The machine's own files the host copied before it first wrote over them: kept for ever, so
    // a person can compare or put one back (docs/decisions.md, "A file found with no record").
    let kept_dir = crate::store::originals_dir(state);
    let kept: Vec<serde_json::Value> = crate::system::fs::files_under(&kept_dir)
        .with_context(|| format!("cannot list the kept originals under {}", kept_dir.display()))?
        .into_iter()
        .filter_map(|copy| {
            let original = Path::new("/").join(copy.strip_prefix(&kept_dir).ok()?);
            Some(serde_json::json!({"path": original, "copy": copy}))
        })
        .collect();
    // What an adopted node holds as found: never applied, so not among the records.
    let held: Vec<serde_json::Value> = store
        .holds()
        .map(|(id, h)| serde_json::json!({"id": id, "type": h.kind, "target": h.target, "origin": h.origin}))
        .collect();
    // The last correction the daemon made, and who made the change it put back.
    let last = crate::controller::drift::read(state).ok().and_then(|mut all| all.pop());
    // The generation in force, and the rollback's hold: the first thing to know at 3 a.m.
    let gens = crate::generations::Generations::of(state);
    let generation = gens.in_force();
    let hold = gens.hold()?;
    let hold_said = hold.as_ref().map(|h| h.describe(&crate::controller::drift::utc(h.since * 1000)));
    if json {
        let hold = hold.as_ref().map(|h| {
            serde_json::json!({"generation": h.generation, "since": h.since, "by": h.by, "reason": h.reason, "reverted": h.reverted, "said": hold_said})
        });
        let all = serde_json::json!({
            "state": state, "generation": generation, "hold": hold,
            "records": rows, "kept": kept, "held": held, "last-correction": last,
        });
        println!("{}", serde_json::to_string_pretty(&all)?);
    } else {
        for r in &rows {
            println!(
                "{:>10} {} {} ({})",
                r["machine"].as_str().unwrap_or("-"),
                r["type"].as_str().unwrap_or(""),
                escape(r["id"].as_str().unwrap_or("")),
                escape(r["target"].as_str().unwrap_or(""))
            );
        }
        println!("{} records in {}; {drifted} no longer as the host left them", rows.len(), state.display());
        for k in &kept {
            println!(
                "{:>10} {} (the machine's original, at {})",
                "kept",
                escape(k["path"].as_str().unwrap_or("")),
                escape(k["copy"].as_str().unwrap_or(""))
            );
        }
        if !kept.is_empty() {
            println!(
                "kept originals: {} under {}, from before the host first wrote over them",
                kept.len(),
                kept_dir.display()
            );
        }
        for h in &held {
            println!(
                "{:>10} {} {} ({})",
                "held",
                h["type"].as_str().unwrap_or(""),
                escape(h["id"].as_str().unwrap_or("")),
                escape(h["target"].as_str().unwrap_or(""))
            );
        }
        if !held.is_empty() {
            println!("held as found: {}, until their modules are taken", held.len());
        }
        if let Some(c) = &last {
            println!("last correction: {}", drift_line(c));
        }
        match (generation, &hold_said) {
            (_, Some(said)) => println!("generation: {}", escape(said)),
            (Some(n), None) => println!("generation: {n} in force (`mesh-host generations` lists them)"),
            (None, None) => {}
        }
    }
    Ok(Ended::Converged)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bodies `apply` reads: moved to a content file as the declaration is parsed, from a
    /// single file as from a directory, so that its peak never holds them beside the text; and
    /// in the declaration when no directory is given (`plan`, `check`).
    #[test]
    #[allow(clippy::disallowed_methods, reason = "the test writes the declaration it reads")]
    fn apply_moves_the_bodies_out_of_the_declaration() {
        let dir = tempfile::tempdir().unwrap();
        let text = br#"{"version": 1, "resources": [
            {"type": "file", "id": "a", "path": "/srv/a", "content": "port=80\n"},
            {"type": "file", "id": "b", "path": "/srv/b", "bytes": "AAEC/w=="},
            {"type": "directory", "id": "c", "path": "/srv"}
        ]}"#;
        let single = dir.path().join("one.json");
        std::fs::write(&single, text).unwrap();
        let several = dir.path().join("d.d");
        std::fs::create_dir(&several).unwrap();
        std::fs::write(several.join("x.json"), text).unwrap();
        for source in [&single, &several] {
            let (d, named, kept) = load_files(source, Some(dir.path()), None).unwrap();
            assert_eq!(named.len(), 1);
            let kept = kept.expect("a content file in a directory that exists");
            assert_eq!(kept.len(), 8 + 4, "{source:?}: both bodies moved");
            assert!(
                d.resources.iter().all(|r| r.movable_body().is_none()),
                "{source:?}: none left in memory"
            );
            let (d, _, kept) = load_files(source, None, None).unwrap();
            assert!(kept.is_none());
            assert_eq!(d.resources.iter().filter(|r| r.movable_body().is_some()).count(), 2);
        }
    }

    /// Before a first apply has made the state directory, the content file is made in the
    /// nearest directory above it; the state directory is not made by it.
    #[test]
    #[allow(clippy::disallowed_methods, reason = "the test makes the state directory")]
    fn the_content_file_goes_above_a_state_directory_not_made_yet() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("var/lib/mesh-host/state.json");
        assert_eq!(content_dir(&state), Some(dir.path()));
        assert!(!dir.path().join("var").exists());
        let made = dir.path().join("var/lib/mesh-host");
        std::fs::create_dir_all(&made).unwrap();
        assert_eq!(content_dir(&state), Some(made.as_path()));
    }

    /// Every argument of every command, by command path (`run`, `completions`).
    fn every_argument() -> Vec<(String, clap::Arg)> {
        fn walk(prefix: &str, command: &clap::Command, out: &mut Vec<(String, clap::Arg)>) {
            for arg in command.get_arguments() {
                out.push((prefix.to_owned(), arg.clone()));
            }
            for sub in command.get_subcommands() {
                walk(format!("{prefix} {}", sub.get_name()).trim_start(), sub, out);
            }
        }
        let mut out = Vec::new();
        walk("", &<Cli as clap::CommandFactory>::command(), &mut out);
        out
    }

    #[test]
    fn every_argument_has_help_text() {
        for (command, arg) in every_argument() {
            let id = arg.get_id().as_str();
            if matches!(id, "help" | "version") {
                continue;
            }
            assert!(
                arg.get_help().is_some_and(|h| h.to_string().len() > 10),
                "`{command}` argument {id} has no help"
            );
        }
    }

    #[test]
    fn the_configuration_reference_names_every_flag() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/configuration.md");
        let reference = std::fs::read_to_string(path).unwrap();
        for (command, arg) in every_argument() {
            if let Some(long) = arg.get_long().filter(|l| !matches!(*l, "help" | "version")) {
                assert!(
                    reference.contains(&format!("`--{long}")),
                    "docs/configuration.md does not name `{command}` --{long}"
                );
            }
        }
        for variable in ["MESH_HOST_LOG", "NO_COLOR", "JOURNAL_STREAM", "NOTIFY_SOCKET", "DOCKER_HOST"] {
            assert!(reference.contains(variable), "docs/configuration.md does not name {variable}");
        }
    }

    #[test]
    fn help_lists_the_exit_codes() {
        let help = <Cli as clap::CommandFactory>::command().render_help().to_string();
        assert!(help.contains("Exit codes:") && help.contains("  2  the declaration was refused"), "{help}");
    }
}
