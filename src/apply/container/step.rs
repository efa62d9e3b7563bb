//! Run-once and scheduled steps: a container run to completion, at an apply or at each fire of
//! the daemon's scheduler, and the check of which scheduled steps an apply installed.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use super::create::new_container;
use super::spec::{keyed_digests, keyed_with, spec};
use super::{ensure_image, pulled};
use crate::apply::{begin, secret, Ctx, Error, Facts, Step, Verb};
use crate::declaration::{Container, Declaration, Id, Kind, Resource, Spec};
use crate::store::Store;
use crate::system::docker::{self, Docker};

/// A run-once step: run in the foreground to completion, exit 0 required. Its record is its
/// spec digest, since a step leaves nothing running to ask: it runs again only when what it
/// was declared as changes. A failure is a gate (the engine stops the pass), so what is
/// declared after a step never runs on a machine the step did not make ready.
pub(super) fn run_once(ctx: &mut Ctx<'_>, r: &Resource, c: &Container) -> Result<Step, Error> {
    let keyed = keyed_digests(ctx, c)?;
    let want = spec(ctx.declaration, c, None, &keyed);
    let record = ctx.store.get(r.id.as_str()).filter(|rec| rec.kind == Kind::Container);
    let facts = Facts { spec: Some(want.clone()), ..Facts::default() };
    if record.and_then(|rec| rec.spec()) == Some(want.as_str()) {
        let detail = "run-once step already completed for this declaration".to_owned();
        return Ok(Step::Done(begin(r, Verb::Unchanged, Some(detail)), Some(facts)));
    }
    let (action, detail) = match record {
        Some(_) => (Verb::Updated, "run-once step ran again, since its declaration changed, and completed"),
        None => (Verb::Created, "run-once step completed"),
    };
    if ctx.opts.dry_run {
        let detail = format!("run-once step would run{}", ports_unpublished(c));
        return Ok(Step::Done(begin(r, action, Some(detail)), None));
    }
    let docker = &ctx.docker()?;
    let got = ensure_image(docker, c)?;
    run_step(docker, r, c, &want, "run-once step", ctx.opts.step_timeout)?;
    let detail = format!("{detail}{}{}", ports_unpublished(c), pulled(c, got));
    Ok(Step::Done(begin(r, action, Some(detail)), Some(facts)))
}

/// What a step's outcome adds when it declares ports, which a step does not publish.
fn ports_unpublished(c: &Container) -> &'static str {
    if c.ports.is_empty() {
        ""
    } else {
        "; its ports are not published: a step runs beside the service that holds them"
    }
}

/// Runs a step's container to completion and removes it. A failed one is left in place so its
/// logs can be read; it is replaced at the next run.
fn run_step(
    docker: &Docker,
    r: &Resource,
    c: &Container,
    want: &str,
    what: &'static str,
    limit: Option<std::time::Duration>,
) -> Result<(), Error> {
    let name = c.name.as_str();
    // A container of this name from an earlier run, or a failed one, must not be mistaken for
    // this run. A failed step's container is left for its logs until here, its next attempt
    // (docs/containers.md, "Run-once and scheduled steps").
    docker.remove(name)?;
    let new = new_container(r, c, want, false)?;
    docker.create(&new)?;
    docker.start(name)?;
    let code = docker.wait(name, limit)?;
    if code != 0 {
        return Err(Error::StepFailed { step: what, name: name.to_owned(), code, cli: docker.cli() });
    }
    docker.remove(name)?;
    Ok(())
}

/// A scheduled step is installed, not run: the schedule is recorded, and its image made
/// present now so the first run does not find it missing. The daemon's scheduler runs it
/// (see [`run_scheduled`]); a failed run never changes what an apply reported
/// (docs/containers.md, "Run-once and scheduled steps").
pub(super) fn install_schedule(ctx: &mut Ctx<'_>, r: &Resource, c: &Container) -> Result<Step, Error> {
    let keyed = keyed_digests(ctx, c)?;
    let want = spec(ctx.declaration, c, None, &keyed);
    let schedule = c.schedule.as_ref().map(|s| s.as_str().to_owned());
    let record = ctx.store.get(r.id.as_str()).filter(|rec| rec.kind == Kind::Container);
    // Made present now, so the first fire does not find it missing; a plan only looks.
    let docker = &ctx.docker()?;
    let got = if ctx.opts.dry_run {
        docker.image(c.image.as_str())?;
        false
    } else {
        ensure_image(docker, c)?
    };
    let (action, detail) = match record.and_then(|rec| rec.spec()) {
        Some(s) if s == want => (Verb::Unchanged, "scheduled step, installed for this declaration"),
        Some(_) => (Verb::Updated, "scheduled step re-installed: its image, settings or cadence changed"),
        None => (
            Verb::Created,
            "scheduled step installed; not run now: the host's scheduler runs it on its cadence",
        ),
    };
    let facts = (!ctx.opts.dry_run).then(|| Facts { spec: Some(want), schedule, ..Facts::default() });
    let detail = format!("{detail}{}{}", ports_unpublished(c), pulled(c, got));
    Ok(Step::Done(begin(r, action, Some(detail)), facts))
}

/// What one run of a scheduled step did.
#[derive(Clone, Debug)]
pub struct ScheduledRun {
    /// The step's id.
    pub id: String,
    /// How long the run took, from its container's start to its exit.
    pub took: Duration,
}

/// The scheduled steps of `declaration` that an apply installed at their current declaration,
/// each with the spec it was recorded at: the only ones the scheduler may run. A step whose
/// install failed, that sat behind a failed gate, or that was held on an adopted node has no
/// such record, and a backup must not run against a store whose migration never passed.
///
/// `key` is the node's key file, read (once) only if a step restarts on a file carrying a
/// secret, whose keyed digest is part of the step's spec; such a step is not installed where
/// the value cannot be opened.
pub fn installed_steps(declaration: &Declaration, store: &Store, key: &Path) -> HashMap<Id, String> {
    let mut ring = secret::ring_at(key);
    declaration
        .scheduled_steps()
        .filter_map(|(id, _)| {
            let r = declaration.get(id)?;
            let Spec::Container(c) = &r.spec else { return None };
            // Installed before its module came to hold something: held now, so not run.
            if module_holds(declaration, store, r) {
                return None;
            }
            let rec = store.get(id.as_str()).filter(|rec| rec.kind == Kind::Container)?;
            let want = spec(declaration, c, None, &keyed_with(declaration, c, &mut ring).ok()?);
            (rec.spec() == Some(want.as_str())).then(|| (id.clone(), want))
        })
        .collect()
}

/// Whether `r`'s module is not taken on an adopted node and holds something (remembered in the
/// store): its steps are held, as `adopt::held_step` decides in a pass, whatever their record.
fn module_holds(declaration: &Declaration, store: &Store, r: &crate::declaration::Resource) -> bool {
    let Some(adoption) = declaration.adoption.as_ref() else { return false };
    let module = r.id.module();
    !adoption.taken.iter().any(|m| m == module)
        && store.holds().any(|(id, _)| declaration.find(id).is_some_and(|h| h.id.module() == module))
}

/// Runs one scheduled step to completion: what the daemon's scheduler calls at each fire.
/// `installed` is the spec the step was installed at ([`installed_steps`]); a step not
/// installed at the spec declared now is refused, not run. Success is an exit of 0; anything
/// else is an error naming the step, to be logged and counted, never to change what an apply
/// reported. Blocks: call it from a blocking thread of a tokio runtime (`spawn_blocking`).
pub fn run_scheduled(
    declaration: &Declaration,
    id: &Id,
    installed: Option<&str>,
    container_socket: Option<&str>,
    limit: Option<std::time::Duration>,
    key: &Path,
) -> Result<ScheduledRun, Error> {
    let r = declaration.get(id).ok_or_else(|| Error::NotDeclared { id: id.to_string() })?;
    // `Spec::schedule` is the one place that knows which types have a schedule.
    let (Spec::Container(c), Some(_)) = (&r.spec, r.spec.schedule()) else {
        return Err(Error::NotScheduled { id: id.to_string() });
    };
    let want = spec(declaration, c, None, &keyed_with(declaration, c, &mut secret::ring_at(key))?);
    if installed != Some(want.as_str()) {
        return Err(Error::StepNotInstalled { id: id.to_string() });
    }
    let started = Instant::now();
    let docker = docker::connect(container_socket)?;
    ensure_image(&docker, c)?;
    run_step(&docker, r, c, &want, "scheduled step", limit)?;
    Ok(ScheduledRun { id: id.to_string(), took: started.elapsed() })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scheduled step recorded before its module held anything is not installed once the
    /// module holds something (issue 21, item 4), and is again once the module is taken.
    #[test]
    fn a_step_of_a_module_that_holds_something_is_not_installed() {
        let parse = |taken: &str| {
            Declaration::parse(
                format!(
                    r#"{{"version": 1, "adoption": {{"taken": [{taken}]}}, "resources": [
                        {{"type": "file", "id": "db.conf", "path": "/srv/db.conf", "content": "x"}},
                        {{"type": "container", "id": "db.backup", "name": "backup", "image": "i:1",
                          "schedule": "0 3 * * *", "args": ["true"]}},
                        {{"type": "container", "id": "ops.backup", "name": "opsbackup", "image": "i:1",
                          "schedule": "0 3 * * *", "args": ["true"]}}
                    ]}}"#
                )
                .as_bytes(),
            )
            .unwrap()
        };
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(&dir.path().join("state.json")).unwrap();
        let d = parse("");
        let step = d.get(&Id::parse("db.backup").unwrap()).unwrap();
        let other = d.get(&Id::parse("ops.backup").unwrap()).unwrap();
        assert!(!module_holds(&d, &store, step), "the module holds nothing yet");
        let held = crate::store::Held {
            kind: Kind::File,
            target: "/srv/db.conf".into(),
            origin: crate::store::Origin::Declared,
        };
        store.hold("db.conf", held);
        assert!(module_holds(&d, &store, step), "its module holds the file");
        assert!(!module_holds(&d, &store, other), "another module's step is not held by it");
        let taken = parse(r#""db""#);
        assert!(!module_holds(&taken, &store, taken.get(&Id::parse("db.backup").unwrap()).unwrap()), "taken");
    }
}
