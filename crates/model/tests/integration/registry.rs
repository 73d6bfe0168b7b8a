//! Registry tests: resolving model arguments, error messages, and the real default
//! model (pulled into the cache, then parsed). CI pulls the default model before the
//! tests run, so `pull` is a cache hit there.

use std::fs;

use pagellm_kernels::quant::GgmlType;
use pagellm_model::gguf::GgufFile;
use pagellm_model::registry::{self, ResolvedModel, DEFAULT_MODEL};
use pagellm_model::{Arch, ModelConfig, RopeStyle};

fn resolve_err(home: &std::path::Path, arg: &str, auto_pull: bool) -> String {
    match registry::resolve_in(home, arg, auto_pull) {
        Ok(r) => panic!("`{arg}` resolved to {r:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn unknown_names_list_the_known_models() {
    let home = tempfile::tempdir().unwrap();
    let e = resolve_err(home.path(), "llama-70b", true);
    assert!(e.contains("unknown model name"), "{e}");
    for m in registry::known_models() {
        assert!(e.contains(m.name), "{e}");
    }
    assert!(
        e.contains("smollm2-135m (default)") && e.contains("existing path"),
        "{e}"
    );

    let e = registry::pull_into(home.path(), "llama-70b", false)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("unknown model `llama-70b`") && e.contains("qwen2.5-coder-1.5b"),
        "{e}"
    );
    assert!(registry::pull("no-such-model", false).is_err());
    assert!(!registry::is_present("no-such-model"));
}

#[test]
fn missing_paths_are_reported_as_paths() {
    let home = tempfile::tempdir().unwrap();
    let e = resolve_err(home.path(), "/nonexistent/dir/model.gguf", true);
    assert!(
        e.contains("/nonexistent/dir/model.gguf") && e.contains("path does not exist"),
        "{e}"
    );
    let e = resolve_err(home.path(), "weights.gguf", false);
    assert!(e.contains("path does not exist"), "{e}");
}

#[test]
fn directories_and_files() {
    let dir = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();

    let e = resolve_err(home.path(), d, false);
    assert!(e.contains("no config.json"), "{e}");

    fs::write(dir.path().join("config.json"), "{}").unwrap();
    assert_eq!(
        registry::resolve_in(home.path(), d, false).unwrap(),
        ResolvedModel::HfDir(dir.path().to_path_buf())
    );

    // A .gguf extension or the GGUF magic marks a GGUF file.
    let by_ext = dir.path().join("m.gguf");
    fs::write(&by_ext, b"anything").unwrap();
    assert_eq!(
        registry::resolve_in(home.path(), by_ext.to_str().unwrap(), false).unwrap(),
        ResolvedModel::Gguf(by_ext.clone())
    );
    let by_magic = dir.path().join("model.bin");
    fs::write(&by_magic, b"GGUF\x03\0\0\0").unwrap();
    assert_eq!(
        registry::resolve_in(home.path(), by_magic.to_str().unwrap(), false).unwrap(),
        ResolvedModel::Gguf(by_magic.clone())
    );
    let other = dir.path().join("notes.txt");
    fs::write(&other, b"hello").unwrap();
    let e = resolve_err(home.path(), other.to_str().unwrap(), false);
    assert!(e.contains("not a GGUF model"), "{e}");
}

#[test]
fn known_name_without_auto_pull_says_to_pull() {
    let home = tempfile::tempdir().unwrap();
    let e = resolve_err(home.path(), "qwen2.5-coder-1.5b", false);
    assert!(
        e.contains("not downloaded") && e.contains("qwen2.5-coder-1.5b.gguf"),
        "{e}"
    );
    assert!(!registry::is_present_in(home.path(), "qwen2.5-coder-1.5b"));
}

#[test]
fn cached_file_is_found_by_name_when_its_size_matches() {
    let home = tempfile::tempdir().unwrap();
    let m = registry::find_model(DEFAULT_MODEL).unwrap();
    let path = registry::model_path_in(home.path(), DEFAULT_MODEL);
    assert_eq!(path, home.path().join("models").join("smollm2-135m.gguf"));
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    // A sparse file of the right size stands in for the real one.
    fs::File::create(&path).unwrap().set_len(m.size).unwrap();
    assert!(registry::is_present_in(home.path(), DEFAULT_MODEL));
    assert_eq!(
        registry::resolve_in(home.path(), DEFAULT_MODEL, false).unwrap(),
        ResolvedModel::Gguf(path.clone())
    );
    assert_eq!(
        registry::pull_into(home.path(), DEFAULT_MODEL, false).unwrap(),
        path
    );
}

#[test]
fn home_and_model_paths() {
    let home = registry::home_dir();
    assert_eq!(
        registry::model_path("x"),
        home.join("models").join("x.gguf")
    );
}

/// The real default model: pulled (a cache hit when the cache is warm), then parsed.
#[test]
fn real_default_model() {
    let path = registry::pull(DEFAULT_MODEL, false).expect("pulling the default model");
    assert!(registry::is_present(DEFAULT_MODEL));
    let g = GgufFile::open(&path).unwrap();
    assert_eq!(g.version, 3);
    assert_eq!(g.architecture().unwrap(), Arch::Llama);
    assert_eq!(g.tensors.len(), 272);
    assert_eq!(g.get_u32("llama.block_count").unwrap(), 30);
    assert_eq!(g.get_u32("llama.embedding_length").unwrap(), 576);
    assert_eq!(g.get_u32("llama.attention.head_count").unwrap(), 9);
    assert_eq!(g.get_u32("llama.attention.head_count_kv").unwrap(), 3);
    let emb = g.tensor_info("token_embd.weight").unwrap();
    assert_eq!(emb.ty, GgmlType::Q8_0);
    let q = g.tensor_info("blk.0.attn_q.weight").unwrap();
    assert_eq!((q.ty, q.dims.as_slice()), (GgmlType::Q4_1, &[576, 576][..]));
    assert_eq!(
        g.get_str_array("tokenizer.ggml.tokens").unwrap().len(),
        49152
    );

    let set = g.tensor_set().unwrap();
    assert_eq!(set.len(), 272);
    let cfg = ModelConfig::from_gguf(&g).unwrap();
    assert_eq!(
        (
            cfg.n_layers,
            cfg.d_model,
            cfg.n_heads,
            cfg.n_kv_heads,
            cfg.head_dim
        ),
        (30, 576, 9, 3, 64)
    );
    assert_eq!(
        (cfg.vocab_size, cfg.rope_style),
        (49152, RopeStyle::Interleaved)
    );
    // The last tensor ends within the file and nothing overlaps the header.
    assert!(g
        .tensors
        .iter()
        .all(|t| t.offset >= g.data_offset && t.offset + t.n_bytes <= g.file_size()));
}
