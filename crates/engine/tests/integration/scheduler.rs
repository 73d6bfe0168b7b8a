//! The scheduler and the KV block pool without a model: the forward pass is simulated
//! (a step marks the scheduled tokens computed and appends a token to requests that
//! caught up), so thousands of random operation sequences run in seconds.

use std::collections::HashSet;
use std::time::Instant;

use pagellm_engine::kv_cache::KvCacheManager;
use pagellm_engine::live::{LiveView, Phase};
use pagellm_engine::request::{Request, RequestId, RequestParams};
use pagellm_engine::scheduler::{Scheduler, SchedulerOutput};
use pagellm_engine::{EngineError, EngineLimits, Policy, SchedulerConfig};
use proptest::prelude::*;

struct Sim {
    s: Scheduler,
    bs: usize,
    next: u64,
}

impl Sim {
    fn new(
        num_blocks: usize,
        bs: usize,
        budget: usize,
        max_seqs: usize,
        caching: bool,
        policy: Policy,
    ) -> Self {
        let config = SchedulerConfig {
            max_num_batched_tokens: budget,
            max_num_seqs: max_seqs,
            policy,
            enable_chunked_prefill: true,
        };
        Self {
            s: Scheduler::new(config, KvCacheManager::new(num_blocks, bs, caching)),
            bs,
            next: 0,
        }
    }

    fn add(&mut self, prompt: Vec<u32>, max_tokens: usize, priority: i32) -> RequestId {
        self.next += 1;
        let params = RequestParams {
            priority,
            max_tokens: Some(max_tokens),
            ..RequestParams::default()
        };
        let r = Request::new(
            self.next,
            self.next,
            prompt,
            params,
            max_tokens,
            Instant::now(),
        )
        .unwrap();
        self.s.add(r);
        self.next
    }

    /// Plans a step and "runs" it; returns the plan and the requests that finished.
    fn step(&mut self) -> (SchedulerOutput, Vec<RequestId>) {
        let plan = self.s.schedule();
        let mut done = Vec::new();
        for &(id, n) in &plan.scheduled {
            let r = self.s.requests.get_mut(&id).unwrap();
            r.num_computed_tokens += n;
            assert!(r.num_computed_tokens <= r.num_tokens());
            if r.num_computed_tokens == r.num_tokens() {
                let t = (r.num_tokens() as u32 * 7 + id as u32) % 1000;
                r.tokens.push(t);
                r.update_block_hashes(self.bs);
                if r.num_output_tokens() >= r.max_tokens {
                    done.push(id);
                }
            }
        }
        for &id in &done {
            self.s.remove(id);
        }
        (plan, done)
    }

    fn check(&self, plan: Option<&SchedulerOutput>) {
        self.s.kv.check_invariants().unwrap();
        let pool = self.s.kv.pool();
        assert!(pool.num_free() <= pool.num_blocks());
        assert!(self.s.num_running() <= self.s.config.max_num_seqs);
        for &id in self.s.running() {
            let r = &self.s.requests[&id];
            assert!(
                self.s.kv.blocks(id).len() * self.bs >= r.num_computed_tokens,
                "request {id} computed more tokens than its blocks hold"
            );
        }
        self.check_live_view();
        if let Some(p) = plan {
            assert!(
                p.num_tokens() <= self.s.config.max_num_batched_tokens,
                "token budget exceeded"
            );
            let ids: HashSet<_> = p.scheduled.iter().map(|s| s.0).collect();
            assert_eq!(
                ids.len(),
                p.scheduled.len(),
                "a request scheduled twice in one step"
            );
            assert!(p.scheduled.iter().all(|s| s.1 > 0));
        }
    }
}

impl Sim {
    /// The dashboard's view agrees with the scheduler: each block's letter follows from
    /// how many block tables hold it, each request's table and phase are its own.
    fn check_live_view(&self) -> LiveView {
        let v = LiveView::build(&self.s, 0, Instant::now());
        let pool = self.s.kv.pool();
        assert_eq!(v.blocks.len(), pool.num_blocks());
        assert_eq!(
            v.requests.len(),
            self.s.num_running() + self.s.num_waiting()
        );
        let mut holders = vec![0usize; pool.num_blocks()];
        for (i, r) in v.requests.iter().enumerate() {
            assert_eq!(r.blocks, self.s.kv.blocks(r.id), "request {}", r.id);
            for &b in &r.blocks {
                holders[b as usize] += 1;
            }
            let running = i < self.s.num_running();
            assert_eq!(running, self.s.running().contains(&r.id));
            let req = &self.s.requests[&r.id];
            let phase = match (running, req.num_computed_tokens + 1 < req.num_tokens()) {
                (true, true) => Phase::Prefill,
                (true, false) => Phase::Decode,
                (false, _) if req.num_preemptions > 0 => Phase::Preempted,
                (false, _) => Phase::Waiting,
            };
            assert_eq!(r.phase, phase, "request {}", r.id);
        }
        for (b, code) in v.blocks.chars().enumerate() {
            let want = match holders[b] {
                0 if pool.is_cached(b as u32) => 'c',
                0 => '.',
                1 => 'u',
                _ => 's',
            };
            assert_eq!(code, want, "block {b}");
        }
        v
    }
}

#[derive(Debug, Clone)]
enum Op {
    Add {
        base: usize,
        shared: usize,
        extra: usize,
        max_tokens: usize,
        priority: i32,
    },
    Step,
    Abort(usize),
    Finish(usize),
    Preempt(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0usize..3, 0usize..48, 1usize..40, 1usize..12, -2i32..3).prop_map(
            |(base, shared, extra, max_tokens, priority)| Op::Add {
                base,
                shared,
                extra,
                max_tokens,
                priority
            }
        ),
        Just(Op::Step),
        Just(Op::Step),
        Just(Op::Step),
        (0usize..64).prop_map(Op::Abort),
        (0usize..64).prop_map(Op::Finish),
        (0usize..64).prop_map(Op::Preempt),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Random add/step/finish/abort/preempt sequences never break the pool: free + used
    /// equals total, ref counts equal the number of block tables holding a block (so
    /// none goes below zero), a block is in two tables only when shared through the
    /// prefix cache, budgets hold, and everything is free once all requests end.
    #[test]
    fn pool_never_leaks(ops in prop::collection::vec(op(), 1..120), caching: bool, priority: bool, bs in prop::sample::select(vec![1usize, 4, 16])) {
        let policy = if priority { Policy::Priority } else { Policy::Fcfs };
        let mut sim = Sim::new(40, bs, 64, 6, caching, policy);
        let bases: Vec<Vec<u32>> = (0..3u32).map(|b| (0..48).map(|i| b * 100 + i).collect()).collect();
        for op in ops {
            let mut plan = None;
            match op {
                Op::Add { base, shared, extra, max_tokens, priority } => {
                    let mut p = bases[base][..shared].to_vec();
                    p.extend((0..extra as u32).map(|i| 5000 + i * 3 + sim.next as u32));
                    // Keep every request able to fit in the whole pool on its own.
                    if (p.len() + max_tokens).div_ceil(bs) <= 40 {
                        sim.add(p, max_tokens, priority);
                    }
                }
                Op::Step => plan = Some(sim.step().0),
                Op::Abort(i) | Op::Finish(i) => {
                    let mut ids: Vec<_> = sim.s.requests.keys().copied().collect();
                    ids.sort();
                    if !ids.is_empty() {
                        sim.s.remove(ids[i % ids.len()]);
                    }
                }
                Op::Preempt(i) => {
                    let running = sim.s.running().to_vec();
                    if !running.is_empty() {
                        prop_assert!(sim.s.preempt_request(running[i % running.len()]));
                    }
                }
            }
            sim.check(plan.as_ref());
        }
        // Drain: everything completes (nothing can be stuck) and the pool is whole again.
        let mut steps = 0;
        while sim.s.has_unfinished() {
            let (plan, _) = sim.step();
            sim.check(Some(&plan));
            steps += 1;
            prop_assert!(steps < 10_000, "requests never finish");
        }
        prop_assert_eq!(sim.s.kv.pool().num_free(), 40);
        prop_assert!(sim.s.requests.is_empty());
    }
}

#[test]
fn long_prompt_completes_through_chunks_within_the_budget() {
    let mut sim = Sim::new(64, 16, 32, 4, true, Policy::Fcfs);
    let id = sim.add((0..100).collect(), 3, 0);
    let mut chunks = Vec::new();
    loop {
        let (plan, done) = sim.step();
        sim.check(Some(&plan));
        chunks.push(plan.scheduled.iter().find(|s| s.0 == id).map_or(0, |s| s.1));
        if done.contains(&id) {
            break;
        }
    }
    // 100 prompt tokens in chunks of at most 32, then two decode steps.
    assert_eq!(chunks, vec![32, 32, 32, 4, 1, 1]);
}

#[test]
fn running_requests_are_not_starved_by_new_arrivals() {
    let mut sim = Sim::new(200, 16, 64, 8, false, Policy::Fcfs);
    let a = sim.add((0..10).collect(), 20, 0);
    let b = sim.add((100..110).collect(), 20, 0);
    sim.step();
    // A flood of long prompts arrives; the two decoding requests still advance every step.
    for i in 0..10u32 {
        sim.add((1000 * (i + 1)..1000 * (i + 1) + 150).collect(), 5, 0);
    }
    let mut steps = 0;
    while sim.s.requests.contains_key(&a) || sim.s.requests.contains_key(&b) {
        let (plan, _) = sim.step();
        sim.check(Some(&plan));
        for id in [a, b] {
            if sim.s.requests.contains_key(&id) || plan.scheduled.iter().any(|s| s.0 == id) {
                assert!(
                    plan.scheduled.iter().any(|s| s.0 == id && s.1 == 1),
                    "running request {id} skipped in step {steps}"
                );
            }
        }
        steps += 1;
    }
    assert_eq!(steps, 19, "one decode per step for the remaining 19 tokens");
}

#[test]
fn max_num_seqs_caps_the_running_set() {
    let mut sim = Sim::new(200, 16, 512, 3, false, Policy::Fcfs);
    for i in 0..7u32 {
        sim.add(vec![i; 5], 4, 0);
    }
    let (plan, _) = sim.step();
    assert_eq!(plan.scheduled.len(), 3);
    assert_eq!(sim.s.num_waiting(), 4);
    while sim.s.has_unfinished() {
        let (plan, _) = sim.step();
        sim.check(Some(&plan));
        assert!(plan.scheduled.len() <= 3);
    }
}

#[test]
fn out_of_blocks_preempts_the_latest_arrival_which_resumes_later() {
    // 6 blocks of 4 tokens; two requests of 8-token prompts growing to 16 tokens each
    // cannot both fit.
    let mut sim = Sim::new(6, 4, 64, 4, false, Policy::Fcfs);
    let a = sim.add((0..8).collect(), 8, 0);
    let b = sim.add((50..58).collect(), 8, 0);
    let mut preempted = Vec::new();
    let mut finished = Vec::new();
    for _ in 0..100 {
        let (plan, done) = sim.step();
        sim.check(Some(&plan));
        preempted.extend(plan.preempted.iter().copied());
        finished.extend(done);
        if !sim.s.has_unfinished() {
            break;
        }
    }
    assert_eq!(preempted.first(), Some(&b), "the later arrival goes first");
    assert!(!preempted.contains(&a));
    assert_eq!(finished, vec![a, b], "both complete; b after recomputation");
    assert_eq!(sim.s.num_preemptions, preempted.len() as u64);
    assert_eq!(sim.s.kv.pool().num_free(), 6);
}

#[test]
fn priority_policy_admits_lowest_value_first_and_preempts_highest() {
    let mut sim = Sim::new(6, 4, 64, 1, false, Policy::Priority);
    let low = sim.add(vec![1; 3], 2, 5);
    let high = sim.add(vec![2; 3], 2, -1);
    let (plan, _) = sim.step();
    assert_eq!(plan.scheduled[0].0, high);
    let mut order = Vec::new();
    while sim.s.has_unfinished() {
        order.extend(sim.step().1);
    }
    assert_eq!(order, vec![high, low]);

    let mut sim = Sim::new(6, 4, 64, 4, false, Policy::Priority);
    let first_low = sim.add((0..8).collect(), 8, 3);
    sim.step();
    let later_high = sim.add((50..58).collect(), 8, 0);
    let mut preempted = Vec::new();
    while sim.s.has_unfinished() {
        let (plan, _) = sim.step();
        sim.check(Some(&plan));
        preempted.extend(plan.preempted.iter().copied());
    }
    assert_eq!(
        preempted.first(),
        Some(&first_low),
        "lower priority is preempted even though it came first"
    );
    assert!(!preempted.contains(&later_high));
}

#[test]
fn prefix_cache_shares_full_blocks_and_counts_hits() {
    let mut sim = Sim::new(64, 16, 512, 4, true, Policy::Fcfs);
    let prefix: Vec<u32> = (0..64).collect();
    let mut p1 = prefix.clone();
    p1.extend([900, 901, 902]);
    let a = sim.add(p1, 1, 0);
    while sim.s.has_unfinished() {
        sim.step();
    }
    let mut p2 = prefix.clone();
    p2.extend([700, 701]);
    let b = sim.add(p2, 5, 0);
    let (plan, _) = sim.step();
    assert_eq!(
        plan.scheduled,
        vec![(b, 2)],
        "only the two new tokens are computed"
    );
    assert_eq!(sim.s.requests[&b].num_cached_tokens, Some(64));
    assert_ne!(a, b);
    let st = sim.s.kv.prefix_stats;
    assert_eq!((st.queries, st.hits), (67 + 66, 64));
    // A fully cached prompt still computes its last token.
    let c = sim.add(prefix.clone(), 1, 0);
    let (plan, _) = sim.step();
    assert_eq!(plan.scheduled.iter().find(|s| s.0 == c), Some(&(c, 16)));
}

#[test]
fn requests_that_can_never_fit_are_rejected_at_submission() {
    let limits = EngineLimits {
        max_model_len: 100,
        vocab_size: 1000,
        num_blocks: 10,
        block_size: 16,
        max_logprobs: 20,
    };
    let params = |m| RequestParams {
        max_tokens: m,
        ..RequestParams::default()
    };
    let e = limits.validate(&[1; 90], &params(Some(20))).unwrap_err();
    assert!(matches!(
        e,
        EngineError::ContextLength {
            prompt_tokens: 90,
            max_tokens: 20,
            max_model_len: 100
        }
    ));
    assert!(
        e.to_string().contains("maximum context length of 100"),
        "{e}"
    );
    assert_eq!(
        limits.validate(&[1; 90], &params(None)).unwrap(),
        10,
        "default fills the context"
    );
    assert!(matches!(
        limits.validate(&[], &params(None)),
        Err(EngineError::EmptyPrompt)
    ));
    assert!(matches!(
        limits.validate(&[1, 5000], &params(None)),
        Err(EngineError::TokenOutOfVocab { token: 5000, .. })
    ));
    assert!(limits.validate(&[1; 10], &params(Some(0))).is_err());
    // A prompt that fills the context leaves no room for even one token.
    assert!(matches!(
        limits.validate(&[1; 100], &params(None)),
        Err(EngineError::ContextLength { .. })
    ));
}

#[test]
fn live_view_shows_phases_shared_prefixes_and_cached_blocks() {
    let mut sim = Sim::new(32, 4, 8, 4, true, Policy::Fcfs);
    let prefix: Vec<u32> = (1..=12).collect();
    let a = sim.add([&prefix[..], &[50, 51]].concat(), 8, 0);
    let v = sim.check_live_view();
    assert!(v.blocks.chars().all(|c| c == '.'));
    assert_eq!(v.requests[0].phase, Phase::Waiting);
    let mut phases = HashSet::new();
    let mut max_shared = 0;
    let mut b = None;
    for step in 0..40 {
        // The second request, with the same three-block prefix, arrives once the first
        // has computed and cached it.
        if step == 3 {
            b = Some(sim.add([&prefix[..], &[60, 61, 62]].concat(), 8, 0));
        }
        sim.step();
        let v = sim.check_live_view();
        phases.extend(v.requests.iter().map(|r| r.phase));
        max_shared = max_shared.max(v.blocks.chars().filter(|&c| c == 's').count());
        if !sim.s.has_unfinished() {
            break;
        }
    }
    assert!(
        b.is_some() && !sim.s.has_unfinished(),
        "{a} and {b:?} did not finish"
    );
    assert!(phases.contains(&Phase::Prefill) && phases.contains(&Phase::Decode));
    assert_eq!(max_shared, 3, "the common prefix's three blocks are shared");
    let v = sim.check_live_view();
    assert!(v.requests.is_empty());
    assert!(!v.blocks.contains(['u', 's']));
    assert!(v.blocks.chars().filter(|&c| c == 'c').count() >= 3);
}
