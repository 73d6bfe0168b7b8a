//! The gateway's configuration: a LiteLLM proxy config, read unchanged, plus a
//! `pagellm_settings` section (and `pagellm_params` per deployment) for what LiteLLM
//! has no words for.
//!
//! Every key is either understood, or known to LiteLLM and reported as having no effect
//! here, or an error naming the key and its line. Nothing is silently dropped.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use crate::yaml_lines::LineIndex;

/// A configuration error, already phrased for the user (key and line included).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

/// The routing policies; LiteLLM's strategy names map onto the nearest one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    RoundRobin,
    LeastOutstanding,
    PowerOfTwo,
    PrefixAware,
}

impl Policy {
    pub fn as_str(self) -> &'static str {
        match self {
            Policy::RoundRobin => "round-robin",
            Policy::LeastOutstanding => "least-outstanding",
            Policy::PowerOfTwo => "power-of-two",
            Policy::PrefixAware => "prefix-aware",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "round-robin" | "round_robin" => Policy::RoundRobin,
            "least-outstanding" | "least_outstanding" => Policy::LeastOutstanding,
            "power-of-two" | "power_of_two" => Policy::PowerOfTwo,
            "prefix-aware" | "prefix_aware" | "cache_aware" | "cache-aware" => Policy::PrefixAware,
            _ => return None,
        })
    }

    /// LiteLLM's `router_settings.routing_strategy` names.
    fn from_litellm(s: &str) -> Option<Self> {
        Some(match s {
            // Weighted random: the nearest stateless spread is round robin.
            "simple-shuffle" | "cost-based-routing" => Policy::RoundRobin,
            // Fewest requests in flight; TPM-based routing is a slower proxy for the same.
            "least-busy" | "usage-based-routing" | "usage-based-routing-v2" => {
                Policy::LeastOutstanding
            }
            // Lowest recent latency: a load score from the engines' own metrics.
            "latency-based-routing" => Policy::PowerOfTwo,
            _ => return None,
        })
    }
}

/// One upstream server of a model group.
#[derive(Debug, Clone)]
pub struct Deployment {
    /// Stable id: `model_info.id`, else `GROUP-INDEX`.
    pub id: String,
    pub group: String,
    /// The model name sent upstream (`openai/NAME` → `NAME`).
    pub upstream_model: String,
    /// The OpenAI base URL, ending in `/v1`.
    pub api_base: String,
    pub api_key: Option<String>,
    pub rpm: Option<u64>,
    pub tpm: Option<u64>,
    pub max_concurrency: Option<usize>,
}

impl Deployment {
    /// The server's root (`api_base` without `/v1`), where `/health` and `/metrics` live.
    pub fn root(&self) -> &str {
        self.api_base.strip_suffix("/v1").unwrap_or(&self.api_base)
    }
}

#[derive(Debug, Clone)]
pub struct HealthSettings {
    pub interval: Duration,
    pub timeout: Duration,
    /// Consecutive failed checks before a replica is taken out.
    pub failure_threshold: u32,
}

#[derive(Debug, Clone)]
pub struct LoadGuard {
    /// Route by load instead of prefix when `max - min > abs` and `max > rel * min`.
    /// SGLang's cache-aware defaults (64 and 1.5): a prefix miss costs a whole prefill,
    /// which outweighs a few requests of queue (measured in BENCHMARKS.md).
    pub abs: f64,
    pub rel: f64,
}

#[derive(Debug, Clone)]
pub enum StoreConfig {
    Sqlite(String),
    Redis(String),
    Memory,
}

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub deployments: Vec<Deployment>,
    /// Group names in config order.
    pub groups: Vec<String>,
    pub policy: Policy,
    pub num_retries: u32,
    pub request_timeout: Duration,
    pub fallbacks: HashMap<String, Vec<String>>,
    pub context_window_fallbacks: HashMap<String, Vec<String>>,
    /// Failed requests in a row before a replica is ejected.
    pub allowed_fails: u32,
    /// How long an ejected replica stays out (doubled on each ejection in a row).
    pub cooldown: Duration,
    pub master_key: Option<String>,
    pub health: HealthSettings,
    pub metrics_interval: Duration,
    pub load_guard: LoadGuard,
    /// Prefix-aware routing follows a prefix only when the replica holds at least this
    /// share of the prompt's blocks (SGLang's `cache_threshold`, default 0.5); below it
    /// (a shared system prompt, say) the request goes by load.
    pub cache_threshold: f64,
    /// Model group → tokenizer (registry name, GGUF or HF directory) for exact prefix
    /// hashes.
    pub tokenizers: HashMap<String, String>,
    pub kv_events: bool,
    pub store: StoreConfig,
    /// Keys LiteLLM knows that have no effect here, with their lines, for the start-up log.
    pub ignored: Vec<String>,
}

// ---- the file as written -------------------------------------------------------------
//
// Fields typed `Value` are keys LiteLLM knows that have no effect here: they are
// accepted (so a LiteLLM config reads unchanged) and reported by `NO_EFFECT`.

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct RawFile {
    model_list: Option<Vec<RawModel>>,
    router_settings: Option<RawRouter>,
    litellm_settings: Option<RawLitellm>,
    general_settings: Option<RawGeneral>,
    pagellm_settings: Option<RawPagellm>,
    // Known LiteLLM sections without meaning here.
    environment_variables: Option<serde_yaml_ng::Value>,
    credential_list: Option<serde_yaml_ng::Value>,
    guardrails: Option<serde_yaml_ng::Value>,
    mcp_servers: Option<serde_yaml_ng::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct RawModel {
    model_name: String,
    litellm_params: RawParams,
    model_info: Option<RawModelInfo>,
    pagellm_params: Option<RawPagellmParams>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct RawModelInfo {
    id: Option<String>,
    // Informational in LiteLLM; no effect on routing here.
    mode: Option<serde_yaml_ng::Value>,
    base_model: Option<serde_yaml_ng::Value>,
    max_tokens: Option<serde_yaml_ng::Value>,
    max_input_tokens: Option<serde_yaml_ng::Value>,
    max_output_tokens: Option<serde_yaml_ng::Value>,
    input_cost_per_token: Option<serde_yaml_ng::Value>,
    output_cost_per_token: Option<serde_yaml_ng::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct RawParams {
    model: String,
    api_base: Option<String>,
    api_key: Option<String>,
    rpm: Option<u64>,
    tpm: Option<u64>,
    /// LiteLLM's per-deployment concurrency cap.
    max_parallel_requests: Option<usize>,
    timeout: Option<f64>,
    stream_timeout: Option<serde_yaml_ng::Value>,
    max_retries: Option<serde_yaml_ng::Value>,
    weight: Option<serde_yaml_ng::Value>,
    order: Option<serde_yaml_ng::Value>,
    rust: Option<serde_yaml_ng::Value>,
    api_version: Option<serde_yaml_ng::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct RawPagellmParams {
    max_concurrency: Option<usize>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct RawRouter {
    routing_strategy: Option<String>,
    num_retries: Option<u32>,
    timeout: Option<f64>,
    allowed_fails: Option<u32>,
    cooldown_time: Option<f64>,
    fallbacks: Option<Vec<BTreeMap<String, Vec<String>>>>,
    context_window_fallbacks: Option<Vec<BTreeMap<String, Vec<String>>>>,
    redis_host: Option<String>,
    redis_port: Option<u16>,
    redis_password: Option<String>,
    enable_pre_call_checks: Option<serde_yaml_ng::Value>,
    retry_policy: Option<serde_yaml_ng::Value>,
    allowed_fails_policy: Option<serde_yaml_ng::Value>,
    model_group_alias: Option<serde_yaml_ng::Value>,
    routing_strategy_args: Option<serde_yaml_ng::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct RawLitellm {
    num_retries: Option<u32>,
    request_timeout: Option<f64>,
    fallbacks: Option<Vec<BTreeMap<String, Vec<String>>>>,
    context_window_fallbacks: Option<Vec<BTreeMap<String, Vec<String>>>>,
    allowed_fails: Option<u32>,
    cooldown_time: Option<f64>,
    // Known to LiteLLM, no effect here.
    callbacks: Option<serde_yaml_ng::Value>,
    success_callback: Option<serde_yaml_ng::Value>,
    failure_callback: Option<serde_yaml_ng::Value>,
    drop_params: Option<serde_yaml_ng::Value>,
    set_verbose: Option<serde_yaml_ng::Value>,
    json_logs: Option<serde_yaml_ng::Value>,
    telemetry: Option<serde_yaml_ng::Value>,
    cache: Option<serde_yaml_ng::Value>,
    cache_params: Option<serde_yaml_ng::Value>,
    content_policy_fallbacks: Option<serde_yaml_ng::Value>,
    default_fallbacks: Option<serde_yaml_ng::Value>,
    turn_off_message_logging: Option<serde_yaml_ng::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct RawGeneral {
    master_key: Option<String>,
    database_url: Option<serde_yaml_ng::Value>,
    alerting: Option<serde_yaml_ng::Value>,
    store_model_in_db: Option<serde_yaml_ng::Value>,
    disable_spend_logs: Option<serde_yaml_ng::Value>,
    proxy_batch_write_at: Option<serde_yaml_ng::Value>,
    background_health_checks: Option<serde_yaml_ng::Value>,
    health_check_interval: Option<serde_yaml_ng::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct RawPagellm {
    routing_policy: Option<String>,
    cache_threshold: Option<f64>,
    load_guard: Option<RawLoadGuard>,
    health_check: Option<RawHealth>,
    metrics_interval: Option<f64>,
    /// Model group → tokenizer, for exact prefix hashes.
    tokenizers: Option<BTreeMap<String, String>>,
    kv_events: Option<bool>,
    key_store: Option<RawStore>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct RawLoadGuard {
    abs_threshold: Option<f64>,
    rel_threshold: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct RawHealth {
    interval: Option<f64>,
    timeout: Option<f64>,
    failure_threshold: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, tag = "type", rename_all = "lowercase")]
enum RawStore {
    Sqlite { path: Option<String> },
    Redis { url: String },
    Memory,
}

/// Keys whose presence is reported at start as having no effect in pagellm.
const NO_EFFECT: &[&str] = &[
    "environment_variables",
    "credential_list",
    "guardrails",
    "mcp_servers",
    "model_info.mode",
    "model_info.base_model",
    "model_info.max_tokens",
    "model_info.max_input_tokens",
    "model_info.max_output_tokens",
    "model_info.input_cost_per_token",
    "model_info.output_cost_per_token",
    "litellm_params.stream_timeout",
    "litellm_params.max_retries",
    "litellm_params.weight",
    "litellm_params.order",
    "litellm_params.rust",
    "litellm_params.api_version",
    "router_settings.enable_pre_call_checks",
    "router_settings.retry_policy",
    "router_settings.allowed_fails_policy",
    "router_settings.model_group_alias",
    "router_settings.routing_strategy_args",
    "litellm_settings.callbacks",
    "litellm_settings.success_callback",
    "litellm_settings.failure_callback",
    "litellm_settings.drop_params",
    "litellm_settings.set_verbose",
    "litellm_settings.json_logs",
    "litellm_settings.telemetry",
    "litellm_settings.cache",
    "litellm_settings.cache_params",
    "litellm_settings.content_policy_fallbacks",
    "litellm_settings.default_fallbacks",
    "litellm_settings.turn_off_message_logging",
    "general_settings.database_url",
    "general_settings.alerting",
    "general_settings.store_model_in_db",
    "general_settings.disable_spend_logs",
    "general_settings.proxy_batch_write_at",
    "general_settings.background_health_checks",
    "general_settings.health_check_interval",
];

fn secs(v: f64, key: &str, lines: &LineIndex) -> Result<Duration, ConfigError> {
    if !(v.is_finite() && v > 0.0 && v < 1e7) {
        return Err(lines.err(
            key,
            format!("must be a positive number of seconds, got {v}"),
        ));
    }
    Ok(Duration::from_secs_f64(v))
}

impl Config {
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError(format!("{}: {e}", path.display())))?;
        Config::parse(&text).map_err(|e| ConfigError(format!("{}: {}", path.display(), e.0)))
    }

    pub fn parse(text: &str) -> Result<Config, ConfigError> {
        let lines = LineIndex::new(text)?;
        let raw: RawFile = serde_yaml_ng::from_str(text).map_err(|e| {
            let at = e
                .location()
                .map(|l| format!(" (line {}, column {})", l.line(), l.column()))
                .unwrap_or_default();
            // serde_yaml's messages name the path: "model_list[0].litellm_params: unknown field `x`".
            let msg = e.to_string();
            let msg = msg.split(" at line ").next().unwrap_or(&msg).to_string();
            ConfigError(format!("{msg}{at}"))
        })?;
        Config::validate(raw, &lines)
    }

    fn validate(raw: RawFile, lines: &LineIndex) -> Result<Config, ConfigError> {
        let mut ignored = Vec::new();
        for key in lines.paths() {
            let generic = generic_path(&key);
            if NO_EFFECT
                .iter()
                .any(|k| generic == *k || generic.ends_with(&format!(".{k}")))
            {
                ignored.push(format!("{key} (line {})", lines.line(&key).unwrap_or(0)));
            }
        }
        let models = raw
            .model_list
            .ok_or_else(|| ConfigError("`model_list` is required (line 1)".into()))?;
        if models.is_empty() {
            return Err(lines.err("model_list", "must list at least one deployment"));
        }
        let mut deployments = Vec::new();
        let mut groups: Vec<String> = Vec::new();
        let mut ids = HashSet::new();
        for (i, m) in models.into_iter().enumerate() {
            let at = |k: &str| format!("model_list[{i}].{k}");
            if m.model_name.trim().is_empty() {
                return Err(lines.err(&at("model_name"), "must not be empty"));
            }
            let p = &m.litellm_params;
            let upstream_model = match p.model.split_once('/') {
                Some(("openai" | "hosted_vllm" | "pagellm", name)) if !name.is_empty() => {
                    name.to_string()
                }
                _ => {
                    return Err(lines.err(
                        &at("litellm_params.model"),
                        format!(
                            "`{}`: expected `openai/NAME` or `hosted_vllm/NAME` (an \
                             OpenAI-compatible server)",
                            p.model
                        ),
                    ))
                }
            };
            let Some(base) = &p.api_base else {
                return Err(lines.err(
                    &at("litellm_params"),
                    "`api_base` is required (e.g. http://127.0.0.1:8000/v1)",
                ));
            };
            let base = base.trim_end_matches('/');
            if reqwest::Url::parse(base).map_or(true, |u| !matches!(u.scheme(), "http" | "https")) {
                return Err(lines.err(
                    &at("litellm_params.api_base"),
                    format!("`{base}` is not an http(s) URL"),
                ));
            }
            let api_base = if base.ends_with("/v1") {
                base.to_string()
            } else {
                format!("{base}/v1")
            };
            let id = m
                .model_info
                .as_ref()
                .and_then(|i| i.id.clone())
                .unwrap_or_else(|| format!("{}-{i}", m.model_name));
            if !ids.insert(id.clone()) {
                return Err(lines.err(&at("model_info.id"), format!("duplicate id `{id}`")));
            }
            if p.timeout.is_some() {
                ignored.push(format!(
                    "{} (line {}): per-deployment timeouts use litellm_settings.request_timeout",
                    at("litellm_params.timeout"),
                    lines.line(&at("litellm_params.timeout")).unwrap_or(0)
                ));
            }
            let max_concurrency = m
                .pagellm_params
                .as_ref()
                .and_then(|pp| pp.max_concurrency)
                .or(p.max_parallel_requests);
            if max_concurrency == Some(0) {
                return Err(lines.err(&at("pagellm_params.max_concurrency"), "must be at least 1"));
            }
            if !groups.contains(&m.model_name) {
                groups.push(m.model_name.clone());
            }
            deployments.push(Deployment {
                id,
                group: m.model_name.clone(),
                upstream_model,
                api_base,
                api_key: p.api_key.clone().filter(|k| !k.is_empty() && k != "none"),
                rpm: p.rpm,
                tpm: p.tpm,
                max_concurrency,
            });
        }

        let router = raw.router_settings;
        let lite = raw.litellm_settings;
        let pg = raw.pagellm_settings;
        let mut policy = Policy::PrefixAware;
        if let Some(s) = router.as_ref().and_then(|r| r.routing_strategy.as_deref()) {
            policy = Policy::from_litellm(s)
                .or_else(|| Policy::parse(s))
                .ok_or_else(|| {
                    lines.err(
                        "router_settings.routing_strategy",
                        format!(
                            "unknown strategy `{s}` (LiteLLM's simple-shuffle, least-busy, \
                         usage-based-routing, latency-based-routing, cost-based-routing, or \
                         one of pagellm's policies)"
                        ),
                    )
                })?;
        }
        if let Some(s) = pg.as_ref().and_then(|p| p.routing_policy.as_deref()) {
            policy = Policy::parse(s).ok_or_else(|| {
                lines.err(
                    "pagellm_settings.routing_policy",
                    format!(
                        "unknown policy `{s}` (round-robin, least-outstanding, power-of-two, \
                         prefix-aware)"
                    ),
                )
            })?;
        }
        let pick = |a: Option<u32>, b: Option<u32>| a.or(b);
        let num_retries = pick(
            lite.as_ref().and_then(|l| l.num_retries),
            router.as_ref().and_then(|r| r.num_retries),
        )
        .unwrap_or(2);
        let timeout = lite
            .as_ref()
            .and_then(|l| l.request_timeout)
            .or(router.as_ref().and_then(|r| r.timeout));
        let request_timeout = match timeout {
            Some(t) => secs(t, "litellm_settings.request_timeout", lines)?,
            None => Duration::from_secs(600),
        };
        let allowed_fails = pick(
            lite.as_ref().and_then(|l| l.allowed_fails),
            router.as_ref().and_then(|r| r.allowed_fails),
        )
        .unwrap_or(3)
        .max(1);
        let cooldown = match lite
            .as_ref()
            .and_then(|l| l.cooldown_time)
            .or(router.as_ref().and_then(|r| r.cooldown_time))
        {
            Some(t) => secs(t, "litellm_settings.cooldown_time", lines)?,
            None => Duration::from_secs(5),
        };
        let fallback_map = |key: &str,
                            a: Option<&Vec<BTreeMap<String, Vec<String>>>>,
                            b: Option<&Vec<BTreeMap<String, Vec<String>>>>|
         -> Result<HashMap<String, Vec<String>>, ConfigError> {
            let mut out: HashMap<String, Vec<String>> = HashMap::new();
            for (section, list) in [("litellm_settings", a), ("router_settings", b)] {
                for entry in list.into_iter().flatten() {
                    for (from, to) in entry {
                        for g in std::iter::once(from).chain(to) {
                            if !groups.contains(g) {
                                return Err(lines.err(
                                    &format!("{section}.{key}"),
                                    format!(
                                        "`{g}` is not a model_name of model_list (known: {})",
                                        groups.join(", ")
                                    ),
                                ));
                            }
                        }
                        out.entry(from.clone())
                            .or_default()
                            .extend(to.iter().cloned());
                    }
                }
            }
            Ok(out)
        };
        let fallbacks = fallback_map(
            "fallbacks",
            lite.as_ref().and_then(|l| l.fallbacks.as_ref()),
            router.as_ref().and_then(|r| r.fallbacks.as_ref()),
        )?;
        let context_window_fallbacks = fallback_map(
            "context_window_fallbacks",
            lite.as_ref()
                .and_then(|l| l.context_window_fallbacks.as_ref()),
            router
                .as_ref()
                .and_then(|r| r.context_window_fallbacks.as_ref()),
        )?;
        let master_key = raw.general_settings.and_then(|g| g.master_key);
        if let Some(k) = &master_key {
            if k.len() < 4 {
                return Err(lines.err(
                    "general_settings.master_key",
                    "is too short (at least 4 characters; LiteLLM's start with `sk-`)",
                ));
            }
        }

        let h = pg.as_ref().and_then(|p| p.health_check.as_ref());
        let health = HealthSettings {
            interval: match h.and_then(|h| h.interval) {
                Some(v) => secs(v, "pagellm_settings.health_check.interval", lines)?,
                None => Duration::from_secs(2),
            },
            timeout: match h.and_then(|h| h.timeout) {
                Some(v) => secs(v, "pagellm_settings.health_check.timeout", lines)?,
                None => Duration::from_secs(2),
            },
            failure_threshold: h.and_then(|h| h.failure_threshold).unwrap_or(2).max(1),
        };
        let metrics_interval = match pg.as_ref().and_then(|p| p.metrics_interval) {
            Some(v) => secs(v, "pagellm_settings.metrics_interval", lines)?,
            None => Duration::from_millis(500),
        };
        let g = pg.as_ref().and_then(|p| p.load_guard.as_ref());
        let load_guard = LoadGuard {
            abs: g.and_then(|g| g.abs_threshold).unwrap_or(64.0),
            rel: g.and_then(|g| g.rel_threshold).unwrap_or(1.5),
        };
        let cache_threshold = pg.as_ref().and_then(|p| p.cache_threshold).unwrap_or(0.5);
        if !(0.0..=1.0).contains(&cache_threshold) {
            return Err(lines.err(
                "pagellm_settings.cache_threshold",
                "must be between 0 and 1",
            ));
        }
        if !(load_guard.rel >= 1.0 && load_guard.abs >= 0.0) {
            return Err(lines.err(
                "pagellm_settings.load_guard",
                "abs_threshold must be ≥ 0 and rel_threshold ≥ 1",
            ));
        }
        let mut tokenizers = HashMap::new();
        for (group, tok) in pg
            .as_ref()
            .and_then(|p| p.tokenizers.clone())
            .unwrap_or_default()
        {
            if !groups.contains(&group) {
                return Err(lines.err(
                    &format!("pagellm_settings.tokenizers.{group}"),
                    format!("`{group}` is not a model_name of model_list"),
                ));
            }
            tokenizers.insert(group, tok);
        }
        let mut store = StoreConfig::Memory;
        if master_key.is_some() {
            store = StoreConfig::Sqlite("pagellm-gateway.db".into());
        }
        if let Some(s) = pg.as_ref().and_then(|p| p.key_store.as_ref()) {
            store = match s {
                RawStore::Sqlite { path } => {
                    StoreConfig::Sqlite(path.clone().unwrap_or_else(|| "pagellm-gateway.db".into()))
                }
                RawStore::Redis { url } => StoreConfig::Redis(url.clone()),
                RawStore::Memory => StoreConfig::Memory,
            };
        } else if let Some(r) = router.as_ref().and_then(|r| r.redis_host.as_ref()) {
            // LiteLLM shares its limits through Redis when router_settings name one.
            let port = router.as_ref().and_then(|r| r.redis_port).unwrap_or(6379);
            let auth = router
                .as_ref()
                .and_then(|r| r.redis_password.as_ref())
                .map(|p| format!(":{p}@"))
                .unwrap_or_default();
            store = StoreConfig::Redis(format!("redis://{auth}{r}:{port}"));
        }
        Ok(Config {
            deployments,
            groups,
            policy,
            num_retries,
            request_timeout,
            fallbacks,
            context_window_fallbacks,
            allowed_fails,
            cooldown,
            master_key,
            health,
            metrics_interval,
            load_guard,
            cache_threshold,
            tokenizers,
            kv_events: pg.as_ref().and_then(|p| p.kv_events).unwrap_or(true),
            store,
            ignored,
        })
    }
}

/// `model_list[3].litellm_params.rpm` → `litellm_params.rpm` under `model_list`.
fn generic_path(key: &str) -> String {
    let mut out = String::new();
    let mut depth = 0;
    for c in key.chars() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            _ if depth == 0 => out.push(c),
            _ => {}
        }
    }
    out.strip_prefix("model_list.")
        .map(str::to_string)
        .unwrap_or(out)
}

#[cfg(test)]
mod tests;
