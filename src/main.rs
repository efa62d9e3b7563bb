//! The binary: parse the command line, set up logging, run, and decide the exit code. This is
//! the one place exit codes are decided: 0 converged, 1 an apply failed, 2 the declaration was
//! refused or the usage was wrong.

use std::process::ExitCode;

use clap::Parser as _;
use mesh_host::cli::{self, Cli, Ended};
use mesh_host::declaration::Refused;

fn main() -> ExitCode {
    // clap itself exits with 2 on bad usage.
    let cli = Cli::parse();
    mesh_host::telemetry::init(cli.log_json);
    match cli::run(cli) {
        Ok(Ended::Converged) => ExitCode::from(0),
        Ok(Ended::Failed) => ExitCode::from(1),
        Err(e) if e.downcast_ref::<Refused>().is_some() => {
            eprintln!("{e}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("mesh-host: {e:#}");
            ExitCode::from(1)
        }
    }
}
