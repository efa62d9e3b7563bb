//! Removing what the host applied and the declaration no longer names.
//!
//! Only ever called for a record in the store, which is what bounds it: the host removes what
//! it made and leaves what it merely configured or found. It returns the honest word: for much
//! of the vocabulary that is `kept` or `forgotten`, not `removed`.
//!
//! `look` reads what the record names, as far as its kind needs; `decide` says, from plain
//! values, whether to leave it or remove it; `act` removes and reads back.

use std::path::{Path, PathBuf};

use super::{process, Error, Managers, Options, Target, Verb};
use crate::declaration::{Digest, Kind};
use crate::store::Record;
use crate::system::docker::ID_LABEL;
use crate::system::fs::{Fs, Kind as FsKind};
use crate::system::systemd;

pub(super) fn remove(
    fs: &mut Fs,
    machine: &mut Managers,
    rec: &Record,
    opts: &Options,
) -> Result<(Verb, Option<String>), Error> {
    // Keys set in someone else's file: each goes back to what it held before the host, and the
    // file goes only if the host made it and nothing else is left (docs/decisions.md, "`into`").
    if let (Kind::File, Some(merged)) = (rec.kind, rec.merged()) {
        return super::into::remove(fs, machine, &opts.key, Path::new(&*rec.target), merged, opts.dry_run);
    }
    match look(fs, machine, rec, opts)? {
        Plan::Leave(action, detail) => Ok((action, Some(detail))),
        Plan::Remove(removal, detail) => {
            if !opts.dry_run {
                act(fs, machine, opts, &removal)?;
            }
            Ok((Verb::Removed, Some(detail)))
        }
    }
}

/// What removal does with what one record names.
#[derive(Debug, PartialEq, Eq)]
enum Plan {
    /// Left as it is (forgotten, or kept), and why.
    Leave(Verb, String),
    /// Removed (a unit: stopped), and what the report says.
    Remove(Removal, String),
}

#[derive(Debug, PartialEq, Eq)]
enum Removal {
    File(PathBuf),
    Directory(PathBuf),
    /// Stopped: the host set the unit's state, it did not install it.
    Unit(String),
    Container(String),
    Network(String),
}

/// Looks at what a record names, as far as its kind needs, and decides.
fn look(fs: &mut Fs, machine: &mut Managers, rec: &Record, opts: &Options) -> Result<Plan, Error> {
    let path = Path::new(&*rec.target);
    let forget = |why: &str| Ok(Plan::Leave(Verb::Forgotten, why.to_owned()));
    match rec.kind {
        // A file that carried a secret was recorded by its keyed digest: only the node's key
        // tells whether it is still what the host wrote. Without the key nothing can be told,
        // so nothing is removed (docs/decisions.md, "An orphan file that carried a secret").
        Kind::File if rec.wrote.is_some_and(|w| w.is_keyed()) => match machine.keyring(&opts.key) {
            Ok(Some(ring)) => {
                let found = super::secret::found_keyed(fs, &ring, path)?.map(|(meta, sum)| (meta.kind, sum));
                Ok(decide::file(path, rec.wrote, found))
            }
            Ok(None) | Err(_) => Ok(Plan::Leave(
                Verb::Kept,
                format!(
                    "no longer declared; it carried a secret, and without this node's sealing key ({}) the host cannot tell whether it was changed since it wrote it: left in place",
                    opts.key.display()
                ),
            )),
        },
        Kind::File => {
            let found = fs
                .digest_bounded(path, super::status::hash_bound(rec, opts.keep_max_bytes))?
                .map(|(meta, sum)| (meta.kind, sum.map(Digest::from_sum)));
            Ok(decide::file(path, rec.wrote, found))
        }
        Kind::Directory => {
            let found = match fs.meta(path)? {
                Some(m) if m.kind == FsKind::Directory => Some((m.kind, fs.list(path)?.len())),
                other => other.map(|m| (m.kind, 0)),
            };
            Ok(decide::directory(path, found))
        }
        Kind::Access => forget("an operator-owned path is never the host's to remove"),
        // What it unpacked may have been added to since (docs/decisions.md, "Archives").
        Kind::Archive => {
            forget("the files it unpacked are left in place: they may have been changed or added to since")
        }
        // Never removed, only forgotten; and an account is left for the files it owns
        // (docs/systemd.md, "package"; docs/systemd.md, "user").
        Kind::Package => forget("left installed; the host does not uninstall what it cannot know is unused"),
        Kind::User => forget(
            "the account is left: it may own files, and a uid freed and handed out again would give them to someone else",
        ),
        Kind::Action => forget("an action leaves nothing the host owns"),
        // Stopped, its unit file and boot setting left: the host set its state, it did not
        // install it (docs/systemd.md, "service").
        Kind::Service => {
            let state = machine.systemd(opts.bus.as_deref())?.state(&rec.target)?;
            Ok(decide::unit(&rec.target, &state, "the unit file is left: it is not the host's to delete"))
        }
        // The host started this unit; once stopped, systemd collects it and nothing is left
        // (docs/systemd.md, "process").
        Kind::Process => {
            let unit = process::unit_name(&rec.target);
            let state = machine.systemd(opts.bus.as_deref())?.state(&unit)?;
            Ok(decide::unit(&unit, &state, "the transient unit is gone with it"))
        }
        Kind::Container => {
            let found = machine.docker(opts.container_socket.as_deref())?.container(&rec.target)?;
            Ok(decide::container(&rec.target, found.map(|c| c.label(ID_LABEL).is_some())))
        }
        Kind::Network => {
            let found = machine.docker(opts.container_socket.as_deref())?.network(&rec.target)?;
            Ok(decide::network(&rec.target, found.map(|n| (n.labels.contains_key(ID_LABEL), n.containers))))
        }
        // Not reached: the pass hands orphan openings to the firewall step (`opening::nft::apply`),
        // which takes them out of the filter after everything else, in the same load
        // (docs/decisions.md, "The filter is loaded after everything else in the pass").
        Kind::Opening => Ok(Plan::Leave(
            Verb::Kept,
            "an opening leaves the filter in the firewall step, after everything else".to_owned(),
        )),
    }
}

/// The decisions, from plain values: what was found, and what the record says.
mod decide {
    use super::{Digest, FsKind, Path, Plan, Removal, Verb};
    use crate::system::systemd::UnitState;

    fn leave(action: Verb, why: &str) -> Plan {
        Plan::Leave(action, why.to_owned())
    }

    const GONE: &str = "no longer declared, and no longer there";

    /// A file: what is there (its kind, and the digest of what it holds), against what the host
    /// wrote.
    pub(super) fn file(path: &Path, wrote: Option<Digest>, found: Option<(FsKind, Option<Digest>)>) -> Plan {
        match found {
            None => leave(Verb::Forgotten, GONE),
            Some((kind, _)) if kind != FsKind::File => leave(
                Verb::Kept,
                "no longer declared, and what is there now is not the file the host wrote: left alone",
            ),
            // A file whose content is no longer what the host wrote holds someone's work (a
            // create-once seed a program grew, a hand edit): nothing is lost by leaving it
            // (docs/decisions.md, "Removing an orphan file").
            Some((_, sum)) if wrote.is_some_and(|w| sum != Some(w)) => leave(
                Verb::Kept,
                "no longer declared, and changed on the machine since the host wrote it: left in place so nothing is lost",
            ),
            Some(_) => Plan::Remove(Removal::File(path.to_owned()), "no longer declared".to_owned()),
        }
    }

    /// A directory: what is there, and how many entries it holds if it is a directory.
    ///
    /// A directory with anything left in it is kept: everything the host put inside is itself
    /// declared, and orphans go in reverse order, so what the host wrote there is already gone.
    /// What remains is data nobody declared.
    pub(super) fn directory(path: &Path, found: Option<(FsKind, usize)>) -> Plan {
        match found {
            None => leave(Verb::Forgotten, GONE),
            Some((kind, _)) if kind != FsKind::Directory => {
                leave(Verb::Kept, "no longer declared, and no longer a directory: left alone")
            }
            Some((_, 0)) => Plan::Remove(Removal::Directory(path.to_owned()), "no longer declared, and empty".to_owned()),
            Some((_, inside)) => Plan::Leave(
                Verb::Kept,
                format!(
                    "no longer declared, and {inside} item{} inside that the mesh did not put there; remove it by hand once you know what {}",
                    if inside == 1 { "" } else { "s" },
                    if inside == 1 { "it is" } else { "they are" }
                ),
            ),
        }
    }

    /// A unit that is no longer declared is stopped; `left` says what stays behind. A unit that
    /// no longer exists at all is already where removal is going; failing on it would leave a
    /// record no apply could ever clear.
    pub(super) fn unit(unit: &str, state: &UnitState, left: &str) -> Plan {
        if !state.exists() {
            return Plan::Leave(Verb::Forgotten, format!("no longer declared, and {unit} no longer exists"));
        }
        if state.stopped() {
            return Plan::Leave(
                Verb::Forgotten,
                format!("no longer declared, and {unit} was already {}", state.active),
            );
        }
        Plan::Remove(Removal::Unit(unit.to_owned()), format!("no longer declared: {unit} stopped; {left}"))
    }

    /// A container of the recorded name: `Some(true)` when it carries the host's label. One the
    /// host did not create is the declaration's no longer, so it is left alone
    /// (docs/containers.md, "Orphans").
    pub(super) fn container(name: &str, found: Option<bool>) -> Plan {
        match found {
            // A step leaves nothing running, and a container removed by hand is already where
            // removal was going.
            None => leave(Verb::Forgotten, "no longer declared, and no container of that name is there"),
            Some(false) => leave(
                Verb::Kept,
                "no longer declared, and the container of that name now was not created by mesh-host: left alone",
            ),
            Some(true) => Plan::Remove(Removal::Container(name.to_owned()), "no longer declared".to_owned()),
        }
    }

    /// A network of the recorded name: whether it carries the host's label, and the containers
    /// that use it.
    pub(super) fn network(name: &str, found: Option<(bool, Vec<String>)>) -> Plan {
        match found {
            None => leave(Verb::Forgotten, GONE),
            // Found already there, used as it was, and never the host's to remove
            // (docs/containers.md, "Networks").
            Some((false, _)) => leave(Verb::Forgotten, "made outside mesh-host, so left in place"),
            // Orphans go in reverse declared order, so the containers declared after the
            // network are gone by now. What still uses it is something this declaration does
            // not name (or a container that moves to another network later in this pass): its
            // connectivity is not the host's to cut, so the network is kept, and the record
            // with it, to be tried again at the next apply (docs/containers.md, "Networks").
            Some((true, users)) if !users.is_empty() => Plan::Leave(
                Verb::Kept,
                format!(
                    "no longer declared, and still used by {}: left in place, and removed once nothing uses it",
                    users.join(", ")
                ),
            ),
            Some((true, _)) => Plan::Remove(Removal::Network(name.to_owned()), "no longer declared".to_owned()),
        }
    }
}

/// Removes, and reads back that it is gone (a unit: that it is down).
fn act(fs: &mut Fs, machine: &mut Managers, opts: &Options, removal: &Removal) -> Result<(), Error> {
    match removal {
        Removal::File(path) => {
            fs.remove_file(path)?;
            if fs.meta(path)?.is_some() {
                return Err(Error::StillThere { target: Target::Path(path.clone()) });
            }
        }
        Removal::Directory(path) => {
            fs.remove_dir(path)?;
            if fs.meta(path)?.is_some() {
                return Err(Error::StillThere { target: Target::Path(path.clone()) });
            }
        }
        Removal::Unit(unit) => {
            let sd = machine.systemd(opts.bus.as_deref())?;
            match sd.stop(unit) {
                // Gone between the look and the stop: where removal was going anyway.
                Err(systemd::Error::NoUnit(_)) => {}
                other => other?,
            }
            let after = sd.state(unit)?;
            if after.exists() && !after.stopped() {
                return Err(Error::StillRunning { unit: unit.clone(), state: Box::new(after) });
            }
        }
        Removal::Container(name) => {
            let docker = machine.docker(opts.container_socket.as_deref())?;
            docker.remove(name)?;
            if docker.container(name)?.is_some() {
                return Err(Error::StillThere { target: Target::Container(name.clone()) });
            }
        }
        Removal::Network(name) => {
            let docker = machine.docker(opts.container_socket.as_deref())?;
            docker.remove_network(name)?;
            if docker.network(name)?.is_some() {
                return Err(Error::StillThere { target: Target::Network(name.clone()) });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::declaration::digest;
    use crate::system::systemd::UnitState;

    fn said(plan: &Plan) -> (Verb, &str) {
        match plan {
            Plan::Leave(action, detail) => (*action, detail),
            Plan::Remove(_, detail) => (Verb::Removed, detail),
        }
    }

    #[test]
    fn a_file_is_removed_only_while_it_holds_what_the_host_wrote() {
        let path = Path::new("/etc/app.conf");
        let wrote = Some(digest(b"ours"));
        assert_eq!(
            decide::file(path, wrote, Some((FsKind::File, Some(digest(b"ours"))))),
            Plan::Remove(Removal::File(path.into()), "no longer declared".into())
        );
        assert_eq!(
            said(&decide::file(path, wrote, Some((FsKind::File, Some(digest(b"edited")))))),
            (
                Verb::Kept,
                "no longer declared, and changed on the machine since the host wrote it: left in place so nothing is lost"
            )
        );
        assert_eq!(
            said(&decide::file(path, wrote, None)),
            (Verb::Forgotten, "no longer declared, and no longer there")
        );
        for kind in [FsKind::Symlink, FsKind::Directory, FsKind::Other] {
            assert_eq!(said(&decide::file(path, wrote, Some((kind, None)))).0, Verb::Kept, "{kind:?}");
        }
        // A record without a digest (from before digests were kept) removes what is there.
        assert!(matches!(
            decide::file(path, None, Some((FsKind::File, Some(digest(b"any"))))),
            Plan::Remove(..)
        ));
    }

    #[test]
    fn a_directory_is_removed_only_when_empty() {
        let path = Path::new("/srv/app");
        assert_eq!(
            decide::directory(path, Some((FsKind::Directory, 0))),
            Plan::Remove(Removal::Directory(path.into()), "no longer declared, and empty".into())
        );
        assert_eq!(
            said(&decide::directory(path, Some((FsKind::Directory, 1)))),
            (
                Verb::Kept,
                "no longer declared, and 1 item inside that the mesh did not put there; remove it by hand once you know what it is"
            )
        );
        assert_eq!(
            said(&decide::directory(path, Some((FsKind::Directory, 2)))).1,
            "no longer declared, and 2 items inside that the mesh did not put there; remove it by hand once you know what they are"
        );
        assert_eq!(said(&decide::directory(path, Some((FsKind::Symlink, 0)))).0, Verb::Kept);
        assert_eq!(said(&decide::directory(path, None)).0, Verb::Forgotten);
    }

    #[test]
    fn a_unit_is_stopped_unless_it_is_down_or_gone() {
        let state = |load: &str, active: &str| UnitState {
            load: load.into(),
            active: active.into(),
            sub: "x".into(),
        };
        assert_eq!(
            decide::unit("web.service", &state("loaded", "active"), "the unit file is left"),
            Plan::Remove(
                Removal::Unit("web.service".into()),
                "no longer declared: web.service stopped; the unit file is left".into()
            )
        );
        assert_eq!(
            said(&decide::unit("web.service", &state("loaded", "failed"), "")),
            (Verb::Forgotten, "no longer declared, and web.service was already failed")
        );
        assert_eq!(
            said(&decide::unit("web.service", &state("not-found", "inactive"), "")),
            (Verb::Forgotten, "no longer declared, and web.service no longer exists")
        );
    }

    #[test]
    fn a_container_or_network_is_removed_only_when_the_host_made_it_and_nothing_uses_it() {
        assert_eq!(
            decide::container("web", Some(true)),
            Plan::Remove(Removal::Container("web".into()), "no longer declared".into())
        );
        assert_eq!(said(&decide::container("web", Some(false))).0, Verb::Kept);
        assert_eq!(said(&decide::container("web", None)).0, Verb::Forgotten);
        assert_eq!(
            decide::network("net", Some((true, vec![]))),
            Plan::Remove(Removal::Network("net".into()), "no longer declared".into())
        );
        assert_eq!(
            said(&decide::network("net", Some((true, vec!["a".into(), "b".into()])))),
            (
                Verb::Kept,
                "no longer declared, and still used by a, b: left in place, and removed once nothing uses it"
            )
        );
        assert_eq!(
            said(&decide::network("net", Some((false, vec!["a".into()])))),
            (Verb::Forgotten, "made outside mesh-host, so left in place")
        );
        assert_eq!(said(&decide::network("net", None)).0, Verb::Forgotten);
    }
}
