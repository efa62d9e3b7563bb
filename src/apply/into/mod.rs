//! `file` with `into`: the file belongs to someone else (a program's `daemon.json`, an env file
//! a package ships), and the mesh owns some keys in it.
//!
//! Only the owned keys are ever looked at or changed: the rest of the file, its order, its
//! indentation, its comments and blank lines stay byte for byte (`doc`). What each key held
//! before the host first set it (or that it was absent) is recorded, and put back when the
//! resource leaves; the file itself is removed then only if the host created it and nothing
//! else is in it. A hand edit of an owned key is drift (`corrected`); one of any other key is
//! not the mesh's business, and is not even read as drift. A file that is not of its format
//! fails the resource, naming the line, and is left exactly as it is.
//!
//! A file that belongs to someone else keeps its own mode and owner; the declared ones apply
//! only to a file the host creates. Secret holes (`${secret:NAME}`) in `into` content are
//! refused (`Error::IntoSecret`): what is recorded here (each key's previous value, the digest
//! of the whole file) would first have to be kept keyed, as a file carrying a secret is.

mod doc;

use std::path::Path;

use self::doc::Doc;
use super::{begin, Ctx, Error, Facts, Step, Verb};
use crate::declaration::{digest, File, Kind, MergeInto, Resource};
use crate::store::{Merged, Record};
use crate::system::fs::{Content, Fs, Kind as FsKind, Meta};

/// The largest file whose keys the host edits. Configuration files are kilobytes; a file of
/// this size at such a path is not one, and is not read whole.
const LARGEST: u64 = 16 << 20;

/// Sets the declared keys in the file, reads them back, and records what they held before.
pub(super) fn apply(ctx: &mut Ctx<'_>, r: &Resource, f: &File) -> Result<Step, Error> {
    let path = f.path.as_path();
    let format = f.into.expect("into::apply is only called for a file with `into`");
    if f.carries_secret() {
        return Err(Error::IntoSecret { path: path.to_owned() });
    }
    let content = f.content.as_deref().ok_or_else(|| Error::NoContent { path: path.to_owned() })?;
    let declared = match format {
        MergeInto::Json => doc::declared_json(content),
        MergeInto::Env => doc::declared_env(content),
    };
    let record =
        ctx.store.get(r.id.as_str()).filter(|rec| rec.kind == Kind::File && *rec.target == *r.target());
    let recorded = record.and_then(Record::into).filter(|m| m.format == format);
    let found = read(&mut ctx.fs, path, format)?;

    let plan = decide(
        found.as_ref().map(|(_, d)| d),
        record.map(|rec| rec.declared == r.digest),
        recorded,
        format,
        &declared,
    );
    let facts = |doc: &Doc, meta: &Meta| Facts {
        wrote: Some(digest(doc.text().as_bytes())),
        mode: Some(meta.mode),
        owner: Some((meta.uid, meta.gid)),
        into: Some(plan.merged.clone()),
        ..Facts::default()
    };
    if !plan.write {
        let (meta, doc) = found.as_ref().expect("nothing to write only when the file is there");
        return Ok(Step::Done(begin(r, plan.action, plan.detail.clone()), Some(facts(doc, meta))));
    }
    if ctx.opts.dry_run {
        return Ok(Step::Done(begin(r, plan.action, plan.detail), None));
    }

    let (mode, owner) = match &found {
        Some((meta, _)) => (meta.mode, Some((meta.uid, meta.gid))),
        None => (
            f.mode().bits(),
            f.owner.as_ref().map(|o| ctx.accounts.resolve(&o.user, o.group.as_deref())).transpose()?,
        ),
    };
    let mut detail = plan.detail.clone();
    // Before the host first writes over a file it has no record of, a copy is kept, as for any
    // file: the keys are put back on removal, and the copy is there for whatever else a person
    // may want back.
    if let (None, Some(_)) = (record, &found) {
        if !ctx.store.holds_target(Kind::File, &r.target()) {
            let at = super::file::kept_path(&ctx.opts.originals, path);
            if ctx.fs.meta(&at)?.is_none() {
                let copy = ctx.fs.stage_copy(path, &at, mode & 0o700)?;
                ctx.fs.commit(vec![copy]).pop().unwrap_or(Ok(()))?;
            }
            let said = format!("the file as found was kept at {}", at.display());
            detail = Some(match detail {
                Some(d) => format!("{d}; {said}"),
                None => said,
            });
        }
    }
    write(&mut ctx.fs, path, &plan.doc, mode, owner)?;

    // Read back: every owned key holds what is declared, in the file as it is now.
    let (meta, now) = read(&mut ctx.fs, path, format)?
        .ok_or_else(|| Error::Vanished { target: super::Target::Path(path.to_owned()), did: "written" })?;
    if let Some((key, _)) = declared.iter().find(|(k, v)| !now.holds(k, v)) {
        return Err(Error::IntoReadBack { path: path.to_owned(), key: key.clone() });
    }
    Ok(Step::Done(begin(r, plan.action, detail), Some(facts(&now, &meta))))
}

/// What to do, decided from plain values.
#[derive(Debug)]
struct Plan {
    action: Verb,
    detail: Option<String>,
    /// The file's text with the declared keys set (and released keys put back).
    doc: Doc,
    /// The text differs from what is on the machine (or nothing is there).
    write: bool,
    /// What to record.
    merged: Merged,
}

/// Decides from the file as found (`None`: not there), whether the record is of the declaration
/// as it is now (`None`: no record), what the record says the keys held, and what is declared.
/// Pure.
fn decide(
    found: Option<&Doc>,
    record_current: Option<bool>,
    recorded: Option<&Merged>,
    format: MergeInto,
    declared: &[(String, String)],
) -> Plan {
    let mut doc = found.cloned().unwrap_or_else(|| Doc::empty(format));
    let mut was = recorded.map(|m| m.was.clone()).unwrap_or_default();
    // The host made the file if it was not there when the host first set a key in it.
    let made = recorded.map_or(found.is_none(), |m| m.made);

    // Keys the declaration no longer sets are put back as they were.
    let mut released = Vec::new();
    let gone: Vec<String> = was.keys().filter(|k| !declared.iter().any(|(d, _)| d == *k)).cloned().collect();
    for key in gone {
        match was.remove(&key).flatten() {
            Some(value) => doc.restore(&key, &value),
            None => doc.remove(&key),
        }
        released.push(key);
    }
    let mut twice = Vec::new();
    let mut set = Vec::new();
    for (key, value) in declared {
        let held = doc.get(key);
        if held.len() > 1 {
            twice.push(format!("{key} appears {} times in the file; each was set", held.len()));
        }
        // Only the first time the host sets it: what it holds later is the host's own value.
        was.entry(key.clone()).or_insert_with(|| held.first().map(|v| (*v).to_owned()));
        if !doc.holds(key, value) {
            doc.set(key, value);
            set.push(key.as_str());
        }
    }
    let write = found.is_none_or(|f| f.text() != doc.text());

    let (action, mut detail) = match (found, record_current) {
        (None, None) => (Verb::Created, None),
        (None, Some(_)) => (Verb::Corrected, Some("it had been deleted on the machine".to_owned())),
        (Some(_), _) if !write => (Verb::Unchanged, None),
        // The declaration is what the host last applied, so a key that no longer holds its
        // value was changed on the machine.
        (Some(_), Some(true)) => {
            (Verb::Corrected, Some(format!("put back {}: changed on the machine", set.join(", "))))
        }
        (Some(_), _) => {
            let mut said = Vec::new();
            if !set.is_empty() {
                said.push(format!("set {}", set.join(", ")));
            }
            if !released.is_empty() {
                said.push(format!("put back {} as found", released.join(", ")));
            }
            (Verb::Updated, Some(said.join("; ")))
        }
    };
    if !twice.is_empty() {
        let said = twice.join("; ");
        detail = Some(match detail {
            Some(d) => format!("{d}; {said}"),
            None => said,
        });
    }
    Plan { action, detail, doc, write, merged: Merged { format, was, made } }
}

/// What is at the path, read and checked to be of its format; `None` when nothing is there.
fn read(fs: &mut Fs, path: &Path, format: MergeInto) -> Result<Option<(Meta, Doc)>, Error> {
    let Some((meta, content)) = fs.read_up_to(path, LARGEST)? else { return Ok(None) };
    let unreadable = |why: String| Error::IntoUnreadable { path: path.to_owned(), why, format: name(format) };
    let bytes = match content {
        Content::Bytes(b) => b,
        Content::NotFile => {
            return Err(Error::WrongKind { path: path.to_owned(), declared: Kind::File, found: meta.kind })
        }
        Content::Large { size, .. } => {
            return Err(unreadable(format!(
                "holds {size} bytes, more than the {LARGEST} mesh-host reads to set keys in"
            )))
        }
    };
    if meta.kind != FsKind::File {
        return Err(Error::WrongKind { path: path.to_owned(), declared: Kind::File, found: meta.kind });
    }
    Doc::parse(format, bytes).map(|doc| Some((meta, doc))).map_err(unreadable)
}

fn name(format: MergeInto) -> &'static str {
    match format {
        MergeInto::Json => "a JSON object",
        MergeInto::Env => "KEY=VALUE lines",
    }
}

/// Replaces the file whole and atomically, with the mode and owner it had.
fn write(fs: &mut Fs, path: &Path, doc: &Doc, mode: u32, owner: Option<(u32, u32)>) -> Result<(), Error> {
    let staged = fs.stage(path, doc.text().as_bytes(), mode, owner)?;
    fs.commit(vec![staged]).pop().unwrap_or(Ok(()))?;
    Ok(())
}

/// Removal of an orphan `into`: each owned key put back as the record says it was; the file
/// removed only if the host created it and nothing else is in it now. A file no longer there
/// is forgotten. A file no longer of its format fails the removal, and its record stays for
/// the next try.
pub(super) fn remove(
    fs: &mut Fs,
    path: &Path,
    merged: &Merged,
    dry_run: bool,
) -> Result<(Verb, Option<String>), Error> {
    let Some((meta, found)) = read(fs, path, merged.format)? else {
        return Ok((Verb::Forgotten, Some("no longer declared, and the file is no longer there".to_owned())));
    };
    let mut doc = found.clone();
    let mut restored = Vec::new();
    let mut taken = Vec::new();
    for (key, was) in &merged.was {
        match was {
            Some(value) => {
                doc.restore(key, value);
                restored.push(key.as_str());
            }
            None => {
                doc.remove(key);
                taken.push(key.as_str());
            }
        }
    }
    if merged.made && doc.is_bare() {
        if !dry_run {
            fs.remove_file(path)?;
        }
        return Ok((
            Verb::Removed,
            Some("no longer declared; the host had created the file, and nothing else is in it".to_owned()),
        ));
    }
    if !dry_run && doc != found {
        write(fs, path, &doc, meta.mode, Some((meta.uid, meta.gid)))?;
    }
    let mut said = vec!["no longer declared: its keys were put back as found".to_owned()];
    if !restored.is_empty() {
        said.push(format!("{} as they were", restored.join(", ")));
    }
    if !taken.is_empty() {
        said.push(format!("{} taken out (absent before)", taken.join(", ")));
    }
    Ok((Verb::Removed, Some(said.join("; "))))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// A record's keys as `decide` sees them.
    fn was(pairs: &[(&str, Option<&str>)]) -> BTreeMap<String, Option<String>> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), v.map(str::to_owned))).collect()
    }

    fn env(text: &str) -> Doc {
        Doc::parse(MergeInto::Env, text.as_bytes().to_vec()).unwrap()
    }

    fn declared(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn the_first_set_records_what_each_key_held_and_whether_the_file_was_there() {
        let found = env("# theirs\nPORT=80\n");
        let p = decide(
            Some(&found),
            None,
            None,
            MergeInto::Env,
            &declared(&[("PORT", "8080"), ("MODE", "mesh")]),
        );
        assert_eq!((p.action, p.write), (Verb::Updated, true));
        assert_eq!(p.detail.as_deref(), Some("set PORT, MODE"));
        assert_eq!(p.doc.text(), "# theirs\nPORT=8080\nMODE=mesh\n");
        assert_eq!(
            p.merged,
            Merged { format: MergeInto::Env, was: was(&[("PORT", Some("80")), ("MODE", None)]), made: false }
        );

        let p = decide(None, None, None, MergeInto::Env, &declared(&[("PORT", "8080")]));
        assert_eq!((p.action, p.merged.made), (Verb::Created, true));
        assert_eq!(p.merged.was, was(&[("PORT", None)]));
    }

    #[test]
    fn a_hand_edit_of_an_owned_key_is_corrected_and_of_another_key_is_nothing() {
        let recorded = Merged { format: MergeInto::Env, was: was(&[("PORT", Some("80"))]), made: false };
        let want = declared(&[("PORT", "8080")]);
        let edited_other = env("# theirs\nPORT=8080\nDEBUG=1\n");
        let p = decide(Some(&edited_other), Some(true), Some(&recorded), MergeInto::Env, &want);
        assert_eq!((p.action, p.write), (Verb::Unchanged, false));
        // What it held before the host is still what it held before the host.
        assert_eq!(p.merged, recorded);

        let edited_owned = env("# theirs\nPORT=9\n");
        let p = decide(Some(&edited_owned), Some(true), Some(&recorded), MergeInto::Env, &want);
        assert_eq!(p.action, Verb::Corrected);
        assert_eq!(p.detail.as_deref(), Some("put back PORT: changed on the machine"));
        assert_eq!(p.merged.was, was(&[("PORT", Some("80"))]));
        // The same difference after the declaration changed is an update.
        let p = decide(Some(&edited_owned), Some(false), Some(&recorded), MergeInto::Env, &want);
        assert_eq!(p.action, Verb::Updated);
    }

    #[test]
    fn a_key_no_longer_declared_is_put_back_and_a_key_given_twice_is_said() {
        let recorded =
            Merged { format: MergeInto::Env, was: was(&[("PORT", Some("80")), ("NEW", None)]), made: false };
        let found = env("PORT=8080\nNEW=1\nNAME=a\nNAME=b\n");
        let p = decide(
            Some(&found),
            Some(false),
            Some(&recorded),
            MergeInto::Env,
            &declared(&[("PORT", "8080"), ("NAME", "web")]),
        );
        assert_eq!(p.doc.text(), "PORT=8080\nNAME=web\nNAME=web\n");
        assert_eq!(
            p.detail.as_deref(),
            Some("set NAME; put back NEW as found; NAME appears 2 times in the file; each was set")
        );
        assert_eq!(p.merged.was, was(&[("PORT", Some("80")), ("NAME", Some("a"))]));
    }
}
