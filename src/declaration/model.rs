//! The twelve resource types, as the declaration spells them.
//!
//! Every struct denies unknown fields: a typo such as `"mdoe"` must refuse the declaration, not
//! silently fall back to a default mode on a thousand machines.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::types::{
    AbsPath, Argv, Base64Bytes, Cidr, Cron, EnvName, HostEntry, Id, Image, Mode, Name, Owner, Port,
    PortMapping, Sealed, Sha256, Volume,
};

/// A directory the host makes if absent, and whose mode and owner it maintains.
#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Directory {
    /// The directory's absolute path.
    pub path: AbsPath,
    /// An octal string of three or four digits; "0755" by default.
    pub mode: Option<Mode>,
    /// "user" or "user:group"; left as the directory has it when absent.
    pub owner: Option<Owner>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
// How a file's keys are merged into a file someone else owns (`into`). Named `Into` in the JSON
// Schema, as it always was; the Rust name says what it does. (Not in the doc comment: the schema
// carries that as the type's description, so it is written for the declaration's author.)
/// How the keys of a file are set into a file that belongs to someone else.
#[schemars(rename = "Into")]
pub enum MergeInto {
    /// `content` is a JSON object whose top-level keys are set in the file's object.
    Json,
    /// `content` holds KEY=VALUE lines, each set in the file.
    Env,
}

/// A file, written atomically (a temporary file in the same directory, fsync, rename) and never
/// through a symlink.
#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct File {
    /// The file's absolute path.
    pub path: AbsPath,
    /// The file's text; one of `content`, `bytes` and `sealed` is given. May hold `${secret:NAME}`
    /// holes, filled from `secrets`.
    // `content` as declared (`File::content`), or, once the daemon moved the declared bytes
    // (of `content` or `bytes`) to its content file, where they are (`File::stored`): one
    // field of 24 bytes for the two, where they were 40 side by side (docs/memory.md).
    #[serde(rename = "content")]
    #[schemars(with = "Option<Box<str>>")]
    body: Option<Body>,
    /// Base64 of the file's bytes, for what is not text.
    // Decoded when parsed (`Base64Bytes`). This, `sealed` and `secrets` are rare: each is one
    // pointer, 8 bytes in every file, where inline they were 56 (docs/memory.md).
    pub bytes: Option<Box<Base64Bytes>>,
    /// The whole file, sealed to this node's key (age X25519): armored, or base64 of binary.
    pub sealed: Option<Box<Sealed>>,
    /// Sealed values by name, for `${secret:NAME}` holes in `content`.
    #[serde(default)]
    #[schemars(with = "BTreeMap<String, Sealed>")]
    pub secrets: Secrets,
    /// An octal string of three or four digits; "0644" by default, "0600" when the file carries a
    /// secret.
    pub mode: Option<Mode>,
    /// "user" or "user:group"; one that does not exist on the machine fails the file at apply, not
    /// the parse.
    pub owner: Option<Owner>,
    /// Written if absent; if present, left exactly as it is (what the program grew in it is not the
    /// mesh's) and reported `kept`. False by default.
    #[serde(default)]
    pub create_once: bool,
    /// The file belongs to someone else and the mesh owns some keys in it: `content` holds those
    /// keys, in this format. What they held before is put back when the resource is removed.
    pub into: Option<MergeInto>,
}

/// A file's declared text, or where the daemon keeps its declared bytes.
#[derive(Clone, Debug)]
enum Body {
    /// `content`, as declared: boxed, as ids and owners are (a capacity in every file would be
    /// 8 bytes for nothing).
    Text(Box<str>),
    /// Moved out of `content` or `bytes` into the daemon's content file
    /// (`controller::contents`); never part of a declaration.
    Stored(Stored),
}

impl<'de> Deserialize<'de> for Body {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Box::<str>::deserialize(d).map(Body::Text)
    }
}

/// Where one file's declared bytes are in the daemon's content file, and their checksum: plain
/// values. The declaration holds no handle to anything; the file itself is the daemon's, handed
/// to each apply in its options.
///
/// Held as 32-bit halves, so that it is 20 bytes aligned to 4 and `Option<Stored>` in every file
/// is 24 bytes, not 32 (docs/memory.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stored {
    at: [u32; 2],
    len: u32,
    sum: [u32; 2],
}

impl Stored {
    /// Bytes `len` long at `at` in the content file, whose checksum is `sum`.
    pub fn new(at: u64, len: u32, sum: u64) -> Stored {
        let halves = |v: u64| [(v >> 32) as u32, v as u32];
        Stored { at: halves(at), len, sum: halves(sum) }
    }

    /// Where the bytes start in the content file, from its beginning.
    pub fn at(self) -> u64 {
        (u64::from(self.at[0]) << 32) | u64::from(self.at[1])
    }

    /// How many bytes they are.
    pub fn length(self) -> u32 {
        self.len
    }

    /// Their checksum, checked when they are read back from the content file.
    pub fn sum(self) -> u64 {
        (u64::from(self.sum[0]) << 32) | u64::from(self.sum[1])
    }
}

/// The sealed values of a file's `secrets`, by name: `None` when there are none, as in almost
/// every file, so that a file holds one pointer for them (8 bytes) rather than an empty map (24).
/// Read as the map it holds, and described so in the JSON Schema (`File::secrets`).
#[derive(Clone, Debug, Default)]
#[allow(clippy::box_collection, reason = "one pointer (8 bytes) in every file, where the map is 24")]
pub struct Secrets(Option<Box<BTreeMap<String, Sealed>>>);

impl Secrets {
    /// The sealed value named `name`.
    pub fn get(&self, name: &str) -> Option<&Sealed> {
        self.0.as_ref().and_then(|m| m.get(name))
    }

    /// Whether there is a value named `name`.
    pub fn contains_key(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.as_ref().is_none_or(|m| m.is_empty())
    }
}

impl<'de> Deserialize<'de> for Secrets {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let map = BTreeMap::<String, Sealed>::deserialize(d)?;
        Ok(Secrets((!map.is_empty()).then(|| Box::new(map))))
    }
}

impl File {
    /// Whether the file carries a secret, which makes its default mode 0600.
    pub fn carries_secret(&self) -> bool {
        self.sealed.is_some() || !self.secrets.is_empty()
    }

    /// The body declared in the declaration itself: `content`'s text (holes and all) or the
    /// decoded `bytes`; `None` for a sealed file, or one whose body was moved to the daemon's
    /// content file.
    pub fn inline_body(&self) -> Option<&[u8]> {
        match (self.content(), &self.bytes) {
            (Some(c), _) => Some(c.as_bytes()),
            (None, Some(b)) => Some(b.as_slice()),
            (None, None) => None,
        }
    }

    /// `content`, as declared; `None` where none was, or once the daemon moved it to its
    /// content file.
    pub fn content(&self) -> Option<&str> {
        match &self.body {
            Some(Body::Text(text)) => Some(text),
            Some(Body::Stored(_)) | None => None,
        }
    }

    /// Where the daemon keeps the declared bytes, once it has moved them out of `content` or
    /// `bytes` into its content file.
    pub fn stored(&self) -> Option<Stored> {
        match &self.body {
            Some(Body::Stored(at)) => Some(*at),
            Some(Body::Text(_)) | None => None,
        }
    }

    /// Notes that the declared bytes are kept at `stored`, and drops them from the file.
    pub(super) fn moved(&mut self, stored: Stored) {
        self.body = Some(Body::Stored(stored));
        self.bytes = None;
    }

    /// The mode the file must have: the declared one, else the default for what it carries.
    pub fn mode(&self) -> Mode {
        self.mode.unwrap_or(if self.carries_secret() { Mode::new(0o600) } else { Mode::new(0o644) })
    }
}

/// What an access needs of its directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum AccessMode {
    /// The directory is only read.
    #[default]
    Read,
    /// The directory is written too.
    Write,
}

/// An operator-owned directory that must already exist; never created, chmod-ed or removed.
#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Access {
    /// The directory's absolute path.
    pub path: AbsPath,
    /// "read" or "write"; "read" by default.
    #[serde(default)]
    pub mode: AccessMode,
}

/// A package, installed if absent; never upgraded, never removed.
#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Package {
    /// The package's name, as the machine's package manager knows it.
    pub package: Name,
}

/// What a service's unit must be doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ServiceState {
    /// The unit is active.
    Running,
    /// The unit is stopped.
    Stopped,
}

/// Whether a service's unit starts at boot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Boot {
    /// The unit starts at boot.
    Enabled,
    /// The unit does not start at boot.
    Disabled,
}

/// A systemd unit's state, through systemd's D-Bus API.
#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Service {
    /// The unit's full name, with its suffix ("nginx.service").
    pub unit: Name,
    /// "running" or "stopped".
    pub state: ServiceState,
    /// "enabled" or "disabled"; left as it is when absent.
    pub boot: Option<Boot>,
    /// Ids whose change in an apply restarts the unit. Empty by default.
    #[serde(default)]
    pub restart_on: Vec<Id>,
    /// Ids whose change in an apply reloads the running unit instead of restarting it. Empty by
    /// default.
    #[serde(default)]
    pub reload_on: Vec<Id>,
}

/// A container of the machine's runtime (Docker, or Podman through its Docker-compatible API).
#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Container {
    /// The container's name.
    pub name: Name,
    /// The image, by name and tag or by repository and digest (`name@sha256:...`); made present at
    /// apply.
    pub image: Image,
    /// Environment variables by name. Empty by default.
    #[serde(default)]
    pub env: BTreeMap<EnvName, String>,
    /// Absolute paths of env-files, read when the container is created; each is part of its spec.
    /// Empty by default.
    #[serde(default)]
    pub env_file: Vec<AbsPath>,
    /// Published ports, `[ip:][host:]container[/tcp|udp|sctp]`, as `docker run -p` takes them.
    /// Empty by default.
    #[serde(default)]
    pub ports: Vec<PortMapping>,
    /// Volumes, `source:target[:options]`; a file bind-mounted directly is part of the
    /// container's spec. Empty by default.
    #[serde(default)]
    pub volumes: Vec<Volume>,
    /// The container network to join; the runtime's default network when absent.
    pub network: Option<Name>,
    /// Arguments given after the image's entrypoint. Empty by default.
    #[serde(default)]
    pub args: Vec<String>,
    /// Extra entries for the container's /etc/hosts, "name:ip". Empty by default.
    #[serde(default)]
    pub hosts: Vec<HostEntry>,
    /// Ids whose change in an apply recreates the container. Empty by default.
    #[serde(default)]
    pub restart_on: Vec<Id>,
    /// A step, run in the foreground to completion, which must exit 0; it runs again only when its
    /// declaration changes, and gates what follows when it fails. False by default.
    #[serde(default)]
    pub run_once: bool,
    /// A 5-field cron expression (UTC): the container is a scheduled step the host's scheduler runs
    /// on that cadence.
    pub schedule: Option<Cron>,
}

/// A container network, present.
#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Network {
    /// The network's name.
    pub name: Name,
}

/// A local account, present.
#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct User {
    /// The account's name.
    pub name: Name,
    /// A system account: a uid in the system range, no home made for it and no login shell unless
    /// declared. It matters only when the account is made. False by default.
    #[serde(default)]
    pub system: bool,
    /// The account's uid; chosen by the machine when absent. An existing account is never
    /// renumbered.
    pub uid: Option<u32>,
    /// The account's primary group, made if absent; left as the machine has it when not declared.
    pub group: Option<Name>,
    /// Supplementary groups, which must exist on the machine. Empty by default.
    #[serde(default)]
    pub groups: Vec<Name>,
    /// The account's home directory; left as the machine has it when not declared.
    pub home: Option<AbsPath>,
    /// The account's login shell; left as the machine has it when not declared.
    pub shell: Option<AbsPath>,
}

/// An archive (tar or tar.gz) unpacked into a directory, and unpacked again only when the archive
/// changes.
#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Archive {
    /// The directory the archive is unpacked into.
    pub path: AbsPath,
    /// Base64 of a tar or tar.gz archive.
    // Decoded when parsed (`Base64Bytes`).
    pub bytes: Option<Base64Bytes>,
    /// A tar or tar.gz archive on the machine.
    pub source: Option<AbsPath>,
    /// The sha256 of the archive, 64 hex digits; checked before anything is unpacked. Required
    /// with `source`, unless `unverified` is true.
    pub digest: Option<Sha256>,
    /// `true` accepts a `source` without a `digest`: whatever is at the source when the
    /// archive is unpacked is unpacked, so whoever can write it chooses what lands in `path`.
    /// False by default, and refused beside `digest` or `bytes`.
    #[serde(default)]
    pub unverified: bool,
}

/// A long-running program, supervised by systemd as a transient unit the host starts over D-Bus.
#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Process {
    /// The process's name; its unit is `mesh-host-NAME.service`.
    pub name: Name,
    /// The program and its arguments, as a list, never a shell string.
    pub command: Argv,
    /// Environment variables by name. Empty by default.
    #[serde(default)]
    pub env: BTreeMap<EnvName, String>,
    /// The account it runs as; systemd's default (root) when absent.
    pub user: Option<Name>,
    /// Ids whose change in an apply restarts the process. Empty by default.
    #[serde(default)]
    pub restart_on: Vec<Id>,
}

impl Process {
    /// The transient unit a process runs as: `mesh-host-NAME.service`.
    pub fn unit_name(name: &str) -> String {
        format!("mesh-host-{name}.service")
    }
}

/// A command made true by checking: `verify` first; if it fails, `command`, then `verify` again,
/// which must now pass.
#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Action {
    /// The program and arguments that make the change.
    pub command: Argv,
    /// The program and arguments that check it, exiting 0 when it holds.
    pub verify: Argv,
    /// Run both inside this container.
    #[serde(rename = "in")]
    pub in_container: Option<Name>,
}

/// The protocol an opening is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Protocol {
    /// TCP.
    #[default]
    Tcp,
    /// UDP.
    Udp,
}

/// A port open in the machine's firewall (the host's own nftables table by default).
#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Opening {
    /// The port's number.
    pub port: Port,
    /// "tcp" or "udp"; "tcp" by default.
    #[serde(default)]
    pub protocol: Protocol,
    /// Networks the port is open to, in CIDR notation; every address when empty, the default.
    #[serde(default)]
    pub from: Vec<Cidr>,
}

/// What a resource is, with the fields of its type.
#[derive(Clone, Debug)]
pub enum Spec {
    /// A directory the host makes and maintains.
    Directory(Directory),
    /// A file the host writes.
    File(File),
    /// An operator-owned directory that must already exist.
    Access(Access),
    /// A package, installed if absent.
    Package(Package),
    /// A systemd unit's state. Boxed, as containers, users, archives and processes are: a
    /// `Spec` is as large as a file, and no larger.
    Service(Box<Service>),
    /// A container, a run-once step or a scheduled step.
    Container(Box<Container>),
    /// A container network.
    Network(Network),
    /// A local account. Boxed, as containers and processes are: rare beside files, and larger
    /// than a file (a `Spec` is as large as its largest type).
    User(Box<User>),
    /// An archive unpacked into a directory. Boxed: rare, and as large as a file.
    Archive(Box<Archive>),
    /// A program supervised by systemd as a transient unit.
    Process(Box<Process>),
    /// A command with its verify.
    Action(Action),
    /// A port open in the firewall.
    Opening(Opening),
}

/// The closed set of resource types. Matched exhaustively everywhere, so a new type fails to
/// compile wherever it must be handled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// `directory`: a directory, made and maintained.
    Directory,
    /// `file`: a file, written whole or by its keys.
    File,
    /// `access`: a directory the operator provides.
    Access,
    /// `package`: a package, installed if absent.
    Package,
    /// `service`: a systemd unit's state and boot setting.
    Service,
    /// `container`: a container, a run-once step or a scheduled step.
    Container,
    /// `network`: a container network.
    Network,
    /// `user`: a local account.
    User,
    /// `archive`: an archive unpacked into a directory.
    Archive,
    /// `process`: a program under a transient systemd unit.
    Process,
    /// `action`: a command with its verify.
    Action,
    /// `opening`: a port open in the firewall.
    Opening,
}

impl Kind {
    /// Every kind, in the order the spec's table lists them.
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

    /// The kind's name as the declaration's `type` spells it.
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

    /// The kind a `type` names, or `None` for a name that is no kind.
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
    /// The kind of resource this is.
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
        self.target_shared().to_string()
    }

    /// `target`, sharing the path's text where the target is a path (`AbsPath::shared`): what a
    /// record holds.
    pub fn target_shared(&self) -> std::sync::Arc<str> {
        match self {
            Spec::Directory(r) => r.path.shared(),
            Spec::File(r) => r.path.shared(),
            Spec::Access(r) => r.path.shared(),
            Spec::Archive(r) => r.path.shared(),
            Spec::Package(r) => r.package.as_str().into(),
            Spec::Service(r) => r.unit.as_str().into(),
            Spec::Container(r) => r.name.as_str().into(),
            Spec::Network(r) => r.name.as_str().into(),
            Spec::User(r) => r.name.as_str().into(),
            Spec::Process(r) => r.name.as_str().into(),
            Spec::Action(r) => r.command.as_slice().join(" ").into(),
            Spec::Opening(r) => format!(
                "{}/{}",
                r.port.get(),
                match r.protocol {
                    Protocol::Tcp => "tcp",
                    Protocol::Udp => "udp",
                }
            )
            .into(),
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

    /// What a container reads on the machine when it is made: its env-files and the host
    /// paths it mounts. A reconcile of the container depends on whatever manages them.
    pub fn reads(&self) -> Vec<&std::path::Path> {
        match self {
            Spec::Container(c) => c
                .env_file
                .iter()
                .map(|p| p.as_path())
                .chain(c.volumes.iter().filter_map(|v| v.host_path().map(|p| p.as_path())))
                .collect(),
            Spec::Directory(_)
            | Spec::File(_)
            | Spec::Access(_)
            | Spec::Package(_)
            | Spec::Service(_)
            | Spec::User(_)
            | Spec::Archive(_)
            | Spec::Process(_)
            | Spec::Action(_)
            | Spec::Network(_)
            | Spec::Opening(_) => Vec::new(),
        }
    }

    /// The network a container joins, by name: a reconcile of the container depends on it.
    pub fn joins(&self) -> Option<&str> {
        match self {
            Spec::Container(c) => c.network.as_ref().map(|n| n.as_str()),
            Spec::Directory(_)
            | Spec::File(_)
            | Spec::Access(_)
            | Spec::Package(_)
            | Spec::Service(_)
            | Spec::User(_)
            | Spec::Archive(_)
            | Spec::Process(_)
            | Spec::Action(_)
            | Spec::Network(_)
            | Spec::Opening(_) => None,
        }
    }

    /// The container an action runs in, by name: a reconcile of the action depends on it.
    pub fn runs_in(&self) -> Option<&str> {
        match self {
            Spec::Action(a) => a.in_container.as_ref().map(|n| n.as_str()),
            Spec::Directory(_)
            | Spec::File(_)
            | Spec::Access(_)
            | Spec::Package(_)
            | Spec::Service(_)
            | Spec::User(_)
            | Spec::Archive(_)
            | Spec::Process(_)
            | Spec::Container(_)
            | Spec::Network(_)
            | Spec::Opening(_) => None,
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
            Spec::File(f) => f.inline_body().map_or(0, <[u8]>::len),
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

    /// The machine's ports a resource binds by declaration: a container's published host
    /// ports, in order, without repeats (a port the runtime picks is not one). Empty for
    /// anything else.
    pub fn holds(&self) -> Vec<u16> {
        match self {
            Spec::Container(c) => {
                let mut ports: Vec<u16> =
                    c.ports.iter().flat_map(|p| p.publishes()).filter_map(|(host, _)| host).collect();
                ports.sort_unstable();
                ports.dedup();
                ports
            }
            Spec::Directory(_)
            | Spec::File(_)
            | Spec::Access(_)
            | Spec::Package(_)
            | Spec::Service(_)
            | Spec::User(_)
            | Spec::Archive(_)
            | Spec::Process(_)
            | Spec::Action(_)
            | Spec::Network(_)
            | Spec::Opening(_) => Vec::new(),
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
    /// a run-once container. When a gate fails, nothing after it is attempted (docs/systemd.md,
    /// "action"; docs/containers.md, "Run-once and scheduled steps").
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
