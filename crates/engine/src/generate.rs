//! One request, run synchronously on an [`EngineCore`]: what `pagellm generate` does.

use std::time::Instant;

use tokio::sync::mpsc::unbounded_channel;

use crate::core::{EngineCore, FinishInfo, RequestOutput};
use crate::error::EngineError;
use crate::request::{RequestId, RequestParams};

/// Runs `prompt` to completion, calling `on_output` with every update (the last one
/// carries `finish`). Returning false from `on_output` aborts the request.
pub fn generate(
    core: &mut EngineCore,
    id: RequestId,
    prompt: Vec<u32>,
    params: RequestParams,
    mut on_output: impl FnMut(&RequestOutput) -> bool,
) -> Result<FinishInfo, EngineError> {
    let (tx, mut rx) = unbounded_channel();
    core.add_request(id, prompt, params, tx, Instant::now())?;
    loop {
        core.step();
        while let Ok(out) = rx.try_recv() {
            let keep_going = on_output(&out);
            if let Some(f) = out.finish {
                return Ok(f);
            }
            if !keep_going {
                core.abort(id);
            }
        }
        if !core.has_unfinished() {
            // Aborted between updates: the final update is queued.
            if let Ok(out) = rx.try_recv() {
                if let Some(f) = out.finish {
                    return Ok(f);
                }
            }
            return Err(EngineError::ShutDown);
        }
    }
}
