use super::*;

const LITELLM: &str = r#"
model_list:
  - model_name: smollm
    litellm_params:
      model: openai/smollm2-135m
      api_base: http://127.0.0.1:8001/v1
      api_key: none
      rpm: 600
    model_info: {id: replica-1}
  - model_name: smollm
    litellm_params:
      model: hosted_vllm/smollm2-135m
      api_base: http://127.0.0.1:8002
  - model_name: qwen
    litellm_params:
      model: openai/qwen2.5-coder-0.5b
      api_base: http://127.0.0.1:8003/v1
router_settings:
  routing_strategy: least-busy
  enable_pre_call_checks: true
litellm_settings:
  num_retries: 3
  request_timeout: 10
  fallbacks: [{"smollm": ["qwen"]}]
  allowed_fails: 2
  cooldown_time: 30
  callbacks: []
general_settings:
  master_key: sk-1234
"#;

#[test]
fn a_litellm_config_reads_unchanged() {
    let c = Config::parse(LITELLM).unwrap();
    assert_eq!(c.groups, ["smollm", "qwen"]);
    assert_eq!(c.deployments.len(), 3);
    assert_eq!(c.deployments[0].id, "replica-1");
    assert_eq!(c.deployments[1].id, "smollm-1");
    assert_eq!(c.deployments[1].api_base, "http://127.0.0.1:8002/v1");
    assert_eq!(c.deployments[1].root(), "http://127.0.0.1:8002");
    assert_eq!(c.deployments[0].upstream_model, "smollm2-135m");
    assert_eq!(c.deployments[0].api_key, None);
    assert_eq!(c.deployments[0].rpm, Some(600));
    assert_eq!(c.policy, Policy::LeastOutstanding);
    assert_eq!(c.num_retries, 3);
    assert_eq!(c.request_timeout, Duration::from_secs(10));
    assert_eq!(c.fallbacks["smollm"], ["qwen"]);
    assert_eq!(c.allowed_fails, 2);
    assert_eq!(c.cooldown, Duration::from_secs(30));
    assert_eq!(c.master_key.as_deref(), Some("sk-1234"));
    assert!(matches!(c.store, StoreConfig::Sqlite(_)));
    // Known LiteLLM keys without effect are reported with their lines.
    assert!(
        c.ignored
            .iter()
            .any(|w| w == "router_settings.enable_pre_call_checks (line 20)"),
        "{:?}",
        c.ignored
    );
    assert!(c
        .ignored
        .iter()
        .any(|w| w.starts_with("litellm_settings.callbacks (line 27)")));
}

fn err(text: &str) -> String {
    Config::parse(text).unwrap_err().0
}

#[test]
fn errors_name_the_key_and_line() {
    let e = err("model_list:\n  - model_name: a\n    litellm_params:\n      model: openai/a\n      api_base: http://x/v1\n      rmp: 5\n");
    assert!(
        e.contains("unknown field `rmp`") && e.contains("line 6"),
        "{e}"
    );
    let e = err("model_list:\n  - model_name: a\n    litellm_params:\n      model: gpt-4\n      api_base: http://x/v1\n");
    assert!(
        e.contains("model_list[0].litellm_params.model (line 4)") && e.contains("openai/NAME"),
        "{e}"
    );
    let e = err("model_list:\n  - model_name: a\n    litellm_params:\n      model: openai/a\n      api_base: ftp://x\n");
    assert!(e.contains("api_base (line 5)"), "{e}");
    let e = err("model_list:\n  - model_name: a\n    litellm_params: {model: openai/a, api_base: 'http://x'}\nlitellm_settings:\n  fallbacks: [{a: [b]}]\n");
    assert!(
        e.contains("litellm_settings.fallbacks (line 5)") && e.contains("`b`"),
        "{e}"
    );
    let e = err("model_list:\n  - model_name: a\n    litellm_params: {model: openai/a, api_base: 'http://x'}\nrouter_settings:\n  routing_strategy: fastest\n");
    assert!(
        e.contains("routing_strategy (line 5)") && e.contains("fastest"),
        "{e}"
    );
    let e = err("model_list:\n  - model_name: a\n    litellm_params: {model: openai/a, api_base: 'http://x'}\nrouter_settings:\n  num_retries: many\n");
    assert!(e.contains("num_retries") && e.contains("line 5"), "{e}");
    let e = err("modle_list: []\n");
    assert!(
        e.contains("unknown field `modle_list`") && e.contains("line 1"),
        "{e}"
    );
    let e = err("model_list: [\n");
    assert!(e.contains("YAML"), "{e}");
    let e = err("model_list:\n  - model_name: a\n    litellm_params: {model: openai/a, api_base: 'http://x'}\npagellm_settings:\n  health_check: {interval: -1}\n");
    assert!(e.contains("health_check.interval (line 5)"), "{e}");
    let e = err("model_list:\n  - model_name: a\n    litellm_params: {model: openai/a, api_base: 'http://x'}\npagellm_settings:\n  cache_threshold: 2\n");
    assert!(
        e.contains("cache_threshold (line 5)") && e.contains("between 0 and 1"),
        "{e}"
    );
}

#[test]
fn pagellm_settings_override_litellm_names() {
    let c = Config::parse(
        "model_list:\n  - model_name: a\n    litellm_params: {model: openai/a, api_base: 'http://x:1/v1'}\n    pagellm_params: {max_concurrency: 4}\nrouter_settings: {routing_strategy: simple-shuffle}\npagellm_settings:\n  routing_policy: power-of-two\n  tokenizers: {a: smollm2-135m}\n  key_store: {type: redis, url: 'redis://127.0.0.1:6379'}\n",
    )
    .unwrap();
    assert_eq!(c.policy, Policy::PowerOfTwo);
    assert_eq!(c.deployments[0].max_concurrency, Some(4));
    assert_eq!(c.tokenizers["a"], "smollm2-135m");
    assert!(matches!(c.store, StoreConfig::Redis(ref u) if u == "redis://127.0.0.1:6379"));
    assert_eq!(Config::parse("model_list:\n  - model_name: a\n    litellm_params: {model: openai/a, api_base: 'http://x'}\n").unwrap().policy, Policy::PrefixAware);
}

proptest::proptest! {
    /// Whatever the bytes, parsing returns a config or an error: it never panics.
    #[test]
    fn parsing_never_panics(s in "\\PC{0,400}") {
        let _ = Config::parse(&s);
    }

    /// Mutations of a valid config (a byte changed, dropped or duplicated) never panic.
    #[test]
    fn mutated_configs_never_panic(pos in 0usize..LITELLM.len(), op in 0u8..3, b in 0u8..128) {
        let mut bytes = LITELLM.as_bytes().to_vec();
        match op {
            0 => bytes[pos] = b,
            1 => { bytes.remove(pos); }
            _ => { let c = bytes[pos]; bytes.insert(pos, c); }
        }
        if let Ok(s) = String::from_utf8(bytes) {
            let _ = Config::parse(&s);
        }
    }
}

#[test]
fn the_annotated_example_is_valid() {
    let c = Config::parse(include_str!("../../../../examples/gateway.yaml")).unwrap();
    assert_eq!(c.groups, ["smollm2-135m", "qwen2.5-coder-0.5b"]);
    assert_eq!(c.policy, Policy::PrefixAware);
    assert_eq!(c.deployments[0].max_concurrency, Some(32));
    assert_eq!(
        c.context_window_fallbacks["smollm2-135m"],
        ["qwen2.5-coder-0.5b"]
    );
}
