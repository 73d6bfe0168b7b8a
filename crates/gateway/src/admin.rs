//! The key admin API, under LiteLLM's paths: `POST /key/generate`, `GET /key/list`,
//! `GET /key/info?key=`, `POST /key/delete`. Only the master key may call it.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::json;

use crate::error::GatewayError;
use crate::keys::{KeySpec, Store};
use crate::proxy::{authenticate, Principal};
use crate::Gateway;

fn master<'a>(gw: &'a Gateway, headers: &HeaderMap) -> Result<&'a Store, GatewayError> {
    let rt = gw.runtime();
    match authenticate(&rt, headers)? {
        Principal::Master => {}
        Principal::Open => {
            return Err(GatewayError::bad_request(
                "virtual keys need general_settings.master_key in the config",
                None,
            ))
        }
        Principal::Virtual(_) => {
            return Err(GatewayError::unauthorized(
                "only the master key may manage keys",
            ))
        }
    }
    gw.store
        .as_ref()
        .ok_or_else(|| GatewayError::unavailable("no key store", 1))
}

fn store_err(e: crate::keys::StoreError) -> GatewayError {
    GatewayError::unavailable(e.to_string(), 1)
}

pub async fn generate(State(gw): State<Arc<Gateway>>, headers: HeaderMap, body: Bytes) -> Response {
    let r = async {
        let store = master(&gw, &headers)?;
        let spec: KeySpec = if body.iter().all(u8::is_ascii_whitespace) {
            KeySpec::default()
        } else {
            serde_json::from_slice(&body)
                .map_err(|e| GatewayError::bad_request(format!("invalid key request: {e}"), None))?
        };
        let rt = gw.runtime();
        for m in &spec.models {
            if !rt.config.groups.contains(m) {
                return Err(GatewayError::bad_request(
                    format!(
                        "models: `{m}` is not a configured model (known: {})",
                        rt.config.groups.join(", ")
                    ),
                    Some("models"),
                ));
            }
        }
        let (key, rec) = store.create(spec).await.map_err(store_err)?;
        let mut v = serde_json::to_value(&rec).unwrap_or_default();
        v["key"] = json!(key);
        Ok::<_, GatewayError>(Json(v))
    };
    r.await
        .map_or_else(IntoResponse::into_response, IntoResponse::into_response)
}

pub async fn list(State(gw): State<Arc<Gateway>>, headers: HeaderMap) -> Response {
    let r = async {
        let store = master(&gw, &headers)?;
        let keys = store.list().await.map_err(store_err)?;
        Ok::<_, GatewayError>(Json(json!({"keys": keys})))
    };
    r.await
        .map_or_else(IntoResponse::into_response, IntoResponse::into_response)
}

pub async fn info(
    State(gw): State<Arc<Gateway>>,
    headers: HeaderMap,
    Query(q): Query<std::collections::HashMap<String, String>>,
) -> Response {
    let r = async {
        let store = master(&gw, &headers)?;
        let Some(key) = q.get("key") else {
            return Err(GatewayError::bad_request(
                "`key` query parameter is required",
                Some("key"),
            ));
        };
        let Some(rec) = store.get(key).await.map_err(store_err)? else {
            return Err(GatewayError::not_found("no such key"));
        };
        let ledger = store.ledger(key).await.map_err(store_err)?;
        Ok(Json(json!({"key": key, "info": rec, "ledger": ledger})))
    };
    r.await
        .map_or_else(IntoResponse::into_response, IntoResponse::into_response)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DeleteReq {
    keys: Vec<String>,
}

pub async fn delete(State(gw): State<Arc<Gateway>>, headers: HeaderMap, body: Bytes) -> Response {
    let r = async {
        let store = master(&gw, &headers)?;
        let req: DeleteReq = serde_json::from_slice(&body).map_err(|e| {
            GatewayError::bad_request(format!("expected {{\"keys\": [...]}}: {e}"), Some("keys"))
        })?;
        let mut deleted = Vec::new();
        for k in &req.keys {
            if store.delete(k).await.map_err(store_err)? {
                deleted.push(k.clone());
            }
        }
        Ok::<_, GatewayError>(Json(json!({"deleted_keys": deleted})))
    };
    r.await
        .map_or_else(IntoResponse::into_response, IntoResponse::into_response)
}
