//! The typed model configuration every architecture reads, parsed once from GGUF
//! metadata (`gguf.rs`) or a Hugging Face `config.json` (`hf.rs`).

use crate::error::{ModelError, Result};

/// Supported architectures (GGUF `general.architecture`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Qwen2,
}

impl Arch {
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "llama" => Ok(Arch::Llama),
            "qwen2" => Ok(Arch::Qwen2),
            other => Err(ModelError::UnsupportedArch(other.to_string())),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
        }
    }
}

pub use pagellm_kernels::ops::rope::RopeStyle;

#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub arch: Arch,
    /// Human-readable name (`general.name`), may be empty.
    pub name: String,
    pub n_layers: usize,
    /// Hidden size (`embedding_length`).
    pub d_model: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// MLP inner size (`feed_forward_length`).
    pub d_ff: usize,
    pub vocab_size: usize,
    /// Longest context the model was trained for.
    pub context_length: usize,
    pub rms_eps: f32,
    pub rope_theta: f32,
    pub rope_style: RopeStyle,
}

impl ModelConfig {
    /// Checks the relations between fields that the forward pass relies on.
    pub fn validate(&self) -> Result<()> {
        let err = |m: String| Err(ModelError::Config(m));
        if self.n_layers == 0 || self.d_model == 0 || self.n_heads == 0 || self.vocab_size == 0 {
            return err(format!("zero-sized dimension in {self:?}"));
        }
        if self.n_kv_heads == 0 || !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return err(format!(
                "n_heads ({}) must be a multiple of n_kv_heads ({})",
                self.n_heads, self.n_kv_heads
            ));
        }
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) || self.head_dim > 512 {
            return err(format!(
                "head_dim {} must be even and at most 512",
                self.head_dim
            ));
        }
        if self.d_model > 1 << 16 || self.d_ff > 1 << 18 || self.n_layers > 1024 {
            return err(format!("implausible dimensions in {self:?}"));
        }
        let eps_ok = self.rms_eps > 0.0 && self.rms_eps < 1.0;
        let theta_ok = self.rope_theta.is_finite() && self.rope_theta > 0.0;
        if !eps_ok || !theta_ok {
            return err(format!(
                "bad rms_eps {} or rope_theta {}",
                self.rms_eps, self.rope_theta
            ));
        }
        Ok(())
    }

    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }

    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }
}
