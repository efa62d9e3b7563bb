//! The second look at units: a unit just started is done only if it is still running
//! `UNIT_SECOND_LOOK` later. Apart because the pass looks at all the units it started at once,
//! before a gate or at its end, rather than each holding the pass.

use super::{service, Facts, Managers, Outcome, Pass};
use crate::system::systemd::UNIT_SECOND_LOOK;

/// A unit just started (or restarted, or replaced): running at the first look, and done only if
/// it still is `UNIT_SECOND_LOOK` later. A simple service counts as started once its process is forked, so
/// one that exits at once on a bad configuration passes the first look and not the second. The
/// second look is the pass's: units started one after another settle together, before the next
/// gate or at the end of the pass, rather than each holding the pass for `UNIT_SECOND_LOOK`.
pub(super) struct Rising {
    pub(super) outcome: Outcome,
    pub(super) facts: Option<Facts>,
    pub(super) unit: String,
    /// What was done to it, for the message if it died ("was started").
    pub(super) what: String,
    pub(super) since: std::time::Instant,
}

impl Pass<'_> {
    /// The second look at the units started since the last one: once `UNIT_SECOND_LOOK` has passed since
    /// the latest start, each still running is done and recorded; one that died is an error.
    pub(super) fn second_look(&mut self, machine: &mut Managers) {
        let Some(latest) = self.rising.iter().map(|(_, _, r)| r.since).max() else { return };
        std::thread::sleep((latest + UNIT_SECOND_LOOK).saturating_duration_since(std::time::Instant::now()));
        let declaration = self.declaration;
        for (slot, index, rising) in std::mem::take(&mut self.rising) {
            let resource = &declaration.resources[index];
            let Rising { outcome, facts, unit, what, since: _ } = *rising;
            let second = machine.systemd(self.opts.bus.as_deref()).and_then(|sd| Ok(sd.state(&unit)?));
            match second {
                Ok(state) if state.running() => {
                    self.slots[slot] = Some(self.record(resource, outcome, facts))
                }
                Ok(state) => self.fail(resource, &service::died(&unit, &what, &state)),
                Err(e) => self.fail(resource, &e),
            }
        }
    }
}
