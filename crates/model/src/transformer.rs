//! The decoder-only transformer shared by the llama and qwen2 architectures:
//! pre-norm blocks of GQA self-attention with RoPE and a SwiGLU MLP.
//!
//! Weights stay in their checkpoint type (memory-mapped); every matmul quantizes its
//! input once to Q8 blocks and runs integer dot products (see `pagellm_kernels`).
//! Architecture files (`llama.rs`, `qwen2.rs`) only map checkpoint tensors onto
//! [`Transformer`]; the computation is written once, here.

use pagellm_kernels::cpu::Numerics;
use pagellm_kernels::matmul::{matmul, matmul_many, Activations, MatmulJob, WeightRef};
use pagellm_kernels::ops::{self, attention, rope::RopeTable};
use pagellm_kernels::pool::ThreadPool;
use pagellm_kernels::quant::interleave;

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::kv::{KvDtype, PagedKvCache, SeqKvCache};
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

impl Layer {
    /// The layer's weight matrices.
    fn mats_mut(&mut self) -> [&mut Tensor; 7] {
        [
            &mut self.attn_q,
            &mut self.attn_k,
            &mut self.attn_v,
            &mut self.attn_output,
            &mut self.ffn_gate,
            &mut self.ffn_up,
            &mut self.ffn_down,
        ]
    }
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

/// Where in a layer [`Transformer::run_layer`] shows activations to a capture: the
/// input of each group of linear layers that share one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Site {
    /// The normed hidden states entering Q, K and V.
    Qkv,
    /// The attention output entering the output projection.
    AttnOutput,
    /// The normed hidden states entering gate and up.
    GateUp,
    /// `silu(gate) · up` entering down.
    Down,
}

/// A callback shown each [`Site`]'s activations, `(n_tokens, width)` row-major.
pub type Capture<'a> = &'a mut dyn FnMut(Site, &[f32]);

/// Which positions of a forward pass need logits. The LM head is the single largest
/// matmul of a small model, so prefill computes it for the last token only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    None,
    Last,
    All,
}

/// One sequence's share of a batched forward pass.
#[derive(Debug, Clone)]
pub struct SeqSlice {
    /// New tokens of this sequence in the batch (consecutive in `Batch::tokens`).
    pub n_tokens: usize,
    /// Position of the first new token: the tokens already in the KV cache.
    pub pos0: usize,
    /// Positions from which attention uses the decode summation order (see
    /// [`pagellm_kernels::ops::attention::AttnSeq`]).
    pub decode_from: usize,
    /// This sequence's block table: a range of `Batch::block_tables`.
    pub table: std::ops::Range<usize>,
    /// Which of its rows need logits.
    pub logits: Logits,
}

/// A flattened, ragged batch: prefill chunks and decodes of many sequences in one pass.
#[derive(Debug, Clone, Default)]
pub struct Batch {
    pub tokens: Vec<u32>,
    pub seqs: Vec<SeqSlice>,
    /// Every sequence's block table, back to back.
    pub block_tables: Vec<u32>,
}

impl Batch {
    pub fn clear(&mut self) {
        self.tokens.clear();
        self.seqs.clear();
        self.block_tables.clear();
    }

    /// Appends a sequence's new tokens.
    pub fn push(
        &mut self,
        tokens: &[u32],
        pos0: usize,
        decode_from: usize,
        table: &[u32],
        logits: Logits,
    ) {
        let t0 = self.block_tables.len();
        self.block_tables.extend_from_slice(table);
        self.tokens.extend_from_slice(tokens);
        self.seqs.push(SeqSlice {
            n_tokens: tokens.len(),
            pos0,
            decode_from,
            table: t0..self.block_tables.len(),
            logits,
        });
    }

    /// Rows of logits a forward pass over this batch returns.
    pub fn logits_rows(&self) -> usize {
        self.seqs
            .iter()
            .map(|s| match s.logits {
                Logits::None => 0,
                Logits::Last => 1,
                Logits::All => s.n_tokens,
            })
            .sum()
    }
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
    slots: Vec<usize>,
    logit_rows: Vec<usize>,
    x_sel: Vec<f32>,
    single: Batch,
    /// (rows, vocab) logits of the last forward pass.
    pub logits: Vec<f32>,
}

impl Workspace {
    /// A workspace whose forward passes use `numerics` (a default one takes
    /// `PAGELLM_SIMD`'s, see [`pagellm_kernels::cpu::default_numerics`]).
    pub fn with_numerics(numerics: Numerics) -> Self {
        let mut ws = Self::default();
        for a in [&mut ws.xn, &mut ws.attn, &mut ws.h] {
            a.set_numerics(numerics);
        }
        ws
    }

    /// The arithmetic of this workspace's forward passes.
    pub fn numerics(&self) -> Numerics {
        self.xn.numerics()
    }
}

fn weight(t: &Tensor) -> WeightRef<'_> {
    WeightRef {
        ty: t.ty,
        data: t.data(),
        rows: t.rows(),
        cols: t.cols(),
        params: t.params(),
        packed: t.packed(),
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
        let mut output = output;
        if interleave::repack_enabled() {
            let mut mats: Vec<&mut Tensor> = layers
                .iter_mut()
                .flat_map(|l| l.mats_mut())
                .chain([&mut output])
                .collect();
            Tensor::repack_all(&mut mats);
        }
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
        self.new_cache_with(capacity, KvDtype::F16)
    }

    /// A one-sequence cache with entries in `dtype`.
    pub fn new_cache_with(&self, capacity: usize, dtype: KvDtype) -> SeqKvCache {
        SeqKvCache::with_dtype(
            self.config.n_layers,
            self.config.n_kv_heads,
            self.config.head_dim,
            capacity.min(self.max_context()),
            dtype,
        )
    }

    /// Longest sequence this model can run (RoPE table and trained context).
    pub fn max_context(&self) -> usize {
        self.config.context_length.min(1 << 17)
    }

    /// A paged KV cache of `num_blocks` blocks of `block_size` tokens for this model.
    pub fn new_paged_cache(
        &self,
        block_size: usize,
        num_blocks: usize,
        dtype: KvDtype,
    ) -> Result<PagedKvCache> {
        PagedKvCache::new(
            self.config.n_layers,
            self.config.n_kv_heads,
            self.config.head_dim,
            block_size,
            num_blocks,
            dtype,
        )
    }

    /// Runs `tokens` at positions `cache.len()..` through the model, appending their keys
    /// and values to `cache`, and returns the requested logits: (rows, vocab) where rows
    /// is 0, 1 or `tokens.len()` for `Logits::{None, Last, All}`.
    ///
    /// Summation orders follow llama.cpp for a batch of this many tokens: a one-token
    /// call is a decode step, a longer one a prompt batch.
    pub fn forward<'w>(
        &self,
        pool: &ThreadPool,
        ws: &'w mut Workspace,
        cache: &mut SeqKvCache,
        tokens: &[u32],
        want: Logits,
    ) -> Result<&'w [f32]> {
        let start = cache.len();
        if start + tokens.len() > cache.capacity() {
            return Err(ModelError::Other(format!(
                "sequence of {} tokens exceeds the context window of {}",
                start + tokens.len(),
                cache.capacity()
            )));
        }
        let mut batch = std::mem::take(&mut ws.single);
        batch.clear();
        let decode_from = if tokens.len() == 1 { 0 } else { usize::MAX };
        batch.push(tokens, start, decode_from, &[0], want);
        let r = self
            .forward_batch(pool, ws, &mut cache.paged, &batch)
            .map(|_| ());
        ws.single = batch;
        r?;
        cache.advance(tokens.len());
        Ok(&ws.logits)
    }

    /// Runs one step of a ragged batch: each sequence's new tokens at positions
    /// `pos0..`, their keys and values written into `cache` through the sequence's block
    /// table, attention reading everything before them through the same table. Returns
    /// (rows, vocab) logits for the rows each sequence asked for, in batch order.
    ///
    /// A row's result does not depend on the other rows of the batch for weights in
    /// 32-element block formats and float types (the dot products of one row are summed
    /// the same way whatever the batch); K-quant weights follow llama.cpp's
    /// batch-size-dependent paths.
    pub fn forward_batch<'w>(
        &self,
        pool: &ThreadPool,
        ws: &'w mut Workspace,
        cache: &mut PagedKvCache,
        batch: &Batch,
    ) -> Result<&'w [f32]> {
        self.begin_layers(ws, cache, batch)?;
        for li in 0..self.layers.len() {
            self.run_layer(pool, ws, cache, batch, li, None);
        }
        Ok(self.head(pool, ws))
    }

    /// Checks `batch` against the model and the cache and puts the embeddings of its
    /// tokens into the workspace, ready for [`Transformer::run_layer`] from layer 0.
    pub fn begin_layers(
        &self,
        ws: &mut Workspace,
        cache: &PagedKvCache,
        batch: &Batch,
    ) -> Result<()> {
        let c = &self.config;
        let n = batch.tokens.len();
        let (d, qd, kvd, ff) = (c.d_model, c.q_dim(), c.kv_dim(), c.d_ff);
        if n == 0 {
            return Err(ModelError::Other("forward pass over zero tokens".into()));
        }
        if let Some(&bad) = batch.tokens.iter().find(|&&t| t as usize >= c.vocab_size) {
            return Err(ModelError::Other(format!(
                "token id {bad} is outside the vocabulary of {}",
                c.vocab_size
            )));
        }
        let bs = cache.block_size();
        ws.positions.clear();
        ws.slots.clear();
        ws.logit_rows.clear();
        let mut row = 0;
        for s in &batch.seqs {
            let end = s.pos0 + s.n_tokens;
            if end > self.max_context() {
                return Err(ModelError::Other(format!(
                    "sequence of {end} tokens exceeds the context window of {}",
                    self.max_context()
                )));
            }
            let table = &batch.block_tables[s.table.clone()];
            if table.len() * bs < end {
                return Err(ModelError::Other(format!(
                    "block table of {} blocks cannot hold {end} tokens",
                    table.len()
                )));
            }
            if let Some(&b) = table.iter().find(|&&b| b as usize >= cache.num_blocks()) {
                return Err(ModelError::Other(format!(
                    "block {b} is outside the KV cache of {} blocks",
                    cache.num_blocks()
                )));
            }
            for p in s.pos0..end {
                ws.positions.push(p);
                ws.slots.push(table[p / bs] as usize * bs + p % bs);
            }
            match s.logits {
                Logits::None => {}
                Logits::Last => ws.logit_rows.push(row + s.n_tokens - 1),
                Logits::All => ws.logit_rows.extend(row..row + s.n_tokens),
            }
            row += s.n_tokens;
        }
        if row != n {
            return Err(ModelError::Other(format!(
                "batch sequences cover {row} tokens but the batch has {n}"
            )));
        }

        // x: (n, d) embeddings.
        ws.x.resize(n * d, 0.0);
        for (row, &tok) in ws.x.chunks_exact_mut(d).zip(&batch.tokens) {
            self.token_embd.dequantize_row(tok as usize, row);
        }
        ws.q.resize(n * qd, 0.0);
        ws.k.resize(n * kvd, 0.0);
        ws.v.resize(n * kvd, 0.0);
        ws.o.resize(n * d, 0.0);
        ws.gate.resize(n * ff, 0.0);
        ws.up.resize(n * ff, 0.0);
        Ok(())
    }

    /// Runs layer `li` on the workspace's hidden states (after [`Transformer::begin_layers`]
    /// and layers `0..li`). `capture`, if given, sees the input of each group of linear
    /// layers, `(n_tokens, width)` row-major, before it is multiplied; calibration reads
    /// them there.
    pub fn run_layer(
        &self,
        pool: &ThreadPool,
        ws: &mut Workspace,
        cache: &mut PagedKvCache,
        batch: &Batch,
        li: usize,
        mut capture: Option<Capture<'_>>,
    ) {
        let c = &self.config;
        let n = batch.tokens.len();
        let (d, qd, kvd, ff) = (c.d_model, c.q_dim(), c.kv_dim(), c.d_ff);
        let l = &self.layers[li];
        let shape = attention::AttnShape {
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            head_dim: c.head_dim,
        };
        // Row-wise steps run split by rows across the pool for a prompt's many rows
        // (`rows_mut`); each row's arithmetic is the same either way.
        // Attention block.
        rmsnorm_rows(pool, &ws.x, &l.attn_norm, c.rms_eps, ws.xn.reset(n, d));
        if let Some(f) = capture.as_mut() {
            f(Site::Qkv, &ws.xn.f32);
        }
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
        for (buf, heads) in [(&mut ws.q, c.n_heads), (&mut ws.k, c.n_kv_heads)] {
            let (rope, positions) = (&self.rope, &ws.positions);
            pool.rows_mut(buf, heads * c.head_dim, &|i, tok| {
                rope.apply_token(tok, positions[i])
            });
        }
        for (t, &slot) in ws.slots.iter().enumerate() {
            cache.write(
                li,
                slot,
                &ws.k[t * kvd..(t + 1) * kvd],
                &ws.v[t * kvd..(t + 1) * kvd],
            );
        }
        let mut token0 = 0;
        let seqs: Vec<_> = batch
            .seqs
            .iter()
            .map(|s| {
                let a = attention::AttnSeq {
                    token0,
                    pos0: s.pos0,
                    n_tokens: s.n_tokens,
                    decode_from: s.decode_from,
                    kv: cache.view(li, &batch.block_tables[s.table.clone()]),
                };
                token0 += s.n_tokens;
                a
            })
            .collect();
        let reference = ws.numerics() == Numerics::Reference;
        let out = ws.attn.reset(n, qd);
        if reference {
            attention::attention_reference(pool, shape, &ws.q, &seqs, out);
        } else {
            attention::attention(pool, shape, &ws.q, &seqs, out);
        }
        if let Some(f) = capture.as_mut() {
            f(Site::AttnOutput, &ws.attn.f32);
        }
        matmul(pool, &mut ws.attn, weight(&l.attn_output), &mut ws.o);
        add_rows(pool, &mut ws.x, &ws.o, d);

        // MLP block.
        rmsnorm_rows(pool, &ws.x, &l.ffn_norm, c.rms_eps, ws.xn.reset(n, d));
        if let Some(f) = capture.as_mut() {
            f(Site::GateUp, &ws.xn.f32);
        }
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
        let (gate, up) = (&ws.gate, &ws.up);
        pool.rows_mut(ws.h.reset(n, ff), ff, &|i, h| {
            ops::silu_mul(&gate[i * ff..][..ff], &up[i * ff..][..ff], h)
        });
        if let Some(f) = capture.as_mut() {
            f(Site::Down, &ws.h.f32);
        }
        matmul(pool, &mut ws.h, weight(&l.ffn_down), &mut ws.o);
        add_rows(pool, &mut ws.x, &ws.o, d);
    }

    /// The final norm and the LM head over the rows that asked for logits.
    fn head<'w>(&self, pool: &ThreadPool, ws: &'w mut Workspace) -> &'w [f32] {
        let c = &self.config;
        let d = c.d_model;
        let m = ws.logit_rows.len();
        if m == 0 {
            ws.logits.clear();
            return &ws.logits;
        }
        ws.x_sel.clear();
        for &r in &ws.logit_rows {
            ws.x_sel.extend_from_slice(&ws.x[r * d..(r + 1) * d]);
        }
        ops::rmsnorm(&ws.x_sel, &self.output_norm, c.rms_eps, ws.xn.reset(m, d));
        ws.logits.resize(m * c.vocab_size, 0.0);
        matmul(pool, &mut ws.xn, weight(&self.output), &mut ws.logits);
        &ws.logits[..m * c.vocab_size]
    }
}

/// `out = rmsnorm(x) * w` row by row, split across the pool for many rows.
fn rmsnorm_rows(pool: &ThreadPool, x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let d = w.len();
    pool.rows_mut(out, d, &|i, row| {
        ops::rmsnorm(&x[i * d..][..d], w, eps, row)
    });
}

/// `x += o` row by row (the residual), split across the pool for many rows.
fn add_rows(pool: &ThreadPool, x: &mut [f32], o: &[f32], d: usize) {
    pool.rows_mut(x, d, &|i, row| ops::add_inplace(row, &o[i * d..][..d]));
}
