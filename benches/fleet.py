#!/usr/bin/env python3
"""Fleet convergence (issue 14, item 6), on this machine: N agents (each with its own state and
target directory) on one private etcd member, one fleet-wide write, and the time until every
agent's status key reports a revision at or past that write's. Also etcd's write rate from the
idle agents, and each agent's resident size.

    benches/fleet.py [AGENTS] [MESH_HOST_BINARY]

Runs as root (the agents are the real daemon). Each agent holds two inotify instances (the
file watcher and the declaration watcher), and Linux allows 128 per user by default, shared by
every root process on the machine: past about 60 agents, the later ones would stop at start-up
("cannot watch the declaration ...: Too many open files"). So when the limit is too low for the
run, the bench raises `fs.inotify.max_user_instances` (a sysctl, machine-wide) for the run,
says so on stderr, and puts the old value back when it ends, however it ends. Leaves nothing
behind: everything is under a temporary directory and every process it started is stopped by
its id.
"""
import json, os, shutil, signal, socket, statistics, subprocess, sys, tempfile, threading, time

agents = int(sys.argv[1]) if len(sys.argv) > 1 else 20
binary = sys.argv[2] if len(sys.argv) > 2 else os.path.join(os.environ.get("CARGO_TARGET_DIR", "target"), "debug/mesh-host")

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

INOTIFY = "/proc/sys/fs/inotify/max_user_instances"
inotify_before = None
with open(INOTIFY) as f:
    limit = int(f.read())
# Two per agent, and room for what else runs as root on the machine.
wanted = max(1024, agents * 2 + 256)
if limit < wanted:
    with open(INOTIFY, "w") as f:
        f.write(str(wanted))
    inotify_before = limit
    print(f"fleet.py: raised fs.inotify.max_user_instances from {limit} to {wanted} for this run "
          f"(two inotify instances per agent); it is put back to {limit} at the end", file=sys.stderr)

work = tempfile.mkdtemp(prefix="mesh-host-fleet-bench-")
client, peer = free_port(), free_port()
url = f"http://127.0.0.1:{client}"
procs = []

def etcdctl(*args):
    return subprocess.run(["etcdctl", "--endpoints", url, *args], capture_output=True, text=True,
                          env={**os.environ, "ETCDCTL_API": "3"})

def revision():
    return int(json.loads(etcdctl("endpoint", "status", "-w", "json").stdout)[0]["Status"]["header"]["revision"])

def statuses():
    out = json.loads(etcdctl("get", "--prefix", "/mesh-host/node/", "-w", "json").stdout or "{}")
    got = {}
    import base64
    for kv in out.get("kvs", []):
        key = base64.b64decode(kv["key"]).decode()
        if key.endswith("/status"):
            got[key.split("/")[3]] = json.loads(base64.b64decode(kv["value"]))
    return got

def wal_fsyncs():
    """etcd's write-ahead-log fsyncs so far: (count, seconds), from its own /metrics."""
    import urllib.request
    text = urllib.request.urlopen(f"{url}/metrics", timeout=5).read().decode()
    got = {}
    for line in text.splitlines():
        for name in ("etcd_disk_wal_fsync_duration_seconds_count", "etcd_disk_wal_fsync_duration_seconds_sum"):
            if line.startswith(name + " "):
                got[name] = float(line.split()[1])
    return got.get("etcd_disk_wal_fsync_duration_seconds_count", 0), got.get("etcd_disk_wal_fsync_duration_seconds_sum", 0)

def agents_cpu():
    """The CPU seconds (user and system) every agent has used so far."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for p in procs[1:agents + 1]:
        with open(f"/proc/{p.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / tick
    return total

def put_fleet(content):
    # No resource: agents on one machine share its filesystem, and one path declared by the
    # fleet would have them fight over it. The bytes still change (the indent), so every agent
    # reads, accepts and applies a new declaration at the new revision.
    d = os.path.join(work, "fleet")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "base.json"), "w") as f:
        json.dump({"version": 1, "resources": []}, f, indent=len(content))
    out = subprocess.run([binary, "--state", os.path.join(work, "cli/state.json"), "fleet", "put", "--etcd", url,
                          "--fleet", d], check=True, capture_output=True, text=True).stdout
    return int(out.split("at revision ")[1].split(":")[0])

try:
    procs.append(subprocess.Popen(["etcd", "--name", "bench", "--data-dir", os.path.join(work, "etcd"),
        "--listen-client-urls", url, "--advertise-client-urls", url,
        "--listen-peer-urls", f"http://127.0.0.1:{peer}", "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
        "--initial-cluster", f"bench=http://127.0.0.1:{peer}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    for _ in range(100):
        if etcdctl("endpoint", "health").returncode == 0:
            break
        time.sleep(0.1)
    # Each agent's own node key: its own target file, so agents do not fight over one path.
    for i in range(agents):
        d = os.path.join(work, f"n{i}")
        os.makedirs(d)
        with open(os.path.join(d, "own.json"), "w") as f:
            json.dump({"version": 1, "resources": [{"type": "file", "id": "own.conf",
                       "path": os.path.join(d, "own.conf"), "content": f"node {i}\n"}]}, f)
        subprocess.run([binary, "--state", os.path.join(work, "cli/state.json"), "fleet", "put", "--etcd", url,
                        "--node", f"bench-{i}", os.path.join(d, "own.json")], check=True, capture_output=True)
    put_fleet("1")
    for i in range(agents):
        d = os.path.join(work, f"n{i}")
        procs.append(subprocess.Popen([binary, "--state", os.path.join(d, "state/state.json"), "run", "--etcd", url,
            "--node", f"bench-{i}", "--metrics", "off"], stdout=open(os.path.join(d, "log"), "w"), stderr=subprocess.STDOUT))
    deadline = time.time() + 120
    while time.time() < deadline and len([s for s in statuses().values() if s.get("converged")]) < agents:
        time.sleep(0.2)
    ready = len([s for s in statuses().values() if s.get("converged")])
    time.sleep(2)
    # Idle write rate: revisions per second with nothing declared changing.
    r0, t0 = revision(), time.time()
    time.sleep(10)
    idle_rate = (revision() - r0) / (time.time() - t0)
    # One fleet-wide write, then each agent's time to report it applied. A watch on every
    # node's keys, started before the write, stamps each status as etcd delivers it (a poll
    # would measure its own length: on a loaded machine, an etcdctl start takes seconds).
    # Timed from before the `fleet put` starts, so the CLI's own time counts against the agents;
    # `after_the_put_returned_s` is from the moment the write is known to be in etcd.
    watch = subprocess.Popen(["etcdctl", "--endpoints", url, "watch", "--prefix", "/mesh-host/node/", "-w", "json"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                             env={**os.environ, "ETCDCTL_API": "3"})
    procs.append(watch)
    arrivals = []
    def read_watch():
        for line in watch.stdout:
            arrivals.append((time.time(), line))
    threading.Thread(target=read_watch, daemon=True).start()
    time.sleep(1)
    fsyncs_before = wal_fsyncs()
    cpu_before = agents_cpu()
    start = time.time()
    written = put_fleet("22")
    # The put's own time (a debug CLI's start-up, the validation of every node's declaration it
    # reaches, the transaction): the write is in etcd when it returns.
    put_s = time.time() - start
    seen = {}
    import base64
    done = 0
    while time.time() < start + 60 and len(seen) < agents:
        time.sleep(0.05)
        for at, line in arrivals[done:]:
            for ev in json.loads(line).get("Events") or []:
                key = base64.b64decode(ev["kv"]["key"]).decode()
                if not key.endswith("/status") or "value" not in ev["kv"]:
                    continue
                st = json.loads(base64.b64decode(ev["kv"]["value"]))
                node = key.split("/")[3]
                if node not in seen and (st.get("revision") or 0) >= written and st.get("converged"):
                    seen[node] = at - start
        done = len(arrivals)
    times = sorted(seen.values())
    cpu_used = agents_cpu() - cpu_before
    fsyncs_after = wal_fsyncs()
    fsync_count = fsyncs_after[0] - fsyncs_before[0]
    fsync_mean_ms = 1000 * (fsyncs_after[1] - fsyncs_before[1]) / fsync_count if fsync_count else None
    rss = []
    for p in procs[1:agents + 1]:
        with open(f"/proc/{p.pid}/status") as f:
            rss += [int(l.split()[1]) / 1024 for l in f if l.startswith("VmRSS:")]
    q = lambda f: times[min(len(times) - 1, int(f * len(times)))] if times else float("nan")
    print(json.dumps({
        "agents": agents, "converged_before_the_write": ready, "reported": len(times),
        "not_reported": {n: {"revision": st.get("revision"), "converged": st.get("converged")}
                         for n, st in statuses().items() if n not in seen},
        "written_at_revision": written,
        "convergence_s": {"p50": round(q(0.50), 3), "p99": round(q(0.99), 3), "max": round(times[-1], 3) if times else None},
        "fleet_put_s": round(put_s, 3),
        "after_the_put_returned_s": {"p50": round(q(0.50) - put_s, 3), "p99": round(q(0.99) - put_s, 3),
                                     "max": round(times[-1] - put_s, 3) if times else None},
        "load_average_1m": os.getloadavg()[0],
        # The agents' own CPU from the write until the last reported: per agent, what one
        # fleet-wide change costs it (read, cache, parse, apply, status).
        "agent_cpu_for_the_change_ms": {"total": round(cpu_used * 1000), "per_agent": round(cpu_used * 1000 / agents, 1)},
        # etcd's group commit: how many WAL fsyncs carried the write and the 100 status writes,
        # and how long one took on this disk meanwhile.
        "etcd_wal_fsyncs_during_the_write": {"count": int(fsync_count),
                                             "mean_ms": round(fsync_mean_ms, 1) if fsync_mean_ms else None},
        "idle_etcd_revisions_per_s": round(idle_rate, 2),
        "agent_rss_mib": {"median": round(statistics.median(rss), 1), "max": round(max(rss), 1)},
    }, indent=1))
finally:
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
    if inotify_before is not None:
        with open(INOTIFY, "w") as f:
            f.write(str(inotify_before))
        print(f"fleet.py: fs.inotify.max_user_instances put back to {inotify_before}", file=sys.stderr)
    if not os.environ.get("KEEP"):
        shutil.rmtree(work, ignore_errors=True)
    else:
        print("kept", work)
