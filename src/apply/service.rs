//! `service`: a systemd unit's boot setting and state, through systemd's D-Bus API.

use super::{begin, named, Action, Ctx, Error, Facts, Rising, Step};
use crate::declaration::{Boot, Kind, Resource, Service, ServiceState};
use crate::system::systemd::{Systemd, SystemdError, UnitState};

pub(super) fn apply(ctx: &mut Ctx<'_>, r: &Resource, s: &Service) -> Result<Step, Error> {
    let unit = s.unit.as_str();
    let restart_for = named(&s.restart_on, ctx.changed);
    let reload_for = named(&s.reload_on, ctx.changed);
    let dry_run = ctx.opts.dry_run;
    // Whether the host has set this unit as declared before: a difference then is someone's
    // hand on the machine (corrected), not the host's first visit or a new declaration.
    let settled_before = ctx
        .store
        .get(r.id.as_str())
        .is_some_and(|rec| rec.kind == Kind::Service && *rec.target == *unit && rec.declared == r.digest);
    let sd = ctx.systemd()?;

    // Something this unit reflects changed in this pass, and it may be the unit's own file or a
    // drop-in: systemd keeps what it loaded until told to read them again, and a restart
    // without that runs the old definition. The same when systemd itself says the files
    // changed on disk: a start or enable must act on the unit as it is written now.
    if !dry_run && (!restart_for.is_empty() || sd.needs_reload(unit)?) {
        sd.reload_manager()?;
    }

    let before = sd.state(unit)?;
    if before.load == "not-found" {
        return Err(SystemdError::NoUnit(unit.to_owned()).into());
    }
    // A masked unit cannot be started or enabled, and unmasking is a person's decision; one
    // declared stopped and disabled is already both.
    if before.load == "masked" && (s.state == ServiceState::Running || s.boot == Some(Boot::Enabled)) {
        return Err(SystemdError::Masked(unit.to_owned()).into());
    }

    let mut changes = Vec::new();
    let mut drifted = false;
    // Set when the unit was started or restarted: its second look is the pass's.
    let mut rising = None;

    // Boot first. If the apply fails half way, enabled-and-stopped comes right at the next
    // boot; running-and-disabled does not.
    if let Some(boot) = s.boot {
        let found = sd.boot(unit)?;
        if !boot_is(boot, &found) {
            let wanted = boot_word(boot);
            if boot == Boot::Enabled && found == "static" {
                return Err(Error::StaticUnit { unit: unit.to_owned() });
            }
            if !dry_run {
                sd.set_boot(unit, boot == Boot::Enabled)?;
                let after = sd.boot(unit)?;
                if !boot_is(boot, &after) {
                    return Err(Error::BootReadBack { unit: unit.to_owned(), wanted, found: after });
                }
            }
            changes.push(format!("boot {found} to {wanted}"));
            drifted = true;
        }
    }

    match s.state {
        ServiceState::Running if !before.running() => {
            if !dry_run {
                sd.start(unit)?;
                running_now(sd, unit, "was started")?;
                rising = Some("was started".to_owned());
            }
            changes.push(format!("started (was {})", before.active));
            drifted = true;
        }
        ServiceState::Running if !restart_for.is_empty() => {
            // Running already, and something it must reflect changed in this pass: a running
            // program does not read its configuration again by itself, so leaving it alone
            // would leave the machine right on disk and wrong in fact.
            let why = restart_for.join(", ");
            if !dry_run {
                sd.restart(unit)?;
                running_now(sd, unit, &format!("was restarted for {why}"))?;
                rising = Some(format!("was restarted for {why}"));
            }
            changes.push(format!("restarted for {why}"));
        }
        ServiceState::Running if !reload_for.is_empty() => {
            // Told to read its configuration again rather than stopped: for a service whose
            // restart would cut off what it serves.
            let why = reload_for.join(", ");
            if !dry_run {
                sd.reload(unit)?;
                let after = sd.state(unit)?;
                if !after.running() {
                    return Err(Error::ReloadDied { unit: unit.to_owned(), why, state: Box::new(after) });
                }
            }
            changes.push(format!("reloaded for {why}"));
        }
        ServiceState::Running => {}
        ServiceState::Stopped if !before.stopped() => {
            if !dry_run {
                sd.stop(unit)?;
                let after = sd.state(unit)?;
                if !after.stopped() {
                    return Err(Error::StillRunning { unit: unit.to_owned(), state: Box::new(after) });
                }
            }
            changes.push(format!("stopped (was {})", before.active));
            drifted = true;
        }
        ServiceState::Stopped => {}
    }

    let (action, detail) = if changes.is_empty() {
        (Action::Unchanged, format!("{before}"))
    } else if drifted && settled_before {
        (Action::Corrected, format!("changed on the machine since the host set it: {}", changes.join(", ")))
    } else {
        (Action::Updated, changes.join(", "))
    };
    let outcome = begin(r, action, Some(detail));
    Ok(rise(outcome, Some(Facts::default()), unit, rising))
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
/// [Install] section and a masked unit cannot start at all, so neither starts at boot.
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
}
