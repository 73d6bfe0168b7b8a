//! Tensor names: Hugging Face (`model.layers.3.mlp.up_proj.weight`) ⇄ GGUF
//! (`blk.3.ffn_up.weight`), as in llama.cpp's `gguf-py/gguf/tensor_mapping.py` for the
//! llama and qwen2 architectures.

/// Whole-model tensors.
const GLOBAL: [(&str, &str); 3] = [
    ("model.embed_tokens.weight", "token_embd.weight"),
    ("model.norm.weight", "output_norm.weight"),
    ("lm_head.weight", "output.weight"),
];

/// Per-layer tensors, after the `model.layers.{i}.` / `blk.{i}.` prefix.
const LAYER: [(&str, &str); 12] = [
    ("input_layernorm.weight", "attn_norm.weight"),
    ("self_attn.q_proj.weight", "attn_q.weight"),
    ("self_attn.k_proj.weight", "attn_k.weight"),
    ("self_attn.v_proj.weight", "attn_v.weight"),
    ("self_attn.o_proj.weight", "attn_output.weight"),
    ("self_attn.q_proj.bias", "attn_q.bias"),
    ("self_attn.k_proj.bias", "attn_k.bias"),
    ("self_attn.v_proj.bias", "attn_v.bias"),
    ("post_attention_layernorm.weight", "ffn_norm.weight"),
    ("mlp.gate_proj.weight", "ffn_gate.weight"),
    ("mlp.up_proj.weight", "ffn_up.weight"),
    ("mlp.down_proj.weight", "ffn_down.weight"),
];

/// Splits `"{prefix}{i}.{rest}"` into `(i, rest)`.
fn split_layer<'a>(name: &'a str, prefix: &str) -> Option<(usize, &'a str)> {
    let rest = name.strip_prefix(prefix)?;
    let (index, rest) = rest.split_once('.')?;
    if index.is_empty() || !index.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((index.parse().ok()?, rest))
}

fn map(name: &str, from_hf: bool) -> Option<String> {
    let (src_prefix, dst_prefix) = if from_hf {
        ("model.layers.", "blk.")
    } else {
        ("blk.", "model.layers.")
    };
    let pick = |&(hf, gguf): &(&'static str, &'static str)| {
        if from_hf {
            (hf, gguf)
        } else {
            (gguf, hf)
        }
    };
    if let Some((_, dst)) = GLOBAL.iter().map(pick).find(|(src, _)| *src == name) {
        return Some(dst.to_string());
    }
    let (i, rest) = split_layer(name, src_prefix)?;
    let (_, dst) = LAYER.iter().map(pick).find(|(src, _)| *src == rest)?;
    Some(format!("{dst_prefix}{i}.{dst}"))
}

/// The GGUF name of a Hugging Face tensor; `None` for tensors pagellm does not use.
pub(crate) fn hf_to_gguf(name: &str) -> Option<String> {
    map(name, true)
}

/// The Hugging Face name of a GGUF tensor; `None` for tensors with no counterpart.
pub(super) fn gguf_to_hf(name: &str) -> Option<String> {
    map(name, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_both_ways() {
        for (hf, gguf) in [
            ("model.embed_tokens.weight", "token_embd.weight"),
            ("lm_head.weight", "output.weight"),
            (
                "model.layers.0.self_attn.q_proj.weight",
                "blk.0.attn_q.weight",
            ),
            (
                "model.layers.17.self_attn.v_proj.bias",
                "blk.17.attn_v.bias",
            ),
            (
                "model.layers.3.mlp.down_proj.weight",
                "blk.3.ffn_down.weight",
            ),
        ] {
            assert_eq!(hf_to_gguf(hf).as_deref(), Some(gguf));
            assert_eq!(gguf_to_hf(gguf).as_deref(), Some(hf));
        }
        for unknown in [
            "model.layers.0.self_attn.rotary_emb.inv_freq",
            "model.layers.x.mlp.up_proj.weight",
            "model.layers..mlp.up_proj.weight",
            "rope_freqs.weight",
            "blk.0.attn_q.scale",
            "blk.0.",
        ] {
            assert_eq!(hf_to_gguf(unknown), None, "{unknown}");
            assert_eq!(gguf_to_hf(unknown), None, "{unknown}");
        }
    }
}
