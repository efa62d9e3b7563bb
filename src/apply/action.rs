//! `action`: verify; if it fails, the command; then verify again, which must now pass.
//!
//! Verify is both the question "is there anything to do" and the read-back: the host does not
//! know what a database or a migration is, so only the declaration can ask whether it is
//! there, and asking again afterwards is how the host knows the command did what it claimed.
//! Both are argv lists, run without a shell, on the machine or, with `in`, inside that running
//! container through the runtime's exec. A failed action is a gate; the engine stops there
//! (docs/systemd.md, "action").

use super::{begin, Ctx, Error, Facts, Step, Verb};
use crate::declaration::{Action, Resource};
use crate::system::command::{self, Ran};

pub(super) fn apply(ctx: &mut Ctx<'_>, r: &Resource, a: &Action) -> Result<Step, Error> {
    // `plan` runs no command: previewing a declaration someone sent must not execute it, and
    // `verify` is any argv, run as root. Without `--run-verify` it says what it would run and
    // decides nothing, before even the runtime is asked for (docs/decisions.md, "`plan` runs
    // no command").
    if ctx.opts.dry_run && !ctx.opts.run_verify {
        let detail = format!(
            "would run verify ({}) to decide; `plan --run-verify` runs it",
            shown(a.verify.as_slice())
        );
        return Ok(Step::Done(begin(r, Verb::Undecided, Some(detail)), None));
    }
    // The runtime is asked for only when the action runs inside a container, so an action on
    // the machine works where no runtime answers (docs/containers.md, "Actions inside a
    // container (`in`)").
    let docker = a.in_container.as_ref().map(|_| ctx.docker()).transpose()?;
    let limit = ctx.opts.step_timeout;
    let run = |argv: &[String]| -> Result<Ran, Error> {
        match (&a.in_container, &docker) {
            (Some(container), Some(docker)) => Ok(docker.exec(container.as_str(), argv, limit)?.into()),
            _ => Ok(command::run_within(argv, &[], limit)?),
        }
    };
    let first = run(a.verify.as_slice())?;
    if first.success() {
        return Ok(Step::Done(
            begin(r, Verb::Unchanged, Some("verify passes".into())),
            Some(Facts::default()),
        ));
    }
    // `plan --run-verify` runs `verify`, which must only look, and never the command
    // (docs/systemd.md, "action").
    if ctx.opts.dry_run {
        return Ok(Step::Done(
            begin(r, Verb::Created, Some(format!("verify {}, so the command would run", first.describe()))),
            None,
        ));
    }
    let ran = run(a.command.as_slice())?;
    if !ran.success() {
        return Err(Error::CommandFailed { verify: first.describe(), ran: ran.describe() });
    }
    let again = run(a.verify.as_slice())?;
    if !again.success() {
        return Err(Error::VerifyStillFails { verify: again.describe() });
    }
    Ok(Step::Done(
        begin(r, Verb::Created, Some("verify failed; the command ran and verify now passes".into())),
        Some(Facts::default()),
    ))
}

/// An argv as a person reads it: the program and its first arguments, cut at 80 characters.
fn shown(argv: &[String]) -> String {
    let all = argv.join(" ");
    match all.char_indices().nth(80) {
        Some((cut, _)) => format!("{}...", &all[..cut]),
        None => all,
    }
}
