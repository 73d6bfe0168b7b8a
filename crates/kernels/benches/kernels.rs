//! Kernel micro-benchmarks: quantized dot products (one weight row against one or
//! four activation rows) at the row lengths of the test models, on each of llama.cpp's
//! paths for the K-quants, activation quantization, whole matmuls and one layer's
//! attention. Throughput is in bytes of weights (of f32 input for the
//! quantizer). Each iteration takes the next of 64 rows so the weights come from L1/L2
//! like in a tiled matmul, not from one hot row.

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use pagellm_kernels::matmul::{matmul, Activations, WeightRef};
use pagellm_kernels::pool::ThreadPool;
use pagellm_kernels::quant::interleave::Interleaved;
use pagellm_kernels::quant::{
    dot_kernel, dot_kernel_ref, quantize_row_q8, quantize_row_q8_ref, quantize_row_q8k,
    quantize_row_q8k_ref, ActQuant, BlockQ8, BlockQ8K, DotKernel, GgmlType, QuantParams,
};
use rand::{Rng, SeedableRng};

const ROWS: usize = 64;

/// Random weight rows of `ty`: random bytes with small finite f16 scales.
fn weights(ty: GgmlType, cols: usize, rng: &mut impl Rng) -> Vec<u8> {
    let rb = ty.row_bytes(cols).expect("whole blocks");
    let mut w: Vec<u8> = (0..rb * ROWS).map(|_| rng.gen()).collect();
    let fields: &[usize] = match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q6_K => &[208],
        _ => unreachable!("quantized types only"),
    };
    for blk in w.chunks_exact_mut(ty.block_bytes()) {
        for &f in fields {
            let v = half::f16::from_f32(rng.gen_range(-0.05..0.05));
            blk[f..f + 2].copy_from_slice(&v.to_le_bytes());
        }
    }
    w
}

/// Row lengths: SmolLM2-135M's 576 and 1536; K-quant rows need whole 256-element
/// super-blocks, so they use 1536 and Qwen2.5-0.5B's ffn_down length 4864 instead.
fn bench_cols(ty: GgmlType) -> [usize; 2] {
    if ty.block_elems() == 256 {
        [1536, 4864]
    } else {
        [576, 1536]
    }
}

/// Quantized activation rows in the format kernel `k` consumes.
enum Acts {
    Q8(Vec<BlockQ8>),
    Q8K(Vec<BlockQ8K>),
}

fn activations(k: DotKernel, cols: usize, n: usize, rng: &mut impl Rng) -> Acts {
    let x: Vec<f32> = (0..cols * n).map(|_| rng.gen_range(-2.0..2.0)).collect();
    match k {
        DotKernel::Q8(_) => {
            let mut q = vec![BlockQ8::default(); x.len() / 32];
            quantize_row_q8_ref(&x, &mut q);
            Acts::Q8(q)
        }
        DotKernel::Q8K(_) => {
            let mut q = vec![BlockQ8K::default(); x.len() / 256];
            quantize_row_q8k_ref(&x, &mut q);
            Acts::Q8K(q)
        }
        DotKernel::F32(_) | DotKernel::U4(_) => unreachable!("GGML block types only"),
    }
}

fn bench_dot(c: &mut Criterion) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    let types = [
        GgmlType::Q4_1,
        GgmlType::Q8_0,
        GgmlType::Q5_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
    ];
    for (kind, pick) in [
        ("dot", dot_kernel as fn(GgmlType) -> DotKernel),
        ("dot_ref", dot_kernel_ref),
    ] {
        let mut g = c.benchmark_group(kind);
        for ty in types {
            // The scalar twins are for comparison only; keep their run short.
            if kind == "dot_ref" && !matches!(ty, GgmlType::Q4_1 | GgmlType::Q8_0) {
                continue;
            }
            {
                let k = pick(ty);
                for cols in bench_cols(ty) {
                    let w = weights(ty, cols, &mut rng);
                    let rb = ty.row_bytes(cols).unwrap();
                    for n_act in [1, 4] {
                        let acts = activations(k, cols, n_act, &mut rng);
                        g.throughput(Throughput::Bytes(rb as u64));
                        g.bench_with_input(
                            BenchmarkId::new(format!("{}/n{n_act}", ty.name()), cols),
                            &cols,
                            |b, _| {
                                let mut r = 0;
                                let mut out = [0f32; 4];
                                b.iter(|| {
                                    r = (r + 1) % ROWS;
                                    let row = black_box(&w[r * rb..(r + 1) * rb]);
                                    match (k, &acts) {
                                        (DotKernel::Q8(f), Acts::Q8(a)) => {
                                            f(row, black_box(a), n_act, &mut out)
                                        }
                                        (DotKernel::Q8K(f), Acts::Q8K(a)) => {
                                            f(row, black_box(a), n_act, &mut out)
                                        }
                                        _ => unreachable!(),
                                    }
                                    black_box(out)
                                })
                            },
                        );
                    }
                }
            }
        }
        g.finish();
    }
}

fn bench_quantize(c: &mut Criterion) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut g = c.benchmark_group("quantize_row_q8");
    for cols in [576, 1536] {
        let x: Vec<f32> = (0..cols).map(|_| rng.gen_range(-2.0..2.0)).collect();
        let mut q = vec![BlockQ8::default(); cols / 32];
        g.throughput(Throughput::Bytes(4 * cols as u64));
        g.bench_with_input(BenchmarkId::new("fast", cols), &cols, |b, _| {
            b.iter(|| quantize_row_q8(black_box(&x), black_box(&mut q)))
        });
        g.bench_with_input(BenchmarkId::new("ref", cols), &cols, |b, _| {
            b.iter(|| quantize_row_q8_ref(black_box(&x), black_box(&mut q)))
        });
    }
    g.finish();
    let mut g = c.benchmark_group("quantize_row_q8k");
    for cols in [1536, 4864] {
        let x: Vec<f32> = (0..cols).map(|_| rng.gen_range(-2.0..2.0)).collect();
        let mut q = vec![BlockQ8K::default(); cols / 256];
        g.throughput(Throughput::Bytes(4 * cols as u64));
        g.bench_with_input(BenchmarkId::new("fast", cols), &cols, |b, _| {
            b.iter(|| quantize_row_q8k(black_box(&x), black_box(&mut q)))
        });
        g.bench_with_input(BenchmarkId::new("ref", cols), &cols, |b, _| {
            b.iter(|| quantize_row_q8k_ref(black_box(&x), black_box(&mut q)))
        });
    }
    g.finish();
}

/// Whole single-threaded matmuls at SmolLM2-135M's shapes with 64 activation rows
/// (batched decoding of 64 sequences): attention (576x576) and FFN gate/up (1536x576).
/// Throughput is in bytes of weights.
fn bench_matmul(c: &mut Criterion) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let pool = ThreadPool::new(1);
    let mut g = c.benchmark_group("matmul");
    g.sample_size(30);
    const N: usize = 64;
    for ty in [GgmlType::Q4_1, GgmlType::Q8_0] {
        for (w_rows, cols) in [(1536, 576), (576, 576)] {
            let rb = ty.row_bytes(cols).unwrap();
            // `weights` makes ROWS rows; repeat them to the full height.
            let base = weights(ty, cols, &mut rng);
            let data: Vec<u8> = base.iter().copied().cycle().take(rb * w_rows).collect();
            let w = WeightRef::plain(ty, &data, w_rows, cols);
            let mut x = Activations::new();
            for v in x.reset(N, cols) {
                *v = rng.gen_range(-2.0..2.0);
            }
            let mut out = vec![0f32; N * w_rows];
            g.throughput(Throughput::Bytes((rb * w_rows) as u64));
            g.bench_function(format!("{}/{w_rows}x{cols}/n{N}", ty.name()), |b| {
                b.iter(|| matmul(&pool, &mut x, w, black_box(&mut out)))
            });
        }
    }
    g.finish();
}

/// Prompt processing: whole single-threaded matmuls of 128 activation rows (one pp128
/// chunk) with the weights as the engine holds them (interleaved where the type has a
/// layout for it): SmolLM2-135M's FFN up (1536x576, Q4_1) and Qwen2.5-1.5B's attention
/// output (1536x1536, Q4_K) and FFN down (1536x8960, Q6_K), with rows cut to 1536.
/// Throughput is in bytes of weights.
fn bench_prefill(c: &mut Criterion) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(17);
    let pool = ThreadPool::new(1);
    let mut g = c.benchmark_group("prefill");
    g.sample_size(20);
    for (ty, cols) in [
        (GgmlType::Q4_1, 576),
        (GgmlType::Q4_K, 1536),
        (GgmlType::Q6_K, 8960),
    ] {
        bench_packed(&mut g, &pool, &mut rng, ty, 1536, cols, 128);
    }
    g.finish();
}

/// One benchmark of `g`: a whole matmul of `n` random activation rows against `w_rows`
/// rows of `ty` held as the engine holds them (interleaved where the type has a layout
/// for it). Throughput is in bytes of weights.
fn bench_packed(
    g: &mut criterion::BenchmarkGroup<criterion::measurement::WallTime>,
    pool: &ThreadPool,
    rng: &mut impl Rng,
    ty: GgmlType,
    w_rows: usize,
    cols: usize,
    n: usize,
) {
    let rb = ty.row_bytes(cols).unwrap();
    let base = weights(ty, cols, rng);
    let data: Vec<u8> = base.iter().copied().cycle().take(rb * w_rows).collect();
    let packed = Interleaved::repack(ty, &data, w_rows, cols);
    let w = WeightRef {
        packed: packed.as_ref(),
        ..WeightRef::plain(ty, &data, w_rows, cols)
    };
    let mut x = Activations::new();
    for v in x.reset(n, cols) {
        *v = rng.gen_range(-2.0..2.0);
    }
    let mut out = vec![0f32; n * w_rows];
    g.throughput(Throughput::Bytes((rb * w_rows) as u64));
    g.bench_function(format!("{}/{w_rows}x{cols}/n{n}", ty.name()), |b| {
        b.iter(|| matmul(pool, &mut x, w, black_box(&mut out)))
    });
}

/// Decoding: one activation row against about 64 MB of interleaved weights, twice the
/// L3 of the machines in BENCHMARKS.md, so the weights stream from memory as they do in
/// a decode step; two threads, as the end-to-end benchmarks run. Throughput is in bytes
/// of weights: compare it with the machine's read bandwidth.
fn bench_decode(c: &mut Criterion) {
    decode_group(c, "decode", 2, 64 << 20, 20);
}

/// The decode kernels' compute rate: one activation row against about 256 KB of
/// interleaved weights, which stay in L2 across iterations, on one thread. Where this
/// is not well above `decode/`'s rate per thread, a kernel's arithmetic, not memory,
/// bounds a decode step.
fn bench_decode_cached(c: &mut Criterion) {
    decode_group(c, "decode_cached", 1, 256 << 10, 30);
}

/// One activation row against about `bytes` of each decode-shaped weight type.
fn decode_group(c: &mut Criterion, name: &str, threads: usize, bytes: usize, samples: usize) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(19);
    let pool = ThreadPool::new(threads);
    let mut g = c.benchmark_group(name);
    g.sample_size(samples);
    for (ty, cols) in [
        (GgmlType::Q4_1, 576),
        (GgmlType::Q8_0, 576),
        (GgmlType::Q4_K, 1536),
        (GgmlType::Q6_K, 1536),
    ] {
        let w_rows = bytes / ty.row_bytes(cols).unwrap() / 16 * 16;
        bench_packed(&mut g, &pool, &mut rng, ty, w_rows, cols, 1);
    }
    g.finish();
}

/// Decoding through a small model: 300 different 576x576 Q4_1 weights (SmolLM2-135M's
/// attention shape, 207 KB each, 62 MB in all, in one buffer) one after the other, one
/// activation row, two threads. Each call streams a short run from memory, so this
/// measures what a call costs beyond the bytes (its start-up, the pool's hand-off and
/// the hardware prefetcher's ramp); `empty_run` is the pool's hand-off alone, 300 times.
fn bench_decode_small(c: &mut Criterion) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(23);
    let pool = ThreadPool::new(2);
    let mut g = c.benchmark_group("decode_small");
    g.sample_size(20);
    let (ty, cols, w_rows) = (GgmlType::Q4_1, 576, 576);
    let rb = ty.row_bytes(cols).unwrap();
    let base = weights(ty, cols, &mut rng);
    let data: Vec<u8> = base.iter().copied().cycle().take(rb * w_rows).collect();
    // In one buffer on huge pages, as a model's repacked weights are held.
    let len = Interleaved::packed_len(ty, w_rows, cols).expect("repackable");
    let mut buf = pagellm_kernels::mem::zeroed_huge::<u8>(300 * len);
    for out in buf.chunks_exact_mut(len) {
        assert!(Interleaved::repack_into(
            ty,
            &data,
            w_rows,
            cols,
            out,
            |_| {}
        ));
    }
    let buf = std::sync::Arc::new(buf);
    let copies: Vec<Interleaved> = (0..300)
        .map(|i| Interleaved::in_buffer(ty, w_rows, cols, buf.clone(), i * len))
        .collect();
    let mut x = Activations::new();
    for v in x.reset(1, cols) {
        *v = rng.gen_range(-2.0..2.0);
    }
    let mut out = vec![0f32; w_rows];
    g.throughput(Throughput::Bytes((rb * w_rows * copies.len()) as u64));
    g.bench_function("Q4_1/576x576/n1/x300", |b| {
        b.iter(|| {
            for p in &copies {
                let w = WeightRef {
                    packed: Some(p),
                    ..WeightRef::plain(ty, &data, w_rows, cols)
                };
                matmul(&pool, &mut x, w, black_box(&mut out))
            }
        })
    });
    g.bench_function("empty_run/x300", |b| {
        b.iter(|| {
            for _ in 0..300 {
                pool.run(&|t, _| {
                    black_box(t);
                })
            }
        })
    });
    g.finish();
}

/// Whole single-threaded matmuls at Qwen2.5-0.5B's FFN shapes (gate 4864x896, down
/// 896x4864) for one and four activation rows: Q4_0 against the checkpoint INT4 format
/// (`U4`, group 128, with and without zero points), whose bytes are about the same.
fn bench_matmul_int4(c: &mut Criterion) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(13);
    let pool = ThreadPool::new(1);
    let mut g = c.benchmark_group("matmul_int4");
    g.sample_size(30);
    for (w_rows, cols) in [(4864, 896), (896, 4864)] {
        let q4_0 = weights(GgmlType::Q4_0, cols, &mut rng);
        let rb = GgmlType::Q4_0.row_bytes(cols).unwrap();
        let q4_0: Vec<u8> = q4_0.iter().copied().cycle().take(rb * w_rows).collect();
        let u4: Vec<u8> = (0..w_rows * cols / 2).map(|_| rng.gen()).collect();
        let n_groups = w_rows * cols / 128;
        let scales: Vec<f32> = (0..n_groups).map(|_| rng.gen_range(0.001..0.01)).collect();
        let zeros: Vec<u8> = (0..n_groups).map(|_| rng.gen_range(0..16)).collect();
        let sym = QuantParams {
            group: 128,
            scales,
            zeros: None,
            act: ActQuant::Block32,
            perm: None,
        };
        let asym = QuantParams {
            zeros: Some(zeros),
            ..sym.clone()
        };
        let ws = [
            (
                "Q4_0",
                WeightRef::plain(GgmlType::Q4_0, &q4_0, w_rows, cols),
            ),
            (
                "U4",
                WeightRef {
                    params: Some(&sym),
                    ..WeightRef::plain(GgmlType::U4, &u4, w_rows, cols)
                },
            ),
            (
                "U4_zp",
                WeightRef {
                    params: Some(&asym),
                    ..WeightRef::plain(GgmlType::U4, &u4, w_rows, cols)
                },
            ),
        ];
        for n in [1, 4] {
            let mut x = Activations::new();
            for v in x.reset(n, cols) {
                *v = rng.gen_range(-2.0..2.0);
            }
            let mut out = vec![0f32; n * w_rows];
            for (name, w) in ws {
                g.throughput(Throughput::Bytes((w_rows * cols / 2) as u64));
                g.bench_function(format!("{name}/{w_rows}x{cols}/n{n}"), |b| {
                    b.iter(|| matmul(&pool, &mut x, w, black_box(&mut out)))
                });
            }
        }
    }
    g.finish();
}

/// One layer's attention for a decode step of 16 sequences with 256 cached positions
/// each, smollm2-135m's heads (9 query, 3 key/value, 64 wide), one thread; and the same
/// for a 128- and a 512-token prompt (the prompt-order summation).
fn bench_attention(c: &mut Criterion) {
    use half::f16;
    use pagellm_kernels::ops::attention::{attention, AttnSeq, AttnShape, ContiguousKv};
    let mut rng = rand::rngs::StdRng::seed_from_u64(12);
    let pool = ThreadPool::new(1);
    let shape = AttnShape {
        n_heads: 9,
        n_kv_heads: 3,
        head_dim: 64,
    };
    let mut g = c.benchmark_group("attention");
    g.sample_size(30);
    for (name, n_seqs, ctx, n_tokens) in [
        ("decode/16x256", 16, 256, 1),
        ("prefill/1x128", 1, 128, 128),
        ("prefill/1x512", 1, 512, 512),
    ] {
        let kv_len = ctx * shape.n_kv_heads * shape.head_dim;
        let k: Vec<f16> = (0..kv_len)
            .map(|_| f16::from_f32(rng.gen_range(-1.0..1.0)))
            .collect();
        let v: Vec<f16> = (0..kv_len)
            .map(|_| f16::from_f32(rng.gen_range(-1.0..1.0)))
            .collect();
        let seqs: Vec<AttnSeq<ContiguousKv>> = (0..n_seqs)
            .map(|i| AttnSeq {
                token0: i * n_tokens,
                pos0: ctx - n_tokens,
                n_tokens,
                decode_from: if n_tokens == 1 { 0 } else { ctx },
                kv: ContiguousKv {
                    k: &k,
                    v: &v,
                    n_kv_heads: shape.n_kv_heads,
                    head_dim: shape.head_dim,
                },
            })
            .collect();
        let rows = n_seqs * n_tokens * shape.n_heads * shape.head_dim;
        let q: Vec<f32> = (0..rows).map(|_| rng.gen_range(-2.0..2.0)).collect();
        let mut out = vec![0f32; rows];
        g.bench_function(name, |b| {
            b.iter(|| attention(&pool, shape, black_box(&q), &seqs, &mut out))
        });
    }
    g.finish();
}

criterion_group!(
    benches,
    bench_dot,
    bench_quantize,
    bench_matmul,
    bench_prefill,
    bench_decode,
    bench_decode_cached,
    bench_decode_small,
    bench_matmul_int4,
    bench_attention
);
criterion_main!(benches);
