//! A real model file, minimally damaged, must be refused with a message naming the damage.

use pagellm_kernels::pool::ThreadPool;
use pagellm_model::loader::load_gguf;
use pagellm_model::{registry, Logits, ModelError, Workspace};

fn real_model_bytes() -> Vec<u8> {
    std::fs::read(registry::pull("smollm2-135m", false).expect("model in cache")).unwrap()
}

fn find(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len())
        .position(|w| w == needle)
        .expect("needle present")
}

fn load_modified(edit: impl FnOnce(&mut Vec<u8>)) -> ModelError {
    let mut bytes = real_model_bytes();
    edit(&mut bytes);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("damaged.gguf");
    std::fs::write(&path, &bytes).unwrap();
    match load_gguf(&path) {
        Ok(_) => panic!("damaged model loaded"),
        Err(e) => e,
    }
}

#[test]
fn renamed_tensor_is_reported_missing() {
    let e = load_modified(|b| {
        let at = find(b, b"blk.3.ffn_up.weight");
        b[at + 10] = b'X'; // blk.3.ffn_uX.weight
    });
    assert!(
        matches!(e, ModelError::MissingTensor { ref name } if name == "blk.3.ffn_up.weight"),
        "{e}"
    );
}

#[test]
fn metadata_that_disagrees_with_tensor_shapes_is_reported() {
    let e = load_modified(|b| {
        // llama.feed_forward_length: key, then type u32 (4), then the value 1536.
        let key = b"llama.feed_forward_length";
        let at = find(b, key) + key.len() + 4;
        assert_eq!(u32::from_le_bytes(b[at..at + 4].try_into().unwrap()), 1536);
        b[at..at + 4].copy_from_slice(&1024u32.to_le_bytes());
    });
    let msg = e.to_string();
    assert!(
        msg.contains("ffn_gate.weight") && msg.contains("1536") && msg.contains("1024"),
        "{msg}"
    );
}

#[test]
fn unsupported_architecture_is_named() {
    let e = load_modified(|b| {
        // general.architecture = "llama" -> "llamb"
        let key = b"general.architecture";
        let at = find(b, key) + key.len() + 4 + 8;
        assert_eq!(&b[at..at + 5], b"llama");
        b[at + 4] = b'b';
    });
    assert!(e.to_string().contains("llamb"), "{e}");
}

#[test]
fn forward_rejects_out_of_vocabulary_tokens_and_context_overflow() {
    let m = load_gguf(&registry::pull("smollm2-135m", false).unwrap()).unwrap();
    let pool = ThreadPool::new(1);
    let mut ws = Workspace::default();
    let mut cache = m.transformer.new_cache(4);
    let e = m
        .transformer
        .forward(&pool, &mut ws, &mut cache, &[1, 49152], Logits::Last)
        .unwrap_err();
    assert!(e.to_string().contains("49152"), "{e}");
    assert_eq!(cache.len(), 0, "a refused batch leaves the cache untouched");
    let e = m
        .transformer
        .forward(&pool, &mut ws, &mut cache, &[1, 2, 3, 4, 5], Logits::Last)
        .unwrap_err();
    assert!(e.to_string().contains("context window"), "{e}");
    // The cache still works after both refusals.
    let logits = m
        .transformer
        .forward(&pool, &mut ws, &mut cache, &[504, 3575], Logits::Last)
        .unwrap();
    assert_eq!(logits.len(), 49152);
}
