//! Tool calling: OpenAI's `tools` and `tool_choice`, in the Hermes format the Qwen2.5
//! chat template teaches (`<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`).
//!
//! The definitions reach the model through its chat template. With `tool_choice`
//! `required` or a named function, the reply is constrained by a grammar to be calls of
//! the offered functions with arguments that follow their schemas; with `auto` the model
//! decides, and its reply is parsed for calls. Either way the calls come back as
//! `tool_calls`, streamed one delta per call as soon as its closing tag arrives.

use pagellm_structured::{lark_json, Constraint};
use serde_json::{json, Value};

use super::types::GenRequest;
use crate::error::ApiError;

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Choice {
    None,
    Auto,
    Required,
    Named(String),
}

/// A request's tools, validated.
#[derive(Debug, Clone)]
pub(crate) struct Tools {
    /// The definitions as the client sent them (the template renders them).
    defs: Vec<Value>,
    /// (name, parameters schema) of each function.
    funcs: Vec<(String, Value)>,
    pub(crate) choice: Choice,
    parallel: bool,
}

/// The request's tools, if it has any; a 400 naming the field if they are malformed.
pub(crate) fn parse(req: &GenRequest, chat: bool) -> Result<Option<Tools>, ApiError> {
    let bad = |m: String, p: &str| ApiError::bad_request(m, Some(p));
    let defs = match &req.tools {
        None => {
            return match &req.tool_choice {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) if s == "none" => Ok(None),
                Some(_) => Err(bad("tool_choice needs tools".into(), "tool_choice")),
            }
        }
        Some(_) if !chat => {
            return Err(bad("tools need /v1/chat/completions".into(), "tools"));
        }
        Some(d) => d.clone(),
    };
    let mut funcs = Vec::with_capacity(defs.len());
    for (i, t) in defs.iter().enumerate() {
        let p = "tools";
        if t.get("type").and_then(Value::as_str) != Some("function") {
            return Err(bad(format!("tools[{i}].type must be `function`"), p));
        }
        let f = t
            .get("function")
            .ok_or_else(|| bad(format!("tools[{i}].function is required"), p))?;
        let name = f
            .get("name")
            .and_then(Value::as_str)
            .filter(|n| {
                !n.is_empty()
                    && n.len() <= 64
                    && n.chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            })
            .ok_or_else(|| {
                bad(
                    format!("tools[{i}].function.name must be 1 to 64 letters, digits, `_` or `-`"),
                    p,
                )
            })?;
        if funcs.iter().any(|(n, _)| n == name) {
            return Err(bad(
                format!("tools[{i}]: a second function named `{name}`"),
                p,
            ));
        }
        let params = match f.get("parameters") {
            None | Some(Value::Null) => json!({"type": "object"}),
            Some(v) if v.is_object() => v.clone(),
            Some(_) => {
                return Err(bad(
                    format!("tools[{i}].function.parameters must be an object"),
                    p,
                ))
            }
        };
        funcs.push((name.to_string(), params));
    }
    let p = "tool_choice";
    let choice = match &req.tool_choice {
        None | Some(Value::Null) => Choice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "none" => Choice::None,
            "auto" => Choice::Auto,
            "required" => Choice::Required,
            other => {
                return Err(bad(
                    format!(
                    "tool_choice must be `none`, `auto`, `required` or a function, got `{other}`"
                ),
                    p,
                ))
            }
        },
        Some(v) => {
            let name = v
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    bad(
                        "tool_choice must be {\"type\": \"function\", \"function\": {\"name\": ...}}"
                            .into(),
                        p,
                    )
                })?;
            if !funcs.iter().any(|(n, _)| n == name) {
                return Err(bad(
                    format!("tool_choice names `{name}`, which is not in tools"),
                    p,
                ));
            }
            Choice::Named(name.to_string())
        }
    };
    if choice != Choice::None && defs.is_empty() {
        return Err(bad("tools is empty".into(), "tools"));
    }
    Ok(Some(Tools {
        defs,
        funcs,
        choice,
        parallel: req.parallel_tool_calls.unwrap_or(true),
    }))
}

impl Tools {
    /// The definitions for the chat template, also with `tool_choice: "none"` (as vLLM
    /// renders them by default; the reply is then not parsed for calls).
    pub(crate) fn for_template(&self) -> Option<&[Value]> {
        Some(self.defs.as_slice())
    }

    /// Whether replies are parsed for calls.
    pub(crate) fn parses(&self) -> bool {
        self.choice != Choice::None
    }

    /// The grammar that enforces `required` or a named function: one call (several
    /// with `parallel_tool_calls`) of the allowed functions, arguments per their schemas.
    pub(crate) fn constraint(&self) -> Option<Constraint> {
        let allowed: Vec<&(String, Value)> = match &self.choice {
            Choice::None | Choice::Auto => return None,
            Choice::Required => self.funcs.iter().collect(),
            Choice::Named(n) => self.funcs.iter().filter(|(f, _)| f == n).collect(),
        };
        let call = |(name, params): &&(String, Value)| {
            json!({"type": "object", "properties": {"name": {"const": name}, "arguments": params},
                   "required": ["name", "arguments"], "additionalProperties": false})
        };
        let body = json!({"anyOf": allowed.iter().map(call).collect::<Vec<_>>()});
        let many = self.parallel && matches!(self.choice, Choice::Required);
        let start = if many {
            "start: call (\"\\n\" call)*"
        } else {
            "start: call"
        };
        Some(Constraint::Grammar(format!(
            "{start}\ncall: {open} \"\\n\" body \"\\n\" {close}\nbody: {}\n",
            lark_json(&body),
            open = serde_json::to_string(OPEN).expect("a string"),
            close = serde_json::to_string(CLOSE).expect("a string"),
        )))
    }
}

/// One parsed call.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Call {
    pub(crate) name: String,
    /// The arguments as a JSON string, as OpenAI sends them.
    pub(crate) arguments: String,
}

/// A call's JSON body, or `None` if it is not `{"name": ..., "arguments": {...}}`.
fn parse_call(body: &str) -> Option<Call> {
    let v: Value = serde_json::from_str(body.trim()).ok()?;
    let name = v.get("name")?.as_str()?.to_string();
    let args = v.get("arguments").cloned().unwrap_or_else(|| json!({}));
    let arguments = match args {
        Value::String(s) => s,
        a => a.to_string(),
    };
    Some(Call { name, arguments })
}

impl Tools {
    /// Splits a whole reply into its text and its calls. A block that does not parse
    /// stays in the text.
    pub(crate) fn split(&self, text: &str) -> (String, Vec<Call>) {
        split(text, self.names())
    }

    /// A stream splitter for one reply.
    pub(crate) fn stream(&self) -> ToolStream {
        ToolStream::new(self.names())
    }

    fn names(&self) -> Vec<String> {
        self.funcs.iter().map(|(n, _)| n.clone()).collect()
    }
}

fn split(text: &str, names: Vec<String>) -> (String, Vec<Call>) {
    let mut s = ToolStream::new(names);
    let (mut content, mut calls) = s.push(text);
    let (c, k) = s.finish();
    content.push_str(&c);
    calls.extend(k);
    (content, calls)
}

/// Separates a streamed reply's text from its calls as it arrives: text is passed on
/// except what could be the start of a call's opening tag; a call is released when its
/// closing tag arrives. Small models often write the call's JSON without the tags: a
/// reply that starts with `{` is held to its end, and is a call if it is exactly one
/// `{"name": ..., "arguments": ...}` naming an offered function.
#[derive(Debug)]
pub(crate) struct ToolStream {
    /// Text not passed on yet: a possible opening tag, an open call, or a reply that
    /// may be a bare call.
    pending: String,
    in_call: bool,
    /// Whether any text was seen (a bare call must start the reply).
    started: bool,
    bare: bool,
    names: Vec<String>,
}

impl ToolStream {
    fn new(names: Vec<String>) -> Self {
        Self {
            pending: String::new(),
            in_call: false,
            started: false,
            bare: false,
            names,
        }
    }

    pub(crate) fn push(&mut self, text: &str) -> (String, Vec<Call>) {
        self.pending.push_str(text);
        if !self.started {
            match self.pending.trim_start().chars().next() {
                None => return (String::new(), Vec::new()),
                Some(c) => {
                    self.started = true;
                    self.bare = c == '{';
                }
            }
        }
        let (mut out, mut calls) = (String::new(), Vec::new());
        if self.bare {
            return (out, calls);
        }
        loop {
            if self.in_call {
                let Some(end) = self.pending.find(CLOSE) else {
                    break;
                };
                let block: String = self.pending.drain(..end + CLOSE.len()).collect();
                match parse_call(&block[OPEN.len()..block.len() - CLOSE.len()]) {
                    Some(c) => calls.push(c),
                    None => out.push_str(&block),
                }
                self.in_call = false;
            } else if let Some(start) = self.pending.find(OPEN) {
                out.extend(self.pending.drain(..start));
                self.in_call = true;
            } else {
                // Keep back the longest tail that could begin the opening tag.
                let keep = (1..OPEN.len())
                    .rev()
                    .find(|&k| self.pending.ends_with(&OPEN[..k]))
                    .unwrap_or(0);
                let cut = self.pending.len() - keep;
                out.extend(self.pending.drain(..cut));
                break;
            }
        }
        (out, calls)
    }

    /// The end of the reply: a held-back bare call, or else text.
    pub(crate) fn finish(&mut self) -> (String, Vec<Call>) {
        self.in_call = false;
        let rest = std::mem::take(&mut self.pending);
        if self.bare {
            self.bare = false;
            if let Some(c) = parse_call(&rest).filter(|c| self.names.contains(&c.name)) {
                return (String::new(), vec![c]);
            }
            // Not a call: it is text, which may still hold tagged calls.
            let (mut text, calls) = self.push(&rest);
            let (t, _) = self.finish();
            text.push_str(&t);
            return (text, calls);
        }
        (rest, Vec::new())
    }
}

/// `tool_calls` entries (OpenAI's shape), numbered from `first`.
pub(crate) fn calls_json(calls: &[Call], first: usize, id: &str) -> Value {
    Value::Array(
        calls
            .iter()
            .enumerate()
            .map(|(i, c)| {
                json!({"index": first + i, "id": format!("call_{id}_{}", first + i), "type": "function",
                       "function": {"name": c.name, "arguments": c.arguments}})
            })
            .collect(),
    )
}

/// A message's `tool_calls` as the chat template expects them: arguments as objects
/// (clients send them as JSON strings), as vLLM renders them.
pub(crate) fn template_calls(calls: &[Value]) -> Vec<Value> {
    calls
        .iter()
        .map(|c| {
            let mut c = c.clone();
            if let Some(a) = c.pointer_mut("/function/arguments") {
                if let Some(parsed) = a
                    .as_str()
                    .and_then(|s| serde_json::from_str::<Value>(s).ok())
                {
                    *a = parsed;
                }
            }
            c
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_split_into_text_and_calls() {
        let names = || vec!["get_weather".to_string(), "f".to_string()];
        let (text, calls) = split(
            "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>",
            names(),
        );
        assert_eq!(text, "Let me check.\n\n");
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].name, "get_weather");
        assert_eq!(
            serde_json::from_str::<Value>(&calls[0].arguments).unwrap(),
            json!({"city": "Paris"})
        );
        // A block that is not a call stays text.
        let (text, calls) = split("a <tool_call>not json</tool_call> b", names());
        assert_eq!(
            (text.as_str(), calls.len()),
            ("a <tool_call>not json</tool_call> b", 0)
        );
        // A bare call naming an offered function is a call; other JSON is text.
        let (text, calls) = split(" {\"name\": \"f\", \"arguments\": {\"x\": 2}}", names());
        assert_eq!(
            (text.as_str(), calls[0].arguments.as_str()),
            ("", "{\"x\":2}")
        );
        let (text, calls) = split("{\"name\": \"g\", \"arguments\": {}}", names());
        assert_eq!(
            (text.as_str(), calls.len()),
            ("{\"name\": \"g\", \"arguments\": {}}", 0)
        );
    }

    #[test]
    fn streamed_text_holds_back_only_a_possible_tag() {
        let mut s = ToolStream::new(vec!["f".into()]);
        let whole =
            "Hi <tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call> done <tool";
        let (mut text, mut calls) = (String::new(), Vec::new());
        for ch in whole.chars() {
            let (t, c) = s.push(&ch.to_string());
            assert!(!t.contains('<'), "a tag leaked: {t:?}");
            text.push_str(&t);
            calls.extend(c);
        }
        assert_eq!(text, "Hi  done ");
        assert_eq!(
            calls,
            vec![Call {
                name: "f".into(),
                arguments: "{\"x\":1}".into()
            }]
        );
        assert_eq!(s.finish().0, "<tool");
    }
}
