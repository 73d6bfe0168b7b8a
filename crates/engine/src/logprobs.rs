//! Log-probabilities of sampled tokens and their top alternatives.
//!
//! As vLLM v1 does by default, they are the log-softmax of the model's raw logits:
//! before penalties, temperature and truncation, so they describe the model rather
//! than the sampling settings.

/// The most alternatives a request may ask for (OpenAI's `top_logprobs` limit).
pub const MAX_LOGPROBS: usize = 20;

/// One sampled token's log-probability and the `k` most likely tokens at its position.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprobs {
    pub token: u32,
    pub logprob: f32,
    /// 1 for the most likely token (vLLM's rank; ties share the better rank).
    pub rank: usize,
    /// Most likely first; ties go to the lower token id.
    pub top: Vec<(u32, f32)>,
}

/// Log-probabilities over one logits row.
pub struct LogSoftmax<'a> {
    logits: &'a [f32],
    log_z: f32,
}

impl<'a> LogSoftmax<'a> {
    pub fn new(logits: &'a [f32]) -> Self {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let sum: f64 = logits.iter().map(|&l| f64::from((l - max).exp())).sum();
        Self {
            logits,
            log_z: max + sum.ln() as f32,
        }
    }

    /// `log(sum(exp(logits)))`: a token's logprob is its logit minus this.
    pub fn log_z(&self) -> f32 {
        self.log_z
    }

    pub fn logprob(&self, token: u32) -> f32 {
        self.logits[token as usize] - self.log_z
    }

    /// The `k` most likely tokens, most likely first.
    pub fn top(&self, k: usize) -> Vec<(u32, f32)> {
        let k = k.min(self.logits.len());
        if k == 0 {
            return Vec::new();
        }
        let desc = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if k > 2 * MAX_LOGPROBS {
            // Many (a server started with a large --max-logprobs): sort them all.
            let mut all: Vec<(u32, f32)> = (0..).zip(self.logits.iter().copied()).collect();
            all.sort_unstable_by(desc);
            all.truncate(k);
            return all.into_iter().map(|(t, l)| (t, l - self.log_z)).collect();
        }
        // Keep a small sorted head in one pass.
        let mut head: Vec<(u32, f32)> = Vec::with_capacity(k + 1);
        for (i, &l) in self.logits.iter().enumerate() {
            if head.len() == k && l <= head[k - 1].1 {
                continue;
            }
            let e = (i as u32, l);
            let at = head.partition_point(|h| desc(h, &e).is_lt());
            head.insert(at, e);
            head.truncate(k);
        }
        head.into_iter().map(|(t, l)| (t, l - self.log_z)).collect()
    }

    /// 1 + how many tokens are strictly more likely than `token`.
    pub fn rank(&self, token: u32) -> usize {
        let l = self.logits[token as usize];
        1 + self.logits.iter().filter(|&&x| x > l).count()
    }

    pub fn token(&self, token: u32, k: usize) -> TokenLogprobs {
        TokenLogprobs {
            token,
            logprob: self.logprob(token),
            rank: self.rank(token),
            top: self.top(k),
        }
    }
}

/// `logprob_token_ids`: the pinned tokens and the sampled one, each once, most likely
/// first (ties to the lower id).
pub(crate) fn pinned(ids: &[u32], sampled: u32, raw: &[f32], log_z: f32) -> Vec<(u32, f32)> {
    let mut top: Vec<(u32, f32)> = ids
        .iter()
        .copied()
        .chain([sampled])
        .map(|t| (t, raw[t as usize] - log_z))
        .collect();
    top.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    top.dedup_by_key(|e| e.0);
    top
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logprobs_normalise_and_rank() {
        let logits = [1.0f32, 3.0, 2.0, 3.0, -1.0];
        let ls = LogSoftmax::new(&logits);
        let total: f32 = (0..5).map(|t| ls.logprob(t).exp()).sum();
        assert!((total - 1.0).abs() < 1e-6, "probabilities sum to {total}");
        let top = ls.top(3);
        // Equal logits: the lower id first.
        assert_eq!(top.iter().map(|t| t.0).collect::<Vec<_>>(), [1, 3, 2]);
        assert!((top[0].1 - ls.logprob(1)).abs() < 1e-7);
        assert_eq!(ls.top(9).len(), 5);
        assert!(ls.top(0).is_empty());
        let t = ls.token(4, 1);
        assert!(t.logprob < top[2].1 && t.top == vec![top[0]]);
        assert_eq!((t.rank, ls.rank(1), ls.rank(3), ls.rank(2)), (5, 1, 1, 3));
    }

    #[test]
    fn pinned_logprobs_hold_the_pinned_and_the_sampled_token_once() {
        let raw = [0.0f32, 2.0, 1.0, 3.0];
        let log_z = 3.5;
        let top = pinned(&[2, 0, 2], 3, &raw, log_z);
        assert_eq!(top, vec![(3, -0.5), (2, -2.5), (0, -3.5)]);
        // The sampled token among the pinned ones is not repeated.
        let top = pinned(&[1, 0], 1, &raw, log_z);
        assert_eq!(top, vec![(1, -1.5), (0, -3.5)]);
    }

    #[test]
    fn many_alternatives_are_sorted_like_a_few() {
        // Past 2 x MAX_LOGPROBS, `top` sorts the whole row; it must agree with the
        // one-pass head on the tokens both return, ties included.
        let logits: Vec<f32> = (0..300u32)
            .map(|i| ((i * 37) % 101) as f32 * 0.25)
            .collect();
        let ls = LogSoftmax::new(&logits);
        let few = ls.top(MAX_LOGPROBS);
        let many = ls.top(250);
        assert_eq!(many.len(), 250);
        assert_eq!(many[..MAX_LOGPROBS], few[..]);
        assert!(many
            .windows(2)
            .all(|w| w[0].1 > w[1].1 || (w[0].1 == w[1].1 && w[0].0 < w[1].0)));
        assert_eq!(ls.top(usize::MAX).len(), 300);
    }
}
