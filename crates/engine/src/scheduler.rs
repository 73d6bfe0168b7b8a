//! The scheduler (vLLM v1's design): every step, running requests first, in order, each
//! gets the tokens it has not computed yet, within a token budget; then waiting requests
//! are admitted in policy order while the budget, `max_num_seqs` and the KV pool allow.
//! A prompt longer than what is left of the budget is split into chunks that share
//! steps with decodes (chunked prefill). When a running request cannot get a block,
//! the lowest-priority, latest-arrived running request is preempted: its blocks are
//! freed and it rejoins the waiting queue to be recomputed later.

use std::collections::HashMap;
use std::str::FromStr;
use std::time::Instant;

use crate::kv_cache::{ComputedBlocks, KvCacheManager};
use crate::request::{Request, RequestId, RequestStatus};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Policy {
    /// First come, first served.
    #[default]
    Fcfs,
    /// Lowest `priority` value first, then arrival order.
    Priority,
}

impl FromStr for Policy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "fcfs" => Ok(Policy::Fcfs),
            "priority" => Ok(Policy::Priority),
            other => Err(format!(
                "unknown scheduling policy {other:?}; expected fcfs or priority"
            )),
        }
    }
}

#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// Tokens computed per step at most, over all requests.
    pub max_num_batched_tokens: usize,
    /// Requests running at once at most.
    pub max_num_seqs: usize,
    pub policy: Policy,
    /// Split prompts longer than the remaining budget into chunks; without it a prompt
    /// waits until its whole uncached part fits in one step.
    pub enable_chunked_prefill: bool,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            max_num_batched_tokens: 2048,
            max_num_seqs: 256,
            policy: Policy::Fcfs,
            enable_chunked_prefill: true,
        }
    }
}

/// One step's plan.
#[derive(Debug, Default, Clone)]
pub struct SchedulerOutput {
    /// Requests and how many new tokens each computes this step, in batch order.
    pub scheduled: Vec<(RequestId, usize)>,
    /// Requests preempted while planning this step.
    pub preempted: Vec<RequestId>,
}

impl SchedulerOutput {
    pub fn num_tokens(&self) -> usize {
        self.scheduled.iter().map(|s| s.1).sum()
    }
}

pub struct Scheduler {
    pub config: SchedulerConfig,
    pub kv: KvCacheManager,
    pub requests: HashMap<RequestId, Request>,
    /// Waiting requests; fcfs keeps them in serving order (preempted ones at the front).
    waiting: Vec<RequestId>,
    running: Vec<RequestId>,
    pub num_preemptions: u64,
    /// Prompt tokens of requests admitted for the first time.
    pub num_prompt_tokens: u64,
    /// Requests scheduled for the first time.
    pub num_admitted: u64,
}

impl Scheduler {
    pub fn new(config: SchedulerConfig, kv: KvCacheManager) -> Self {
        Self {
            config,
            kv,
            requests: HashMap::new(),
            waiting: Vec::new(),
            running: Vec::new(),
            num_preemptions: 0,
            num_prompt_tokens: 0,
            num_admitted: 0,
        }
    }

    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    pub fn running(&self) -> &[RequestId] {
        &self.running
    }

    /// Waiting requests in serving order.
    pub fn waiting(&self) -> &[RequestId] {
        &self.waiting
    }

    pub fn has_unfinished(&self) -> bool {
        !self.waiting.is_empty() || !self.running.is_empty()
    }

    pub fn add(&mut self, mut req: Request) {
        req.status = RequestStatus::Waiting;
        req.update_block_hashes(self.kv.block_size());
        self.waiting.push(req.id);
        self.requests.insert(req.id, req);
    }

    /// Removes a request wherever it is and releases its blocks.
    pub fn remove(&mut self, id: RequestId) -> Option<Request> {
        self.waiting.retain(|&w| w != id);
        self.running.retain(|&r| r != id);
        self.kv.free(id);
        let mut req = self.requests.remove(&id)?;
        req.status = RequestStatus::Finished;
        Some(req)
    }

    /// Order key of a request: smaller is served first and preempted last.
    fn key(&self, id: RequestId) -> (i64, u64) {
        let r = &self.requests[&id];
        match self.config.policy {
            Policy::Fcfs => (0, r.seq),
            Policy::Priority => (r.params.priority as i64, r.seq),
        }
    }

    /// Index in `waiting` of the request to admit next.
    fn next_waiting(&self) -> Option<usize> {
        match self.config.policy {
            Policy::Fcfs => (!self.waiting.is_empty()).then_some(0),
            Policy::Priority => (0..self.waiting.len()).min_by_key(|&i| self.key(self.waiting[i])),
        }
    }

    /// Preempts a running request now (as running out of blocks would); false if it is
    /// not running.
    pub fn preempt_request(&mut self, id: RequestId) -> bool {
        match self.running.iter().position(|&r| r == id) {
            Some(i) => {
                self.preempt(i);
                true
            }
            None => false,
        }
    }

    fn preempt(&mut self, idx: usize) -> RequestId {
        let id = self.running.remove(idx);
        self.kv.free(id);
        let r = self.requests.get_mut(&id).expect("running request exists");
        r.status = RequestStatus::Preempted;
        r.num_computed_tokens = 0;
        r.num_preemptions += 1;
        self.num_preemptions += 1;
        tracing::debug!(
            request = id,
            tokens = r.num_tokens(),
            "preempted: out of KV blocks"
        );
        self.waiting.insert(0, id);
        id
    }

    pub fn schedule(&mut self) -> SchedulerOutput {
        let mut out = SchedulerOutput::default();
        let mut budget = self.config.max_num_batched_tokens;

        // 1. Running requests, in order.
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let id = self.running[i];
            let r = &self.requests[&id];
            let n = (r.num_tokens() - r.num_computed_tokens)
                .min(budget)
                .min(r.max_chunk());
            if n == 0 {
                i += 1;
                continue;
            }
            loop {
                let r = &self.requests[&id];
                if self.kv.allocate_slots(
                    id,
                    r.num_computed_tokens,
                    &ComputedBlocks::default(),
                    n,
                    &r.block_hashes,
                ) {
                    out.scheduled.push((id, n));
                    budget -= n;
                    i += 1;
                    break;
                }
                // Out of blocks: preempt the request that matters least.
                let victim = (0..self.running.len())
                    .max_by_key(|&j| self.key(self.running[j]))
                    .expect("running is not empty");
                let vid = self.preempt(victim);
                out.preempted.push(vid);
                if let Some(k) = out.scheduled.iter().position(|s| s.0 == vid) {
                    budget += out.scheduled.remove(k).1;
                }
                if victim < i {
                    i -= 1;
                }
                if vid == id {
                    break;
                }
            }
        }

        // 2. Waiting requests, unless this step already had to preempt.
        if out.preempted.is_empty() {
            while budget > 0 && self.running.len() < self.config.max_num_seqs {
                let Some(wi) = self.next_waiting() else { break };
                let id = self.waiting[wi];
                let r = &self.requests[&id];
                let first_time = r.num_cached_tokens.is_none();
                // Prompt logprobs need the logits of every prompt position.
                let computed = if r.params.prompt_logprobs.is_some() {
                    ComputedBlocks::default()
                } else {
                    self.kv.get_computed_blocks(&r.block_hashes, r.num_tokens())
                };
                let remaining = r.num_tokens() - computed.num_tokens;
                if !self.config.enable_chunked_prefill && remaining > budget {
                    break;
                }
                let n = remaining.min(budget).min(r.max_chunk());
                if !self.kv.allocate_slots(id, 0, &computed, n, &r.block_hashes) {
                    break;
                }
                self.waiting.remove(wi);
                self.running.push(id);
                let r = self.requests.get_mut(&id).expect("waiting request exists");
                r.status = RequestStatus::Running;
                r.num_computed_tokens = computed.num_tokens;
                if first_time {
                    self.kv
                        .record_prefix_lookup(r.num_tokens(), computed.num_tokens);
                    self.num_prompt_tokens += r.prompt_len as u64;
                    r.num_cached_tokens = Some(computed.num_tokens);
                    r.times.first_scheduled = Some(Instant::now());
                    self.num_admitted += 1;
                }
                out.scheduled.push((id, n));
                budget -= n;
            }
        }
        out
    }

    /// Fraction of allocated KV slots that hold a token, over running requests.
    pub fn slot_usage(&self) -> (usize, usize) {
        let bs = self.kv.block_size();
        let mut used = 0;
        let mut allocated = 0;
        for id in &self.running {
            used += self.requests[id].num_computed_tokens;
            allocated += self.kv.blocks(*id).len() * bs;
        }
        (used, allocated)
    }
}
