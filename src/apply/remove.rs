//! Removing what the host applied and the declaration no longer names.
//!
//! Only ever called for a record in the store, which is what bounds it: the host removes what
//! it made and leaves what it merely configured or found. It returns the honest word: for much
//! of the vocabulary that is `kept` or `forgotten`, not `removed`.

use super::{process, Action, Error, Machine, Options, Target};
use crate::declaration::{Digest, Kind};
use crate::store::Record;
use crate::system::docker::ID_LABEL;
use crate::system::fs::{Fs, Kind as FsKind};
use crate::system::SystemdError;

pub(super) fn remove(
    fs: &mut Fs,
    machine: &mut Machine,
    rec: &Record,
    opts: &Options,
) -> Result<(Action, Option<String>), Error> {
    let dry_run = opts.dry_run;
    let path = std::path::Path::new(&*rec.target);
    let said = |action, detail: &str| Ok((action, Some(detail.to_owned())));
    match rec.kind {
        Kind::File => match fs.digest(path)? {
            None => said(Action::Forgotten, "no longer declared, and no longer there"),
            Some((meta, _)) if meta.kind != FsKind::File => said(
                Action::Kept,
                "no longer declared, and what is there now is not the file the host wrote: left alone",
            ),
            // A file whose content is no longer what the host wrote holds someone's work (a
            // create-once seed a program grew, a hand edit): nothing is lost by leaving it.
            Some((_, sum)) if rec.wrote.is_some_and(|w| sum.map(Digest::from_sum) != Some(w)) => said(
                Action::Kept,
                "no longer declared, and changed on the machine since the host wrote it: left in place so nothing is lost",
            ),
            Some(_) => {
                if !dry_run {
                    fs.remove_file(path)?;
                    if fs.meta(path)?.is_some() {
                        return Err(Error::StillThere { target: Target::Path(path.to_owned()) });
                    }
                }
                said(Action::Removed, "no longer declared")
            }
        },
        Kind::Directory => {
            // A directory with anything left in it is kept: everything the host put inside is
            // itself declared, and orphans go in reverse order, so what the host wrote there is
            // already gone. What remains is data nobody declared.
            match fs.meta(path)? {
                None => return said(Action::Forgotten, "no longer declared, and no longer there"),
                Some(m) if m.kind != FsKind::Directory => {
                    return said(Action::Kept, "no longer declared, and no longer a directory: left alone")
                }
                Some(_) => {}
            }
            let inside = fs.list(path)?.len();
            if inside > 0 {
                return Ok((
                    Action::Kept,
                    Some(format!(
                        "no longer declared, and {inside} item{} inside that the mesh did not put there; remove it by hand once you know what {}",
                        if inside == 1 { "" } else { "s" },
                        if inside == 1 { "it is" } else { "they are" }
                    )),
                ));
            }
            if !dry_run {
                fs.remove_dir(path)?;
            }
            said(Action::Removed, "no longer declared, and empty")
        }
        Kind::Access => said(Action::Forgotten, "an operator-owned path is never the host's to remove"),
        Kind::Archive => said(
            Action::Forgotten,
            "the files it unpacked are left in place: they may have been changed or added to since",
        ),
        Kind::Package => said(
            Action::Forgotten,
            "left installed; the host does not uninstall what it cannot know is unused",
        ),
        Kind::User => said(
            Action::Forgotten,
            "the account is left: it may own files, and a uid freed and handed out again would give them to someone else",
        ),
        Kind::Action => said(Action::Forgotten, "an action leaves nothing the host owns"),
        // A unit that is no longer declared is stopped, and its file left: the host set the
        // unit's state, it did not install it. A unit that no longer exists at all is already
        // where removal is going; failing on it would leave a record no apply could ever clear.
        Kind::Service => stop(machine, opts, &rec.target, "the unit file is left: it is not the host's to delete"),
        // The host started this unit; once stopped, systemd collects it and nothing is left.
        Kind::Process => stop(
            machine,
            opts,
            &process::unit_name(&rec.target),
            "the transient unit is gone with it",
        ),
        Kind::Container => {
            let docker = machine.docker(opts.container_socket.as_deref())?;
            let name = &*rec.target;
            match docker.container(name)? {
                // A step leaves nothing running, and a container removed by hand is already
                // where removal was going.
                None => said(Action::Forgotten, "no longer declared, and no container of that name is there"),
                Some(found) if found.label(ID_LABEL).is_none() => said(
                    Action::Kept,
                    "no longer declared, and the container of that name now was not created by mesh-host: left alone",
                ),
                Some(_) => {
                    if !dry_run {
                        docker.remove(name)?;
                        if docker.container(name)?.is_some() {
                            return Err(Error::StillThere { target: Target::Container(name.to_owned()) });
                        }
                    }
                    said(Action::Removed, "no longer declared")
                }
            }
        }
        Kind::Network => {
            let docker = machine.docker(opts.container_socket.as_deref())?;
            let name = &*rec.target;
            match docker.network(name)? {
                None => said(Action::Forgotten, "no longer declared, and no longer there"),
                Some(found) if !found.labels.contains_key(ID_LABEL) => {
                    said(Action::Forgotten, "made outside mesh-host, so left in place")
                }
                // Orphans go in reverse declared order, so the containers declared after the
                // network are gone by now. What still uses it is something this declaration
                // does not name (or a container that moves to another network later in this
                // pass): its connectivity is not the host's to cut, so the network is kept,
                // and the record with it, to be tried again at the next apply.
                Some(found) if !found.containers.is_empty() => Ok((
                    Action::Kept,
                    Some(format!(
                        "no longer declared, and still used by {}: left in place, and removed once nothing uses it",
                        found.containers.join(", ")
                    )),
                )),
                Some(_) => {
                    if !dry_run {
                        docker.remove_network(name)?;
                        if docker.network(name)?.is_some() {
                            return Err(Error::StillThere { target: Target::Network(name.to_owned()) });
                        }
                    }
                    said(Action::Removed, "no longer declared")
                }
            }
        }
        Kind::Opening => Err(Error::Unsupported(rec.kind)),
    }
}

/// Stops a unit that is no longer declared, and reads back that it is down.
fn stop(
    machine: &mut Machine,
    opts: &Options,
    unit: &str,
    left: &str,
) -> Result<(Action, Option<String>), Error> {
    let sd = machine.systemd(opts.bus.as_deref())?;
    let before = sd.state(unit)?;
    if !before.exists() {
        return Ok((Action::Forgotten, Some(format!("no longer declared, and {unit} no longer exists"))));
    }
    if before.stopped() {
        return Ok((
            Action::Forgotten,
            Some(format!("no longer declared, and {unit} was already {}", before.active)),
        ));
    }
    if !opts.dry_run {
        match sd.stop(unit) {
            // Gone between the look and the stop: where removal was going anyway.
            Err(SystemdError::NoUnit(_)) => {}
            other => other?,
        }
        let after = sd.state(unit)?;
        if after.exists() && !after.stopped() {
            return Err(Error::StillRunning { unit: unit.to_owned(), state: Box::new(after) });
        }
    }
    Ok((Action::Removed, Some(format!("no longer declared: {unit} stopped; {left}"))))
}
