//! Tokenizer and chat-template tests against llama.cpp's output.
//!
//! The goldens in `tests/golden/` were produced by `scripts/make_goldens.py` with
//! llama-cpp-python 0.3.36 from the same GGUF files the registry serves, so every id
//! list here is what llama.cpp's `llama_tokenize` returns. The models are read from the
//! registry cache (`registry::pull` returns at once when they are present).

use std::path::PathBuf;
use std::sync::OnceLock;

use pagellm_model::chat::{ChatMessage, ChatTemplate};
use pagellm_model::gguf::GgufFile;
use pagellm_model::registry;
use pagellm_model::tokenizer::{GgufTokenizerData, StreamDecoder, Tokenizer};
use serde_json::Value;

const SMOLLM: &str = "smollm2-135m";
const QWEN: &str = "qwen2.5-coder-0.5b";

fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden")
}

fn read_golden(file: &str) -> Value {
    let path = golden_dir().join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (regenerate with scripts/make_goldens.py)",
            path.display()
        )
    });
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("id list")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

/// The `tokenizer.ggml.*` keys of a GGUF file, as the model loader reads them.
fn gguf_tokenizer_data(g: &GgufFile) -> GgufTokenizerData {
    let opt_str = |k: &str| g.get(k).map(|_| g.get_str(k).unwrap().to_string());
    let opt_u32 = |k: &str| g.get(k).map(|_| g.get_u32(k).unwrap());
    let opt_bool = |k: &str| g.get(k).is_some_and(|_| g.get_bool(k).unwrap());
    let strings = |k: &str| -> Vec<String> {
        match g.get(k) {
            Some(_) => g
                .get_str_array(k)
                .unwrap()
                .into_iter()
                .map(str::to_string)
                .collect(),
            None => Vec::new(),
        }
    };
    GgufTokenizerData {
        model: g.get_str("tokenizer.ggml.model").unwrap().to_string(),
        pre: opt_str("tokenizer.ggml.pre"),
        tokens: strings("tokenizer.ggml.tokens"),
        token_types: match g.get("tokenizer.ggml.token_type") {
            Some(_) => g.get_i32_array("tokenizer.ggml.token_type").unwrap(),
            None => Vec::new(),
        },
        merges: strings("tokenizer.ggml.merges"),
        bos_id: opt_u32("tokenizer.ggml.bos_token_id"),
        eos_id: opt_u32("tokenizer.ggml.eos_token_id"),
        add_bos: opt_bool("tokenizer.ggml.add_bos_token"),
        add_eos: opt_bool("tokenizer.ggml.add_eos_token"),
        chat_template: opt_str("tokenizer.chat_template"),
    }
}

fn load(name: &str) -> Tokenizer {
    let path = registry::pull(name, false)
        .unwrap_or_else(|e| panic!("model {name} is not available: {e}"));
    let g = GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Tokenizer::from_gguf_data(gguf_tokenizer_data(&g)).expect("tokenizer builds")
}

/// Building a 150k-token vocabulary takes a moment; share one per model.
fn tokenizer(name: &str) -> &'static Tokenizer {
    static SMOL: OnceLock<Tokenizer> = OnceLock::new();
    static QW: OnceLock<Tokenizer> = OnceLock::new();
    match name {
        SMOLLM => SMOL.get_or_init(|| load(SMOLLM)),
        QWEN => QW.get_or_init(|| load(QWEN)),
        _ => unreachable!("{name}"),
    }
}

/// Compares every golden string in both parse_special modes and returns how many of
/// the strings matched in both; panics listing all mismatches.
fn check_tokenize_goldens(tok: &Tokenizer, name: &str) -> usize {
    let g = read_golden(&format!("tokenize_{name}.json"));
    let cases = g["cases"].as_array().expect("cases");
    assert!(cases.len() >= 60, "only {} golden strings", cases.len());
    let mut failures = Vec::new();
    let mut matched = 0;
    for c in cases {
        let text = c["text"].as_str().unwrap();
        let mut ok = true;
        for (key, add_special, parse_special) in [
            ("ids_plain", false, false),
            ("ids_special", false, true),
            ("ids_special_add_special", true, true),
        ] {
            let want = ids(&c[key]);
            let got = tok.encode(text, add_special, parse_special).unwrap();
            if got != want {
                ok = false;
                failures.push(format!(
                    "{name} {text:?} (add_special={add_special}, parse_special={parse_special})\n  \
                     llama.cpp: {want:?}\n  pagellm:   {got:?}"
                ));
            }
        }
        matched += usize::from(ok);
    }
    assert!(
        failures.is_empty(),
        "{} of {} strings differ from llama.cpp:\n{}",
        cases.len() - matched,
        cases.len(),
        failures.join("\n")
    );
    eprintln!(
        "{name}: {matched}/{} golden strings identical to llama.cpp",
        cases.len()
    );
    matched
}

fn check_vocab_facts(tok: &Tokenizer, name: &str) {
    let g = read_golden(&format!("tokenize_{name}.json"));
    let v = &g["vocab"];
    assert_eq!(
        tok.vocab_size() as u64,
        v["n_vocab"].as_u64().unwrap(),
        "n_vocab"
    );
    assert_eq!(tok.bos_id().map(u64::from), v["bos_id"].as_u64(), "bos");
    assert_eq!(tok.eos_id().map(u64::from), v["eos_id"].as_u64(), "eos");
    assert_eq!(tok.add_bos(), v["add_bos"].as_bool().unwrap(), "add_bos");
    assert_eq!(
        tok.eos_ids(),
        ids(&v["eog_ids"]).as_slice(),
        "end-of-generation set"
    );
    for id in ids(&v["eog_ids"]) {
        assert!(tok.is_eog(id));
    }
}

/// llama.cpp's detokenization of the golden ids, and decode(encode(s)) == s.
fn check_decode(tok: &Tokenizer, name: &str) {
    let g = read_golden(&format!("tokenize_{name}.json"));
    for c in g["cases"].as_array().unwrap() {
        let text = c["text"].as_str().unwrap();
        if let Some(want) = c["detok_plain"].as_str() {
            assert_eq!(tok.decode(&ids(&c["ids_plain"]), true), want, "{text:?}");
        }
        if let Some(want) = c["detok_special_render"].as_str() {
            assert_eq!(tok.decode(&ids(&c["ids_special"]), false), want, "{text:?}");
        }
        let plain = tok.encode(text, false, false).unwrap();
        assert_eq!(
            tok.decode(&plain, false),
            text,
            "round trip without specials"
        );
        let special = tok.encode(text, false, true).unwrap();
        assert_eq!(
            tok.decode(&special, false),
            text,
            "round trip with specials"
        );
    }
}

/// The prompts of the generation goldens must tokenize exactly as llama.cpp did, or
/// the generated ids cannot be compared.
fn check_generate_prompts(tok: &Tokenizer, name: &str) {
    let g = read_golden(&format!("generate_{name}.json"));
    let prompts = g["prompts"].as_array().unwrap();
    assert!(prompts.len() >= 22);
    for p in prompts {
        let prompt = p["prompt"].as_str().unwrap();
        assert_eq!(
            tok.encode(prompt, true, true).unwrap(),
            ids(&p["prompt_ids"]),
            "{name} prompt {prompt:?}"
        );
        assert_eq!(p["generated_ids"].as_array().unwrap().len(), 32);
    }
}

const STREAM_TEXTS: &[&str] = &[
    "👨‍👩‍👧‍👦 family, 👩🏽‍💻 coder, 🏳️‍🌈 flag",
    "你好，世界！今天天气很好。",
    "日本語のテキストとカタカナ、ひらがな。",
    "😀😃😄😁 ❤️ 🇫🇷🇩🇪 👍🏿",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𐍈 𝟘𝟙𝟚 and नमस्ते दुनिया",
    "Mixed: English, 中文, русский, العربية, हिन्दी, 日本語 and emoji 🎉",
];

fn check_stream_decoder(tok: &Tokenizer, name: &str) {
    let mut held_back = 0;
    for &text in STREAM_TEXTS {
        let ids = tok.encode(text, false, false).unwrap();
        let mut sd = StreamDecoder::new(tok);
        let mut out = String::new();
        for &id in &ids {
            match sd.push(id) {
                Some(piece) => {
                    assert!(
                        !piece.contains('\u{FFFD}'),
                        "{name}: piece {piece:?} of {text:?} split a character"
                    );
                    assert!(
                        text[out.len()..].starts_with(&piece),
                        "{name}: {piece:?} out of order"
                    );
                    out.push_str(&piece);
                }
                None => held_back += 1,
            }
        }
        if let Some(rest) = sd.finish() {
            out.push_str(&rest);
        }
        assert_eq!(out, text, "{name}: streamed text");
    }
    // These strings contain characters whose bytes span several tokens; the decoder
    // must have waited for them at least once.
    assert!(
        held_back > 0,
        "{name}: no token ever ended inside a character"
    );

    // Control tokens are not rendered by default, but can be.
    let ids = tok
        .encode("<|im_start|>user\nhi<|im_end|>", false, true)
        .unwrap();
    let mut sd = StreamDecoder::new(tok);
    let text: String = ids.iter().filter_map(|&id| sd.push(id)).collect();
    assert_eq!(text, "user\nhi");
    let mut sd = StreamDecoder::new(tok).with_special(true);
    let text: String = ids.iter().filter_map(|&id| sd.push(id)).collect();
    assert_eq!(text, "<|im_start|>user\nhi<|im_end|>");
}

/// Saving `inner()` as tokenizer.json (what the Hugging Face exporter does) and loading
/// it with `from_file` must give the same tokenizer.
fn check_hf_round_trip(tok: &Tokenizer, name: &str) {
    let dir = tempfile::tempdir().unwrap();
    let tokenizer_json = dir.path().join("tokenizer.json");
    tok.inner().save(&tokenizer_json, false).unwrap();
    let text = |id: Option<u32>| id.and_then(|id| tok.id_to_token(id)).map(str::to_string);
    let config = serde_json::json!({
        "bos_token": text(tok.bos_id()),
        "eos_token": text(tok.eos_id()),
        "add_bos_token": tok.add_bos(),
        "add_eos_token": tok.add_eos(),
        "chat_template": tok.chat_template(),
    });
    let config_path = dir.path().join("tokenizer_config.json");
    std::fs::write(&config_path, config.to_string()).unwrap();
    let hf = Tokenizer::from_file(&tokenizer_json, Some(&config_path)).unwrap();
    assert_eq!(hf.bos_id(), tok.bos_id());
    assert_eq!(hf.eos_id(), tok.eos_id());
    assert_eq!(hf.eos_ids(), tok.eos_ids());
    assert_eq!(hf.chat_template(), tok.chat_template());
    assert_eq!(hf.vocab_size(), tok.vocab_size());
    check_tokenize_goldens(&hf, name);
}

fn check_chat_template(tok: &Tokenizer, default_system: &str) {
    let tmpl = ChatTemplate::from_tokenizer(tok)
        .unwrap()
        .expect("model has a chat template");
    let conversation = [
        ChatMessage::system("You are a terse assistant."),
        ChatMessage::user("What is 2+2?"),
    ];
    assert_eq!(
        tmpl.render(&conversation, true).unwrap(),
        "<|im_start|>system\nYou are a terse assistant.<|im_end|>\n\
         <|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    );
    // Without a system message both templates insert their own.
    let conversation = [
        ChatMessage::user("Hi there"),
        ChatMessage::assistant("Hello! How can I help?"),
        ChatMessage::user("Tell me a joke."),
    ];
    assert_eq!(
        tmpl.render(&conversation, false).unwrap(),
        format!(
            "<|im_start|>system\n{default_system}<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n\
             <|im_start|>assistant\nHello! How can I help?<|im_end|>\n\
             <|im_start|>user\nTell me a joke.<|im_end|>\n"
        )
    );
    // The rendered prompt's markers become control tokens when parsed as specials.
    let rendered = tmpl.render(&[ChatMessage::user("hi")], true).unwrap();
    let ids = tok.encode(&rendered, false, true).unwrap();
    let im_start = tok.token_to_id("<|im_start|>").unwrap();
    assert_eq!(ids.iter().filter(|&&id| id == im_start).count(), 3);
}

#[test]
fn smollm2_tokenize_matches_llama_cpp() {
    let tok = tokenizer(SMOLLM);
    check_tokenize_goldens(tok, SMOLLM);
    check_vocab_facts(tok, SMOLLM);
    check_generate_prompts(tok, SMOLLM);
}

#[test]
fn qwen25_tokenize_matches_llama_cpp() {
    let tok = tokenizer(QWEN);
    check_tokenize_goldens(tok, QWEN);
    check_vocab_facts(tok, QWEN);
    check_generate_prompts(tok, QWEN);
}

#[test]
fn smollm2_decode() {
    check_decode(tokenizer(SMOLLM), SMOLLM);
    check_stream_decoder(tokenizer(SMOLLM), SMOLLM);
}

#[test]
fn qwen25_decode() {
    check_decode(tokenizer(QWEN), QWEN);
    check_stream_decoder(tokenizer(QWEN), QWEN);
}

#[test]
fn smollm2_hf_tokenizer_json_round_trip() {
    check_hf_round_trip(tokenizer(SMOLLM), SMOLLM);
}

#[test]
fn qwen25_hf_tokenizer_json_round_trip() {
    check_hf_round_trip(tokenizer(QWEN), QWEN);
}

#[test]
fn smollm2_chat_template() {
    check_chat_template(
        tokenizer(SMOLLM),
        "You are a helpful AI assistant named SmolLM, trained by Hugging Face",
    );
}

#[test]
fn qwen25_chat_template() {
    check_chat_template(
        tokenizer(QWEN),
        "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
    );
}

#[test]
fn qwen25_special_token_details() {
    let tok = tokenizer(QWEN);
    // `<tool_call>` is user-defined: matched even without parse_special.
    let tool_call = tok.token_to_id("<tool_call>").unwrap();
    assert_eq!(
        tok.encode("<tool_call>", false, false).unwrap(),
        vec![tool_call]
    );
    // llama.cpp treats the vocabulary's `</s>` as an end-of-generation control token.
    let s = tok.token_to_id("</s>").unwrap();
    assert!(tok.is_eog(s));
    assert_eq!(tok.encode("</s>", false, true).unwrap(), vec![s]);
    assert_ne!(tok.encode("</s>", false, false).unwrap(), vec![s]);
}
