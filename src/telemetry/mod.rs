//! Logging set-up. Structured `tracing` events; plain text, coloured only on a terminal and
//! without `NO_COLOR`; JSON lines when asked for; and under systemd, lines the journal reads
//! with their priority and without a timestamp of their own (the journal keeps one).

pub mod events;
pub mod http;
pub mod metrics;
pub mod text;
pub mod web;

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
    // https://no-color.org: set and not empty means no colour, whatever the terminal.
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr()) && !no_color;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .with_target(false);
    // Text lines escape the control characters of every field (`text::EscapedFields`), so that
    // a path or an error a local user wrote cannot steer the terminal reading the log; JSON is
    // escaped by serde.
    let _ = if json {
        builder.json().try_init()
    } else if crate::system::stderr_is_journal() {
        let builder = builder.fmt_fields(text::EscapedFields::default());
        builder.without_time().with_ansi(false).event_format(Journald::default()).try_init()
    } else {
        builder.fmt_fields(text::EscapedFields::default()).try_init()
    };
}

/// Lines for systemd's journal on standard error: each line of an event is prefixed with the
/// event's syslog priority (`<4>` for a warning), which journald reads and strips
/// (`SyslogLevelPrefix=`, on by default), so `journalctl -p warning` finds the warnings; no
/// timestamp, since the journal stamps every line. A prefix rather than the journal's native
/// protocol (`tracing-journald`): nothing more to connect to, and nothing lost if the socket
/// is not there, since the lines still go where systemd pointed stderr. Every line of a
/// multi-line event (a refusal lists its problems) gets the prefix, so none falls back to
/// the stream's default priority.
struct Journald {
    inner: tracing_subscriber::fmt::format::Format<tracing_subscriber::fmt::format::Full, ()>,
}

impl Default for Journald {
    fn default() -> Journald {
        let format = tracing_subscriber::fmt::format().without_time().with_target(false).with_ansi(false);
        Journald { inner: format }
    }
}

impl<S, N> tracing_subscriber::fmt::FormatEvent<S, N> for Journald
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
        mut writer: tracing_subscriber::fmt::format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        let mut line = String::new();
        self.inner.format_event(ctx, tracing_subscriber::fmt::format::Writer::new(&mut line), event)?;
        let priority = priority(*event.metadata().level());
        // The level word is padded to a column for a terminal; in the journal it leads the line.
        for part in line.trim_start().trim_end_matches('\n').split('\n') {
            writeln!(writer, "<{priority}>{part}")?;
        }
        Ok(())
    }
}

/// The syslog priority of a level, as journald reads it: 3 err, 4 warning, 6 info, 7 debug.
fn priority(level: tracing::Level) -> u8 {
    match level {
        tracing::Level::ERROR => 3,
        tracing::Level::WARN => 4,
        tracing::Level::INFO => 6,
        tracing::Level::DEBUG | tracing::Level::TRACE => 7,
    }
}
