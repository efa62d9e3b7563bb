//! Confirm or go back (issue 25, point 3), against a real etcd member and real agents: a node
//! that reaches etcd by a name (`http://etcd-under-test:PORT`), resolved through an `/etc/hosts`
//! of its own: the node runs in a mount namespace of its own whose `/etc` is an overlay on the
//! host's (its writes go to the test's scratch directory, so the host's `/etc/hosts` is never
//! touched, and the agent's atomic rename of `/etc/hosts` works as on a real machine, which a
//! bind mount of the one file would not allow). The member listens on 127.0.0.1 only, so
//! `127.0.0.2 etcd-under-test` is a route that goes nowhere.

use std::process::Command;
use std::time::Duration;

use serde_json::json;

use super::*;

/// The name the nodes reach etcd by.
const NAME: &str = "etcd-under-test";

/// The window the tests give a node: short, so the test is too.
const WINDOW: &str = "5";

fn hosts(address: &str) -> String {
    format!("127.0.0.1 localhost\n{address} {NAME}\n")
}

/// `mesh-host run --etcd http://etcd-under-test:PORT` in a mount namespace of its own, its `/etc`
/// an overlay whose upper layer is in the scratch directory and whose `/etc/hosts` maps the
/// name to the member at the start; waits until /healthz answers.
fn node_in_namespace(s: &Scratch, port: u16, name: &str, more: &[&str]) -> Daemon {
    node_in_namespace_env(s, port, name, more, &[])
}

/// `node_in_namespace`, with more environment.
fn node_in_namespace_env(s: &Scratch, port: u16, name: &str, more: &[&str], env: &[(&str, &str)]) -> Daemon {
    node_in_namespace_at(s, &format!("http://{NAME}:{port}"), name, more, env)
}

/// `node_in_namespace_env`, reaching etcd at `endpoint` (by address, a node whose `/etc/hosts`
/// does not decide its route).
fn node_in_namespace_at(
    s: &Scratch,
    endpoint: &str,
    name: &str,
    more: &[&str],
    env: &[(&str, &str)],
) -> Daemon {
    let (upper, work) = (s.path("etc-upper"), s.path("etc-work"));
    std::fs::create_dir_all(&upper).unwrap();
    std::fs::create_dir_all(&work).unwrap();
    let script = format!(
        "mount -t overlay overlay -o lowerdir=/etc,upperdir={},workdir={} /etc && printf '%s' '{}' > /etc/hosts && exec \"$@\"",
        upper.display(),
        work.display(),
        hosts("127.0.0.1")
    );
    let metrics = free_port();
    let log = s.path(&format!("node-{metrics}.log"));
    let child = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "--", "sh", "-c", &script, "sh"])
        .arg(assert_cmd::cargo::cargo_bin("mesh-host"))
        .arg("--state")
        .arg(s.state())
        .args(["run", "--etcd", endpoint, "--node", name])
        // etcd by a name (on loopback, as /etc/hosts says), which mesh-host cannot know is.
        .arg("--allow-plaintext")
        .args(more)
        .args(["--metrics", &format!("127.0.0.1:{metrics}"), "--settle-ms", "20"])
        .env("MESH_HOST_LOG", "info")
        .envs(env.iter().copied())
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::fs::File::options().append(true).open(&log).unwrap())
        .spawn()
        .expect("unshare starts");
    let d = Daemon { child: Some(child), port: metrics, log };
    assert!(
        wait_for(PATIENCE, || d.answer("/healthz").is_some()),
        "the node never answered /healthz:\n{}",
        d.log()
    );
    d
}

/// The node's `/etc/hosts`, as the node sees it (through its own mount namespace).
fn node_hosts(d: &Daemon) -> String {
    let pid = d.child.as_ref().unwrap().id();
    read(Path::new(&format!("/proc/{pid}/root/etc/hosts")))
}

/// Puts, for node `name`, a declaration of its `/etc/hosts` mapping the name to `address` and
/// of a marker file holding `marker`.
fn put(s: &Scratch, url: &str, name: &str, address: &str, marker: &str) {
    write_declaration(
        &s.path("in/d.json"),
        json!([
            {"type": "file", "id": "hosts", "path": "/etc/hosts", "content": hosts(address)},
            {"type": "file", "id": "marker", "path": s.p("marker"), "content": marker},
        ]),
    );
    let out = fleet(s, &["put", "--etcd", url, "--node", name, s.p("in/d.json").as_str()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

fn node_status(s: &Scratch, url: &str, name: &str) -> serde_json::Value {
    let out = fleet(s, &["status", "--etcd", url, "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    v["nodes"].as_array().into_iter().flatten().find(|r| r["node"] == name).cloned().unwrap_or_default()
}

/// The value of a metric without labels on the node's /metrics.
fn metric(d: &Daemon, name: &str) -> Option<f64> {
    let (_, body) = d.answer("/metrics")?;
    body.lines().find_map(|l| l.strip_prefix(&format!("{name} "))).and_then(|v| v.trim().parse().ok())
}

/// Whether the node's state directory records an open confirmation window
/// (`fleet/window.json`): it is removed once the window is confirmed, cancelled, not armed, or
/// gone back from, so its absence says the node has nothing left to go back from by itself.
fn window_open(s: &Scratch) -> bool {
    s.state().parent().unwrap().join("fleet/window.json").exists()
}

/// The barrier for "nothing more comes of what etcd holds": the node's watch has delivered
/// every change up to etcd's revision now (its `mesh_host_etcd_watch_revision`, moved by
/// etcd's progress notices, which the member must send: `PROGRESS`), then a hand-edit of
/// `marker` made after that is put back, so the controller has had the source's word and
/// acted on it. Returns what the marker was put back to.
fn settled(url: &str, d: &Daemon, marker: &Path) -> String {
    let now = revision_now(url) as f64;
    assert!(
        wait_for(PATIENCE, || d.metric("mesh_host_etcd_watch_revision") >= now),
        "the watch never reached revision {now}: {}\n{}",
        d.metric("mesh_host_etcd_watch_revision"),
        d.log()
    );
    std::fs::write(marker, "by hand\n").unwrap();
    assert!(wait_for(PATIENCE, || read(marker) != "by hand\n"), "the hand-edit stayed:\n{}", d.log());
    read(marker)
}

/// etcd's flag for a progress notice every second (10 minutes by default), for `settled`.
const PROGRESS: [&str; 2] = ["--experimental-watch-progress-notify-interval", "1s"];

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn a_node_cut_off_from_etcd_by_its_new_generation_goes_back_within_the_window() {
    let s = Scratch::new();
    let etcd = OwnEtcd::start_with(&s, false, &PROGRESS);
    let url = etcd.url();
    let name = unique("revert");
    let marker = s.path("marker");
    // Generation 1 declares the good /etc/hosts: it is what going back restores.
    put(&s, &url, &name, "127.0.0.1", "a\n");
    let daemon = node_in_namespace(&s, etcd.client, &name, &["--confirm-window", WINDOW]);
    assert!(wait_for(PATIENCE, || read(&marker) == "a\n"), "{}", daemon.log());
    assert!(
        wait_for(PATIENCE, || node_status(&s, &url, &name)["status"]["generation"] == 1),
        "{:#}\n{}",
        node_status(&s, &url, &name),
        daemon.log()
    );
    assert_eq!(
        std::fs::read_to_string("/etc/hosts").unwrap().matches(NAME).count(),
        0,
        "the host's own is not touched"
    );

    // Generation 2 points the name at an address where nothing listens.
    put(&s, &url, &name, "127.0.0.2", "b\n");
    assert!(wait_for(PATIENCE, || read(&marker) == "b\n"), "generation 2 applied:\n{}", daemon.log());
    assert_eq!(node_hosts(&daemon), hosts("127.0.0.2"));
    let applied = std::time::Instant::now();

    // Within the window (and the pass that goes back), generation 1 is back, /etc/hosts with it.
    let back = Duration::from_secs(5) + PATIENCE;
    assert!(wait_for(back, || read(&marker) == "a\n"), "went back:\n{}", daemon.log());
    assert!(applied.elapsed() >= Duration::from_secs(4), "not before the window closed");
    assert_eq!(node_hosts(&daemon), hosts("127.0.0.1"), "the generation gone back to restores the route");

    // Once etcd answers again (the route mended by going back), the status says `reverted`.
    assert!(
        wait_for(PATIENCE, || !node_status(&s, &url, &name)["status"]["reverted"].is_null()),
        "{:#}\n{}",
        node_status(&s, &url, &name),
        daemon.log()
    );
    let st = node_status(&s, &url, &name);
    let reverted = &st["status"]["reverted"];
    assert_eq!(reverted["generation"], 1, "{st:#}");
    assert_eq!(reverted["from"], 2, "{st:#}");
    let reason = reverted["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("no etcd round trip within 5 s of applying generation 2 (revision "),
        "{reason}"
    );
    assert!(reason.contains("; last: "), "the error that kept etcd out of reach: {reason}");
    assert_eq!(st["status"]["generation"], 1, "{st:#}");
    assert!(
        st["status"]["hold"].as_str().unwrap().starts_with("held at generation 1 by the node itself"),
        "{st:#}"
    );
    assert_eq!(metric(&daemon, "mesh_host_reverted"), Some(1.0));
    assert_eq!(metric(&daemon, "mesh_host_reverts_total"), Some(1.0));
    let log = daemon.log();
    assert!(log.contains("going back to generation 1 by itself: no etcd round trip within 5 s"), "{log}");

    // `fleet status` shows it, in its table.
    let out = fleet(&s, &["status", "--etcd", &url]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("reverted from generation 2: no etcd round trip"), "{table}");
    assert!(table.contains(&format!("{name}: held at generation 1 by the node itself")), "{table}");

    // The source is still read while held: the bad declaration (a kept generation) changes
    // nothing, once the watch has delivered it again and the controller has acted since;
    // across a restart too (the hold is a file), still saying why.
    assert_eq!(
        settled(&url, &daemon, &marker),
        "a\n",
        "held, no second try of generation 2:\n{}",
        daemon.log()
    );
    assert_eq!(metric(&daemon, "mesh_host_reverts_total"), Some(1.0), "{}", daemon.log());
    drop(daemon);
    let key = format!("/mesh-host/node/{name}/status");
    let before = version_of(&url, &key);
    let daemon = node_in_namespace(&s, etcd.client, &name, &["--confirm-window", WINDOW]);
    // A status the restarted node wrote (the key's version moved), saying why it is held.
    assert!(
        wait_for(PATIENCE, || {
            version_of(&url, &key) > before && node_status(&s, &url, &name)["status"]["reverted"]["from"] == 2
        }),
        "restarted, still reverted: {:#}\n{}",
        node_status(&s, &url, &name),
        daemon.log()
    );
    assert_eq!(read(&marker), "a\n", "{}", daemon.log());
    assert_eq!(metric(&daemon, "mesh_host_reverted"), Some(1.0));

    // A newer declaration ends the hold, as it ends a rollback's.
    put(&s, &url, &name, "127.0.0.1", "c\n");
    assert!(wait_for(PATIENCE, || read(&marker) == "c\n"), "{}", daemon.log());
    assert!(
        wait_for(PATIENCE, || {
            let st = node_status(&s, &url, &name);
            st["status"]["generation"] == 3
                && st["status"]["reverted"].is_null()
                && st["status"]["hold"].is_null()
        }),
        "{:#}\n{}",
        node_status(&s, &url, &name),
        daemon.log()
    );
    assert!(
        wait_for(PATIENCE, || daemon.log().contains("generation 3 (revision ")
            && daemon.log().contains(") confirmed")),
        "{}",
        daemon.log()
    );
    assert_eq!(metric(&daemon, "mesh_host_reverted"), Some(0.0));
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn a_good_new_generation_is_confirmed_and_stays() {
    let s = Scratch::new();
    let etcd = OwnEtcd::start(&s);
    let url = etcd.url();
    let name = unique("confirm");
    let marker = s.path("marker");
    put(&s, &url, &name, "127.0.0.1", "a\n");
    let daemon = node_in_namespace(&s, etcd.client, &name, &["--confirm-window", WINDOW]);
    assert!(wait_for(PATIENCE, || read(&marker) == "a\n"), "{}", daemon.log());
    put(&s, &url, &name, "127.0.0.1", "b\n");
    assert!(wait_for(PATIENCE, || read(&marker) == "b\n"), "{}", daemon.log());
    assert!(
        wait_for(PATIENCE, || daemon.log().contains("generation 2 (revision ")
            && daemon.log().contains(") confirmed: etcd answered a read on a new connection")),
        "{}",
        daemon.log()
    );
    // The barrier: the node's own word that it will not go back from generation 2 by itself
    // (its status's `confirmed`), and no window left open in its state directory. That a
    // confirmed window does nothing at its deadline is `fleet::confirm`'s paused-time test
    // (`a_new_generation_confirmed_in_time_closes_its_window`); here, nothing is left to fire.
    assert!(
        wait_for(PATIENCE, || node_status(&s, &url, &name)["status"]["confirmed"] == 2 && !window_open(&s)),
        "{:#}\n{}",
        node_status(&s, &url, &name),
        daemon.log()
    );
    assert_eq!(read(&marker), "b\n", "{}", daemon.log());
    let st = node_status(&s, &url, &name);
    assert_eq!(st["status"]["generation"], 2, "{st:#}");
    assert!(st["status"]["reverted"].is_null() && st["status"]["hold"].is_null(), "{st:#}");
    assert_eq!(metric(&daemon, "mesh_host_reverts_total"), Some(0.0));
    assert!(!daemon.log().contains("by itself"), "{}", daemon.log());
    // The node dialled afresh for the confirmation and still holds one connection.
    let pid = daemon.child.as_ref().unwrap().id();
    assert!(
        wait_for(PATIENCE, || connections_to(pid, etcd.client) == 1),
        "one connection to etcd: {}\n{}",
        ss_of(pid),
        daemon.log()
    );
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn a_node_offline_from_the_start_does_not_go_back() {
    let s = Scratch::new();
    let mut etcd = OwnEtcd::start(&s);
    let url = etcd.url();
    let name = unique("offline");
    let marker = s.path("marker");
    put(&s, &url, &name, "127.0.0.1", "a\n");
    let daemon = node_in_namespace(&s, etcd.client, &name, &["--confirm-window", WINDOW]);
    assert!(wait_for(PATIENCE, || read(&marker) == "a\n"), "{}", daemon.log());
    put(&s, &url, &name, "127.0.0.1", "b\n");
    assert!(wait_for(PATIENCE, || read(&marker) == "b\n"), "{}", daemon.log());
    assert!(wait_for(PATIENCE, || daemon.log().contains(") confirmed")), "{}", daemon.log());
    // The operator holds generation 1 (the running node applies it) and releases the hold while
    // no agent runs (which applies nothing): the cache (generation 2) is a change from the
    // generation in force (1) when the node starts again, but etcd is down, so the node starts
    // offline on its cache. (The rollback is left to the node: applied here it would write the
    // host's own /etc/hosts.)
    let out = s.run(&["rollback", "1"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(wait_for(PATIENCE, || read(&marker) == "a\n"), "{}", daemon.log());
    drop(daemon);
    let out = s.run(&["rollback", "--release"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    etcd.stop();
    let daemon = node_in_namespace(&s, etcd.client, &name, &["--confirm-window", WINDOW]);
    assert!(wait_for(Duration::from_secs(15) + PATIENCE, || read(&marker) == "b\n"), "{}", daemon.log());
    assert!(
        wait_for(PATIENCE, || daemon.log().contains("it was not read from etcd by this run")),
        "{}",
        daemon.log()
    );
    // That word is the decision: no window armed, none recorded, nothing to go back from at a
    // deadline (etcd is down, so the status cannot say `confirmed`).
    assert!(!window_open(&s), "a window recorded:\n{}", daemon.log());
    assert_eq!(read(&marker), "b\n", "not gone back:\n{}", daemon.log());
    assert!(!daemon.log().contains("by itself"), "{}", daemon.log());
    assert_eq!(metric(&daemon, "mesh_host_reverts_total"), Some(0.0));
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn with_the_window_off_a_node_cut_off_by_its_new_generation_stays_on_it() {
    let s = Scratch::new();
    let etcd = OwnEtcd::start(&s);
    let url = etcd.url();
    let name = unique("off");
    let marker = s.path("marker");
    put(&s, &url, &name, "127.0.0.1", "a\n");
    // The environment's equivalent of --confirm-window 0.
    let daemon = node_in_namespace_env(&s, etcd.client, &name, &[], &[("MESH_HOST_CONFIRM_WINDOW", "0")]);
    assert!(wait_for(PATIENCE, || read(&marker) == "a\n"), "{}", daemon.log());
    assert!(daemon.log().contains("the confirmation window is off"), "{}", daemon.log());
    put(&s, &url, &name, "127.0.0.2", "b\n");
    assert!(wait_for(PATIENCE, || read(&marker) == "b\n"), "{}", daemon.log());
    // Its connection, opened before the change, is not dropped: it does not even know. The
    // barrier: generation 2's status, which only that connection can carry (a new one would
    // dial the address where nothing listens).
    assert!(
        wait_for(PATIENCE, || node_status(&s, &url, &name)["status"]["generation"] == 2),
        "{:#}\n{}",
        node_status(&s, &url, &name),
        daemon.log()
    );
    let pid = daemon.child.as_ref().unwrap().id();
    assert_eq!(connections_to(pid, etcd.client), 1, "{}\n{}", ss_of(pid), daemon.log());
    assert!(!window_open(&s), "a window recorded with the window off:\n{}", daemon.log());
    assert_eq!(read(&marker), "b\n", "{}", daemon.log());
    assert_eq!(node_hosts(&daemon), hosts("127.0.0.2"));
    assert!(!daemon.log().contains("by itself"), "{}", daemon.log());
    assert_eq!(metric(&daemon, "mesh_host_reverts_total"), Some(0.0));
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn a_node_that_reads_a_bad_generation_as_it_starts_goes_back_too() {
    let s = Scratch::new();
    let etcd = OwnEtcd::start(&s);
    let url = etcd.url();
    let name = unique("boot");
    let marker = s.path("marker");
    put(&s, &url, &name, "127.0.0.1", "a\n");
    let daemon = node_in_namespace(&s, etcd.client, &name, &["--confirm-window", WINDOW]);
    assert!(wait_for(PATIENCE, || read(&marker) == "a\n"), "{}", daemon.log());
    drop(daemon);
    // Put while the node is down: its first read as it starts is the bad generation, read from
    // etcd (so etcd answered before the change), and the one to go back to is the generation it
    // had in force when it stopped.
    put(&s, &url, &name, "127.0.0.2", "b\n");
    let daemon = node_in_namespace(&s, etcd.client, &name, &["--confirm-window", WINDOW]);
    assert!(wait_for(PATIENCE, || read(&marker) == "b\n"), "{}", daemon.log());
    assert!(
        wait_for(Duration::from_secs(5) + PATIENCE, || read(&marker) == "a\n"),
        "went back:\n{}",
        daemon.log()
    );
    assert_eq!(node_hosts(&daemon), hosts("127.0.0.1"));
    assert!(
        wait_for(PATIENCE, || node_status(&s, &url, &name)["status"]["reverted"]["from"] == 2),
        "{:#}\n{}",
        node_status(&s, &url, &name),
        daemon.log()
    );
    assert_eq!(node_status(&s, &url, &name)["status"]["reverted"]["generation"], 1);
}

/// Points 2 and 3 together: a staged rollout whose candidate cuts its canary off from etcd (its
/// `/etc/hosts` pointing etcd's name nowhere). The canary takes it, cannot confirm it within
/// the window, goes back by itself and, once etcd answers again, reports `reverted`; the
/// rollout counts that as a failure, halts with its budget of 0 spent, and the second node
/// never sees the candidate. Both nodes in mount namespaces of their own (their `/etc` an
/// overlay), so the host's `/etc/hosts` is never written whatever happens.
#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn a_rollout_halts_when_its_canary_goes_back_by_itself_and_the_next_wave_never_sees_it() {
    let s = Scratch::new();
    let etcd = OwnEtcd::start(&s);
    let url = etcd.url();
    let marker = "/etc/mesh-host-rollout-marker";
    let declare = |dir: &str, address: &str, content: &str| {
        write_declaration(
            &s.path(&format!("{dir}/d.json")),
            json!([
                {"type": "file", "id": "hosts", "path": "/etc/hosts", "content": hosts(address)},
                {"type": "file", "id": "marker", "path": marker, "content": content},
            ]),
        );
        s.p(dir)
    };
    let good = declare("good", "127.0.0.1", "a\n");
    let out = fleet(&s, &["put", "--etcd", &url, "--fleet", &good]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let (canary, other) = (unique("canary"), unique("other"));
    let (sc, so) = (Scratch::new(), Scratch::new());
    let nodes = [
        (canary.as_str(), node_in_namespace(&sc, etcd.client, &canary, &["--confirm-window", WINDOW])),
        (other.as_str(), node_in_namespace(&so, etcd.client, &other, &["--confirm-window", WINDOW])),
    ];
    let seen = |d: &Daemon| {
        let pid = d.child.as_ref().unwrap().id();
        std::fs::read_to_string(format!("/proc/{pid}/root{marker}")).unwrap_or_default()
    };
    for (name, d) in &nodes {
        assert!(wait_for(PATIENCE, || seen(d) == "a\n"), "{name}:\n{}", d.log());
        assert!(
            // Current: alive too, so the rollout's plan (over live nodes) has it.
            wait_for(PATIENCE, || node_status(&s, &url, name)["current"] == true),
            "{name}: {:#}",
            node_status(&s, &url, name)
        );
    }

    let bad = declare("bad", "127.0.0.2", "b\n");
    let args = ["rollout", "start", "--etcd", &url, "--fleet", &bad, "--waves", "1,100%", "--soak", "0"];
    let mut driver = Command::new(assert_cmd::cargo::cargo_bin("mesh-host"))
        .arg("--state")
        .arg(s.state())
        .arg("fleet")
        .args(args)
        .args(["--canary", &canary, "--deadline", "120"])
        .stdout(std::fs::File::create(s.path("driver.out")).unwrap())
        .stderr(std::fs::File::create(s.path("driver.err")).unwrap())
        .spawn()
        .expect("the driver starts");
    let said = || format!("{}{}", read(&s.path("driver.out")), read(&s.path("driver.err")));
    let mut code = None;
    assert!(
        wait_for(Duration::from_secs(90), || {
            code = driver.try_wait().unwrap().map(|st| st.code());
            code.is_some()
        }),
        "the driver did not end:\n{}\ncanary:\n{}",
        said(),
        nodes[0].1.log()
    );
    let said = said();
    assert_eq!(code, Some(Some(1)), "a halted rollout exits 1:\n{said}");
    assert!(said.contains("halted") && said.contains(&canary) && said.contains("reverted"), "{said}");

    // The canary took it and went back; the other never saw it.
    let (_, canary_d) = &nodes[0];
    assert_eq!(seen(canary_d), "a\n", "{}", canary_d.log());
    assert!(canary_d.log().contains("going back to generation 1 by itself"), "{}", canary_d.log());
    assert!(!node_status(&s, &url, &canary)["status"]["reverted"].is_null());
    let (_, other_d) = &nodes[1];
    assert_eq!(seen(other_d), "a\n", "the second wave saw the candidate:\n{}", other_d.log());
    assert_eq!(node_status(&s, &url, &other)["status"]["generation"], 1);

    let out = fleet(&s, &["rollout", "status", "--etcd", &url, "--json"]);
    assert_eq!(out.status.code(), Some(1), "status exits 1 while halted: {out:?}");
    let out = fleet(&s, &["rollout", "abort", "--etcd", &url]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(seen(other_d), "a\n");
}

/// Every value node `name`'s status took from revision `from` on, oldest first: the test's own
/// member never compacts, so etcd still holds each one.
fn status_history(url: &str, name: &str, from: i64) -> Vec<serde_json::Value> {
    let key = format!("/mesh-host/node/{name}/status");
    let mut seen: Vec<serde_json::Value> = Vec::new();
    for revision in from..=revision_now(url) {
        let out = etcdctl(url, &["get", &key, "--rev", &revision.to_string(), "--print-value-only"]);
        let value: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        if !value.is_null() && seen.last() != Some(&value) {
            seen.push(value);
        }
    }
    seen
}

/// Puts, for node `name`, a declaration of a marker file only (its `/etc/hosts` is the test's to
/// change).
fn put_marker(s: &Scratch, url: &str, name: &str, marker: &str) {
    write_declaration(
        &s.path("in/d.json"),
        json!([{"type": "file", "id": "marker", "path": s.p("marker"), "content": marker}]),
    );
    let out = fleet(s, &["put", "--etcd", url, "--node", name, s.p("in/d.json").as_str()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// Points etcd's name nowhere in the node's own `/etc/hosts` (the file no declaration of the test
/// manages): dials from then on fail, while the connection the node holds goes on.
fn cut_off(d: &Daemon) {
    let pid = d.child.as_ref().unwrap().id();
    std::fs::write(format!("/proc/{pid}/root/etc/hosts"), hosts("127.0.0.2")).unwrap();
}

/// The confirmation's read runs beside the window's deadline, never in front of it: held 30 s
/// (the failpoint `etcd-confirm-late`, as a member stopped mid-read holds it), the node goes
/// back when its 5 s window ends, not when the read comes back. Found by the fleet harness's
/// window schedule (every member SIGSTOPped as the canary takes the abort): with the read
/// awaited inside the window's loop, the node confirmed 9 s into a 5 s window. Shown failing
/// so: the marker stays "b" until the read's answer confirms it, 30 s on.
#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn a_confirmation_read_that_hangs_does_not_keep_the_window_open() {
    let s = Scratch::new();
    let etcd = OwnEtcd::start(&s);
    let url = etcd.url();
    let name = unique("late");
    let marker = s.path("marker");
    put(&s, &url, &name, "127.0.0.1", "a\n");
    let env = [("MESH_HOST_FAILPOINT", "etcd-confirm-late")];
    let daemon = node_in_namespace_env(&s, etcd.client, &name, &["--confirm-window", WINDOW], &env);
    assert!(wait_for(PATIENCE, || read(&marker) == "a\n"), "{}", daemon.log());
    put(&s, &url, &name, "127.0.0.1", "b\n");
    assert!(wait_for(PATIENCE, || read(&marker) == "b\n"), "{}", daemon.log());
    // The window (5 s) and a pass back, well inside the read's 30 s.
    assert!(wait_for(Duration::from_secs(15), || read(&marker) == "a\n"), "went back:\n{}", daemon.log());
    let log = daemon.log();
    assert!(log.contains("going back to generation 1"), "{log}");
    assert!(!log.contains(") confirmed: etcd answered"), "{log}");
}

/// Issue 42: the status says which generation the node will not go back from by itself
/// (`confirmed`), for the rollout's gate; issue 43: a new generation and its confirmation are one
/// status write, where they were three (the generation, the round trip, the confirmation). Every
/// status the node wrote is read back from etcd's history: none says generation 2 before its
/// round trip was answered, and generation 2 is written once, saying it is confirmed.
///
/// Shown failing: with the status writer's wait for the confirmation taken out
/// (`status::CONFIRM_WAIT` zero), generation 2 was written twice, first saying confirmed 1.
#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn a_new_generation_and_its_confirmation_are_one_status_write() {
    let s = Scratch::new();
    let etcd = OwnEtcd::start(&s);
    let url = etcd.url();
    let name = unique("confirmed");
    let marker = s.path("marker");
    put(&s, &url, &name, "127.0.0.1", "a\n");
    let daemon = node_in_namespace(&s, etcd.client, &name, &["--confirm-window", "30"]);
    assert!(wait_for(PATIENCE, || read(&marker) == "a\n"), "{}", daemon.log());
    // The first generation has nothing to go back to: confirmed as it is applied.
    assert!(
        wait_for(PATIENCE, || node_status(&s, &url, &name)["status"]["confirmed"] == 1),
        "{:#}\n{}",
        node_status(&s, &url, &name),
        daemon.log()
    );
    // Past the writer's rate limit, so that it is idle when generation 2 comes: in its pause,
    // it would write after the round trip whether it waits for it or not.
    std::thread::sleep(Duration::from_secs(2));
    let key = format!("/mesh-host/node/{name}/status");
    let (from, before) = (revision_now(&url), version_of(&url, &key));
    put(&s, &url, &name, "127.0.0.1", "b\n");
    assert!(wait_for(PATIENCE, || read(&marker) == "b\n"), "{}", daemon.log());
    assert!(wait_for(PATIENCE, || daemon.log().contains(") confirmed: etcd answered")), "{}", daemon.log());
    assert!(
        wait_for(PATIENCE, || node_status(&s, &url, &name)["status"]["confirmed"] == 2),
        "{:#}\n{}",
        node_status(&s, &url, &name),
        daemon.log()
    );
    // Past the writer's rate limit: a second write, had there been one, has landed.
    std::thread::sleep(Duration::from_secs(2));
    let history = status_history(&url, &name, from);
    let said = || history.iter().map(|v| v.to_string()).collect::<Vec<_>>().join("\n");
    let twos: Vec<_> = history.iter().filter(|v| v["generation"] == 2).collect();
    assert!(!twos.is_empty() && twos.iter().all(|v| v["confirmed"] == 2), "{}", said());
    assert_eq!(
        version_of(&url, &key) - before,
        1,
        "one status write for generation 2:\n{}\n{}",
        said(),
        daemon.log()
    );
}

/// Issue 42, hole 2: abort is not undone. The node takes the candidate and confirms it; then
/// its `/etc/hosts` points etcd's name nowhere (the connection it holds still carries the
/// abort), the rollout is aborted, and once the node is back on its declaration etcd itself is
/// stopped, for longer than the window. The node stays on its declaration: the candidate is no
/// fallback for the generation the abort brought back.
#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn after_an_abort_a_node_cut_off_from_etcd_never_goes_back_to_the_candidate() {
    let s = Scratch::new();
    let mut etcd = OwnEtcd::start(&s);
    let url = etcd.url();
    let name = unique("abort");
    let marker = s.path("marker");
    let declare = |dir: &str, content: &str| {
        write_declaration(
            &s.path(&format!("{dir}/d.json")),
            json!([{"type": "file", "id": "marker", "path": s.p("marker"), "content": content}]),
        );
        s.p(dir)
    };
    let v1 = declare("v1", "a\n");
    let out = fleet(&s, &["put", "--etcd", &url, "--fleet", &v1]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let daemon = node_in_namespace(&s, etcd.client, &name, &["--confirm-window", WINDOW]);
    assert!(wait_for(PATIENCE, || read(&marker) == "a\n"), "{}", daemon.log());
    // Current: alive too, so the rollout's plan (over live nodes) has it.
    assert!(
        wait_for(PATIENCE, || node_status(&s, &url, &name)["current"] == true),
        "{:#}",
        node_status(&s, &url, &name)
    );
    let v2 = declare("v2", "b\n");
    let out = fleet(
        &s,
        &[
            "rollout",
            "start",
            "--etcd",
            &url,
            "--fleet",
            "--waves",
            "100%",
            "--soak",
            "0",
            "--deadline",
            "60",
            &v2,
        ],
    );
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(wait_for(PATIENCE, || read(&marker) == "b\n"), "{}", daemon.log());
    assert!(
        wait_for(PATIENCE, || daemon.log().contains("generation 2 (revision ")
            && daemon.log().contains(") confirmed: etcd answered")),
        "{}",
        daemon.log()
    );

    cut_off(&daemon);
    let before = daemon.log().len();
    let out = fleet(&s, &["rollout", "abort", "--etcd", &url]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(wait_for(PATIENCE, || read(&marker) == "a\n"), "back on v1 after the abort:\n{}", daemon.log());
    // The barrier: the node's word on generation 1 once its pass ended (a window, or none).
    let decided = || {
        let log = daemon.log();
        let after = &log[before..];
        after.contains("generation 1 is not confirmed by etcd") || after.contains("applied: confirming it")
    };
    assert!(wait_for(PATIENCE, decided), "{}", daemon.log());
    // And no window left recorded: nothing that could take the node back at a deadline, with
    // etcd stopped or not.
    assert!(wait_for(PATIENCE, || !window_open(&s)), "a window still recorded:\n{}", daemon.log());
    etcd.stop();
    assert_eq!(read(&marker), "a\n", "the node went back to the aborted candidate:\n{}", daemon.log());
    assert!(!daemon.log()[before..].contains("by itself"), "{}", daemon.log());
    assert!(!daemon.log()[before..].contains("applied: confirming it"), "{}", daemon.log());
}

/// The window the kill tests give a node.
const KILL_WINDOW: u64 = 10;

/// Generation 1 (marker `a`) applied and confirmed; the node cut off (its `/etc/hosts`); then
/// generation 2 (marker `b`), read on the connection held, applied and armed; the agent killed
/// (SIGKILL) inside its window. Returns when the window armed.
fn killed_inside_a_window(s: &Scratch, etcd: &OwnEtcd, name: &str) -> std::time::Instant {
    let url = etcd.url();
    let marker = s.path("marker");
    put_marker(s, &url, name, "a\n");
    let window = KILL_WINDOW.to_string();
    let daemon = node_in_namespace(s, etcd.client, name, &["--confirm-window", &window]);
    assert!(wait_for(PATIENCE, || read(&marker) == "a\n"), "{}", daemon.log());
    assert!(
        wait_for(PATIENCE, || node_status(s, &url, name)["status"]["generation"] == 1),
        "{:#}\n{}",
        node_status(s, &url, name),
        daemon.log()
    );
    cut_off(&daemon);
    put_marker(s, &url, name, "b\n");
    let armed = || {
        daemon.log().contains("generation 2 (revision ") && daemon.log().contains("applied: confirming it")
    };
    assert!(wait_for(PATIENCE, armed), "{}", daemon.log());
    let at = std::time::Instant::now();
    assert_eq!(read(&marker), "b\n");
    drop(daemon);
    at
}

/// Issue 42, hole 4: an agent killed inside its window, whose window closes while it is down,
/// and restarted with etcd out of reach, goes back at once.
#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn an_agent_killed_inside_its_window_and_restarted_cut_off_goes_back() {
    let s = Scratch::new();
    let mut etcd = OwnEtcd::start(&s);
    let name = unique("killed");
    let marker = s.path("marker");
    let armed = killed_inside_a_window(&s, &etcd, &name);
    etcd.stop();
    let closed = armed + Duration::from_secs(KILL_WINDOW + 1);
    std::thread::sleep(closed.saturating_duration_since(std::time::Instant::now()));
    let window = KILL_WINDOW.to_string();
    let daemon = node_in_namespace(&s, etcd.client, &name, &["--confirm-window", &window]);
    assert!(wait_for(PATIENCE, || read(&marker) == "a\n"), "went back:\n{}", daemon.log());
    assert!(daemon.log().contains("going back to generation 1 by itself"), "{}", daemon.log());
    assert!(daemon.log().contains("the agent restarted in between"), "at its start:\n{}", daemon.log());
    let out = s.run(&["generations"]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("held at generation 1 by the node itself"), "{said}");
}

/// Issue 42, hole 4: an agent killed inside its window and restarted with etcd in reach
/// confirms the generation and stays on it.
#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn an_agent_killed_inside_its_window_and_restarted_in_reach_confirms_and_stays() {
    let s = Scratch::new();
    let etcd = OwnEtcd::start(&s);
    let url = etcd.url();
    let name = unique("resumed");
    let marker = s.path("marker");
    killed_inside_a_window(&s, &etcd, &name);
    // Restarted at once: its `/etc/hosts` is good again (`node_in_namespace` writes it).
    let window = KILL_WINDOW.to_string();
    let daemon = node_in_namespace(&s, etcd.client, &name, &["--confirm-window", &window]);
    assert!(
        wait_for(PATIENCE, || daemon.log().contains("recorded before the agent restarted is open")),
        "{}",
        daemon.log()
    );
    assert!(
        wait_for(PATIENCE, || daemon.log().contains("generation 2 (revision ")
            && daemon.log().contains(") confirmed: etcd answered")),
        "{}",
        daemon.log()
    );
    assert!(
        wait_for(PATIENCE, || node_status(&s, &url, &name)["status"]["confirmed"] == 2),
        "{:#}\n{}",
        node_status(&s, &url, &name),
        daemon.log()
    );
    // The window resumed from the record is closed, and its record gone: nothing is left to
    // take the node back at the deadline it was armed with (what a confirmed window does at
    // its deadline, nothing, is `fleet::confirm`'s paused-time test). Still generation 2.
    assert!(wait_for(PATIENCE, || !window_open(&s)), "the window is still recorded:\n{}", daemon.log());
    assert_eq!(read(&marker), "b\n", "{}", daemon.log());
    assert!(!daemon.log().contains("by itself"), "{}", daemon.log());
}

/// Issue 42: a node that went back by itself during a rollout (its failure within the budget)
/// stays held on the generation it went back to after promote: the promoted declaration is the
/// generation it went back from, which changes nothing under the hold (docs/decisions.md,
/// "Rollouts"). `fleet status` does not call it current while it is held, and promote names it.
/// The canary reaches etcd by a name the candidate points nowhere; the other node reaches it by
/// address, so the candidate cuts off the canary alone.
#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn after_promote_a_node_that_went_back_stays_held_and_is_not_called_current() {
    let s = Scratch::new();
    let etcd = OwnEtcd::start(&s);
    let url = etcd.url();
    let marker = "/etc/mesh-host-promote-marker";
    let declare = |dir: &str, address: &str, content: &str| {
        write_declaration(
            &s.path(&format!("{dir}/d.json")),
            json!([
                {"type": "file", "id": "hosts", "path": "/etc/hosts", "content": hosts(address)},
                {"type": "file", "id": "marker", "path": marker, "content": content},
            ]),
        );
        s.p(dir)
    };
    let out = fleet(&s, &["put", "--etcd", &url, "--fleet", &declare("good", "127.0.0.1", "a\n")]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let (canary, other) = (unique("canary"), unique("other"));
    let (sc, so) = (Scratch::new(), Scratch::new());
    let window = ["--confirm-window", WINDOW];
    let canary_d = node_in_namespace(&sc, etcd.client, &canary, &window);
    let other_d = node_in_namespace_at(&so, &url, &other, &window, &[]);
    let seen = |d: &Daemon| {
        let pid = d.child.as_ref().unwrap().id();
        std::fs::read_to_string(format!("/proc/{pid}/root{marker}")).unwrap_or_default()
    };
    for (name, d) in [(&canary, &canary_d), (&other, &other_d)] {
        assert!(
            // Current: alive too, so the rollout's plan (over live nodes) has it.
            wait_for(PATIENCE, || seen(d) == "a\n" && node_status(&s, &url, name)["current"] == true),
            "{name}:\n{}",
            d.log()
        );
    }

    let bad = declare("bad", "127.0.0.2", "b\n");
    let driver = super::rollout::Driver::start(
        &s,
        &[
            "start",
            "--etcd",
            &url,
            "--fleet",
            &bad,
            "--waves",
            "1,100%",
            "--soak",
            "0",
            "--canary",
            &canary,
            "--max-failures",
            "1",
            "--deadline",
            "120",
        ],
    );
    let (code, said) = driver.finish(Duration::from_secs(120));
    assert_eq!(code, Some(0), "one going back is within the budget:\n{said}\ncanary:\n{}", canary_d.log());
    assert!(said.contains(&format!("{canary}: FAILED: reverted by itself")), "{said}");
    assert_eq!(seen(&other_d), "b\n", "{said}\n{}", other_d.log());

    let out = fleet(&s, &["rollout", "promote", "--etcd", &url]);
    let promoted = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(promoted.contains(&format!("stay held where they went back: {canary}")), "{promoted}");
    let at: i64 = promoted
        .split("promoted at revision ")
        .nth(1)
        .and_then(|r| r.split(':').next())
        .and_then(|r| r.parse().ok())
        .unwrap_or_else(|| panic!("{promoted}"));
    // The canary reads the promoted declaration (its cache written again at that revision, or
    // at a later one when its source, backing off since the candidate cut it off, reads again
    // after the promote: doubled from 250 ms up to 30 s with jitter)...
    let read_since = || {
        canary_d
            .log()
            .lines()
            .filter_map(|l| l.split("declaration from etcd accepted at revision ").nth(1))
            .any(|r| r.split(':').next().and_then(|r| r.parse::<i64>().ok()).is_some_and(|r| r >= at))
    };
    assert!(wait_for(Duration::from_secs(40), read_since), "{}", canary_d.log());
    assert!(wait_for(PATIENCE, || node_status(&s, &url, &other)["current"] == true));
    // ...and stays on the generation it went back to, held, never called current.
    assert_eq!(seen(&canary_d), "a\n", "{}", canary_d.log());
    let row = node_status(&s, &url, &canary);
    assert!(!row["status"]["hold"].is_null() && !row["status"]["reverted"].is_null(), "{row:#}");
    assert_eq!(row["current"], false, "a held node is not current: {row:#}");
    let out = fleet(&s, &["status", "--etcd", &url]);
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stdout));
    assert_eq!(seen(&canary_d), "a\n");
}

/// Issue 44, point 3: with signed declarations, a node cut off from etcd by its new signed
/// generation does not go back by itself below what it accepted (its high-water mark): the
/// window closes unconfirmed, the node stays on the new generation and says why, and nothing
/// is reverted; a newer signed version then reaches it as usual. Against a real etcd, a real
/// agent in a namespace of its own, and `ssh-keygen` signing.
#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn with_signed_declarations_a_node_cut_off_by_its_new_generation_never_goes_below_its_mark() {
    let s = Scratch::new();
    let etcd = OwnEtcd::start(&s);
    let url = etcd.url();
    let name = unique("floor");
    let marker = s.path("marker");
    let alice = crate::signed::keypair(&s, "alice");
    let signers = crate::signed::allowed(&s, &[&alice]);
    let signed_put = |address: &str, content: &str| {
        write_declaration(
            &s.path("in/d.json"),
            json!([
                {"type": "file", "id": "hosts", "path": "/etc/hosts", "content": hosts(address)},
                {"type": "file", "id": "marker", "path": s.p("marker"), "content": content},
            ]),
        );
        let args = ["put", "--etcd", &url, "--node", &name, "--sign", alice.to_str().unwrap()];
        let out = fleet(&s, &[&args[..], &["--fleet-name", "prod", s.p("in/d.json").as_str()]].concat());
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    };
    let more =
        ["--confirm-window", WINDOW, "--allowed-signers", signers.to_str().unwrap(), "--fleet-name", "prod"];
    signed_put("127.0.0.1", "a\n");
    let daemon = node_in_namespace(&s, etcd.client, &name, &more);
    assert!(wait_for(PATIENCE, || read(&marker) == "a\n"), "{}", daemon.log());
    let mark = s.state().parent().unwrap().join(format!("trust/node.{name}"));
    assert!(read(&mark).starts_with("version 1\n"), "{}", daemon.log());

    // Version 2 points the name at an address where nothing listens: the window closes
    // unconfirmed, and the node stays on it rather than go below version 2.
    signed_put("127.0.0.2", "b\n");
    assert!(wait_for(PATIENCE, || read(&marker) == "b\n"), "version 2 applied:\n{}", daemon.log());
    assert!(read(&mark).starts_with("version 2\n"));
    assert!(
        wait_for(Duration::from_secs(5) + PATIENCE, || daemon
            .log()
            .contains("a node never goes back below what it accepted (its high-water mark)")),
        "said why it stays:\n{}",
        daemon.log()
    );
    // The barrier: a hand-edit put back, so the controller has acted since the window closed.
    std::fs::write(&marker, "by hand\n").unwrap();
    assert!(wait_for(PATIENCE, || read(&marker) != "by hand\n"), "the hand-edit stayed:\n{}", daemon.log());
    assert_eq!(read(&marker), "b\n", "went back below the mark:\n{}", daemon.log());
    assert_eq!(node_hosts(&daemon), hosts("127.0.0.2"));
    assert!(read(&mark).starts_with("version 2\n"), "the mark never goes down");
    assert_eq!(metric(&daemon, "mesh_host_reverts_total"), Some(0.0), "{}", daemon.log());
    assert_eq!(metric(&daemon, "mesh_host_reverted"), Some(0.0));
    assert!(!daemon.log().contains("by itself:"), "{}", daemon.log());
}
