//! `action`: verify; if it fails, the command; then verify again, which must now pass.
//!
//! Verify is both the question "is there anything to do" and the read-back: the host does not
//! know what a database or a migration is, so only the declaration can ask whether it is
//! there, and asking again afterwards is how the host knows the command did what it claimed.
//! Both are argv lists, run without a shell. A failed action is a gate; the engine stops there.

use super::{begin, Action, Ctx, Error, Facts, Step};
use crate::declaration::{Action as ActionSpec, Resource};
use crate::system::command;

pub(super) fn apply(ctx: &mut Ctx<'_>, r: &Resource, a: &ActionSpec) -> Result<Step, Error> {
    if let Some(container) = &a.in_container {
        return Err(Error::Refused(format!(
            "running an action inside a container (in: {container}) needs the container runtime, not wired yet"
        )));
    }
    let first = command::run(&a.verify.0, &[])?;
    if first.success() {
        return Ok(Step::Done(
            begin(r, Action::Unchanged, Some("verify passes".into())),
            Some(Facts::default()),
        ));
    }
    if ctx.opts.dry_run {
        return Ok(Step::Done(
            begin(r, Action::Created, Some(format!("verify {}, so the command would run", first.describe()))),
            None,
        ));
    }
    let ran = command::run(&a.command.0, &[])?;
    if !ran.success() {
        return Err(Error::Refused(format!(
            "verify {}, so the command ran, and it {}",
            first.describe(),
            ran.describe()
        )));
    }
    let again = command::run(&a.verify.0, &[])?;
    if !again.success() {
        return Err(Error::Refused(format!(
            "the command exited 0 and verify still fails ({}): the command claimed success and did not do its job",
            again.describe()
        )));
    }
    Ok(Step::Done(
        begin(r, Action::Created, Some("verify failed; the command ran and verify now passes".into())),
        Some(Facts::default()),
    ))
}
