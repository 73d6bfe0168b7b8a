//! A request's prompt as the block hashes its replica's KV cache will use.
//!
//! With the group's tokenizer loaded (`pagellm_settings.tokenizers`), the gateway
//! renders and tokenizes the request exactly as `pagellm serve` does (the server's own
//! function) and hashes full blocks with the engine's chained block hash, so a match
//! against a replica's KV events is a real cache hit. Without one, it hashes chunks of
//! the prompt text, which only its own routing history can match.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};

use pagellm_engine::kv_cache::extend_block_hashes;
use pagellm_model::chat::ChatTemplate;
use pagellm_model::tokenizer::Tokenizer;
use serde_json::Value;

use crate::config::{Config, Policy};
use crate::routing::{text_hashes, PrefixKey};
use crate::Runtime;

pub struct GroupTokenizer {
    pub tok: Tokenizer,
    pub template: Option<ChatTemplate>,
}

/// Tokenizers per model group, loaded in the background at start and on reload.
#[derive(Default)]
pub struct Tokenizers {
    map: Arc<RwLock<HashMap<String, Arc<GroupTokenizer>>>>,
    loading: Arc<Mutex<HashSet<(String, String)>>>,
}

impl Tokenizers {
    pub fn load(&self, config: &Config) {
        for (group, spec) in &config.tokenizers {
            let key = (group.clone(), spec.clone());
            if !self.loading.lock().unwrap().insert(key) {
                continue;
            }
            let (map, group, spec) = (self.map.clone(), group.clone(), spec.clone());
            std::thread::spawn(move || {
                let loaded = pagellm_model::loader::load_tokenizer(&spec).and_then(|tok| {
                    let template = ChatTemplate::from_tokenizer(&tok)?;
                    Ok(GroupTokenizer { tok, template })
                });
                match loaded {
                    Ok(t) => {
                        tracing::info!("model group {group}: tokenizer {spec} loaded");
                        map.write().unwrap().insert(group, Arc::new(t));
                    }
                    Err(e) => tracing::error!(
                        "model group {group}: cannot load tokenizer {spec} ({e:#}); \
                         prefix routing falls back to text chunks"
                    ),
                }
            });
        }
    }

    pub fn get(&self, group: &str) -> Option<Arc<GroupTokenizer>> {
        self.map.read().unwrap().get(group).cloned()
    }

    pub fn is_loaded(&self, group: &str) -> bool {
        self.map.read().unwrap().contains_key(group)
    }
}

/// The prefix key of `body` for `group`'s replicas; `PrefixKey::None` unless the policy
/// uses prefixes.
pub fn prefix_key(
    rt: &Runtime,
    toks: &Tokenizers,
    group: &str,
    chat: bool,
    body: &Value,
) -> PrefixKey {
    if rt.config.policy != Policy::PrefixAware {
        return PrefixKey::None;
    }
    let block_size = rt.groups.get(group).and_then(|rs| {
        rs.iter().find_map(|r| {
            let p = r.prefix.lock().unwrap();
            p.connected.then_some(p.block_size).flatten()
        })
    });
    if let (Some(t), Some(bs)) = (toks.get(group), block_size) {
        if let Ok(prompts) =
            pagellm_server::prompt_token_ids(&t.tok, t.template.as_ref(), chat, body)
        {
            if let Some(ids) = prompts.first() {
                let salt = body.get("cache_salt").and_then(Value::as_str);
                let mut hashes = Vec::new();
                extend_block_hashes(&mut hashes, ids, bs, salt);
                return PrefixKey::Exact {
                    block_size: bs,
                    hashes: hashes.into_iter().map(|h| h.0).collect(),
                };
            }
        }
    }
    PrefixKey::Text(text_hashes(&prompt_text(body, chat)))
}

/// The prompt as text, for text-chunk hashing: the first completions prompt, or the
/// messages' roles and contents in order.
fn prompt_text(body: &Value, chat: bool) -> String {
    let mut s = String::new();
    if chat {
        for m in body
            .get("messages")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            s.push_str(m.get("role").and_then(Value::as_str).unwrap_or(""));
            s.push('\n');
            match m.get("content") {
                Some(Value::String(c)) => s.push_str(c),
                Some(Value::Array(parts)) => {
                    for p in parts {
                        s.push_str(p.get("text").and_then(Value::as_str).unwrap_or(""));
                    }
                }
                _ => {}
            }
            s.push('\n');
        }
    } else {
        match body.get("prompt") {
            Some(Value::String(p)) => s.push_str(p),
            // A list of strings: the first prompt. Token ids: their text form.
            Some(Value::Array(v)) => match v.first() {
                Some(Value::String(p)) => s.push_str(p),
                Some(Value::Number(_)) => s = Value::Array(v.clone()).to_string(),
                Some(first) => s = first.to_string(),
                None => {}
            },
            _ => {}
        }
    }
    s
}
