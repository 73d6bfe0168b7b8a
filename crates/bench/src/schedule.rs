//! When each request is sent: all at once (`--request-rate inf`) or with gamma-distributed
//! gaps of mean `1/rate` (`--burstiness` is the shape: 1 = Poisson arrivals, below 1
//! burstier, above 1 more even), as `vllm bench serve` does.

use rand::rngs::StdRng;
use rand::SeedableRng;
use rand_distr::{Distribution, Gamma};

/// Seconds from the start at which each of `n` requests arrives; the first at 0.
pub fn arrival_offsets(
    n: usize,
    rate: f64,
    burstiness: f64,
    seed: u64,
) -> anyhow::Result<Vec<f64>> {
    anyhow::ensure!(
        rate > 0.0,
        "--request-rate must be positive or inf, got {rate}"
    );
    anyhow::ensure!(
        burstiness > 0.0 && burstiness.is_finite(),
        "--burstiness must be a positive number, got {burstiness}"
    );
    if rate.is_infinite() {
        return Ok(vec![0.0; n]);
    }
    let gamma = Gamma::new(burstiness, 1.0 / (rate * burstiness))
        .map_err(|e| anyhow::anyhow!("bad arrival distribution: {e}"))?;
    let mut rng = StdRng::seed_from_u64(seed);
    let mut t = 0.0;
    Ok((0..n)
        .map(|_| {
            let at = t;
            t += gamma.sample(&mut rng);
            at
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn infinite_rate_sends_everything_at_once() {
        assert_eq!(arrival_offsets(3, f64::INFINITY, 1.0, 0).unwrap(), [0.0; 3]);
    }

    #[test]
    fn mean_gap_is_one_over_the_rate_and_burstiness_sets_the_spread() {
        let spread = |b: f64| {
            let t = arrival_offsets(20_001, 4.0, b, 7).unwrap();
            let gaps: Vec<f64> = t.windows(2).map(|w| w[1] - w[0]).collect();
            let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
            let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64;
            assert!((mean - 0.25).abs() < 0.01, "mean gap {mean}");
            var.sqrt() / mean
        };
        // Coefficient of variation of a gamma is 1/sqrt(shape).
        assert!((spread(1.0) - 1.0).abs() < 0.05);
        assert!((spread(4.0) - 0.5).abs() < 0.05);
        assert!(arrival_offsets(2, 0.0, 1.0, 0).is_err());
        assert!(arrival_offsets(2, 1.0, 0.0, 0).is_err());
    }
}
