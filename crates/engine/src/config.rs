//! Engine configuration: KV cache geometry and memory, scheduling limits.

use pagellm_model::KvDtype;

use crate::scheduler::SchedulerConfig;

#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Compute threads; 0 = one per core.
    pub threads: usize,
    /// Tokens per KV block.
    pub block_size: usize,
    /// Bytes of KV cache (all layers, keys and values). Pages are touched only as
    /// blocks are first used.
    pub kv_cache_memory: u64,
    pub kv_cache_dtype: KvDtype,
    /// Exactly this many KV blocks, overriding `kv_cache_memory` (vLLM's
    /// `--num-gpu-blocks-override`).
    pub num_kv_blocks: Option<usize>,
    pub enable_prefix_caching: bool,
    /// Longest sequence (prompt + output) served; `None` = the model's context length.
    pub max_model_len: Option<usize>,
    pub scheduler: SchedulerConfig,
    /// Requests that may wait for admission before [`crate::Engine::submit`] refuses
    /// more; `None` = no limit.
    pub max_waiting_requests: Option<usize>,
    /// vLLM's `--max-logprobs`: the most alternatives a request may ask for per token
    /// (`usize::MAX`: the whole vocabulary).
    pub max_logprobs: usize,
}

/// vLLM's CPU backend reserves 4 GiB of KV cache by default (`VLLM_CPU_KVCACHE_SPACE`).
pub const DEFAULT_KV_CACHE_MEMORY: u64 = 4 << 30;

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            threads: 0,
            block_size: 16,
            kv_cache_memory: DEFAULT_KV_CACHE_MEMORY,
            kv_cache_dtype: KvDtype::F16,
            num_kv_blocks: None,
            enable_prefix_caching: true,
            max_model_len: None,
            scheduler: SchedulerConfig::default(),
            max_waiting_requests: None,
            max_logprobs: crate::logprobs::MAX_LOGPROBS,
        }
    }
}

/// Parses a byte size: a plain number of bytes or a number with a unit (`512MiB`,
/// `4GiB`, `2G`, `1.5GB`, `100k`). Binary and decimal units are both accepted.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num.parse().map_err(|_| {
        format!("invalid size {s:?}: expected a number with an optional unit such as 4GiB")
    })?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "m" | "mb" => 1e6,
        "g" | "gb" => 1e9,
        "t" | "tb" => 1e12,
        "ki" | "kib" => 1024.0,
        "mi" | "mib" => 1024.0 * 1024.0,
        "gi" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "ti" | "tib" => 1024.0f64.powi(4),
        other => {
            return Err(format!(
                "invalid size {s:?}: unknown unit {other:?} (use B, KiB, MiB, GiB, KB, MB, GB)"
            ))
        }
    };
    let bytes = value * mult;
    if !bytes.is_finite() || bytes < 1.0 || bytes > u64::MAX as f64 {
        return Err(format!("invalid size {s:?}: must be at least one byte"));
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_sizes_with_units() {
        assert_eq!(parse_bytes("4GiB").unwrap(), 4 << 30);
        assert_eq!(parse_bytes("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_bytes("2G").unwrap(), 2_000_000_000);
        assert_eq!(parse_bytes("1.5GB").unwrap(), 1_500_000_000);
        assert_eq!(parse_bytes("1234").unwrap(), 1234);
        assert!(parse_bytes("lots").unwrap_err().contains("lots"));
        assert!(parse_bytes("4 parsecs")
            .unwrap_err()
            .contains("unknown unit"));
        assert!(parse_bytes("0").is_err());
    }
}
