//! The engine core: owns the model, the KV cache and the scheduler, and runs steps.
//!
//! A step asks the scheduler for a plan, runs one forward pass over the flattened batch
//! it describes (prefill chunks and decodes mixed), samples a token for every request
//! whose computed tokens caught up with its tokens, checks stop conditions and sends
//! each request its new output. It is single-threaded and synchronous; [`crate::Engine`]
//! runs it on its own thread behind channels.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use pagellm_kernels::pool::ThreadPool;
use pagellm_model::loader::LoadedModel;
use pagellm_model::{Batch, Logits, PagedKvCache, Workspace};
use tokio::sync::mpsc::UnboundedSender;

use crate::config::EngineConfig;
use crate::error::EngineError;
use crate::kv_cache::{KvCacheManager, PrefixCacheStats};
pub use crate::limits::EngineLimits;
use crate::live::{LivePublisher, LiveSlot};
use crate::logprobs::{LogSoftmax, TokenLogprobs};
use crate::metrics::LatencyHistograms;
use crate::request::{
    FinishReason, Request, RequestId, RequestParams, RequestTimes, StopReason, Usage,
};
use crate::scheduler::{Scheduler, SchedulerOutput};
use crate::stop::StopScan;

/// One update for one request: tokens sampled in a step, their text, and, on the last
/// update, how and why the request ended.
#[derive(Debug, Clone)]
pub struct RequestOutput {
    pub request_id: RequestId,
    pub token_ids: Vec<u32>,
    /// Newly released text (may be empty while a stop string could still match).
    pub text: String,
    /// When these tokens were sampled.
    pub time: Instant,
    /// One entry per token in `token_ids` when the request asked for logprobs.
    pub logprobs: Vec<TokenLogprobs>,
    /// With `prompt_logprobs`, on the first update: one entry per prompt token after
    /// the first.
    pub prompt_logprobs: Vec<TokenLogprobs>,
    pub finish: Option<FinishInfo>,
}

#[derive(Debug, Clone)]
pub struct FinishInfo {
    pub reason: FinishReason,
    pub stop_reason: Option<StopReason>,
    pub usage: Usage,
    pub times: RequestTimes,
    pub num_preemptions: usize,
    /// What went wrong, for `FinishReason::Error`.
    pub error: Option<String>,
}

pub type OutputSink = UnboundedSender<RequestOutput>;

/// Sees every logits row before sampling (tests compare runs bit for bit with it).
pub type LogitsProbe = Box<dyn FnMut(RequestId, &[f32]) + Send>;

/// Counters and gauges, in vLLM's terms.
#[derive(Debug, Clone, Default)]
pub struct EngineStats {
    pub num_running: usize,
    pub num_waiting: usize,
    /// Fraction of KV blocks in use.
    pub kv_cache_usage: f64,
    pub prefix_cache: PrefixCacheStats,
    pub num_preemptions: u64,
    /// Requests refused because the waiting queue was full (`max_waiting_requests`).
    pub admission_rejections: u64,
    /// Prompt tokens of admitted requests (each request once, however often recomputed).
    pub prompt_tokens: u64,
    pub generation_tokens: u64,
    /// Finished requests by reason (stop, length, abort, error).
    pub finished: [u64; 4],
    pub steps: u64,
    /// Summed over steps: KV slots holding a token, and slots in allocated blocks,
    /// over running requests. Their ratio is the cache's memory efficiency.
    pub kv_slots_used: u64,
    pub kv_slots_allocated: u64,
    pub latency: LatencyHistograms,
}

impl EngineStats {
    pub fn kv_slot_utilization(&self) -> Option<f64> {
        (self.kv_slots_allocated > 0)
            .then(|| self.kv_slots_used as f64 / self.kv_slots_allocated as f64)
    }
}

/// What one step did.
#[derive(Debug, Clone, Default)]
pub struct StepReport {
    pub num_scheduled_tokens: usize,
    pub num_scheduled_requests: usize,
    pub preempted: Vec<RequestId>,
    pub finished: Vec<RequestId>,
}

pub struct EngineCore {
    model: Arc<LoadedModel>,
    pool: ThreadPool,
    sched: Scheduler,
    cache: PagedKvCache,
    ws: Workspace,
    batch: Batch,
    limits: EngineLimits,
    sinks: HashMap<RequestId, OutputSink>,
    /// Updates made by the current step or call, sent together by [`Self::deliver`].
    outbox: Vec<(OutputSink, RequestOutput)>,
    /// Where [`Self::deliver`] publishes the stats before sending updates, so a client
    /// that has seen an update reads gauges and counters that include it.
    published: Option<Arc<std::sync::Mutex<EngineStats>>>,
    /// Where the dashboard's view of blocks and requests is published.
    live: Option<LivePublisher>,
    next_seq: u64,
    stats: EngineStats,
    probe: Option<LogitsProbe>,
    /// Requests submitted to [`crate::Engine`] and not yet admitted; the core counts
    /// them down as they are first scheduled or end before that.
    queued: Option<Arc<AtomicUsize>>,
    num_admitted: u64,
    /// Tokens of the current step, for `iteration_tokens` (see [`LatencyHistograms`]).
    iteration_tokens: u64,
}

impl EngineCore {
    pub fn new(model: Arc<LoadedModel>, config: &EngineConfig) -> Result<Self, EngineError> {
        let t = &model.transformer;
        let c = &t.config;
        let sc = &config.scheduler;
        let bad = |m: String| Err(EngineError::Config(m));
        if config.block_size == 0 || config.block_size > 1024 {
            return bad(format!(
                "--block-size must be between 1 and 1024, got {}",
                config.block_size
            ));
        }
        if sc.max_num_seqs == 0 {
            return bad("--max-num-seqs must be at least 1".into());
        }
        if sc.max_num_batched_tokens < sc.max_num_seqs {
            return bad(format!(
                "--max-num-batched-tokens ({}) must be at least --max-num-seqs ({})",
                sc.max_num_batched_tokens, sc.max_num_seqs
            ));
        }
        let max_model_len = match config.max_model_len {
            Some(0) => return bad("--max-model-len must be at least 1".into()),
            Some(m) if m > t.max_context() => {
                return bad(format!(
                    "--max-model-len {m} exceeds the model's context length of {}",
                    t.max_context()
                ))
            }
            Some(m) => m,
            None => t.max_context(),
        };
        let per_block = PagedKvCache::bytes_per_block(
            c.n_layers,
            c.kv_dim(),
            c.head_dim,
            config.block_size,
            config.kv_cache_dtype,
        ) as u64;
        let num_blocks = match config.num_kv_blocks {
            Some(n) => n,
            None => (config.kv_cache_memory / per_block) as usize,
        };
        let need = max_model_len.div_ceil(config.block_size);
        if num_blocks < need {
            if config.num_kv_blocks.is_some() {
                return bad(format!(
                    "--num-kv-blocks {num_blocks} holds {} tokens, less than one sequence \
                     of the maximum length {max_model_len}; raise --num-kv-blocks or lower \
                     --max-model-len",
                    num_blocks * config.block_size
                ));
            }
            return bad(format!(
                "--kv-cache-memory of {} bytes holds {} tokens ({num_blocks} blocks of {} \
                 tokens, {per_block} bytes each), less than one sequence of the maximum \
                 length {max_model_len}; raise --kv-cache-memory or lower --max-model-len",
                config.kv_cache_memory,
                num_blocks * config.block_size,
                config.block_size
            ));
        }
        let cache = t.new_paged_cache(config.block_size, num_blocks, config.kv_cache_dtype)?;
        let kv = KvCacheManager::new(num_blocks, config.block_size, config.enable_prefix_caching);
        let threads = if config.threads == 0 {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            config.threads
        };
        tracing::info!(
            num_blocks,
            block_size = config.block_size,
            tokens = num_blocks * config.block_size,
            dtype = %config.kv_cache_dtype,
            max_model_len,
            "KV cache ready"
        );
        Ok(Self {
            limits: EngineLimits {
                max_model_len,
                vocab_size: c.vocab_size,
                num_blocks,
                block_size: config.block_size,
                max_logprobs: config.max_logprobs.min(c.vocab_size),
            },
            model,
            pool: ThreadPool::new(threads),
            sched: Scheduler::new(sc.clone(), kv),
            cache,
            ws: Workspace::default(),
            batch: Batch::default(),
            sinks: HashMap::new(),
            outbox: Vec::new(),
            published: None,
            live: None,
            next_seq: 0,
            stats: EngineStats::default(),
            probe: None,
            queued: None,
            num_admitted: 0,
            iteration_tokens: 0,
        })
    }

    pub fn limits(&self) -> EngineLimits {
        self.limits
    }

    /// Prefix-cache changes since the last call (see [`crate::kv_events`]).
    pub fn take_kv_events(&mut self) -> Vec<crate::kv_cache::KvEvent> {
        self.sched.kv.take_events()
    }

    /// Counts admitted requests down from `queued` (see [`crate::Engine`]'s waiting limit).
    pub fn track_queue(&mut self, queued: Arc<AtomicUsize>) {
        self.queued = Some(queued);
    }

    fn leave_queue(&self, n: u64) {
        if let (Some(q), true) = (&self.queued, n > 0) {
            q.fetch_sub(n as usize, Ordering::AcqRel);
        }
    }

    /// Publishes [`Self::stats`] into `to` before each batch of updates is sent.
    pub fn publish_stats(&mut self, to: Arc<std::sync::Mutex<EngineStats>>) {
        self.published = Some(to);
    }

    /// Publishes a [`crate::live::LiveView`] into `to` after steps (rate limited).
    pub fn publish_live(&mut self, to: LiveSlot) {
        let mut live = LivePublisher::new(to);
        live.after_step(&self.sched, self.stats.steps);
        self.live = Some(live);
    }

    /// Publishes the stats, then sends the updates made since the last call.
    fn deliver(&mut self) {
        if let Some(to) = &self.published {
            let s = self.stats();
            if let Ok(mut g) = to.lock() {
                *g = s;
            }
        }
        if let Some(live) = &mut self.live {
            live.after_step(&self.sched, self.stats.steps);
        }
        for (sink, out) in self.outbox.drain(..) {
            // A receiver that went away is noticed by the next step.
            let _ = sink.send(out);
        }
    }

    /// Installs a hook that sees each request's logits before sampling.
    pub fn set_logits_probe(&mut self, probe: Option<LogitsProbe>) {
        self.probe = probe;
    }

    pub fn model(&self) -> &Arc<LoadedModel> {
        &self.model
    }

    pub fn scheduler(&self) -> &Scheduler {
        &self.sched
    }

    pub fn has_unfinished(&self) -> bool {
        self.sched.has_unfinished()
    }

    /// Queues a request. `arrival` is when the client sent it (queue time counts from it).
    pub fn add_request(
        &mut self,
        id: RequestId,
        prompt: Vec<u32>,
        params: RequestParams,
        sink: OutputSink,
        arrival: Instant,
    ) -> Result<(), EngineError> {
        let max_tokens = self.limits.validate(&prompt, &params)?;
        if self.sched.requests.contains_key(&id) {
            return Err(EngineError::InvalidParam(format!(
                "request id {id} is already in use"
            )));
        }
        self.next_seq += 1;
        let req = Request::new(id, self.next_seq, prompt, params, max_tokens, arrival)?;
        self.sched.add(req);
        self.sinks.insert(id, sink);
        Ok(())
    }

    /// Ends a request now; its blocks return to the pool. Unknown ids are ignored (the
    /// request may have finished already).
    pub fn abort(&mut self, id: RequestId) {
        self.finish(
            id,
            Vec::new(),
            Vec::new(),
            FinishReason::Abort,
            None,
            None,
            String::new(),
            Instant::now(),
        );
        self.deliver();
    }

    /// Ends a request whose output reached a stop string found off the engine thread
    /// (see [`crate::Engine`]); the stream that found it reports the final output.
    pub fn stop_at_text(&mut self, id: RequestId, stop: String) {
        self.finish(
            id,
            Vec::new(),
            Vec::new(),
            FinishReason::Stop,
            Some(StopReason::Text(stop)),
            None,
            String::new(),
            Instant::now(),
        );
        self.deliver();
    }

    /// Aborts every request.
    pub fn abort_all(&mut self) {
        let ids: Vec<RequestId> = self.sched.requests.keys().copied().collect();
        for id in ids {
            self.abort(id);
        }
    }

    pub fn stats(&self) -> EngineStats {
        let mut s = self.stats.clone();
        s.num_running = self.sched.num_running();
        s.num_waiting = self.sched.num_waiting();
        s.kv_cache_usage = self.sched.kv.usage();
        s.prefix_cache = self.sched.kv.prefix_stats;
        s.num_preemptions = self.sched.num_preemptions;
        s.prompt_tokens = self.sched.num_prompt_tokens;
        s
    }

    /// Pool and block-table invariants (for tests).
    pub fn check_invariants(&self) -> Result<(), String> {
        self.sched.kv.check_invariants()
    }

    /// Runs one step and sends its updates. Returns an empty report when there is
    /// nothing to do.
    pub fn step(&mut self) -> StepReport {
        let report = self.step_inner();
        self.deliver();
        report
    }

    fn step_inner(&mut self) -> StepReport {
        // Clients that went away: abort before spending compute on them.
        let gone: Vec<RequestId> = self
            .sinks
            .iter()
            .filter(|(_, s)| s.is_closed())
            .map(|(&id, _)| id)
            .collect();
        for id in gone {
            self.abort(id);
        }

        let plan = self.sched.schedule();
        let admitted = self.sched.num_admitted - self.num_admitted;
        self.num_admitted = self.sched.num_admitted;
        self.leave_queue(admitted);
        let mut report = StepReport {
            num_scheduled_tokens: plan.num_tokens(),
            num_scheduled_requests: plan.scheduled.len(),
            preempted: plan.preempted.clone(),
            finished: Vec::new(),
        };
        if plan.scheduled.is_empty() {
            return report;
        }
        self.stats.steps += 1;
        self.iteration_tokens = 0;
        let (used, allocated) = self.slot_usage(&plan);
        self.stats.kv_slots_used += used as u64;
        self.stats.kv_slots_allocated += allocated as u64;

        let (rows, prompt_rows) = self.build_batch(&plan);
        // Structured outputs: the token masks of the guided requests that sample this
        // step are computed on a helper thread while the forward pass runs, so neither
        // waits for the other and unguided requests never wait for a mask.
        let samples = |id: RequestId| {
            plan.scheduled
                .iter()
                .zip(&rows)
                .any(|(&(s, _), r)| s == id && r.is_some())
        };
        let guides: Vec<(RequestId, &mut pagellm_structured::Guide)> = self
            .sched
            .requests
            .iter_mut()
            .filter_map(|(&id, r)| r.params.guide.as_mut().map(|g| (id, g)))
            .filter(|&(id, _)| samples(id))
            .collect();
        let (model, pool, ws, cache, batch) = (
            &self.model,
            &self.pool,
            &mut self.ws,
            &mut self.cache,
            &self.batch,
        );
        let (result, mut masks) = std::thread::scope(|s| {
            let helper = (!guides.is_empty()).then(|| {
                s.spawn(move || {
                    guides
                        .into_iter()
                        .map(|(id, g)| (id, g.mask()))
                        .collect::<HashMap<_, _>>()
                })
            });
            let r = model
                .transformer
                .forward_batch(pool, ws, cache, batch)
                .map(|_| ());
            let masks = helper.map(|h| h.join().unwrap_or_default());
            (r, masks.unwrap_or_default())
        });
        if let Err(e) = result {
            let msg = e.to_string();
            tracing::error!(error = %msg, "forward pass failed");
            for &(id, _) in &plan.scheduled {
                self.fail(id, msg.clone(), Instant::now());
                report.finished.push(id);
            }
            return report;
        }

        let now = Instant::now();
        let vocab = self.limits.vocab_size;
        for (i, &(id, n)) in plan.scheduled.iter().enumerate() {
            let req = self.sched.requests.get_mut(&id).expect("scheduled request");
            let start = req.num_computed_tokens;
            req.num_computed_tokens += n;
            if let Some(first) = prompt_rows[i] {
                let chunk = &self.ws.logits[first * vocab..(first + n) * vocab];
                record_prompt_logprobs(req, chunk, vocab, start);
            }
            let Some(row) = rows[i] else { continue };
            let logits = &mut self.ws.logits[row * vocab..(row + 1) * vocab];
            if let Some(p) = self.probe.as_mut() {
                p(id, logits);
            }
            let prompt_len = req.prompt_len;
            // Raw-logit log-softmax: taken before the sampler's penalties edit the row.
            let pre = req.params.logprobs.map(|k| {
                let ls = LogSoftmax::new(logits);
                (ls.top(k), ls.log_z())
            });
            let raw = pre.as_ref().map(|_| logits.to_vec());
            let mask = req.params.guide.is_some().then(|| {
                masks.remove(&id).unwrap_or_else(|| {
                    Err(pagellm_structured::Error::Matcher(
                        "no mask was computed".into(),
                    ))
                })
            });
            if let Some(Ok(m)) = &mask {
                m.apply(logits);
            }
            let tok =
                req.sampler
                    .sample(logits, &req.tokens[..prompt_len], &req.tokens[prompt_len..]);
            let guided = match (mask, req.params.guide.as_mut()) {
                (Some(Ok(_)), Some(g)) => g.advance(tok),
                (Some(Err(e)), _) => Err(e),
                _ => Ok(()),
            };
            if let Err(e) = guided {
                tracing::warn!(request = id, error = %e, "structured output failed");
                self.fail(id, e.to_string(), now);
                report.finished.push(id);
                continue;
            }
            let pinned = req.params.logprob_token_ids.as_deref();
            let logprobs = pre.zip(raw).map(|((top, log_z), raw)| TokenLogprobs {
                token: tok,
                logprob: raw[tok as usize] - log_z,
                rank: 1 + raw.iter().filter(|&&x| x > raw[tok as usize]).count(),
                top: match pinned {
                    None => top,
                    Some(ids) => crate::logprobs::pinned(ids, tok, &raw, log_z),
                },
            });
            if let Some(fid) = self.on_token(id, tok, logprobs, now) {
                report.finished.push(fid);
            }
        }
        self.stats
            .latency
            .iteration_tokens
            .observe(self.iteration_tokens as f64);
        report
    }

    /// Fills the batch from the plan; returns each scheduled request's sampling row and,
    /// for a chunk whose logits rows give prompt logprobs, the row of its first token.
    fn build_batch(&mut self, plan: &SchedulerOutput) -> (Vec<Option<usize>>, Vec<Option<usize>>) {
        self.batch.clear();
        let mut rows = Vec::with_capacity(plan.scheduled.len());
        let mut prompt_rows = Vec::with_capacity(plan.scheduled.len());
        let mut next_row = 0;
        for &(id, n) in &plan.scheduled {
            let r = &self.sched.requests[&id];
            let start = r.num_computed_tokens;
            let samples = start + n == r.num_tokens();
            // Every position before the prompt's last predicts a prompt token.
            let all = r.params.prompt_logprobs.is_some() && start + 1 < r.prompt_len;
            let (logits, count) = match (all, samples) {
                (true, _) => (Logits::All, n),
                (false, true) => (Logits::Last, 1),
                (false, false) => (Logits::None, 0),
            };
            self.batch.push(
                &r.tokens[start..start + n],
                start,
                r.decode_from(),
                self.sched.kv.blocks(id),
                logits,
            );
            prompt_rows.push(all.then_some(next_row));
            rows.push(samples.then_some(next_row + count - 1));
            next_row += count;
        }
        (rows, prompt_rows)
    }

    fn slot_usage(&self, plan: &SchedulerOutput) -> (usize, usize) {
        let bs = self.limits.block_size;
        plan.scheduled.iter().fold((0, 0), |(u, a), &(id, n)| {
            let r = &self.sched.requests[&id];
            (
                u + r.num_computed_tokens + n,
                a + self.sched.kv.blocks(id).len() * bs,
            )
        })
    }

    /// Appends a sampled token, checks stop conditions and sends the update. Returns
    /// the id if the request finished.
    fn on_token(
        &mut self,
        id: RequestId,
        tok: u32,
        logprobs: Option<TokenLogprobs>,
        now: Instant,
    ) -> Option<RequestId> {
        let tokenizer = &self.model.tokenizer;
        let max_model_len = self.limits.max_model_len;
        let block_size = self.limits.block_size;
        let req = self.sched.requests.get_mut(&id)?;
        req.tokens.push(tok);
        req.update_block_hashes(block_size);
        self.iteration_tokens += 1;
        match req.times.last_token {
            None => {
                self.iteration_tokens += req.prompt_len as u64;
                if let Some(t) = RequestTimes::secs(Some(req.times.arrival), Some(now)) {
                    self.stats.latency.ttft.observe(t);
                }
            }
            Some(prev) => self
                .stats
                .latency
                .inter_token
                .observe(now.saturating_duration_since(prev).as_secs_f64()),
        }
        req.times.first_token.get_or_insert(now);
        req.times.last_token = Some(now);
        self.stats.generation_tokens += 1;

        let n_out = req.num_output_tokens();
        let past_min = n_out > req.params.min_tokens;
        let mut finish = None;
        let mut text = String::new();
        if past_min
            && ((!req.params.ignore_eos && tokenizer.is_eog(tok))
                || req.params.stop_token_ids.contains(&tok))
        {
            finish = Some((FinishReason::Stop, Some(StopReason::Token(tok))));
        } else if req.params.detokenize {
            match req.detok.push(tokenizer, tok) {
                StopScan::Continue(t) => text = t,
                StopScan::Stopped { text: t, stop } => {
                    text = t;
                    finish = Some((FinishReason::Stop, Some(StopReason::Text(stop))));
                }
            }
        }
        if finish.is_none() && (n_out >= req.max_tokens || req.num_tokens() >= max_model_len) {
            finish = Some((FinishReason::Length, None));
        }
        match finish {
            None => {
                let out = RequestOutput {
                    request_id: id,
                    token_ids: vec![tok],
                    text,
                    time: now,
                    logprobs: logprobs.into_iter().collect(),
                    prompt_logprobs: std::mem::take(&mut req.prompt_logprobs),
                    finish: None,
                };
                match self.sinks.get(&id) {
                    Some(s) if !s.is_closed() => {
                        self.outbox.push((s.clone(), out));
                        None
                    }
                    _ => {
                        // The receiver is gone: nobody wants the rest.
                        self.abort(id);
                        Some(id)
                    }
                }
            }
            Some((reason, stop_reason)) => {
                if !matches!(stop_reason, Some(StopReason::Text(_))) {
                    // Release text held back for stop strings and incomplete characters.
                    let req = self.sched.requests.get_mut(&id)?;
                    if req.params.detokenize {
                        text.push_str(&req.detok.finish());
                    }
                }
                self.finish(
                    id,
                    vec![tok],
                    logprobs.into_iter().collect(),
                    reason,
                    stop_reason,
                    None,
                    text,
                    now,
                );
                Some(id)
            }
        }
    }

    /// Ends a request with `FinishReason::Error` and the message.
    fn fail(&mut self, id: RequestId, error: String, now: Instant) {
        let reason = FinishReason::Error;
        self.finish(
            id,
            Vec::new(),
            Vec::new(),
            reason,
            None,
            Some(error),
            String::new(),
            now,
        );
    }

    /// Ends a request: removes it, frees its blocks and sends the final update.
    #[allow(clippy::too_many_arguments)]
    fn finish(
        &mut self,
        id: RequestId,
        token_ids: Vec<u32>,
        logprobs: Vec<TokenLogprobs>,
        reason: FinishReason,
        stop_reason: Option<StopReason>,
        error: Option<String>,
        text: String,
        now: Instant,
    ) {
        let Some(mut req) = self.sched.remove(id) else {
            return;
        };
        req.times.finished = Some(now);
        self.stats.finished[reason as usize] += 1;
        if req.times.first_scheduled.is_none() {
            self.leave_queue(1);
        }
        let t = &req.times;
        let lat = &mut self.stats.latency;
        let inference = RequestTimes::secs(t.first_scheduled, t.finished);
        for (h, v) in [
            (&mut lat.e2e, t.e2e_s()),
            (&mut lat.queue, t.queue_s()),
            (&mut lat.prefill, t.prefill_s()),
            (&mut lat.decode, t.decode_s()),
            (&mut lat.inference, inference),
        ] {
            if let Some(v) = v {
                h.observe(v);
            }
        }
        lat.prompt_tokens.observe(req.prompt_len as f64);
        lat.generation_tokens
            .observe(req.num_output_tokens() as f64);
        lat.max_tokens.observe(req.max_tokens as f64);
        lat.num_preemptions.observe(req.num_preemptions as f64);
        if let Some(sink) = self.sinks.remove(&id) {
            self.outbox.push((
                sink,
                RequestOutput {
                    request_id: id,
                    token_ids,
                    text,
                    time: now,
                    logprobs,
                    prompt_logprobs: std::mem::take(&mut req.prompt_logprobs),
                    finish: Some(FinishInfo {
                        reason,
                        stop_reason,
                        usage: req.usage(),
                        times: req.times.clone(),
                        num_preemptions: req.num_preemptions,
                        error,
                    }),
                },
            ));
        }
    }
}

/// Records the logprobs of the prompt tokens that a chunk's logits rows predict: the row
/// of position `start + j` gives the token at `start + j + 1`.
fn record_prompt_logprobs(req: &mut Request, rows: &[f32], vocab: usize, start: usize) {
    let Some(k) = req.params.prompt_logprobs else {
        return;
    };
    for (j, row) in rows.chunks_exact(vocab).enumerate() {
        let target = start + j + 1;
        if target >= req.prompt_len {
            break;
        }
        // Known already when this is a recomputation after a preemption.
        if target <= req.num_prompt_logprobs {
            continue;
        }
        let ls = LogSoftmax::new(row);
        req.prompt_logprobs.push(ls.token(req.tokens[target], k));
        req.num_prompt_logprobs = target;
    }
}
