//! Openings made in firewalld, found running on an adopted node.
//!
//! firewalld keeps two sets of rules, both read back here: the permanent configuration
//! (saved, loaded at its start or reload) and the runtime one (in force). The host never
//! reloads firewalld, since a reload drops what an operator put in force at runtime only
//! (docs/decisions.md, "Openings in firewalld are labelled by a saved service"), so each
//! opening is written to both:
//!
//! - permanent: a service `mesh-host-ID` (the opening's port; its description names the
//!   resource), and in the default zone one rich rule per `from` network (or one for
//!   anywhere) that accepts that service: `rule family="ipv4" source address="10.0.0.0/8"
//!   service name="mesh-host-web_2eadmin" accept`. The service's name is the label.
//! - runtime: the same rule with the port written out, `rule ... port port="22"
//!   protocol="tcp" accept`, since a service saved after firewalld's start is unknown to the
//!   runtime until a reload. Rich rules carry no label, so the runtime rules that are the
//!   host's are the ones its saved services and rules spell out.
//!
//! `service_name`, `rules` and `runtime_of` are pure and unit-tested; `apply` acts through
//! `system::firewalld` and reads back. Why D-Bus, and the offline tool only while firewalld is
//! stopped: docs/firewall.md, "Why D-Bus, and `firewall-offline-cmd` only while stopped".

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use super::plan::Home;
use super::{driver, nft, Done};
use crate::apply::opening;
use crate::apply::{Error, FirewalldMove, Options};
use crate::declaration::{Declaration, Opening};
use crate::store::{Record, Store};
use crate::system::firewall::Transport;
use crate::system::firewalld::{self, offline, Firewalld, Service};

/// The prefix of every service the host saves in firewalld.
const PREFIX: &str = "mesh-host-";

/// The service that labels an opening in firewalld. firewalld allows letters, digits, `_`
/// and `-` in a service's name, and ids also have `.`: `.` is written `_2e` and `_` is
/// written `_5f`, so two ids never share a service (docs/decisions.md, "Openings in firewalld
/// are labelled by a saved service").
pub(super) fn service_name(id: &str) -> String {
    let mut name = PREFIX.to_owned();
    for c in id.chars() {
        match c {
            '.' => name.push_str("_2e"),
            '_' => name.push_str("_5f"),
            c => name.push(c),
        }
    }
    name
}

/// An opening as firewalld holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Rules {
    /// Its saved service.
    pub service: Service,
    /// Its saved rich rules in the zone, naming the service.
    pub permanent: Vec<String>,
    /// Its rich rules in force, with the port written out.
    pub runtime: Vec<String>,
}

/// The end of a saved rich rule that accepts this service.
fn accepts_service(service: &str) -> String {
    format!(" service name=\"{service}\" accept")
}

fn accepts_port(port: &str, protocol: &str) -> String {
    format!(" port port=\"{port}\" protocol=\"{protocol}\" accept")
}

/// An opening's rules in firewalld: one rule for anywhere (IPv4 and IPv6), or one per `from`
/// network, with its host bits cleared and a single address bare, as the host's own filter has
/// them (firewalld keeps an address as it is given).
pub(super) fn rules(id: &str, o: &Opening) -> Rules {
    let name = service_name(id);
    let (port, protocol) = (o.port.get().to_string(), opening::transport(o.protocol).as_str().to_owned());
    let mut seen = BTreeSet::new();
    let starts: Vec<String> = if o.from.is_empty() {
        vec!["rule".to_owned()]
    } else {
        o.from
            .iter()
            .map(opening::network)
            .filter(|n| seen.insert(*n))
            .map(|(addr, prefix)| {
                let (family, full) = if addr.is_ipv4() { ("ipv4", 32) } else { ("ipv6", 128) };
                let source = if prefix == full { addr.to_string() } else { format!("{addr}/{prefix}") };
                format!("rule family=\"{family}\" source address=\"{source}\"")
            })
            .collect()
    };
    Rules {
        service: Service {
            short: format!("mesh-host {id}"),
            description: format!("Opened by mesh-host for the declared opening {id} ({port}/{protocol})."),
            ports: vec![(port.clone(), protocol.clone())],
        },
        permanent: starts.iter().map(|s| format!("{s}{}", accepts_service(&name))).collect(),
        runtime: starts.iter().map(|s| format!("{s}{}", accepts_port(&port, &protocol))).collect(),
    }
}

/// The saved rich rules that accept this service.
fn saved_for<'a>(permanent: &'a [String], service: &str) -> Vec<&'a String> {
    let end = accepts_service(service);
    permanent.iter().filter(|r| r.ends_with(&end)).collect()
}

/// The runtime rules that saved rules for a service stand for, given the service's ports: what
/// the host put in force for it when it saved them. A rich rule carries no comment, so this is
/// how the host's rules in force are told from the operator's (docs/decisions.md, "Which rules
/// in force are the host's").
pub(super) fn runtime_of(saved: &[&String], service: &str, ports: &[(String, String)]) -> Vec<String> {
    let end = accepts_service(service);
    saved
        .iter()
        .filter_map(|r| r.strip_suffix(&end))
        .flat_map(|start| ports.iter().map(move |(p, proto)| format!("{start}{}", accepts_port(p, proto))))
        .collect()
}

/// Whether a port of firewalld's own zone settings (`firewall-cmd --add-port`) lets this port
/// in. Its services and rich rules are not resolved, so a port opened through them is not
/// found open.
fn lets_in(ports: &[(String, String)], t: Transport, port: u16) -> bool {
    ports.iter().any(|(p, proto)| {
        proto == t.as_str()
            && match p.split_once('-') {
                Some((lo, hi)) => {
                    lo.parse().is_ok_and(|lo: u16| hi.parse().is_ok_and(|hi: u16| (lo..=hi).contains(&port)))
                }
                None => p.parse() == Ok(port),
            }
    })
}

/// firewalld as read at one moment: the default zone's rules, runtime and saved, and its ports.
struct Zone {
    zone: String,
    runtime: Vec<String>,
    permanent: Vec<String>,
    ports: Vec<(String, String)>,
    services: BTreeSet<String>,
}

fn read(fw: &Firewalld) -> Result<Zone, firewalld::Error> {
    let zone = fw.default_zone()?;
    Ok(Zone {
        runtime: fw.runtime_rich_rules(&zone)?,
        permanent: fw.permanent_rich_rules(&zone)?,
        ports: fw.runtime_ports(&zone)?,
        services: fw.service_names()?,
        zone,
    })
}

fn sorted<T: Ord + Clone>(v: &[T]) -> Vec<T> {
    let mut v = v.to_vec();
    v.sort();
    v
}

/// Openings made in firewalld, found running on an adopted node: each opening's service saved,
/// its saved rules and its rules in force added, whatever else the host had for it (an older
/// port or `from`) taken out after; orphan openings' rules and services deleted. Then read back,
/// saved and in force. firewalld's own rules and the operator's are never touched.
pub(super) fn apply(
    declaration: &Declaration,
    store: &Store,
    opts: &Options,
    orphans: Vec<(String, Record)>,
    fw: &Firewalld,
) -> Done {
    let mut f = InFirewalld { fw, zone: String::new(), found: HashMap::new(), stale: BTreeSet::new() };
    driver::apply_with(&mut f, declaration, store, opts, orphans)
}

/// firewalld, found running, as the driver works in it.
struct InFirewalld<'a> {
    fw: &'a Firewalld,
    /// The default zone, as first read.
    zone: String,
    /// Each opening's service as found, and whether it was saved as wanted: read back again
    /// only where something was changed.
    found: HashMap<String, (bool, Option<Service>)>,
    /// The rules in force the host had for its openings, worked out from what is saved: taken
    /// out once every wanted one is in, unless wanted.
    stale: BTreeSet<String>,
}

impl driver::Filter for InFirewalld<'_> {
    type Seen = Zone;
    type Want = Rules;
    type Fault = firewalld::Error;
    const HOME: Home = Home::Firewalld;

    fn error(fault: &Arc<firewalld::Error>) -> Error {
        Error::Firewalld(Arc::clone(fault))
    }

    fn read(&mut self) -> Result<Zone, firewalld::Error> {
        let zone = read(self.fw)?;
        self.zone = zone.zone.clone();
        Ok(zone)
    }

    // An opening of a module not taken yet, whose port firewalld already lets in, is held:
    // nothing of the host's is added beside the operator's setting (docs/decisions.md, "An
    // opening is held behind firewalld").
    fn lets_in(&self, seen: &Zone, o: &Opening) -> bool {
        lets_in(&seen.ports, opening::transport(o.protocol), o.port.get())
    }

    fn want(&self, id: &str, o: &Opening) -> Rules {
        rules(id, o)
    }

    fn compare(&mut self, seen: &Zone, id: &str, want: &Rules) -> Result<driver::Compared, firewalld::Error> {
        let name = service_name(id);
        let service = self.fw.service(&name, &seen.services)?;
        let have = saved_for(&seen.permanent, &name);
        let saved = service.as_ref() == Some(&want.service)
            && sorted(&have.iter().map(|s| (*s).clone()).collect::<Vec<_>>()) == sorted(&want.permanent);
        let in_force = want.runtime.iter().all(|w| seen.runtime.contains(w));
        if let Some(s) = &service {
            self.stale.extend(runtime_of(&have, &name, &s.ports));
        }
        self.found.insert(id.to_owned(), (saved, service));
        // `put` changes only what differs.
        Ok(driver::Compared { intact: saved && in_force, change: true })
    }

    // What is wanted goes in before what is stale goes out: no moment with the port closed
    // (docs/decisions.md, "Which rules in force are the host's").
    fn put(&mut self, seen: &Zone, id: &str, want: &Rules) -> Result<(), firewalld::Error> {
        let (fw, zone) = (self.fw, &self.zone);
        let name = service_name(id);
        let service = self.found.get(id).and_then(|(_, s)| s.as_ref());
        if service != Some(&want.service) {
            fw.put_service(&name, &want.service, service.is_some())?;
        }
        let have = saved_for(&seen.permanent, &name);
        for rule in want.permanent.iter().filter(|w| !have.contains(w)) {
            fw.add_permanent_rich_rule(zone, rule)?;
        }
        for rule in have.iter().filter(|h| !want.permanent.contains(h)) {
            fw.remove_permanent_rich_rule(zone, rule)?;
        }
        for rule in want.runtime.iter().filter(|w| !seen.runtime.contains(w)) {
            fw.add_runtime_rich_rule(zone, rule)?;
        }
        Ok(())
    }

    fn find_orphan(&mut self, seen: &Zone, id: &str) -> Result<bool, firewalld::Error> {
        let name = service_name(id);
        let have = saved_for(&seen.permanent, &name);
        // After an operator's reload, the saved rules are in force as they are saved.
        self.stale.extend(have.iter().map(|r| (*r).clone()));
        let service = self.fw.service(&name, &seen.services)?;
        if let Some(s) = &service {
            self.stale.extend(runtime_of(&have, &name, &s.ports));
        }
        Ok(!have.is_empty() || service.is_some())
    }

    fn delete(&mut self, seen: &Zone, id: &str) -> Result<(), firewalld::Error> {
        for rule in saved_for(&seen.permanent, &service_name(id)) {
            self.fw.remove_permanent_rich_rule(&self.zone, rule)?;
        }
        Ok(())
    }

    fn finish(&mut self, seen: &Zone, wanted: &[&Rules], orphans: &[&str]) -> Result<(), firewalld::Error> {
        let wanted_runtime: BTreeSet<&String> = wanted.iter().flat_map(|w| &w.runtime).collect();
        for rule in self.stale.iter().filter(|r| !wanted_runtime.contains(r)) {
            if seen.runtime.contains(rule) {
                self.fw.remove_runtime_rich_rule(&self.zone, rule)?;
            }
        }
        for id in orphans {
            let name = service_name(id);
            if seen.services.contains(&name) {
                self.fw.remove_service(&name)?;
            }
        }
        Ok(())
    }

    fn read_back(&mut self, _: &[&Rules]) -> Result<Zone, firewalld::Error> {
        read(self.fw)
    }

    fn check(&mut self, now: &Zone, id: &str, want: &Rules) -> Result<(), Error> {
        let name = service_name(id);
        let (saved, found) = self.found.get(id).cloned().unwrap_or((false, None));
        let service = if saved {
            found
        } else {
            self.fw.service(&name, &now.services).map_err(|e| Error::Firewalld(Arc::new(e)))?
        };
        let mut differs = Vec::new();
        if service.as_ref() != Some(&want.service) {
            differs.push(match service {
                None => format!("its service {name} is not saved"),
                Some(s) => format!("its service {name} is saved as {s:?}"),
            });
        }
        let have: Vec<String> = saved_for(&now.permanent, &name).into_iter().cloned().collect();
        if sorted(&have) != sorted(&want.permanent) {
            differs.push(format!("saved rules {have:?}, wanted {:?}", want.permanent));
        }
        let missing: Vec<&String> = want.runtime.iter().filter(|w| !now.runtime.contains(w)).collect();
        if !missing.is_empty() {
            differs.push(format!("not in force {missing:?}"));
        }
        if differs.is_empty() {
            return Ok(());
        }
        Err(Error::FirewalldReadBack { id: id.to_owned(), differs: differs.join("; ") })
    }

    fn check_gone(&self, now: &Zone, id: &str) -> Result<(), Error> {
        let name = service_name(id);
        if saved_for(&now.permanent, &name).is_empty() && !now.services.contains(&name) {
            return Ok(());
        }
        Err(Error::FirewalldReadBack {
            id: id.to_owned(),
            differs: format!(
                "its saved rules or its service {name} are still in firewalld after deleting them"
            ),
        })
    }

    fn here(&self) -> String {
        format!("in firewalld's zone {}, found running on this adopted node", self.zone)
    }

    fn gone(was_there: bool) -> &'static str {
        if was_there {
            "its rules and its service were deleted from firewalld"
        } else {
            "its rules were already gone from firewalld"
        }
    }
}

/// firewalld's unit.
const UNIT: &str = "firewalld.service";

/// How long firewalld may take to answer on the bus once systemd started it.
const START_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// The flip, on a node whose openings were made in firewalld and whose declaration no longer
/// says `adoption`: the host's own filter is loaded (the caller has checked that everything else
/// applied), then firewalld is retired (`retire`); the orphan openings are told last. Anything
/// that fails after the load fails every opening, so their records stay those of firewalld and
/// the next pass tries again: the filter already loaded is found as wanted.
pub(super) fn flip(
    declaration: &Declaration,
    store: &Store,
    opts: &Options,
    orphans: Vec<(String, Record)>,
) -> Done {
    let leaving = driver::Leaving {
        from: "firewalld",
        home: Home::Firewalld,
        moved: "moved from firewalld into table inet mesh_host; firewalld was stopped and disabled, and the host's services and rules deleted from its saved configuration",
        orphan_removed: "its rules and service were deleted from firewalld, which was stopped",
    };
    let retire = |ids: &[String]| if opts.dry_run { Ok(()) } else { retire(opts, ids).map_err(Arc::new) };
    driver::flip_from(&leaving, declaration, store, opts, orphans, retire, |reason| Error::FlipFirewalld {
        reason,
    })
}

/// Retires firewalld, the host's own filter already loaded: its unit disabled, then stopped
/// (firewalld takes its rules out of force as it stops), read back (its bus name without an
/// owner, its unit inactive and disabled); then the host's services and rules deleted from its
/// saved configuration, offline, and read back. If disabling or stopping fails, the unit is
/// enabled again if it was, so firewalld stays as it was, in force with the host's openings.
/// If the deletion fails, firewalld stays retired and the next pass deletes what is left
/// (docs/decisions.md, "Retiring firewalld").
fn retire(opts: &Options, ids: &[String]) -> Result<(), FirewalldMove> {
    let bus = opts.bus.as_deref();
    let systemd = crate::system::Systemd::connect(bus)?;
    let boot = systemd.boot(UNIT)?;
    let running = match Firewalld::running(bus) {
        Ok(found) => found.is_some(),
        Err(firewalld::Error::Connect { .. }) => false,
        Err(e) => return Err(e.into()),
    };
    let stopped = systemd
        .set_boot(UNIT, false)
        .map_err(FirewalldMove::from)
        .and_then(|()| Ok(crate::system::firewalld::failpoint("stop")?))
        .and_then(|()| if running { Ok(systemd.stop(UNIT)?) } else { Ok(()) });
    if let Err(e) = stopped {
        if boot == "enabled" {
            if let Err(again) = systemd.set_boot(UNIT, true) {
                return Err(FirewalldMove::NotEnabledAgain { failed: Box::new(e), again });
            }
        }
        return Err(e);
    }
    check_retired(&systemd, bus)?;
    let zone = offline::default_zone()?;
    let saved = offline::rich_rules(&zone)?;
    for id in ids {
        let name = service_name(id);
        for rule in saved_for(&saved, &name) {
            offline::remove_rich_rule(&zone, rule)?;
        }
        if offline::has_service(&name)? {
            offline::remove_service(&name)?;
        }
    }
    let left = offline::rich_rules(&zone)?;
    if let Some(id) = ids.iter().find(|id| !saved_for(&left, &service_name(id)).is_empty()) {
        return Err(FirewalldMove::RulesLeft { id: id.clone(), zone });
    }
    Ok(())
}

fn check_retired(systemd: &crate::system::Systemd, bus: Option<&str>) -> Result<(), FirewalldMove> {
    let state = systemd.state(UNIT)?;
    let boot = systemd.boot(UNIT)?;
    let answers = match Firewalld::running(bus) {
        Ok(Some(_)) => true,
        Ok(None) | Err(firewalld::Error::Connect { .. }) => false,
        Err(e) => return Err(e.into()),
    };
    if !state.stopped() || answers || boot == "enabled" {
        return Err(FirewalldMove::NotRetired { state: Box::new(state), boot, answers });
    }
    Ok(())
}

/// The way back: a declaration with `adoption` returning to a node whose firewalld the host
/// retired. The host's table, still in force, is made to let the declared openings in too
/// (`nft::widen_for_way_back`), so a new one is open before firewalld, started without the
/// orphans, closes theirs. The openings are saved in firewalld's configuration (offline), then firewalld
/// is enabled and started, so it starts with them in force and never refuses a declared port;
/// then they are read back over D-Bus (and put in force with the port written out, as on any
/// pass), and only then does the host's own table go. Orphans leave after, through firewalld
/// (docs/decisions.md, "The way back to firewalld").
pub(super) fn way_back(
    declaration: &Declaration,
    store: &Store,
    opts: &Options,
    orphans: Vec<(String, Record)>,
) -> Done {
    let bus = opts.bus.as_deref();
    let started = || -> Result<Option<Firewalld>, FirewalldMove> {
        if opts.dry_run {
            return Ok(None);
        }
        nft::widen_for_way_back(declaration, &orphans).map_err(|e| FirewalldMove::Widen(Box::new(e)))?;
        save_offline(declaration)?;
        let systemd = crate::system::Systemd::connect(bus)?;
        crate::system::firewalld::failpoint("start")?;
        systemd.set_boot(UNIT, true)?;
        systemd.start(UNIT)?;
        let began = std::time::Instant::now();
        loop {
            match Firewalld::running(bus) {
                Ok(Some(fw)) => return Ok(Some(fw)),
                Ok(None) | Err(firewalld::Error::NotRunning(_)) if began.elapsed() < START_WAIT => {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                Ok(None) => return Err(FirewalldMove::NoAnswer { secs: START_WAIT.as_secs() }),
                Err(e) => return Err(e.into()),
            }
        }
    };
    match started() {
        Ok(Some(fw)) => {
            nft::without_own_table(apply(declaration, store, opts, orphans, &fw), opts, "firewalld")
        }
        // `plan`: what the host's table holds now is what is reported.
        Ok(None) => nft::apply(declaration, store, opts, orphans),
        Err(reason) => {
            let reason = Arc::new(reason);
            Done::failed(&opening::declared_openings(declaration), orphans, || Error::WayBackFirewalld {
                reason: reason.clone(),
            })
        }
    }
}

/// Saves every declared opening in a stopped firewalld's configuration: its service and its
/// rules in the default zone, anything else saved for it deleted.
fn save_offline(declaration: &Declaration) -> Result<(), firewalld::Error> {
    let zone = offline::default_zone()?;
    let saved = offline::rich_rules(&zone)?;
    for (r, o) in opening::declared_openings(declaration) {
        let want = rules(r.id.as_str(), o);
        let name = service_name(r.id.as_str());
        if offline::service_ports(&name)?.as_ref() != Some(&want.service.ports) {
            offline::put_service(&name, &want.service)?;
        }
        let have = saved_for(&saved, &name);
        for rule in want.permanent.iter().filter(|w| !have.contains(w)) {
            offline::add_rich_rule(&zone, rule)?;
        }
        for rule in have.iter().filter(|h| !want.permanent.contains(h)) {
            offline::remove_rich_rule(&zone, rule)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn opening(port: u16, protocol: &str, from: &[&str]) -> Opening {
        serde_json::from_value(json!({"port": port, "protocol": protocol, "from": from})).unwrap()
    }

    #[test]
    fn a_service_name_is_an_id_firewalld_accepts_and_never_another_ids() {
        assert_eq!(service_name("web.http"), "mesh-host-web_2ehttp");
        assert_eq!(service_name("a_b-c"), "mesh-host-a_5fb-c");
        assert_ne!(service_name("a._b"), service_name("a_.b"));
        assert_ne!(service_name("a.5f"), service_name("a_"));
        let name = service_name("x.y_z-0");
        assert!(name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-'));
    }

    #[test]
    fn an_opening_is_written_as_firewalld_lists_it() {
        let any = rules("dns.udp", &opening(53, "udp", &[]));
        assert_eq!(any.permanent, vec![r#"rule service name="mesh-host-dns_2eudp" accept"#]);
        assert_eq!(any.runtime, vec![r#"rule port port="53" protocol="udp" accept"#]);
        assert_eq!(any.service.ports, vec![("53".to_owned(), "udp".to_owned())]);
        assert_eq!(any.service.short, "mesh-host dns.udp");
        let from =
            rules("web.admin", &opening(22, "tcp", &["10.1.2.3/8", "10.9.9.9/8", "192.0.2.7", "fd00::1/8"]));
        assert_eq!(
            from.runtime,
            vec![
                r#"rule family="ipv4" source address="10.0.0.0/8" port port="22" protocol="tcp" accept"#,
                r#"rule family="ipv4" source address="192.0.2.7" port port="22" protocol="tcp" accept"#,
                r#"rule family="ipv6" source address="fd00::/8" port port="22" protocol="tcp" accept"#,
            ],
            "host bits cleared, the same network once, a single address bare"
        );
        assert_eq!(
            from.permanent[0],
            r#"rule family="ipv4" source address="10.0.0.0/8" service name="mesh-host-web_2eadmin" accept"#
        );
    }

    #[test]
    fn the_runtime_rules_of_a_saved_opening_are_spelled_out_from_its_service() {
        let old = rules("web.admin", &opening(22, "tcp", &["10.0.0.0/8"]));
        let name = service_name("web.admin");
        let mut saved = old.permanent.clone();
        saved.push(r#"rule service name="ssh" accept"#.to_owned());
        saved.push(
            r#"rule family="ipv4" source address="10.0.0.0/8" service name="mesh-host-web_2eadmin2" accept"#
                .to_owned(),
        );
        let mine = saved_for(&saved, &name);
        assert_eq!(mine.len(), 1, "the operator's rule and another id's are not this opening's");
        assert_eq!(runtime_of(&mine, &name, &old.service.ports), old.runtime);
    }

    #[test]
    fn a_port_of_the_zone_is_found_open() {
        let ports = vec![("22".to_owned(), "tcp".to_owned()), ("6000-6010".to_owned(), "udp".to_owned())];
        assert!(lets_in(&ports, Transport::Tcp, 22));
        assert!(!lets_in(&ports, Transport::Udp, 22));
        assert!(lets_in(&ports, Transport::Udp, 6005));
        assert!(!lets_in(&ports, Transport::Udp, 6011));
    }
}
