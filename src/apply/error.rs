//! Why one resource could not be applied. Messages describe the machine, name the path, and
//! are lower-case, for a person reading a report.
//!
//! Each variant says what happened, so code that must tell failures apart (a contest from a
//! fault, a missing applier from a machine that is not ready) matches on a variant, never on a
//! message: rewording a message cannot change how the daemon treats the failure. The variants
//! are grouped by when they happen: what the declaration asks that cannot be done here, what
//! the host found before it changed anything, and what a read-back found after it did.

use std::path::PathBuf;
use std::sync::Arc;

use crate::declaration::Kind;
use crate::system::fs::Kind as FsKind;
use crate::system::systemd::UnitState;
use crate::system::{accounts, command, docker, fs, packages, systemd, users};

/// Why one resource could not be applied; each variant is one cause, matched on by the daemon
/// and shown to a person by its message.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    // What a manager of the machine answered.
    /// A filesystem call failed, as `system::fs` reports it.
    #[error(transparent)]
    Fs(#[from] fs::Error),
    /// A user or group the declaration names (an `owner`, a process's `user`) is not on this
    /// machine, or could not be looked up.
    #[error(transparent)]
    Owner(#[from] users::Error),
    /// systemd refused or failed a call over D-Bus.
    #[error(transparent)]
    Systemd(#[from] systemd::Error),
    /// The package manager failed, as `system::packages` reports it.
    #[error(transparent)]
    Package(#[from] packages::Error),
    /// The account tools (`useradd`, `usermod`, ...) failed.
    #[error(transparent)]
    AccountTools(#[from] accounts::Error),
    /// A command the host ran failed to start or to finish in time.
    #[error(transparent)]
    Command(#[from] command::Error),
    /// The container runtime's answer. Shared, because a runtime that could not be reached is
    /// the answer for every container of the pass (see `Managers::docker`).
    #[error(transparent)]
    Runtime(Arc<docker::Error>),
    /// What ufw answered, found active on an adopted node. Shared, like nft's.
    #[error("ufw: {0}")]
    Ufw(Arc<crate::system::ufw::Error>),
    /// What firewalld answered, found running on an adopted node. Shared, like nft's.
    #[error("{0}")]
    Firewalld(Arc<crate::system::firewalld::Error>),
    /// The flip from ufw to the host's own filter stopped after the filter was loaded.
    #[error("the host's own filter was loaded, and retiring ufw failed: {0}; ufw and the openings made in it stay, and the next pass tries again")]
    Flip(Arc<crate::system::ufw::Error>),
    /// The flip from firewalld to the host's own filter stopped after the filter was loaded.
    #[error("the host's own filter was loaded, and retiring firewalld failed: {reason}; firewalld and the openings made in it stay, and the next pass tries again")]
    FlipFirewalld {
        /// What failed, and what of it was undone. Shared: it is every opening's.
        reason: Arc<FirewalldMove>,
    },
    /// The way back to firewalld could not start it.
    #[error("firewalld, retired by the host, could not be started again: {reason}; table inet mesh_host stays in force, and the next pass tries again")]
    WayBackFirewalld {
        /// What failed. Shared: it is every opening's.
        reason: Arc<FirewalldMove>,
    },
    /// Which firewall is in force on an adopted node could not be told: the declaration is
    /// refused, nothing touched.
    #[error("cannot tell which firewall is in force: {0}; nothing was touched")]
    FirewallUnknown(FoundUnreadable),
    /// A filter other than ufw's, firewalld's and the host's own is in force on the input hook
    /// of an adopted node: the declaration is refused, nothing touched.
    #[error("a filter other than ufw or firewalld is in force on the input hook of this adopted node: {}; mesh-host does not load its own filter beside one it cannot manage, so the declaration was refused and nothing was touched", .chains.join(", "))]
    ForeignFilter {
        /// Each chain in force, described: its table, name, policy and number of rules.
        chains: Vec<String>,
    },
    /// The flip from the found firewall (ufw or firewalld) waits: something else in the pass
    /// failed.
    #[error("the flip from {from} to the host's own filter waits until everything applies without failure ({failed} failed); {from} and the openings made in it were left in force")]
    FlipWaits {
        /// The firewall found: `ufw` or `firewalld`.
        from: &'static str,
        /// How many other resources of the pass failed.
        failed: usize,
    },
    /// The way back to the found firewall (ufw or firewalld) waits: something else in the pass
    /// failed.
    #[error("the way back from the host's own filter to {to} waits until everything applies without failure ({failed} failed); table inet mesh_host stays in force, and {to} as it is")]
    WayBackWaits {
        /// The firewall to go back to: `ufw` or `firewalld`.
        to: &'static str,
        /// How many other resources of the pass failed.
        failed: usize,
    },
    /// The flip from the found firewall waits: a reconcile of some keys (a change the daemon
    /// saw) never moves the filter, only a full pass that fails nothing does.
    #[error("the flip from {from} to the host's own filter waits for a full pass that fails nothing, and this was a reconcile of one change; {from} and the openings made in it were left in force")]
    FlipWaitsForFullPass {
        /// The firewall found: `ufw` or `firewalld`.
        from: &'static str,
    },
    /// The way back to the found firewall waits: a reconcile of some keys never moves the
    /// filter.
    #[error("the way back from the host's own filter to {to} waits for a full pass that fails nothing, and this was a reconcile of one change; table inet mesh_host stays in force, and {to} as it is")]
    WayBackWaitsForFullPass {
        /// The firewall to go back to: `ufw` or `firewalld`.
        to: &'static str,
    },
    /// What nft answered. Shared, because one load of the filter is every opening's.
    #[error(transparent)]
    Firewall(Arc<crate::system::firewall::Error>),

    // What the declaration asks that this build or this node cannot do. Nothing was changed.
    /// A file writing keys `into` another asked for its whole content, which it does not have:
    /// its keys are set by `apply::into`, never written as a file.
    #[error("{path} sets keys `into` a file that belongs to someone else; it has no content of its own to write whole, and nothing was written")]
    IntoUnsupported {
        /// The file that writes keys into another.
        path: PathBuf,
    },
    /// A file with `into` whose text is not of its format (or too large to edit): nothing was
    /// written.
    #[error("{path} {why}; mesh-host sets keys only in a file it can read as {format}, so it left the file exactly as it is")]
    IntoUnreadable {
        /// The file the keys go into.
        path: PathBuf,
        /// What is wrong with its text, as a phrase that follows the path.
        why: String,
        /// The format the file is read as, in words ("a JSON object").
        format: &'static str,
    },
    /// After writing a file with `into`, an owned key does not hold its declared value. The
    /// value is not quoted: it may be a secret.
    #[error("{path} was written, and reading it back {key} does not hold the declared value")]
    IntoReadBack {
        /// The file written.
        path: PathBuf,
        /// The owned key that does not hold its value.
        key: String,
    },
    /// The declared bytes of a file carrying a secret were asked for as plain bytes: they are
    /// opened only by the file's applier, with the node's key.
    #[error("{path} carries a sealed value, which is opened only when the file is applied")]
    Sealed {
        /// The file whose bytes were asked for.
        path: PathBuf,
    },
    /// An opening whose id cannot be its rules' comment, which is how its rules are told apart.
    #[error("the id {id:?} is longer than {max} bytes, the most nftables keeps as a rule's comment; this opening was not loaded (the others were)")]
    IdTooLongForRule {
        /// The opening's id, quoted.
        id: String,
        /// The longest comment nftables keeps, in bytes.
        max: usize,
    },
    /// A secret of an `into` file that opened to a value its hole cannot take (a line break in
    /// an env value, bytes that are not text). Says what is wrong, never the value.
    #[error("{path}: `{field}` opened, and the value {why}, so it cannot fill its hole in this `into` file; nothing was written")]
    IntoValue {
        /// The `into` file.
        path: PathBuf,
        /// The secret, by its name in the declaration (`secrets.NAME`).
        field: String,
        /// What is wrong with the value, as a phrase.
        why: &'static str,
    },
    /// What an owned key held before the host set it is to be put back (the key left the
    /// declaration, or the resource did), and it was recorded sealed to this node's key, which
    /// cannot open it now. Nothing is written and the record stays: the value is the
    /// operator's, and is not lost.
    #[error("{path}: the value {owned} held before the host set it is to be put back, and was recorded sealed to this node's key, which cannot open it now: {why}; nothing was written, and the record is kept so that a later pass can put it back once the key at {key} opens it")]
    IntoPutBack {
        /// The `into` file.
        path: PathBuf,
        /// The owned key whose earlier value is sealed.
        owned: String,
        /// Where the node's key was looked for.
        key: PathBuf,
        /// Why it cannot be opened (no key file, a key file that cannot be used, another key).
        why: String,
    },
    /// What an owned key filled from a secret held before the host set it could not be sealed
    /// to the node's key to be recorded; without that record it could not be put back, so
    /// nothing was written.
    #[error("{path}: the value {owned} held before the host set it could not be sealed to this node's key to be kept: {why}; nothing was written")]
    IntoSeal {
        /// The `into` file.
        path: PathBuf,
        /// The owned key.
        owned: String,
        /// Why sealing failed.
        why: String,
    },
    /// A file carrying a sealed value, on a node without the key to open it.
    #[error(
        "{path} carries a sealed value and this node has no sealing key at {key}: make one with `mesh-host keygen` and seal the value to the public key it prints; nothing was written"
    )]
    NoKey {
        /// The file carrying the sealed value.
        path: PathBuf,
        /// Where this node's sealing key is looked for.
        key: PathBuf,
    },
    /// The node's key file is there and cannot be used (readable by others, not a key file).
    #[error("{path} carries a sealed value and the node's sealing key cannot be used: {error}; nothing was written")]
    KeyUnusable {
        /// The file carrying the sealed value.
        path: PathBuf,
        /// Why the key file cannot be used.
        error: Arc<str>,
    },
    /// A sealed value that does not open with this node's key. Names the field, never what it
    /// held or what a failed attempt produced.
    #[error("{path}: `{field}` does not open: {error}; nothing was written")]
    NotOpened {
        /// The file carrying the sealed value.
        path: PathBuf,
        /// The field whose value does not open, by its name in the declaration.
        field: String,
        /// Why it does not open, with nothing of the value in it.
        error: crate::secrets::OpenError,
    },
    /// A file whose bytes were asked for, with neither `content` nor `bytes` to give (an `into`
    /// file needs its `content`): there is nothing to write.
    #[error("{path} declares no content")]
    NoContent {
        /// The declared file.
        path: PathBuf,
    },
    /// An archive declared with neither `bytes` nor `source`: there is nothing to unpack.
    #[error("{path}: the archive has no bytes or source")]
    NoArchive {
        /// The directory the archive unpacks into.
        path: PathBuf,
    },
    /// The daemon's content file did not give back a file's declared bytes.
    #[error(
        "cannot read the declared content of {path} from the agent's content file: {error}; touch the declaration to have it read again"
    )]
    ContentFile {
        /// The file whose bytes were asked for.
        path: PathBuf,
        /// Why the content file could not be read.
        error: std::io::Error,
    },
    /// A scheduled run asked for an id the declaration in force does not have.
    #[error("{id} is not declared")]
    NotDeclared {
        /// The id asked for.
        id: String,
    },
    /// A scheduled run asked for an id that is declared and is not a scheduled container step.
    #[error("{id} is not a scheduled container step")]
    NotScheduled {
        /// The id asked for.
        id: String,
    },
    /// A fire of a step that no apply installed at its current declaration: its install
    /// failed, a gate before it failed, or its module is not taken yet.
    #[error(
        "scheduled step {id} is not installed at its current declaration (its install failed, a gate before it failed, or its module is not taken yet), so it was not run"
    )]
    StepNotInstalled {
        /// The step's id.
        id: String,
    },

    // What the host found before changing anything. Nothing was changed.
    /// Something of another kind at a declared path: a symlink, a directory or a FIFO where a
    /// file is declared, a file where a directory is.
    #[error("{path} {}", wrong_kind(*.declared, *.found))]
    WrongKind {
        /// The declared path.
        path: PathBuf,
        /// What the declaration asks for there.
        declared: Kind,
        /// What is there instead.
        found: FsKind,
    },
    /// What a resource needs and the host never makes is not there.
    #[error("{}", missing(.path, .need))]
    Missing {
        /// The path that is not there.
        path: PathBuf,
        /// Who needs it, which says what the operator must provide.
        need: Need,
    },
    /// The archive is refused whole, before anything is unpacked.
    #[error("the archive for {path} {why}; nothing was unpacked")]
    ArchiveRefused {
        /// The directory the archive unpacks into.
        path: PathBuf,
        /// Why it is refused, as a phrase that follows "the archive for `<path>`".
        why: String,
    },
    /// An archive's `source` that cannot be read; nothing was unpacked.
    #[error("cannot read the archive {path}: {error}")]
    ArchiveSource {
        /// The archive's source file.
        path: PathBuf,
        /// Why it cannot be read.
        error: std::io::Error,
    },
    /// A file a container reads (an env-file, a mounted file) that cannot be read to compute the
    /// container's digest.
    #[error("cannot read {path}, which the container reads: {error}")]
    ContainerReads {
        /// The file the container reads.
        path: PathBuf,
        /// Why it cannot be read.
        error: std::io::Error,
    },
    /// An env-file that cannot be read or is not in the env-file format.
    #[error("container {container}: env-file[{index}] {path}: {why}")]
    EnvFile {
        /// The container's name.
        container: String,
        /// The env-file's index in the container's `env-file` list.
        index: usize,
        /// The env-file's path.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// The image is not on this machine, and is named by its id alone, which no registry serves.
    #[error(
        "image {image} is not on this machine, and an image named by its id alone cannot be pulled: name it by repository and digest (name@sha256:...), or load it (`{cli} load`) before applying"
    )]
    ImageMissing {
        /// The image as declared.
        image: String,
        /// The runtime's command-line tool (`docker` or `podman`), for the advice.
        cli: &'static str,
    },
    /// The image was absent and the pull failed: the registry's answer, as the runtime relays it.
    #[error("image {image} is not on this machine and cannot be pulled: {answer}")]
    PullFailed {
        /// The image as declared.
        image: String,
        /// The error the runtime relayed from the registry.
        answer: String,
    },
    /// The pull said it succeeded and the image is not there.
    #[error("image {image} was pulled, and the runtime does not have it afterwards")]
    PulledNotThere {
        /// The image as declared.
        image: String,
    },
    /// An image named by digest is held at another one.
    #[error(
        "image {image} is named by its digest, and the runtime holds it as {found}; nothing was created"
    )]
    ImageDigest {
        /// The image as declared, by digest.
        image: String,
        /// The digest the runtime holds it at.
        found: String,
    },
    /// A service declared with `boot: enabled` whose unit file has no `[Install]` section, so
    /// systemd cannot enable it.
    #[error("{unit} cannot be enabled: its unit file has no [Install] section (systemd calls it static)")]
    StaticUnit {
        /// The unit's name.
        unit: String,
    },
    /// A transient unit of the host's that systemd keeps restarting.
    #[error("{unit} is {state}: the program keeps exiting; journalctl -u {unit} says why")]
    UnitKeepsExiting {
        /// The unit's name.
        unit: String,
        /// The unit's state as systemd reports it.
        state: Box<UnitState>,
    },
    /// An account declared in a group that does not exist on this machine.
    #[error("{user}: the group {group:?} named in groups does not exist on this machine")]
    NoGroup {
        /// The account's name.
        user: String,
        /// The group named in `groups`.
        group: String,
    },
    /// An account that exists with another uid than the declared one; the host never renumbers an
    /// account.
    #[error(
        "{user} has uid {found} and the declaration says {declared}; mesh-host does not renumber an account (its files would keep the old number): change it by hand or declare {found}"
    )]
    Renumber {
        /// The account's name.
        user: String,
        /// The uid it has.
        found: u32,
        /// The uid declared.
        declared: u32,
    },

    // What a read-back found after the host changed something. The write returned success and
    // did not take, or something undid it at once.
    /// A property of what was written is not what the host set it to.
    #[error("{target}: {what} is {found} after the host set it to {wanted}")]
    ReadBack {
        /// What was read back.
        target: Target,
        /// Which property of it differs.
        what: Aspect,
        /// The value the host set, in words.
        wanted: String,
        /// The value read back, in words.
        found: String,
    },
    /// An opening's rules in ufw, added without an error, read back differently.
    #[error("{id}: ufw reads back different: {differs}")]
    UfwReadBack {
        /// The opening's id.
        id: String,
        /// How its rules differ, in words.
        differs: String,
    },
    /// An opening's rules in firewalld, added without an error, read back differently.
    #[error("{id}: firewalld reads back different: {differs}")]
    FirewalldReadBack {
        /// The opening's id.
        id: String,
        /// How its rules differ, in words.
        differs: String,
    },
    /// The host's filter, loaded without an error, listed differently.
    #[error("table inet mesh_host was loaded and reads back different: {differs}")]
    FilterReadBack {
        /// How the listed table differs from the one loaded, in words.
        differs: String,
    },
    /// Something the host made or started that is not there when read back.
    #[error("{target} was {did} and is not there afterwards")]
    Vanished {
        /// What was made.
        target: Target,
        /// What the host did to it ("created", "started"), as a past participle.
        did: &'static str,
    },
    /// Something the host removed that is still there when read back.
    #[error("{target} is still there after removing it")]
    StillThere {
        /// What was removed.
        target: Target,
    },
    /// An entry just unpacked is not what the archive holds.
    #[error("{path} {what} after unpacking")]
    Unpacked {
        /// The unpacked entry.
        path: PathBuf,
        /// How it differs, as a phrase that follows the path.
        what: &'static str,
    },
    /// A unit just started, restarted or replaced that did not stay up.
    #[error("{unit} {did} and is {state} a moment later: it exited or died at once; journalctl -u {unit} says why")]
    UnitDied {
        /// The unit's name.
        unit: String,
        /// What the host did to it ("was started", "was restarted").
        did: String,
        /// The unit's state a moment later.
        state: Box<UnitState>,
    },
    /// A unit reloaded to take a change that is not up after the reload.
    #[error("{unit} was reloaded for {why} and is {state}; journalctl -u {unit} says why")]
    ReloadDied {
        /// The unit's name.
        unit: String,
        /// What the reload was for.
        why: String,
        /// The unit's state after the reload.
        state: Box<UnitState>,
    },
    /// A unit the host stopped that is still active.
    #[error("{unit} was stopped and is {state}")]
    StillRunning {
        /// The unit's name.
        unit: String,
        /// The unit's state after the stop.
        state: Box<UnitState>,
    },
    /// A unit enabled or disabled without an error whose boot setting reads back otherwise.
    #[error("{unit} was set to {wanted} at boot and systemd reads it back as {found}")]
    BootReadBack {
        /// The unit's name.
        unit: String,
        /// The setting the host made ("enabled" or "disabled").
        wanted: &'static str,
        /// What systemd reports.
        found: String,
    },
    /// A transient unit whose description does not carry the spec it was started with.
    #[error("{unit} was started with spec {wanted} and systemd describes it as {described:?}")]
    UnitSpec {
        /// The unit's name.
        unit: String,
        /// The spec digest it was started with.
        wanted: String,
        /// The description systemd has for it.
        described: String,
    },
    /// A container the runtime keeps restarting by its policy: it exits at once.
    #[error(
        "container {name} was started and is not running: it exited at once, and the runtime keeps restarting it; read its logs with `{cli} logs {name}`"
    )]
    ContainerRestarting {
        /// The container's name.
        name: String,
        /// The runtime's command-line tool, for the advice.
        cli: &'static str,
    },
    /// A container that is not running after its start; `how` says how it stopped.
    #[error(
        "container {name} was started and is not running: it {how}; read its logs with `{cli} logs {name}`"
    )]
    ContainerDied {
        /// The container's name.
        name: String,
        /// How it stopped ("exited with code 1", ...), as a phrase that follows "it".
        how: String,
        /// The runtime's command-line tool, for the advice.
        cli: &'static str,
    },
    /// A run-once or scheduled step whose container exited non-zero.
    #[error(
        "{step} {name} exited with code {code}; its container is left for its logs: `{cli} logs {name}`"
    )]
    StepFailed {
        /// What kind of step it is ("run-once step", "scheduled step").
        step: &'static str,
        /// The container's name, kept for its logs.
        name: String,
        /// The exit code.
        code: i64,
        /// The runtime's command-line tool, for the advice.
        cli: &'static str,
    },
    /// A package the manager installed without an error that its database does not list as
    /// installed.
    #[error(
        "{manager} installed {package} without an error and the package database does not have it installed"
    )]
    NotInstalled {
        /// The package manager (`apt` or `dnf`).
        manager: &'static str,
        /// The package's name.
        package: String,
    },
    /// An account added without an error that does not exist when read back.
    #[error("{user} was added without an error and does not exist")]
    AccountMissing {
        /// The account's name.
        user: String,
    },
    /// An account created with a uid it does not have when read back.
    #[error("{user} was made with uid {wanted} and has uid {found}")]
    AccountUid {
        /// The account's name.
        user: String,
        /// The uid it was made with.
        wanted: u32,
        /// The uid it has.
        found: u32,
    },
    /// An account changed without an error that still differs; `left` says how.
    #[error("{user} was changed without an error and still differs: {left}")]
    AccountDiffers {
        /// The account's name.
        user: String,
        /// What still differs, in words.
        left: String,
    },
    /// An action's command failed; `verify` and `ran` say how each ended.
    #[error("verify {verify}, so the command ran, and it {ran}")]
    CommandFailed {
        /// How the verify ended before the command ran.
        verify: String,
        /// How the command ended.
        ran: String,
    },
    /// An action's command exited 0 and its verify still fails.
    #[error(
        "the command exited 0 and verify still fails ({verify}): the command claimed success and did not do its job"
    )]
    VerifyStillFails {
        /// How the verify ended after the command.
        verify: String,
    },
}

impl From<docker::Error> for Error {
    fn from(e: docker::Error) -> Error {
        Error::Runtime(Arc::new(e))
    }
}

impl Error {
    /// Whether the machine changed between the host's write and its read-back: someone else
    /// wrote the same file in that instant. Not a fault of the host's, and retried as a contest
    /// is, not as a failure is (a minute-long backoff).
    pub fn raced(&self) -> bool {
        // A name swapped between the look and a change in place is the same contest, caught
        // before the change rather than after it (`fs::Error::Swapped`).
        matches!(
            self,
            Error::ReadBack { what: Aspect::File | Aspect::Content, .. }
                | Error::Fs(fs::Error::Swapped { .. })
        )
    }
}

/// What a read-back, a removal or a start names: a path, or a container or network by name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// A file or directory on this machine.
    Path(PathBuf),
    /// A container, by its name.
    Container(String),
    /// A container network, by its name.
    Network(String),
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Path(p) => write!(f, "{}", p.display()),
            Target::Container(name) => write!(f, "container {name}"),
            Target::Network(name) => write!(f, "network {name}"),
        }
    }
}

/// What a read-back compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Aspect {
    /// Whether a regular file is there at all.
    File,
    /// Whether a directory is there at all.
    Directory,
    /// The bytes of a file.
    Content,
    /// The permission bits.
    Mode,
    /// The owning user and group.
    Owner,
    /// The `mesh-host.spec` label a container carries.
    SpecLabel,
}

impl std::fmt::Display for Aspect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Aspect::File => "the file",
            Aspect::Directory => "the directory",
            Aspect::Content => "the content",
            Aspect::Mode => "the mode",
            Aspect::Owner => "the owner",
            Aspect::SpecLabel => "the label mesh-host.spec",
        })
    }
}

/// What could not be read while looking for the firewall in force on an adopted node.
#[derive(Debug, thiserror::Error)]
pub enum FoundUnreadable {
    /// ufw could not say whether it is active.
    #[error(transparent)]
    Ufw(#[from] crate::system::ufw::Error),
    /// firewalld answered, and not whether it runs.
    #[error(transparent)]
    Firewalld(#[from] crate::system::firewalld::Error),
    /// The chains on the input hook could not be listed.
    #[error(transparent)]
    Nft(#[from] crate::system::firewall::Error),
}

/// Why retiring firewalld (the flip) or starting it again (the way back) failed.
#[derive(Debug, thiserror::Error)]
pub enum FirewalldMove {
    /// systemd refused or failed a call about firewalld's unit.
    #[error(transparent)]
    Systemd(#[from] systemd::Error),
    /// firewalld, or its offline tool, failed.
    #[error(transparent)]
    Firewalld(#[from] crate::system::firewalld::Error),
    /// Disabling or stopping the unit failed, and enabling it again after failed too.
    #[error("{failed}; enabling it again failed too: {again}")]
    NotEnabledAgain {
        /// Why it could not be disabled or stopped.
        failed: Box<FirewalldMove>,
        /// Why it could not be enabled again.
        again: systemd::Error,
    },
    /// Disabled and stopped without an error, firewalld reads back otherwise.
    #[error("firewalld was stopped and disabled, and reads back {state}, {boot}{}", if *.answers { ", still answering on the bus" } else { "" })]
    NotRetired {
        /// The unit's state read back.
        state: Box<UnitState>,
        /// Whether it starts at boot, as systemd says it.
        boot: String,
        /// Whether firewalld still answers on the bus.
        answers: bool,
    },
    /// The host's saved rules are still in firewalld's zone after they were deleted.
    #[error(
        "firewalld was retired, and the saved rules of {id} are still in its zone {zone} after deleting them"
    )]
    RulesLeft {
        /// The opening whose rules are left.
        id: String,
        /// The zone they are in.
        zone: String,
    },
    /// Started, firewalld never answered on the bus.
    #[error("firewalld was started and did not answer on the bus within {secs} s")]
    NoAnswer {
        /// How long it was waited for, in seconds.
        secs: u64,
    },
    /// The host's table could not be made to let the declared openings in before the way back.
    #[error(transparent)]
    Widen(Box<Error>),
}

/// Who needs a path that is not there, and that the host never makes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Need {
    /// An access: the operator provides the directory.
    Access,
    /// A container's env-file, by its index.
    EnvFile {
        /// The container's name.
        container: String,
        /// The env-file's index in its `env-file` list.
        index: usize,
    },
    /// A container's bind-mount source, by the volume's index.
    BindSource {
        /// The container's name.
        container: String,
        /// The volume's index in its `volumes` list.
        index: usize,
    },
}

fn missing(path: &std::path::Path, need: &Need) -> String {
    let path = path.display();
    match need {
        Need::Access => format!(
            "{path} is not there, and it is the operator's to provide: an access names shared data that mesh-host never creates"
        ),
        Need::EnvFile { container, index } => format!(
            "container {container}: env-file[{index}] {path} is not there (or not a file); declare it before the container"
        ),
        Need::BindSource { container, index } => format!(
            "container {container}: volumes[{index}]: {path} does not exist; declare it before the container"
        ),
    }
}

/// What follows the path when something of another kind is found there.
fn wrong_kind(declared: Kind, found: FsKind) -> &'static str {
    match (declared, found) {
        (Kind::File, FsKind::Symlink) => {
            "is a symlink; mesh-host never writes through a symlink, and does not replace one it did not make: remove it, or declare the real path"
        }
        (Kind::File, FsKind::File | FsKind::Directory | FsKind::Other) => {
            "exists and is not a regular file; it was left alone"
        }
        (Kind::Directory, FsKind::Symlink) => {
            "is a symlink; mesh-host never manages a directory through a symlink: declare the real path"
        }
        (Kind::Archive, _) => "exists and is not a directory to unpack into; it was left alone",
        (Kind::Access, _) => "is not a directory; an access names a directory the operator provides",
        // The other kinds name no path; a directory is what they would need, if any.
        (Kind::Directory, FsKind::File | FsKind::Directory | FsKind::Other)
        | (
            Kind::Package
            | Kind::Service
            | Kind::Container
            | Kind::Network
            | Kind::User
            | Kind::Process
            | Kind::Action
            | Kind::Opening,
            _,
        ) => "exists and is not a directory; it was left alone",
    }
}

/// Which of two messages: an image named by its digest cannot be fetched at all.
#[cfg(test)]
mod tests {
    use super::*;

    fn state(active: &str, sub: &str) -> Box<UnitState> {
        Box::new(UnitState { load: "loaded".into(), active: active.into(), sub: sub.into() })
    }

    fn io() -> std::io::Error {
        std::io::Error::other("boom")
    }

    /// Every message, word for word as a person reads it in a report: the integration tests
    /// match on many of them, and each was a format string before it was a variant.
    #[test]
    fn every_message_reads_as_it_did() {
        let snapshot = expect_test::expect![[r#"
            the id "a.b" is longer than 128 bytes, the most nftables keeps as a rule's comment; this opening was not loaded (the others were)
            the flip from firewalld to the host's own filter waits until everything applies without failure (2 failed); firewalld and the openings made in it were left in force
            the flip from ufw to the host's own filter waits for a full pass that fails nothing, and this was a reconcile of one change; ufw and the openings made in it were left in force
            the way back from the host's own filter to ufw waits until everything applies without failure (1 failed); table inet mesh_host stays in force, and ufw as it is
            the host's own filter was loaded, and retiring firewalld failed: firewalld was stopped and disabled, and reads back active (running), disabled, still answering on the bus; firewalld and the openings made in it stay, and the next pass tries again
            firewalld, retired by the host, could not be started again: firewalld was started and did not answer on the bus within 60 s; table inet mesh_host stays in force, and the next pass tries again
            a filter other than ufw or firewalld is in force on the input hook of this adopted node: table ip guard chain c (policy drop, 0 rules), table inet x chain i (policy accept, 2 rules); mesh-host does not load its own filter beside one it cannot manage, so the declaration was refused and nothing was touched
            web.http: firewalld reads back different: not in force ["rule"]
            table inet mesh_host was loaded and reads back different: its rules were reordered
            /etc/app.conf sets keys `into` a file that belongs to someone else; it has no content of its own to write whole, and nothing was written
            /etc/app.conf is not valid JSON (line 3, column 7: expected `:`); mesh-host sets keys only in a file it can read as a JSON object, so it left the file exactly as it is
            /etc/app.conf was written, and reading it back PORT does not hold the declared value
            /etc/app.conf carries a sealed value, which is opened only when the file is applied
            /etc/app.conf: `secrets.pw` opened, and the value is not UTF-8 text, so it cannot fill its hole in this `into` file; nothing was written
            /etc/app.conf: the value PASSWORD held before the host set it is to be put back, and was recorded sealed to this node's key, which cannot open it now: there is no key file; nothing was written, and the record is kept so that a later pass can put it back once the key at /var/lib/mesh-host/sealing.key opens it
            /etc/app.conf: the value PASSWORD held before the host set it could not be sealed to this node's key to be kept: cannot seal: boom; nothing was written
            /etc/app.conf carries a sealed value and this node has no sealing key at /var/lib/mesh-host/sealing.key: make one with `mesh-host keygen` and seal the value to the public key it prints; nothing was written
            /etc/app.conf: `secrets.db` does not open: it is neither an armored age value (`-----BEGIN AGE ENCRYPTED FILE-----`) nor base64 of a binary one; nothing was written
            /etc/app.conf declares no content
            /etc/app.conf: the archive has no bytes or source
            cannot read the declared content of /etc/app.conf from the agent's content file: boom; touch the declaration to have it read again
            a.b is not declared
            a.b is not a scheduled container step
            scheduled step a.b is not installed at its current declaration (its install failed, a gate before it failed, or its module is not taken yet), so it was not run
            /etc/app.conf is a symlink; mesh-host never writes through a symlink, and does not replace one it did not make: remove it, or declare the real path
            /etc/app.conf exists and is not a regular file; it was left alone
            /etc/app.conf exists and is not a regular file; it was left alone
            /etc/app.conf is a symlink; mesh-host never manages a directory through a symlink: declare the real path
            /etc/app.conf exists and is not a directory; it was left alone
            /etc/app.conf exists and is not a directory to unpack into; it was left alone
            /etc/app.conf is not a directory; an access names a directory the operator provides
            /etc/app.conf is not there, and it is the operator's to provide: an access names shared data that mesh-host never creates
            container web: env-file[1] /etc/app.conf is not there (or not a file); declare it before the container
            container web: volumes[2]: /etc/app.conf does not exist; declare it before the container
            the archive for /etc/app.conf changed while it was read; nothing was unpacked
            cannot read the archive /etc/app.conf: boom
            cannot read /etc/app.conf, which the container reads: boom
            container web: env-file[0] /etc/app.conf: is not UTF-8 text
            image sha256:ab is not on this machine, and an image named by its id alone cannot be pulled: name it by repository and digest (name@sha256:...), or load it (`podman load`) before applying
            image web:1 is not on this machine and cannot be pulled: manifest unknown
            image web:1 was pulled, and the runtime does not have it afterwards
            image web@sha256:ab is named by its digest, and the runtime holds it as web@sha256:cd; nothing was created
            a.service cannot be enabled: its unit file has no [Install] section (systemd calls it static)
            a.service is activating (auto-restart): the program keeps exiting; journalctl -u a.service says why
            app: the group "wheel" named in groups does not exist on this machine
            app has uid 1001 and the declaration says 1002; mesh-host does not renumber an account (its files would keep the old number): change it by hand or declare 1001
            /etc/app.conf: the mode is 0644 after the host set it to 0640
            container web: the label mesh-host.spec is absent after the host set it to sha256:1
            network net was created and is not there afterwards
            container web was started and is not there afterwards
            /etc/app.conf is still there after removing it
            container web is still there after removing it
            network net is still there after removing it
            /etc/app.conf is missing after unpacking
            a.service was restarted for b.c and is failed (failed) a moment later: it exited or died at once; journalctl -u a.service says why
            a.service was reloaded for b.c and is inactive (dead); journalctl -u a.service says why
            a.service was stopped and is active (running)
            a.service was set to enabled at boot and systemd reads it back as disabled
            a.service was started with spec sha256:1 and systemd describes it as "x"
            container web was started and is not running: it exited at once, and the runtime keeps restarting it; read its logs with `docker logs web`
            container web was started and is not running: it exited with code 1; read its logs with `docker logs web`
            run-once step mig exited with code 3; its container is left for its logs: `podman logs mig`
            apt installed curl without an error and the package database does not have it installed
            app was added without an error and does not exist
            app was made with uid 1002 and has uid 1001
            app was changed without an error and still differs: shell /bin/sh to /bin/bash
            verify exited 1, so the command ran, and it exited 2: no
            the command exited 0 and verify still fails (exited 1): the command claimed success and did not do its job
            no container runtime answers on this machine (tried /run/docker.sock); start Docker or Podman's service, or configure its socket"#]];
        let p = || PathBuf::from("/etc/app.conf");
        let errors: Vec<Error> = vec![
            Error::IdTooLongForRule { id: "a.b".into(), max: 128 },
            Error::FlipWaits { from: "firewalld", failed: 2 },
            Error::FlipWaitsForFullPass { from: "ufw" },
            Error::WayBackWaits { to: "ufw", failed: 1 },
            Error::FlipFirewalld {
                reason: Arc::new(FirewalldMove::NotRetired {
                    state: state("active", "running"),
                    boot: "disabled".into(),
                    answers: true,
                }),
            },
            Error::WayBackFirewalld { reason: Arc::new(FirewalldMove::NoAnswer { secs: 60 }) },
            Error::ForeignFilter {
                chains: vec![
                    "table ip guard chain c (policy drop, 0 rules)".into(),
                    "table inet x chain i (policy accept, 2 rules)".into(),
                ],
            },
            Error::FirewalldReadBack { id: "web.http".into(), differs: "not in force [\"rule\"]".into() },
            Error::FilterReadBack { differs: "its rules were reordered".into() },
            Error::IntoUnsupported { path: p() },
            Error::IntoUnreadable {
                path: p(),
                why: "is not valid JSON (line 3, column 7: expected `:`)".into(),
                format: "a JSON object",
            },
            Error::IntoReadBack { path: p(), key: "PORT".into() },
            Error::Sealed { path: p() },
            Error::IntoValue { path: p(), field: "secrets.pw".into(), why: "is not UTF-8 text" },
            Error::IntoPutBack {
                path: p(),
                owned: "PASSWORD".into(),
                key: PathBuf::from("/var/lib/mesh-host/sealing.key"),
                why: "there is no key file".into(),
            },
            Error::IntoSeal { path: p(), owned: "PASSWORD".into(), why: "cannot seal: boom".into() },
            Error::NoKey { path: p(), key: PathBuf::from("/var/lib/mesh-host/sealing.key") },
            Error::NotOpened {
                path: p(),
                field: "secrets.db".into(),
                error: crate::secrets::OpenError::NotAge,
            },
            Error::NoContent { path: p() },
            Error::NoArchive { path: p() },
            Error::ContentFile { path: p(), error: io() },
            Error::NotDeclared { id: "a.b".into() },
            Error::NotScheduled { id: "a.b".into() },
            Error::StepNotInstalled { id: "a.b".into() },
            Error::WrongKind { path: p(), declared: Kind::File, found: FsKind::Symlink },
            Error::WrongKind { path: p(), declared: Kind::File, found: FsKind::Other },
            Error::WrongKind { path: p(), declared: Kind::File, found: FsKind::Directory },
            Error::WrongKind { path: p(), declared: Kind::Directory, found: FsKind::Symlink },
            Error::WrongKind { path: p(), declared: Kind::Directory, found: FsKind::File },
            Error::WrongKind { path: p(), declared: Kind::Archive, found: FsKind::Symlink },
            Error::WrongKind { path: p(), declared: Kind::Access, found: FsKind::File },
            Error::Missing { path: p(), need: Need::Access },
            Error::Missing { path: p(), need: Need::EnvFile { container: "web".into(), index: 1 } },
            Error::Missing { path: p(), need: Need::BindSource { container: "web".into(), index: 2 } },
            Error::ArchiveRefused { path: p(), why: "changed while it was read".into() },
            Error::ArchiveSource { path: p(), error: io() },
            Error::ContainerReads { path: p(), error: io() },
            Error::EnvFile { container: "web".into(), index: 0, path: p(), why: "is not UTF-8 text".into() },
            Error::ImageMissing { image: "sha256:ab".into(), cli: "podman" },
            Error::PullFailed { image: "web:1".into(), answer: "manifest unknown".into() },
            Error::PulledNotThere { image: "web:1".into() },
            Error::ImageDigest { image: "web@sha256:ab".into(), found: "web@sha256:cd".into() },
            Error::StaticUnit { unit: "a.service".into() },
            Error::UnitKeepsExiting { unit: "a.service".into(), state: state("activating", "auto-restart") },
            Error::NoGroup { user: "app".into(), group: "wheel".into() },
            Error::Renumber { user: "app".into(), found: 1001, declared: 1002 },
            Error::ReadBack {
                target: Target::Path(p()),
                what: Aspect::Mode,
                wanted: "0640".into(),
                found: "0644".into(),
            },
            Error::ReadBack {
                target: Target::Container("web".into()),
                what: Aspect::SpecLabel,
                wanted: "sha256:1".into(),
                found: "absent".into(),
            },
            Error::Vanished { target: Target::Network("net".into()), did: "created" },
            Error::Vanished { target: Target::Container("web".into()), did: "started" },
            Error::StillThere { target: Target::Path(p()) },
            Error::StillThere { target: Target::Container("web".into()) },
            Error::StillThere { target: Target::Network("net".into()) },
            Error::Unpacked { path: p(), what: "is missing" },
            Error::UnitDied {
                unit: "a.service".into(),
                did: "was restarted for b.c".into(),
                state: state("failed", "failed"),
            },
            Error::ReloadDied {
                unit: "a.service".into(),
                why: "b.c".into(),
                state: state("inactive", "dead"),
            },
            Error::StillRunning { unit: "a.service".into(), state: state("active", "running") },
            Error::BootReadBack { unit: "a.service".into(), wanted: "enabled", found: "disabled".into() },
            Error::UnitSpec { unit: "a.service".into(), wanted: "sha256:1".into(), described: "x".into() },
            Error::ContainerRestarting { name: "web".into(), cli: "docker" },
            Error::ContainerDied { name: "web".into(), how: "exited with code 1".into(), cli: "docker" },
            Error::StepFailed { step: "run-once step", name: "mig".into(), code: 3, cli: "podman" },
            Error::NotInstalled { manager: "apt", package: "curl".into() },
            Error::AccountMissing { user: "app".into() },
            Error::AccountUid { user: "app".into(), wanted: 1002, found: 1001 },
            Error::AccountDiffers { user: "app".into(), left: "shell /bin/sh to /bin/bash".into() },
            Error::CommandFailed { verify: "exited 1".into(), ran: "exited 2: no".into() },
            Error::VerifyStillFails { verify: "exited 1".into() },
            Error::from(docker::Error::NoRuntime { tried: "/run/docker.sock".into() }),
        ];
        let said: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
        snapshot.assert_eq(&said.join("\n"));
    }

    /// Every applier returns `Result<_, Error>`: a large error makes every one of those results
    /// large, on the hot path too. What is big and rare (a unit's state) is boxed.
    #[test]
    fn an_error_stays_small() {
        assert!(std::mem::size_of::<Error>() <= 96, "{}", std::mem::size_of::<Error>());
    }

    #[test]
    fn only_a_read_back_of_the_file_or_its_content_is_a_race() {
        let read_back = |what| Error::ReadBack {
            target: Target::Path("/etc/a".into()),
            what,
            wanted: String::new(),
            found: String::new(),
        };
        assert!(read_back(Aspect::Content).raced());
        assert!(read_back(Aspect::File).raced());
        for what in [Aspect::Directory, Aspect::Mode, Aspect::Owner, Aspect::SpecLabel] {
            assert!(!read_back(what).raced(), "{what}");
        }
        assert!(!Error::StillThere { target: Target::Path("/etc/a".into()) }.raced());
    }
}
