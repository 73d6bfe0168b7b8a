//! `pagellm quantize` end to end on the tiny test checkpoint: every method writes its
//! standard format, the reader loads it back to exactly the weights the quantizer
//! made, the quantized model stays close to the float one, and bad options or
//! checkpoints get errors naming the problem.

use std::path::Path;

use pagellm_kernels::pool::ThreadPool;
use pagellm_model::loader::load_model;
use pagellm_model::{KvDtype, Logits, Workspace};
use pagellm_quant::calib::CalibOptions;
use pagellm_quant::quantize::{quantize_model, Method, QuantizeOptions};
use safetensors::Dtype;

fn opts(method: Method, group_size: usize, zero_point: bool) -> QuantizeOptions {
    QuantizeOptions {
        method,
        group_size,
        zero_point,
        per_tensor: false,
        calib: None,
        awq_search_tokens: 256,
        act_order: false,
        damp: 0.01,
        smooth_alpha: None,
        threads: 2,
    }
}

fn logits(dir: &Path, tokens: &[u32]) -> Vec<f32> {
    let m = load_model(dir.to_str().unwrap()).unwrap();
    let pool = ThreadPool::new(2);
    let mut ws = Workspace::default();
    let mut cache = m.transformer.new_cache(64);
    m.transformer
        .forward(&pool, &mut ws, &mut cache, tokens, Logits::All)
        .unwrap()
        .to_vec()
}

fn calib_text() -> String {
    // Byte-level tokens of the tiny tokenizer: any ASCII text calibrates.
    "the quick brown fox jumps over the lazy dog; ".repeat(40)
}

#[test]
fn every_method_round_trips_and_stays_close() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    pagellm_testkit::write_tiny_model(&src, "Qwen2ForCausalLM", Dtype::F32);
    let model = load_model(src.to_str().unwrap()).unwrap();
    let tokens: Vec<u32> = (0..24).map(|i| (i * 7 % 37) as u32).collect();
    let want = logits(&src, &tokens);
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    let calibrated = |method, zero_point, act_order| {
        let mut o = opts(method, 32, zero_point);
        o.calib = Some(CalibOptions {
            text: calib_text(),
            source: "test".into(),
            samples: 4,
            seq_len: 32,
        });
        o.act_order = act_order;
        o
    };
    for (name, o, tol) in [
        ("int8", opts(Method::Int8, 128, false), 0.02),
        ("w8a8", opts(Method::W8a8, 128, false), 0.05),
        ("fp8", opts(Method::Fp8, 128, false), 0.08),
        ("rtn", opts(Method::Rtn, 32, false), 0.3),
        ("rtn-zp", opts(Method::Rtn, 32, true), 0.3),
        ("awq", calibrated(Method::Awq, true, false), 0.3),
        ("gptq", calibrated(Method::Gptq, false, false), 0.3),
        ("gptq-act-zp", calibrated(Method::Gptq, true, true), 0.3),
        (
            "w8a8-smooth",
            QuantizeOptions {
                smooth_alpha: Some(0.5),
                ..calibrated(Method::W8a8, false, false)
            },
            0.05,
        ),
    ] {
        let out = tmp.path().join(name);
        let summary = quantize_model(&model, &o, &out, |_, _| {}).unwrap();
        assert_eq!(summary.linear_layers, 2 * 7, "{name}");
        let config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap())
                .unwrap();
        let qc = &config["quantization_config"];
        let want_method = match o.method {
            Method::Awq => "awq",
            Method::Gptq => "gptq",
            _ => "compressed-tensors",
        };
        assert_eq!(qc["quant_method"], want_method, "{name}");
        if o.method == Method::Gptq {
            assert_eq!(qc["desc_act"], o.act_order, "{name}");
            assert_eq!(qc["sym"], !o.zero_point, "{name}");
        }
        let q = load_model(out.to_str().unwrap()).unwrap();
        let l = &q.transformer.layers[0];
        assert!(l.ffn_down.ty.has_params(), "{name}: {:?}", l.ffn_down.ty);
        let p = l.ffn_down.params().unwrap();
        assert_eq!(p.perm.is_some(), o.act_order, "{name}");
        assert_eq!(p.zeros.is_some(), o.zero_point, "{name}");
        // The loaded weight is exactly what the quantizer produced (formats round-trip),
        // for the methods without calibration: quantizing the float weight again.
        if !matches!(o.method, Method::Awq | Method::Gptq) && o.smooth_alpha.is_none() {
            let w = model.transformer.layers[0].ffn_down.to_f32();
            let (rows, cols) = (l.ffn_down.rows(), l.ffn_down.cols());
            let again = pagellm_quant::quantize::quantize_matrix(&w, rows, cols, &o).unwrap();
            let mut deq = vec![0f32; cols];
            for r in 0..rows {
                l.ffn_down.dequantize_row(r, &mut deq);
                let rb = again.ty.row_bytes(cols).unwrap();
                let mut want_row = vec![0f32; cols];
                pagellm_kernels::quant::wq::dequantize_row_wq(
                    again.ty,
                    &again.params,
                    r,
                    &again.data[r * rb..(r + 1) * rb],
                    &mut want_row,
                );
                assert_eq!(deq, want_row, "{name}: row {r}");
            }
        }
        let got = logits(&out, &tokens);
        let worst = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(
            worst <= tol * scale,
            "{name}: logits differ by {worst} (scale {scale})"
        );
        assert!(worst > 0.0, "{name}: quantization changed nothing");
    }
}

#[test]
fn bad_options_are_refused_with_the_flag_named() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    pagellm_testkit::write_tiny_model(&src, "LlamaForCausalLM", Dtype::F32);
    let model = load_model(src.to_str().unwrap()).unwrap();
    // The tiny model's width is 64: group 128 does not divide it.
    let e = quantize_model(
        &model,
        &opts(Method::Rtn, 128, false),
        &tmp.path().join("a"),
        |_, _| {},
    )
    .unwrap_err()
    .to_string();
    // (96, the intermediate size, rules out 64 too.)
    assert!(
        e.contains("--group-size 128") && e.contains("try --group-size 32"),
        "{e}"
    );
    let e = quantize_model(
        &model,
        &opts(Method::Rtn, 48, false),
        &tmp.path().join("b"),
        |_, _| {},
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("multiple of 32"), "{e}");
    let e = quantize_model(
        &model,
        &opts(Method::Awq, 32, true),
        &tmp.path().join("c"),
        |_, _| {},
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("--calib"), "{e}");
    let mut smooth = opts(Method::Int8, 32, false);
    smooth.smooth_alpha = Some(0.5);
    let e = quantize_model(&model, &smooth, &tmp.path().join("c"), |_, _| {})
        .unwrap_err()
        .to_string();
    assert!(e.contains("--smooth-alpha applies to --method w8a8"), "{e}");
    let mut act = opts(Method::Rtn, 32, false);
    act.act_order = true;
    let e = quantize_model(&model, &act, &tmp.path().join("c"), |_, _| {})
        .unwrap_err()
        .to_string();
    assert!(e.contains("--act-order applies to --method gptq"), "{e}");
    let mut short = opts(Method::Awq, 32, true);
    short.calib = Some(CalibOptions {
        text: "too short".into(),
        source: "short.txt".into(),
        samples: 32,
        seq_len: 64,
    });
    let e = quantize_model(&model, &short, &tmp.path().join("d"), |_, _| {})
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("short.txt") && e.contains("--calib-samples 32"),
        "{e}"
    );
    let mut none = opts(Method::Awq, 32, true);
    none.calib = Some(CalibOptions {
        text: calib_text(),
        source: "test".into(),
        samples: 4,
        seq_len: 32,
    });
    none.awq_search_tokens = 0;
    let e = quantize_model(&model, &none, &tmp.path().join("d"), |_, _| {})
        .unwrap_err()
        .to_string();
    assert!(e.contains("--awq-search-tokens 0"), "{e}");
    let mut long = short.clone();
    long.calib.as_mut().unwrap().seq_len = 512;
    let e = quantize_model(&model, &long, &tmp.path().join("d"), |_, _| {})
        .unwrap_err()
        .to_string();
    assert!(e.contains("--calib-seq-len 512"), "{e}");
    for d in ["a", "b", "c", "d"] {
        assert!(
            !tmp.path().join(d).exists(),
            "nothing written for a refused run"
        );
    }
}

/// Tensors of a safetensors file: name, dtype, shape, bytes.
type Tensors = Vec<(String, Dtype, Vec<usize>, Vec<u8>)>;
/// A change made to a checkpoint's tensors and config.
type Edit = dyn Fn(&mut Tensors, &mut serde_json::Value);

/// Rewrites `dir`'s weights with `edit` applied to the tensor list and the config.
fn edit_checkpoint(dir: &Path, edit: impl FnOnce(&mut Tensors, &mut serde_json::Value)) {
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<_> = st
        .tensors()
        .into_iter()
        .map(|(n, v)| (n, v.dtype(), v.shape().to_vec(), v.data().to_vec()))
        .collect();
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    edit(&mut tensors, &mut config);
    pagellm_testkit::write_safetensors(&dir.join("model.safetensors"), &tensors);
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
}

#[test]
fn bad_checkpoints_name_the_tensor_or_field() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    pagellm_testkit::write_tiny_model(&src, "Qwen2ForCausalLM", Dtype::F32);
    let model = load_model(src.to_str().unwrap()).unwrap();
    let cases: Vec<(&str, Method, Box<Edit>, &str)> = vec![
        (
            "missing-scale",
            Method::Rtn,
            Box::new(|t, _| t.retain(|x| x.0 != "model.layers.1.mlp.up_proj.weight_scale")),
            "model.layers.1.mlp.up_proj.weight_scale",
        ),
        (
            "wrong-shape",
            Method::Rtn,
            Box::new(|t, _| {
                let x = t
                    .iter_mut()
                    .find(|x| x.0 == "model.layers.0.self_attn.o_proj.weight_packed")
                    .unwrap();
                x.2 = vec![x.2[0] / 2, x.2[1] * 2];
            }),
            "model.layers.0.self_attn.o_proj.weight_packed",
        ),
        (
            "scale-groups",
            Method::Rtn,
            Box::new(|t, _| {
                let x = t
                    .iter_mut()
                    .find(|x| x.0 == "model.layers.0.mlp.down_proj.weight_scale")
                    .unwrap();
                // [64 rows, 3 groups] read as [32, 6]: scales for the wrong rows.
                x.2 = vec![32, 6];
            }),
            "model.layers.0.mlp.down_proj.weight_scale",
        ),
        (
            "bits",
            Method::Rtn,
            Box::new(|_, c| {
                c["quantization_config"]["config_groups"]["group_0"]["weights"]["num_bits"] =
                    3.into()
            }),
            "3-bit",
        ),
        (
            "act-order",
            Method::Rtn,
            Box::new(|_, c| {
                c["quantization_config"]["config_groups"]["group_0"]["weights"]["actorder"] =
                    "group".into()
            }),
            "actorder",
        ),
        (
            "missing-zero-point",
            Method::Rtn,
            Box::new(|_, c| {
                c["quantization_config"]["config_groups"]["group_0"]["weights"]["symmetric"] =
                    false.into()
            }),
            "weight_zero_point",
        ),
        (
            "int8-dtype",
            Method::W8a8,
            Box::new(|t, _| {
                let x = t
                    .iter_mut()
                    .find(|x| x.0 == "model.layers.0.mlp.gate_proj.weight")
                    .unwrap();
                x.1 = Dtype::U8;
            }),
            "model.layers.0.mlp.gate_proj.weight",
        ),
    ];
    let tensor = |t: &mut Tensors, name: &str| t.iter().position(|x| x.0 == name).unwrap();
    let packed: Vec<(&str, Method, Box<Edit>, &str)> = vec![
        (
            "awq-missing-scales",
            Method::Awq,
            Box::new(|t, _| t.retain(|x| x.0 != "model.layers.1.mlp.up_proj.scales")),
            "model.layers.1.mlp.up_proj.scales",
        ),
        (
            "awq-wrong-zeros",
            Method::Awq,
            Box::new(move |t, _| {
                let i = tensor(t, "model.layers.0.mlp.gate_proj.qzeros");
                t[i].2 = vec![t[i].2[0] * 2, t[i].2[1] / 2];
            }),
            "model.layers.0.mlp.gate_proj.qzeros",
        ),
        (
            "awq-version",
            Method::Awq,
            Box::new(|_, c| c["quantization_config"]["version"] = "gemv".into()),
            "awq version `gemv`",
        ),
        (
            "gptq-bits",
            Method::Gptq,
            Box::new(|_, c| c["quantization_config"]["bits"] = 3.into()),
            "`bits` Some(3)",
        ),
        (
            "gptq-group-size",
            Method::Gptq,
            Box::new(|_, c| c["quantization_config"]["group_size"] = 64.into()),
            "but group_size is 64",
        ),
        (
            "gptq-act-order-without-g-idx",
            Method::Gptq,
            Box::new(|t, c| {
                c["quantization_config"]["desc_act"] = true.into();
                t.retain(|x| x.0 != "model.layers.0.self_attn.k_proj.g_idx");
            }),
            "model.layers.0.self_attn.k_proj.g_idx",
        ),
        (
            "gptq-uneven-g-idx",
            Method::Gptq,
            Box::new(move |t, _| {
                let i = tensor(t, "model.layers.1.mlp.down_proj.g_idx");
                // Input 0 moved to group 1: group 0 is one short.
                t[i].3[..4].copy_from_slice(&1i32.to_le_bytes());
            }),
            "group 0 does not hold exactly 32 inputs",
        ),
    ];
    for (name, method, edit, needle) in cases.into_iter().chain(packed) {
        let dir = tmp.path().join(name);
        let mut o = opts(method, 32, false);
        if matches!(method, Method::Awq | Method::Gptq) {
            o.calib = Some(CalibOptions {
                text: calib_text(),
                source: "test".into(),
                samples: 2,
                seq_len: 32,
            });
        }
        quantize_model(&model, &o, &dir, |_, _| {}).unwrap();
        edit_checkpoint(&dir, |t, c| edit(t, c));
        let e = match load_model(dir.to_str().unwrap()) {
            Ok(_) => panic!("{name}: a broken checkpoint loaded"),
            Err(e) => e.to_string(),
        };
        assert!(e.contains(needle), "{name}: `{e}` does not name `{needle}`");
    }
}

#[test]
fn perplexity_and_kl_against_a_base() {
    use pagellm_kernels::cpu::Numerics;
    use pagellm_quant::eval::{chunks, evaluate, Base, EvalConfig, KldBaseWriter};
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    pagellm_testkit::write_tiny_model(&src, "Qwen2ForCausalLM", Dtype::F32);
    let model = load_model(src.to_str().unwrap()).unwrap();
    let q = tmp.path().join("rtn");
    quantize_model(&model, &opts(Method::Rtn, 32, false), &q, |_, _| {}).unwrap();
    let qm = load_model(q.to_str().unwrap()).unwrap();
    let pool = ThreadPool::new(2);
    let cfg = EvalConfig {
        ctx: 32,
        max_chunks: Some(3),
    };
    let text = calib_text();
    let c = chunks(&model, &text, &cfg).unwrap();
    assert_eq!(c.len(), 3);
    let fast = |model| {
        Some(Base {
            model,
            numerics: Numerics::Fast,
        })
    };
    let same = evaluate(
        &model,
        fast(&model),
        &pool,
        &c,
        KvDtype::F16,
        None,
        |_, _| {},
    )
    .unwrap();
    let kl = same.kl.as_ref().unwrap();
    assert_eq!(same.scored_tokens, 3 * (32 - 1 - 16));
    assert_eq!(kl.mean.mean, 0.0);
    assert_eq!(kl.top1_agreement.mean, 1.0);
    assert!((kl.base_ppl - same.ppl.mean).abs() < 1e-9);
    let other = evaluate(&qm, fast(&model), &pool, &c, KvDtype::F16, None, |_, _| {}).unwrap();
    let kl = other.kl.as_ref().unwrap();
    assert!(kl.mean.mean > 0.0 && kl.p99 >= kl.median && kl.max >= kl.p99);
    // Against its own float reference path: the fast kernels' cost, small but not zero
    // (the INT4 model's activations are quantized to 8 bits on the fast path only).
    let reference = Some(Base {
        model: &qm,
        numerics: Numerics::Reference,
    });
    let kld_path = tmp.path().join("base.kld");
    let vocab = qm.transformer.config.vocab_size;
    let mut w = KldBaseWriter::create(&kld_path, &c, vocab).unwrap();
    let own = evaluate(
        &qm,
        reference,
        &pool,
        &c,
        KvDtype::F16,
        Some(&mut w),
        |_, _| {},
    )
    .unwrap();
    w.finish().unwrap();
    // The file as llama-perplexity reads it: header, tokens, then per scored position
    // two f32 (step, smallest log-probability) and the 16-bit codes, padded to even.
    let bytes = std::fs::read(&kld_path).unwrap();
    let word = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().unwrap());
    assert_eq!(&bytes[..8], b"_logits_");
    assert_eq!((word(8), word(12), word(16)), (32, vocab as u32, 3));
    let tokens: Vec<u32> = (0..3 * 32).map(|k| word(20 + 4 * k)).collect();
    assert_eq!(tokens, c.concat());
    let nv = 2 * vocab.div_ceil(2) + 4;
    let rows = 3 * (32 - 1 - 16);
    let start = 20 + 4 * 3 * 32;
    assert_eq!(bytes.len(), start + rows * nv * 2);
    for row in bytes[start..].chunks_exact(nv * 2) {
        let f = |k: usize| f32::from_le_bytes(row[4 * k..4 * k + 4].try_into().unwrap());
        let (step, min) = (f(0), f(1));
        let lp: Vec<f64> = row[8..8 + 2 * vocab]
            .chunks_exact(2)
            .map(|b| (min + step * u16::from_le_bytes([b[0], b[1]]) as f32) as f64)
            .collect();
        let mass: f64 = lp.iter().map(|v| v.exp()).sum();
        assert!(
            (mass - 1.0).abs() < 1e-2,
            "decoded probabilities sum to {mass}"
        );
    }
    let own_kl = own.kl.as_ref().unwrap();
    assert!(
        own_kl.mean.mean > 0.0 && own_kl.mean.mean < kl.mean.mean,
        "fast vs reference {} not between 0 and the quantization's {}",
        own_kl.mean.mean,
        kl.mean.mean
    );
    assert!(other.ppl.mean.is_finite() && other.ppl.stderr > 0.0);
    let e = chunks(&model, "short", &cfg).unwrap_err().to_string();
    assert!(e.contains("fewer than one chunk"), "{e}");
    let e = chunks(
        &model,
        &text,
        &EvalConfig {
            ctx: 4096,
            max_chunks: None,
        },
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("context window"), "{e}");
}
