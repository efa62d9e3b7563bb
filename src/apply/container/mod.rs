//! `container`: a long-running container, a run-once step, or a scheduled step, on the machine's
//! runtime (Docker, or Podman through its Docker-compatible API).
//!
//! A container's configuration is fixed when it is created, so there is no update in place:
//! a container whose spec moved is replaced. Whether it moved is told by a digest of the spec
//! carried on the container as a label, not by comparing what the runtime reports field by
//! field: runtimes add defaults, normalise and reorder what they were given, and those
//! differences cannot be told from real drift.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::{Duration, Instant};

use super::{begin, Aspect, Ctx, Error, Facts, Need, Step, Target, Verb};
use crate::declaration::{digest, Container, Declaration, Digest, Id, Kind, Resource, Spec, Volume};
use crate::store::{Record, Store};
use crate::system::docker::{self, Docker, NewContainer, ID_LABEL, SPEC_LABEL, STEP_LABEL};

/// The most of an env-file the host reads: far more than any real one, and a bound on what a
/// file planted at the path (or `/dev/zero` behind a symlink) can cost.
const ENV_FILE_LIMIT: u64 = 16 << 20;

/// The most of a mounted file carrying a secret the host reads to take its keyed digest.
const SECRET_FILE_LIMIT: u64 = 16 << 20;

/// How long a freshly started container is given before it is looked at a second time. A
/// process that exits at once (a bad flag, a missing file) is usually gone within this; one
/// that fails later is the watcher's to see. Paid once per creation, never on a steady pass.
const CONTAINER_SECOND_LOOK: Duration = Duration::from_millis(100);

/// A long-running container: looked at, decided (`decide`, pure), then started or created.
pub(super) fn apply(ctx: &mut Ctx<'_>, r: &Resource, c: &Container) -> Result<Step, Error> {
    if c.run_once {
        return run_once(ctx, r, c);
    }
    if c.schedule.is_some() {
        return install_schedule(ctx, r, c);
    }

    // Read once, so the label and the record agree about a file even if it moves meanwhile.
    let keyed = keyed_digests(ctx, c)?;
    let reads = reads(ctx, c)?;
    let spec_now = spec(ctx.declaration, c, Some(&reads), &keyed);
    // Only a container that reads files can carry a label from before they were folded in.
    let legacy = (!reads.is_empty()).then(|| spec(ctx.declaration, c, None, &keyed));
    let reasons: Vec<&str> =
        c.restart_on.iter().filter(|id| ctx.changed.contains(*id)).map(Id::as_str).collect();
    let want = Wanted { spec: &spec_now, legacy: legacy.as_deref(), reads: &reads, reasons: &reasons };
    let docker = &ctx.docker()?;
    let found = docker.container(c.name.as_str())?;
    let record = ctx.store.get(r.id.as_str()).filter(|rec| rec.kind == Kind::Container);
    // What it was created reading: by its id, and by its name when the id has no record. The
    // bundle's `store` becomes the module's `postgres.server`, the same container under a new
    // id, and a file that changes on the day it is adopted must still be named.
    let was_reading = match record {
        Some(rec) => rec.reads(),
        None => ctx.store.latest_at(Kind::Container, c.name.as_str()).and_then(|(_, rec)| rec.reads()),
    };
    let plan = decide(found.as_ref(), record, was_reading, &want);

    let done = |facts| Ok(Step::Done(begin(r, plan.action, plan.detail.clone()), facts));
    let facts = Facts { spec: Some(plan.spec.clone()), reads: reads.clone(), ..Facts::default() };
    if plan.run == Run::Leave {
        return done(Some(facts));
    }
    if ctx.opts.dry_run {
        return done(None);
    }
    match plan.run {
        Run::Leave => {}
        // It stopped, or someone stopped it. Starting it again is the fastest way back and
        // keeps what it had; its spec is still the declared one (docs/containers.md, "Drift").
        Run::StartAgain => {
            docker.start(c.name.as_str())?;
            read_back(docker, c, &plan.spec, Started::Again)?;
        }
        Run::Create { replace, started } => {
            let got = ensure_image(docker, c)?;
            let new = new_container(r, c, &plan.spec, true)?;
            if replace {
                docker.remove(c.name.as_str())?;
            }
            docker.create(&new)?;
            docker.start(c.name.as_str())?;
            read_back(docker, c, &plan.spec, started)?;
            if got {
                let detail = match &plan.detail {
                    Some(d) => format!("{d}{}", pulled(c, true)),
                    None => pulled(c, true).trim_start_matches("; ").to_owned(),
                };
                return Ok(Step::Done(begin(r, plan.action, Some(detail)), Some(facts)));
            }
        }
    }
    done(Some(facts))
}

/// What the declaration asks of a long-running container, resolved to plain values.
struct Wanted<'a> {
    /// The digest of its spec, with the files it reads (the `mesh-host.spec` label).
    spec: &'a str,
    /// The digest of its spec as computed before the files it reads were folded in; only for
    /// a container that reads files.
    legacy: Option<&'a str>,
    /// What it reads now, by path, with each file's digest.
    reads: &'a BTreeMap<String, String>,
    /// Its restart-on ids that moved in this pass.
    reasons: &'a [&'a str],
}

/// What to do with a long-running container, and what to report.
#[derive(Debug, PartialEq, Eq)]
struct Plan {
    action: Verb,
    detail: Option<String>,
    /// The spec to record, and to find on the container afterwards: the declared one, or the
    /// legacy label a container is accepted at.
    spec: String,
    run: Run,
}

#[derive(Debug, PartialEq, Eq)]
enum Run {
    /// Running at its spec: nothing to do.
    Leave,
    /// Stopped, at its spec: started again.
    StartAgain,
    /// Created at the declared spec (replacing the container of that name, when there is one)
    /// and started.
    Create { replace: bool, started: Started },
}

/// Decides from the container found by name, the record (by id), what the container was last
/// created reading (by id, or by name), and what is declared. Pure.
fn decide(
    found: Option<&docker::ContainerState>,
    record: Option<&Record>,
    was_reading: Option<&BTreeMap<String, String>>,
    want: &Wanted<'_>,
) -> Plan {
    // A container labelled before the host folded in what it reads is accepted, not
    // recreated: recreating every such container at once would be a restart storm across the
    // mesh, the store first. What it reads is recorded from now on, so a change is caught from
    // the next apply. The trade-off: a container already stale when this rule arrived is not
    // caught, and could not have been either way.
    let legacy = |label: &str| {
        want.legacy == Some(label) && was_reading.is_none_or(|was| was.is_empty() || was == want.reads)
    };
    // A container removed by hand and made again at the spec it last ran with is not new to
    // this machine: its recovery is timed like a restart's, without the settling wait.
    let started = if record.is_some_and(|rec| rec.spec() == Some(want.spec)) {
        Started::Recreated
    } else {
        Started::New
    };
    let create = |action, detail: Option<&str>, replace| Plan {
        action,
        detail: detail.map(str::to_owned),
        spec: want.spec.to_owned(),
        run: Run::Create { replace, started },
    };
    let Some(state) = found else {
        return match record {
            Some(_) => {
                create(Verb::Corrected, Some("it had been removed on the machine; created again"), false)
            }
            None => create(Verb::Created, None, false),
        };
    };
    let label = state.label(SPEC_LABEL).unwrap_or_default();
    if (label == want.spec || legacy(label)) && want.reasons.is_empty() {
        let (action, detail, run) = if state.running {
            let detail = (label != want.spec).then(|| {
                "accepted as labelled before mesh-host folded in the files a container reads; what it reads is recorded from now on".to_owned()
            });
            (Verb::Unchanged, detail, Run::Leave)
        } else {
            (Verb::Corrected, Some(format!("it {}; started again", stopped(state))), Run::StartAgain)
        };
        return Plan { action, detail, spec: label.to_owned(), run };
    }
    let changed_files: Vec<&str> = was_reading
        .into_iter()
        .flatten()
        .filter(|(path, was)| want.reads.get(*path).is_some_and(|now| now != *was))
        .map(|(path, _)| path.as_str())
        .collect();
    let detail = if !changed_files.is_empty() {
        let mut d = format!("recreated: {} changed", changed_files.join(", "));
        if !want.reasons.is_empty() {
            d.push_str(&format!("; and to pick up {}", want.reasons.join(", ")));
        }
        d
    } else if !want.reasons.is_empty() {
        format!("recreated to pick up {}, changed in this apply", want.reasons.join(", "))
    } else if state.label(ID_LABEL).is_none() {
        "replaced a container of that name that mesh-host had not created".to_owned()
    } else {
        "recreated: its declaration changed, and a container's configuration is fixed when it is created"
            .to_owned()
    };
    create(Verb::Updated, Some(&detail), true)
}

/// On an adopted node: whether the container or network a resource names is on the machine and
/// was made by someone else (it has no `mesh-host.id` label, and no record holds its name), so
/// that it is held as found. `None` for a step, which leaves nothing running to find
/// (docs/decisions.md, "Adoption": "With no record of the host making it").
pub(super) fn found_made_by_others(ctx: &mut Ctx<'_>, r: &Resource) -> Option<Result<bool, Error>> {
    let (container, name) = match &r.spec {
        Spec::Container(c) if c.run_once || c.schedule.is_some() => return None,
        Spec::Container(c) => (true, c.name.as_str()),
        Spec::Network(n) => (false, n.name.as_str()),
        Spec::Directory(_)
        | Spec::File(_)
        | Spec::Access(_)
        | Spec::Package(_)
        | Spec::Service(_)
        | Spec::User(_)
        | Spec::Archive(_)
        | Spec::Process(_)
        | Spec::Action(_)
        | Spec::Opening(_) => return None,
    };
    let kind = if container { Kind::Container } else { Kind::Network };
    if ctx.store.holds_target(kind, name) {
        return Some(Ok(false));
    }
    let found = ctx.docker().and_then(|docker| {
        if container {
            Ok(docker.container(name)?.map(|c| c.labels))
        } else {
            Ok(docker.network(name)?.map(|n| n.labels))
        }
    });
    Some(found.map(|labels| labels.is_some_and(|l| !l.contains_key(ID_LABEL))))
}

/// How a stopped container is described, after "it": "exited with code 137".
fn stopped(state: &docker::ContainerState) -> String {
    match (state.status.as_str(), state.exit_code) {
        ("exited", Some(code)) => format!("exited with code {code}"),
        ("created", _) => "was created and not started".to_owned(),
        ("", _) => "was not running".to_owned(),
        (status, _) => format!("was {status}, not running"),
    }
}

/// How the container being read back came to be running.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Started {
    /// Created at a spec this machine has not run it with.
    New,
    /// Created again, at the spec it last ran with (it had been removed by hand).
    Recreated,
    /// The same container, started again after it stopped.
    Again,
}

/// Reads back a container just started: there, running, and carrying the label. A start that
/// returned success says the process began, not that it is still there.
///
/// A container created at a new spec is looked at a second time after [`CONTAINER_SECOND_LOOK`]: a process
/// exiting at once is the likeliest failure of a new configuration. Any created container must
/// not have been restarted by its restart policy already, which is a process exiting at once.
/// One started again after it stopped is held to neither: its runtime may be restarting it by
/// its own policy at the same moment. A container that ran at this spec before is not settled
/// either: if it dies again its event says so, and settling would add its whole wait to the
/// time a killed or removed container takes to come back, which is what the daemon is measured
/// on.
fn read_back(docker: &Docker, c: &Container, want: &str, started: Started) -> Result<(), Error> {
    let name = c.name.as_str();
    let look = || {
        docker
            .container(name)?
            .ok_or_else(|| Error::Vanished { target: Target::Container(name.to_owned()), did: "started" })
    };
    let mut state = look()?;
    if state.running && started == Started::New {
        std::thread::sleep(CONTAINER_SECOND_LOOK);
        state = look()?;
    }
    if started != Started::Again && state.restarts > 0 {
        return Err(Error::ContainerRestarting { name: name.to_owned(), cli: docker.cli() });
    }
    if !state.running {
        return Err(Error::ContainerDied { name: name.to_owned(), how: stopped(&state), cli: docker.cli() });
    }
    if state.label(SPEC_LABEL) != Some(want) {
        return Err(Error::ReadBack {
            target: Target::Container(name.to_owned()),
            what: Aspect::SpecLabel,
            wanted: want.to_owned(),
            found: state.label(SPEC_LABEL).unwrap_or("absent").to_owned(),
        });
    }
    Ok(())
}

/// A run-once step: run in the foreground to completion, exit 0 required. Its record is its
/// spec digest, since a step leaves nothing running to ask: it runs again only when what it
/// was declared as changes. A failure is a gate (the engine stops the pass), so what is
/// declared after a step never runs on a machine the step did not make ready.
fn run_once(ctx: &mut Ctx<'_>, r: &Resource, c: &Container) -> Result<Step, Error> {
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
fn install_schedule(ctx: &mut Ctx<'_>, r: &Resource, c: &Container) -> Result<Step, Error> {
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
    let mut ring = super::secret::ring_at(key);
    declaration
        .scheduled_steps()
        .filter_map(|(id, _)| {
            let r = declaration.get(id)?;
            let Spec::Container(c) = &r.spec else { return None };
            let rec = store.get(id.as_str()).filter(|rec| rec.kind == Kind::Container)?;
            let want = spec(declaration, c, None, &keyed_with(declaration, c, &mut ring).ok()?);
            (rec.spec() == Some(want.as_str())).then(|| (id.clone(), want))
        })
        .collect()
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
    let want = spec(declaration, c, None, &keyed_with(declaration, c, &mut super::secret::ring_at(key))?);
    if installed != Some(want.as_str()) {
        return Err(Error::StepNotInstalled { id: id.to_string() });
    }
    let started = Instant::now();
    let docker = docker::connect(container_socket)?;
    ensure_image(&docker, c)?;
    run_step(&docker, r, c, &want, "scheduled step", limit)?;
    Ok(ScheduledRun { id: id.to_string(), took: started.elapsed() })
}

/// Makes the image present: inspected, pulled when absent (by digest when it is named by one),
/// and inspected again. Returns whether it was pulled, for the outcome. The runtime's own
/// registry configuration applies: a name without a registry is looked up where the runtime
/// looks (Docker Hub for Docker, Podman's search registries), so a module names its images
/// fully, or by digest, when it must have exactly them.
fn ensure_image(docker: &Docker, c: &Container) -> Result<bool, Error> {
    let image = c.image.as_str();
    if let Some(found) = docker.image(image)? {
        same_digest(image, &found)?;
        return Ok(false);
    }
    // An image id alone names no repository: nothing can be asked for it (docs/containers.md,
    // "A failed pull fails that resource").
    if image.starts_with("sha256:") {
        return Err(Error::ImageMissing { image: image.to_owned(), cli: docker.cli() });
    }
    docker.pull(image).map_err(|answer| Error::PullFailed { image: image.to_owned(), answer })?;
    // Read back: a pull that said it finished is not evidence the image is there.
    let found = docker.image(image)?.ok_or_else(|| Error::PulledNotThere { image: image.to_owned() })?;
    same_digest(image, &found)?;
    Ok(true)
}

/// An image named by digest must be held at that digest. The runtime answers an inspect by
/// `name@sha256:...` only for an image it holds at that digest; this is the read-back of that,
/// never taken on trust from the pull.
fn same_digest(image: &str, found: &docker::ImageFound) -> Result<(), Error> {
    let Some((_, digest)) = image.split_once('@') else { return Ok(()) };
    if found.repo_digests.iter().any(|d| d.rsplit_once('@').is_some_and(|(_, at)| at == digest)) {
        return Ok(());
    }
    let found = match found.repo_digests.as_slice() {
        [] => format!("{}, with no repository digest", found.id),
        digests => digests.join(", "),
    };
    Err(Error::ImageDigest { image: image.to_owned(), found })
}

/// What an outcome adds when the image was pulled for it.
fn pulled(c: &Container, pulled: bool) -> String {
    if pulled {
        format!("; image {} pulled", c.image.as_str())
    } else {
        String::new()
    }
}

/// The digest of a container's spec: what it is made from. `reads` are the files it reads at
/// creation; `None` computes the spec as it was before those were folded in (the legacy label).
///
/// Besides what the contract lists (image, name, env, ports, volumes, args, schedule, the
/// declared digest of each restart-on resource, the files read), the network and the extra
/// hosts are in it, each only when set: changing either changes the container, and a
/// container that sets neither keeps the digest the contract gives it.
pub fn spec_digest(
    declaration: &Declaration,
    c: &Container,
    reads: Option<&BTreeMap<String, String>>,
) -> String {
    spec(declaration, c, reads, &BTreeMap::new())
}

/// The declared digests of the restart-on files of `c` that carry a secret: keyed digests of
/// their opened content (`secret::declared_digest`), so the spec moves when a value moves and
/// not when the same value is sealed again.
fn keyed_digests(ctx: &mut Ctx<'_>, c: &Container) -> Result<BTreeMap<Id, Digest>, Error> {
    let declaration = ctx.declaration;
    keyed_with(declaration, c, &mut |f| super::secret::keyring(ctx, f))
}

/// `keyed_digests`, with the keyring from `ring` (asked only if a restart-on file carries a
/// secret): the scheduler's way, which has no pass.
fn keyed_with(
    declaration: &Declaration,
    c: &Container,
    ring: &mut dyn FnMut(&crate::declaration::File) -> Result<std::sync::Arc<crate::secrets::Keyring>, Error>,
) -> Result<BTreeMap<Id, Digest>, Error> {
    let mut out = BTreeMap::new();
    for id in &c.restart_on {
        let Some(r) = declaration.get(id) else { continue };
        let Spec::File(f) = &r.spec else { continue };
        if f.carries_secret() {
            out.insert(id.clone(), super::secret::declared_digest(&*ring(f)?, f)?);
        }
    }
    Ok(out)
}

/// `keyed` holds the declared digest of each restart-on file carrying a secret
/// (`keyed_digests`); every other resource is folded in by the digest of its declaration.
fn spec(
    declaration: &Declaration,
    c: &Container,
    reads: Option<&BTreeMap<String, String>>,
    keyed: &BTreeMap<Id, Digest>,
) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(s, "image {}", c.image.as_str());
    let _ = writeln!(s, "name {}", c.name.as_str());
    for (k, v) in &c.env {
        let _ = writeln!(s, "env {k}={v}");
    }
    for p in &c.ports {
        let _ = writeln!(s, "port {p}");
    }
    for v in &c.volumes {
        let _ = writeln!(s, "volume {v}");
    }
    for a in &c.args {
        let _ = writeln!(s, "arg {a}");
    }
    if let Some(n) = &c.network {
        let _ = writeln!(s, "network {}", n.as_str());
    }
    for h in &c.hosts {
        let _ = writeln!(s, "host {h}");
    }
    if let Some(cron) = &c.schedule {
        let _ = writeln!(s, "schedule {}", cron.as_str());
    }
    // Sorted, so a reordering nobody meant does not recreate anything.
    let mut named: Vec<&Id> = c.restart_on.iter().collect();
    named.sort();
    for id in named {
        let declared = match keyed.get(id) {
            Some(d) => d.to_string(),
            None => declaration.get(id).map(|r| r.digest.to_string()).unwrap_or_default(),
        };
        let _ = writeln!(s, "restart-on {id}={declared}");
    }
    for (path, d) in reads.into_iter().flatten() {
        let _ = writeln!(s, "file {path}={d}");
    }
    digest(s.as_bytes()).to_string()
}

/// What a long-running container reads at creation, by path: each env-file, and each file
/// bind-mounted directly. A mounted directory is not looked inside, not even at files the host
/// wrote there: what a program reads out of a directory, and when, is the program's (a proxy
/// that re-reads its routes live would be recreated on every route change). A module whose
/// program reads such a file once says so with restart-on. Steps read nothing here: they read
/// their files afresh each time they run (docs/containers.md, "What makes a container "the
/// same"").
fn reads(ctx: &mut Ctx<'_>, c: &Container) -> Result<BTreeMap<String, String>, Error> {
    let mut out = BTreeMap::new();
    for path in &c.env_file {
        let d = file_digest(ctx, path.as_path())?.unwrap_or_else(|| "absent".to_owned());
        out.insert(path.to_string(), d);
    }
    // A named volume is the runtime's, holding data: only a bind from the machine is read.
    for source in c.volumes.iter().filter_map(Volume::host_path) {
        if let Some(d) = file_digest(ctx, source.as_path())? {
            out.insert(source.to_string(), d);
        }
    }
    Ok(out)
}

/// What a file holds, by digest: what the host wrote there when it has a record of writing it,
/// else what is on disk. The record is preferred because it is what the host means by the
/// file: a seed created once digests as the seed, not as what the program grew in it. `None`
/// when nothing readable is there, or it is not a regular file.
///
/// The record of the file resource this declaration has at that path comes first; another
/// origin's record of the same path (a first-boot bundle's, which the mesh never removes) is
/// only a fallback, the most recent one, for a path this declaration does not write.
///
/// A file this declaration writes that carries a secret, found with no record (its apply
/// failed), is digested with the node's key, like its record would be: a plain sha256 of it
/// would be a way to check guesses of the secret, in the store and on the label.
fn file_digest(ctx: &mut Ctx<'_>, path: &Path) -> Result<Option<String>, Error> {
    let (store, declaration) = (ctx.store, ctx.declaration);
    let text = path.display().to_string();
    let at = declaration.at_path(path).filter(|r| r.kind() == Kind::File);
    let declared = at
        .and_then(|r| store.get(r.id.as_str()))
        .filter(|rec| rec.kind == Kind::File && *rec.target == *text);
    let record = declared.or_else(|| store.latest_at(Kind::File, &text).map(|(_, rec)| rec));
    if let Some(wrote) = record.and_then(|rec| rec.wrote) {
        return Ok(Some(wrote.to_string()));
    }
    let reads = |error| Error::ContainerReads { path: path.to_owned(), error };
    let secret = at.and_then(|r| if let Spec::File(f) = &r.spec { Some(f) } else { None });
    let d = match secret.filter(|f| f.carries_secret()) {
        // A file carrying a secret: its keyed digest needs its bytes (a secret is small).
        Some(f) => {
            let Some(mut bytes) =
                crate::system::input::read_input_file(path, SECRET_FILE_LIMIT).map_err(reads)?
            else {
                return Ok(None);
            };
            let ring = super::secret::keyring(ctx, f);
            let d = ring.map(|ring| Digest::from_keyed(ring.digest(&bytes)));
            zeroize::Zeroize::zeroize(&mut bytes);
            d?
        }
        // Anything else is hashed as a stream: a mounted file may be gigabytes.
        None => match crate::system::input::hash_input_file(path).map_err(reads)? {
            Some(sum) => Digest::from_sum(sum),
            None => return Ok(None),
        },
    };
    Ok(Some(d.to_string()))
}

/// Everything the runtime needs to create the container, resolved: env-files read, bind
/// sources checked. The ports were parsed with the declaration.
fn new_container(r: &Resource, c: &Container, want: &str, keep_running: bool) -> Result<NewContainer, Error> {
    let name = c.name.as_str();
    let mut env = Vec::new();
    // The Engine API takes no env-file: the docker CLI reads it on the client side, and so
    // does the host, in the CLI's format. Values are never logged (docs/containers.md,
    // "Creating, and reading back").
    for (i, path) in c.env_file.iter().enumerate() {
        let unusable = |why: String| Error::EnvFile {
            container: name.to_owned(),
            index: i,
            path: path.as_path().to_owned(),
            why,
        };
        let bytes = crate::system::input::read_input_file(path.as_path(), ENV_FILE_LIMIT)
            .map_err(|e| unusable(e.to_string()))?
            .ok_or_else(|| Error::Missing {
                path: path.as_path().to_owned(),
                need: Need::EnvFile { container: name.to_owned(), index: i },
            })?;
        env.extend(parse_env_file(&bytes).map_err(unusable)?);
    }
    env.extend(c.env.iter().map(|(k, v)| format!("{k}={v}")));

    let mut binds = Vec::new();
    for (i, v) in c.volumes.iter().enumerate() {
        // Docker makes a missing bind source as an empty directory, owned by root. Where a file
        // was meant (a credential not written yet) that directory then blocks the file for
        // ever, so a missing source is refused instead (docs/containers.md, "A bind-mount
        // source that does not exist is refused").
        if let Some(source) = v.host_path().filter(|p| !crate::system::input::exists(p.as_path())) {
            return Err(Error::Missing {
                path: source.as_path().to_owned(),
                need: Need::BindSource { container: name.to_owned(), index: i },
            });
        }
        // Given in the runtime's own form, from the parts: the source is the path that was
        // just checked, not text cut from the declaration again.
        let mut bind = format!("{}:{}", v.source(), v.target());
        if let Some(options) = v.options() {
            bind.push(':');
            bind.push_str(options);
        }
        binds.push(bind);
    }

    // A step publishes nothing: it runs beside the service it prepares, which holds those
    // ports, and a run-once step or a fire would otherwise fail on them (or, before the
    // service is up, expose a migration to the network for as long as it runs). A step that
    // declares ports (a template shared with its service) is told so in its outcome
    // (docs/containers.md, "A step publishes no ports").
    let published = if keep_running { &c.ports[..] } else { &[] };
    let ports = published
        .iter()
        .flat_map(|p| {
            p.publishes().map(|(host_port, container_port)| docker::Publish {
                container_port,
                transport: p.transport().as_str(),
                host_ip: p.host_ip(),
                host_port,
            })
        })
        .collect();

    let mut labels =
        HashMap::from([(SPEC_LABEL.to_owned(), want.to_owned()), (ID_LABEL.to_owned(), r.id.to_string())]);
    // A step's container exits by design. Marked, so the event watcher does not take its end
    // for drift: a failed run-once step would otherwise be run again at every exit of its own
    // (docs/containers.md, "The event watcher (`watchers::docker`)").
    if !keep_running {
        let kind = if c.schedule.is_some() { "scheduled" } else { "run-once" };
        labels.insert(STEP_LABEL.to_owned(), kind.to_owned());
    }
    Ok(NewContainer {
        name: name.to_owned(),
        image: c.image.as_str().to_owned(),
        env,
        args: c.args.clone(),
        labels,
        binds,
        ports,
        network: c.network.as_ref().map(|n| n.as_str().to_owned()),
        hosts: c.hosts.iter().map(|h| h.as_str().to_owned()).collect(),
        keep_running,
    })
}

/// Parses an env-file the way the docker CLI does: `KEY=VALUE` lines, the value taken as
/// written; blank lines and `#` comments skipped. A bare `KEY`, which the CLI fills from its
/// own environment, is skipped: the agent's environment is not the container's.
pub fn parse_env_file(bytes: &[u8]) -> Result<Vec<String>, String> {
    let text = std::str::from_utf8(bytes).map_err(|_| "is not UTF-8 text".to_owned())?;
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim_start();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((key, _)) = line.split_once('=') else { continue };
        if key.is_empty() || key.contains(char::is_whitespace) {
            // The line number, never the line: it may hold a secret.
            return Err(format!("line {} does not start with a variable name", n + 1));
        }
        out.push(line.to_owned());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_files_parse_like_the_docker_cli() {
        let got = parse_env_file(b"# a comment\n\nPORT=8080\n  NAME=a b \nBARE\nEMPTY=\n").unwrap();
        assert_eq!(got, vec!["PORT=8080", "NAME=a b ", "EMPTY="]);
        let err = parse_env_file(b"OK=1\nA B=secret\n").unwrap_err();
        assert_eq!(err, "line 2 does not start with a variable name");
        assert!(!err.contains("secret"));
    }

    #[test]
    fn the_spec_is_of_the_declared_text_of_ports_volumes_hosts_env_and_schedule() {
        // The values are parsed into types, but the digest (the label on every running
        // container, and the record of every step) is of the text as declared, as it was when
        // they were strings: a change of it would recreate every container on the mesh.
        let d = Declaration::parse(
            br#"{"version": 1, "resources": [
                {"type": "container", "id": "web.backup", "name": "web-backup", "image": "local/web:1",
                 "env": {"B": "2", "A": "1"}, "ports": ["127.0.0.1:8080:80", "[::1]:8081:81/udp"],
                 "volumes": ["/srv/web/:/srv/web:ro", "web-data:/data"], "hosts": ["db6:fd00:0::5"],
                 "schedule": "*/15 3-5 * * 1,3"}]}"#,
        )
        .unwrap();
        let Spec::Container(c) = &d.resources[0].spec else { unreachable!() };
        let text = "image local/web:1\nname web-backup\nenv A=1\nenv B=2\n\
                    port 127.0.0.1:8080:80\nport [::1]:8081:81/udp\n\
                    volume /srv/web/:/srv/web:ro\nvolume web-data:/data\n\
                    host db6:fd00:0::5\nschedule */15 3-5 * * 1,3\n";
        assert_eq!(spec(&d, c, None, &BTreeMap::new()), digest(text.as_bytes()).to_string());
    }

    #[test]
    fn the_runtime_is_given_the_parsed_ports_binds_and_hosts() {
        let d = Declaration::parse(
            br#"{"version": 1, "resources": [
                {"type": "container", "id": "web.app", "name": "web", "image": "local/web:1",
                 "ports": ["80", "127.0.0.1::8080", "[::1]:8443:443/tcp", "5353:53/udp"],
                 "volumes": ["/tmp/:/scratch:ro", "web-data:/data"], "hosts": ["db:10.0.0.5"]}]}"#,
        )
        .unwrap();
        let r = &d.resources[0];
        let Spec::Container(c) = &r.spec else { unreachable!() };
        let new = new_container(r, c, "sha256:want", true).unwrap();
        let publish = |container_port, transport, host_ip: Option<&str>, host_port| docker::Publish {
            container_port,
            transport,
            host_ip: host_ip.map(|ip| ip.parse().unwrap()),
            host_port,
        };
        assert_eq!(
            new.ports,
            [
                publish(80, "tcp", None, None),
                publish(8080, "tcp", Some("127.0.0.1"), None),
                publish(443, "tcp", Some("::1"), Some(8443)),
                publish(53, "udp", None, Some(5353)),
            ]
        );
        // The source as checked (normalised), in the runtime's own form.
        assert_eq!(new.binds, ["/tmp:/scratch:ro", "web-data:/data"]);
        assert_eq!(new.hosts, ["db:10.0.0.5"]);
        // A step publishes none of them: it runs beside the service that holds them.
        let step = new_container(r, c, "sha256:want", false).unwrap();
        assert!(step.ports.is_empty());
        assert_eq!(step.binds, new.binds);
    }

    #[test]
    fn the_spec_moves_with_what_is_read_and_only_then() {
        let d = Declaration::parse(
            br#"{"version": 1, "resources": [
                {"type": "container", "id": "web.app", "name": "web", "image": "local/web:1",
                 "env": {"B": "2", "A": "1"}}]}"#,
        )
        .unwrap();
        let Spec::Container(c) = &d.resources[0].spec else { unreachable!() };
        let empty = BTreeMap::new();
        // A container that reads nothing has the same digest with and without file lines.
        let none = BTreeMap::new();
        assert_eq!(spec(&d, c, None, &none), spec(&d, c, Some(&empty), &none));
        let one = BTreeMap::from([("/etc/web.env".to_owned(), "sha256:1".to_owned())]);
        let two = BTreeMap::from([("/etc/web.env".to_owned(), "sha256:2".to_owned())]);
        assert_ne!(spec(&d, c, Some(&one), &none), spec(&d, c, Some(&two), &none));
        assert_ne!(spec(&d, c, Some(&one), &none), spec(&d, c, None, &none));
    }

    #[test]
    fn a_restart_on_file_carrying_a_secret_is_folded_in_by_its_keyed_digest() {
        let d = Declaration::parse(
            br#"{"version": 1, "resources": [
                {"type": "file", "id": "web.key", "path": "/etc/web.key", "sealed": "YWdlLWVuY3J5cHRpb24ub3JnL3YxCg=="},
                {"type": "container", "id": "web.app", "name": "web", "image": "local/web:1",
                 "restart-on": ["web.key"]}]}"#,
        )
        .unwrap();
        let Spec::Container(c) = &d.resources[1].spec else { unreachable!() };
        let id = d.resources[0].id.clone();
        let keyed = |sum: u8| BTreeMap::from([(id.clone(), Digest::from_keyed([sum; 32]))]);
        // The same opened value, whatever its ciphertext: the same spec; another value, another.
        assert_eq!(spec(&d, c, None, &keyed(1)), spec(&d, c, None, &keyed(1)));
        assert_ne!(spec(&d, c, None, &keyed(1)), spec(&d, c, None, &keyed(2)));
        assert_ne!(spec(&d, c, None, &keyed(1)), spec(&d, c, None, &BTreeMap::new()));
    }

    #[test]
    fn a_restart_on_into_file_with_a_secret_moves_the_spec_only_when_the_value_moves() {
        let ring = std::sync::Arc::new(
            crate::secrets::Keyring::parse(&crate::secrets::Keyring::generate()).unwrap(),
        );
        let declared = |value: &[u8]| {
            let sealed = crate::secrets::seal(&ring.public_key(), value).unwrap();
            let text = serde_json::json!({"version": 1, "resources": [
                {"type": "file", "id": "web.env", "path": "/etc/web.env", "into": "env",
                 "content": "TOKEN=${secret:token}\n", "secrets": {"token": sealed}},
                {"type": "container", "id": "web.app", "name": "web", "image": "local/web:1",
                 "restart-on": ["web.env"]}]});
            Declaration::parse(text.to_string().as_bytes()).unwrap()
        };
        let spec_of = |d: &Declaration| {
            let Spec::Container(c) = &d.resources[1].spec else { unreachable!() };
            let keyed = keyed_with(d, c, &mut |_| Ok(std::sync::Arc::clone(&ring))).unwrap();
            assert!(keyed.values().all(Digest::is_keyed), "folded in by a keyed digest");
            spec(d, c, None, &keyed)
        };
        let (first, again, moved) = (declared(b"one"), declared(b"one"), declared(b"two"));
        assert_ne!(first.resources[0].digest, again.resources[0].digest, "another ciphertext");
        assert_eq!(spec_of(&first), spec_of(&again), "sealed again: the same spec");
        assert_ne!(spec_of(&first), spec_of(&moved), "a new value: another spec");
    }

    #[test]
    fn an_image_named_by_digest_must_be_held_at_it() {
        let d = format!("sha256:{}", "a".repeat(64));
        let other = format!("sha256:{}", "b".repeat(64));
        let held = |digests: &[String]| docker::ImageFound {
            id: "sha256:id".into(),
            repo_digests: digests.to_vec(),
        };
        let named = format!("reg:5000/web@{d}");
        // Held at it, by whatever repository the runtime came by it.
        assert!(same_digest(&named, &held(&[format!("other/web@{d}")])).is_ok());
        let err = same_digest(&named, &held(&[format!("reg:5000/web@{other}")])).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("image {named} is named by its digest, and the runtime holds it as reg:5000/web@{other}; nothing was created")
        );
        assert!(same_digest(&named, &held(&[]))
            .unwrap_err()
            .to_string()
            .contains("sha256:id, with no repository digest"));
        // A tag is not held to a digest.
        assert!(same_digest("reg:5000/web:1", &held(&[])).is_ok());
    }

    // The decision for a long-running container, without a runtime.

    fn container(running: bool, labels: &[(&str, &str)]) -> docker::ContainerState {
        docker::ContainerState {
            running,
            status: if running { "running" } else { "exited" }.into(),
            exit_code: (!running).then_some(137),
            labels: labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
            ..Default::default()
        }
    }

    fn ours(spec: &str) -> Vec<(&str, &str)> {
        vec![(SPEC_LABEL, spec), (ID_LABEL, "web.app")]
    }

    fn record(spec: &str) -> Record {
        Record {
            origin: crate::store::Origin::Declared,
            kind: Kind::Container,
            target: "web".into(),
            position: 0,
            declared: digest(b"v1"),
            applied_at: 0,
            wrote: None,
            mode: None,
            owner: None,
            sig: None,
            more: crate::store::More { spec: Some(spec.to_owned()), ..Default::default() }.boxed(),
        }
    }

    const NOTHING: &BTreeMap<String, String> = &BTreeMap::new();

    fn wanted<'a>(reasons: &'a [&'a str]) -> Wanted<'a> {
        Wanted { spec: "sha256:now", legacy: None, reads: NOTHING, reasons }
    }

    #[test]
    fn a_container_running_at_its_spec_is_left_and_one_stopped_is_started_again() {
        let rec = record("sha256:now");
        let p = decide(Some(&container(true, &ours("sha256:now"))), Some(&rec), None, &wanted(&[]));
        assert_eq!(
            p,
            Plan { action: Verb::Unchanged, detail: None, spec: "sha256:now".into(), run: Run::Leave }
        );
        let p = decide(Some(&container(false, &ours("sha256:now"))), Some(&rec), None, &wanted(&[]));
        assert_eq!(
            (p.action, p.detail.as_deref(), &p.run),
            (Verb::Corrected, Some("it exited with code 137; started again"), &Run::StartAgain)
        );
    }

    #[test]
    fn a_container_not_there_is_created_and_one_removed_by_hand_created_again() {
        let p = decide(None, None, None, &wanted(&[]));
        assert_eq!(
            p,
            Plan {
                action: Verb::Created,
                detail: None,
                spec: "sha256:now".into(),
                run: Run::Create { replace: false, started: Started::New }
            }
        );
        // At the spec it last ran with: timed as a restart, without the settling wait.
        let p = decide(None, Some(&record("sha256:now")), None, &wanted(&[]));
        assert_eq!(
            (p.action, p.detail.as_deref()),
            (Verb::Corrected, Some("it had been removed on the machine; created again"))
        );
        assert_eq!(p.run, Run::Create { replace: false, started: Started::Recreated });
        let p = decide(None, Some(&record("sha256:before")), None, &wanted(&[]));
        assert_eq!(p.run, Run::Create { replace: false, started: Started::New });
    }

    #[test]
    fn a_container_at_another_spec_is_replaced_and_says_why() {
        let rec = record("sha256:before");
        let replaced =
            |found: &docker::ContainerState, was: Option<&BTreeMap<String, String>>, want: &Wanted<'_>| {
                let p = decide(Some(found), Some(&rec), was, want);
                assert_eq!(
                    (p.action, &p.run),
                    (Verb::Updated, &Run::Create { replace: true, started: Started::New })
                );
                p.detail.unwrap()
            };
        assert_eq!(
            replaced(&container(true, &ours("sha256:before")), None, &wanted(&[])),
            "recreated: its declaration changed, and a container's configuration is fixed when it is created"
        );
        assert_eq!(
            replaced(&container(true, &[]), None, &wanted(&[])),
            "replaced a container of that name that mesh-host had not created"
        );
        // At its spec, but something it names in restart-on moved in this pass.
        assert_eq!(
            replaced(&container(true, &ours("sha256:now")), None, &wanted(&["web.conf"])),
            "recreated to pick up web.conf, changed in this apply"
        );
        // A file it reads changed since it was created.
        let was = BTreeMap::from([("/etc/web.env".to_owned(), "sha256:1".to_owned())]);
        let now = BTreeMap::from([("/etc/web.env".to_owned(), "sha256:2".to_owned())]);
        let want = Wanted { reads: &now, ..wanted(&["web.conf"]) };
        assert_eq!(
            replaced(&container(true, &ours("sha256:before")), Some(&was), &want),
            "recreated: /etc/web.env changed; and to pick up web.conf"
        );
    }

    #[test]
    fn a_container_labelled_before_reads_were_folded_in_is_accepted_once() {
        let reads = BTreeMap::from([("/etc/web.env".to_owned(), "sha256:1".to_owned())]);
        let want = Wanted { legacy: Some("sha256:legacy"), reads: &reads, ..wanted(&[]) };
        let found = container(true, &ours("sha256:legacy"));
        let p = decide(Some(&found), None, None, &want);
        assert_eq!((p.action, &p.run, p.spec.as_str()), (Verb::Unchanged, &Run::Leave, "sha256:legacy"));
        assert_eq!(
            p.detail.as_deref(),
            Some("accepted as labelled before mesh-host folded in the files a container reads; what it reads is recorded from now on")
        );
        // Once what it reads is recorded, a change of it is caught.
        let was = BTreeMap::from([("/etc/web.env".to_owned(), "sha256:0".to_owned())]);
        let p = decide(Some(&found), None, Some(&was), &want);
        assert_eq!(p.detail.as_deref(), Some("recreated: /etc/web.env changed"));
        // Stopped at the legacy label: started again, and read back at that label.
        let p = decide(Some(&container(false, &ours("sha256:legacy"))), None, Some(&reads), &want);
        assert_eq!((&p.run, p.spec.as_str()), (&Run::StartAgain, "sha256:legacy"));
    }
}
