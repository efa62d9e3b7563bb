//! Holding what an adopted node was found with: what a module not yet taken describes and is
//! already present is reported and left as found, and what would act on it does not run. Apart
//! because it decides, before and beside the appliers, whether a resource is applied at all.

use std::collections::{BTreeSet, HashSet};
use std::path::Path;

use super::{begin, container, process, Ctx, Error, Outcome, Pass, Step, Verb};
use crate::declaration::{Declaration, Id, Kind, Resource, Spec};

/// What an adopted node held before a pass changed anything, for the resources it may hold.
#[derive(Default)]
pub(super) struct Found {
    /// By resource index: found present with no record of the host making it, or the error
    /// looking. Taken out when the resource is reached.
    present: std::collections::HashMap<usize, Result<bool, Error>>,
    /// Modules not taken that hold something (held before, or found now): their actions and
    /// steps would act on it, so they do not run.
    modules: HashSet<String>,
    /// Names of containers held: an action run `in` one does not run.
    containers: HashSet<String>,
    /// Everything held, remembered or found now, indexed for what a resource of a module not
    /// taken must not act on, write into or run over (`acts_on_held`): each question is a few
    /// lookups, not a scan of every hold, so adopting ten thousand found files beside ten
    /// thousand new resources stays linear.
    held: Held,
}

/// What is held, by the questions `acts_on_held` asks of it.
#[derive(Default)]
struct Held {
    /// Ids of everything held: what restarts or reloads on one is held.
    ids: HashSet<String>,
    /// Held files, directories and archives by path, with their id and type.
    paths: std::collections::HashMap<std::path::PathBuf, (String, Kind)>,
    /// Each strict ancestor of a held path, with the first held path found beneath it: a mount
    /// of the ancestor would run over it.
    above: std::collections::HashMap<std::path::PathBuf, (String, String)>,
    /// Held files by their file name, with their id and path: a unit file is found by its unit.
    files_named: std::collections::HashMap<String, (String, String)>,
}

impl Found {
    /// Notes that `id` is held, with its type and what it names on the machine.
    fn hold_seen(&mut self, id: &str, kind: Kind, target: &str) {
        let held = &mut self.held;
        held.ids.insert(id.to_owned());
        if !matches!(kind, Kind::File | Kind::Directory | Kind::Archive) {
            return;
        }
        let path = Path::new(target);
        held.paths.entry(path.to_path_buf()).or_insert_with(|| (id.to_owned(), kind));
        for up in path.ancestors().skip(1) {
            held.above.entry(up.to_path_buf()).or_insert_with(|| (id.to_owned(), target.to_owned()));
        }
        if let (Kind::File, Some(name)) = (kind, path.file_name().and_then(|n| n.to_str())) {
            held.files_named.entry(name.to_owned()).or_insert_with(|| (id.to_owned(), target.to_owned()));
        }
    }

    /// The held path nearest to `p` at or above it whose type `fits`, as `(id, target)`.
    fn at_or_above(&self, p: &Path, skip_self: bool, fits: impl Fn(Kind) -> bool) -> Option<(&str, &str)> {
        p.ancestors().skip(usize::from(skip_self)).find_map(|up| {
            let (path, (id, kind)) = self.held.paths.get_key_value(up)?;
            fits(*kind).then(|| (id.as_str(), path.to_str().unwrap_or_default()))
        })
    }

    /// A held path `p` overlaps: the path itself, one it is inside, or one inside it.
    fn path_over(&self, p: &Path) -> Option<(&str, &str)> {
        self.at_or_above(p, false, |_| true)
            .or_else(|| self.held.above.get(p).map(|(id, target)| (id.as_str(), target.as_str())))
    }

    /// A held directory (or an archive's, which is one) that `p` is inside.
    fn directory_around(&self, p: &Path) -> Option<(&str, &str)> {
        self.at_or_above(p, true, |kind| matches!(kind, Kind::Directory | Kind::Archive))
    }

    /// A held file named `name` (a unit file, by its unit), as `(id, path)`.
    fn file_named(&self, name: &str) -> Option<(&str, &str)> {
        self.held.files_named.get(name).map(|(id, path)| (id.as_str(), path.as_str()))
    }

    /// A held resource among `ids`.
    fn among(&self, ids: &[Id]) -> Option<&str> {
        ids.iter().find_map(|id| self.held.ids.get(id.as_str())).map(String::as_str)
    }
}

/// Why a resource of a module not taken is held because of what it would act on, or `None`:
/// it would write into a held directory (a file, a directory, an archive), mount or read a
/// held path (a container), run a program from one (a process), be restarted or reloaded by a
/// held resource (a container, a process, a service), or be a service whose unit file is held.
/// The spec's "the host never runs anything inside what it does not own yet", for every type
/// (docs/decisions.md, "Adoption"). Decided at each pass, never remembered: what it would act
/// on is what is held.
pub(super) fn acts_on_held(declaration: &Declaration, found: &Found, r: &Resource) -> Option<String> {
    let adoption = declaration.adoption.as_ref()?;
    let module = r.id.module();
    if found.held.ids.is_empty() || adoption.taken.iter().any(|m| m == module) {
        return None;
    }
    let tail =
        format!("held as found until its module is taken; module {module:?} is not taken yet: not applied");
    let into = |p: &Path| {
        found
            .directory_around(p)
            .map(|(id, dir)| format!("it would be written into directory {dir} ({id}), {tail}"))
    };
    let restarted = |ids: &[Id], verb: &str| {
        found.among(ids).map(|id| format!("it would be {verb} by a change of {id}, which is {tail}"))
    };
    match &r.spec {
        Spec::File(f) => into(f.path.as_path()),
        Spec::Directory(d) => into(d.path.as_path()),
        Spec::Archive(a) => into(a.path.as_path()),
        Spec::Container(_) => r
            .spec
            .reads()
            .into_iter()
            .find_map(|p| {
                found.path_over(p).map(|(id, over)| {
                    format!("it would mount or read {} over {over} ({id}), {tail}", p.display())
                })
            })
            .or_else(|| restarted(r.spec.restart_on(), "restarted")),
        Spec::Process(p) => {
            let program = Path::new(p.command.as_slice().first().map_or("", String::as_str));
            program
                .is_absolute()
                .then(|| found.path_over(program))
                .flatten()
                .map(|(id, over)| format!("it would run {} from {over} ({id}), {tail}", program.display()))
                .or_else(|| restarted(r.spec.restart_on(), "restarted"))
        }
        Spec::Service(s) => found
            .file_named(s.unit.as_str())
            .map(|(id, file)| format!("its unit file {file} ({id}) is {tail}"))
            .or_else(|| restarted(r.spec.restart_on(), "restarted"))
            .or_else(|| restarted(r.spec.reload_on(), "reloaded")),
        Spec::Access(_)
        | Spec::Package(_)
        | Spec::User(_)
        | Spec::Action(_)
        | Spec::Network(_)
        | Spec::Opening(_) => None,
    }
}

/// Why an action or step is held on an adopted node, or `None` when it runs: it would run
/// inside a held container (whatever its module), or its module is not taken and holds
/// something it would act on. Decided at each pass, never remembered: a step has nothing of its
/// own to find.
pub(super) fn held_step(declaration: &Declaration, found: &Found, r: &Resource) -> Option<String> {
    let adoption = declaration.adoption.as_ref()?;
    let module = r.id.module();
    let step = match &r.spec {
        Spec::Action(a) => {
            if let Some(name) = a.in_container.as_ref().filter(|c| found.containers.contains(c.as_str())) {
                return Some(format!(
                    "it would run inside container {name}, which is held as found until its module is taken: not run"
                ));
            }
            true
        }
        Spec::Container(c) => c.run_once || c.schedule.is_some(),
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
    };
    (step && !adoption.taken.iter().any(|m| m == module) && found.modules.contains(module)).then(|| {
        format!("module {module:?} is not taken yet, and what it would act on is held as found: not run")
    })
}

/// Looks, before anything in the pass, at what each resource of a module not yet taken would
/// find: the answer `Pass::hold` gives when the resource is reached. Only on an adopted node,
/// and only for resources with no record and no hold already.
pub(super) fn look_before(ctx: &mut Ctx<'_>, only: Option<&BTreeSet<usize>>) -> Found {
    let mut found = Found::default();
    let Some(adoption) = ctx.declaration.adoption.as_ref() else { return found };
    let untaken = |r: &Resource| !adoption.taken.iter().any(|m| m == r.id.module());
    for (id, h) in ctx.store.holds() {
        let Some(r) = ctx.declaration.find(id).filter(|r| untaken(r)) else { continue };
        found.modules.insert(r.id.module().to_owned());
        if h.kind == Kind::Container {
            found.containers.insert(h.target.to_string());
        }
        found.hold_seen(id, h.kind, &h.target);
    }
    let declaration = ctx.declaration;
    // The selected resources only, found by index: not a scan of the declaration per correction.
    let selected: Box<dyn Iterator<Item = &Resource>> = match only {
        Some(only) => Box::new(only.iter().map(|&i| &declaration.resources[i])),
        None => Box::new(declaration.resources.iter()),
    };
    for r in selected {
        if !untaken(r) || ctx.store.get(r.id.as_str()).is_some() || ctx.store.held(r.id.as_str()).is_some() {
            continue;
        }
        let Some(present) = present(ctx, r) else { continue };
        if matches!(present, Ok(true)) {
            found.modules.insert(r.id.module().to_owned());
            if let Spec::Container(c) = &r.spec {
                found.containers.insert(c.name.to_string());
            }
            found.hold_seen(r.id.as_str(), r.kind(), &r.target());
        }
        found.present.insert(r.index(), present);
    }
    found
}

/// Whether what a resource describes is on the machine with no record of the host making it
/// (under any id); `None` for what has nothing of its own to find (an access path, an action, a
/// step, an opening).
fn present(ctx: &mut Ctx<'_>, r: &Resource) -> Option<Result<bool, Error>> {
    let path_present = |ctx: &mut Ctx<'_>, path: &std::path::Path| {
        // A path the host wrote under another id (a bundle's) is the host's, not found.
        if ctx.store.holds_target(r.kind(), &r.target()) {
            return Ok(false);
        }
        ctx.fs.meta(path).map(|m| m.is_some()).map_err(Error::from)
    };
    Some(match &r.spec {
        Spec::File(f) => path_present(ctx, f.path.as_path()),
        Spec::Directory(d) => path_present(ctx, d.path.as_path()),
        Spec::Archive(a) => path_present(ctx, a.path.as_path()),
        // A unit that exists is the operator's as found, running or not: starting or
        // stopping it is what taking the module will do.
        Spec::Service(s) => ctx.systemd().and_then(|sd| Ok(sd.state(s.unit.as_str())?.exists())),
        Spec::Process(p) => {
            let unit = process::unit_name(p.name.as_str());
            ctx.systemd().and_then(|sd| Ok(!sd.state(&unit)?.stopped()))
        }
        Spec::Package(p) => ctx.machine.packages.installed(p.package.as_str()).map_err(Error::from),
        Spec::User(u) => {
            crate::system::accounts::lookup(u.name.as_str()).map(|a| a.is_some()).map_err(Error::from)
        }
        Spec::Container(_) | Spec::Network(_) => return container::found_made_by_others(ctx, r),
        // An opening is held by the firewall step, which knows what the filter found lets in;
        // an access path is never the host's to make, so there is nothing to hold; an action
        // has nothing present to find.
        Spec::Access(_) | Spec::Action(_) | Spec::Opening(_) => return None,
    })
}

impl Pass<'_> {
    /// On an adopted node, what a module not yet taken describes and was found present with no
    /// record of the host making it (before this pass changed anything) is held as found:
    /// reported, never recorded as applied, never changed, and remembered in the store until the
    /// module is taken, so that it disappearing does not make it the host's to create. What would
    /// act on something held is held too, and never run: an action run `in` a held container
    /// (whatever its module), and the actions, run-once and scheduled steps of a module that
    /// holds anything. `None`: applied as on any node. The hold to remember comes back beside
    /// the outcome, for the caller to store once the applier's context is gone.
    pub(super) fn hold(
        &self,
        found: &mut Found,
        r: &Resource,
    ) -> Option<(Result<Step, Error>, Option<crate::store::Held>)> {
        let adoption = self.declaration.adoption.as_ref()?;
        let module = r.id.module();
        let held = |detail: String| Some((Ok(Step::Done(begin(r, Verb::Held, Some(detail)), None)), None));
        if let Some(why) = held_step(self.declaration, found, r) {
            return held(why);
        }
        if adoption.taken.iter().any(|m| m == module) {
            return None;
        }
        if self.store.held(r.id.as_str()).is_some() {
            return held(format!(
                "held as found since it was first found, and module {module:?} is not taken yet: left as it is now"
            ));
        }
        // Recorded (the host made it, before what it would act on came to be held): asked all
        // the same, since a record says the host made it, not that it may now write into,
        // mount or run over what the operator's module holds (issue 45, point 7).
        if self.store.get(r.id.as_str()).is_some() {
            return acts_on_held(self.declaration, found, r).and_then(held);
        }
        match found.present.remove(&r.index()).unwrap_or(Ok(false)) {
            Ok(true) => {
                let detail = format!("found present, and module {module:?} is not taken yet: left as found");
                let remember = crate::store::Held {
                    kind: r.kind(),
                    target: r.target().into_boxed_str(),
                    origin: self.opts.origin,
                };
                Some((Ok(Step::Done(begin(r, Verb::Held, Some(detail)), None)), Some(remember)))
            }
            // Not found itself: held still if it would act on something held.
            Ok(false) => acts_on_held(self.declaration, found, r).and_then(held),
            Err(e) => Some((Err(e), None)),
        }
    }

    /// Lets go of the holds no longer declared by this origin, before a full pass, reported
    /// `forgotten` (what was held was never the host's, so nothing is removed). A hold whose
    /// module is now taken is not let go here but once its resource has applied
    /// (`Pass::let_go_when_taken`): a first try that fails keeps it, and the note that the thing was
    /// the operator's, for the next.
    pub(super) fn release_holds(&mut self) {
        let mut released = Vec::new();
        for (id, h) in self.store.holds() {
            if self.declaration.find(id).is_none() && h.origin == self.opts.origin {
                released.push((id.to_owned(), h.clone()));
            }
        }
        for (id, h) in released {
            if !self.opts.dry_run {
                self.store.release(&id);
            }
            self.slots.push(Some(Outcome {
                id,
                kind: h.kind,
                target: h.target.into(),
                action: Verb::Forgotten,
                detail: Some("no longer declared; it was held as found, and is left as found".to_owned()),
                hand_edit: None,
            }));
        }
    }

    /// After `r` applied: if it was held as found and its module is now taken, the hold is let
    /// go, and its outcome will say it was taken over (`Pass::report`), as the Go agent did
    /// after recording it. In a reconcile of one key as in a full pass.
    pub(super) fn let_go_when_taken(&mut self, r: &Resource, outcome: &Outcome) {
        if outcome.action == Verb::Held || self.store.held(r.id.as_str()).is_none() {
            return;
        }
        let taken =
            self.declaration.adoption.as_ref().is_none_or(|a| a.taken.iter().any(|m| m == r.id.module()));
        if taken {
            if !self.opts.dry_run {
                self.store.release(r.id.as_str());
            }
            self.taken_over.insert(r.id.to_string());
        }
    }
}
