use super::*;

fn logits() -> Vec<f32> {
    vec![1.0, 3.0, 2.0, 0.5, 2.9]
}

fn draw_many(p: SamplingParams, n: usize) -> Vec<usize> {
    let mut s = Sampler::new(p).unwrap();
    let mut hist = vec![0usize; 5];
    for _ in 0..n {
        let mut l = logits();
        hist[s.sample(&mut l, &[], &[]) as usize] += 1;
    }
    hist
}

#[test]
fn greedy_is_argmax() {
    let mut s = Sampler::new(SamplingParams::greedy()).unwrap();
    assert_eq!(s.sample(&mut logits(), &[], &[]), 1);
}

#[test]
fn top_k_one_is_greedy() {
    let h = draw_many(
        SamplingParams {
            top_k: 1,
            seed: Some(1),
            ..Default::default()
        },
        200,
    );
    assert_eq!(h, vec![0, 200, 0, 0, 0]);
}

#[test]
fn top_k_two_only_draws_the_two_best() {
    let h = draw_many(
        SamplingParams {
            top_k: 2,
            seed: Some(1),
            ..Default::default()
        },
        2000,
    );
    assert_eq!(h[0] + h[2] + h[3], 0);
    // exp(3) : exp(2.9) = 0.525 : 0.475
    let f = h[1] as f32 / 2000.0;
    assert!((f - 0.525).abs() < 0.04, "{h:?}");
}

#[test]
fn top_p_keeps_smallest_prefix_reaching_mass() {
    // probs ≈ [0.05, 0.37, 0.14, 0.03, 0.34]: top_p 0.5 keeps tokens 1 and 4.
    let h = draw_many(
        SamplingParams {
            top_p: 0.5,
            seed: Some(3),
            ..Default::default()
        },
        1000,
    );
    assert_eq!(h[0] + h[2] + h[3], 0, "{h:?}");
    assert!(h[1] > 0 && h[4] > 0);
}

#[test]
fn min_p_drops_unlikely_tokens() {
    // relative to exp(3): token 2 is e^-1 = 0.37, token 0 is e^-2 = 0.14.
    let h = draw_many(
        SamplingParams {
            min_p: 0.3,
            seed: Some(5),
            ..Default::default()
        },
        1000,
    );
    assert_eq!(h[0] + h[3], 0, "{h:?}");
    assert!(h[2] > 0);
}

#[test]
fn seed_makes_sampling_reproducible_and_differs_between_seeds() {
    let run = |seed| {
        let mut s = Sampler::new(SamplingParams {
            seed: Some(seed),
            ..Default::default()
        })
        .unwrap();
        (0..64)
            .map(|_| s.sample(&mut logits(), &[], &[]))
            .collect::<Vec<_>>()
    };
    assert_eq!(run(7), run(7));
    assert_ne!(run(7), run(8));
}

#[test]
fn low_temperature_concentrates_high_temperature_spreads() {
    let cold = draw_many(
        SamplingParams {
            temperature: 0.01,
            seed: Some(1),
            ..Default::default()
        },
        500,
    );
    // exp(-0.1 / 0.01) = 4.5e-5: the runner-up is essentially never drawn.
    assert!(cold[1] >= 499, "{cold:?}");
    let hot = draw_many(
        SamplingParams {
            temperature: 5.0,
            seed: Some(1),
            ..Default::default()
        },
        2000,
    );
    assert!(hot.iter().all(|&c| c > 200), "{hot:?}");
}

#[test]
fn repetition_penalty_divides_positive_and_multiplies_negative() {
    let mut s = Sampler::new(SamplingParams {
        repetition_penalty: 2.0,
        ..SamplingParams::greedy()
    })
    .unwrap();
    let mut l = vec![4.0, -1.0, 3.0];
    assert_eq!(s.sample(&mut l, &[0, 1], &[0]), 2);
    assert_eq!(l, vec![2.0, -2.0, 3.0]);
}

#[test]
fn presence_and_frequency_penalties_count_output_only() {
    let mut s = Sampler::new(SamplingParams {
        presence_penalty: 0.5,
        frequency_penalty: 0.25,
        ..SamplingParams::greedy()
    })
    .unwrap();
    let mut l = vec![4.0, 4.0, 3.0];
    s.sample(&mut l, &[1, 1, 1], &[0, 0, 2]);
    assert_eq!(l, vec![4.0 - 0.5 - 0.5, 4.0, 3.0 - 0.5 - 0.25]);
}

#[test]
fn invalid_params_are_rejected_with_the_field_name() {
    for (p, name) in [
        (
            SamplingParams {
                temperature: -1.0,
                ..Default::default()
            },
            "temperature",
        ),
        (
            SamplingParams {
                top_p: 0.0,
                ..Default::default()
            },
            "top_p",
        ),
        (
            SamplingParams {
                top_p: 1.5,
                ..Default::default()
            },
            "top_p",
        ),
        (
            SamplingParams {
                min_p: 2.0,
                ..Default::default()
            },
            "min_p",
        ),
        (
            SamplingParams {
                repetition_penalty: 0.0,
                ..Default::default()
            },
            "repetition_penalty",
        ),
        (
            SamplingParams {
                presence_penalty: 3.0,
                ..Default::default()
            },
            "presence_penalty",
        ),
        (
            SamplingParams {
                frequency_penalty: f32::NAN,
                ..Default::default()
            },
            "frequency_penalty",
        ),
    ] {
        let e = Sampler::new(p).err().expect("should fail").to_string();
        assert!(e.starts_with(name), "{e}");
    }
}

#[test]
fn logit_bias_moves_tokens_before_the_draw() {
    let logits = [1.0f32, 3.0, 2.0, 0.5];
    let greedy = |bias: Vec<(u32, f32)>| {
        let mut s = Sampler::new(SamplingParams {
            logit_bias: bias,
            ..SamplingParams::greedy()
        })
        .unwrap();
        s.sample(&mut logits.clone(), &[], &[])
    };
    assert_eq!(greedy(vec![]), 1);
    assert_eq!(greedy(vec![(3, 100.0)]), 3);
    assert_eq!(greedy(vec![(1, -100.0)]), 2);
    // -100 on every other token makes sampling deterministic, as OpenAI documents.
    let mut s = Sampler::new(SamplingParams {
        temperature: 1.0,
        seed: Some(3),
        logit_bias: vec![(0, -100.0), (1, -100.0), (3, -100.0)],
        ..SamplingParams::default()
    })
    .unwrap();
    assert!((0..50).all(|_| s.sample(&mut logits.clone(), &[], &[]) == 2));
    assert!(Sampler::new(SamplingParams {
        logit_bias: vec![(0, 101.0)],
        ..SamplingParams::default()
    })
    .is_err());
}

#[test]
fn allowed_token_ids_mask_every_other_token() {
    let logits = [1.0f32, 3.0, 2.0, 0.5, 2.5];
    // Greedy picks the best allowed token, not the best token.
    let mut s = Sampler::new(SamplingParams {
        allowed_token_ids: Some(vec![3, 2]),
        ..SamplingParams::greedy()
    })
    .unwrap();
    assert_eq!(s.sample(&mut logits.clone(), &[], &[]), 2);
    // Sampling at a high temperature, with penalties, never leaves the set.
    let mut s = Sampler::new(SamplingParams {
        temperature: 5.0,
        seed: Some(11),
        repetition_penalty: 1.5,
        frequency_penalty: 1.0,
        allowed_token_ids: Some(vec![0, 3]),
        ..SamplingParams::default()
    })
    .unwrap();
    let drawn: std::collections::HashSet<u32> = (0..200)
        .map(|_| s.sample(&mut logits.clone(), &[1, 3], &[3]))
        .collect();
    assert_eq!(drawn, [0, 3].into_iter().collect());
}
