//! The machine's packet filter: nftables, driven through the `nft` program's JSON (the JSON
//! API of libnftables), and the sockets listening in the agent's network namespace.
//!
//! The host owns one table, `inet mesh_host`. Everything here that writes names that table and
//! nothing else: a batch is built by the caller and checked here to touch no other table before
//! it is handed to nft, which applies a batch as one kernel transaction (all of it or none).
//!
//! Why `nft -j` and not the `nftables` crate or netlink: the batches are a handful of rule
//! shapes, and reading the table back as untyped JSON means a rule added by hand, whatever
//! expression it uses, is seen as a difference rather than failing a typed parse.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde_json::{json, Value};

use super::command::{self, run_fed, run_str, Ran};

/// The family of the host's own table.
pub const FAMILY: &str = "inet";
/// The name of the host's own table.
pub const TABLE: &str = "mesh_host";

/// What nft answered when it was asked to read or change the ruleset.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// nft could not be run, or did not finish in time.
    #[error(transparent)]
    Command(#[from] command::Error),
    /// nft ran and failed.
    #[error("nft could not {what}: it {how}")]
    Nft {
        /// What it was asked to do ("list tables").
        what: &'static str,
        /// How it ended: its exit and what it printed.
        how: String,
    },
    /// nft's JSON output could not be read.
    #[error("nft printed something that is not its JSON while it {what}: {why}")]
    Json {
        /// What it was asked to do.
        what: &'static str,
        /// What is wrong with the output.
        why: String,
    },
    /// An iptables-legacy filter table the kernel lists could not be read.
    #[error("the kernel lists an iptables-legacy filter table and {tool} could not read it: it {how}")]
    Legacy {
        /// The program asked (`iptables-legacy-save`).
        tool: &'static str,
        /// How it ended.
        how: String,
    },
    /// A batch that would touch something outside the host's own table: a bug, refused before
    /// nft sees it.
    #[error("refused to load a batch that names {found}: the host changes only table inet mesh_host")]
    OutsideTable {
        /// What the batch names outside the table.
        found: String,
    },
}

/// The objects of the host's table as nft lists them (the table itself, its chains, rules and
/// anything else found in it), or `None` when the table is absent.
pub fn read_table() -> Result<Option<Vec<Value>>, Error> {
    let ran = run_str(&["nft", "-j", "list", "table", FAMILY, TABLE], &[])?;
    if !ran.success() {
        // nft says "No such file or directory" for a table that is not there; anything else is
        // a real failure. Asking for the list of tables settles which, without parsing words.
        if present()? {
            return Err(Error::Nft { what: "list table inet mesh_host", how: ran.describe() });
        }
        return Ok(None);
    }
    let objects = objects(&ran, "listed table inet mesh_host")?;
    Ok(Some(objects))
}

/// Whether the host's table exists.
fn present() -> Result<bool, Error> {
    let ran = run_str(&["nft", "-j", "list", "tables"], &[])?;
    if !ran.success() {
        return Err(Error::Nft { what: "list tables", how: ran.describe() });
    }
    Ok(objects(&ran, "listed the tables")?
        .iter()
        .any(|o| o.get("table").is_some_and(|t| t["family"] == FAMILY && t["name"] == TABLE)))
}

/// The objects of an `nft -j` listing, without its metainfo.
fn objects(ran: &Ran, what: &'static str) -> Result<Vec<Value>, Error> {
    let doc: Value =
        serde_json::from_str(&ran.stdout).map_err(|e| Error::Json { what, why: e.to_string() })?;
    let Some(list) = doc.get("nftables").and_then(Value::as_array) else {
        return Err(Error::Json { what, why: "no \"nftables\" list".into() });
    };
    Ok(list.iter().filter(|o| o.get("metainfo").is_none()).cloned().collect())
}

/// Applies `commands` (nft JSON commands: `{"add": {...}}`, `{"delete": {...}}`) as one
/// transaction. Every command must name the host's table; one that does not refuses the batch.
pub fn load(commands: Vec<Value>) -> Result<(), Error> {
    for c in &commands {
        confined(c)?;
    }
    let batch = json!({ "nftables": commands });
    let ran = run_fed(&["nft", "-j", "-f", "-"], batch.to_string().into_bytes())?;
    if !ran.success() {
        return Err(Error::Nft { what: "load table inet mesh_host", how: ran.describe() });
    }
    Ok(())
}

/// Removes the host's table, whether it is there or not (adding it first makes the removal
/// one that cannot fail for its absence; both are one transaction).
pub fn remove_table() -> Result<(), Error> {
    let table = json!({"table": {"family": FAMILY, "name": TABLE}});
    load(vec![json!({ "add": table.clone() }), json!({ "delete": table })])
}

/// Checks that a command names only the host's table.
fn confined(command: &Value) -> Result<(), Error> {
    let objects = command.as_object().into_iter().flat_map(|c| c.values()).filter_map(Value::as_object);
    let mut any = false;
    for object in objects {
        for (kind, body) in object {
            any = true;
            let (family, table) = if kind == "table" {
                (body.get("family"), body.get("name"))
            } else {
                (body.get("family"), body.get("table"))
            };
            if family.and_then(Value::as_str) != Some(FAMILY) || table.and_then(Value::as_str) != Some(TABLE)
            {
                return Err(Error::OutsideTable { found: format!("{kind} {body}") });
            }
        }
    }
    if any {
        Ok(())
    } else {
        Err(Error::OutsideTable { found: format!("a command without a table: {command}") })
    }
}

/// A base chain on the input hook found on the machine, with what makes it a filter in force.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InputChain {
    /// The table's family (`inet`, `ip`, ...).
    pub family: String,
    /// The table's name.
    pub table: String,
    /// The chain's name.
    pub chain: String,
    /// Its policy (`accept` or `drop`).
    pub policy: String,
    /// How many rules it holds.
    pub rules: usize,
}

/// Every base chain on the input hook of the ip, ip6 and inet families, outside the host's
/// own table, with its policy and how many rules it holds.
pub fn input_chains() -> Result<Vec<InputChain>, Error> {
    let ran = run_str(&["nft", "-j", "list", "ruleset"], &[])?;
    if !ran.success() {
        return Err(Error::Nft { what: "list the ruleset", how: ran.describe() });
    }
    let objects = objects(&ran, "listed the ruleset")?;
    let mut chains: Vec<InputChain> = objects
        .iter()
        .filter_map(|o| o.get("chain"))
        .filter(|c| c["hook"] == "input" && ["ip", "ip6", "inet"].iter().any(|f| c["family"] == *f))
        .filter(|c| !(c["family"] == FAMILY && c["table"] == TABLE))
        .map(|c| InputChain {
            family: text(&c["family"]),
            table: text(&c["table"]),
            chain: text(&c["name"]),
            policy: c.get("policy").map_or_else(|| "accept".to_owned(), text),
            rules: 0,
        })
        .collect();
    for rule in objects.iter().filter_map(|o| o.get("rule")).filter(|r| !only_into_ufw(r)) {
        if let Some(c) = chains.iter_mut().find(|c| {
            rule["family"] == c.family.as_str()
                && rule["table"] == c.table.as_str()
                && rule["chain"] == c.chain.as_str()
        }) {
            c.rules += 1;
        }
    }
    Ok(chains)
}

/// The INPUT chains of the iptables-legacy filter tables (IPv4 and IPv6) in the agent's network
/// namespace, reported as `input_chains` reports nftables' own. nft does not see them: a filter
/// made with iptables-legacy lives in the kernel's older x_tables, not in nftables. A table is
/// read only when the kernel lists it (`/proc/net/ip_tables_names`): asking iptables-legacy
/// about a table that is absent would make it. A table listed that cannot be read (no
/// `iptables-legacy-save`) is an error, so a filter that may be in force is never taken for
/// none.
pub fn legacy_input_chains() -> Result<Vec<InputChain>, Error> {
    let mut chains = Vec::new();
    for (names, tool, family) in [
        ("/proc/net/ip_tables_names", "iptables-legacy-save", "ip"),
        ("/proc/net/ip6_tables_names", "ip6tables-legacy-save", "ip6"),
    ] {
        // Absent: the kernel has no x_tables for this family, so no legacy filter either.
        let Ok(listed) = std::fs::read_to_string(names) else { continue };
        if !listed.lines().any(|l| l.trim() == "filter") {
            continue;
        }
        let ran = run_str(&[tool, "-t", "filter"], &[]).map_err(|e| Error::Legacy {
            tool,
            how: format!("could not be run ({e}); it comes with the iptables package"),
        })?;
        if !ran.success() {
            return Err(Error::Legacy { tool, how: ran.describe() });
        }
        chains.extend(legacy_input(&ran.stdout, family));
    }
    Ok(chains)
}

/// The INPUT chain of an `iptables-legacy-save -t filter` listing: its policy and its rules,
/// not counting the jumps a disabled ufw leaves into the chains it emptied.
pub(crate) fn legacy_input(save: &str, family: &str) -> Option<InputChain> {
    let policy = save.lines().find_map(|l| l.strip_prefix(":INPUT "))?.split(' ').next()?.to_lowercase();
    let rules = save
        .lines()
        .filter_map(|l| l.strip_prefix("-A INPUT "))
        .filter(|rest| {
            let words: Vec<&str> = rest.split(' ').collect();
            !matches!(words.as_slice(), ["-j" | "-g", target] if target.starts_with("ufw-") || target.starts_with("ufw6-"))
        })
        .count();
    Some(InputChain {
        family: family.to_owned(),
        table: "filter (iptables-legacy)".to_owned(),
        chain: "INPUT".to_owned(),
        policy,
        rules,
    })
}

/// Whether a rule only jumps into one of ufw's chains (counting on the way): what a disabled
/// ufw leaves in INPUT, jumps to chains it emptied, which filter nothing. With ufw active the
/// chains hold its rules, and ufw is found as itself before this is asked.
fn only_into_ufw(rule: &Value) -> bool {
    let Some(expr) = rule.get("expr").and_then(Value::as_array) else { return false };
    let into_ufw = |e: &Value| {
        ["jump", "goto"].iter().any(|k| {
            e.get(*k)
                .and_then(|j| j.get("target"))
                .and_then(Value::as_str)
                .is_some_and(|t| t.starts_with("ufw-") || t.starts_with("ufw6-"))
        })
    };
    expr.iter().any(into_ufw) && expr.iter().all(|e| into_ufw(e) || e.get("counter").is_some())
}

fn text(v: &Value) -> String {
    v.as_str().map_or_else(|| v.to_string(), str::to_owned)
}

/// The transport of a socket or an opening.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Transport {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
}

impl Transport {
    /// The transport as nft and `/proc/net` name it.
    pub fn as_str(self) -> &'static str {
        match self {
            Transport::Tcp => "tcp",
            Transport::Udp => "udp",
        }
    }
}

/// A socket waiting for connections (TCP in LISTEN) or datagrams (UDP, bound and unconnected).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Listener {
    /// TCP or UDP.
    pub transport: Transport,
    /// The address it is bound to; the unspecified address for every one.
    pub addr: IpAddr,
    /// The port.
    pub port: u16,
}

/// The sockets listening in the agent's network namespace (`/proc/net` is the reader's own).
pub fn listening() -> std::io::Result<Vec<Listener>> {
    let mut found = Vec::new();
    for (file, transport) in [
        ("/proc/net/tcp", Transport::Tcp),
        ("/proc/net/tcp6", Transport::Tcp),
        ("/proc/net/udp", Transport::Udp),
        ("/proc/net/udp6", Transport::Udp),
    ] {
        match std::fs::read_to_string(file) {
            Ok(text) => found.extend(parse_sockets(&text, transport)),
            // A kernel without IPv6 has no tcp6.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(std::io::Error::new(e.kind(), format!("cannot read {file}: {e}"))),
        }
    }
    found.sort();
    found.dedup();
    Ok(found)
}

/// The listening sockets of one `/proc/net/{tcp,udp}[6]` table. TCP's LISTEN is state 0A; a
/// UDP socket that receives from anyone is unconnected (state 07, no remote port).
pub fn parse_sockets(text: &str, transport: Transport) -> Vec<Listener> {
    let mut out = Vec::new();
    for line in text.lines().skip(1) {
        let mut fields = line.split_whitespace().skip(1);
        let (Some(local), Some(remote), Some(state)) = (fields.next(), fields.next(), fields.next()) else {
            continue;
        };
        let listening = match transport {
            Transport::Tcp => state == "0A",
            Transport::Udp => state == "07" && remote.ends_with(":0000"),
        };
        if !listening {
            continue;
        }
        if let Some((addr, port)) = parse_endpoint(local) {
            out.push(Listener { transport, addr, port });
        }
    }
    out
}

/// `0100007F:1F90` (IPv4) or 32 hex digits and a port (IPv6). The kernel prints each 32-bit
/// word of the address as a number in the machine's byte order.
fn parse_endpoint(s: &str) -> Option<(IpAddr, u16)> {
    let (addr, port) = s.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |hex: &str| u32::from_str_radix(hex, 16).ok().map(u32::to_ne_bytes);
    let addr = match addr.len() {
        8 => IpAddr::V4(Ipv4Addr::from(word(addr)?)),
        32 => {
            let mut bytes = [0u8; 16];
            for i in 0..4 {
                bytes[i * 4..i * 4 + 4].copy_from_slice(&word(addr.get(i * 8..i * 8 + 8)?)?);
            }
            IpAddr::V6(Ipv6Addr::from(bytes))
        }
        _ => return None,
    };
    Some((addr, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_legacy_input_chain_counts_its_rules_but_not_what_a_disabled_ufw_left() {
        let save = "# Generated by iptables-save\n*filter\n:INPUT DROP [0:0]\n:FORWARD ACCEPT [0:0]\n\
            -A INPUT -j ufw-before-logging-input\n-A INPUT -g ufw6-user-input\n\
            -A INPUT -p tcp -m tcp --dport 22 -j ACCEPT\n-A FORWARD -j DROP\nCOMMIT\n";
        let c = legacy_input(save, "ip").unwrap();
        assert_eq!((c.policy.as_str(), c.rules, c.chain.as_str()), ("drop", 1, "INPUT"));
        assert_eq!(c.table, "filter (iptables-legacy)");
        let empty = legacy_input("*filter\n:INPUT ACCEPT [0:0]\nCOMMIT\n", "ip6").unwrap();
        assert_eq!((empty.policy.as_str(), empty.rules), ("accept", 0), "filters nothing");
        assert_eq!(legacy_input("", "ip"), None);
    }

    #[test]
    fn listening_sockets_are_read_from_proc_net() {
        let tcp = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
           0: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1\n\
           1: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2 1\n\
           2: 0100007F:1F90 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 3 1\n";
        let found = parse_sockets(tcp, Transport::Tcp);
        assert_eq!(
            found,
            vec![
                Listener { transport: Transport::Tcp, addr: "0.0.0.0".parse().unwrap(), port: 22 },
                Listener { transport: Transport::Tcp, addr: "127.0.0.1".parse().unwrap(), port: 8080 },
            ],
            "an established connection is not a listener"
        );
        let tcp6 = "  sl  local_address                         remote_address                        st\n\
           0: 00000000000000000000000001000000:0016 00000000000000000000000000000000:0000 0A 0\n\
           1: 000080FE00000000FF005452120034FE:01BB 00000000000000000000000000000000:0000 0A 0\n";
        let found = parse_sockets(tcp6, Transport::Tcp);
        assert_eq!(found[0].addr, "::1".parse::<IpAddr>().unwrap());
        assert_eq!(found[1].addr, "fe80::5254:ff:fe34:12".parse::<IpAddr>().unwrap());
        assert_eq!(found[1].port, 443);
        let udp = "  sl  local_address rem_address   st\n\
           0: 00000000:0035 00000000:0000 07 0\n\
           1: 0100007F:0035 0200007F:0035 01 0\n";
        assert_eq!(
            parse_sockets(udp, Transport::Udp),
            vec![Listener { transport: Transport::Udp, addr: "0.0.0.0".parse().unwrap(), port: 53 }],
            "a connected datagram socket receives from its peer only"
        );
    }

    #[test]
    fn the_jumps_a_disabled_ufw_leaves_filter_nothing() {
        let jump = json!({"family": "ip", "table": "filter", "chain": "INPUT",
            "expr": [{"counter": {"packets": 0, "bytes": 0}}, {"jump": {"target": "ufw-before-input"}}]});
        assert!(only_into_ufw(&jump));
        let accept = json!({"expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}}, "right": 22}}, {"accept": null}]});
        assert!(!only_into_ufw(&accept));
        let other = json!({"expr": [{"jump": {"target": "guard"}}]});
        assert!(!only_into_ufw(&other));
    }

    #[test]
    fn a_batch_naming_another_table_is_refused() {
        let ours =
            json!({"add": {"rule": {"family": "inet", "table": "mesh_host", "chain": "input", "expr": []}}});
        assert!(confined(&ours).is_ok());
        let table = json!({"delete": {"table": {"family": "inet", "name": "mesh_host"}}});
        assert!(confined(&table).is_ok());
        for other in [
            json!({"add": {"rule": {"family": "ip", "table": "filter", "chain": "INPUT", "expr": []}}}),
            json!({"delete": {"table": {"family": "ip", "name": "mesh_host"}}}),
            json!({"flush": {"ruleset": null}}),
            json!({"flush": {}}),
        ] {
            assert!(matches!(confined(&other), Err(Error::OutsideTable { .. })), "{other}");
        }
    }
}
