//! Openings made in ufw, found active on an adopted node: each opening's rules carry the
//! comment `mesh-host ID`, and are read back in ufw's saved rules and in the filter in force;
//! the flip from ufw to the host's own table retires it.
//!
//! `ufw_rules` and `ufw_lets_in` are pure and unit-tested; `apply_ufw` and `flip` act through
//! `system::ufw` and read back.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::driver::{apply_with, flip_from, Compared, Filter, Leaving};
use super::nft::widen;
use super::plan::Home;
use super::{declared_openings, network, transport, Done};
use crate::apply::{Error, Options};
use crate::declaration::{Declaration, Opening};
use crate::store::{Record, Store};
use crate::system::firewall::Transport;
use crate::system::ufw;

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
/// port is closed meanwhile), then read back. The host's table protects the node until ufw is
/// up (docs/decisions.md, "The way back").
pub(super) fn apply_ufw(
    declaration: &Declaration,
    store: &Store,
    opts: &Options,
    orphans: Vec<(String, Record)>,
    enable: bool,
) -> Done {
    if enable && !opts.dry_run {
        if let Err(e) = widen(declaration, &orphans) {
            return Done::failed(&declared_openings(declaration), orphans, || e.error());
        }
    }
    apply_with(&mut InUfw { enable }, declaration, store, opts, orphans)
}

/// ufw, found active on an adopted node, or enabled again on the way back (`enable`).
struct InUfw {
    enable: bool,
}

/// ufw as read at one moment: its saved rules as `ufw show added` lists them, and the rules in
/// force as `iptables -S` prints them.
type Listed = (Vec<String>, Vec<String>);

impl Filter for InUfw {
    type Seen = Listed;
    type Want = Vec<UfwRule>;
    type Fault = ufw::Error;
    const HOME: Home = Home::Ufw;

    fn error(fault: &Arc<ufw::Error>) -> Error {
        Error::Ufw(Arc::clone(fault))
    }

    fn read(&mut self) -> Result<Listed, ufw::Error> {
        Ok((ufw::added()?, ufw::in_force()?))
    }

    // An opening of a module not taken yet, whose port a rule of ufw's own already lets in, is
    // held: nothing of the host's is added beside the operator's rule (docs/decisions.md, "An
    // opening is held").
    fn lets_in(&self, (added, _): &Listed, o: &Opening) -> bool {
        ufw_lets_in(added, transport(o.protocol), o.port.get())
    }

    fn want(&self, id: &str, o: &Opening) -> Vec<UfwRule> {
        ufw_rules(id, o)
    }

    fn compare(
        &mut self,
        (added, in_force): &Listed,
        id: &str,
        want: &Vec<UfwRule>,
    ) -> Result<Compared, ufw::Error> {
        let have = ufw_added_for(added, id);
        let mut a: Vec<&String> = have.iter().map(|(line, _)| line).collect();
        let mut b: Vec<&String> = want.iter().map(|w| &w.shown).collect();
        a.sort();
        b.sort();
        let saved = a == b;
        let loaded = want.iter().flat_map(|w| &w.in_force).all(|l| in_force.contains(l));
        // Saved and not in force is put right by the read-back's reload, not by adding again.
        Ok(Compared { intact: saved && loaded, change: !saved })
    }

    fn put(&mut self, (added, _): &Listed, id: &str, want: &Vec<UfwRule>) -> Result<(), ufw::Error> {
        for (_, words) in ufw_added_for(added, id) {
            ufw::delete(&words)?;
        }
        want.iter().try_for_each(|w| ufw::add(&w.words, &ufw_comment(id)))
    }

    fn find_orphan(&mut self, (added, _): &Listed, id: &str) -> Result<bool, ufw::Error> {
        Ok(!ufw_added_for(added, id).is_empty())
    }

    fn delete(&mut self, (added, _): &Listed, id: &str) -> Result<(), ufw::Error> {
        ufw_added_for(added, id).iter().try_for_each(|(_, words)| ufw::delete(words))
    }

    fn finish(&mut self, _: &Listed, _: &[&Vec<UfwRule>], _: &[&str]) -> Result<(), ufw::Error> {
        if self.enable {
            ufw::enable()?;
        }
        Ok(())
    }

    // A rule saved and not in force (the filter flushed by hand) is put in force by loading
    // ufw's saved rules again: `ufw show added` shows what is saved, not what is in force
    // (docs/firewall.md, "The firewall found on an adopted node").
    fn read_back(&mut self, wanted: &[&Vec<UfwRule>]) -> Result<Listed, ufw::Error> {
        let (added, in_force) = self.read()?;
        if wanted.iter().copied().flatten().flat_map(|w| &w.in_force).all(|l| in_force.contains(l)) {
            return Ok((added, in_force));
        }
        ufw::reload()?;
        self.read()
    }

    fn check(&mut self, (added, in_force): &Listed, id: &str, want: &Vec<UfwRule>) -> Result<(), Error> {
        let have = ufw_added_for(added, id);
        let missing: Vec<&String> =
            want.iter().map(|w| &w.shown).filter(|s| !have.iter().any(|(l, _)| l == *s)).collect();
        let not_loaded: Vec<&String> =
            want.iter().flat_map(|w| &w.in_force).filter(|l| !in_force.contains(l)).collect();
        if have.len() == want.len() && missing.is_empty() && not_loaded.is_empty() {
            return Ok(());
        }
        Err(Error::UfwReadBack {
            id: id.to_owned(),
            differs: format!(
                "saved {} rule(s) under its comment for {} wanted, missing {missing:?}; not in force {not_loaded:?}",
                have.len(),
                want.len()
            ),
        })
    }

    fn check_gone(&self, (added, _): &Listed, id: &str) -> Result<(), Error> {
        if ufw_added_for(added, id).is_empty() {
            return Ok(());
        }
        Err(Error::UfwReadBack {
            id: id.to_owned(),
            differs: "its rules are still in ufw after deleting them".into(),
        })
    }

    fn here(&self) -> String {
        "in ufw, found active on this adopted node".to_owned()
    }

    fn gone(was_there: bool) -> &'static str {
        if was_there {
            "its rules were deleted from ufw"
        } else {
            "its rules were already gone from ufw"
        }
    }
}

/// The flip, on a node whose openings were made in ufw and whose declaration no longer says
/// `adoption`: the host's own filter is loaded (the caller has checked that everything else
/// applied), then ufw is disabled, then the host's rules are deleted from ufw; the orphan
/// openings are told last. Anything that fails after the load fails every opening, so their
/// records stay those of ufw and the next pass tries the rest again: the filter already loaded
/// is found as wanted, ufw is disabled, its rules deleted (docs/firewall.md, "The firewall found
/// on an adopted node").
pub(super) fn flip(
    declaration: &Declaration,
    store: &Store,
    opts: &Options,
    orphans: Vec<(String, Record)>,
) -> Done {
    let leaving = Leaving {
        from: "ufw",
        home: Home::Ufw,
        moved:
            "moved from ufw into table inet mesh_host; ufw was disabled and the host's rules in it deleted",
        orphan_removed: "its rules were deleted from ufw, which was disabled",
    };
    let retire =
        |ids: &[String]| if opts.dry_run { Ok(()) } else { retire_ufw(ids).map_err(std::sync::Arc::new) };
    flip_from(&leaving, declaration, store, opts, orphans, retire, Error::Flip)
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
    use crate::apply::opening::testing::opening;

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
}
