//! `access`: an operator-owned directory that must already exist. Never created, chmod-ed or
//! removed.
//!
//! The mirror image of `directory`. A missing path is refused rather than made: a container
//! runtime given a bind-mount source that does not exist creates it as root with whatever mode
//! it picks, which is exactly the silent wrong ownership this resource exists to prevent. So the
//! host says plainly that the operator must provide it.

use super::{begin, Ctx, Error, Facts, Need, Step, Verb};
use crate::declaration::{Access, AccessMode, Kind, Resource};
use crate::system::fs::Kind as FsKind;

pub(super) fn apply(ctx: &mut Ctx<'_>, r: &Resource, a: &Access) -> Result<Step, Error> {
    let path = a.path.as_path();
    match ctx.fs.meta(path)? {
        None => Err(Error::Missing { path: path.to_owned(), need: Need::Access }),
        Some(m) if m.kind != FsKind::Directory => {
            Err(Error::WrongKind { path: path.to_owned(), declared: Kind::Access, found: m.kind })
        }
        Some(_) => {
            let how = match a.mode {
                AccessMode::Read => "read",
                AccessMode::Write => "write",
            };
            let detail = format!("operator-owned; present, {how}, nothing managed");
            Ok(Step::Done(begin(r, Verb::Unchanged, Some(detail)), Some(Facts::default())))
        }
    }
}
