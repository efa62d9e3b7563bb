//! `process`: a long-running program supervised by systemd as a transient unit that the host
//! starts over D-Bus.
//!
//! The unit is `mesh-host-<name>.service`. Its description carries the digest of what it runs
//! (command, environment, user), so the running unit itself says whether it is the one the
//! declaration describes; a different digest means the unit is replaced.

use super::service::{rise, running_now};
use super::{begin, named, Ctx, Error, Facts, Step, Verb};
use crate::declaration::{digest, Kind, Process, Resource};
use crate::system::systemd::Transient;

/// The transient unit a process runs as.
pub(super) fn unit_name(name: &str) -> String {
    Process::unit_name(name)
}

/// The digest of what the unit runs. restart-on is not in it: a change it names restarts the
/// program, it does not make the program a different one.
fn spec_digest(p: &Process) -> String {
    let spec = serde_json::json!({"command": p.command.as_slice(), "env": p.env, "user": p.user.as_ref().map(|u| u.as_str())});
    digest(spec.to_string().as_bytes()).to_string()
}

fn description(name: &str, spec: &str) -> String {
    format!("mesh-host process {name}, spec {spec}")
}

/// The digest a description carries, if it is one the host wrote.
fn described_spec(description: &str) -> Option<&str> {
    description.rsplit_once(", spec ").map(|(_, d)| d).filter(|d| d.starts_with("sha256:"))
}

pub(super) fn apply(ctx: &mut Ctx<'_>, r: &Resource, p: &Process) -> Result<Step, Error> {
    let name = p.name.as_str();
    let unit = unit_name(name);
    let want = spec_digest(p);
    let restart_for = named(&p.restart_on, ctx.changed);
    let dry_run = ctx.opts.dry_run;
    let recorded =
        ctx.store.get(r.id.as_str()).is_some_and(|rec| rec.kind == Kind::Process && *rec.target == *name);
    let sd = ctx.systemd()?;
    let facts = Some(Facts { spec: Some(want.clone()), ..Facts::default() });

    let before = sd.state(&unit)?;
    let running_spec = if before.exists() && !before.stopped() { Some(sd.description(&unit)?) } else { None };
    let env: Vec<String> = p.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let desc = description(name, &want);
    let transient = Transient {
        unit: &unit,
        description: &desc,
        argv: p.command.as_slice(),
        env,
        user: p.user.as_ref().map(|u| u.as_str()),
    };

    let (action, detail, what) = match running_spec.as_deref().map(described_spec) {
        Some(Some(spec)) if spec == want => {
            if !before.running() {
                // Supervised and coming back (auto-restart), or on its way down: either way,
                // not a program that stays up, and an error until it does (docs/systemd.md,
                // "process").
                return Err(Error::UnitKeepsExiting { unit: unit.clone(), state: Box::new(before.clone()) });
            }
            if restart_for.is_empty() {
                return Ok(Step::Done(begin(r, Verb::Unchanged, Some(format!("{unit} {before}"))), facts));
            }
            let why = restart_for.join(", ");
            if !dry_run {
                sd.restart(&unit)?;
                running_now(sd, &unit, &format!("was restarted for {why}"))?;
            }
            let what = (!dry_run).then(|| format!("was restarted for {why}"));
            (Verb::Updated, format!("{unit} restarted for {why}"), what)
        }
        Some(_) => {
            // Running something else: a changed command, environment or user, or a unit of
            // that name the host did not start. Stopped, then started anew as declared: the
            // digest in its description says which (docs/systemd.md, "process").
            if !dry_run {
                sd.stop(&unit)?;
                sd.reset_failed(&unit)?;
                sd.start_transient(&transient)?;
                running_now(sd, &unit, "was replaced")?;
                check_spec(ctx, &unit, &want)?;
            }
            let what = (!dry_run).then(|| "was replaced".to_owned());
            (Verb::Updated, format!("{unit} replaced: its command, environment or user changed"), what)
        }
        None => {
            if !dry_run {
                // A failed unit of this name that was not collected yet would refuse a new one.
                sd.reset_failed(&unit)?;
                sd.start_transient(&transient)?;
                running_now(sd, &unit, "was started")?;
                check_spec(ctx, &unit, &want)?;
            }
            let what = (!dry_run).then(|| "was started".to_owned());
            if recorded {
                (Verb::Corrected, format!("{unit} was no longer running; started again"), what)
            } else {
                (Verb::Created, format!("started as {unit}"), what)
            }
        }
    };
    Ok(rise(begin(r, action, Some(detail)), facts, &unit, what))
}

/// Reads back that the unit now running is the one just asked for.
fn check_spec(ctx: &mut Ctx<'_>, unit: &str, want: &str) -> Result<(), Error> {
    let found = ctx.systemd()?.description(unit)?;
    match described_spec(&found) {
        Some(spec) if spec == want => Ok(()),
        _ => Err(Error::UnitSpec { unit: unit.to_owned(), wanted: want.to_owned(), described: found }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn process(json: serde_json::Value) -> Process {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn the_spec_digest_changes_with_command_env_and_user_only() {
        let base = process(serde_json::json!({"name": "w", "command": ["/bin/w"], "env": {"A": "1"}}));
        let d = spec_digest(&base);
        let same = process(
            serde_json::json!({"name": "w", "command": ["/bin/w"], "env": {"A": "1"}, "restart-on": ["x.y"]}),
        );
        assert_eq!(spec_digest(&same), d, "restart-on restarts, it does not replace");
        for other in [
            serde_json::json!({"name": "w", "command": ["/bin/w", "-v"], "env": {"A": "1"}}),
            serde_json::json!({"name": "w", "command": ["/bin/w"], "env": {"A": "2"}}),
            serde_json::json!({"name": "w", "command": ["/bin/w"], "env": {"A": "1"}, "user": "nobody"}),
        ] {
            assert_ne!(spec_digest(&process(other)), d);
        }
    }

    #[test]
    fn the_description_carries_the_digest_back() {
        let d = description("web", "sha256:abc");
        assert_eq!(d, "mesh-host process web, spec sha256:abc");
        assert_eq!(described_spec(&d), Some("sha256:abc"));
        assert_eq!(described_spec("/bin/sleep 1000"), None);
        assert_eq!(described_spec("something, spec unknown"), None);
        assert_eq!(unit_name("web"), "mesh-host-web.service");
    }
}
