//! `package`: installed if absent; never upgraded, never removed. "Present" is all a package
//! resource says: which version is the package manager's business, not a second opinion the
//! host keeps (docs/systemd.md, "package").

use super::{begin, Ctx, Error, Facts, Step, Verb};
use crate::declaration::{Kind, Package, Resource};

pub(super) fn apply(ctx: &mut Ctx<'_>, r: &Resource, p: &Package) -> Result<Step, Error> {
    let name = p.package.as_str();
    let packages = &mut ctx.machine.packages;
    if packages.installed(name)? {
        return Ok(Step::Done(begin(r, Verb::Unchanged, Some("installed".into())), Some(Facts::default())));
    }
    let recorded =
        ctx.store.get(r.id.as_str()).is_some_and(|rec| rec.kind == Kind::Package && *rec.target == *name);
    let manager = packages.manager(name)?.name();
    let (action, detail) = if recorded {
        (Verb::Corrected, format!("it had been removed on the machine; installed again with {manager}"))
    } else {
        (Verb::Created, format!("installed with {manager}"))
    };
    if ctx.opts.dry_run {
        return Ok(Step::Done(begin(r, action, Some(detail)), None));
    }
    packages.install(name)?;
    // Read back from the package database: a package manager exiting 0 says its transaction
    // ran, not that this package is what it installed.
    if !packages.installed(name)? {
        return Err(Error::NotInstalled { manager, package: name.to_owned() });
    }
    Ok(Step::Done(begin(r, action, Some(detail)), Some(Facts::default())))
}
