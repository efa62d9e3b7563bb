//! `file`: content, mode and owner, written atomically, never through a symlink, read back.

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use base64::Engine as _;

use super::{begin, Action, Aspect, Ctx, Error, Facts, Outcome, Step, Target};
use crate::declaration::{digest, Digest, File, Kind, Resource};
use crate::system::fs::{Content, Fs, Kind as FsKind, Meta};
use crate::system::journal::Intent;
use crate::system::{ContentFile, Place, Staged};

/// What is read whole of a file found at a managed path whose content is larger than what is
/// declared: enough for a diff a person can read. Anything larger is hashed as a stream.
const HOLD: u64 = 1 << 20;

/// A file written to its temporary name, waiting for the batch commit.
pub(super) struct Pending {
    pub staged: Staged,
    pub checked: Checked,
}

/// What the read-back after the commit must find, and what to report when it does.
pub(super) struct Checked {
    pub index: usize,
    id: String,
    target: String,
    path: PathBuf,
    digest: Digest,
    len: u64,
    mode: u32,
    owner: Option<(u32, u32)>,
    action: Action,
    detail: Option<String>,
}

/// The bytes the declaration puts in the file: its content, its decoded `bytes`, or what the
/// daemon's content file holds for it.
pub fn declared_bytes<'a>(f: &'a File, contents: Option<&ContentFile>) -> Result<Cow<'a, [u8]>, Error> {
    if f.carries_secret() {
        // Refused, never skipped: a machine that quietly leaves out the one file holding a
        // credential looks configured and cannot connect. Opening sealed values needs this
        // node's sealing key, which comes with `keygen` and `seal` (not built yet).
        return Err(Error::Sealed { path: f.path.as_path().to_owned() });
    }
    if f.into.is_some() {
        return Err(Error::IntoUnsupported { path: f.path.as_path().to_owned() });
    }
    if let Some(stored) = &f.stored {
        let place = Place { at: stored.at, len: stored.len, sum: stored.sum };
        let read = contents
            .ok_or_else(|| std::io::Error::other("the daemon has no content file"))
            .and_then(|file| file.read(&place));
        return read
            .map(Cow::Owned)
            .map_err(|error| Error::ContentFile { path: f.path.as_path().to_owned(), error });
    }
    match (&f.content, &f.bytes) {
        (Some(c), _) => Ok(Cow::Borrowed(c.as_bytes())),
        (None, Some(b)) => base64::engine::general_purpose::STANDARD
            .decode(b)
            .map(Cow::Owned)
            .map_err(|error| Error::NotBase64 { path: f.path.as_path().to_owned(), error }),
        (None, None) => Err(Error::NoContent { path: f.path.as_path().to_owned() }),
    }
}

pub(super) fn apply(ctx: &mut Ctx<'_>, r: &Resource, f: &File) -> Result<Step, Error> {
    let path = f.path.as_path();
    let content = declared_bytes(f, ctx.opts.contents.as_deref())?;
    let mode = f.mode().bits();
    let owner = f.owner.as_ref().map(|o| ctx.accounts.resolve(&o.user, o.group.as_deref())).transpose()?;
    let record =
        ctx.store.get(r.id.as_str()).filter(|rec| rec.kind == Kind::File && *rec.target == *r.target());
    // The steady state, and the hot path: a file whose signature (inode, ctime, size) is the
    // one recorded when the host last found it as declared has not been touched since, so it
    // is not read again. Only when the declaration is the one recorded, too.
    if let (Some(rec), false) = (record, f.create_once) {
        if let (Some(sig), true) = (rec.sig, rec.declared == r.digest) {
            if let Some(m) = ctx.fs.meta(path)? {
                let owner_same = owner.is_none_or(|o| Some(o) == rec.owner);
                if m.kind == FsKind::File
                    && m.sig == sig
                    && m.mode == mode
                    && rec.mode == Some(mode)
                    && owner_same
                {
                    let facts = Facts {
                        wrote: rec.wrote,
                        mode: rec.mode,
                        owner: rec.owner,
                        sig: Some(sig),
                        ..Facts::default()
                    };
                    return Ok(Step::Done(begin(r, Action::Unchanged, None), Some(facts)));
                }
            }
        }
    }
    // What is on the machine is read whole only up to the size of what is declared (or a
    // megabyte, for a diff a person can read); anything larger is hashed as a stream, so a huge
    // file at a managed path never sizes an allocation.
    let existing = ctx.fs.read_up_to(path, (content.len() as u64).max(HOLD))?;

    let checked = |action, detail| Checked {
        index: r.index,
        id: r.id.to_string(),
        target: r.target(),
        path: path.to_owned(),
        digest: digest(&content),
        len: content.len() as u64,
        mode,
        owner,
        action,
        detail,
    };

    let Some((meta, held)) = existing else {
        let (action, detail) = match record {
            Some(_) => (Action::Corrected, Some("it had been deleted on the machine".to_owned())),
            None => (Action::Created, None),
        };
        if ctx.opts.dry_run {
            ctx.diffs.0.push((path.display().to_string(), diff(f, b"", &content)));
            return Ok(Step::Done(begin(r, action, detail), None));
        }
        let staged = ctx.fs.stage(path, &content, mode, owner)?;
        return Ok(Step::Staged(Box::new(Pending { staged, checked: checked(action, detail) })));
    };

    if meta.kind != FsKind::File {
        return Err(Error::WrongKind { path: path.to_owned(), declared: Kind::File, found: meta.kind });
    }

    // A seed that is present is left exactly as it is: what the program grew in it since is not
    // the mesh's to put back. The record keeps what the host once wrote, so a later change of
    // the seed in the declaration is not mistaken for drift.
    if f.create_once {
        // No signature: a seed is not compared, so there is nothing for one to save.
        let wrote = record.and_then(|r| r.wrote).or_else(|| held.sum().map(Digest::from_sum));
        let facts = Facts { sig: None, ..found(wrote, &meta) };
        let detail = "created once, and present: what is in it now is not the mesh's to change";
        return Ok(Step::Done(begin(r, Action::Kept, Some(detail.into())), Some(facts)));
    }

    let content_same = matches!(&held, Content::Bytes(b) if *b == *content);
    let found_digest = || held.sum().map(Digest::from_sum);
    let mode_same = meta.mode == mode;
    let owner_same = owner.is_none_or(|o| o == (meta.uid, meta.gid));
    if content_same && mode_same && owner_same {
        // The steady state, and the hot path: no hashing when the declaration has not changed
        // since the record, because what the host wrote is then exactly what is declared.
        let wrote = match record {
            Some(rec) if rec.declared == r.digest && rec.wrote.is_some() => rec.wrote,
            _ => found_digest(),
        };
        return Ok(Step::Done(begin(r, Action::Unchanged, None), Some(found(wrote, &meta))));
    }

    // Drift is a difference from what the host last left, not from what is declared now: a
    // declaration that changed its mind is an update, a machine that changed on its own was
    // changed by hand. What an unfinished pass of the host's was writing (the journal found at
    // start-up) is the host's own work, not a hand's.
    let intended = ctx.store.intended(path);
    let found_ours = !intended.is_empty()
        && found_digest().is_some_and(|d| intended.iter().any(|i| i.sum == d.to_string()));
    let mut drifted = Vec::new();
    let mut changes = Vec::new();
    if !content_same {
        changes.push("content".to_owned());
        if record.is_some_and(|rec| rec.wrote != found_digest()) && !found_ours {
            drifted.push("content".to_owned());
        }
    }
    if !mode_same {
        changes.push(format!("mode {:04o} to {:04o}", meta.mode, mode));
        if record.is_some_and(|rec| rec.mode != Some(meta.mode))
            && !intended.iter().any(|i| i.mode == meta.mode)
        {
            drifted.push(format!("mode (it was {:04o})", meta.mode));
        }
    }
    if let (false, Some((uid, gid))) = (owner_same, owner) {
        changes.push(format!("owner {}:{} to {uid}:{gid}", meta.uid, meta.gid));
        if record.is_some_and(|rec| rec.owner != Some((meta.uid, meta.gid)))
            && !intended.iter().any(|i| i.owner == Some((meta.uid, meta.gid)))
        {
            drifted.push(format!("owner (it was {}:{})", meta.uid, meta.gid));
        }
    }
    let (action, mut detail) = if drifted.is_empty() {
        (Action::Updated, changes.join(", "))
    } else {
        (
            Action::Corrected,
            format!("changed on the machine since the host last wrote it: {}", drifted.join(", ")),
        )
    };

    // The original of a file the host has no record of, under any id, is the machine's until
    // the mesh writes over it: it is kept first, once, and never overwritten.
    let keep =
        !content_same && record.is_none() && !found_ours && !ctx.store.holds_target(Kind::File, &r.target());
    let kept_at = keep.then(|| kept_path(&ctx.opts.kept, path));

    if ctx.opts.dry_run {
        if let Some(at) = &kept_at {
            detail.push_str(&format!("; the file found here would be kept at {}", at.display()));
        }
        if !content_same {
            let shown = match &held {
                Content::Bytes(bytes) => diff(f, bytes, &content),
                other => format!(
                    "content differs: {} bytes on the machine (too large to show), {} declared\n",
                    other.size(),
                    content.len()
                ),
            };
            ctx.diffs.0.push((path.display().to_string(), shown));
        }
        return Ok(Step::Done(begin(r, action, Some(detail)), None));
    }

    if let Some(at) = kept_at {
        // Before anything is written: if the copy fails, the write does not happen, since the
        // original could not be had back otherwise.
        if ctx.fs.meta(&at)?.is_none() {
            let copy = match &held {
                Content::Bytes(bytes) => ctx.fs.stage(&at, bytes, meta.mode & 0o700, None)?,
                _ => ctx.fs.stage_copy(path, &at, meta.mode & 0o700)?,
            };
            ctx.fs.commit(vec![copy]).pop().unwrap_or(Ok(()))?;
        }
        detail.push_str(&format!(
            "; the file found here, which the host had no record of, was kept at {}",
            at.display()
        ));
    }

    if !content_same {
        let staged = ctx.fs.stage(path, &content, mode, owner)?;
        return Ok(Step::Staged(Box::new(Pending { staged, checked: checked(action, Some(detail)) })));
    }
    if meta.links > 1 {
        // A chmod or chown here would reach every other name of this file too, paths the
        // declaration does not name (a hard link from elsewhere, even to a credential file). The
        // path gets a file of its own instead; the other names keep what they had.
        detail.push_str(&format!(
            "; it had {} names (hard links), so it was replaced by a file of its own instead of being changed in place, and the other names were left as they were",
            meta.links
        ));
        let staged = ctx.fs.stage(path, &content, mode, owner)?;
        return Ok(Step::Staged(Box::new(Pending { staged, checked: checked(action, Some(detail)) })));
    }
    if let (false, Some((uid, gid))) = (owner_same, owner) {
        ctx.fs.set_owner(path, uid, gid)?;
    }
    if !mode_same {
        ctx.fs.set_mode(path, mode)?;
    }
    let (outcome, facts) = read_back(&mut ctx.fs, &checked(action, Some(detail)))?;
    Ok(Step::Done(outcome, Some(facts)))
}

impl Checked {
    /// What the journal of intent says of this write.
    pub(super) fn intent(&self) -> Intent {
        Intent { path: self.path.clone(), sum: self.digest.to_string(), mode: self.mode, owner: self.owner }
    }
}

/// Reads the file back after a change: the bytes, the mode and the owner must be what was
/// asked. A write that returned success is not evidence that the value took.
pub(super) fn read_back(fs: &mut Fs, c: &Checked) -> Result<(Outcome, Facts), Error> {
    let mismatch = |what, wanted: String, found: String| Error::ReadBack {
        target: Target::Path(c.path.clone()),
        what,
        wanted,
        found,
    };
    let Some((meta, held)) = fs.read_up_to(&c.path, c.len)? else {
        return Err(mismatch(Aspect::File, "written".into(), "missing".into()));
    };
    if meta.kind != FsKind::File {
        return Err(mismatch(Aspect::File, "a regular file".into(), format!("{:?}", meta.kind)));
    }
    let digest_found = Digest::from_sum(held.sum().expect("a regular file has a sum"));
    if digest_found != c.digest {
        return Err(mismatch(Aspect::Content, c.digest.to_string(), digest_found.to_string()));
    }
    if meta.mode != c.mode {
        return Err(mismatch(Aspect::Mode, format!("{:04o}", c.mode), format!("{:04o}", meta.mode)));
    }
    if let Some((uid, gid)) = c.owner {
        if (meta.uid, meta.gid) != (uid, gid) {
            return Err(mismatch(
                Aspect::Owner,
                format!("{uid}:{gid}"),
                format!("{}:{}", meta.uid, meta.gid),
            ));
        }
    }
    let outcome = Outcome {
        id: c.id.clone(),
        kind: Kind::File,
        target: c.target.clone(),
        action: c.action,
        detail: c.detail.clone(),
    };
    Ok((outcome, found(Some(digest_found), &meta)))
}

/// What to record of a file as it was just found (or read back): the digest of what the host
/// wrote, its mode, owner and, once trustworthy, its change signature.
fn found(wrote: Option<Digest>, meta: &Meta) -> Facts {
    Facts {
        wrote,
        mode: Some(meta.mode),
        owner: Some((meta.uid, meta.gid)),
        sig: meta.settled_sig(),
        ..Facts::default()
    }
}

/// `<kept>/<path>`: where the original of a file found on the machine is kept.
fn kept_path(kept: &Path, path: &Path) -> PathBuf {
    kept.join(path.strip_prefix("/").unwrap_or(path))
}

/// A unified diff of the content a plan would write. Only for text declared in the clear: a
/// file carrying a secret never reaches here, and binary content is summarised.
fn diff(f: &File, old: &[u8], new: &[u8]) -> String {
    match (std::str::from_utf8(old), std::str::from_utf8(new)) {
        (Ok(old), Ok(new)) => similar::TextDiff::from_lines(old, new)
            .unified_diff()
            .context_radius(3)
            .header(&format!("{} (on the machine)", f.path), &format!("{} (declared)", f.path))
            .to_string(),
        _ => format!("binary content differs: {} bytes on the machine, {} declared\n", old.len(), new.len()),
    }
}
