//! The declaration: JSON to a validated model, refused whole or accepted whole.
//!
//! Architecture Invariant: nothing here touches the machine. Parsing a declaration is a pure
//! function of its bytes, so `check` and `plan` are safe anywhere and a refused declaration has
//! provably changed nothing.

mod across;
mod digest;
mod error;
mod json;
mod model;
mod schema;
mod types;
mod validate;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::hash::{Hash, Hasher as _};
use std::path::Path;

use serde::Deserialize;

pub use digest::Digest;
pub use error::{Problem, Refused};
pub use model::*;
pub use schema::json_schema;
pub use types::{
    AbsPath, Argv, Base64Bytes, Cidr, Cron, EnvName, HostEntry, Id, Image, Mode, Name, Owner, Port,
    PortMapping, Sealed, Sha256, Transport, Volume, VolumeSource,
};
pub(crate) use validate::secret_holes;

/// The declaration versions this build understands.
pub const VERSIONS: &[u64] = &[1];

/// A validated declaration. Every value in it has passed every rule.
#[derive(Clone, Debug)]
pub struct Declaration {
    /// The resources, in their apply order.
    pub resources: Vec<Resource>,
    /// Present when the node ran before the mesh came: which modules the mesh has taken over.
    pub adoption: Option<Adoption>,
    /// (hash of the id, position), sorted: a lookup table of 8 bytes per resource, which
    /// refers to the ids in `resources` instead of holding copies of them. The hash is 32 bits:
    /// the key is compared in any case, and at 100,000 ids two of them share a hash about once.
    by_id: Vec<(u32, u32)>,
    /// The same for the paths of files, directories and archives: what a watcher's event at a
    /// path is matched against.
    by_path: Vec<(u32, u32)>,
    /// For each id, the resources naming it in restart-on or reload-on: the controller asks
    /// this on every reconcile, so it is built once rather than found by a scan.
    named_by: HashMap<Id, Vec<usize>>,
    /// The positions of the gates (actions, run-once steps), in order.
    gates: Vec<usize>,
    /// The positions of the scheduled steps, in order: the controller asks after every
    /// reconcile whether there are any, which a scan would make cost as much as the node is big.
    scheduled: Vec<usize>,
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
    /// Its position in `resources`, which is its apply order (`index`). 32 bits, beside the
    /// digest's flag: a resource is 8 bytes smaller.
    position: u32,
    /// The resource's id, unique in the declaration.
    pub id: Id,
    /// What the resource is, with the fields of its type.
    pub spec: Spec,
    /// Of the resource's canonical JSON: changes exactly when its declaration does.
    pub digest: Digest,
}

impl Resource {
    /// Its position in `resources`, which is its apply order.
    pub fn index(&self) -> usize {
        self.position as usize
    }

    /// The resource's type.
    pub fn kind(&self) -> Kind {
        self.spec.kind()
    }

    /// The declared body of a file that may be kept outside the declaration, in the daemon's
    /// content file. Not of a file carrying a sealed value (opened per apply), nor of one
    /// writing keys `into` a file (merged from its text), nor of one already moved.
    pub fn movable_body(&self) -> Option<&[u8]> {
        let Spec::File(f) = &self.spec else { return None };
        if f.stored().is_some() || f.carries_secret() || f.into.is_some() {
            return None;
        }
        f.inline_body()
    }

    /// Notes that this file's body is kept at `stored`, and drops it from the resource.
    /// Nothing for a resource that is not a file.
    pub fn body_moved(&mut self, stored: Stored) {
        if let Spec::File(f) = &mut self.spec {
            f.moved(stored);
        }
    }

    /// What a person would call the thing on the machine: a path, a unit, a name, a port.
    pub fn target(&self) -> String {
        self.spec.target()
    }
}

impl Declaration {
    /// Parses and validates; any problem refuses the whole declaration.
    pub fn parse(bytes: &[u8]) -> Result<Declaration, Refused> {
        validate::parse(bytes)
    }

    /// As `parse`, handing each resource to `keep` as soon as it is validated
    /// (`parse_sources_keeping`): one document, its problems named without a source.
    pub fn parse_keeping(
        bytes: &[u8],
        keep: &(dyn Fn(&mut Resource) + Sync),
    ) -> Result<Declaration, Refused> {
        validate::parse_sources(&[(None, bytes)], keep)
    }

    /// Parses several named documents as one declaration, in the order given (a directory's
    /// `*.json` files, sorted by name). Problems name their document.
    pub fn parse_sources(sources: &[(String, Vec<u8>)]) -> Result<Declaration, Refused> {
        Declaration::parse_sources_keeping(sources, &|_| {})
    }

    /// As `parse_sources`, handing each resource to `keep` as soon as it is validated, before
    /// the next is read: how the daemon moves each file's body out of the heap while the
    /// declaration is parsed (`controller::contents`), so that the bodies of 100,000 files are
    /// never all in memory beside the declaration's text. `keep` may be called from two threads
    /// at once, in no particular order; it is called for resources of a declaration that is
    /// then refused, too.
    pub fn parse_sources_keeping(
        sources: &[(String, Vec<u8>)],
        keep: &(dyn Fn(&mut Resource) + Sync),
    ) -> Result<Declaration, Refused> {
        let refs: Vec<(Option<&str>, &[u8])> =
            sources.iter().map(|(name, bytes)| (Some(name.as_str()), bytes.as_slice())).collect();
        validate::parse_sources(&refs, keep)
    }

    /// The resource with this id, if it is declared.
    pub fn get(&self, id: &Id) -> Option<&Resource> {
        self.find(id.as_str())
    }

    /// Looks an id up by its text.
    pub fn find(&self, id: &str) -> Option<&Resource> {
        candidates(&self.by_id, hash_of(id)).map(|i| &self.resources[i]).find(|r| r.id.as_str() == id)
    }

    /// The file, directory or archive declared at exactly this path.
    pub fn at_path(&self, path: &Path) -> Option<&Resource> {
        candidates(&self.by_path, hash_of(path))
            .map(|i| &self.resources[i])
            .find(|r| r.spec.path().is_some_and(|p| p == path))
    }

    /// Resources that name `id` in restart-on or reload-on, in declaration order.
    pub fn dependents<'a>(&'a self, id: &'a Id) -> impl Iterator<Item = &'a Resource> + 'a {
        self.named_by.get(id).into_iter().flatten().map(|&i| &self.resources[i])
    }

    /// The indexes a reconcile of `ids` selects: each declared one, and whatever restarts or
    /// reloads on it, transitively. Ids not declared select nothing. It is also the core of a
    /// key's claim, which keeps two reconciles off one resource (docs/concurrency.md, "Concurrent
    /// reconciles").
    pub fn closure<'a>(&'a self, ids: impl IntoIterator<Item = &'a Id>) -> std::collections::BTreeSet<usize> {
        let mut selected = std::collections::BTreeSet::new();
        let mut todo: Vec<&Id> = ids.into_iter().collect();
        while let Some(id) = todo.pop() {
            if let Some(r) = self.get(id) {
                if selected.insert(r.index()) {
                    todo.extend(self.dependents(&r.id).map(|d| &d.id));
                }
            }
        }
        selected
    }

    /// Whether anything in it talks to the container runtime (the controller then follows the
    /// runtime's events). A node without containers never talks to the runtime, nor reports its
    /// watcher down (docs/decisions.md, "The daemon").
    pub fn needs_container_runtime(&self) -> bool {
        self.resources.iter().any(|r| r.spec.uses_containers())
    }

    /// The first declared opening: reconciling it loads the host's filter, which is made from
    /// every opening at once, and a hand change outside every opening's rules is told on it
    /// (docs/decisions.md, "The daemon follows the table"). `None` when nothing is opened.
    pub fn first_opening(&self) -> Option<&Id> {
        self.resources.iter().find(|r| r.kind() == Kind::Opening).map(|r| &r.id)
    }

    /// The scheduled steps, with their cron expressions.
    pub fn scheduled_steps(&self) -> impl Iterator<Item = (&Id, &Cron)> + '_ {
        self.scheduled.iter().filter_map(|&i| {
            let r = &self.resources[i];
            r.spec.schedule().map(|c| (&r.id, c))
        })
    }

    /// The files whose declared body may be kept outside the declaration, in the daemon's
    /// content file, with that body: by index (`Resource::movable_body`).
    pub fn movable_bodies(&self) -> impl Iterator<Item = (usize, &[u8])> + '_ {
        self.resources.iter().filter_map(|r| r.movable_body().map(|body| (r.index(), body)))
    }

    /// Notes that the body of the file at `index` is kept at `stored`, and drops it from the
    /// declaration. Nothing for a resource that is not a file.
    pub fn body_moved(&mut self, index: usize, stored: Stored) {
        if let Some(r) = self.resources.get_mut(index) {
            r.body_moved(stored);
        }
    }

    /// The container names declared, with their resources' ids.
    pub fn container_names(&self) -> impl Iterator<Item = (&Id, &Name)> + '_ {
        self.resources.iter().filter_map(|r| {
            let Spec::Container(c) = &r.spec else { return None };
            Some((&r.id, &c.name))
        })
    }

    /// The declared bytes of files held in the declaration itself, not in a content file.
    pub fn inline_bytes(&self) -> usize {
        self.resources.iter().map(|r| r.spec.inline_bytes()).sum()
    }

    /// The gates (actions and run-once steps), in declaration order.
    pub fn gates(&self) -> impl Iterator<Item = &Resource> + '_ {
        self.gates.iter().map(|&i| &self.resources[i])
    }

    pub(crate) fn new(resources: Vec<Resource>, adoption: Option<Adoption>) -> Declaration {
        let by_id = table(resources.iter().map(|r| (hash_of(r.id.as_str()), r.index())));
        let by_path = table(resources.iter().filter_map(|r| r.spec.path().map(|p| (hash_of(p), r.index()))));
        let mut named_by: HashMap<Id, Vec<usize>> = HashMap::new();
        for r in &resources {
            let mut names: Vec<&Id> = r.spec.restart_on().iter().chain(r.spec.reload_on()).collect();
            names.dedup();
            for id in names {
                let list = named_by.entry(id.clone()).or_default();
                if list.last() != Some(&r.index()) {
                    list.push(r.index());
                }
            }
        }
        let gates = resources.iter().filter(|r| r.spec.is_gate()).map(|r| r.index()).collect();
        let scheduled = resources.iter().filter(|r| r.spec.schedule().is_some()).map(|r| r.index()).collect();
        Declaration { resources, adoption, by_id, by_path, named_by, gates, scheduled }
    }
}

/// The digest of some bytes: the one digest format in records and reports.
pub fn digest(bytes: &[u8]) -> Digest {
    Digest::of(bytes)
}

/// A fixed hash (std's SipHash with its fixed keys): the tables below are rebuilt with each
/// declaration and never leave the process, so no seed is needed.
fn hash_of<T: Hash + ?Sized>(key: &T) -> u32 {
    let mut h = std::hash::DefaultHasher::new();
    key.hash(&mut h);
    (h.finish() >> 32) as u32
}

/// A sorted table of (hash, position).
fn table(entries: impl Iterator<Item = (u32, usize)>) -> Vec<(u32, u32)> {
    let mut t: Vec<(u32, u32)> =
        entries.map(|(h, i)| (h, u32::try_from(i).expect("fewer than 2^32 resources"))).collect();
    t.sort_unstable();
    t.shrink_to_fit();
    t
}

/// The positions whose key hashes to `hash`: usually one, and the caller compares the key.
fn candidates(table: &[(u32, u32)], hash: u32) -> impl Iterator<Item = usize> + '_ {
    let from = table.partition_point(|&(h, _)| h < hash);
    table[from..].iter().take_while(move |&&(h, _)| h == hash).map(|&(_, i)| i as usize)
}
