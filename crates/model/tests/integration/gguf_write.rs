//! `convert --to gguf`: a model written as GGUF loads back with the same tokenizer and
//! the same logits, for both architectures (llama's Q/K rows permuted into GGUF's
//! interleaved order and back through its RoPE). Runs on the pulled registry models,
//! through their BF16 Hugging Face conversion: the reference pagellm evaluates and
//! llama.cpp's tools then work on.

use pagellm_kernels::pool::ThreadPool;
use pagellm_model::gguf::write::{write_gguf, GgufDtype};
use pagellm_model::gguf::GgufFile;
use pagellm_model::hf::{convert_gguf_to_hf, HfDtype};
use pagellm_model::loader::{load_model, LoadedModel};
use pagellm_model::{Logits, Workspace};
use safetensors::Dtype;

fn logits(m: &LoadedModel, tokens: &[u32]) -> Vec<f32> {
    let pool = ThreadPool::new(2);
    let mut ws = Workspace::default();
    let mut cache = m.transformer.new_cache(64);
    m.transformer
        .forward(&pool, &mut ws, &mut cache, tokens, Logits::All)
        .unwrap()
        .to_vec()
}

#[test]
fn gguf_round_trip_keeps_tokenizer_and_logits() {
    let tmp = tempfile::tempdir().unwrap();
    for name in ["smollm2-135m", "qwen2.5-coder-0.5b"] {
        let hf = tmp.path().join(name);
        convert_gguf_to_hf(name, &hf, HfDtype::Bf16).unwrap();
        let m = load_model(hf.to_str().unwrap()).unwrap();
        let out = tmp.path().join(format!("{name}.gguf"));
        write_gguf(&m, &out, GgufDtype::Bf16, None).unwrap();
        let e = write_gguf(&m, &out, GgufDtype::Bf16, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("refusing to overwrite"), "{e}");
        let g = GgufFile::open(&out).unwrap();
        assert_eq!(g.get_u32("general.file_type").unwrap(), 32, "{name}");
        let back = load_model(out.to_str().unwrap()).unwrap();
        let text = "def add(a, b):\n    return a + b  # Ünïcödé, 12345 <|im_start|>";
        for special in [false, true] {
            assert_eq!(
                back.tokenizer.encode(text, true, special).unwrap(),
                m.tokenizer.encode(text, true, special).unwrap(),
                "{name}"
            );
        }
        let (c, d) = (&m.transformer.config, &back.transformer.config);
        assert_eq!(
            (
                c.n_layers,
                c.d_model,
                c.n_heads,
                c.n_kv_heads,
                c.d_ff,
                c.vocab_size
            ),
            (
                d.n_layers,
                d.d_model,
                d.n_heads,
                d.n_kv_heads,
                d.d_ff,
                d.vocab_size
            ),
            "{name}"
        );
        assert_eq!(
            (c.context_length, c.rms_eps, c.rope_theta),
            (d.context_length, d.rms_eps, d.rope_theta),
            "{name}"
        );
        let tokens = m.tokenizer.encode(text, true, false).unwrap();
        let (a, b) = (logits(&m, &tokens), logits(&back, &tokens));
        let scale = a.iter().fold(0f32, |m, v| m.max(v.abs()));
        let worst = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        assert!(
            worst <= 1e-3 * scale,
            "{name}: logits differ by {worst} (scale {scale})"
        );
        std::fs::remove_dir_all(&hf).unwrap();
        std::fs::remove_file(&out).unwrap();
    }
}

#[test]
fn tokenizers_gguf_cannot_hold_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    // The tiny test tokenizer is character-level, not byte-level BPE.
    pagellm_testkit::write_tiny_model(tmp.path(), "Qwen2ForCausalLM", Dtype::F32);
    let m = load_model(tmp.path().to_str().unwrap()).unwrap();
    let out = tmp.path().join("x.gguf");
    let e = write_gguf(&m, &out, GgufDtype::F32, None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("byte-level"), "{e}");
    assert!(!out.exists());
}
