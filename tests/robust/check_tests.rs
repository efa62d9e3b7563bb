//! The checker can fail: small histories, each breaking one invariant, and the verdict naming
//! the invariant, the node and the revision; and a clean one, with faults, that passes.

use serde_json::json;

use crate::check::{check, Violation};
use crate::history::{digest, ClaimKind, Edge, Entry, KvOp, Phase};
use crate::model::{admission_key, alive_key, status_key, CANDIDATE, DRIVER, FLEET, LAST, STATE};

/// A history written by hand: each write a new revision, 100 ms apart.
struct H {
    e: Vec<Entry>,
    t: u64,
    rev: i64,
}

fn decl(content: &str) -> String {
    json!({"version": 1, "resources": [{"type": "file", "id": "app", "path": "/t/app.conf", "content": content}]})
        .to_string()
}

fn state(opened: usize, failures: &[&str], done: bool) -> String {
    let failures: Vec<_> = failures.iter().map(|n| json!({"node": n, "reason": "x", "at": 0})).collect();
    json!({"id": "r1", "replaces": FLEET, "waves": [["a"], ["b"]], "opened": opened, "failures": failures,
           "done": done, "closed": null, "started_by": "me on h (pid 7)"})
    .to_string()
}

fn status(revision: i64, generation: u64, confirmed: u64) -> String {
    json!({"node": "n", "revision": revision, "converged": true, "last_error": null,
           "generation": generation, "confirmed": confirmed})
    .to_string()
}

impl H {
    fn new() -> H {
        H { e: Vec::new(), t: 0, rev: 1 }
    }

    fn txn(&mut self, writes: &[(&str, Option<String>)]) -> i64 {
        self.t += 100;
        self.rev += 1;
        for (key, value) in writes {
            let op = if value.is_some() { KvOp::Put } else { KvOp::Del };
            self.e.push(Entry::Etcd {
                t: self.t,
                rev: self.rev,
                op,
                key: key.to_string(),
                value: value.clone(),
            });
        }
        self.rev
    }

    fn put(&mut self, key: &str, value: String) -> i64 {
        self.txn(&[(key, Some(value))])
    }

    fn sample(&mut self, node: &str, content: &str) {
        self.t += 100;
        let (digest, content) = (digest(Some(content)), content.to_owned());
        self.e.push(Entry::Sample { t: self.t, node: node.into(), digest, content });
    }

    fn wait(&mut self, ms: u64) {
        self.t += ms;
    }

    fn op(&mut self, id: u64, op: &str, token: Option<&str>, phase: Phase, out: &str) {
        let token = token.map(str::to_owned);
        self.e.push(Entry::Op {
            t: self.t,
            id,
            phase: Phase::Invoke,
            op: op.into(),
            token,
            pid: Some(900 + id as u32),
            code: None,
            out: String::new(),
        });
        self.t += 50;
        self.e.push(Entry::Op {
            t: self.t,
            id,
            phase,
            op: op.into(),
            token: None,
            pid: None,
            code: Some(0),
            out: out.into(),
        });
    }

    fn fault(&mut self, phase: Edge) {
        self.e.push(Entry::Nemesis { t: self.t, phase, fault: "kill -9 etcd m1".into() });
    }

    fn admit(&mut self, node: &str) -> i64 {
        let a = json!({"rollout": "r1", "replaces": FLEET, "wave": 1, "at": 0}).to_string();
        self.put(&admission_key(node), a)
    }

    /// v1 for the fleet, both nodes on it and alive, a rollout of "c <tok-2>" started, wave 1
    /// (node a) open, a on the candidate and confirmed.
    fn through_wave_one() -> H {
        let mut h = H::new();
        let r = h.put(&format!("{FLEET}app.json"), decl("v1 <tok-1>"));
        for n in ["a", "b"] {
            h.put(&alive_key(n), "1".into());
            h.put(&status_key(n), status(r, 1, 1));
            h.sample(n, "v1 <tok-1>");
        }
        h.txn(&[
            (STATE, Some(state(0, &[], false))),
            (&format!("{CANDIDATE}app.json"), Some(decl("c <tok-2>"))),
        ]);
        h.put(STATE, state(1, &[], false));
        let ra = h.admit("a");
        h.sample("a", "c <tok-2>");
        h.put(&status_key("a"), status(ra, 2, 2));
        h
    }

    /// Then wave 2 (node b) opened, b on the candidate, and the rollout done.
    fn through_wave_two(mut self) -> H {
        self.put(STATE, state(2, &[], false));
        let rb = self.admit("b");
        self.sample("b", "c <tok-2>");
        self.put(&status_key("b"), status(rb, 2, 2));
        self.put(STATE, state(2, &[], true));
        self
    }
}

fn only(v: &[Violation], invariant: &str) -> Violation {
    let found: Vec<&Violation> = v.iter().filter(|v| v.invariant == invariant).collect();
    assert_eq!(found.len(), 1, "want one {invariant}, got: {v:#?}");
    found[0].clone()
}

#[test]
fn a_clean_rollout_through_a_fault_and_an_abort_passes() {
    let mut h = H::through_wave_one().through_wave_two();
    h.fault(Edge::Start);
    h.wait(3_000);
    h.fault(Edge::Stop);
    h.op(1, "abort", None, Phase::Ok, "rollout r1 aborted");
    let last = json!({"id": "r1", "closed": "aborted by me on h (pid 901) at now"}).to_string();
    h.txn(&[(STATE, None), (&admission_key("a"), None), (&admission_key("b"), None), (LAST, Some(last))]);
    h.wait(2_000);
    h.sample("a", "v1 <tok-1>");
    h.sample("b", "v1 <tok-1>");
    h.wait(30_000);
    let v = check(&h.e);
    assert!(v.is_empty(), "{v:#?}");
}

#[test]
fn i1_a_node_running_a_candidate_it_was_not_admitted_to_is_named() {
    let mut h = H::through_wave_one();
    h.sample("b", "c <tok-2>");
    let v = only(&check(&h.e), "I1");
    assert_eq!(v.node.as_deref(), Some("b"));
    // The revision that wrote the candidate.
    assert_eq!(v.revision, Some(7), "{v}");
    assert!(v.to_string().starts_with("I1 node b revision 7 at "), "{v}");
}

#[test]
fn i1_an_admission_outside_the_open_waves_is_named() {
    let mut h = H::through_wave_one();
    let rb = h.admit("b");
    let v = only(&check(&h.e), "I1");
    assert_eq!((v.node.as_deref(), v.revision), (Some("b"), Some(rb)), "{v}");
}

#[test]
fn i2_a_wave_opened_over_an_unconfirmed_node_is_named() {
    let mut h = H::through_wave_one();
    // a applied the candidate; its confirmation has not come (confirmed 1, generation 2).
    let ra = h.rev - 1;
    h.put(&status_key("a"), status(ra, 2, 1));
    // The state written again (a pause undone, say): the gate counts from here.
    h.put(STATE, state(1, &[], false));
    let open = h.put(STATE, state(2, &[], false));
    let v = only(&check(&h.e), "I2");
    assert_eq!((v.node.as_deref(), v.revision), (Some("a"), Some(open)), "{v}");
    assert!(v.what.contains("not confirmed"), "{v}");
}

#[test]
fn i2_a_node_counted_as_failed_no_longer_holds_the_gate() {
    let mut h = H::through_wave_one();
    let ra = h.rev - 1;
    h.put(&status_key("a"), status(ra, 2, 1));
    h.put(STATE, state(1, &["a"], false));
    h.put(STATE, state(2, &["a"], false));
    assert!(check(&h.e).is_empty(), "{:#?}", check(&h.e));
}

#[test]
fn i3_a_wave_opened_over_a_node_that_went_back_by_itself_is_named() {
    let mut h = H::through_wave_one();
    let ra = h.rev - 1;
    h.e.push(Entry::Claim {
        t: h.t,
        node: "a".into(),
        what: ClaimKind::Reverted,
        generation: Some(2),
        revision: Some(ra),
    });
    let open = h.put(STATE, state(2, &[], false));
    let v = only(&check(&h.e), "I3");
    assert_eq!((v.node.as_deref(), v.revision), (Some("a"), Some(open)), "{v}");
}

#[test]
fn i4_a_node_left_on_an_aborted_candidate_is_named_once_no_fault_excuses_it() {
    let mut h = H::through_wave_one();
    let last = json!({"id": "r1", "closed": "aborted by me on h (pid 901) at now"}).to_string();
    let abort = h.txn(&[(STATE, None), (&admission_key("a"), None), (LAST, Some(last))]);
    // A fault right after: no verdict while it lasts and for the grace after it.
    h.fault(Edge::Start);
    h.wait(10_000);
    h.fault(Edge::Stop);
    h.wait(19_000);
    h.sample("b", "v1 <tok-1>");
    assert!(check(&h.e).iter().all(|v| v.invariant != "I4"), "{:#?}", check(&h.e));
    h.wait(5_000);
    h.sample("b", "v1 <tok-1>");
    let all = check(&h.e);
    let v = only(&all, "I4");
    assert_eq!((v.node.as_deref(), v.revision), (Some("a"), Some(abort)), "{v}");
    // And at the end a still runs it: I11 too.
    assert_eq!(only(&all, "I11").node.as_deref(), Some("a"));
}

/// A slow, lossy link is a fault like the others for the checker's allowances; a note (what a
/// probe found while it was on) is no fault by itself.
#[test]
fn i4_is_excused_by_a_slow_link_and_not_by_a_note() {
    let what = "agent ro-1 on a slow, lossy link (30 % lost each way, 64 kbit/s both ends)";
    for slow in [true, false] {
        let mut h = H::through_wave_one();
        let last = json!({"id": "r1", "closed": "aborted by me on h (pid 901) at now"}).to_string();
        h.txn(&[(STATE, None), (&admission_key("a"), None), (LAST, Some(last))]);
        let nemesis = |h: &mut H, phase: Edge, fault: &str| {
            h.e.push(Entry::Nemesis { t: h.t, phase, fault: fault.into() });
        };
        if slow {
            nemesis(&mut h, Edge::Start, what);
        }
        nemesis(&mut h, Edge::Note, &format!("{what}: 3 of 10 pings answered"));
        h.wait(10_000);
        if slow {
            nemesis(&mut h, Edge::Stop, what);
        }
        h.wait(19_000);
        h.sample("b", "v1 <tok-1>");
        let all = check(&h.e);
        assert_eq!(all.iter().any(|v| v.invariant == "I4"), !slow, "slow link: {slow}: {all:#?}");
    }
}

#[test]
fn i7_a_wave_opened_by_a_driver_whose_key_another_holds_is_named() {
    let mut h = H::through_wave_one();
    // The first driver (op 1, pid 901) held the key; its lease ended, a second (op 2, pid 902)
    // took it.
    h.put(DRIVER, "me on h (pid 901) since then".into());
    h.txn(&[(DRIVER, None)]);
    h.put(DRIVER, "me on h (pid 902) since now".into());
    let open = h.put(STATE, state(2, &[], false));
    let by_second = format!("wave 2 of 2 open at revision {open}: b");
    h.op(2, "resume", None, Phase::Ok, &by_second);
    assert!(check(&h.e).iter().all(|v| v.invariant != "I7"), "{:#?}", check(&h.e));
    // The same wave said opened by the first: two drivers acted.
    h.op(1, "start", None, Phase::Info, &format!("rollout r1: a candidate of 1 key(s)\n{by_second}"));
    let v = only(&check(&h.e), "I7");
    assert_eq!(v.revision, Some(open), "{v}");
    assert!(v.what.contains("(pid 901)") && v.what.contains("(pid 902)"), "{v}");
}

#[test]
fn i6_an_acknowledged_put_missing_from_etcd_and_a_refusal_that_wrote_are_named() {
    let mut h = H::through_wave_one().through_wave_two();
    // Acknowledged at revision 40, which holds no such write.
    h.op(1, "put", Some("<tok-9>"), Phase::Ok, "put 1 key(s) at revision 40: done");
    // Refused, yet its token is in etcd.
    h.put(&format!("{FLEET}other.json"), decl("x <tok-8>"));
    h.op(2, "put", Some("<tok-8>"), Phase::Fail, "nothing was put");
    // Unknown: either is fine.
    h.op(3, "put", Some("<tok-7>"), Phase::Info, "unknown");
    let v = check(&h.e);
    let i6: Vec<&Violation> = v.iter().filter(|v| v.invariant == "I6").collect();
    assert_eq!(i6.len(), 2, "{v:#?}");
    assert!(
        i6.iter().any(|v| v.revision == Some(40) && v.what.starts_with("put #1 was acknowledged")),
        "{v:#?}"
    );
    assert!(i6.iter().any(|v| v.what.starts_with("put #2 was refused")), "{v:#?}");
}

#[test]
fn i11_a_node_not_on_its_declaration_at_the_end_is_named_unless_a_hold_it_reports_stands() {
    let mut h = H::through_wave_one().through_wave_two();
    let promoted = h.txn(&[
        (&format!("{FLEET}app.json"), Some(decl("c <tok-2>"))),
        (STATE, None),
        (&admission_key("a"), None),
        (&admission_key("b"), None),
    ]);
    h.sample("b", "v1 <tok-1>");
    let v = only(&check(&h.e), "I11");
    assert_eq!((v.node.as_deref(), v.revision), (Some("b"), Some(promoted)), "{v}");
    let held = json!({"node": "b", "revision": promoted, "converged": true, "hold": "held at generation 1"});
    h.put(&status_key("b"), held.to_string());
    assert!(check(&h.e).is_empty(), "{:#?}", check(&h.e));
}

#[test]
fn i8_a_status_that_says_converged_before_the_files_change_is_named() {
    let mut h = H::through_wave_one();
    // b admitted; its status says so at once, its file changes 100 ms later: within the
    // sampler's slack, not ahead.
    h.put(STATE, state(2, &[], false));
    let rb = h.admit("b");
    h.put(&status_key("b"), status(rb, 2, 1));
    h.sample("b", "c <tok-2>");
    assert!(check(&h.e).is_empty(), "{:#?}", check(&h.e));
    // A put for the fleet outside the rollout's candidate would not reach b; a node's own
    // declaration does: its status says so 3 s before its file holds it.
    let own = h.put("/mesh-host/node/b/declaration/app.json", decl("own <tok-3>"));
    let said = h.put(&status_key("b"), status(own, 3, 2));
    h.wait(3_000);
    h.sample("b", "own <tok-3>");
    let v = only(&check(&h.e), "I8");
    assert_eq!((v.node.as_deref(), v.revision), (Some("b"), Some(said)), "{v}");
    assert!(v.what.contains("not yet"), "{v}");
}

#[test]
fn i10_a_node_that_takes_a_change_twice_with_nothing_new_is_named() {
    let mut h = H::through_wave_one();
    // a: v1, c, back to v1 by itself, then c again at promote: a write explains it.
    h.sample("a", "v1 <tok-1>");
    h.put(&format!("{FLEET}app.json"), decl("c <tok-2>"));
    h.sample("a", "c <tok-2>");
    // b: v1, c, v1, c with nothing written to what it reads.
    h.sample("b", "c <tok-2>");
    h.sample("b", "v1 <tok-1>");
    h.sample("b", "c <tok-2>");
    h.wait(11_000);
    let v = only(&check(&h.e), "I10");
    assert_eq!(v.node.as_deref(), Some("b"), "{v}");
}

#[test]
fn i9_a_cache_that_is_not_etcd_at_its_revision_is_named() {
    let mut h = H::through_wave_one();
    let key = format!("{FLEET}app.json");
    let candidate = format!("{CANDIDATE}app.json");
    // a, admitted, caches the candidate at the admission's revision; b, the fleet's.
    let at = h.rev;
    let cache = |node: &str, revision: i64, kvs: &[(&str, String)]| Entry::Cache {
        t: 0,
        node: node.into(),
        revision,
        kvs: kvs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect(),
    };
    h.e.push(cache("a", at, &[(&candidate, decl("c <tok-2>"))]));
    h.e.push(cache("b", at, &[(&key, decl("v1 <tok-1>"))]));
    assert!(check(&h.e).is_empty(), "{:#?}", check(&h.e));
    // b labels the candidate's bytes with revision 2, when etcd held v1 for it.
    h.e.push(cache("b", 2, &[(&key, decl("c <tok-2>"))]));
    let v = only(&check(&h.e), "I9");
    assert_eq!((v.node.as_deref(), v.revision), (Some("b"), Some(2)), "{v}");
    assert!(v.what.contains("other values"), "{v}");
}

/// A promote, after which b goes back to v1, saying it is held (`held`) or not.
fn promoted_and_b_back(held: bool) -> (H, i64) {
    let mut h = H::through_wave_one().through_wave_two();
    let last = json!({"id": "r1", "closed": "promoted by me on h (pid 901) at now"}).to_string();
    let promoted = h.txn(&[
        (&format!("{FLEET}app.json"), Some(decl("c <tok-2>"))),
        (STATE, None),
        (&admission_key("a"), None),
        (&admission_key("b"), None),
        (LAST, Some(last)),
    ]);
    if held {
        let status =
            json!({"node": "b", "revision": promoted, "converged": true, "hold": "held at generation 1"});
        h.put(&status_key("b"), status.to_string());
    }
    h.sample("b", "v1 <tok-1>");
    h.wait(25_000);
    h.sample("a", "c <tok-2>");
    (h, promoted)
}

#[test]
fn i5_a_node_neither_on_the_promoted_candidate_nor_held_is_named() {
    let (h, promoted) = promoted_and_b_back(false);
    let v = only(&check(&h.e), "I5");
    assert_eq!((v.node.as_deref(), v.revision), (Some("b"), Some(promoted)), "{v}");
    let (h, _) = promoted_and_b_back(true);
    assert!(check(&h.e).iter().all(|v| v.invariant != "I5"), "{:#?}", check(&h.e));
}

#[test]
fn a_history_reads_back_as_it_was_written() {
    let h = H::through_wave_one();
    let text: String = h.e.iter().map(|e| serde_json::to_string(e).unwrap() + "\n").collect();
    assert_eq!(crate::history::parse(&text).unwrap(), h.e);
    let err = crate::history::parse("{\"kind\": \"nothing\"}\n").unwrap_err();
    assert!(err.starts_with("history line 1: "), "{err}");
}
