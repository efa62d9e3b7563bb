//! The firewall step of a pass: the firewall found in force looked for first, then, after
//! everything else, every opening loaded at once into the host's own table, ufw or firewalld,
//! with the flips between them. Apart because it is one step for all openings, not one each.

use std::collections::{BTreeMap, BTreeSet};

use super::{firewalld, opening, Error, Facts, Failure, Pass, PassFailed, Verb};
use crate::declaration::{Kind, Spec};
use crate::store::Record;

impl Pass<'_> {
    /// On an adopted node, looks for the firewall found in force before anything else, and
    /// keeps it in `found`: one the host cannot manage refuses the whole declaration, with
    /// nothing touched, so its error is the pass's whole report.
    pub(super) fn look_for_firewall(&mut self, only: Option<&BTreeSet<usize>>) -> Result<(), PassFailed> {
        // Only a pass that reaches the openings looks: a reconcile of one file does not run ufw.
        let reaches_openings = only.is_none_or(|only| {
            only.iter().any(|&i| matches!(self.declaration.resources[i].spec, Spec::Opening(_)))
        });
        if self.declaration.adoption.is_none() || !reaches_openings {
            return Ok(());
        }
        match opening::found_firewall(self.opts.bus.as_deref()) {
            Ok(found) => {
                self.found = found;
                Ok(())
            }
            Err(message) => {
                let failure = Failure {
                    id: "the firewall found on this machine".to_owned(),
                    kind: Kind::Opening,
                    target: "the input hook".to_owned(),
                    message,
                    raced: false,
                };
                Err(PassFailed {
                    resource: failure.id.clone(),
                    message: failure.message.clone(),
                    others: 0,
                    gated: false,
                    failures: vec![failure],
                })
            }
        }
    }

    /// The firewall step behind firewalld, found running on an adopted node: the openings are
    /// made in it, and the host's own table, if one is there, removed once they read back.
    pub(super) fn firewall_in_firewalld(&mut self, orphans: Vec<(String, Record)>) {
        let done = match crate::system::firewalld::Firewalld::running(self.opts.bus.as_deref()) {
            Ok(Some(fw)) => {
                let done = firewalld::apply(self.declaration, self.store, self.opts, orphans, &fw);
                opening::without_own_table(done, self.opts, "firewalld")
            }
            found => {
                let e = match found {
                    Err(e) => e,
                    Ok(_) => crate::system::firewalld::Error::NotRunning(
                        "gone: it stopped during this pass".to_owned(),
                    ),
                };
                let e = std::sync::Arc::new(e);
                opening::Done {
                    declared: opening::declared_openings(self.declaration)
                        .into_iter()
                        .map(|(r, _)| (r.index, Err(Error::Firewalld(e.clone()))))
                        .collect(),
                    orphans: orphans
                        .into_iter()
                        .map(|(id, rec)| (id, rec, Err(Error::Firewalld(e.clone()))))
                        .collect(),
                }
            }
        };
        self.take_done(done, Some(firewalld::FIREWALLD));
    }

    /// The firewall step: the host's filter from every declared opening, loaded once, after
    /// everything else; orphan openings leave it in the same load. `whole`: the pass is a full
    /// one, not a reconcile of some keys, which never moves the filter between firewalls.
    pub(super) fn firewall(&mut self, whole: bool) {
        let orphans = std::mem::take(&mut self.orphan_openings);
        if self.found == opening::Found::Firewalld {
            return self.firewall_in_firewalld(orphans);
        }
        let recorded_in = |spec: &str| {
            self.store.records().any(|(_, rec)| {
                rec.kind == Kind::Opening && rec.origin == self.opts.origin && rec.spec() == Some(spec)
            })
        };
        // The same two orders with firewalld: the flip once the declaration no longer says
        // `adoption` (only after a clean pass), and the way back when it says it again.
        let adopted = self.declaration.adoption.is_some();
        let fw_flipping = !adopted && recorded_in(firewalld::FIREWALLD);
        let fw_retired = recorded_in(firewalld::FIREWALLD_RETIRED);
        if fw_flipping || fw_retired {
            let declaration = self.declaration;
            let moving = fw_flipping || adopted;
            if let Some(waits) = self.move_waits(moving, whole, fw_flipping, "firewalld") {
                return self.fail_openings(&waits);
            }
            let (done, spec) = if fw_flipping {
                (firewalld::flip(declaration, self.store, self.opts, orphans), firewalld::FIREWALLD_RETIRED)
            } else if adopted {
                (firewalld::way_back(declaration, self.store, self.opts, orphans), firewalld::FIREWALLD)
            } else {
                (opening::apply(declaration, self.store, self.opts, orphans), firewalld::FIREWALLD_RETIRED)
            };
            return self.take_done(done, Some(spec));
        }
        let in_ufw = self.found == opening::Found::Ufw;
        // The flip: a node adopted behind ufw whose declaration no longer says `adoption`. What
        // protects the node goes last: only once everything else applied without failure.
        let flipping = !in_ufw
            && self.declaration.adoption.is_none()
            && self.store.records().any(|(_, rec)| {
                rec.kind == Kind::Opening
                    && rec.origin == self.opts.origin
                    && rec.spec() == Some(opening::UFW)
            });
        let opening_spec = |spec: &str| {
            self.store.records().any(|(_, rec)| {
                rec.kind == Kind::Opening && rec.origin == self.opts.origin && rec.spec() == Some(spec)
            })
        };
        // The way back: a declaration with `adoption` returning to a node whose ufw the host
        // retired. Its openings go into ufw, ufw is enabled, and only then does the host's own
        // table go: the mirror of the flip. Like the flip, it waits for a full pass that fails
        // nothing; the host's table protects the node meanwhile (docs/decisions.md, "The flip
        // and the way back wait for a full pass that fails nothing").
        let retired = opening_spec(opening::UFW_RETIRED);
        let returning = !in_ufw && self.declaration.adoption.is_some() && retired;
        if let Some(waits) = self.move_waits(flipping || returning, whole, flipping, "ufw") {
            return self.fail_openings(&waits);
        }
        let done = if in_ufw || returning {
            let done = opening::apply_ufw(self.declaration, self.store, self.opts, orphans, returning);
            opening::without_own_table(done, self.opts, "ufw")
        } else if flipping {
            opening::flip(self.declaration, self.store, self.opts, orphans)
        } else {
            opening::apply(self.declaration, self.store, self.opts, orphans)
        };
        let spec = if in_ufw || returning {
            Some(opening::UFW)
        } else if flipping || retired {
            Some(opening::UFW_RETIRED)
        } else {
            None
        };
        self.take_done(done, spec);
    }

    /// Why a move between the found firewall and the host's own table (`flip`: to the host's;
    /// otherwise the way back to `found`) waits, if it does: it runs only in a full pass in
    /// which nothing else failed. A reconcile of one key (an `nft monitor` event) knows nothing
    /// of how the rest of the declaration stands, and a failure elsewhere in the pass may be
    /// what the port serves; meanwhile the filter in force keeps protecting the node
    /// (docs/decisions.md, "The flip and the way back wait for a full pass that fails nothing").
    fn move_waits(&self, moving: bool, whole: bool, flip: bool, found: &'static str) -> Option<Error> {
        let failed = self.failures.len();
        match (moving, whole, flip) {
            (false, _, _) => None,
            (true, false, true) => Some(Error::FlipWaitsForFullPass { from: found }),
            (true, false, false) => Some(Error::WayBackWaitsForFullPass { to: found }),
            (true, true, _) if failed == 0 => None,
            (true, true, true) => Some(Error::FlipWaits { from: found, failed }),
            (true, true, false) => Some(Error::WayBackWaits { to: found, failed }),
        }
    }

    /// Fails every opening set aside with `why`, leaving the filter in force and every record
    /// (orphans' included) as they are, for the pass that may move it.
    fn fail_openings(&mut self, why: &Error) {
        let declaration = self.declaration;
        for (index, _) in std::mem::take(&mut self.openings) {
            self.fail(&declaration.resources[index], why);
        }
    }

    /// Reports and records what the firewall step did with each opening: `spec` is what the
    /// records say of where the openings are (ufw, firewalld, retired), none for the host's own
    /// table alone.
    pub(super) fn take_done(&mut self, done: opening::Done, spec: Option<&str>) {
        let facts = || Facts { spec: spec.map(str::to_owned), ..Facts::default() };
        let slots: BTreeMap<usize, usize> = self.openings.iter().copied().collect();
        let declaration = self.declaration;
        for (index, result) in done.declared {
            let resource = &declaration.resources[index];
            // A held opening is reported and never recorded: it is not the host's yet. The hold
            // is remembered, as every type's is, until its module is taken.
            let result = match result {
                Ok(outcome) if outcome.action == Verb::Held => {
                    if !self.opts.dry_run {
                        let held = crate::store::Held {
                            kind: resource.kind(),
                            target: resource.target().into_boxed_str(),
                            origin: self.opts.origin,
                        };
                        self.store.hold(resource.id.as_str(), held);
                    }
                    match slots.get(&index) {
                        Some(&slot) => self.slots[slot] = Some(outcome),
                        None => self.slots.push(Some(outcome)),
                    }
                    continue;
                }
                other => other,
            };
            match (result, slots.get(&index)) {
                (Ok(outcome), Some(&slot)) => {
                    self.slots[slot] = Some(self.record(resource, outcome, Some(facts())))
                }
                // An opening outside a reconcile's selection is loaded with the others (the
                // filter is one), reported and recorded like them.
                (Ok(outcome), None) => {
                    let outcome = self.record(resource, outcome, Some(facts()));
                    self.slots.push(Some(outcome));
                }
                (Err(e), _) => self.fail(resource, &e),
            }
        }
        for (id, record, result) in done.orphans {
            self.orphan_told(id, record, result);
        }
    }

    /// A gate failed, so not every opening was reached: the filter is left as it was, its
    /// orphans stay recorded, and each opening set aside says why it was not loaded.
    pub(super) fn firewall_held_by_gate(&mut self) {
        let declaration = self.declaration;
        for (index, _) in std::mem::take(&mut self.openings) {
            let r = &declaration.resources[index];
            self.failures.push(Failure {
                id: r.id.to_string(),
                kind: r.kind(),
                target: r.target(),
                message: "not loaded: a gate failed in this pass, and the filter is loaded only with every opening reached; it was left as it was".to_owned(),
                raced: false,
            });
        }
    }
}
