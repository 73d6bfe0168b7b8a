//! Text ⇄ token ids, matching llama.cpp's `llama_tokenize` / `llama_detokenize`.
//!
//! The heavy lifting (byte-level BPE merges, user-defined added tokens) is done by the
//! Hugging Face `tokenizers` crate; this module configures it so that its output is
//! identical to llama.cpp, which is the reference the goldens in `tests/golden/` come
//! from:
//!
//! * GGUF vocabularies (`tokenizer.ggml.model == "gpt2"`) are rebuilt from vocab +
//!   merges, with the pre-tokenizer regexes llama.cpp uses for `tokenizer.ggml.pre`
//!   (ported from `src/llama-vocab.cpp`, `llm_tokenizer_bpe::llm_tokenizer_bpe`).
//! * Special-token handling follows `tokenizer_st_partition`: with `parse_special`
//!   control tokens in the text become their ids; without it they are ordinary text.
//!   User-defined tokens are always matched, as in llama.cpp and HF.
//! * llama.cpp promotes well-known end-of-turn / FIM token names to control tokens and
//!   derives its end-of-generation (EOG) set from them; [`Tokenizer::eos_ids`] mirrors
//!   that, because a token llama.cpp treats as control also tokenizes differently.
//! * Detokenization is done here from per-token byte pieces (like
//!   `llama_token_to_piece`), so [`StreamDecoder`] can work on raw bytes and never
//!   split a UTF-8 character.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Merges, Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, DecoderWrapper, PreTokenizerWrapper, SplitDelimiterBehavior};

use crate::error::{ModelError, Result};

/// Tokenizer metadata as stored in a GGUF file (`tokenizer.ggml.*` keys). Plain data so
/// the tokenizer does not depend on the GGUF reader.
#[derive(Debug, Clone, Default)]
pub struct GgufTokenizerData {
    /// `tokenizer.ggml.model`, e.g. `"gpt2"` (byte-level BPE) or `"llama"` (SentencePiece).
    pub model: String,
    /// `tokenizer.ggml.pre`: `"smollm"`, `"qwen2"`, `"llama-bpe"`, ...
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`, indexed by id.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.token_type`: 1 normal, 2 unknown, 3 control, 4 user-defined,
    /// 5 unused, 6 byte. May be empty (all normal).
    pub token_types: Vec<i32>,
    /// `tokenizer.ggml.merges`, each `"left right"`, highest priority first.
    pub merges: Vec<String>,
    pub bos_id: Option<u32>,
    pub eos_id: Option<u32>,
    pub add_bos: bool,
    pub add_eos: bool,
    pub chat_template: Option<String>,
}

/// What kind of token an id is; mirrors llama.cpp's `llama_token_attr` subset that
/// matters for tokenizing and rendering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenAttr {
    Normal,
    Unknown,
    Control,
    UserDefined,
    Unused,
    Byte,
}

impl TokenAttr {
    fn from_gguf_type(t: i32) -> Self {
        match t {
            2 => Self::Unknown,
            3 => Self::Control,
            4 => Self::UserDefined,
            5 => Self::Unused,
            6 => Self::Byte,
            // 1 = normal; 0 = undefined and anything newer is treated as normal text.
            _ => Self::Normal,
        }
    }

    /// Control and unknown tokens are the ones `parse_special` governs and that are
    /// hidden when rendering without specials (llama.cpp's `attr_special`).
    fn is_special(self) -> bool {
        matches!(self, Self::Control | Self::Unknown)
    }
}

// Pre-tokenizer regexes, copied from llama.cpp `src/llama-vocab.cpp`
// (`llm_tokenizer_bpe` constructor). llama.cpp runs hand-written matchers for some of
// them (`unicode_regex_split_custom_*` in `src/unicode.cpp`); those implement exactly
// these expressions, including the final `\s+` alternative its GPT-2 expression omits,
// so the trailing `|\s+` is added here explicitly.

/// `LLAMA_VOCAB_PRE_TYPE_GPT2` (and the second stage of `SMOLLM`/`STARCODER`).
const RE_GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
/// `LLAMA_VOCAB_PRE_TYPE_SMOLLM` first stage: every digit is its own piece.
const RE_DIGIT: &str = r"\p{N}";
/// `LLAMA_VOCAB_PRE_TYPE_LLAMA3` (llama.cpp's case-insensitive-free adaptation).
const RE_LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// `LLAMA_VOCAB_PRE_TYPE_QWEN2`: like llama3 but single digits.
const RE_QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// `LLAMA_VOCAB_PRE_TYPE_DEFAULT` (used when `tokenizer.ggml.pre` is missing).
const RE_DEFAULT: [&str; 4] = [
    r"[\p{P}\$\+<=>\^~\|]+",
    RE_GPT2,
    r"\p{N}+",
    r"[0-9][0-9][0-9]",
];

/// How a `tokenizer.ggml.pre` value is handled.
struct PreTokenizerSpec {
    regexes: &'static [&'static str],
    /// llama.cpp sets `ignore_merges` for llama3-style vocabularies: a whole word that
    /// is already in the vocabulary is emitted without running merges.
    ignore_merges: bool,
}

fn pre_tokenizer_spec(pre: Option<&str>) -> Result<PreTokenizerSpec> {
    const GPT2: &[&str] = &[RE_GPT2];
    const SMOLLM: &[&str] = &[RE_DIGIT, RE_GPT2];
    const LLAMA3: &[&str] = &[RE_LLAMA3];
    const QWEN2: &[&str] = &[RE_QWEN2];
    const DEFAULT: &[&str] = &RE_DEFAULT;
    let spec = |regexes, ignore_merges| PreTokenizerSpec {
        regexes,
        ignore_merges,
    };
    // Names and groupings follow llama.cpp's `llama_vocab::impl::load`.
    Ok(match pre {
        None => {
            tracing::warn!(
                "GGUF has no tokenizer.ggml.pre; using llama.cpp's 'default' pre-tokenizer \
                 (generation quality may be degraded)"
            );
            spec(DEFAULT, false)
        }
        Some("default") => spec(DEFAULT, false),
        Some(
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0"
            | "lfm2",
        ) => spec(LLAMA3, true),
        Some("dbrx" | "smaug-bpe") => spec(LLAMA3, false),
        Some(
            "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es" | "jina-v2-de"
            | "a.x-4.0" | "mellum" | "modern-bert" | "mpt" | "olmo" | "jais" | "exaone4"
            | "trillion" | "granite-docling",
        ) => spec(GPT2, false),
        Some(
            "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" | "minerva-7b",
        ) => spec(SMOLLM, false),
        Some(
            "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "stablelm2" | "megrez" | "hunyuan",
        ) => spec(QWEN2, false),
        Some(other) => {
            // llama.cpp refuses to load unknown pre-tokenizers rather than silently
            // tokenizing differently from the model's training; do the same.
            return Err(ModelError::Tokenizer(format!(
                "unsupported pre-tokenizer tokenizer.ggml.pre = '{other}' (supported: default, \
                 gpt-2, smollm, starcoder, qwen2, llama-bpe/llama3, dbrx and their llama.cpp aliases)"
            )));
        }
    })
}

fn build_pre_tokenizer(regexes: &[&str]) -> Result<PreTokenizerWrapper> {
    let mut steps: Vec<PreTokenizerWrapper> = Vec::with_capacity(regexes.len() + 1);
    for re in regexes {
        // Isolated = matches and the gaps between them both become pieces, which is
        // what llama.cpp's `unicode_regex_split` produces.
        let split = Split::new(
            SplitPattern::Regex((*re).to_string()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| ModelError::Tokenizer(format!("bad pre-tokenizer regex {re:?}: {e}")))?;
        steps.push(split.into());
    }
    // The regex splitting is done above, so ByteLevel only maps bytes to its alphabet.
    steps.push(ByteLevel::new(false, false, false).into());
    Ok(Sequence::new(steps).into())
}

/// GPT-2's reversible byte ↔ printable-char table (`bytes_to_unicode`).
fn byte_level_chars() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut extra = 0u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        table[b as usize] = if printable {
            char::from(b)
        } else {
            extra += 1;
            char::from_u32(255 + extra).expect("valid code point")
        };
    }
    table
}

/// Inverse of [`byte_level_chars`].
fn byte_level_decoder_map() -> HashMap<char, u8> {
    byte_level_chars()
        .iter()
        .enumerate()
        .map(|(b, &c)| (c, b as u8))
        .collect()
}

/// How a normal vocabulary entry maps back to bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PieceStyle {
    /// GPT-2 byte-level alphabet (every GGUF "gpt2" vocabulary).
    ByteLevel,
    /// SentencePiece style: `▁` is a space and `<0xAB>` is a raw byte.
    SentencePiece,
    /// The vocabulary string is the text.
    Plain,
}

fn parse_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() == 2 {
        u8::from_str_radix(hex, 16).ok()
    } else {
        None
    }
}

// End-of-turn / FIM / EOG token names, from llama.cpp `llama_vocab::impl::load`.
// llama.cpp forces every token with one of these names to be a control token, which
// changes how it tokenizes (e.g. Qwen's vocabulary has a normal `</s>` token that thus
// becomes special), so the list is kept verbatim.
const EOG_NAMES: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];
const FIM_PRE_NAMES: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
];
const FIM_SUF_NAMES: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
];
const FIM_MID_NAMES: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
];
/// FIM pad / repo / file-separator tokens are also end-of-generation in llama.cpp.
const FIM_PAD_NAMES: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_NAMES: &[&str] = &[
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
];
const FIM_SEP_NAMES: &[&str] = &["<|file_sep|>"];
/// Tokens llama.cpp always renders as text (gpt-oss chat format markers).
const ALWAYS_RENDERED: &[&str] = &["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"];

/// Applies llama.cpp's name-based attribute fixes and returns the EOG id set.
fn derive_eog(
    tokens: &[String],
    attrs: &mut [TokenAttr],
    eos: Option<u32>,
    extra_eog: &[u32],
) -> Vec<u32> {
    let lowest_with_name = |names: &[&str]| -> Option<u32> {
        tokens
            .iter()
            .position(|t| names.contains(&t.as_str()))
            .map(|i| i as u32)
    };
    let mut eog: HashSet<u32> = HashSet::new();

    // llama.cpp picks one id per FIM role and makes it control; vocabularies have at
    // most one per role in practice, so the lowest id is used for determinism.
    for (names, ends_generation) in [
        (FIM_PRE_NAMES, false),
        (FIM_SUF_NAMES, false),
        (FIM_MID_NAMES, false),
        (FIM_PAD_NAMES, true),
        (FIM_REP_NAMES, true),
        (FIM_SEP_NAMES, true),
    ] {
        if let Some(id) = lowest_with_name(names) {
            attrs[id as usize] = TokenAttr::Control;
            if ends_generation {
                eog.insert(id);
            }
        }
    }
    for (id, text) in tokens.iter().enumerate() {
        if EOG_NAMES.contains(&text.as_str()) {
            eog.insert(id as u32);
            attrs[id] = TokenAttr::Control;
        }
    }
    for (id, text) in tokens.iter().enumerate() {
        if ALWAYS_RENDERED.contains(&text.as_str()) {
            attrs[id] = TokenAttr::UserDefined;
        }
    }
    if let Some(eos) = eos {
        eog.insert(eos);
    }
    eog.extend(extra_eog.iter().copied());

    let find = |eog: &HashSet<u32>, name: &str| {
        eog.iter().copied().find(|&id| tokens[id as usize] == name)
    };
    // gpt-oss: `<|end|>` ends a message, not the generation, when `<|return|>` and
    // `<|call|>` exist (same rule as llama.cpp).
    let has = |eog: &HashSet<u32>, name: &str| find(eog, name).is_some();
    if (has(&eog, "<|return|>") && has(&eog, "<|call|>")
        || has(&eog, "<|calls|>") && has(&eog, "<|flush|>"))
        && has(&eog, "<|end|>")
    {
        let end = find(&eog, "<|end|>").expect("checked above");
        eog.remove(&end);
        attrs[end as usize] = TokenAttr::UserDefined;
    }
    // Vocabularies with their own end marker use `</s>` as ordinary text.
    if has(&eog, "<|tool_response>") || has(&eog, "<|plamo:eos|>") {
        if let Some(s) = find(&eog, "</s>") {
            eog.remove(&s);
            attrs[s as usize] = TokenAttr::Normal;
        }
    }

    let mut eog: Vec<u32> = eog.into_iter().collect();
    eog.sort_unstable();
    eog
}

fn tok_err(context: &str) -> impl Fn(tokenizers::Error) -> ModelError + '_ {
    move |e| ModelError::Tokenizer(format!("{context}: {e}"))
}

/// A tokenizer that reproduces llama.cpp's tokenization for the vocabularies pagellm
/// supports.
pub struct Tokenizer {
    /// Configured with `encode_special_tokens = true`: it never turns control-token
    /// text into ids by itself; [`Tokenizer::encode`] does that when asked.
    inner: tokenizers::Tokenizer,
    /// Vocabulary strings by id (byte-level encoded for GPT-2 style vocabularies).
    tokens: Vec<String>,
    token_ids: HashMap<String, u32>,
    attrs: Vec<TokenAttr>,
    /// Raw bytes each id renders to (control tokens included), concatenated;
    /// `piece_offsets[id]..piece_offsets[id + 1]` indexes into it.
    piece_bytes: Vec<u8>,
    piece_offsets: Vec<u32>,
    /// Control/unknown ids matched by `parse_special`, longest text first (llama.cpp's
    /// `cache_special_tokens` order).
    special_ids: Vec<u32>,
    bos: Option<u32>,
    eos: Option<u32>,
    eog: Vec<u32>,
    add_bos: bool,
    add_eos: bool,
    chat_template: Option<String>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.tokens.len())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("eog", &self.eog)
            .field("add_bos", &self.add_bos)
            .field("add_eos", &self.add_eos)
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Builds the tokenizer from GGUF metadata. Only byte-level BPE (`"gpt2"`) vocabularies
    /// are supported; other models and unknown pre-tokenizers are errors.
    pub fn from_gguf_data(data: GgufTokenizerData) -> Result<Tokenizer> {
        if data.model != "gpt2" {
            return Err(ModelError::Tokenizer(format!(
                "unsupported tokenizer model tokenizer.ggml.model = '{}' (only 'gpt2' byte-level \
                 BPE is supported{})",
                data.model,
                if data.model == "llama" {
                    "; SentencePiece vocabularies are not implemented"
                } else {
                    ""
                }
            )));
        }
        let n = data.tokens.len();
        if n == 0 {
            return Err(ModelError::Tokenizer("GGUF vocabulary is empty".into()));
        }
        if !data.token_types.is_empty() && data.token_types.len() != n {
            return Err(ModelError::Tokenizer(format!(
                "tokenizer.ggml.token_type has {} entries but there are {n} tokens",
                data.token_types.len()
            )));
        }
        for (name, id) in [("bos", data.bos_id), ("eos", data.eos_id)] {
            if let Some(id) = id {
                if id as usize >= n {
                    return Err(ModelError::Tokenizer(format!(
                        "{name} token id {id} is outside the vocabulary of {n} tokens"
                    )));
                }
            }
        }
        let spec = pre_tokenizer_spec(data.pre.as_deref())?;

        let mut attrs: Vec<TokenAttr> = if data.token_types.is_empty() {
            vec![TokenAttr::Normal; n]
        } else {
            data.token_types
                .iter()
                .map(|&t| TokenAttr::from_gguf_type(t))
                .collect()
        };
        let eog = derive_eog(&data.tokens, &mut attrs, data.eos_id, &[]);

        let mut vocab = Vocab::with_capacity(n);
        for (id, text) in data.tokens.iter().enumerate() {
            if vocab.insert(text.clone(), id as u32).is_some() {
                return Err(ModelError::Tokenizer(format!(
                    "token {text:?} appears twice in the vocabulary (second time at id {id})"
                )));
            }
        }
        let merges = parse_merges(&data.merges, &vocab);
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .ignore_merges(spec.ignore_merges)
            .build()
            .map_err(tok_err("building BPE model"))?;

        let mut inner = tokenizers::Tokenizer::new(bpe);
        inner.with_pre_tokenizer(Some(build_pre_tokenizer(spec.regexes)?));
        inner.with_decoder(Some(ByteLevelDecoder::default()));
        register_added_tokens(&mut inner, &data.tokens, &attrs);
        if let Some(pp) = template_post_processor(
            data.add_bos.then_some(data.bos_id).flatten(),
            data.add_eos.then_some(data.eos_id).flatten(),
            &data.tokens,
        ) {
            // Only for consumers of `inner()` (e.g. a saved tokenizer.json); `encode`
            // adds BOS/EOS itself.
            inner.with_post_processor(Some(pp));
        }
        inner.set_encode_special_tokens(true);

        Ok(Self::assemble(
            inner,
            data.tokens,
            attrs,
            PieceStyle::ByteLevel,
            data.bos_id,
            data.eos_id,
            eog,
            data.add_bos,
            data.add_eos,
            data.chat_template,
        ))
    }

    /// Loads a Hugging Face `tokenizer.json`. BOS/EOS, `add_bos_token`/`add_eos_token`
    /// and the chat template come from `tokenizer_config.json` when given; `config.json`
    /// and `generation_config.json` next to `tokenizer.json` contribute extra EOS ids.
    /// Without an explicit `add_bos_token` the post-processor is probed.
    pub fn from_file(tokenizer_json: &Path, tokenizer_config_json: Option<&Path>) -> Result<Self> {
        let mut inner = tokenizers::Tokenizer::from_file(tokenizer_json)
            .map_err(|e| ModelError::Tokenizer(format!("{}: {e}", tokenizer_json.display())))?;
        let config = match tokenizer_config_json {
            Some(p) => read_json(p)?,
            None => serde_json::Value::Null,
        };

        let n = inner.get_vocab_size(true);
        let mut tokens = vec![String::new(); n];
        for (text, id) in inner.get_vocab(true) {
            if let Some(slot) = tokens.get_mut(id as usize) {
                *slot = text;
            }
        }
        let mut attrs = vec![TokenAttr::Normal; n];
        for (id, tok) in inner.get_added_tokens_decoder() {
            if let Some(a) = attrs.get_mut(id as usize) {
                *a = if tok.special {
                    TokenAttr::Control
                } else {
                    TokenAttr::UserDefined
                };
            }
        }
        let id_of = |text: &str| tokens.iter().position(|t| t == text).map(|i| i as u32);
        let special_text = |key: &str| -> Option<String> {
            match config.get(key)? {
                serde_json::Value::String(s) => Some(s.clone()),
                serde_json::Value::Object(o) => o.get("content")?.as_str().map(str::to_owned),
                _ => None,
            }
        };
        let mut bos = special_text("bos_token").and_then(|t| id_of(&t));
        let mut eos = special_text("eos_token").and_then(|t| id_of(&t));

        // config.json / generation_config.json hold ids; eos_token_id may be a list.
        let dir = tokenizer_json.parent().unwrap_or(Path::new("."));
        let mut extra_eos = Vec::new();
        for name in ["config.json", "generation_config.json"] {
            let path = dir.join(name);
            if !path.exists() {
                continue;
            }
            let v = read_json(&path)?;
            if bos.is_none() {
                bos = v
                    .get("bos_token_id")
                    .and_then(|x| x.as_u64())
                    .map(|x| x as u32);
            }
            match v.get("eos_token_id") {
                Some(serde_json::Value::Number(x)) => {
                    extra_eos.extend(x.as_u64().map(|x| x as u32))
                }
                Some(serde_json::Value::Array(xs)) => {
                    extra_eos.extend(xs.iter().filter_map(|x| x.as_u64()).map(|x| x as u32))
                }
                _ => {}
            }
        }
        extra_eos.retain(|&id| (id as usize) < n);
        if eos.is_none() {
            eos = extra_eos.first().copied();
        }

        // Whether BOS/EOS get added: explicit config wins, else ask the post-processor.
        let probe_with = inner.encode_fast("a", true).map_err(tok_err("probing"))?;
        let probe_without = inner.encode_fast("a", false).map_err(tok_err("probing"))?;
        let (with, without) = (probe_with.get_ids(), probe_without.get_ids());
        let mut probed_bos = None;
        let mut probed_eos = None;
        if with.len() > without.len() {
            if with.ends_with(without) {
                probed_bos = with.first().copied();
            } else if with.starts_with(without) {
                probed_eos = with.last().copied();
            } else {
                probed_bos = with.first().copied();
                probed_eos = with.last().copied();
            }
        }
        let add_bos = config
            .get("add_bos_token")
            .and_then(|v| v.as_bool())
            .unwrap_or(probed_bos.is_some());
        let add_eos = config
            .get("add_eos_token")
            .and_then(|v| v.as_bool())
            .unwrap_or(probed_eos.is_some());
        bos = bos.or(probed_bos);
        eos = eos.or(probed_eos);

        let chat_template = match config.get("chat_template") {
            Some(serde_json::Value::String(s)) => Some(s.clone()),
            // Newer configs store several named templates; "default" is the chat one.
            Some(serde_json::Value::Array(list)) => list
                .iter()
                .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
                .or_else(|| list.first())
                .and_then(|t| t.get("template"))
                .and_then(|t| t.as_str())
                .map(str::to_owned),
            _ => None,
        };

        let eog = derive_eog(&tokens, &mut attrs, eos, &extra_eos);
        let style = piece_style(inner.get_decoder());
        // Tokens llama.cpp would treat as control must be matchable by parse_special
        // and skipped by decode; make sure `inner` knows them as special.
        let already: HashSet<u32> = inner
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, t)| t.special)
            .map(|(id, _)| id)
            .collect();
        let promote: Vec<AddedToken> = attrs
            .iter()
            .enumerate()
            .filter(|(id, a)| a.is_special() && !already.contains(&(*id as u32)))
            .filter(|(id, _)| !tokens[*id].is_empty())
            .map(|(id, _)| AddedToken::from(tokens[id].clone(), true).normalized(false))
            .collect();
        if !promote.is_empty() {
            inner.add_special_tokens(&promote);
        }
        inner.set_encode_special_tokens(true);

        Ok(Self::assemble(
            inner,
            tokens,
            attrs,
            style,
            bos,
            eos,
            eog,
            add_bos,
            add_eos,
            chat_template,
        ))
    }

    #[allow(clippy::too_many_arguments)]
    fn assemble(
        inner: tokenizers::Tokenizer,
        tokens: Vec<String>,
        attrs: Vec<TokenAttr>,
        style: PieceStyle,
        bos: Option<u32>,
        eos: Option<u32>,
        eog: Vec<u32>,
        add_bos: bool,
        add_eos: bool,
        chat_template: Option<String>,
    ) -> Self {
        let byte_map = byte_level_decoder_map();
        let mut piece_bytes = Vec::new();
        let mut piece_offsets = Vec::with_capacity(tokens.len() + 1);
        piece_offsets.push(0u32);
        for (text, attr) in tokens.iter().zip(&attrs) {
            match attr {
                TokenAttr::Control | TokenAttr::Unknown | TokenAttr::UserDefined => {
                    piece_bytes.extend_from_slice(text.as_bytes())
                }
                TokenAttr::Unused => {}
                TokenAttr::Byte => match parse_byte_token(text) {
                    Some(b) => piece_bytes.push(b),
                    None => piece_bytes.extend_from_slice(text.as_bytes()),
                },
                TokenAttr::Normal => match style {
                    PieceStyle::ByteLevel => {
                        for c in text.chars() {
                            match byte_map.get(&c) {
                                Some(&b) => piece_bytes.push(b),
                                // Not in the byte alphabet: keep the character itself.
                                None => {
                                    let mut buf = [0u8; 4];
                                    piece_bytes
                                        .extend_from_slice(c.encode_utf8(&mut buf).as_bytes())
                                }
                            }
                        }
                    }
                    PieceStyle::SentencePiece => match parse_byte_token(text) {
                        Some(b) => piece_bytes.push(b),
                        None => piece_bytes.extend_from_slice(text.replace('▁', " ").as_bytes()),
                    },
                    PieceStyle::Plain => piece_bytes.extend_from_slice(text.as_bytes()),
                },
            }
            piece_offsets.push(piece_bytes.len() as u32);
        }

        let mut special_ids: Vec<u32> = (0..tokens.len() as u32)
            .filter(|&id| attrs[id as usize].is_special() && !tokens[id as usize].is_empty())
            .collect();
        // Longest first so that a token containing another is matched whole; ties by id
        // keep the order deterministic.
        special_ids.sort_by_key(|&id| (std::cmp::Reverse(tokens[id as usize].len()), id));

        let token_ids = tokens
            .iter()
            .enumerate()
            .filter(|(_, t)| !t.is_empty())
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();

        Self {
            inner,
            tokens,
            token_ids,
            attrs,
            piece_bytes,
            piece_offsets,
            special_ids,
            bos,
            eos,
            eog,
            add_bos,
            add_eos,
            chat_template,
        }
    }

    /// Tokenizes `text` like llama.cpp's `llama_tokenize(text, add_special, parse_special)`:
    /// `add_special` adds BOS/EOS where the model asks for them; `parse_special` turns
    /// control-token text (e.g. `<|im_start|>`) into the token instead of plain text.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<u32>> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && self.add_bos {
            out.extend(self.bos);
        }
        if parse_special {
            for frag in self.partition_special(text) {
                match frag {
                    Fragment::Text(s) => self.encode_plain(s, &mut out)?,
                    Fragment::Token(id) => out.push(id),
                }
            }
        } else {
            self.encode_plain(text, &mut out)?;
        }
        if add_special && self.add_eos {
            out.extend(self.eos);
        }
        Ok(out)
    }

    fn encode_plain(&self, text: &str, out: &mut Vec<u32>) -> Result<()> {
        if text.is_empty() {
            return Ok(());
        }
        let enc = self
            .inner
            .encode_fast(text, false)
            .map_err(tok_err("encoding"))?;
        out.extend_from_slice(enc.get_ids());
        Ok(())
    }

    /// Splits `text` around control-token occurrences, one token at a time in
    /// `special_ids` order, exactly like llama.cpp's `tokenizer_st_partition`.
    fn partition_special<'t>(&self, text: &'t str) -> Vec<Fragment<'t>> {
        let mut frags = vec![Fragment::Text(text)];
        for &id in &self.special_ids {
            let pat = self.tokens[id as usize].as_str();
            if !text.contains(pat) {
                continue;
            }
            let mut next = Vec::with_capacity(frags.len() + 2);
            for frag in frags {
                let Fragment::Text(mut rest) = frag else {
                    next.push(frag);
                    continue;
                };
                while let Some(pos) = rest.find(pat) {
                    if pos > 0 {
                        next.push(Fragment::Text(&rest[..pos]));
                    }
                    next.push(Fragment::Token(id));
                    rest = &rest[pos + pat.len()..];
                }
                if !rest.is_empty() {
                    next.push(Fragment::Text(rest));
                }
            }
            frags = next;
        }
        frags
    }

    /// Renders ids to text. With `skip_special`, control tokens render as nothing (like
    /// llama.cpp without `unparse_special`); user-defined tokens always render. Ids
    /// outside the vocabulary are ignored. Invalid UTF-8 becomes U+FFFD.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> String {
        let mut bytes = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            bytes.extend_from_slice(self.piece(id, skip_special));
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    fn piece(&self, id: u32, skip_special: bool) -> &[u8] {
        let i = id as usize;
        if i >= self.attrs.len() || (skip_special && self.attrs[i].is_special()) {
            return &[];
        }
        &self.piece_bytes[self.piece_offsets[i] as usize..self.piece_offsets[i + 1] as usize]
    }

    /// The raw bytes token `id` renders to (special tokens included). A piece may be a
    /// fragment of a multi-byte UTF-8 character, hence bytes rather than `str`.
    pub fn token_to_piece(&self, id: u32) -> Option<&[u8]> {
        ((id as usize) < self.tokens.len()).then(|| self.piece(id, false))
    }

    /// The vocabulary entry for `id` as stored (e.g. `"Ġhello"` in byte-level vocabularies).
    pub fn id_to_token(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    /// The id of a vocabulary entry (exact match on the stored string).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.token_ids.get(token).copied()
    }

    pub fn token_attr(&self, id: u32) -> Option<TokenAttr> {
        self.attrs.get(id as usize).copied()
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }

    /// Every id that ends generation (llama.cpp's EOG set): EOS plus end-of-turn style
    /// control tokens such as `<|im_end|>`, `<|endoftext|>`, `<|eot_id|>`, and the FIM
    /// pad/repo/file-separator tokens. Sorted ascending.
    pub fn eos_ids(&self) -> &[u32] {
        &self.eog
    }

    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }

    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    pub fn add_eos(&self) -> bool {
        self.add_eos
    }

    /// Number of ids, including special and unused ones.
    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    /// The model's chat template (GGUF `tokenizer.chat_template` or
    /// `tokenizer_config.json`), if it has one.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// The underlying `tokenizers` tokenizer, e.g. to `save()` a `tokenizer.json`.
    /// Note it has `encode_special_tokens` set (control-token text is not matched by
    /// its own `encode`); that flag is not part of the saved file.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}

enum Fragment<'t> {
    Text(&'t str),
    Token(u32),
}

/// Splits `"left right"` merges the way llama.cpp does (first space after position 0)
/// and drops merges whose parts or result are not in the vocabulary, which the
/// `tokenizers` BPE builder would reject. Dropping keeps the relative priority of the
/// rest, and such merges could never fire anyway.
fn parse_merges(merges: &[String], vocab: &Vocab) -> Merges {
    let mut out = Merges::with_capacity(merges.len());
    let mut dropped = 0usize;
    for m in merges {
        // Byte-wise search from index 1, as llama.cpp's `word.find(' ', 1)`; a space
        // byte is always a whole character, so slicing there is safe.
        let Some(pos) = m.bytes().skip(1).position(|b| b == b' ').map(|p| p + 1) else {
            dropped += 1;
            continue;
        };
        let (a, b) = (&m[..pos], &m[pos + 1..]);
        if vocab.contains_key(a) && vocab.contains_key(b) && vocab.contains_key(&format!("{a}{b}"))
        {
            out.push((a.to_string(), b.to_string()));
        } else {
            dropped += 1;
        }
    }
    if dropped > 0 {
        tracing::debug!("ignored {dropped} merges that do not map onto the vocabulary");
    }
    out
}

fn register_added_tokens(
    inner: &mut tokenizers::Tokenizer,
    tokens: &[String],
    attrs: &[TokenAttr],
) {
    let mut special = Vec::new();
    let mut user = Vec::new();
    for (text, attr) in tokens.iter().zip(attrs) {
        if text.is_empty() {
            continue;
        }
        match attr {
            TokenAttr::Control | TokenAttr::Unknown => {
                special.push(AddedToken::from(text.clone(), true).normalized(false))
            }
            TokenAttr::UserDefined => {
                user.push(AddedToken::from(text.clone(), false).normalized(false))
            }
            _ => {}
        }
    }
    if !special.is_empty() {
        inner.add_special_tokens(&special);
    }
    if !user.is_empty() {
        inner.add_tokens(&user);
    }
}

fn template_post_processor(
    bos: Option<u32>,
    eos: Option<u32>,
    tokens: &[String],
) -> Option<TemplateProcessing> {
    if bos.is_none() && eos.is_none() {
        return None;
    }
    let text = |id: u32| tokens[id as usize].clone();
    // The template syntax treats whitespace, `$` and `:` specially.
    let usable =
        |t: &str| !t.is_empty() && !t.contains(|c: char| c.is_whitespace() || c == '$' || c == ':');
    let mut single: Vec<String> = Vec::new();
    let mut pair: Vec<String> = Vec::new();
    let mut specials = Vec::new();
    if let Some(b) = bos {
        if !usable(&tokens[b as usize]) {
            return None;
        }
        single.push(text(b));
        pair.push(text(b));
        specials.push((text(b), b));
    }
    single.push("$A".into());
    pair.push("$A".into());
    if let Some(e) = eos {
        if !usable(&tokens[e as usize]) {
            return None;
        }
        single.push(text(e));
        pair.push(text(e));
        if Some(e) != bos {
            specials.push((text(e), e));
        }
    }
    if let Some(b) = bos {
        pair.push(format!("{}:1", text(b)));
    }
    pair.push("$B:1".into());
    if let Some(e) = eos {
        pair.push(format!("{}:1", text(e)));
    }
    TemplateProcessing::builder()
        .try_single(single)
        .ok()?
        .try_pair(pair)
        .ok()?
        .special_tokens(specials)
        .build()
        .ok()
}

fn piece_style(decoder: Option<&DecoderWrapper>) -> PieceStyle {
    fn visit(d: &DecoderWrapper) -> Option<PieceStyle> {
        match d {
            DecoderWrapper::ByteLevel(_) => Some(PieceStyle::ByteLevel),
            DecoderWrapper::Metaspace(_) | DecoderWrapper::ByteFallback(_) => {
                Some(PieceStyle::SentencePiece)
            }
            DecoderWrapper::Sequence(s) => s.get_decoders().iter().find_map(visit),
            _ => None,
        }
    }
    decoder.and_then(visit).unwrap_or(PieceStyle::Plain)
}

fn read_json(path: &Path) -> Result<serde_json::Value> {
    let text = std::fs::read_to_string(path).map_err(|source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str(&text)
        .map_err(|e| ModelError::Tokenizer(format!("{}: invalid JSON: {e}", path.display())))
}

/// Incremental detokenizer for streaming: feed ids one at a time and get back only
/// text that is complete. Bytes of a UTF-8 character split across tokens are held back
/// until the character is whole, so every returned string is valid and the
/// concatenation of all outputs (plus [`StreamDecoder::finish`]) equals
/// [`Tokenizer::decode`] of the whole sequence.
pub struct StreamDecoder<'a> {
    tok: &'a Tokenizer,
    state: IncrementalDecoder,
}

impl<'a> StreamDecoder<'a> {
    /// A decoder that, like chat output, does not render control tokens.
    pub fn new(tok: &'a Tokenizer) -> Self {
        Self {
            tok,
            state: IncrementalDecoder::new(true),
        }
    }

    /// Whether control tokens are rendered (default: not).
    pub fn with_special(mut self, render_special: bool) -> Self {
        self.state.skip_special = !render_special;
        self
    }

    /// Adds one token; returns newly completed text, or `None` if nothing is complete yet.
    pub fn push(&mut self, id: u32) -> Option<String> {
        self.state.push(self.tok, id)
    }

    /// Flushes held-back bytes (an incomplete character becomes U+FFFD).
    pub fn finish(&mut self) -> Option<String> {
        self.state.finish()
    }
}

/// The state of a [`StreamDecoder`] without the borrow of the tokenizer, for holders
/// that live next to it (one per request in the engine).
#[derive(Debug, Clone, Default)]
pub struct IncrementalDecoder {
    pending: Vec<u8>,
    skip_special: bool,
}

impl IncrementalDecoder {
    pub fn new(skip_special: bool) -> Self {
        Self {
            pending: Vec::new(),
            skip_special,
        }
    }

    /// Adds one token; returns newly completed text, or `None` if nothing is complete yet.
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> Option<String> {
        self.pending
            .extend_from_slice(tok.piece(id, self.skip_special));
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    break;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // Safe: `valid_up_to` bytes were just validated.
                    out.push_str(
                        std::str::from_utf8(&self.pending[..valid]).expect("valid prefix"),
                    );
                    match e.error_len() {
                        // A truncated character at the end: wait for more bytes.
                        None => {
                            self.pending.drain(..valid);
                            break;
                        }
                        // Bytes that can never become valid: replace and go on.
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            self.pending.drain(..valid + bad);
                        }
                    }
                }
            }
        }
        (!out.is_empty()).then_some(out)
    }

    /// Flushes held-back bytes (an incomplete character becomes U+FFFD).
    pub fn finish(&mut self) -> Option<String> {
        if self.pending.is_empty() {
            return None;
        }
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny byte-level vocabulary: all 256 byte symbols, a few merges, two control
    /// tokens and one user-defined token.
    fn toy() -> Tokenizer {
        let chars = byte_level_chars();
        let mut tokens: Vec<String> = chars.iter().map(|c| c.to_string()).collect();
        let mut types = vec![1; 256];
        for t in ["he", "ll", "hell", "hello", "Ġw", "Ġwo"] {
            tokens.push(t.into());
            types.push(1);
        }
        for (t, ty) in [("<|im_start|>", 3), ("<|im_end|>", 3), ("<tool>", 4)] {
            tokens.push(t.into());
            types.push(ty);
        }
        let merges = ["h e", "l l", "he ll", "hell o", "Ġ w", "Ġw o"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let eos = tokens.iter().position(|t| t == "<|im_end|>").unwrap() as u32;
        Tokenizer::from_gguf_data(GgufTokenizerData {
            model: "gpt2".into(),
            pre: Some("qwen2".into()),
            tokens,
            token_types: types,
            merges,
            bos_id: Some(eos - 1),
            eos_id: Some(eos),
            add_bos: false,
            add_eos: false,
            chat_template: None,
        })
        .unwrap()
    }

    #[test]
    fn encodes_merges_and_specials() {
        let t = toy();
        let hello = t.token_to_id("hello").unwrap();
        let start = t.token_to_id("<|im_start|>").unwrap();
        let end = t.token_to_id("<|im_end|>").unwrap();
        let tool = t.token_to_id("<tool>").unwrap();
        assert_eq!(t.encode("hello", false, false).unwrap(), vec![hello]);
        let with = t
            .encode("<|im_start|>hello<|im_end|>", false, true)
            .unwrap();
        assert_eq!(with, vec![start, hello, end]);
        let without = t
            .encode("<|im_start|>hello<|im_end|>", false, false)
            .unwrap();
        assert!(!without.contains(&start) && without.contains(&hello));
        // User-defined tokens are matched whether or not specials are parsed.
        assert!(t.encode("a<tool>b", false, false).unwrap().contains(&tool));
        assert_eq!(t.eos_ids(), &[end]);
    }

    #[test]
    fn decode_and_stream_hold_back_partial_utf8() {
        let t = toy();
        let text = "héllo 🎉 世界";
        let ids = t.encode(text, false, false).unwrap();
        assert_eq!(t.decode(&ids, false), text);
        let mut sd = StreamDecoder::new(&t);
        let mut out = String::new();
        for &id in &ids {
            if let Some(s) = sd.push(id) {
                out.push_str(&s);
            }
        }
        assert!(sd.finish().is_none());
        assert_eq!(out, text);
    }

    #[test]
    fn stream_replaces_invalid_bytes() {
        let t = toy();
        let mut sd = StreamDecoder::new(&t);
        // 0xE6 starts a 3-byte sequence; "a" cannot continue it.
        assert_eq!(sd.push(0xE6), None);
        let a = t.encode("a", false, false).unwrap()[0];
        assert_eq!(sd.push(a).as_deref(), Some("\u{FFFD}a"));
    }

    #[test]
    fn add_special_adds_bos_and_inner_agrees() {
        let t = toy();
        let mut data = GgufTokenizerData {
            model: "gpt2".into(),
            pre: Some("llama-bpe".into()),
            tokens: (0..t.vocab_size() as u32)
                .map(|id| t.id_to_token(id).unwrap().to_string())
                .collect(),
            token_types: (0..t.vocab_size() as u32)
                .map(|id| match t.token_attr(id).unwrap() {
                    TokenAttr::Control => 3,
                    TokenAttr::UserDefined => 4,
                    _ => 1,
                })
                .collect(),
            merges: vec!["h e".into(), "l l".into(), "he ll".into(), "hell o".into()],
            bos_id: t.token_to_id("<|im_start|>"),
            eos_id: t.token_to_id("<|im_end|>"),
            add_bos: true,
            add_eos: false,
            chat_template: None,
        };
        let bos = data.bos_id.unwrap();
        let hello = t.token_to_id("hello").unwrap();
        let with_bos = Tokenizer::from_gguf_data(data.clone()).unwrap();
        assert_eq!(
            with_bos.encode("hello", true, false).unwrap(),
            vec![bos, hello]
        );
        assert_eq!(with_bos.encode("hello", false, false).unwrap(), vec![hello]);
        let inner = with_bos.inner().encode("hello", true).unwrap();
        assert_eq!(inner.get_ids(), &[bos, hello]);
        // No pre-tokenizer name: llama.cpp's "default" expressions.
        data.pre = None;
        let default = Tokenizer::from_gguf_data(data).unwrap();
        assert_eq!(default.encode("hello", false, false).unwrap(), vec![hello]);
    }

    #[test]
    fn rejects_unsupported_models() {
        let err = Tokenizer::from_gguf_data(GgufTokenizerData {
            model: "llama".into(),
            tokens: vec!["a".into()],
            ..Default::default()
        })
        .unwrap_err();
        assert!(err.to_string().contains("SentencePiece"), "{err}");
        let err = Tokenizer::from_gguf_data(GgufTokenizerData {
            model: "gpt2".into(),
            pre: Some("no-such-pre".into()),
            tokens: vec!["a".into()],
            ..Default::default()
        })
        .unwrap_err();
        assert!(err.to_string().contains("no-such-pre"), "{err}");
    }
}
