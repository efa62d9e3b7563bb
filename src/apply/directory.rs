//! `directory`: made if absent; mode and owner maintained, not only set at creation.

use super::{begin, Aspect, Ctx, Error, Facts, Step, Target, Verb};
use crate::declaration::{Directory, Kind, Resource};
use std::path::Path;

use crate::system::fs::{Expect, Kind as FsKind, Meta};

/// What the host last set on the directory, from its record.
#[derive(Clone, Copy, Debug, Default)]
struct Recorded {
    mode: Option<u32>,
    owner: Option<(u32, u32)>,
}

/// What the directory needs.
#[derive(Debug)]
enum Plan {
    /// As declared: nothing to do; the mode and owner found.
    Unchanged { mode: u32, owner: (u32, u32) },
    /// Made, or its mode or owner set, with the outcome word and what changed.
    Set(Verb, Option<String>),
}

/// Decides from what is at the path, what the host recorded and what is declared, without the
/// machine: made (`created`, or `corrected` when the host had made it and it is gone), set
/// (`updated` for a new wish, `corrected` when the mode or owner moved since the host set it),
/// or nothing. Something other than a directory there is refused, never replaced.
fn decide(
    path: &Path,
    found: Option<&Meta>,
    recorded: Option<Recorded>,
    mode: u32,
    owner: Option<(u32, u32)>,
) -> Result<Plan, Error> {
    let Some(m) = found else {
        return Ok(match recorded {
            Some(_) => Plan::Set(Verb::Corrected, Some("it had been removed on the machine".to_owned())),
            None => Plan::Set(Verb::Created, None),
        });
    };
    if m.kind != FsKind::Directory {
        return Err(Error::WrongKind { path: path.to_owned(), declared: Kind::Directory, found: m.kind });
    }
    let mode_same = m.mode == mode;
    let owner_same = owner.is_none_or(|o| o == (m.uid, m.gid));
    if mode_same && owner_same {
        return Ok(Plan::Unchanged { mode: m.mode, owner: (m.uid, m.gid) });
    }
    let mut changes = Vec::new();
    let mut drifted = false;
    if !mode_same {
        changes.push(format!("mode {:04o} to {:04o}", m.mode, mode));
        drifted |= recorded.is_some_and(|rec| rec.mode != Some(m.mode));
    }
    if let (false, Some((uid, gid))) = (owner_same, owner) {
        changes.push(format!("owner {}:{} to {uid}:{gid}", m.uid, m.gid));
        drifted |= recorded.is_some_and(|rec| rec.owner != Some((m.uid, m.gid)));
    }
    Ok(if drifted {
        Plan::Set(
            Verb::Corrected,
            Some(format!("changed on the machine since the host last set it: {}", changes.join(", "))),
        )
    } else {
        Plan::Set(Verb::Updated, Some(changes.join(", ")))
    })
}

pub(super) fn apply(ctx: &mut Ctx<'_>, r: &Resource, d: &Directory) -> Result<Step, Error> {
    let path = d.path.as_path();
    // A permission set at creation is not a permission maintained: the mode and owner are
    // compared on every pass, so a chmod by hand is put back like a file's content.
    let mode = d.mode.map_or(0o755, |m| m.bits());
    let owner = d.owner.as_ref().map(|o| ctx.owner_ids.resolve(o.user(), o.group())).transpose()?;
    let record =
        ctx.store.get(r.id.as_str()).filter(|rec| rec.kind == Kind::Directory && *rec.target == *r.target());

    let recorded =
        record.map(|rec| Recorded { mode: rec.mode.map(u32::from), owner: rec.owner.map(Into::into) });
    let found = ctx.fs.meta(path)?;
    let (action, detail) = match decide(path, found.as_ref(), recorded, mode, owner)? {
        Plan::Unchanged { mode, owner } => {
            let facts = Facts { mode: Some(mode), owner: Some(owner), ..Facts::default() };
            return Ok(Step::Done(begin(r, Verb::Unchanged, None), Some(facts)));
        }
        Plan::Set(action, detail) => (action, detail),
    };
    if ctx.opts.dry_run {
        return Ok(Step::Done(begin(r, action, detail), None));
    }

    // On the directory that was looked at, or, when there was none, one the host makes now:
    // never on whatever was put at the name in between (`Fs::change_in_place`).
    let made = ctx.fs.make_dirs(path, mode)?;
    let checked = match &found {
        Some(meta) if !made => Expect::Checked(meta),
        _ => Expect::Directory,
    };
    ctx.fs.change_in_place(path, checked, owner, Some(mode))?;

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

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(mode: u32, uid: u32) -> Meta {
        Meta {
            kind: FsKind::Directory,
            mode,
            uid,
            gid: uid,
            dev: 1,
            links: 2,
            sig: crate::system::Sig {
                inode: 1,
                ctime: 0,
                ctime_nsec: crate::system::Nanos::new(0),
                size: 4096,
            },
        }
    }

    fn plan(
        found: Option<&Meta>,
        recorded: Option<Recorded>,
        mode: u32,
        owner: Option<(u32, u32)>,
    ) -> String {
        match decide(Path::new("/srv/data"), found, recorded, mode, owner) {
            Ok(Plan::Unchanged { .. }) => "unchanged".into(),
            Ok(Plan::Set(verb, detail)) => format!("{verb} {}", detail.unwrap_or_default()).trim().to_owned(),
            Err(e) => format!("refused: {e}"),
        }
    }

    #[test]
    fn a_directory_is_made_corrected_updated_or_left_as_it_is() {
        let set = Recorded { mode: Some(0o750), owner: Some((0, 0)) };
        assert_eq!(plan(None, None, 0o750, None), "created");
        assert_eq!(plan(None, Some(set), 0o750, None), "corrected it had been removed on the machine");
        assert_eq!(plan(Some(&dir(0o750, 0)), Some(set), 0o750, Some((0, 0))), "unchanged");
        // The host set 0750 and finds 0777: someone's hand.
        assert_eq!(
            plan(Some(&dir(0o777, 0)), Some(set), 0o750, None),
            "corrected changed on the machine since the host last set it: mode 0777 to 0750"
        );
        // The declaration now asks 0700 of a directory still as the host left it: a new wish.
        assert_eq!(plan(Some(&dir(0o750, 0)), Some(set), 0o700, None), "updated mode 0750 to 0700");
        // Found on the machine, never set by the host: updated, not drift.
        assert_eq!(
            plan(Some(&dir(0o755, 1000)), None, 0o750, Some((0, 0))),
            "updated mode 0755 to 0750, owner 1000:1000 to 0:0"
        );
        // An owner changed by hand is drift too.
        assert_eq!(
            plan(Some(&dir(0o750, 1000)), Some(set), 0o750, Some((0, 0))),
            "corrected changed on the machine since the host last set it: owner 1000:1000 to 0:0"
        );
    }

    #[test]
    fn something_else_at_the_path_is_refused_not_replaced() {
        let mut file = dir(0o644, 0);
        file.kind = FsKind::File;
        assert!(
            plan(Some(&file), None, 0o755, None).starts_with("refused:"),
            "{}",
            plan(Some(&file), None, 0o755, None)
        );
    }
}
