//! Structured outputs: a request's JSON schema, regex, choice list or grammar, compiled
//! into a matcher that says, before every sampled token, which tokens may come next.
//!
//! The matcher is llguidance's (the library vLLM and llama.cpp can use for the same job):
//! an Earley parser over the grammar with a lexer of derivative-based regexes, walking a
//! byte trie of the vocabulary to produce a token mask in tens of microseconds. Writing
//! one by hand would buy nothing: this crate only adapts it to pagellm's vocabulary,
//! request fields and errors.
//!
//! A [`Compiler`] is built once per model (it indexes the vocabulary); each request's
//! [`Constraint`] compiles into a [`Guide`], which the engine asks for a [`TokenMask`]
//! before each sample and then advances by the sampled token.

mod gbnf;

use std::fmt;
use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, SimpleVob, TokEnv, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory};
use serde_json::{json, Value};

pub use gbnf::gbnf_to_lark;

/// What a request constrains its output to.
#[derive(Debug, Clone, PartialEq)]
pub enum Constraint {
    /// Text that validates against a JSON schema. An object that does not set
    /// `additionalProperties` admits only its declared properties, as in llama.cpp and in
    /// vLLM's default backend (and as OpenAI's `strict` mode requires of every schema):
    /// JSON Schema's own default, any other key, lets small models wander into keys of
    /// their own until the token limit.
    JsonSchema(Value),
    /// Any JSON object (`response_format: {"type": "json_object"}`).
    JsonObject,
    /// Text that matches a regular expression, whole.
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// A grammar: Lark (llguidance's dialect, as vLLM's `guidance` backend takes it) or
    /// GBNF (llama.cpp's), told apart by GBNF's `::=`.
    Grammar(String),
}

impl Constraint {
    /// The name a client knows the constraint by, for messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Constraint::JsonSchema(_) => "JSON schema",
            Constraint::JsonObject => "JSON object",
            Constraint::Regex(_) => "regex",
            Constraint::Choice(_) => "choice",
            Constraint::Grammar(_) => "grammar",
        }
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// The constraint does not compile; the message says why.
    #[error("invalid {kind}: {message}")]
    Invalid { kind: &'static str, message: String },
    /// The matcher failed while generating (for example, no token can continue).
    #[error("structured output: {0}")]
    Matcher(String),
    #[error("vocabulary: {0}")]
    Vocabulary(String),
}

/// The model's tokens as the matcher needs them.
pub struct Vocabulary {
    /// Each token's bytes as it renders in text (special tokens: their name).
    pub pieces: Vec<Vec<u8>>,
    /// Control and other special tokens, which constrained text can never contain.
    pub special: Vec<bool>,
    /// The token that ends a constrained output (allowed once the grammar is complete).
    pub eos: u32,
    /// Logits per row; may exceed `pieces.len()` (padding rows, never allowed).
    pub logits_len: usize,
}

/// Compiles constraints for one model.
#[derive(Clone)]
pub struct Compiler {
    factory: Arc<ParserFactory>,
}

impl Compiler {
    pub fn new(v: &Vocabulary) -> Result<Self, Error> {
        let n = v.logits_len.max(v.pieces.len());
        if v.eos as usize >= n {
            return Err(Error::Vocabulary(format!(
                "end token {} outside the vocabulary of {n}",
                v.eos
            )));
        }
        let words: Vec<Vec<u8>> = (0..n)
            .map(|i| match v.pieces.get(i) {
                // Special tokens carry the trie's marker byte, so no grammar can spell
                // them as text; ids without a piece get a name that nothing matches.
                Some(p) if !v.special.get(i).copied().unwrap_or(false) && !p.is_empty() => {
                    p.clone()
                }
                Some(p) if !p.is_empty() => [&[TokTrie::SPECIAL_TOKEN_MARKER][..], p].concat(),
                _ => [TokTrie::SPECIAL_TOKEN_MARKER]
                    .into_iter()
                    .chain(format!("<[{i}]>").into_bytes())
                    .collect(),
            })
            .collect();
        let info = TokRxInfo::new(n as u32, v.eos);
        let trie = TokTrie::from(&info, &words);
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| Error::Vocabulary(e.to_string()))?;
        factory.quiet();
        Ok(Self {
            factory: Arc::new(factory),
        })
    }

    /// Compiles `c`; an error names what is wrong with it.
    pub fn compile(&self, c: &Constraint) -> Result<Guide, Error> {
        let invalid = |message: String| Error::Invalid {
            kind: c.kind(),
            message,
        };
        let grammar = match c {
            Constraint::JsonSchema(schema) => {
                if !schema.is_object() && !schema.is_boolean() {
                    return Err(invalid("a schema must be a JSON object".into()));
                }
                let mut schema = schema.clone();
                close_objects(&mut schema);
                TopLevelGrammar::from_json_schema(with_layout(schema))
            }
            Constraint::JsonObject => {
                TopLevelGrammar::from_json_schema(with_layout(json!({"type": "object"})))
            }
            Constraint::Regex(rx) => TopLevelGrammar::from_regex(rx),
            Constraint::Choice(options) => {
                if options.is_empty() {
                    return Err(invalid("the list of choices is empty".into()));
                }
                let alts: Vec<String> = options.iter().map(|o| escape_regex(o)).collect();
                TopLevelGrammar::from_regex(&alts.join("|"))
            }
            Constraint::Grammar(g) => {
                let lark = if g.contains("::=") {
                    gbnf_to_lark(g).map_err(invalid)?
                } else {
                    g.clone()
                };
                TopLevelGrammar::from_lark(lark)
            }
        };
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| invalid(e.to_string()))?;
        let m = Matcher::new(Ok(parser));
        if let Some(e) = m.get_error() {
            return Err(invalid(e));
        }
        Ok(Guide { m })
    }
}

/// A Lark rule body (`%json {...}`) for a JSON value following `schema`, laid out and
/// closed as [`Constraint::JsonSchema`] is, for grammars that embed JSON (tool calls).
pub fn lark_json(schema: &Value) -> String {
    let mut schema = schema.clone();
    close_objects(&mut schema);
    format!("%json {}", with_layout(schema))
}

/// JSON the way models write it: `", "` and `": "` between items, no free whitespace
/// (which small models can repeat until the token limit), unless the schema sets its own
/// `x-guidance` options.
fn with_layout(mut schema: Value) -> Value {
    if let Some(o) = schema.as_object_mut() {
        o.entry("x-guidance").or_insert_with(
            || json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}),
        );
    }
    schema
}

/// Every object schema without its own `additionalProperties` admits only its declared
/// properties (see [`Constraint::JsonSchema`]).
fn close_objects(v: &mut Value) {
    match v {
        Value::Object(o) => {
            let is_object =
                o.get("type").is_some_and(|t| t == "object") || o.contains_key("properties");
            if is_object && !o.contains_key("additionalProperties") {
                o.insert("additionalProperties".into(), Value::Bool(false));
            }
            o.values_mut().for_each(close_objects);
        }
        Value::Array(a) => a.iter_mut().for_each(close_objects),
        _ => {}
    }
}

/// `s` as a regex that matches exactly `s`.
fn escape_regex(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 8);
    for ch in s.chars() {
        if "\\.+*?()|[]{}^$#&-~".contains(ch) {
            out.push('\\');
        }
        out.push(ch);
    }
    out
}

/// One request's matcher: which tokens may come next, advanced token by token.
pub struct Guide {
    m: Matcher,
}

impl Clone for Guide {
    /// An independent copy (for the `n` choices of one request).
    fn clone(&self) -> Self {
        Self {
            m: self.m.deep_clone(),
        }
    }
}

impl fmt::Debug for Guide {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Guide")
            .field("stopped", &self.m.is_stopped())
            .finish()
    }
}

impl Guide {
    /// The tokens allowed next; only the end token once the grammar is complete.
    pub fn mask(&mut self) -> Result<TokenMask, Error> {
        let m = self
            .m
            .compute_mask_or_eos()
            .map_err(|e| Error::Matcher(e.to_string()))?;
        if m.is_zero() {
            return Err(Error::Matcher("no token can continue the output".into()));
        }
        Ok(TokenMask(m))
    }

    /// Takes `token` as the next output token. Once the grammar is complete the mask
    /// allows only the end token, which needs no parsing.
    pub fn advance(&mut self, token: u32) -> Result<(), Error> {
        if self.m.is_stopped() {
            return Ok(());
        }
        self.m
            .consume_token(token)
            .map_err(|e| Error::Matcher(e.to_string()))
    }

    /// Takes output tokens produced before this guide was attached (a resumed stream).
    pub fn advance_all(&mut self, tokens: &[u32]) -> Result<(), Error> {
        self.m
            .consume_tokens(tokens)
            .map_err(|e| Error::Matcher(e.to_string()))
    }

    /// Whether the grammar is complete (only the end token remains).
    pub fn is_complete(&self) -> bool {
        self.m.is_stopped()
    }
}

/// The set of tokens a [`Guide`] allows at one step.
pub struct TokenMask(SimpleVob);

impl TokenMask {
    pub fn allows(&self, token: u32) -> bool {
        (token as usize) < self.0.len() && self.0.is_allowed(token)
    }

    pub fn count(&self) -> usize {
        self.0.num_set()
    }

    /// Sets every disallowed token's logit to −∞.
    pub fn apply(&self, logits: &mut [f32]) {
        let words = self.0.as_slice();
        for (w, chunk) in logits.chunks_mut(32).enumerate() {
            let bits = words.get(w).copied().unwrap_or(0);
            if bits == u32::MAX {
                continue;
            }
            for (b, l) in chunk.iter_mut().enumerate() {
                if bits & (1 << b) == 0 {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
