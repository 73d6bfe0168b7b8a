//! The shared key store: Redis, for several gateway instances enforcing one set of
//! limits. Admission is a single Lua script (atomic on the server), so the instances
//! never both take the last place of a window.

use redis::aio::MultiplexedConnection;
use redis::{AsyncCommands, Script};

use super::{decide, Admission, KeyRecord, KeySpec, LedgerRow, StoreError, WINDOW_MS};

pub struct RedisStore {
    conn: MultiplexedConnection,
    admit: Script,
}

const PREFIX: &str = "pagellm:gw";

/// KEYS: key record, request window, token window. ARGV: now ms, window ms, member,
/// rpm, tpm, budget (-1 = none). Prunes both windows, counts them, and records the
/// request when all three limits admit it, atomically. Returns {exists, spec, spent,
/// requests in window, oldest request ms, tokens in window, oldest token ms} from
/// before this request; `decide` applies the same three comparisons to them, so the
/// caller's verdict is the script's.
const ADMIT: &str = r#"
local now = tonumber(ARGV[1])
local from = now - tonumber(ARGV[2])
if redis.call('EXISTS', KEYS[1]) == 0 then return {0} end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', from)
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', from)
local spec = redis.call('HGET', KEYS[1], 'spec')
local spent = tonumber(redis.call('HGET', KEYS[1], 'spent') or '0')
local n = redis.call('ZCARD', KEYS[2])
local oldest = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
local used = 0
for _, m in ipairs(redis.call('ZRANGE', KEYS[3], 0, -1)) do
  used = used + tonumber(string.match(m, ':(%d+)$'))
end
local oldest_t = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
local rpm = tonumber(ARGV[4])
local tpm = tonumber(ARGV[5])
local budget = tonumber(ARGV[6])
local ok = 1
if rpm >= 0 and n >= rpm then ok = 0 end
if tpm >= 0 and used >= tpm then ok = 0 end
if budget >= 0 and spent >= budget then ok = 0 end
if ok == 1 then
  redis.call('ZADD', KEYS[2], now, ARGV[3])
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
end
return {1, spec, spent, n, oldest[2] or '', used, oldest_t[2] or ''}
"#;

fn k(kind: &str, token: &str) -> String {
    format!("{PREFIX}:{kind}:{token}")
}

impl RedisStore {
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let client = redis::Client::open(url)?;
        let conn = client.get_multiplexed_async_connection().await?;
        Ok(Self {
            conn,
            admit: Script::new(ADMIT),
        })
    }

    pub async fn insert(&self, rec: &KeyRecord) -> Result<(), StoreError> {
        let spec =
            serde_json::to_string(&rec.spec).map_err(|e| StoreError::Other(e.to_string()))?;
        let mut c = self.conn.clone();
        let _: () = redis::pipe()
            .atomic()
            .hset_multiple(
                k("key", &rec.token),
                &[
                    ("spec", spec),
                    ("created", rec.created.to_string()),
                    ("spent", "0".into()),
                ],
            )
            .sadd(format!("{PREFIX}:keys"), &rec.token)
            .query_async(&mut c)
            .await?;
        Ok(())
    }

    pub async fn get(&self, token: &str) -> Result<Option<KeyRecord>, StoreError> {
        let mut c = self.conn.clone();
        let v: Vec<Option<String>> = redis::cmd("HMGET")
            .arg(k("key", token))
            .arg("spec")
            .arg("created")
            .arg("spent")
            .query_async(&mut c)
            .await?;
        let [Some(spec), created, spent] = <[Option<String>; 3]>::try_from(v)
            .map_err(|_| StoreError::Other("HMGET returned the wrong arity".into()))?
        else {
            return Ok(None);
        };
        let spec: KeySpec = serde_json::from_str(&spec)
            .map_err(|e| StoreError::Other(format!("stored key {token}: {e}")))?;
        Ok(Some(KeyRecord {
            token: token.to_string(),
            spec,
            created: created.and_then(|c| c.parse().ok()).unwrap_or(0),
            spent_tokens: spent.and_then(|s| s.parse().ok()).unwrap_or(0),
        }))
    }

    pub async fn list(&self) -> Result<Vec<KeyRecord>, StoreError> {
        let mut c = self.conn.clone();
        let mut tokens: Vec<String> = c.smembers(format!("{PREFIX}:keys")).await?;
        tokens.sort();
        let mut out = Vec::new();
        for t in tokens {
            if let Some(r) = self.get(&t).await? {
                out.push(r);
            }
        }
        out.sort_by(|a, b| (a.created, &a.token).cmp(&(b.created, &b.token)));
        Ok(out)
    }

    pub async fn delete(&self, token: &str) -> Result<bool, StoreError> {
        let mut c = self.conn.clone();
        let (n, _, _, _): (i64, i64, i64, i64) = redis::pipe()
            .atomic()
            .del(k("key", token))
            .srem(format!("{PREFIX}:keys"), token)
            .del(k("req", token))
            .del(k("tok", token))
            .query_async(&mut c)
            .await?;
        Ok(n > 0)
    }

    pub async fn admit(&self, token: &str, model: &str, now: i64) -> Result<Admission, StoreError> {
        let Some(rec) = self.get(token).await? else {
            return Ok(Admission::UnknownKey);
        };
        // Model permission needs no counters; refuse before touching the windows.
        if !rec.spec.models.is_empty() && !rec.spec.models.iter().any(|m| m == model) {
            return Ok(Admission::ModelNotAllowed(rec.spec.models));
        }
        let opt = |v: Option<u64>| v.map_or(-1, |v| v as i64);
        let member = format!("{now}:{}", rand::random::<u64>());
        let mut c = self.conn.clone();
        let v: Vec<redis::Value> = self
            .admit
            .key(k("key", token))
            .key(k("req", token))
            .key(k("tok", token))
            .arg(now)
            .arg(WINDOW_MS)
            .arg(member)
            .arg(opt(rec.spec.rpm_limit))
            .arg(opt(rec.spec.tpm_limit))
            .arg(opt(rec.spec.max_budget_tokens))
            .invoke_async(&mut c)
            .await?;
        let int = |i: usize| -> i64 {
            v.get(i)
                .and_then(|x| redis::from_redis_value::<String>(x).ok())
                .and_then(|s| s.parse::<f64>().ok())
                .map_or(0, |f| f as i64)
        };
        let opt_ms = |i: usize| -> Option<i64> {
            v.get(i)
                .and_then(|x| redis::from_redis_value::<String>(x).ok())
                .and_then(|s| s.parse::<f64>().ok())
                .map(|f| f as i64)
        };
        if int(0) == 0 {
            return Ok(Admission::UnknownKey);
        }
        let rec = KeyRecord {
            spent_tokens: int(2).max(0) as u64,
            ..rec
        };
        let n = int(3).max(0) as u64;
        let used = int(5).max(0) as u64;
        let a = decide(&rec, model, n, opt_ms(4), used, opt_ms(6), now);
        // The script admitted exactly when `decide` does (same three comparisons); the
        // counts it returned are from before this request.
        Ok(a)
    }

    pub async fn record_usage(
        &self,
        token: &str,
        model: &str,
        prompt: u64,
        completion: u64,
        now: i64,
    ) -> Result<(), StoreError> {
        let total = prompt + completion;
        let mut c = self.conn.clone();
        let member = format!("{now}:{}:{total}", rand::random::<u64>());
        let led = k("ledger", token);
        let _: () = redis::pipe()
            .atomic()
            .zadd(k("tok", token), member, now)
            .pexpire(k("tok", token), WINDOW_MS)
            .hincr(k("key", token), "spent", total)
            .hincr(&led, format!("{model}\u{1f}requests"), 1)
            .hincr(&led, format!("{model}\u{1f}prompt"), prompt)
            .hincr(&led, format!("{model}\u{1f}completion"), completion)
            .query_async(&mut c)
            .await?;
        Ok(())
    }

    pub async fn ledger(&self, token: &str) -> Result<Vec<LedgerRow>, StoreError> {
        let mut c = self.conn.clone();
        let h: std::collections::BTreeMap<String, u64> = c.hgetall(k("ledger", token)).await?;
        let mut rows: std::collections::BTreeMap<String, LedgerRow> = Default::default();
        for (f, v) in h {
            let Some((model, field)) = f.split_once('\u{1f}') else {
                continue;
            };
            let r = rows.entry(model.to_string()).or_insert_with(|| LedgerRow {
                model: model.to_string(),
                requests: 0,
                prompt_tokens: 0,
                completion_tokens: 0,
            });
            match field {
                "requests" => r.requests = v,
                "prompt" => r.prompt_tokens = v,
                "completion" => r.completion_tokens = v,
                _ => {}
            }
        }
        Ok(rows.into_values().collect())
    }
}
