//! Writing GGUF v3 files (`pagellm convert --to gguf`), so that llama.cpp's tools
//! (`llama-quantize`, `llama-perplexity`) work on the very model pagellm evaluates.
//!
//! The file is what llama.cpp's `convert_hf_to_gguf.py` writes for a llama or qwen2
//! model: the hyperparameters under `{arch}.*`, the byte-level BPE vocabulary under
//! `tokenizer.ggml.*` (padded to the embedding's rows with `[PAD{i}]` tokens of type
//! unused), GGUF tensor names, llama's Q/K rows permuted into GGUF's interleaved
//! order, 1-D tensors in F32 and matrices in the requested float type; tensor data
//! aligned to 32 bytes.

use std::io::{BufWriter, Write};
use std::path::Path;

use crate::config::Arch;
use crate::error::{ModelError, Result};
use crate::hf::write::for_each_weight;
use crate::loader::LoadedModel;
use crate::tokenizer::TokenAttr;

use super::{MetaValue, DEFAULT_ALIGNMENT};

/// The float type of the written matrices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgufDtype {
    F32,
    F16,
    Bf16,
}

impl GgufDtype {
    /// GGML type id and `general.file_type` (`LLAMA_FTYPE_*`).
    fn ids(self) -> (u32, u32) {
        match self {
            GgufDtype::F32 => (0, 0),
            GgufDtype::F16 => (1, 1),
            GgufDtype::Bf16 => (30, 32),
        }
    }
}

fn put_str(w: &mut impl Write, s: &str) -> std::io::Result<()> {
    w.write_all(&(s.len() as u64).to_le_bytes())?;
    w.write_all(s.as_bytes())
}

fn type_id(v: &MetaValue) -> u32 {
    match v {
        MetaValue::U8(_) => 0,
        MetaValue::I8(_) => 1,
        MetaValue::U16(_) => 2,
        MetaValue::I16(_) => 3,
        MetaValue::U32(_) => 4,
        MetaValue::I32(_) => 5,
        MetaValue::F32(_) => 6,
        MetaValue::Bool(_) => 7,
        MetaValue::String(_) => 8,
        MetaValue::Array(_) => 9,
        MetaValue::U64(_) => 10,
        MetaValue::I64(_) => 11,
        MetaValue::F64(_) => 12,
    }
}

fn put_value(w: &mut impl Write, v: &MetaValue) -> std::io::Result<()> {
    match v {
        MetaValue::U8(x) => w.write_all(&x.to_le_bytes()),
        MetaValue::I8(x) => w.write_all(&x.to_le_bytes()),
        MetaValue::U16(x) => w.write_all(&x.to_le_bytes()),
        MetaValue::I16(x) => w.write_all(&x.to_le_bytes()),
        MetaValue::U32(x) => w.write_all(&x.to_le_bytes()),
        MetaValue::I32(x) => w.write_all(&x.to_le_bytes()),
        MetaValue::U64(x) => w.write_all(&x.to_le_bytes()),
        MetaValue::I64(x) => w.write_all(&x.to_le_bytes()),
        MetaValue::F32(x) => w.write_all(&x.to_le_bytes()),
        MetaValue::F64(x) => w.write_all(&x.to_le_bytes()),
        MetaValue::Bool(x) => w.write_all(&[*x as u8]),
        MetaValue::String(s) => put_str(w, s),
        MetaValue::Array(items) => {
            let elem = items.first().map_or(8, type_id);
            w.write_all(&elem.to_le_bytes())?;
            w.write_all(&(items.len() as u64).to_le_bytes())?;
            items.iter().try_for_each(|x| put_value(w, x))
        }
    }
}

/// llama.cpp's pre-tokenizer name for the model's vocabulary (`tokenizer.ggml.pre`),
/// unless given.
fn pre_tokenizer(model: &LoadedModel, given: Option<&str>) -> Result<String> {
    if let Some(p) = given {
        return Ok(p.to_string());
    }
    match (model.transformer.config.arch, model.tokenizer.vocab_size()) {
        (Arch::Qwen2, _) => Ok("qwen2".into()),
        (Arch::Llama, 49152) => Ok("smollm".into()),
        (Arch::Llama, n) => Err(ModelError::Other(format!(
            "cannot tell llama.cpp's pre-tokenizer for this llama vocabulary of {n} tokens; \
             name it with --gguf-pre (e.g. llama-bpe, smollm)"
        ))),
    }
}

fn tokenizer_meta(model: &LoadedModel, pre: String) -> Result<Vec<(String, MetaValue)>> {
    let tok = &model.tokenizer;
    let rows = model.transformer.config.vocab_size;
    let n = tok.vocab_size();
    if n > rows {
        return Err(ModelError::Other(format!(
            "the tokenizer has {n} tokens but the embedding only {rows} rows"
        )));
    }
    let mut tokens = Vec::with_capacity(rows);
    let mut types = Vec::with_capacity(rows);
    for id in 0..rows as u32 {
        match tok.id_to_token(id) {
            Some(t) if (id as usize) < n => {
                tokens.push(MetaValue::String(t.to_string()));
                types.push(MetaValue::I32(match tok.token_attr(id) {
                    Some(TokenAttr::Normal) | None => 1,
                    Some(TokenAttr::Unknown) => 2,
                    Some(TokenAttr::Control) => 3,
                    Some(TokenAttr::UserDefined) => 4,
                    Some(TokenAttr::Unused) => 5,
                    Some(TokenAttr::Byte) => 6,
                }));
            }
            _ => {
                tokens.push(MetaValue::String(format!("[PAD{id}]")));
                types.push(MetaValue::I32(5));
            }
        }
    }
    // The merges, from the tokenizer's own serialization ("a b" strings or pairs).
    let json: serde_json::Value = serde_json::from_str(
        &tok.inner()
            .to_string(false)
            .map_err(|e| ModelError::Tokenizer(format!("serializing the tokenizer: {e}")))?,
    )
    .map_err(|e| ModelError::Tokenizer(format!("reading the tokenizer back: {e}")))?;
    // GGUF's `gpt2` vocabularies are byte-level: token strings in GPT-2's byte alphabet.
    if !json["pre_tokenizer"].to_string().contains("ByteLevel")
        && !json["decoder"].to_string().contains("ByteLevel")
    {
        return Err(ModelError::Tokenizer(
            "only byte-level BPE tokenizers can be written to GGUF (tokenizer.ggml.model \
             gpt2); this one has no ByteLevel pre-tokenizer or decoder"
                .into(),
        ));
    }
    let merges: Vec<MetaValue> = json["model"]["merges"]
        .as_array()
        .ok_or_else(|| ModelError::Tokenizer("the tokenizer has no BPE merges".into()))?
        .iter()
        .map(|m| match m {
            serde_json::Value::String(s) => Ok(s.clone()),
            serde_json::Value::Array(p) if p.len() == 2 => Ok(format!(
                "{} {}",
                p[0].as_str().unwrap_or_default(),
                p[1].as_str().unwrap_or_default()
            )),
            other => Err(ModelError::Tokenizer(format!("unreadable merge {other}"))),
        })
        .map(|r| r.map(MetaValue::String))
        .collect::<Result<_>>()?;
    let mut meta = vec![
        (
            "tokenizer.ggml.model".into(),
            MetaValue::String("gpt2".into()),
        ),
        ("tokenizer.ggml.pre".into(), MetaValue::String(pre)),
        ("tokenizer.ggml.tokens".into(), MetaValue::Array(tokens)),
        ("tokenizer.ggml.token_type".into(), MetaValue::Array(types)),
        ("tokenizer.ggml.merges".into(), MetaValue::Array(merges)),
        (
            "tokenizer.ggml.add_bos_token".into(),
            MetaValue::Bool(tok.add_bos()),
        ),
    ];
    if let Some(b) = tok.bos_id() {
        meta.push(("tokenizer.ggml.bos_token_id".into(), MetaValue::U32(b)));
    }
    if let Some(e) = tok.eos_id() {
        meta.push(("tokenizer.ggml.eos_token_id".into(), MetaValue::U32(e)));
    }
    if let Some(t) = tok.chat_template() {
        meta.push((
            "tokenizer.chat_template".into(),
            MetaValue::String(t.into()),
        ));
    }
    Ok(meta)
}

/// Writes `model` as a GGUF file at `out` (refusing to overwrite), matrices in `dtype`;
/// `pre` names llama.cpp's pre-tokenizer when it cannot be told from the model.
pub fn write_gguf(
    model: &LoadedModel,
    out: &Path,
    dtype: GgufDtype,
    pre: Option<&str>,
) -> Result<()> {
    if out.exists() {
        return Err(ModelError::Other(format!(
            "{} exists; refusing to overwrite it",
            out.display()
        )));
    }
    let c = &model.transformer.config;
    let a = c.arch.name();
    let (mat_type, file_type) = dtype.ids();
    let mut meta: Vec<(String, MetaValue)> = vec![
        ("general.architecture".into(), MetaValue::String(a.into())),
        ("general.name".into(), MetaValue::String(c.name.clone())),
        ("general.file_type".into(), MetaValue::U32(file_type)),
        (
            "general.alignment".into(),
            MetaValue::U32(DEFAULT_ALIGNMENT as u32),
        ),
    ];
    let k = |s: &str| format!("{a}.{s}");
    for (key, v) in [
        ("context_length", c.context_length),
        ("embedding_length", c.d_model),
        ("block_count", c.n_layers),
        ("feed_forward_length", c.d_ff),
        ("attention.head_count", c.n_heads),
        ("attention.head_count_kv", c.n_kv_heads),
        ("rope.dimension_count", c.head_dim),
        ("vocab_size", c.vocab_size),
    ] {
        meta.push((k(key), MetaValue::U32(v as u32)));
    }
    meta.push((k("rope.freq_base"), MetaValue::F32(c.rope_theta)));
    meta.push((
        k("attention.layer_norm_rms_epsilon"),
        MetaValue::F32(c.rms_eps),
    ));
    meta.extend(tokenizer_meta(model, pre_tokenizer(model, pre)?)?);

    // Tensors in GGUF names and order; llama Q/K (weights and biases) permuted.
    let permute = c.arch == Arch::Llama;
    let mut tensors: Vec<(String, Vec<usize>, u32, Vec<u8>)> = Vec::new();
    for_each_weight(model, |w| {
        let name = crate::hf::names::hf_to_gguf(&w.name)
            .ok_or_else(|| ModelError::Other(format!("no GGUF name for tensor `{}`", w.name)))?;
        let heads = if name.contains(".attn_q.") {
            Some(c.n_heads)
        } else if name.contains(".attn_k.") {
            Some(c.n_kv_heads)
        } else {
            None
        };
        let row_len = if w.shape.len() == 2 { w.shape[1] } else { 1 };
        let values = match (permute, heads) {
            (true, Some(h)) => crate::hf::convert::permute_rows(&w.values, h, row_len),
            _ => w.values,
        };
        let dims: Vec<usize> = w.shape.iter().rev().copied().collect();
        let (ty, data) = if w.shape.len() == 1 || dtype == GgufDtype::F32 {
            (0, values.iter().flat_map(|v| v.to_le_bytes()).collect())
        } else if dtype == GgufDtype::F16 {
            (
                mat_type,
                values
                    .iter()
                    .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
                    .collect(),
            )
        } else {
            (
                mat_type,
                values
                    .iter()
                    .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
                    .collect(),
            )
        };
        tensors.push((name, dims, ty, data));
        Ok(())
    })?;

    let io = |e: std::io::Error| ModelError::Other(format!("{}: {e}", out.display()));
    let tmp = out.with_extension("gguf.partial");
    let file = std::fs::File::create(&tmp).map_err(io)?;
    let mut w = BufWriter::new(file);
    let align = DEFAULT_ALIGNMENT as u64;
    let pad = |n: u64| (align - n % align) % align;
    let write = |w: &mut BufWriter<std::fs::File>| -> std::io::Result<()> {
        w.write_all(b"GGUF")?;
        w.write_all(&3u32.to_le_bytes())?;
        w.write_all(&(tensors.len() as u64).to_le_bytes())?;
        w.write_all(&(meta.len() as u64).to_le_bytes())?;
        let mut header = 24u64;
        for (key, v) in &meta {
            put_str(w, key)?;
            w.write_all(&type_id(v).to_le_bytes())?;
            put_value(w, v)?;
        }
        let mut offset = 0u64;
        for (name, dims, ty, data) in &tensors {
            put_str(w, name)?;
            w.write_all(&(dims.len() as u32).to_le_bytes())?;
            for d in dims {
                w.write_all(&(*d as u64).to_le_bytes())?;
            }
            w.write_all(&ty.to_le_bytes())?;
            w.write_all(&offset.to_le_bytes())?;
            offset += data.len() as u64 + pad(data.len() as u64);
        }
        w.flush()?;
        header = header.max(w.get_ref().metadata()?.len());
        w.write_all(&vec![0u8; pad(header) as usize])?;
        for (_, _, _, data) in &tensors {
            w.write_all(data)?;
            w.write_all(&vec![0u8; pad(data.len() as u64) as usize])?;
        }
        w.flush()
    };
    write(&mut w).map_err(io)?;
    drop(w);
    std::fs::rename(&tmp, out).map_err(io)?;
    Ok(())
}
