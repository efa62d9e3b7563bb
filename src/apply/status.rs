//! What `status` says of the machine: whether each recorded file and directory still holds what
//! the host left. The same comparison the appliers make (content digest, mode), read-only.

use std::path::Path;
use std::sync::Arc;

use crate::declaration::{Digest, Kind};
use crate::secrets::Keyring;
use crate::store::Record;
use crate::system::Fs;

/// Looks at the machine for `status`, reusing its directory descriptors across records.
#[derive(Default)]
pub struct Looker {
    fs: Fs,
    /// The node's keyring, for files recorded by a keyed digest (they carried a secret).
    keyring: Option<Arc<Keyring>>,
    /// The largest file hashed unless the host last found it at that size
    /// (`--keep-max-bytes`): a larger one is `changed` without being read.
    hash_max: u64,
}

/// What the machine holds of one record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Holds {
    /// What the host left.
    Holds,
    /// Something else: changed by hand since.
    Changed,
    /// Nothing is there any more.
    Missing,
    /// It could not be looked at (a symlink on the way, no permission).
    Unreadable,
}

impl Holds {
    /// The word `status` prints.
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
    /// A looker that can tell whether a file that carried a secret still holds what the host
    /// wrote, with the node's key at `key`. Without a usable key such files are `unreadable`:
    /// nothing can be told (docs/decisions.md, "An orphan file that carried a secret").
    pub fn with_key(key: &Path, hash_max: u64) -> Looker {
        Looker { fs: Fs::default(), keyring: super::secret::load(key).ok().flatten(), hash_max }
    }

    /// For a file or directory, what the machine holds of it; `None` for the types `status`
    /// does not look at (units, containers, packages, accounts: their own tools say more).
    pub fn holds(&mut self, rec: &Record) -> Option<Holds> {
        let path = std::path::Path::new(&*rec.target);
        let mode_same = |mode: u32| rec.mode.is_none_or(|m| u32::from(m) == mode);
        let seen = match rec.kind {
            Kind::File if rec.wrote.is_some_and(|w| w.is_keyed()) => match &self.keyring {
                Some(ring) => super::secret::found_keyed(&mut self.fs, ring, path).map(|found| {
                    found.map(|(m, sum)| rec.wrote.is_some() && rec.wrote == sum && mode_same(m.mode))
                }),
                None => return Some(Holds::Unreadable),
            },
            Kind::File => self.fs.digest_bounded(path, hash_bound(rec, self.hash_max)).map(|found| {
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

/// How large a file recorded by `rec` may be and still be hashed to compare it with what the
/// host wrote: `keep_max` (`--keep-max-bytes`), or the size the host last found it at when
/// that is larger (a large file the host itself wrote). A file larger than both cannot hold
/// what the host wrote and is not read: a sparse 100 GiB file planted at a recorded path
/// costs a stat, not minutes of hashing (issue 45, point 3).
pub(super) fn hash_bound(rec: &Record, keep_max: u64) -> u64 {
    keep_max.max(rec.sig.map_or(0, |sig| sig.size))
}
