//! Virtual keys through the gateway: the master key, per-minute request and token
//! limits counted from real usage, budgets, model allow-lists, revocation, state that
//! survives a restart (SQLite), and one limit shared by two gateways (a real
//! `redis-server`, which `.ci/run` installs).

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::common::*;
use futures_util::StreamExt;
use serde_json::{json, Value};

const MASTER: &str = "sk-master-1234";

fn config(upstream: &str, store: &str) -> String {
    format!(
        "model_list:\n{}{}general_settings: {{master_key: {MASTER}}}\npagellm_settings:\n  key_store: {store}\n",
        deployment(MODEL, "a", upstream),
        deployment("other", "o", upstream),
    )
}

async fn new_key(gw: &str, spec: Value) -> String {
    let r = post(gw, "/key/generate", &spec, Some(MASTER)).await;
    assert_eq!(r.status, 200, "{}", r.text);
    r.json()["key"].as_str().unwrap().to_string()
}

fn ask(max_tokens: u32) -> Value {
    // 5 prompt tokens on the tiny model (one per character).
    json!({"model": MODEL, "prompt": "hello", "max_tokens": max_tokens, "temperature": 0, "ignore_eos": true})
}

fn header(r: &Reply, name: &str) -> Option<String> {
    r.headers.get(name).map(|v| v.to_str().unwrap().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_limits_and_ledger_hold_and_survive_a_restart() {
    let dir = tiny_dir();
    let a = replica(&dir, None).await;
    let db = tempfile::tempdir().unwrap();
    let store = format!(
        "{{type: sqlite, path: \"{}\"}}",
        db.path().join("gw.db").display()
    );
    let yaml = config(&a.url, &store);
    let (gw, _) = gateway(&yaml).await;

    assert_eq!(
        post(&gw, "/v1/completions", &ask(2), None).await.status,
        401
    );
    assert_eq!(
        post(&gw, "/v1/completions", &ask(2), Some("sk-wrong"))
            .await
            .status,
        401
    );
    assert_eq!(
        post(&gw, "/v1/completions", &ask(2), Some(MASTER))
            .await
            .status,
        200
    );
    let r = post(
        &gw,
        "/key/generate",
        &json!({"rpm_limit": 3}),
        Some("sk-wrong"),
    )
    .await;
    assert_eq!(r.status, 401);

    // Requests per minute: the 4th of 3 is refused, with Retry-After.
    let k = new_key(&gw, json!({"rpm_limit": 3, "key_alias": "rpm"})).await;

    // The dashboard: the page and its assets are public, its live stream (every
    // client's routing) needs the master key; a virtual key is not enough.
    let page = get(&gw, "/", None).await;
    assert_eq!(page.status, 200);
    assert!(page.text.contains("/dashboard/gateway.js"), "{}", page.text);
    for asset in [
        "/dashboard/gateway.js",
        "/dashboard/common.js",
        "/dashboard/style.css",
    ] {
        let a = get(&gw, asset, None).await;
        assert!(
            a.status == 200 && a.text.len() > 500,
            "{asset}: {}",
            a.status
        );
    }
    assert_eq!(get(&gw, "/dashboard/events", None).await.status, 401);
    assert_eq!(get(&gw, "/dashboard/events", Some(&k)).await.status, 401);
    let events = client()
        .get(format!("{gw}/dashboard/events"))
        .bearer_auth(MASTER)
        .send()
        .await
        .unwrap();
    assert_eq!(events.status(), 200);
    let mut body = events.bytes_stream();
    let first = body.next().await.unwrap().unwrap();
    let frame: Value = serde_json::from_str(
        std::str::from_utf8(&first)
            .unwrap()
            .trim()
            .strip_prefix("data: ")
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        frame["replicas"][0]["api_base"],
        format!("{}/v1", a.url),
        "{frame}"
    );
    assert_eq!(frame["decisions"][0]["outcome"], "200", "{frame}");
    drop(body);
    for left in ["2", "1", "0"] {
        let r = post(&gw, "/v1/completions", &ask(2), Some(&k)).await;
        assert_eq!(r.status, 200, "{}", r.text);
        assert_eq!(
            header(&r, "x-ratelimit-remaining-requests").as_deref(),
            Some(left)
        );
    }
    let r = post(&gw, "/v1/completions", &ask(2), Some(&k)).await;
    assert_eq!(r.status, 429, "{}", r.text);
    assert_eq!(r.json()["error"]["code"], "rate_limit_exceeded");
    let retry: u64 = header(&r, "retry-after").unwrap().parse().unwrap();
    assert!((55..=60).contains(&retry), "{retry}");
    assert_eq!(
        header(&r, "x-ratelimit-remaining-requests").as_deref(),
        Some("0")
    );
    assert_eq!(
        header(&r, "x-ratelimit-limit-requests").as_deref(),
        Some("3")
    );

    // Tokens per minute, counted from the replica's usage: 5 + 8 = 13 per request.
    let t = new_key(&gw, json!({"tpm_limit": 20})).await;
    assert_eq!(
        post(&gw, "/v1/completions", &ask(8), Some(&t)).await.status,
        200
    );
    let r = post(&gw, "/v1/completions", &ask(8), Some(&t)).await;
    assert_eq!(r.status, 200);
    assert_eq!(
        header(&r, "x-ratelimit-remaining-tokens").as_deref(),
        Some("7")
    );
    let mut s = ask(8);
    s["stream"] = json!(true);
    let r = post(&gw, "/v1/completions", &s, Some(&t)).await;
    assert_eq!(r.status, 429, "{}", r.text);
    assert!(r.text.contains("tokens per minute"), "{}", r.text);

    // A streamed request is charged too, though the client asked for no usage.
    let b = new_key(&gw, json!({"max_budget_tokens": 20, "models": [MODEL]})).await;
    let r = post(&gw, "/v1/completions", &s, Some(&b)).await;
    assert_eq!(r.status, 200);
    assert!(
        !r.text.contains("\"usage\""),
        "usage sent though not asked for: {}",
        r.text
    );
    assert_eq!(
        post(&gw, "/v1/completions", &ask(8), Some(&b)).await.status,
        200
    );
    let r = post(&gw, "/v1/completions", &ask(8), Some(&b)).await;
    assert_eq!(r.status, 429);
    assert_eq!(r.json()["error"]["code"], "insufficient_quota");
    let mut other = ask(2);
    other["model"] = json!("other");
    let r = post(&gw, "/v1/completions", &other, Some(&b)).await;
    assert_eq!(r.status, 403, "{}", r.text);

    // The ledger holds real counts per key and model.
    let info = get(&gw, &format!("/key/info?key={b}"), Some(MASTER))
        .await
        .json();
    assert_eq!(
        info["ledger"],
        json!([{"model": MODEL, "requests": 2, "prompt_tokens": 10, "completion_tokens": 16}])
    );
    assert_eq!(info["info"]["spent_tokens"], 26);
    let list = get(&gw, "/key/list", Some(MASTER)).await.json();
    assert_eq!(list["keys"].as_array().unwrap().len(), 3);
    assert!(!list.to_string().contains(&k), "keys are listed in clear");

    // A second gateway on the same file (a restart) keeps limits and ledger.
    let (gw2, _) = gateway(&yaml).await;
    assert_eq!(
        post(&gw2, "/v1/completions", &ask(2), Some(&k))
            .await
            .status,
        429
    );
    assert_eq!(
        post(&gw2, "/v1/completions", &ask(2), Some(&b))
            .await
            .status,
        429
    );
    let info = get(&gw2, &format!("/key/info?key={b}"), Some(MASTER))
        .await
        .json();
    assert_eq!(info["ledger"][0]["requests"], 2);

    // Revoked keys stop working.
    let r = post(
        &gw2,
        "/key/delete",
        &json!({"keys": [k.clone()]}),
        Some(MASTER),
    )
    .await;
    assert_eq!(r.json()["deleted_keys"], json!([k]));
    assert_eq!(
        post(&gw2, "/v1/completions", &ask(2), Some(&k))
            .await
            .status,
        401
    );
    let r = post(&gw2, "/key/generate", &json!({"rpm": 3}), Some(MASTER)).await;
    assert_eq!(r.status, 400, "unknown fields must be refused: {}", r.text);
    let r = post(
        &gw2,
        "/key/generate",
        &json!({"models": ["nope"]}),
        Some(MASTER),
    )
    .await;
    assert_eq!(r.status, 400);
}

struct Redis(Child, u16);

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn redis() -> Redis {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .stdout(Stdio::null())
        .spawn()
        .expect(
            "redis-server must be installed (apt-get install redis-server; scripts/test.sh does)",
        );
    // Owned from here on: dropping it kills and reaps the server, even on a panic.
    let redis = Redis(child, port);
    for _ in 0..200 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return redis;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    panic!("redis-server did not start on port {port}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_sharing_redis_enforce_one_limit() {
    let r = redis();
    let dir = tiny_dir();
    let a = replica(&dir, None).await;
    let yaml = config(
        &a.url,
        &format!("{{type: redis, url: \"redis://127.0.0.1:{}\"}}", r.1),
    );
    let (g1, _) = gateway(&yaml).await;
    let (g2, _) = gateway(&yaml).await;
    let k = new_key(&g1, json!({"rpm_limit": 10})).await;
    // Created on one, known to the other.
    let info = get(&g2, &format!("/key/info?key={k}"), Some(MASTER)).await;
    assert_eq!(info.status, 200, "{}", info.text);
    let mut tasks = Vec::new();
    for i in 0..24 {
        let (gw, k) = (if i % 2 == 0 { g1.clone() } else { g2.clone() }, k.clone());
        tasks.push(tokio::spawn(async move {
            post(&gw, "/v1/completions", &ask(1), Some(&k)).await.status
        }));
    }
    let mut ok = 0;
    let mut limited = 0;
    for t in tasks {
        match t.await.unwrap() {
            200 => ok += 1,
            429 => limited += 1,
            s => panic!("status {s}"),
        }
    }
    assert_eq!((ok, limited), (10, 14));
    // Usage from both lands in one ledger.
    let info = get(&g1, &format!("/key/info?key={k}"), Some(MASTER))
        .await
        .json();
    let ledger = &info["ledger"][0];
    assert_eq!(ledger["requests"], 10, "{info}");
    assert_eq!(ledger["prompt_tokens"], 50, "{info}");
    // Revoked through one, refused by the other.
    post(
        &g2,
        "/key/delete",
        &json!({"keys": [k.clone()]}),
        Some(MASTER),
    )
    .await;
    assert_eq!(
        post(&g1, "/v1/completions", &ask(1), Some(&k)).await.status,
        401
    );
}
