//! What the dashboard shows of the engine while it works: every KV block's state and the
//! requests in flight with their phase and block tables.
//!
//! The engine thread builds a [`LiveView`] after a step at most every [`LIVE_INTERVAL`],
//! and always when it goes idle so the last view is never stale, and swaps it into a
//! shared slot; readers clone an `Arc` and never wait on the engine. Building one is a
//! pass over the block pool and the requests: microseconds next to a step.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::kv_cache::BlockPool;
use crate::request::{Request, RequestId, RequestStatus};
use crate::scheduler::Scheduler;

/// Least time between two views while the engine is busy.
pub const LIVE_INTERVAL: Duration = Duration::from_millis(100);

/// A block's state, as the block map colours it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockState {
    /// On the free list with nothing worth keeping.
    Free,
    /// On the free list and still findable by its prefix hash: reusable until evicted.
    Cached,
    /// Held by one request.
    Used,
    /// Held by more than one request (a shared prefix).
    Shared,
}

impl BlockState {
    /// The one-letter code of the wire format: `.`, `c`, `u`, `s`.
    pub fn code(self) -> char {
        match self {
            Self::Free => '.',
            Self::Cached => 'c',
            Self::Used => 'u',
            Self::Shared => 's',
        }
    }

    fn of(pool: &BlockPool, b: u32) -> Self {
        match (pool.ref_count(b), pool.is_cached(b)) {
            (0, false) => Self::Free,
            (0, true) => Self::Cached,
            (1, _) => Self::Used,
            _ => Self::Shared,
        }
    }
}

/// Where a request is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    Waiting,
    /// Lost its blocks to another request; waits to be recomputed.
    Preempted,
    /// Running, with tokens behind the last one not yet computed: a prompt (chunked
    /// prefill spans several steps) or a preempted request's recomputation.
    Prefill,
    Decode,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Self::Waiting => "waiting",
            Self::Preempted => "preempted",
            Self::Prefill => "prefill",
            Self::Decode => "decode",
        }
    }

    fn of(r: &Request) -> Self {
        match r.status {
            RequestStatus::Preempted => Self::Preempted,
            RequestStatus::Waiting if r.num_preemptions > 0 => Self::Preempted,
            RequestStatus::Waiting | RequestStatus::Finished => Self::Waiting,
            // Decoding computes one token a step, the last sampled one; anything behind
            // it is a prompt (or, after a preemption, a recomputation) being prefilled.
            RequestStatus::Running if r.num_computed_tokens + 1 < r.tokens.len() => Self::Prefill,
            RequestStatus::Running => Self::Decode,
        }
    }
}

/// One request in flight.
#[derive(Debug, Clone, PartialEq)]
pub struct LiveRequest {
    pub id: RequestId,
    pub phase: Phase,
    pub prompt_tokens: usize,
    /// Prompt tokens served from the prefix cache (known once first scheduled).
    pub cached_tokens: usize,
    /// Tokens whose KV is computed.
    pub computed_tokens: usize,
    pub output_tokens: usize,
    pub max_tokens: usize,
    pub num_preemptions: usize,
    /// Seconds since arrival.
    pub age_s: f64,
    /// Seconds from arrival to the first output token, once there is one.
    pub ttft_s: Option<f64>,
    /// The request's block table, in logical order.
    pub blocks: Vec<u32>,
}

/// The engine at one moment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LiveView {
    /// Engine steps run so far.
    pub step: u64,
    pub block_size: usize,
    /// One [`BlockState::code`] per physical block, by block id.
    pub blocks: String,
    /// Running requests in batch order, then waiting ones in serving order.
    pub requests: Vec<LiveRequest>,
}

impl LiveView {
    pub fn build(sched: &Scheduler, step: u64, now: Instant) -> Self {
        let pool = sched.kv.pool();
        let blocks = (0..pool.num_blocks() as u32)
            .map(|b| BlockState::of(pool, b).code())
            .collect();
        let requests = sched
            .running()
            .iter()
            .chain(sched.waiting())
            .filter_map(|id| sched.requests.get(id))
            .map(|r| LiveRequest {
                id: r.id,
                phase: Phase::of(r),
                prompt_tokens: r.prompt_len,
                cached_tokens: r.num_cached_tokens.unwrap_or(0),
                computed_tokens: r.num_computed_tokens,
                output_tokens: r.tokens.len() - r.prompt_len,
                max_tokens: r.max_tokens,
                num_preemptions: r.num_preemptions,
                age_s: now.saturating_duration_since(r.times.arrival).as_secs_f64(),
                ttft_s: r
                    .times
                    .first_token
                    .map(|t| t.saturating_duration_since(r.times.arrival).as_secs_f64()),
                blocks: sched.kv.blocks(r.id).to_vec(),
            })
            .collect();
        Self {
            step,
            block_size: sched.kv.block_size(),
            blocks,
            requests,
        }
    }
}

/// The shared slot the engine publishes views into.
pub type LiveSlot = Arc<Mutex<Arc<LiveView>>>;

/// The engine thread's side: rate limiting and the swap.
pub(crate) struct LivePublisher {
    slot: LiveSlot,
    last: Option<Instant>,
}

impl LivePublisher {
    pub fn new(slot: LiveSlot) -> Self {
        Self { slot, last: None }
    }

    /// Publishes a new view if the last is older than [`LIVE_INTERVAL`] or the engine has
    /// nothing left to do (it is about to sleep, and the view must show that).
    pub fn after_step(&mut self, sched: &Scheduler, step: u64) {
        let now = Instant::now();
        let due = match self.last {
            Some(t) => now - t >= LIVE_INTERVAL,
            None => true,
        };
        if !due && sched.has_unfinished() {
            return;
        }
        self.last = Some(now);
        let view = Arc::new(LiveView::build(sched, step, now));
        if let Ok(mut g) = self.slot.lock() {
            *g = view;
        }
    }
}
