//! Perplexity and KL divergence over a text, the way llama.cpp's `llama-perplexity`
//! measures them, so the numbers of the two tools are comparable.
//!
//! The text is tokenized once (with BOS where the model adds one) and cut into
//! independent chunks of `ctx` tokens; each chunk starts a fresh KV cache with its first
//! token replaced by BOS, and only the second half of each chunk is scored (position
//! `j` predicts token `j + 1` for `j` in `ctx/2 .. ctx-1`), so every scored token sees at
//! least `ctx/2` tokens of context. Against a base model run in the same process, each
//! scored position also gets `KL(p_base ‖ p_model)` and whether the two top tokens agree.

use pagellm_kernels::cpu::Numerics;
use pagellm_kernels::pool::ThreadPool;
use pagellm_model::loader::LoadedModel;
use pagellm_model::{KvDtype, Logits, Workspace};
use serde::Serialize;

use crate::error::{QuantError, Result};

/// What to evaluate.
#[derive(Debug, Clone)]
pub struct EvalConfig {
    /// Tokens per chunk.
    pub ctx: usize,
    /// Evaluate at most this many chunks (`None` = all the text holds).
    pub max_chunks: Option<usize>,
}

/// Mean and standard error of a per-position quantity.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Estimate {
    pub mean: f64,
    pub stderr: f64,
}

/// KL divergence against the base model.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct KlStats {
    /// Mean KL(p_base ‖ p_model) in nats.
    pub mean: Estimate,
    pub median: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
    /// Share of scored positions where both models' most likely token is the same.
    pub top1_agreement: Estimate,
    /// The base model's perplexity on the same positions.
    pub base_ppl: f64,
}

/// The result for one model.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct EvalReport {
    pub model: String,
    pub chunks: usize,
    pub ctx: usize,
    pub scored_tokens: usize,
    /// Perplexity `exp(mean NLL)` with llama.cpp's standard error
    /// (`ppl · sqrt(var(NLL) / (n − 1))`).
    pub ppl: Estimate,
    pub kl: Option<KlStats>,
    /// Prompt-processing speed of the model over the evaluation, tokens per second.
    pub tokens_per_second: f64,
}

/// Log-softmax of one row of logits, in f64.
fn log_softmax(logits: &[f32], out: &mut Vec<f64>) {
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
    let sum: f64 = logits.iter().map(|&v| (v as f64 - max).exp()).sum();
    let lse = max + sum.ln();
    out.clear();
    out.extend(logits.iter().map(|&v| v as f64 - lse));
}

fn argmax(v: &[f64]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best
}

/// Mean and standard error (`sqrt(var / (n − 1))`).
fn estimate(values: &[f64]) -> Estimate {
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    let var = values.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
    let stderr = if values.len() > 1 {
        (var / (n - 1.0)).sqrt()
    } else {
        0.0
    };
    Estimate { mean, stderr }
}

/// The `q`-quantile of sorted values, interpolated as numpy does.
fn quantile(sorted: &[f64], q: f64) -> f64 {
    let pos = q * (sorted.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

/// The text's tokens cut into chunks of `ctx`, each starting with BOS when the model
/// adds one.
pub fn chunks(model: &LoadedModel, text: &str, cfg: &EvalConfig) -> Result<Vec<Vec<u32>>> {
    if cfg.ctx < 4 {
        return Err(QuantError::Invalid(format!(
            "--ctx {} is too small: at least 4 tokens per chunk",
            cfg.ctx
        )));
    }
    let max_ctx = model.transformer.max_context();
    if cfg.ctx > max_ctx {
        return Err(QuantError::Invalid(format!(
            "--ctx {} exceeds the model's context window of {max_ctx}",
            cfg.ctx
        )));
    }
    let tokens = model.tokenizer.encode(text, true, false)?;
    let n = tokens.len() / cfg.ctx;
    if n == 0 {
        return Err(QuantError::Invalid(format!(
            "the text has {} tokens, fewer than one chunk of --ctx {}",
            tokens.len(),
            cfg.ctx
        )));
    }
    let n = cfg.max_chunks.map_or(n, |m| m.min(n));
    let bos = model
        .tokenizer
        .bos_id()
        .filter(|_| model.tokenizer.add_bos());
    Ok((0..n)
        .map(|i| {
            let mut c = tokens[i * cfg.ctx..(i + 1) * cfg.ctx].to_vec();
            if let Some(b) = bos {
                c[0] = b;
            }
            c
        })
        .collect())
}

/// Runs one chunk and returns the log-probabilities of its scored positions, row by
/// row (`ctx − 1 − ctx/2` rows of the vocabulary).
fn score_chunk(
    model: &LoadedModel,
    pool: &ThreadPool,
    ws: &mut Workspace,
    chunk: &[u32],
    kv: KvDtype,
) -> Result<Vec<Vec<f64>>> {
    let t = &model.transformer;
    let mut cache = t.new_cache_with(chunk.len(), kv);
    let first = chunk.len() / 2;
    // The unscored first half needs no logits; the second half needs all of them.
    t.forward(pool, ws, &mut cache, &chunk[..first], Logits::None)?;
    let logits = t.forward(
        pool,
        ws,
        &mut cache,
        &chunk[first..chunk.len() - 1],
        Logits::All,
    )?;
    let vocab = t.config.vocab_size;
    Ok(logits
        .chunks_exact(vocab)
        .map(|row| {
            let mut lp = Vec::with_capacity(vocab);
            log_softmax(row, &mut lp);
            lp
        })
        .collect())
}

/// The model KL divergence is measured against, and the arithmetic it runs in: the
/// fast kernels with an f16 KV cache, or the float reference path
/// ([`Numerics::Reference`]) with an f32 one.
#[derive(Clone, Copy)]
pub struct Base<'a> {
    pub model: &'a LoadedModel,
    pub numerics: Numerics,
}

/// The base's log-probabilities in the file format of `llama-perplexity
/// --kl-divergence-base`, so that llama.cpp's KL divergence is measured against the
/// very base pagellm's is: `_logits_`, `n_ctx` (u32), `n_vocab` and `n_chunk` (i32),
/// the chunks' tokens (i32), then per scored position `2·⌈n_vocab/2⌉ + 4` u16: the f32
/// step and the f32 smallest kept log-probability, then each token's log-probability as
/// a 16-bit step count above it (log-probabilities more than 16 below the largest clamp
/// to 0), as `llama-perplexity --kl-divergence-base` writes them.
pub struct KldBaseWriter {
    out: std::io::BufWriter<std::fs::File>,
    vocab: usize,
    codes: Vec<u16>,
}

impl KldBaseWriter {
    /// Creates (or truncates) `path` and writes the header and the tokens of `chunks`.
    pub fn create(path: &std::path::Path, chunks: &[Vec<u32>], vocab: usize) -> Result<Self> {
        use std::io::Write;
        let io = |e: std::io::Error| QuantError::Invalid(format!("{}: {e}", path.display()));
        let ctx = chunks.first().map_or(0, Vec::len);
        let mut out = std::io::BufWriter::new(std::fs::File::create(path).map_err(io)?);
        out.write_all(b"_logits_").map_err(io)?;
        out.write_all(&(ctx as u32).to_le_bytes()).map_err(io)?;
        out.write_all(&(vocab as i32).to_le_bytes()).map_err(io)?;
        out.write_all(&(chunks.len() as i32).to_le_bytes())
            .map_err(io)?;
        for t in chunks.iter().flatten() {
            out.write_all(&(*t as i32).to_le_bytes()).map_err(io)?;
        }
        Ok(Self {
            out,
            vocab,
            codes: Vec::new(),
        })
    }

    /// Appends one chunk's scored rows of log-probabilities.
    fn write_rows(&mut self, rows: &[Vec<f64>]) -> Result<()> {
        use std::io::Write;
        let nv = 2 * self.vocab.div_ceil(2) + 4;
        for lp in rows {
            let max = lp.iter().copied().fold(f64::NEG_INFINITY, f64::max) as f32;
            let min = (lp.iter().copied().fold(f64::INFINITY, f64::min) as f32).max(max - 16.0);
            let step = (max - min) / 65535.0;
            self.codes.clear();
            self.codes.resize(nv, 0);
            self.codes[..2].copy_from_slice(&u32_halves(step.to_bits()));
            self.codes[2..4].copy_from_slice(&u32_halves(min.to_bits()));
            if step > 0.0 {
                for (c, &v) in self.codes[4..].iter_mut().zip(lp) {
                    let v = v as f32;
                    *c = if v > min {
                        ((v - min) / step).round_ties_even() as u16
                    } else {
                        0
                    };
                }
            }
            for c in &self.codes {
                self.out
                    .write_all(&c.to_le_bytes())
                    .map_err(|e| QuantError::Invalid(format!("writing the KL base: {e}")))?;
            }
        }
        Ok(())
    }

    /// Flushes the file.
    pub fn finish(mut self) -> Result<()> {
        use std::io::Write;
        self.out
            .flush()
            .map_err(|e| QuantError::Invalid(format!("writing the KL base: {e}")))
    }
}

/// The two little-endian u16 halves of an f32's bits, as the file stores the f32.
fn u32_halves(bits: u32) -> [u16; 2] {
    [bits as u16, (bits >> 16) as u16]
}

/// Evaluates `model` on `chunks` (from [`chunks`]) with its KV cache in `kv`, against
/// `base` when given, whose log-probabilities also go to `save_base` when given.
/// `progress` is called after each chunk with (done, total).
pub fn evaluate(
    model: &LoadedModel,
    base: Option<Base<'_>>,
    pool: &ThreadPool,
    chunks: &[Vec<u32>],
    kv: KvDtype,
    mut save_base: Option<&mut KldBaseWriter>,
    mut progress: impl FnMut(usize, usize),
) -> Result<EvalReport> {
    if let Some(b) = base {
        let (vm, vb) = (
            model.transformer.config.vocab_size,
            b.model.transformer.config.vocab_size,
        );
        if vm != vb {
            return Err(QuantError::Invalid(format!(
                "the base model's vocabulary ({vb}) differs from the model's ({vm}); KL \
                 divergence needs the same tokens"
            )));
        }
    }
    let ctx = chunks.first().map_or(0, Vec::len);
    let mut ws = Workspace::with_numerics(Numerics::Fast);
    let mut base_ws = Workspace::with_numerics(base.map_or(Numerics::Fast, |b| b.numerics));
    let mut nll = Vec::new();
    let mut base_nll = Vec::new();
    let mut kld = Vec::new();
    let mut agree = Vec::new();
    let mut seconds = 0.0;
    for (ci, chunk) in chunks.iter().enumerate() {
        let t0 = std::time::Instant::now();
        let rows = score_chunk(model, pool, &mut ws, chunk, kv)?;
        seconds += t0.elapsed().as_secs_f64();
        let base_rows = base
            .map(|b| {
                let kv = match b.numerics {
                    Numerics::Fast => KvDtype::F16,
                    Numerics::Reference => KvDtype::F32,
                };
                score_chunk(b.model, pool, &mut base_ws, chunk, kv)
            })
            .transpose()?;
        if let (Some(w), Some(br)) = (save_base.as_deref_mut(), &base_rows) {
            w.write_rows(br)?;
        }
        let first = chunk.len() / 2;
        for (j, lp) in rows.iter().enumerate() {
            let target = chunk[first + j + 1] as usize;
            nll.push(-lp[target]);
            if let Some(br) = &base_rows {
                let bp = &br[j];
                base_nll.push(-bp[target]);
                let kl: f64 = bp
                    .iter()
                    .zip(lp)
                    .map(|(&b, &m)| if b > -700.0 { b.exp() * (b - m) } else { 0.0 })
                    .sum();
                kld.push(kl.max(0.0));
                agree.push(if argmax(bp) == argmax(lp) { 1.0 } else { 0.0 });
            }
        }
        progress(ci + 1, chunks.len());
    }
    let ppl_of = |nll: &[f64]| {
        let e = estimate(nll);
        let ppl = e.mean.exp();
        Estimate {
            mean: ppl,
            stderr: ppl * e.stderr,
        }
    };
    let kl = base.map(|_| {
        let mut sorted = kld.clone();
        sorted.sort_by(|a, b| a.partial_cmp(b).expect("finite"));
        KlStats {
            mean: estimate(&kld),
            median: quantile(&sorted, 0.5),
            p99: quantile(&sorted, 0.99),
            p999: quantile(&sorted, 0.999),
            max: *sorted.last().expect("non-empty"),
            top1_agreement: estimate(&agree),
            base_ppl: ppl_of(&base_nll).mean,
        }
    });
    let scored = nll.len();
    Ok(EvalReport {
        model: model.source.clone(),
        chunks: chunks.len(),
        ctx,
        scored_tokens: scored,
        ppl: ppl_of(&nll),
        kl,
        tokens_per_second: (chunks.len() * (ctx - 1)) as f64 / seconds.max(1e-9),
    })
}

/// The results table: one row per model.
pub fn table(reports: &[EvalReport]) -> String {
    let mut s = String::from(
        "| model | PPL | mean KLD | KLD p99 | top-1 agree | tok/s |\n|---|---|---|---|---|---|\n",
    );
    for r in reports {
        let (kl, p99, top) = match &r.kl {
            Some(k) => (
                format!("{:.5} ± {:.5}", k.mean.mean, k.mean.stderr),
                format!("{:.4}", k.p99),
                format!(
                    "{:.2}% ± {:.2}",
                    100.0 * k.top1_agreement.mean,
                    100.0 * k.top1_agreement.stderr
                ),
            ),
            None => ("—".into(), "—".into(), "—".into()),
        };
        s.push_str(&format!(
            "| {} | {:.4} ± {:.4} | {kl} | {p99} | {top} | {:.1} |\n",
            r.model, r.ppl.mean, r.ppl.stderr, r.tokens_per_second
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn estimates_match_numpy() {
        let e = estimate(&[1.0, 2.0, 3.0, 4.0]);
        assert_eq!(e.mean, 2.5);
        // population var 1.25; / (n - 1) = 0.41667
        assert!((e.stderr - (1.25f64 / 3.0).sqrt()).abs() < 1e-12);
        let s = [0.0, 1.0, 2.0, 3.0, 4.0];
        assert_eq!(quantile(&s, 0.5), 2.0);
        assert!((quantile(&s, 0.99) - 3.96).abs() < 1e-12);
    }

    #[test]
    fn log_softmax_normalizes() {
        let mut lp = Vec::new();
        log_softmax(&[1.0, 2.0, 3.0, 1000.0], &mut lp);
        let total: f64 = lp.iter().map(|v| v.exp()).sum();
        assert!((total - 1.0).abs() < 1e-12);
        assert_eq!(argmax(&lp), 3);
    }
}
