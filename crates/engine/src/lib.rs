//! The serving core, following vLLM v1's split:
//!
//! - [`request`]: a request is its tokens and how many are computed; no phases.
//! - [`kv_cache`]: the block pool (ref counts, LRU free list, prefix-cache index) and the
//!   manager that allocates slots for each step.
//! - [`scheduler`]: the per-step plan under a token budget, with chunked prefill and
//!   preemption by recomputation.
//! - [`core`]: runs a step: one forward pass over the ragged batch, sampling, stop
//!   conditions, output events.
//! - [`engine`]: the core on its own thread behind channels.
//! - [`generate`]: one request, synchronously (what `pagellm generate` runs).

pub mod config;
pub mod core;
pub mod engine;
pub mod error;
pub mod generate;
pub mod kv_cache;
pub mod kv_events;
mod limits;
pub mod live;
pub mod logprobs;
pub mod metrics;
pub mod request;
pub mod sampler;
pub mod scheduler;
pub mod stop;

pub use crate::config::{parse_bytes, EngineConfig};
pub use crate::core::{
    EngineCore, EngineLimits, EngineStats, FinishInfo, RequestOutput, StepReport,
};
pub use crate::engine::{Engine, RequestStream};
pub use crate::error::EngineError;
pub use crate::live::{LiveRequest, LiveView, Phase};
pub use crate::logprobs::{TokenLogprobs, MAX_LOGPROBS};
pub use crate::metrics::{Histogram, LatencyHistograms};
pub use crate::request::{
    FinishReason, RequestId, RequestParams, RequestTimes, Resume, StopReason, Usage,
};
pub use crate::scheduler::{Policy, SchedulerConfig};
pub use sampler::{Sampler, SamplingError, SamplingParams};
