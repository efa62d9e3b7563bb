//! Logging set-up. Structured `tracing` events; plain text without colour when the output is
//! not a terminal, or JSON lines when asked for.

pub mod events;
pub mod http;
pub mod metrics;

pub use events::Event;
pub use metrics::Metrics;

use tracing_subscriber::EnvFilter;

/// Installs the global subscriber. `MESH_HOST_LOG` filters (default `info`); logs go to
/// stderr so that stdout stays the command's own output (a report, a schema).
pub fn init(json: bool) {
    let filter = EnvFilter::try_from_env("MESH_HOST_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    // bollard logs every request and response body at debug, and a container's create request
    // and its inspection hold the values of its env-files, credentials among them. Capped here,
    // after the operator's filter, so that `MESH_HOST_LOG=debug` cannot put a secret in a log.
    let filter = filter.add_directive("bollard=info".parse().expect("a valid directive"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .with_target(false);
    let _ = if json { builder.json().try_init() } else { builder.try_init() };
}
