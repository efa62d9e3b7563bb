//! The twelve resource types, as the declaration spells them.
//!
//! Every struct denies unknown fields: a typo such as `"mdoe"` must refuse the declaration, not
//! silently fall back to a default mode on a thousand machines.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::types::{
    AbsPath, Argv, Cidr, Cron, EnvName, HostEntry, Id, Image, Mode, Name, Owner, Port, PortMapping, Sealed,
    Sha256, Volume,
};

#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Directory {
    pub path: AbsPath,
    pub mode: Option<Mode>,
    pub owner: Option<Owner>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
// How a file's keys are merged into a file someone else owns (`into`). Named `Into` in the JSON
// Schema, as it always was; the Rust name says what it does. (Not a doc comment: the schema
// would carry it as the type's description.)
#[schemars(rename = "Into")]
pub enum MergeInto {
    Json,
    Env,
}

#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct File {
    pub path: AbsPath,
    pub content: Option<String>,
    /// Base64 of the file's bytes, for what is not text.
    // Absent is `None`, as for any `Option`; `serde(default)` says so only because the field
    // has its own deserialiser, and the schemars attribute keeps that out of the schema.
    #[serde(default, deserialize_with = "super::types::base64_text")]
    #[schemars(skip_serializing_if = "Option::is_none")]
    pub bytes: Option<String>,
    /// The whole file, sealed to this node's key (age X25519): armored, or base64 of binary.
    pub sealed: Option<Sealed>,
    /// Sealed values by name, for `${secret:NAME}` holes in `content`.
    #[serde(default)]
    pub secrets: BTreeMap<String, Sealed>,
    pub mode: Option<Mode>,
    pub owner: Option<Owner>,
    #[serde(default)]
    pub create_once: bool,
    pub into: Option<MergeInto>,
    /// Where the daemon keeps the declared bytes once it has moved them out of `content` or
    /// `bytes` into its content file (`controller::contents`); never part of a declaration.
    #[serde(skip)]
    #[schemars(skip)]
    pub stored: Option<Stored>,
}

/// Where one file's declared bytes are in the daemon's content file, and their checksum: plain
/// values. The declaration holds no handle to anything; the file itself is the daemon's, handed
/// to each apply in its options.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stored {
    pub at: u64,
    pub len: u32,
    pub sum: u64,
}

impl File {
    /// Whether the file carries a secret, which makes its default mode 0600.
    pub fn carries_secret(&self) -> bool {
        self.sealed.is_some() || !self.secrets.is_empty()
    }

    /// The mode the file must have: the declared one, else the default for what it carries.
    pub fn mode(&self) -> Mode {
        self.mode.unwrap_or(if self.carries_secret() { Mode::new(0o600) } else { Mode::new(0o644) })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum AccessMode {
    #[default]
    Read,
    Write,
}

#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Access {
    pub path: AbsPath,
    #[serde(default)]
    pub mode: AccessMode,
}

#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Package {
    pub package: Name,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ServiceState {
    Running,
    Stopped,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Boot {
    Enabled,
    Disabled,
}

#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Service {
    pub unit: Name,
    pub state: ServiceState,
    pub boot: Option<Boot>,
    #[serde(default)]
    pub restart_on: Vec<Id>,
    #[serde(default)]
    pub reload_on: Vec<Id>,
}

#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Container {
    pub name: Name,
    pub image: Image,
    #[serde(default)]
    pub env: BTreeMap<EnvName, String>,
    #[serde(default)]
    pub env_file: Vec<AbsPath>,
    #[serde(default)]
    pub ports: Vec<PortMapping>,
    #[serde(default)]
    pub volumes: Vec<Volume>,
    pub network: Option<Name>,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub hosts: Vec<HostEntry>,
    #[serde(default)]
    pub restart_on: Vec<Id>,
    #[serde(default)]
    pub run_once: bool,
    pub schedule: Option<Cron>,
}

#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Network {
    pub name: Name,
}

#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct User {
    pub name: Name,
    #[serde(default)]
    pub system: bool,
    pub uid: Option<u32>,
    pub group: Option<Name>,
    #[serde(default)]
    pub groups: Vec<Name>,
    pub home: Option<AbsPath>,
    pub shell: Option<AbsPath>,
}

#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Archive {
    /// The directory the archive is unpacked into.
    pub path: AbsPath,
    /// Base64 of a tar or tar.gz archive.
    // Absent is `None`, as for any `Option`; `serde(default)` says so only because the field
    // has its own deserialiser, and the schemars attribute keeps that out of the schema.
    #[serde(default, deserialize_with = "super::types::base64_text")]
    #[schemars(skip_serializing_if = "Option::is_none")]
    pub bytes: Option<String>,
    /// A tar or tar.gz archive on the machine.
    pub source: Option<AbsPath>,
    /// The sha256 of the archive, 64 hex digits; checked before anything is unpacked.
    pub digest: Option<Sha256>,
}

#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Process {
    pub name: Name,
    pub command: Argv,
    #[serde(default)]
    pub env: BTreeMap<EnvName, String>,
    pub user: Option<Name>,
    #[serde(default)]
    pub restart_on: Vec<Id>,
}

impl Process {
    /// The transient unit a process runs as: `mesh-host-NAME.service`.
    pub fn unit_name(name: &str) -> String {
        format!("mesh-host-{name}.service")
    }
}

#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Action {
    pub command: Argv,
    pub verify: Argv,
    /// Run both inside this container.
    #[serde(rename = "in")]
    pub in_container: Option<Name>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Protocol {
    #[default]
    Tcp,
    Udp,
}

#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Opening {
    pub port: Port,
    #[serde(default)]
    pub protocol: Protocol,
    #[serde(default)]
    pub from: Vec<Cidr>,
}

/// What a resource is, with the fields of its type.
#[derive(Clone, Debug)]
pub enum Spec {
    Directory(Directory),
    File(File),
    Access(Access),
    Package(Package),
    Service(Service),
    Container(Box<Container>),
    Network(Network),
    User(User),
    Archive(Archive),
    Process(Process),
    Action(Action),
    Opening(Opening),
}

/// The closed set of resource types. Matched exhaustively everywhere, so a new type fails to
/// compile wherever it must be handled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    Directory,
    File,
    Access,
    Package,
    Service,
    Container,
    Network,
    User,
    Archive,
    Process,
    Action,
    Opening,
}

impl Kind {
    pub const ALL: [Kind; 12] = [
        Kind::Directory,
        Kind::File,
        Kind::Access,
        Kind::Package,
        Kind::Service,
        Kind::Container,
        Kind::Network,
        Kind::User,
        Kind::Archive,
        Kind::Process,
        Kind::Action,
        Kind::Opening,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Directory => "directory",
            Kind::File => "file",
            Kind::Access => "access",
            Kind::Package => "package",
            Kind::Service => "service",
            Kind::Container => "container",
            Kind::Network => "network",
            Kind::User => "user",
            Kind::Archive => "archive",
            Kind::Process => "process",
            Kind::Action => "action",
            Kind::Opening => "opening",
        }
    }

    pub fn parse(s: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Spec {
    pub fn kind(&self) -> Kind {
        match self {
            Spec::Directory(_) => Kind::Directory,
            Spec::File(_) => Kind::File,
            Spec::Access(_) => Kind::Access,
            Spec::Package(_) => Kind::Package,
            Spec::Service(_) => Kind::Service,
            Spec::Container(_) => Kind::Container,
            Spec::Network(_) => Kind::Network,
            Spec::User(_) => Kind::User,
            Spec::Archive(_) => Kind::Archive,
            Spec::Process(_) => Kind::Process,
            Spec::Action(_) => Kind::Action,
            Spec::Opening(_) => Kind::Opening,
        }
    }

    /// What a person would call the thing on the machine: a path, a unit, a name, a port.
    pub fn target(&self) -> String {
        match self {
            Spec::Directory(r) => r.path.as_str().to_owned(),
            Spec::File(r) => r.path.as_str().to_owned(),
            Spec::Access(r) => r.path.as_str().to_owned(),
            Spec::Archive(r) => r.path.as_str().to_owned(),
            Spec::Package(r) => r.package.to_string(),
            Spec::Service(r) => r.unit.to_string(),
            Spec::Container(r) => r.name.to_string(),
            Spec::Network(r) => r.name.to_string(),
            Spec::User(r) => r.name.to_string(),
            Spec::Process(r) => r.name.to_string(),
            Spec::Action(r) => r.command.as_slice().join(" "),
            Spec::Opening(r) => format!(
                "{}/{}",
                r.port.get(),
                match r.protocol {
                    Protocol::Tcp => "tcp",
                    Protocol::Udp => "udp",
                }
            ),
        }
    }

    /// The systemd unit this resource is carried out by: a service's own unit, or the transient
    /// unit a process runs as. A change of that unit is a reason to reconcile the resource.
    pub fn unit(&self) -> Option<String> {
        match self {
            Spec::Service(s) => Some(s.unit.to_string()),
            Spec::Process(p) => Some(Process::unit_name(p.name.as_str())),
            Spec::Directory(_)
            | Spec::File(_)
            | Spec::Access(_)
            | Spec::Package(_)
            | Spec::Container(_)
            | Spec::Network(_)
            | Spec::User(_)
            | Spec::Archive(_)
            | Spec::Action(_)
            | Spec::Opening(_) => None,
        }
    }

    /// Whether applying this resource talks to the container runtime: a container or step, a
    /// network, an action run inside a container.
    pub fn uses_containers(&self) -> bool {
        match self {
            Spec::Container(_) | Spec::Network(_) => true,
            Spec::Action(a) => a.in_container.is_some(),
            Spec::Directory(_)
            | Spec::File(_)
            | Spec::Access(_)
            | Spec::Package(_)
            | Spec::Service(_)
            | Spec::User(_)
            | Spec::Archive(_)
            | Spec::Process(_)
            | Spec::Opening(_) => false,
        }
    }

    /// A scheduled step's cron expression.
    pub fn schedule(&self) -> Option<&Cron> {
        match self {
            Spec::Container(c) => c.schedule.as_ref(),
            Spec::Directory(_)
            | Spec::File(_)
            | Spec::Access(_)
            | Spec::Package(_)
            | Spec::Service(_)
            | Spec::Network(_)
            | Spec::User(_)
            | Spec::Archive(_)
            | Spec::Process(_)
            | Spec::Action(_)
            | Spec::Opening(_) => None,
        }
    }

    /// The declared bytes of a file held in the declaration itself (text or base64), not moved
    /// to the daemon's content file.
    pub fn inline_bytes(&self) -> usize {
        match self {
            Spec::File(f) => {
                f.content.as_ref().map_or(0, String::len) + f.bytes.as_ref().map_or(0, String::len)
            }
            Spec::Directory(_)
            | Spec::Access(_)
            | Spec::Package(_)
            | Spec::Service(_)
            | Spec::Container(_)
            | Spec::Network(_)
            | Spec::User(_)
            | Spec::Archive(_)
            | Spec::Process(_)
            | Spec::Action(_)
            | Spec::Opening(_) => 0,
        }
    }

    /// The path a file, directory or archive manages: where a change on the machine is its.
    /// An access path is the operator's, not the host's, so it has none here.
    pub fn path(&self) -> Option<&std::path::Path> {
        match self {
            Spec::File(r) => Some(r.path.as_path()),
            Spec::Directory(r) => Some(r.path.as_path()),
            Spec::Archive(r) => Some(r.path.as_path()),
            Spec::Access(_)
            | Spec::Package(_)
            | Spec::Service(_)
            | Spec::Container(_)
            | Spec::Network(_)
            | Spec::User(_)
            | Spec::Process(_)
            | Spec::Action(_)
            | Spec::Opening(_) => None,
        }
    }

    /// Ids whose change in an apply restarts (or recreates) this resource.
    pub fn restart_on(&self) -> &[Id] {
        match self {
            Spec::Service(r) => &r.restart_on,
            Spec::Container(r) => &r.restart_on,
            Spec::Process(r) => &r.restart_on,
            Spec::Directory(_)
            | Spec::File(_)
            | Spec::Access(_)
            | Spec::Package(_)
            | Spec::User(_)
            | Spec::Archive(_)
            | Spec::Action(_)
            | Spec::Network(_)
            | Spec::Opening(_) => &[],
        }
    }

    /// Ids whose change in an apply reloads this (running) unit.
    pub fn reload_on(&self) -> &[Id] {
        match self {
            Spec::Service(r) => &r.reload_on,
            Spec::Directory(_)
            | Spec::File(_)
            | Spec::Access(_)
            | Spec::Package(_)
            | Spec::User(_)
            | Spec::Archive(_)
            | Spec::Process(_)
            | Spec::Action(_)
            | Spec::Container(_)
            | Spec::Network(_)
            | Spec::Opening(_) => &[],
        }
    }

    /// A gate is a step that makes something true before the next thing needs it: an action or
    /// a run-once container. When a gate fails, nothing after it is attempted.
    pub fn is_gate(&self) -> bool {
        match self {
            Spec::Action(_) => true,
            Spec::Container(c) => c.run_once,
            Spec::Directory(_)
            | Spec::File(_)
            | Spec::Access(_)
            | Spec::Package(_)
            | Spec::Service(_)
            | Spec::User(_)
            | Spec::Archive(_)
            | Spec::Process(_)
            | Spec::Network(_)
            | Spec::Opening(_) => false,
        }
    }
}
