//! The one driver of the found firewalls (ufw, firewalld), written once over the small
//! `Filter` trait each implements: held openings set aside, every opening compared with what
//! the firewall holds and put right, orphans deleted, then one read-back told to each. And the
//! flip from a found firewall to the host's own table, the same for both: the table loaded
//! first, the found firewall retired only once every opening went through.

use std::sync::Arc;

use super::nft::{apply, dropped_to};
use super::plan::Home;
use super::{decide, declared_openings, held_detail, held_now, holdable, Done, Seen};
use crate::apply::{Error, Options, Outcome, Verb};
use crate::declaration::{Declaration, Opening, Resource};
use crate::store::{Record, Store};

/// How one opening compares with what a found firewall holds.
pub(super) struct Compared {
    /// Its rules are there as wanted, saved and in force.
    pub intact: bool,
    /// Something of it is to be put right (`Filter::put`).
    pub change: bool,
}

/// A found firewall the openings are made in, as the driver asks of it. Each call that fails
/// answers its `Fault`, which fails every opening: the firewall is one, as the host's table is.
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
        wanted: &[Self::Want],
        orphans: &[&str],
    ) -> Result<(), Self::Fault>;
    /// What it holds after the change, for the read-back.
    fn read_back(&mut self, wanted: &[Self::Want]) -> Result<Self::Seen, Self::Fault>;
    /// Whether an opening reads back as wanted.
    fn check(&mut self, now: &Self::Seen, id: &str, want: &Self::Want) -> Result<(), Error>;
    /// Whether an orphan reads back gone.
    fn check_gone(&self, now: &Self::Seen, id: &str) -> Result<(), Error>;
    /// Where the openings are, as a detail says it.
    fn here(&self) -> String;
    /// What an orphan's detail says: its rules deleted, or already gone.
    fn gone(was_there: bool) -> &'static str;
}

/// Splits the declared openings into those held, reported `held` in `done` and never touched,
/// and the rest: an opening of a module not taken yet whose port was let in before the pass
/// (`open`) stays as found (docs/decisions.md, "An opening is held").
pub(super) fn hold<'d>(
    done: &mut Done,
    declaration: &Declaration,
    store: &Store,
    declared: Vec<(&'d Resource, &'d Opening)>,
    open: impl Fn(&Opening) -> bool,
) -> Vec<(&'d Resource, &'d Opening)> {
    let mut live = Vec::new();
    for (r, o) in declared {
        if holdable(declaration, store, r) && held_now(store, r, open(o)) {
            let outcome = Outcome {
                id: r.id.to_string(),
                kind: r.kind(),
                target: r.target(),
                action: Verb::Held,
                detail: Some(held_detail(r)),
                hand_edit: None,
            };
            done.declared.push((r.index, Ok(outcome)));
        } else {
            live.push((r, o));
        }
    }
    live
}

/// The openings in a found firewall: read, held set aside, each compared and put right, the
/// orphans deleted, then read back once and each told. A change stops at the first failure
/// (the rest would fail alike), and `plan` changes nothing. The firewall's own rules and the
/// operator's are never touched.
pub(super) fn apply_with<F: Filter>(
    f: &mut F,
    declaration: &Declaration,
    store: &Store,
    opts: &Options,
    orphans: Vec<(String, Record)>,
) -> Done {
    let declared = declared_openings(declaration);
    let seen = match f.read() {
        Ok(seen) => seen,
        Err(e) => {
            let e = Arc::new(e);
            return Done::failed(&declared, orphans, || F::error(&e));
        }
    };
    let mut done = Done::default();
    let live = hold(&mut done, declaration, store, declared, |o| f.lets_in(&seen, o));
    let wanted: Vec<F::Want> = live.iter().map(|(r, o)| f.want(r.id.as_str(), o)).collect();
    let mut change = Ok(());
    let intact = compare_and_put(f, &seen, &live, &wanted, opts, &mut change);
    let mut was_there = Vec::new();
    for (id, _) in &orphans {
        was_there.push(f.find_orphan(&seen, id).unwrap_or_else(|e| {
            change = std::mem::replace(&mut change, Ok(())).and(Err(e));
            false
        }));
        if !opts.dry_run && change.is_ok() {
            change = f.delete(&seen, id);
        }
    }
    let ids: Vec<&str> = orphans.iter().map(|(id, _)| id.as_str()).collect();
    let after = change
        .and_then(|()| match opts.dry_run {
            true => Ok(None),
            false => f.finish(&seen, &wanted, &ids).and_then(|()| f.read_back(&wanted)).map(Some),
        })
        .map_err(Arc::new);
    for (((r, _), want), intact) in live.iter().zip(&wanted).zip(intact) {
        let result = match &after {
            Err(e) => Err(F::error(e)),
            Ok(None) => Ok(()),
            Ok(Some(now)) => f.check(now, r.id.as_str(), want),
        };
        done.declared.push((r.index, result.map(|()| told(f, store, r, intact))));
    }
    for ((id, rec), was_there) in orphans.into_iter().zip(was_there) {
        let result = match &after {
            Err(e) => Err(F::error(e)),
            Ok(Some(now)) => f.check_gone(now, &id),
            Ok(None) => Ok(()),
        };
        done.orphans.push((id, rec, result.map(|()| (Verb::Removed, Some(F::gone(was_there).to_owned())))));
    }
    done
}

/// Compares each live opening and puts it right, until a change fails (`change`); whether each
/// was found intact.
fn compare_and_put<F: Filter>(
    f: &mut F,
    seen: &F::Seen,
    live: &[(&Resource, &Opening)],
    wanted: &[F::Want],
    opts: &Options,
    change: &mut Result<(), F::Fault>,
) -> Vec<bool> {
    let mut intact = Vec::new();
    for ((r, _), want) in live.iter().zip(wanted) {
        let id = r.id.as_str();
        // The first failure is the one told.
        let compared = f.compare(seen, id, want).unwrap_or_else(|e| {
            *change = std::mem::replace(change, Ok(())).and(Err(e));
            Compared { intact: false, change: false }
        });
        intact.push(compared.intact);
        if compared.change && !opts.dry_run && change.is_ok() {
            *change = f.put(seen, id, want);
        }
    }
    intact
}

/// The outcome of an opening that read back as wanted in a found firewall: drift is told from
/// a change of declaration by its record, which must say it lives there.
fn told<F: Filter>(f: &F, store: &Store, r: &Resource, intact: bool) -> Outcome {
    let recorded =
        store.get(r.id.as_str()).map(|rec| rec.declared == r.digest && Home::parse(rec.spec()) == F::HOME);
    let (action, detail) = decide(&Seen { recorded, intact, table_absent: false, common: &[] });
    let here = f.here();
    let detail = match detail {
        Some(d) => format!("{d}; {here}"),
        None => format!("{here} (runtime and permanent)"),
    };
    Outcome {
        id: r.id.to_string(),
        kind: r.kind(),
        target: r.target(),
        action,
        detail: Some(detail),
        hand_edit: None,
    }
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
        fn finish(&mut self, _: &BTreeSet<String>, _: &[()], _: &[&str]) -> Result<(), String> {
            self.did.push("finish".into());
            Ok(())
        }
        fn read_back(&mut self, _: &[()]) -> Result<BTreeSet<String>, String> {
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
            originals: "/nonexistent/originals".into(),
            bus: None,
            container_socket: None,
            step_timeout: None,
            archive_limits: crate::apply::archive::ArchiveLimits::default(),
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
}
