//! `network`: a container network, present.
//!
//! Presence is the whole of its state: nothing about a network can be declared beyond its
//! name, so there is nothing else to disagree with. A network found already there but made
//! by someone else is used as it is, and is never removed by the host (it carries no
//! `mesh-host.id` label; docs/containers.md, "Networks").

use std::collections::HashMap;

use super::{begin, Ctx, Error, Facts, Step, Target, Verb};
use crate::declaration::{Kind, Network, Resource};
use crate::system::docker::ID_LABEL;

pub(super) fn apply(ctx: &mut Ctx<'_>, r: &Resource, n: &Network) -> Result<Step, Error> {
    let name = n.name.as_str();
    let docker = ctx.docker()?;
    let record = ctx.store.get(r.id.as_str()).filter(|rec| rec.kind == Kind::Network);
    if let Some(found) = docker.network(name)? {
        let detail = (!found.labels.contains_key(ID_LABEL)).then(|| {
            "already there, made outside mesh-host: used as it is, and not removed when no longer declared"
                .to_owned()
        });
        return Ok(Step::Done(begin(r, Verb::Unchanged, detail), Some(Facts::default())));
    }
    let (action, detail) = match record {
        Some(_) => (Verb::Corrected, Some("it had been removed on the machine; created again".to_owned())),
        None => (Verb::Created, None),
    };
    if ctx.opts.dry_run {
        return Ok(Step::Done(begin(r, action, detail), None));
    }
    docker.create_network(name, HashMap::from([(ID_LABEL.to_owned(), r.id.to_string())]))?;
    // Read back: a network reported made and not there leaves every container that joins it
    // failing to start, with the cause one step away.
    if docker.network(name)?.is_none() {
        return Err(Error::Vanished { target: Target::Network(name.to_owned()), did: "created" });
    }
    Ok(Step::Done(begin(r, action, detail), Some(Facts::default())))
}
