//! `archive`: a tar or tar.gz unpacked into a directory, again only when the archive changes.
//!
//! Every entry is checked before anything is written: an absolute name, a `..` segment, a hard
//! link that points outside, or a device node refuses the whole archive. Then every write goes
//! through the same symlink-refusing path as a `file`, so even a symlink the archive itself
//! made cannot carry a later entry outside the target.
//!
//! Decisions: entries are owned by root whatever the archive says (an archive does not pick
//! accounts on this machine); set-id bits are dropped; files already in the directory that the
//! archive does not name are left alone, as `tar -x` would.

use std::io::Read as _;
use std::path::{Component, Path, PathBuf};

use base64::Engine as _;

use super::{begin, Action, Ctx, Error, Facts, Step};
use crate::declaration::{digest, Archive, Kind, Resource};
use crate::system::fs::Kind as FsKind;

enum Body {
    File(Vec<u8>),
    Dir,
    Symlink(PathBuf),
    HardLink(PathBuf),
}

struct Entry {
    path: PathBuf,
    mode: u32,
    body: Body,
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

fn entries(bytes: &[u8], target: &Path) -> Result<Vec<Entry>, Error> {
    let bad = |why: String| {
        Error::Refused(format!("the archive for {} {why}; nothing was unpacked", target.display()))
    };
    let reader: Box<dyn std::io::Read + '_> = if bytes.starts_with(&[0x1f, 0x8b]) {
        Box::new(flate2::read::GzDecoder::new(bytes))
    } else {
        Box::new(bytes)
    };
    let mut archive = tar::Archive::new(reader);
    let mut out = Vec::new();
    let iter = archive.entries().map_err(|e| bad(format!("is not a tar archive: {e}")))?;
    for entry in iter {
        let mut entry = entry.map_err(|e| bad(format!("cannot be read: {e}")))?;
        let name = entry.path().map_err(|e| bad(format!("has an unreadable name: {e}")))?.into_owned();
        let Some(path) = beneath(&name) else {
            return Err(bad(format!(
                "has an entry {:?} that would land outside it",
                name.display().to_string()
            )));
        };
        if path.as_os_str().is_empty() {
            continue; // "./" itself
        }
        let mode = entry.header().mode().unwrap_or(0o644) & 0o1777;
        let kind = entry.header().entry_type();
        let body = if kind.is_dir() {
            Body::Dir
        } else if kind.is_file() {
            let mut data = Vec::with_capacity(entry.size() as usize);
            entry
                .read_to_end(&mut data)
                .map_err(|e| bad(format!("cannot be read at {}: {e}", path.display())))?;
            Body::File(data)
        } else if kind.is_symlink() {
            let to = entry
                .link_name()
                .ok()
                .flatten()
                .ok_or_else(|| bad(format!("has a symlink {} with no target", path.display())))?;
            Body::Symlink(to.into_owned())
        } else if kind.is_hard_link() {
            let to = entry
                .link_name()
                .ok()
                .flatten()
                .ok_or_else(|| bad(format!("has a hard link {} with no target", path.display())))?;
            let Some(to) = beneath(&to) else {
                return Err(bad(format!(
                    "has a hard link {} to {:?}, outside it",
                    path.display(),
                    to.display().to_string()
                )));
            };
            Body::HardLink(to)
        } else if kind.is_pax_global_extensions()
            || kind.is_pax_local_extensions()
            || kind.is_gnu_longname()
            || kind.is_gnu_longlink()
        {
            continue;
        } else {
            return Err(bad(format!(
                "has {} of a kind mesh-host does not unpack (device, fifo...)",
                path.display()
            )));
        };
        out.push(Entry { path, mode, body });
    }
    Ok(out)
}

pub(super) fn apply(ctx: &mut Ctx<'_>, r: &Resource, a: &Archive) -> Result<Step, Error> {
    let path = a.path.as_path();
    let bytes = match (&a.bytes, &a.source) {
        (Some(b), _) => base64::engine::general_purpose::STANDARD
            .decode(b)
            .map_err(|e| Error::Refused(format!("{}: `bytes` is not base64: {e}", path.display())))?,
        (None, Some(src)) => crate::system::read_input(src.as_path(), u64::MAX)
            .map_err(|e| Error::Refused(format!("cannot read the archive {src}: {e}")))?,
        (None, None) => {
            return Err(Error::Refused(format!("{}: the archive has no bytes or source", path.display())))
        }
    };
    let got = digest(&bytes).to_string();
    if let Some(want) = &a.digest {
        let want = format!("sha256:{}", want.strip_prefix("sha256:").unwrap_or(want));
        if want != got {
            return Err(Error::Refused(format!(
                "the archive for {} is {got}, and the declaration says {want}; nothing was unpacked",
                path.display()
            )));
        }
    }
    let record =
        ctx.store.get(r.id.as_str()).filter(|rec| rec.kind == Kind::Archive && *rec.target == *r.target());
    let present = match ctx.fs.meta(path)? {
        None => false,
        Some(m) if m.kind == FsKind::Directory => true,
        Some(_) => {
            return Err(Error::Refused(format!(
                "{} exists and is not a directory to unpack into; it was left alone",
                path.display()
            )))
        }
    };
    let facts = Facts { archive: Some(got.clone()), ..Facts::default() };
    let (action, detail) = match record {
        Some(rec) if rec.archive() == Some(got.as_str()) && present => {
            return Ok(Step::Done(begin(r, Action::Unchanged, None), Some(facts)));
        }
        Some(rec) if rec.archive() == Some(got.as_str()) => (
            Action::Corrected,
            Some("the directory it was unpacked into had been removed on the machine".to_owned()),
        ),
        Some(rec) => (
            Action::Updated,
            Some(format!("the archive changed from {} to {got}", rec.archive().unwrap_or("nothing"))),
        ),
        None => (Action::Created, Some(format!("unpacked {got}"))),
    };

    let entries = entries(&bytes, path)?;
    if ctx.opts.dry_run {
        return Ok(Step::Done(begin(r, action, detail), None));
    }

    ctx.fs.make_dirs(path, 0o755)?;
    let mut staged = Vec::new();
    for e in &entries {
        let full = path.join(&e.path);
        match &e.body {
            Body::Dir => {
                ctx.fs.make_dirs(&full, e.mode)?;
                ctx.fs.set_mode(&full, e.mode)?;
            }
            Body::File(data) => staged.push(ctx.fs.stage(&full, data, e.mode, None)?),
            Body::Symlink(_) | Body::HardLink(_) => {}
        }
    }
    for result in ctx.fs.commit(staged) {
        result?;
    }
    // Links last, once everything they may point at is in place.
    for e in &entries {
        let full = path.join(&e.path);
        match &e.body {
            Body::Symlink(to) => ctx.fs.symlink(&full, to)?,
            Body::HardLink(to) => ctx.fs.hard_link(&path.join(to), &full)?,
            Body::Dir | Body::File(_) => {}
        }
    }

    // Read back every entry.
    for e in &entries {
        let full = path.join(&e.path);
        let wrong = |what: &str| Error::Refused(format!("{} {what} after unpacking", full.display()));
        match &e.body {
            Body::File(data) => match ctx.fs.read(&full)? {
                Some((m, b)) if m.kind == FsKind::File && b == *data => {}
                _ => return Err(wrong("does not hold what the archive holds")),
            },
            Body::Dir => {
                if ctx.fs.meta(&full)?.is_none_or(|m| m.kind != FsKind::Directory) {
                    return Err(wrong("is not a directory"));
                }
            }
            Body::Symlink(to) => {
                if ctx.fs.read_link(&full)? != *to {
                    return Err(wrong("is not the symlink the archive holds"));
                }
            }
            Body::HardLink(_) => {
                if ctx.fs.meta(&full)?.is_none() {
                    return Err(wrong("is missing"));
                }
            }
        }
    }
    Ok(Step::Done(begin(r, action, detail), Some(facts)))
}
