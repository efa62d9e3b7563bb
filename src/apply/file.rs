//! `file`: content, mode and owner, written atomically, never through a symlink, read back.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use age::secrecy::ExposeSecret as _;

use super::{begin, secret, Aspect, Ctx, Error, Facts, HandEdit, Outcome, Step, Target, Verb};
use crate::declaration::{digest, Digest, File, Kind, Resource};
use crate::secrets::Keyring;
use crate::store::Record;
use crate::system::fs::{Content, Expect, Fs, Kind as FsKind, Meta};
use crate::system::journal::Intent;
use crate::system::{ContentFile, Place, Staged};

/// What is read whole of a file found at a managed path whose content is larger than what is
/// declared: enough for a diff a person can read. Anything larger is hashed as a stream.
const HOLD: u64 = 1 << 20;

/// A file written to its temporary name, waiting for the batch commit.
pub(super) struct Pending {
    pub staged: Staged,
    pub checked: Checked,
    /// The copy of the file found there, to be kept before it is written over: committed with
    /// the other copies of the batch, before any of the batch's files (see `Pass::flush`).
    pub kept: Option<Staged>,
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
    action: Verb,
    detail: Option<String>,
    /// For a file carrying a secret: what its digests are keyed with.
    keyed: Option<Arc<Keyring>>,
    /// For a correction of the content: what the hand-edit left, for the drift history. The
    /// diff is made at the read-back, once the file is put back, so that it never delays that.
    edit: Option<Edit>,
}

/// What a correction of a file's content keeps of the hand-edit until the read-back.
enum Edit {
    /// The declared content and what was found, both text and at most `HandEdit::LARGEST`
    /// bytes, of a file whose content may be shown (`hidden`).
    Texts { declared: String, found: String },
    /// Why nothing of it is kept.
    Omitted(String),
}

/// The bytes the declaration puts in the file: its content, its decoded `bytes`, or what the
/// daemon's content file holds for it.
pub fn declared_bytes<'a>(f: &'a File, contents: Option<&ContentFile>) -> Result<Cow<'a, [u8]>, Error> {
    if f.carries_secret() {
        // Its bytes exist only opened, in the applier, for as long as it needs them
        // (`secret::open`): never as plain bytes handed to whoever asks.
        return Err(Error::Sealed { path: f.path.as_path().to_owned() });
    }
    if f.into.is_some() {
        return Err(Error::IntoUnsupported { path: f.path.as_path().to_owned() });
    }
    if let Some(stored) = f.stored() {
        let place = Place { at: stored.at(), len: stored.length(), sum: stored.sum() };
        let read = contents
            .ok_or_else(|| std::io::Error::other("the daemon has no content file"))
            .and_then(|file| file.read(&place));
        return read
            .map(Cow::Owned)
            .map_err(|error| Error::ContentFile { path: f.path.as_path().to_owned(), error });
    }
    f.inline_body().map(Cow::Borrowed).ok_or_else(|| Error::NoContent { path: f.path.as_path().to_owned() })
}

/// Looks at the file, decides what to do (`decide`, pure), then does it (`act`): what can be
/// decided without the machine is, so every branch of it is tested without root.
pub(super) fn apply(ctx: &mut Ctx<'_>, r: &Resource, f: &File) -> Result<Step, Error> {
    let path = f.path.as_path();
    let owner = f.owner.as_ref().map(|o| ctx.owner_ids.resolve(o.user(), o.group())).transpose()?;
    // Declared before `want`, which borrows it once it is known.
    let content: Cow<'_, [u8]>;
    let opened;
    let mut want = Declared {
        path,
        content: &[],
        declared: r.digest,
        mode: f.mode().bits(),
        owner,
        create_once: f.create_once,
        keyed: None,
    };
    let store = ctx.store;
    let record = store.get(r.id.as_str()).filter(|rec| rec.kind == Kind::File && *rec.target == *r.target());
    // The hot path: a file untouched since the host last found it as declared is not read, and
    // a file carrying a secret is not opened.
    if let Some(rec) = record.filter(|rec| may_be_untouched(rec, &want)) {
        if let Some(facts) = ctx.fs.meta(path)?.and_then(|m| untouched(rec, &want, &m)) {
            return Ok(Step::Done(begin(r, Verb::Unchanged, None), Some(facts)));
        }
    }
    if f.carries_secret() {
        // Opened now that it must be compared or written, and zeroed when this returns.
        let ring = secret::keyring(ctx, f)?;
        opened = secret::open(&ring, f)?;
        content = Cow::Borrowed(opened.expose_secret().as_slice());
        want.keyed = Some(ring);
    } else {
        content = declared_bytes(f, ctx.opts.contents.as_deref())?;
    }
    want.content = &content;
    // What is on the machine is read whole only up to the size of what is declared (or a
    // megabyte, for a diff a person can read); anything larger is hashed as a stream, so a huge
    // file at a managed path never sizes an allocation (docs/decisions.md, "Inputs and what is
    // found at managed paths"). What was read of a file carrying a secret is zeroed when this
    // returns (`Wiped`).
    // Nor is one larger than `--keep-max-bytes` hashed, unless the host last found it at that
    // size: a sparse 100 GiB file planted here costs a stat (issue 45, point 3).
    let hash_max =
        record.map_or(ctx.opts.keep_max_bytes, |rec| super::status::hash_bound(rec, ctx.opts.keep_max_bytes));
    let found = Wiped(ctx.fs.read_bounded(path, (content.len() as u64).max(HOLD), hash_max)?);
    let found = &found.0;
    let known = Known {
        record,
        intended: store.intended(path),
        recorded_elsewhere: &|| store.holds_target(Kind::File, &r.target()),
        kept: &ctx.opts.originals,
        keep_max: ctx.opts.keep_max_bytes,
    };
    let plan = decide(found.as_ref().map(|(meta, held)| (meta, held)), &known, &want)?;
    // Found after a crash where the unfinished pass was writing, and kept as it is (or only
    // its mode or owner set): durable before it is recorded (`Fs::found_in_flight`). A file
    // written anew is synced by its own commit.
    if !known.intended.is_empty()
        && !ctx.opts.dry_run
        && matches!(plan.change, Change::None(_) | Change::Set { .. })
    {
        ctx.fs.found_in_flight(path)?;
    }
    if let Change::None(facts) = plan.change {
        return Ok(Step::Done(begin(r, plan.action, plan.detail), Some(*facts)));
    }
    if ctx.opts.dry_run {
        if let Some(shown) = planned_diff(&plan, found.as_ref(), f, &content) {
            ctx.diffs.0.push((path.display().to_string(), shown));
        }
        return Ok(Step::Done(begin(r, plan.action, plan.planned()), None));
    }
    let edit = plan.hand_content.then(|| hand_edit(f, &want, found.as_ref()));
    act(&mut ctx.fs, r, &want, plan, found.as_ref(), edit)
}

/// What the declaration asks of one file, resolved to plain values.
struct Declared<'a> {
    path: &'a Path,
    content: &'a [u8],
    /// The digest of the resource's declaration, to compare with the record's.
    declared: Digest,
    mode: u32,
    owner: Option<(u32, u32)>,
    create_once: bool,
    /// For a file carrying a secret: the keyring its digests are keyed with. What the store
    /// and the journal hold of it is then a keyed digest, never a plain sha256 of a secret.
    keyed: Option<Arc<Keyring>>,
}

impl Declared<'_> {
    /// The digest recorded for some content: keyed for a file carrying a secret.
    fn digest_of(&self, bytes: &[u8]) -> Digest {
        match &self.keyed {
            Some(ring) => Digest::from_keyed(ring.digest(bytes)),
            None => digest(bytes),
        }
    }

    /// The digest of what was found, in the same kind. A file carrying a secret found larger
    /// than what is read whole has no keyed digest: it is not what the host wrote.
    fn digest_found(&self, held: &Content) -> Option<Digest> {
        match (&self.keyed, held) {
            (None, held) => held.sum().map(Digest::from_sum),
            (Some(ring), Content::Bytes(bytes)) => Some(Digest::from_keyed(ring.digest(bytes))),
            (Some(_), Content::Large { .. } | Content::Unhashed { .. } | Content::NotFile) => None,
        }
    }
}

/// What was read of a file, zeroed when dropped: it may hold a secret (the file's own, or a
/// credential the machine had there).
struct Wiped(Option<(Meta, Content)>);

impl Drop for Wiped {
    fn drop(&mut self) {
        if let Some((_, Content::Bytes(bytes))) = &mut self.0 {
            zeroize::Zeroize::zeroize(bytes);
        }
    }
}

/// What the host knows of a file besides what is on the machine.
struct Known<'a> {
    /// Its record, when it names this file at this path.
    record: Option<&'a Record>,
    /// What an unfinished pass of the host's was writing here (the journal found at start-up).
    intended: &'a [Intent],
    /// Whether any record, under any id, holds this path. Asked only when an original might be
    /// kept: it is a scan of the store.
    recorded_elsewhere: &'a dyn Fn() -> bool,
    /// Where originals are kept (`Options::kept`).
    kept: &'a Path,
    /// The largest original kept whole (`Options::keep_max_bytes`).
    keep_max: u64,
}

/// What to do with a file, and what to report.
struct Plan {
    action: Verb,
    /// What the report says, before what only acting can add (see `Plan::applied`).
    detail: Option<String>,
    change: Change,
    /// The content is corrected: a hand changed it since the host last wrote it.
    hand_content: bool,
}

enum Change {
    /// Nothing: the file is as declared, or is a seed and present. Recorded as found.
    None(Box<Facts>),
    /// The declared content written to a temporary name and renamed over whatever is there.
    Write {
        /// What is kept first of the original, found with no record of the host's.
        keep: Option<Keep>,
    },
    /// Mode or owner differ on a file that has other names (hard links): a chmod or chown in
    /// place would reach those too, so a file of its own, with the same content, replaces it.
    Replace { links: u64 },
    /// Mode and owner set in place; `None` where already as declared.
    Set { mode: Option<u32>, owner: Option<(u32, u32)> },
}

impl Plan {
    /// What `plan` reports.
    fn planned(&self) -> Option<String> {
        match &self.change {
            Change::Write { keep: Some(Keep::Copy(at)) } => {
                Some(self.said(&format!("; the file found here would be kept at {}", at.display())))
            }
            Change::Write { keep: Some(Keep::Note { note, size, limit }) } => Some(self.said(&format!(
                "; the file found here, {size} bytes, is larger than --keep-max-bytes ({limit}): it would not be kept, only its size, mode and owner, at {}",
                note.display()
            ))),
            Change::None(_) | Change::Write { keep: None } | Change::Replace { .. } | Change::Set { .. } => {
                self.detail.clone()
            }
        }
    }

    /// What `apply` reports once the change is made.
    fn applied(&self) -> Option<String> {
        match &self.change {
            Change::Write { keep: Some(Keep::Copy(at)) } => Some(self.said(&format!(
                "; the file found here, which the host had no record of, was kept at {}",
                at.display()
            ))),
            Change::Write { keep: Some(Keep::Note { note, size, limit }) } => Some(self.said(&format!(
                "; the file found here, which the host had no record of, was {size} bytes, more than --keep-max-bytes ({limit}): its bytes were not kept, and its size, mode and owner were recorded at {}",
                note.display()
            ))),
            Change::Replace { links } => Some(self.said(&format!(
                "; it had {links} names (hard links), so it was replaced by a file of its own instead of being changed in place, and the other names were left as they were"
            ))),
            Change::None(_) | Change::Write { keep: None } | Change::Set { .. } => self.detail.clone(),
        }
    }

    fn said(&self, more: &str) -> String {
        format!("{}{more}", self.detail.as_deref().unwrap_or_default())
    }
}

/// Whether the record allows skipping the read: the host last found the file as declared, under
/// this same declaration, and took its signature then. A seed is never compared, so has none.
fn may_be_untouched(rec: &Record, want: &Declared<'_>) -> bool {
    !want.create_once && rec.sig.is_some() && rec.declared == want.declared
}

/// The steady state, and the hot path: a file whose signature (inode, ctime, size) is the one
/// recorded when the host last found it as declared has not been touched since, so it is not
/// read again. A signature is recorded only once it can be trusted to move on the next change
/// (ARCHITECTURE.md, "Invariants"). What to record when so.
fn untouched(rec: &Record, want: &Declared<'_>, m: &Meta) -> Option<Facts> {
    let owner_same = want.owner.is_none_or(|o| Some(o) == rec.owner.map(<(u32, u32)>::from));
    let same = may_be_untouched(rec, want)
        && m.kind == FsKind::File
        && rec.sig == Some(m.sig)
        && m.mode == want.mode
        && rec.mode.map(u32::from) == Some(want.mode)
        && owner_same;
    same.then(|| Facts {
        wrote: rec.wrote,
        mode: rec.mode.map(u32::from),
        owner: rec.owner.map(Into::into),
        sig: rec.sig,
        ..Facts::default()
    })
}

/// Decides what to do with a file from what was found at its path (its metadata and what it
/// holds, `None` when nothing is there), what the host knows of it, and what is declared. Pure:
/// nothing here touches the machine.
fn decide(found: Option<(&Meta, &Content)>, known: &Known<'_>, want: &Declared<'_>) -> Result<Plan, Error> {
    let record = known.record;
    let Some((meta, held)) = found else {
        let (action, detail) = match record {
            Some(_) => (Verb::Corrected, Some("it had been deleted on the machine".to_owned())),
            None => (Verb::Created, None),
        };
        return Ok(Plan { action, detail, change: Change::Write { keep: None }, hand_content: false });
    };
    if meta.kind != FsKind::File {
        return Err(Error::WrongKind { path: want.path.to_owned(), declared: Kind::File, found: meta.kind });
    }

    if want.create_once {
        return Ok(seed_kept(record, meta, held, want));
    }

    // Hashed at most once, and only when needed: the steady state below never hashes.
    let digest_found = std::cell::OnceCell::new();
    let found_digest = || *digest_found.get_or_init(|| digest_or_recorded(want, held, meta, record));
    let content_same = matches!(held, Content::Bytes(b) if *b == *want.content);
    let mode_same = meta.mode == want.mode;
    let owner_same = want.owner.is_none_or(|o| o == (meta.uid, meta.gid));
    if content_same && mode_same && owner_same {
        // No hashing when the declaration has not changed since the record, because what the
        // host wrote is then exactly what is declared.
        let wrote = match record {
            Some(rec)
                if rec.declared == want.declared
                    && rec.wrote.is_some_and(|w| w.is_keyed() == want.keyed.is_some()) =>
            {
                rec.wrote
            }
            _ => found_digest(),
        };
        let change = Change::None(Box::new(as_found(wrote, meta)));
        return Ok(Plan { action: Verb::Unchanged, detail: None, change, hand_content: false });
    }

    // Drift is a difference from what the host last left, not from what is declared now: a
    // declaration that changed its mind is an update, a machine that changed on its own was
    // changed by hand (ARCHITECTURE.md, "Drift versus a change of mind"). What an unfinished
    // pass of the host's was writing (the journal found at start-up) is the host's own work, not
    // a hand's (docs/durability.md, "Crashes").
    let intended = known.intended;
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
        changes.push(format!("mode {:04o} to {:04o}", meta.mode, want.mode));
        if record.is_some_and(|rec| rec.mode.map(u32::from) != Some(meta.mode))
            && !intended.iter().any(|i| i.mode == meta.mode)
        {
            drifted.push(format!("mode (it was {:04o})", meta.mode));
        }
    }
    let owner_change = want.owner.filter(|_| !owner_same);
    if let Some((uid, gid)) = owner_change {
        changes.push(format!("owner {}:{} to {uid}:{gid}", meta.uid, meta.gid));
        if record.is_some_and(|rec| rec.owner.map(<(u32, u32)>::from) != Some((meta.uid, meta.gid)))
            && !intended.iter().any(|i| i.owner == Some((meta.uid, meta.gid)))
        {
            drifted.push(format!("owner (it was {}:{})", meta.uid, meta.gid));
        }
    }
    let (action, detail) = match drifted.is_empty() {
        true => (Verb::Updated, changes.join(", ")),
        false => (
            Verb::Corrected,
            format!("changed on the machine since the host last wrote it: {}", drifted.join(", ")),
        ),
    };

    let change = if !content_same {
        // The original of a file the host has no record of, under any id, is the machine's
        // until the mesh writes over it: it is kept first, once, and never overwritten
        // (docs/decisions.md, "A file found with no record").
        let keep = record.is_none() && !found_ours && !(known.recorded_elsewhere)();
        Change::Write { keep: keep.then(|| Keep::of(known.kept, want.path, meta.sig.size, known.keep_max)) }
    } else if meta.links > 1 {
        // A chmod or chown here would reach every other name of this file too, paths the
        // declaration does not name (a hard link from elsewhere, even to a credential file). The
        // path gets a file of its own instead; the other names keep what they had
        // (docs/decisions.md, "Inputs and what is found at managed paths").
        Change::Replace { links: meta.links }
    } else {
        Change::Set { mode: (!mode_same).then_some(want.mode), owner: owner_change }
    };
    let hand_content = drifted.first().is_some_and(|d| d == "content");
    Ok(Plan { action, detail: Some(detail), change, hand_content })
}

/// The digest of what was found, or, for a file too large to hash (`Content::Unhashed`) whose
/// signature is the one recorded, what the host wrote there, which it still holds; any other
/// unhashed file has none, and differs from what the host wrote.
fn digest_or_recorded(
    want: &Declared<'_>,
    held: &Content,
    meta: &Meta,
    record: Option<&Record>,
) -> Option<Digest> {
    want.digest_found(held).or_else(|| {
        record.filter(|rec| matches!(held, Content::Unhashed { .. }) && rec.sig == Some(meta.sig))?.wrote
    })
}

/// A seed that is present is left exactly as it is: what the program grew in it since is not
/// the mesh's to put back. The record keeps what the host once wrote, so a later change of the
/// seed in the declaration is not mistaken for drift.
fn seed_kept(record: Option<&Record>, meta: &Meta, held: &Content, want: &Declared<'_>) -> Plan {
    // No signature: a seed is not compared, so there is nothing for one to save.
    let wrote = record.and_then(|r| r.wrote).or_else(|| want.digest_found(held));
    let detail = "created once, and present: what is in it now is not the mesh's to change";
    let facts = Facts { sig: None, fresh: None, ..as_found(wrote, meta) };
    Plan {
        action: Verb::Kept,
        detail: Some(detail.into()),
        change: Change::None(Box::new(facts)),
        hand_content: false,
    }
}

/// What a plan shows of the content it would write: a diff, where the content changes.
///
/// Never a secret: not the content of a file carrying one (opened or on the machine), and not
/// what is on the machine when that file is not world-readable, which a dry run must not turn
/// into a way of reading a credential already on disk. Those say only that the content
/// differs (docs/decisions.md, "`plan` never diffs a file on the machine that is not
/// world-readable").
fn planned_diff(plan: &Plan, found: Option<&(Meta, Content)>, f: &File, content: &[u8]) -> Option<String> {
    let Change::Write { .. } = plan.change else { return None };
    let path = &f.path;
    if let Some(why) = hidden(f, found.map(|(meta, _)| meta.mode), None) {
        return Some(format!("{path}: content differs (not shown: {why})\n"));
    }
    Some(match found {
        None => diff(f, b"", content),
        Some((_, Content::Bytes(bytes))) => diff(f, bytes, content),
        Some((_, other)) => format!(
            "content differs: {} bytes on the machine (too large to show), {} declared\n",
            other.size(),
            content.len()
        ),
    })
}

/// Why the content of a file may not be shown, if it may not: the one rule for `plan`'s diffs
/// and the drift history's. Never the content of a file carrying a secret (opened or on the
/// machine), and never what is on the machine when that file is not world-readable (`found`),
/// nor, for the history, content declared not world-readable (`declared`): a dry run or the
/// history must not turn into a way of reading a credential already on disk (docs/decisions.md,
/// "`plan` never diffs a file on the machine that is not world-readable").
fn hidden(f: &File, found: Option<u32>, declared: Option<u32>) -> Option<String> {
    if f.carries_secret() {
        return Some("it carries a secret".to_owned());
    }
    if let Some(mode) = found.filter(|m| m & 0o004 == 0) {
        return Some(format!("the file on the machine is not world-readable, mode {mode:04o}"));
    }
    declared
        .filter(|m| m & 0o004 == 0)
        .map(|mode| format!("the file is declared not world-readable, mode {mode:04o}"))
}

/// What a correction of a file's content keeps of the hand-edit: both sides as text, where
/// `hidden` allows it and both are small text; else why not. What was found is already held
/// (the applier read it to compare): nothing is read again.
fn hand_edit(f: &File, want: &Declared<'_>, found: Option<&(Meta, Content)>) -> Edit {
    let Some((meta, held)) = found else {
        return Edit::Omitted("the file had been deleted".to_owned());
    };
    if let Some(why) = hidden(f, Some(meta.mode), Some(want.mode)) {
        return Edit::Omitted(why);
    }
    let Content::Bytes(bytes) = held else {
        return Edit::Omitted(format!("the file found is larger than {} KiB", HandEdit::LARGEST / 1024));
    };
    if bytes.len() > HandEdit::LARGEST || want.content.len() > HandEdit::LARGEST {
        return Edit::Omitted(format!("a side is larger than {} KiB", HandEdit::LARGEST / 1024));
    }
    match (as_text(want.content), as_text(bytes)) {
        (Some(declared), Some(found)) => {
            Edit::Texts { declared: declared.to_owned(), found: found.to_owned() }
        }
        _ => Edit::Omitted("a side is not UTF-8 text".to_owned()),
    }
}

impl Edit {
    /// The history's words: the unified diff from the declared content to what the hand-edit
    /// left, cut at `HandEdit::MAX` bytes on a line's end. Its time is bounded too: past 20 ms
    /// the diff settles for a coarser one, as `similar` does at a deadline.
    fn said(&self, path: &Path) -> HandEdit {
        let (declared, found) = match self {
            Edit::Texts { declared, found } => (declared, found),
            Edit::Omitted(why) => return HandEdit::Omitted(why.clone()),
        };
        let mut text = similar::TextDiff::configure()
            .timeout(std::time::Duration::from_millis(20))
            .diff_lines(declared.as_str(), found.as_str())
            .unified_diff()
            .context_radius(3)
            .header(&format!("{} (declared)", path.display()), &format!("{} (as found)", path.display()))
            .to_string();
        if text.len() > HandEdit::MAX {
            let mut end = HandEdit::MAX;
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            end = text[..end].rfind('\n').map_or(0, |i| i + 1);
            text.truncate(end);
            text.push_str(&format!("... the diff goes on; cut at {} bytes\n", HandEdit::MAX));
        }
        HandEdit::Diff(text)
    }
}

/// Carries out a plan that changes the file: writes are staged for the pass's batch commit and
/// read back after it; a change of mode or owner in place is read back at once.
fn act(
    fs: &mut Fs,
    r: &Resource,
    want: &Declared<'_>,
    plan: Plan,
    found: Option<&(Meta, Content)>,
    edit: Option<Edit>,
) -> Result<Step, Error> {
    let path = want.path;
    let checked = Checked {
        index: r.index(),
        id: r.id.to_string(),
        target: r.target(),
        path: path.to_owned(),
        digest: want.digest_of(want.content),
        len: want.content.len() as u64,
        mode: want.mode,
        owner: want.owner,
        action: plan.action,
        detail: plan.applied(),
        keyed: want.keyed.clone(),
        edit,
    };
    match plan.change {
        Change::None(facts) => Ok(Step::Done(begin(r, plan.action, plan.detail), Some(*facts))),
        Change::Write { keep } => {
            let mut kept = None;
            if let (Some(keep), Some((meta, held))) = (keep, found) {
                // Staged now, put in place before anything of the batch is written: if the copy
                // fails, the write does not happen, since the original could not be had back
                // otherwise.
                kept = keep.stage(fs, path, meta, Some(held))?;
            }
            let staged = fs.stage(path, want.content, want.mode, want.owner)?;
            Ok(Step::Staged(Box::new(Pending { staged, checked, kept })))
        }
        Change::Replace { .. } => {
            let staged = fs.stage(path, want.content, want.mode, want.owner)?;
            Ok(Step::Staged(Box::new(Pending { staged, checked, kept: None })))
        }
        Change::Set { mode, owner } => {
            // On the file that was read and checked, or on nothing: whatever was put at the
            // name since (a hard link to another file, another file renamed in) fails this
            // resource untouched (`Fs::change_in_place`; security review F7).
            let looked = found
                .map(|(meta, _)| meta)
                .ok_or_else(|| Error::Vanished { target: Target::Path(path.to_owned()), did: "looked at" })?;
            fs.change_in_place(path, Expect::Checked(looked), owner, mode)?;
            let (outcome, facts) = read_back(fs, &checked)?;
            Ok(Step::Done(outcome, Some(facts)))
        }
    }
}

/// What is kept of the original of a file found with no record of the host's, before the host
/// first writes over it (docs/decisions.md, "A file found with no record").
pub(super) enum Keep {
    /// A copy, whole, at `<kept>/<path>`.
    Copy(PathBuf),
    /// Larger than `--keep-max-bytes`: no copy, and no hash past that limit either; its size,
    /// mode, owner (and digest, where one was taken) are written to this note,
    /// `<kept>/<path>.not-kept.json`, instead (issue 45, point 3).
    Note { note: PathBuf, size: u64, limit: u64 },
}

/// What ends the name of the note kept instead of a copy too large to keep.
pub const NOT_KEPT: &str = ".not-kept.json";

impl Keep {
    /// What to keep of a file of `size` bytes at `path`, kept under `kept`.
    pub(super) fn of(kept: &Path, path: &Path, size: u64, limit: u64) -> Keep {
        let at = kept_path(kept, path);
        if size <= limit {
            return Keep::Copy(at);
        }
        let mut note = at.into_os_string();
        note.push(NOT_KEPT);
        Keep::Note { note: note.into(), size, limit }
    }

    /// Stages the copy, or the note, unless a copy or a note of this path is already there
    /// (neither is ever overwritten). The copy keeps only the owner's bits of the original's
    /// mode: whatever the file held (a credential, often) is readable by root alone in
    /// `kept/`, whoever could read it at its own path. `held` is what was read of it, when it
    /// was: bytes are staged from memory, anything else is copied as a stream from `path`.
    pub(super) fn stage(
        &self,
        fs: &mut Fs,
        path: &Path,
        meta: &Meta,
        held: Option<&Content>,
    ) -> Result<Option<Staged>, Error> {
        let (at, note) = match self {
            Keep::Copy(at) => {
                let mut note = at.clone().into_os_string();
                note.push(NOT_KEPT);
                (at.clone(), PathBuf::from(note))
            }
            Keep::Note { note, .. } => {
                let at = note.to_string_lossy();
                (PathBuf::from(at.strip_suffix(NOT_KEPT).unwrap_or(&at)), note.clone())
            }
        };
        if fs.meta(&at)?.is_some() || fs.meta(&note)?.is_some() {
            return Ok(None);
        }
        let mode = meta.mode & 0o700;
        Ok(Some(match (self, held) {
            (Keep::Copy(_), Some(Content::Bytes(bytes))) => fs.stage(&at, bytes, mode, None)?,
            (Keep::Copy(_), _) => fs.stage_copy(path, &at, mode)?,
            (Keep::Note { size, limit, .. }, held) => {
                let said = serde_json::json!({
                    "path": path,
                    "size": size,
                    "mode": format!("{:04o}", meta.mode),
                    "uid": meta.uid,
                    "gid": meta.gid,
                    "sha256": held.and_then(Content::sum).map(|sum| Digest::from_sum(sum).to_string()),
                    "kept": false,
                    "why": format!("{size} bytes, more than the limit on a kept copy (--keep-max-bytes {limit}): its bytes were not kept, nor hashed past that limit"),
                });
                fs.stage(&note, format!("{said:#}\n").as_bytes(), 0o600, None)?
            }
        }))
    }
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
    let read = Wiped(fs.read_up_to(&c.path, c.len)?);
    let Some((meta, held)) = &read.0 else {
        return Err(mismatch(Aspect::File, "written".into(), "missing".into()));
    };
    if meta.kind != FsKind::File {
        return Err(mismatch(Aspect::File, "a regular file".into(), format!("{:?}", meta.kind)));
    }
    // For a file carrying a secret, a keyed digest, so that even a mismatch's message shows
    // nothing a guess could be checked against.
    let digest_found = match (&c.keyed, held) {
        (Some(ring), Content::Bytes(bytes)) => Digest::from_keyed(ring.digest(bytes)),
        (Some(_), other) => {
            return Err(mismatch(
                Aspect::Content,
                format!("{} bytes", c.len),
                format!("{} bytes", other.size()),
            ))
        }
        (None, held) => match held.sum() {
            Some(sum) => Digest::from_sum(sum),
            // Larger than what was written, and than what is hashed: not what the host wrote.
            None => {
                return Err(mismatch(
                    Aspect::Content,
                    format!("{} bytes", c.len),
                    format!("{} bytes", held.size()),
                ))
            }
        },
    };
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
        hand_edit: c.edit.as_ref().map(|e| e.said(&c.path)),
    };
    Ok((outcome, as_found(Some(digest_found), meta)))
}

/// What to record of a file as it was just found (or read back): the digest of what the host
/// wrote, its mode, owner and, once trustworthy, its change signature.
fn as_found(wrote: Option<Digest>, meta: &Meta) -> Facts {
    let sig = meta.trusted_sig();
    Facts {
        wrote,
        mode: Some(meta.mode),
        owner: Some((meta.uid, meta.gid)),
        sig,
        fresh: sig.is_none().then_some(meta.sig),
        ..Facts::default()
    }
}

/// `<kept>/<path>`: where the original of a file found on the machine is kept.
pub(super) fn kept_path(kept: &Path, path: &Path) -> PathBuf {
    kept.join(path.strip_prefix("/").unwrap_or(path))
}

/// A unified diff of the content a plan would write. Only for text declared in the clear: a
/// file carrying a secret never reaches here, and binary content is summarised.
fn diff(f: &File, old: &[u8], new: &[u8]) -> String {
    match (as_text(old), as_text(new)) {
        (Some(old), Some(new)) => similar::TextDiff::from_lines(old, new)
            .unified_diff()
            .context_radius(3)
            .header(&format!("{} (on the machine)", f.path), &format!("{} (declared)", f.path))
            .to_string(),
        // Raw bytes in a terminal are noise at best and escape sequences at worst: the sizes
        // say what a person can act on (docs/decisions.md, "The command line").
        _ => format!("{}: binary content differs ({} bytes to {} bytes)\n", f.path, old.len(), new.len()),
    }
}

/// Content a diff can show as lines: UTF-8 with no NUL byte. A NUL marks binary content even
/// where the bytes happen to decode, as git decides.
fn as_text(bytes: &[u8]) -> Option<&str> {
    if bytes.contains(&0) {
        return None;
    }
    std::str::from_utf8(bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::declaration::{Declaration, Spec};

    fn file_of<'a>(d: &'a Declaration, id: &str) -> &'a File {
        match &d.find(id).unwrap().spec {
            Spec::File(f) => f,
            other => panic!("{other:?}"),
        }
    }

    // The decision, without a machine: plain values in, a plan out.

    const PATH: &str = "/etc/app.conf";
    const SIG: crate::system::Sig =
        crate::system::Sig { inode: 7, ctime: 1_000, ctime_nsec: crate::system::Nanos::new(0), size: 3 };

    fn meta(kind: FsKind, mode: u32, owner: (u32, u32), links: u64) -> Meta {
        Meta { kind, mode, uid: owner.0, gid: owner.1, dev: 1, links, sig: SIG }
    }

    fn file(mode: u32) -> Meta {
        meta(FsKind::File, mode, (0, 0), 1)
    }

    fn bytes(b: &[u8]) -> Content {
        Content::Bytes(b.to_vec())
    }

    /// What the host left: `wrote` under the declaration `declared`, with mode and owner.
    fn record(wrote: &[u8], mode: u32, owner: (u32, u32), declared: &str) -> Record {
        Record {
            origin: crate::store::Origin::Declared,
            kind: Kind::File,
            target: PATH.into(),
            position: 0,
            declared: digest(declared.as_bytes()),
            applied_at: 0,
            wrote: Some(digest(wrote)),
            mode: Some(crate::store::mode_bits(mode)),
            owner: Some(crate::store::owned(owner)),
            sig: Some(SIG),
            more: None,
        }
    }

    fn want<'a>(content: &'a [u8], mode: u32, owner: Option<(u32, u32)>) -> Declared<'a> {
        Declared {
            path: Path::new(PATH),
            content,
            declared: digest(b"v2"),
            mode,
            owner,
            create_once: false,
            keyed: None,
        }
    }

    fn known<'a>(record: Option<&'a Record>, intended: &'a [Intent]) -> Known<'a> {
        Known {
            record,
            intended,
            recorded_elsewhere: &|| false,
            kept: Path::new("/var/lib/mesh-host/kept"),
            keep_max: crate::apply::KEEP_MAX_BYTES,
        }
    }

    fn intent(content: &[u8], mode: u32, owner: Option<(u32, u32)>) -> Intent {
        Intent { path: PATH.into(), sum: digest(content).to_string(), mode, owner }
    }

    fn plan(found: Option<(&Meta, &Content)>, known: &Known<'_>, want: &Declared<'_>) -> Plan {
        decide(found, known, want).unwrap()
    }

    fn said(p: &Plan) -> (Verb, Option<&str>) {
        (p.action, p.detail.as_deref())
    }

    #[test]
    fn a_file_not_there_is_created_or_put_back() {
        let w = want(b"new", 0o644, None);
        let p = plan(None, &known(None, &[]), &w);
        assert_eq!(said(&p), (Verb::Created, None));
        assert!(matches!(p.change, Change::Write { keep: None }));
        let rec = record(b"new", 0o644, (0, 0), "v2");
        let p = plan(None, &known(Some(&rec), &[]), &w);
        assert_eq!(said(&p), (Verb::Corrected, Some("it had been deleted on the machine")));
        assert!(matches!(p.change, Change::Write { keep: None }));
    }

    #[test]
    fn a_symlink_a_directory_or_a_fifo_where_a_file_is_declared_is_refused() {
        for kind in [FsKind::Symlink, FsKind::Directory, FsKind::Other] {
            let found = meta(kind, 0o644, (0, 0), 1);
            match decide(Some((&found, &Content::NotFile)), &known(None, &[]), &want(b"x", 0o644, None)) {
                Err(Error::WrongKind { declared: Kind::File, found, .. }) => assert_eq!(found, kind),
                Err(other) => panic!("{kind:?}: {other}"),
                Ok(p) => panic!("{kind:?}: {:?}", said(&p)),
            }
        }
    }

    #[test]
    fn a_seed_that_is_present_is_kept_whatever_it_holds() {
        let w = Declared { create_once: true, ..want(b"seed", 0o600, Some((1, 1))) };
        let grown = bytes(b"what the program grew");
        // No record: what is there is recorded as what the host found.
        let p = plan(Some((&file(0o644), &grown)), &known(None, &[]), &w);
        assert_eq!(p.action, Verb::Kept);
        let Change::None(facts) = &p.change else { panic!("a seed is not changed") };
        assert_eq!(facts.wrote, Some(digest(b"what the program grew")));
        assert_eq!(facts.sig, None, "a seed is never compared, so has no signature");
        // A record: what the host once wrote stays recorded, so a new seed is not drift.
        let rec = record(b"seed", 0o600, (1, 1), "v1");
        let p = plan(Some((&file(0o644), &grown)), &known(Some(&rec), &[]), &w);
        let Change::None(facts) = &p.change else { panic!("a seed is not changed") };
        assert_eq!(facts.wrote, Some(digest(b"seed")));
        // And it is never read untouched by signature, either.
        assert!(untouched(&rec, &w, &file(0o600)).is_none());
    }

    #[test]
    fn a_file_as_declared_is_unchanged_and_hashed_only_when_the_declaration_moved() {
        let w = want(b"same", 0o644, Some((0, 0)));
        // Recorded at this declaration: what the host wrote is what is declared, not rehashed.
        let rec = Record {
            declared: digest(b"v2"),
            wrote: Some(digest(b"as recorded")),
            ..record(b"", 0o644, (0, 0), "")
        };
        let p = plan(Some((&file(0o644), &bytes(b"same"))), &known(Some(&rec), &[]), &w);
        assert_eq!(said(&p), (Verb::Unchanged, None));
        let Change::None(facts) = &p.change else { panic!("nothing to change") };
        assert_eq!(facts.wrote, Some(digest(b"as recorded")));
        // Recorded at another declaration, or not at all: what is there is digested.
        for rec in [Some(record(b"old", 0o644, (0, 0), "v1")), None] {
            let p = plan(Some((&file(0o644), &bytes(b"same"))), &known(rec.as_ref(), &[]), &w);
            let Change::None(facts) = &p.change else { panic!("nothing to change") };
            assert_eq!(facts.wrote, Some(digest(b"same")));
            assert_eq!((facts.mode, facts.owner), (Some(0o644), Some((0, 0))));
        }
    }

    #[test]
    fn new_content_is_an_update_and_content_changed_by_hand_a_correction() {
        let w = want(b"new", 0o644, None);
        let found = bytes(b"old");
        // The host wrote what is there: the declaration changed its mind.
        let rec = record(b"old", 0o644, (0, 0), "v1");
        let p = plan(Some((&file(0o644), &found)), &known(Some(&rec), &[]), &w);
        assert_eq!(said(&p), (Verb::Updated, Some("content")));
        assert!(matches!(p.change, Change::Write { keep: None }));
        // The host wrote something else: a hand changed it.
        let rec = record(b"what the host wrote", 0o644, (0, 0), "v1");
        let p = plan(Some((&file(0o644), &found)), &known(Some(&rec), &[]), &w);
        assert_eq!(
            said(&p),
            (Verb::Corrected, Some("changed on the machine since the host last wrote it: content"))
        );
        // Unless the journal says the host itself was writing that when it was stopped.
        let ours = [intent(b"old", 0o644, None)];
        let p = plan(Some((&file(0o644), &found)), &known(Some(&rec), &ours), &w);
        assert_eq!(said(&p), (Verb::Updated, Some("content")));
    }

    #[test]
    fn the_original_of_a_file_larger_than_the_limit_is_noted_not_kept() {
        let w = want(b"new", 0o644, None);
        let size = crate::apply::KEEP_MAX_BYTES + 1;
        let big = Meta { sig: crate::system::Sig { size, ..SIG }, ..file(0o640) };
        let found = Content::Unhashed { size };
        let p = plan(Some((&big, &found)), &known(None, &[]), &w);
        let Change::Write { keep: Some(Keep::Note { note, .. }) } = &p.change else { panic!("only noted") };
        assert_eq!(note, Path::new("/var/lib/mesh-host/kept/etc/app.conf.not-kept.json"));
        let said = p.applied().unwrap();
        assert!(said.contains("8388609 bytes") && said.contains("were not kept"), "{said}");
        assert!(p.planned().unwrap().contains("would not be kept"));
        // At the limit, the copy is whole.
        let at_limit = Meta { sig: crate::system::Sig { size: size - 1, ..SIG }, ..file(0o640) };
        let p = plan(Some((&at_limit, &found)), &known(None, &[]), &w);
        assert!(matches!(p.change, Change::Write { keep: Some(Keep::Copy(_)) }));
        // Too large to hash, and recorded at this very signature: still what the host wrote, so
        // a change of the declaration is an update, not a correction.
        let rec = Record { sig: Some(big.sig), ..record(b"old", 0o640, (0, 0), "{}") };
        let p = plan(Some((&big, &found)), &known(Some(&rec), &[]), &w);
        assert_eq!(p.action, Verb::Updated);
        // At another signature it was changed by hand.
        let rec = Record { sig: None, ..rec };
        assert_eq!(plan(Some((&big, &found)), &known(Some(&rec), &[]), &w).action, Verb::Corrected);
    }

    #[test]
    fn the_original_of_a_file_the_host_has_no_record_of_is_kept_once() {
        let w = want(b"new", 0o644, None);
        let found = bytes(b"the machine's own");
        let p = plan(Some((&file(0o644), &found)), &known(None, &[]), &w);
        let Change::Write { keep: Some(Keep::Copy(at)) } = &p.change else { panic!("the original is kept") };
        assert_eq!(at, Path::new("/var/lib/mesh-host/kept/etc/app.conf"));
        assert_eq!(
            p.planned().as_deref(),
            Some("content; the file found here would be kept at /var/lib/mesh-host/kept/etc/app.conf")
        );
        assert_eq!(
            p.applied().as_deref(),
            Some("content; the file found here, which the host had no record of, was kept at /var/lib/mesh-host/kept/etc/app.conf")
        );
        // A record of this path under another id: the host wrote it, so there is nothing to keep.
        let elsewhere = Known { recorded_elsewhere: &|| true, ..known(None, &[]) };
        assert!(matches!(
            plan(Some((&file(0o644), &found)), &elsewhere, &w).change,
            Change::Write { keep: None }
        ));
        // Nor when the journal says it is the host's own unfinished write.
        let ours = [intent(b"the machine's own", 0o600, None)];
        assert!(matches!(
            plan(Some((&file(0o644), &found)), &known(None, &ours), &w).change,
            Change::Write { keep: None }
        ));
        // Nor when only the mode differs: nothing is written over.
        assert!(matches!(
            plan(Some((&file(0o600), &bytes(b"new"))), &known(None, &[]), &w).change,
            Change::Set { mode: Some(0o644), owner: None }
        ));
    }

    #[test]
    fn a_mode_or_owner_set_by_hand_is_a_correction_and_a_new_one_an_update() {
        let w = want(b"same", 0o644, Some((10, 10)));
        let found = bytes(b"same");
        // The host left 0644 and 10:10; the machine has 0600 and 0:0.
        let rec = record(b"same", 0o644, (10, 10), "v2");
        let p = plan(Some((&file(0o600), &found)), &known(Some(&rec), &[]), &w);
        assert_eq!(
            said(&p),
            (
                Verb::Corrected,
                Some("changed on the machine since the host last wrote it: mode (it was 0600), owner (it was 0:0)")
            )
        );
        assert!(matches!(p.change, Change::Set { mode: Some(0o644), owner: Some((10, 10)) }));
        // The host left 0600 and 0:0 itself: the declaration moved.
        let rec = record(b"same", 0o600, (0, 0), "v1");
        let p = plan(Some((&file(0o600), &found)), &known(Some(&rec), &[]), &w);
        assert_eq!(said(&p), (Verb::Updated, Some("mode 0600 to 0644, owner 0:0 to 10:10")));
        // What the journal says the host was setting is not a hand's either.
        let rec = record(b"same", 0o644, (10, 10), "v2");
        let ours = [intent(b"same", 0o600, Some((0, 0)))];
        let p = plan(Some((&file(0o600), &found)), &known(Some(&rec), &ours), &w);
        assert_eq!(p.action, Verb::Updated);
        // An owner not declared is not compared.
        let p = plan(Some((&file(0o600), &found)), &known(None, &[]), &want(b"same", 0o644, None));
        assert!(matches!(p.change, Change::Set { mode: Some(0o644), owner: None }));
    }

    #[test]
    fn a_file_with_other_names_gets_a_file_of_its_own_instead_of_a_chmod() {
        let linked = meta(FsKind::File, 0o600, (0, 0), 3);
        let p = plan(Some((&linked, &bytes(b"same"))), &known(None, &[]), &want(b"same", 0o644, None));
        assert!(matches!(p.change, Change::Replace { links: 3 }));
        assert_eq!(p.planned().as_deref(), Some("mode 0600 to 0644"));
        assert_eq!(
            p.applied().as_deref(),
            Some("mode 0600 to 0644; it had 3 names (hard links), so it was replaced by a file of its own instead of being changed in place, and the other names were left as they were")
        );
    }

    #[test]
    fn a_plan_shows_a_diff_only_where_the_content_changes() {
        let d: Declaration = Declaration::parse(
            br#"{"version": 1, "resources": [{"type": "file", "id": "a.f", "path": "/etc/app.conf", "content": "b\n"}]}"#,
        )
        .unwrap();
        let f = file_of(&d, "a.f");
        let write = Plan {
            action: Verb::Created,
            detail: None,
            change: Change::Write { keep: None },
            hand_content: false,
        };
        let shown = planned_diff(&write, None, f, b"b\n").unwrap();
        assert!(shown.contains("+b"), "{shown}");
        let shown = planned_diff(&write, Some(&(file(0o644), bytes(b"a\n"))), f, b"b\n").unwrap();
        assert!(shown.contains("-a") && shown.contains("+b"), "{shown}");
        let large = Content::Large { sum: [0; 32], size: 5 << 20 };
        assert_eq!(
            planned_diff(&write, Some(&(file(0o644), large)), f, b"b\n").unwrap(),
            "content differs: 5242880 bytes on the machine (too large to show), 2 declared\n"
        );
        assert_eq!(
            planned_diff(&write, Some(&(file(0o644), bytes(b"\x7fELF\x00\x01"))), f, b"b\n").unwrap(),
            "/etc/app.conf: binary content differs (6 bytes to 2 bytes)\n"
        );
        assert_eq!(
            planned_diff(&write, Some(&(file(0o644), bytes(b"a\n"))), f, &[0xff, 0xfe, 0]).unwrap(),
            "/etc/app.conf: binary content differs (2 bytes to 3 bytes)\n"
        );
        let set = Plan { change: Change::Set { mode: Some(0o644), owner: None }, ..write };
        assert_eq!(planned_diff(&set, Some(&(file(0o644), bytes(b"b\n"))), f, b"b\n"), None);
    }

    #[test]
    fn a_plan_never_shows_a_secret_nor_a_file_others_cannot_read() {
        let d: Declaration = Declaration::parse(
            br#"{"version": 1, "resources": [
                {"type": "file", "id": "a.f", "path": "/etc/app.conf", "content": "b\n"},
                {"type": "file", "id": "a.s", "path": "/etc/app.key", "sealed": "YWdlLWVuY3J5cHRpb24ub3JnL3YxCg=="}]}"#,
        )
        .unwrap();
        let write = Plan {
            action: Verb::Updated,
            detail: None,
            change: Change::Write { keep: None },
            hand_content: false,
        };
        // A credential already on disk, readable by its owner only: a dry run does not show it.
        for mode in [0o600, 0o640, 0o000] {
            let shown = planned_diff(
                &write,
                Some(&(file(mode), bytes(b"password=hunter2\n"))),
                file_of(&d, "a.f"),
                b"b\n",
            )
            .unwrap();
            assert!(!shown.contains("hunter2") && shown.contains("not world-readable"), "{shown}");
        }
        // A file carrying a secret: neither what is there nor what would be written.
        for found in [None, Some((file(0o644), bytes(b"old value\n")))] {
            let shown = planned_diff(&write, found.as_ref(), file_of(&d, "a.s"), b"new value\n").unwrap();
            assert!(!shown.contains("value"), "{shown}");
            assert_eq!(shown, "/etc/app.key: content differs (not shown: it carries a secret)\n");
        }
    }

    /// The drift history's diff of a hand-edit: made only of what `plan` may show, bounded, and
    /// only for a correction of the content (not an update, not a chmod).
    #[test]
    fn a_hand_edit_is_kept_as_a_bounded_diff_only_where_plan_may_show_one() {
        let d: Declaration = Declaration::parse(
            br#"{"version": 1, "resources": [
                {"type": "file", "id": "a.f", "path": "/etc/app.conf", "content": "port=80\n"},
                {"type": "file", "id": "a.s", "path": "/etc/app.key", "sealed": "YWdlLWVuY3J5cHRpb24ub3JnL3YxCg=="}]}"#,
        )
        .unwrap();
        let (f, sealed) = (file_of(&d, "a.f"), file_of(&d, "a.s"));
        let said = |f: &File, w: &Declared<'_>, found: (Meta, Content)| {
            hand_edit(f, w, Some(&found)).said(Path::new(PATH))
        };
        let w = want(b"port=80\n", 0o644, None);
        let HandEdit::Diff(shown) = said(f, &w, (file(0o644), bytes(b"port=8080\n"))) else { panic!() };
        assert!(shown.contains("-port=80\n+port=8080\n"), "{shown}");
        assert!(shown.starts_with("--- /etc/app.conf (declared)\n+++ /etc/app.conf (as found)\n"), "{shown}");
        let omitted = |f: &File, w: &Declared<'_>, found| match said(f, w, found) {
            HandEdit::Omitted(why) => why,
            HandEdit::Diff(d) => panic!("a diff: {d}"),
        };
        let secret = || bytes(b"password=hunter2\n");
        assert_eq!(omitted(sealed, &w, (file(0o644), secret())), "it carries a secret");
        assert_eq!(
            omitted(f, &w, (file(0o600), secret())),
            "the file on the machine is not world-readable, mode 0600"
        );
        assert_eq!(
            omitted(f, &want(b"port=80\n", 0o640, None), (file(0o644), secret())),
            "the file is declared not world-readable, mode 0640"
        );
        let big = vec![b'a'; HandEdit::LARGEST + 1];
        assert!(omitted(f, &w, (file(0o644), bytes(&big))).contains("larger than 64 KiB"));
        let large = Content::Large { sum: [0; 32], size: 5 << 20 };
        assert!(omitted(f, &w, (file(0o644), large)).contains("larger than 64 KiB"));
        assert_eq!(omitted(f, &w, (file(0o644), bytes(b"\x7fELF\x00"))), "a side is not UTF-8 text");
        // A long hand-edit: cut on a line's end, and said to be cut.
        let long: String = (0..2000).map(|i| format!("line {i}\n")).collect();
        let HandEdit::Diff(shown) = said(f, &w, (file(0o644), bytes(long.as_bytes()))) else { panic!() };
        assert!(shown.len() <= HandEdit::MAX + 64, "{}", shown.len());
        assert!(shown.ends_with("... the diff goes on; cut at 4096 bytes\n"), "{shown}");
        // Only a correction of the content keeps one.
        let rec = record(b"port=80\n", 0o644, (0, 0), "v2");
        let p = plan(Some((&file(0o644), &bytes(b"port=1\n"))), &known(Some(&rec), &[]), &w);
        assert!(p.action == Verb::Corrected && p.hand_content);
        let p = plan(Some((&file(0o600), &bytes(b"port=80\n"))), &known(Some(&rec), &[]), &w);
        assert!(p.action == Verb::Corrected && !p.hand_content, "a chmod");
        let p = plan(Some((&file(0o644), &bytes(b"port=1\n"))), &known(None, &[]), &w);
        assert!(p.action == Verb::Updated && !p.hand_content);
    }

    #[test]
    fn a_file_untouched_since_the_record_is_not_read_again() {
        let w = want(b"x", 0o644, Some((1, 1)));
        let rec = record(b"x", 0o644, (1, 1), "v2");
        let m = meta(FsKind::File, 0o644, (1, 1), 1);
        let facts = untouched(&rec, &w, &m).expect("untouched");
        assert_eq!((facts.wrote, facts.sig), (rec.wrote, Some(SIG)));
        // Anything that says otherwise sends it to be read.
        let touched = Meta { sig: crate::system::Sig { inode: 8, ..SIG }, ..m };
        assert!(untouched(&rec, &w, &touched).is_none(), "another signature");
        assert!(untouched(&rec, &w, &Meta { mode: 0o600, ..m }).is_none(), "another mode");
        assert!(untouched(&rec, &want(b"x", 0o600, Some((1, 1))), &m).is_none(), "a new mode declared");
        assert!(untouched(&rec, &want(b"x", 0o644, Some((2, 2))), &m).is_none(), "a new owner declared");
        let older = record(b"x", 0o644, (1, 1), "v1");
        assert!(untouched(&older, &w, &m).is_none(), "another declaration");
        let unsigned = Record { sig: None, ..rec.clone() };
        assert!(untouched(&unsigned, &w, &m).is_none(), "no signature recorded");
    }
}
