#!/usr/bin/env python3
"""The long run's totals (RELIABILITY.md, "The long run"): every history a long run kept.

    tests/robust/totals.py DIR      (DIR as given to tests/robust/long.sh)

Reads DIR/run-N.log for each run's seed, verdict and history, then each history.jsonl: the
operations by outcome, the faults by kind (a fault's steps, such as the quota's fill and heal,
counted once, under the fault), etcd's revisions, the agents' claims, the samples and caches.
"""
import collections
import glob
import json
import re
import sys

FAULTS = [  # (kind as RELIABILITY.md names it, what the nemesis's line begins with)
    ("members killed (kill -9) and restarted", r"kill -9 etcd"),
    ("members stopped (SIGSTOP) and continued", r"SIGSTOP etcd m\d+$"),
    ("compactions at the current revision, a member stopped", r"SIGSTOP etcd m\d+, a (write|put), compaction"),
    ("backend quotas spent (NOSPACE) and healed", r"etcd's backend quota spent"),
    ("nodes cut off (nftables in their namespace)", r"agent ro-\d+ cut off"),
    ("agents killed inside their confirmation window", r"kill -9 agent ro-\d+ inside"),
    ("agents killed (kill -9) and restarted", r"kill -9 agent ro-\d+$"),
    ("drivers stopped past their lease", r"SIGSTOP driver"),
    ("links made slow and lossy (nftables loss, a TBF rate)", r".* on a slow, lossy link"),
    ("agents stopped through the first waves (directed)", r"SIGSTOP agent"),
    ("every member stopped as a node takes the abort (directed)", r"SIGSTOP every etcd member"),
]
# Inner steps of a fault, written as faults by histories made before they became notes.
STEPS = [r"\d+ MiB put outside", r"deleted \d+; compact", r"compact at revision"]


def main(dir_):
    runs, violations, wall = 0, 0, 0.0
    ops, faults, claims, other = (collections.Counter() for _ in range(4))
    revisions, races, unknown_faults = 0, collections.Counter(), collections.Counter()
    for log in sorted(glob.glob(f"{dir_}/run-*.log"), key=lambda p: int(re.findall(r"\d+", p)[-1])):
        text = open(log).read()
        found = re.search(r"history: (\S+history\.jsonl)", text)
        verdict = re.search(r"(\d+) violation\(s\)", text)
        took = re.search(r"finished in ([\d.]+)s", text)
        if not (found and verdict):
            print(f"{log}: no history or verdict (the run did not finish)", file=sys.stderr)
            continue
        runs += 1
        races["two operators at once"] += len(re.findall(r"robust: race of \d+ operators", text))
        races["an abort as a wave opens"] += text.count("robust: race: abort as a wave opens")
        violations += int(verdict.group(1))
        wall += float(took.group(1)) if took else 0
        last_rev = 0
        for line in open(found.group(1)):
            e = json.loads(line)
            kind = e["kind"]
            if kind == "op" and e["phase"] != "invoke":
                ops[e["phase"]] += 1
                other[f"op {e['op']} {e['phase']}"] += 1
            elif kind == "etcd":
                last_rev = max(last_rev, e.get("rev", 0))
            elif kind == "claim":
                claims[e["what"]] += 1
            elif kind == "nemesis" and e["phase"] == "start":
                name = next((n for n, p in FAULTS if re.match(p, e["fault"])), None)
                if name:
                    faults[name] += 1
                elif not any(re.match(p, e["fault"]) for p in STEPS):
                    unknown_faults[e["fault"][:80]] += 1
            elif kind in ("sample", "cache"):
                other[kind] += 1
        revisions += last_rev
    print(f"runs: {runs} ({wall / 60:.1f} min of test time); violations: {violations}")
    print(f"operations: {sum(ops.values())}: " + ", ".join(f"{v} {k}" for k, v in ops.most_common()))
    print("races: " + ", ".join(f"{v} {k}" for k, v in races.items()))
    print(f"faults: {sum(faults.values())}: " + ", ".join(f"{v} {k}" for k, v in faults.most_common()))
    for k, v in unknown_faults.items():
        print(f"  fault of no known kind: {v} x {k}")
    print(f"etcd revisions recorded: {revisions}")
    print("claims: " + ", ".join(f"{v} {k}" for k, v in claims.most_common()))
    print("samples of the files: {sample}; caches read: {cache}".format(**{"sample": 0, "cache": 0, **other}))
    print("by operation: " + ", ".join(f"{v} {k}" for k, v in sorted(other.items()) if k.startswith("op ")))


if __name__ == "__main__":
    main(sys.argv[1])
