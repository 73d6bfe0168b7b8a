//! Virtual keys, their limits, and the usage ledger.
//!
//! A key carries the models it may use, requests per minute, tokens per minute and a
//! token budget. Limits are sliding windows over the last 60 s, so "60 per minute"
//! refuses the 61st request whenever it comes. Tokens are counted from the usage the
//! upstream reports once a response is done; a request is admitted while the window's
//! tokens are below the limit. Keys are stored as SHA-256 hashes, never in clear.
//!
//! State lives in SQLite by default (one file, survives restarts) or in Redis, where
//! several gateway instances share one set of counters: admission there is one Lua
//! script, so two instances cannot both take the last request of a window.

mod redis_store;
mod sqlite;

use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

pub use redis_store::RedisStore;
pub use sqlite::SqliteStore;

pub const WINDOW_MS: i64 = 60_000;

/// A key as an admin creates it (LiteLLM's `/key/generate` field names).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeySpec {
    #[serde(default)]
    pub key_alias: Option<String>,
    /// Model groups the key may use; empty means all.
    #[serde(default)]
    pub models: Vec<String>,
    #[serde(default)]
    pub rpm_limit: Option<u64>,
    #[serde(default)]
    pub tpm_limit: Option<u64>,
    /// Total tokens (prompt + completion) the key may ever use.
    #[serde(default)]
    pub max_budget_tokens: Option<u64>,
    #[serde(default)]
    pub metadata: Option<serde_json::Value>,
}

#[derive(Debug, Clone, Serialize)]
pub struct KeyRecord {
    /// SHA-256 of the key, hex (LiteLLM's `token`).
    pub token: String,
    #[serde(flatten)]
    pub spec: KeySpec,
    pub created: i64,
    pub spent_tokens: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct LedgerRow {
    pub model: String,
    pub requests: u64,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
}

/// What admission says.
#[derive(Debug, Clone, PartialEq)]
pub enum Admission {
    Admitted {
        remaining_requests: Option<u64>,
        remaining_tokens: Option<u64>,
    },
    UnknownKey,
    ModelNotAllowed(Vec<String>),
    BudgetExhausted {
        budget: u64,
        spent: u64,
    },
    /// Over a per-minute limit; retry after this many seconds.
    RateLimited {
        limit: &'static str,
        retry_after_s: u64,
        limit_requests: Option<u64>,
        limit_tokens: Option<u64>,
    },
}

pub fn hash_key(key: &str) -> String {
    let d = Sha256::digest(key.as_bytes());
    d.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn new_key() -> String {
    use rand::Rng;
    let mut rng = rand::thread_rng();
    let bytes: [u8; 24] = rng.gen();
    format!(
        "sk-{}",
        bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()
    )
}

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Seconds until the window's oldest entry leaves it (at least 1).
pub fn retry_after(oldest_ms: i64, now: i64) -> u64 {
    (((oldest_ms + WINDOW_MS - now).max(0) as u64).div_ceil(1000)).max(1)
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("key store (SQLite): {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("key store (Redis): {0}")]
    Redis(#[from] redis::RedisError),
    #[error("key store: {0}")]
    Other(String),
}

pub enum Store {
    Sqlite(SqliteStore),
    Redis(RedisStore),
}

impl Store {
    pub async fn create(&self, spec: KeySpec) -> Result<(String, KeyRecord), StoreError> {
        let key = new_key();
        let rec = KeyRecord {
            token: hash_key(&key),
            spec,
            created: now_ms() / 1000,
            spent_tokens: 0,
        };
        match self {
            Store::Sqlite(s) => s.insert(&rec)?,
            Store::Redis(s) => s.insert(&rec).await?,
        }
        Ok((key, rec))
    }

    pub async fn list(&self) -> Result<Vec<KeyRecord>, StoreError> {
        match self {
            Store::Sqlite(s) => s.list(),
            Store::Redis(s) => s.list().await,
        }
    }

    /// `key_or_token`: the key itself or its hash.
    pub async fn get(&self, key_or_token: &str) -> Result<Option<KeyRecord>, StoreError> {
        let token = token_of(key_or_token);
        match self {
            Store::Sqlite(s) => s.get(&token),
            Store::Redis(s) => s.get(&token).await,
        }
    }

    /// Revokes; returns whether the key existed.
    pub async fn delete(&self, key_or_token: &str) -> Result<bool, StoreError> {
        let token = token_of(key_or_token);
        match self {
            Store::Sqlite(s) => s.delete(&token),
            Store::Redis(s) => s.delete(&token).await,
        }
    }

    /// Checks a request against the key's limits and, if admitted, counts it.
    pub async fn admit(&self, key: &str, model: &str) -> Result<Admission, StoreError> {
        let token = hash_key(key);
        match self {
            Store::Sqlite(s) => s.admit(&token, model, now_ms()),
            Store::Redis(s) => s.admit(&token, model, now_ms()).await,
        }
    }

    /// Charges a finished request's real token counts to the key.
    pub async fn record_usage(
        &self,
        key: &str,
        model: &str,
        prompt: u64,
        completion: u64,
    ) -> Result<(), StoreError> {
        let token = hash_key(key);
        match self {
            Store::Sqlite(s) => s.record_usage(&token, model, prompt, completion, now_ms()),
            Store::Redis(s) => {
                s.record_usage(&token, model, prompt, completion, now_ms())
                    .await
            }
        }
    }

    pub async fn ledger(&self, key_or_token: &str) -> Result<Vec<LedgerRow>, StoreError> {
        let token = token_of(key_or_token);
        match self {
            Store::Sqlite(s) => s.ledger(&token),
            Store::Redis(s) => s.ledger(&token).await,
        }
    }
}

fn token_of(key_or_token: &str) -> String {
    if key_or_token.len() == 64 && key_or_token.bytes().all(|b| b.is_ascii_hexdigit()) {
        key_or_token.to_ascii_lowercase()
    } else {
        hash_key(key_or_token)
    }
}

/// The admission rule both stores apply, given the window's state.
pub fn decide(
    rec: &KeyRecord,
    model: &str,
    window_requests: u64,
    oldest_request_ms: Option<i64>,
    window_tokens: u64,
    oldest_token_ms: Option<i64>,
    now: i64,
) -> Admission {
    let s = &rec.spec;
    if !s.models.is_empty() && !s.models.iter().any(|m| m == model) {
        return Admission::ModelNotAllowed(s.models.clone());
    }
    if let Some(b) = s.max_budget_tokens {
        if rec.spent_tokens >= b {
            return Admission::BudgetExhausted {
                budget: b,
                spent: rec.spent_tokens,
            };
        }
    }
    if let Some(rpm) = s.rpm_limit {
        if window_requests >= rpm {
            return Admission::RateLimited {
                limit: "requests",
                retry_after_s: retry_after(oldest_request_ms.unwrap_or(now), now),
                limit_requests: Some(rpm),
                limit_tokens: s.tpm_limit,
            };
        }
    }
    if let Some(tpm) = s.tpm_limit {
        if window_tokens >= tpm {
            return Admission::RateLimited {
                limit: "tokens",
                retry_after_s: retry_after(oldest_token_ms.unwrap_or(now), now),
                limit_requests: s.rpm_limit,
                limit_tokens: Some(tpm),
            };
        }
    }
    Admission::Admitted {
        remaining_requests: s.rpm_limit.map(|r| r.saturating_sub(window_requests + 1)),
        remaining_tokens: s.tpm_limit.map(|t| t.saturating_sub(window_tokens)),
    }
}
