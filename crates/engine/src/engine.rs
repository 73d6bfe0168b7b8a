//! [`Engine`]: the engine core on its own thread. Clients submit requests from any
//! thread (or async task) and read their outputs from a channel; the engine thread
//! never waits on a client. It only samples token ids: detokenization and stop strings
//! run in each [`RequestStream`], on the reader's thread, as in vLLM's output
//! processor. A dropped [`RequestStream`] aborts its request at the next step and
//! returns its blocks to the pool.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::Instant;

use pagellm_model::loader::LoadedModel;
use pagellm_model::tokenizer::TokenAttr;
use pagellm_structured::{Compiler, Vocabulary};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use crate::config::EngineConfig;
use crate::core::{EngineCore, EngineLimits, EngineStats, OutputSink, RequestOutput};
use crate::error::EngineError;
use crate::request::{FinishReason, RequestId, RequestParams, StopReason};
use crate::stop::{Detokenizer, StopScan};

enum Command {
    Add {
        id: RequestId,
        prompt: Vec<u32>,
        params: Box<RequestParams>,
        sink: OutputSink,
        arrival: Instant,
    },
    Abort(RequestId),
    /// A stream found a stop string in the request's text.
    StopAtText(RequestId, String),
    AbortAll,
    Shutdown,
}

pub struct Engine {
    tx: mpsc::Sender<Command>,
    limits: EngineLimits,
    model: Arc<LoadedModel>,
    next_id: AtomicU64,
    stats: Arc<Mutex<EngineStats>>,
    live: crate::live::LiveSlot,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// Submitted and not yet admitted (see `max_waiting_requests`).
    queued: Arc<AtomicUsize>,
    max_waiting: Option<usize>,
    /// Requests refused because the queue was full.
    rejected: AtomicU64,
    kv_events: crate::kv_events::KvEvents,
    /// Built on the first structured-output request (it indexes the vocabulary).
    structured: OnceLock<Result<Compiler, pagellm_structured::Error>>,
}

/// The outputs of one request, ending with the one that carries `finish`.
///
/// Text is made here, on the reader's thread, not on the engine thread: the engine
/// sends token ids, and the stream detokenizes them and scans for stop strings. When
/// one matches, the stream tells the engine to end the request and reports the stop
/// with the engine's final update; tokens the engine sampled in the meantime are
/// dropped and not counted.
pub struct RequestStream {
    pub id: RequestId,
    rx: UnboundedReceiver<RequestOutput>,
    text: Option<StreamText>,
}

struct StreamText {
    model: Arc<LoadedModel>,
    detok: Detokenizer,
    num_output_tokens: usize,
    /// A stop string matched: which, and how many output tokens count.
    stopped: Option<(String, usize)>,
    tx: mpsc::Sender<Command>,
    /// A resumed request: text of the resumed tokens the client does not have yet,
    /// sent before the first new text.
    pending: String,
    /// A resumed request: bytes of upcoming text the client already has.
    skip: usize,
}

impl StreamText {
    /// Primes the detokenizer and stop strings with a resumed request's tokens.
    fn resume(&mut self, r: &crate::request::Resume) {
        let mut released = String::new();
        for &t in &r.output_token_ids {
            self.num_output_tokens += 1;
            match self.detok.push(&self.model.tokenizer, t) {
                StopScan::Continue(text) | StopScan::Stopped { text, .. } => {
                    released.push_str(&text)
                }
            }
        }
        let mut at = r.text_offset.min(released.len());
        while !released.is_char_boundary(at) {
            at += 1;
        }
        self.pending = released.split_off(at);
        self.skip = r.text_offset.saturating_sub(at);
    }

    /// Applies a resumed request's text offset to the text of one update.
    fn offset(&mut self, text: &mut String) {
        if !self.pending.is_empty() {
            text.insert_str(0, &std::mem::take(&mut self.pending));
        }
        if self.skip > 0 {
            let mut n = self.skip.min(text.len());
            while !text.is_char_boundary(n) {
                n += 1;
            }
            text.drain(..n);
            self.skip -= n.min(self.skip);
        }
    }
}

impl RequestStream {
    /// The next update, blocking; `None` after the final one.
    pub fn blocking_next(&mut self) -> Option<RequestOutput> {
        loop {
            let o = self.rx.blocking_recv()?;
            if let Some(o) = self.process(o) {
                return Some(o);
            }
        }
    }

    /// The next update; `None` after the final one.
    pub async fn next(&mut self) -> Option<RequestOutput> {
        loop {
            let o = self.rx.recv().await?;
            if let Some(o) = self.process(o) {
                return Some(o);
            }
        }
    }

    /// Adds text to an engine update; `None` drops it (sampled after a stop string).
    fn process(&mut self, mut o: RequestOutput) -> Option<RequestOutput> {
        let id = self.id;
        let Some(st) = self.text.as_mut() else {
            return Some(o);
        };
        if let Some((stop, n)) = &st.stopped {
            // Waiting for the engine to end the request: only its final update counts.
            let mut f = o.finish?;
            f.reason = FinishReason::Stop;
            f.stop_reason = Some(StopReason::Text(stop.clone()));
            f.usage.completion_tokens = *n;
            o.token_ids.clear();
            o.logprobs.clear();
            o.finish = Some(f);
            return Some(o);
        }
        // A stop token ends generation without text of its own.
        let stop_token = matches!(
            o.finish.as_ref().and_then(|f| f.stop_reason.as_ref()),
            Some(StopReason::Token(_))
        );
        let n = o.token_ids.len() - usize::from(stop_token && !o.token_ids.is_empty());
        let tokenizer = &st.model.tokenizer;
        for i in 0..n {
            st.num_output_tokens += 1;
            match st.detok.push(tokenizer, o.token_ids[i]) {
                StopScan::Continue(t) => o.text.push_str(&t),
                StopScan::Stopped { text, stop } => {
                    o.text.push_str(&text);
                    o.token_ids.truncate(i + 1);
                    o.logprobs.truncate(i + 1);
                    let n = st.num_output_tokens;
                    match o.finish.as_mut() {
                        // The engine ended the request in the same step.
                        Some(f) => {
                            f.reason = FinishReason::Stop;
                            f.stop_reason = Some(StopReason::Text(stop));
                            f.usage.completion_tokens = n;
                        }
                        None => {
                            let _ = st.tx.send(Command::StopAtText(id, stop.clone()));
                            st.stopped = Some((stop, n));
                        }
                    }
                    st.offset(&mut o.text);
                    return Some(o);
                }
            }
        }
        if o.finish.is_some() {
            o.text.push_str(&st.detok.finish());
        }
        st.offset(&mut o.text);
        Some(o)
    }
}

impl Engine {
    /// Builds the engine core (allocating the KV cache) and starts its thread.
    pub fn start(model: Arc<LoadedModel>, config: &EngineConfig) -> Result<Self, EngineError> {
        let mut core = EngineCore::new(model.clone(), config)?;
        let limits = core.limits();
        let queued = Arc::new(AtomicUsize::new(0));
        core.track_queue(queued.clone());
        // The core publishes its stats here before it sends each batch of updates.
        let stats = Arc::new(Mutex::new(core.stats()));
        core.publish_stats(stats.clone());
        let live: crate::live::LiveSlot = Default::default();
        core.publish_live(live.clone());
        let queued2 = queued.clone();
        let (tx, rx) = mpsc::channel();
        let (kv_pub, kv_events) = crate::kv_events::channel();
        let thread = std::thread::Builder::new()
            .name("pagellm-engine".into())
            .spawn(move || run(core, rx, queued2, kv_pub))
            .map_err(|e| EngineError::Config(format!("cannot start the engine thread: {e}")))?;
        Ok(Self {
            tx,
            limits,
            model,
            next_id: AtomicU64::new(1),
            stats,
            live,
            thread: Mutex::new(Some(thread)),
            queued,
            max_waiting: config.max_waiting_requests,
            rejected: AtomicU64::new(0),
            kv_events,
            structured: OnceLock::new(),
        })
    }

    pub fn limits(&self) -> EngineLimits {
        self.limits
    }

    pub fn model(&self) -> &Arc<LoadedModel> {
        &self.model
    }

    /// Compiles structured-output constraints for this model (see
    /// [`RequestParams::guide`]).
    pub fn structured(&self) -> Result<&Compiler, EngineError> {
        self.structured
            .get_or_init(|| Compiler::new(&vocabulary(&self.model, self.limits.vocab_size)))
            .as_ref()
            .map_err(|e| EngineError::Structured(e.clone()))
    }

    /// Subscribes to the prefix cache's changes.
    pub fn kv_events(&self) -> crate::kv_events::KvEvents {
        self.kv_events.clone()
    }

    /// Queues a request; it is checked here, so a request that can never run fails
    /// now with a clear error instead of waiting.
    pub fn submit(
        &self,
        prompt: Vec<u32>,
        params: RequestParams,
    ) -> Result<RequestStream, EngineError> {
        let mut v = self.submit_group(vec![(prompt, params)])?;
        Ok(v.pop().expect("one stream per request"))
    }

    /// Queues requests that belong together (the prompts and choices of one API call):
    /// all are checked first, and the waiting limit admits or refuses them as one, so
    /// a group larger than the limit still runs when the queue is short.
    pub fn submit_group(
        &self,
        requests: Vec<(Vec<u32>, RequestParams)>,
    ) -> Result<Vec<RequestStream>, EngineError> {
        for (prompt, params) in &requests {
            self.limits.validate(prompt, params)?;
            // Resumed output must be output the constraint allows (checked on a copy;
            // the request's own guide takes the tokens when the engine admits it).
            if let (Some(g), Some(r)) = (&params.guide, &params.resume) {
                g.clone().advance_all(&r.output_token_ids)?;
            }
        }
        // Reserve places in the queue, or refuse: it never grows past the limit by more
        // than one group.
        let limit = self.max_waiting.unwrap_or(usize::MAX);
        let k = requests.len();
        self.queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| {
                (q < limit).then_some(q + k)
            })
            .map_err(|_| {
                self.rejected.fetch_add(k as u64, Ordering::Relaxed);
                EngineError::QueueFull { limit }
            })?;
        let mut streams = Vec::with_capacity(k);
        for (i, (prompt, mut params)) in requests.into_iter().enumerate() {
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            let (sink, rx) = unbounded_channel();
            // The stream detokenizes; the engine thread only samples.
            let text = std::mem::replace(&mut params.detokenize, false).then(|| {
                let mut t = StreamText {
                    model: self.model.clone(),
                    detok: Detokenizer::new(params.stop.clone()),
                    num_output_tokens: 0,
                    stopped: None,
                    tx: self.tx.clone(),
                    pending: String::new(),
                    skip: 0,
                };
                if let Some(r) = &params.resume {
                    t.resume(r);
                }
                t
            });
            let add = Command::Add {
                id,
                prompt,
                params: Box::new(params),
                sink,
                arrival: Instant::now(),
            };
            if self.tx.send(add).is_err() {
                self.queued.fetch_sub(k - i, Ordering::AcqRel);
                return Err(EngineError::ShutDown);
            }
            streams.push(RequestStream { id, rx, text });
        }
        Ok(streams)
    }

    pub fn abort(&self, id: RequestId) {
        let _ = self.tx.send(Command::Abort(id));
    }

    /// Aborts every request and keeps running (the end of a shutdown grace period).
    pub fn abort_all(&self) {
        let _ = self.tx.send(Command::AbortAll);
    }

    /// Requests submitted and not yet admitted to the running batch.
    pub fn num_queued(&self) -> usize {
        self.queued.load(Ordering::Acquire)
    }

    /// The counters as of the last step.
    pub fn stats(&self) -> EngineStats {
        let mut s = self.stats.lock().map(|s| s.clone()).unwrap_or_default();
        s.admission_rejections = self.rejected.load(Ordering::Relaxed);
        s
    }

    /// The engine's blocks and requests as of a recent step (see [`crate::live`]).
    pub fn live(&self) -> Arc<crate::live::LiveView> {
        self.live.lock().map(|v| v.clone()).unwrap_or_default()
    }

    /// Aborts everything and stops the thread.
    pub fn shutdown(&self) {
        let _ = self.tx.send(Command::Shutdown);
        if let Some(t) = self.thread.lock().ok().and_then(|mut t| t.take()) {
            let _ = t.join();
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn run(
    mut core: EngineCore,
    rx: mpsc::Receiver<Command>,
    queued: Arc<AtomicUsize>,
    kv: crate::kv_events::KvEventPublisher,
) {
    loop {
        // Busy: take what has arrived and step. Idle: sleep until a command comes.
        let mut cmds = Vec::new();
        if core.has_unfinished() {
            while let Ok(c) = rx.try_recv() {
                cmds.push(c);
            }
        } else {
            match rx.recv() {
                Ok(c) => cmds.push(c),
                Err(_) => return,
            }
        }
        for c in cmds {
            match c {
                Command::Add {
                    id,
                    prompt,
                    params,
                    sink,
                    arrival,
                } => {
                    if let Err(e) = core.add_request(id, prompt, *params, sink, arrival) {
                        // Checked at submission; only a race with a limit change lands here.
                        tracing::warn!(request = id, error = %e, "request rejected");
                        queued.fetch_sub(1, Ordering::AcqRel);
                    }
                }
                Command::Abort(id) => core.abort(id),
                Command::StopAtText(id, stop) => core.stop_at_text(id, stop),
                Command::AbortAll => core.abort_all(),
                Command::Shutdown => {
                    core.abort_all();
                    kv.publish(core.take_kv_events());
                    return;
                }
            }
        }
        core.step();
        kv.publish(core.take_kv_events());
    }
}

/// The model's tokens for the structured-output matcher: their text, which are control
/// tokens, and the end token (the tokenizer's EOS, else its first end-of-generation id).
fn vocabulary(model: &LoadedModel, logits_len: usize) -> Vocabulary {
    let tok = &model.tokenizer;
    let n = tok.vocab_size() as u32;
    Vocabulary {
        pieces: (0..n)
            .map(|i| tok.token_to_piece(i).unwrap_or_default().to_vec())
            .collect(),
        special: (0..n)
            .map(|i| {
                matches!(
                    tok.token_attr(i),
                    Some(TokenAttr::Control | TokenAttr::Unknown)
                )
            })
            .collect(),
        eos: tok
            .eos_id()
            .or_else(|| tok.eos_ids().first().copied())
            .unwrap_or(0),
        logits_len,
    }
}
