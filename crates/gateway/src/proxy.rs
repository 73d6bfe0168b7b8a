//! One request's path through the gateway: authenticate, admit against the key's
//! limits, route, send upstream with retries and fallbacks, relay the answer.
//!
//! Retries happen only before the client has received a byte: a connection error,
//! a 5xx, a 429 or an unreadable body moves the request to another replica of its
//! group, then to the fallback groups. Once a stream has started, a replica that
//! dies is replaced by continuing the stream elsewhere (`stream.rs`).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use crate::dashboard::LoggedDecision;
use crate::error::GatewayError;
use crate::keys::Admission;
use crate::prefix::prefix_key;
use crate::replica::{Failure, InFlight, Replica};
use crate::routing::{Decision, PrefixKey};
use crate::{Gateway, Runtime};

pub const REPLICA_HEADER: &str = "x-pagellm-replica";
/// Largest non-streamed upstream body read.
const MAX_UPSTREAM_BODY: usize = 64 << 20;

pub async fn completions(
    State(gw): State<Arc<Gateway>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    handle(gw, headers, body, false)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

pub async fn chat_completions(
    State(gw): State<Arc<Gateway>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    handle(gw, headers, body, true)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

/// Who is asking.
#[derive(Debug, Clone)]
pub enum Principal {
    /// No master key configured: the gateway is open.
    Open,
    Master,
    /// A virtual key (in clear; hashed by the store).
    Virtual(String),
}

pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    let v = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    v.strip_prefix("Bearer ")
        .or_else(|| v.strip_prefix("bearer "))
        .map(str::trim)
}

pub fn authenticate(rt: &Runtime, headers: &HeaderMap) -> Result<Principal, GatewayError> {
    let Some(master) = &rt.config.master_key else {
        return Ok(Principal::Open);
    };
    match bearer(headers) {
        None => Err(GatewayError::unauthorized(
            "missing API key (send Authorization: Bearer KEY)",
        )),
        Some(k) if k == master => Ok(Principal::Master),
        Some(k) => Ok(Principal::Virtual(k.to_string())),
    }
}

/// Everything an attempt needs.
pub struct Ctx {
    pub gw: Arc<Gateway>,
    pub rt: Arc<Runtime>,
    pub chat: bool,
    pub group: String,
    pub body: Value,
    pub principal: Principal,
    pub started: Instant,
    pub pkey: PrefixKey,
    /// The routing log's entry for the latest attempt (0: none yet).
    pub logged: AtomicU64,
}

impl Ctx {
    pub fn path(&self) -> &'static str {
        if self.chat {
            "/chat/completions"
        } else {
            "/completions"
        }
    }

    /// The body sent to `r`: the client's, with `r`'s model name and `extra` fields.
    pub fn upstream_body(&self, r: &Replica, extra: &[(&str, Value)]) -> Vec<u8> {
        let mut b = self.body.clone();
        if let Some(o) = b.as_object_mut() {
            o.insert("model".into(), Value::String(r.dep.upstream_model.clone()));
            for (k, v) in extra {
                o.insert((*k).to_string(), v.clone());
            }
        }
        serde_json::to_vec(&b).unwrap_or_default()
    }

    pub fn send(&self, r: &Replica, body: Vec<u8>) -> reqwest::RequestBuilder {
        let mut req = self
            .gw
            .http
            .post(format!("{}{}", r.dep.api_base, self.path()))
            .header(header::CONTENT_TYPE, "application/json")
            .body(body);
        if let Some(k) = &r.dep.api_key {
            req = req.bearer_auth(k);
        }
        req
    }

    pub fn fail(&self, r: &Replica, kind: Failure) {
        let what = match kind {
            Failure::Connection => "failed: connection",
            Failure::Response => "failed: response",
        };
        self.gw.routing_log.finish(self.logged.load(Relaxed), what);
        let cfg = &self.rt.config;
        if r.record_failure(kind, cfg.allowed_fails, cfg.cooldown) {
            self.gw
                .metrics
                .inc("pagellm_gateway_ejections_total", &[("replica", &r.dep.id)]);
            tracing::warn!("replica {} ejected ({kind:?})", r.dep.id);
        }
    }

    /// Picks a replica of `group` not in `tried`.
    pub fn pick(&self, group: &str, tried: &[String]) -> Option<Decision> {
        self.pick_logged(group, tried, false)
    }

    /// Picks a replica of `group` not in `tried` to continue a broken stream.
    pub fn pick_resume(&self, group: &str, tried: &[String]) -> Option<Decision> {
        self.pick_logged(group, tried, true)
    }

    fn pick_logged(&self, group: &str, tried: &[String], resume: bool) -> Option<Decision> {
        let now = Instant::now();
        let mut cands: Vec<Arc<Replica>> = self
            .rt
            .groups
            .get(group)?
            .iter()
            .filter(|r| !tried.contains(&r.dep.id) && r.available(now))
            .cloned()
            .collect();
        let d = loop {
            let d = self.rt.router.pick(&cands, &self.pkey)?;
            if d.replica.reserve(now) {
                break d;
            }
            // Reached its rpm/tpm since the filter above.
            cands.retain(|r| !Arc::ptr_eq(r, &d.replica));
        };
        self.gw.metrics.inc(
            "pagellm_gateway_routing_decisions_total",
            &[
                ("policy", self.rt.router.policy.as_str()),
                ("reason", d.reason.as_str()),
            ],
        );
        d.replica.routed.fetch_add(1, Relaxed);
        let seq = self.gw.routing_log.push(LoggedDecision {
            seq: 0,
            t: 0,
            model: group.to_string(),
            replica: d.replica.dep.id.clone(),
            reason: d.reason.as_str(),
            matched: d.matched_blocks,
            blocks: self.pkey.hashes().0.len(),
            resume,
            outcome: None,
        });
        self.logged.store(seq, Relaxed);
        Some(d)
    }

    /// Seconds until some replica of the chain may take traffic again.
    fn retry_after(&self, groups: &[String]) -> u64 {
        let now = Instant::now();
        groups
            .iter()
            .filter_map(|g| self.rt.groups.get(g))
            .flatten()
            .filter_map(|r| r.health.lock().unwrap().ejected_until)
            .map(|t| t.saturating_duration_since(now).as_secs_f64().ceil() as u64)
            .min()
            .unwrap_or(self.rt.config.health.interval.as_secs().max(1))
            .max(1)
    }

    /// When every replica of the chain that is up is held back by its deployment's
    /// `rpm`/`tpm`: a 429 saying when one frees up (LiteLLM answers this case with a
    /// 429 too).
    fn deployments_limited(&self, groups: &[String]) -> Option<GatewayError> {
        let now = Instant::now();
        let up: Vec<&Arc<Replica>> = groups
            .iter()
            .filter_map(|g| self.rt.groups.get(g))
            .flatten()
            .filter(|r| r.is_up())
            .collect();
        let waits: Vec<Duration> = up.iter().filter_map(|r| r.limit_wait(now)).collect();
        if up.is_empty() || waits.len() < up.len() {
            return None;
        }
        let secs = waits.iter().min()?.as_secs_f64().ceil().max(1.0) as u64;
        self.gw.metrics.inc(
            "pagellm_gateway_rate_limited_total",
            &[("limit", "deployment")],
        );
        self.done("none", StatusCode::TOO_MANY_REQUESTS);
        Some(
            GatewayError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                format!(
                    "every deployment of `{}` is at its rpm/tpm limit; retry after {secs} s",
                    groups.join("`, `")
                ),
            )
            .code("rate_limit_exceeded")
            .header(header::RETRY_AFTER, secs.to_string()),
        )
    }

    pub fn done(&self, replica: &str, status: StatusCode) {
        if replica != "none" {
            self.gw
                .routing_log
                .finish(self.logged.load(Relaxed), status.as_str());
        }
        self.gw.metrics.inc(
            "pagellm_gateway_requests_total",
            &[
                ("model", &self.group),
                ("replica", replica),
                ("status", status.as_str()),
            ],
        );
    }

    /// Charges real token counts to the deployment's `tpm` and to a virtual key.
    pub async fn charge(&self, r: &Replica, usage: Option<(u64, u64)>) {
        if let Some((p, c)) = usage {
            r.record_tokens(p + c);
        }
        let (Principal::Virtual(key), Some(store), Some((p, c))) =
            (&self.principal, &self.gw.store, usage)
        else {
            return;
        };
        if let Err(e) = store.record_usage(key, &self.group, p, c).await {
            tracing::error!("cannot record usage: {e}");
        }
    }
}

pub fn usage_of(v: &Value) -> Option<(u64, u64)> {
    let u = v.get("usage")?;
    Some((
        u.get("prompt_tokens")?.as_u64()?,
        u.get("completion_tokens")
            .and_then(Value::as_u64)
            .unwrap_or(0),
    ))
}

async fn handle(
    gw: Arc<Gateway>,
    headers: HeaderMap,
    body: Bytes,
    chat: bool,
) -> Result<Response, GatewayError> {
    let started = Instant::now();
    let rt = gw.runtime();
    let principal = authenticate(&rt, &headers)?;
    let body: Value = serde_json::from_slice(&body).map_err(|e| {
        GatewayError::bad_request(format!("the request body is not valid JSON: {e}"), None)
    })?;
    if !body.is_object() {
        return Err(GatewayError::bad_request(
            "the request body must be a JSON object",
            None,
        ));
    }
    let Some(model) = body.get("model").and_then(Value::as_str) else {
        return Err(GatewayError::bad_request(
            "`model` is required (a string)",
            Some("model"),
        ));
    };
    if !rt.groups.contains_key(model) {
        return Err(GatewayError::not_found(format!(
            "the model `{model}` does not exist; known models: {}",
            rt.config.groups.join(", ")
        ))
        .code("model_not_found"));
    }
    let group = model.to_string();
    let mut limit_headers = Vec::new();
    if let Principal::Virtual(key) = &principal {
        limit_headers = admit(&gw, key, &group).await?;
    }
    let stream = match body.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            return Err(GatewayError::bad_request(
                "`stream` must be a boolean",
                Some("stream"),
            ))
        }
    };
    let pkey = prefix_key(&rt, &gw.tokenizers, &group, chat, &body);
    let ctx = Ctx {
        gw: gw.clone(),
        rt,
        chat,
        group,
        body,
        principal,
        started,
        pkey,
        logged: AtomicU64::new(0),
    };
    let mut resp = if stream {
        crate::stream::start(ctx).await?
    } else {
        unary(ctx).await?
    };
    for (k, v) in limit_headers {
        if let Ok(v) = HeaderValue::from_str(&v) {
            resp.headers_mut().insert(k, v);
        }
    }
    Ok(resp)
}

/// Checks a virtual key; returns the rate-limit headers to send.
async fn admit(
    gw: &Gateway,
    key: &str,
    group: &str,
) -> Result<Vec<(HeaderName, String)>, GatewayError> {
    let Some(store) = &gw.store else {
        return Err(GatewayError::unauthorized("invalid API key"));
    };
    let a = store
        .admit(key, group)
        .await
        .map_err(|e| GatewayError::unavailable(format!("{e}"), 1))?;
    let h = |n: &'static str| HeaderName::from_static(n);
    match a {
        Admission::Admitted {
            remaining_requests,
            remaining_tokens,
        } => {
            let mut out = Vec::new();
            if let Some(r) = remaining_requests {
                out.push((h("x-ratelimit-remaining-requests"), r.to_string()));
            }
            if let Some(t) = remaining_tokens {
                out.push((h("x-ratelimit-remaining-tokens"), t.to_string()));
            }
            Ok(out)
        }
        Admission::UnknownKey => Err(GatewayError::unauthorized("invalid API key")),
        Admission::ModelNotAllowed(models) => Err(GatewayError::new(
            StatusCode::FORBIDDEN,
            "permission_error",
            format!(
                "this key may not use `{group}`; it may use: {}",
                models.join(", ")
            ),
        )),
        Admission::BudgetExhausted { budget, spent } => {
            gw.metrics
                .inc("pagellm_gateway_rate_limited_total", &[("limit", "budget")]);
            Err(GatewayError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "insufficient_quota",
                format!("this key's token budget is used up ({spent} of {budget} tokens)"),
            )
            .code("insufficient_quota"))
        }
        Admission::RateLimited {
            limit,
            retry_after_s,
            limit_requests,
            limit_tokens,
        } => {
            gw.metrics
                .inc("pagellm_gateway_rate_limited_total", &[("limit", limit)]);
            let mut e = GatewayError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                format!("rate limit reached for {limit} per minute; retry after {retry_after_s} s"),
            )
            .code("rate_limit_exceeded")
            .header(header::RETRY_AFTER, retry_after_s.to_string());
            if let Some(r) = limit_requests {
                e = e.header(h("x-ratelimit-limit-requests"), r.to_string());
            }
            if let Some(t) = limit_tokens {
                e = e.header(h("x-ratelimit-limit-tokens"), t.to_string());
            }
            let exhausted = if limit == "requests" {
                "x-ratelimit-remaining-requests"
            } else {
                "x-ratelimit-remaining-tokens"
            };
            e = e.header(h(exhausted), "0".into());
            Err(e)
        }
    }
}

/// The groups a request may be served by, in order: its own, then its fallbacks.
pub fn chain(ctx: &Ctx) -> Vec<String> {
    let mut c = vec![ctx.group.clone()];
    for g in ctx
        .rt
        .config
        .fallbacks
        .get(&ctx.group)
        .into_iter()
        .flatten()
    {
        if !c.contains(g) {
            c.push(g.clone());
        }
    }
    c
}

/// What one attempt at a replica gave.
pub enum Attempt<T> {
    /// Done: relay this to the client.
    Ok(T),
    /// A response the client should see as it is (a 4xx other than 429).
    PassThrough(Response),
    /// Try elsewhere; `Some` is the upstream's error response, kept in case no other
    /// replica does better.
    Retry(Failure, Option<Response>),
}

/// Runs `attempt` on replicas of the chain until one succeeds. Returns the result and
/// the replica that produced it.
pub async fn with_retries<T, F, Fut>(
    ctx: &Ctx,
    mut attempt: F,
) -> Result<(T, Arc<Replica>), GatewayError>
where
    F: FnMut(Arc<Replica>) -> Fut,
    Fut: std::future::Future<Output = Attempt<T>>,
{
    let mut groups = chain(ctx);
    let mut tried: Vec<String> = Vec::new();
    let mut last_error: Option<Response> = None;
    let mut attempts = 0u32;
    let mut gi = 0;
    let mut context_switched = false;
    while gi < groups.len() {
        let group = groups[gi].clone();
        let mut in_group = 0;
        while in_group <= ctx.rt.config.num_retries {
            let Some(d) = ctx.pick(&group, &tried) else {
                break;
            };
            let r = d.replica.clone();
            tried.push(r.dep.id.clone());
            if attempts > 0 {
                ctx.gw
                    .metrics
                    .inc("pagellm_gateway_retries_total", &[("model", &ctx.group)]);
            }
            attempts += 1;
            in_group += 1;
            match attempt(r.clone()).await {
                Attempt::Ok(t) => {
                    r.record_success();
                    return Ok((t, r));
                }
                Attempt::PassThrough(resp) => {
                    // A context-length refusal moves to the context-window fallbacks.
                    if resp.status() == StatusCode::BAD_REQUEST && !context_switched {
                        if let Some(fb) = ctx.rt.config.context_window_fallbacks.get(&group) {
                            let (parts, body) = resp.into_parts();
                            let bytes = axum::body::to_bytes(body, 1 << 20)
                                .await
                                .unwrap_or_default();
                            let text = String::from_utf8_lossy(&bytes).to_lowercase();
                            if text.contains("context") {
                                context_switched = true;
                                groups.truncate(gi + 1);
                                groups.extend(fb.iter().cloned());
                                last_error = Some(Response::from_parts(parts, Body::from(bytes)));
                                break;
                            }
                            ctx.done(&r.dep.id, parts.status);
                            return Err(pass(Response::from_parts(parts, Body::from(bytes))));
                        }
                    }
                    ctx.done(&r.dep.id, resp.status());
                    return Err(pass(resp));
                }
                Attempt::Retry(kind, resp) => {
                    ctx.fail(&r, kind);
                    if resp.is_some() {
                        last_error = resp;
                    }
                }
            }
        }
        gi += 1;
    }
    if let Some(resp) = last_error {
        ctx.done("none", resp.status());
        return Err(pass(resp));
    }
    if tried.is_empty() {
        if let Some(e) = ctx.deployments_limited(&groups) {
            return Err(e);
        }
    }
    ctx.done("none", StatusCode::SERVICE_UNAVAILABLE);
    Err(GatewayError::unavailable(
        format!(
            "no replica of `{}` is available ({} tried)",
            groups.join("`, `"),
            tried.len()
        ),
        ctx.retry_after(&groups),
    ))
}

/// Wraps an upstream response so that it flows out through the error path unchanged.
fn pass(resp: Response) -> GatewayError {
    GatewayError {
        passthrough: Some(Box::new(resp)),
        ..GatewayError::new(StatusCode::BAD_GATEWAY, "upstream_error", "")
    }
}

/// Turns an upstream error status into an attempt result.
pub async fn classify<T>(
    r: &Replica,
    resp: reqwest::Response,
) -> Result<reqwest::Response, Attempt<T>> {
    let status = resp.status();
    if status.is_success() {
        return Ok(resp);
    }
    let code = StatusCode::from_u16(status.as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    let headers = resp.headers().clone();
    let bytes = resp.bytes().await.unwrap_or_default();
    let mut out = Response::builder().status(code);
    for name in [header::CONTENT_TYPE, header::RETRY_AFTER] {
        if let Some(v) = headers.get(&name) {
            out = out.header(name, v);
        }
    }
    let mut out = out.body(Body::from(bytes)).unwrap_or_default();
    if let Ok(v) = HeaderValue::from_str(&r.dep.id) {
        out.headers_mut().insert(REPLICA_HEADER, v);
    }
    if code.is_server_error() || code == StatusCode::TOO_MANY_REQUESTS {
        Err(Attempt::Retry(Failure::Response, Some(out)))
    } else {
        Err(Attempt::PassThrough(out))
    }
}

pub fn failure_of(e: &reqwest::Error) -> Failure {
    if e.is_connect() || e.is_request() && !e.is_timeout() {
        Failure::Connection
    } else {
        Failure::Response
    }
}

async fn unary(ctx: Ctx) -> Result<Response, GatewayError> {
    let timeout = ctx.rt.config.request_timeout;
    let ((bytes, content_type, usage, t0), r) = with_retries(&ctx, |r| {
        let ctx = &ctx;
        async move {
            let _in = InFlight::new(&r);
            let t0 = Instant::now();
            let body = ctx.upstream_body(&r, &[]);
            let resp = match ctx.send(&r, body).timeout(timeout).send().await {
                Ok(resp) => resp,
                Err(e) => return Attempt::Retry(failure_of(&e), None),
            };
            let resp = match classify(&r, resp).await {
                Ok(resp) => resp,
                Err(a) => return a,
            };
            let ct = resp.headers().get(header::CONTENT_TYPE).cloned();
            let bytes = match read_limited(resp, MAX_UPSTREAM_BODY).await {
                Ok(b) => b,
                Err(kind) => return Attempt::Retry(kind, Some(bad_body(&r, "its body broke off"))),
            };
            let Ok(v) = serde_json::from_slice::<Value>(&bytes) else {
                return Attempt::Retry(
                    Failure::Response,
                    Some(bad_body(&r, "it returned a body that is not valid JSON")),
                );
            };
            Attempt::Ok((bytes, ct, usage_of(&v), t0))
        }
    })
    .await?;
    ctx.gw.metrics.observe(
        "pagellm_gateway_upstream_latency_seconds",
        &[("model", &ctx.group), ("replica", &r.dep.id)],
        t0.elapsed().as_secs_f64(),
    );
    ctx.done(&r.dep.id, StatusCode::OK);
    ctx.charge(&r, usage).await;
    let mut resp = Response::new(Body::from(bytes));
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        content_type.unwrap_or(HeaderValue::from_static("application/json")),
    );
    if let Ok(v) = HeaderValue::from_str(&r.dep.id) {
        h.insert(REPLICA_HEADER, v);
    }
    Ok(resp)
}

/// A 502 naming the replica and what was wrong with its answer.
pub fn bad_body(r: &Replica, what: &str) -> Response {
    let mut resp =
        GatewayError::bad_gateway(format!("replica `{}` failed: {what}", r.dep.id)).into_response();
    if let Ok(v) = HeaderValue::from_str(&r.dep.id) {
        resp.headers_mut().insert(REPLICA_HEADER, v);
    }
    resp
}

async fn read_limited(mut resp: reqwest::Response, max: usize) -> Result<Vec<u8>, Failure> {
    let mut out = Vec::new();
    loop {
        match resp.chunk().await {
            Ok(Some(c)) => {
                if out.len() + c.len() > max {
                    return Err(Failure::Response);
                }
                out.extend_from_slice(&c);
            }
            Ok(None) => return Ok(out),
            Err(e) => return Err(failure_of(&e)),
        }
    }
}

/// How long to wait for the next chunk of a stream before calling its replica dead.
pub fn idle_timeout(ctx: &Ctx) -> Duration {
    ctx.rt.config.request_timeout
}
