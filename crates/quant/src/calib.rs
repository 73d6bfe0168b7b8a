//! Calibration: the float model run layer by layer over calibration text, showing each
//! layer's linear inputs to the quantizers that need them (AWQ, GPTQ).

use pagellm_kernels::pool::ThreadPool;
use pagellm_model::loader::LoadedModel;
use pagellm_model::{Batch, KvDtype, Logits, PagedKvCache, Site, Workspace};

use crate::error::{QuantError, Result};

/// Where calibration text comes from and how much of it is used.
#[derive(Debug, Clone)]
pub struct CalibOptions {
    pub text: String,
    /// Where the text came from, for messages.
    pub source: String,
    pub samples: usize,
    pub seq_len: usize,
}

/// The inputs of one layer's groups of linear layers over every calibration token,
/// `(tokens, width)` row-major.
#[derive(Debug, Default)]
pub struct LayerInputs {
    pub tokens: usize,
    /// Tokens per calibration window (`tokens` is a whole number of windows).
    pub seq_len: usize,
    pub qkv: Vec<f32>,
    pub attn_output: Vec<f32>,
    pub gate_up: Vec<f32>,
    pub down: Vec<f32>,
}

/// The model over the calibration batch, one layer at a time.
pub struct Calibration<'m> {
    model: &'m LoadedModel,
    pool: &'m ThreadPool,
    ws: Workspace,
    cache: PagedKvCache,
    batch: Batch,
    next_layer: usize,
}

/// Cuts `samples` windows of `seq_len` tokens from the text, evenly spaced; each starts
/// with BOS when the model adds one.
pub fn windows(model: &LoadedModel, o: &CalibOptions) -> Result<Vec<Vec<u32>>> {
    if o.samples == 0 || o.seq_len < 2 {
        return Err(QuantError::Invalid(format!(
            "--calib-samples {} × --calib-seq-len {} selects no calibration tokens",
            o.samples, o.seq_len
        )));
    }
    if o.seq_len > model.transformer.max_context() {
        return Err(QuantError::Invalid(format!(
            "--calib-seq-len {} exceeds the model's context window of {}",
            o.seq_len,
            model.transformer.max_context()
        )));
    }
    let tokens = model.tokenizer.encode(&o.text, false, false)?;
    let need = o.samples * o.seq_len;
    if tokens.len() < need {
        return Err(QuantError::Invalid(format!(
            "--calib {}: {} tokens, fewer than the {need} that --calib-samples {} × \
             --calib-seq-len {} need",
            o.source,
            tokens.len(),
            o.samples,
            o.seq_len
        )));
    }
    let stride = tokens.len() / o.samples;
    let bos = model
        .tokenizer
        .bos_id()
        .filter(|_| model.tokenizer.add_bos());
    Ok((0..o.samples)
        .map(|i| {
            let mut w = tokens[i * stride..i * stride + o.seq_len].to_vec();
            if let Some(b) = bos {
                w[0] = b;
            }
            w
        })
        .collect())
}

impl<'m> Calibration<'m> {
    pub fn new(model: &'m LoadedModel, pool: &'m ThreadPool, windows: &[Vec<u32>]) -> Result<Self> {
        let t = &model.transformer;
        let bs = 16;
        let blocks: usize = windows.iter().map(|w| w.len().div_ceil(bs)).sum();
        let cache = t.new_paged_cache(bs, blocks, KvDtype::F32)?;
        let mut batch = Batch::default();
        let mut next = 0u32;
        for w in windows {
            let n = w.len().div_ceil(bs) as u32;
            let table: Vec<u32> = (next..next + n).collect();
            next += n;
            batch.push(w, 0, usize::MAX, &table, Logits::None);
        }
        let mut ws = Workspace::default();
        t.begin_layers(&mut ws, &cache, &batch)?;
        Ok(Self {
            model,
            pool,
            ws,
            cache,
            batch,
            next_layer: 0,
        })
    }

    /// The model being calibrated.
    pub fn model(&self) -> &'m LoadedModel {
        self.model
    }

    /// Runs the next layer and returns its linear inputs.
    pub fn next_layer(&mut self) -> LayerInputs {
        let mut inputs = LayerInputs {
            tokens: self.batch.tokens.len(),
            seq_len: self.batch.seqs[0].n_tokens,
            ..LayerInputs::default()
        };
        let mut keep = |site: Site, x: &[f32]| {
            let dst = match site {
                Site::Qkv => &mut inputs.qkv,
                Site::AttnOutput => &mut inputs.attn_output,
                Site::GateUp => &mut inputs.gate_up,
                Site::Down => &mut inputs.down,
            };
            dst.clear();
            dst.extend_from_slice(x);
        };
        self.model.transformer.run_layer(
            self.pool,
            &mut self.ws,
            &mut self.cache,
            &self.batch,
            self.next_layer,
            Some(&mut keep),
        );
        self.next_layer += 1;
        inputs
    }
}
