//! The flip from a found firewall (ufw or firewalld) to the host's own table, the same for
//! both: the table loaded first, the found firewall retired only once every opening went
//! through.

use super::nft::{apply, dropped_to};
use super::plan::Home;
use super::Done;
use crate::apply::{Error, Options, Verb};
use crate::declaration::Declaration;
use crate::store::{Record, Store};

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
