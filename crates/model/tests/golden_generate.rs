//! Greedy continuations must match llama.cpp's, token for token.
//!
//! Goldens: `tests/golden/generate_<model>.json`, made by `scripts/make_goldens.py` with
//! llama.cpp (through llama-cpp-python). The prompts are given as token ids so that this
//! test checks the forward pass alone; tokenization has its own goldens.
//!
//! The bar: the first 32 generated tokens identical on at least 90% of the prompts, and
//! wherever a prompt diverges, the reference's own top-2 logprob margin at that position
//! is below 0.05 — a near-tie that any difference in float rounding may flip.

use pagellm_kernels::pool::ThreadPool;
use pagellm_model::loader::load_gguf;
use pagellm_model::{registry, Logits, Workspace};
use serde_json::Value;

const MAX_TIE_MARGIN: f64 = 0.05;

fn argmax(x: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best as u32
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
    let pool = ThreadPool::new(0);
    let mut ws = Workspace::default();
    let cases = golden["prompts"].as_array().expect("prompts");
    assert!(cases.len() >= 20, "at least 20 prompts");
    let mut identical = 0;
    let mut report = Vec::new();
    for case in cases {
        let prompt: Vec<u32> = case["prompt_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        let want: Vec<u32> = case["generated_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        let steps = case["steps"].as_array().unwrap();
        assert_eq!(want.len(), 32);
        let mut cache = m.transformer.new_cache(prompt.len() + want.len());
        let mut got = Vec::new();
        let mut logits = m
            .transformer
            .forward(&pool, &mut ws, &mut cache, &prompt, Logits::Last)
            .unwrap()
            .to_vec();
        for (i, &w) in want.iter().enumerate() {
            let tok = argmax(&logits);
            got.push(tok);
            if tok != w {
                let margin = steps[i]["margin"].as_f64().unwrap();
                report.push((
                    margin,
                    format!(
                        "prompt {:?} diverges at token {i}: ours {tok}, llama.cpp {w}, reference top-2 margin {margin:.4}",
                        case["prompt"].as_str().unwrap_or("")
                    ),
                ));
                break;
            }
            // Continue from the reference token, as llama.cpp did.
            logits = m
                .transformer
                .forward(&pool, &mut ws, &mut cache, &[w], Logits::Last)
                .unwrap()
                .to_vec();
        }
        if got == want {
            identical += 1;
        }
    }
    for (_, r) in &report {
        eprintln!("{name}: {r}");
    }
    eprintln!(
        "{name}: {identical}/{} prompts identical for 32 tokens",
        cases.len()
    );
    for (margin, r) in &report {
        assert!(
            *margin < MAX_TIE_MARGIN,
            "{name}: {r}, not a near-tie (margin >= {MAX_TIE_MARGIN})"
        );
    }
    assert!(
        identical * 10 >= cases.len() * 9,
        "{name}: only {identical}/{} prompts identical",
        cases.len()
    );
}

#[test]
fn smollm2_135m_matches_llama_cpp() {
    check_model("smollm2-135m");
}

#[test]
fn qwen2_5_coder_0_5b_matches_llama_cpp() {
    check_model("qwen2.5-coder-0.5b");
}
