//! The binary: parse the command line, set up logging, run, and decide the exit code. This is
//! the one place exit codes are decided: 0 converged, 1 an apply failed, 2 the declaration was
//! refused or the usage was wrong, 3 a write to etcd whose outcome is unknown (its answer lost).

use std::process::ExitCode;

/// mimalloc rather than glibc's allocator: parsing a 10,000-resource declaration allocates and
/// frees hundreds of thousands of small strings, where glibc's arenas spent a fifth of the
/// time (measured with perf; see BENCHMARKS.md), and a daemon that runs for months benefits
/// from its lower fragmentation.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The allocator's policy, set by the binary itself before anything is allocated, so the agent's
/// memory does not depend on how it was started (an environment variable, a unit file): see
/// `system::memory::before_main`. The C runtime calls what `.init_array` holds before `main`.
/// The one use of a linker section in the workspace, hence the lint allowed here alone.
#[allow(unsafe_code)]
#[used]
#[link_section = ".init_array"]
static ALLOCATOR_POLICY: extern "C" fn() = mesh_host::system::memory::before_main;

use clap::Parser as _;
use mesh_host::cli::{self, Cli, Ended};
use mesh_host::declaration::Refused;

fn main() -> ExitCode {
    // clap itself exits with 2 on bad usage.
    let cli = Cli::parse();
    if matches!(cli.command, cli::Command::Run { .. }) {
        mesh_host::system::memory::for_the_daemon();
    } else {
        mesh_host::system::memory::for_a_command();
    }
    mesh_host::telemetry::init(cli.log_json);
    if mesh_host::system::durable::MUTANT {
        tracing::warn!(
            "this build never syncs to disk (feature powerloss-mutant): for the power-loss lanes only"
        );
    }
    #[cfg(feature = "robust-mutant")]
    if let Ok(m) = std::env::var("MESH_HOST_MUTANT") {
        tracing::warn!("this build is broken on purpose (feature robust-mutant, MESH_HOST_MUTANT={m}): for tests/robust only");
    }
    tracing::debug!(arena_eager_commit = mesh_host::system::memory::arena_eager_commit(), "allocator policy");
    // The command runs on the main thread with a small runtime entered: the apply engine is
    // synchronous and reaches async protocols (Docker, D-Bus) through the runtime's handle,
    // and the daemon blocks on its async controller from here.
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("mesh-host: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let result = {
        let _entered = runtime.enter();
        cli::run(cli)
    };
    match result {
        Ok(Ended::Converged) => ExitCode::from(0),
        Ok(Ended::Failed) => ExitCode::from(1),
        Err(e) if cli::outcome_unknown(&e) => {
            eprintln!(
                "mesh-host: {e}\nthe outcome is unknown: read back (`mesh-host fleet status`, `mesh-host fleet rollout status`); repeating the command is safe"
            );
            ExitCode::from(3)
        }
        Err(e)
            if e.downcast_ref::<Refused>().is_some()
                || e.downcast_ref::<cli::Usage>().is_some()
                || e.downcast_ref::<mesh_host::trust::Refusal>().is_some() =>
        {
            // An error quotes what it was given: a path, a node's words, a command's output.
            eprintln!("{}", mesh_host::telemetry::text::escape_lines(&e.to_string()));
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("mesh-host: {}", mesh_host::telemetry::text::escape_lines(&format!("{e:#}")));
            ExitCode::from(1)
        }
    }
}
