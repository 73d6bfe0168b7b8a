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
