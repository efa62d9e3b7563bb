//! `service`: a systemd unit's boot setting and state, through systemd's D-Bus API.

use super::{begin, named, Ctx, Error, Facts, Rising, Step, Verb};
use crate::declaration::{Boot, Kind, Resource, Service, ServiceState};
use crate::system::systemd::{self, Systemd, UnitState};

/// Looks at the unit, decides (`decide`, pure), then acts (`act`) unless this is a plan.
pub(super) fn apply(ctx: &mut Ctx<'_>, r: &Resource, s: &Service) -> Result<Step, Error> {
    let unit = s.unit.as_str();
    let restart_for = named(&s.restart_on, ctx.changed);
    let reload_for = named(&s.reload_on, ctx.changed);
    let want = Declared { state: s.state, boot: s.boot, restart_for: &restart_for, reload_for: &reload_for };
    let dry_run = ctx.opts.dry_run;
    // Whether the host has set this unit as declared before: a difference then is someone's
    // hand on the machine (corrected), not the host's first visit or a new declaration
    // (docs/systemd.md, "service", its outcomes).
    let set_before = ctx
        .store
        .get(r.id.as_str())
        .is_some_and(|rec| rec.kind == Kind::Service && *rec.target == *unit && rec.declared == r.digest);
    let sd = ctx.systemd()?;

    // Something this unit reflects changed in this pass, and it may be the unit's own file or a
    // drop-in: systemd keeps what it loaded until told to read them again, and a restart
    // without that runs the old definition. The same when systemd itself says the files
    // changed on disk: a start or enable must act on the unit as it is written now
    // (docs/systemd.md, "service": `restart-on`, and NeedDaemonReload).
    if !dry_run && (!restart_for.is_empty() || sd.needs_reload(unit)?) {
        sd.reload_manager()?;
    }

    let state = sd.state(unit)?;
    refuse(unit, &state, &want)?;
    let boot = s.boot.map(|_| sd.boot(unit)).transpose()?;
    let plan = decide(unit, &state, boot.as_deref(), &want, set_before)?;
    // Set when the unit was started or restarted: its second look is the pass's.
    let rising = if dry_run { None } else { act(sd, unit, &plan)? };
    Ok(rise(begin(r, plan.action, Some(plan.detail)), Some(Facts::default()), unit, rising))
}

/// What the declaration asks of a unit, and what it reflects that moved in this pass.
struct Declared<'a> {
    state: ServiceState,
    boot: Option<Boot>,
    /// The restart-on ids that moved in this pass.
    restart_for: &'a [String],
    /// The reload-on ids that moved in this pass.
    reload_for: &'a [String],
}

/// What to do with a unit, and what to report.
#[derive(Debug, PartialEq, Eq)]
struct Plan {
    /// The boot setting to make, where it differs.
    boot: Option<Boot>,
    run: Run,
    action: Verb,
    detail: String,
}

#[derive(Debug, PartialEq, Eq)]
enum Run {
    Leave,
    Start,
    /// Restarted for what moved, named.
    Restart(String),
    /// Reloaded for what moved, named.
    Reload(String),
    Stop,
}

/// What is refused at the first look, before anything else is asked of systemd.
fn refuse(unit: &str, state: &UnitState, want: &Declared<'_>) -> Result<(), Error> {
    if state.load == "not-found" {
        return Err(systemd::Error::NoUnit(unit.to_owned()).into());
    }
    // A masked unit cannot be started or enabled, and unmasking is a person's decision; one
    // declared stopped and disabled is already both (docs/systemd.md, "service").
    if state.load == "masked" && (want.state == ServiceState::Running || want.boot == Some(Boot::Enabled)) {
        return Err(systemd::Error::Masked(unit.to_owned()).into());
    }
    Ok(())
}

/// Decides what to do with a unit from its state and boot setting (`boot` is read only when
/// one is declared), what is declared, and whether the host set it as declared before. Pure.
fn decide(
    unit: &str,
    state: &UnitState,
    boot: Option<&str>,
    want: &Declared<'_>,
    set_before: bool,
) -> Result<Plan, Error> {
    let mut changes = Vec::new();
    let mut drifted = false;

    // Boot first. If the apply fails half way, enabled-and-stopped comes right at the next
    // boot; running-and-disabled does not (docs/systemd.md, "service").
    let set_boot = match (want.boot, boot) {
        (Some(wanted), Some(found)) if !boot_is(wanted, found) => {
            if wanted == Boot::Enabled && found == "static" {
                return Err(Error::StaticUnit { unit: unit.to_owned() });
            }
            changes.push(format!("boot {found} to {}", boot_word(wanted)));
            drifted = true;
            Some(wanted)
        }
        _ => None,
    };

    let run = match want.state {
        ServiceState::Running if !state.running() => {
            changes.push(format!("started (was {})", state.active));
            drifted = true;
            Run::Start
        }
        // Running already, and something it must reflect changed in this pass: a running
        // program does not read its configuration again by itself, so leaving it alone would
        // leave the machine right on disk and wrong in fact. It is not drift: the declaration's
        // own change moved it (docs/systemd.md, "service": `restart-on`).
        ServiceState::Running if !want.restart_for.is_empty() => {
            let why = want.restart_for.join(", ");
            changes.push(format!("restarted for {why}"));
            Run::Restart(why)
        }
        // Told to read its configuration again rather than stopped: for a service whose
        // restart would cut off what it serves. Restart wins when both are due, and a unit that
        // is down is started, which reads everything anew (docs/systemd.md, "service":
        // `reload-on`).
        ServiceState::Running if !want.reload_for.is_empty() => {
            let why = want.reload_for.join(", ");
            changes.push(format!("reloaded for {why}"));
            Run::Reload(why)
        }
        ServiceState::Stopped if !state.stopped() => {
            changes.push(format!("stopped (was {})", state.active));
            drifted = true;
            Run::Stop
        }
        ServiceState::Running | ServiceState::Stopped => Run::Leave,
    };

    let (action, detail) = if changes.is_empty() {
        (Verb::Unchanged, format!("{state}"))
    } else if drifted && set_before {
        (Verb::Corrected, format!("changed on the machine since the host set it: {}", changes.join(", ")))
    } else {
        (Verb::Updated, changes.join(", "))
    };
    Ok(Plan { boot: set_boot, run, action, detail })
}

/// Carries out a plan, reading back each change. Returns what was done to a unit that must
/// still be running at its second look ("was started"), if anything was.
fn act(sd: &Systemd, unit: &str, plan: &Plan) -> Result<Option<String>, Error> {
    if let Some(boot) = plan.boot {
        sd.set_boot(unit, boot == Boot::Enabled)?;
        let after = sd.boot(unit)?;
        if !boot_is(boot, &after) {
            return Err(Error::BootReadBack { unit: unit.to_owned(), wanted: boot_word(boot), found: after });
        }
    }
    match &plan.run {
        Run::Leave => Ok(None),
        Run::Start => {
            sd.start(unit)?;
            running_now(sd, unit, "was started")?;
            Ok(Some("was started".to_owned()))
        }
        Run::Restart(why) => {
            let what = format!("was restarted for {why}");
            sd.restart(unit)?;
            running_now(sd, unit, &what)?;
            Ok(Some(what))
        }
        Run::Reload(why) => {
            sd.reload(unit)?;
            let after = sd.state(unit)?;
            if !after.running() {
                return Err(Error::ReloadDied {
                    unit: unit.to_owned(),
                    why: why.clone(),
                    state: Box::new(after),
                });
            }
            Ok(None)
        }
        Run::Stop => {
            sd.stop(unit)?;
            let after = sd.state(unit)?;
            if !after.stopped() {
                return Err(Error::StillRunning { unit: unit.to_owned(), state: Box::new(after) });
            }
            Ok(None)
        }
    }
}

/// Done, or, for a unit just started, rising: its second look comes later in the pass.
pub(super) fn rise(outcome: super::Outcome, facts: Option<Facts>, unit: &str, what: Option<String>) -> Step {
    match what {
        Some(what) => Step::Rising(Box::new(Rising {
            outcome,
            facts,
            unit: unit.to_owned(),
            what,
            since: std::time::Instant::now(),
        })),
        None => Step::Done(outcome, facts),
    }
}

/// The first look at a unit just started: running now. The second, a moment later, is the
/// pass's (`Rising`).
pub(super) fn running_now(sd: &Systemd, unit: &str, what: &str) -> Result<(), Error> {
    let after = sd.state(unit)?;
    if after.running() {
        Ok(())
    } else {
        Err(died(unit, what, &after))
    }
}

/// A unit that did not stay up after it was started.
pub(super) fn died(unit: &str, what: &str, after: &UnitState) -> Error {
    Error::UnitDied { unit: unit.to_owned(), did: what.to_owned(), state: Box::new(after.clone()) }
}

fn boot_word(b: Boot) -> &'static str {
    match b {
        Boot::Enabled => "enabled",
        Boot::Disabled => "disabled",
    }
}

/// Whether systemd's unit file state satisfies the declaration. `static` units have no
/// `[Install]` section and a masked unit cannot start at all, so neither starts at boot.
fn boot_is(b: Boot, found: &str) -> bool {
    match b {
        Boot::Enabled => found == "enabled",
        Boot::Disabled => matches!(found, "disabled" | "static" | "masked"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_states_that_satisfy_the_declaration() {
        assert!(boot_is(Boot::Enabled, "enabled"));
        for s in ["disabled", "static", "masked", "indirect", "enabled-runtime", "linked"] {
            assert!(!boot_is(Boot::Enabled, s), "{s}");
        }
        for s in ["disabled", "static", "masked"] {
            assert!(boot_is(Boot::Disabled, s), "{s}");
        }
        for s in ["enabled", "enabled-runtime", "linked", "indirect"] {
            assert!(!boot_is(Boot::Disabled, s), "{s}");
        }
    }

    fn state(load: &str, active: &str, sub: &str) -> UnitState {
        UnitState { load: load.into(), active: active.into(), sub: sub.into() }
    }

    fn running() -> UnitState {
        state("loaded", "active", "running")
    }

    fn dead() -> UnitState {
        state("loaded", "inactive", "dead")
    }

    fn want(state: ServiceState, boot: Option<Boot>) -> Declared<'static> {
        Declared { state, boot, restart_for: &[], reload_for: &[] }
    }

    fn plan(found: &UnitState, boot: Option<&str>, want: &Declared<'_>, set_before: bool) -> Plan {
        decide("web.service", found, boot, want, set_before).unwrap()
    }

    #[test]
    fn a_missing_unit_is_refused_and_a_masked_one_only_when_it_must_start() {
        let up = want(ServiceState::Running, None);
        let down = want(ServiceState::Stopped, Some(Boot::Disabled));
        let refused =
            |found: &UnitState, w: &Declared<'_>| refuse("web.service", found, w).map_err(|e| e.to_string());
        assert_eq!(
            refused(&state("not-found", "inactive", "dead"), &down),
            Err("the unit web.service does not exist on this machine".to_owned())
        );
        let masked = state("masked", "inactive", "dead");
        assert!(matches!(
            refuse("web.service", &masked, &up),
            Err(Error::Systemd(systemd::Error::Masked(_)))
        ));
        let enabled = want(ServiceState::Stopped, Some(Boot::Enabled));
        assert!(matches!(
            refuse("web.service", &masked, &enabled),
            Err(Error::Systemd(systemd::Error::Masked(_)))
        ));
        assert_eq!(refused(&masked, &down), Ok(()), "stopped and disabled already");
        assert_eq!(refused(&running(), &up), Ok(()));
    }

    #[test]
    fn a_unit_as_declared_is_unchanged_and_says_its_state() {
        let p = plan(&running(), None, &want(ServiceState::Running, None), true);
        assert_eq!(
            p,
            Plan { boot: None, run: Run::Leave, action: Verb::Unchanged, detail: "active (running)".into() }
        );
        let p = plan(
            &state("loaded", "failed", "failed"),
            Some("disabled"),
            &want(ServiceState::Stopped, Some(Boot::Disabled)),
            true,
        );
        assert_eq!((p.run, p.action), (Run::Leave, Verb::Unchanged), "failed counts as stopped");
    }

    #[test]
    fn a_unit_stopped_by_hand_is_started_and_corrected_once_the_host_had_set_it() {
        let w = want(ServiceState::Running, None);
        let p = plan(&dead(), None, &w, true);
        assert_eq!((&p.run, p.action), (&Run::Start, Verb::Corrected));
        assert_eq!(p.detail, "changed on the machine since the host set it: started (was inactive)");
        // The host's first visit, or a declaration that changed: an update.
        let p = plan(&dead(), None, &w, false);
        assert_eq!(
            (&p.run, p.action, p.detail.as_str()),
            (&Run::Start, Verb::Updated, "started (was inactive)")
        );
        // And the other way.
        let p = plan(&running(), None, &want(ServiceState::Stopped, None), true);
        assert_eq!((&p.run, p.action), (&Run::Stop, Verb::Corrected));
        assert_eq!(p.detail, "changed on the machine since the host set it: stopped (was active)");
    }

    #[test]
    fn what_moved_restarts_or_reloads_a_running_unit_and_is_never_drift() {
        let moved = ["web.conf".to_owned(), "web.key".to_owned()];
        let w = Declared { restart_for: &moved, ..want(ServiceState::Running, None) };
        let p = plan(&running(), None, &w, true);
        assert_eq!((&p.run, p.action), (&Run::Restart("web.conf, web.key".into()), Verb::Updated));
        assert_eq!(p.detail, "restarted for web.conf, web.key");
        // Restart wins over reload; a unit that is down is started, which reads everything anew.
        let both = Declared { reload_for: &moved[..1], ..w };
        assert_eq!(plan(&running(), None, &both, true).run, Run::Restart("web.conf, web.key".into()));
        assert_eq!(plan(&dead(), None, &both, true).run, Run::Start);
        let reload = Declared { reload_for: &moved[..1], ..want(ServiceState::Running, None) };
        let p = plan(&running(), None, &reload, true);
        assert_eq!((&p.run, p.detail.as_str()), (&Run::Reload("web.conf".into()), "reloaded for web.conf"));
        // A stopped unit stays stopped, whatever moved.
        let stopped = Declared { restart_for: &moved, ..want(ServiceState::Stopped, None) };
        assert_eq!(plan(&dead(), None, &stopped, true).run, Run::Leave);
    }

    #[test]
    fn boot_is_set_first_and_a_static_unit_cannot_be_enabled() {
        let w = want(ServiceState::Running, Some(Boot::Enabled));
        let p = plan(&dead(), Some("disabled"), &w, true);
        assert_eq!(p.boot, Some(Boot::Enabled));
        assert_eq!(
            p.detail,
            "changed on the machine since the host set it: boot disabled to enabled, started (was inactive)"
        );
        assert_eq!(plan(&running(), Some("enabled"), &w, true).boot, None);
        assert!(matches!(
            decide("web.service", &running(), Some("static"), &w, true),
            Err(Error::StaticUnit { .. })
        ));
        // Static is as disabled as a unit gets.
        let off = want(ServiceState::Running, Some(Boot::Disabled));
        assert_eq!(plan(&running(), Some("static"), &off, true).action, Verb::Unchanged);
        let p = plan(&running(), Some("enabled"), &off, false);
        assert_eq!(
            (p.boot, p.action, p.detail.as_str()),
            (Some(Boot::Disabled), Verb::Updated, "boot enabled to disabled")
        );
    }
}
