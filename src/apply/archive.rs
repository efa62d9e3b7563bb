//! `archive`: a tar or tar.gz unpacked into a directory, again only when the archive changes.
//!
//! Every entry is checked before anything is written: an absolute name, a `..` segment, a hard
//! link that points outside, or a device node refuses the whole archive. Then every write goes
//! through the same symlink-refusing path as a `file`, so even a symlink the archive itself
//! made cannot carry a later entry outside the target.
//!
//! Nothing the archive says sizes an allocation, and nothing is held whole: the archive is read
//! as a stream three times. The first pass looks only at the headers as they are written
//! (sizes, kinds, the size of each long-name or pax record) against the limits
//! (`--archive-max-bytes`, `--archive-max-entries`) and takes the digest; the second reads the
//! names and checks each; the third streams each file into its temporary name. A source file
//! that changes between passes is caught by its digest, and what was staged is removed.
//!
//! Decisions: entries are owned by root whatever the archive says (an archive does not pick
//! accounts on this machine); set-id bits are dropped; files already in the directory that the
//! archive does not name are left alone, as `tar -x` would; a file it does name, found there
//! before the host first unpacked it, is kept first as a `file`'s original is
//! (docs/decisions.md, "Archives").

use std::io::{self, BufRead as _, Read, Seek as _};
use std::path::{Component, Path, PathBuf};

use sha2::Digest as _;

use super::{begin, Ctx, Error, Facts, Step, Verb};
use crate::declaration::{Archive, Digest, Kind, Resource, Sha256};
use crate::store::Record;
use crate::system::fs::{Fs, Kind as FsKind};

/// How much one archive may unpack: a forged or runaway archive fails its resource instead of
/// filling the disk or the agent's memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArchiveLimits {
    /// Bytes of file content in all, as the entries' headers give them.
    pub bytes: u64,
    /// Entries of any kind.
    pub entries: u64,
}

impl Default for ArchiveLimits {
    fn default() -> ArchiveLimits {
        ArchiveLimits { bytes: 4 << 30, entries: 100_000 }
    }
}

/// The largest long-name or pax record read: names and attributes, never content.
const META_MAX: u64 = 1 << 20;

enum Body {
    File { size: u64 },
    Dir,
    Symlink(PathBuf),
    HardLink(PathBuf),
}

struct Entry {
    path: PathBuf,
    mode: u32,
    body: Body,
}

/// The archive's bytes: declared inline, or a file on the machine, kept open so every pass
/// reads the same file.
enum Source<'a> {
    Inline(&'a [u8]),
    File(std::fs::File),
}

/// A reader that feeds everything it reads to a hash.
struct Hashing<R> {
    inner: R,
    hasher: sha2::Sha256,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

impl Source<'_> {
    /// One pass over the archive from its start: the raw bytes, hashed as they are read, and the
    /// tar stream (gunzipped when the bytes start as gzip does).
    fn pass(&mut self) -> io::Result<Pass<'_>> {
        let raw: Box<dyn Read + '_> = match self {
            Source::Inline(b) => Box::new(*b),
            Source::File(f) => {
                f.rewind()?;
                Box::new(&*f)
            }
        };
        let mut raw = io::BufReader::new(Hashing { inner: raw, hasher: sha2::Sha256::new() });
        let gz = raw.fill_buf()?.starts_with(&[0x1f, 0x8b]);
        Ok(Pass { raw, gz })
    }
}

struct Pass<'a> {
    raw: io::BufReader<Hashing<Box<dyn Read + 'a>>>,
    gz: bool,
}

impl Pass<'_> {
    fn tar(&mut self) -> tar::Archive<Box<dyn Read + '_>> {
        let stream: Box<dyn Read + '_> = if self.gz {
            Box::new(flate2::bufread::GzDecoder::new(&mut self.raw))
        } else {
            Box::new(&mut self.raw)
        };
        tar::Archive::new(stream)
    }

    /// The digest of every raw byte, reading what the tar reader left unread.
    fn digest(mut self) -> io::Result<Digest> {
        io::copy(&mut self.raw, &mut io::sink())?;
        Ok(Digest::from_sum(self.raw.into_inner().hasher.finalize().into()))
    }
}

/// A relative path that stays beneath the target, or `None`.
fn beneath(name: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in name.components() {
        match c {
            Component::Normal(part) => out.push(part),
            Component::CurDir => {}
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

fn refused(target: &Path, why: String) -> Error {
    Error::ArchiveRefused { path: target.to_owned(), why }
}

/// Whether an entry carries names or attributes for the next one rather than being one itself.
fn is_meta(kind: tar::EntryType) -> bool {
    kind.is_pax_global_extensions()
        || kind.is_pax_local_extensions()
        || kind.is_gnu_longname()
        || kind.is_gnu_longlink()
}

/// The first pass: every header as written, before any record in it is interpreted, against
/// the limits; and the digest of the archive.
fn measure(src: &mut Source, limits: ArchiveLimits, target: &Path) -> Result<Digest, Error> {
    let bad = |why: String| refused(target, why);
    let mut pass = src.pass().map_err(|e| bad(format!("cannot be read: {e}")))?;
    {
        let mut tar = pass.tar();
        let iter = tar.entries().map_err(|e| bad(format!("is not a tar archive: {e}")))?.raw(true);
        let (mut count, mut bytes) = (0u64, 0u64);
        for entry in iter {
            let entry = entry.map_err(|e| bad(format!("cannot be read: {e}")))?;
            count += 1;
            if count > limits.entries {
                return Err(bad(format!(
                    "has more than {} entries, the limit (--archive-max-entries)",
                    limits.entries
                )));
            }
            let size =
                entry.header().entry_size().map_err(|e| bad(format!("has an unreadable size: {e}")))?;
            if is_meta(entry.header().entry_type()) {
                if size > META_MAX {
                    return Err(bad(format!(
                        "has a name or attribute record of {size} bytes, more than the {META_MAX} mesh-host reads"
                    )));
                }
            } else {
                bytes = bytes.saturating_add(size);
                if bytes > limits.bytes {
                    return Err(bad(format!(
                        "would unpack more than {} bytes, the limit (--archive-max-bytes): an entry claims {size} bytes",
                        limits.bytes
                    )));
                }
            }
        }
    }
    pass.digest().map_err(|e| bad(format!("cannot be read: {e}")))
}

/// What one tar entry is, checked: `Ok(None)` for a record that only carries names.
fn check(entry: &tar::Entry<'_, impl Read>, bad: &dyn Fn(String) -> Error) -> Result<Option<Entry>, Error> {
    let name = entry.path().map_err(|e| bad(format!("has an unreadable name: {e}")))?.into_owned();
    let Some(path) = beneath(&name) else {
        return Err(bad(format!("has an entry {:?} that would land outside it", name.display().to_string())));
    };
    let kind = entry.header().entry_type();
    if path.as_os_str().is_empty() || is_meta(kind) {
        return Ok(None); // "./" itself, or names for the next entry
    }
    let mode = entry.header().mode().unwrap_or(0o644) & 0o1777;
    let link = || {
        entry
            .link_name()
            .ok()
            .flatten()
            .map(|l| l.into_owned())
            .ok_or_else(|| bad(format!("has a link {} with no target", path.display())))
    };
    let body = if kind.is_dir() {
        Body::Dir
    } else if kind.is_file() {
        Body::File { size: entry.size() }
    } else if kind.is_symlink() {
        Body::Symlink(link()?)
    } else if kind.is_hard_link() {
        let to = link()?;
        let Some(to) = beneath(&to) else {
            return Err(bad(format!(
                "has a hard link {} to {:?}, outside it",
                path.display(),
                to.display().to_string()
            )));
        };
        Body::HardLink(to)
    } else {
        return Err(bad(format!(
            "has {} of a kind mesh-host does not unpack (device, fifo...)",
            path.display()
        )));
    };
    Ok(Some(Entry { path, mode, body }))
}

/// The second pass: every entry's name and kind, checked before anything is written.
fn entries(src: &mut Source, target: &Path, measured: &Digest) -> Result<Vec<Entry>, Error> {
    let bad = |why: String| refused(target, why);
    let mut pass = src.pass().map_err(|e| bad(format!("cannot be read: {e}")))?;
    let mut out = Vec::new();
    {
        let mut tar = pass.tar();
        for entry in tar.entries().map_err(|e| bad(format!("is not a tar archive: {e}")))? {
            let entry = entry.map_err(|e| bad(format!("cannot be read: {e}")))?;
            out.extend(check(&entry, &bad)?);
        }
    }
    if pass.digest().map_err(|e| bad(format!("cannot be read: {e}")))? != *measured {
        return Err(bad("changed while it was read".to_owned()));
    }
    Ok(out)
}

/// Reads the archive twice to check it, decides (`decide`, pure), then unpacks and reads back.
pub(super) fn apply(ctx: &mut Ctx<'_>, r: &Resource, a: &Archive) -> Result<Step, Error> {
    let path = a.path.as_path();
    let mut src = source(a)?;
    let got = measure(&mut src, ctx.opts.archive_limits, path)?;
    check_digest(path, a.digest.map(Sha256::digest), &got)?;
    let record =
        ctx.store.get(r.id.as_str()).filter(|rec| rec.kind == Kind::Archive && *rec.target == *r.target());
    let found = ctx.fs.meta(path)?.map(|m| m.kind);
    let facts = Facts { archive: Some(got.to_string()), ..Facts::default() };
    let mut listed = None;
    let (action, detail) = match decide(path, record, found, &got)? {
        Plan::Unchanged if ctx.store.after_a_crash() => {
            let all = entries(&mut src, path, &got)?;
            let lost = lost_after_a_crash(&mut ctx.fs, path, &all)?;
            listed = Some(all);
            match lost {
                0 => return Ok(Step::Done(begin(r, Verb::Unchanged, None), Some(facts))),
                n => (Verb::Updated, Some(format!("the last pass did not finish, and {n} of the files unpacked here were missing or empty: unpacked again"))),
            }
        }
        Plan::Unchanged => return Ok(Step::Done(begin(r, Verb::Unchanged, None), Some(facts))),
        Plan::Unpack(action, detail) => (action, Some(detail)),
    };
    let entries = match listed {
        Some(all) => all,
        None => entries(&mut src, path, &got)?,
    };
    // Only before the host first unpacks this archive here: once it has, the files it names
    // are the ones it wrote, and keeping each on every update would fill `kept/` with the
    // host's own old versions (docs/decisions.md, "Archives").
    let (kept, noted) = match record {
        None => keep_found(ctx, path, &entries)?,
        Some(_) => (0, 0),
    };
    let detail = kept_said(ctx, path, detail, kept, noted);
    if ctx.opts.dry_run {
        return Ok(Step::Done(begin(r, action, detail), None));
    }
    let sums = unpack(&mut ctx.fs, &mut src, path, &entries, &got)?;
    read_back(&mut ctx.fs, path, &entries, sums)?;
    Ok(Step::Done(begin(r, action, detail), Some(facts)))
}

/// After a pass that did not finish (a journal found at start-up), how many of the files an
/// archive recorded as unpacked are missing, or empty where the archive's are not: what a power
/// cut leaves when a disk acknowledged a flush it had not made, the record durable and the
/// files' delayed data not. Only then is an archive's tree looked at; otherwise its files are
/// the operator's to change, as after `tar -x` (docs/decisions.md, "Archives").
fn lost_after_a_crash(fs: &mut Fs, path: &Path, entries: &[Entry]) -> Result<usize, Error> {
    let mut lost = 0;
    for e in entries {
        if let Body::File { size } = e.body {
            let there = fs.meta(&path.join(&e.path))?;
            if there.is_none_or(|m| m.kind != FsKind::File || (m.sig.size == 0 && size > 0)) {
                lost += 1;
            }
        }
    }
    Ok(lost)
}

/// What the archive's outcome says of the files found where it unpacks: how many were kept
/// whole, and how many, larger than `--keep-max-bytes`, only noted.
fn kept_said(
    ctx: &Ctx<'_>,
    path: &Path,
    detail: Option<String>,
    kept: usize,
    noted: usize,
) -> Option<String> {
    if kept + noted == 0 {
        return detail;
    }
    let files = |n: usize| if n == 1 { "file" } else { "files" };
    let verb = if ctx.opts.dry_run { "would be" } else { "were" };
    let under = super::file::kept_path(&ctx.opts.originals, path);
    let mut said = detail.unwrap_or_default();
    if kept > 0 {
        said.push_str(&format!(
            "; {kept} {} found here, which the host had no record of, {verb} kept under {}",
            files(kept),
            under.display()
        ));
    }
    if noted > 0 {
        said.push_str(&format!(
            "; {noted} {} found here, which the host had no record of, {verb} not kept, being larger than --keep-max-bytes ({}): only their size, mode and owner, in a note ending {} under {}",
            files(noted),
            ctx.opts.keep_max_bytes,
            super::file::NOT_KEPT,
            under.display()
        ));
    }
    Some(said)
}

/// Keeps, as a `file` keeps its original, each regular file already at a path the archive is
/// about to write over that the host has no record of writing: copied once to
/// `<kept>/<its path>`, never overwritten, before anything is unpacked. A copy that fails fails
/// the archive before it has changed anything. Returns how many were (or, in a plan, would be)
/// kept; a copy already there from an earlier apply counts, since it is where the original is.
fn keep_found(ctx: &mut Ctx<'_>, path: &Path, entries: &[Entry]) -> Result<(usize, usize), Error> {
    let (mut kept, mut noted) = (0, 0);
    for e in entries {
        // A directory entry keeps what is in it; a link is made only where nothing is (a
        // file there fails the unpack, touching nothing of it).
        let Body::File { .. } = e.body else { continue };
        let full = path.join(&e.path);
        let Some(meta) = ctx.fs.meta(&full)? else { continue };
        if meta.kind != FsKind::File || ctx.store.holds_target(Kind::File, &full.display().to_string()) {
            continue;
        }
        // One larger than `--keep-max-bytes` is not copied, nor hashed: a note of its size,
        // mode and owner is kept instead (issue 45, point 3).
        let keep = super::file::Keep::of(&ctx.opts.originals, &full, meta.sig.size, ctx.opts.keep_max_bytes);
        match keep {
            super::file::Keep::Copy(_) => kept += 1,
            super::file::Keep::Note { .. } => noted += 1,
        }
        if ctx.opts.dry_run {
            continue;
        }
        if let Some(copy) = keep.stage(&mut ctx.fs, &full, &meta, None)? {
            ctx.fs.commit(vec![copy]).pop().unwrap_or(Ok(()))?;
        }
    }
    Ok((kept, noted))
}

/// The archive's bytes, as declared: inline, or a regular file on the machine.
fn source(a: &Archive) -> Result<Source<'_>, Error> {
    let path = a.path.as_path();
    match (&a.bytes, &a.source) {
        (Some(b), _) => Ok(Source::Inline(b.as_slice())),
        (None, Some(src)) => crate::system::input::open_regular(src.as_path())
            .map(|(file, _)| Source::File(file))
            .map_err(|error| Error::ArchiveSource { path: src.as_path().to_owned(), error }),
        (None, None) => Err(Error::NoArchive { path: path.to_owned() }),
    }
}

/// The archive must be the one the declaration names by digest, when it names one.
fn check_digest(path: &Path, declared: Option<Digest>, got: &Digest) -> Result<(), Error> {
    let Some(want) = declared else { return Ok(()) };
    if want != *got {
        return Err(refused(path, format!("is {got}, and the declaration says {want}")));
    }
    Ok(())
}

/// What to do with an archive.
#[derive(Debug, PartialEq, Eq)]
enum Plan {
    /// Unpacked at this digest already, and its directory is there.
    Unchanged,
    /// Unpacked, and what the report says.
    Unpack(Verb, String),
}

/// Decides from the kind of what is at the target (`None`: nothing), the record, and the
/// digest of the archive now. Pure. Only the archive's digest is compared, never the files it
/// unpacked: those may be changed or added to, as after `tar -x`.
fn decide(path: &Path, record: Option<&Record>, found: Option<FsKind>, got: &Digest) -> Result<Plan, Error> {
    let present = match found {
        None => false,
        Some(FsKind::Directory) => true,
        Some(kind) => {
            return Err(Error::WrongKind { path: path.to_owned(), declared: Kind::Archive, found: kind })
        }
    };
    let got_text = got.to_string();
    Ok(match record.map(|rec| rec.archive()) {
        Some(Some(was)) if was == got_text && present => Plan::Unchanged,
        Some(Some(was)) if was == got_text => Plan::Unpack(
            Verb::Corrected,
            "the directory it was unpacked into had been removed on the machine".to_owned(),
        ),
        Some(was) => Plan::Unpack(
            Verb::Updated,
            format!("the archive changed from {} to {got}", was.unwrap_or("nothing")),
        ),
        None => Plan::Unpack(Verb::Created, format!("unpacked {got}")),
    })
}

/// The third pass: each file streamed into its temporary name, in step with what was checked,
/// then committed; links last, once everything they may point at is in place. Returns the
/// digest of each file, in order, for the read-back.
fn unpack(
    fs: &mut Fs,
    src: &mut Source,
    path: &Path,
    entries: &[Entry],
    got: &Digest,
) -> Result<Vec<Digest>, Error> {
    let bad = |why: String| refused(path, why);
    fs.make_dirs(path, 0o755)?;
    let mut staged = Vec::new();
    let mut sums = Vec::new();
    let mut pass = src.pass().map_err(|e| bad(format!("cannot be read: {e}")))?;
    {
        let mut tar = pass.tar();
        let mut planned = entries.iter();
        for entry in tar.entries().map_err(|e| bad(format!("is not a tar archive: {e}")))? {
            let mut entry = entry.map_err(|e| bad(format!("cannot be read: {e}")))?;
            let Some(seen) = check(&entry, &bad)? else { continue };
            let e = planned
                .next()
                .filter(|e| {
                    e.path == seen.path
                        && std::mem::discriminant(&e.body) == std::mem::discriminant(&seen.body)
                })
                .ok_or_else(|| bad("changed while it was read".to_owned()))?;
            let full = path.join(&e.path);
            match &e.body {
                Body::Dir => {
                    fs.make_dirs(&full, e.mode)?;
                    fs.set_dir_mode(&full, e.mode)?;
                }
                Body::File { .. } => {
                    let mut reader = Hashing { inner: &mut entry, hasher: sha2::Sha256::new() };
                    staged.push(fs.stage_from(&full, &mut reader, e.mode, None)?);
                    sums.push(Digest::from_sum(reader.hasher.finalize().into()));
                }
                Body::Symlink(_) | Body::HardLink(_) => {}
            }
        }
    }
    // What was staged is removed again (when `staged` drops) if the source changed meanwhile.
    if pass.digest().map_err(|e| bad(format!("cannot be read: {e}")))? != *got {
        return Err(bad("changed while it was read".to_owned()));
    }
    for result in fs.commit(staged) {
        result?;
    }
    for e in entries {
        let full = path.join(&e.path);
        match &e.body {
            Body::Symlink(to) => fs.symlink(&full, to)?,
            Body::HardLink(to) => fs.hard_link(&path.join(to), &full)?,
            Body::Dir | Body::File { .. } => {}
        }
    }
    Ok(sums)
}

/// Reads back every entry, files as streams: each file must hold what the archive holds
/// (`sums`, in order), each directory and link must be there.
fn read_back(fs: &mut Fs, path: &Path, entries: &[Entry], sums: Vec<Digest>) -> Result<(), Error> {
    let mut sums = sums.into_iter();
    for e in entries {
        let full = path.join(&e.path);
        let wrong = |what| Error::Unpacked { path: full.clone(), what };
        match &e.body {
            Body::File { size } => {
                let want = sums.next();
                match fs.read_up_to(&full, 0)? {
                    Some((m, held))
                        if m.kind == FsKind::File
                            && held.size() == *size
                            && held.sum().map(Digest::from_sum) == want => {}
                    _ => return Err(wrong("does not hold what the archive holds")),
                }
            }
            Body::Dir => {
                if fs.meta(&full)?.is_none_or(|m| m.kind != FsKind::Directory) {
                    return Err(wrong("is not a directory"));
                }
            }
            Body::Symlink(to) => {
                if fs.read_link(&full)? != *to {
                    return Err(wrong("is not the symlink the archive holds"));
                }
            }
            Body::HardLink(_) => {
                if fs.meta(&full)?.is_none() {
                    return Err(wrong("is missing"));
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::declaration::digest;

    fn record(archive: Option<&str>) -> Record {
        Record {
            origin: crate::store::Origin::Declared,
            kind: Kind::Archive,
            target: "/srv/site".into(),
            position: 0,
            declared: digest(b"v1"),
            applied_at: 0,
            wrote: None,
            mode: None,
            owner: None,
            sig: None,
            more: crate::store::More { archive: archive.map(str::to_owned), ..Default::default() }.boxed(),
        }
    }

    #[test]
    fn an_archive_is_unpacked_again_only_when_it_or_its_directory_changed() {
        let path = Path::new("/srv/site");
        let got = digest(b"the archive");
        let at = got.to_string();
        let plan = |rec: Option<&Record>, found| decide(path, rec, found, &got).unwrap();
        assert_eq!(plan(None, None), Plan::Unpack(Verb::Created, format!("unpacked {got}")));
        // Into a directory that is there already, as `tar -x` would.
        assert_eq!(
            plan(None, Some(FsKind::Directory)),
            Plan::Unpack(Verb::Created, format!("unpacked {got}"))
        );
        let same = record(Some(&at));
        assert_eq!(plan(Some(&same), Some(FsKind::Directory)), Plan::Unchanged);
        assert_eq!(
            plan(Some(&same), None),
            Plan::Unpack(
                Verb::Corrected,
                "the directory it was unpacked into had been removed on the machine".into()
            )
        );
        assert_eq!(
            plan(Some(&record(Some("sha256:old"))), Some(FsKind::Directory)),
            Plan::Unpack(Verb::Updated, format!("the archive changed from sha256:old to {got}"))
        );
        assert_eq!(
            plan(Some(&record(None)), Some(FsKind::Directory)),
            Plan::Unpack(Verb::Updated, format!("the archive changed from nothing to {got}"))
        );
        for kind in [FsKind::File, FsKind::Symlink, FsKind::Other] {
            assert!(
                matches!(decide(path, Some(&same), Some(kind), &got), Err(Error::WrongKind { found, .. }) if found == kind),
                "{kind:?}"
            );
        }
    }

    #[test]
    fn the_declared_digest_is_checked_when_there_is_one() {
        let path = Path::new("/srv/site");
        let got = digest(b"the archive");
        assert!(check_digest(path, None, &got).is_ok());
        assert!(check_digest(path, Some(got), &got).is_ok());
        let other = digest(b"another");
        assert_eq!(
            check_digest(path, Some(other), &got).unwrap_err().to_string(),
            format!(
                "the archive for /srv/site is {got}, and the declaration says {other}; nothing was unpacked"
            )
        );
    }
}
