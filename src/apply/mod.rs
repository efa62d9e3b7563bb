//! The apply: orphans first, then every resource in order, each compared, changed where it
//! differs, read back, and recorded only after it worked.
//!
//! Architecture Invariant: appliers decide and report; they reach the machine only through
//! `system`. They never write the store: the engine records a resource after its read-back
//! passed, and the caller persists the store once the pass is over.

mod access;
mod action;
mod adopt;
mod archive;
mod container;
mod directory;
mod error;
mod file;
pub use file::declared_bytes;
mod firewall;
mod firewalld;
mod into;
mod network;
mod opening;
mod outcome;
mod package;
mod process;
mod remove;
mod rising;
mod secret;
mod service;
mod session;
pub mod status;
mod user;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::PathBuf;

use adopt::{held_step, look_before, Found};
pub use archive::ArchiveLimits;
/// For the `env_file` fuzz target (`fuzz/`): the parser of a container's env-file.
#[doc(hidden)]
pub use container::parse_env_file;
pub use container::{installed_steps, run_scheduled, spec_digest, ScheduledRun};
pub use error::{Aspect, Error, Need, Target};
pub use outcome::{Failure, Outcome, PassFailed, Report, Verb};
use rising::Rising;
use session::Managers;
pub use session::Session;

use crate::declaration::{Declaration, Digest, Id, Kind, Resource, Spec};
use crate::store::{More, Origin, Record, Store};
use crate::system::docker::Docker;
use crate::system::{Fs, OwnerIds, Staged, Systemd};

/// How an apply is run.
#[derive(Clone, Debug)]
pub struct Options {
    /// Where the declaration came from: its records are written with this origin, and orphans are
    /// looked for among them.
    pub origin: Origin,
    /// Decide and report, change nothing (`plan`).
    pub dry_run: bool,
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

/// What the pass owns between steps and lends each applier in its `Ctx` (see
/// `Pass::with_ctx`): the file system with its batch of staged files, the owners resolved so
/// far, and the diffs a plan shows. Owned by the pass, not the context, because a context
/// borrows the pass's store and lives for one step only.
struct Lent {
    fs: Fs,
    owner_ids: OwnerIds,
    diffs: Diffs,
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

/// How many files are staged before a batch is committed. Bounded so that open descriptors
/// stay far below the default limit, and so a huge declaration does not hold every new
/// content in memory at once.
const BATCH: usize = 512;

/// How long after the latest fresh signature of a pass it is looked at again: past the
/// coarse tick that `Meta::trusted_sig` waits out, with a millisecond to spare.
const SIG_SETTLE: std::time::Duration = std::time::Duration::from_millis(51);

fn begin(r: &Resource, action: Verb, detail: Option<String>) -> Outcome {
    Outcome { id: r.id.to_string(), kind: r.kind(), target: r.target(), action, detail }
}

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

struct Pass<'a> {
    declaration: &'a Declaration,
    store: &'a mut Store,
    opts: &'a Options,
    slots: Vec<Option<Outcome>>,
    failures: Vec<Failure>,
    /// Ids that moved in this pass, for restart-on and reload-on. Only within one pass: a change
    /// already reflected must not restart a service on every later pass.
    changed: HashSet<Id>,
    pending: Vec<(usize, Box<file::Pending>)>,
    /// Units started in this pass awaiting their second look, with their slots.
    rising: Vec<(usize, usize, Box<Rising>)>,
    /// Orphan openings, left for the firewall step.
    orphan_openings: Vec<(String, Record)>,
    /// The slots of the declared openings, filled by the firewall step, by resource index.
    openings: Vec<(usize, usize)>,
    /// The firewall found in force on an adopted node (looked for first).
    found: opening::Found,
    /// Files recorded in this pass with a signature too fresh to trust: by index, with that
    /// signature, and when the latest was taken.
    untrusted_sigs: Vec<(usize, crate::system::Sig)>,
    latest_fresh: Option<std::time::Instant>,
}

impl<'a> Pass<'a> {
    fn new(declaration: &'a Declaration, store: &'a mut Store, opts: &'a Options) -> Pass<'a> {
        Pass {
            declaration,
            store,
            opts,
            slots: Vec::new(),
            failures: Vec::new(),
            changed: HashSet::new(),
            pending: Vec::new(),
            rising: Vec::new(),
            orphan_openings: Vec::new(),
            openings: Vec::new(),
            found: opening::Found::Nothing,
            untrusted_sigs: Vec::new(),
            latest_fresh: None,
        }
    }

    /// One pass: the firewall found in force looked for, what an adopted node holds decided,
    /// orphans removed, every resource stepped in declaration order, then what waits for the
    /// end of the pass (the last batch, the second look at units, the firewall, signatures).
    fn run(mut self, only: Option<BTreeSet<usize>>, session: &mut Session) -> (Report, Diffs) {
        if let Err(error) = self.look_for_firewall(only.as_ref()) {
            return (
                Report { outcomes: Vec::new(), error: Some(error), store_error: None },
                Diffs::default(),
            );
        }
        let fs = if self.opts.dry_run { Fs::new() } else { Fs::journaled(self.store.journal_path()) };
        let mut lent = Lent { fs, owner_ids: OwnerIds::default(), diffs: Diffs::default() };
        let mut machine = session.start();

        // What an adopted node holds is decided from the machine as it was before this pass
        // changed anything: a directory the pass makes as a file's parent was made, not found.
        if only.is_none() {
            self.release_holds();
        }
        let mut found = self.with_ctx(&mut lent, &mut machine, |ctx| look_before(ctx, only.as_ref()));
        if only.is_none() {
            self.remove_orphans(&mut lent.fs, &mut machine);
        }
        let gate_at = self.step_all(only.as_ref(), &mut found, &mut lent, &mut machine);
        self.finish(gate_at, only.is_none(), &mut lent.fs, &mut machine);
        session.end(machine, !self.failures.is_empty());
        (self.report(gate_at), lent.diffs)
    }

    /// Lends `lent` and `machine` to `f` in an applier's context, and takes them back after it:
    /// the context borrows the pass's store and its changed ids, so it lives only for the call.
    fn with_ctx<R>(&self, lent: &mut Lent, machine: &mut Managers, f: impl FnOnce(&mut Ctx<'_>) -> R) -> R {
        let mut ctx = Ctx {
            fs: std::mem::take(&mut lent.fs),
            owner_ids: std::mem::take(&mut lent.owner_ids),
            store: self.store,
            opts: self.opts,
            diffs: std::mem::take(&mut lent.diffs),
            declaration: self.declaration,
            changed: &self.changed,
            machine,
        };
        let result = f(&mut ctx);
        lent.fs = ctx.fs;
        lent.owner_ids = ctx.owner_ids;
        lent.diffs = ctx.diffs;
        result
    }

    /// Which gate, if any, holds back the rest when reconciling a part alone: the first one
    /// not recorded at its current declaration. A held gate is not closed: a full pass goes
    /// past it (held is not a failure), and it is never recorded while it is held.
    fn closed_gate(&self, only: Option<&BTreeSet<usize>>, found: &Found) -> Option<&'a Resource> {
        only.and_then(|_| {
            self.declaration.gates().find(|r| {
                self.store.get(r.id.as_str()).is_none_or(|rec| rec.declared != r.digest)
                    && held_step(self.declaration, found, r).is_none()
            })
        })
    }

    /// Steps every resource of the pass (all of them, or those `only` names) in declaration
    /// order, telling the progress callback of each, until a gate stops the pass: a closed gate
    /// before a resource, or a gate that failed. Returns where that gate's failure is in
    /// `failures`, for the report to name it.
    fn step_all(
        &mut self,
        only: Option<&BTreeSet<usize>>,
        found: &mut Found,
        lent: &mut Lent,
        machine: &mut Managers,
    ) -> Option<usize> {
        let closed_gate = self.closed_gate(only, found);
        let total = only.map_or(self.declaration.resources.len(), BTreeSet::len);
        let mut done = 0;
        let declaration = self.declaration;
        for resource in &declaration.resources {
            if let Some(only) = only {
                if !only.contains(&resource.index) {
                    continue;
                }
            }
            if let Some(progress) = &self.opts.progress {
                (progress.0)(done, total, resource.id.as_str());
            }
            done += 1;
            if let Some(gate) = closed_gate {
                if resource.index > gate.index {
                    self.failures.push(Failure {
                        id: gate.id.to_string(),
                        kind: gate.kind(),
                        target: gate.target(),
                        message: format!(
                            "this gate has not passed at its current declaration, so {} was not attempted",
                            resource.id
                        ),
                        raced: false,
                    });
                    return Some(self.failures.len() - 1);
                }
            }
            if let Some(gate_at) = self.step_one(resource, found, lent, machine) {
                return Some(gate_at);
            }
        }
        None
    }

    /// Steps one resource: an opening set aside for the firewall step, and anything else
    /// applied (or held as found) once what it may depend on is finished, then noted. Returns
    /// where its failure is in `failures` when it is a gate that failed: the rest of the pass
    /// is then not attempted.
    fn step_one(
        &mut self,
        resource: &Resource,
        found: &mut Found,
        lent: &mut Lent,
        machine: &mut Managers,
    ) -> Option<usize> {
        // The filter is made from every opening at once, after everything else.
        if matches!(resource.spec, Spec::Opening(_)) {
            self.openings.push((resource.index, self.slots.len()));
            self.slots.push(None);
            return None;
        }
        // Files are committed in batches; anything that is not a file or directory may
        // depend on them (a service restarted on a file), so the batch is finished first.
        if !matches!(resource.kind(), Kind::File | Kind::Directory) || self.pending.len() >= BATCH {
            self.flush(&mut lent.fs);
        }
        // A gate (an action, a run-once step) may depend on the units started before it:
        // they settle first, as they did when each start held the pass.
        if resource.spec.is_gate() {
            self.second_look(machine);
        }
        let (result, remember) = match self.hold(found, resource) {
            Some(held) => held,
            None => (self.with_ctx(lent, machine, |ctx| step(ctx, resource)), None),
        };
        if let (Some(held), false) = (remember, self.opts.dry_run) {
            self.store.hold(resource.id.as_str(), held);
        }
        self.note(resource, result)
    }

    /// Notes how one resource's step went: done and recorded, staged for the next batch, or
    /// started and awaiting its second look; or failed. Returns where the failure is in
    /// `failures` when the resource is a gate that failed.
    fn note(&mut self, resource: &Resource, result: Result<Step, Error>) -> Option<usize> {
        match result {
            Ok(Step::Done(outcome, facts)) => self.done(resource, outcome, facts),
            Ok(Step::Staged(p)) => {
                self.pending.push((self.slots.len(), p));
                self.slots.push(None);
            }
            Ok(Step::Rising(rising)) => {
                // It moved now, whatever the second look finds: what restarts on it must see
                // that in this pass.
                if rising.outcome.action.moved() {
                    self.changed.insert(resource.id.clone());
                }
                self.rising.push((self.slots.len(), resource.index, rising));
                self.slots.push(None);
            }
            Err(e) => {
                self.fail(resource, &e);
                if resource.spec.is_gate() {
                    return Some(self.failures.len() - 1);
                }
            }
        }
        None
    }

    /// What waits for the end of the pass, whether or not a gate stopped it: the last batch
    /// committed and made durable, the second look at the units started, the firewall step
    /// (or, past a failed gate, the openings set aside saying why), and on a whole pass the
    /// signatures that were too fresh to record.
    fn finish(&mut self, gate_at: Option<usize>, whole: bool, fs: &mut Fs, machine: &mut Managers) {
        self.flush(fs);
        // Directories made since the last batch (a directory resource alone, say), durable
        // before the store records them; what is in one that could not be made durable fails.
        for (parent, why) in fs.make_durable() {
            self.undurable(&parent, &Error::from(why));
        }
        if fs.journal_written() {
            self.store.journaled();
        }
        self.second_look(machine);
        if gate_at.is_some() {
            self.firewall_held_by_gate();
        } else if !self.openings.is_empty() || !self.orphan_openings.is_empty() {
            self.firewall();
        }
        if whole {
            self.trust_signatures(fs);
        }
    }

    /// The pass's report: every outcome in its slot's order, and the error if anything failed.
    /// `gate_at` is where the failure of the gate that closed the pass is, if one did: the
    /// report's error is that gate's own, whatever failed before it.
    fn report(self, gate_at: Option<usize>) -> Report {
        let outcomes: Vec<Outcome> = self.slots.into_iter().flatten().collect();
        let error = (!self.failures.is_empty()).then(|| {
            // A gate's failure is the one that matters: it is why the rest was not attempted,
            // and the error says "it is a gate" of whatever it names. Otherwise the first.
            let named = &self.failures[gate_at.unwrap_or(0)];
            PassFailed {
                resource: named.id.clone(),
                message: named.message.clone(),
                others: self.failures.len() - 1,
                gated: gate_at.is_some(),
                failures: self.failures.clone(),
            }
        });
        Report { outcomes, error, store_error: None }
    }

    /// Removes orphans, in reverse of their declared order, before anything is applied: a
    /// resource renamed at the same path must not have its new file deleted after it was
    /// written. A record whose id is still declared but now names another target or type is
    /// treated the same way, since what it left behind is no longer declared by anything.
    fn remove_orphans(&mut self, fs: &mut Fs, machine: &mut Managers) {
        let mut orphans = self.store.orphans(self.declaration, self.opts.origin);
        let mut displaced: Vec<(String, Record)> = self
            .declaration
            .resources
            .iter()
            .filter_map(|r| {
                let rec = self.store.get(r.id.as_str())?;
                (rec.origin == self.opts.origin && (rec.kind != r.kind() || *rec.target != *r.target()))
                    .then(|| (r.id.to_string(), rec.clone()))
            })
            .collect();
        orphans.append(&mut displaced);
        orphans.sort_by_key(|o| std::cmp::Reverse(o.1.position));
        // Openings leave the filter last, in the firewall step's one load: taking a port out of
        // the filter first would close it while the rest of the pass may still fail. An opening
        // whose port or protocol changed under the same id is simply loaded anew.
        let (openings, orphans): (Vec<_>, Vec<_>) =
            orphans.into_iter().partition(|o| o.1.kind == Kind::Opening);
        self.orphan_openings =
            openings.into_iter().filter(|(id, _)| self.declaration.find(id).is_none()).collect();
        for (id, record) in orphans {
            let result = remove::remove(fs, machine, &record, self.opts);
            self.orphan_told(id, record, result);
        }
    }

    /// How the removal of an orphan went, reported; its record forgotten once it is gone.
    fn orphan_told(&mut self, id: String, record: Record, result: Result<(Verb, Option<String>), Error>) {
        match result {
            Ok((action, detail)) => {
                // A network kept because something undeclared still uses it stays recorded,
                // so it is removed at a later apply once nothing does, instead of leaking.
                let retry = record.kind == Kind::Network && action == Verb::Kept;
                if !self.opts.dry_run && !retry {
                    self.store.forget(&id);
                }
                self.slots.push(Some(Outcome {
                    id,
                    kind: record.kind,
                    target: record.target.into(),
                    action,
                    detail,
                }));
            }
            Err(e) => self.failures.push(Failure {
                id,
                kind: record.kind,
                target: record.target.into(),
                message: format!("removing what is no longer declared: {e}"),
                raced: false,
            }),
        }
    }

    fn done(&mut self, r: &Resource, outcome: Outcome, facts: Option<Facts>) {
        let outcome = self.record(r, outcome, facts);
        self.slots.push(Some(outcome));
    }

    /// Notes a resource that worked: marks it changed if it moved, and records it.
    fn record(&mut self, r: &Resource, outcome: Outcome, facts: Option<Facts>) -> Outcome {
        if outcome.action.moved() {
            self.changed.insert(r.id.clone());
        }
        if let (Some(facts), false) = (facts, self.opts.dry_run) {
            if let (None, Some(fresh)) = (facts.sig, facts.fresh) {
                self.untrusted_sigs.push((r.index, fresh));
                self.latest_fresh = Some(std::time::Instant::now());
            }
            // Only now: the read-back passed. The record follows the fact.
            self.store.record(
                r.id.as_str(),
                Record {
                    origin: self.opts.origin,
                    kind: r.kind(),
                    target: r.target().into_boxed_str(),
                    position: u32::try_from(r.index).expect("fewer than 2^32 resources"),
                    declared: r.digest,
                    applied_at: 0,
                    wrote: facts.wrote,
                    mode: facts.mode,
                    owner: facts.owner,
                    sig: facts.sig,
                    more: More {
                        archive: facts.archive,
                        spec: facts.spec,
                        reads: facts.reads,
                        schedule: facts.schedule,
                        into: facts.into,
                    }
                    .boxed(),
                },
            );
        }
        outcome
    }

    /// Signs the files this pass wrote (or found as declared) while their change times were too
    /// fresh to trust, so the next pass need not read them again: once the coarse clock tick
    /// has passed since the latest, each is looked at once more, and its signature is recorded
    /// only if it is still exactly the one taken when the content was read back. Anything that
    /// touched the file since then in a later tick moved its change time, and leaves it
    /// unsigned: the next pass reads it. Only a whole pass does this; a reconcile of one file
    /// in the daemon does not wait for the tick, and its next resync reads that one file.
    fn trust_signatures(&mut self, fs: &mut Fs) {
        let Some(latest) = self.latest_fresh.take() else { return };
        std::thread::sleep((latest + SIG_SETTLE).saturating_duration_since(std::time::Instant::now()));
        let declaration = self.declaration;
        for (index, fresh) in std::mem::take(&mut self.untrusted_sigs) {
            let resource = &declaration.resources[index];
            let Some(path) = resource.spec.path() else { continue };
            // A file that cannot be looked at now is simply left unsigned: read next time.
            let Ok(Some(meta)) = fs.meta(path) else { continue };
            if meta.sig == fresh {
                if let Some(sig) = meta.trusted_sig() {
                    self.store.sign(resource.id.as_str(), sig);
                }
            }
        }
    }

    /// Fails every resource of this pass at or under `parent`, whose new entries could not be
    /// made durable: in place, but not known to survive a crash, so not reported as done.
    fn undurable(&mut self, parent: &std::path::Path, e: &Error) {
        let declaration = self.declaration;
        for r in &declaration.resources {
            if !r.spec.path().is_some_and(|p| p.starts_with(parent)) {
                continue;
            }
            let Some(slot) =
                self.slots.iter_mut().find(|o| o.as_ref().is_some_and(|o| o.id == r.id.as_str()))
            else {
                continue;
            };
            *slot = None;
            self.fail(r, e);
        }
    }

    fn fail(&mut self, r: &Resource, e: &Error) {
        self.failures.push(Failure {
            id: r.id.to_string(),
            kind: r.kind(),
            target: r.target(),
            message: e.to_string(),
            raced: e.raced(),
        });
    }

    /// Commits the staged files, reads each back, and records those that passed.
    fn flush(&mut self, fs: &mut Fs) {
        if self.pending.is_empty() {
            return;
        }
        let mut pending = std::mem::take(&mut self.pending);
        // The originals kept before their files are written over go first, all in one commit
        // (one sync, where a copy committed on its own cost two fsyncs: adopting a node of
        // 10,000 found files waited on 20,000 of them). A file whose copy could not be kept is
        // not written: the original could not be had back otherwise.
        let (copies, owners): (Vec<Staged>, Vec<usize>) = pending
            .iter_mut()
            .enumerate()
            .filter_map(|(at, (_, p))| p.kept.take().map(|copy| (copy, at)))
            .unzip();
        if !copies.is_empty() {
            let failed: Vec<(usize, Error)> = fs
                .commit_copies(copies)
                .into_iter()
                .zip(owners)
                .filter_map(|(result, at)| result.err().map(|e| (at, Error::from(e))))
                .collect();
            for (at, e) in failed.iter().rev() {
                // The file's own staged write goes when it drops, its temporary file with it.
                let (_, p) = pending.remove(*at);
                self.fail(&self.declaration.resources[p.checked.index], e);
            }
        }
        let (slots, pending): (Vec<usize>, Vec<Box<file::Pending>>) = pending.into_iter().unzip();
        let (staged, rest): (Vec<Staged>, Vec<file::Checked>) =
            pending.into_iter().map(|p| (p.staged, p.checked)).unzip();
        // What the batch is about to leave, durable before any of it is renamed into place, so
        // that after a crash the host knows its own unfinished work from a hand-edit.
        if let Err(e) = fs.intend(rest.iter().map(file::Checked::intent).collect()) {
            // Nothing was renamed; the temporary files go when `staged` drops.
            let e = Error::from(e);
            for checked in &rest {
                self.fail(&self.declaration.resources[checked.index], &e);
            }
            return;
        }
        let committed = fs.commit(staged);
        for ((slot, result), checked) in slots.into_iter().zip(committed).zip(rest) {
            let resource = &self.declaration.resources[checked.index];
            let outcome = result.map_err(Error::from).and_then(|()| file::read_back(fs, &checked));
            match outcome {
                Ok((outcome, facts)) => {
                    let outcome = self.record(resource, outcome, Some(facts));
                    self.slots[slot] = Some(outcome);
                }
                Err(e) => self.fail(resource, &e),
            }
        }
    }
}

/// One resource, by its type.
fn step(ctx: &mut Ctx<'_>, r: &Resource) -> Result<Step, Error> {
    match &r.spec {
        Spec::Directory(d) => directory::apply(ctx, r, d),
        // Keys in a file that belongs to someone else: its own applier, which never writes the
        // file whole.
        Spec::File(f) if f.into.is_some() => into::apply(ctx, r, f),
        Spec::File(f) => file::apply(ctx, r, f),
        Spec::Access(a) => access::apply(ctx, r, a),
        Spec::Archive(a) => archive::apply(ctx, r, a),
        Spec::Package(p) => package::apply(ctx, r, p),
        Spec::Service(s) => service::apply(ctx, r, s),
        Spec::User(u) => user::apply(ctx, r, u),
        Spec::Process(p) => process::apply(ctx, r, p),
        Spec::Action(a) => action::apply(ctx, r, a),
        Spec::Container(c) => container::apply(ctx, r, c),
        Spec::Network(n) => network::apply(ctx, r, n),
        // Openings are one filter, loaded by the firewall step once everything else is applied
        // (`opening::apply`); the pass sets them aside and never steps them one by one.
        Spec::Opening(_) => unreachable!("the pass sets openings aside for the firewall step"),
    }
}
