//! What a change on the machine means: which keys to reconcile.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fmt;
use std::path::Path;
use std::sync::Arc;

use mesh_host_watchers::{Change, Watcher};

use crate::declaration::{Declaration, Id};

/// What the worker reconciles.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Key {
    /// Everything, orphans included.
    Full,
    /// The declaration settled: read it, put it in force if it is valid, then everything.
    Declaration,
    /// One resource, and whatever names it in restart-on or reload-on.
    Resource(Id),
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Key::Full => f.write_str("full"),
            Key::Declaration => f.write_str("declaration"),
            Key::Resource(id) => write!(f, "{id}"),
        }
    }
}

/// What on the machine belongs to which resource.
#[derive(Default)]
pub struct Index {
    /// The declaration in force, whose own table finds the resource managing a path: no copy
    /// of ten thousand paths is kept here.
    declaration: Option<Arc<Declaration>>,
    /// systemd units (a service's, a process's transient one) to the resources that own them.
    units: HashMap<String, Id>,
    /// Containers by the resource id on their `mesh-host.id` label, and by name: a container
    /// adopted from a bundle keeps its old id on its label until it is recreated
    /// (docs/decisions.md, "The daemon").
    containers: HashSet<Id>,
    container_names: HashMap<String, Id>,
    /// The opening whose reconcile loads the host's filter (every opening is loaded with it).
    opening: Option<Id>,
    /// The declaration in force is refused whole on this machine (a firewall found that the
    /// host cannot manage): a change anywhere in the ruleset may have lifted that, so it
    /// brings a full pass. Set by the worker after each full pass; false in a new index.
    pub refused: bool,
}

impl Index {
    pub fn new(d: &Arc<Declaration>) -> Index {
        let mut units = HashMap::new();
        let mut containers = HashSet::new();
        let mut container_names = HashMap::new();
        for (id, name) in d.container_names() {
            containers.insert(id.clone());
            container_names.insert(name.to_string(), id.clone());
        }
        for r in &d.resources {
            if let Some(unit) = r.spec.unit() {
                units.insert(unit, r.id.clone());
            }
        }
        let opening = d.first_opening().cloned();
        Index {
            declaration: Some(Arc::clone(d)),
            units,
            containers,
            container_names,
            opening,
            refused: false,
        }
    }

    /// Whether a full pass of the declaration in force looks for a firewall found on the
    /// machine: an adopted node's declaration that opens a port (`opening::look_for_firewall`).
    /// A change in the ruleset may then be a filter the host cannot manage, put in force since.
    fn looks_for_firewall(&self) -> bool {
        self.opening.is_some() && self.declaration.as_ref().is_some_and(|d| d.adoption.is_some())
    }

    /// The systemd units the declaration manages, for the systemd watcher.
    pub fn units(&self) -> BTreeSet<String> {
        self.units.keys().cloned().collect()
    }

    /// The paths the declaration manages, for the file watcher.
    pub fn paths(&self) -> impl Iterator<Item = &Path> + '_ {
        self.declaration.iter().flat_map(|d| d.resources.iter().filter_map(|r| r.spec.path()))
    }

    /// The resource managing exactly this path.
    fn at_path(&self, path: &Path) -> Option<&Id> {
        self.declaration.as_ref()?.at_path(path).map(|r| &r.id)
    }
}

/// What queued a key: the `source` label of `mesh_host_queue_adds_total`. A closed set, so the
/// metric is created at 0 for each (`ALL`) and the first add is seen by `increase()`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The file watcher: a managed path moved, or it overflowed.
    File,
    /// The declaration source settled.
    Declaration,
    /// The systemd watcher: a unit moved, or it reconnected.
    Systemd,
    /// The Docker watcher: a container event, or it reconnected.
    Docker,
    /// `nft monitor`: the host's table moved, or the ruleset did while refused.
    Firewall,
    /// The periodic resync.
    Resync,
}

impl Source {
    /// Every source, in the order the metric lists them.
    pub const ALL: [Source; 6] = [
        Source::File,
        Source::Declaration,
        Source::Systemd,
        Source::Docker,
        Source::Firewall,
        Source::Resync,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::File => "file",
            Source::Declaration => "declaration",
            Source::Systemd => "systemd",
            Source::Docker => "docker",
            Source::Firewall => "firewall",
            Source::Resync => "resync",
        }
    }

    /// The source for a watcher that says it resynced.
    fn of_watcher(watcher: Watcher) -> Source {
        match watcher {
            Watcher::File => Source::File,
            Watcher::Systemd => Source::Systemd,
            Watcher::Docker => Source::Docker,
            Watcher::Firewall => Source::Firewall,
        }
    }
}

/// The keys a change adds, each with the source label for `mesh_host_queue_adds_total`.
pub fn keys(change: &Change, index: &Index) -> Vec<(Key, Source)> {
    match change {
        Change::Path(path) => {
            index.at_path(path).map(|id| (Key::Resource(id.clone()), Source::File)).into_iter().collect()
        }
        Change::SourceChanged { .. } => vec![(Key::Declaration, Source::Declaration)],
        Change::Resynced { watcher } => vec![(Key::Full, Source::of_watcher(*watcher))],
        Change::Unit { unit } => {
            index.units.get(unit).map(|id| (Key::Resource(id.clone()), Source::Systemd)).into_iter().collect()
        }
        Change::Container { id_label, name, .. } => Id::parse(id_label)
            .ok()
            .filter(|id| index.containers.contains(id))
            .or_else(|| index.container_names.get(name).cloned())
            .map(|id| (Key::Resource(id), Source::Docker))
            .into_iter()
            .collect(),
        // The host's table moved: the filter is one, so reconciling its first opening loads
        // it whole. Nothing declared opened, nothing to put back (docs/firewall.md, "The host's
        // filter"; docs/decisions.md, "The daemon follows the table").
        Change::Firewall => {
            index.opening.iter().map(|id| (Key::Resource(id.clone()), Source::Firewall)).collect()
        }
        // Elsewhere in the ruleset (ufw or firewalld enabled or disabled, a foreign table
        // added or removed, Docker's own rules): it matters where a found firewall is looked
        // for, which a full pass does. While refused, so the refusal lifts once the filter
        // goes; and on an adopted node that opens ports, so a foreign filter put in force
        // after a clean pass refuses the declaration now, not at the next resync (issue 45,
        // point 7; docs/decisions.md, "The daemon").
        Change::Ruleset if index.refused || index.looks_for_firewall() => vec![(Key::Full, Source::Firewall)],
        Change::Ruleset | Change::Up { .. } => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_managed_path_is_its_resource_and_others_are_nothing() {
        let d = Declaration::parse(
            br#"{"version": 1, "resources": [
                {"type": "directory", "id": "a.dir", "path": "/srv/a"},
                {"type": "file", "id": "a.conf", "path": "/srv/a/conf", "content": "x"},
                {"type": "access", "id": "a.media", "path": "/srv/media"},
                {"type": "service", "id": "a.web", "unit": "nginx.service", "state": "running"},
                {"type": "process", "id": "a.worker", "name": "worker", "command": ["/bin/sleep", "9"]},
                {"type": "container", "id": "a.app", "name": "app", "image": "local/app:1"},
                {"type": "opening", "id": "a.http", "port": 80},
                {"type": "opening", "id": "a.https", "port": 443}
            ]}"#,
        )
        .unwrap();
        let index = Index::new(&Arc::new(d));
        let id = |s: &str| Key::Resource(Id::parse(s).unwrap());
        assert_eq!(keys(&Change::Path("/srv/a/conf".into()), &index), vec![(id("a.conf"), Source::File)]);
        assert_eq!(keys(&Change::Path("/srv/a".into()), &index), vec![(id("a.dir"), Source::File)]);
        assert!(keys(&Change::Path("/srv/media".into()), &index).is_empty());
        assert!(keys(&Change::Path("/srv/a/.conf.mesh-host-1-2".into()), &index).is_empty());
        assert_eq!(
            keys(&Change::Resynced { watcher: Watcher::File }, &index),
            vec![(Key::Full, Source::File)]
        );
        assert_eq!(
            keys(&Change::Unit { unit: "nginx.service".into() }, &index),
            vec![(id("a.web"), Source::Systemd)]
        );
        assert_eq!(
            keys(&Change::Unit { unit: "mesh-host-worker.service".into() }, &index),
            vec![(id("a.worker"), Source::Systemd)]
        );
        assert!(keys(&Change::Unit { unit: "sshd.service".into() }, &index).is_empty());
        assert_eq!(index.units().len(), 2);
        let container = |id_label: &str, name: &str| Change::Container {
            id_label: id_label.into(),
            name: name.into(),
            action: "die".into(),
        };
        assert_eq!(keys(&container("a.app", "app"), &index), vec![(id("a.app"), Source::Docker)]);
        assert_eq!(
            keys(&container("store", "app"), &index),
            vec![(id("a.app"), Source::Docker)],
            "found by name"
        );
        assert!(keys(&container("other", "other"), &index).is_empty());
        assert_eq!(
            keys(&Change::Firewall, &index),
            vec![(id("a.http"), Source::Firewall)],
            "the filter is one"
        );
        assert!(keys(&Change::Firewall, &Index::default()).is_empty(), "nothing opened");
        assert!(keys(&Change::Ruleset, &index).is_empty(), "a change elsewhere is not the host's");
        let adopted = Declaration::parse(
            br#"{"version": 1, "adoption": {"taken": []}, "resources": [
                {"type": "file", "id": "a.conf", "path": "/srv/a/conf", "content": "x"},
                {"type": "opening", "id": "a.http", "port": 80}
            ]}"#,
        )
        .unwrap();
        assert_eq!(
            keys(&Change::Ruleset, &Index::new(&Arc::new(adopted))),
            vec![(Key::Full, Source::Firewall)],
            "on an adopted node that opens ports, a change in the ruleset looks for a foreign filter"
        );
        let refused = Index { refused: true, ..Index::new(index.declaration.as_ref().unwrap()) };
        assert_eq!(
            keys(&Change::Ruleset, &refused),
            vec![(Key::Full, Source::Firewall)],
            "while refused, any change in the ruleset looks again"
        );
        assert_eq!(
            keys(&Change::SourceChanged { source: "/etc/mesh-host/declaration.d".into() }, &index),
            vec![(Key::Declaration, Source::Declaration)]
        );
        // Every source seen here is one the metric starts at 0 for.
        let changes = [
            Change::Path("/srv/a/conf".into()),
            Change::Unit { unit: "nginx.service".into() },
            container("a.app", "app"),
            Change::SourceChanged { source: "/etc/mesh-host/declaration.d".into() },
            Change::Resynced { watcher: Watcher::File },
            Change::Resynced { watcher: Watcher::Docker },
            Change::Resynced { watcher: Watcher::Systemd },
        ];
        let expected = [
            Source::File,
            Source::Systemd,
            Source::Docker,
            Source::Declaration,
            Source::File,
            Source::Docker,
            Source::Systemd,
        ];
        for (change, want) in changes.iter().zip(expected) {
            let sources: Vec<Source> = keys(change, &index).into_iter().map(|(_, s)| s).collect();
            assert_eq!(sources, vec![want], "{change:?}");
        }
        // A watcher's resync is counted under its own name, never as the periodic resync.
        for w in Watcher::ALL {
            assert_eq!(Source::of_watcher(w).as_str(), w.as_str());
        }
    }
}
