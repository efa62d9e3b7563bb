//! Each agent in a network namespace of its own, so that one node can be cut off from etcd
//! alone, or given a slow, lossy link (issue 42): a bridge in the host's namespace, on whose
//! address the etcd members listen besides loopback, and a veth pair from it into each agent's
//! namespace; in the seeded run the operator (its commands and drivers) in one too.
//!
//! - A cut is an nftables table in the agent's namespace dropping everything it sends to the
//!   bridge's address; the heal deletes the table.
//! - A slow, lossy link (this kernel has no `sch_netem`): an nftables table in the agent's
//!   namespace dropping a random share of what it sends to etcd and of what it receives from it
//!   (`numgen random mod 100 < P`), and a token bucket (`tbf`, a low rate) on both ends of its
//!   veth pair, so that what is queued waits for its turn; the heal deletes the table and both
//!   qdiscs.
//!
//! Every run's names are its own: a run takes the first free slot `s` of 1-15 (a lock held for
//! the run's life, `/run/mesh-host-robust/net-S.lock`), and names its bridge `mhrobustS`, its
//! subnet 10.231.S.0/24, its namespaces `mh-robust{S}-ro-N` and its veths `mhrSxIh` (the
//! bridge's end) and `mhrSxIn`. What a run that died left behind in a slot is removed by the
//! next run to take the slot's lock, never while a live run holds it: so two seeded runs, or a
//! seeded run and directed ones, share the machine.

use std::process::Command;

/// The nftables table of a cut, in the agent's namespace.
const CUT: &str = "mh_robust_cut";
/// The nftables table of a lossy link, in the agent's namespace.
const LOSSY: &str = "mh_robust_lossy";
/// The slots' locks.
const LOCKS: &str = "/run/mesh-host-robust";
/// The slots: 1 to `SLOTS - 1`.
const SLOTS: u8 = 16;
/// The namespaces a slot's cleanup looks for (a run of more agents than this is refused).
const MAX_AGENTS: usize = 16;
/// The index of the operator's namespace (its commands and drivers), when the run has one.
pub const OPERATOR: usize = MAX_AGENTS;

/// `ip ARGS` (or any command), its failure an error naming the command and what it said.
fn run(program: &str, args: &[&str]) -> Result<(), String> {
    output(program, args).map(drop)
}

/// `program ARGS`, what it printed to stdout, or an error naming the command and what it said.
fn output(program: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(program).args(args).output().map_err(|e| format!("{program}: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.success() {
        Ok(stdout)
    } else {
        let said = format!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
        Err(format!("{program} {}: {}", args.join(" "), said.trim()))
    }
}

/// One slot's names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Names {
    slot: u8,
}

impl Names {
    fn bridge(self) -> String {
        format!("mhrobust{}", self.slot)
    }

    /// The bridge's address: what the agents reach etcd at.
    pub fn host(self) -> String {
        format!("10.231.{}.1", self.slot)
    }

    /// Agent `i`'s namespace (`ip netns`, so `/run/netns/NAME`), or the operator's (`OPERATOR`).
    pub fn netns(self, i: usize) -> String {
        match i {
            OPERATOR => format!("mh-robust{}-op", self.slot),
            _ => format!("mh-robust{}-ro-{}", self.slot, i + 1),
        }
    }

    /// Agent `i`'s veth (or the operator's): the bridge's end (`outside`) or the namespace's.
    fn veth(self, i: usize, outside: bool) -> String {
        let who = if i == OPERATOR { "op".to_owned() } else { i.to_string() };
        format!("mhr{}x{who}{}", self.slot, if outside { 'h' } else { 'n' })
    }

    /// Agent `i`'s address on the bridge (10.231.S.(11+i)), or the operator's (10.231.S.10).
    fn address(self, i: usize) -> String {
        format!("10.231.{}.{}/24", self.slot, if i == OPERATOR { 10 } else { 11 + i })
    }
}

/// A slow, lossy link's settings.
#[derive(Clone, Copy, Debug)]
pub struct Slow {
    /// The share of packets dropped each way, in percent (0: none).
    pub loss: u64,
    /// The token bucket's rate on both ends, kbit/s (0: no qdisc).
    pub kbit: u64,
}

/// The namespaces and the bridge of one run, removed when dropped.
pub struct Net {
    agents: usize,
    /// Whether the operator has a namespace of its own (`OPERATOR`).
    operator: bool,
    pub names: Names,
    /// The slot's lock, held for the run's life.
    _lock: std::fs::File,
}

impl Net {
    /// The bridge and a namespace for each of `agents` agents (and the operator, when
    /// `operator`), each with its veth pair, its address and loopback up, in the first free
    /// slot.
    pub fn up(agents: usize, operator: bool) -> Net {
        assert!(agents <= MAX_AGENTS, "at most {MAX_AGENTS} agents in namespaces");
        let (names, lock) = take_slot();
        clean(names);
        let net = Net { agents, operator, names, _lock: lock };
        let (bridge, host) = (names.bridge(), format!("{}/24", names.host()));
        let steps: [&[&str]; 3] = [
            &["link", "add", &bridge, "type", "bridge"],
            &["addr", "add", &host, "dev", &bridge],
            &["link", "set", &bridge, "up"],
        ];
        for step in steps {
            run("ip", step).unwrap_or_else(|e| panic!("the agents' bridge: {e}"));
        }
        for i in net.all() {
            let (ns, outside, inside) = (names.netns(i), names.veth(i, true), names.veth(i, false));
            let address = names.address(i);
            let steps: [&[&str]; 7] = [
                &["netns", "add", &ns],
                &["link", "add", &outside, "type", "veth", "peer", "name", &inside],
                &["link", "set", &outside, "master", &bridge, "up"],
                &["link", "set", &inside, "netns", &ns],
                &["-n", &ns, "addr", "add", &address, "dev", &inside],
                &["-n", &ns, "link", "set", &inside, "up"],
                &["-n", &ns, "link", "set", "lo", "up"],
            ];
            for step in steps {
                run("ip", step).unwrap_or_else(|e| panic!("namespace {ns}: {e}"));
            }
        }
        net
    }

    /// `nft ARGS` in agent `i`'s namespace.
    fn nft(&self, i: usize, args: &[&str]) -> Result<(), String> {
        let ns = self.names.netns(i);
        let all: Vec<&str> = ["netns", "exec", &ns, "nft"].iter().chain(args).copied().collect();
        run("ip", &all)
    }

    /// Agent `i` cut off from etcd: everything it sends to the bridge's address dropped.
    pub fn cut(&self, i: usize) -> Result<(), String> {
        let host = self.names.host();
        self.nft(i, &["add", "table", "inet", CUT])?;
        self.nft(
            i,
            &["add", "chain", "inet", CUT, "out", "{ type filter hook output priority 0; policy accept; }"],
        )?;
        self.nft(i, &["add", "rule", "inet", CUT, "out", "ip", "daddr", &host, "drop"])
    }

    /// Agent `i`'s link to etcd made slow and lossy: `slow.loss` % of the packets it sends to
    /// the bridge's address, and of those it receives from it, dropped at random; a token
    /// bucket of `slow.kbit` kbit/s (a bucket of 1,600 bytes, a queue of at most 2 s) on both
    /// ends of its veth pair.
    pub fn slow(&self, i: usize, slow: Slow) -> Result<(), String> {
        let host = self.names.host();
        if slow.loss > 0 {
            let loss = slow.loss.to_string();
            self.nft(i, &["add", "table", "inet", LOSSY])?;
            for (chain, hook, way) in [("out", "output", "daddr"), ("in", "input", "saddr")] {
                let spec = format!("{{ type filter hook {hook} priority 0; policy accept; }}");
                self.nft(i, &["add", "chain", "inet", LOSSY, chain, &spec])?;
                let rule = ["add", "rule", "inet", LOSSY, chain, "ip", way, &host, "numgen", "random"];
                let all: Vec<&str> =
                    rule.iter().copied().chain(["mod", "100", "<", &loss, "counter", "drop"]).collect();
                self.nft(i, &all)?;
            }
        }
        if slow.kbit > 0 {
            let rate = format!("{}kbit", slow.kbit);
            let tbf = ["root", "tbf", "rate", &rate, "burst", "1600", "latency", "2s"];
            let outside = self.names.veth(i, true);
            let host_end: Vec<&str> =
                ["qdisc", "replace", "dev", &outside].iter().chain(&tbf).copied().collect();
            run("tc", &host_end)?;
            let (ns, inside) = (self.names.netns(i), self.names.veth(i, false));
            let node_end: Vec<&str> =
                ["-n", &ns, "qdisc", "replace", "dev", &inside].iter().chain(&tbf).copied().collect();
            run("tc", &node_end)?;
        }
        Ok(())
    }

    /// What agent `i`'s link to etcd does now, measured from inside its namespace: `count`
    /// pings of 1,000 bytes to the bridge's address, 20 ms apart (50 kB/s, more than a slow
    /// link's rate, so that its queues fill: each ping waits for those before it; ping itself
    /// is held back by the queue of its own end, so `count` pings through 32 kbit/s take
    /// about `count` / 4 s).
    pub fn probe(&self, i: usize, count: u32) -> Result<Probe, String> {
        let (ns, host, count) = (self.names.netns(i), self.names.host(), count.to_string());
        let args = [
            "netns", "exec", &ns, "ping", "-q", "-n", "-c", &count, "-i", "0.02", "-s", "1000", "-W", "3",
            &host,
        ];
        // ping exits 1 when a reply is missing: its summary says how many.
        let out =
            Command::new("ip").args(args).output().map_err(|e| format!("ip netns exec {ns} ping: {e}"))?;
        Probe::parse(&String::from_utf8_lossy(&out.stdout)).ok_or_else(|| {
            format!("ping in {ns}: no summary: {}", String::from_utf8_lossy(&out.stderr).trim())
        })
    }

    /// How many packets agent `i`'s lossy link has dropped so far, both ways (its rules'
    /// counters).
    pub fn dropped(&self, i: usize) -> Result<u64, String> {
        let ns = self.names.netns(i);
        let listed = output("ip", &["netns", "exec", &ns, "nft", "list", "table", "inet", LOSSY])?;
        let counts = listed.split("counter packets ").skip(1);
        Ok(counts.filter_map(|c| c.split_whitespace().next()?.parse::<u64>().ok()).sum())
    }

    /// Agent `i`'s cut and slow link ended (nothing when there is none).
    pub fn heal(&self, i: usize) {
        for table in [CUT, LOSSY] {
            let _ = self.nft(i, &["delete", "table", "inet", table]);
        }
        let _ = run("tc", &["qdisc", "del", "dev", &self.names.veth(i, true), "root"]);
        let ns = self.names.netns(i);
        let _ = run("tc", &["-n", &ns, "qdisc", "del", "dev", &self.names.veth(i, false), "root"]);
    }

    pub fn heal_all(&self) {
        for i in self.all() {
            self.heal(i);
        }
    }

    /// Every namespace's index: the agents', then the operator's when there is one.
    pub fn all(&self) -> Vec<usize> {
        (0..self.agents).chain(self.operator.then_some(OPERATOR)).collect()
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        clean(self.names);
    }
}

/// What a probe found: packets sent, replies received, the replies' mean and longest round
/// trips (ms; 0 when none came back).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Probe {
    pub sent: u32,
    pub received: u32,
    pub avg_ms: f64,
    pub max_ms: f64,
}

impl Probe {
    /// From ping's summary: "N packets transmitted, M received, ..." and "rtt min/avg/max/mdev =
    /// A/B/C/D ms" (absent when nothing came back).
    pub fn parse(out: &str) -> Option<Probe> {
        let line = out.lines().find(|l| l.contains("packets transmitted"))?;
        let mut nums = line.split(',').map(|p| p.split_whitespace().next().and_then(|n| n.parse().ok()));
        let (sent, received) = (nums.next()??, nums.next()??);
        let rtt: Vec<f64> = out
            .lines()
            .find(|l| l.starts_with("rtt "))
            .and_then(|l| l.split('=').nth(1))
            .and_then(|v| v.split_whitespace().next())
            .map(|v| v.split('/').filter_map(|n| n.parse().ok()).collect())
            .unwrap_or_default();
        let (avg_ms, max_ms) = if rtt.len() == 4 { (rtt[1], rtt[2]) } else { (0.0, 0.0) };
        Some(Probe { sent, received, avg_ms, max_ms })
    }

    /// The share of pings without a reply, in percent.
    pub fn loss(&self) -> f64 {
        if self.sent == 0 {
            return 0.0;
        }
        100.0 * f64::from(self.sent - self.received) / f64::from(self.sent)
    }
}

impl std::fmt::Display for Probe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} of {} pings answered ({:.0} % lost), round trip mean {:.1} ms, longest {:.1} ms",
            self.received,
            self.sent,
            self.loss(),
            self.avg_ms,
            self.max_ms
        )
    }
}

/// The first slot whose lock is free, and the lock, held.
fn take_slot() -> (Names, std::fs::File) {
    std::fs::create_dir_all(LOCKS).unwrap_or_else(|e| panic!("{LOCKS}: {e}"));
    for slot in 1..SLOTS {
        let path = format!("{LOCKS}/net-{slot}.lock");
        let file = std::fs::File::create(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        if rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_ok() {
            return (Names { slot }, file);
        }
    }
    panic!("every network slot of the harness (1-{}) is taken by a live run: see {LOCKS}", SLOTS - 1)
}

/// A slot's namespaces (their veth pairs go with them) and bridge, whoever made them: called
/// only with the slot's lock held.
fn clean(names: Names) {
    for i in (0..MAX_AGENTS).chain([OPERATOR]) {
        let _ = run("ip", &["netns", "del", &names.netns(i)]);
        // Gone with the namespace, unless a process of a run that died still holds it.
        let _ = run("ip", &["link", "del", &names.veth(i, true)]);
    }
    let _ = run("ip", &["link", "del", &names.bridge()]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_probe_reads_pings_summary_with_and_without_replies() {
        let some = "--- 10.231.1.1 ping statistics ---\n40 packets transmitted, 9 received, 77.5% packet loss, time 812ms\nrtt min/avg/max/mdev = 120.310/640.5/1210.9/300.2 ms, pipe 12\n";
        let p = Probe::parse(some).unwrap();
        assert_eq!((p.sent, p.received, p.avg_ms, p.max_ms), (40, 9, 640.5, 1210.9));
        assert!((p.loss() - 77.5).abs() < 0.01);
        let none = "--- 10.231.1.1 ping statistics ---\n10 packets transmitted, 0 received, 100% packet loss, time 200ms\n";
        let p = Probe::parse(none).unwrap();
        assert_eq!((p.received, p.avg_ms), (0, 0.0));
        assert_eq!(p.loss(), 100.0);
        assert_eq!(Probe::parse("ping: connect: Network is unreachable\n"), None);
    }

    /// Two runs on the machine at once take slots of their own, and one's end (or cleanup)
    /// leaves the other's names alone; a slot given back is taken again, its leftovers removed.
    #[test]
    #[ignore = "needs root and iproute2 (the testbed); namespaces of its own"]
    fn two_runs_take_slots_of_their_own_and_leave_each_other_alone() {
        assert!(nix::unistd::geteuid().is_root(), "run it as root: it makes network namespaces");
        let first = Net::up(1, true);
        let second = Net::up(1, true);
        assert_ne!(first.names, second.names, "two live runs were given the same names");
        let slot = second.names;
        drop(second);
        let listed = output("ip", &["netns", "list"]).unwrap();
        assert!(listed.contains(&first.names.netns(0)), "the live run's namespace went with the other's");
        assert!(!listed.contains(&slot.netns(0)), "a run's namespace outlived it: {listed}");
        for i in [0, OPERATOR] {
            let probe = first.probe(i, 5).unwrap();
            assert_eq!(probe.received, 5, "the live run's link ({i}) broke when the other ended: {probe}");
        }
        let third = Net::up(1, false);
        assert_eq!(third.names, slot, "the slot given back was not taken again");
    }

    /// The slow, lossy link does what it says, measured from inside the namespace: the loss
    /// alone loses pings and does not delay them, the token bucket alone delays them, the
    /// heal gives the link back. Fails when the nftables rule or the qdisc does nothing.
    #[test]
    #[ignore = "needs root, nftables, tc and ping (the testbed); one namespace of its own"]
    fn a_slow_lossy_link_loses_and_delays_packets_and_heals() {
        assert!(nix::unistd::geteuid().is_root(), "run it as root: it makes a network namespace");
        let net = Net::up(1, false);
        let before = net.probe(0, 10).unwrap();
        eprintln!("robust: a healthy link: {before}");
        assert!(
            before.loss() == 0.0 && before.max_ms < 50.0,
            "the healthy link already loses or delays: {before}"
        );

        net.slow(0, Slow { loss: 50, kbit: 0 }).unwrap();
        let lossy = net.probe(0, 40).unwrap();
        let dropped = net.dropped(0).unwrap();
        eprintln!("robust: 50 % lost each way: {lossy}; {dropped} packets dropped");
        assert!(dropped > 0, "the nftables rules counted no drop: {lossy}");
        net.heal(0);
        // A round trip survives 0.5 × 0.5 of the time: 75 % lost on average; 40 % or less
        // happens once in many thousands.
        assert!(lossy.loss() > 40.0, "the nftables rule lost too little: {lossy}");
        assert!(lossy.max_ms < 50.0, "the loss alone delayed packets: {lossy}");

        net.slow(0, Slow { loss: 0, kbit: 32 }).unwrap();
        let slow = net.probe(0, 10).unwrap();
        eprintln!("robust: a token bucket of 32 kbit/s: {slow}");
        net.heal(0);
        // 10 pings of 1,028 bytes through 4 kB/s each way: each waits for those before it.
        assert!(slow.received > 0 && slow.avg_ms > 100.0, "the token bucket did not delay: {slow}");

        let after = net.probe(0, 10).unwrap();
        eprintln!("robust: healed: {after}");
        assert!(after.loss() == 0.0 && after.max_ms < 50.0, "the heal left the link slow or lossy: {after}");
    }
}
