//! `directory`: made if absent; mode and owner maintained, not only set at creation.

use super::{begin, Aspect, Ctx, Error, Facts, Step, Target, Verb};
use crate::declaration::{Directory, Kind, Resource};
use crate::system::fs::Kind as FsKind;

pub(super) fn apply(ctx: &mut Ctx<'_>, r: &Resource, d: &Directory) -> Result<Step, Error> {
    let path = d.path.as_path();
    // A permission set at creation is not a permission maintained: the mode and owner are
    // compared on every pass, so a chmod by hand is put back like a file's content.
    let mode = d.mode.map_or(0o755, |m| m.bits());
    let owner = d.owner.as_ref().map(|o| ctx.owner_ids.resolve(&o.user, o.group.as_deref())).transpose()?;
    let record =
        ctx.store.get(r.id.as_str()).filter(|rec| rec.kind == Kind::Directory && *rec.target == *r.target());

    let (action, detail) = match ctx.fs.meta(path)? {
        None => match record {
            Some(_) => (Verb::Corrected, Some("it had been removed on the machine".to_owned())),
            None => (Verb::Created, None),
        },
        Some(m) if m.kind != FsKind::Directory => {
            return Err(Error::WrongKind { path: path.to_owned(), declared: Kind::Directory, found: m.kind })
        }
        Some(m) => {
            let mode_same = m.mode == mode;
            let owner_same = owner.is_none_or(|o| o == (m.uid, m.gid));
            if mode_same && owner_same {
                let facts = Facts { mode: Some(m.mode), owner: Some((m.uid, m.gid)), ..Facts::default() };
                return Ok(Step::Done(begin(r, Verb::Unchanged, None), Some(facts)));
            }
            let mut changes = Vec::new();
            let mut drifted = false;
            if !mode_same {
                changes.push(format!("mode {:04o} to {:04o}", m.mode, mode));
                drifted |= record.is_some_and(|rec| rec.mode != Some(m.mode));
            }
            if let (false, Some((uid, gid))) = (owner_same, owner) {
                changes.push(format!("owner {}:{} to {uid}:{gid}", m.uid, m.gid));
                drifted |= record.is_some_and(|rec| rec.owner != Some((m.uid, m.gid)));
            }
            if drifted {
                let detail =
                    format!("changed on the machine since the host last set it: {}", changes.join(", "));
                (Verb::Corrected, Some(detail))
            } else {
                (Verb::Updated, Some(changes.join(", ")))
            }
        }
    };
    if ctx.opts.dry_run {
        return Ok(Step::Done(begin(r, action, detail), None));
    }

    ctx.fs.make_dirs(path, mode)?;
    if let Some((uid, gid)) = owner {
        ctx.fs.set_owner(path, uid, gid)?;
    }
    ctx.fs.set_mode(path, mode)?;

    // Read back.
    let readback = |what, wanted: String, found: String| Error::ReadBack {
        target: Target::Path(path.to_owned()),
        what,
        wanted,
        found,
    };
    let m = ctx.fs.meta(path)?.ok_or_else(|| readback(Aspect::Directory, "made".into(), "missing".into()))?;
    if m.kind != FsKind::Directory {
        return Err(readback(Aspect::Directory, "a directory".into(), format!("{:?}", m.kind)));
    }
    if m.mode != mode {
        return Err(readback(Aspect::Mode, format!("{mode:04o}"), format!("{:04o}", m.mode)));
    }
    if let Some((uid, gid)) = owner {
        if (m.uid, m.gid) != (uid, gid) {
            return Err(readback(Aspect::Owner, format!("{uid}:{gid}"), format!("{}:{}", m.uid, m.gid)));
        }
    }
    let facts = Facts { mode: Some(m.mode), owner: Some((m.uid, m.gid)), ..Facts::default() };
    Ok(Step::Done(begin(r, action, detail), Some(facts)))
}
