//! `container`: a long-running container, a run-once step, or a scheduled step, on the machine's
//! runtime (Docker, or Podman through its Docker-compatible API).
//!
//! A container's configuration is fixed when it is created, so there is no update in place:
//! a container whose spec moved is replaced. Whether it moved is told by a digest of the spec
//! carried on the container as a label, not by comparing what the runtime reports field by
//! field: runtimes add defaults, normalise and reorder what they were given, and those
//! differences cannot be told from real drift.
//!
//! Here: the long-running container (`apply`, its `decide`, then what it does), and what the
//! parts share (the image made present, the read-back). The steps are in `step`, the spec
//! digest and what a container reads in `spec`, the container as the runtime is given it in
//! `create`.

mod create;
mod spec;
mod step;

use std::collections::BTreeMap;
use std::time::Duration;

use super::{begin, Aspect, Ctx, Error, Facts, Step, Target, Verb};
use crate::declaration::{Container, Id, Kind, Resource, Spec};
use crate::store::Record;
use crate::system::docker::{self, Docker, ID_LABEL, SPEC_LABEL};
use create::new_container;
use spec::{go_spec, keyed_digests, reads, spec};
use step::{install_schedule, run_once};

pub use create::parse_env_file;
pub use spec::spec_digest;
pub use step::{installed_steps, run_scheduled, ScheduledRun};

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
    // The label the Go agent would have put on it: a node switched from it in place keeps its
    // containers (docs/containers.md, "A node switched in place from the Go agent").
    let go = go_spec(ctx, c, &reads);
    let reasons: Vec<&str> =
        c.restart_on.iter().filter(|id| ctx.changed.contains(*id)).map(Id::as_str).collect();
    let want = Wanted {
        spec: &spec_now,
        legacy: legacy.as_deref(),
        go: go.as_deref(),
        reads: &reads,
        reasons: &reasons,
    };
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
    /// The digest of its spec as the Go agent computed it (`spec::go_spec`), when it can be
    /// matched at all.
    go: Option<&'a str>,
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
    // The Go's label folds in what the container reads, file by file, so a match is a
    // container made from this declaration, reading what the machine holds now.
    let by_go = want.go == Some(label);
    if (label == want.spec || legacy(label) || by_go) && want.reasons.is_empty() {
        let (action, detail, run) = if state.running {
            let detail = if by_go {
                Some("accepted as labelled by the Go agent; relabelled when it is next recreated".to_owned())
            } else {
                (label != want.spec).then(|| {
                    "accepted as labelled before mesh-host folded in the files a container reads; what it reads is recorded from now on".to_owned()
                })
            };
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::declaration::digest;

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
        Wanted { spec: "sha256:now", legacy: None, go: None, reads: NOTHING, reasons }
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

    #[test]
    fn a_container_at_the_go_agents_label_is_accepted_and_a_restart_on_still_recreates_it() {
        let want = Wanted { go: Some("0f0f"), ..wanted(&[]) };
        let found = container(true, &ours("0f0f"));
        let p = decide(Some(&found), None, None, &want);
        assert_eq!((p.action, &p.run, p.spec.as_str()), (Verb::Unchanged, &Run::Leave, "0f0f"));
        assert_eq!(
            p.detail.as_deref(),
            Some("accepted as labelled by the Go agent; relabelled when it is next recreated")
        );
        let p = decide(Some(&container(true, &ours("0f0e"))), None, None, &want);
        assert_eq!(p.action, Verb::Updated, "another Go label is no match");
        let p = decide(Some(&found), None, None, &Wanted { go: Some("0f0f"), ..wanted(&["web.conf"]) });
        assert_eq!(p.action, Verb::Updated, "a restart-on that moved recreates it as before");
    }
}
