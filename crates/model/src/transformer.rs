//! The decoder-only transformer shared by the llama and qwen2 architectures:
//! pre-norm blocks of GQA self-attention with RoPE and a SwiGLU MLP.
//!
//! Weights stay in their checkpoint type (memory-mapped); every matmul quantizes its
//! input once to Q8 blocks and runs integer dot products (see `pagellm_kernels`).
//! Architecture files (`llama.rs`, `qwen2.rs`) only map checkpoint tensors onto
//! [`Transformer`]; the computation is written once, here.

use pagellm_kernels::matmul::{matmul, matmul_many, Activations, MatmulJob, WeightRef};
use pagellm_kernels::ops::{self, attention, rope::RopeTable};
use pagellm_kernels::pool::ThreadPool;
use pagellm_kernels::quant::dequantize_row;

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::kv::SeqKvCache;
use crate::tensor::{Tensor, TensorSet};

/// One transformer block. Field names follow the GGUF tensor names.
pub struct Layer {
    pub attn_norm: Vec<f32>,
    pub attn_q: Tensor,
    pub attn_k: Tensor,
    pub attn_v: Tensor,
    pub attn_q_bias: Option<Vec<f32>>,
    pub attn_k_bias: Option<Vec<f32>>,
    pub attn_v_bias: Option<Vec<f32>>,
    pub attn_output: Tensor,
    pub ffn_norm: Vec<f32>,
    pub ffn_gate: Tensor,
    pub ffn_up: Tensor,
    pub ffn_down: Tensor,
}

pub struct Transformer {
    pub config: ModelConfig,
    pub token_embd: Tensor,
    pub layers: Vec<Layer>,
    pub output_norm: Vec<f32>,
    /// The LM head; the same tensor as `token_embd` when embeddings are tied.
    pub output: Tensor,
    pub tied_embeddings: bool,
    rope: RopeTable,
}

/// Which positions of a forward pass need logits. The LM head is the single largest
/// matmul of a small model, so prefill computes it for the last token only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    None,
    Last,
    All,
}

/// Buffers reused across forward passes so the hot path never allocates after warm-up.
#[derive(Default)]
pub struct Workspace {
    x: Vec<f32>,
    xn: Activations,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    attn: Activations,
    o: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    h: Activations,
    positions: Vec<usize>,
    /// (rows, vocab) logits of the last forward pass.
    pub logits: Vec<f32>,
}

fn weight(t: &Tensor) -> WeightRef<'_> {
    WeightRef {
        ty: t.ty,
        data: t.data(),
        rows: t.rows(),
        cols: t.cols(),
    }
}

/// Loads a 1-D f32 vector (norm weights, biases) of length `n`.
pub(crate) fn load_vec(tensors: &TensorSet, name: &str, n: usize) -> Result<Vec<f32>> {
    Ok(tensors.get(name)?.expect_shape(&[n])?.to_f32())
}

/// Loads a matrix of `rows` outputs by `cols` inputs (GGML shape `[cols, rows]`).
pub(crate) fn load_mat(
    tensors: &TensorSet,
    name: &str,
    cols: usize,
    rows: usize,
) -> Result<Tensor> {
    Ok(tensors.get(name)?.expect_shape(&[cols, rows])?.clone())
}

impl Transformer {
    /// Maps GGUF-named tensors onto the model; `biases` selects qwen2's Q/K/V biases.
    pub(crate) fn from_tensors(config: ModelConfig, t: &TensorSet, biases: bool) -> Result<Self> {
        config.validate()?;
        let c = &config;
        let (d, qd, kvd, ff) = (c.d_model, c.q_dim(), c.kv_dim(), c.d_ff);
        let token_embd = load_mat(t, "token_embd.weight", d, c.vocab_size)?;
        let (output, tied_embeddings) = if t.contains("output.weight") {
            (load_mat(t, "output.weight", d, c.vocab_size)?, false)
        } else {
            (token_embd.clone(), true)
        };
        let mut layers = Vec::with_capacity(c.n_layers);
        for i in 0..c.n_layers {
            let n = |s: &str| format!("blk.{i}.{s}");
            let bias = |s: &str, len: usize| -> Result<Option<Vec<f32>>> {
                biases.then(|| load_vec(t, &n(s), len)).transpose()
            };
            layers.push(Layer {
                attn_norm: load_vec(t, &n("attn_norm.weight"), d)?,
                attn_q: load_mat(t, &n("attn_q.weight"), d, qd)?,
                attn_k: load_mat(t, &n("attn_k.weight"), d, kvd)?,
                attn_v: load_mat(t, &n("attn_v.weight"), d, kvd)?,
                attn_q_bias: bias("attn_q.bias", qd)?,
                attn_k_bias: bias("attn_k.bias", kvd)?,
                attn_v_bias: bias("attn_v.bias", kvd)?,
                attn_output: load_mat(t, &n("attn_output.weight"), qd, d)?,
                ffn_norm: load_vec(t, &n("ffn_norm.weight"), d)?,
                ffn_gate: load_mat(t, &n("ffn_gate.weight"), d, ff)?,
                ffn_up: load_mat(t, &n("ffn_up.weight"), d, ff)?,
                ffn_down: load_mat(t, &n("ffn_down.weight"), ff, d)?,
            });
        }
        let output_norm = load_vec(t, "output_norm.weight", d)?;
        let mut rope = RopeTable::new(c.head_dim, c.rope_theta, c.rope_style);
        rope.ensure(c.context_length.min(1 << 17));
        Ok(Self {
            config,
            token_embd,
            layers,
            output_norm,
            output,
            tied_embeddings,
            rope,
        })
    }

    /// A KV cache for one sequence of up to `capacity` tokens.
    pub fn new_cache(&self, capacity: usize) -> SeqKvCache {
        SeqKvCache::new(
            self.config.n_layers,
            self.config.kv_dim(),
            capacity.min(self.max_context()),
        )
    }

    /// Longest sequence this model can run (RoPE table and trained context).
    pub fn max_context(&self) -> usize {
        self.config.context_length.min(1 << 17)
    }

    /// Runs `tokens` at positions `cache.len()..` through the model, appending their keys
    /// and values to `cache`, and returns the requested logits: (rows, vocab) where rows
    /// is 0, 1 or `tokens.len()` for `Logits::{None, Last, All}`.
    pub fn forward<'w>(
        &self,
        pool: &ThreadPool,
        ws: &'w mut Workspace,
        cache: &mut SeqKvCache,
        tokens: &[u32],
        want: Logits,
    ) -> Result<&'w [f32]> {
        let c = &self.config;
        let n = tokens.len();
        let (d, qd, kvd, ff) = (c.d_model, c.q_dim(), c.kv_dim(), c.d_ff);
        let start = cache.len();
        if n == 0 {
            return Err(ModelError::Other("forward pass over zero tokens".into()));
        }
        if start + n > cache.capacity() {
            return Err(ModelError::Other(format!(
                "sequence of {} tokens exceeds the context window of {}",
                start + n,
                cache.capacity()
            )));
        }
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= c.vocab_size) {
            return Err(ModelError::Other(format!(
                "token id {bad} is outside the vocabulary of {}",
                c.vocab_size
            )));
        }
        ws.positions.clear();
        ws.positions.extend(start..start + n);

        // x: (n, d) embeddings.
        ws.x.resize(n * d, 0.0);
        for (row, &tok) in ws.x.chunks_exact_mut(d).zip(tokens) {
            dequantize_row(self.token_embd.ty, self.token_embd.row(tok as usize), row);
        }
        ws.q.resize(n * qd, 0.0);
        ws.k.resize(n * kvd, 0.0);
        ws.v.resize(n * kvd, 0.0);
        ws.o.resize(n * d, 0.0);
        ws.gate.resize(n * ff, 0.0);
        ws.up.resize(n * ff, 0.0);
        let shape = attention::AttnShape {
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            head_dim: c.head_dim,
        };

        for (li, l) in self.layers.iter().enumerate() {
            // Attention block.
            ops::rmsnorm(&ws.x, &l.attn_norm, c.rms_eps, ws.xn.reset(n, d));
            matmul_many(
                pool,
                &mut ws.xn,
                &mut [
                    MatmulJob {
                        w: weight(&l.attn_q),
                        out: &mut ws.q,
                    },
                    MatmulJob {
                        w: weight(&l.attn_k),
                        out: &mut ws.k,
                    },
                    MatmulJob {
                        w: weight(&l.attn_v),
                        out: &mut ws.v,
                    },
                ],
            );
            for (buf, bias) in [
                (&mut ws.q, &l.attn_q_bias),
                (&mut ws.k, &l.attn_k_bias),
                (&mut ws.v, &l.attn_v_bias),
            ] {
                if let Some(b) = bias {
                    for row in buf.chunks_exact_mut(b.len()) {
                        ops::add_inplace(row, b);
                    }
                }
            }
            self.rope.apply(&mut ws.q, c.n_heads, &ws.positions);
            self.rope.apply(&mut ws.k, c.n_kv_heads, &ws.positions);
            cache.write(li, start, &ws.k, &ws.v);
            let kv = cache.view(li, c.n_kv_heads, c.head_dim);
            attention::attention(pool, shape, &ws.q, &ws.positions, &kv, ws.attn.reset(n, qd));
            matmul(pool, &mut ws.attn, weight(&l.attn_output), &mut ws.o);
            ops::add_inplace(&mut ws.x, &ws.o);

            // MLP block.
            ops::rmsnorm(&ws.x, &l.ffn_norm, c.rms_eps, ws.xn.reset(n, d));
            matmul_many(
                pool,
                &mut ws.xn,
                &mut [
                    MatmulJob {
                        w: weight(&l.ffn_gate),
                        out: &mut ws.gate,
                    },
                    MatmulJob {
                        w: weight(&l.ffn_up),
                        out: &mut ws.up,
                    },
                ],
            );
            ops::silu_mul(&ws.gate, &ws.up, ws.h.reset(n, ff));
            matmul(pool, &mut ws.h, weight(&l.ffn_down), &mut ws.o);
            ops::add_inplace(&mut ws.x, &ws.o);
        }
        cache.advance(n);

        let rows = match want {
            Logits::None => return Ok(&ws.logits[..0]),
            Logits::Last => n - 1..n,
            Logits::All => 0..n,
        };
        let m = rows.len();
        ops::rmsnorm(
            &ws.x[rows.start * d..rows.end * d],
            &self.output_norm,
            c.rms_eps,
            ws.xn.reset(m, d),
        );
        ws.logits.resize(m * c.vocab_size, 0.0);
        matmul(pool, &mut ws.xn, weight(&self.output), &mut ws.logits);
        Ok(&ws.logits[..m * c.vocab_size])
    }
}
