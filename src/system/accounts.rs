//! Local accounts: read through the C library (getpwnam_r, getgrouplist), changed with the
//! shadow suite's own tools (groupadd, useradd, usermod), which keep /etc/passwd, /etc/shadow
//! and /etc/group consistent and locked the way every other tool on the machine expects.

use std::collections::BTreeSet;
use std::ffi::CString;

use nix::unistd::{Gid, Group, User};

use super::command;

/// A failure to read or change an account, naming it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A tool could not be run, or did not finish in time.
    #[error(transparent)]
    Run(#[from] command::Error),
    /// The user and group databases could not be read.
    #[error("cannot look up {name:?}: {source}")]
    Lookup {
        /// The account or group looked up.
        name: String,
        /// The system's error.
        #[source]
        source: nix::Error,
    },
    /// A tool ran and failed.
    #[error("{tool} for {name} failed: {how}")]
    Failed {
        /// The tool (`useradd`, `usermod`, `groupadd`).
        tool: &'static str,
        /// The account or group it was run for.
        name: String,
        /// How it ended: its exit and what it printed.
        how: String,
    },
}

/// An account as the machine has it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Account {
    /// The account's uid.
    pub uid: u32,
    /// The primary group's name (its number when it has no name).
    pub group: String,
    /// Supplementary groups, by name, the primary one left out.
    pub groups: BTreeSet<String>,
    /// The home directory.
    pub home: String,
    /// The login shell.
    pub shell: String,
}

/// What `useradd` is asked for.
pub struct NewAccount<'a> {
    /// The account's name.
    pub name: &'a str,
    /// A system account: made with `--system`, no home made for it, and `/usr/sbin/nologin` as its
    /// shell unless one is given.
    pub system: bool,
    /// The uid; `useradd` chooses one when absent.
    pub uid: Option<u32>,
    /// The primary group, which must exist.
    pub group: Option<&'a str>,
    /// Supplementary groups, which must exist.
    pub groups: &'a [&'a str],
    /// The home directory; `useradd`'s default when absent.
    pub home: Option<&'a str>,
    /// The login shell; `useradd`'s default when absent.
    pub shell: Option<&'a str>,
}

/// What `usermod` is asked to change; `None` leaves a field as it is.
#[derive(Default)]
pub struct Changes {
    /// A new primary group.
    pub group: Option<String>,
    /// Added to the account's supplementary groups; none are taken away.
    pub add_groups: Vec<String>,
    /// A new home directory: pointed to, never moved into.
    pub home: Option<String>,
    /// A new login shell.
    pub shell: Option<String>,
}

impl Changes {
    /// Whether there is nothing to change, so `usermod` need not run.
    pub fn is_empty(&self) -> bool {
        self.group.is_none() && self.add_groups.is_empty() && self.home.is_none() && self.shell.is_none()
    }
}

/// The account, or `None` when the machine has no such user.
pub fn lookup(name: &str) -> Result<Option<Account>, Error> {
    let lookup = |source| Error::Lookup { name: name.to_owned(), source };
    let Some(user) = User::from_name(name).map_err(lookup)? else {
        return Ok(None);
    };
    let group_name = |gid: Gid| -> Result<String, Error> {
        Ok(Group::from_gid(gid).map_err(lookup)?.map_or_else(|| gid.to_string(), |g| g.name))
    };
    let cname = CString::new(name).map_err(|_| lookup(nix::Error::EINVAL))?;
    let mut groups = BTreeSet::new();
    for gid in nix::unistd::getgrouplist(&cname, user.gid).map_err(lookup)? {
        if gid != user.gid {
            groups.insert(group_name(gid)?);
        }
    }
    Ok(Some(Account {
        uid: user.uid.as_raw(),
        group: group_name(user.gid)?,
        groups,
        home: user.dir.display().to_string(),
        shell: user.shell.display().to_string(),
    }))
}

/// Whether a group of this name exists.
pub fn group_exists(name: &str) -> Result<bool, Error> {
    Ok(Group::from_name(name).map_err(|source| Error::Lookup { name: name.to_owned(), source })?.is_some())
}

/// Makes a group with `groupadd`, a system group when asked.
pub fn add_group(name: &str, system: bool) -> Result<(), Error> {
    let mut argv = vec!["groupadd"];
    if system {
        argv.push("--system");
    }
    argv.push(name);
    tool("groupadd", name, &argv)
}

/// Makes an account with `useradd`.
pub fn add(a: &NewAccount<'_>) -> Result<(), Error> {
    let uid = a.uid.map(|u| u.to_string());
    let groups = a.groups.join(",");
    let mut argv = vec!["useradd"];
    if a.system {
        // A service account gets no home made for it and no login shell unless declared.
        argv.extend_from_slice(&["--system", "--no-create-home"]);
    } else {
        argv.push("--create-home");
    }
    if let Some(uid) = &uid {
        argv.extend_from_slice(&["--uid", uid]);
    }
    if let Some(g) = a.group {
        argv.extend_from_slice(&["--gid", g]);
    }
    if !groups.is_empty() {
        argv.extend_from_slice(&["--groups", &groups]);
    }
    if let Some(h) = a.home {
        argv.extend_from_slice(&["--home-dir", h]);
    }
    if let Some(s) = a.shell {
        argv.extend_from_slice(&["--shell", s]);
    } else if a.system {
        argv.extend_from_slice(&["--shell", "/usr/sbin/nologin"]);
    }
    argv.push(a.name);
    tool("useradd", a.name, &argv)
}

/// Changes an account with `usermod`; supplementary groups are only added to.
pub fn modify(name: &str, c: &Changes) -> Result<(), Error> {
    let groups = c.add_groups.join(",");
    let mut argv = vec!["usermod"];
    if let Some(g) = &c.group {
        argv.extend_from_slice(&["--gid", g]);
    }
    if !groups.is_empty() {
        argv.extend_from_slice(&["--append", "--groups", &groups]);
    }
    // The home directory is pointed elsewhere, never moved: what is in the old one is not the
    // host's to carry.
    if let Some(h) = &c.home {
        argv.extend_from_slice(&["--home", h]);
    }
    if let Some(s) = &c.shell {
        argv.extend_from_slice(&["--shell", s]);
    }
    argv.push(name);
    tool("usermod", name, &argv)
}

fn tool(tool: &'static str, name: &str, argv: &[&str]) -> Result<(), Error> {
    let ran = command::run_str(argv, &[])?;
    if ran.success() {
        Ok(())
    } else {
        Err(Error::Failed { tool, name: name.to_owned(), how: ran.describe() })
    }
}
