pub mod bench;
pub mod bench_overhead;
pub mod bench_serve;
pub mod bench_throughput;
pub mod convert;
pub mod eval;
pub mod gateway;
pub mod generate;
pub mod models;
pub mod quantize;
pub mod serve;
pub mod tokenize;

use pagellm_model::registry::DEFAULT_MODEL;

/// `--model` and `--threads`, shared by every subcommand that runs a model.
#[derive(clap::Args, Debug, Clone)]
pub struct ModelArgs {
    /// A registry name (see `pagellm models list`), a GGUF file or a Hugging Face directory.
    #[arg(short, long, default_value = DEFAULT_MODEL)]
    pub model: String,
    /// Worker threads (0 = one per core).
    #[arg(short, long, default_value_t = 0)]
    pub threads: usize,
}

/// The engine's options, with vLLM's flag names where vLLM has the option.
#[derive(clap::Args, Debug, Clone)]
pub struct EngineArgs {
    /// Tokens per KV cache block.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// KV cache size in bytes; units accepted (4GiB, 512MiB, 2G).
    #[arg(long, default_value = "4GiB", value_parser = parse_size)]
    pub kv_cache_memory: u64,
    /// KV cache size in blocks of --block-size tokens, overriding --kv-cache-memory.
    #[arg(long)]
    pub num_kv_blocks: Option<usize>,
    /// KV cache element type: auto (= f16), f16, bf16, f32, fp8 (E4M3) or int8; the 8-bit
    /// types keep one f16 scale per token and KV head and hold about twice the tokens.
    #[arg(long, default_value = "auto")]
    pub kv_cache_dtype: pagellm_model::KvDtype,
    /// Most tokens computed in one step, over all requests.
    #[arg(long, default_value_t = 2048)]
    pub max_num_batched_tokens: usize,
    /// Most requests running at once.
    #[arg(long, default_value_t = 256)]
    pub max_num_seqs: usize,
    /// Longest prompt + output served (default: the model's context length).
    #[arg(long)]
    pub max_model_len: Option<usize>,
    /// Order of admission: fcfs or priority (lower value first).
    #[arg(long, default_value = "fcfs")]
    pub scheduling_policy: pagellm_engine::Policy,
    /// Turn prefix caching off (on by default).
    #[arg(long)]
    pub no_enable_prefix_caching: bool,
    /// Turn chunked prefill off: a prompt waits until it fits in one step.
    #[arg(long)]
    pub no_enable_chunked_prefill: bool,
    /// The most alternatives per token a request may ask for with `logprobs`,
    /// `top_logprobs` or `prompt_logprobs`; -1: the whole vocabulary (vLLM's flag).
    #[arg(long, default_value_t = 20, allow_negative_numbers = true,
          value_parser = clap::value_parser!(i64).range(-1..))]
    pub max_logprobs: i64,
}

fn parse_size(s: &str) -> Result<u64, String> {
    pagellm_engine::parse_bytes(s)
}

impl EngineArgs {
    pub fn config(&self, threads: usize) -> pagellm_engine::EngineConfig {
        pagellm_engine::EngineConfig {
            threads,
            block_size: self.block_size,
            kv_cache_memory: self.kv_cache_memory,
            kv_cache_dtype: self.kv_cache_dtype,
            num_kv_blocks: self.num_kv_blocks,
            enable_prefix_caching: !self.no_enable_prefix_caching,
            max_model_len: self.max_model_len,
            scheduler: pagellm_engine::SchedulerConfig {
                max_num_batched_tokens: self.max_num_batched_tokens,
                max_num_seqs: self.max_num_seqs,
                policy: self.scheduling_policy,
                enable_chunked_prefill: !self.no_enable_chunked_prefill,
            },
            max_waiting_requests: None,
            max_logprobs: match self.max_logprobs {
                -1 => usize::MAX,
                k => k.max(0) as usize,
            },
        }
    }
}
