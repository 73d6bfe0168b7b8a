//! Structured outputs in the engine (smollm2-135m, pulled by scripts/test.sh): guided
//! requests follow their constraint, their neighbours in the batch get exactly the
//! tokens they get alone, and a resumed guided request continues as if uninterrupted.

use std::sync::Arc;

use pagellm_engine::{
    Engine, EngineConfig, EngineError, FinishInfo, FinishReason, RequestParams, RequestStream,
    Resume, SamplingParams,
};
use pagellm_model::loader::{load_gguf, LoadedModel};
use pagellm_model::registry;
use pagellm_structured::Constraint;
use serde_json::{json, Value};

fn engine() -> Engine {
    let path = registry::pull("smollm2-135m", false).expect("model in cache (scripts/test.sh)");
    let model: Arc<LoadedModel> = Arc::new(load_gguf(&path).unwrap());
    let config = EngineConfig {
        threads: 2,
        kv_cache_memory: 128 << 20,
        max_model_len: Some(512),
        ..EngineConfig::default()
    };
    Engine::start(model, &config).unwrap()
}

fn prompt(e: &Engine, text: &str) -> Vec<u32> {
    e.model().tokenizer.encode(text, true, false).unwrap()
}

fn params(e: &Engine, c: Option<Constraint>, temperature: f32, max_tokens: usize) -> RequestParams {
    RequestParams {
        sampling: SamplingParams {
            temperature,
            seed: Some(11),
            ..SamplingParams::default()
        },
        max_tokens: Some(max_tokens),
        guide: c.map(|c| e.structured().unwrap().compile(&c).unwrap()),
        ..RequestParams::default()
    }
}

/// Reads a stream to its end: (tokens, text, finish).
fn collect(mut s: RequestStream) -> (Vec<u32>, String, FinishInfo) {
    let (mut toks, mut text) = (Vec::new(), String::new());
    loop {
        let o = s.blocking_next().expect("a final update");
        toks.extend(o.token_ids);
        text.push_str(&o.text);
        if let Some(f) = o.finish {
            return (toks, text, f);
        }
    }
}

#[test]
fn guided_requests_follow_their_constraint_and_leave_neighbours_unchanged() {
    let e = engine();
    let plain = || {
        let mut p = params(&e, None, 0.0, 24);
        p.ignore_eos = true;
        (prompt(&e, "The history of the printing press"), p)
    };
    let (p0, params0) = plain();
    let alone = collect(e.submit(p0, params0).unwrap()).0;
    assert_eq!(alone.len(), 24);

    let schema = json!({
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0, "maximum": 99}},
        "required": ["name", "age"],
    });
    let mut group = vec![plain()];
    for temperature in [0.0, 0.9] {
        group.push((
            prompt(&e, "A person as JSON:"),
            params(
                &e,
                Some(Constraint::JsonSchema(schema.clone())),
                temperature,
                64,
            ),
        ));
        group.push((
            prompt(&e, "Is water wet? Answer:"),
            params(
                &e,
                Some(Constraint::Choice(vec!["yes".into(), "no".into()])),
                temperature,
                8,
            ),
        ));
        group.push((
            prompt(&e, "A year:"),
            params(
                &e,
                Some(Constraint::Regex("1[0-9]{3}|20[0-2][0-9]".into())),
                temperature,
                8,
            ),
        ));
    }
    let streams = e.submit_group(group).unwrap();
    let mut outs = streams.into_iter().map(collect);
    assert_eq!(
        outs.next().unwrap().0,
        alone,
        "a guided neighbour changed a plain request"
    );
    for _ in 0..2 {
        let (_, text, f) = outs.next().unwrap();
        assert_eq!(f.reason, FinishReason::Stop, "{text:?}");
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        assert!(
            v["name"].as_str().is_some_and(|n| n.chars().count() <= 12),
            "{text}"
        );
        assert!(v["age"].as_u64().is_some_and(|a| a <= 99), "{text}");
        assert_eq!(v.as_object().unwrap().len(), 2, "{text}");
        let (_, text, f) = outs.next().unwrap();
        assert!(
            f.reason == FinishReason::Stop && (text == "yes" || text == "no"),
            "{text:?}"
        );
        let (_, text, f) = outs.next().unwrap();
        let year: u32 = text.parse().unwrap_or_else(|_| panic!("{text:?}"));
        assert!(
            f.reason == FinishReason::Stop && (1000..=2029).contains(&year),
            "{text:?}"
        );
    }
}

#[test]
fn a_resumed_guided_request_continues_where_it_stopped() {
    let e = engine();
    let c = Constraint::Regex("[a-z]{3}-[0-9]{4}-[a-z]{2}".into());
    let p = prompt(&e, "A product code:");
    let (full, text, f) = collect(
        e.submit(p.clone(), params(&e, Some(c.clone()), 0.0, 32))
            .unwrap(),
    );
    assert_eq!(f.reason, FinishReason::Stop, "{text:?}");
    assert!(full.len() >= 4, "{full:?}");
    let k = full.len() / 2;
    let mut resumed = params(&e, Some(c.clone()), 0.0, 32);
    resumed.resume = Some(Resume {
        output_token_ids: full[..k].to_vec(),
        text_offset: 0,
    });
    let (rest, _, f) = collect(e.submit(p.clone(), resumed).unwrap());
    assert_eq!(f.reason, FinishReason::Stop);
    assert_eq!(rest, full[k..], "the resumed request went another way");

    // Resumed output the constraint forbids is refused at submission, with the reason.
    let mut bad = params(&e, Some(c), 0.0, 32);
    let digit = prompt(&e, "7").last().copied().unwrap();
    bad.resume = Some(Resume {
        output_token_ids: vec![digit],
        text_offset: 0,
    });
    match e.submit(p, bad) {
        Err(EngineError::Structured(err)) => assert!(err.to_string().contains("structured output")),
        Err(other) => panic!("unexpected error {other}"),
        Ok(_) => panic!("forbidden resumed output was accepted"),
    }
}
