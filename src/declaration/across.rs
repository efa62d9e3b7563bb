//! The rules between resources, checked once every resource is read: an id given once, one
//! resource per thing held on the machine (a path, a unit, a container's name), and references
//! (`restart-on`, `reload-on`) that name a declared resource other than their own.

use std::collections::{BTreeSet, HashMap};

use super::error::Problems;
use super::model::Kind;
use super::types::Id;
use super::Resource;

/// Rules between resources: unique ids, one owner per path or name, references that resolve.
pub(super) fn across(resources: &[Resource], problems: &mut Problems, name: &dyn Fn(usize) -> String) {
    let mut ids: HashMap<&Id, usize> = HashMap::with_capacity(resources.len());
    for r in resources {
        if let Some(first) = ids.insert(&r.id, r.index()) {
            ids.insert(&r.id, first);
            problems.at(
                Some(r.index()),
                Some(r.id.as_str()),
                Some("id"),
                format!("duplicate id: {} already has it", name(first)),
            );
        }
    }

    // Two resources that would each hold the same thing on the machine would fight for it on
    // every reconcile; that is a declaration error, not something to find out in production
    // (docs/decisions.md, "Two resources may not hold the same thing").
    let mut targets: HashMap<(&'static str, String), usize> = HashMap::with_capacity(resources.len());
    for r in resources {
        let class = match r.kind() {
            // An archive is unpacked into a directory, which may well be declared too.
            Kind::Directory | Kind::File => Some("path"),
            Kind::Archive => Some("archive"),
            Kind::Container => Some("container"),
            Kind::Network => Some("network"),
            Kind::User => Some("user"),
            Kind::Process => Some("process"),
            Kind::Service => Some("unit"),
            Kind::Opening => Some("opening"),
            Kind::Access | Kind::Package | Kind::Action => None,
        };
        if let Some(class) = class {
            if let Some(first) = targets.insert((class, r.target()), r.index()) {
                targets.insert((class, r.target()), first);
                problems.at(
                    Some(r.index()),
                    Some(r.id.as_str()),
                    Some(target_field(r.kind())),
                    format!("{:?} is already declared by {}", r.target(), name(first)),
                );
            }
        }
    }

    for r in resources {
        // The verb follows the list, so a `reload-on` problem does not speak of restarting.
        for (field, verb, list) in
            [("restart-on", "restart", r.spec.restart_on()), ("reload-on", "reload", r.spec.reload_on())]
        {
            let mut seen = BTreeSet::new();
            for (i, named) in list.iter().enumerate() {
                let field = format!("{field}[{i}]");
                if named == &r.id {
                    problems.at(
                        Some(r.index()),
                        Some(r.id.as_str()),
                        Some(&field),
                        format!("a resource cannot {verb} on itself"),
                    );
                } else if !ids.contains_key(named) {
                    problems.at(
                        Some(r.index()),
                        Some(r.id.as_str()),
                        Some(&field),
                        format!("{:?} is not declared", named.as_str()),
                    );
                } else if !seen.insert(named) {
                    problems.at(
                        Some(r.index()),
                        Some(r.id.as_str()),
                        Some(&field),
                        format!("{:?} is named twice", named.as_str()),
                    );
                }
            }
        }
    }
}

fn target_field(kind: Kind) -> &'static str {
    match kind {
        Kind::Directory | Kind::File | Kind::Archive | Kind::Access => "path",
        Kind::Service => "unit",
        Kind::Opening => "port",
        Kind::Package => "package",
        Kind::Action => "command",
        Kind::Container | Kind::Network | Kind::User | Kind::Process => "name",
    }
}
