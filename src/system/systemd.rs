//! systemd, through its D-Bus API (`org.freedesktop.systemd1`).
//!
//! One connection per pass, made when the first service or process needs it. The API is
//! blocking: the apply engine is synchronous and runs on a blocking thread of a tokio runtime,
//! so each call drives the async zbus call to completion on that runtime's handle.
//!
//! Every state this module reports is read afresh with `org.freedesktop.DBus.Properties.Get`,
//! never from a proxy's property cache: a cached `ActiveState` can still say `active` for a
//! moment after a stop job has ended, and a read-back that trusts it proves nothing.

use std::time::Duration;

use futures_util::StreamExt as _;
use tokio::runtime::Handle;
use zbus::message::Type as MessageType;
use zbus::{Connection, MatchRule, MessageStream, OwnedObjectPath, OwnedVariant, Variant};

use mesh_host_watchers::systemd::{DESTINATION, MANAGER, MANAGER_PATH, PROPERTIES, UNIT};

/// How long one method call may go unanswered before it is an error, so that a reply lost for
/// any reason fails the resource instead of hanging the apply. A manager reload on a large
/// machine takes seconds, so the bound is generous.
const CALL_TIMEOUT: Duration = Duration::from_secs(90);

/// How many messages may wait unread on the connection or one of its streams. zbus stops
/// reading the connection, replies included, while a queue is full, so a burst of signals
/// arriving while a reply is awaited (a manager reload announces every unit) must fit.
const QUEUE: std::num::NonZeroUsize = std::num::NonZeroUsize::new(65_536).unwrap();

/// How long `Subscribe` may take before it is sent again, and how many times it is tried.
const SUBSCRIBE_TIMEOUT: Duration = Duration::from_secs(5);
const SUBSCRIBE_TRIES: u32 = 3;

/// How long a job may take before the host stops waiting for it. systemd times out a unit's
/// start itself (TimeoutStartSec); this only bounds the wait when the job's signal is lost.
const JOB_TIMEOUT: Duration = Duration::from_secs(600);

/// How long a unit that was just started must stay active to count as running. A simple
/// service is "started" by systemd as soon as its process is forked, so a program that exits at
/// once on a bad configuration satisfies the start job; it is only seen dead a moment later.
pub const UNIT_SECOND_LOOK: Duration = Duration::from_millis(300);

/// A failure talking to systemd, naming the unit.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The bus could not be reached.
    #[error("cannot reach systemd on {bus}: {reason}")]
    Connect {
        /// The bus's address.
        bus: String,
        /// Why it could not be reached.
        reason: String,
    },
    /// No such unit is loaded or installed; holds the unit's name.
    #[error("the unit {0} does not exist on this machine")]
    NoUnit(String),
    /// The unit is masked; holds the unit's name.
    #[error("the unit {0} is masked; mesh-host does not unmask a unit someone masked on purpose")]
    Masked(String),
    /// systemd answered a call with an error.
    #[error("systemd refused to {op} {unit}: {reason}")]
    Call {
        /// What was asked ("start", "enable").
        op: &'static str,
        /// The unit it was asked of.
        unit: String,
        /// systemd's answer.
        reason: String,
    },
    /// A job ran and ended otherwise than `done`.
    #[error("the {op} job of {unit} ended {result}, not done; journalctl -u {unit} says why")]
    Job {
        /// The job's operation ("start", "stop").
        op: &'static str,
        /// The unit the job was for.
        unit: String,
        /// How it ended (`failed`, `timeout`, `dependency`...).
        result: String,
    },
    /// A job that did not end within `JOB_TIMEOUT`.
    #[error("systemd did not finish the {op} job of {unit} within {} s", JOB_TIMEOUT.as_secs())]
    Timeout {
        /// The job's operation.
        op: &'static str,
        /// The unit the job was for.
        unit: String,
    },
}

type Result<T> = std::result::Result<T, Error>;

/// What systemd says of a unit right now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnitState {
    /// `loaded`, `not-found`, `masked`, `bad-setting`, `error`...
    pub load: String,
    /// `active`, `reloading`, `inactive`, `failed`, `activating`, `deactivating`.
    pub active: String,
    /// The type-specific state: `running`, `exited`, `dead`, `auto-restart`...
    pub sub: String,
}

impl UnitState {
    /// Whether systemd knows the unit at all.
    pub fn exists(&self) -> bool {
        !matches!(self.load.as_str(), "not-found")
    }

    /// Up: what a declaration means by `running`.
    pub fn running(&self) -> bool {
        matches!(self.active.as_str(), "active" | "reloading")
    }

    /// Down and settled: what a declaration means by `stopped`. A failed unit is not running,
    /// so it counts; the detail still says `failed`.
    pub fn stopped(&self) -> bool {
        matches!(self.active.as_str(), "inactive" | "failed")
    }
}

impl std::fmt::Display for UnitState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.active, self.sub)
    }
}

/// What a transient unit runs, as handed to `StartTransientUnit`.
pub struct Transient<'a> {
    /// The unit's name, `mesh-host-NAME.service`.
    pub unit: &'a str,
    /// Its description, which carries the digest of what it runs.
    pub description: &'a str,
    /// The program and its arguments.
    pub argv: &'a [String],
    /// `KEY=VALUE` lines. They may carry secrets: never logged.
    pub env: Vec<String>,
    /// The account it runs as; root when absent.
    pub user: Option<&'a str>,
}

/// A connection to one systemd.
pub struct Systemd {
    conn: Connection,
    handle: Handle,
    bus: String,
}

/// The bus a `--bus` option names, or the system bus, for messages.
pub fn describe_bus(bus: Option<&str>) -> String {
    match bus {
        Some(address) => format!("the bus at {address}"),
        None => "the system bus".to_owned(),
    }
}

impl Systemd {
    /// Connects to the bus at `address` (a D-Bus address such as
    /// `unix:path=/run/dbus/system_bus_socket`), or the system bus, and subscribes to the
    /// manager's signals so that jobs can be waited for.
    pub fn connect(address: Option<&str>) -> Result<Systemd> {
        let handle = Handle::current();
        let bus = describe_bus(address);
        let fail = |e: zbus::Error| Error::Connect { bus: bus.clone(), reason: reason(&e) };
        let conn = handle.block_on(async {
            let builder = match address {
                Some(a) => zbus::conn::Builder::address(a),
                None => zbus::conn::Builder::system(),
            };
            let conn = builder.method_timeout(CALL_TIMEOUT).max_queued(QUEUE).build().await?;
            // systemd sends JobRemoved only while some client is subscribed. Subscribing twice
            // is refused as "already subscribed", which is as good as a yes.
            let mut tries = 0;
            loop {
                tries += 1;
                let subscribe =
                    conn.call_method(Some(DESTINATION), MANAGER_PATH, Some(MANAGER), "Subscribe", &());
                match tokio::time::timeout(SUBSCRIBE_TIMEOUT, subscribe).await {
                    Ok(Ok(_)) => break,
                    Ok(Err(e)) if error_name(&e) == Some("org.freedesktop.systemd1.AlreadySubscribed") => {
                        break
                    }
                    Ok(Err(e)) => return Err(e),
                    Err(_) if tries < SUBSCRIBE_TRIES => continue,
                    Err(_) => return Err(zbus::Error::Failure("systemd did not answer Subscribe".into())),
                }
            }
            Ok::<_, zbus::Error>(conn)
        });
        let conn = conn.map_err(fail)?;
        Ok(Systemd { conn, handle, bus })
    }

    /// The bus this connection reached, for messages.
    pub fn bus(&self) -> &str {
        &self.bus
    }

    /// The unit's load, active and sub state, read uncached. A unit systemd cannot find is
    /// reported with `load` = `not-found`, not as an error: removal needs to tell them apart.
    pub fn state(&self, unit: &str) -> Result<UnitState> {
        self.handle.block_on(async {
            let path = self.load(unit).await?;
            Ok(UnitState {
                load: self.property(unit, &path, "LoadState").await?,
                active: self.property(unit, &path, "ActiveState").await?,
                sub: self.property(unit, &path, "SubState").await?,
            })
        })
    }

    /// Whether systemd says the unit's file or drop-ins changed on disk since it loaded them.
    pub fn needs_reload(&self, unit: &str) -> Result<bool> {
        self.handle.block_on(async {
            let path = self.load(unit).await?;
            let value = self.get(unit, &path, "NeedDaemonReload").await?;
            bool::try_from(value).map_err(|e| call("read the properties of", unit, e))
        })
    }

    /// A unit's description, read uncached.
    pub fn description(&self, unit: &str) -> Result<String> {
        self.handle.block_on(async {
            let path = self.load(unit).await?;
            self.property(unit, &path, "Description").await
        })
    }

    /// Whether the unit starts at boot, as `GetUnitFileState` says (`enabled`, `disabled`,
    /// `static`, `masked`, `indirect`, ...).
    pub fn boot(&self, unit: &str) -> Result<String> {
        self.handle.block_on(async {
            let reply = self
                .conn
                .call_method(Some(DESTINATION), MANAGER_PATH, Some(MANAGER), "GetUnitFileState", &(unit,))
                .await;
            match reply {
                Ok(m) => {
                    m.body().deserialize::<String>().map_err(|e| call("read the boot state of", unit, e))
                }
                Err(e) if not_found(&e) => Err(Error::NoUnit(unit.to_owned())),
                Err(e) => Err(call("read the boot state of", unit, e)),
            }
        })
    }

    /// Enables or disables the unit's file, then reloads the manager so its dependencies are
    /// what the new symlinks say (as `systemctl enable` does).
    pub fn set_boot(&self, unit: &str, enabled: bool) -> Result<()> {
        self.handle.block_on(async {
            let files = [unit];
            let result = if enabled {
                self.conn
                    .call_method(
                        Some(DESTINATION),
                        MANAGER_PATH,
                        Some(MANAGER),
                        "EnableUnitFiles",
                        &(&files[..], false, false),
                    )
                    .await
            } else {
                self.conn
                    .call_method(
                        Some(DESTINATION),
                        MANAGER_PATH,
                        Some(MANAGER),
                        "DisableUnitFiles",
                        &(&files[..], false),
                    )
                    .await
            };
            result.map_err(|e| call(if enabled { "enable" } else { "disable" }, unit, e))?;
            self.reload_manager_async().await
        })
    }

    /// Makes the manager read every unit file and drop-in again (`daemon-reload`). The reply
    /// comes once the reload is over.
    pub fn reload_manager(&self) -> Result<()> {
        self.handle.block_on(self.reload_manager_async())
    }

    async fn reload_manager_async(&self) -> Result<()> {
        self.conn
            .call_method(Some(DESTINATION), MANAGER_PATH, Some(MANAGER), "Reload", &())
            .await
            .map(|_| ())
            .map_err(|e| call("reload", "the manager's units", e))
    }

    /// Starts a unit and waits for its job to end.
    pub fn start(&self, unit: &str) -> Result<()> {
        self.job("start", "StartUnit", unit)
    }

    /// Stops a unit and waits for its job to end.
    pub fn stop(&self, unit: &str) -> Result<()> {
        self.job("stop", "StopUnit", unit)
    }

    /// Restarts a unit and waits for its job to end.
    pub fn restart(&self, unit: &str) -> Result<()> {
        self.job("restart", "RestartUnit", unit)
    }

    /// Reloads a unit and waits for its job to end.
    pub fn reload(&self, unit: &str) -> Result<()> {
        self.job("reload", "ReloadUnit", unit)
    }

    /// Forgets that a unit failed, so a transient unit of the same name can be made again.
    pub fn reset_failed(&self, unit: &str) -> Result<()> {
        self.handle.block_on(async {
            match self
                .conn
                .call_method(Some(DESTINATION), MANAGER_PATH, Some(MANAGER), "ResetFailedUnit", &(unit,))
                .await
            {
                Ok(_) => Ok(()),
                Err(e) if no_such_unit(&e) => Ok(()),
                Err(e) => Err(call("reset the failed state of", unit, e)),
            }
        })
    }

    /// Starts a transient service and waits for its start job.
    pub fn start_transient(&self, t: &Transient<'_>) -> Result<()> {
        let exec = vec![(t.argv[0].clone(), t.argv.to_vec(), false)];
        let mut props: Vec<(&str, Variant<'_>)> = vec![
            ("Description", Variant::new(t.description)),
            ("ExecStart", Variant::new(exec)),
            // Supervised: a program that dies is started again, a second later, as long as
            // the declaration names it.
            ("Restart", Variant::new("always")),
            ("RestartUSec", Variant::new(1_000_000u64)),
            // A unit that failed is collected too, so a corrected declaration can start a
            // unit of the same name without a reset first.
            ("CollectMode", Variant::new("inactive-or-failed")),
        ];
        if !t.env.is_empty() {
            props.push(("Environment", Variant::new(t.env.clone())));
        }
        if let Some(user) = t.user {
            props.push(("User", Variant::new(user)));
        }
        let aux: Vec<(&str, Vec<(&str, Variant<'_>)>)> = Vec::new();
        self.handle.block_on(self.job_with(
            "start",
            "StartTransientUnit",
            t.unit,
            &(t.unit, "replace", props, aux),
        ))
    }

    fn job(&self, op: &'static str, method: &str, unit: &str) -> Result<()> {
        self.handle.block_on(self.job_with(op, method, unit, &(unit, "replace")))
    }

    /// Calls a method that queues a job, and waits for that job's JobRemoved signal: the reply
    /// only says the job was queued, and a read-back before the job ends reads the old state.
    async fn job_with<B>(&self, op: &'static str, method: &str, unit: &str, body: &B) -> Result<()>
    where
        B: serde::Serialize + zbus::DynamicType,
    {
        let fail = |e| call(op, unit, e);
        // The stream is made before the call, so the signal cannot slip past between the two.
        let rule = MatchRule::builder()
            .msg_type(MessageType::Signal)
            .sender(DESTINATION)
            .interface(MANAGER)
            .member("JobRemoved")
            .build()
            .map_err(fail)?;
        // Room for every JobRemoved of a busy machine until the reply is read (QUEUE).
        let mut stream = MessageStream::for_match_rule(rule, &self.conn, Some(QUEUE)).await.map_err(fail)?;
        let job: OwnedObjectPath = self
            .conn
            .call_method(Some(DESTINATION), MANAGER_PATH, Some(MANAGER), method, body)
            .await
            .and_then(|m| m.body().deserialize())
            .map_err(|e| if no_such_unit(&e) { Error::NoUnit(unit.to_owned()) } else { fail(e) })?;
        let wait = async {
            while let Some(msg) = stream.next().await {
                let msg = msg.map_err(fail)?;
                let Ok((_id, path, _unit, result)) =
                    msg.body().deserialize::<(u32, OwnedObjectPath, String, String)>()
                else {
                    continue;
                };
                if path == job {
                    return if result == "done" {
                        Ok(())
                    } else {
                        Err(Error::Job { op, unit: unit.to_owned(), result })
                    };
                }
            }
            Err(Error::Call {
                op,
                unit: unit.to_owned(),
                reason: "the bus connection closed while waiting for the job".into(),
            })
        };
        tokio::time::timeout(JOB_TIMEOUT, wait)
            .await
            .unwrap_or_else(|_| Err(Error::Timeout { op, unit: unit.to_owned() }))
    }

    async fn load(&self, unit: &str) -> Result<OwnedObjectPath> {
        self.conn
            .call_method(Some(DESTINATION), MANAGER_PATH, Some(MANAGER), "LoadUnit", &(unit,))
            .await
            .and_then(|m| m.body().deserialize())
            .map_err(|e| call("load", unit, e))
    }

    async fn property(&self, unit: &str, path: &OwnedObjectPath, name: &str) -> Result<String> {
        let value = self.get(unit, path, name).await?;
        String::try_from(value).map_err(|e| call("read the properties of", unit, e))
    }

    async fn get(&self, unit: &str, path: &OwnedObjectPath, name: &str) -> Result<OwnedVariant> {
        self.conn
            .call_method(Some(DESTINATION), path.as_str(), Some(PROPERTIES), "Get", &(UNIT, name))
            .await
            .and_then(|m| m.body().deserialize())
            .map_err(|e| call("read the properties of", unit, e))
    }
}

fn call(op: &'static str, unit: &str, e: zbus::Error) -> Error {
    Error::Call { op, unit: unit.to_owned(), reason: reason(&e) }
}

/// The words of a D-Bus error for a person: systemd's own message where it gave one.
fn reason(e: &zbus::Error) -> String {
    match e {
        zbus::Error::MethodError(name, Some(text), _) => format!("{text} ({name})"),
        other => other.to_string(),
    }
}

fn error_name(e: &zbus::Error) -> Option<&str> {
    match e {
        zbus::Error::MethodError(name, _, _) => Some(name.as_str()),
        _ => None,
    }
}

fn no_such_unit(e: &zbus::Error) -> bool {
    error_name(e) == Some("org.freedesktop.systemd1.NoSuchUnit")
}

fn not_found(e: &zbus::Error) -> bool {
    matches!(
        error_name(e),
        Some("org.freedesktop.DBus.Error.FileNotFound" | "org.freedesktop.systemd1.NoSuchUnit")
    )
}
