//! The `pagellm` binary end to end, on the real default model (pulled by scripts/test.sh).

use std::process::{Command, Output};

fn pagellm(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pagellm"))
        .args(args)
        .output()
        .expect("run pagellm")
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).expect("stdout is UTF-8")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Runs a command that must fail and returns its error message.
fn fails(args: &[&str]) -> String {
    let o = pagellm(args);
    assert_eq!(
        o.status.code(),
        Some(1),
        "expected failure for {args:?}, stdout: {}",
        stdout(&o)
    );
    let e = stderr(&o);
    assert!(e.starts_with("error: "), "{e}");
    assert!(!e.contains("panicked"), "{e}");
    e
}

#[test]
fn tokenize_prints_llama_cpp_ids() {
    let o = pagellm(&["tokenize", "The capital of France is"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o).trim(), "[504,3575,282,4649,314]");
    // Special tokens are parsed only with --special.
    let plain = stdout(&pagellm(&["tokenize", "<|im_start|>"]));
    let special = stdout(&pagellm(&["tokenize", "--special", "<|im_start|>"]));
    assert_eq!(special.trim(), "[1]");
    assert_ne!(plain.trim(), "[1]");
}

#[test]
fn greedy_generate_streams_text_and_reports_timings() {
    let o = pagellm(&[
        "generate",
        "--prompt",
        "The capital of France is",
        "--temperature",
        "0",
        "-n",
        "8",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).starts_with(" Paris."), "{:?}", stdout(&o));
    let e = stderr(&o);
    for field in [
        "prompt tokens: 5",
        "generated: 8",
        "TTFT",
        "TPOT",
        "tokens/s",
    ] {
        assert!(e.contains(field), "missing {field:?} in {e}");
    }
}

#[test]
fn seeded_sampling_is_reproducible() {
    let run = |seed: &str| {
        let o = pagellm(&[
            "generate",
            "-p",
            "Once upon a time",
            "-n",
            "24",
            "--temperature",
            "1.0",
            "--seed",
            seed,
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        stdout(&o)
    };
    let a = run("42");
    assert_eq!(a, run("42"));
    assert_ne!(a, run("43"));
}

#[test]
fn chat_mode_applies_the_template() {
    let o = pagellm(&[
        "generate",
        "--chat",
        "-p",
        "What is 2+2?",
        "--temperature",
        "0",
        "-n",
        "12",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    // The template adds a system prompt and role markers: far more than the 8 raw tokens.
    let e = stderr(&o);
    let n: usize = e
        .split("prompt tokens: ")
        .nth(1)
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(n > 20, "{e}");
    assert!(!stdout(&o).contains("<|im_start|>"));
}

#[test]
fn models_list_shows_the_registry() {
    let o = pagellm(&["models", "list"]);
    assert!(o.status.success());
    let s = stdout(&o);
    for name in ["smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"] {
        assert!(s.contains(name), "{s}");
    }
    assert!(s
        .lines()
        .any(|l| l.starts_with("smollm2-135m") && l.contains("yes") && l.contains("(default)")));
}

#[test]
fn bad_flags_are_rejected_with_the_flag_named() {
    let base = ["generate", "-p", "hi"];
    for (extra, word) in [
        (&["--temperature=-1"][..], "temperature"),
        (&["--top-p", "1.5"], "top_p"),
        (&["--min-p", "2"], "min_p"),
        (&["--repetition-penalty", "0"], "repetition_penalty"),
        (&["--max-tokens", "0"], "max-tokens"),
    ] {
        let args: Vec<&str> = base.iter().chain(extra).copied().collect();
        let e = fails(&args);
        assert!(e.contains(word), "{args:?}: {e}");
    }
    // clap's own errors (exit code 2) for malformed numbers.
    let o = pagellm(&["generate", "-p", "hi", "--temperature", "warm"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--temperature"));
}

#[test]
fn a_misspelt_kernel_setting_is_an_error_not_ignored() {
    let o = Command::new(env!("CARGO_BIN_EXE_pagellm"))
        .args(["tokenize", "hi"])
        .env("PAGELLM_SIMD", "avx512")
        .output()
        .expect("run pagellm");
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(
        e.contains("PAGELLM_SIMD=avx512") && e.contains("reference"),
        "{e}"
    );
    let o = Command::new(env!("CARGO_BIN_EXE_pagellm"))
        .args(["tokenize", "hi"])
        .env("PAGELLM_SIMD", "Reference")
        .output()
        .expect("run pagellm");
    assert!(o.status.success(), "{}", stderr(&o));
    let o = Command::new(env!("CARGO_BIN_EXE_pagellm"))
        .args(["tokenize", "hi"])
        .env("PAGELLM_REPACK", "no")
        .output()
        .expect("run pagellm");
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("PAGELLM_REPACK=no"), "{}", stderr(&o));
}

#[test]
fn bad_models_are_rejected_clearly() {
    let e = fails(&["generate", "-p", "hi", "--model", "no-such-model"]);
    assert!(
        e.contains("no-such-model") && e.contains("smollm2-135m"),
        "{e}"
    );
    let e = fails(&[
        "generate",
        "-p",
        "hi",
        "--model",
        "/nonexistent/dir/model.gguf",
    ]);
    assert!(e.contains("/nonexistent/dir/model.gguf"), "{e}");

    let dir = tempfile::tempdir().unwrap();
    let not_gguf = dir.path().join("notes.gguf");
    std::fs::write(&not_gguf, b"this is not a model").unwrap();
    let e = fails(&[
        "generate",
        "-p",
        "hi",
        "--model",
        not_gguf.to_str().unwrap(),
    ]);
    assert!(e.contains("notes.gguf") && e.contains("GGUF"), "{e}");

    // A real model cut short: the tensor data runs past the end of the file.
    let real = pagellm_model::registry::pull("smollm2-135m", false).unwrap();
    let bytes = std::fs::read(real).unwrap();
    let truncated = dir.path().join("truncated.gguf");
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    let e = fails(&[
        "generate",
        "-p",
        "hi",
        "--model",
        truncated.to_str().unwrap(),
    ]);
    assert!(e.contains("truncated.gguf"), "{e}");
    assert!(
        e.contains("past end of file") || e.contains("outside"),
        "{e}"
    );
}

#[test]
fn convert_refuses_a_non_empty_directory() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("keep.txt"), b"x").unwrap();
    let e = fails(&[
        "convert",
        "--to",
        "hf",
        "smollm2-135m",
        dir.path().to_str().unwrap(),
    ]);
    assert!(e.contains("not empty") || e.contains("non-empty"), "{e}");
    assert!(dir.path().join("keep.txt").exists());
}

#[test]
fn generate_stops_at_a_stop_string() {
    let o = pagellm(&[
        "generate",
        "--prompt",
        "The capital of France is",
        "--temperature",
        "0",
        "-n",
        "24",
        "--stop",
        "United",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.starts_with(" Paris."), "{out:?}");
    assert!(!out.contains("United"), "{out:?}");
    assert!(stderr(&o).contains("finish: stop"), "{}", stderr(&o));
}

#[test]
fn bench_throughput_reports_and_writes_json() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("t.json");
    let o = pagellm(&[
        "bench",
        "throughput",
        "--num-prompts",
        "6",
        "--input-len",
        "20",
        "--output-len",
        "5",
        "--random-range-ratio",
        "0.5",
        "--quiet",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("output tokens/s"), "{out}");
    assert!(
        out.contains("KV slots used by tokens / slots allocated"),
        "{out}"
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["num_prompts"], 6);
    for k in [
        "elapsed_s",
        "requests_per_s",
        "output_tokens_per_s",
        "total_tokens_per_s",
    ] {
        assert!(v[k].as_f64().unwrap() > 0.0, "{k}: {v}");
    }
    // Output lengths were drawn from [3, 8]: the total is within 6*3..=6*8.
    let n = v["output_tokens"].as_u64().unwrap();
    assert!((18..=48).contains(&n), "{n}");
    let rps = v["requests_per_s"].as_f64().unwrap();
    let elapsed = v["elapsed_s"].as_f64().unwrap();
    assert!((rps * elapsed - 6.0).abs() < 1e-6);
}

#[test]
fn bad_engine_flags_are_rejected_with_the_flag_named() {
    for (args, word) in [
        (
            &["generate", "-p", "hi", "--kv-cache-memory", "lots"][..],
            "lots",
        ),
        (
            &["generate", "-p", "hi", "--kv-cache-dtype", "int3"],
            "int3",
        ),
        (
            &["generate", "-p", "hi", "--scheduling-policy", "random"],
            "random",
        ),
    ] {
        let o = pagellm(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        assert!(stderr(&o).contains(word), "{args:?}: {}", stderr(&o));
    }
    let e = fails(&["generate", "-p", "hi", "--kv-cache-memory", "1MiB"]);
    assert!(e.contains("--kv-cache-memory"), "{e}");
    let e = fails(&["generate", "-p", "hi", "--max-num-seqs", "0"]);
    assert!(e.contains("--max-num-seqs"), "{e}");
    let e = fails(&["bench", "throughput", "--num-prompts", "0"]);
    assert!(e.contains("--num-prompts"), "{e}");
}
