//! Strict sources, as sshd's `StrictModes`: a file the agent takes its orders or its keys from
//! (the daemon's declaration and its directory, the sealing key, etcd's password and client key,
//! the allowed signers) is read only when nobody but a trusted user can change it: the file, and
//! every directory above it, owned by root or the agent (or, for `apply`, the operator who ran
//! it through sudo), and writable by neither group nor others. A directory above it that others
//! may write is fine when it has the sticky bit and a trusted owner (`/tmp`): there nobody can
//! rename or remove what another owns. Symlinks are followed and the target checked, and the
//! directories holding each link as well (whoever can write those can point the link elsewhere).
//!
//! Checked by path, then read by path: no race is left between the two, since passing the check
//! means nobody untrusted can change any name on the way. `verdict` is the pure decision;
//! `check` walks the machine. Why so, and which commands check: docs/decisions.md, "Strict
//! sources".

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

/// Whose files the agent trusts: root and its own uid, and for a one-shot command run through
/// sudo, the operator who ran it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trusted {
    uids: Vec<u32>,
}

impl Trusted {
    /// Root and the agent's own effective uid: what the daemon trusts.
    pub fn agent() -> Trusted {
        let mut uids = vec![0];
        let euid = nix::unistd::geteuid().as_raw();
        if euid != 0 {
            uids.push(euid);
        }
        Trusted { uids }
    }

    /// `agent`, and the user who ran the command through sudo (`SUDO_UID`): what `apply` trusts
    /// of a declaration the operator names (docs/decisions.md, "Strict sources"). Whoever sets
    /// the environment of a command run as root is root already.
    pub fn operator() -> Trusted {
        let mut trusted = Trusted::agent();
        if let Some(uid) = std::env::var("SUDO_UID").ok().and_then(|u| u.parse::<u32>().ok()) {
            if !trusted.uids.contains(&uid) {
                trusted.uids.push(uid);
            }
        }
        trusted
    }

    /// Only these uids (for the tests).
    #[cfg(test)]
    pub fn only(uids: &[u32]) -> Trusted {
        Trusted { uids: uids.to_vec() }
    }
}

/// Where a path stands in what is read: the file or directory read itself (a directory whose
/// entries are read, so the sticky bit does not excuse it: anyone could add a file to it), or a
/// directory above it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// What is read: the file, or the directory whose files are read.
    Read,
    /// A directory on the way to it.
    Above,
}

/// What is wrong with one path, or nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Nobody untrusted can change it.
    Fine,
    /// Owned by a user who is not trusted.
    Owner,
    /// Writable by group or others (and not excused by the sticky bit).
    Writable,
    /// Both.
    OwnerAndWritable,
}

/// The pure decision for one path, from its mode bits (`st_mode & 0o7777`), its owner and
/// whether it is a directory.
pub fn verdict(mode: u32, uid: u32, dir: bool, place: Place, trusted: &Trusted) -> Verdict {
    let owner_ok = trusted.uids.contains(&uid);
    let sticky = dir && mode & 0o1000 != 0 && place == Place::Above;
    // A sticky directory owned by a trusted user: others may add names, never change ours.
    let writable = mode & 0o022 != 0 && !(sticky && owner_ok);
    match (owner_ok, writable) {
        (true, false) => Verdict::Fine,
        (false, false) => Verdict::Owner,
        (true, true) => Verdict::Writable,
        (false, true) => Verdict::OwnerAndWritable,
    }
}

/// Why a source is refused: the path, what is wrong, and the fix.
#[derive(Debug, thiserror::Error)]
#[error("{path} is {wrong}: anyone who can change it, or a directory above it, is root here, so mesh-host refuses it (as sshd's StrictModes does); `{fix}`")]
pub struct Refused {
    /// The path found wrong (the source, or a directory above it).
    pub path: PathBuf,
    /// What is wrong: its owner and mode.
    pub wrong: String,
    /// The commands that put it right.
    pub fix: String,
}

/// Checks `path` and every directory above it, following symlinks (see the module's notes).
/// An error reaching a path (it does not exist) is returned as it is, for the caller's own
/// message; a path that is not strict, as `Refused` in an `io::Error` of kind `PermissionDenied`.
pub fn check(path: &Path, trusted: &Trusted) -> std::io::Result<()> {
    walk(path, trusted, Place::Read)
}

/// Checks only the directories above `path`, for a file its reader opens without following a
/// symlink and checks on the descriptor itself (a key file, `keys::read`): the directory that
/// holds it may be sticky, as `/tmp` is.
pub fn check_above(path: &Path, trusted: &Trusted) -> std::io::Result<()> {
    let absolute = std::path::absolute(path)?;
    match absolute.parent() {
        Some(dir) => walk(dir, trusted, Place::Above),
        None => Ok(()),
    }
}

fn walk(path: &Path, trusted: &Trusted, place: Place) -> std::io::Result<()> {
    let absolute = std::path::absolute(path)?;
    let real = std::fs::canonicalize(&absolute)?;
    let mut seen: Vec<PathBuf> = Vec::new();
    // The target and its directories; then the directories of the name as given, which hold
    // the symlinks on the way (followed: each is checked as what it points to).
    let chain = std::iter::once((real.clone(), place))
        .chain(real.ancestors().skip(1).map(|p| (p.to_path_buf(), Place::Above)))
        .chain(absolute.ancestors().skip(1).map(|p| (p.to_path_buf(), Place::Above)));
    for (p, place) in chain {
        if seen.contains(&p) {
            continue;
        }
        let meta = std::fs::metadata(&p)?;
        // A FIFO or a device read as a source is refused by its reader, which says what it is
        // (a clearer message than its mode: `/dev/zero` is 0666).
        if place == Place::Read && !meta.is_file() && !meta.is_dir() {
            seen.push(p);
            continue;
        }
        let mode = meta.mode() & 0o7777;
        let wrong = verdict(mode, meta.uid(), meta.is_dir(), place, trusted);
        if wrong != Verdict::Fine {
            let refused = refused(&p, mode, meta.uid(), wrong);
            return Err(std::io::Error::new(std::io::ErrorKind::PermissionDenied, refused));
        }
        seen.push(p);
    }
    Ok(())
}

/// The refusal of `path`, with its fix.
fn refused(path: &Path, mode: u32, uid: u32, wrong: Verdict) -> Refused {
    let shown = quoted(path);
    let owner = format!("owned by uid {uid}, not root or the agent");
    let writable = format!("writable by {} (mode {mode:04o})", by(mode));
    let (wrong, fix) = match wrong {
        Verdict::Owner => (format!("{owner} (mode {mode:04o})"), format!("chown root {shown}")),
        Verdict::Writable => (writable, format!("chmod go-w {shown}")),
        Verdict::OwnerAndWritable | Verdict::Fine => {
            (format!("{owner}, and {writable}"), format!("chown root {shown}; chmod go-w {shown}"))
        }
    };
    Refused { path: path.to_owned(), wrong, fix }
}

/// A path as a shell would take it back: as it is when plain, else in single quotes.
fn quoted(path: &Path) -> String {
    let s = path.display().to_string();
    if s.bytes().all(|b| b.is_ascii_alphanumeric() || b"/._-+,:@".contains(&b)) {
        s
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// Who may write, by the mode's group and other bits.
fn by(mode: u32) -> &'static str {
    match (mode & 0o020 != 0, mode & 0o002 != 0) {
        (true, true) => "group and others",
        (true, false) => "its group",
        _ => "others",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_decision_by_mode_owner_and_sticky_bit() {
        let t = Trusted::only(&[0, 1000]);
        use Place::{Above, Read};
        use Verdict::*;
        #[rustfmt::skip]
        let table: &[(u32, u32, bool, Place, Verdict)] = &[
            // mode, uid, dir, place: verdict
            (0o644, 0, false, Read, Fine),
            (0o600, 1000, false, Read, Fine),
            (0o444, 0, false, Read, Fine),
            (0o664, 0, false, Read, Writable),
            (0o646, 0, false, Read, Writable),
            (0o644, 65534, false, Read, Owner),
            (0o666, 65534, false, Read, OwnerAndWritable),
            (0o755, 0, true, Read, Fine),
            (0o755, 0, true, Above, Fine),
            (0o775, 0, true, Above, Writable),
            (0o777, 0, true, Above, Writable),
            // /tmp: sticky and root's, fine above what is read, never as what is read.
            (0o1777, 0, true, Above, Fine),
            (0o1777, 0, true, Read, Writable),
            // Sticky, but owned by someone else: they can remove anything in it.
            (0o1777, 65534, true, Above, OwnerAndWritable),
            (0o1755, 65534, true, Above, Owner),
            // The sticky bit on a file excuses nothing.
            (0o1666, 0, false, Above, Writable),
            (0o4755, 0, false, Read, Fine),
        ];
        for &(mode, uid, dir, place, want) in table {
            assert_eq!(
                verdict(mode, uid, dir, place, &t),
                want,
                "mode {mode:04o} uid {uid} dir {dir} {place:?}"
            );
        }
    }

    #[test]
    fn the_message_names_the_path_what_is_wrong_and_the_fix() {
        let r = refused(Path::new("/etc/x"), 0o666, 65534, Verdict::OwnerAndWritable).to_string();
        assert!(r.contains("/etc/x is owned by uid 65534"), "{r}");
        assert!(r.contains("writable by group and others (mode 0666)"), "{r}");
        assert!(r.contains("`chown root /etc/x; chmod go-w /etc/x`"), "{r}");
        let r = refused(Path::new("/etc/x"), 0o664, 0, Verdict::Writable).to_string();
        assert!(r.contains("writable by its group (mode 0664)") && r.contains("`chmod go-w /etc/x`"), "{r}");
        let r = refused(Path::new("/etc/x"), 0o644, 7, Verdict::Owner).to_string();
        assert!(r.contains("owned by uid 7") && r.contains("`chown root /etc/x`"), "{r}");
    }
}
