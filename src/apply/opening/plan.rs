//! Where the filter lives and what the firewall step does about it, as types: `Home` is what
//! the openings' records say, `Step` what the step does, and `plan` the one place that decides,
//! pure and tested over every transition without root.

use super::Found;

/// A firewall found on an adopted node that the host makes openings in, flips from and goes
/// back to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Backend {
    Ufw,
    Firewalld,
}

impl Backend {
    /// Its name, as messages say it.
    pub(super) fn name(self) -> &'static str {
        match self {
            Backend::Ufw => "ufw",
            Backend::Firewalld => "firewalld",
        }
    }

    /// Where openings made in it live.
    pub(super) fn home(self) -> Home {
        match self {
            Backend::Ufw => Home::Ufw,
            Backend::Firewalld => Home::Firewalld,
        }
    }

    /// Where openings moved out of it by a flip live: the host's table, remembering it.
    pub(super) fn retired(self) -> Home {
        match self {
            Backend::Ufw => Home::UfwRetired,
            Backend::Firewalld => Home::FirewalldRetired,
        }
    }
}

/// Where the openings live, as their records say it (`store::More::spec` of an opening's
/// record): the host's own table, or a found firewall, or the host's table on a node whose
/// found firewall the host retired in a flip (what the way back looks for).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Home {
    Own,
    Ufw,
    UfwRetired,
    Firewalld,
    FirewalldRetired,
}

impl Home {
    /// The store's string, unchanged from before the type: none for the host's own table.
    pub(super) fn spec(self) -> Option<&'static str> {
        match self {
            Home::Own => None,
            Home::Ufw => Some("ufw"),
            Home::UfwRetired => Some("ufw-retired"),
            Home::Firewalld => Some("firewalld"),
            Home::FirewalldRetired => Some("firewalld-retired"),
        }
    }

    /// A record's string read back; anything else (no spec) is the host's own table.
    pub(super) fn parse(spec: Option<&str>) -> Home {
        [Home::Ufw, Home::UfwRetired, Home::Firewalld, Home::FirewalldRetired]
            .into_iter()
            .find(|h| h.spec() == spec)
            .unwrap_or(Home::Own)
    }

    /// The one home of a node's openings, from each record's: a found firewall's before a
    /// retired one's, firewalld's before ufw's, so that records left mixed by a failure (an
    /// opening that failed kept its old record) still give the flip or the way back, which
    /// every pass tries again until they agree.
    pub(super) fn of(homes: impl IntoIterator<Item = Home>) -> Home {
        let rank = |h: &Home| match h {
            Home::Firewalld => 0,
            Home::FirewalldRetired => 1,
            Home::Ufw => 2,
            Home::UfwRetired => 3,
            Home::Own => 4,
        };
        homes.into_iter().min_by_key(rank).unwrap_or(Home::Own)
    }
}

/// What kind of pass runs the firewall step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Scope {
    /// A full pass, in which `failed` other resources failed.
    Full { failed: usize },
    /// A reconcile of some keys (a change the daemon saw): it never moves the filter.
    Keys,
}

/// A move of the filter between a found firewall and the host's own table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Move {
    /// From the found firewall into the host's table: the declaration no longer says
    /// `adoption`.
    Flip(Backend),
    /// From the host's table back into the firewall it retired: `adoption` is said again.
    WayBack(Backend),
}

/// What the firewall step does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Step {
    /// The host's own table; the records say `record` (the host's, or a retired firewall's).
    Own { record: Home },
    /// The openings made in the firewall found in force; the host's table, if there, removed.
    In(Backend),
    /// A flip or a way back.
    Move(Move),
    /// A move is due and waits: the filter in force is left exactly as it is, and every
    /// opening fails saying why. `failed` is how many others failed in a full pass; none for a
    /// reconcile of some keys.
    Waits { due: Move, failed: Option<usize> },
}

impl Step {
    /// What the records of the openings the step applied say of where they live.
    pub(super) fn record(self) -> Home {
        match self {
            Step::Own { record } => record,
            Step::In(b) | Step::Move(Move::WayBack(b)) => b.home(),
            Step::Move(Move::Flip(b)) => b.retired(),
            // Nothing is recorded: every opening fails.
            Step::Waits { due: Move::Flip(b), .. } => b.home(),
            Step::Waits { due: Move::WayBack(b), .. } => b.retired(),
        }
    }
}

/// The firewall step from what was found in force, where the records say the openings live,
/// whether the declaration says `adoption`, and the pass's scope. A found firewall wins (its
/// openings are made in it); then a move the records call for; else the host's own table. A
/// move runs only in a full pass in which nothing else failed: a reconcile of some keys cannot
/// tell how the rest of the declaration stands, and a failure elsewhere may be what a port
/// serves; the filter in force keeps protecting the node meanwhile (docs/decisions.md, "The
/// flip and the way back wait for a full pass that fails nothing").
pub(super) fn plan(found: Found, home: Home, adopted: bool, scope: Scope) -> Step {
    let due = match (found, home, adopted) {
        (Found::Firewalld, _, _) => return Step::In(Backend::Firewalld),
        (_, Home::Firewalld, false) => Move::Flip(Backend::Firewalld),
        (_, Home::FirewalldRetired, true) => Move::WayBack(Backend::Firewalld),
        (_, Home::FirewalldRetired, false) => return Step::Own { record: Home::FirewalldRetired },
        (Found::Ufw, _, _) => return Step::In(Backend::Ufw),
        (_, Home::Ufw, false) => Move::Flip(Backend::Ufw),
        (_, Home::UfwRetired, true) => Move::WayBack(Backend::Ufw),
        (_, Home::UfwRetired, false) => return Step::Own { record: Home::UfwRetired },
        // A found firewall's records on an adopted node where it is no longer in force (stopped
        // by hand): the host's table, as on a node found with none.
        (Found::Nothing, Home::Own | Home::Ufw | Home::Firewalld, _) => {
            return Step::Own { record: Home::Own }
        }
    };
    match scope {
        Scope::Full { failed: 0 } => Step::Move(due),
        Scope::Full { failed } => Step::Waits { due, failed: Some(failed) },
        Scope::Keys => Step::Waits { due, failed: None },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOMES: [Home; 5] =
        [Home::Own, Home::Ufw, Home::UfwRetired, Home::Firewalld, Home::FirewalldRetired];

    #[test]
    fn a_home_is_written_and_read_as_the_store_always_said_it() {
        let specs: Vec<Option<&str>> = HOMES.iter().map(|h| h.spec()).collect();
        assert_eq!(
            specs,
            [None, Some("ufw"), Some("ufw-retired"), Some("firewalld"), Some("firewalld-retired")]
        );
        for h in HOMES {
            assert_eq!(Home::parse(h.spec()), h);
        }
        assert_eq!(Home::parse(Some("3f2a...")), Home::Own, "a spec digest is no home");
        assert_eq!(Home::of([]), Home::Own);
        assert_eq!(Home::of([Home::Own, Home::UfwRetired, Home::Ufw]), Home::Ufw);
        assert_eq!(Home::of([Home::Ufw, Home::FirewalldRetired]), Home::FirewalldRetired);
    }

    /// Every found firewall, home and `adoption`, in a full pass that failed nothing.
    #[test]
    fn every_transition_of_a_clean_full_pass() {
        use Backend::{Firewalld as Fd, Ufw};
        let clean = Scope::Full { failed: 0 };
        let own = |record| Step::Own { record };
        let cases = [
            // Found firewalld: its openings are made in it, whatever the records say.
            (Found::Firewalld, Home::Own, true, Step::In(Fd)),
            (Found::Firewalld, Home::Ufw, false, Step::In(Fd)),
            (Found::Firewalld, Home::FirewalldRetired, true, Step::In(Fd)),
            // Records in firewalld: the flip once `adoption` goes.
            (Found::Nothing, Home::Firewalld, false, Step::Move(Move::Flip(Fd))),
            (Found::Ufw, Home::Firewalld, false, Step::Move(Move::Flip(Fd))),
            (Found::Nothing, Home::Firewalld, true, own(Home::Own)),
            // Retired firewalld: the way back with `adoption`, the host's table without.
            (Found::Nothing, Home::FirewalldRetired, true, Step::Move(Move::WayBack(Fd))),
            (Found::Nothing, Home::FirewalldRetired, false, own(Home::FirewalldRetired)),
            // Found ufw: its openings are made in it.
            (Found::Ufw, Home::Own, true, Step::In(Ufw)),
            (Found::Ufw, Home::Ufw, true, Step::In(Ufw)),
            (Found::Ufw, Home::UfwRetired, true, Step::In(Ufw)),
            // Records in ufw: the flip once `adoption` goes.
            (Found::Nothing, Home::Ufw, false, Step::Move(Move::Flip(Ufw))),
            (Found::Nothing, Home::Ufw, true, own(Home::Own)),
            // Retired ufw: the way back with `adoption`, the host's table without.
            (Found::Nothing, Home::UfwRetired, true, Step::Move(Move::WayBack(Ufw))),
            (Found::Nothing, Home::UfwRetired, false, own(Home::UfwRetired)),
            // Nothing found, nothing recorded elsewhere: the host's table.
            (Found::Nothing, Home::Own, true, own(Home::Own)),
            (Found::Nothing, Home::Own, false, own(Home::Own)),
        ];
        for (found, home, adopted, step) in cases {
            assert_eq!(plan(found, home, adopted, clean), step, "{found:?}, {home:?}, adopted {adopted}");
        }
    }

    /// Issue 21, point 3: a move never runs in a reconcile of some keys nor in a full pass in
    /// which something else failed; what does not move is the same in any pass.
    #[test]
    fn a_move_waits_for_a_full_pass_that_fails_nothing() {
        for found in [Found::Nothing, Found::Ufw, Found::Firewalld] {
            for home in HOMES {
                for adopted in [false, true] {
                    let clean = plan(found, home, adopted, Scope::Full { failed: 0 });
                    for (scope, failed) in [(Scope::Full { failed: 2 }, Some(2)), (Scope::Keys, None)] {
                        let step = plan(found, home, adopted, scope);
                        match clean {
                            Step::Move(due) => assert_eq!(step, Step::Waits { due, failed }),
                            other => assert_eq!(step, other, "{found:?}, {home:?}, {adopted}, {scope:?}"),
                        }
                    }
                }
            }
        }
        let waits = plan(Found::Nothing, Home::Ufw, false, Scope::Keys);
        assert_eq!(waits.record(), Home::Ufw);
        assert_eq!(
            plan(Found::Nothing, Home::Ufw, false, Scope::Full { failed: 0 }).record(),
            Home::UfwRetired
        );
        assert_eq!(
            plan(Found::Nothing, Home::UfwRetired, true, Scope::Full { failed: 0 }).record(),
            Home::Ufw
        );
    }
}
