//! The engine on a real model (smollm2-135m, pulled by scripts/test.sh): batching,
//! chunking, preemption and prefix caching must not change a request's result, and
//! stop conditions, rejection and aborts behave as documented.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use pagellm_engine::sampler::argmax;
use pagellm_engine::{
    Engine, EngineConfig, EngineCore, EngineError, FinishInfo, FinishReason, RequestId,
    RequestParams, SamplingParams, SchedulerConfig, StopReason,
};
use pagellm_model::loader::{load_gguf, LoadedModel};
use pagellm_model::{registry, KvDtype, Logits, PagedKvCache, Workspace};
use rand::{Rng, SeedableRng};

const MODEL: &str = "smollm2-135m";

/// The tests share two cores; running them one at a time keeps each fast.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn model() -> Arc<LoadedModel> {
    static M: std::sync::OnceLock<Arc<LoadedModel>> = std::sync::OnceLock::new();
    M.get_or_init(|| {
        let path = registry::pull(MODEL, false).expect("model in cache (scripts/test.sh pulls it)");
        Arc::new(load_gguf(&path).unwrap())
    })
    .clone()
}

fn config() -> EngineConfig {
    EngineConfig {
        threads: 2,
        kv_cache_memory: 256 << 20,
        max_model_len: Some(1024),
        ..EngineConfig::default()
    }
}

fn bytes_for_blocks(m: &LoadedModel, blocks: usize, bs: usize) -> u64 {
    let c = &m.transformer.config;
    (blocks * PagedKvCache::bytes_per_block(c.n_layers, c.kv_dim(), c.head_dim, bs, KvDtype::F16))
        as u64
}

fn greedy(max_tokens: usize) -> RequestParams {
    RequestParams {
        sampling: SamplingParams::greedy(),
        max_tokens: Some(max_tokens),
        ignore_eos: true,
        ..RequestParams::default()
    }
}

#[derive(Debug, Clone)]
struct Outcome {
    tokens: Vec<u32>,
    text: String,
    /// Hash of each logits row's bits, in sampling order.
    logits: Vec<u64>,
    /// Of the sampled tokens, when asked for.
    logprobs: Vec<pagellm_engine::TokenLogprobs>,
    prompt_logprobs: Vec<pagellm_engine::TokenLogprobs>,
    finish: FinishInfo,
}

/// Submits every request at once to a fresh core and runs until all finish.
fn run_all(
    config: &EngineConfig,
    reqs: Vec<(Vec<u32>, RequestParams)>,
) -> (Vec<Outcome>, EngineCore) {
    run_staggered(config, reqs, 0)
}

/// Like [`run_all`], but the first `head` requests get `head` steps to themselves first.
fn run_staggered(
    config: &EngineConfig,
    reqs: Vec<(Vec<u32>, RequestParams)>,
    head: usize,
) -> (Vec<Outcome>, EngineCore) {
    run_on(model(), config, reqs, head)
}

/// [`run_staggered`] on model `m`.
fn run_on(
    m: Arc<LoadedModel>,
    config: &EngineConfig,
    reqs: Vec<(Vec<u32>, RequestParams)>,
    head: usize,
) -> (Vec<Outcome>, EngineCore) {
    let mut core = EngineCore::new(m, config).unwrap();
    let logits: Arc<Mutex<HashMap<RequestId, Vec<u64>>>> = Arc::default();
    let sink = logits.clone();
    core.set_logits_probe(Some(Box::new(move |id, row: &[f32]| {
        let mut h = DefaultHasher::new();
        for x in row {
            x.to_bits().hash(&mut h);
        }
        sink.lock().unwrap().entry(id).or_default().push(h.finish());
    })));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let n = reqs.len();
    for (i, (prompt, params)) in reqs.into_iter().enumerate() {
        if i == head {
            for _ in 0..head {
                core.step();
            }
        }
        core.add_request(i as u64, prompt, params, tx.clone(), Instant::now())
            .unwrap();
    }
    let mut toks: Vec<Vec<u32>> = vec![Vec::new(); n];
    let mut text = vec![String::new(); n];
    let mut fin: Vec<Option<FinishInfo>> = vec![None; n];
    let mut plps = vec![Vec::new(); n];
    let mut lps = vec![Vec::new(); n];
    let mut steps = 0;
    while fin.iter().any(Option::is_none) {
        core.step();
        core.check_invariants().unwrap();
        while let Ok(o) = rx.try_recv() {
            let i = o.request_id as usize;
            toks[i].extend(&o.token_ids);
            text[i].push_str(&o.text);
            plps[i].extend(o.prompt_logprobs);
            lps[i].extend(o.logprobs);
            if let Some(f) = o.finish {
                fin[i] = Some(f);
            }
        }
        steps += 1;
        assert!(steps < 100_000, "requests never finish");
    }
    assert_eq!(
        core.scheduler().kv.pool().num_free(),
        core.limits().num_blocks,
        "all blocks free at the end"
    );
    let logits = std::mem::take(&mut *logits.lock().unwrap());
    let out = (0..n)
        .map(|i| Outcome {
            tokens: toks[i].clone(),
            text: text[i].clone(),
            logits: logits.get(&(i as u64)).cloned().unwrap_or_default(),
            logprobs: std::mem::take(&mut lps[i]),
            prompt_logprobs: std::mem::take(&mut plps[i]),
            finish: fin[i].clone().unwrap(),
        })
        .collect();
    (out, core)
}

fn random_prompt(rng: &mut impl Rng, len: usize) -> Vec<u32> {
    (0..len).map(|_| rng.gen_range(100..49000)).collect()
}

#[test]
fn results_do_not_depend_on_batch_chunking_or_preemption() {
    let _g = serial();
    check_batch_invariance(model(), 11, 12);
}

/// The same on a model in K-quants (Q4_K and Q6_K matrices), whose kernels llama.cpp
/// switches with the batch size and pagellm does not.
#[test]
fn k_quant_results_do_not_depend_on_batch_chunking_or_preemption() {
    let _g = serial();
    let path = registry::pull("qwen2.5-coder-1.5b", false)
        .expect("model in cache (scripts/test.sh pulls it)");
    let m = Arc::new(load_gguf(&path).unwrap());
    let types: std::collections::HashSet<&str> = m
        .transformer
        .layers
        .iter()
        .flat_map(|l| [&l.attn_q, &l.attn_v, &l.ffn_down])
        .map(|t| t.ty.name())
        .collect();
    assert!(
        types.contains("Q4_K") && types.contains("Q6_K"),
        "expected a K-quant model, got {types:?}"
    );
    check_batch_invariance(m, 4, 4);
}

/// A target request's tokens and logits (bit for bit) alone, among 16 others of
/// prompt lengths `5 + i * len_step` generating `gen + i % 5 * 4` tokens, with 16-token
/// chunks, and after preemption.
fn check_batch_invariance(m: Arc<LoadedModel>, len_step: usize, gen: usize) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let target = (random_prompt(&mut rng, 40), greedy(24));
    let others: Vec<_> = (0..16)
        .map(|i| {
            (
                random_prompt(&mut rng, 5 + i * len_step),
                greedy(gen + i % 5 * 4),
            )
        })
        .collect();
    let run_all = |config: &EngineConfig, reqs| run_on(m.clone(), config, reqs, 0);
    let run_staggered = |config: &EngineConfig, reqs, head| run_on(m.clone(), config, reqs, head);

    let (alone, _) = run_all(&config(), vec![target.clone()]);
    assert_eq!(alone[0].tokens.len(), 24);
    assert_eq!(alone[0].logits.len(), 24);

    // Among 16 others of different lengths (the target last).
    let mut batch = others.clone();
    batch.push(target.clone());
    let (mixed, core) = run_all(&config(), batch.clone());
    assert!(core.stats().steps < 60, "the requests really ran together");

    // A different chunk size: 16-token steps split every prompt.
    let mut small = config();
    small.scheduler = SchedulerConfig {
        max_num_batched_tokens: 16,
        max_num_seqs: 16,
        ..SchedulerConfig::default()
    };
    let (chunked, _) = run_all(&small, batch.clone());

    // A cache too small for everyone: the target starts first, then more important
    // requests arrive and take its blocks; it is recomputed once they leave room.
    let mut tight = config();
    tight.max_model_len = Some(192);
    tight.kv_cache_memory = bytes_for_blocks(&m, 12, 16);
    tight.scheduler.policy = pagellm_engine::Policy::Priority;
    let mut order = vec![target.clone()];
    order[0].1.priority = 1;
    order.extend(others.iter().cloned());
    let (mut preempted, core) = run_staggered(&tight, order, 1);
    let total_prompt: usize = batch.iter().map(|r| r.0.len()).sum();
    assert_eq!(
        core.stats().prompt_tokens,
        total_prompt as u64,
        "recomputation does not count prompt tokens twice"
    );
    assert!(core.stats().num_preemptions > 0);
    assert!(
        preempted[0].finish.num_preemptions > 0,
        "the target was preempted"
    );
    preempted.rotate_left(1);

    for (name, run) in [
        ("mixed", &mixed),
        ("chunked", &chunked),
        ("preempted", &preempted),
    ] {
        assert_eq!(
            run[16].tokens, alone[0].tokens,
            "{name}: tokens differ from the solo run"
        );
        assert_eq!(
            run[16].logits, alone[0].logits,
            "{name}: logits differ from the solo run"
        );
    }
    // The others agree between runs too.
    for i in 0..16 {
        assert_eq!(
            chunked[i].logits, mixed[i].logits,
            "request {i}: chunked vs mixed"
        );
        assert_eq!(
            preempted[i].tokens, mixed[i].tokens,
            "request {i}: preempted vs mixed"
        );
    }
}

/// The 24 golden prompts submitted at once give, token for token, what the model's own
/// one-sequence forward pass gives each prompt alone (greedy, 32 tokens). How many also
/// equal llama.cpp's continuations is printed; `golden_generate.rs` judges that part.
#[test]
fn batched_engine_matches_each_prompt_run_alone() {
    let _g = serial();
    let golden_path = format!(
        "{}/../../tests/golden/generate_{MODEL}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let golden: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(golden_path).unwrap()).unwrap();
    let ids = |v: &serde_json::Value| -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    };
    let cases = golden["prompts"].as_array().unwrap();
    let reqs: Vec<_> = cases
        .iter()
        .map(|c| (ids(&c["prompt_ids"]), greedy(32)))
        .collect();
    let (out, _) = run_all(&config(), reqs.clone());
    let m = model();
    let t = &m.transformer;
    let pool = pagellm_kernels::pool::ThreadPool::new(2);
    let mut ws = Workspace::default();
    let mut as_llama_cpp = 0;
    for ((c, (prompt, _)), o) in cases.iter().zip(&reqs).zip(&out) {
        let mut cache = t.new_cache(prompt.len() + 32);
        let mut logits = t
            .forward(&pool, &mut ws, &mut cache, prompt, Logits::Last)
            .unwrap()
            .to_vec();
        let mut alone = Vec::new();
        for _ in 0..32 {
            let tok = argmax(&logits);
            alone.push(tok);
            logits = t
                .forward(&pool, &mut ws, &mut cache, &[tok], Logits::Last)
                .unwrap()
                .to_vec();
        }
        assert_eq!(o.tokens, alone, "prompt {:?}", c["prompt"]);
        as_llama_cpp += usize::from(alone == ids(&c["generated_ids"]));
    }
    eprintln!(
        "{as_llama_cpp}/{} prompts equal llama.cpp's 32-token continuations",
        cases.len()
    );
}

#[test]
fn shared_prefix_is_computed_once_and_gives_the_same_output() {
    let _g = serial();
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let prefix = random_prompt(&mut rng, 256);
    let mut a = prefix.clone();
    a.extend(random_prompt(&mut rng, 20));
    let mut b = prefix.clone();
    b.extend(random_prompt(&mut rng, 30));

    let mut core = EngineCore::new(model(), &config()).unwrap();
    let run = |core: &mut EngineCore, id, p: &Vec<u32>| {
        let mut toks: Vec<u32> = Vec::new();
        let f = pagellm_engine::generate::generate(core, id, p.clone(), greedy(12), |o| {
            toks.extend(&o.token_ids);
            true
        })
        .unwrap();
        (toks, f)
    };
    let (_, fa) = run(&mut core, 1, &a);
    assert_eq!(fa.usage.cached_prompt_tokens, 0);
    let (tb, fb) = run(&mut core, 2, &b);
    assert_eq!(
        fb.usage.cached_prompt_tokens, 256,
        "the 256-token prefix came from the cache"
    );
    let st = core.stats().prefix_cache;
    assert_eq!((st.queries, st.hits), ((a.len() + b.len()) as u64, 256));

    let mut off = config();
    off.enable_prefix_caching = false;
    let mut cold = EngineCore::new(model(), &off).unwrap();
    let (tb_cold, fb_cold) = run(&mut cold, 2, &b);
    assert_eq!(fb_cold.usage.cached_prompt_tokens, 0);
    assert_eq!(tb, tb_cold, "cached and uncached runs agree");
}

#[test]
fn stop_conditions_and_finish_reasons() {
    let _g = serial();
    let m = model();
    let prompt = m
        .tokenizer
        .encode("The capital of France is", true, true)
        .unwrap();
    let (base, _) = run_all(&config(), vec![(prompt.clone(), greedy(24))]);
    let base = &base[0];
    assert_eq!(base.finish.reason, FinishReason::Length);
    assert_eq!(
        base.text,
        m.tokenizer.decode(&base.tokens, true),
        "streamed text equals the decoded tokens"
    );

    // A stop string: the text before it is released, the string itself is not.
    let word = base.text.split_whitespace().nth(3).unwrap().to_string();
    let cut = base.text.find(&word).unwrap();
    let mut p = greedy(24);
    p.stop = vec![word.clone()];
    // A stop token id: generation ends on the 3rd token.
    let mut q = greedy(24);
    q.stop_token_ids = vec![base.tokens[2]];
    q.ignore_eos = false;
    let (out, _) = run_all(
        &config(),
        vec![
            (prompt.clone(), p),
            (prompt.clone(), q),
            (prompt.clone(), greedy(5)),
        ],
    );
    assert_eq!(out[0].finish.reason, FinishReason::Stop);
    assert_eq!(
        out[0].finish.stop_reason,
        Some(StopReason::Text(word.clone()))
    );
    assert_eq!(out[0].text, base.text[..cut], "stop string {word:?}");
    // Through the threaded engine the stream makes the text and finds the stop string
    // off the engine thread; the answer is the same, extra tokens are not counted.
    let engine = Engine::start(m.clone(), &config()).unwrap();
    let mut p = greedy(24);
    p.stop = vec![word.clone()];
    let mut s = engine.submit(prompt.clone(), p).unwrap();
    let (mut text, mut tokens, mut fin) = (String::new(), Vec::new(), None);
    while let Some(o) = s.blocking_next() {
        text.push_str(&o.text);
        tokens.extend(o.token_ids);
        fin = o.finish.or(fin);
    }
    let fin = fin.unwrap();
    assert_eq!(text, out[0].text);
    assert_eq!(tokens, out[0].tokens);
    assert_eq!(fin.stop_reason, out[0].finish.stop_reason);
    assert_eq!(fin.usage, out[0].finish.usage);
    let t = Instant::now();
    while engine.stats().finished[FinishReason::Stop as usize] != 1 {
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", engine.stats());
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(engine);
    let first = base
        .tokens
        .iter()
        .position(|&t| t == base.tokens[2])
        .unwrap();
    assert_eq!(
        out[1].finish.stop_reason,
        Some(StopReason::Token(base.tokens[2]))
    );
    assert_eq!(out[1].tokens, base.tokens[..=first]);
    assert_eq!(out[2].finish.reason, FinishReason::Length);
    assert_eq!(out[2].tokens, base.tokens[..5]);
    assert_eq!(out[2].finish.usage.completion_tokens, 5);

    // The context length: no max_tokens means "until the context is full".
    let mut ctx = config();
    ctx.max_model_len = Some(prompt.len() + 4);
    let mut p = greedy(1);
    p.max_tokens = None;
    let (out, _) = run_all(&ctx, vec![(prompt.clone(), p)]);
    assert_eq!(out[0].finish.reason, FinishReason::Length);
    assert_eq!(out[0].tokens, base.tokens[..4]);

    // The model's own end-of-generation token ends a chat reply.
    let tmpl = m.chat_template.as_ref().unwrap();
    let chat = tmpl
        .render(
            &[pagellm_model::chat::ChatMessage {
                role: "user".into(),
                content: "Say hi.".into(),
            }],
            true,
        )
        .unwrap();
    let mut p = greedy(200);
    p.ignore_eos = false;
    let (out, _) = run_all(
        &config(),
        vec![(m.tokenizer.encode(&chat, false, true).unwrap(), p)],
    );
    let f = &out[0].finish;
    assert_eq!(f.reason, FinishReason::Stop);
    assert!(matches!(f.stop_reason, Some(StopReason::Token(t)) if m.tokenizer.is_eog(t)));
    assert!(f.times.first_scheduled.is_some() && f.times.first_token >= f.times.first_scheduled);
}

#[test]
fn dropped_receivers_abort_and_free_their_blocks() {
    let _g = serial();
    let engine = Engine::start(model(), &config()).unwrap();
    let mut streams: Vec<_> = (0..4)
        .map(|i| engine.submit(vec![1 + i, 2, 3, 4, 5], greedy(500)).unwrap())
        .collect();
    for s in &mut streams {
        let first = s.blocking_next().unwrap();
        assert!(first.finish.is_none());
    }
    drop(streams);
    let t = Instant::now();
    loop {
        let st = engine.stats();
        if st.num_running == 0 && st.num_waiting == 0 && st.kv_cache_usage == 0.0 {
            assert_eq!(st.finished[FinishReason::Abort as usize], 4);
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "requests still running: {st:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Explicit abort and a request that can never fit.
    let mut s = engine.submit(vec![5, 6, 7], greedy(500)).unwrap();
    s.blocking_next().unwrap();
    engine.abort(s.id);
    let mut last = None;
    while let Some(o) = s.blocking_next() {
        last = o.finish;
    }
    assert_eq!(last.unwrap().reason, FinishReason::Abort);
    let e = engine.submit(vec![1; 1000], greedy(100)).err().unwrap();
    assert!(matches!(e, EngineError::ContextLength { .. }), "{e}");
}

#[test]
fn the_waiting_queue_is_bounded_and_drains() {
    let _g = serial();
    let mut c = config();
    c.scheduler.max_num_seqs = 1;
    c.max_waiting_requests = Some(3);
    let engine = Engine::start(model(), &c).unwrap();
    // A group is admitted whole while the queue is short, even past the limit ...
    let group: Vec<_> = (0..5).map(|i| (vec![7 + i, 8, 9], greedy(8))).collect();
    let mut streams = engine.submit_group(group).unwrap();
    // ... and then nothing more until it drains (one runs at a time, 8 tokens each).
    let e = engine.submit(vec![1, 2, 3], greedy(8)).err().unwrap();
    assert!(matches!(e, EngineError::QueueFull { limit: 3 }), "{e}");
    assert!(e.to_string().contains("--max-waiting-requests"), "{e}");
    // Hanging up on requests still waiting releases their places too.
    let waiting = streams.split_off(2);
    drop(waiting);
    for mut s in streams {
        let mut last = None;
        while let Some(o) = s.blocking_next() {
            last = o.finish;
        }
        assert_eq!(last.unwrap().reason, FinishReason::Length);
    }
    let t = Instant::now();
    while engine.num_queued() > 0 {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "{}",
            engine.num_queued()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut s = engine.submit(vec![1, 2, 3], greedy(2)).unwrap();
    while s.blocking_next().is_some() {}
    assert_eq!(engine.num_queued(), 0);
}

#[test]
fn logprobs_are_the_raw_log_softmax() {
    let _g = serial();
    let mut core = EngineCore::new(model(), &config()).unwrap();
    let rows = Arc::new(Mutex::new(Vec::<Vec<f32>>::new()));
    let sink = rows.clone();
    core.set_logits_probe(Some(Box::new(move |_, l| {
        sink.lock().unwrap().push(l.to_vec())
    })));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let params = RequestParams {
        logprobs: Some(4),
        // Penalties change what is sampled, not the reported logprobs.
        sampling: SamplingParams {
            repetition_penalty: 1.3,
            ..SamplingParams::greedy()
        },
        ..greedy(6)
    };
    core.add_request(
        1,
        vec![504, 3575, 282, 4649, 314],
        params,
        tx,
        Instant::now(),
    )
    .unwrap();
    while core.has_unfinished() {
        core.step();
    }
    let mut lps = Vec::new();
    while let Ok(o) = rx.try_recv() {
        assert_eq!(o.logprobs.len(), o.token_ids.len());
        lps.extend(o.logprobs);
    }
    let rows = rows.lock().unwrap();
    assert_eq!(lps.len(), 6);
    assert_eq!(rows.len(), 6);
    for (lp, row) in lps.iter().zip(rows.iter()) {
        let max = row.iter().copied().fold(f32::MIN, f32::max);
        let log_z = max
            + row
                .iter()
                .map(|&l| ((l - max) as f64).exp())
                .sum::<f64>()
                .ln() as f32;
        assert!((lp.logprob - (row[lp.token as usize] - log_z)).abs() < 1e-4);
        assert_eq!(lp.top.len(), 4);
        assert!(lp.top.windows(2).all(|w| w[0].1 >= w[1].1));
        let best = pagellm_engine::sampler::argmax(row);
        assert_eq!(lp.top[0].0, best);
        assert!((lp.top[0].1 - (max - log_z)).abs() < 1e-4);
    }
}

#[test]
fn a_cache_that_cannot_hold_one_sequence_is_a_configuration_error() {
    let _g = serial();
    let m = model();
    let mut c = config();
    c.kv_cache_memory = bytes_for_blocks(&m, 10, 16);
    let e = EngineCore::new(m.clone(), &c).err().unwrap();
    assert!(matches!(e, EngineError::Config(_)));
    assert!(e.to_string().contains("--kv-cache-memory"), "{e}");
    c.kv_cache_memory = bytes_for_blocks(&m, 64, 16);
    assert_eq!(EngineCore::new(m, &c).unwrap().limits().num_blocks, 64);
}

#[test]
fn every_kv_cache_dtype_serves_the_same_answer() {
    let _g = serial();
    let m = model();
    let prompt = m
        .tokenizer
        .encode("The capital of France is", true, true)
        .unwrap();
    let mut texts = Vec::new();
    for dtype in [
        KvDtype::F16,
        KvDtype::Bf16,
        KvDtype::F32,
        KvDtype::Fp8,
        KvDtype::Int8,
    ] {
        let mut c = config();
        c.kv_cache_dtype = dtype;
        let (out, core) = run_all(&c, vec![(prompt.clone(), greedy(2))]);
        // Half the bytes per block for 16-bit types: twice the blocks for f32's memory.
        let per_token = core.limits().num_blocks * core.limits().block_size;
        texts.push((dtype, out[0].text.clone(), per_token));
    }
    for (dtype, text, _) in &texts {
        assert_eq!(text, " Paris.", "{dtype}");
    }
    assert_eq!(texts[0].2, texts[1].2);
    assert_eq!(
        texts[0].2,
        2 * texts[2].2,
        "f32 entries take twice the memory"
    );
    // 8-bit entries with an f16 scale per row of head_dim: about twice f16's tokens.
    for (dtype, _, tokens) in &texts[3..] {
        assert!(
            *tokens as f64 >= 1.9 * texts[0].2 as f64,
            "{dtype}: {tokens} tokens against f16's {}",
            texts[0].2
        );
    }
}

#[test]
fn prompt_logprobs_are_what_each_prefix_predicts() {
    let _g = serial();
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    // Longer than one prompt-logprobs chunk, so a chunk boundary is crossed.
    let prompt = random_prompt(&mut rng, 300);
    let wants = RequestParams {
        prompt_logprobs: Some(3),
        ..greedy(2)
    };
    // The same prompt without prompt logprobs runs first and caches its blocks; the
    // request that wants them must compute its whole prompt anyway.
    let (out, _) = run_staggered(
        &config(),
        vec![(prompt.clone(), greedy(2)), (prompt.clone(), wants)],
        1,
    );
    let got = &out[1].prompt_logprobs;
    assert!(out[0].prompt_logprobs.is_empty());
    assert_eq!(out[1].finish.usage.cached_prompt_tokens, 0);
    assert_eq!(got.len(), prompt.len() - 1);
    assert_eq!(out[1].tokens, out[0].tokens);
    for (i, lp) in got.iter().enumerate() {
        assert_eq!(lp.token, prompt[i + 1]);
        assert_eq!(lp.top.len(), 3);
        assert!(lp.rank >= 1 && lp.logprob <= lp.top[0].1 + 1e-6);
        if lp.rank <= 3 {
            assert_eq!(lp.top[lp.rank - 1].0, lp.token, "position {i}");
        }
    }
    // Each checked position against a request whose prompt ends just before it: its
    // first sampled token's logprobs come from the same logits.
    let at = [1, 2, 100, 255, 256, 257, 299];
    let reqs = at
        .iter()
        .map(|&i| {
            let p = RequestParams {
                logprobs: Some(3),
                ..greedy(1)
            };
            (prompt[..i].to_vec(), p)
        })
        .collect();
    let (refs, _) = run_all(&config(), reqs);
    for (&i, r) in at.iter().zip(&refs) {
        let want = &r.logprobs[0].top;
        let lp = &got[i - 1];
        assert_eq!(lp.top[0].0, want[0].0, "position {i}");
        for (a, b) in lp.top.iter().zip(want) {
            assert!(
                (a.1 - b.1).abs() < 1e-3,
                "position {i}: {:?} vs {:?}",
                lp.top,
                want
            );
        }
    }
}
