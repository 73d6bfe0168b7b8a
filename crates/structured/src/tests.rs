use super::*;

/// A small vocabulary: every printable ASCII character, a few multi-character pieces,
/// a special end token and an unused id.
fn vocab() -> Vocabulary {
    let mut pieces: Vec<Vec<u8>> = (b' '..=b'~').map(|c| vec![c]).collect();
    for w in ["\"name\"", ": ", ", ", "true", "false", "null", "yes", "no"] {
        pieces.push(w.as_bytes().to_vec());
    }
    pieces.push(b"<|end|>".to_vec());
    let eos = pieces.len() as u32 - 1;
    let mut special = vec![false; pieces.len()];
    special[eos as usize] = true;
    Vocabulary {
        pieces,
        special,
        eos,
        logits_len: eos as usize + 2,
    }
}

/// Drives `g` to the end token, picking among the allowed tokens with a seeded
/// generator; returns the text, or `None` if it did not end within `limit` tokens.
fn walk(v: &Vocabulary, mut g: Guide, seed: u64, limit: usize) -> Option<String> {
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
    let mut out = Vec::new();
    for _ in 0..limit {
        let m = g.mask().expect("a mask");
        let allowed: Vec<u32> = (0..v.logits_len as u32).filter(|&t| m.allows(t)).collect();
        assert!(!allowed.is_empty());
        if m.allows(v.eos) && (state >> 60) < 4 {
            return Some(String::from_utf8(out).unwrap());
        }
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let t = allowed[(state >> 33) as usize % allowed.len()];
        if t == v.eos {
            return Some(String::from_utf8(out).unwrap());
        }
        out.extend_from_slice(&v.pieces[t as usize]);
        g.advance(t).expect("an allowed token advances");
    }
    None
}

#[test]
fn choices_produce_exactly_one_of_the_options() {
    let v = vocab();
    let c = Compiler::new(&v).unwrap();
    let opts = vec!["yes".to_string(), "no".into(), "a.b*".into()];
    let g = c.compile(&Constraint::Choice(opts.clone())).unwrap();
    for seed in 0..40 {
        let text = walk(&v, g.clone(), seed, 50).expect("ends");
        assert!(opts.contains(&text), "{text:?}");
    }
}

#[test]
fn regexes_are_matched_whole() {
    let v = vocab();
    let c = Compiler::new(&v).unwrap();
    let g = c
        .compile(&Constraint::Regex("[0-9]{3}-[a-z]+".into()))
        .unwrap();
    for seed in 0..40 {
        let text = walk(&v, g.clone(), seed, 200).expect("ends");
        let (num, word) = text.split_once('-').expect("a dash");
        assert!(
            num.len() == 3 && num.bytes().all(|b| b.is_ascii_digit()),
            "{text:?}"
        );
        assert!(
            !word.is_empty() && word.bytes().all(|b| b.is_ascii_lowercase()),
            "{text:?}"
        );
    }
}

#[test]
fn json_schemas_produce_valid_instances() {
    let v = vocab();
    let c = Compiler::new(&v).unwrap();
    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 5},
            "n": {"type": "integer", "minimum": 1, "maximum": 9},
            "tags": {"type": "array", "items": {"enum": ["x", "y"]}, "maxItems": 2},
        },
        "required": ["name", "n"],
    });
    let g = c.compile(&Constraint::JsonSchema(schema)).unwrap();
    let mut ended = 0;
    for seed in 0..30 {
        let Some(text) = walk(&v, g.clone(), seed, 300) else {
            continue;
        };
        ended += 1;
        let val: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        let o = val.as_object().expect("an object");
        assert!(
            o.keys()
                .all(|k| ["name", "n", "tags"].contains(&k.as_str())),
            "{text}"
        );
        assert!(
            o["name"].as_str().is_some_and(|s| s.chars().count() <= 5),
            "{text}"
        );
        assert!((1..=9).contains(&o["n"].as_i64().expect("n")), "{text}");
        if let Some(t) = o.get("tags") {
            let t = t.as_array().expect("tags");
            assert!(
                t.len() <= 2 && t.iter().all(|x| x == "x" || x == "y"),
                "{text}"
            );
        }
    }
    assert!(ended >= 20, "only {ended} of 30 walks ended");
}

#[test]
fn the_end_token_is_the_only_choice_once_complete() {
    let v = vocab();
    let c = Compiler::new(&v).unwrap();
    let mut g = c.compile(&Constraint::Choice(vec!["no".into()])).unwrap();
    let no = v.pieces.iter().position(|p| p == b"no").unwrap() as u32;
    let m = g.mask().unwrap();
    assert!(m.allows(no) && m.allows(b'n' as u32 - b' ' as u32) && !m.allows(v.eos));
    g.advance(no).unwrap();
    let m = g.mask().unwrap();
    assert_eq!(m.count(), 1);
    assert!(m.allows(v.eos));
    let mut logits = vec![1.0; v.logits_len];
    m.apply(&mut logits);
    let finite: Vec<usize> = (0..logits.len())
        .filter(|&i| logits[i].is_finite())
        .collect();
    assert_eq!(finite, vec![v.eos as usize]);
    // The end token itself is taken without complaint.
    g.advance(v.eos).unwrap();
    assert!(g.is_complete());
    // A token the mask forbids is refused.
    let mut g = c.compile(&Constraint::Choice(vec!["no".into()])).unwrap();
    assert!(g.advance(b'x' as u32 - b' ' as u32).is_err());
}

#[test]
fn bad_constraints_name_the_problem() {
    let c = Compiler::new(&vocab()).unwrap();
    let err = |k: Constraint| match c.compile(&k) {
        Err(Error::Invalid { kind, message }) => (kind, message),
        other => panic!("expected an error, got {other:?}"),
    };
    let (kind, _) = err(Constraint::Regex("[a-".into()));
    assert_eq!(kind, "regex");
    let (kind, msg) = err(Constraint::JsonSchema(json!({"type": "nonsense"})));
    assert_eq!(kind, "JSON schema");
    assert!(msg.contains("nonsense"), "{msg}");
    let (kind, _) = err(Constraint::JsonSchema(json!([1, 2])));
    assert_eq!(kind, "JSON schema");
    // A keyword the matcher cannot enforce is refused by name, not dropped.
    let (_, msg) = err(Constraint::JsonSchema(
        json!({"type": "array", "items": {"type": "integer"}, "uniqueItems": true}),
    ));
    assert!(msg.contains("uniqueItems"), "{msg}");
    assert_eq!(err(Constraint::Choice(vec![])).0, "choice");
    assert_eq!(
        err(Constraint::Grammar("start: undefined_rule".into())).0,
        "grammar"
    );
    let (kind, msg) = err(Constraint::Grammar("root ::= \"a\" [b-".into()));
    assert_eq!(kind, "grammar");
    assert!(msg.contains("unclosed"), "{msg}");
}

#[test]
fn gbnf_grammars_work_as_llama_cpp_writes_them() {
    let src = r#"
        # yes/no answers with a number
        root   ::= answer " " number
        answer ::= ("yes" | "no")
        number ::= [1-9] [0-9]{0,2}   # up to three digits
    "#;
    let lark = gbnf_to_lark(src).unwrap();
    assert!(lark.starts_with("start: answer \" \" number\n"), "{lark}");
    let v = vocab();
    let c = Compiler::new(&v).unwrap();
    let g = c.compile(&Constraint::Grammar(src.into())).unwrap();
    for seed in 0..30 {
        let text = walk(&v, g.clone(), seed, 50).expect("ends");
        let (a, n) = text.split_once(' ').expect("a space");
        assert!(a == "yes" || a == "no", "{text:?}");
        assert!(
            (1..=3).contains(&n.len()) && !n.starts_with('0'),
            "{text:?}"
        );
        assert!(n.bytes().all(|b| b.is_ascii_digit()), "{text:?}");
    }
    assert!(gbnf_to_lark("answer ::= \"x\"")
        .unwrap_err()
        .contains("root"));
}

#[test]
fn lark_grammars_compile_as_given() {
    let v = vocab();
    let c = Compiler::new(&v).unwrap();
    let g = c
        .compile(&Constraint::Grammar("start: \"a\"+ \"b\"".into()))
        .unwrap();
    for seed in 0..20 {
        let text = walk(&v, g.clone(), seed, 60).expect("ends");
        assert!(text.ends_with('b') && text[..text.len() - 1].bytes().all(|b| b == b'a'));
        assert!(text.len() >= 2, "{text:?}");
    }
}

#[test]
fn json_embedded_in_a_grammar_is_closed_and_laid_out() {
    let v = vocab();
    let c = Compiler::new(&v).unwrap();
    let schema =
        json!({"type": "object", "properties": {"n": {"enum": [1, 2]}}, "required": ["n"]});
    let g = format!("start: \"call \" body\nbody: {}", lark_json(&schema));
    let g = c.compile(&Constraint::Grammar(g)).unwrap();
    for seed in 0..20 {
        let text = walk(&v, g.clone(), seed, 60).expect("ends");
        assert!(
            text == "call {\"n\": 1}" || text == "call {\"n\": 2}",
            "{text:?}"
        );
    }
}
