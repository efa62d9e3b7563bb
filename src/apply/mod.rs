//! The apply: orphans first, then every resource in order, each compared, changed where it
//! differs, read back, and recorded only after it worked.
//!
//! Architecture Invariant: appliers decide and report; they reach the machine only through
//! `system`. They never write the store: the engine records a resource after its read-back
//! passed, and the caller persists the store once the pass is over.
//!
//! Here: the public calls and what the appliers share (`Ctx`, `Step`, `Facts`, and `step`,
//! which picks the applier for a `One`, any resource but an opening). The pass itself is `pass.rs`, its firewall step `firewall.rs`, the
//! second look at units `rising.rs`, holding what an adopted node was found with `adopt.rs`, and
//! the connections to the machine's managers `session.rs`; one file per resource type besides.

mod access;
mod action;
mod adopt;
mod archive;
mod container;
mod directory;
mod error;
mod file;
pub use file::declared_bytes;
mod into;
mod network;
mod opening;
mod outcome;
mod package;
mod pass;
mod process;
mod remove;
mod rising;
mod secret;
mod service;
mod session;
pub mod status;
mod user;

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;

pub use archive::ArchiveLimits;
/// For the `env_file` fuzz target (`fuzz/`): the parser of a container's env-file.
#[doc(hidden)]
pub use container::parse_env_file;
pub use container::{installed_steps, run_scheduled, spec_digest, ScheduledRun};
pub use error::{Aspect, Error, FirewalldMove, FoundUnreadable, Need, Target};
pub use file::NOT_KEPT;
pub use outcome::{Failure, HandEdit, Outcome, PassFailed, Report, Verb};
use pass::Pass;
use rising::Rising;
use session::Managers;
pub use session::Session;

use crate::declaration::{
    Access, Action, Archive, Container, Declaration, Digest, Directory, File, Id, Network, Opening, Package,
    Process, Resource, Service, Spec, User,
};
use crate::store::{Origin, Store};
use crate::system::docker::Docker;
use crate::system::{Fs, OwnerIds, Systemd};

/// How an apply is run.
#[derive(Clone, Debug)]
pub struct Options {
    /// Where the declaration came from: its records are written with this origin, and orphans are
    /// looked for among them.
    pub origin: Origin,
    /// Decide and report, change nothing (`plan`).
    pub dry_run: bool,
    /// Under `dry_run`, run each action's `verify` to decide whether its command would run
    /// (`plan --run-verify`); without it, `plan` runs no command and says the action is
    /// undecided. Ignored when not `dry_run`: `apply` and the daemon always run it.
    pub run_verify: bool,
    /// Where the original of a file the host has no record of is kept before it is first
    /// written over: `<originals>/<its path>` (the `kept` directory beside the store), once,
    /// never overwritten.
    pub originals: PathBuf,
    /// The D-Bus address of the systemd to manage (`unix:path=...`); the system bus when
    /// `None`.
    pub bus: Option<String>,
    /// The container runtime's socket (`unix:///run/podman/podman.sock`), when configured;
    /// otherwise `DOCKER_HOST`, Docker's default socket, then Podman's are tried.
    pub container_socket: Option<String>,
    /// How long an action's command or verify, or a run-once step, may run before it is
    /// stopped and fails; `None` for no limit.
    pub step_timeout: Option<std::time::Duration>,
    /// How much one archive may unpack.
    pub archive_limits: ArchiveLimits,
    /// The largest file found at a managed path whose original is kept whole, and the largest
    /// found file hashed unless the host wrote one of its size (`--keep-max-bytes`): past it
    /// only its size, mode and owner are recorded (docs/decisions.md, "A file found with no
    /// record").
    pub keep_max_bytes: u64,
    /// The daemon's content file, where the declared bytes of files are when the declaration
    /// says `stored` instead of holding them (`controller::contents`).
    pub contents: Option<std::sync::Arc<crate::system::ContentFile>>,
    /// The node's key file (`--key`): read once in a pass, when the first file carrying a
    /// secret must be written or compared, so a key made or rotated under the daemon is used
    /// from its next pass.
    pub key: PathBuf,
    /// Told before each resource of a pass, for a person watching (`apply` on a terminal).
    pub progress: Option<Progress>,
}

/// The default of `Options::keep_max_bytes`: 8 MiB.
pub const KEEP_MAX_BYTES: u64 = 8 << 20;

/// What a pass tells a watcher before each resource: how many it has done, of how many, and
/// the id of the one it starts. Called on the pass's thread, so it must be quick.
#[derive(Clone)]
pub struct Progress(pub std::sync::Arc<ProgressFn>);

/// (done, total, the id of the resource starting).
pub type ProgressFn = dyn Fn(usize, usize, &str) + Send + Sync;

impl std::fmt::Debug for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Progress")
    }
}

/// What a plan adds to a report: the diff of each file whose content would change.
#[derive(Clone, Debug, Default)]
pub struct Diffs(pub Vec<(String, String)>);

/// Applies the whole declaration: orphans, then every resource.
pub fn apply(declaration: &Declaration, store: &mut Store, opts: &Options) -> (Report, Diffs) {
    apply_in(&mut Session::default(), declaration, store, opts)
}

/// `apply`, with connections kept in `session`.
pub fn apply_in(
    session: &mut Session,
    declaration: &Declaration,
    store: &mut Store,
    opts: &Options,
) -> (Report, Diffs) {
    Pass::new(declaration, store, opts).run(None, session)
}

/// Reconciles some resources alone, with whatever names them in restart-on or reload-on
/// (transitively), in declaration order. A resource behind a gate that has not passed (an
/// action or run-once step not recorded at its current declaration) is not attempted. Orphans
/// are not looked for: that is a full apply's job.
pub fn reconcile(declaration: &Declaration, ids: &[Id], store: &mut Store, opts: &Options) -> Report {
    reconcile_in(&mut Session::default(), declaration, ids, store, opts)
}

/// `reconcile`, with connections kept in `session`.
pub fn reconcile_in(
    session: &mut Session,
    declaration: &Declaration,
    ids: &[Id],
    store: &mut Store,
    opts: &Options,
) -> Report {
    let selected = declaration.closure(ids);
    Pass::new(declaration, store, opts).run(Some(selected), session).0
}

/// Of these managed paths (each with its resource's id), those that may have moved since the
/// host last looked: all but the files whose change signature is exactly the one recorded for
/// them (untouched since, then: a signature is recorded only once it can be trusted to move on
/// the next change). Wherever the store keeps no signature (a directory, a file whose
/// signature was too fresh to trust, a resource never applied) only a reconcile can tell, so
/// the path is given. One `lstat` a path, no read, each directory opened once: cheap enough to
/// ask of every path of a directory whose watch was just made (the controller's look after
/// its watches are armed).
pub fn maybe_moved<'a>(
    store: &Store,
    paths: impl IntoIterator<Item = (&'a Id, &'a std::path::Path)>,
) -> Vec<&'a std::path::Path> {
    let mut fs = crate::system::Fs::new();
    paths
        .into_iter()
        .filter(|(id, path)| {
            let Some(recorded) = store.get(id.as_str()).and_then(|r| r.sig) else { return true };
            !matches!(
                fs.meta(path),
                Ok(Some(m)) if m.kind == crate::system::fs::Kind::File && m.sig == recorded
            )
        })
        .map(|(_, path)| path)
        .collect()
}

/// What the machine facts of a resource are after it applied: the store's record of it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Facts {
    wrote: Option<Digest>,
    mode: Option<u32>,
    owner: Option<(u32, u32)>,
    sig: Option<crate::system::Sig>,
    /// A file's signature as read back or found, when it is too fresh to trust yet (its change
    /// time within the kernel's coarse clock tick of now). A whole pass settles it at its end.
    fresh: Option<crate::system::Sig>,
    archive: Option<String>,
    /// For a process, or a container: the digest of the spec it was started or created with;
    /// see `store::Record::spec`.
    spec: Option<String>,
    /// What a container read at creation, by path.
    reads: BTreeMap<String, String>,
    /// A scheduled step's cron expression.
    schedule: Option<String>,
    /// For a file with `into`: what its keys held before the host set them.
    into: Option<crate::store::Merged>,
}

/// What an applier returns: done (with what to record, if anything), a file staged for the
/// next batch commit, or a unit just started that must still be running a moment later.
#[allow(
    clippy::large_enum_variant,
    reason = "Done is what nearly every applier returns, once per resource, moved straight into the report; boxing it would allocate for every resource to save a copy of a few hundred bytes"
)]
enum Step {
    Done(Outcome, Option<Facts>),
    Staged(Box<file::Pending>),
    Rising(Box<Rising>),
}

/// State shared by the appliers during one pass.
///
/// The pass is synchronous and always runs on a blocking thread of a tokio runtime (the CLI
/// and the controller both arrange it), so an applier that speaks an async protocol (Docker,
/// D-Bus) calls `tokio::runtime::Handle::current().block_on(..)`. Keeping the engine
/// synchronous keeps its ordering plain: one resource at a time, in declaration order.
struct Ctx<'a> {
    fs: Fs,
    owner_ids: OwnerIds,
    store: &'a Store,
    opts: &'a Options,
    diffs: Diffs,
    declaration: &'a Declaration,
    /// Ids that moved earlier in this pass: what restart-on and reload-on react to.
    changed: &'a HashSet<Id>,
    machine: &'a mut Managers,
}

impl Ctx<'_> {
    fn systemd(&mut self) -> Result<&Systemd, Error> {
        self.machine.systemd(self.opts.bus.as_deref())
    }

    fn docker(&mut self) -> Result<Docker, Error> {
        self.machine.docker(self.opts.container_socket.as_deref())
    }
}

/// The ids of `names` that moved earlier in this pass, for "restarted for ..." details.
fn named(names: &[Id], changed: &HashSet<Id>) -> Vec<String> {
    names.iter().filter(|id| changed.contains(*id)).map(|id| id.to_string()).collect()
}

fn begin(r: &Resource, action: Verb, detail: Option<String>) -> Outcome {
    Outcome { id: r.id.to_string(), kind: r.kind(), target: r.target(), action, detail, hand_edit: None }
}

/// A resource's spec as the pass steps it, one resource at a time: every type but the opening.
/// Openings are one filter, loaded by the firewall step once everything else is applied
/// (`opening::nft::apply`); the pass sets them aside as `One::of` hands them back, so `step` has
/// no opening arm to reach.
enum One<'r> {
    Directory(&'r Directory),
    File(&'r File),
    Access(&'r Access),
    Archive(&'r Archive),
    Package(&'r Package),
    Service(&'r Service),
    User(&'r User),
    Process(&'r Process),
    Action(&'r Action),
    Container(&'r Container),
    Network(&'r Network),
}

impl<'r> One<'r> {
    /// The spec as one the pass steps, or the opening it is, for the firewall step.
    fn of(spec: &'r Spec) -> Result<Self, &'r Opening> {
        Ok(match spec {
            Spec::Directory(d) => One::Directory(d),
            Spec::File(f) => One::File(f),
            Spec::Access(a) => One::Access(a),
            Spec::Archive(a) => One::Archive(a),
            Spec::Package(p) => One::Package(p),
            Spec::Service(s) => One::Service(s),
            Spec::User(u) => One::User(u),
            Spec::Process(p) => One::Process(p),
            Spec::Action(a) => One::Action(a),
            Spec::Container(c) => One::Container(c),
            Spec::Network(n) => One::Network(n),
            Spec::Opening(o) => return Err(o),
        })
    }
}

/// One resource, by its type.
fn step(ctx: &mut Ctx<'_>, r: &Resource, one: One<'_>) -> Result<Step, Error> {
    match one {
        One::Directory(d) => directory::apply(ctx, r, d),
        // Keys in a file that belongs to someone else: its own applier, which never writes the
        // file whole.
        One::File(f) if let Some(format) = f.into => into::apply(ctx, r, f, format),
        One::File(f) => file::apply(ctx, r, f),
        One::Access(a) => access::apply(ctx, r, a),
        One::Archive(a) => archive::apply(ctx, r, a),
        One::Package(p) => package::apply(ctx, r, p),
        One::Service(s) => service::apply(ctx, r, s),
        One::User(u) => user::apply(ctx, r, u),
        One::Process(p) => process::apply(ctx, r, p),
        One::Action(a) => action::apply(ctx, r, a),
        One::Container(c) => container::apply(ctx, r, c),
        One::Network(n) => network::apply(ctx, r, n),
    }
}
