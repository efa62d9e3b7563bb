//! The declaration: JSON to a validated model, refused whole or accepted whole.
//!
//! Architecture Invariant: nothing here touches the machine. Parsing a declaration is a pure
//! function of its bytes, so `check` and `plan` are safe anywhere and a refused declaration has
//! provably changed nothing.

mod error;
mod model;
mod schema;
mod types;
mod validate;

#[cfg(test)]
mod tests;

use std::collections::HashMap;

use serde::Deserialize;
use sha2::{Digest as _, Sha256};

pub use error::{Problem, Refused};
pub use model::*;
pub use schema::json_schema;
pub use types::{AbsPath, Argv, Cidr, Cron, Id, Image, Mode, Name, Owner, Port};

/// The declaration versions this build understands.
pub const VERSIONS: &[u64] = &[1];

/// A validated declaration. Every value in it has passed every rule.
#[derive(Clone, Debug)]
pub struct Declaration {
    pub resources: Vec<Resource>,
    pub adoption: Option<Adoption>,
    by_id: HashMap<Id, usize>,
    /// For each id, the resources naming it in restart-on or reload-on: the controller asks
    /// this on every reconcile, so it is built once rather than found by a scan.
    named_by: HashMap<Id, Vec<usize>>,
    /// The positions of the gates (actions, run-once steps), in order.
    gates: Vec<usize>,
}

/// A declaration that says the node ran before the mesh came.
#[derive(Clone, Debug, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Adoption {
    /// The modules the mesh has taken over; what the others describe is held as found.
    #[serde(default)]
    pub taken: Vec<String>,
}

/// One declared resource.
#[derive(Clone, Debug)]
pub struct Resource {
    /// Its position in `resources`, which is its apply order.
    pub index: usize,
    pub id: Id,
    pub spec: Spec,
    /// `sha256:` of the resource's canonical JSON: changes exactly when its declaration does.
    pub digest: String,
}

impl Resource {
    pub fn kind(&self) -> Kind {
        self.spec.kind()
    }

    pub fn target(&self) -> String {
        self.spec.target()
    }
}

impl Declaration {
    /// Parses and validates; any problem refuses the whole declaration.
    pub fn parse(bytes: &[u8]) -> Result<Declaration, Refused> {
        validate::parse(bytes)
    }

    /// Parses several named documents as one declaration, in the order given (a directory's
    /// `*.json` files, sorted by name). Problems name their document.
    pub fn parse_sources(sources: &[(String, Vec<u8>)]) -> Result<Declaration, Refused> {
        let refs: Vec<(Option<&str>, &[u8])> =
            sources.iter().map(|(name, bytes)| (Some(name.as_str()), bytes.as_slice())).collect();
        validate::parse_sources(&refs)
    }

    pub fn get(&self, id: &Id) -> Option<&Resource> {
        self.by_id.get(id).map(|&i| &self.resources[i])
    }

    /// Looks an id up by its text.
    pub fn find(&self, id: &str) -> Option<&Resource> {
        Id::parse(id).ok().and_then(|id| self.get(&id))
    }

    /// Resources that name `id` in restart-on or reload-on, in declaration order.
    pub fn dependents<'a>(&'a self, id: &'a Id) -> impl Iterator<Item = &'a Resource> + 'a {
        self.named_by.get(id).into_iter().flatten().map(|&i| &self.resources[i])
    }

    /// The gates (actions and run-once steps), in declaration order.
    pub fn gates(&self) -> impl Iterator<Item = &Resource> + '_ {
        self.gates.iter().map(|&i| &self.resources[i])
    }

    pub(crate) fn new(resources: Vec<Resource>, adoption: Option<Adoption>) -> Declaration {
        let by_id = resources.iter().map(|r| (r.id.clone(), r.index)).collect();
        let mut named_by: HashMap<Id, Vec<usize>> = HashMap::new();
        for r in &resources {
            let mut names: Vec<&Id> = r.spec.restart_on().iter().chain(r.spec.reload_on()).collect();
            names.dedup();
            for id in names {
                let list = named_by.entry(id.clone()).or_default();
                if list.last() != Some(&r.index) {
                    list.push(r.index);
                }
            }
        }
        let gates = resources.iter().filter(|r| r.spec.is_gate()).map(|r| r.index).collect();
        Declaration { resources, adoption, by_id, named_by, gates }
    }
}

/// `sha256:<hex>` of some bytes: the one digest format in records and reports.
pub fn digest(bytes: &[u8]) -> String {
    hex_digest(&Sha256::digest(bytes))
}

/// `sha256:<hex>` of a finished sha256.
pub(crate) fn hex_digest(sum: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(71);
    s.push_str("sha256:");
    for b in sum {
        s.push(HEX[(b >> 4) as usize] as char);
        s.push(HEX[(b & 15) as usize] as char);
    }
    s
}
