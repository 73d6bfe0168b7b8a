//! The serving core. Today: sampling. Next: request state, paged KV cache, scheduler.
