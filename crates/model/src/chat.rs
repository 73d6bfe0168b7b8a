//! Chat templates: turning a conversation into the prompt text a model was trained on.
//!
//! Models ship a Jinja template (GGUF `tokenizer.chat_template`, or
//! `tokenizer_config.json`) written for Hugging Face `transformers`. It is rendered with
//! minijinja, set up to behave like transformers' environment so the output is
//! byte-identical:
//!
//! * `trim_blocks` and `lstrip_blocks` on (transformers enables both);
//! * variables `messages`, `add_generation_prompt`, `bos_token`, `eos_token`, and `tools`
//!   / `documents` set to none, as transformers passes them when absent;
//! * `raise_exception(msg)` and `strftime_now(fmt)` globals;
//! * Python string/dict/list methods (`.strip()`, `.startswith()`, `.items()`, ...) via
//!   `minijinja-contrib`'s pycompat callback;
//! * a `tojson` filter matching Python's `json.dumps(..., ensure_ascii=False)` layout
//!   (`", "` and `": "` separators, optional `indent`), which templates embed in prompts;
//! * transformers' `{% generation %}` marker tags are accepted and ignored.

use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, Error, ErrorKind, UndefinedBehavior};
use serde::{Deserialize, Serialize};

use crate::error::{ModelError, Result};
use crate::tokenizer::Tokenizer;

const TEMPLATE_NAME: &str = "chat_template";

/// One turn of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `"system"`, `"user"`, `"assistant"`, `"tool"`, ...
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }

    pub fn system(content: impl Into<String>) -> Self {
        Self::new("system", content)
    }

    pub fn user(content: impl Into<String>) -> Self {
        Self::new("user", content)
    }

    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new("assistant", content)
    }
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Compiles `template_source`. `bos_token`/`eos_token` are the texts the template
    /// sees under those names (e.g. `"<|endoftext|>"`, `"<|im_end|>"`).
    pub fn new(template_source: String, bos_token: String, eos_token: String) -> Result<Self> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_undefined_behavior(UndefinedBehavior::Lenient);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned(TEMPLATE_NAME, strip_generation_tags(&template_source))
            .map_err(|e| {
                ModelError::ChatTemplate(format!("template does not compile: {}", describe(&e)))
            })?;
        Ok(Self {
            env,
            bos_token,
            eos_token,
        })
    }

    /// The tokenizer's own template with its BOS/EOS texts; `None` if the model has no
    /// template.
    pub fn from_tokenizer(tok: &Tokenizer) -> Result<Option<Self>> {
        let Some(source) = tok.chat_template() else {
            return Ok(None);
        };
        let text = |id: Option<u32>| {
            id.and_then(|id| tok.id_to_token(id))
                .unwrap_or_default()
                .to_string()
        };
        Self::new(source.to_string(), text(tok.bos_id()), text(tok.eos_id())).map(Some)
    }

    /// Renders `messages`; with `add_generation_prompt` the result ends with the header
    /// that makes the model answer as the assistant.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        let tmpl = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| ModelError::ChatTemplate(describe(&e)))?;
        let ctx = minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
            tools => Value::from(()),
            documents => Value::from(()),
        };
        tmpl.render(ctx)
            .map_err(|e| ModelError::ChatTemplate(format!("rendering failed: {}", describe(&e))))
    }
}

impl ChatTemplate {
    /// Renders messages given as JSON objects, which may carry more than role and
    /// content (an assistant's `tool_calls`, a tool result's `tool_call_id`), with the
    /// tool definitions the template lists in its prompt (`None`: no tools).
    pub fn render_json(
        &self,
        messages: &[serde_json::Value],
        tools: Option<&[serde_json::Value]>,
        add_generation_prompt: bool,
    ) -> Result<String> {
        let tmpl = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| ModelError::ChatTemplate(describe(&e)))?;
        let ctx = minijinja::context! {
            messages => Value::from_serialize(messages),
            add_generation_prompt => add_generation_prompt,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
            tools => tools.map_or(Value::from(()), Value::from_serialize),
            documents => Value::from(()),
        };
        tmpl.render(ctx)
            .map_err(|e| ModelError::ChatTemplate(format!("rendering failed: {}", describe(&e))))
    }
}

/// Error text including the detail and location minijinja knows about.
fn describe(e: &Error) -> String {
    let mut msg = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        source = s.source();
    }
    msg
}

fn raise_exception(message: String) -> std::result::Result<Value, Error> {
    Err(Error::new(
        ErrorKind::InvalidOperation,
        format!("template raised an exception: {message}"),
    ))
}

/// `strftime_now(format)` as provided by transformers (Llama 3 templates print today's
/// date). Supports the common `%` codes in UTC.
fn strftime_now(format: String) -> std::result::Result<Value, Error> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    Ok(Value::from(format_time(secs, &format)))
}

fn format_time(unix_secs: i64, format: &str) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
    ];
    let days = unix_secs.div_euclid(86_400);
    let secs_of_day = unix_secs.rem_euclid(86_400);
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday.
    let (h, m, s) = (secs_of_day / 3600, secs_of_day / 60 % 60, secs_of_day % 60);
    let month_name = MONTHS[(month - 1) as usize];

    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&format!("{:02}", year.rem_euclid(100))),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('e') => out.push_str(&format!("{day:>2}")),
            Some('H') => out.push_str(&format!("{h:02}")),
            Some('M') => out.push_str(&format!("{m:02}")),
            Some('S') => out.push_str(&format!("{s:02}")),
            Some('B') => out.push_str(month_name),
            Some('b') => out.push_str(&month_name[..3]),
            Some('A') => out.push_str(DAYS[weekday]),
            Some('a') => out.push_str(&DAYS[weekday][..3]),
            Some('j') => out.push_str(&format!("{:03}", day_of_year(year, month, day))),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

fn day_of_year(year: i64, month: i64, day: i64) -> i64 {
    const CUM: [i64; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    CUM[(month - 1) as usize] + day + i64::from(leap && month > 2)
}

/// Python `json.dumps(value, ensure_ascii=False, indent=indent)` formatting, which
/// differs from minijinja's built-in `tojson` (compact, HTML-escaped).
fn tojson(value: Value, kwargs: Kwargs) -> std::result::Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    // Accepted for compatibility with transformers' signature; output is always
    // non-ASCII-preserving with insertion (or sorted map) order.
    let _: Option<Value> = kwargs.get("ensure_ascii")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let _: Option<Value> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(&value).map_err(|e| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("value cannot be converted to JSON: {e}"),
        )
    })?;
    let mut out = String::new();
    write_py_json(&json, indent, 0, sort_keys.unwrap_or(false), &mut out);
    Ok(Value::from_safe_string(out))
}

fn write_py_json(
    v: &serde_json::Value,
    indent: Option<usize>,
    level: usize,
    sort_keys: bool,
    out: &mut String,
) {
    use serde_json::Value as J;
    let newline = |out: &mut String, level: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * level));
        }
    };
    let item_sep = if indent.is_some() { "," } else { ", " };
    match v {
        J::Array(items) if !items.is_empty() => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, level + 1);
                write_py_json(item, indent, level + 1, sort_keys, out);
            }
            newline(out, level);
            out.push(']');
        }
        J::Object(map) if !map.is_empty() => {
            let mut entries: Vec<_> = map.iter().collect();
            if sort_keys {
                entries.sort_by(|a, b| a.0.cmp(b.0));
            }
            out.push('{');
            for (i, (k, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, level + 1);
                out.push_str(&serde_json::to_string(k).unwrap_or_default());
                out.push_str(": ");
                write_py_json(item, indent, level + 1, sort_keys, out);
            }
            newline(out, level);
            out.push('}');
        }
        // Scalars, `[]` and `{}` print the same as serde_json's compact form, which
        // escapes strings like Python does with ensure_ascii=False.
        other => out.push_str(&serde_json::to_string(other).unwrap_or_default()),
    }
}

/// Removes transformers' `{% generation %}` / `{% endgeneration %}` tags (they only mark
/// assistant spans for training masks and have no output).
fn strip_generation_tags(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let mut rest = src;
    while let Some(start) = rest.find("{%") {
        let (before, tag_and_after) = rest.split_at(start);
        out.push_str(before);
        let Some(end) = tag_and_after.find("%}") else {
            out.push_str(tag_and_after);
            return out;
        };
        let tag = &tag_and_after[..end + 2];
        let body =
            tag[2..tag.len() - 2].trim_matches(|c: char| c == '-' || c == '+' || c.is_whitespace());
        if body != "generation" && body != "endgeneration" {
            out.push_str(tag);
        }
        rest = &tag_and_after[end + 2..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(src: &str, msgs: &[ChatMessage], gen: bool) -> String {
        ChatTemplate::new(src.into(), "<s>".into(), "</s>".into())
            .unwrap()
            .render(msgs, gen)
            .unwrap()
    }

    #[test]
    fn python_methods_and_globals() {
        let out = render(
            "{{ bos_token }}{% for m in messages %}{{ m.role.upper() }}:{{ m['content'].strip() }}\
             {% if m.content.startswith(' ') %}*{% endif %};{% endfor %}{{ tools is none }}",
            &[ChatMessage::user("  hi  ")],
            false,
        );
        assert_eq!(out, "<s>USER:hi*;True");
    }

    #[test]
    fn raise_exception_is_an_error() {
        let t = ChatTemplate::new(
            "{{ raise_exception('only user and assistant roles') }}".into(),
            String::new(),
            String::new(),
        )
        .unwrap();
        let err = t.render(&[], false).unwrap_err().to_string();
        assert!(err.contains("only user and assistant roles"), "{err}");
    }

    #[test]
    fn compile_error_names_the_problem() {
        let err = ChatTemplate::new("{% for x in %}".into(), String::new(), String::new())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("chat template") && err.contains("does not compile"),
            "{err}"
        );
    }

    #[test]
    fn tojson_matches_python() {
        let out = render(
            "{{ {'b': [1, 'é\"'], 'a': none} | tojson }}|{{ [1, {'x': 2}] | tojson(indent=2) }}",
            &[],
            false,
        );
        assert_eq!(
            out,
            "{\"a\": null, \"b\": [1, \"é\\\"\"]}|[\n  1,\n  {\n    \"x\": 2\n  }\n]"
        );
    }

    #[test]
    fn generation_tags_are_ignored() {
        let out = render(
            "{% for m in messages %}{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}",
            &[ChatMessage::assistant("ok")],
            false,
        );
        assert_eq!(out, "ok");
    }

    #[test]
    fn formats_dates() {
        // 2024-07-26 13:05:09 UTC, a Friday.
        assert_eq!(
            format_time(1_722_000_309, "%d %b %Y %H:%M:%S %A %j"),
            "26 Jul 2024 13:25:09 Friday 208"
        );
    }
}
