//! Account lookups (getpwnam_r / getgrnam_r through nix). Read-only: making accounts is the
//! `user` applier's, which comes with the systemd issue.

use std::collections::HashMap;

use crate::declaration::Owner;

/// A failure to find an account, naming it.
#[derive(Debug, thiserror::Error)]
pub enum UserError {
    #[error("the user {0:?} does not exist on this machine")]
    NoUser(String),
    #[error("the group {0:?} does not exist on this machine")]
    NoGroup(String),
    #[error("cannot look up {name:?}: {source}")]
    Lookup {
        name: String,
        #[source]
        source: nix::Error,
    },
}

/// Resolves owners to uid and gid, once per name for the life of the cache (one apply).
#[derive(Default)]
pub struct Accounts {
    owners: HashMap<String, (u32, u32)>,
}

impl Accounts {
    /// The uid and gid an owner names. `user` alone means the user's primary group.
    pub fn resolve(&mut self, owner: &Owner) -> Result<(u32, u32), UserError> {
        let key = owner.to_string();
        if let Some(ids) = self.owners.get(&key) {
            return Ok(*ids);
        }
        let user = nix::unistd::User::from_name(&owner.user)
            .map_err(|source| UserError::Lookup { name: owner.user.clone(), source })?
            .ok_or_else(|| UserError::NoUser(owner.user.clone()))?;
        let gid = match &owner.group {
            None => user.gid.as_raw(),
            Some(g) => nix::unistd::Group::from_name(g)
                .map_err(|source| UserError::Lookup { name: g.clone(), source })?
                .ok_or_else(|| UserError::NoGroup(g.clone()))?
                .gid
                .as_raw(),
        };
        let ids = (user.uid.as_raw(), gid);
        self.owners.insert(key, ids);
        Ok(ids)
    }
}
