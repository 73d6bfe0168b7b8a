//! Token sampling: penalties, temperature, top-k, top-p, min-p, seeded randomness.
//!
//! Order of operations follows vLLM: penalties on raw logits, then temperature, then
//! the truncations (min-p, top-k, top-p) on the tempered distribution, then a draw.
//! Temperature 0 means greedy (argmax after penalties), as in vLLM and llama.cpp.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Validated sampling parameters of one request.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// 0 = greedy.
    pub temperature: f32,
    /// 0 = off.
    pub top_k: usize,
    /// 1.0 = off.
    pub top_p: f32,
    /// 0.0 = off. Drops tokens whose probability is below `min_p` times the top one's.
    pub min_p: f32,
    /// 1.0 = off. HF/llama.cpp style: divides positive logits, multiplies negative ones,
    /// for every token in the prompt or the output.
    pub repetition_penalty: f32,
    /// OpenAI style, over output tokens: subtracted once if the token appeared.
    pub presence_penalty: f32,
    /// OpenAI style, over output tokens: subtracted per occurrence.
    pub frequency_penalty: f32,
    /// Fixed seed for reproducible sampling; `None` draws one from the OS.
    pub seed: Option<u64>,
    /// OpenAI's `logit_bias`: added to these tokens' logits before anything else.
    pub logit_bias: Vec<(u32, f32)>,
    /// vLLM's `allowed_token_ids`: when set, every other token is masked out.
    pub allowed_token_ids: Option<Vec<u32>>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: None,
            logit_bias: Vec::new(),
            allowed_token_ids: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SamplingError {
    #[error("{name} must be {range}, got {value}")]
    OutOfRange {
        name: &'static str,
        range: &'static str,
        value: f32,
    },
}

impl SamplingParams {
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            ..Self::default()
        }
    }

    /// Checks every field against the ranges vLLM and the OpenAI API accept.
    pub fn validate(&self) -> Result<(), SamplingError> {
        let check = |name, ok: bool, range, value| {
            if ok {
                Ok(())
            } else {
                Err(SamplingError::OutOfRange { name, range, value })
            }
        };
        check(
            "temperature",
            self.temperature.is_finite() && self.temperature >= 0.0,
            ">= 0",
            self.temperature,
        )?;
        check(
            "top_p",
            self.top_p > 0.0 && self.top_p <= 1.0,
            "in (0, 1]",
            self.top_p,
        )?;
        check(
            "min_p",
            (0.0..=1.0).contains(&self.min_p),
            "in [0, 1]",
            self.min_p,
        )?;
        check(
            "repetition_penalty",
            self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0,
            "> 0",
            self.repetition_penalty,
        )?;
        check(
            "presence_penalty",
            (-2.0..=2.0).contains(&self.presence_penalty),
            "in [-2, 2]",
            self.presence_penalty,
        )?;
        check(
            "frequency_penalty",
            (-2.0..=2.0).contains(&self.frequency_penalty),
            "in [-2, 2]",
            self.frequency_penalty,
        )?;
        for &(_, b) in &self.logit_bias {
            check(
                "logit_bias",
                (-100.0..=100.0).contains(&b),
                "in [-100, 100]",
                b,
            )?;
        }
        Ok(())
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }
}

/// Samples tokens for one sequence; owns its random state.
pub struct Sampler {
    params: SamplingParams,
    rng: StdRng,
    /// (probability or logit, token) candidates, reused between calls.
    cand: Vec<(f32, u32)>,
    counts: Vec<u32>,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Result<Self, SamplingError> {
        params.validate()?;
        let rng = match params.seed {
            Some(s) => StdRng::seed_from_u64(s),
            None => StdRng::from_entropy(),
        };
        Ok(Self {
            params,
            rng,
            cand: Vec::new(),
            counts: Vec::new(),
        })
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Advances the random state past `n` sampled tokens, as if [`Sampler::sample`]
    /// had drawn them: a non-greedy sample takes exactly one draw, a greedy one none.
    pub fn skip(&mut self, n: usize) {
        if !self.params.is_greedy() {
            for _ in 0..n {
                let _: f32 = self.rng.gen();
            }
        }
    }

    /// Picks the next token from `logits` (modified in place by the penalties).
    pub fn sample(&mut self, logits: &mut [f32], prompt: &[u32], output: &[u32]) -> u32 {
        for &(t, b) in &self.params.logit_bias {
            if let Some(l) = logits.get_mut(t as usize) {
                *l += b;
            }
        }
        if let Some(allowed) = &self.params.allowed_token_ids {
            let kept: Vec<(u32, f32)> = allowed
                .iter()
                .filter_map(|&t| Some((t, *logits.get(t as usize)?)))
                .collect();
            logits.fill(f32::NEG_INFINITY);
            for (t, l) in kept {
                logits[t as usize] = l;
            }
        }
        self.apply_penalties(logits, prompt, output);
        if self.params.is_greedy() {
            return argmax(logits);
        }
        let p = &self.params;
        let inv_t = 1.0 / p.temperature;
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        // Probabilities relative to the top token: exp((l - max) / T) in (0, 1].
        self.cand.clear();
        let min_rel = p.min_p.max(1e-9); // below 1e-9 of the top token nothing is ever drawn
        for (i, &l) in logits.iter().enumerate() {
            let r = ((l - max) * inv_t).exp();
            if r >= min_rel {
                self.cand.push((r, i as u32));
            }
        }
        let desc = |a: &(f32, u32), b: &(f32, u32)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
        if p.top_k > 0 && p.top_k < self.cand.len() {
            self.cand.select_nth_unstable_by(p.top_k - 1, desc);
            self.cand.truncate(p.top_k);
        }
        if p.top_p < 1.0 {
            let total: f32 = self.cand.iter().map(|c| c.0).sum();
            // Most of the mass usually sits in a few tokens: sort a small head first and
            // sort everything only if that head does not reach top_p.
            let head = 64.min(self.cand.len());
            if head < self.cand.len() {
                self.cand.select_nth_unstable_by(head - 1, desc);
            }
            self.cand[..head].sort_unstable_by(desc);
            let mut keep = cutoff(&self.cand[..head], total * p.top_p);
            if keep.is_none() {
                self.cand.sort_unstable_by(desc);
                keep = cutoff(&self.cand, total * p.top_p);
            }
            self.cand.truncate(keep.unwrap_or(self.cand.len()));
        }
        let total: f32 = self.cand.iter().map(|c| c.0).sum();
        let mut r = self.rng.gen::<f32>() * total;
        for &(w, id) in &self.cand {
            if r < w {
                return id;
            }
            r -= w;
        }
        self.cand.last().map_or_else(|| argmax(logits), |c| c.1)
    }

    fn apply_penalties(&mut self, logits: &mut [f32], prompt: &[u32], output: &[u32]) {
        let p = &self.params;
        if p.repetition_penalty != 1.0 {
            let mut seen = std::mem::take(&mut self.counts);
            seen.clear();
            seen.resize(logits.len(), 0);
            for &t in prompt.iter().chain(output) {
                let Some(l) = logits.get_mut(t as usize) else {
                    continue;
                };
                if seen[t as usize] == 0 {
                    seen[t as usize] = 1;
                    *l = if *l > 0.0 {
                        *l / p.repetition_penalty
                    } else {
                        *l * p.repetition_penalty
                    };
                }
            }
            self.counts = seen;
        }
        if p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 {
            let mut counts = std::mem::take(&mut self.counts);
            counts.clear();
            counts.resize(logits.len(), 0);
            for &t in output {
                if let Some(c) = counts.get_mut(t as usize) {
                    *c += 1;
                }
            }
            for &t in output {
                let c = std::mem::replace(&mut counts[t as usize], 0);
                if c > 0 {
                    logits[t as usize] -= p.frequency_penalty * c as f32 + p.presence_penalty;
                }
            }
            self.counts = counts;
        }
    }
}

/// Index of the smallest prefix of descending-sorted `cand` whose mass reaches `target`.
fn cutoff(cand: &[(f32, u32)], target: f32) -> Option<usize> {
    let mut acc = 0.0;
    for (i, c) in cand.iter().enumerate() {
        acc += c.0;
        if acc >= target {
            return Some(i + 1);
        }
    }
    None
}

/// The index of the largest value; the lowest index wins ties (as llama.cpp's greedy).
pub fn argmax(x: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests;
