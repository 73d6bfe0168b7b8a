//! Greedy continuations against llama.cpp's, judged by pagellm's float reference path.
//!
//! Goldens: `tests/golden/generate_<model>.json`, made by `scripts/make_goldens.py` with
//! llama.cpp (through llama-cpp-python). The prompts are given as token ids so that this
//! test checks the forward pass alone; tokenization has its own goldens.
//!
//! Every prompt is run teacher-forced on llama.cpp's 32 tokens, through the fast kernels
//! and through the float reference path (`Numerics::Reference`: weights dequantized,
//! activations, attention and sums in f32). Both engines quantize activations to 8 bits
//! and keep K/V in f16, so where the reference's top two tokens are close each engine
//! may pick either (llama.cpp's own builds for different ISAs disagree there); pagellm
//! does not imitate llama.cpp's rounding. The bars:
//!
//! * fidelity: at the 32 × prompts positions, pagellm's greedy token is the reference's
//!   at least as often as llama.cpp's token is, less one position per eight prompts
//!   (near-ties go either way; a kernel error costs far more);
//! * pagellm's largest miss (how far its token trails the reference's own choice, at
//!   any position) is no larger than llama.cpp's largest miss on the same positions, or
//!   [`MAX_WORSE`] nats if that is larger: no position where pagellm is clearly wrong
//!   and llama.cpp's arithmetic is not.
//!
//! Each divergence is printed with both engines' margins, and the count of prompts
//! identical to llama.cpp's for all 32 tokens (on qwen2.5-coder-0.5b, whose massive
//! activations amplify rounding, about 60%: any change of summation order flips some).

use pagellm_kernels::cpu::Numerics;
use pagellm_kernels::pool::ThreadPool;
use pagellm_model::loader::load_gguf;
use pagellm_model::{registry, KvDtype, Logits, Workspace};
use serde_json::Value;

/// A miss against the reference always allowed: the size of the near-ties the two
/// engines' shared noise (8-bit activations, f16 K/V) flips on these prompts.
const MAX_WORSE: f64 = 0.25;

fn argmax(x: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best as u32
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn check_model(name: &str) {
    let golden_path = format!(
        "{}/../../tests/golden/generate_{name}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let golden: Value =
        serde_json::from_str(&std::fs::read_to_string(&golden_path).unwrap()).unwrap();
    let path = registry::pull(name, false).expect("model in cache (scripts/test.sh pulls it)");
    let m = load_gguf(&path).unwrap();
    let t = &m.transformer;
    let vocab = t.config.vocab_size;
    let pool = ThreadPool::new(0);
    let mut ws = Workspace::with_numerics(Numerics::Fast);
    let mut rws = Workspace::with_numerics(Numerics::Reference);
    let cases = golden["prompts"].as_array().expect("prompts");
    assert!(cases.len() >= 20, "at least 20 prompts");
    let (mut identical, mut ours_agree, mut theirs_agree, mut positions) = (0, 0, 0, 0);
    let (mut ours_miss, mut theirs_miss) = (0f64, 0f64);
    let mut worse = Vec::new();
    for case in cases {
        let prompt = ids(&case["prompt_ids"]);
        let want = ids(&case["generated_ids"]);
        let steps = case["steps"].as_array().unwrap();
        assert_eq!(want.len(), 32);
        let text = case["prompt"].as_str().unwrap_or("");
        // The reference's logits at every position that predicts one of the 32 tokens.
        let mut seen = prompt.clone();
        seen.extend_from_slice(&want[..31]);
        let mut rcache = t.new_cache_with(seen.len(), KvDtype::F32);
        let reference = t
            .forward(&pool, &mut rws, &mut rcache, &seen, Logits::All)
            .unwrap()[(prompt.len() - 1) * vocab..]
            .to_vec();
        let mut cache = t.new_cache(prompt.len() + want.len());
        let mut logits = t
            .forward(&pool, &mut ws, &mut cache, &prompt, Logits::Last)
            .unwrap()
            .to_vec();
        let mut same = true;
        for (i, &w) in want.iter().enumerate() {
            let r = &reference[i * vocab..(i + 1) * vocab];
            let (tok, best) = (argmax(&logits), argmax(r));
            positions += 1;
            ours_agree += usize::from(tok == best);
            theirs_agree += usize::from(w == best);
            // How far each engine's token trails the reference's own choice.
            ours_miss = ours_miss.max((r[best as usize] - r[tok as usize]) as f64);
            theirs_miss = theirs_miss.max((r[best as usize] - r[w as usize]) as f64);
            if tok != w {
                // How much the reference prefers llama.cpp's token to ours.
                let gap = (r[w as usize] - r[tok as usize]) as f64;
                let theirs = steps[i]["margin"].as_f64().unwrap();
                let line = format!(
                    "prompt {text:?} token {i}: ours {tok}, llama.cpp {w}, reference top {best}; \
                     reference prefers llama.cpp's by {gap:.4} (llama.cpp's top-2 margin {theirs:.4})"
                );
                eprintln!("{name}: {line}");
                worse.push((gap, line));
                same = false;
            }
            // Continue from llama.cpp's token.
            logits = t
                .forward(&pool, &mut ws, &mut cache, &[w], Logits::Last)
                .unwrap()
                .to_vec();
        }
        identical += usize::from(same);
    }
    eprintln!(
        "{name}: {identical}/{} prompts identical to llama.cpp for 32 tokens; the float \
         reference's greedy token chosen at {ours_agree}/{positions} positions by pagellm, \
         {theirs_agree}/{positions} by llama.cpp; largest miss against the reference \
         {ours_miss:.4} nats for pagellm, {theirs_miss:.4} for llama.cpp",
        cases.len()
    );
    assert!(
        ours_agree + cases.len() / 8 >= theirs_agree,
        "{name}: pagellm agrees with the float reference at {ours_agree} positions, \
         llama.cpp at {theirs_agree}"
    );
    let allowed = theirs_miss.max(MAX_WORSE);
    worse.retain(|(gap, _)| *gap > allowed);
    assert!(
        ours_miss <= allowed,
        "{name}: pagellm's token trails the reference's by {ours_miss:.4} nats somewhere, \
         more than llama.cpp's worst ({theirs_miss:.4}) and {MAX_WORSE}: {worse:#?}"
    );
}

#[test]
fn smollm2_135m_against_llama_cpp_and_the_reference() {
    check_model("smollm2-135m");
}

#[test]
fn qwen2_5_coder_0_5b_against_llama_cpp_and_the_reference() {
    check_model("qwen2.5-coder-0.5b");
}
