//! The host's own filter, the nftables table `inet mesh_host`: every declared opening is a
//! rule (or one per `from` network) in one chain on the input hook whose policy is drop. It is
//! worked out from all of them, compared with the table nft lists, replaced in one transaction
//! if it differs, and read back whole.
//!
//! `wanted`, `parse`, `common_drift`, `newly_closed` and `table_plan` are pure and unit-tested; `apply`,
//! `widen_for_way_back` and `without_own_table` act through `system::firewall` and read back.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

use serde_json::{json, Value};

use super::driver::{run, Backend, Item, Plan, Verdict};
use super::plan::Home;
use super::{declared_openings, network, transport, Done};
use crate::apply::{Error, Options, Verb};
use crate::declaration::{Declaration, Opening};
use crate::store::{Record, Store};
use crate::system::firewall::{self, Listener, Transport, FAMILY, TABLE};

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

/// A listening port a new filter closes to new connections from elsewhere: what the flip says
/// again when it moves the openings, kept as data rather than read back out of a detail.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(in crate::apply) struct Closed {
    pub transport: Transport,
    pub port: u16,
    /// The addresses it listens on.
    pub addrs: Vec<IpAddr>,
}

impl std::fmt::Display for Closed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let addrs: Vec<String> = self.addrs.iter().map(IpAddr::to_string).collect();
        write!(f, "{}/{} (listening on {})", self.port, self.transport.as_str(), addrs.join(", "))
    }
}

/// What an opening's detail says of the ports a filter closes.
pub(super) fn dropped_to(closes: &[Closed]) -> String {
    let ports: Vec<String> = closes.iter().map(Closed::to_string).collect();
    format!("new connections are dropped to {}", ports.join(", "))
}

/// The listening ports the new filter would close to new connections from elsewhere: open
/// before (no table, or a rule let them in) and not declared now. A socket bound to loopback
/// only is not reachable from elsewhere anyway (docs/decisions.md, "Ports the filter closes").
pub(super) fn newly_closed(
    listeners: &[Listener],
    found: Option<&Table>,
    declared: &BTreeSet<(Transport, u16)>,
) -> Vec<Closed> {
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
        .map(|((transport, port), addrs)| Closed { transport, port, addrs: addrs.into_iter().collect() })
        .collect()
}

/// Works out the host's filter from every declared opening, loads it if the table differs (or
/// removes the table when none is declared and the host had made one), reads it back, and
/// says what happened to each opening, declared or orphan: the one driver (`driver::run`) over
/// the table as a `Backend`.
pub(super) fn apply(
    declaration: &Declaration,
    store: &Store,
    opts: &Options,
    orphans: Vec<(String, Record)>,
) -> Done {
    let declared = declared_openings(declaration);
    // No opening declared and none recorded: a table found all the same (a crash between its
    // load and the store's write) is left until an opening is declared again
    // (docs/decisions.md, "The table is removed").
    if declared.is_empty() && orphans.is_empty() {
        return Done::default();
    }
    // An id too long to be a rule's comment could not be told apart from another's once loaded:
    // that opening fails alone, before anything is read, and the others are loaded without it
    // (docs/decisions.md, "One opening's rules are found by their comment").
    let (fits, too_long): (Vec<_>, Vec<_>) =
        declared.into_iter().partition(|(r, _)| r.id.as_str().len() <= COMMENT_MAX);
    let mut table = InTable { any_too_long: !too_long.is_empty() };
    let mut done = run(&mut table, declaration, store, opts, fits, orphans);
    let refused = too_long
        .into_iter()
        .map(|(r, _)| (r.index(), Err(Error::IdTooLongForRule { id: r.id.to_string(), max: COMMENT_MAX })));
    done.declared.splice(0..0, refused);
    done
}

/// What the host's table is to become.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Load {
    /// Left as it is: as wanted already, or nothing to load.
    Keep,
    /// Removed: no opening is declared any more.
    Remove,
    /// Replaced whole, in one transaction, with this one.
    Replace(Table),
}

/// The host's own table as the driver's `Backend`: the unit of change is the whole table, so
/// `compare` works out the table wanted from every opening (held ones in it, since a table
/// with policy drop that left one out would close its port), `act` loads it in one
/// transaction, and `read_back` compares it whole, so no opening is checked on its own.
struct InTable {
    /// Openings are declared that could not be loaded: with none loadable, the filter in force
    /// stays rather than the table going and every port with it.
    any_too_long: bool,
}

impl Backend for InTable {
    type Seen = Option<Table>;
    type Want = Vec<Rule>;
    type Change = Load;
    type Fault = Failed;
    const HOME: Option<Home> = None;

    fn error(fault: &Arc<Failed>) -> Error {
        fault.error()
    }

    fn read(&mut self) -> Result<Option<Table>, Failed> {
        Ok(firewall::read_table().map_err(|e| Failed::Nft(Arc::new(e)))?.map(|o| parse(&o)))
    }

    // An opening of a module not taken yet whose port was let in before this pass (no filter
    // of the host's at all, or one that accepts it) is held: it stays open, its rule in the
    // table, but it is not the host's yet (docs/decisions.md, "An opening is held").
    fn lets_in(&self, seen: &Option<Table>, o: &Opening) -> bool {
        lets_in(seen.as_ref(), transport(o.protocol), o.port.get())
    }

    fn want(&self, id: &str, o: &Opening) -> Vec<Rule> {
        opening_rules(id, o).into_iter().map(canonical_rule).collect()
    }

    fn compare(
        &mut self,
        seen: &Option<Table>,
        items: &[Item<'_, Vec<Rule>>],
        orphans: &[&str],
    ) -> Plan<Load, Failed> {
        table_plan(seen.as_ref(), items, orphans, self.any_too_long, firewall::listening)
    }

    fn act(
        &mut self,
        _: &Option<Table>,
        _: &[Item<'_, Vec<Rule>>],
        _: &[&str],
        load: &Load,
    ) -> Result<(), Failed> {
        make(load)
    }

    fn read_back(&mut self, _: &[Item<'_, Vec<Rule>>], load: &Load) -> Result<Option<Option<Table>>, Failed> {
        read_back(load).map(|()| None)
    }

    fn check(&mut self, _: &Option<Table>, _: &str, _: &Vec<Rule>) -> Result<(), Error> {
        Ok(())
    }

    fn check_gone(&self, _: &Option<Table>, _: &str) -> Result<(), Error> {
        Ok(())
    }

    fn here(&self) -> Option<String> {
        None
    }
}

/// The plan for the host's table, pure: from the table found, the openings that fit (held or
/// not), the orphans and whether some did not fit, the table to load (`Load`), each opening's
/// verdict from its own rules found by their comment, what was changed by hand outside every
/// opening's rules, and each orphan's detail. `listening` reads the listening sockets, only
/// when a new table is loaded, for the ports it closes.
pub(super) fn table_plan(
    found: Option<&Table>,
    items: &[Item<'_, Vec<Rule>>],
    orphans: &[&str],
    any_too_long: bool,
    listening: impl FnOnce() -> std::io::Result<Vec<Listener>>,
) -> Plan<Load, Failed> {
    // When every opening is held and no table of the host's is there, none is loaded: a filter
    // with policy drop would close what the node was found with (docs/decisions.md, "An
    // opening is held").
    let all_held = items.iter().all(|i| i.held);
    let nothing_to_load = items.is_empty() || (all_held && found.is_none());
    let want = (!nothing_to_load).then(|| wanted(items.iter().map(|i| (i.r.id.as_str(), i.o))));
    let ids: BTreeSet<&str> = items.iter().map(|i| i.r.id.as_str()).collect();
    let common_drift = match (&want, found) {
        (Some(w), Some(f)) => common_drift(f, w, &ids),
        (_, _) => Vec::new(),
    };
    let found_by_comment = found.map(by_comment);
    let verdicts = items
        .iter()
        .map(|i| match i.held {
            true => Verdict::HeldWithin,
            false => Verdict::Own {
                intact: found_by_comment.as_ref().is_some_and(|f| {
                    f.get(i.r.id.as_str()).is_some_and(|rules| rules.iter().copied().eq(i.want.iter()))
                }),
            },
        })
        .collect();
    let orphans = orphans
        .iter()
        .map(|id| match (found_by_comment.as_ref().is_some_and(|f| f.contains_key(id)), want.is_some()) {
            (false, _) => "its rule was already gone",
            (true, true) => "its rule was taken out of table inet mesh_host",
            (true, false) => "it was the last opening, so table inet mesh_host was removed",
        })
        .collect();
    let load = match (want, found) {
        (Some(w), Some(f)) if w == *f => Load::Keep,
        (Some(w), _) => Load::Replace(w),
        // Openings are declared and none could be loaded: the filter in force stays, rather
        // than the table going and every port with it.
        (None, _) if any_too_long => Load::Keep,
        (None, Some(_)) => Load::Remove,
        (None, None) => Load::Keep,
    };
    // The listening ports this filter closes, said before it is loaded (and by `plan`), so an
    // operator sees what a new filter cuts off (docs/decisions.md, "Ports the filter closes").
    // A table left as it is closes nothing new; reading every socket of a busy server on each
    // pass would be paid for nothing.
    let closes = match &load {
        Load::Replace(_) => listening().map(|listeners| {
            let open: BTreeSet<(Transport, u16)> =
                items.iter().map(|i| (transport(i.o.protocol), i.o.port.get())).collect();
            newly_closed(&listeners, found, &open)
        }),
        Load::Keep | Load::Remove => Ok(Vec::new()),
    };
    Plan { verdicts, change: Ok(load), common_drift, absent: found.is_none(), closes, orphans }
}

/// Why the filter could not be loaded, kept once and told to every opening.
pub(super) enum Failed {
    Nft(Arc<firewall::Error>),
    ReadBack(String),
}

impl Failed {
    pub(super) fn error(&self) -> Error {
        match self {
            Failed::Nft(e) => Error::Firewall(Arc::clone(e)),
            Failed::ReadBack(differs) => Error::FilterReadBack { differs: differs.clone() },
        }
    }
}

/// Replaces the table in one transaction, or removes it: the old filter stands until the new
/// one is complete (docs/firewall.md, "The host's filter").
fn make(load: &Load) -> Result<(), Failed> {
    let nft = |e| Failed::Nft(Arc::new(e));
    match load {
        Load::Keep => Ok(()),
        Load::Remove => firewall::remove_table().map_err(nft),
        Load::Replace(want) => firewall::load(batch(want)).map_err(nft),
    }
}

/// Reads the table back after `make`, whole: gone if removed, exactly as wanted if replaced.
fn read_back(load: &Load) -> Result<(), Failed> {
    let nft = |e| Failed::Nft(Arc::new(e));
    match load {
        Load::Keep => Ok(()),
        Load::Remove => match firewall::read_table().map_err(nft)? {
            None => Ok(()),
            Some(_) => Err(Failed::ReadBack("it is still there after it was removed".into())),
        },
        Load::Replace(want) => match firewall::read_table().map_err(nft)?.map(|o| parse(&o)) {
            None => Err(Failed::ReadBack("it is not there after it was loaded".into())),
            Some(found) if found == *want => Ok(()),
            Some(found) => {
                let ids: BTreeSet<&str> = want.rules.iter().filter_map(|r| r.comment.as_deref()).collect();
                let mut differs = common_drift(&found, want, &ids);
                let (found_by_comment, wanted_by_comment) = (by_comment(&found), by_comment(want));
                differs.extend(
                    ids.iter()
                        .filter(|id| found_by_comment.get(*id) != wanted_by_comment.get(*id))
                        .map(|id| format!("the rules of {id} differ")),
                );
                Err(Failed::ReadBack(differs.join(", ")))
            }
        },
    }
}

/// `make`, then `read_back`.
fn load(load: &Load) -> Result<(), Failed> {
    make(load)?;
    read_back(load)
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

pub(super) fn widen(declaration: &Declaration, orphans: &[(String, Record)]) -> Result<(), Failed> {
    let nft = |e| Failed::Nft(Arc::new(e));
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
    load(&Load::Replace(want))
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
            let e = Arc::new(e);
            for (_, result) in &mut done.declared {
                *result = Err(Error::Firewall(e.clone()));
            }
        }
    }
    done
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apply::opening::testing::opening;
    use crate::declaration::Cidr;
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
        let said = |closed: Vec<Closed>| closed.iter().map(Closed::to_string).collect::<Vec<_>>();
        assert_eq!(
            said(newly_closed(&listeners, None, &declared)),
            vec!["22/tcp (listening on 0.0.0.0, ::)", "53/udp (listening on ::)"],
            "with no table, every listening port not declared and not on loopback"
        );
        // A table of the host's that already drops 22 and lets 53/udp in.
        let table = wanted([("dns", &opening(53, "udp", &["10.0.0.0/8"]))]);
        assert_eq!(said(newly_closed(&listeners, Some(&table), &declared)), vec!["53/udp (listening on ::)"]);
        let mut open = table.clone();
        open.chains[0]["policy"] = json!("accept");
        assert_eq!(
            newly_closed(&listeners, Some(&open), &declared).len(),
            2,
            "a chain that accepts closes nothing"
        );
    }
}

#[cfg(test)]
mod plan_tests {
    use super::*;

    /// Two openings, 8080/tcp (`web.http`) and 53/udp (`dns.udp`), as a declaration gives them.
    fn declaration() -> Declaration {
        let text = r#"{"version": 1, "resources": [
            {"type": "opening", "id": "web.http", "port": 8080},
            {"type": "opening", "id": "dns.udp", "port": 53, "protocol": "udp"}
        ]}"#;
        Declaration::parse(text.as_bytes()).unwrap()
    }

    fn items<'d>(declaration: &'d Declaration, held: &[&str]) -> Vec<Item<'d, Vec<Rule>>> {
        declared_openings(declaration)
            .into_iter()
            .map(|(r, o)| Item {
                r,
                o,
                want: opening_rules(r.id.as_str(), o).into_iter().map(canonical_rule).collect(),
                held: held.contains(&r.id.as_str()),
            })
            .collect()
    }

    fn listening() -> std::io::Result<Vec<Listener>> {
        let l = |t, port| Listener { transport: t, addr: "0.0.0.0".parse().unwrap(), port };
        Ok(vec![l(Transport::Tcp, 22), l(Transport::Tcp, 8080)])
    }

    fn unread() -> std::io::Result<Vec<Listener>> {
        panic!("the sockets are read only when a new table is loaded")
    }

    fn plan_of(
        found: Option<&Table>,
        items: &[Item<'_, Vec<Rule>>],
        orphans: &[&str],
        listen: impl FnOnce() -> std::io::Result<Vec<Listener>>,
    ) -> (Load, Plan<Load, Failed>) {
        let mut plan = table_plan(found, items, orphans, false, listen);
        let load = std::mem::replace(&mut plan.change, Ok(Load::Keep));
        (load.unwrap_or_else(|_| panic!("the table's plan never fails")), plan)
    }

    #[test]
    fn no_table_found_loads_one_and_says_the_ports_it_closes() {
        let d = declaration();
        let items = items(&d, &[]);
        let (load, plan) = plan_of(None, &items, &[], listening);
        let want = wanted(items.iter().map(|i| (i.r.id.as_str(), i.o)));
        assert_eq!(load, Load::Replace(want));
        assert_eq!(plan.verdicts, vec![Verdict::Own { intact: false }; 2]);
        assert!(plan.absent && plan.common_drift.is_empty());
        let closes = plan.closes.unwrap();
        assert_eq!(
            closes.iter().map(Closed::to_string).collect::<Vec<_>>(),
            vec!["22/tcp (listening on 0.0.0.0)"],
            "8080 is declared, 22 is not"
        );
    }

    #[test]
    fn a_table_as_wanted_is_kept_and_its_sockets_are_not_read() {
        let d = declaration();
        let items = items(&d, &[]);
        let found = wanted(items.iter().map(|i| (i.r.id.as_str(), i.o)));
        let (load, plan) = plan_of(Some(&found), &items, &["old.ssh"], unread);
        assert_eq!(load, Load::Keep);
        assert_eq!(plan.verdicts, vec![Verdict::Own { intact: true }; 2]);
        assert!(!plan.absent && plan.common_drift.is_empty());
        assert_eq!(plan.orphans, vec!["its rule was already gone"]);
    }

    #[test]
    fn a_hand_edit_is_one_openings_and_the_common_parts_told_apart() {
        let d = declaration();
        let items = items(&d, &[]);
        let mut found = wanted(items.iter().map(|i| (i.r.id.as_str(), i.o)));
        // The rule of dns.udp deleted by hand, a set added, and an orphan's rule left in.
        found.rules.retain(|r| r.comment.as_deref() != Some("dns.udp"));
        found.others.push("a set \"extra\"".to_owned());
        found
            .rules
            .extend(opening_rules("old.ssh", &crate::apply::opening::testing::opening(22, "tcp", &[])));
        let (load, plan) = plan_of(Some(&found), &items, &["old.ssh"], listening);
        assert!(matches!(load, Load::Replace(_)));
        assert_eq!(plan.verdicts, vec![Verdict::Own { intact: true }, Verdict::Own { intact: false }]);
        assert_eq!(
            plan.common_drift,
            vec![
                "1 rule(s) the declaration does not hold were added to it",
                "a set \"extra\" was added to it"
            ]
        );
        assert_eq!(plan.orphans, vec!["its rule was taken out of table inet mesh_host"]);
        let closes: Vec<String> = plan.closes.unwrap().iter().map(Closed::to_string).collect();
        assert_eq!(closes, vec!["22/tcp (listening on 0.0.0.0)"], "the orphan's rule let 22 in");
    }

    #[test]
    fn held_openings_are_in_the_table_and_none_is_loaded_when_all_are_held_and_none_is_there() {
        let d = declaration();
        let some = items(&d, &["dns.udp"]);
        let (load, plan) = plan_of(None, &some, &[], listening);
        assert!(
            matches!(load, Load::Replace(ref t) if t.rules.iter().any(|r| r.comment.as_deref() == Some("dns.udp")))
        );
        assert_eq!(plan.verdicts, vec![Verdict::Own { intact: false }, Verdict::HeldWithin]);
        let all = items(&d, &["web.http", "dns.udp"]);
        let (load, plan) = plan_of(None, &all, &[], unread);
        assert_eq!(load, Load::Keep, "a filter with policy drop would close what the node was found with");
        assert_eq!(plan.verdicts, vec![Verdict::HeldWithin; 2]);
    }

    #[test]
    fn the_last_opening_gone_removes_the_table_unless_openings_did_not_fit() {
        let d = declaration();
        let found = wanted(items(&d, &[]).iter().map(|i| (i.r.id.as_str(), i.o)));
        let (load, plan) = plan_of(Some(&found), &[], &["web.http", "gone.x"], unread);
        assert_eq!(load, Load::Remove);
        assert_eq!(
            plan.orphans,
            vec!["it was the last opening, so table inet mesh_host was removed", "its rule was already gone"]
        );
        let plan = table_plan(Some(&found), &[], &["web.http"], true, unread);
        assert_eq!(
            plan.change.ok(),
            Some(Load::Keep),
            "the filter in force stays rather than every port going"
        );
        let (load, _) = plan_of(None, &[], &["web.http"], unread);
        assert_eq!(load, Load::Keep, "no table, nothing to remove");
    }
}
