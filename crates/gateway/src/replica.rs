//! What the gateway knows about one upstream replica: requests in flight, health,
//! the load its `/metrics` report, and which prompt prefixes its KV cache holds.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::config::Deployment;

/// Blocks the gateway remembers having routed to a replica (its own routing history).
const RECENT_CAP: usize = 1 << 16;
/// The most block hashes taken from a replica's KV events: a replica holds at most its
/// `num_gpu_blocks`, this only guards against a misbehaving upstream.
const EXACT_CAP: usize = 1 << 21;
/// While a replica's KV events are connected, a routed block counts as held only this
/// long unless an event confirms it (time for the replica to compute it).
const PENDING_TTL: Duration = Duration::from_secs(15);

#[derive(Debug)]
pub struct Health {
    /// The last active checks passed (or none failed enough yet).
    pub up: bool,
    pub check_fails: u32,
    /// Failed requests in a row (passive).
    pub consecutive_fails: u32,
    pub ejected_until: Option<Instant>,
    pub ejections_in_row: u32,
}

#[derive(Debug, Default, Clone, Copy)]
pub struct Load {
    pub waiting: f64,
    pub running: f64,
    pub kv_usage: f64,
    pub scraped: Option<Instant>,
}

/// Prefix state: exact block hashes from the replica's KV events, plus the gateway's
/// own recent routing (bounded LRU) for replicas without events and for blocks not
/// computed yet.
#[derive(Default)]
pub struct PrefixState {
    pub exact: HashSet<u128>,
    pub connected: bool,
    pub block_size: Option<usize>,
    pub num_blocks: Option<usize>,
    recent: HashMap<u128, (u64, Instant)>,
    order: VecDeque<(u128, u64)>,
    seq: u64,
}

impl PrefixState {
    pub fn note_routed(&mut self, hashes: &[u128], now: Instant) {
        for &h in hashes {
            self.seq += 1;
            self.recent.insert(h, (self.seq, now));
            self.order.push_back((h, self.seq));
        }
        while self.recent.len() > RECENT_CAP || self.order.len() > 2 * RECENT_CAP {
            let Some((h, s)) = self.order.pop_front() else {
                break;
            };
            if self.recent.get(&h).is_some_and(|e| e.0 == s) {
                self.recent.remove(&h);
            }
        }
    }

    /// How many leading blocks of `hashes` this replica holds (or is about to).
    pub fn matched(&self, hashes: &[u128], exact_hashes: bool, now: Instant) -> usize {
        hashes
            .iter()
            .take_while(|h| {
                (exact_hashes && self.connected && self.exact.contains(h))
                    || self.recent.get(h).is_some_and(|&(_, t)| {
                        !(exact_hashes && self.connected) || now.duration_since(t) < PENDING_TTL
                    })
            })
            .count()
    }

    pub fn snapshot(&mut self, hashes: impl IntoIterator<Item = u128>) {
        self.exact.clear();
        self.exact.extend(hashes.into_iter().take(EXACT_CAP));
        self.connected = true;
    }

    pub fn stored(&mut self, hashes: impl IntoIterator<Item = u128>) {
        for h in hashes {
            if self.exact.len() < EXACT_CAP {
                self.exact.insert(h);
            }
        }
    }

    pub fn removed(&mut self, hashes: impl IntoIterator<Item = u128>) {
        for h in hashes {
            self.exact.remove(&h);
            self.recent.remove(&h);
        }
    }

    pub fn disconnected(&mut self) {
        self.connected = false;
        self.exact.clear();
    }

    pub fn recent_len(&self) -> usize {
        self.recent.len()
    }
}

/// The span of a deployment's `rpm` and `tpm` limits.
const LIMIT_WINDOW: Duration = Duration::from_secs(60);

/// What a deployment with `rpm`/`tpm` (LiteLLM's per-deployment limits) was sent and
/// used over the last minute. Only kept for the limits that are set, so its size is
/// bounded by `rpm` and by the requests of one minute.
#[derive(Debug, Default)]
pub struct Window {
    requests: VecDeque<Instant>,
    tokens: VecDeque<(Instant, u64)>,
    token_sum: u64,
}

impl Window {
    fn expire(&mut self, now: Instant) {
        let old = |t: Instant| now.saturating_duration_since(t) >= LIMIT_WINDOW;
        while self.requests.front().is_some_and(|t| old(*t)) {
            self.requests.pop_front();
        }
        while let Some(&(t, n)) = self.tokens.front() {
            if !old(t) {
                break;
            }
            self.tokens.pop_front();
            self.token_sum -= n;
        }
    }

    /// How long until `dep`'s limits let another request through; `None` when they do now.
    fn wait(&mut self, dep: &Deployment, now: Instant) -> Option<Duration> {
        self.expire(now);
        let until = |t: Instant| LIMIT_WINDOW.saturating_sub(now.saturating_duration_since(t));
        let by_requests = dep
            .rpm
            .filter(|&rpm| self.requests.len() as u64 >= rpm)
            .map(|_| self.requests.front().map_or(LIMIT_WINDOW, |t| until(*t)));
        let by_tokens = dep
            .tpm
            .filter(|&tpm| self.token_sum >= tpm)
            .map(|_| self.tokens.front().map_or(LIMIT_WINDOW, |(t, _)| until(*t)));
        by_requests.max(by_tokens)
    }
}

pub struct Replica {
    pub dep: Deployment,
    pub in_flight: AtomicUsize,
    pub window: Mutex<Window>,
    pub health: Mutex<Health>,
    pub load: Mutex<Load>,
    pub prefix: Mutex<PrefixState>,
    /// A pagellm replica: publishes KV events and can resume a stream.
    pub is_pagellm: AtomicBool,
    /// Requests routed here (attempts, resumed streams included).
    pub routed: AtomicU64,
    /// Its background tasks (health, metrics, KV events) run.
    pub tasks_started: AtomicBool,
}

/// Why a replica took a request out of rotation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// Connection refused or reset, or the stream broke: the process is likely gone.
    Connection,
    /// 5xx, 429, invalid body or timeout: alive but failing.
    Response,
}

impl Replica {
    pub fn new(dep: Deployment) -> Self {
        Self {
            dep,
            in_flight: AtomicUsize::new(0),
            window: Mutex::new(Window::default()),
            health: Mutex::new(Health {
                up: true,
                check_fails: 0,
                consecutive_fails: 0,
                ejected_until: None,
                ejections_in_row: 0,
            }),
            load: Mutex::new(Load::default()),
            prefix: Mutex::new(PrefixState::default()),
            is_pagellm: AtomicBool::new(false),
            routed: AtomicU64::new(0),
            tasks_started: AtomicBool::new(false),
        }
    }

    pub fn available(&self, now: Instant) -> bool {
        let h = self.health.lock().unwrap();
        h.up && h.ejected_until.is_none_or(|t| now >= t)
            && self
                .dep
                .max_concurrency
                .is_none_or(|m| self.in_flight.load(Ordering::Relaxed) < m)
            && self.limit_wait(now).is_none()
    }

    /// How long until the deployment's `rpm`/`tpm` let a request through, if they
    /// hold one back now.
    pub fn limit_wait(&self, now: Instant) -> Option<Duration> {
        if self.dep.rpm.is_none() && self.dep.tpm.is_none() {
            return None;
        }
        self.window.lock().unwrap().wait(&self.dep, now)
    }

    /// Counts a request against `rpm`, unless the limits are reached (then false). A
    /// check and a count under one lock, so concurrent requests cannot overshoot.
    pub fn reserve(&self, now: Instant) -> bool {
        if self.dep.rpm.is_none() && self.dep.tpm.is_none() {
            return true;
        }
        let mut w = self.window.lock().unwrap();
        if w.wait(&self.dep, now).is_some() {
            return false;
        }
        if self.dep.rpm.is_some() {
            w.requests.push_back(now);
        }
        true
    }

    /// Counts the tokens a request used (prompt and completion) against `tpm`.
    pub fn record_tokens(&self, n: u64) {
        if self.dep.tpm.is_some() {
            let mut w = self.window.lock().unwrap();
            w.tokens.push_back((Instant::now(), n));
            w.token_sum += n;
        }
    }

    pub fn is_up(&self) -> bool {
        let h = self.health.lock().unwrap();
        h.up && h.ejected_until.is_none_or(|t| Instant::now() >= t)
    }

    /// The load score routing compares: the replica's own queue when its metrics are
    /// fresh (waiting requests count twice: they have not started), else the gateway's
    /// in-flight count.
    pub fn load_score(&self, fresh: Duration) -> f64 {
        let inflight = self.in_flight.load(Ordering::Relaxed) as f64;
        let l = *self.load.lock().unwrap();
        match l.scraped {
            Some(t) if t.elapsed() < fresh => inflight.max(l.running + l.waiting) + l.waiting,
            _ => inflight,
        }
    }

    /// Records a failed request; returns true when this ejects the replica.
    pub fn record_failure(&self, kind: Failure, allowed_fails: u32, cooldown: Duration) -> bool {
        let mut h = self.health.lock().unwrap();
        if kind == Failure::Connection {
            // Gone until an active check sees it again.
            h.up = false;
        }
        h.consecutive_fails += 1;
        if h.consecutive_fails >= allowed_fails || kind == Failure::Connection {
            let factor = 1u32 << h.ejections_in_row.min(3);
            h.ejected_until = Some(Instant::now() + cooldown * factor);
            h.ejections_in_row += 1;
            h.consecutive_fails = 0;
            return true;
        }
        false
    }

    pub fn record_success(&self) {
        let mut h = self.health.lock().unwrap();
        h.consecutive_fails = 0;
        h.ejections_in_row = 0;
    }

    /// An active check's result; returns true when the replica comes back.
    pub fn record_check(&self, ok: bool, failure_threshold: u32) -> bool {
        let mut h = self.health.lock().unwrap();
        if ok {
            let back = !h.up;
            h.up = true;
            h.check_fails = 0;
            if back {
                // It was down and answers again (restarted): readmit now rather than
                // after the cooldown meant for replicas that answer but fail.
                h.ejected_until = None;
                h.consecutive_fails = 0;
            }
            back
        } else {
            h.check_fails += 1;
            if h.check_fails >= failure_threshold {
                h.up = false;
            }
            false
        }
    }
}

/// Counts a request in flight on a replica until dropped.
pub struct InFlight(pub Arc<Replica>);

impl InFlight {
    pub fn new(r: &Arc<Replica>) -> Self {
        r.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(r.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}
