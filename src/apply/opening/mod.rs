//! Openings: the host's filter, as one engine. The filter is one thing on the machine made
//! from many resources, so openings are not applied one by one: the pass sets them aside, and
//! once everything else has been applied the firewall step (here, on `Pass`) works the filter
//! out from all of them, in the one place it lives.
//!
//! Where it lives, by job:
//! - `nft`: the host's own table `inet mesh_host` as the driver's backend: worked out from every
//!   opening (`table_plan`, pure), compared with the table nft lists, replaced in one
//!   transaction if it differs, and read back whole; each opening's verdict is its own part of
//!   that comparison (its rules, found by their comment).
//! - `ufw` and `firewalld`: the firewall found in force on an adopted node, where the openings
//!   are made instead, and retired in the flip to the host's table.
//! - `found`: which firewall is in force on an adopted node, looked for before anything else.
//! - `plan`: where the openings live (`Home`, as their records say it) and the pure `plan` of
//!   what the step does about it: stay, make them in a found firewall, flip, go back, or wait.
//! - `driver`: the one driver of all three over the small `Backend` trait (read, held,
//!   compare into a `Plan` of data, act, read back once, tell): the host's table implements it
//!   whole (`nft`), ufw and firewalld one opening at a time through `Filter`. And the flip from
//!   either found firewall, the same for both.
//!
//! Architecture Invariant: where the filter lives is decided in `plan` alone, and only a full
//! pass that failed nothing moves it between firewalls.
//!
//! Loading it last is the order rule (spec, "Firewalls"): what protects the node goes last on
//! the way in. It also means a declaration that adds a service and its opening never has the
//! port open before the service's files are in place (docs/decisions.md, "The filter is loaded
//! after everything else in the pass"). The flip to the host's filter when `adoption` goes and
//! the way back when it returns are ordered so that what protects the node goes last on the
//! way in and first on the way back.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

use super::{Error, Facts, Failure, Outcome, Pass, PassFailed, Verb};
use crate::declaration::{Cidr, Declaration, Kind, Opening, Protocol, Resource, Spec};
use crate::store::{Record, Store};
use crate::system::firewall::Transport;

mod driver;
mod firewalld;
mod found;
mod nft;
mod plan;
mod ufw;

pub(super) use found::Found;
use plan::{plan, Backend, Home, Move, Scope, Step};

/// The transport of a declared protocol, as the machine layer names it.
pub(super) fn transport(p: Protocol) -> Transport {
    match p {
        Protocol::Tcp => Transport::Tcp,
        Protocol::Udp => Transport::Udp,
    }
}

/// A network with its host bits cleared, as nft lists it: `10.0.0.0/8` for `10.0.0.5/8`.
pub(super) fn network(c: &Cidr) -> (IpAddr, u8) {
    let addr = match c.addr {
        IpAddr::V4(a) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(c.prefix)).unwrap_or(0);
            IpAddr::V4((u32::from(a) & mask).into())
        }
        IpAddr::V6(a) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(c.prefix)).unwrap_or(0);
            IpAddr::V6((u128::from(a) & mask).into())
        }
    };
    (addr, c.prefix)
}

/// What happened to one declared opening, from plain values.
pub(super) struct Seen<'a> {
    /// Its record: whether it was declared the same when last applied.
    pub recorded: Option<bool>,
    /// Its rules in the table found are exactly the ones wanted.
    pub intact: bool,
    /// The table was absent.
    pub table_absent: bool,
    /// What else of the table was changed by hand, reported on the first opening only.
    pub common: &'a [String],
}

/// The outcome word and detail of one opening.
pub(super) fn decide(seen: &Seen<'_>) -> (Verb, Option<String>) {
    // "corrected" already says it was put back; the detail says what had been done to it. A hand
    // change outside every opening's rules is told on the first opening only, so one edit counts
    // as drift once (docs/decisions.md, "A hand change to the table outside any opening's
    // rules").
    let by_hand = |what: String| (Verb::Corrected, Some(what));
    match (seen.recorded, seen.intact) {
        (Some(true), true) if !seen.common.is_empty() => {
            by_hand(format!("table inet mesh_host had been changed by hand: {}", seen.common.join(", ")))
        }
        (_, true) => (Verb::Unchanged, None),
        (Some(true), false) if seen.table_absent => {
            by_hand("table inet mesh_host had been deleted by hand".to_owned())
        }
        (Some(true), false) => by_hand("its rule had been changed or deleted by hand".to_owned()),
        (Some(false), false) => (Verb::Updated, None),
        (None, false) => (Verb::Created, None),
    }
}

/// Whether an opening may be held: the declaration is an adopted node's, its module is not
/// taken, and the host has no record of it.
pub(super) fn holdable(declaration: &Declaration, store: &Store, r: &Resource) -> bool {
    declaration.adoption.as_ref().is_some_and(|a| !a.taken.iter().any(|m| m == r.id.module()))
        && store.get(r.id.as_str()).is_none()
}

/// Whether an opening that may be held is: held before (a hold lasts until its module is taken,
/// whatever became of the port since), or its port found open now (docs/decisions.md, "An
/// opening is held"; "A hold is remembered").
pub(super) fn held_now(store: &Store, r: &Resource, found_open: bool) -> bool {
    store.held(r.id.as_str()).is_some() || found_open
}

pub(super) fn held_detail(r: &Resource) -> String {
    format!("found open, and module {:?} is not taken yet: left open as found", r.id.module())
}

/// What became of an orphan opening: the outcome word and its detail.
pub(super) type Left = (Verb, Option<String>);

/// What the firewall step did with each opening.
#[derive(Default)]
pub(super) struct Done {
    /// Each declared opening's outcome, by its index in the declaration.
    pub declared: Vec<(usize, Result<Outcome, Error>)>,
    /// Each orphan opening's outcome, with its record.
    pub orphans: Vec<(String, Record, Result<Left, Error>)>,
    /// The listening ports the host's table closed, or would close, to new connections: told
    /// on the first declared opening, and again by the flip that loaded that table.
    pub closes: Vec<nft::Closed>,
}

/// Every declared opening, with its fields.
pub(super) fn declared_openings(declaration: &Declaration) -> Vec<(&Resource, &Opening)> {
    declaration
        .resources
        .iter()
        .filter_map(|r| match &r.spec {
            Spec::Opening(o) => Some((r, o)),
            Spec::Directory(_)
            | Spec::File(_)
            | Spec::Access(_)
            | Spec::Package(_)
            | Spec::Service(_)
            | Spec::Container(_)
            | Spec::Network(_)
            | Spec::User(_)
            | Spec::Archive(_)
            | Spec::Process(_)
            | Spec::Action(_) => None,
        })
        .collect()
}

/// Why a move that is due waits, said to every opening: `failed` others in a full pass, or
/// none in a reconcile of some keys.
fn waits(due: Move, failed: Option<usize>) -> Error {
    match (due, failed) {
        (Move::Flip(b), Some(failed)) => Error::FlipWaits { from: b.name(), failed },
        (Move::WayBack(b), Some(failed)) => Error::WayBackWaits { to: b.name(), failed },
        (Move::Flip(b), None) => Error::FlipWaitsForFullPass { from: b.name() },
        (Move::WayBack(b), None) => Error::WayBackWaitsForFullPass { to: b.name() },
    }
}

impl Done {
    /// Every declared opening and every orphan failed with one error.
    pub(super) fn failed(
        declared: &[(&Resource, &Opening)],
        orphans: Vec<(String, Record)>,
        e: impl Fn() -> Error,
    ) -> Done {
        Done {
            declared: declared.iter().map(|(r, _)| (r.index(), Err(e()))).collect(),
            orphans: orphans.into_iter().map(|(id, rec)| (id, rec, Err(e()))).collect(),
            closes: Vec::new(),
        }
    }
}

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
        match found::found_firewall(self.opts.bus.as_deref()) {
            Ok(found) => {
                self.found = found;
                Ok(())
            }
            Err(refused) => {
                let failure = Failure {
                    id: "the firewall found on this machine".to_owned(),
                    kind: Kind::Opening,
                    target: "the input hook".to_owned(),
                    message: refused.to_string(),
                    raced: false,
                };
                Err(PassFailed {
                    resource: failure.id.clone(),
                    message: failure.message.clone(),
                    others: 0,
                    gated: false,
                    refused: true,
                    failures: vec![failure],
                })
            }
        }
    }

    /// The firewall step behind firewalld, found running on an adopted node: the openings are
    /// made in it, and the host's own table, if one is there, removed once they read back.
    fn in_firewalld(&self, orphans: Vec<(String, Record)>) -> Done {
        match crate::system::firewalld::Firewalld::running(self.opts.bus.as_deref()) {
            Ok(Some(fw)) => {
                let done = firewalld::apply(self.declaration, self.store, self.opts, orphans, &fw);
                nft::without_own_table(done, self.opts, "firewalld")
            }
            found => {
                let e = match found {
                    Err(e) => e,
                    Ok(_) => crate::system::firewalld::Error::NotRunning(
                        "gone: it stopped during this pass".to_owned(),
                    ),
                };
                let e = Arc::new(e);
                Done::failed(&declared_openings(self.declaration), orphans, || Error::Firewalld(e.clone()))
            }
        }
    }

    /// Where the records of this origin's openings say they live, read once.
    fn home(&self) -> Home {
        Home::of(
            self.store
                .records()
                .filter(|(_, rec)| rec.kind == Kind::Opening && rec.origin == self.opts.origin)
                .map(|(_, rec)| Home::parse(rec.spec())),
        )
    }

    /// The firewall step: where the filter lives read once from the records, what to do about
    /// it decided by `plan`, then run; every opening is reported and recorded from what it did.
    /// `whole`: the pass is a full one, not a reconcile of some keys, which never moves the
    /// filter between firewalls (docs/decisions.md, "The flip and the way back wait for a full
    /// pass that fails nothing").
    pub(super) fn firewall(&mut self, whole: bool) {
        let orphans = std::mem::take(&mut self.orphan_openings);
        let scope = if whole { Scope::Full { failed: self.failures.len() } } else { Scope::Keys };
        let step = plan(self.found, self.home(), self.declaration.adoption.is_some(), scope);
        let (declaration, store, opts) = (self.declaration, &*self.store, self.opts);
        let done = match step {
            Step::Waits { due, failed } => return self.fail_openings(&waits(due, failed)),
            Step::Own { .. } => nft::apply(declaration, store, opts, orphans),
            Step::In(Backend::Firewalld) => self.in_firewalld(orphans),
            // Behind ufw, found active; and the way back to it, where ufw is enabled once its
            // openings are saved. The host's own table goes once they read back in ufw.
            Step::In(Backend::Ufw) | Step::Move(Move::WayBack(Backend::Ufw)) => {
                let enable = step != Step::In(Backend::Ufw);
                nft::without_own_table(ufw::apply_ufw(declaration, store, opts, orphans, enable), opts, "ufw")
            }
            Step::Move(Move::Flip(Backend::Ufw)) => ufw::flip(declaration, store, opts, orphans),
            Step::Move(Move::Flip(Backend::Firewalld)) => firewalld::flip(declaration, store, opts, orphans),
            Step::Move(Move::WayBack(Backend::Firewalld)) => {
                firewalld::way_back(declaration, store, opts, orphans)
            }
        };
        self.take_done(done, step.record());
    }

    /// Fails every opening set aside with `why`, leaving the filter in force and every record
    /// (orphans' included) as they are, for the pass that may move it.
    fn fail_openings(&mut self, why: &Error) {
        let declaration = self.declaration;
        for (index, _) in std::mem::take(&mut self.openings) {
            self.fail(&declaration.resources[index], why);
        }
    }

    /// Reports and records what the firewall step did with each opening: `home` is what the
    /// records say of where the openings are.
    fn take_done(&mut self, done: Done, home: Home) {
        let facts = || Facts { spec: home.spec().map(str::to_owned), ..Facts::default() };
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

/// What the unit tests of the firewall's files share.
#[cfg(test)]
pub(super) mod testing {
    use crate::declaration::Opening;

    /// An opening, as a declaration would give it.
    pub fn opening(port: u16, protocol: &str, from: &[&str]) -> Opening {
        serde_json::from_value(serde_json::json!({"port": port, "protocol": protocol, "from": from})).unwrap()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drift_is_told_from_a_change_of_declaration() {
        let seen = |recorded, intact, table_absent, common: &'static [String]| {
            decide(&Seen { recorded, intact, table_absent, common })
        };
        assert_eq!(seen(None, false, true, &[]).0, Verb::Created);
        assert_eq!(seen(Some(true), true, false, &[]), (Verb::Unchanged, None));
        assert_eq!(seen(Some(false), false, false, &[]).0, Verb::Updated, "declared otherwise: updated");
        let (verb, said) = seen(Some(true), false, false, &[]);
        assert_eq!(
            (verb, said.unwrap()),
            (Verb::Corrected, "its rule had been changed or deleted by hand".into())
        );
        let (verb, said) = seen(Some(true), false, true, &[]);
        assert_eq!(
            (verb, said.unwrap()),
            (Verb::Corrected, "table inet mesh_host had been deleted by hand".into())
        );
        let common = Box::leak(Box::new(vec!["its rules were reordered".to_owned()]));
        assert_eq!(seen(Some(true), true, false, common).0, Verb::Corrected);
        assert_eq!(
            seen(None, true, false, common).0,
            Verb::Unchanged,
            "nothing of its own was found changed"
        );
    }
}
