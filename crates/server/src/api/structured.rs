//! Request fields that constrain the output (structured outputs), and the fields that
//! would change the output but are not supported, which are refused rather than ignored.

use pagellm_structured::Constraint;
use serde_json::Value;

use super::types::GenRequest;
use crate::error::ApiError;

/// Fields that would change the output and cannot be honoured yet. A request that sets
/// one gets a 400 naming it: silently ignoring such a field is worse than refusing it.
const UNSUPPORTED: &[&str] = &[
    "functions",
    "function_call",
    "best_of",
    "suffix",
    "bad_words",
    "logits_processors",
    "guided_whitespace_pattern",
    "structural_tag",
    "audio",
    "modalities",
    "prediction",
    "web_search_options",
    "documents",
    "chat_template",
    "chat_template_kwargs",
    "mm_processor_kwargs",
    "priority_token_ids",
    "logits_processor_pattern",
    "vllm_xargs",
];

/// Fields accepted and not acted on: metadata that does not change the output (vLLM
/// accepts them the same way).
const METADATA: &[&str] = &[
    "metadata",
    "store",
    "service_tier",
    "guided_decoding_backend",
    "request_id",
    "reasoning_effort",
];

/// vLLM's knobs whose default is what pagellm does: accepted at that value, refused at
/// any other.
const DEFAULTS: &[(&str, &str)] = &[
    ("add_special_tokens", "false"),
    ("skip_special_tokens", "true"),
    ("spaces_between_special_tokens", "true"),
    ("include_stop_str_in_output", "false"),
    ("use_beam_search", "false"),
    ("length_penalty", "1.0"),
];

/// Refuses the request if it sets a field pagellm cannot honour; logs fields it does not
/// know at all (as vLLM does) and goes on.
pub(crate) fn check_fields(req: &GenRequest) -> Result<(), ApiError> {
    for (k, v) in &req.extra {
        if v.is_null() || METADATA.contains(&k.as_str()) {
            continue;
        }
        let default = DEFAULTS.iter().find(|(name, _)| name == k);
        let at_default = default.is_some_and(|(_, d)| {
            serde_json::from_str::<Value>(d)
                .is_ok_and(|d| d == *v || d.as_f64() == v.as_f64() && d.is_number())
        });
        if at_default {
            continue;
        }
        if let Some((_, d)) = default {
            return Err(ApiError::bad_request(
                format!("`{k}` can only be {d} on this server, got {v}"),
                Some(k),
            ));
        }
        if UNSUPPORTED.contains(&k.as_str()) {
            return Err(ApiError::bad_request(
                format!("`{k}` is not supported by this server"),
                Some(k),
            ));
        }
        tracing::warn!(field = %k, "ignoring an unknown request field");
    }
    Ok(())
}

/// The output constraint a request asks for, if any: OpenAI's `response_format`, vLLM's
/// `structured_outputs`, or its older `guided_*` fields (at most one of them).
pub(crate) fn constraint(req: &GenRequest) -> Result<Option<(Constraint, &'static str)>, ApiError> {
    let bad = |m: String, p: &str| ApiError::bad_request(m, Some(p));
    let mut found: Vec<(Constraint, &'static str)> = Vec::new();
    if let Some(rf) = &req.response_format {
        let p = "response_format";
        match rf.get("type").and_then(Value::as_str) {
            Some("text") => {}
            Some("json_object") => found.push((Constraint::JsonObject, p)),
            Some("json_schema") => {
                let js = rf
                    .get("json_schema")
                    .ok_or_else(|| bad("response_format.json_schema is required".into(), p))?;
                let schema = js.get("schema").cloned().ok_or_else(|| {
                    bad("response_format.json_schema.schema is required".into(), p)
                })?;
                // `strict` needs nothing more: objects are closed to their declared
                // properties either way (see `Constraint::JsonSchema`), and a keyword
                // that cannot be enforced is an error, never dropped.
                found.push((Constraint::JsonSchema(schema), p));
            }
            other => {
                return Err(bad(
                    format!(
                    "response_format.type must be `text`, `json_object` or `json_schema`, got {}",
                    other.map_or("nothing".to_string(), |t| format!("`{t}`"))
                ),
                    p,
                ))
            }
        }
    }
    if let Some(so) = &req.structured_outputs {
        let p = "structured_outputs";
        let o = so
            .as_object()
            .ok_or_else(|| bad("structured_outputs must be an object".into(), p))?;
        for (k, v) in o {
            if v.is_null() {
                continue;
            }
            match k.as_str() {
                "json" => found.push((json_schema(v, p)?, p)),
                "regex" => {
                    found.push((Constraint::Regex(string(v, "structured_outputs.regex")?), p))
                }
                "choice" => found.push((
                    Constraint::Choice(choices(v, "structured_outputs.choice")?),
                    p,
                )),
                "grammar" => found.push((
                    Constraint::Grammar(string(v, "structured_outputs.grammar")?),
                    p,
                )),
                "json_object" if v.as_bool() == Some(true) => {
                    found.push((Constraint::JsonObject, p))
                }
                "json_object"
                | "backend"
                | "disable_fallback"
                | "disable_any_whitespace"
                | "disable_additional_properties" => {}
                other => {
                    return Err(bad(
                        format!("structured_outputs.{other} is not supported by this server"),
                        p,
                    ))
                }
            }
        }
    }
    if let Some(v) = &req.guided_json {
        found.push((json_schema(v, "guided_json")?, "guided_json"));
    }
    if let Some(v) = &req.guided_regex {
        found.push((Constraint::Regex(v.clone()), "guided_regex"));
    }
    if let Some(v) = &req.guided_choice {
        found.push((Constraint::Choice(v.clone()), "guided_choice"));
    }
    if let Some(v) = &req.guided_grammar {
        found.push((Constraint::Grammar(v.clone()), "guided_grammar"));
    }
    match found.len() {
        0 | 1 => Ok(found.pop()),
        _ => Err(bad(
            format!(
                "only one output constraint can be set, got {}",
                found.iter().map(|(_, p)| *p).collect::<Vec<_>>().join(", ")
            ),
            found[1].1,
        )),
    }
}

/// A schema given as an object, or as a string holding one (vLLM accepts both).
fn json_schema(v: &Value, p: &str) -> Result<Constraint, ApiError> {
    let schema = match v {
        Value::String(s) => serde_json::from_str(s)
            .map_err(|e| ApiError::bad_request(format!("{p} is not valid JSON: {e}"), Some(p)))?,
        v => v.clone(),
    };
    Ok(Constraint::JsonSchema(schema))
}

fn string(v: &Value, p: &str) -> Result<String, ApiError> {
    v.as_str()
        .map(str::to_string)
        .ok_or_else(|| ApiError::bad_request(format!("{p} must be a string"), Some(p)))
}

fn choices(v: &Value, p: &str) -> Result<Vec<String>, ApiError> {
    v.as_array()
        .and_then(|a| a.iter().map(|c| c.as_str().map(str::to_string)).collect())
        .ok_or_else(|| ApiError::bad_request(format!("{p} must be a list of strings"), Some(p)))
}
