//! What `status` says of the machine: whether each recorded file and directory still holds what
//! the host left. The same comparison the appliers make (content digest, mode), read-only.

use crate::declaration::{Digest, Kind};
use crate::store::Record;
use crate::system::Fs;

/// Looks at the machine for `status`, reusing its directory descriptors across records.
#[derive(Default)]
pub struct Looker {
    fs: Fs,
}

/// What the machine holds of one record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Holds {
    /// What the host left.
    Holds,
    /// Something else: changed by hand since.
    Changed,
    Missing,
    /// It could not be looked at (a symlink on the way, no permission).
    Unreadable,
}

impl Holds {
    pub fn as_str(self) -> &'static str {
        match self {
            Holds::Holds => "holds",
            Holds::Changed => "changed",
            Holds::Missing => "missing",
            Holds::Unreadable => "unreadable",
        }
    }
}

impl Looker {
    /// For a file or directory, what the machine holds of it; `None` for the types `status`
    /// does not look at (units, containers, packages, accounts: their own tools say more).
    pub fn holds(&mut self, rec: &Record) -> Option<Holds> {
        let path = std::path::Path::new(&*rec.target);
        let mode_same = |mode: u32| rec.mode.is_none_or(|m| m == mode);
        let seen = match rec.kind {
            Kind::File => self.fs.digest(path).map(|found| {
                found.map(|(m, sum)| {
                    rec.wrote.is_some() && rec.wrote == sum.map(Digest::from_sum) && mode_same(m.mode)
                })
            }),
            Kind::Directory => self.fs.meta(path).map(|found| found.map(|m| mode_same(m.mode))),
            Kind::Access
            | Kind::Package
            | Kind::Service
            | Kind::Container
            | Kind::Network
            | Kind::User
            | Kind::Archive
            | Kind::Process
            | Kind::Action
            | Kind::Opening => return None,
        };
        Some(match seen {
            Ok(Some(true)) => Holds::Holds,
            Ok(Some(false)) => Holds::Changed,
            Ok(None) => Holds::Missing,
            Err(_) => Holds::Unreadable,
        })
    }
}
