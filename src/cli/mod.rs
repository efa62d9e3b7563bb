//! The command line: one function per command, in a file per group of commands (`one_shot`:
//! check, plan, apply; `daemon`: run; `state`: status, generations, rollback, drift; `secrets`;
//! `sign`; `fleet`), with the arguments and the loading of declarations they share here. Each
//! returns whether the machine converged; `main` turns that, or an error, into the exit code.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use clap::{Parser, Subcommand};

mod daemon;
mod fleet;
mod fleet_sign;
mod one_shot;
mod secrets;
mod sign;
mod state;
mod trust;

pub use daemon::RunArgs;
pub use fleet::{EtcdArgs, EtcdLogin, FleetCommand, FleetPut, RolloutCommand, RolloutStart};
pub use fleet_sign::{FleetSign, SigningArgs};
pub use one_shot::human;
pub use secrets::key_path;
pub use sign::{SignArgs, TrustArgs};
pub use trust::TrustCommand;

use daemon::daemon;
use fleet::fleet;
use one_shot::*;
use secrets::*;
use state::*;

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
    /// The largest file found at a managed path, with no record of the host's, whose original
    /// is kept whole before it is first written over; past it only its size, mode and owner
    /// are recorded beside where the copy would be, and it is not hashed either.
    #[arg(long, global = true, value_name = "BYTES", default_value_t = crate::apply::KEEP_MAX_BYTES)]
    pub keep_max_bytes: u64,
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
    /// The trust policy: who may sign which scope, and each node's groups (init, show, rotate).
    Trust {
        /// What to do with a policy.
        #[command(subcommand)]
        command: TrustCommand,
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
        keep_max_bytes: cli.keep_max_bytes,
        key: key_path(cli.key.as_deref(), &cli.state),
        keep: usize::from(cli.keep_generations),
    };
    let key = reach.key.clone();
    match cli.command {
        Command::Check { file, json, trust } => {
            check(&file, json, &sign::Verify::of(&trust, &cli.state, false, false)?)
        }
        Command::Plan { file, origin, json, run_verify, trust } => {
            // `plan` runs nothing, and reads as `check` does; with --run-verify it runs the
            // actions' verify as root, and takes its orders as `apply` does.
            let verify = sign::Verify::of(&trust, &cli.state, false, run_verify)?;
            plan(&file, origin, Planned { json, run_verify }, &cli.state, reach, &verify)
        }
        Command::Apply { file, origin, json, verbose, trust } => {
            let verify = sign::Verify::of(&trust, &cli.state, true, true)?;
            apply_cmd(&file, origin, Shown { json, verbose }, &cli.state, reach, &verify)
        }
        Command::Sign(args) => sign::sign(args),
        Command::Trust { command } => trust::trust(command),
        Command::Status { json } => status(json, &cli.state, &reach.key, reach.keep_max_bytes),
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
    let strict = verify.and_then(|v| v.strict.as_ref());
    let read = match strict {
        Some(trusted) => crate::system::read_strict_source(source, trusted),
        None => crate::system::read_source(source),
    };
    let mut files = read.map_err(unreadable)?;
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
    /// `--keep-max-bytes`.
    keep_max_bytes: u64,
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
        keep_max_bytes: reach.keep_max_bytes,
        // Bodies stay in the declaration, but where `apply` moved them out (`one_pass`).
        contents: None,
        key: reach.key,
        progress: None,
    }
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
