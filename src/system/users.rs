//! Account lookups by name (getpwnam_r / getgrnam_r through nix). Read-only: accounts are made
//! by `system::accounts` (useradd/usermod), for the `user` applier.

use std::collections::HashMap;

/// A failure to find an account, naming it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No user of this name; holds the name.
    #[error("the user {0:?} does not exist on this machine")]
    NoUser(String),
    /// No group of this name; holds the name.
    #[error("the group {0:?} does not exist on this machine")]
    NoGroup(String),
    /// The user or group database could not be read.
    #[error("cannot look up {name:?}: {source}")]
    Lookup {
        /// The user or group looked up.
        name: String,
        /// The system's error.
        #[source]
        source: nix::Error,
    },
}

/// Resolves owners to uid and gid, once per name for the life of the cache (one apply).
#[derive(Default)]
pub struct OwnerIds {
    owners: HashMap<String, (u32, u32)>,
}

impl OwnerIds {
    /// The uid and gid of a user and group by name. A user alone means its primary group.
    pub fn resolve(&mut self, user: &str, group: Option<&str>) -> Result<(u32, u32), Error> {
        let key = match group {
            Some(g) => format!("{user}:{g}"),
            None => user.to_owned(),
        };
        if let Some(ids) = self.owners.get(&key) {
            return Ok(*ids);
        }
        let account = nix::unistd::User::from_name(user)
            .map_err(|source| Error::Lookup { name: user.to_owned(), source })?
            .ok_or_else(|| Error::NoUser(user.to_owned()))?;
        let gid = match group {
            None => account.gid.as_raw(),
            Some(g) => nix::unistd::Group::from_name(g)
                .map_err(|source| Error::Lookup { name: g.to_owned(), source })?
                .ok_or_else(|| Error::NoGroup(g.to_owned()))?
                .gid
                .as_raw(),
        };
        let ids = (account.uid.as_raw(), gid);
        self.owners.insert(key, ids);
        Ok(ids)
    }
}
