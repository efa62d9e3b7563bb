//! Which firewall is in force on an adopted node, looked for before the pass changes anything.

use crate::apply::{Error, FoundUnreadable};
use crate::system::firewall;
use crate::system::firewalld::{self, Firewalld};
use crate::system::ufw;

/// The firewall found in force on an adopted node, looked for before anything else.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::apply) enum Found {
    /// Nothing filters the input hook but, perhaps, the host's own table.
    Nothing,
    /// ufw is active: openings are made in it.
    Ufw,
    /// firewalld is running: openings are made in it.
    Firewalld,
}

/// Which firewall is in force here, or why the declaration is refused: any filter on the
/// input hook other than ufw's, firewalld's and the host's own, named. firewalld is looked for
/// on `bus` (the system bus when `None`), where the agent also reaches systemd: its bus name
/// having an owner is what "running" means. A bus that cannot be reached has no firewalld on
/// it; a firewalld running all the same is then found as the filter it loaded, and refused
/// (docs/decisions.md, "firewalld is found running"; "Any other filter in force").
pub(super) fn found_firewall(bus: Option<&str>) -> Result<Found, Error> {
    let unknown = |e: FoundUnreadable| Error::FirewallUnknown(e);
    if ufw::active().map_err(|e| unknown(e.into()))? {
        return Ok(Found::Ufw);
    }
    match Firewalld::running(bus) {
        Ok(Some(_)) => return Ok(Found::Firewalld),
        Ok(None) | Err(firewalld::Error::Connect { .. }) => {}
        Err(e) => return Err(unknown(e.into())),
    }
    // nft lists only nftables' chains: a filter made with iptables-legacy is looked for apart.
    let mut chains = firewall::input_chains().map_err(|e| unknown(e.into()))?;
    chains.extend(firewall::legacy_input_chains().map_err(|e| unknown(e.into()))?);
    let in_force: Vec<String> = chains
        .into_iter()
        .filter(|c| c.policy != "accept" || c.rules > 0)
        .map(|c| {
            format!(
                "table {} {} chain {} (policy {}, {} rules)",
                c.family, c.table, c.chain, c.policy, c.rules
            )
        })
        .collect();
    if in_force.is_empty() {
        Ok(Found::Nothing)
    } else {
        Err(Error::ForeignFilter { chains: in_force })
    }
}
