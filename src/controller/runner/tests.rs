//! The runner against a fake reconciler, under paused time: keys named `slow-*` run apart,
//! others inline; a key claims what follows its first `-` (`slow-x` and `fast-x` meet). Work
//! apart waits on a gate the test opens. Each method of the reconciler the runner calls is a
//! line on a channel, so a test waits for the line it needs instead of sleeping, and since the
//! runtime has one thread, the runner has run up to its next wait by the time a line arrives.

use std::collections::{HashMap, HashSet};
use std::sync::mpsc as gate;

use tokio::sync::mpsc;

use super::*;
use crate::controller::queue;
use crate::declaration::Id;

struct Job {
    id: String,
    gate: Option<gate::Receiver<()>>,
    panics: bool,
}

#[derive(Default)]
struct Fake {
    lines: Option<mpsc::UnboundedSender<String>>,
    /// Work apart of these ids waits until its gate is opened (or dropped).
    gates: HashMap<String, gate::Receiver<()>>,
    /// These ids panic, once: apart for `slow-*`, inline for the others.
    panics: HashSet<String>,
    oldest: Option<std::time::Instant>,
}

impl Fake {
    fn say(&self, line: String) {
        let _ = self.lines.as_ref().expect("a channel").send(line);
    }
}

fn id_of(key: &Key) -> String {
    key.to_string()
}

impl Reconcile for Fake {
    type Job = Job;
    type Back = String;

    fn claim_of(&self, key: &Key) -> Claim {
        match key {
            Key::Full | Key::Declaration => Claim::Everything,
            Key::Resource(id) => {
                let group = id.as_str().split_once('-').map_or(id.as_str(), |(_, g)| g);
                Claim::only(vec![super::super::claims::claim_hash(group)])
            }
        }
    }

    fn runs_apart(&self, key: &Key, limit: usize) -> bool {
        limit > 0 && id_of(key).starts_with("slow")
    }

    fn apart(&mut self, key: &Key, _: Instant) -> Option<Job> {
        let id = id_of(key);
        self.say(format!("apart {id}"));
        Some(Job { gate: self.gates.remove(&id), panics: self.panics.remove(&id), id })
    }

    fn run_apart(job: Job) -> String {
        if let Some(gate) = job.gate {
            let _ = gate.recv();
        }
        assert!(!job.panics, "boom in {}", job.id);
        job.id
    }

    fn take_back(&mut self, key: &Key, _: Instant, back: Result<String, String>) -> Verdict {
        match back {
            Ok(id) => {
                assert_eq!(id, id_of(key), "what comes back is taken back as its own key");
                self.say(format!("back {id}"));
                Verdict::Clean
            }
            Err(message) => {
                self.say(format!("back {key} panicked: {message}"));
                Verdict::Failed
            }
        }
    }

    fn lost(&mut self, key: Option<&Key>, _: &JoinError) {
        self.say(format!("lost {key:?}"));
    }

    fn reconcile(&mut self, key: &Key, _: Instant) -> Verdict {
        let id = id_of(key);
        assert!(!self.panics.remove(&id), "boom inline in {id}");
        self.say(format!("inline {id}"));
        Verdict::Clean
    }

    fn panicked(&mut self, key: &Key, message: &str) -> Verdict {
        self.say(format!("panicked {key}: {message}"));
        Verdict::Failed
    }

    fn done(&mut self, key: &Key, verdict: Verdict, _: Told) {
        self.say(format!("done {key} {verdict:?}"));
    }

    fn oldest_apart(&mut self, started: Option<std::time::Instant>) {
        self.oldest = started;
    }

    fn finish(&mut self) -> Vec<tokio::task::JoinHandle<()>> {
        self.say(format!("finish, oldest apart {:?}", self.oldest.map(|_| "some")));
        Vec::new()
    }
}

fn key(id: &str) -> Key {
    Key::Resource(Id::parse(id).unwrap())
}

struct Run {
    queue: Arc<Queue<Key>>,
    lines: mpsc::UnboundedReceiver<String>,
    seen: Vec<String>,
    task: tokio::task::JoinHandle<()>,
}

impl Run {
    /// A runner of `fake` with at most `limit` apart, started.
    fn start(mut fake: Fake, limit: usize) -> Run {
        let (tx, lines) = mpsc::unbounded_channel();
        fake.lines = Some(tx);
        let queue = Arc::new(Queue::new(queue::Config { jitter: 0.0, ..queue::Config::default() }));
        let task = tokio::spawn(Runner::new(fake, Arc::clone(&queue), limit).run());
        Run { queue, lines, seen: Vec::new(), task }
    }

    /// Waits for `line`; every line up to it is kept in `seen`.
    async fn until(&mut self, line: &str) {
        while !self.seen.iter().any(|l| l == line) {
            let next = self.lines.recv().await.unwrap_or_else(|| panic!("no {line:?}; saw {:?}", self.seen));
            self.seen.push(next);
        }
    }

    /// Where `line` was seen.
    fn at(&self, line: &str) -> usize {
        self.seen.iter().position(|l| l == line).unwrap_or_else(|| panic!("no {line:?} in {:?}", self.seen))
    }

    /// Shuts the queue down and waits for the runner to end.
    async fn stop(mut self) -> Vec<String> {
        self.queue.shut_down();
        self.until("finish, oldest apart None").await;
        self.task.await.unwrap();
        self.seen
    }
}

#[tokio::test(start_paused = true)]
async fn inline_work_goes_on_while_work_apart_runs() {
    let (open, gate) = gate::channel();
    let mut run = Run::start(Fake { gates: HashMap::from([("slow-a".into(), gate)]), ..Fake::default() }, 1);
    run.queue.add(key("slow-a"));
    run.until("apart slow-a").await;
    run.queue.add(key("fast-b"));
    run.queue.add(key("fast-c"));
    run.until("done fast-c Clean").await;
    assert!(
        !run.seen.iter().any(|l| l.starts_with("back")),
        "inline keys ran while slow-a was apart: {:?}",
        run.seen
    );
    open.send(()).unwrap();
    run.until("done slow-a Clean").await;
    let seen = run.stop().await;
    assert_eq!(
        seen,
        [
            "apart slow-a",
            "inline fast-b",
            "done fast-b Clean",
            "inline fast-c",
            "done fast-c Clean",
            "back slow-a"
        ]
        .into_iter()
        .chain(["done slow-a Clean", "finish, oldest apart None"])
        .collect::<Vec<_>>()
    );
}

#[tokio::test(start_paused = true)]
async fn with_no_room_apart_everything_runs_inline() {
    let mut run = Run::start(Fake::default(), 0);
    run.queue.add(key("slow-a"));
    run.until("done slow-a Clean").await;
    assert_eq!(run.seen, ["inline slow-a", "done slow-a Clean"]);
    run.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_claim_is_held_until_its_work_apart_is_taken_back() {
    let (open, gate) = gate::channel();
    let mut run = Run::start(Fake { gates: HashMap::from([("slow-x".into(), gate)]), ..Fake::default() }, 2);
    run.queue.add(key("slow-x"));
    run.until("apart slow-x").await;
    // fast-x meets slow-x's claim; fast-y, added after it, does not and passes it.
    run.queue.add(key("fast-x"));
    run.queue.add(key("fast-y"));
    run.until("done fast-y Clean").await;
    assert!(!run.seen.contains(&"inline fast-x".to_owned()), "fast-x ran beside slow-x: {:?}", run.seen);
    open.send(()).unwrap();
    run.until("done fast-x Clean").await;
    assert!(run.at("back slow-x") < run.at("inline fast-x"), "taken back first: {:?}", run.seen);
    run.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_panic_apart_or_inline_fails_its_key_and_the_runner_goes_on() {
    let panics = HashSet::from(["slow-p".to_owned(), "fast-q".to_owned()]);
    let mut run = Run::start(Fake { panics, ..Fake::default() }, 1);
    run.queue.add(key("slow-p"));
    run.until("back slow-p panicked: boom in slow-p").await;
    run.until("done slow-p Failed").await;
    // Retried after its backoff (paused time moves to it), and clean this time.
    run.until("back slow-p").await;
    run.until("done slow-p Clean").await;
    run.queue.add(key("fast-q"));
    run.until("panicked fast-q: boom inline in fast-q").await;
    run.until("done fast-q Failed").await;
    run.until("done fast-q Clean").await;
    run.stop().await;
}

#[tokio::test(start_paused = true)]
async fn shutdown_waits_for_work_apart_and_takes_it_back() {
    let (open, gate) = gate::channel();
    let mut run = Run::start(Fake { gates: HashMap::from([("slow-a".into(), gate)]), ..Fake::default() }, 1);
    run.queue.add(key("slow-a"));
    run.until("apart slow-a").await;
    run.queue.add(key("fast-b"));
    run.queue.shut_down();
    // What was due when the queue shut down still runs; then the runner waits for slow-a.
    run.until("done fast-b Clean").await;
    tokio::task::yield_now().await;
    assert!(!run.task.is_finished(), "the runner ended with work apart: {:?}", run.seen);
    assert!(run.lines.try_recv().is_err(), "nothing more before slow-a ends: {:?}", run.seen);
    open.send(()).unwrap();
    run.until("back slow-a").await;
    let seen = run.stop().await;
    assert!(
        seen.ends_with(&["done slow-a Clean".to_owned(), "finish, oldest apart None".to_owned()]),
        "{seen:?}"
    );
}
