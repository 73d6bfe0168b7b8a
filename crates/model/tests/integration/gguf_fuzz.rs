//! GGUF parser tests: valid files built in memory round-trip; specific corruptions give
//! specific messages; and property tests show that truncated, bit-flipped or random
//! input never panics and never yields a tensor outside the buffer.

use std::path::Path;

use pagellm_kernels::quant::GgmlType;
use pagellm_model::gguf::{GgufFile, MetaValue};
use pagellm_model::{Arch, ModelConfig, ModelError, RopeStyle};
use proptest::prelude::*;

/// Writes GGUF images for tests. Values are written exactly as given, so tests can
/// also produce invalid files.
struct Writer {
    version: u32,
    alignment: usize,
    kvs: Vec<(String, Vec<u8>)>,
    tensors: Vec<(String, Vec<u64>, u32, Vec<u8>)>,
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// Encodes `v` as GGUF value type id + payload.
fn encode(v: &MetaValue) -> (u32, Vec<u8>) {
    let mut b = Vec::new();
    let ty = match v {
        MetaValue::U8(x) => {
            b.push(*x);
            0
        }
        MetaValue::I8(x) => {
            b.push(*x as u8);
            1
        }
        MetaValue::U16(x) => {
            b.extend_from_slice(&x.to_le_bytes());
            2
        }
        MetaValue::I16(x) => {
            b.extend_from_slice(&x.to_le_bytes());
            3
        }
        MetaValue::U32(x) => {
            b.extend_from_slice(&x.to_le_bytes());
            4
        }
        MetaValue::I32(x) => {
            b.extend_from_slice(&x.to_le_bytes());
            5
        }
        MetaValue::F32(x) => {
            b.extend_from_slice(&x.to_le_bytes());
            6
        }
        MetaValue::Bool(x) => {
            b.push(*x as u8);
            7
        }
        MetaValue::String(s) => {
            put_str(&mut b, s);
            8
        }
        MetaValue::Array(items) => {
            let elem_ty = items.first().map(|x| encode(x).0).unwrap_or(0);
            b.extend_from_slice(&elem_ty.to_le_bytes());
            b.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for it in items {
                b.extend_from_slice(&encode(it).1);
            }
            9
        }
        MetaValue::U64(x) => {
            b.extend_from_slice(&x.to_le_bytes());
            10
        }
        MetaValue::I64(x) => {
            b.extend_from_slice(&x.to_le_bytes());
            11
        }
        MetaValue::F64(x) => {
            b.extend_from_slice(&x.to_le_bytes());
            12
        }
    };
    (ty, b)
}

impl Writer {
    fn new() -> Self {
        Self {
            version: 3,
            alignment: 32,
            kvs: Vec::new(),
            tensors: Vec::new(),
        }
    }

    fn kv(&mut self, key: &str, v: MetaValue) -> &mut Self {
        let (ty, payload) = encode(&v);
        self.raw_kv(key, ty, payload)
    }

    /// A key with an arbitrary type id and payload.
    fn raw_kv(&mut self, key: &str, ty: u32, payload: Vec<u8>) -> &mut Self {
        let mut b = ty.to_le_bytes().to_vec();
        b.extend_from_slice(&payload);
        self.kvs.push((key.to_string(), b));
        self
    }

    fn tensor(&mut self, name: &str, dims: &[u64], ty: GgmlType) -> &mut Self {
        let n: u64 = dims.iter().product();
        let bytes = ty.row_bytes(dims[0] as usize).unwrap() * (n / dims[0]) as usize;
        // Deterministic, non-trivial contents (for Q-types, scales included).
        let data = (0..bytes).map(|i| (i * 7 + name.len()) as u8).collect();
        self.tensors.push((
            name.to_string(),
            dims.to_vec(),
            ty.id().expect("a GGUF type"),
            data,
        ));
        self
    }

    /// The file, with tensor data padded to the alignment between tensors but not after
    /// the last one, so the file ends exactly where the last tensor's data ends.
    fn build(&self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.kvs.len() as u64).to_le_bytes());
        for (k, v) in &self.kvs {
            put_str(&mut out, k);
            out.extend_from_slice(v);
        }
        let mut rel = 0usize;
        let mut offsets = Vec::new();
        for (_, _, _, data) in &self.tensors {
            offsets.push(rel);
            rel = (rel + data.len()).next_multiple_of(self.alignment);
        }
        for ((name, dims, ty, _), off) in self.tensors.iter().zip(&offsets) {
            put_str(&mut out, name);
            out.extend_from_slice(&(dims.len() as u32).to_le_bytes());
            for d in dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&ty.to_le_bytes());
            out.extend_from_slice(&(*off as u64).to_le_bytes());
        }
        let data_start = out.len().next_multiple_of(self.alignment);
        out.resize(data_start, 0);
        for ((_, _, _, data), off) in self.tensors.iter().zip(&offsets) {
            out.resize(data_start + off, 0);
            out.extend_from_slice(data);
        }
        out
    }
}

fn tokens() -> Vec<MetaValue> {
    ["<unk>", "<s>", "</s>", "hello", "wörld", "▁the", ""]
        .iter()
        .map(|s| MetaValue::String(s.to_string()))
        .collect()
}

/// A small llama-style file with metadata of every type and three tensors.
fn valid_writer() -> Writer {
    let mut w = Writer::new();
    w.kv("general.architecture", MetaValue::String("llama".into()))
        .kv("general.name", MetaValue::String("tiny test".into()))
        .kv("general.alignment", MetaValue::U32(32))
        .kv("llama.block_count", MetaValue::U32(2))
        .kv("llama.embedding_length", MetaValue::U64(64))
        .kv("llama.attention.head_count", MetaValue::I32(4))
        .kv("llama.attention.head_count_kv", MetaValue::U16(2))
        .kv("llama.feed_forward_length", MetaValue::U32(128))
        .kv("llama.context_length", MetaValue::U32(256))
        .kv(
            "llama.attention.layer_norm_rms_epsilon",
            MetaValue::F32(1e-5),
        )
        .kv("llama.rope.freq_base", MetaValue::F32(100000.0))
        .kv("llama.rope.dimension_count", MetaValue::U32(16))
        .kv("test.u8", MetaValue::U8(200))
        .kv("test.i8", MetaValue::I8(-5))
        .kv("test.i16", MetaValue::I16(-300))
        .kv("test.i64", MetaValue::I64(-1))
        .kv("test.f64", MetaValue::F64(2.5))
        .kv("test.bool", MetaValue::Bool(true))
        .kv(
            "test.nested",
            MetaValue::Array(vec![
                MetaValue::Array(vec![MetaValue::U8(1), MetaValue::U8(2)]),
                MetaValue::Array(vec![MetaValue::U8(3)]),
            ]),
        )
        .kv("tokenizer.ggml.model", MetaValue::String("llama".into()))
        .kv("tokenizer.ggml.tokens", MetaValue::Array(tokens()))
        .kv(
            "tokenizer.ggml.token_type",
            MetaValue::Array((0..7).map(|i| MetaValue::I32(i % 3)).collect()),
        )
        .kv(
            "tokenizer.ggml.scores",
            MetaValue::Array((0..7).map(|i| MetaValue::F32(-(i as f32))).collect()),
        )
        .tensor("token_embd.weight", &[64, 7], GgmlType::Q8_0)
        .tensor("output_norm.weight", &[64], GgmlType::F32)
        .tensor("blk.0.ffn_up.weight", &[256, 2], GgmlType::Q4_K);
    w
}

fn parse(bytes: Vec<u8>) -> Result<GgufFile, ModelError> {
    GgufFile::parse_bytes(Path::new("test.gguf"), bytes)
}

fn err_text(bytes: Vec<u8>) -> String {
    match parse(bytes) {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn valid_file_parses_with_right_values() {
    let bytes = valid_writer().build();
    let len = bytes.len();
    let g = parse(bytes).unwrap();
    assert_eq!(g.version, 3);
    assert_eq!(g.alignment, 32);
    assert_eq!(g.file_size(), len);
    assert_eq!(g.architecture().unwrap(), Arch::Llama);
    assert_eq!(g.get_str("general.name").unwrap(), "tiny test");
    assert_eq!(g.get_u32("llama.block_count").unwrap(), 2);
    assert_eq!(g.get_u32("llama.embedding_length").unwrap(), 64); // stored as u64
    assert_eq!(g.get_u32("llama.attention.head_count").unwrap(), 4); // stored as i32
    assert_eq!(g.get_u32("test.u8").unwrap(), 200);
    assert_eq!(g.get("test.i8"), Some(&MetaValue::I8(-5)));
    assert_eq!(g.get_i32("test.i16").unwrap(), -300);
    assert_eq!(g.get("test.i64"), Some(&MetaValue::I64(-1)));
    assert_eq!(g.get_f32("test.f64").unwrap(), 2.5);
    assert_eq!(
        g.get_f32("llama.attention.layer_norm_rms_epsilon").unwrap(),
        1e-5
    );
    assert!(g.get_bool("test.bool").unwrap());
    assert_eq!(
        g.get_str_array("tokenizer.ggml.tokens").unwrap(),
        ["<unk>", "<s>", "</s>", "hello", "wörld", "▁the", ""]
    );
    assert_eq!(
        g.get_i32_array("tokenizer.ggml.token_type").unwrap(),
        [0, 1, 2, 0, 1, 2, 0]
    );
    assert_eq!(g.get_f32_array("tokenizer.ggml.scores").unwrap()[3], -3.0);
    assert_eq!(g.get_array("test.nested").unwrap().len(), 2);

    let names: Vec<_> = g.tensors.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "token_embd.weight",
            "output_norm.weight",
            "blk.0.ffn_up.weight"
        ]
    );
    let emb = g.tensor_info("token_embd.weight").unwrap();
    assert_eq!(
        (emb.ty, emb.dims.clone(), emb.n_bytes),
        (GgmlType::Q8_0, vec![64, 7], 2 * 34 * 7)
    );
    assert_eq!(emb.offset, g.data_offset);
    assert_eq!(g.data_offset % 32, 0);
    let norm = g.tensor_info("output_norm.weight").unwrap();
    assert_eq!(
        (norm.ty, norm.n_bytes, norm.offset % 32),
        (GgmlType::F32, 256, 0)
    );
    let up = g.tensor_info("blk.0.ffn_up.weight").unwrap();
    assert_eq!((up.ty, up.n_bytes), (GgmlType::Q4_K, 2 * 144));
    assert_eq!(up.offset + up.n_bytes, len);

    let set = g.tensor_set().unwrap();
    assert_eq!(set.len(), 3);
    let t = set.get("blk.0.ffn_up.weight").unwrap();
    assert_eq!(t.shape, [256, 2]);
    assert_eq!(t.data().len(), 288);
    assert_eq!(t.data()[0], ("blk.0.ffn_up.weight".len()) as u8);
    assert_eq!(g.tensor("output_norm.weight").unwrap().to_f32().len(), 64);
    assert!(matches!(
        g.tensor("nope"),
        Err(ModelError::MissingTensor { .. })
    ));
}

#[test]
fn typed_getters_report_missing_and_wrong_types() {
    let g = parse(valid_writer().build()).unwrap();
    assert!(
        matches!(g.get_u32("no.such.key"), Err(ModelError::MissingKey { key }) if key == "no.such.key")
    );
    let e = g.get_u32("general.name").unwrap_err().to_string();
    assert!(
        e.contains("general.name") && e.contains("string") && e.contains("u32"),
        "{e}"
    );
    let e = g.get_u32("test.i8").unwrap_err().to_string();
    assert!(e.contains("-5") && e.contains("out of range"), "{e}");
    let e = g
        .get_str_array("tokenizer.ggml.scores")
        .unwrap_err()
        .to_string();
    assert!(e.contains("array of f32"), "{e}");
    assert!(g.get_bool("test.u8").is_err());
    assert!(g.get_str("test.bool").is_err());
}

#[test]
fn version_2_parses() {
    let mut w = valid_writer();
    w.version = 2;
    assert_eq!(parse(w.build()).unwrap().version, 2);
}

#[test]
fn custom_alignment_and_default_alignment() {
    let mut w = Writer::new();
    w.alignment = 64;
    w.kv("general.alignment", MetaValue::U32(64))
        .tensor("a", &[3], GgmlType::F32)
        .tensor("b", &[32], GgmlType::Q8_0);
    let g = parse(w.build()).unwrap();
    assert_eq!(g.alignment, 64);
    assert!(g.tensors.iter().all(|t| t.offset % 64 == 0));

    let mut w = Writer::new();
    w.tensor("a", &[5], GgmlType::F16)
        .tensor("b", &[2, 3], GgmlType::F32);
    let g = parse(w.build()).unwrap();
    assert_eq!(g.alignment, 32);
    assert_eq!(g.tensor_info("b").unwrap().offset - g.data_offset, 32);
}

#[test]
fn empty_file_without_tensors_is_valid() {
    let g = parse(Writer::new().build()).unwrap();
    assert!(g.tensors.is_empty() && g.metadata.is_empty());
}

#[test]
fn config_from_gguf() {
    let g = parse(valid_writer().build()).unwrap();
    let c = ModelConfig::from_gguf(&g).unwrap();
    assert_eq!(c.arch, Arch::Llama);
    assert_eq!(c.name, "tiny test");
    assert_eq!(
        (c.n_layers, c.d_model, c.n_heads, c.n_kv_heads, c.head_dim),
        (2, 64, 4, 2, 16)
    );
    assert_eq!((c.d_ff, c.context_length, c.vocab_size), (128, 256, 7));
    assert_eq!(
        (c.rms_eps, c.rope_theta, c.rope_style),
        (1e-5, 100000.0, RopeStyle::Interleaved)
    );
}

fn qwen_writer() -> Writer {
    let mut w = Writer::new();
    w.kv("general.architecture", MetaValue::String("qwen2".into()))
        .kv("qwen2.block_count", MetaValue::U32(1))
        .kv("qwen2.embedding_length", MetaValue::U32(64))
        .kv("qwen2.attention.head_count", MetaValue::U32(4))
        .kv("qwen2.feed_forward_length", MetaValue::U32(128))
        .kv("qwen2.context_length", MetaValue::U32(512))
        .kv(
            "qwen2.attention.layer_norm_rms_epsilon",
            MetaValue::F32(1e-6),
        )
        .kv("qwen2.vocab_size", MetaValue::U32(1000));
    w
}

#[test]
fn config_defaults_and_errors() {
    let c = ModelConfig::from_gguf(&parse(qwen_writer().build()).unwrap()).unwrap();
    assert_eq!(c.arch, Arch::Qwen2);
    assert_eq!(
        (c.n_kv_heads, c.rope_theta, c.vocab_size, c.name.as_str()),
        (4, 10000.0, 1000, "")
    );
    assert_eq!(c.rope_style, RopeStyle::Neox);

    let mut w = qwen_writer();
    w.kv("qwen2.rope.dimension_count", MetaValue::U32(8));
    let e = ModelConfig::from_gguf(&parse(w.build()).unwrap())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("rope.dimension_count") && e.contains("16"),
        "{e}"
    );

    let mut w = Writer::new();
    w.kv("general.architecture", MetaValue::String("gpt2".into()));
    let e = ModelConfig::from_gguf(&parse(w.build()).unwrap()).unwrap_err();
    assert!(
        matches!(e, ModelError::UnsupportedArch(ref a) if a == "gpt2"),
        "{e}"
    );

    let mut w = qwen_writer();
    w.kvs.retain(|(k, _)| k != "qwen2.feed_forward_length");
    let e = ModelConfig::from_gguf(&parse(w.build()).unwrap()).unwrap_err();
    assert!(
        matches!(e, ModelError::MissingKey { ref key } if key == "qwen2.feed_forward_length"),
        "{e}"
    );

    let mut w = qwen_writer();
    w.kvs.retain(|(k, _)| k != "qwen2.vocab_size");
    let e = ModelConfig::from_gguf(&parse(w.build()).unwrap())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("vocab_size") && e.contains("tokenizer.ggml.tokens"),
        "{e}"
    );
}

// ---- specific corruptions and their messages ----

#[test]
fn bad_magic() {
    let mut b = valid_writer().build();
    b[3] = b'X';
    let e = err_text(b);
    assert!(
        e.contains("test.gguf") && e.contains("bad magic") && e.contains("GGUX"),
        "{e}"
    );
    assert!(err_text(b"GG".to_vec()).contains("truncated"));
}

#[test]
fn version_1_and_unknown_versions() {
    let mut w = valid_writer();
    w.version = 1;
    let e = err_text(w.build());
    assert!(e.contains("version 1 is not supported"), "{e}");
    w.version = 7;
    assert!(err_text(w.build()).contains("unsupported GGUF version 7"));
    w.version = 3u32.swap_bytes();
    assert!(err_text(w.build()).contains("big-endian"));
}

#[test]
fn unsupported_tensor_type_id() {
    let mut w = valid_writer();
    w.tensors[1].2 = 23; // IQ4_XS
    match parse(w.build()) {
        Err(ModelError::UnsupportedTensorType { name, ty }) => {
            assert_eq!(name, "output_norm.weight");
            assert!(ty.contains("23") && ty.contains("IQ4_XS"), "{ty}");
        }
        other => panic!("expected UnsupportedTensorType, got {other:?}"),
    }
}

#[test]
fn tensor_data_past_end_of_file() {
    let mut b = valid_writer().build();
    b.truncate(b.len() - 1);
    let e = err_text(b);
    assert!(
        e.contains("tensor 2 (`blk.0.ffn_up.weight`)") && e.contains("past end of file"),
        "{e}"
    );
}

#[test]
fn huge_string_length() {
    let mut w = Writer::new();
    w.raw_kv(
        "general.name",
        8,
        u64::MAX
            .to_le_bytes()
            .iter()
            .copied()
            .chain([b'x'; 16])
            .collect(),
    );
    let e = err_text(w.build());
    assert!(
        e.contains("key 0 (`general.name`)")
            && e.contains("length 18446744073709551615 exceeds remaining"),
        "{e}"
    );
    assert!(e.contains("at offset 0x"), "{e}");
}

#[test]
fn huge_array_count() {
    let mut w = Writer::new();
    let mut payload = 4u32.to_le_bytes().to_vec(); // u32 elements
    payload.extend_from_slice(&(1u64 << 60).to_le_bytes());
    payload.extend_from_slice(&[0; 64]);
    w.raw_kv("tokenizer.ggml.token_type", 9, payload);
    let e = err_text(w.build());
    assert!(
        e.contains("tokenizer.ggml.token_type") && e.contains("array count 1152921504606846976"),
        "{e}"
    );
}

#[test]
fn metadata_value_budget() {
    // A plausible (fits in the file) but excessive u8 array is refused before parsing.
    let n = (1usize << 23) + 1;
    let mut payload = 0u32.to_le_bytes().to_vec();
    payload.extend_from_slice(&(n as u64).to_le_bytes());
    payload.resize(payload.len() + n, 7);
    let mut w = Writer::new();
    w.raw_kv("big", 9, payload);
    let e = err_text(w.build());
    assert!(
        e.contains("key 0 (`big`)") && e.contains("exceeds the limit"),
        "{e}"
    );
}

#[test]
fn unknown_value_type() {
    let mut w = Writer::new();
    w.kv("a", MetaValue::U8(1)).raw_kv("weird", 13, vec![0; 8]);
    let e = err_text(w.build());
    assert!(
        e.contains("key 1 (`weird`)") && e.contains("unknown value type 13"),
        "{e}"
    );
    let mut w = Writer::new();
    w.raw_kv(
        "arr",
        9,
        [
            99u32.to_le_bytes().to_vec(),
            1u64.to_le_bytes().to_vec(),
            vec![0; 8],
        ]
        .concat(),
    );
    assert!(err_text(w.build()).contains("unknown element type 99"));
}

#[test]
fn layout_errors() {
    // Duplicate tensor names.
    let mut w = valid_writer();
    w.tensors[2].0 = "token_embd.weight".into();
    assert!(err_text(w.build()).contains("duplicate tensor name"));
    // Duplicate keys.
    let mut w = valid_writer();
    w.kv("general.name", MetaValue::String("again".into()));
    assert!(err_text(w.build()).contains("duplicate key"));
    // Alignment not a power of two.
    let mut w = valid_writer();
    w.kvs[2] = (
        "general.alignment".into(),
        [4u32.to_le_bytes(), 24u32.to_le_bytes()].concat(),
    );
    assert!(err_text(w.build()).contains("not a power of two"));
    // Row length not a multiple of the block size.
    let mut w = Writer::new();
    w.tensors.push((
        "q".into(),
        vec![33, 1],
        GgmlType::Q8_0.id().expect("a GGUF type"),
        vec![0; 64],
    ));
    assert!(err_text(w.build()).contains("not a multiple of the Q8_0 block size 32"));
    // Too many dimensions.
    let mut w = Writer::new();
    w.tensors
        .push(("t".into(), vec![1, 1, 1, 1, 1], 0, vec![0; 4]));
    assert!(err_text(w.build()).contains("dimension count 5"));
    // Row byte size overflow (the element count itself fits).
    let mut w = Writer::new();
    w.tensors
        .push(("t".into(), vec![1 << 62, 1], 0, vec![0; 4]));
    assert!(err_text(w.build()).contains("row overflows"));
    let mut w = Writer::new();
    w.tensors.push(("t".into(), vec![1 << 62, 0], 0, vec![]));
    assert!(err_text(w.build()).contains("row overflows"));
    // Element count overflow.
    let mut w = Writer::new();
    w.tensors
        .push(("t".into(), vec![1 << 40, 1 << 40], 0, vec![0; 4]));
    assert!(err_text(w.build()).contains("overflows"));
    // Misaligned offset: patch the offset field of the only tensor.
    let mut w = Writer::new();
    w.tensor("t", &[8], GgmlType::F32);
    let mut b = w.build();
    // header 24, name 8 + 1, n_dims 4, dim 8, type 4, then the offset.
    let off_pos = 24 + 9 + 4 + 8 + 4;
    assert_eq!(b[off_pos..off_pos + 8], 0u64.to_le_bytes());
    b[off_pos] = 4;
    let e = err_text(b);
    assert!(e.contains("not a multiple of the alignment 32"), "{e}");
    // Invalid bool.
    let mut w = Writer::new();
    w.raw_kv("b", 7, vec![2]);
    assert!(err_text(w.build()).contains("neither 0 nor 1"));
    // Deeply nested arrays.
    let mut v = MetaValue::U8(0);
    for _ in 0..5 {
        v = MetaValue::Array(vec![v]);
    }
    let mut w = Writer::new();
    w.kv("deep", v);
    assert!(err_text(w.build()).contains("deeper than"));
    // Impossible tensor count.
    let mut b = Writer::new().build();
    b[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(err_text(b).contains("tensor count 18446744073709551615 is impossible"));
}

#[test]
fn every_truncation_is_an_error() {
    let bytes = valid_writer().build();
    for len in 0..bytes.len() {
        match parse(bytes[..len].to_vec()) {
            Err(ModelError::Gguf { .. }) => {}
            other => panic!("truncation to {len} bytes gave {other:?}"),
        }
    }
}

#[test]
fn open_reads_a_file_and_reports_io_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    std::fs::write(&path, valid_writer().build()).unwrap();
    let g = GgufFile::open(&path).unwrap();
    assert_eq!(g.path, path);
    assert_eq!(
        g.tensor_set()
            .unwrap()
            .get("output_norm.weight")
            .unwrap()
            .to_f32()
            .len(),
        64
    );
    let e = GgufFile::open(&dir.path().join("missing.gguf")).unwrap_err();
    assert!(matches!(e, ModelError::Io { .. }), "{e}");
    std::fs::write(&path, b"").unwrap();
    assert!(GgufFile::open(&path)
        .unwrap_err()
        .to_string()
        .contains("empty"));
}

/// If the parser accepts a mutated file, everything it hands out must be in bounds.
fn check_accepted(bytes: Vec<u8>) {
    let len = bytes.len();
    if let Ok(g) = parse(bytes) {
        for t in &g.tensors {
            assert!(
                t.offset
                    .checked_add(t.n_bytes)
                    .is_some_and(|end| end <= len),
                "{t:?}"
            );
        }
        let set = g
            .tensor_set()
            .expect("accepted tensors must be constructible");
        for t in set.iter() {
            assert_eq!(t.data().len(), g.tensor_info(&t.name).unwrap().n_bytes);
        }
        let _ = ModelConfig::from_gguf(&g);
        for v in g.metadata.values() {
            let _ = v.to_string();
        }
    }
}

fn extreme_words() -> Vec<u64> {
    vec![
        0,
        1,
        0xff,
        1 << 31,
        1 << 32,
        1 << 60,
        u64::MAX,
        u64::MAX - 7,
        i64::MAX as u64,
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 10_000, ..ProptestConfig::default() })]

    #[test]
    fn bit_flips_never_panic(
        flips in prop::collection::vec((any::<prop::sample::Index>(), 0u8..8), 1..8)
    ) {
        let mut bytes = valid_writer().build();
        for (i, bit) in flips {
            let i = i.index(bytes.len());
            bytes[i] ^= 1 << bit;
        }
        check_accepted(bytes);
    }

    #[test]
    fn byte_overwrites_never_panic(
        writes in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8)
    ) {
        let mut bytes = valid_writer().build();
        for (i, b) in writes {
            let i = i.index(bytes.len());
            bytes[i] = b;
        }
        check_accepted(bytes);
    }

    /// Overwrites 8-byte words with extreme values, which is how lengths, counts,
    /// dimensions and offsets get corrupted in practice.
    #[test]
    fn word_overwrites_never_panic(
        writes in prop::collection::vec(
            (any::<prop::sample::Index>(), prop::sample::select(extreme_words())),
            1..4,
        )
    ) {
        let mut bytes = valid_writer().build();
        for (i, w) in writes {
            let i = i.index(bytes.len() - 8);
            bytes[i..i + 8].copy_from_slice(&w.to_le_bytes());
        }
        check_accepted(bytes);
    }

    #[test]
    fn random_garbage_is_rejected(
        mut bytes in prop::collection::vec(any::<u8>(), 0..4096),
        magic in any::<bool>(),
    ) {
        // Half the cases start with a plausible header so the parser gets past it.
        if magic && bytes.len() >= 8 {
            bytes[..4].copy_from_slice(b"GGUF");
            bytes[4..8].copy_from_slice(&3u32.to_le_bytes());
        }
        prop_assert!(parse(bytes).is_err());
    }
}
