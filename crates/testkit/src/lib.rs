//! Test fixtures shared by the workspace's test suites: a tiny Llama/Qwen2-shaped
//! Hugging Face checkpoint (config, safetensors weights with deterministic
//! pseudo-random values, a byte-level BPE tokenizer) written to a directory, so tests
//! can load and serve a real model in milliseconds.

use std::fs;
use std::path::Path;

use safetensors::tensor::TensorView;
use safetensors::Dtype;
use serde_json::json;

pub const D: usize = 64;
pub const HEADS: usize = 4;
pub const KV_HEADS: usize = 2;
pub const FF: usize = 96;
pub const VOCAB: usize = 40;
pub const LAYERS: usize = 2;

pub fn tiny_config(arch: &str) -> serde_json::Value {
    json!({
        "architectures": [arch],
        "hidden_size": D,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "intermediate_size": FF,
        "vocab_size": VOCAB,
        "max_position_embeddings": 128,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": false,
    })
}

/// HF-named tensors of a tiny model with deterministic pseudo-random values.
pub fn tiny_tensors(biases: bool) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    let hd = D / HEADS;
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut values = |n: usize, scale: f32, offset: f32| -> Vec<f32> {
        (0..n)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                offset + scale * ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5)
            })
            .collect()
    };
    let mut out = Vec::new();
    let mut push = |name: String, shape: Vec<usize>, scale: f32, offset: f32| {
        let n = shape.iter().product();
        out.push((name, shape, values(n, scale, offset)));
    };
    push("model.embed_tokens.weight".into(), vec![VOCAB, D], 2.0, 0.0);
    push("lm_head.weight".into(), vec![VOCAB, D], 0.5, 0.0);
    push("model.norm.weight".into(), vec![D], 0.2, 1.0);
    for i in 0..LAYERS {
        let p = |s: &str| format!("model.layers.{i}.{s}");
        push(p("input_layernorm.weight"), vec![D], 0.2, 1.0);
        push(p("post_attention_layernorm.weight"), vec![D], 0.2, 1.0);
        push(p("self_attn.q_proj.weight"), vec![HEADS * hd, D], 0.3, 0.0);
        push(
            p("self_attn.k_proj.weight"),
            vec![KV_HEADS * hd, D],
            0.3,
            0.0,
        );
        push(
            p("self_attn.v_proj.weight"),
            vec![KV_HEADS * hd, D],
            0.3,
            0.0,
        );
        push(p("self_attn.o_proj.weight"), vec![D, HEADS * hd], 0.3, 0.0);
        push(p("mlp.gate_proj.weight"), vec![FF, D], 0.3, 0.0);
        push(p("mlp.up_proj.weight"), vec![FF, D], 0.3, 0.0);
        push(p("mlp.down_proj.weight"), vec![D, FF], 0.3, 0.0);
        if biases {
            push(p("self_attn.q_proj.bias"), vec![HEADS * hd], 0.1, 0.0);
            push(p("self_attn.k_proj.bias"), vec![KV_HEADS * hd], 0.1, 0.0);
            push(p("self_attn.v_proj.bias"), vec![KV_HEADS * hd], 0.1, 0.0);
        }
    }
    // Present in older checkpoints; must be ignored.
    push(
        "model.layers.0.self_attn.rotary_emb.inv_freq".into(),
        vec![hd / 2],
        1.0,
        0.0,
    );
    out
}

pub fn bytes_of(values: &[f32], dtype: Dtype) -> Vec<u8> {
    match dtype {
        Dtype::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        Dtype::F16 => values
            .iter()
            .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
            .collect(),
        Dtype::BF16 => values
            .iter()
            .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
            .collect(),
        Dtype::I64 => values
            .iter()
            .flat_map(|&v| (v as i64).to_le_bytes())
            .collect(),
        other => panic!("no test encoding for {other:?}"),
    }
}

/// Writes `(name, dtype, shape, bytes)` tensors as a safetensors file.
pub fn write_safetensors(path: &Path, tensors: &[(String, Dtype, Vec<usize>, Vec<u8>)]) {
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(n, dt, shape, data)| {
            (
                n.clone(),
                TensorView::new(*dt, shape.clone(), data).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, &None, path).unwrap();
}

/// A BPE `tokenizer.json` of single characters, plus `tokenizer_config.json`.
pub fn write_tiny_tokenizer(dir: &Path) {
    use tokenizers::models::bpe::{Vocab, BPE};
    // 39 characters plus `<eos>`: every id of the model has text.
    let letters = "abcdefghijklmnopqrstuvwxyz 0123456789.,";
    let vocab: Vocab = letters
        .chars()
        .enumerate()
        .map(|(i, c)| (c.to_string(), i as u32))
        .collect();
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, vec![])
        .build()
        .unwrap();
    let mut tok = tokenizers::Tokenizer::new(bpe);
    tok.add_special_tokens(&[tokenizers::AddedToken::from("<eos>", true)]);
    tok.save(dir.join("tokenizer.json"), false).unwrap();
    fs::write(
        dir.join("tokenizer_config.json"),
        json!({"eos_token": "<eos>", "add_bos_token": false, "chat_template": "{{ messages[0].content }}"})
            .to_string(),
    )
    .unwrap();
}

/// A complete tiny model directory with the weights in `dtype`.
pub fn write_tiny_model(dir: &Path, arch: &str, dtype: Dtype) {
    fs::create_dir_all(dir).unwrap();
    fs::write(dir.join("config.json"), tiny_config(arch).to_string()).unwrap();
    let tensors: Vec<_> = tiny_tensors(arch == "Qwen2ForCausalLM")
        .into_iter()
        .map(|(n, shape, v)| (n, dtype, shape, bytes_of(&v, dtype)))
        .collect();
    write_safetensors(&dir.join("model.safetensors"), &tensors);
    write_tiny_tokenizer(dir);
}
