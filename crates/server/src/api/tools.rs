//! Tool calling: OpenAI's `tools` and `tool_choice`, in the Hermes format the Qwen2.5
//! chat template teaches (`<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`).
//!
//! The definitions reach the model through its chat template. With `tool_choice`
//! `required` or a named function, the reply is constrained by a grammar to be calls of
//! the offered functions with arguments that follow their schemas; with `auto` the model
//! decides, and its reply is parsed for calls. Either way the calls come back as
//! `tool_calls`; streamed, a call's name is sent as soon as it is known and its
//! arguments in fragments as they are written, as OpenAI streams them.

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

/// A piece of a streamed call, as OpenAI streams them: the first piece of call `index`
/// carries its name, the following ones fragments of its arguments.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct CallDelta {
    pub(crate) index: usize,
    pub(crate) name: Option<String>,
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

/// The name of a call whose body so far reads `{"name": "...", "arguments": {`, and
/// where its arguments object starts; `None` until then (or for any other shape, which
/// is then parsed whole at the closing tag).
fn call_head(body: &str) -> Option<(String, usize)> {
    const KEY: &str = "\"arguments\"";
    let i = body.find(KEY)?;
    let value = body[i + KEY.len()..]
        .trim_start()
        .strip_prefix(':')?
        .trim_start();
    if !value.starts_with('{') {
        return None;
    }
    let head = body[..i].trim_end().trim_end_matches(',');
    let v: Value = serde_json::from_str(&format!("{head}}}")).ok()?;
    Some((
        v.get("name")?.as_str()?.to_string(),
        body.len() - value.len(),
    ))
}

/// Where the JSON object at the start of `s` ends (just past its closing brace), or
/// `None` while it is still open. Braces inside strings do not count.
fn object_end(s: &str) -> Option<usize> {
    let (mut depth, mut in_str, mut escaped) = (0usize, false, false);
    for (i, c) in s.char_indices() {
        if in_str {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_str = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_str = true,
            '{' | '[' => depth += 1,
            '}' | ']' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(i + 1);
                }
            }
            _ => {}
        }
    }
    None
}

impl Tools {
    /// Splits a whole reply into its text and its calls. A block that does not parse
    /// stays in the text.
    pub(crate) fn split(&self, text: &str) -> (String, Vec<Call>) {
        split(text, self.names())
    }

    /// A stream splitter for one reply.
    pub(crate) fn stream(&self) -> ToolStream {
        ToolStream::new(self.names(), true)
    }

    fn names(&self) -> Vec<String> {
        self.funcs.iter().map(|(n, _)| n.clone()).collect()
    }
}

fn split(text: &str, names: Vec<String>) -> (String, Vec<Call>) {
    let mut s = ToolStream::new(names, false);
    let (mut content, mut deltas) = s.push(text);
    let (c, k) = s.finish();
    content.push_str(&c);
    deltas.extend(k);
    let calls = deltas
        .into_iter()
        .map(|d| Call {
            name: d.name.unwrap_or_default(),
            arguments: d.arguments,
        })
        .collect();
    (content, calls)
}

/// A call being streamed: its name is out, its arguments are sent as they arrive.
#[derive(Debug)]
struct OpenCall {
    index: usize,
    /// Where the arguments start in the pending body.
    start: usize,
    /// Bytes of the arguments sent so far.
    sent: usize,
}

/// Separates a streamed reply's text from its calls as it arrives: text is passed on
/// except what could be the start of a call's opening tag. With `fragments`, a call is
/// announced (index, name) as soon as its name is known and its arguments follow as
/// they are written, up to the brace that closes them; otherwise, and for a call of
/// another shape, a call is released whole at its closing tag. Small models often write
/// the call's JSON without the tags: a reply that starts with `{` is held until it
/// shows itself as `{"name": <an offered function>, "arguments": {` (then streamed the
/// same way, text after the call's closing brace staying text) or ends, when it is a
/// call if it is exactly one `{"name": ..., "arguments": ...}` naming an offered
/// function.
#[derive(Debug)]
pub(crate) struct ToolStream {
    /// Text not passed on yet: a possible opening tag, an open call's body, or a reply
    /// that may be a bare call.
    pending: String,
    in_call: bool,
    /// Whether any text was seen (a bare call must start the reply).
    started: bool,
    bare: bool,
    /// The open call has no tags: it ends with the reply.
    bare_call: bool,
    names: Vec<String>,
    fragments: bool,
    open: Option<OpenCall>,
    /// Calls started so far.
    calls: usize,
}

impl ToolStream {
    fn new(names: Vec<String>, fragments: bool) -> Self {
        Self {
            pending: String::new(),
            in_call: false,
            started: false,
            bare: false,
            bare_call: false,
            names,
            fragments,
            open: None,
            calls: 0,
        }
    }

    /// Calls started so far (a reply that called ends with `tool_calls`).
    pub(crate) fn calls(&self) -> usize {
        self.calls
    }

    fn whole(&mut self, c: Call) -> CallDelta {
        self.calls += 1;
        CallDelta {
            index: self.calls - 1,
            name: Some(c.name),
            arguments: c.arguments,
        }
    }

    pub(crate) fn push(&mut self, text: &str) -> (String, Vec<CallDelta>) {
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
        let (mut out, mut deltas) = (String::new(), Vec::new());
        if self.bare {
            let offered = call_head(&self.pending).filter(|(n, _)| self.names.contains(n));
            if !(self.fragments && offered.is_some()) {
                return (out, deltas);
            }
            self.bare = false;
            self.bare_call = true;
            self.in_call = true;
        }
        loop {
            if self.in_call {
                let close = if self.bare_call {
                    None
                } else {
                    self.pending.find(CLOSE)
                };
                let Some(end) = close else {
                    if self.fragments {
                        self.stream_open(&mut deltas);
                    }
                    break;
                };
                let block: String = self.pending.drain(..end + CLOSE.len()).collect();
                let body = &block[..end];
                match self.open.take() {
                    Some(o) => deltas.extend(rest_of(&o, &body[o.start..])),
                    None => match parse_call(body) {
                        Some(c) => deltas.push(self.whole(c)),
                        None => {
                            out.push_str(OPEN);
                            out.push_str(&block);
                        }
                    },
                }
                self.in_call = false;
            } else if let Some(start) = self.pending.find(OPEN) {
                out.extend(self.pending.drain(..start));
                self.pending.drain(..OPEN.len());
                self.in_call = true;
            } else {
                // Keep back the longest tail that could begin the opening tag.
                let cut = self.pending.len() - tag_prefix(&self.pending, OPEN);
                out.extend(self.pending.drain(..cut));
                break;
            }
        }
        (out, deltas)
    }

    /// Announces the open call once its name is known, then sends its arguments as far
    /// as they are written.
    fn stream_open(&mut self, deltas: &mut Vec<CallDelta>) {
        if self.open.is_none() {
            let Some((name, start)) = call_head(&self.pending) else {
                return;
            };
            let index = self.calls;
            self.calls += 1;
            deltas.push(CallDelta {
                index,
                name: Some(name),
                arguments: String::new(),
            });
            self.open = Some(OpenCall {
                index,
                start,
                sent: 0,
            });
        }
        let o = self.open.as_mut().expect("opened above");
        if let Some(d) = rest_of(o, &self.pending[o.start..]) {
            o.sent += d.arguments.len();
            deltas.push(d);
        }
    }

    /// The end of the reply: a held-back bare call, the rest of a call being streamed
    /// (cut short, or bare), or else text.
    pub(crate) fn finish(&mut self) -> (String, Vec<CallDelta>) {
        let rest = std::mem::take(&mut self.pending);
        if std::mem::take(&mut self.in_call) {
            return match self.open.take() {
                Some(o) => {
                    let args = &rest[o.start..];
                    // After a bare call's arguments: its own brace, then any text.
                    let after = object_end(args).map_or("", |e| &args[e..]);
                    let after = after.trim_start();
                    let after = after.strip_prefix('}').unwrap_or(after).trim();
                    (after.to_string(), rest_of(&o, args).into_iter().collect())
                }
                None => (format!("{OPEN}{rest}"), Vec::new()),
            };
        }
        if self.bare {
            self.bare = false;
            if let Some(c) = parse_call(&rest).filter(|c| self.names.contains(&c.name)) {
                return (String::new(), vec![self.whole(c)]);
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

/// What of an open call's arguments (`args`, as written so far) is not sent yet: up to
/// the brace that closes them, or all of it while they are open.
fn rest_of(o: &OpenCall, args: &str) -> Option<CallDelta> {
    let upto = object_end(args).unwrap_or_else(|| args.trim_end().len());
    (upto > o.sent).then(|| CallDelta {
        index: o.index,
        name: None,
        arguments: args[o.sent..upto].to_string(),
    })
}

/// The length of the longest tail of `s` that could begin `tag`.
fn tag_prefix(s: &str, tag: &str) -> usize {
    (1..tag.len())
        .rev()
        .find(|&k| s.ends_with(&tag[..k]))
        .unwrap_or(0)
}

/// `tool_calls` entries (OpenAI's shape), numbered from 0.
pub(crate) fn calls_json(calls: &[Call], id: &str) -> Value {
    Value::Array(
        calls
            .iter()
            .enumerate()
            .map(|(i, c)| {
                json!({"index": i, "id": call_id(id, i), "type": "function",
                       "function": {"name": c.name, "arguments": c.arguments}})
            })
            .collect(),
    )
}

/// Streamed `tool_calls` deltas: a call's first delta has its id, type and name.
pub(crate) fn deltas_json(deltas: &[CallDelta], id: &str) -> Value {
    Value::Array(
        deltas
            .iter()
            .map(|d| match &d.name {
                Some(name) => json!({"index": d.index, "id": call_id(id, d.index),
                    "type": "function", "function": {"name": name, "arguments": d.arguments}}),
                None => json!({"index": d.index, "function": {"arguments": d.arguments}}),
            })
            .collect(),
    )
}

fn call_id(id: &str, index: usize) -> String {
    format!("call_{id}_{index}")
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

    /// Feeds `whole` one character at a time; returns the text and each call's
    /// (name, concatenated arguments, number of argument fragments).
    fn stream_chars(whole: &str, names: &[&str]) -> (String, Vec<(String, String, usize)>, String) {
        let mut s = ToolStream::new(names.iter().map(|n| n.to_string()).collect(), true);
        let (mut text, mut calls) = (String::new(), Vec::<(String, String, usize)>::new());
        for ch in whole.chars() {
            let (t, deltas) = s.push(&ch.to_string());
            text.push_str(&t);
            for d in deltas {
                match d.name {
                    Some(n) => {
                        assert_eq!(d.index, calls.len(), "calls are numbered in order");
                        calls.push((n, d.arguments, 0));
                    }
                    None => {
                        let c = &mut calls[d.index];
                        c.1.push_str(&d.arguments);
                        c.2 += 1;
                    }
                }
            }
        }
        let (rest, more) = s.finish();
        assert!(more.is_empty());
        (text, calls, rest)
    }

    #[test]
    fn streamed_calls_come_in_fragments_and_text_holds_back_only_a_tag() {
        let whole = "Hi <tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1, \"s\": \"a}b </c\"}}\n</tool_call> done <tool_call>\n{\"name\": \"g\", \"arguments\": {\"y\": {\"z\": [1, 2]}}}\n</tool_call><tool";
        let (text, calls, rest) = stream_chars(whole, &["f", "g"]);
        assert_eq!(text, "Hi  done ");
        assert_eq!(rest, "<tool");
        assert_eq!(calls.len(), 2);
        assert_eq!((calls[0].0.as_str(), calls[1].0.as_str()), ("f", "g"));
        // The fragments join into exactly the arguments the model wrote.
        assert_eq!(calls[0].1, "{\"x\": 1, \"s\": \"a}b </c\"}");
        assert_eq!(calls[1].1, "{\"y\": {\"z\": [1, 2]}}");
        assert!(calls[0].2 > 5, "arguments were not streamed: {calls:?}");
        // A block that is not a call, or names its arguments first, is handled whole.
        let (text, calls, _) = stream_chars("a <tool_call>not json</tool_call> b", &["f"]);
        assert_eq!(
            (text.as_str(), calls.len()),
            ("a <tool_call>not json</tool_call> b", 0)
        );
        let (_, calls, _) = stream_chars(
            "<tool_call>{\"arguments\": {\"x\": 2}, \"name\": \"f\"}</tool_call>",
            &["f"],
        );
        assert_eq!(calls, vec![("f".into(), "{\"x\":2}".into(), 0)]);
    }

    #[test]
    fn a_bare_call_naming_an_offered_function_streams_too() {
        let (text, calls, rest) = stream_chars(
            " {\"name\": \"f\", \"arguments\": {\"x\": \"{[\\\"]}\"}}\nok",
            &["f"],
        );
        assert_eq!(text, "");
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].1, "{\"x\": \"{[\\\"]}\"}");
        assert!(calls[0].2 > 3, "{calls:?}");
        assert_eq!(rest, "ok");
        // Naming no offered function, it is text, released at the end.
        let (text, calls, rest) = stream_chars("{\"name\": \"g\", \"arguments\": {}}", &["f"]);
        assert_eq!((text.as_str(), calls.len()), ("", 0));
        assert_eq!(rest, "{\"name\": \"g\", \"arguments\": {}}");
        assert_eq!(object_end("{\"a\": [1, {\"b\": \"}\"}]} tail"), Some(22));
        assert_eq!(object_end("{\"a\": \"\\\"}\""), None);
    }

    #[test]
    fn a_call_cut_short_ends_with_what_was_written() {
        let mut s = ToolStream::new(vec!["f".into()], true);
        let (_, d) = s.push("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": [1, 2");
        assert_eq!(d.len(), 2);
        assert_eq!(d[1].arguments, "{\"x\": [1, 2");
        let (text, d) = s.finish();
        assert_eq!((text.as_str(), d.len()), ("", 0));
        assert_eq!(s.calls(), 1);
    }
}
