//! Hugging Face directories: GGUF → HF conversion against the GGUF original (same
//! config, weights, tokenizer and greedy generations), loading of hand-written
//! single-file and sharded checkpoints, and the error messages for broken directories.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use pagellm_kernels::pool::ThreadPool;
use pagellm_kernels::quant::GgmlType;
use pagellm_model::hf::{self, HfDtype};
use pagellm_model::loader::{self, LoadedModel};
use pagellm_model::{Logits, ModelError, RopeStyle, Storage, Tensor, TensorSet, Workspace};
use pagellm_testkit::{
    bytes_of, tiny_config, tiny_tensors, write_safetensors, write_tiny_model, write_tiny_tokenizer,
    VOCAB,
};
use safetensors::Dtype;
use serde_json::json;

fn smollm2() -> PathBuf {
    pagellm_model::registry::pull("smollm2-135m", false).expect("pull smollm2-135m")
}

fn convert(dtype: HfDtype) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("smollm2-hf");
    hf::convert_gguf_to_hf(smollm2().to_str().unwrap(), &out, dtype).unwrap();
    (tmp, out)
}

fn argmax(xs: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in xs.iter().enumerate() {
        if x > xs[best] {
            best = i;
        }
    }
    best as u32
}

/// Greedy decoding of `n` tokens after `prompt`.
fn greedy(model: &LoadedModel, pool: &ThreadPool, prompt: &[u32], n: usize) -> Vec<u32> {
    let t = &model.transformer;
    let mut cache = t.new_cache(prompt.len() + n);
    let mut ws = Workspace::default();
    let mut input = prompt.to_vec();
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let logits = t
            .forward(pool, &mut ws, &mut cache, &input, Logits::Last)
            .unwrap();
        let next = argmax(logits);
        out.push(next);
        input = vec![next];
    }
    out
}

fn prompts(model: &LoadedModel) -> Vec<Vec<u32>> {
    let tok = &model.tokenizer;
    let chat = model
        .chat_template
        .as_ref()
        .expect("smollm2 has a chat template")
        .render(
            &[pagellm_model::chat::ChatMessage::user(
                "What is the tallest mountain on Earth?",
            )],
            true,
        )
        .unwrap();
    [
        "The capital of France is",
        "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
        "Once upon a time, in a small village by the sea,",
        chat.as_str(),
    ]
    .iter()
    .map(|p| tok.encode(p, true, true).unwrap())
    .collect()
}

#[test]
fn f32_conversion_matches_gguf() {
    let (_tmp, out) = convert(HfDtype::F32);
    for f in [
        "model.safetensors",
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ] {
        assert!(out.join(f).is_file(), "{f} was not written");
    }
    let g = loader::load_gguf(&smollm2()).unwrap();
    let h = hf::load_hf_dir(&out).unwrap();
    let (gt, ht) = (&g.transformer, &h.transformer);

    assert_eq!(gt.config.rope_style, RopeStyle::Interleaved);
    assert_eq!(ht.config.rope_style, RopeStyle::Neox);
    let mut hc = ht.config.clone();
    hc.rope_style = gt.config.rope_style;
    assert_eq!(hc, gt.config);
    assert_eq!(ht.tied_embeddings, gt.tied_embeddings);

    assert_eq!(ht.token_embd.ty.name(), "F32");
    assert_eq!(ht.token_embd.shape, gt.token_embd.shape);
    assert!(
        ht.token_embd.to_f32() == gt.token_embd.to_f32(),
        "token_embd differs"
    );
    assert_eq!(ht.output_norm, gt.output_norm);
    assert_eq!(ht.layers[0].attn_norm, gt.layers[0].attn_norm);
    assert_eq!(ht.layers[3].ffn_norm, gt.layers[3].ffn_norm);
    assert!(
        ht.layers[1].attn_v.to_f32() == gt.layers[1].attn_v.to_f32(),
        "attn_v differs"
    );
    // Q and K hold the same rows, reordered within each head.
    let (hq, gq) = (ht.layers[0].attn_q.to_f32(), gt.layers[0].attn_q.to_f32());
    assert_ne!(hq, gq);
    let (mut hs, mut gs) = (hq.clone(), gq.clone());
    hs.sort_by(f32::total_cmp);
    gs.sort_by(f32::total_cmp);
    assert_eq!(hs, gs);

    // The chat template survives the trip.
    let msgs = [pagellm_model::chat::ChatMessage::user("hi")];
    assert_eq!(
        h.chat_template
            .as_ref()
            .unwrap()
            .render(&msgs, true)
            .unwrap(),
        g.chat_template
            .as_ref()
            .unwrap()
            .render(&msgs, true)
            .unwrap()
    );

    // Reference without activation quantization: the GGUF weights dequantized to f32
    // under their GGUF names, so the only differences from the Hugging Face model are
    // the Q/K row order and the RoPE pairing, which must cancel out.
    let reference = dequantized_gguf(&smollm2());
    let pool = ThreadPool::new(2);
    let mut full_matches = 0;
    for (n, prompt) in prompts(&g).iter().enumerate() {
        let quantized = greedy(&g, &pool, prompt, 24);
        let exact = greedy(&reference, &pool, prompt, 24);
        let ours = greedy(&h, &pool, prompt, 24);
        assert_eq!(ours, exact, "prompt {n}: differs from the f32 GGUF weights");

        // Teacher-forced along the quantized model's continuation: the logits of every
        // position match the f32 reference, not just the argmax.
        let mut seq = prompt.clone();
        seq.extend_from_slice(&quantized);
        let (lh, lr) = (
            all_logits(&h, &pool, &seq),
            all_logits(&reference, &pool, &seq),
        );
        let max_diff = lh
            .iter()
            .zip(&lr)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        // Not bit-exact: the HF layout keeps each head's dimensions in a different order,
        // so attention sums q·k in another order, and the f16 K/V cache can turn a
        // last-bit difference into one f16 step. Observed max: 0.014; a wrong
        // permutation gives differences of several units.
        assert!(
            max_diff < 0.05,
            "prompt {n}: logits differ from the f32 reference by {max_diff}"
        );

        // The quantized GGUF model runs Q8 activations, this one f32, so their greedy
        // paths may part where two tokens are nearly tied, but only there: at every
        // position the token the quantized model chose must be within a small margin
        // of the best logit here.
        let v = h.transformer.config.vocab_size;
        for (k, &tok) in quantized.iter().enumerate() {
            let row = &lh[(prompt.len() - 1 + k) * v..][..v];
            let best = row.iter().copied().fold(f32::MIN, f32::max);
            let regret = best - row[tok as usize];
            assert!(
                regret < 1.0,
                "prompt {n}, token {k}: quantized model's choice {tok} is {regret} below the best logit"
            );
        }
        match quantized.iter().zip(&ours).position(|(x, y)| x != y) {
            None => full_matches += 1,
            Some(pos) => println!(
                "prompt {n} ({} tokens): Q8-activation GGUF and f32 HF diverge at generated token {pos}\n  gguf: {:?}\n  hf:   {:?}",
                prompt.len(),
                g.tokenizer.decode(&quantized, false),
                h.tokenizer.decode(&ours, false)
            ),
        }
        assert_eq!(
            quantized[0], ours[0],
            "prompt {n}: first generated token differs"
        );
    }
    println!(
        "{full_matches}/4 prompts: identical 24-token greedy continuations with the quantized GGUF"
    );
}

/// The GGUF model with every tensor dequantized to f32 (same names, shapes and RoPE
/// style), so that matmuls run on f32 activations like the Hugging Face path.
fn dequantized_gguf(path: &Path) -> LoadedModel {
    let g = pagellm_model::gguf::GgufFile::open(path).unwrap();
    let mut set = TensorSet::default();
    for t in g.tensor_set().unwrap().iter() {
        let bytes: Vec<u8> = t.to_f32().iter().flat_map(|v| v.to_le_bytes()).collect();
        let storage = Arc::new(Storage::Owned(bytes));
        set.insert(
            Tensor::new(t.name.clone(), GgmlType::F32, t.shape.clone(), storage, 0).unwrap(),
        );
    }
    let config = pagellm_model::ModelConfig::from_gguf(&g).unwrap();
    LoadedModel {
        transformer: loader::build(config, &set).unwrap(),
        tokenizer: loader::tokenizer_from_gguf(&g).unwrap(),
        chat_template: None,
        source: path.display().to_string(),
    }
}

/// Logits of every position of `seq`, run as one prefill.
fn all_logits(model: &LoadedModel, pool: &ThreadPool, seq: &[u32]) -> Vec<f32> {
    let t = &model.transformer;
    let mut cache = t.new_cache(seq.len());
    let mut ws = Workspace::default();
    t.forward(pool, &mut ws, &mut cache, seq, Logits::All)
        .unwrap()
        .to_vec()
}

#[test]
fn bf16_conversion_generates_like_gguf() {
    let (_tmp, out) = convert(HfDtype::Bf16);
    let config: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["torch_dtype"], "bfloat16");
    let g = loader::load_gguf(&smollm2()).unwrap();
    let h = hf::load_hf_dir(&out).unwrap();
    assert_eq!(h.transformer.token_embd.ty.name(), "BF16");
    let pool = ThreadPool::new(2);
    let prompt = g
        .tokenizer
        .encode("The capital of France is", true, true)
        .unwrap();
    assert_eq!(greedy(&h, &pool, &prompt, 4), greedy(&g, &pool, &prompt, 4));
}

#[test]
fn tokenizer_round_trips() {
    let (_tmp, out) = convert(HfDtype::Bf16);
    let g = loader::load_gguf(&smollm2()).unwrap().tokenizer;
    let h = hf::load_hf_tokenizer(&out).unwrap();
    assert_eq!(h.vocab_size(), g.vocab_size());
    assert_eq!((h.bos_id(), h.eos_id()), (g.bos_id(), g.eos_id()));
    assert_eq!((h.add_bos(), h.add_eos()), (g.add_bos(), g.add_eos()));
    assert_eq!(h.eos_ids(), g.eos_ids());
    assert_eq!(h.chat_template(), g.chat_template());
    let texts = [
        "Hello, world!",
        "  leading and trailing spaces  ",
        "Numbers: 1234567 and 3.14159, dates 2024-07-26.",
        "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
        "Ünïcödé: naïve café, 日本語のテキスト, emoji 🦀🚀",
        "fn main() {\n\tprintln!(\"{}\", 1 + 2);\n}\n",
        "don't won't I'm you're we'll they've she'd",
        "\n\n\nmultiple\n\nnewlines   and\ttabs",
        "<|endoftext|> in the middle <|endoftext|>",
        "",
    ];
    for text in texts {
        for (add_special, parse_special) in [(true, true), (false, false), (true, false)] {
            let a = g.encode(text, add_special, parse_special).unwrap();
            let b = h.encode(text, add_special, parse_special).unwrap();
            assert_eq!(
                a, b,
                "{text:?} (add_special {add_special}, parse_special {parse_special})"
            );
            assert_eq!(g.decode(&a, false), h.decode(&b, false), "{text:?}");
        }
    }
}

// ---- Hand-written checkpoints ----------------------------------------------------

fn tiny_logits(model: &LoadedModel) -> Vec<f32> {
    let pool = ThreadPool::new(2);
    let t = &model.transformer;
    let mut cache = t.new_cache(16);
    let mut ws = Workspace::default();
    t.forward(
        &pool,
        &mut ws,
        &mut cache,
        &[3, 1, 4, 1, 5, 9, 2, 6],
        Logits::All,
    )
    .unwrap()
    .to_vec()
}

#[test]
fn sharded_checkpoint_loads_like_single_file() {
    let tmp = tempfile::tempdir().unwrap();
    let single = tmp.path().join("single");
    write_tiny_model(&single, "Qwen2ForCausalLM", Dtype::F32);
    let model = hf::load_hf_dir(&single).unwrap();
    assert_eq!(model.transformer.config.rope_style, RopeStyle::Neox);
    assert!(!model.transformer.tied_embeddings);
    assert!(model.transformer.layers[1].attn_k_bias.is_some());
    assert_eq!(
        model.tokenizer.eos_id(),
        model.tokenizer.token_to_id("<eos>")
    );
    assert!(model.chat_template.is_some());
    let expected = tiny_logits(&model);
    assert_eq!(expected.len(), 8 * VOCAB);

    // The same tensors split over two shards with an index.
    let sharded = tmp.path().join("sharded");
    write_tiny_model(&sharded, "Qwen2ForCausalLM", Dtype::F32);
    fs::remove_file(sharded.join("model.safetensors")).unwrap();
    let all: Vec<_> = tiny_tensors(true)
        .into_iter()
        .map(|(n, shape, v)| (n, Dtype::F32, shape, bytes_of(&v, Dtype::F32)))
        .collect();
    let (first, second) = all.split_at(all.len() / 2);
    let mut weight_map = serde_json::Map::new();
    for (file, part) in [
        ("model-00001-of-00002.safetensors", first),
        ("model-00002-of-00002.safetensors", second),
    ] {
        write_safetensors(&sharded.join(file), part);
        for t in part {
            weight_map.insert(t.0.clone(), json!(file));
        }
    }
    fs::write(
        sharded.join("model.safetensors.index.json"),
        json!({"metadata": {"total_size": 0}, "weight_map": weight_map}).to_string(),
    )
    .unwrap();
    let model = hf::load_hf_dir(&sharded).unwrap();
    assert_eq!(tiny_logits(&model), expected);
}

#[test]
fn half_precision_checkpoints_load() {
    let tmp = tempfile::tempdir().unwrap();
    let reference = tiny_logits(&{
        write_tiny_model(&tmp.path().join("f32"), "LlamaForCausalLM", Dtype::F32);
        hf::load_hf_dir(&tmp.path().join("f32")).unwrap()
    });
    for dtype in [Dtype::F16, Dtype::BF16] {
        let dir = tmp.path().join(format!("{dtype:?}"));
        write_tiny_model(&dir, "LlamaForCausalLM", dtype);
        let model = hf::load_hf_dir(&dir).unwrap();
        assert_eq!(
            model.transformer.layers[0].ffn_up.ty.name(),
            format!("{dtype:?}")
        );
        let logits = tiny_logits(&model);
        let max_err = logits
            .iter()
            .zip(&reference)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        let scale = reference.iter().map(|x| x.abs()).fold(0f32, f32::max);
        assert!(
            max_err < 0.05 * scale,
            "{dtype:?}: max error {max_err} vs scale {scale}"
        );
    }
}

#[test]
fn tied_embeddings_ignore_lm_head() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("m");
    write_tiny_model(&dir, "LlamaForCausalLM", Dtype::F32);
    let mut cfg = tiny_config("LlamaForCausalLM");
    cfg["tie_word_embeddings"] = json!(true);
    fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    let model = hf::load_hf_dir(&dir).unwrap();
    assert!(model.transformer.tied_embeddings);
    assert_eq!(
        model.transformer.output.to_f32(),
        model.transformer.token_embd.to_f32()
    );
}

// ---- Errors ------------------------------------------------------------------------

fn load_err(dir: &Path) -> (ModelError, String) {
    let err = match hf::load_hf_dir(dir) {
        Ok(_) => panic!("{} loaded but should not have", dir.display()),
        Err(e) => e,
    };
    let msg = err.to_string();
    (err, msg)
}

#[test]
fn missing_files_are_named() {
    let tmp = tempfile::tempdir().unwrap();
    let (_, msg) = load_err(tmp.path());
    assert!(msg.contains("config.json"), "{msg}");

    let dir = tmp.path().join("m");
    write_tiny_model(&dir, "LlamaForCausalLM", Dtype::F32);
    fs::remove_file(dir.join("tokenizer.json")).unwrap();
    let (_, msg) = load_err(&dir);
    assert!(msg.contains("tokenizer.json"), "{msg}");

    write_tiny_tokenizer(&dir);
    fs::remove_file(dir.join("model.safetensors")).unwrap();
    let (_, msg) = load_err(&dir);
    assert!(msg.contains("model.safetensors"), "{msg}");

    fs::write(
        dir.join("model.safetensors.index.json"),
        json!({"weight_map": {"model.norm.weight": "model-00001-of-00002.safetensors"}})
            .to_string(),
    )
    .unwrap();
    let (_, msg) = load_err(&dir);
    assert!(msg.contains("model-00001-of-00002.safetensors"), "{msg}");
}

#[test]
fn bad_config_json() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write_tiny_model(dir, "LlamaForCausalLM", Dtype::F32);

    fs::write(dir.join("config.json"), "{\"hidden_size\": 64,").unwrap();
    let (err, msg) = load_err(dir);
    assert!(matches!(err, ModelError::Config(_)), "{err:?}");
    assert!(
        msg.contains("config.json") && msg.contains("invalid JSON"),
        "{msg}"
    );

    let mut cfg = tiny_config("MambaForCausalLM");
    cfg["model_type"] = json!("mamba");
    fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    let (err, msg) = load_err(dir);
    assert!(matches!(err, ModelError::UnsupportedArch(_)), "{err:?}");
    assert!(msg.contains("MambaForCausalLM"), "{msg}");

    let mut cfg = tiny_config("LlamaForCausalLM");
    cfg.as_object_mut().unwrap().remove("hidden_size");
    fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    let (_, msg) = load_err(dir);
    assert!(
        msg.contains("hidden_size") && msg.contains("config.json"),
        "{msg}"
    );

    // No `architectures`: `model_type` decides.
    let mut cfg = tiny_config("LlamaForCausalLM");
    cfg.as_object_mut().unwrap().remove("architectures");
    cfg["model_type"] = json!("llama");
    fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    hf::load_hf_dir(dir).unwrap();
}

#[test]
fn truncated_safetensors_header() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write_tiny_model(dir, "LlamaForCausalLM", Dtype::F32);
    let path = dir.join("model.safetensors");
    let mut bytes = 1000u64.to_le_bytes().to_vec();
    bytes.extend_from_slice(b"{\"model.norm.weight\": {\"dtype\": \"F32\"");
    fs::write(&path, &bytes).unwrap();
    let (_, msg) = load_err(dir);
    assert!(
        msg.contains("model.safetensors") && msg.contains("truncated"),
        "{msg}"
    );

    fs::write(&path, [1u8, 2, 3]).unwrap();
    let (_, msg) = load_err(dir);
    assert!(
        msg.contains("model.safetensors") && msg.contains("truncated"),
        "{msg}"
    );

    let mut bytes = 4u64.to_le_bytes().to_vec();
    bytes.extend_from_slice(b"{]}x");
    fs::write(&path, &bytes).unwrap();
    let (_, msg) = load_err(dir);
    assert!(msg.contains("invalid safetensors header"), "{msg}");
}

#[test]
fn tensor_data_beyond_end_of_file() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write_tiny_model(dir, "LlamaForCausalLM", Dtype::F32);
    let path = dir.join("model.safetensors");
    let bytes = fs::read(&path).unwrap();
    fs::write(&path, &bytes[..bytes.len() - 16]).unwrap();
    let (_, msg) = load_err(dir);
    assert!(
        msg.contains("beyond the end of the file") && msg.contains("tensor `"),
        "{msg}"
    );
}

#[test]
fn unsupported_dtype_names_the_tensor() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write_tiny_model(dir, "LlamaForCausalLM", Dtype::F32);
    let tensors: Vec<_> = tiny_tensors(false)
        .into_iter()
        .map(|(n, shape, v)| {
            let dtype = if n == "model.norm.weight" {
                Dtype::I64
            } else {
                Dtype::F32
            };
            (n, dtype, shape, bytes_of(&v, dtype))
        })
        .collect();
    write_safetensors(&dir.join("model.safetensors"), &tensors);
    let (err, msg) = load_err(dir);
    assert!(
        matches!(err, ModelError::UnsupportedTensorType { .. }),
        "{err:?}"
    );
    assert!(
        msg.contains("model.norm.weight") && msg.contains("I64"),
        "{msg}"
    );
}

#[test]
fn missing_tensor_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write_tiny_model(dir, "LlamaForCausalLM", Dtype::F32);
    let tensors: Vec<_> = tiny_tensors(false)
        .into_iter()
        .filter(|(n, _, _)| n != "model.layers.1.mlp.up_proj.weight")
        .map(|(n, shape, v)| (n, Dtype::F32, shape, bytes_of(&v, Dtype::F32)))
        .collect();
    write_safetensors(&dir.join("model.safetensors"), &tensors);
    let (err, msg) = load_err(dir);
    assert!(matches!(err, ModelError::MissingTensor { .. }), "{err:?}");
    assert!(msg.contains("model.layers.1.mlp.up_proj.weight"), "{msg}");
}

#[test]
fn convert_refuses_non_empty_output_dir() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    fs::create_dir(&out).unwrap();
    fs::write(out.join("keep.txt"), "precious").unwrap();
    let err = hf::convert_gguf_to_hf(smollm2().to_str().unwrap(), &out, HfDtype::Bf16)
        .unwrap_err()
        .to_string();
    assert!(err.contains("not empty") && err.contains("out"), "{err}");
    assert_eq!(
        fs::read_to_string(out.join("keep.txt")).unwrap(),
        "precious"
    );
    assert_eq!(fs::read_dir(&out).unwrap().count(), 1);
    // Nothing was staged next to it either.
    assert_eq!(fs::read_dir(tmp.path()).unwrap().count(), 1);
}
