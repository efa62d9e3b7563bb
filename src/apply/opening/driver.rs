//! The one driver of the firewall, for the host's own table and for a found firewall (ufw,
//! firewalld) alike, written once over the small `Backend` trait each implements: what is there
//! read, the held openings found, a `Plan` worked out from both (each opening's verdict, the
//! change, and what is told of the filter as a whole, all data), the change made, read back
//! once, and every opening told from the plan and the read-back.
//!
//! The backends differ in the grain of their change, not in the driver's steps: the host's
//! table is replaced whole (`nft::InTable`), ufw and firewalld are mended one opening at a time,
//! so they implement the finer `Filter` trait and `ByOpening` makes either a `Backend`. And the
//! flip from a found firewall to the host's own table, the same for both: the table loaded
//! first, the found firewall retired only once every opening went through.

use std::sync::Arc;

use super::nft::{apply, dropped_to, Closed};
use super::plan::Home;
use super::{decide, declared_openings, held_detail, held_now, holdable, Done, Seen};
use crate::apply::{Error, Options, Outcome, Verb};
use crate::declaration::{Declaration, Opening, Resource};
use crate::store::{Record, Store};

/// One declared opening as the driver hands it to a backend: its resource and fields, how the
/// backend holds it (`want`), and whether it is held.
pub(super) struct Item<'d, W> {
    pub r: &'d Resource,
    pub o: &'d Opening,
    pub want: W,
    pub held: bool,
}

/// What the comparison says of one opening.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Held and left out of the filter, the operator's rule letting it in: told `held` first,
    /// whatever becomes of the change.
    HeldAside,
    /// Held and kept in the filter (the host's table, whose policy drop would close it
    /// otherwise): told `held` once the change went through.
    HeldWithin,
    /// The host's: its rules found `intact` or not.
    Own { intact: bool },
}

/// What a backend worked out from what it read, as data: `act` makes `change`, and the driver
/// tells every opening from the rest.
pub(super) struct Plan<C, F> {
    /// Each opening's verdict, in the order the openings were given.
    pub verdicts: Vec<Verdict>,
    /// The change to make, or the first failure of the comparison: then nothing is changed and
    /// every opening not held aside fails with it.
    pub change: Result<C, Arc<F>>,
    /// What was changed by hand in the parts of the filter that are no opening's (the host's
    /// table's chain and fixed rules), told on the first opening only, so one edit is one drift.
    pub common_drift: Vec<String>,
    /// The filter was not there at all.
    pub absent: bool,
    /// The listening ports the change closes to new connections, told on the first opening.
    pub closes: std::io::Result<Vec<Closed>>,
    /// Each orphan's detail once it is removed, in the order the orphans were given.
    pub orphans: Vec<&'static str>,
}

/// Where the openings are made, as the driver asks of it. Every call that fails answers its
/// `Fault`, which fails every opening: the filter is one.
pub(super) trait Backend {
    /// What it holds, read at once.
    type Seen;
    /// One opening as it holds it.
    type Want;
    /// What `act` makes: the whole table, or the openings to mend.
    type Change;
    /// What a failed call answers.
    type Fault;
    /// Where an opening's record must say it lives for its declaration to count as the same;
    /// none: anywhere (the host's table, whose records may say a retired firewall).
    const HOME: Option<Home>;
    /// Its failure as an opening's error.
    fn error(fault: &Arc<Self::Fault>) -> Error;
    /// What it holds now.
    fn read(&mut self) -> Result<Self::Seen, Self::Fault>;
    /// Whether what it holds lets this opening's port in already (what makes it held).
    fn lets_in(&self, seen: &Self::Seen, o: &Opening) -> bool;
    /// An opening as it should hold it.
    fn want(&self, id: &str, o: &Opening) -> Self::Want;
    /// The plan, from what it holds, the openings and the orphans' ids.
    fn compare(
        &mut self,
        seen: &Self::Seen,
        items: &[Item<'_, Self::Want>],
        orphans: &[&str],
    ) -> Plan<Self::Change, Self::Fault>;
    /// Makes the change.
    fn act(
        &mut self,
        seen: &Self::Seen,
        items: &[Item<'_, Self::Want>],
        orphans: &[&str],
        change: &Self::Change,
    ) -> Result<(), Self::Fault>;
    /// Reads the change back: what it holds now, for `check` and `check_gone` to look at one
    /// opening at a time, or none when it was checked whole here.
    fn read_back(
        &mut self,
        items: &[Item<'_, Self::Want>],
        change: &Self::Change,
    ) -> Result<Option<Self::Seen>, Self::Fault>;
    /// Whether an opening reads back as wanted.
    fn check(&mut self, now: &Self::Seen, id: &str, want: &Self::Want) -> Result<(), Error>;
    /// Whether an orphan reads back gone.
    fn check_gone(&self, now: &Self::Seen, id: &str) -> Result<(), Error>;
    /// Where the openings are, as an outcome's detail says it; none for the host's table.
    fn here(&self) -> Option<String>;
}

/// The firewall step's one driver: what `b` holds read, the held openings found, the plan
/// worked out, the change made and read back once (none of it in `plan`, which changes
/// nothing), and every declared opening and orphan told. `declared` are the openings `b` is to
/// make, in the declaration's order.
pub(super) fn run<B: Backend>(
    b: &mut B,
    declaration: &Declaration,
    store: &Store,
    opts: &Options,
    declared: Vec<(&Resource, &Opening)>,
    orphans: Vec<(String, Record)>,
) -> Done {
    let seen = match b.read() {
        Ok(seen) => seen,
        Err(e) => {
            let e = Arc::new(e);
            return Done::failed(&declared, orphans, || B::error(&e));
        }
    };
    // An opening of a module not taken yet whose port was let in before the pass is held
    // (docs/decisions.md, "An opening is held").
    let items: Vec<Item<'_, B::Want>> = declared
        .into_iter()
        .map(|(r, o)| Item {
            r,
            o,
            want: b.want(r.id.as_str(), o),
            held: holdable(declaration, store, r) && held_now(store, r, b.lets_in(&seen, o)),
        })
        .collect();
    let ids: Vec<&str> = orphans.iter().map(|(id, _)| id.as_str()).collect();
    let plan = b.compare(&seen, &items, &ids);
    let after = match &plan.change {
        Err(e) => Err(Arc::clone(e)),
        Ok(_) if opts.dry_run => Ok(None),
        Ok(change) => {
            b.act(&seen, &items, &ids, change).and_then(|()| b.read_back(&items, change)).map_err(Arc::new)
        }
    };
    let mut done = Done::default();
    tell(b, store, &items, &plan, &after, &mut done);
    for ((id, rec), gone) in orphans.into_iter().zip(&plan.orphans) {
        let result = match &after {
            Err(e) => Err(B::error(e)),
            Ok(Some(now)) => b.check_gone(now, &id),
            Ok(None) => Ok(()),
        };
        done.orphans.push((id, rec, result.map(|()| (Verb::Removed, Some((*gone).to_owned())))));
    }
    done.closes = plan.closes.unwrap_or_default();
    done
}

/// Each declared opening's outcome: those held aside first, untouched whatever became of the
/// change; then the others in order, each from its verdict and its record once the change read
/// back, the first also saying what the plan tells of the filter as a whole.
fn tell<B: Backend>(
    b: &mut B,
    store: &Store,
    items: &[Item<'_, B::Want>],
    plan: &Plan<B::Change, B::Fault>,
    after: &Result<Option<B::Seen>, Arc<B::Fault>>,
    done: &mut Done,
) {
    let verdicts = items.iter().zip(plan.verdicts.iter().copied());
    for (item, _) in verdicts.clone().filter(|(_, v)| *v == Verdict::HeldAside) {
        done.declared.push((item.r.index(), Ok(outcome(item.r, Verb::Held, Some(held_detail(item.r))))));
    }
    for (i, (item, verdict)) in verdicts.filter(|(_, v)| *v != Verdict::HeldAside).enumerate() {
        let result = match after {
            Err(e) => Err(B::error(e)),
            Ok(Some(now)) if verdict != Verdict::HeldWithin => b.check(now, item.r.id.as_str(), &item.want),
            Ok(_) => Ok(()),
        };
        let told = |()| {
            let (action, detail) = said(b, store, item.r, verdict, plan, i == 0);
            outcome(item.r, action, detail)
        };
        done.declared.push((item.r.index(), result.map(told)));
    }
}

/// What one opening that went through is told: drift told from a change of declaration by its
/// record (which must say it lives in `B::HOME`, if the backend has one), where it is, and on
/// the `first`, what was changed in the common parts and the ports the change closes.
fn said<B: Backend>(
    b: &B,
    store: &Store,
    r: &Resource,
    verdict: Verdict,
    plan: &Plan<B::Change, B::Fault>,
    first: bool,
) -> (Verb, Option<String>) {
    let (action, detail) = match verdict {
        Verdict::HeldAside | Verdict::HeldWithin => (Verb::Held, Some(held_detail(r))),
        Verdict::Own { intact } => {
            let recorded = store.get(r.id.as_str()).map(|rec| {
                rec.declared == r.digest && B::HOME.is_none_or(|home| Home::parse(rec.spec()) == home)
            });
            let common: &[String] = if first { &plan.common_drift } else { &[] };
            let (action, detail) = decide(&Seen { recorded, intact, table_absent: plan.absent, common });
            let detail = match (detail, b.here()) {
                (detail, None) => detail,
                (Some(d), Some(here)) => Some(format!("{d}; {here}")),
                (None, Some(here)) => Some(format!("{here} (runtime and permanent)")),
            };
            (action, detail)
        }
    };
    let closes = if first { closes_said(&plan.closes) } else { None };
    let detail = match (detail, closes) {
        (Some(d), Some(s)) => Some(format!("{d}; {s}")),
        (d, s) => d.or(s),
    };
    (action, detail)
}

/// What the first opening says of the ports the new filter closes, if anything.
fn closes_said(closes: &std::io::Result<Vec<Closed>>) -> Option<String> {
    match closes {
        Ok(c) if c.is_empty() => None,
        Ok(c) => Some(dropped_to(c)),
        Err(e) => Some(format!(
            "the listening sockets could not be read ({e}), so the ports this filter closes are not known"
        )),
    }
}

fn outcome(r: &Resource, action: Verb, detail: Option<String>) -> Outcome {
    Outcome { id: r.id.to_string(), kind: r.kind(), target: r.target(), action, detail, hand_edit: None }
}

/// How one opening compares with what a found firewall holds.
pub(super) struct Compared {
    /// Its rules are there as wanted, saved and in force.
    pub intact: bool,
    /// Something of it is to be put right (`Filter::put`).
    pub change: bool,
}

/// A found firewall (ufw, firewalld), mended one opening at a time: each compared and put
/// right, each orphan found and deleted, then what is done once (`finish`). `ByOpening` makes
/// one a `Backend`, the same for both.
pub(super) trait Filter {
    /// What it holds, read at once.
    type Seen;
    /// One opening as it holds it.
    type Want;
    /// What a failed call answers.
    type Fault;
    /// Where openings made in it live, as their records say.
    const HOME: Home;
    /// Its failure as an opening's error.
    fn error(fault: &Arc<Self::Fault>) -> Error;
    /// What it holds now.
    fn read(&mut self) -> Result<Self::Seen, Self::Fault>;
    /// Whether a rule of its own (the operator's) lets this opening's port in already.
    fn lets_in(&self, seen: &Self::Seen, o: &Opening) -> bool;
    /// An opening as it should hold it.
    fn want(&self, id: &str, o: &Opening) -> Self::Want;
    /// How an opening compares with what it holds.
    fn compare(&mut self, seen: &Self::Seen, id: &str, want: &Self::Want) -> Result<Compared, Self::Fault>;
    /// Puts an opening right.
    fn put(&mut self, seen: &Self::Seen, id: &str, want: &Self::Want) -> Result<(), Self::Fault>;
    /// Whether it holds anything of an orphan opening.
    fn find_orphan(&mut self, seen: &Self::Seen, id: &str) -> Result<bool, Self::Fault>;
    /// Deletes what it holds of an orphan opening.
    fn delete(&mut self, seen: &Self::Seen, id: &str) -> Result<(), Self::Fault>;
    /// What is done once, after every opening was put and every orphan deleted.
    fn finish(
        &mut self,
        seen: &Self::Seen,
        wanted: &[&Self::Want],
        orphans: &[&str],
    ) -> Result<(), Self::Fault>;
    /// What it holds after the change, for the read-back.
    fn read_back(&mut self, wanted: &[&Self::Want]) -> Result<Self::Seen, Self::Fault>;
    /// Whether an opening reads back as wanted.
    fn check(&mut self, now: &Self::Seen, id: &str, want: &Self::Want) -> Result<(), Error>;
    /// Whether an orphan reads back gone.
    fn check_gone(&self, now: &Self::Seen, id: &str) -> Result<(), Error>;
    /// Where the openings are, as a detail says it.
    fn here(&self) -> String;
    /// What an orphan's detail says: its rules deleted, or already gone.
    fn gone(was_there: bool) -> &'static str;
}

/// A found firewall as a `Backend`: a held opening is set aside (the operator's rule lets it
/// in), every other compared, and the change is which of them to put right; every orphan is
/// deleted, and each reads back on its own.
pub(super) struct ByOpening<'f, F>(pub &'f mut F);

/// The wants of the openings not held, which are the ones made in a found firewall.
fn live<'a, W>(items: &'a [Item<'_, W>]) -> Vec<&'a W> {
    items.iter().filter(|i| !i.held).map(|i| &i.want).collect()
}

impl<F: Filter> Backend for ByOpening<'_, F> {
    type Seen = F::Seen;
    type Want = F::Want;
    /// The openings to put right, by their place among the items.
    type Change = Vec<usize>;
    type Fault = F::Fault;
    const HOME: Option<Home> = Some(F::HOME);

    fn error(fault: &Arc<F::Fault>) -> Error {
        F::error(fault)
    }

    fn read(&mut self) -> Result<F::Seen, F::Fault> {
        self.0.read()
    }

    fn lets_in(&self, seen: &F::Seen, o: &Opening) -> bool {
        self.0.lets_in(seen, o)
    }

    fn want(&self, id: &str, o: &Opening) -> F::Want {
        self.0.want(id, o)
    }

    // The first failure is the one told; nothing is compared after it.
    fn compare(
        &mut self,
        seen: &F::Seen,
        items: &[Item<'_, F::Want>],
        orphans: &[&str],
    ) -> Plan<Vec<usize>, F::Fault> {
        let mut put = Vec::new();
        let mut fault = None;
        let mut verdicts = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let compared = match (item.held, &fault) {
                (true, _) => None,
                (false, Some(_)) => Some(false),
                (false, None) => match self.0.compare(seen, item.r.id.as_str(), &item.want) {
                    Ok(c) => {
                        if c.change {
                            put.push(i);
                        }
                        Some(c.intact)
                    }
                    Err(e) => {
                        fault = Some(e);
                        Some(false)
                    }
                },
            };
            verdicts.push(compared.map_or(Verdict::HeldAside, |intact| Verdict::Own { intact }));
        }
        let mut gone = Vec::new();
        for id in orphans {
            let was_there = match fault {
                Some(_) => false,
                None => self.0.find_orphan(seen, id).unwrap_or_else(|e| {
                    fault = Some(e);
                    false
                }),
            };
            gone.push(F::gone(was_there));
        }
        Plan {
            verdicts,
            change: fault.map_or(Ok(put), |e| Err(Arc::new(e))),
            common_drift: Vec::new(),
            absent: false,
            closes: Ok(Vec::new()),
            orphans: gone,
        }
    }

    // A change stops at its first failure: the rest would fail alike.
    fn act(
        &mut self,
        seen: &F::Seen,
        items: &[Item<'_, F::Want>],
        orphans: &[&str],
        put: &Vec<usize>,
    ) -> Result<(), F::Fault> {
        for item in put.iter().map(|&i| &items[i]) {
            self.0.put(seen, item.r.id.as_str(), &item.want)?;
        }
        for id in orphans {
            self.0.delete(seen, id)?;
        }
        self.0.finish(seen, &live(items), orphans)
    }

    fn read_back(
        &mut self,
        items: &[Item<'_, F::Want>],
        _: &Vec<usize>,
    ) -> Result<Option<F::Seen>, F::Fault> {
        self.0.read_back(&live(items)).map(Some)
    }

    fn check(&mut self, now: &F::Seen, id: &str, want: &F::Want) -> Result<(), Error> {
        self.0.check(now, id, want)
    }

    fn check_gone(&self, now: &F::Seen, id: &str) -> Result<(), Error> {
        self.0.check_gone(now, id)
    }

    fn here(&self) -> Option<String> {
        Some(self.0.here())
    }
}

/// The openings in a found firewall, through the one driver: read, held set aside, each
/// compared and put right, the orphans deleted, then read back once and each told. The
/// firewall's own rules and the operator's are never touched.
pub(super) fn apply_with<F: Filter>(
    f: &mut F,
    declaration: &Declaration,
    store: &Store,
    opts: &Options,
    orphans: Vec<(String, Record)>,
) -> Done {
    run(&mut ByOpening(f), declaration, store, opts, declared_openings(declaration), orphans)
}

/// What a flip says of the found firewall it leaves: its name, what its openings' records say
/// in their `spec`, and the details of a declared opening moved and of an orphan removed.
pub(super) struct Leaving {
    pub(super) from: &'static str,
    pub(super) home: Home,
    pub(super) moved: &'static str,
    pub(super) orphan_removed: &'static str,
}

/// The flip from a found firewall (ufw or firewalld), the same for both: the host's own filter
/// loaded, and only when every opening and orphan went through is the found firewall retired
/// (`retire`, given the ids of the openings made in it); a failure of the retirement fails every
/// opening with `failed`, so their records stay those of the found firewall.
pub(super) fn flip_from<E: Clone>(
    leaving: &Leaving,
    declaration: &Declaration,
    store: &Store,
    opts: &Options,
    orphans: Vec<(String, Record)>,
    retire: impl FnOnce(&[String]) -> Result<(), E>,
    failed: impl Fn(E) -> Error,
) -> Done {
    let made: Vec<String> = store
        .records()
        .filter(|(_, rec)| rec.kind == crate::declaration::Kind::Opening && rec.origin == opts.origin)
        .filter(|(_, rec)| Home::parse(rec.spec()) == leaving.home)
        .map(|(id, _)| id.to_owned())
        .collect();
    let mut done = apply(declaration, store, opts, orphans);
    let failures = done.declared.iter().filter(|(_, r)| r.is_err()).count()
        + done.orphans.iter().filter(|(_, _, r)| r.is_err()).count();
    if failures > 0 {
        // One opening that could not be loaded keeps the found firewall in force for all:
        // retiring it now would drop that port (docs/decisions.md, "The flip waits for a clean
        // pass").
        for (_, result) in &mut done.declared {
            if result.is_ok() {
                *result = Err(Error::FlipWaits { from: leaving.from, failed: failures });
            }
        }
        return done;
    }
    match retire(&made) {
        Ok(()) => {
            // The ports the host's table closed are told again on the first opening, as the
            // load told them, since the flip's detail replaces the load's.
            for (i, (_, result)) in done.declared.iter_mut().enumerate() {
                if let Ok(o) = result {
                    o.action = Verb::Updated;
                    o.detail = Some(match i {
                        0 if !done.closes.is_empty() => {
                            format!("{}; {}", leaving.moved, dropped_to(&done.closes))
                        }
                        _ => leaving.moved.to_owned(),
                    });
                }
            }
            for (id, _, result) in &mut done.orphans {
                if made.contains(id) {
                    *result = Ok((Verb::Removed, Some(leaving.orphan_removed.to_owned())));
                }
            }
        }
        Err(e) => {
            for (_, result) in &mut done.declared {
                *result = Err(failed(e.clone()));
            }
            for (_, _, result) in &mut done.orphans {
                *result = Err(failed(e.clone()));
            }
        }
    }
    done
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::store::Origin;

    /// A found firewall in memory: which openings it holds, which of them intact, which port
    /// a rule of its own lets in, which put fails; and what was done to it, in order.
    #[derive(Default)]
    struct Fake {
        holds: BTreeSet<String>,
        intact: BTreeSet<String>,
        own_port: Option<u16>,
        put_fails: Option<&'static str>,
        did: Vec<String>,
    }

    impl Filter for Fake {
        type Seen = BTreeSet<String>;
        type Want = ();
        type Fault = String;
        const HOME: Home = Home::Ufw;

        fn error(fault: &Arc<String>) -> Error {
            Error::UfwReadBack { id: "the fake".into(), differs: fault.to_string() }
        }
        fn read(&mut self) -> Result<BTreeSet<String>, String> {
            self.did.push("read".into());
            Ok(self.holds.clone())
        }
        fn lets_in(&self, _: &BTreeSet<String>, o: &Opening) -> bool {
            self.own_port == Some(o.port.get())
        }
        fn want(&self, _: &str, _: &Opening) {}
        fn compare(&mut self, _: &BTreeSet<String>, id: &str, (): &()) -> Result<Compared, String> {
            let intact = self.intact.contains(id);
            Ok(Compared { intact, change: !intact })
        }
        fn put(&mut self, _: &BTreeSet<String>, id: &str, (): &()) -> Result<(), String> {
            self.did.push(format!("put {id}"));
            if self.put_fails == Some(id) {
                return Err(format!("{id} could not be put"));
            }
            self.holds.insert(id.to_owned());
            Ok(())
        }
        fn find_orphan(&mut self, seen: &BTreeSet<String>, id: &str) -> Result<bool, String> {
            Ok(seen.contains(id))
        }
        fn delete(&mut self, _: &BTreeSet<String>, id: &str) -> Result<(), String> {
            self.did.push(format!("delete {id}"));
            self.holds.remove(id);
            Ok(())
        }
        fn finish(&mut self, _: &BTreeSet<String>, _: &[&()], _: &[&str]) -> Result<(), String> {
            self.did.push("finish".into());
            Ok(())
        }
        fn read_back(&mut self, _: &[&()]) -> Result<BTreeSet<String>, String> {
            self.did.push("read back".into());
            Ok(self.holds.clone())
        }
        fn check(&mut self, now: &BTreeSet<String>, id: &str, (): &()) -> Result<(), Error> {
            match now.contains(id) {
                true => Ok(()),
                false => Err(Error::UfwReadBack { id: id.into(), differs: "not there".into() }),
            }
        }
        fn check_gone(&self, now: &BTreeSet<String>, id: &str) -> Result<(), Error> {
            match now.contains(id) {
                false => Ok(()),
                true => Err(Error::UfwReadBack { id: id.into(), differs: "still there".into() }),
            }
        }
        fn here(&self) -> String {
            "in the fake".into()
        }
        fn gone(was_there: bool) -> &'static str {
            if was_there {
                "deleted"
            } else {
                "already gone"
            }
        }
    }

    fn declaration(adopted: bool) -> Declaration {
        let adoption = if adopted { r#""adoption": {"taken": []},"# } else { "" };
        let text = format!(
            r#"{{"version": 1, {adoption} "resources": [
                {{"type": "opening", "id": "web.http", "port": 8080}},
                {{"type": "opening", "id": "web.ssh", "port": 22}}
            ]}}"#
        );
        Declaration::parse(text.as_bytes()).unwrap()
    }

    fn options(dry_run: bool) -> Options {
        Options {
            origin: Origin::Declared,
            dry_run,
            run_verify: false,
            originals: "/nonexistent/originals".into(),
            bus: None,
            container_socket: None,
            step_timeout: None,
            archive_limits: crate::apply::archive::ArchiveLimits::default(),
            keep_max_bytes: crate::apply::KEEP_MAX_BYTES,
            contents: None,
            key: "/nonexistent/key".into(),
            progress: None,
        }
    }

    fn told(done: &Done) -> Vec<(usize, String)> {
        done.declared
            .iter()
            .map(|(i, r)| match r {
                Ok(o) => (*i, format!("{} {}", o.action.as_str(), o.detail.as_deref().unwrap_or(""))),
                Err(e) => (*i, format!("failed: {e}")),
            })
            .collect()
    }

    #[test]
    fn held_set_aside_each_compared_and_put_then_read_back_once() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::read_only(&dir.path().join("state.json")).unwrap();
        let mut fake =
            Fake { own_port: Some(22), intact: BTreeSet::from(["web.http".into()]), ..Fake::default() };
        fake.holds.insert("web.http".into());
        let done = apply_with(&mut fake, &declaration(true), &store, &options(false), Vec::new());
        assert_eq!(
            told(&done),
            vec![
                (1, "held found open, and module \"web\" is not taken yet: left open as found".into()),
                (0, "unchanged in the fake (runtime and permanent)".into()),
            ],
            "the operator's port held and never touched; the intact one unchanged"
        );
        assert_eq!(fake.did, ["read", "finish", "read back"]);

        let mut fake = Fake::default();
        let done = apply_with(&mut fake, &declaration(false), &store, &options(false), Vec::new());
        assert_eq!(told(&done)[1], (1, "created in the fake (runtime and permanent)".into()));
        assert_eq!(fake.did, ["read", "put web.http", "put web.ssh", "finish", "read back"]);
    }

    #[test]
    fn a_change_stops_at_its_first_failure_and_plan_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::read_only(&dir.path().join("state.json")).unwrap();
        let mut fake = Fake { put_fails: Some("web.http"), ..Fake::default() };
        let done = apply_with(&mut fake, &declaration(false), &store, &options(false), Vec::new());
        assert_eq!(fake.did, ["read", "put web.http"], "nothing after the failure, no read-back");
        let failed = "failed: the fake: ufw reads back different: web.http could not be put";
        assert_eq!(told(&done), vec![(0, failed.into()), (1, failed.into())], "the firewall is one");

        let mut fake = Fake::default();
        let done = apply_with(&mut fake, &declaration(false), &store, &options(true), Vec::new());
        assert_eq!(fake.did, ["read"], "plan reads and changes nothing");
        assert_eq!(told(&done)[0], (0, "created in the fake (runtime and permanent)".into()));
    }

    /// A backend whose change is whole, as the host's table's is: a plan of fixed data, and
    /// whether its change fails.
    struct Whole {
        fails: bool,
        did: Vec<&'static str>,
    }

    impl Backend for Whole {
        type Seen = ();
        type Want = ();
        type Change = ();
        type Fault = String;
        const HOME: Option<Home> = None;

        fn error(fault: &Arc<String>) -> Error {
            Error::FilterReadBack { differs: fault.to_string() }
        }
        fn read(&mut self) -> Result<(), String> {
            Ok(())
        }
        fn lets_in(&self, (): &(), o: &Opening) -> bool {
            o.port.get() == 8080
        }
        fn want(&self, _: &str, _: &Opening) {}
        fn compare(&mut self, (): &(), items: &[Item<'_, ()>], _: &[&str]) -> Plan<(), String> {
            let closed =
                Closed { transport: crate::system::firewall::Transport::Tcp, port: 23, addrs: vec![] };
            Plan {
                verdicts: items
                    .iter()
                    .map(|i| if i.held { Verdict::HeldWithin } else { Verdict::Own { intact: false } })
                    .collect(),
                change: Ok(()),
                common_drift: vec!["its rules were reordered".into()],
                absent: false,
                closes: Ok(vec![closed]),
                orphans: vec!["its rule was taken out"],
            }
        }
        fn act(&mut self, (): &(), _: &[Item<'_, ()>], _: &[&str], (): &()) -> Result<(), String> {
            self.did.push("act");
            if self.fails {
                return Err("it would not load".into());
            }
            Ok(())
        }
        fn read_back(&mut self, _: &[Item<'_, ()>], (): &()) -> Result<Option<()>, String> {
            self.did.push("read back");
            Ok(None)
        }
        fn check(&mut self, (): &(), _: &str, (): &()) -> Result<(), Error> {
            panic!("a whole read-back checks no opening on its own")
        }
        fn check_gone(&self, (): &(), _: &str) -> Result<(), Error> {
            panic!("a whole read-back checks no orphan on its own")
        }
        fn here(&self) -> Option<String> {
            None
        }
    }

    #[test]
    fn a_whole_change_keeps_held_openings_in_and_tells_the_filter_on_the_first_only() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::read_only(&dir.path().join("state.json")).unwrap();
        let d = declaration(true);
        let orphan = || {
            let rec = Record {
                origin: Origin::Declared,
                kind: crate::declaration::Kind::Opening,
                target: "22/tcp".into(),
                position: 2,
                declared: crate::declaration::digest(b"v1"),
                applied_at: 0,
                wrote: None,
                mode: None,
                owner: None,
                sig: None,
                more: None,
            };
            vec![("old.ssh".to_owned(), rec)]
        };
        let mut whole = Whole { fails: false, did: Vec::new() };
        let done = run(&mut whole, &d, &store, &options(false), declared_openings(&d), orphan());
        assert_eq!(whole.did, ["act", "read back"]);
        assert_eq!(
            told(&done),
            vec![
                (0, "held found open, and module \"web\" is not taken yet: left open as found; new connections are dropped to 23/tcp (listening on )".into()),
                (1, "created ".into()),
            ],
            "held in place, the ports closed told on the first, the common drift only on an opening of the host's that is first"
        );
        assert_eq!(done.closes.len(), 1);
        let removed =
            done.orphans.iter().map(|(id, _, r)| (id.as_str(), r.as_ref().ok().cloned())).collect::<Vec<_>>();
        assert_eq!(
            removed,
            vec![("old.ssh", Some((Verb::Removed, Some("its rule was taken out".to_owned()))))]
        );

        let mut whole = Whole { fails: true, did: Vec::new() };
        let done = run(&mut whole, &d, &store, &options(false), declared_openings(&d), orphan());
        assert_eq!(whole.did, ["act"], "no read-back after a failed change");
        let failed = "failed: table inet mesh_host was loaded and reads back different: it would not load";
        assert_eq!(
            told(&done),
            vec![(0, failed.into()), (1, failed.into())],
            "held within, it fails with the table"
        );
        assert!(done.orphans[0].2.is_err());
    }
}
