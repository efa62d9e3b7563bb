//! Local accounts: read through the C library (getpwnam_r, getgrouplist), changed with the
//! shadow suite's own tools (groupadd, useradd, usermod), which keep /etc/passwd, /etc/shadow
//! and /etc/group consistent and locked the way every other tool on the machine expects.

use std::collections::BTreeSet;
use std::ffi::CString;

use nix::unistd::{Gid, Group, User};

use super::command::{self, CommandError};

/// A failure to read or change an account, naming it.
#[derive(Debug, thiserror::Error)]
pub enum AccountError {
    #[error(transparent)]
    Run(#[from] CommandError),
    #[error("cannot look up {name:?}: {source}")]
    Lookup {
        name: String,
        #[source]
        source: nix::Error,
    },
    #[error("{tool} for {name} failed: {how}")]
    Failed { tool: &'static str, name: String, how: String },
}

/// An account as the machine has it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Account {
    pub uid: u32,
    /// The primary group's name (its number when it has no name).
    pub group: String,
    /// Supplementary groups, by name, the primary one left out.
    pub groups: BTreeSet<String>,
    pub home: String,
    pub shell: String,
}

/// What `useradd` is asked for.
pub struct NewAccount<'a> {
    pub name: &'a str,
    pub system: bool,
    pub uid: Option<u32>,
    pub group: Option<&'a str>,
    pub groups: &'a [&'a str],
    pub home: Option<&'a str>,
    pub shell: Option<&'a str>,
}

/// What `usermod` is asked to change; `None` leaves a field as it is.
#[derive(Default)]
pub struct Changes {
    pub group: Option<String>,
    /// Added to the account's supplementary groups; none are taken away.
    pub add_groups: Vec<String>,
    pub home: Option<String>,
    pub shell: Option<String>,
}

impl Changes {
    pub fn is_empty(&self) -> bool {
        self.group.is_none() && self.add_groups.is_empty() && self.home.is_none() && self.shell.is_none()
    }
}

/// The account, or `None` when the machine has no such user.
pub fn lookup(name: &str) -> Result<Option<Account>, AccountError> {
    let lookup = |source| AccountError::Lookup { name: name.to_owned(), source };
    let Some(user) = User::from_name(name).map_err(lookup)? else {
        return Ok(None);
    };
    let group_name = |gid: Gid| -> Result<String, AccountError> {
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

pub fn group_exists(name: &str) -> Result<bool, AccountError> {
    Ok(Group::from_name(name)
        .map_err(|source| AccountError::Lookup { name: name.to_owned(), source })?
        .is_some())
}

pub fn add_group(name: &str, system: bool) -> Result<(), AccountError> {
    let mut argv = vec!["groupadd"];
    if system {
        argv.push("--system");
    }
    argv.push(name);
    tool("groupadd", name, &argv)
}

pub fn add(a: &NewAccount<'_>) -> Result<(), AccountError> {
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

pub fn modify(name: &str, c: &Changes) -> Result<(), AccountError> {
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

fn tool(tool: &'static str, name: &str, argv: &[&str]) -> Result<(), AccountError> {
    let ran = command::run_str(argv, &[])?;
    if ran.success() {
        Ok(())
    } else {
        Err(AccountError::Failed { tool, name: name.to_owned(), how: ran.describe() })
    }
}
