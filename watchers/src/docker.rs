//! The container runtime's event stream: containers carrying a `mesh-host.id` label that die,
//! stop, are killed, run out of memory or are removed.
//!
//! Docker and Podman (through its Docker-compatible socket) are both spoken to with the Docker
//! Engine API. Their words differ for one event: a removed container is `destroy` to Docker
//! and `remove` to Podman; both are reported.
//!
//! When the runtime goes away (restarted, upgraded, its socket gone) the stream ends. The
//! watcher then reconnects with a capped exponential backoff, and once connected again says
//! [`Change::Resynced`]: whatever happened while it was away is not known, so everything is
//! reconciled.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bollard::models::EventMessage;
use bollard::query_parameters::EventsOptions;
use futures_util::{Stream, StreamExt as _};
use tokio::sync::mpsc::UnboundedSender;
use tokio::task::JoinHandle;

use crate::Change;

/// The name this watcher reports itself by in `Resynced` and `Up`.
pub const WATCHER: crate::Watcher = crate::Watcher::Docker;

/// The label that marks a container the host made, holding the id of its resource.
pub const ID_LABEL: &str = "mesh-host.id";

/// The label that marks a step's container (run-once or scheduled), which exits by design.
pub const STEP_LABEL: &str = "mesh-host.step";

/// The events that mean a container the host keeps running may no longer be.
pub const ACTIONS: [&str; 6] = ["die", "stop", "kill", "oom", "destroy", "remove"];

/// Where a runtime is looked for when none is configured, in this order: Docker's own socket,
/// then the system socket of Podman's service. `DOCKER_HOST`, when set, is tried first. The
/// agent's own client (`system::docker`) uses these, so the two never disagree.
pub const DEFAULT_SOCKETS: [&str; 2] = ["unix:///var/run/docker.sock", "unix:///run/podman/podman.sock"];

/// The first wait before reconnecting, and the cap: short at first, since a restarting
/// engine is usually back within a second, and capped so that a runtime that comes back after
/// a long outage is noticed within seconds.
const BACKOFF_FIRST: Duration = Duration::from_millis(100);
const BACKOFF_CAP: Duration = Duration::from_secs(5);

/// How long the event stream must stay open after its request before the watcher counts itself
/// subscribed.
const SUBSCRIBED: Duration = Duration::from_millis(200);

/// How long a stream must have lasted for its end to restart the backoff from the first wait.
const STEADY: Duration = Duration::from_secs(10);

/// Starts the watcher on the current tokio runtime. It runs until `tx`'s receiver is dropped.
/// `socket` is the runtime's socket (`unix:///run/podman/podman.sock`); `None` looks in the
/// usual places.
pub fn spawn(socket: Option<String>, tx: UnboundedSender<Change>) -> JoinHandle<()> {
    tokio::spawn(run(socket, tx))
}

/// The receiver of changes is gone: nobody listens any more, so the watcher stops.
struct Gone;

/// What the watcher keeps from one connection to the next.
struct Watch {
    /// Whether it last said it was up (`None` before it said anything), so `Up` is sent only
    /// when that changes.
    up: Option<bool>,
    /// Whether it was subscribed before: a later subscription says `Resynced`.
    connected_once: bool,
    /// The wait before the next attempt to connect.
    wait: Duration,
    /// Where the next subscription starts. The engine replays events from its recent history
    /// from this point, so nothing between deciding to subscribe and the request reaching the
    /// engine is missed (bollard sends the request only when the stream is first polled).
    since: String,
}

/// Connects, follows the event stream while it lasts, and after each end (or a failure to
/// connect) says the watcher is down and waits out the backoff before trying again, until the
/// receiver of changes is gone.
async fn run(socket: Option<String>, tx: UnboundedSender<Change>) {
    let mut watch = Watch { up: None, connected_once: false, wait: BACKOFF_FIRST, since: now() };
    loop {
        let connected = tokio::select! {
            _ = tx.closed() => return,
            c = connect(socket.as_deref()) => c,
        };
        match connected {
            Ok(client) => {
                if follow(&client, &tx, &mut watch).await.is_err() {
                    return;
                }
            }
            Err(e) => {
                tracing::debug!(watcher = WATCHER.as_str(), error = %e, "no container runtime answers yet")
            }
        }
        if !set_up(&tx, &mut watch.up, false) {
            return;
        }
        tokio::select! {
            _ = tx.closed() => return,
            _ = tokio::time::sleep(watch.wait) => {}
        }
        watch.wait = (watch.wait * 2).min(BACKOFF_CAP);
    }
}

/// Subscribes to a connected runtime's container events and, once subscribed, says the watcher
/// is up (and `Resynced` after a reconnection), then forwards every change until the stream
/// ends. Leaves in `watch` where the next subscription starts and the backoff to wait.
async fn follow(
    client: &bollard::Docker,
    tx: &UnboundedSender<Change>,
    watch: &mut Watch,
) -> Result<(), Gone> {
    // Only the type is filtered by the engine: Podman 4 does not match a label
    // filter that names a key without a value, so the label is checked here.
    let filters = HashMap::from([("type".to_owned(), vec!["container".to_owned()])]);
    let options = EventsOptions { since: Some(watch.since.clone()), until: None, filters: Some(filters) };
    let mut events = client.events(Some(options));
    let Some(pending) = first_poll(&mut events, tx).await? else { return Ok(()) };
    if !set_up(tx, &mut watch.up, true) {
        return Err(Gone);
    }
    if watch.connected_once {
        tracing::info!(watcher = WATCHER.as_str(), "reconnected to the container runtime; resyncing");
        tx.send(Change::Resynced { watcher: WATCHER }).map_err(|_| Gone)?;
    }
    watch.connected_once = true;
    let subscribed = Instant::now();
    if let Some(change) = pending.and_then(change_of) {
        tx.send(change).map_err(|_| Gone)?;
    }
    forward(&mut events, tx).await?;
    // A stream that lasted was a real connection: start the backoff afresh. One
    // that broke at once keeps growing it, so a failing engine is not hammered.
    if subscribed.elapsed() >= STEADY {
        watch.wait = BACKOFF_FIRST;
    }
    // Resume from shortly before the stream ended: a replayed event costs one
    // extra reconcile, a missed one costs a container left down.
    watch.since = now_minus(Duration::from_secs(1));
    Ok(())
}

/// Polls the event stream first, which sends the request, to learn whether the engine
/// subscribed the watcher: `None` if it refused or ended the stream at once; otherwise the
/// first event, if one came within `SUBSCRIBED`.
async fn first_poll<S>(
    events: &mut S,
    tx: &UnboundedSender<Change>,
) -> Result<Option<Option<EventMessage>>, Gone>
where
    S: Stream<Item = Result<EventMessage, bollard::errors::Error>> + Unpin,
{
    // The first poll sends the request. An engine that refuses it answers at once;
    // one still holding the stream open after a moment has subscribed us. Only then
    // is the watcher up, so a socket that accepts and fails does not flap `Up` and
    // `Resynced` on every retry.
    let first = tokio::select! {
        _ = tx.closed() => return Err(Gone),
        first = tokio::time::timeout(SUBSCRIBED, events.next()) => first,
    };
    Ok(match first {
        Ok(Some(Err(e))) => {
            tracing::debug!(watcher = WATCHER.as_str(), error = %e, "the container runtime refused the event stream");
            None
        }
        Ok(None) => None,
        Ok(Some(Ok(event))) => Some(Some(event)),
        Err(_) => Some(None),
    })
}

/// Sends the change each event means, until the stream fails or ends (each logged as a warning:
/// the watcher is then down until it reconnects).
async fn forward<S>(events: &mut S, tx: &UnboundedSender<Change>) -> Result<(), Gone>
where
    S: Stream<Item = Result<EventMessage, bollard::errors::Error>> + Unpin,
{
    loop {
        let item = tokio::select! {
            _ = tx.closed() => return Err(Gone),
            item = events.next() => item,
        };
        match item {
            Some(Ok(event)) => {
                if let Some(change) = change_of(event) {
                    tx.send(change).map_err(|_| Gone)?;
                }
            }
            Some(Err(e)) => {
                tracing::warn!(watcher = WATCHER.as_str(), error = %e, "the container runtime's event stream failed");
                return Ok(());
            }
            None => {
                tracing::warn!(watcher = WATCHER.as_str(), "the container runtime ended its event stream");
                return Ok(());
            }
        }
    }
}

/// Sends `Up` when the state changes; false when the receiver is gone.
fn set_up(tx: &UnboundedSender<Change>, up: &mut Option<bool>, now: bool) -> bool {
    if *up == Some(now) {
        return true;
    }
    *up = Some(now);
    tx.send(Change::Up { watcher: WATCHER, up: now }).is_ok()
}

/// The change an event means, if it is one of [`ACTIONS`] on a labelled container.
fn change_of(event: bollard::models::EventMessage) -> Option<Change> {
    let action = event.action?;
    // Docker says `die`; some runtimes qualify actions (`exec_die`, `health_status: ...`),
    // which are not the container going away.
    if !ACTIONS.contains(&action.as_str()) {
        return None;
    }
    let attributes = event.actor?.attributes?;
    // A step ending is what a step does, not drift; reporting it would run a failed run-once
    // step again at every exit of its own.
    if attributes.contains_key(STEP_LABEL) {
        return None;
    }
    let id_label = attributes.get(ID_LABEL)?.clone();
    let name = attributes.get("name").cloned().unwrap_or_default();
    Some(Change::Container { id_label, name, action })
}

/// Connects to the runtime at `socket`, or to the first that answers of `DOCKER_HOST` and
/// `DEFAULT_SOCKETS`; the error lists each tried and why it failed, for the log line that says
/// the watcher is down.
async fn connect(socket: Option<&str>) -> Result<bollard::Docker, String> {
    let candidates: Vec<String> = match socket {
        Some(s) => vec![s.to_owned()],
        None => std::env::var("DOCKER_HOST")
            .ok()
            .filter(|h| !h.is_empty())
            .into_iter()
            .chain(DEFAULT_SOCKETS.iter().map(|s| (*s).to_owned()))
            .collect(),
    };
    let mut tried = Vec::new();
    for socket in candidates {
        let address = if socket.contains("://") { socket.clone() } else { format!("unix://{socket}") };
        if address.strip_prefix("unix://").is_some_and(|p| !Path::new(p).exists()) {
            tried.push(format!("{socket}: no socket there"));
            continue;
        }
        let client = match bollard::Docker::connect_with_host(&address) {
            Ok(c) => c.with_timeout(Duration::from_secs(10)),
            Err(e) => {
                tried.push(format!("{socket}: {e}"));
                continue;
            }
        };
        // Negotiated, since bollard asks for a newer API than Debian's engine (1.41) speaks.
        match client.negotiate_version().await {
            Ok(c) => return Ok(c),
            Err(e) => tried.push(format!("{socket}: {e}")),
        }
    }
    Err(tried.join("; "))
}

/// Now, as the Engine API's `since` and `until` take it.
fn now() -> String {
    now_minus(Duration::ZERO)
}

/// A Unix time with nanoseconds, as the Engine API's `since` takes it.
fn now_minus(back: Duration) -> String {
    let t = SystemTime::now().checked_sub(back).unwrap_or(UNIX_EPOCH);
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    format!("{}.{:09}", d.as_secs(), d.subsec_nanos())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bollard::models::{EventActor, EventMessage};

    fn event(action: &str, labelled: bool) -> EventMessage {
        let mut attributes = HashMap::from([("name".to_owned(), "web".to_owned())]);
        if labelled {
            attributes.insert(ID_LABEL.to_owned(), "web.app".to_owned());
        }
        event_with(action, attributes)
    }

    fn event_with(action: &str, attributes: HashMap<String, String>) -> EventMessage {
        EventMessage {
            action: Some(action.to_owned()),
            actor: Some(EventActor { id: Some("abc".into()), attributes: Some(attributes) }),
            ..Default::default()
        }
    }

    #[test]
    fn only_a_labelled_container_going_away_is_a_change() {
        assert_eq!(
            change_of(event("die", true)),
            Some(Change::Container { id_label: "web.app".into(), name: "web".into(), action: "die".into() })
        );
        assert!(change_of(event("remove", true)).is_some(), "podman's word for destroy");
        assert_eq!(change_of(event("start", true)), None);
        assert_eq!(change_of(event("exec_die", true)), None);
        assert_eq!(change_of(event("die", false)), None);
        let step = HashMap::from([
            (ID_LABEL.to_owned(), "db.seed".to_owned()),
            (STEP_LABEL.to_owned(), "run-once".to_owned()),
        ]);
        assert_eq!(change_of(event_with("die", step)), None, "a step ends by design");
    }
}
