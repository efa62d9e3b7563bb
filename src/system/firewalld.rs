//! firewalld, found running on an adopted node, through its D-Bus API
//! (`org.fedoraproject.FirewallD1`): the default zone's rich rules and ports in force
//! (runtime), and the services and zone settings it saves (permanent, the `config` objects).
//!
//! D-Bus rather than `firewall-cmd`: the same calls `firewall-cmd` makes, with typed answers
//! instead of printed lines, and on the bus the agent already reaches systemd on (`--bus`), so
//! a test can point both at a machine booted in a network namespace of its own.
//!
//! Nothing here ever asks firewalld to reload: a reload drops the rules an operator added at
//! runtime only. And nothing here calls firewalld when its bus name has no owner: the name is
//! D-Bus activatable, so a call would start a firewalld someone stopped.
//!
//! Like `systemd`, the calls are blocking: each drives its async zbus call to completion on the
//! current tokio runtime's handle.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use tokio::runtime::Handle;
use zbus::Connection;
use zbus::{OwnedObjectPath, Variant as Value};

/// firewalld's bus name, and the path of its runtime object.
const NAME: &str = "org.fedoraproject.FirewallD1";
const PATH: &str = "/org/fedoraproject/FirewallD1";
/// The runtime interface of zones, on `PATH`.
const ZONE: &str = "org.fedoraproject.FirewallD1.zone";
/// The permanent configuration: its root object and interfaces.
const CONFIG_PATH: &str = "/org/fedoraproject/FirewallD1/config";
const CONFIG: &str = "org.fedoraproject.FirewallD1.config";
const CONFIG_ZONE: &str = "org.fedoraproject.FirewallD1.config.zone";
const CONFIG_SERVICE: &str = "org.fedoraproject.FirewallD1.config.service";

/// How long one call may go unanswered: firewalld applies a rule to nftables before it
/// answers, which takes well under a second, so a minute means it is stuck.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// A failure talking to firewalld.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The bus could not be reached.
    #[error("cannot reach firewalld on {bus}: {reason}")]
    Connect {
        /// The bus's address, for a person.
        bus: String,
        /// Why.
        reason: String,
    },
    /// firewalld (or the bus) answered a call with an error.
    #[error("firewalld could not {op}: {reason}")]
    Call {
        /// What was asked, with what it was asked of.
        op: String,
        /// firewalld's answer.
        reason: String,
    },
    /// firewalld is there and not in its running state.
    #[error("firewalld is {0}, not RUNNING")]
    NotRunning(String),
    /// A failpoint named this step (tests only).
    #[error("{0} failed at the failpoint firewalld-{0}")]
    Failpoint(&'static str),
}

type Result<T> = std::result::Result<T, Error>;

/// One service's permanent settings that the host writes and reads back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Service {
    /// Its short name, shown by `firewall-cmd --info-service`.
    pub short: String,
    /// Its description.
    pub description: String,
    /// Its ports: (port, protocol), as firewalld keeps them (`("22", "tcp")`).
    pub ports: Vec<(String, String)>,
}

/// A connection to one firewalld.
pub struct Firewalld {
    conn: Connection,
    handle: Handle,
}

fn reason(e: &zbus::Error) -> String {
    match e {
        zbus::Error::MethodError(name, Some(text), _) => format!("{text} ({name})"),
        other => other.to_string(),
    }
}

fn call_failed(op: impl Into<String>) -> impl FnOnce(zbus::Error) -> Error {
    let op = op.into();
    move |e| Error::Call { op, reason: reason(&e) }
}

fn body_failed(op: impl Into<String>) -> impl FnOnce(zbus::Error) -> Error {
    let op = op.into();
    move |e| Error::Call { op, reason: format!("its answer could not be read: {e}") }
}

impl Firewalld {
    /// Connects to the bus at `address`, or the system bus, if firewalld's name has an owner
    /// there: `None` when firewalld is not running (and nothing was asked of it).
    pub fn running(address: Option<&str>) -> Result<Option<Firewalld>> {
        let handle = Handle::current();
        let bus = super::systemd::describe_bus(address);
        let conn = handle
            .block_on(async {
                let builder = match address {
                    Some(a) => zbus::conn::Builder::address(a),
                    None => zbus::conn::Builder::system(),
                };
                builder.method_timeout(CALL_TIMEOUT).build().await
            })
            .map_err(|e| Error::Connect { bus, reason: reason(&e) })?;
        let fw = Firewalld { conn, handle };
        let owned: bool = fw.call(
            "tell whether firewalld's bus name has an owner",
            "org.freedesktop.DBus",
            "/org/freedesktop/DBus",
            "org.freedesktop.DBus",
            "NameHasOwner",
            &(NAME,),
        )?;
        if !owned {
            return Ok(None);
        }
        let state: String = fw.property(PATH, NAME, "state")?;
        if state != "RUNNING" {
            return Err(Error::NotRunning(state));
        }
        Ok(Some(fw))
    }

    fn call<B, R>(&self, op: &str, dest: &str, path: &str, iface: &str, method: &str, body: &B) -> Result<R>
    where
        B: serde::Serialize + zbus::zvariant::DynamicType,
        R: for<'d> serde::Deserialize<'d> + zbus::zvariant::Type,
    {
        self.handle.block_on(async {
            let reply = self
                .conn
                .call_method(Some(dest), path, Some(iface), method, body)
                .await
                .map_err(call_failed(op))?;
            reply.body().deserialize::<R>().map_err(body_failed(op))
        })
    }

    fn fw<B, R>(&self, op: &str, path: &str, iface: &str, method: &str, body: &B) -> Result<R>
    where
        B: serde::Serialize + zbus::zvariant::DynamicType,
        R: for<'d> serde::Deserialize<'d> + zbus::zvariant::Type,
    {
        self.call(op, NAME, path, iface, method, body)
    }

    /// A method whose answer is not needed (firewalld answers some with the zone's name).
    fn act<B>(&self, op: &str, path: &str, iface: &str, method: &str, body: &B) -> Result<()>
    where
        B: serde::Serialize + zbus::zvariant::DynamicType,
    {
        self.handle.block_on(async {
            self.conn
                .call_method(Some(NAME), path, Some(iface), method, body)
                .await
                .map(drop)
                .map_err(call_failed(op))
        })
    }

    fn property<T: TryFrom<zbus::OwnedVariant>>(&self, path: &str, iface: &str, name: &str) -> Result<T> {
        let op = format!("read its property {name}");
        let value: zbus::OwnedVariant =
            self.fw(&op, path, "org.freedesktop.DBus.Properties", "Get", &(iface, name))?;
        T::try_from(value).map_err(|_| Error::Call { op, reason: "it is not of the type expected".into() })
    }

    /// The default zone: where an interface bound to no zone is filtered.
    pub fn default_zone(&self) -> Result<String> {
        self.fw("tell its default zone", PATH, NAME, "getDefaultZone", &())
    }

    /// The zone's rich rules in force, as firewalld writes them.
    pub fn runtime_rich_rules(&self, zone: &str) -> Result<Vec<String>> {
        self.fw(&format!("list the rich rules in force in zone {zone}"), PATH, ZONE, "getRichRules", &(zone,))
    }

    /// The zone's ports in force: (port, protocol).
    pub fn runtime_ports(&self, zone: &str) -> Result<Vec<(String, String)>> {
        let ports: Vec<Vec<String>> =
            self.fw(&format!("list the ports in force in zone {zone}"), PATH, ZONE, "getPorts", &(zone,))?;
        Ok(ports.into_iter().filter_map(|p| Some((p.first()?.clone(), p.get(1)?.clone()))).collect())
    }

    /// Puts a rich rule in force in the zone, without a time limit. Not saved.
    pub fn add_runtime_rich_rule(&self, zone: &str, rule: &str) -> Result<()> {
        let op = format!("put the rich rule '{rule}' in force in zone {zone}");
        self.act(&op, PATH, ZONE, "addRichRule", &(zone, rule, 0i32))
    }

    /// Takes a rich rule out of force in the zone. Not saved.
    pub fn remove_runtime_rich_rule(&self, zone: &str, rule: &str) -> Result<()> {
        let op = format!("take the rich rule '{rule}' out of force in zone {zone}");
        self.act(&op, PATH, ZONE, "removeRichRule", &(zone, rule))
    }

    fn zone_config(&self, zone: &str) -> Result<OwnedObjectPath> {
        self.fw(&format!("find the saved zone {zone}"), CONFIG_PATH, CONFIG, "getZoneByName", &(zone,))
    }

    /// The zone's saved rich rules.
    pub fn permanent_rich_rules(&self, zone: &str) -> Result<Vec<String>> {
        let path = self.zone_config(zone)?;
        self.fw(
            &format!("list the saved rich rules of zone {zone}"),
            path.as_str(),
            CONFIG_ZONE,
            "getRichRules",
            &(),
        )
    }

    /// Saves a rich rule in the zone. Not put in force.
    pub fn add_permanent_rich_rule(&self, zone: &str, rule: &str) -> Result<()> {
        let path = self.zone_config(zone)?;
        let op = format!("save the rich rule '{rule}' in zone {zone}");
        self.act(&op, path.as_str(), CONFIG_ZONE, "addRichRule", &(rule,))
    }

    /// Deletes a saved rich rule from the zone. Not taken out of force.
    pub fn remove_permanent_rich_rule(&self, zone: &str, rule: &str) -> Result<()> {
        let path = self.zone_config(zone)?;
        let op = format!("delete the saved rich rule '{rule}' from zone {zone}");
        self.act(&op, path.as_str(), CONFIG_ZONE, "removeRichRule", &(rule,))
    }

    /// The names of the saved services.
    pub fn service_names(&self) -> Result<BTreeSet<String>> {
        let names: Vec<String> =
            self.fw("list its saved services", CONFIG_PATH, CONFIG, "getServiceNames", &())?;
        Ok(names.into_iter().collect())
    }

    fn service_path(&self, name: &str) -> Result<OwnedObjectPath> {
        self.fw(&format!("find the saved service {name}"), CONFIG_PATH, CONFIG, "getServiceByName", &(name,))
    }

    /// A saved service's settings, or `None` when there is no service of that name; `saved` is
    /// what `service_names` answered (listed once for many services, not once each).
    pub fn service(&self, name: &str, saved: &BTreeSet<String>) -> Result<Option<Service>> {
        if !saved.contains(name) {
            return Ok(None);
        }
        let path = self.service_path(name)?;
        let op = format!("read the saved service {name}");
        let short: String = self.fw(&op, path.as_str(), CONFIG_SERVICE, "getShort", &())?;
        let description: String = self.fw(&op, path.as_str(), CONFIG_SERVICE, "getDescription", &())?;
        let ports: Vec<(String, String)> = self.fw(&op, path.as_str(), CONFIG_SERVICE, "getPorts", &())?;
        Ok(Some(Service { short, description, ports }))
    }

    /// Saves a service of that name with these settings: made, or (`exists`) its settings
    /// replaced.
    pub fn put_service(&self, name: &str, s: &Service, exists: bool) -> Result<()> {
        let mut settings: HashMap<&str, Value<'_>> = HashMap::new();
        settings.insert("short", Value::from(s.short.as_str()));
        settings.insert("description", Value::from(s.description.as_str()));
        settings.insert("ports", Value::from(s.ports.clone()));
        if exists {
            let path = self.service_path(name)?;
            self.act(
                &format!("update the saved service {name}"),
                path.as_str(),
                CONFIG_SERVICE,
                "update2",
                &(settings,),
            )
        } else {
            self.act(
                &format!("save the service {name}"),
                CONFIG_PATH,
                CONFIG,
                "addService2",
                &(name, settings),
            )
        }
    }

    /// Deletes a saved service.
    pub fn remove_service(&self, name: &str) -> Result<()> {
        let path = self.service_path(name)?;
        self.act(&format!("delete the saved service {name}"), path.as_str(), CONFIG_SERVICE, "remove", &())
    }
}

/// firewalld's saved configuration while it is stopped, through `firewall-offline-cmd` (from
/// the firewalld package), which edits the files under /etc/firewalld as firewalld itself
/// would. The flip deletes the host's openings this way once firewalld is stopped, and the way
/// back saves them this way before it starts, so that firewalld starts with them in force.
pub mod offline {
    use super::super::command::run_str;
    use super::{Error, Result, Service};

    const PROGRAM: &str = "firewall-offline-cmd";

    fn cmd(op: &str, args: &[&str]) -> Result<String> {
        let mut argv = vec![PROGRAM];
        argv.extend(args);
        let ran =
            run_str(&argv, &[]).map_err(|e| Error::Call { op: op.to_owned(), reason: e.to_string() })?;
        if ran.success() {
            Ok(ran.stdout)
        } else {
            Err(Error::Call { op: op.to_owned(), reason: format!("`{}` {}", argv.join(" "), ran.describe()) })
        }
    }

    /// The default zone, as saved.
    pub fn default_zone() -> Result<String> {
        cmd("tell its saved default zone (offline)", &["--get-default-zone"]).map(|s| s.trim().to_owned())
    }

    /// The zone's saved rich rules, one a line.
    pub fn rich_rules(zone: &str) -> Result<Vec<String>> {
        let out = cmd(
            &format!("list the saved rich rules of zone {zone} (offline)"),
            &[&format!("--zone={zone}"), "--list-rich-rules"],
        )?;
        Ok(out.lines().map(str::trim).filter(|l| !l.is_empty()).map(str::to_owned).collect())
    }

    /// Saves a rich rule in the zone.
    pub fn add_rich_rule(zone: &str, rule: &str) -> Result<()> {
        cmd(
            &format!("save the rich rule '{rule}' in zone {zone} (offline)"),
            &[&format!("--zone={zone}"), &format!("--add-rich-rule={rule}")],
        )
        .map(drop)
    }

    /// Deletes a saved rich rule from the zone.
    pub fn remove_rich_rule(zone: &str, rule: &str) -> Result<()> {
        cmd(
            &format!("delete the saved rich rule '{rule}' from zone {zone} (offline)"),
            &[&format!("--zone={zone}"), &format!("--remove-rich-rule={rule}")],
        )
        .map(drop)
    }

    /// Whether a service of that name is saved.
    pub fn has_service(name: &str) -> Result<bool> {
        let out = cmd("list its saved services (offline)", &["--get-services"])?;
        Ok(out.split_whitespace().any(|n| n == name))
    }

    /// Saves a service of that name with these settings, made anew.
    pub fn put_service(name: &str, s: &Service) -> Result<()> {
        if has_service(name)? {
            remove_service(name)?;
        }
        let op = format!("save the service {name} (offline)");
        cmd(&op, &[&format!("--new-service={name}")])?;
        let service = format!("--service={name}");
        cmd(&op, &[&service, &format!("--set-short={}", s.short)])?;
        cmd(&op, &[&service, &format!("--set-description={}", s.description)])?;
        for (port, protocol) in &s.ports {
            cmd(&op, &[&service, &format!("--add-port={port}/{protocol}")])?;
        }
        Ok(())
    }

    /// A saved service's ports, or `None` when there is no service of that name.
    pub fn service_ports(name: &str) -> Result<Option<Vec<(String, String)>>> {
        if !has_service(name)? {
            return Ok(None);
        }
        let out = cmd(
            &format!("read the saved service {name} (offline)"),
            &[&format!("--service={name}"), "--get-ports"],
        )?;
        Ok(Some(
            out.split_whitespace()
                .filter_map(|p| p.split_once('/'))
                .map(|(port, protocol)| (port.to_owned(), protocol.to_owned()))
                .collect(),
        ))
    }

    /// Deletes a saved service.
    pub fn remove_service(name: &str) -> Result<()> {
        cmd(&format!("delete the saved service {name} (offline)"), &[&format!("--delete-service={name}")])
            .map(drop)
    }
}

/// Fails the named step of retiring or bringing back firewalld when the failpoint
/// `firewalld-STEP` is set (tests only), without doing it.
pub fn failpoint(step: &'static str) -> Result<()> {
    let name = match step {
        "stop" => "firewalld-stop",
        "start" => "firewalld-start",
        _ => return Ok(()),
    };
    if super::fs::failpoint_named(name) {
        Err(Error::Failpoint(step))
    } else {
        Ok(())
    }
}
