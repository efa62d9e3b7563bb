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
//! only to a file the host creates.
//!
//! Secret holes (`${secret:NAME}`) may fill owned values. They are opened only when the keys
//! must be compared or written (a file untouched since the host last found its keys as
//! declared is not read at all), each value escaped as its place in the file needs (`Fill`).
//! What the store keeps of such a file is keyed, as for a file carrying a secret: the digest
//! of the whole file is an HMAC under the node's digest key, and what an owned key filled from
//! a secret held before the host set it (often the credential the secret replaces) is sealed
//! to the node's own public key (`Was::Sealed`), opened again only to put it back.
//!
//! Each of these choices is recorded in docs/decisions.md, "`into`" (under "Files and
//! directories"), with its reason; the comments below cite the part they follow.

mod doc;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use age::secrecy::ExposeSecret as _;
use zeroize::Zeroize as _;

use self::doc::{Doc, Pair};
use super::secret::{self, Fill};
use super::{begin, Ctx, Error, Facts, Managers, Step, Verb};
use crate::declaration::{digest, Digest, File, Kind, MergeInto, Resource};
use crate::secrets::{Keyring, Opened};
use crate::store::{Merged, Record, Was};
use crate::system::fs::{Content, Fs, Kind as FsKind, Meta};

/// The largest file whose keys the host edits. Configuration files are kilobytes; a file of
/// this size at such a path is not one, and is not read whole.
const LARGEST: u64 = 16 << 20;

/// How many more times, and how far apart, an env file found empty where the host had set
/// keys is looked at before it is taken as emptied (see `apply`): a program's truncate and
/// write are microseconds apart, so a tenth of a second covers a loaded machine.
const EMPTY_LOOKS: usize = 5;
const EMPTY_WAIT: std::time::Duration = std::time::Duration::from_millis(20);

/// Sets the declared keys in the file, reads them back, and records what they held before.
/// `format` is the file's `into`: the dispatcher calls this only for a file that has one.
pub(super) fn apply(ctx: &mut Ctx<'_>, r: &Resource, f: &File, format: MergeInto) -> Result<Step, Error> {
    let path = f.path.as_path();
    let template = f.content().ok_or_else(|| Error::NoContent { path: path.to_owned() })?;
    let record =
        ctx.store.get(r.id.as_str()).filter(|rec| rec.kind == Kind::File && *rec.target == *r.target());
    let recorded = record.and_then(Record::merged).filter(|m| m.format == format);
    if let Some(step) = untouched(ctx, r, path, record, recorded)? {
        return Ok(step);
    }

    // The keys filled from a secret, told from the template: nothing is opened for this.
    let secret_keys: BTreeSet<String> = declared(format, template)
        .into_iter()
        .filter(|(_, v)| !crate::declaration::secret_holes(v).is_empty())
        .map(|(k, _)| k)
        .collect();
    // The node's key: to open the holes, and to put back a value recorded sealed.
    let ring = if f.carries_secret() {
        Ok(secret::keyring(ctx, f)?)
    } else if recorded.is_some_and(holds_sealed) {
        put_back_ring(ctx.machine, &ctx.opts.key)
    } else {
        Err(NoRing::NotNeeded)
    };
    let vault = Vault { ring: ring.clone(), path, key: &ctx.opts.key };
    let ring = ring.ok();
    // Opened now that the keys must be compared or written; zeroed when this returns.
    let opened: Opened;
    let content = match &ring {
        Some(ring) if f.carries_secret() => {
            opened = open_content(ring, f, format)?;
            // The template is text and each value was checked to be text as it was filled.
            std::str::from_utf8(opened.expose_secret().as_slice()).map_err(|_| Error::IntoValue {
                path: path.to_owned(),
                field: "content".to_owned(),
                why: "is not UTF-8 text",
            })?
        }
        _ => template,
    };
    let declared = declared(format, content);
    // What the store keeps of the file's text is keyed wherever a secret is in play.
    let digest_of = |doc: &Doc| match &ring {
        Some(ring) => Digest::from_keyed(ring.digest(doc.text().as_bytes())),
        None => digest(doc.text().as_bytes()),
    };
    let found = read_settled(&mut ctx.fs, path, format, recorded.is_some())?;

    let plan = decide(
        found.as_ref().map(|(_, d)| d),
        record.map(|rec| rec.declared == r.digest),
        recorded,
        format,
        &declared,
        &secret_keys,
        &vault,
    )?;
    let facts = |doc: &Doc, meta: &Meta, merged: Merged| {
        let sig = meta.trusted_sig();
        Facts {
            wrote: Some(digest_of(doc)),
            mode: Some(meta.mode),
            owner: Some((meta.uid, meta.gid)),
            sig,
            fresh: sig.is_none().then_some(meta.sig),
            into: Some(merged),
            ..Facts::default()
        }
    };
    if !plan.write {
        let (meta, doc) = found.as_ref().expect("nothing to write only when the file is there");
        let facts = facts(doc, meta, plan.merged);
        return Ok(Step::Done(begin(r, plan.action, plan.detail), Some(facts)));
    }
    if ctx.opts.dry_run {
        return Ok(Step::Done(begin(r, plan.action, plan.detail), None));
    }

    let (mode, owner) = match &found {
        Some((meta, _)) => (meta.mode, Some((meta.uid, meta.gid))),
        None => (
            f.mode().bits(),
            f.owner.as_ref().map(|o| ctx.owner_ids.resolve(o.user(), o.group())).transpose()?,
        ),
    };
    let mut detail = plan.detail.clone();
    if let (None, Some(_)) = (record, &found) {
        if let Some(said) = keep_original(ctx, r, path, mode)? {
            detail = Some(match detail {
                Some(d) => format!("{d}; {said}"),
                None => said,
            });
        }
    }
    write(&mut ctx.fs, path, &plan.doc, mode, owner)?;
    let (meta, now) = read_back(&mut ctx.fs, path, format, &declared)?;
    let facts = facts(&now, &meta, plan.merged);
    Ok(Step::Done(begin(r, plan.action, detail), Some(facts)))
}

/// The hot path: a file whose signature is the one recorded when the host last found its keys
/// as declared, under this same declaration, has not been touched since. It is not read, and
/// its secrets are not opened (docs/decisions.md, "Secret holes in `into` content"). `None`:
/// it must be looked at.
fn untouched(
    ctx: &mut Ctx<'_>,
    r: &Resource,
    path: &Path,
    record: Option<&Record>,
    recorded: Option<&Merged>,
) -> Result<Option<Step>, Error> {
    let (Some(rec), Some(merged)) =
        (record.filter(|rec| rec.sig.is_some() && rec.declared == r.digest), recorded)
    else {
        return Ok(None);
    };
    if !ctx.fs.meta(path)?.is_some_and(|m| m.kind == FsKind::File && Some(m.sig) == rec.sig) {
        return Ok(None);
    }
    let facts = Facts {
        wrote: rec.wrote,
        mode: rec.mode.map(u32::from),
        owner: rec.owner.map(Into::into),
        sig: rec.sig,
        into: Some(merged.clone()),
        ..Facts::default()
    };
    Ok(Some(Step::Done(begin(r, Verb::Unchanged, None), Some(facts))))
}

/// The declared content with its secret holes filled, each value written as the format quotes
/// it.
fn open_content(ring: &Keyring, f: &File, format: MergeInto) -> Result<Opened, Error> {
    let fill = match format {
        MergeInto::Json => Fill::JsonString,
        MergeInto::Env => Fill::EnvLine,
    };
    secret::open_as(ring, f, fill)
}

/// Reads the file, and, for an env file the host had set keys in (`recorded`) found empty,
/// again, briefly: a program that rewrites its env file truncates it first, and written into
/// at that moment, the program's own write would land on the file the host replaced, and its
/// lines would be lost. Only then is it taken as emptied. (An empty JSON file is refused
/// outright: it is not an object; see `Doc::parse`.) Both are in docs/decisions.md, "`into`".
fn read_settled(
    fs: &mut Fs,
    path: &Path,
    format: MergeInto,
    recorded: bool,
) -> Result<Option<(Meta, Doc)>, Error> {
    let mut found = read(fs, path, format)?;
    if format == MergeInto::Env && recorded {
        for _ in 0..EMPTY_LOOKS {
            if !found.as_ref().is_some_and(|(_, d)| d.text().is_empty()) {
                break;
            }
            std::thread::sleep(EMPTY_WAIT);
            found = read(fs, path, format)?;
        }
    }
    Ok(found)
}

/// Before the host first writes over a file it has no record of, a copy is kept, as for any
/// file: the keys are put back on removal, and the copy is there for whatever else a person
/// may want back (docs/decisions.md, "A file found with no record"). What to say of it, or
/// `None` when the path is the host's under another id.
fn keep_original(ctx: &mut Ctx<'_>, r: &Resource, path: &Path, mode: u32) -> Result<Option<String>, Error> {
    if ctx.store.holds_target(Kind::File, &r.target()) {
        return Ok(None);
    }
    let at = super::file::kept_path(&ctx.opts.originals, path);
    if ctx.fs.meta(&at)?.is_none() {
        let copy = ctx.fs.stage_copy(path, &at, mode & 0o700)?;
        ctx.fs.commit(vec![copy]).pop().unwrap_or(Ok(()))?;
    }
    Ok(Some(format!("the file as found was kept at {}", at.display())))
}

/// Read back: every owned key holds what is declared, in the file as it is now.
fn read_back(fs: &mut Fs, path: &Path, format: MergeInto, declared: &[Pair]) -> Result<(Meta, Doc), Error> {
    let (meta, now) = read(fs, path, format)?
        .ok_or_else(|| Error::Vanished { target: super::Target::Path(path.to_owned()), did: "written" })?;
    if let Some((key, _)) = declared.iter().find(|(k, v)| !now.holds(k, v)) {
        return Err(Error::IntoReadBack { path: path.to_owned(), key: key.clone() });
    }
    Ok((meta, now))
}

/// The keys and values a declared content sets, in order.
fn declared(format: MergeInto, content: &str) -> Vec<Pair> {
    match format {
        MergeInto::Json => doc::declared_json(content),
        MergeInto::Env => doc::declared_env(content),
    }
}

/// Whether any key's earlier value is recorded sealed.
fn holds_sealed(merged: &Merged) -> bool {
    merged.was.values().any(|w| matches!(w, Some(Was::Sealed { .. })))
}

/// Why the `Vault` has no keyring: none was looked for, since nothing asked for one (nothing to
/// open, nothing sealed to put back), or none could be had.
#[derive(Clone, Debug)]
enum NoRing {
    /// Nothing asked for the key: a seal or an open then is the engine's mistake, said so.
    NotNeeded,
    /// There is no key file at the key's path.
    NoKeyFile,
    /// The key file could not be used: why, as the keyring says it.
    Unusable(String),
}

impl std::fmt::Display for NoRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NoRing::NotNeeded => f.write_str("no key was needed"),
            NoRing::NoKeyFile => {
                f.write_str("there is no key file (a new one made by `mesh-host keygen` would not open it)")
            }
            NoRing::Unusable(why) => f.write_str(why),
        }
    }
}

/// The node's keyring, to open a value recorded sealed, or why there is none.
fn put_back_ring(machine: &mut Managers, key: &Path) -> Result<Arc<Keyring>, NoRing> {
    match machine.keyring(key) {
        Ok(Some(ring)) => Ok(ring),
        Ok(None) => Err(NoRing::NoKeyFile),
        Err(why) => Err(NoRing::Unusable(why.to_string())),
    }
}

/// Seals the value an owned key filled from a secret held before the host set it, so it is
/// recorded sealed, and opens it again to put it back; with the node's key, or why there is
/// none usable.
struct Vault<'a> {
    ring: Result<Arc<Keyring>, NoRing>,
    /// The `into` file, for errors.
    path: &'a Path,
    /// Where the node's key is looked for, for errors.
    key: &'a Path,
}

/// What `decide` seals and opens with: the node's key (`Vault`), or a stand-in in tests.
trait Seal {
    /// What `owned` held before the host, as it is recorded: sealed.
    fn seal(&self, owned: &str, plain: &str) -> Result<Was, Error>;
    /// Puts back in `doc` what `owned` held before the host, opening it if it was sealed.
    fn put_back(&self, doc: &mut Doc, owned: &str, was: &Was) -> Result<(), Error>;
    /// A sealed value that opens only with the node's previous key (a rotation under way)
    /// sealed again to the current one, so that retiring the previous key does not lose it;
    /// `None` when it needs nothing.
    fn refresh(&self, owned: &str, sealed: &str) -> Result<Option<Was>, Error>;
}

impl Seal for Vault<'_> {
    fn seal(&self, owned: &str, plain: &str) -> Result<Was, Error> {
        let failed =
            |why: String| Error::IntoSeal { path: self.path.to_owned(), owned: owned.to_owned(), why };
        let ring = self.ring.as_ref().map_err(|why| failed(why.to_string()))?;
        let sealed =
            crate::secrets::seal(&ring.public_key(), plain.as_bytes()).map_err(|e| failed(e.to_string()))?;
        Ok(Was::Sealed { sealed })
    }

    fn put_back(&self, doc: &mut Doc, owned: &str, was: &Was) -> Result<(), Error> {
        match was {
            Was::Plain(value) => doc.restore(owned, value),
            Was::Sealed { sealed } => {
                let opened = self.open(owned, sealed)?;
                doc.restore(owned, self.text(owned, &opened)?);
            }
        }
        Ok(())
    }

    fn refresh(&self, owned: &str, sealed: &str) -> Result<Option<Was>, Error> {
        let Ok(ring) = &self.ring else { return Ok(None) };
        if !ring.has_previous() || ring.opens_with_current(sealed) {
            return Ok(None);
        }
        // One that opens with neither is left as it is: the apply goes on, and only putting
        // it back, should that come, fails, naming the key (docs/decisions.md, "`into`":
        // "Without a key that opens it, the removal fails and keeps the record").
        let Ok(opened) = ring.open(sealed) else { return Ok(None) };
        self.seal(owned, self.text(owned, &opened)?).map(Some)
    }
}

impl Vault<'_> {
    fn open(&self, owned: &str, sealed: &str) -> Result<Opened, Error> {
        let ring = self.ring.as_ref().map_err(|why| self.cannot_open(owned, why.to_string()))?;
        ring.open(sealed).map_err(|e| self.cannot_open(owned, e.to_string()))
    }

    /// An opened earlier value as text: it was sealed from the file's own text.
    fn text<'o>(&self, owned: &str, opened: &'o Opened) -> Result<&'o str, Error> {
        std::str::from_utf8(opened.expose_secret().as_slice())
            .map_err(|_| self.cannot_open(owned, "it opens to bytes that are not text".to_owned()))
    }

    fn cannot_open(&self, owned: &str, why: String) -> Error {
        Error::IntoPutBack {
            path: self.path.to_owned(),
            owned: owned.to_owned(),
            key: self.key.to_owned(),
            why,
        }
    }
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
/// as it is now (`None`: no record), what the record says the keys held, what is declared, and
/// which of its keys are filled from a secret. Nothing here touches the machine: the vault
/// seals what those keys held before the host, and opens what is to be put back.
#[allow(
    clippy::too_many_arguments,
    reason = "plain values in, a plan out: each is one fact the decision needs, and a struct for them would be built at its one call only"
)]
fn decide(
    found: Option<&Doc>,
    record_current: Option<bool>,
    recorded: Option<&Merged>,
    format: MergeInto,
    declared: &[Pair],
    secret_keys: &BTreeSet<String>,
    vault: &dyn Seal,
) -> Result<Plan, Error> {
    let mut doc = found.cloned().unwrap_or_else(|| Doc::empty(format));
    let mut was = recorded.map(|m| m.was.clone()).unwrap_or_default();
    // The host made the file if it was not there when the host first set a key in it.
    let made = recorded.map_or(found.is_none(), |m| m.made);

    // Keys the declaration no longer sets are put back as they were.
    let mut released = Vec::new();
    let gone: Vec<String> = was.keys().filter(|k| !declared.iter().any(|(d, _)| d == *k)).cloned().collect();
    for key in gone {
        match was.remove(&key).flatten() {
            Some(before) => vault.put_back(&mut doc, &key, &before)?,
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
        note_before(&mut was, key, held.first().copied(), secret_keys.contains(key), vault)?;
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
        // value was changed on the machine; other keys are not even compared (docs/decisions.md,
        // "`into`", drift).
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
    Ok(Plan { action, detail, doc, write, merged: Merged { format, was, made } })
}

/// Notes what `key` held before the host first set it (`held`, the file's first value for it),
/// as the record keeps it: only the first time, sealed when the key is filled from a secret
/// (`secret`); and a value recorded in the clear, or sealed to a key being rotated away, sealed
/// again once.
fn note_before(
    was: &mut BTreeMap<String, Option<Was>>,
    key: &str,
    held: Option<&str>,
    secret: bool,
    vault: &dyn Seal,
) -> Result<(), Error> {
    match was.get_mut(key) {
        // Only the first time the host sets it: what it holds later is the host's own
        // value. Sealed when the key is filled from a secret: it is likely the credential
        // the secret replaces, and if the host wrote it (a record lost), it is a secret
        // (docs/decisions.md, "`into`": "sealed to the node's own public key").
        None => {
            let before = match held {
                None => None,
                Some(v) if secret => Some(vault.seal(key, v)?),
                Some(v) => Some(Was::Plain(v.to_owned())),
            };
            was.insert(key.to_owned(), before);
        }
        // Recorded in the clear before the key was filled from a secret: sealed now, once,
        // since sealing is not deterministic and the store must not move every pass
        // (docs/decisions.md, "`into`": "sealed to the node's own public key").
        Some(Some(before @ Was::Plain(_))) if secret => {
            let Was::Plain(plain) = before else { unreachable!("matched as plain") };
            let sealed = vault.seal(key, plain)?;
            plain.zeroize();
            *before = sealed;
        }
        // Sealed to a key being rotated away: sealed again to the current one, once, so
        // `--retire-previous` does not strand it (docs/decisions.md, "Secret holes in `into`
        // content", during a rotation).
        Some(Some(before @ Was::Sealed { .. })) => {
            let Was::Sealed { sealed } = &*before else { unreachable!("matched as sealed") };
            if let Some(again) = vault.refresh(key, sealed)? {
                *before = again;
            }
        }
        Some(_) => {}
    }
    Ok(())
}

/// What is at the path, read and checked to be of its format; `None` when nothing is there.
fn read(fs: &mut Fs, path: &Path, format: MergeInto) -> Result<Option<(Meta, Doc)>, Error> {
    // Nothing larger is read, nor hashed: it is refused by its size.
    let Some((meta, content)) = fs.read_bounded(path, LARGEST, LARGEST)? else { return Ok(None) };
    let unreadable = |why: String| Error::IntoUnreadable { path: path.to_owned(), why, format: name(format) };
    let bytes = match content {
        Content::Bytes(b) => b,
        Content::NotFile => {
            return Err(Error::WrongKind { path: path.to_owned(), declared: Kind::File, found: meta.kind })
        }
        Content::Large { size, .. } | Content::Unhashed { size } => {
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
///
/// A value recorded sealed (the key was filled from a secret) is opened with the node's key to
/// be put back; without a key that opens it, the removal fails and the record stays, so the
/// operator's value is never lost.
pub(super) fn remove(
    fs: &mut Fs,
    machine: &mut Managers,
    key: &Path,
    path: &Path,
    merged: &Merged,
    dry_run: bool,
) -> Result<(Verb, Option<String>), Error> {
    let Some((meta, found)) = read(fs, path, merged.format)? else {
        return Ok((Verb::Forgotten, Some("no longer declared, and the file is no longer there".to_owned())));
    };
    let ring = if holds_sealed(merged) { put_back_ring(machine, key) } else { Err(NoRing::NotNeeded) };
    let vault = Vault { ring, path, key };
    let mut doc = found.clone();
    let mut restored = Vec::new();
    let mut taken = Vec::new();
    for (owned, was) in &merged.was {
        match was {
            Some(before) => {
                vault.put_back(&mut doc, owned, before)?;
                restored.push(owned.as_str());
            }
            None => {
                doc.remove(owned);
                taken.push(owned.as_str());
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
    fn was(pairs: &[(&str, Option<&str>)]) -> BTreeMap<String, Option<Was>> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), v.map(|v| Was::Plain(v.to_owned())))).collect()
    }

    fn env(text: &str) -> Doc {
        Doc::parse(MergeInto::Env, text.as_bytes().to_vec()).unwrap()
    }

    fn declared(pairs: &[(&str, &str)]) -> Vec<Pair> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), zeroize::Zeroizing::new((*v).to_owned()))).collect()
    }

    /// Seals by wrapping, so a test can see what was sealed and that it is put back opened.
    struct Wrap;

    impl Seal for Wrap {
        fn seal(&self, _: &str, plain: &str) -> Result<Was, Error> {
            Ok(Was::Sealed { sealed: format!("sealed({plain})") })
        }

        fn put_back(&self, doc: &mut Doc, owned: &str, was: &Was) -> Result<(), Error> {
            match was {
                Was::Plain(v) => doc.restore(owned, v),
                Was::Sealed { sealed } => {
                    doc.restore(owned, sealed.strip_prefix("sealed(").unwrap().strip_suffix(')').unwrap())
                }
            }
            Ok(())
        }

        fn refresh(&self, _: &str, sealed: &str) -> Result<Option<Was>, Error> {
            // "Sealed to the previous key": sealed again, to the current one.
            Ok(sealed.strip_prefix("previous:").map(|rest| Was::Sealed { sealed: rest.to_owned() }))
        }
    }

    /// `decide` for keys none of which is filled from a secret.
    fn decide(
        found: Option<&Doc>,
        record_current: Option<bool>,
        recorded: Option<&Merged>,
        format: MergeInto,
        declared: &[Pair],
    ) -> Plan {
        super::decide(found, record_current, recorded, format, declared, &BTreeSet::new(), &Wrap).unwrap()
    }

    #[test]
    fn what_a_key_filled_from_a_secret_held_before_is_recorded_sealed_and_put_back_opened() {
        let secret: BTreeSet<String> = ["PASSWORD".to_owned()].into();
        let found = env("USER=theirs\nPASSWORD=old-credential\n");
        let want = declared(&[("PASSWORD", "opened-value"), ("MODE", "mesh")]);
        let p = super::decide(Some(&found), None, None, MergeInto::Env, &want, &secret, &Wrap).unwrap();
        assert_eq!(p.doc.text(), "USER=theirs\nPASSWORD=opened-value\nMODE=mesh\n");
        let sealed = Some(Was::Sealed { sealed: "sealed(old-credential)".to_owned() });
        assert_eq!(p.merged.was.get("PASSWORD"), Some(&sealed), "sealed, never in the clear");
        assert_eq!(p.merged.was.get("MODE"), Some(&None));

        // Recorded in the clear before the key carried a secret: sealed now, and only once.
        let clear =
            Merged { format: MergeInto::Env, was: was(&[("PASSWORD", Some("old-credential"))]), made: false };
        let written = env("USER=theirs\nPASSWORD=opened-value\n");
        let want = declared(&[("PASSWORD", "opened-value")]);
        let p =
            super::decide(Some(&written), Some(false), Some(&clear), MergeInto::Env, &want, &secret, &Wrap)
                .unwrap();
        assert_eq!((p.action, p.write), (Verb::Unchanged, false));
        assert_eq!(p.merged.was.get("PASSWORD"), Some(&sealed));
        let again =
            super::decide(Some(&written), Some(true), Some(&p.merged), MergeInto::Env, &want, &secret, &Wrap)
                .unwrap();
        assert_eq!(again.merged, p.merged, "not sealed again");

        // During a rotation, a value sealed to the previous key is sealed again to the current.
        let old = Merged {
            format: MergeInto::Env,
            was: [(
                "PASSWORD".to_owned(),
                Some(Was::Sealed { sealed: "previous:sealed(old-credential)".into() }),
            )]
            .into(),
            made: false,
        };
        let p = super::decide(Some(&written), Some(true), Some(&old), MergeInto::Env, &want, &secret, &Wrap)
            .unwrap();
        assert_eq!(p.merged.was.get("PASSWORD"), Some(&sealed));

        // The key leaves the declaration: what it held is opened and put back.
        let p = super::decide(
            Some(&written),
            Some(false),
            Some(&again.merged),
            MergeInto::Env,
            &[],
            &secret,
            &Wrap,
        )
        .unwrap();
        assert_eq!(p.doc.text(), "USER=theirs\nPASSWORD=old-credential\n");
        assert!(p.merged.was.is_empty());
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
