//! One pass: orphans removed, every resource stepped in declaration order, files committed in
//! batches and read back, each recorded only after it worked, and the report. Apart from
//! `mod.rs` so that the engine's loop reads on its own, under the public calls that start it.

use std::collections::{BTreeSet, HashSet};

use super::adopt::{acts_on_held, held_step, look_before, Found};
use super::{
    file, opening, remove, step, Ctx, Diffs, Error, Facts, Failure, Managers, One, Options, Outcome,
    PassFailed, Report, Rising, Session, Step, Verb,
};
use crate::declaration::{Declaration, Id, Kind, Resource};
use crate::store::{More, Record, Store};
use crate::system::{Fs, OwnerIds, Staged};

/// What the pass owns between steps and lends each applier in its `Ctx` (see
/// `Pass::with_ctx`): the file system with its batch of staged files, the owners resolved so
/// far, and the diffs a plan shows. Owned by the pass, not the context, because a context
/// borrows the pass's store and lives for one step only.
struct Lent {
    fs: Fs,
    owner_ids: OwnerIds,
    diffs: Diffs,
}

/// How many files are staged before a batch is committed. Bounded so that open descriptors
/// stay far below the default limit, and so a huge declaration does not hold every new
/// content in memory at once.
const BATCH: usize = 512;

/// How long after the latest fresh signature of a pass it is looked at again: past the
/// coarse tick that `Meta::trusted_sig` waits out, with a millisecond to spare.
const SIG_SETTLE: std::time::Duration = std::time::Duration::from_millis(51);

pub(super) struct Pass<'a> {
    pub(super) declaration: &'a Declaration,
    pub(super) store: &'a mut Store,
    pub(super) opts: &'a Options,
    pub(super) slots: Vec<Option<Outcome>>,
    pub(super) failures: Vec<Failure>,
    /// Ids that moved in this pass, for restart-on and reload-on. Only within one pass: a change
    /// already reflected must not restart a service on every later pass.
    changed: HashSet<Id>,
    pending: Vec<(usize, Box<file::Pending>)>,
    /// Units started in this pass awaiting their second look, with their slots.
    pub(super) rising: Vec<(usize, usize, Box<Rising>)>,
    /// Orphan openings, left for the firewall step.
    pub(super) orphan_openings: Vec<(String, Record)>,
    /// The slots of the declared openings, filled by the firewall step, by resource index.
    pub(super) openings: Vec<(usize, usize)>,
    /// The firewall found in force on an adopted node (looked for first).
    pub(super) found: opening::Found,
    /// Files recorded in this pass with a signature too fresh to trust: by index, with that
    /// signature, and when the latest was taken.
    untrusted_sigs: Vec<(usize, crate::system::Sig)>,
    latest_fresh: Option<std::time::Instant>,
    /// Ids whose hold was let go at the start of this pass because their module is now taken:
    /// their outcomes say they were taken over.
    pub(super) taken_over: HashSet<String>,
}

impl<'a> Pass<'a> {
    pub(super) fn new(declaration: &'a Declaration, store: &'a mut Store, opts: &'a Options) -> Pass<'a> {
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
            taken_over: HashSet::new(),
        }
    }

    /// One pass: the firewall found in force looked for, what an adopted node holds decided,
    /// orphans removed, every resource stepped in declaration order, then what waits for the
    /// end of the pass (the last batch, the second look at units, the firewall, signatures).
    pub(super) fn run(mut self, only: Option<BTreeSet<usize>>, session: &mut Session) -> (Report, Diffs) {
        if let Err(error) = self.look_for_firewall(only.as_ref()) {
            return (
                Report { outcomes: Vec::new(), error: Some(error), store_error: None },
                Diffs::default(),
            );
        }
        let fs = match (self.opts.dry_run, self.store.after_a_crash()) {
            (true, _) => Fs::new(),
            (false, false) => Fs::journaled(self.store.journal_path()),
            (false, true) => Fs::journaled(self.store.journal_path()).after_a_crash(),
        };
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
                    && acts_on_held(self.declaration, found, r).is_none()
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
        let declaration = self.declaration;
        // A reconcile of a few keys walks those keys, not the whole declaration: a correction
        // costs the same on a node of a thousand resources as on one of a hundred thousand.
        let selected: Box<dyn Iterator<Item = &Resource>> = match only {
            Some(only) => Box::new(only.iter().map(|&i| &declaration.resources[i])),
            None => Box::new(declaration.resources.iter()),
        };
        for (done, resource) in selected.enumerate() {
            if let Some(progress) = &self.opts.progress {
                (progress.0)(done, total, resource.id.as_str());
            }
            if let Some(gate) = closed_gate {
                if resource.index() > gate.index() {
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
        let Ok(one) = One::of(&resource.spec) else {
            self.openings.push((resource.index(), self.slots.len()));
            self.slots.push(None);
            return None;
        };
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
            None => (self.with_ctx(lent, machine, |ctx| step(ctx, resource, one)), None),
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
                self.rising.push((self.slots.len(), resource.index(), rising));
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
            self.firewall(whole);
        }
        if whole {
            self.trust_signatures(fs);
            self.sweep_after_a_crash(fs);
        }
    }

    /// After a pass that did not finish, the directories of every file, directory and archive
    /// declared or recorded are cleared of the temporary files it left, beyond those this pass
    /// staged in (`Fs::after_a_crash`): a temporary can outlive the journal line that named its
    /// directory (docs/durability.md, "Crashes"). Only after a crash: it reads each directory.
    fn sweep_after_a_crash(&mut self, fs: &mut Fs) {
        if fs.swept().is_none() {
            return;
        }
        let declared = self.declaration.resources.iter().map(|r| (r.kind(), r.target()));
        let recorded = self.store.records().map(|(_, r)| (r.kind, r.target.to_string()));
        let mut dirs = std::collections::BTreeSet::new();
        for (kind, target) in declared.chain(recorded) {
            let path = std::path::PathBuf::from(target);
            match kind {
                Kind::File => dirs.extend(path.parent().map(std::path::Path::to_path_buf)),
                Kind::Directory | Kind::Archive => {
                    dirs.extend(path.parent().map(std::path::Path::to_path_buf));
                    dirs.insert(path);
                }
                // Nothing of these is staged as a temporary file beside a path.
                Kind::Access
                | Kind::Package
                | Kind::Service
                | Kind::Container
                | Kind::Network
                | Kind::User
                | Kind::Process
                | Kind::Action
                | Kind::Opening => {}
            }
        }
        for dir in &dirs {
            if let Err(error) = fs.sweep(dir) {
                tracing::warn!(directory = %dir.display(), %error, "cannot clear the temporary files a crashed pass left");
            }
        }
        if let Some((directories, removed)) = fs.swept() {
            tracing::info!(
                directories,
                temporary_files_removed = removed,
                "the directories of the declaration were cleared of the temporary files the unfinished pass left"
            );
        }
    }

    /// The pass's report: every outcome in its slot's order, and the error if anything failed.
    /// `gate_at` is where the failure of the gate that closed the pass is, if one did: the
    /// report's error is that gate's own, whatever failed before it.
    fn report(self, gate_at: Option<usize>) -> Report {
        let mut outcomes: Vec<Outcome> = self.slots.into_iter().flatten().collect();
        // The hand-over from the operator to the host, in the report of the pass that made it.
        for o in outcomes.iter_mut().filter(|o| self.taken_over.contains(&o.id)) {
            const TAKEN: &str = "taken over: held as found until its module was taken";
            o.detail = Some(match o.detail.take() {
                Some(detail) => format!("{TAKEN}; {detail}"),
                None => TAKEN.to_owned(),
            });
        }
        let error = (!self.failures.is_empty()).then(|| {
            // A gate's failure is the one that matters: it is why the rest was not attempted,
            // and the error says "it is a gate" of whatever it names. Otherwise the first.
            let named = &self.failures[gate_at.unwrap_or(0)];
            PassFailed {
                resource: named.id.clone(),
                message: named.message.clone(),
                others: self.failures.len() - 1,
                gated: gate_at.is_some(),
                refused: false,
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
    pub(super) fn orphan_told(
        &mut self,
        id: String,
        record: Record,
        result: Result<(Verb, Option<String>), Error>,
    ) {
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
                    target: record.target.to_string(),
                    action,
                    detail,
                    hand_edit: None,
                }));
            }
            Err(e) => self.failures.push(Failure {
                id,
                kind: record.kind,
                target: record.target.to_string(),
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
    pub(super) fn record(&mut self, r: &Resource, outcome: Outcome, facts: Option<Facts>) -> Outcome {
        if outcome.action.moved() {
            self.changed.insert(r.id.clone());
        }
        if let (Some(facts), false) = (facts, self.opts.dry_run) {
            if let (None, Some(fresh)) = (facts.sig, facts.fresh) {
                self.untrusted_sigs.push((r.index(), fresh));
                self.latest_fresh = Some(std::time::Instant::now());
            }
            // Only now: the read-back passed. The record follows the fact.
            self.store.record(
                r.id.as_str(),
                Record {
                    origin: self.opts.origin,
                    kind: r.kind(),
                    target: r.spec.target_shared(),
                    position: u32::try_from(r.index()).expect("fewer than 2^32 resources"),
                    declared: r.digest,
                    applied_at: 0,
                    wrote: facts.wrote,
                    mode: facts.mode.map(crate::store::mode_bits),
                    owner: facts.owner.map(crate::store::owned),
                    sig: facts.sig,
                    more: More {
                        archive: facts.archive,
                        spec: facts.spec,
                        reads: facts.reads,
                        schedule: facts.schedule,
                        into: facts.into,
                        holds: r.spec.holds(),
                    }
                    .boxed(),
                },
            );
        }
        // After the record: the hold goes once the thing is the host's (`adopt`).
        self.let_go_when_taken(r, &outcome);
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
            // Its record was made when it was done: one that this pass changed goes, so the
            // store claims nothing not known to survive a crash; the next pass finds what is
            // there and records it then. A record this pass left as it was stays.
            if self.changed.contains(&r.id) {
                self.store.forget(r.id.as_str());
            }
            self.fail(r, e);
        }
    }

    pub(super) fn fail(&mut self, r: &Resource, e: &Error) {
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
