//! The work queue: keys to reconcile, each waiting at most once, never run twice at once, with
//! per-key backoff and a global rate limit.
//!
//! Modelled on client-go's workqueue and kube-runtime's scheduler, without the four traps found
//! in client-go's tracker:
//! - the global token bucket's wait is capped (`max_wait`), so ten thousand keys added at once
//!   never wait for minutes;
//! - backoff grows only on a failed reconcile or a repeated correction, never on an add, so a
//!   storm of events cannot push a key to its maximum;
//! - a key's failure count is reset by its first success;
//! - the backoff state is visible: `stats()` feeds gauges, and `done` says when a key becomes or
//!   stops being contested.
//!
//! (docs/concurrency.md, "The queue"; the numbers of a contest are in docs/concurrency.md, "Contested
//! resources".)
//!
//! Several reconciles may run at once (`worker`), so a key handed out holds a **claim**: the
//! resources its reconcile may touch (`Claim`). A key whose claim meets one in flight is not
//! handed out; it keeps its place in the ready line and goes as soon as the claim in its way is
//! released by `done`. A key claiming everything (a full pass) that has to wait raises a
//! barrier: the caller may then refuse to start new long work behind it, so the full pass waits
//! at most for what was already running, rather than skipping what is in flight
//! (docs/decisions.md, "A full pass waits for the reconciles in flight and runs alone";
//! docs/concurrency.md, "A full pass and reconciles in flight").
//!
//! All times are tokio's, so the tests run under paused time.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::hash::Hash;
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// How the queue behaves.
#[derive(Clone, Debug)]
pub struct Config {
    /// First retry after a failure; doubles per further failure (5 ms to 5 min, with jitter:
    /// docs/concurrency.md, "The queue").
    pub failure_base: Duration,
    /// The longest retry delay after failures.
    pub failure_cap: Duration,
    /// First backoff after a repeated correction; doubles per further one.
    pub contest_base: Duration,
    /// Kept short on purpose: once the fight stops, the file must be put back within it
    /// (docs/concurrency.md, "Contested resources").
    pub contest_cap: Duration,
    /// A correction within this time of the previous one is a repeat.
    pub contest_window: Duration,
    /// How many repeats in a row make a key contested (reported once, counted in a gauge).
    /// Holds start at the first repeat; the report waits for a pattern, so a person saving a
    /// file twice in a second is not told they are fighting the agent (docs/concurrency.md,
    /// "Contested resources").
    pub contest_after: u32,
    /// Token bucket: keys admitted per second, and the burst.
    pub rate: f64,
    /// The most keys admitted at once, beyond the steady rate.
    pub burst: f64,
    /// The longest the bucket makes any key wait: capped, so ten thousand keys added at once
    /// never wait for minutes (docs/concurrency.md, "The queue").
    pub max_wait: Duration,
    /// Jitter added to backoffs, as a fraction of the delay (0.1 = up to 10 % more).
    pub jitter: f64,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            failure_base: Duration::from_millis(5),
            failure_cap: Duration::from_secs(300),
            contest_base: Duration::from_millis(10),
            contest_cap: Duration::from_millis(500),
            contest_window: Duration::from_secs(1),
            contest_after: 3,
            rate: 1000.0,
            burst: 2000.0,
            max_wait: Duration::from_secs(1),
            jitter: 0.1,
        }
    }
}

/// How a reconcile of a key ended, which decides its backoff.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing to put back, or a change that was the declaration's: resets the key.
    Clean,
    /// The machine had drifted and was corrected.
    Corrected,
    /// The reconcile failed: retried with backoff.
    Failed,
}

/// A change in a key's contested state, for one log line each way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Contest {
    /// The key became contested; its corrections back off.
    Began {
        /// How long the next correction waits.
        wait: Duration,
    },
    /// A contested key settled.
    Ended,
}

/// What the reconcile of a key may touch while it runs, by the hashes of resource ids (a
/// collision only makes two claims meet that need not: a key waits a little, never runs beside
/// one it could race).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claim {
    /// Everything: a full pass, which meets every other claim.
    Everything,
    /// These resources, by the hash of their ids, sorted and without repeats.
    Only(Vec<u64>),
}

impl Claim {
    /// A claim of these hashes.
    pub fn only(mut hashes: Vec<u64>) -> Claim {
        hashes.sort_unstable();
        hashes.dedup();
        Claim::Only(hashes)
    }

    /// Whether two reconciles holding these claims could touch the same resource.
    pub fn meets(&self, other: &Claim) -> bool {
        match (self, other) {
            (Claim::Everything, _) | (_, Claim::Everything) => true,
            (Claim::Only(a), Claim::Only(b)) => {
                // Both sorted: one walk.
                let (mut i, mut j) = (0, 0);
                while i < a.len() && j < b.len() {
                    match a[i].cmp(&b[j]) {
                        std::cmp::Ordering::Less => i += 1,
                        std::cmp::Ordering::Greater => j += 1,
                        std::cmp::Ordering::Equal => return true,
                    }
                }
                false
            }
        }
    }
}

/// What `try_next` found.
#[derive(Debug, PartialEq, Eq)]
pub enum Next<K> {
    /// A key to reconcile now, when its earliest change was seen, and the claim it now holds.
    Key(K, Instant, Claim),
    /// Nothing can be handed out now; something may be at this time (or sooner, on a wake).
    Wait(Option<Instant>),
    /// Shut down, and nothing left to hand out.
    Closed,
}

/// How far down the ready line `try_next` looks for a key free to run. Keys behind the first
/// this many blocked ones wait for those: a bound on the work of one look when a storm of keys
/// waits behind a long reconcile.
const LOOK_AHEAD: usize = 1024;

/// What the queue holds now, for gauges.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Keys waiting (ready or delayed).
    pub depth: usize,
    /// Keys being reconciled.
    pub processing: usize,
    /// Keys held back by a failure or a contest.
    pub backing_off: usize,
    /// Keys held off because something keeps changing them back.
    pub contested: usize,
}

#[derive(Default)]
struct Backoff {
    failures: u32,
    /// Repeated corrections in a row.
    streak: u32,
    last_correction: Option<Instant>,
    /// No run before this.
    backoff_until: Option<Instant>,
}

struct Waiting {
    due: Instant,
    /// When the earliest change behind this key was seen: the start of the latency measured.
    seen: Instant,
    /// Sequence number, to find the entry in `delayed`.
    seq: u64,
}

struct Inner<K> {
    waiting: HashMap<K, Waiting>,
    /// Due times; an entry whose key was made earlier is removed and re-inserted.
    delayed: BTreeMap<(Instant, u64), K>,
    /// Due keys in the order they became due, with their claim once it was asked for (asked
    /// again after `forget_claims`, when the declaration changed).
    ready: VecDeque<(K, Instant, Option<Claim>)>,
    /// The keys in `ready`, so a key added again while it waits there (on a claim in flight)
    /// is not queued a second time.
    in_ready: HashSet<K>,
    processing: HashSet<K>,
    /// The claims of the keys being reconciled.
    claims: HashMap<K, Claim>,
    /// Keys added while processing: run once more afterwards, from this time seen.
    again: HashMap<K, Instant>,
    backoff: HashMap<K, Backoff>,
    tokens: f64,
    refilled: Instant,
    seq: u64,
    closed: bool,
    rng: u64,
}

/// A de-duplicating, rate-limited, delaying work queue of keys.
pub struct Queue<K> {
    /// Everything that changes: the keys waiting, running, dirty and backing off, the claims in
    /// flight and the token bucket. Written by every producer (`add`, `add_after`: the intake
    /// loop, the scheduler's task, the worker's retries) and by the worker (`next`, `try_next`,
    /// `done`, `forget_claims`, `shut_down`); read by the same and by the metrics (`stats`).
    /// Safe because every access takes the std lock, which is never held across an await nor
    /// while a key runs: each method's work under it is a few map operations.
    inner: Mutex<Inner<K>>,
    /// Wakes the worker waiting in `next` or `wait` when a key becomes ready or the queue shuts
    /// down. Any task may notify; the waiter re-reads `inner` after waking, so a spurious or
    /// stored wake-up costs one look.
    wake: Notify,
    /// Set at construction, read only.
    config: Config,
}

impl<K: Clone + Eq + Hash> Queue<K> {
    /// An empty queue with this behaviour.
    pub fn new(config: Config) -> Queue<K> {
        let now = Instant::now();
        Queue {
            inner: Mutex::new(Inner {
                waiting: HashMap::new(),
                delayed: BTreeMap::new(),
                ready: VecDeque::new(),
                in_ready: HashSet::new(),
                processing: HashSet::new(),
                claims: HashMap::new(),
                again: HashMap::new(),
                backoff: HashMap::new(),
                tokens: config.burst,
                refilled: now,
                seq: 0,
                closed: false,
                // A fixed seed: the jitter only spreads retries of different keys apart within
                // one process, which any seed does, and a fixed one keeps tests repeatable.
                rng: 0x9e37_79b9_7f4a_7c15,
            }),
            wake: Notify::new(),
            config,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner<K>> {
        // A panic while holding the lock leaves plain data behind; carrying on is safe.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds a key to run as soon as its backoff and the rate limit allow. A key already waiting is
    /// not added twice; a key being reconciled runs once more afterwards.
    pub fn add(&self, key: K) {
        self.add_seen(key, Instant::now(), Duration::ZERO);
    }

    /// Adds a key to run no sooner than `delay` from now.
    pub fn add_after(&self, key: K, delay: Duration) {
        self.add_seen(key, Instant::now(), delay);
    }

    fn add_seen(&self, key: K, seen: Instant, delay: Duration) {
        let mut q = self.lock();
        if q.closed {
            return;
        }
        let now = Instant::now();
        if q.processing.contains(&key) {
            q.again.entry(key).or_insert(seen);
            return;
        }
        if q.in_ready.contains(&key) {
            // Due already, waiting for a claim in its way: it keeps its place and its sighting.
            return;
        }
        let not_before = q.backoff.get(&key).and_then(|b| b.backoff_until).unwrap_or(now);
        if let Some(w) = q.waiting.get(&key) {
            // Already waiting: keep the earlier due time, never a later one, and the earliest
            // sighting, so latency is measured from the first change.
            let due = (now + delay).max(not_before);
            if due < w.due {
                let (old_due, seq) = (w.due, w.seq);
                q.delayed.remove(&(old_due, seq));
                q.delayed.insert((due, seq), key.clone());
                if let Some(w) = q.waiting.get_mut(&key) {
                    w.due = due;
                }
                drop(q);
                self.wake.notify_one();
            }
            return;
        }
        let wait = q.take_token(now, &self.config);
        let due = (now + delay + wait).max(not_before);
        q.seq += 1;
        let seq = q.seq;
        q.waiting.insert(key.clone(), Waiting { due, seen, seq });
        q.delayed.insert((due, seq), key);
        drop(q);
        self.wake.notify_one();
    }

    /// Waits for the next key that is due, and marks it processing, claiming nothing beyond
    /// the key itself: for a caller that runs one key at a time. `None` once the queue is shut
    /// down and nothing due remains to be handed out.
    pub async fn next(&self) -> Option<(K, Instant)> {
        loop {
            match self.try_next(|_| Claim::Only(Vec::new()), |_, _, _| true) {
                Next::Key(key, seen, _) => return Some((key, seen)),
                Next::Closed => return None,
                Next::Wait(due) => self.wait(due).await,
            }
        }
    }

    /// Waits until `due`, or until something may have become ready sooner: a key added, a key
    /// done. A wake sent before this is called is not lost (`Notify` keeps one permit).
    pub async fn wait(&self, due: Option<Instant>) {
        match due {
            Some(due) => {
                tokio::select! {
                    _ = tokio::time::sleep_until(due) => {}
                    _ = self.wake.notified() => {}
                }
            }
            None => self.wake.notified().await,
        }
    }

    /// Hands out the first due key, in the order keys became due, whose claim (`claim_of`)
    /// meets no claim in flight and that `admit` takes, and marks it processing under that
    /// claim. A key passed over keeps its place. `admit` is told the key, its claim, and
    /// whether a key claiming everything waits ahead of it (a full pass waiting for reconciles
    /// in flight): a caller refuses long work then, so the full pass is not starved.
    pub fn try_next(
        &self,
        mut claim_of: impl FnMut(&K) -> Claim,
        mut admit: impl FnMut(&K, &Claim, bool) -> bool,
    ) -> Next<K> {
        let mut q = self.lock();
        let now = Instant::now();
        while let Some((&(due, seq), _)) = q.delayed.first_key_value() {
            if due > now {
                break;
            }
            let key = q.delayed.remove(&(due, seq)).expect("the entry just seen");
            let seen = q.waiting.remove(&key).map_or(now, |w| w.seen);
            q.in_ready.insert(key.clone());
            q.ready.push_back((key, seen, None));
        }
        let inner = &mut *q;
        let mut barrier = false;
        let mut found = None;
        for (at, (key, _, claim)) in inner.ready.iter_mut().enumerate().take(LOOK_AHEAD) {
            let claim = claim.get_or_insert_with(|| claim_of(key));
            let free = !inner.claims.values().any(|held| held.meets(claim));
            if free && admit(key, claim, barrier) {
                found = Some(at);
                break;
            }
            if !free && *claim == Claim::Everything {
                barrier = true;
            }
        }
        if let Some(at) = found {
            let (key, seen, claim) = q.ready.remove(at).expect("the entry just found");
            q.in_ready.remove(&key);
            let claim = claim.expect("asked for above");
            q.processing.insert(key.clone());
            q.claims.insert(key.clone(), claim.clone());
            return Next::Key(key, seen, claim);
        }
        if q.closed && q.ready.is_empty() && q.delayed.is_empty() {
            return Next::Closed;
        }
        Next::Wait(q.delayed.first_key_value().map(|(&(due, _), _)| due))
    }

    /// Forgets the claims worked out for keys still waiting: the declaration they were worked
    /// out from was replaced. Claims in flight stay until their reconciles are done.
    pub fn forget_claims(&self) {
        for (_, _, claim) in self.lock().ready.iter_mut() {
            *claim = None;
        }
    }

    /// Marks a key done, with how its reconcile ended. Returns a change of its contested state.
    pub fn done(&self, key: &K, verdict: Verdict) -> Option<Contest> {
        let mut q = self.lock();
        let now = Instant::now();
        q.processing.remove(key);
        q.claims.remove(key);
        let config = &self.config;
        let jitter = q.jitter(config.jitter);
        let b = q.backoff.entry(key.clone()).or_default();
        let was_contested = b.streak >= config.contest_after;
        let mut retry = None;
        match verdict {
            Verdict::Clean => {
                b.failures = 0;
                b.streak = 0;
                b.backoff_until = None;
            }
            Verdict::Failed => {
                b.failures = b.failures.saturating_add(1);
                let delay = grow(config.failure_base, b.failures, config.failure_cap, jitter);
                b.backoff_until = Some(now + delay);
                retry = Some(delay);
            }
            Verdict::Corrected => {
                b.failures = 0;
                let repeat =
                    b.last_correction.is_some_and(|at| now.duration_since(at) <= config.contest_window);
                b.last_correction = Some(now);
                if repeat {
                    b.streak = b.streak.saturating_add(1);
                    let delay = grow(config.contest_base, b.streak, config.contest_cap, jitter);
                    b.backoff_until = Some(now + delay);
                    // Run again when the backoff ends, so a fight that stops is put right then
                    // even if no further event comes.
                    retry = Some(delay);
                } else {
                    b.streak = 0;
                    b.backoff_until = None;
                }
            }
        }
        let now_contested = b.streak >= config.contest_after;
        let wait = b.backoff_until.map(|h| h.saturating_duration_since(now)).unwrap_or_default();
        if b.failures == 0
            && b.streak == 0
            && b.last_correction.is_none_or(|at| now.duration_since(at) > config.contest_window)
        {
            // Nothing left to remember: a long-running daemon must not grow a map entry for
            // every key it ever saw.
            q.backoff.remove(key);
        }
        let again = q.again.remove(key);
        drop(q);
        // A claim was released: a key waiting on it may go now.
        self.wake.notify_one();
        if let Some(delay) = retry {
            self.add_seen(key.clone(), now, delay);
        }
        if let Some(seen) = again {
            self.add_seen(key.clone(), seen, Duration::ZERO);
        }
        match (was_contested, now_contested) {
            (false, true) => Some(Contest::Began { wait }),
            (true, false) => Some(Contest::Ended),
            _ => None,
        }
    }

    /// Until when a key is held after repeated corrections (a contest), if it is: the owner may
    /// stop listening for changes to it until then, since none would run it sooner.
    pub fn held(&self, key: &K) -> Option<Instant> {
        let q = self.lock();
        let b = q.backoff.get(key)?;
        (b.streak > 0 && b.failures == 0).then_some(b.backoff_until?).filter(|&until| until > Instant::now())
    }

    /// Stops taking keys. What is due is still handed out; `next` then returns `None`.
    pub fn shut_down(&self) {
        let mut q = self.lock();
        q.closed = true;
        // Later work is dropped, since shutting down must not wait for a backoff to expire:
        // the first full pass after the restart covers it.
        let now = Instant::now();
        let delayed = std::mem::take(&mut q.delayed);
        for ((due, _), key) in delayed {
            let seen = q.waiting.remove(&key).map_or(now, |w| w.seen);
            if due <= now {
                q.in_ready.insert(key.clone());
                q.ready.push_back((key, seen, None));
            }
        }
        drop(q);
        self.wake.notify_waiters();
        // And a permit for a caller between two looks, which `notify_waiters` does not reach.
        self.wake.notify_one();
    }

    /// How many keys are waiting, being reconciled, backing off and contested, now.
    pub fn stats(&self) -> Stats {
        let q = self.lock();
        let now = Instant::now();
        Stats {
            depth: q.waiting.len() + q.ready.len(),
            processing: q.processing.len(),
            backing_off: q.backoff.values().filter(|b| b.backoff_until.is_some_and(|h| h > now)).count(),
            contested: q.backoff.values().filter(|b| b.streak >= self.config.contest_after).count(),
        }
    }
}

impl<K> Inner<K> {
    /// Takes a token, returning how long to wait for it (capped).
    fn take_token(&mut self, now: Instant, c: &Config) -> Duration {
        let elapsed = now.duration_since(self.refilled).as_secs_f64();
        self.refilled = now;
        self.tokens = (self.tokens + elapsed * c.rate).min(c.burst);
        self.tokens -= 1.0;
        if self.tokens >= 0.0 {
            return Duration::ZERO;
        }
        // The debt is bounded too, so the bucket recovers within `max_wait` once adds stop.
        let floor = -(c.rate * c.max_wait.as_secs_f64());
        self.tokens = self.tokens.max(floor);
        Duration::from_secs_f64((-self.tokens / c.rate).min(c.max_wait.as_secs_f64()))
    }

    /// A factor in [1, 1 + spread): xorshift, which is plenty to spread retries apart.
    fn jitter(&mut self, spread: f64) -> f64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        1.0 + spread * ((self.rng >> 11) as f64 / (1u64 << 53) as f64)
    }
}

/// `base * 2^(n-1)`, capped, times the jitter factor (the cap itself is not exceeded).
fn grow(base: Duration, n: u32, cap: Duration, jitter: f64) -> Duration {
    let exp = n.saturating_sub(1).min(30);
    let raw = base.saturating_mul(1u32 << exp).min(cap);
    raw.mul_f64(jitter).min(cap)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quiet() -> Config {
        Config { jitter: 0.0, ..Config::default() }
    }

    async fn next_now(q: &Queue<&'static str>) -> Option<&'static str> {
        tokio::time::timeout(Duration::from_millis(0), q.next()).await.ok().flatten().map(|(k, _)| k)
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiting_key_is_queued_once() {
        let q = Queue::new(quiet());
        q.add("a");
        q.add("a");
        q.add("b");
        q.add("a");
        assert_eq!(q.stats().depth, 2);
        assert_eq!(next_now(&q).await, Some("a"));
        assert_eq!(next_now(&q).await, Some("b"));
        assert_eq!(next_now(&q).await, None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_added_while_processing_runs_once_afterwards_never_twice_at_once() {
        let q = Queue::new(quiet());
        q.add("a");
        assert_eq!(next_now(&q).await, Some("a"));
        q.add("a");
        q.add("a");
        assert_eq!(next_now(&q).await, None, "never handed out while it is processing");
        assert_eq!(q.done(&"a", Verdict::Clean), None);
        assert_eq!(next_now(&q).await, Some("a"), "runs once more");
        q.done(&"a", Verdict::Clean);
        assert_eq!(next_now(&q).await, None, "and only once");
    }

    #[tokio::test(start_paused = true)]
    async fn failures_back_off_exponentially_and_success_resets() {
        let q = Queue::new(quiet());
        q.add("a");
        let (k, _) = q.next().await.unwrap();
        let mut delays = Vec::new();
        for _ in 0..5 {
            q.done(&k, Verdict::Failed);
            let before = Instant::now();
            let (again, _) = q.next().await.unwrap();
            assert_eq!(again, "a", "a failed key is retried without any event");
            delays.push((Instant::now() - before).as_millis());
        }
        assert_eq!(delays, [5, 10, 20, 40, 80]);
        q.done(&"a", Verdict::Clean);
        q.add("a");
        assert_eq!(next_now(&q).await, Some("a"), "success resets: no backoff any more");
        q.done(&"a", Verdict::Failed);
        let before = Instant::now();
        let _ = q.next().await.unwrap();
        assert_eq!(Instant::now() - before, Duration::from_millis(5), "and the count starts again");
    }

    #[tokio::test(start_paused = true)]
    async fn backoff_is_capped() {
        let q = Queue::new(Config { failure_cap: Duration::from_secs(1), ..quiet() });
        q.add("a");
        for _ in 0..40 {
            let (k, _) = q.next().await.unwrap();
            q.done(&k, Verdict::Failed);
        }
        let before = Instant::now();
        let _ = q.next().await.unwrap();
        assert_eq!(Instant::now() - before, Duration::from_secs(1));
    }

    #[tokio::test(start_paused = true)]
    async fn events_do_not_grow_backoff() {
        let q = Queue::new(quiet());
        for _ in 0..1000 {
            q.add("a");
        }
        let (k, _) = q.next().await.unwrap();
        q.done(&k, Verdict::Failed);
        let before = Instant::now();
        let _ = q.next().await.unwrap();
        assert_eq!(Instant::now() - before, Duration::from_millis(5), "one failure, one step");
    }

    #[tokio::test(start_paused = true)]
    async fn the_rate_limit_waits_but_never_longer_than_the_cap() {
        let q =
            Queue::new(Config { rate: 10.0, burst: 5.0, max_wait: Duration::from_millis(300), ..quiet() });
        let keys: Vec<&'static str> =
            (0..50).map(|i| &*Box::leak(format!("k{i}").into_boxed_str())).collect();
        let start = Instant::now();
        for k in &keys {
            q.add(k);
        }
        let mut last = Duration::ZERO;
        for _ in 0..50 {
            let (k, _) = q.next().await.unwrap();
            last = Instant::now() - start;
            q.done(&k, Verdict::Clean);
        }
        assert!(last > Duration::ZERO, "beyond the burst, keys waited");
        assert!(last <= Duration::from_millis(300), "no key waited beyond the cap: {last:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_repeated_correction_is_contested_held_and_settles() {
        let q = Queue::new(quiet());
        q.add("f");
        let (k, _) = q.next().await.unwrap();
        assert_eq!(q.done(&k, Verdict::Corrected), None, "the first correction is not a contest");
        q.add("f");
        // Under paused time the clock moves only when every task waits on a timer, so a key
        // held back even a millisecond would show in `elapsed`.
        let before = Instant::now();
        let (k, _) = q.next().await.unwrap();
        assert_eq!(before.elapsed(), Duration::ZERO, "and the next change is corrected at once");
        assert_eq!(q.done(&k, Verdict::Corrected), None, "one repeat is held, not yet reported");
        // Held: an event now does not run it at once.
        q.add("f");
        assert_eq!(next_now(&q).await, None);
        let before = Instant::now();
        let (k, _) = q.next().await.unwrap();
        assert_eq!(Instant::now() - before, Duration::from_millis(10));
        assert_eq!(q.done(&k, Verdict::Corrected), None);
        let before = Instant::now();
        let (k, _) = q.next().await.unwrap();
        assert_eq!(Instant::now() - before, Duration::from_millis(20), "doubling");
        assert!(
            matches!(q.done(&k, Verdict::Corrected), Some(Contest::Began { .. })),
            "a pattern is reported"
        );
        assert_eq!(q.stats().contested, 1);
        let (k, _) = q.next().await.unwrap();
        // The backoff never exceeds the contest cap, so a fight that stops is put right quickly.
        for _ in 0..20 {
            q.done(&k, Verdict::Corrected);
            let before = Instant::now();
            let _ = q.next().await.unwrap();
            assert!(Instant::now() - before <= Duration::from_millis(500));
        }
        assert_eq!(q.done(&"f", Verdict::Clean), Some(Contest::Ended));
        assert_eq!(q.stats().contested, 0);
    }

    /// `held` says until when a contested key is held, and nothing for a first correction, a
    /// failure's backoff, or once the key settles: the worker mutes the key's path that long.
    #[tokio::test(start_paused = true)]
    async fn a_hold_is_said_only_for_a_repeated_correction() {
        let q = Queue::new(quiet());
        q.add("f");
        let (k, _) = q.next().await.unwrap();
        q.done(&k, Verdict::Corrected);
        assert_eq!(q.held(&"f"), None, "a first correction holds nothing");
        q.add("f");
        let (k, _) = q.next().await.unwrap();
        q.done(&k, Verdict::Corrected);
        assert_eq!(q.held(&"f"), Some(Instant::now() + Duration::from_millis(10)), "a repeat is held");
        tokio::time::advance(Duration::from_millis(10)).await;
        assert_eq!(q.held(&"f"), None, "a hold that ended is not said");
        let (k, _) = q.next().await.unwrap();
        q.done(&k, Verdict::Clean);
        assert_eq!(q.held(&"f"), None, "settled");
        q.add("g");
        let (k, _) = q.next().await.unwrap();
        q.done(&k, Verdict::Failed);
        assert_eq!(q.held(&"g"), None, "a failure's backoff is no contest");
    }

    #[tokio::test(start_paused = true)]
    async fn corrections_far_apart_are_not_a_contest() {
        let q = Queue::new(quiet());
        for _ in 0..5 {
            q.add("f");
            let (k, _) = q.next().await.unwrap();
            assert_eq!(q.done(&k, Verdict::Corrected), None);
            tokio::time::advance(Duration::from_secs(3)).await;
        }
        assert_eq!(q.stats().contested, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn shutting_down_hands_out_what_is_due_then_ends() {
        let q = Queue::new(quiet());
        q.add("a");
        q.add_after("later", Duration::from_secs(60));
        q.shut_down();
        q.add("b");
        assert_eq!(q.next().await.map(|(k, _)| k), Some("a"));
        assert_eq!(q.next().await, None, "delayed work is dropped and new work refused");
    }

    #[tokio::test(start_paused = true)]
    async fn latency_is_measured_from_the_first_sighting() {
        let q = Queue::new(quiet());
        let first = Instant::now();
        q.add_after("a", Duration::from_millis(50));
        tokio::time::advance(Duration::from_millis(10)).await;
        q.add("a");
        let (_, seen) = q.next().await.unwrap();
        assert_eq!(seen, first);
        assert_eq!(Instant::now() - first, Duration::from_millis(10), "the earlier due time won");
    }

    #[tokio::test(start_paused = true)]
    async fn settled_keys_are_forgotten() {
        let q = Queue::new(quiet());
        for i in 0..100 {
            let k: &'static str = Box::leak(format!("k{i}").into_boxed_str());
            q.add(k);
            let (k, _) = q.next().await.unwrap();
            q.done(&k, Verdict::Clean);
        }
        assert_eq!(q.lock().backoff.len(), 0);
    }

    /// Claims for the tests: a key's claim is the hashes listed for it, everything for "full".
    fn claims(key: &&'static str) -> Claim {
        match *key {
            "full" => Claim::Everything,
            "file" => Claim::only(vec![1]),
            "file+svc" => Claim::only(vec![1, 2]),
            "svc" => Claim::only(vec![2]),
            "other" => Claim::only(vec![3]),
            "slow" => Claim::only(vec![4]),
            _ => Claim::only(vec![99]),
        }
    }

    fn take(q: &Queue<&'static str>) -> Option<&'static str> {
        match q.try_next(claims, |_, _, _| true) {
            Next::Key(k, _, _) => Some(k),
            Next::Wait(_) | Next::Closed => None,
        }
    }

    #[test]
    fn claims_meet_when_they_share_a_resource_and_everything_meets_all() {
        assert!(Claim::only(vec![3, 1]).meets(&Claim::only(vec![5, 3])));
        assert!(!Claim::only(vec![1, 2]).meets(&Claim::only(vec![3, 4])));
        assert!(Claim::Everything.meets(&Claim::only(vec![7])));
        assert!(Claim::only(Vec::new()).meets(&Claim::Everything));
        assert!(!Claim::only(Vec::new()).meets(&Claim::only(vec![1])));
    }

    #[tokio::test(start_paused = true)]
    async fn keys_with_disjoint_claims_run_together() {
        let q = Queue::new(quiet());
        q.add("svc");
        q.add("file");
        q.add("other");
        assert_eq!(take(&q), Some("svc"));
        assert_eq!(take(&q), Some("file"), "handed out while svc is in flight");
        assert_eq!(take(&q), Some("other"));
        assert_eq!(q.stats().processing, 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_whose_claim_meets_one_in_flight_waits_keeps_its_place_and_is_deduplicated() {
        let q = Queue::new(quiet());
        q.add("svc");
        assert_eq!(take(&q), Some("svc"));
        q.add("file+svc");
        q.add("other");
        q.add("file+svc");
        assert_eq!(take(&q), Some("other"), "a key free to run passes the one that waits");
        assert_eq!(take(&q), None, "file+svc meets svc's claim");
        q.add("file+svc");
        q.add("file+svc");
        assert_eq!(q.stats().depth, 1, "waiting once, however often it was added, before or while it waits");
        q.add("file");
        assert_eq!(take(&q), Some("file"), "file alone meets nothing in flight");
        q.done(&"file", Verdict::Clean);
        // Released: the waiting key is handed out at once, without any time passing, and wakes
        // a caller waiting for it.
        let waiter = q.wait(None);
        q.done(&"svc", Verdict::Clean);
        tokio::time::timeout(Duration::ZERO, waiter).await.expect("done wakes the caller");
        let before = Instant::now();
        assert_eq!(take(&q), Some("file+svc"));
        assert_eq!(before.elapsed(), Duration::ZERO);
        assert_eq!(take(&q), None, "and only once");
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_never_runs_twice_at_once_under_claims_either() {
        let q = Queue::new(quiet());
        q.add("file");
        assert_eq!(take(&q), Some("file"));
        q.add("file");
        assert_eq!(take(&q), None, "it is in flight: added again, it waits for its own end");
        assert_eq!(q.stats().depth, 0, "kept aside to run once more, not in the line");
        q.done(&"file", Verdict::Clean);
        assert_eq!(take(&q), Some("file"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_pass_waits_for_claims_in_flight_and_holds_back_only_what_admit_refuses() {
        let q = Queue::new(quiet());
        q.add("slow");
        assert_eq!(take(&q), Some("slow"));
        q.add("full");
        q.add("svc");
        q.add("file");
        // The caller's rule: short keys run beside anything; long ones ("svc") not behind a
        // waiting full pass.
        let mut barriers = Vec::new();
        let mut admit = |k: &&'static str, _: &Claim, barrier: bool| {
            barriers.push((*k, barrier));
            *k != "svc" || !barrier
        };
        match q.try_next(claims, &mut admit) {
            Next::Key(k, _, Claim::Only(_)) => assert_eq!(k, "file"),
            other => panic!("the file was not handed out: {other:?}"),
        }
        assert_eq!(barriers, [("svc", true), ("file", true)], "the full pass raised the barrier");
        assert_eq!(q.try_next(claims, |k, _, b| *k != "svc" || !b), Next::Wait(None));
        q.done(&"file", Verdict::Clean);
        assert_eq!(
            q.try_next(claims, |k, _, b| *k != "svc" || !b),
            Next::Wait(None),
            "the full pass still waits for slow"
        );
        // An hour later the slow reconcile ends; the full pass goes first, alone.
        tokio::time::advance(Duration::from_secs(3600)).await;
        q.done(&"slow", Verdict::Clean);
        assert_eq!(take(&q), Some("full"));
        assert_eq!(take(&q), None, "nothing runs beside a full pass");
        q.done(&"full", Verdict::Clean);
        assert_eq!(take(&q), Some("svc"), "and svc kept its place behind it");
    }

    #[tokio::test(start_paused = true)]
    async fn claims_are_asked_again_after_they_are_forgotten() {
        let q = Queue::new(quiet());
        q.add("svc");
        assert_eq!(take(&q), Some("svc"));
        q.add("x");
        let mut asked = 0;
        let r = q.try_next(
            |_| {
                asked += 1;
                Claim::only(vec![2])
            },
            |_, _, _| true,
        );
        assert_eq!(r, Next::Wait(None));
        let _ = q.try_next(|_| panic!("kept, not asked again"), |_, _, _| true);
        q.forget_claims();
        let r = q.try_next(|_| Claim::only(vec![5]), |_, _, _| true);
        assert!(matches!(r, Next::Key("x", _, _)), "the new claim was used: {r:?}");
        assert_eq!(asked, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn shut_down_with_keys_waiting_on_claims_ends_once_they_ran() {
        let q = Queue::new(quiet());
        q.add("svc");
        assert_eq!(take(&q), Some("svc"));
        q.add("file+svc");
        q.shut_down();
        assert_eq!(q.try_next(claims, |_, _, _| true), Next::Wait(None), "not closed: one still waits");
        q.done(&"svc", Verdict::Clean);
        assert_eq!(take(&q), Some("file+svc"));
        q.done(&"file+svc", Verdict::Clean);
        assert_eq!(q.try_next(claims, |_, _, _| true), Next::Closed);
    }
}
