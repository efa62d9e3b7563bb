//! Each agent in a network namespace of its own, so that one node can be cut off from etcd
//! alone (issue 42): a bridge in the host's namespace, on whose address the etcd members listen
//! besides loopback, and a veth pair from it into each agent's namespace. A cut is an nftables
//! table in the agent's namespace dropping everything it sends to the bridge's address; the
//! heal deletes the table. The names are fixed (one seeded run a machine at a time); what a run
//! that died left behind is removed before the next one makes its own.

use std::process::Command;

/// The bridge, in the host's namespace.
const BRIDGE: &str = "mhrobust0";
/// The bridge's address: what the agents reach etcd at.
pub const HOST: &str = "10.231.0.1";
/// The nftables table of a cut, in the agent's namespace.
const CUT: &str = "mh_robust_cut";

/// Agent `i`'s namespace (`ip netns`, so `/run/netns/NAME`).
pub fn netns(i: usize) -> String {
    format!("mh-robust-ro-{}", i + 1)
}

/// `ip ARGS` (or any command), its failure an error naming the command and what it said.
fn run(program: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(program).args(args).output().map_err(|e| format!("{program}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("{program} {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

/// The namespaces and the bridge of one run, removed when dropped.
pub struct Net {
    agents: usize,
}

impl Net {
    /// The bridge and a namespace for each of `agents` agents, each with its veth pair, its
    /// address (10.231.0.(11+i)/24) and loopback up.
    pub fn up(agents: usize) -> Net {
        clean(agents);
        let net = Net { agents };
        let host = format!("{HOST}/24");
        let steps: Vec<Vec<String>> = vec![
            vec!["link", "add", BRIDGE, "type", "bridge"],
            vec!["addr", "add", &host, "dev", BRIDGE],
            vec!["link", "set", BRIDGE, "up"],
        ]
        .into_iter()
        .map(|v| v.into_iter().map(str::to_owned).collect())
        .collect();
        for step in steps {
            let step: Vec<&str> = step.iter().map(String::as_str).collect();
            run("ip", &step).unwrap_or_else(|e| panic!("the agents' bridge: {e}"));
        }
        for i in 0..agents {
            let (ns, outside, inside) = (netns(i), format!("mhr{i}h"), format!("mhr{i}n"));
            let address = format!("10.231.0.{}/24", 11 + i);
            let steps: [&[&str]; 6] = [
                &["netns", "add", &ns],
                &["link", "add", &outside, "type", "veth", "peer", "name", &inside],
                &["link", "set", &outside, "master", BRIDGE, "up"],
                &["link", "set", &inside, "netns", &ns],
                &["-n", &ns, "addr", "add", &address, "dev", &inside],
                &["-n", &ns, "link", "set", &inside, "up"],
            ];
            for step in steps {
                run("ip", step).unwrap_or_else(|e| panic!("agent ro-{}'s namespace: {e}", i + 1));
            }
            run("ip", &["-n", &ns, "link", "set", "lo", "up"])
                .unwrap_or_else(|e| panic!("agent ro-{}'s loopback: {e}", i + 1));
        }
        net
    }

    /// Agent `i` cut off from etcd: everything it sends to the bridge's address dropped.
    pub fn cut(&self, i: usize) -> Result<(), String> {
        let ns = netns(i);
        let nft = |args: &[&str]| {
            let all: Vec<&str> = ["netns", "exec", &ns, "nft"].iter().chain(args).copied().collect();
            run("ip", &all)
        };
        nft(&["add", "table", "inet", CUT])?;
        nft(&["add", "chain", "inet", CUT, "out", "{ type filter hook output priority 0; policy accept; }"])?;
        nft(&["add", "rule", "inet", CUT, "out", "ip", "daddr", HOST, "drop"])
    }

    /// Agent `i`'s cut ended (nothing when there is none).
    pub fn heal(&self, i: usize) {
        let _ = run("ip", &["netns", "exec", &netns(i), "nft", "delete", "table", "inet", CUT]);
    }

    pub fn heal_all(&self) {
        for i in 0..self.agents {
            self.heal(i);
        }
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        clean(self.agents);
    }
}

/// The namespaces (their veth pairs go with them) and the bridge, whoever made them.
fn clean(agents: usize) {
    for i in 0..agents.max(16) {
        let _ = run("ip", &["netns", "del", &netns(i)]);
        // Gone with the namespace, unless a process of a run that died still holds it.
        let _ = run("ip", &["link", "del", &format!("mhr{i}h")]);
    }
    let _ = run("ip", &["link", "del", BRIDGE]);
}
