//! systemd: which of the watched units moved, from the manager's own signals.
//!
//! The task subscribes to the manager (`Subscribe`), then follows two signals: a unit's
//! `PropertiesChanged` (its ActiveState, SubState, ... moved) and the manager's `JobRemoved` (a
//! start, stop or restart of it finished). Each becomes a [`Change::Unit`] for a watched unit;
//! what that means is the controller's to decide.
//!
//! When the bus goes away (systemd or the bus daemon restarting, a socket closed), the task says
//! [`Change::Up`] `false`, connects again with a capped exponential backoff, and once connected
//! says `Up` `true` and [`Change::Resynced`]: whatever moved in between was not seen.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use futures_util::StreamExt as _;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use zbus::message::Type as MessageType;
use zbus::{Connection, MatchRule, Message, MessageStream, OwnedObjectPath};

use crate::Change;

const WATCHER: crate::Watcher = crate::Watcher::Systemd;
// systemd's D-Bus names, defined once here; the agent's own client (`system::systemd`) uses them.
/// systemd's bus name.
pub const DESTINATION: &str = "org.freedesktop.systemd1";
/// The manager's object path.
pub const MANAGER_PATH: &str = "/org/freedesktop/systemd1";
const UNIT_PATHS: &str = "/org/freedesktop/systemd1/unit";
/// The manager's interface.
pub const MANAGER: &str = "org.freedesktop.systemd1.Manager";
/// A unit's interface.
pub const UNIT: &str = "org.freedesktop.systemd1.Unit";
/// The standard properties interface.
pub const PROPERTIES: &str = "org.freedesktop.DBus.Properties";
/// The properties whose change means the unit moved.
const STATES: [&str; 3] = ["ActiveState", "SubState", "LoadState"];

/// How long connecting and subscribing may take before the attempt counts as failed and is
/// made again. Without a bound, a reply that never comes would leave the watcher connected and
/// deaf for good. (That was seen once: a stream's full queue stopped zbus reading the reply;
/// see QUEUE, and its regression test `zbus_queue_...` in tests/it/systemd.rs.)
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The first wait before connecting again, and the longest.
const BACKOFF_FIRST: Duration = Duration::from_millis(100);
const BACKOFF_CAP: Duration = Duration::from_secs(10);

/// Starts the watcher on the current tokio runtime.
///
/// `bus` is a D-Bus address (`unix:path=/run/dbus/system_bus_socket`), or `None` for the system
/// bus. `units` holds the names of the units to report (`nginx.service`); it may change at any
/// time and is read afresh for every signal. The task ends when the receiving side of `tx` is
/// dropped, or the sending side of `units`.
pub fn spawn(
    bus: Option<String>,
    units: watch::Receiver<BTreeSet<String>>,
    tx: mpsc::UnboundedSender<Change>,
) -> JoinHandle<()> {
    tokio::spawn(run(bus, units, tx))
}

/// How following a connection ended.
enum StreamEnd {
    /// The bus went away: connect again.
    Lost,
    /// Nobody listens any more: stop.
    Stop,
}

async fn run(
    bus: Option<String>,
    mut units: watch::Receiver<BTreeSet<String>>,
    tx: mpsc::UnboundedSender<Change>,
) {
    let mut wait = BACKOFF_FIRST;
    // Whether a connection was ever made or tried: the very first connection needs no resync,
    // since the controller reconciles everything when it starts.
    let mut tried = false;
    // What was last said with `Up`, so that only transitions are sent.
    let mut up: Option<bool> = None;
    let say_up = |up: &mut Option<bool>, now: bool| {
        if *up != Some(now) {
            *up = Some(now);
            tx.send(Change::Up { watcher: WATCHER, up: now }).is_ok()
        } else {
            true
        }
    };
    loop {
        let attempt = tokio::time::timeout(CONNECT_TIMEOUT, connect(bus.as_deref())).await;
        match attempt.unwrap_or_else(|_| Err(zbus::Error::Failure("no answer to Subscribe in time".into()))) {
            Ok((_conn, signals)) => {
                wait = BACKOFF_FIRST;
                if !say_up(&mut up, true) {
                    return;
                }
                if tried && tx.send(Change::Resynced { watcher: WATCHER }).is_err() {
                    return;
                }
                tried = true;
                tracing::debug!(bus = bus.as_deref().unwrap_or("system"), "systemd watcher connected");
                match follow(signals, &mut units, &tx).await {
                    StreamEnd::Stop => return,
                    StreamEnd::Lost => {
                        tracing::warn!(
                            bus = bus.as_deref().unwrap_or("system"),
                            "systemd bus lost; reconnecting"
                        );
                        if !say_up(&mut up, false) {
                            return;
                        }
                    }
                }
            }
            Err(e) => {
                tried = true;
                tracing::warn!(bus = bus.as_deref().unwrap_or("system"), error = %e, retry_in = ?wait, "cannot reach systemd");
                if !say_up(&mut up, false) {
                    return;
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = tx.closed() => return,
        }
        wait = (wait * 2).min(BACKOFF_CAP);
    }
}

/// How many signals may wait, unread, on one stream. zbus stops reading the connection when a
/// stream's queue is full, replies included: while `Subscribe` is awaited nothing reads the
/// streams, and a burst of signals (a manager reload announces every unit) must not fill them.
const QUEUE: std::num::NonZeroUsize = std::num::NonZeroUsize::new(65_536).unwrap();

/// The signals followed: one stream for units' `PropertiesChanged`, one for `JobRemoved`.
struct Signals {
    properties: MessageStream,
    jobs: MessageStream,
}

/// Connects, listens, then subscribes: the streams exist before systemd starts sending, so
/// nothing between the two is lost.
async fn connect(bus: Option<&str>) -> zbus::Result<(Connection, Signals)> {
    let builder = match bus {
        Some(a) => zbus::conn::Builder::address(a),
        None => zbus::conn::Builder::system(),
    };
    let conn = builder.max_queued(QUEUE).build().await?;
    let queue = Some(QUEUE);
    // Matched by path and interface rather than by sender: the rules then hold across a
    // systemd re-execution, which gives the manager a new unique name on the bus.
    let properties = MatchRule::builder()
        .msg_type(MessageType::Signal)
        .interface(PROPERTIES)
        .member("PropertiesChanged")
        .path_namespace(UNIT_PATHS)
        .arg(0, UNIT)
        .build()?;
    let jobs = MatchRule::builder()
        .msg_type(MessageType::Signal)
        .interface(MANAGER)
        .member("JobRemoved")
        .path(MANAGER_PATH)
        .build()?;
    let signals = Signals {
        properties: MessageStream::for_match_rule(properties, &conn, queue).await?,
        jobs: MessageStream::for_match_rule(jobs, &conn, queue).await?,
    };
    conn.call_method(Some(DESTINATION), MANAGER_PATH, Some(MANAGER), "Subscribe", &()).await?;
    Ok((conn, signals))
}

async fn follow(
    mut signals: Signals,
    units: &mut watch::Receiver<BTreeSet<String>>,
    tx: &mpsc::UnboundedSender<Change>,
) -> StreamEnd {
    let mut paths = paths_of(&units.borrow_and_update());
    loop {
        // In this order: a change of the set applies to every signal handled after it, and a
        // signal waiting is handled before the end of the channel is noticed.
        tokio::select! {
            biased;
            changed = units.changed() => match changed {
                Ok(()) => paths = paths_of(&units.borrow_and_update()),
                Err(_) => return StreamEnd::Stop,
            },
            msg = next_signal(&mut signals) => match msg {
                Some(Ok(msg)) => {
                    if let Some(unit) = unit_of(&msg, &paths, units) {
                        if tx.send(Change::Unit { unit }).is_err() {
                            return StreamEnd::Stop;
                        }
                    }
                }
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "systemd watcher: unreadable message");
                }
                None => return StreamEnd::Lost,
            },
            _ = tx.closed() => return StreamEnd::Stop,
        }
    }
}

/// The next signal of either stream; `None` once either ends, which means the connection did.
///
/// Job ends first. zbus reads the connection in order and puts each signal in its stream's
/// queue, so when a unit's `PropertiesChanged` is taken, every `JobRemoved` that came before it
/// on the connection is already queued, and taken first. The two streams are then reported in
/// the order systemd sent them but for job ends overtaking state changes, which the controller
/// does not mind (either only names the unit), and a test can use one unit's state change as
/// a barrier behind everything sent before it. Without a bias, tokio picks a ready branch at
/// random.
async fn next_signal(s: &mut Signals) -> Option<zbus::Result<Message>> {
    tokio::select! {
        biased;
        m = s.jobs.next() => m,
        m = s.properties.next() => m,
    }
}

/// The watched unit a signal is about, if it is about one.
fn unit_of(
    msg: &Message,
    paths: &HashMap<String, String>,
    units: &watch::Receiver<BTreeSet<String>>,
) -> Option<String> {
    let header = msg.header();
    let interface = header.interface()?.as_str();
    let member = header.member()?.as_str();
    match (interface, member) {
        (PROPERTIES, "PropertiesChanged") => {
            let path = header.path()?.as_str();
            let unit = paths.get(path)?;
            // Only a change of state counts: systemd also announces timestamps, the job queued,
            // a unit file changed on disk (on every manager reload), none of which says the
            // unit moved. The type-specific interfaces (Service, Socket...) change alongside.
            let (iface, changed, invalidated): (String, HashMap<String, zbus::OwnedVariant>, Vec<String>) =
                msg.body().deserialize().ok()?;
            let moved = STATES.iter().any(|p| changed.contains_key(*p) || invalidated.iter().any(|i| i == p));
            (iface == UNIT && moved).then(|| unit.clone())
        }
        (MANAGER, "JobRemoved") => {
            let (_, _, unit, _): (u32, OwnedObjectPath, String, String) = msg.body().deserialize().ok()?;
            units.borrow().contains(&unit).then_some(unit)
        }
        _ => None,
    }
}

fn paths_of(units: &BTreeSet<String>) -> HashMap<String, String> {
    units.iter().map(|u| (unit_path(u), u.clone())).collect()
}

/// The object path systemd gives a unit: its name with every byte that is not an ASCII letter
/// or digit (and a leading digit) written as `_xx` in hex.
pub fn unit_path(unit: &str) -> String {
    let mut path = String::from("/org/freedesktop/systemd1/unit/");
    if unit.is_empty() {
        path.push('_');
    }
    for (i, b) in unit.bytes().enumerate() {
        if b.is_ascii_alphabetic() || (b.is_ascii_digit() && i > 0) {
            path.push(b as char);
        } else {
            path.push_str(&format!("_{b:02x}"));
        }
    }
    path
}

#[cfg(test)]
mod tests {
    use super::unit_path;

    #[test]
    fn unit_paths_are_escaped_as_systemd_does() {
        assert_eq!(unit_path("nginx.service"), "/org/freedesktop/systemd1/unit/nginx_2eservice");
        assert_eq!(
            unit_path("mesh-host-web.service"),
            "/org/freedesktop/systemd1/unit/mesh_2dhost_2dweb_2eservice"
        );
        assert_eq!(unit_path("1x.service"), "/org/freedesktop/systemd1/unit/_31x_2eservice");
    }
}
