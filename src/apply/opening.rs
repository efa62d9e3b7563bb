//! Openings: the host's own filter, the nftables table `inet mesh_host`.
//!
//! The filter is one thing on the machine made from many resources: every declared opening is
//! a rule (or one per `from` network) in one chain on the input hook whose policy is drop. So
//! openings are not applied one by one. The pass sets them aside, and once everything else has
//! been applied the filter is worked out from all of them, compared with the table nft lists,
//! replaced in one transaction if it differs, and read back whole. Each opening's outcome is
//! then its own part of that comparison: its rules, found by their comment (its id).
//!
//! Loading it last is the order rule (spec, "Firewalls"): what protects the node goes last on
//! the way in. It also means a declaration that adds a service and its opening never has the
//! port open before the service's files are in place (docs/decisions.md, "The filter is loaded
//! after everything else in the pass").
//!
//! On an adopted node the firewall found in force comes first (`found_firewall`): behind ufw
//! the openings are made in ufw instead (`apply_ufw`); the flip to the host's filter when
//! `adoption` goes (`flip`) and the way back when it returns are ordered so that what protects
//! the node goes last on the way in and first on the way back.
//!
//! `wanted`, `parse`, `common_drift`, `decide`, `newly_closed`, `ufw_rules` and `ufw_lets_in`
//! are pure and unit-tested; `apply`, `apply_ufw` and `flip` act through `system::firewall`
//! and `system::ufw`, and read back.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use serde_json::{json, Value};

use super::{Error, Options, Outcome, Verb};
use crate::declaration::{Cidr, Declaration, Opening, Protocol, Resource, Spec};
use crate::store::{Record, Store};
use crate::system::firewall::{self, Listener, Transport, FAMILY, TABLE};
use crate::system::firewalld::{self, Firewalld};
use crate::system::ufw;

/// The base chain's name in the host's table.
const CHAIN: &str = "input";

/// The longest comment nftables keeps on a rule. An opening's id is its rules' comment.
const COMMENT_MAX: usize = 128;

/// One rule as the host writes it and compares it: the opening it belongs to (its comment;
/// none for the rules every filter of the host's has) and its expressions.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Rule {
    pub comment: Option<String>,
    pub expr: Value,
}

/// The table as the host wants it, or as nft listed it.
#[derive(Clone, Debug, PartialEq, Default)]
pub(super) struct Table {
    /// Each chain without its handle: name, type, hook, priority, policy.
    pub chains: Vec<Value>,
    /// The rules of the chain `input`, in order.
    pub rules: Vec<Rule>,
    /// Anything else found in the table (rules of another chain, sets, maps...), described.
    pub others: Vec<String>,
}

/// The chain every filter of the host's has.
fn base_chain() -> Value {
    json!({"name": CHAIN, "type": "filter", "hook": "input", "prio": 0, "policy": "drop"})
}

fn accept_when(matches: Vec<Value>) -> Value {
    let mut expr = matches;
    expr.push(json!({"accept": null}));
    Value::Array(expr)
}

fn equals(left: Value, right: Value) -> Value {
    json!({"match": {"op": "==", "left": left, "right": right}})
}

/// What the filter accepts whatever is declared: the machine talking to itself, answers to
/// what it started, and the ICMP a network needs to work (errors, including "packet too big",
/// which path MTU discovery needs; echo, which people diagnose with; IPv6 neighbour discovery,
/// without which IPv6 does not work at all).
fn fixed_rules() -> Vec<Rule> {
    let rule = |expr| Rule { comment: None, expr };
    vec![
        rule(accept_when(vec![equals(json!({"meta": {"key": "iif"}}), json!("lo"))])),
        rule(accept_when(vec![json!({"match": {
            "op": "in", "left": {"ct": {"key": "state"}}, "right": ["established", "related"]
        }})])),
        rule(accept_when(vec![equals(
            json!({"payload": {"protocol": "icmp", "field": "type"}}),
            json!({"set": ["echo-request", "destination-unreachable", "time-exceeded", "parameter-problem"]}),
        )])),
        rule(accept_when(vec![equals(
            json!({"payload": {"protocol": "icmpv6", "field": "type"}}),
            json!({"set": [
                "destination-unreachable", "packet-too-big", "time-exceeded", "parameter-problem",
                "echo-request", "nd-router-advert", "nd-neighbor-solicit", "nd-neighbor-advert"
            ]}),
        )])),
    ]
}

pub(super) fn transport(p: Protocol) -> Transport {
    match p {
        Protocol::Tcp => Transport::Tcp,
        Protocol::Udp => Transport::Udp,
    }
}

/// A network with its host bits cleared, as nft lists it: `10.0.0.0/8` for `10.0.0.5/8`.
pub(super) fn network(c: &Cidr) -> (IpAddr, u8) {
    let addr = match c.addr {
        IpAddr::V4(a) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(c.prefix)).unwrap_or(0);
            IpAddr::V4((u32::from(a) & mask).into())
        }
        IpAddr::V6(a) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(c.prefix)).unwrap_or(0);
            IpAddr::V6((u128::from(a) & mask).into())
        }
    };
    (addr, c.prefix)
}

/// An opening's rules: one accepting its port from anywhere, or one per `from` network (a set
/// of networks would have nft merge overlapping ones, and then list something else than was
/// loaded).
pub(super) fn opening_rules(id: &str, o: &Opening) -> Vec<Rule> {
    let port = equals(
        json!({"payload": {"protocol": transport(o.protocol).as_str(), "field": "dport"}}),
        json!(o.port.get()),
    );
    let rule = |expr| Rule { comment: Some(id.to_owned()), expr };
    if o.from.is_empty() {
        return vec![rule(accept_when(vec![port]))];
    }
    let mut seen = BTreeSet::new();
    o.from
        .iter()
        .map(network)
        .filter(|n| seen.insert(*n))
        .map(|(addr, prefix)| {
            let (family, full) = if addr.is_ipv4() { ("ip", 32) } else { ("ip6", 128) };
            let source = if prefix == full {
                json!(addr.to_string())
            } else {
                json!({"prefix": {"addr": addr.to_string(), "len": prefix}})
            };
            rule(accept_when(vec![
                equals(json!({"payload": {"protocol": family, "field": "saddr"}}), source),
                port.clone(),
            ]))
        })
        .collect()
}

/// The table the host wants for these openings.
pub(super) fn wanted<'a>(openings: impl IntoIterator<Item = (&'a str, &'a Opening)>) -> Table {
    let mut rules = fixed_rules();
    for (id, o) in openings {
        rules.extend(opening_rules(id, o));
    }
    Table {
        chains: vec![base_chain()],
        rules: rules.into_iter().map(canonical_rule).collect(),
        others: vec![],
    }
}

/// Sets sorted, so that the order nft lists a set's elements in does not count as a change.
fn canonical(v: Value) -> Value {
    match v {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(k, v)| {
                    let v = canonical(v);
                    match (k.as_str(), v) {
                        ("set", Value::Array(mut items)) => {
                            items.sort_by_key(Value::to_string);
                            (k, Value::Array(items))
                        }
                        (_, v) => (k, v),
                    }
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(canonical).collect()),
        other => other,
    }
}

fn canonical_rule(r: Rule) -> Rule {
    Rule { comment: r.comment, expr: canonical(r.expr) }
}

/// The table from what `nft -j list table` printed (without its metainfo).
pub(super) fn parse(objects: &[Value]) -> Table {
    let mut table = Table::default();
    for object in objects {
        let Some((kind, body)) = object.as_object().and_then(|o| o.iter().next()) else { continue };
        match kind.as_str() {
            "table" => {}
            "chain" => {
                let mut chain = body.clone();
                if let Some(c) = chain.as_object_mut() {
                    for k in ["family", "table", "handle"] {
                        c.remove(k);
                    }
                }
                table.chains.push(chain);
            }
            "rule" if body["chain"] == CHAIN => table.rules.push(canonical_rule(Rule {
                comment: body.get("comment").and_then(Value::as_str).map(str::to_owned),
                expr: body.get("expr").cloned().unwrap_or(Value::Null),
            })),
            "rule" => table.others.push(format!("a rule in chain {}", body["chain"])),
            other => table.others.push(format!("a {other} {}", body.get("name").unwrap_or(&Value::Null))),
        }
    }
    table
}

/// What differs between the table found and the one wanted, besides the openings' own rules.
pub(super) fn common_drift(found: &Table, wanted: &Table, ids: &BTreeSet<&str>) -> Vec<String> {
    let mut drift = Vec::new();
    if found.chains != wanted.chains {
        drift.push(match found.chains.iter().find(|c| c["name"] == CHAIN) {
            Some(c) if found.chains.len() == 1 => format!(
                "its chain input was changed (policy {}, hook {})",
                c.get("policy").unwrap_or(&Value::Null),
                c.get("hook").unwrap_or(&Value::Null)
            ),
            Some(_) => "a chain was added to it".to_owned(),
            None => "its chain input was deleted".to_owned(),
        });
    }
    let fixed = |t: &Table| t.rules.iter().filter(|r| r.comment.is_none()).cloned().collect::<Vec<_>>();
    if fixed(found) != fixed(wanted) {
        drift.push("its rules for loopback, established connections and ICMP were changed".to_owned());
    }
    let strangers =
        found.rules.iter().filter(|r| r.comment.as_deref().is_some_and(|c| !ids.contains(c))).count();
    if strangers > 0 {
        drift.push(format!("{strangers} rule(s) the declaration does not hold were added to it"));
    }
    drift.extend(found.others.iter().map(|o| format!("{o} was added to it")));
    if drift.is_empty() && found != wanted {
        drift.push("its rules were reordered".to_owned());
    }
    drift
}

/// Each opening's rules in a table, by comment: looked up once per opening, so a declaration of
/// thousands of openings is not compared in quadratic time.
fn by_comment(t: &Table) -> std::collections::HashMap<&str, Vec<&Rule>> {
    let mut map: std::collections::HashMap<&str, Vec<&Rule>> = std::collections::HashMap::new();
    for r in &t.rules {
        if let Some(c) = r.comment.as_deref() {
            map.entry(c).or_default().push(r);
        }
    }
    map
}

/// What happened to one declared opening, from plain values.
pub(super) struct Seen<'a> {
    /// Its record: whether it was declared the same when last applied.
    pub recorded: Option<bool>,
    /// Its rules in the table found are exactly the ones wanted.
    pub intact: bool,
    /// The table was absent.
    pub table_absent: bool,
    /// What else of the table was changed by hand, reported on the first opening only.
    pub common: &'a [String],
}

/// The outcome word and detail of one opening.
pub(super) fn decide(seen: &Seen<'_>) -> (Verb, Option<String>) {
    // "corrected" already says it was put back; the detail says what had been done to it. A hand
    // change outside every opening's rules is told on the first opening only, so one edit counts
    // as drift once (docs/decisions.md, "A hand change to the table outside any opening's
    // rules").
    let by_hand = |what: String| (Verb::Corrected, Some(what));
    match (seen.recorded, seen.intact) {
        (Some(true), true) if !seen.common.is_empty() => {
            by_hand(format!("table inet mesh_host had been changed by hand: {}", seen.common.join(", ")))
        }
        (_, true) => (Verb::Unchanged, None),
        (Some(true), false) if seen.table_absent => {
            by_hand("table inet mesh_host had been deleted by hand".to_owned())
        }
        (Some(true), false) => by_hand("its rule had been changed or deleted by hand".to_owned()),
        (Some(false), false) => (Verb::Updated, None),
        (None, false) => (Verb::Created, None),
    }
}

/// Whether an opening may be held: the declaration is an adopted node's, its module is not
/// taken, and the host has no record of it.
pub(super) fn holdable(declaration: &Declaration, store: &Store, r: &Resource) -> bool {
    declaration.adoption.as_ref().is_some_and(|a| !a.taken.iter().any(|m| m == r.id.module()))
        && store.get(r.id.as_str()).is_none()
}

/// Whether an opening that may be held is: held before (a hold lasts until its module is taken,
/// whatever became of the port since), or its port found open now (docs/decisions.md, "An
/// opening is held"; "A hold is remembered").
pub(super) fn held_now(store: &Store, r: &Resource, found_open: bool) -> bool {
    store.held(r.id.as_str()).is_some() || found_open
}

pub(super) fn held_detail(r: &Resource) -> String {
    format!("found open, and module {:?} is not taken yet: left open as found", r.id.module())
}

/// Whether a rule ufw keeps (one not of the host's) lets this port in: `ufw allow 22`, `ufw
/// allow 22/tcp`, `ufw allow from 10.0.0.0/8 to any port 22 proto tcp`. An application profile
/// (`ufw allow OpenSSH`) is not resolved, so its port is not found open (docs/decisions.md, "An
/// opening is held").
pub(super) fn ufw_lets_in(added: &[String], t: Transport, port: u16) -> bool {
    added.iter().filter(|l| !l.contains(" comment 'mesh-host ")).any(|line| {
        let words: Vec<&str> = line.split(' ').collect();
        if words.get(1) != Some(&"allow") {
            return false;
        }
        let proto = words.iter().position(|w| *w == "proto").and_then(|i| words.get(i + 1)).copied();
        let proto_ok = proto.is_none_or(|p| p == t.as_str());
        let by_port = words.iter().position(|w| *w == "port").and_then(|i| words.get(i + 1))
            == Some(&&*port.to_string());
        let bare =
            words.get(2).is_some_and(|w| *w == port.to_string() || *w == format!("{port}/{}", t.as_str()));
        (by_port && proto_ok) || bare
    })
}

/// Whether a table lets new connections to this port in: no table at all, a chain that does
/// not drop, or a rule accepting the port (from some source or all).
fn lets_in(found: Option<&Table>, t: Transport, port: u16) -> bool {
    let Some(found) = found else { return true };
    if found.chains.iter().all(|c| c.get("policy").and_then(Value::as_str) != Some("drop")) {
        return true;
    }
    found.rules.iter().any(|r| {
        r.expr.as_array().into_iter().flatten().any(|e| {
            let m = &e["match"];
            let port_matches = match &m["right"] {
                Value::Number(n) => n.as_u64() == Some(u64::from(port)),
                Value::Object(o) => o
                    .get("set")
                    .and_then(Value::as_array)
                    .is_some_and(|s| s.iter().any(|v| v.as_u64() == Some(u64::from(port)))),
                _ => false,
            };
            m["left"]["payload"]["field"] == "dport"
                && m["left"]["payload"]["protocol"] == t.as_str()
                && port_matches
        })
    })
}

/// The listening ports the new filter would close to new connections from elsewhere: open
/// before (no table, or a rule let them in) and not declared now. A socket bound to loopback
/// only is not reachable from elsewhere anyway (docs/decisions.md, "Ports the filter closes").
pub(super) fn newly_closed(
    listeners: &[Listener],
    found: Option<&Table>,
    declared: &BTreeSet<(Transport, u16)>,
) -> Vec<String> {
    let mut closed: BTreeMap<(Transport, u16), BTreeSet<IpAddr>> = BTreeMap::new();
    for l in listeners {
        let loopback = match l.addr {
            IpAddr::V4(a) => a.is_loopback(),
            IpAddr::V6(a) => a.is_loopback() || a.to_ipv4_mapped().is_some_and(|a| a.is_loopback()),
        };
        let key = (l.transport, l.port);
        if !loopback && !declared.contains(&key) && lets_in(found, l.transport, l.port) {
            closed.entry(key).or_default().insert(l.addr);
        }
    }
    closed
        .into_iter()
        .map(|((t, port), addrs)| {
            let addrs: Vec<String> = addrs.iter().map(IpAddr::to_string).collect();
            format!("{port}/{} (listening on {})", t.as_str(), addrs.join(", "))
        })
        .collect()
}

/// What became of an orphan opening: the outcome word and its detail.
pub(super) type Left = (Verb, Option<String>);

/// What the firewall step did with each opening.
pub(super) struct Done {
    /// Each declared opening's outcome, by its index in the declaration.
    pub declared: Vec<(usize, Result<Outcome, Error>)>,
    /// Each orphan opening's outcome, with its record.
    pub orphans: Vec<(String, Record, Result<Left, Error>)>,
}

/// Works out the host's filter from every declared opening, loads it if the table differs (or
/// removes the table when none is declared and the host had made one), reads it back, and
/// says what happened to each opening, declared or orphan.
pub(super) fn apply(
    declaration: &Declaration,
    store: &Store,
    opts: &Options,
    orphans: Vec<(String, Record)>,
) -> Done {
    let declared = declared_openings(declaration);
    let mut done = Done { declared: Vec::new(), orphans: Vec::new() };
    // No opening declared and none recorded: a table found all the same (a crash between its
    // load and the store's write) is left until an opening is declared again
    // (docs/decisions.md, "The table is removed").
    if declared.is_empty() && orphans.is_empty() {
        return done;
    }
    // An id too long to be a rule's comment could not be told apart from another's once loaded:
    // that opening fails alone, and the others are loaded without it (docs/decisions.md, "One
    // opening's rules are found by their comment").
    let (fits, too_long): (Vec<_>, Vec<_>) =
        declared.into_iter().partition(|(r, _)| r.id.as_str().len() <= COMMENT_MAX);
    let any_too_long = !too_long.is_empty();
    for (r, _) in too_long {
        done.declared
            .push((r.index, Err(Error::IdTooLongForRule { id: r.id.to_string(), max: COMMENT_MAX })));
    }

    let found = match firewall::read_table() {
        Ok(found) => found.map(|objects| parse(&objects)),
        Err(e) => {
            let e = std::sync::Arc::new(e);
            done.declared.extend(fits.iter().map(|(r, _)| (r.index, Err(Error::Firewall(e.clone())))));
            done.orphans
                .extend(orphans.into_iter().map(|(id, rec)| (id, rec, Err(Error::Firewall(e.clone())))));
            return done;
        }
    };
    // On an adopted node, an opening of a module not taken yet whose port was let in before
    // this pass (no filter of the host's at all, or one that accepts it) is held: it stays open,
    // its rule in the table, but it is not the host's yet. When every opening is held and no
    // table of the host's is there, none is loaded: a filter with policy drop would close what
    // the node was found with (docs/decisions.md, "An opening is held").
    let held: BTreeSet<usize> = fits
        .iter()
        .filter(|(r, o)| {
            holdable(declaration, store, r)
                && held_now(store, r, lets_in(found.as_ref(), transport(o.protocol), o.port.get()))
        })
        .map(|(r, _)| r.index)
        .collect();
    let all_held = fits.iter().all(|(r, _)| held.contains(&r.index));
    let nothing_to_load = fits.is_empty() || (all_held && found.is_none());
    let want = (!nothing_to_load).then(|| wanted(fits.iter().map(|(r, o)| (r.id.as_str(), *o))));
    let ids: BTreeSet<&str> = fits.iter().map(|(r, _)| r.id.as_str()).collect();

    let change = match (&want, &found) {
        (Some(w), Some(f)) => w != f,
        (Some(_), None) => true,
        // Openings are declared and none could be loaded: the filter in force stays, rather
        // than the table going and every port with it.
        (None, _) if any_too_long => false,
        (None, found) => found.is_some(),
    };
    // The listening ports this filter closes, said before it is loaded (and by `plan`), so an
    // operator sees what a new filter cuts off (docs/decisions.md, "Ports the filter closes").
    let closes = match &want {
        // A table left as it is closes nothing new; reading every socket of a busy server on
        // each pass would be paid for nothing.
        Some(_) if change => firewall::listening().map(|listeners| {
            let open: BTreeSet<(Transport, u16)> =
                fits.iter().map(|(_, o)| (transport(o.protocol), o.port.get())).collect();
            newly_closed(&listeners, found.as_ref(), &open)
        }),
        _ => Ok(Vec::new()),
    };

    let loaded = if change && !opts.dry_run { load(want.as_ref()) } else { Ok(()) };

    let common = match (&want, &found) {
        (Some(w), Some(f)) => common_drift(f, w, &ids),
        (_, _) => Vec::new(),
    };
    let found_by_comment = found.as_ref().map(by_comment);
    let mut first = true;
    for (r, o) in &fits {
        let result = loaded.as_ref().map_err(Failed::error).map(|()| {
            let own = opening_rules(r.id.as_str(), o).into_iter().map(canonical_rule).collect::<Vec<_>>();
            let intact = found_by_comment
                .as_ref()
                .is_some_and(|f| f.get(r.id.as_str()).is_some_and(|rules| rules.iter().copied().eq(own.iter())));
            let recorded: Option<bool> = store.get(r.id.as_str()).map(|rec| rec.declared == r.digest);
            let seen = Seen {
                recorded,
                intact,
                table_absent: found.is_none(),
                common: if first { &common } else { &[] },
            };
            let (action, mut detail) = if held.contains(&r.index) {
                (Verb::Held, Some(held_detail(r)))
            } else {
                decide(&seen)
            };
            if first {
                let said = match &closes {
                    Ok(c) if c.is_empty() => None,
                    Ok(c) => Some(format!("new connections are dropped to {}", c.join(", "))),
                    Err(e) => Some(format!("the listening sockets could not be read ({e}), so the ports this filter closes are not known")),
                };
                detail = match (detail, said) {
                    (Some(d), Some(s)) => Some(format!("{d}; {s}")),
                    (d, s) => d.or(s),
                };
            }
            first = false;
            super::Outcome { id: r.id.to_string(), kind: r.kind(), target: r.target(), action, detail }
        });
        done.declared.push((r.index, result));
    }
    for (id, rec) in orphans {
        let was_there = found_by_comment.as_ref().is_some_and(|f| f.contains_key(id.as_str()));
        let result = loaded.as_ref().map_err(Failed::error).map(|()| {
            let detail = match (was_there, want.is_some()) {
                (false, _) => "its rule was already gone",
                (true, true) => "its rule was taken out of table inet mesh_host",
                (true, false) => "it was the last opening, so table inet mesh_host was removed",
            };
            (Verb::Removed, Some(detail.to_owned()))
        });
        done.orphans.push((id, rec, result));
    }
    done
}

/// Why the filter could not be loaded, kept once and told to every opening.
enum Failed {
    Nft(std::sync::Arc<firewall::Error>),
    ReadBack(String),
}

impl Failed {
    fn error(&self) -> Error {
        match self {
            Failed::Nft(e) => Error::Firewall(std::sync::Arc::clone(e)),
            Failed::ReadBack(differs) => Error::FilterReadBack { differs: differs.clone() },
        }
    }
}

/// Replaces the table with `want` in one transaction (or removes it), then reads it back: the
/// old filter stands until the new one is complete (ARCHITECTURE.md, "The host's filter").
fn load(want: Option<&Table>) -> Result<(), Failed> {
    let nft = |e| Failed::Nft(std::sync::Arc::new(e));
    match want {
        None => {
            firewall::remove_table().map_err(nft)?;
            match firewall::read_table().map_err(nft)? {
                None => Ok(()),
                Some(_) => Err(Failed::ReadBack("it is still there after it was removed".into())),
            }
        }
        Some(want) => {
            firewall::load(batch(want)).map_err(nft)?;
            match firewall::read_table().map_err(nft)?.map(|o| parse(&o)) {
                None => Err(Failed::ReadBack("it is not there after it was loaded".into())),
                Some(found) if found == *want => Ok(()),
                Some(found) => {
                    let ids: BTreeSet<&str> =
                        want.rules.iter().filter_map(|r| r.comment.as_deref()).collect();
                    let mut differs = common_drift(&found, want, &ids);
                    let (found_by_comment, wanted_by_comment) = (by_comment(&found), by_comment(want));
                    differs.extend(
                        ids.iter()
                            .filter(|id| found_by_comment.get(*id) != wanted_by_comment.get(*id))
                            .map(|id| format!("the rules of {id} differ")),
                    );
                    Err(Failed::ReadBack(differs.join(", ")))
                }
            }
        }
    }
}

/// The way back's first step, before the found firewall (ufw or firewalld, retired by a flip)
/// is started again: the host's table, still in force, is made to let in every declared
/// opening as well as what it let in already (the orphans' rules are kept). A packet must pass
/// both filters while both stand, so without this a newly declared port would open only when
/// the table goes, after the found firewall, started without the orphans, had already closed
/// their ports: the openings are applied before any orphan is removed (spec, "Firewalls").
/// Nothing is loaded when the table is absent (no filter of the host's stands) or already lets
/// all of them in; what is loaded is read back.
pub(super) fn widen_for_way_back(
    declaration: &Declaration,
    orphans: &[(String, Record)],
) -> Result<(), Error> {
    widen(declaration, orphans).map_err(|f| f.error())
}

fn widen(declaration: &Declaration, orphans: &[(String, Record)]) -> Result<(), Failed> {
    let nft = |e| Failed::Nft(std::sync::Arc::new(e));
    let Some(found) = firewall::read_table().map_err(nft)?.map(|o| parse(&o)) else { return Ok(()) };
    let fits = declared_openings(declaration).into_iter().filter(|(r, _)| r.id.as_str().len() <= COMMENT_MAX);
    let mut want = wanted(fits.map(|(r, o)| (r.id.as_str(), o)));
    let leaving: BTreeSet<&str> = orphans.iter().map(|(id, _)| id.as_str()).collect();
    want.rules.extend(
        found.rules.iter().filter(|r| r.comment.as_deref().is_some_and(|c| leaving.contains(c))).cloned(),
    );
    if want == found {
        return Ok(());
    }
    load(Some(&want))
}

/// The nft commands that replace the table with `want`: made if absent (so that deleting it
/// cannot fail), deleted, and made anew with its chain and rules. nft applies them as one
/// transaction, so the old filter holds until the new one is complete.
fn batch(want: &Table) -> Vec<Value> {
    let table = json!({"table": {"family": FAMILY, "name": TABLE}});
    let mut commands =
        vec![json!({"add": table.clone()}), json!({"delete": table.clone()}), json!({"add": table})];
    for chain in &want.chains {
        let mut chain = chain.clone();
        chain["family"] = json!(FAMILY);
        chain["table"] = json!(TABLE);
        commands.push(json!({"add": {"chain": chain}}));
    }
    for rule in &want.rules {
        let mut body = json!({"family": FAMILY, "table": TABLE, "chain": CHAIN, "expr": rule.expr});
        if let Some(c) = &rule.comment {
            body["comment"] = json!(c);
        }
        commands.push(json!({"add": {"rule": body}}));
    }
    commands
}

/// The firewall found in force on an adopted node, looked for before anything else.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Found {
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
pub(super) fn found_firewall(bus: Option<&str>) -> Result<Found, String> {
    let failed = |e: &dyn std::fmt::Display| {
        format!("cannot tell which firewall is in force: {e}; nothing was touched")
    };
    if ufw::active().map_err(|e| failed(&e))? {
        return Ok(Found::Ufw);
    }
    match Firewalld::running(bus) {
        Ok(Some(_)) => return Ok(Found::Firewalld),
        Ok(None) | Err(firewalld::Error::Connect { .. }) => {}
        Err(e) => return Err(failed(&e)),
    }
    // nft lists only nftables' chains: a filter made with iptables-legacy is looked for apart.
    let mut chains = firewall::input_chains().map_err(|e| failed(&e))?;
    chains.extend(firewall::legacy_input_chains().map_err(|e| failed(&e))?);
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
        Err(format!(
            "a filter other than ufw or firewalld is in force on the input hook of this adopted node: {}; mesh-host does not load its own filter beside one it cannot manage, so the declaration was refused and nothing was touched",
            in_force.join(", ")
        ))
    }
}

/// The comment of an opening's rules in ufw.
fn ufw_comment(id: &str) -> String {
    format!("mesh-host {id}")
}

/// One rule of an opening in ufw: the words after `ufw` that add it, the line `ufw show added`
/// prints for it, and the lines `iptables -S` prints for it once in force.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct UfwRule {
    pub words: Vec<String>,
    pub shown: String,
    pub in_force: Vec<String>,
}

/// An opening's rules in ufw: one for the port from anywhere (IPv4 and IPv6), or one per
/// `from` network.
pub(super) fn ufw_rules(id: &str, o: &Opening) -> Vec<UfwRule> {
    let proto = transport(o.protocol).as_str();
    let port = o.port.get();
    let comment = ufw_comment(id);
    let accept = |chain: &str, source: &str| {
        format!("-A {chain} {source}-p {proto} -m {proto} --dport {port} -j ACCEPT")
    };
    if o.from.is_empty() {
        let words = vec!["allow".to_owned(), format!("{port}/{proto}")];
        return vec![UfwRule {
            shown: format!("ufw {} comment '{comment}'", words.join(" ")),
            words,
            in_force: vec![accept("ufw-user-input", ""), accept("ufw6-user-input", "")],
        }];
    }
    let mut seen = BTreeSet::new();
    o.from
        .iter()
        .map(network)
        .filter(|n| seen.insert(*n))
        .map(|(addr, prefix)| {
            let (chain, full) =
                if addr.is_ipv4() { ("ufw-user-input", 32) } else { ("ufw6-user-input", 128) };
            let source = if prefix == full { addr.to_string() } else { format!("{addr}/{prefix}") };
            let words: Vec<String> =
                ["allow", "from", &source, "to", "any", "port", &port.to_string(), "proto", proto]
                    .iter()
                    .map(|w| (*w).to_owned())
                    .collect();
            UfwRule {
                shown: format!("ufw {} comment '{comment}'", words.join(" ")),
                words,
                in_force: vec![accept(chain, &format!("-s {addr}/{prefix} "))],
            }
        })
        .collect()
}

/// The rules `ufw show added` lists under an opening's comment, as the words that delete them.
fn ufw_added_for(added: &[String], id: &str) -> Vec<(String, Vec<String>)> {
    let suffix = format!(" comment '{}'", ufw_comment(id));
    added
        .iter()
        .filter_map(|line| {
            let words = line.strip_suffix(&suffix)?.strip_prefix("ufw ")?;
            Some((line.clone(), words.split(' ').map(str::to_owned).collect()))
        })
        .collect()
}

/// Openings made in ufw, found active on an adopted node: each opening's rules added with its
/// comment, anything else under its comment deleted, orphan openings' rules deleted; then read
/// back in ufw's saved rules (permanent) and in the filter in force (runtime), reloading ufw
/// once if the saved rules are not all in force (docs/decisions.md, "Openings in ufw").
///
/// `enable`: the way back, ufw found disabled by the host's own flip. The host's table is made
/// to let the declared openings in too (`widen_for_way_back`), ufw's rules are saved, then it
/// is enabled (ufw's start loads the saved rules before it sets its policy, so no declared
/// port is closed meanwhile), then read back. It does not wait for a clean pass: the host's
/// table protects the node until ufw is up (docs/decisions.md, "The way back").
pub(super) fn apply_ufw(
    declaration: &Declaration,
    store: &Store,
    opts: &Options,
    orphans: Vec<(String, Record)>,
    enable: bool,
) -> Done {
    let declared = declared_openings(declaration);
    let mut done = Done { declared: Vec::new(), orphans: Vec::new() };
    if enable && !opts.dry_run {
        if let Err(e) = widen(declaration, &orphans) {
            done.declared.extend(declared.iter().map(|(r, _)| (r.index, Err(e.error()))));
            done.orphans.extend(orphans.into_iter().map(|(id, rec)| (id, rec, Err(e.error()))));
            return done;
        }
    }
    let ufw_failed = |e: ufw::Error| std::sync::Arc::new(e);
    let found = ufw::added().and_then(|a| Ok((a, ufw::in_force()?))).map_err(ufw_failed);
    let (added, in_force) = match found {
        Ok(found) => found,
        Err(e) => {
            done.declared.extend(declared.iter().map(|(r, _)| (r.index, Err(Error::Ufw(e.clone())))));
            done.orphans.extend(orphans.into_iter().map(|(id, rec)| (id, rec, Err(Error::Ufw(e.clone())))));
            return done;
        }
    };
    let mut seen = Vec::new();
    let mut change: Result<(), std::sync::Arc<ufw::Error>> = Ok(());
    // An opening of a module not taken yet, whose port a rule of ufw's own already lets in, is
    // held: nothing of the host's is added beside the operator's rule (docs/decisions.md, "An
    // opening is held").
    let held: BTreeSet<usize> = declared
        .iter()
        .filter(|(r, o)| {
            holdable(declaration, store, r)
                && held_now(store, r, ufw_lets_in(&added, transport(o.protocol), o.port.get()))
        })
        .map(|(r, _)| r.index)
        .collect();
    let declared: Vec<(&Resource, &Opening)> = declared
        .into_iter()
        .filter(|(r, _)| {
            if held.contains(&r.index) {
                done.declared.push((
                    r.index,
                    Ok(Outcome {
                        id: r.id.to_string(),
                        kind: r.kind(),
                        target: r.target(),
                        action: Verb::Held,
                        detail: Some(held_detail(r)),
                    }),
                ));
                false
            } else {
                true
            }
        })
        .collect();
    for (r, o) in &declared {
        let want = ufw_rules(r.id.as_str(), o);
        let have = ufw_added_for(&added, r.id.as_str());
        let saved = {
            let mut a: Vec<&String> = have.iter().map(|(line, _)| line).collect();
            let mut b: Vec<&String> = want.iter().map(|w| &w.shown).collect();
            a.sort();
            b.sort();
            a == b
        };
        let loaded = want.iter().flat_map(|w| &w.in_force).all(|l| in_force.contains(l));
        seen.push((saved, loaded));
        if !saved && !opts.dry_run && change.is_ok() {
            change = have
                .iter()
                .try_for_each(|(_, words)| ufw::delete(words))
                .and_then(|()| want.iter().try_for_each(|w| ufw::add(&w.words, &ufw_comment(r.id.as_str()))))
                .map_err(ufw_failed);
        }
    }
    let mut orphan_found = Vec::new();
    for (id, _) in &orphans {
        let have = ufw_added_for(&added, id);
        orphan_found.push(!have.is_empty());
        if !opts.dry_run && change.is_ok() {
            change = have.iter().try_for_each(|(_, words)| ufw::delete(words)).map_err(ufw_failed);
        }
    }
    // Read back: saved, and in force. A rule saved and not in force (the filter flushed by hand)
    // is put in force by loading ufw's saved rules again: `ufw show added` shows what is saved,
    // not what is in force (ARCHITECTURE.md, "The firewall found on an adopted node").
    let read_back = || -> Result<(Vec<String>, Vec<String>), std::sync::Arc<ufw::Error>> {
        Ok((ufw::added().map_err(ufw_failed)?, ufw::in_force().map_err(ufw_failed)?))
    };
    let after = change.and_then(|()| {
        if opts.dry_run {
            return Ok((added.clone(), in_force.clone()));
        }
        if enable {
            ufw::enable().map_err(ufw_failed)?;
        }
        let (a, f) = read_back()?;
        let all_in_force = declared
            .iter()
            .flat_map(|(r, o)| ufw_rules(r.id.as_str(), o))
            .flat_map(|w| w.in_force)
            .all(|l| f.contains(&l));
        if all_in_force {
            Ok((a, f))
        } else {
            ufw::reload().map_err(ufw_failed)?;
            read_back()
        }
    });
    for ((r, o), (saved, loaded)) in declared.iter().zip(seen) {
        let result = match &after {
            Err(e) => Err(Error::Ufw(e.clone())),
            Ok((a, f)) if !opts.dry_run => {
                let want = ufw_rules(r.id.as_str(), o);
                let have = ufw_added_for(a, r.id.as_str());
                let missing: Vec<&String> =
                    want.iter().map(|w| &w.shown).filter(|s| !have.iter().any(|(l, _)| l == *s)).collect();
                let not_loaded: Vec<&String> =
                    want.iter().flat_map(|w| &w.in_force).filter(|l| !f.contains(l)).collect();
                if have.len() != want.len() || !missing.is_empty() || !not_loaded.is_empty() {
                    Err(Error::UfwReadBack {
                        id: r.id.to_string(),
                        differs: format!(
                            "saved {} rule(s) under its comment for {} wanted, missing {missing:?}; not in force {not_loaded:?}",
                            have.len(),
                            want.len()
                        ),
                    })
                } else {
                    Ok(())
                }
            }
            Ok(_) => Ok(()),
        };
        let result = result.map(|()| {
            let recorded =
                store.get(r.id.as_str()).map(|rec| rec.declared == r.digest && rec.spec() == Some(UFW));
            let (action, detail) =
                decide(&Seen { recorded, intact: saved && loaded, table_absent: false, common: &[] });
            let detail = match detail {
                Some(d) => format!("{d}; in ufw, found active on this adopted node"),
                None => "in ufw, found active on this adopted node (runtime and permanent)".to_owned(),
            };
            Outcome { id: r.id.to_string(), kind: r.kind(), target: r.target(), action, detail: Some(detail) }
        });
        done.declared.push((r.index, result));
    }
    for ((id, rec), was_there) in orphans.into_iter().zip(orphan_found) {
        let result = match &after {
            Err(e) => Err(Error::Ufw(e.clone())),
            Ok((a, _)) if !opts.dry_run && !ufw_added_for(a, &id).is_empty() => Err(Error::UfwReadBack {
                id: id.clone(),
                differs: "its rules are still in ufw after deleting them".into(),
            }),
            Ok(_) => Ok((
                Verb::Removed,
                Some(
                    if was_there {
                        "its rules were deleted from ufw"
                    } else {
                        "its rules were already gone from ufw"
                    }
                    .to_owned(),
                ),
            )),
        };
        done.orphans.push((id, rec, result));
    }
    done
}

/// What the record of an opening made in ufw says in its `spec`.
pub(super) const UFW: &str = "ufw";

/// What the record of an opening in the host's table says in its `spec` on a node whose ufw the
/// host retired in a flip: what the way back looks for.
pub(super) const UFW_RETIRED: &str = "ufw-retired";

/// After openings were made in `found` (ufw or firewalld): the host's own table, if it is there
/// (left by a flip, on the way back), is removed, since a packet would have to pass both
/// filters. Read back (docs/decisions.md, "Behind ufw the host's own table is removed").
pub(super) fn without_own_table(mut done: Done, opts: &Options, found: &str) -> Done {
    let failed =
        done.declared.iter().any(|(_, r)| r.is_err()) || done.orphans.iter().any(|(_, _, r)| r.is_err());
    if failed || opts.dry_run {
        return done;
    }
    let removed = firewall::read_table().and_then(|found| match found {
        None => Ok(false),
        Some(_) => firewall::remove_table().map(|()| true),
    });
    let removed = removed.and_then(|was| match firewall::read_table()? {
        None => Ok(was),
        Some(_) => Err(firewall::Error::Nft {
            what: "remove table inet mesh_host",
            how: "returned success and the table is still there".into(),
        }),
    });
    match removed {
        Ok(true) => {
            for (_, result) in &mut done.declared {
                if let Ok(o) = result {
                    // One declared for the first time was not moved: it was made in `found`.
                    if o.action != Verb::Held && o.action != Verb::Created {
                        o.action = Verb::Updated;
                        o.detail = Some(format!(
                            "moved into {found}, enabled again; table inet mesh_host was removed after {found} was read back"
                        ));
                    }
                }
            }
        }
        Ok(false) => {}
        Err(e) => {
            let e = std::sync::Arc::new(e);
            for (_, result) in &mut done.declared {
                *result = Err(Error::Firewall(e.clone()));
            }
        }
    }
    done
}

/// Every declared opening, with its fields.
pub(super) fn declared_openings(declaration: &Declaration) -> Vec<(&Resource, &Opening)> {
    declaration
        .resources
        .iter()
        .filter_map(|r| match &r.spec {
            Spec::Opening(o) => Some((r, o)),
            Spec::Directory(_)
            | Spec::File(_)
            | Spec::Access(_)
            | Spec::Package(_)
            | Spec::Service(_)
            | Spec::Container(_)
            | Spec::Network(_)
            | Spec::User(_)
            | Spec::Archive(_)
            | Spec::Process(_)
            | Spec::Action(_) => None,
        })
        .collect()
}

/// The flip, on a node whose openings were made in ufw and whose declaration no longer says
/// `adoption`: the host's own filter is loaded (the caller has checked that everything else
/// applied), then ufw is disabled, then the host's rules are deleted from ufw; the orphan
/// openings are told last. Anything that fails after the load fails every opening, so their
/// records stay those of ufw and the next pass tries the rest again: the filter already loaded
/// is found as wanted, ufw is disabled, its rules deleted (ARCHITECTURE.md, "The firewall found
/// on an adopted node").
pub(super) fn flip(
    declaration: &Declaration,
    store: &Store,
    opts: &Options,
    orphans: Vec<(String, Record)>,
) -> Done {
    let leaving = Leaving {
        from: "ufw",
        spec: UFW,
        moved:
            "moved from ufw into table inet mesh_host; ufw was disabled and the host's rules in it deleted",
        orphan_removed: "its rules were deleted from ufw, which was disabled",
    };
    let retire =
        |ids: &[String]| if opts.dry_run { Ok(()) } else { retire_ufw(ids).map_err(std::sync::Arc::new) };
    flip_from(&leaving, declaration, store, opts, orphans, retire, Error::Flip)
}

/// What a flip says of the found firewall it leaves: its name, what its openings' records say
/// in their `spec`, and the details of a declared opening moved and of an orphan removed.
pub(super) struct Leaving {
    pub(super) from: &'static str,
    pub(super) spec: &'static str,
    pub(super) moved: &'static str,
    pub(super) orphan_removed: &'static str,
}

/// The flip from a found firewall (ufw or firewalld), the same for both: the host's own filter
/// loaded, and only when every opening and orphan went through is the found firewall retired
/// (`retire`, given the ids of the openings made in it); a failure of the retirement fails every
/// opening with `failed`, so their records stay those of the found firewall.
pub(super) fn flip_from<E: Clone>(
    leaving: &Leaving,
    declaration: &Declaration,
    store: &Store,
    opts: &Options,
    orphans: Vec<(String, Record)>,
    retire: impl FnOnce(&[String]) -> Result<(), E>,
    failed: impl Fn(E) -> Error,
) -> Done {
    let made: Vec<String> = store
        .records()
        .filter(|(_, rec)| rec.kind == crate::declaration::Kind::Opening && rec.origin == opts.origin)
        .filter(|(_, rec)| rec.spec() == Some(leaving.spec))
        .map(|(id, _)| id.to_owned())
        .collect();
    let mut done = apply(declaration, store, opts, orphans);
    let failures = done.declared.iter().filter(|(_, r)| r.is_err()).count()
        + done.orphans.iter().filter(|(_, _, r)| r.is_err()).count();
    if failures > 0 {
        // One opening that could not be loaded keeps the found firewall in force for all:
        // retiring it now would drop that port (docs/decisions.md, "The flip waits for a clean
        // pass").
        for (_, result) in &mut done.declared {
            if result.is_ok() {
                *result = Err(Error::FlipWaits { from: leaving.from, failed: failures });
            }
        }
        return done;
    }
    match retire(&made) {
        Ok(()) => {
            for (_, result) in &mut done.declared {
                if let Ok(o) = result {
                    o.action = Verb::Updated;
                    let closes = o.detail.take().filter(|d| d.contains("new connections are dropped"));
                    o.detail = Some(match closes {
                        Some(c) => format!("{}; {}", leaving.moved, c.rsplit("; ").next().unwrap_or(&c)),
                        None => leaving.moved.to_owned(),
                    });
                }
            }
            for (id, _, result) in &mut done.orphans {
                if made.contains(id) {
                    *result = Ok((Verb::Removed, Some(leaving.orphan_removed.to_owned())));
                }
            }
        }
        Err(e) => {
            for (_, result) in &mut done.declared {
                *result = Err(failed(e.clone()));
            }
            for (_, _, result) in &mut done.orphans {
                *result = Err(failed(e.clone()));
            }
        }
    }
    done
}

/// Disables ufw and deletes the host's rules in it; read back: ufw inactive, none of the
/// host's comments left in its saved rules.
///
/// ufw takes its filter down in steps (its chains deleted, then the INPUT policy set to
/// accept), and in between it drops every new connection, even to a port the host's filter,
/// already loaded, accepts; its `ufw default allow` stops and starts it the same way. So the
/// INPUT chains' policy is set to accept first (one change each, in force at once, while the
/// host's filter stands), then ufw is disabled. If disabling fails, the policies found are put
/// back: a ufw left in force must still drop what it does not allow (docs/decisions.md,
/// "Retiring ufw").
fn retire_ufw(ids: &[String]) -> Result<(), ufw::Error> {
    let found = ufw::input_policies()?;
    for (program, _) in &found {
        ufw::set_input_policy(program, "ACCEPT")?;
    }
    if let Err(e) = ufw::disable() {
        for (program, policy) in &found {
            ufw::set_input_policy(program, policy)?;
        }
        return Err(e);
    }
    if ufw::active()? {
        return Err(ufw::Error::Failed {
            command: "ufw disable".into(),
            how: "returned success and ufw still says it is active".into(),
        });
    }
    let added = ufw::added()?;
    for id in ids {
        for (_, words) in ufw_added_for(&added, id) {
            ufw::delete(&words)?;
        }
    }
    let left = ufw::added()?;
    if let Some(id) = ids.iter().find(|id| !ufw_added_for(&left, id).is_empty()) {
        return Err(ufw::Error::Failed {
            command: format!("ufw delete (the rules of {id})"),
            how: "returned success and the rules are still saved".into(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opening(port: u16, protocol: &str, from: &[&str]) -> Opening {
        serde_json::from_value(json!({"port": port, "protocol": protocol, "from": from})).unwrap()
    }

    #[test]
    fn a_from_network_is_written_as_nft_lists_it() {
        let rules = opening_rules(
            "web.admin",
            &opening(22, "tcp", &["10.1.2.3/8", "10.9.9.9/8", "fd00::1/8", "192.0.2.7"]),
        );
        let sources: Vec<&Value> = rules.iter().map(|r| &r.expr[0]["match"]["right"]).collect();
        assert_eq!(
            sources,
            vec![
                &json!({"prefix": {"addr": "10.0.0.0", "len": 8}}),
                &json!({"prefix": {"addr": "fd00::", "len": 8}}),
                &json!("192.0.2.7"),
            ],
            "host bits cleared, the same network once, a single address bare"
        );
        assert!(rules.iter().all(|r| r.comment.as_deref() == Some("web.admin")));
        assert_eq!(rules[1].expr[0]["match"]["left"]["payload"]["protocol"], "ip6");
        let any = opening_rules("web.dns", &opening(53, "udp", &[]));
        assert_eq!(any.len(), 1);
        assert_eq!(any[0].expr[0]["match"]["left"]["payload"], json!({"protocol": "udp", "field": "dport"}));
        assert_eq!(network(&Cidr::parse("0.0.0.0/0").unwrap()).1, 0);
    }

    #[test]
    fn the_order_nft_lists_a_set_in_is_not_a_change() {
        let want = wanted([("web.http", &opening(80, "tcp", &[]))]);
        let mut listed: Vec<Value> =
            vec![json!({"table": {"family": "inet", "name": "mesh_host", "handle": 3}})];
        let mut chain = base_chain();
        chain["family"] = json!("inet");
        chain["table"] = json!("mesh_host");
        chain["handle"] = json!(1);
        listed.push(json!({ "chain": chain }));
        for (i, r) in want.rules.iter().enumerate() {
            let mut expr = r.expr.clone();
            if let Some(set) = expr[0]["match"]["right"].get_mut("set").and_then(Value::as_array_mut) {
                set.reverse();
            }
            let mut rule = json!({"family": "inet", "table": "mesh_host", "chain": "input", "handle": i + 2, "expr": expr});
            if let Some(c) = &r.comment {
                rule["comment"] = json!(c);
            }
            listed.push(json!({ "rule": rule }));
        }
        assert_eq!(parse(&listed), want);
        listed.push(json!({"set": {"family": "inet", "table": "mesh_host", "name": "extra"}}));
        let found = parse(&listed);
        assert_ne!(found, want);
        assert_eq!(
            common_drift(&found, &want, &BTreeSet::from(["web.http"])),
            vec!["a set \"extra\" was added to it"]
        );
    }

    #[test]
    fn drift_is_told_from_a_change_of_declaration() {
        let seen = |recorded, intact, table_absent, common: &'static [String]| {
            decide(&Seen { recorded, intact, table_absent, common })
        };
        assert_eq!(seen(None, false, true, &[]).0, Verb::Created);
        assert_eq!(seen(Some(true), true, false, &[]), (Verb::Unchanged, None));
        assert_eq!(seen(Some(false), false, false, &[]).0, Verb::Updated, "declared otherwise: updated");
        let (verb, said) = seen(Some(true), false, false, &[]);
        assert_eq!(
            (verb, said.unwrap()),
            (Verb::Corrected, "its rule had been changed or deleted by hand".into())
        );
        let (verb, said) = seen(Some(true), false, true, &[]);
        assert_eq!(
            (verb, said.unwrap()),
            (Verb::Corrected, "table inet mesh_host had been deleted by hand".into())
        );
        let common = Box::leak(Box::new(vec!["its rules were reordered".to_owned()]));
        assert_eq!(seen(Some(true), true, false, common).0, Verb::Corrected);
        assert_eq!(
            seen(None, true, false, common).0,
            Verb::Unchanged,
            "nothing of its own was found changed"
        );
    }

    #[test]
    fn an_opening_in_ufw_is_written_as_ufw_shows_it() {
        let any = ufw_rules("dns.udp", &opening(53, "udp", &[]));
        assert_eq!(any[0].shown, "ufw allow 53/udp comment 'mesh-host dns.udp'");
        assert_eq!(
            any[0].in_force,
            vec![
                "-A ufw-user-input -p udp -m udp --dport 53 -j ACCEPT",
                "-A ufw6-user-input -p udp -m udp --dport 53 -j ACCEPT"
            ]
        );
        let from = ufw_rules("web.admin", &opening(22, "tcp", &["10.1.2.3/8", "192.0.2.7", "fd00::/8"]));
        assert_eq!(
            from[0].shown,
            "ufw allow from 10.0.0.0/8 to any port 22 proto tcp comment 'mesh-host web.admin'"
        );
        assert_eq!(
            from[1].shown,
            "ufw allow from 192.0.2.7 to any port 22 proto tcp comment 'mesh-host web.admin'"
        );
        assert_eq!(
            from[1].in_force,
            vec!["-A ufw-user-input -s 192.0.2.7/32 -p tcp -m tcp --dport 22 -j ACCEPT"]
        );
        assert_eq!(
            from[2].in_force,
            vec!["-A ufw6-user-input -s fd00::/8 -p tcp -m tcp --dport 22 -j ACCEPT"]
        );
        let added = vec![
            "ufw allow 53/udp comment 'mesh-host dns.udp'".to_owned(),
            "ufw allow 53/udp comment 'mesh-host dns.udp2'".to_owned(),
            "ufw allow 22/tcp".to_owned(),
        ];
        assert_eq!(
            ufw_added_for(&added, "dns.udp"),
            vec![(added[0].clone(), vec!["allow".to_owned(), "53/udp".to_owned()])],
            "its comment exactly, and the words that delete it"
        );
    }

    #[test]
    fn an_operator_rule_in_ufw_is_found_by_its_port() {
        let added: Vec<String> = [
            "ufw allow 22/tcp",
            "ufw allow 53",
            "ufw allow from 10.0.0.0/8 to any port 5432 proto tcp",
            "ufw allow OpenSSH",
            "ufw deny 23/tcp",
            "ufw allow 8080/tcp comment 'mesh-host web.http'",
        ]
        .iter()
        .map(|l| (*l).to_owned())
        .collect();
        assert!(ufw_lets_in(&added, Transport::Tcp, 22));
        assert!(!ufw_lets_in(&added, Transport::Udp, 22));
        assert!(ufw_lets_in(&added, Transport::Udp, 53) && ufw_lets_in(&added, Transport::Tcp, 53));
        assert!(ufw_lets_in(&added, Transport::Tcp, 5432));
        assert!(!ufw_lets_in(&added, Transport::Tcp, 23), "a deny lets nothing in");
        assert!(!ufw_lets_in(&added, Transport::Tcp, 8080), "the host's own rule is not the operator's");
    }

    #[test]
    fn a_port_is_newly_closed_only_if_it_was_open_listening_and_is_not_declared() {
        let l = |t, addr: &str, port| Listener { transport: t, addr: addr.parse().unwrap(), port };
        let listeners = [
            l(Transport::Tcp, "0.0.0.0", 22),
            l(Transport::Tcp, "::", 22),
            l(Transport::Tcp, "127.0.0.1", 631),
            l(Transport::Tcp, "::ffff:127.0.0.1", 632),
            l(Transport::Udp, "::", 53),
            l(Transport::Tcp, "10.0.0.1", 80),
        ];
        let declared = BTreeSet::from([(Transport::Tcp, 80)]);
        assert_eq!(
            newly_closed(&listeners, None, &declared),
            vec!["22/tcp (listening on 0.0.0.0, ::)", "53/udp (listening on ::)"],
            "with no table, every listening port not declared and not on loopback"
        );
        // A table of the host's that already drops 22 and lets 53/udp in.
        let table = wanted([("dns", &opening(53, "udp", &["10.0.0.0/8"]))]);
        assert_eq!(newly_closed(&listeners, Some(&table), &declared), vec!["53/udp (listening on ::)"]);
        let mut open = table.clone();
        open.chains[0]["policy"] = json!("accept");
        assert_eq!(
            newly_closed(&listeners, Some(&open), &declared).len(),
            2,
            "a chain that accepts closes nothing"
        );
    }
}
