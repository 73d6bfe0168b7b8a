//! One layer's attention block in plain f32 over whole calibration windows: what AWQ
//! measures the Q/K/V scale search on (AutoAWQ's `module2inspect = self_attn`). The
//! weights are in Hugging Face layout, so RoPE rotates pairs `(i, i + head_dim/2)`.

use pagellm_kernels::ops::rope::{RopeStyle, RopeTable};
use pagellm_kernels::ops::softmax;
use pagellm_kernels::pool::ThreadPool;

use crate::awq::matmul_f32;

/// The attention geometry of a decoder layer.
#[derive(Debug, Clone, Copy)]
pub struct AttnGeom {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub rope_theta: f32,
}

/// The parts of the block that stay float while Q, K and V are searched.
pub struct AttnBlock<'a> {
    pub geom: AttnGeom,
    /// Q, K and V biases (qwen2 has them).
    pub bias: [Option<&'a [f32]>; 3],
    /// The output projection, `(d_model, n_heads · head_dim)`.
    pub o_proj: &'a [f32],
    pub d_model: usize,
}

impl AttnBlock<'_> {
    /// The block's output (before the residual add) for `n_seq` independent sequences
    /// of `len` tokens each in `x` (`(n_seq · len, d_model)`, the normed inputs), with
    /// the given Q, K and V weights.
    pub fn forward(
        &self,
        pool: &ThreadPool,
        x: &[f32],
        n_seq: usize,
        len: usize,
        [wq, wk, wv]: [&[f32]; 3],
    ) -> Vec<f32> {
        let g = self.geom;
        let (d, hd) = (self.d_model, g.head_dim);
        let (qd, kvd) = (g.n_heads * hd, g.n_kv_heads * hd);
        let n = n_seq * len;
        let proj = |w: &[f32], rows: usize, bias: Option<&[f32]>| {
            let mut y = matmul_f32(pool, x, n, w, rows, d);
            if let Some(b) = bias {
                for row in y.chunks_exact_mut(rows) {
                    row.iter_mut().zip(b).for_each(|(a, b)| *a += b);
                }
            }
            y
        };
        let mut q = proj(wq, qd, self.bias[0]);
        let mut k = proj(wk, kvd, self.bias[1]);
        let v = proj(wv, kvd, self.bias[2]);
        let mut rope = RopeTable::new(hd, g.rope_theta, RopeStyle::Neox);
        rope.ensure(len);
        let positions: Vec<usize> = (0..n).map(|t| t % len).collect();
        rope.apply(&mut q, g.n_heads, &positions);
        rope.apply(&mut k, g.n_kv_heads, &positions);

        let per_kv = g.n_heads / g.n_kv_heads;
        let scale = 1.0 / (hd as f32).sqrt();
        let mut attn = vec![0f32; n * qd];
        for s in 0..n_seq {
            let rows = s * len..(s + 1) * len;
            for kh in 0..g.n_kv_heads {
                // The query heads sharing this KV head, stacked: (per_kv · len, hd).
                let mut qs = Vec::with_capacity(per_kv * len * hd);
                for h in kh * per_kv..(kh + 1) * per_kv {
                    for t in rows.clone() {
                        qs.extend_from_slice(&q[t * qd + h * hd..t * qd + (h + 1) * hd]);
                    }
                }
                let ks: Vec<f32> = rows
                    .clone()
                    .flat_map(|t| k[t * kvd + kh * hd..t * kvd + (kh + 1) * hd].to_vec())
                    .collect();
                let mut vt = vec![0f32; hd * len];
                for (j, t) in rows.clone().enumerate() {
                    for e in 0..hd {
                        vt[e * len + j] = v[t * kvd + kh * hd + e];
                    }
                }
                let mut p = matmul_f32(pool, &qs, per_kv * len, &ks, len, hd);
                for (r, row) in p.chunks_exact_mut(len).enumerate() {
                    let t = r % len;
                    row.iter_mut().for_each(|a| *a *= scale);
                    softmax(&mut row[..=t]);
                    row[t + 1..].fill(0.0);
                }
                let o = matmul_f32(pool, &p, per_kv * len, &vt, hd, len);
                for (r, head_out) in o.chunks_exact(hd).enumerate() {
                    let (h, t) = (kh * per_kv + r / len, s * len + r % len);
                    attn[t * qd + h * hd..t * qd + (h + 1) * hd].copy_from_slice(head_out);
                }
            }
        }
        matmul_f32(pool, &attn, n, self.o_proj, d, qd)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The same block written the obvious way, one query at a time.
    fn naive(b: &AttnBlock<'_>, x: &[f32], n_seq: usize, len: usize, w: [&[f32]; 3]) -> Vec<f32> {
        let g = b.geom;
        let (d, hd) = (b.d_model, g.head_dim);
        let lin = |w: &[f32], bias: Option<&[f32]>, xr: &[f32]| -> Vec<f32> {
            w.chunks_exact(xr.len())
                .enumerate()
                .map(|(r, wr)| {
                    wr.iter().zip(xr).map(|(a, b)| a * b).sum::<f32>() + bias.map_or(0.0, |b| b[r])
                })
                .collect()
        };
        let rot = |v: &mut [f32], pos: usize| {
            let half = hd / 2;
            for head in v.chunks_exact_mut(hd) {
                for i in 0..half {
                    let th = pos as f32 * g.rope_theta.powf(-2.0 * i as f32 / hd as f32);
                    let (a, c) = (head[i], head[i + half]);
                    head[i] = a * th.cos() - c * th.sin();
                    head[i + half] = a * th.sin() + c * th.cos();
                }
            }
        };
        let mut out = Vec::new();
        for s in 0..n_seq {
            let xs = |t: usize| &x[(s * len + t) * d..(s * len + t + 1) * d];
            let mut ks = Vec::new();
            let mut vs = Vec::new();
            for t in 0..len {
                let mut k = lin(w[1], b.bias[1], xs(t));
                rot(&mut k, t);
                ks.push(k);
                vs.push(lin(w[2], b.bias[2], xs(t)));
            }
            for t in 0..len {
                let mut q = lin(w[0], b.bias[0], xs(t));
                rot(&mut q, t);
                let mut a = vec![0f32; g.n_heads * hd];
                for h in 0..g.n_heads {
                    let kh = h / (g.n_heads / g.n_kv_heads);
                    let qh = &q[h * hd..(h + 1) * hd];
                    let sc: Vec<f32> = (0..=t)
                        .map(|j| {
                            qh.iter()
                                .zip(&ks[j][kh * hd..(kh + 1) * hd])
                                .map(|(a, b)| a * b)
                                .sum::<f32>()
                                / (hd as f32).sqrt()
                        })
                        .collect();
                    let m = sc.iter().copied().fold(f32::MIN, f32::max);
                    let e: Vec<f32> = sc.iter().map(|v| (v - m).exp()).collect();
                    let z: f32 = e.iter().sum();
                    for (j, ej) in e.iter().enumerate() {
                        for i in 0..hd {
                            a[h * hd + i] += ej / z * vs[j][kh * hd + i];
                        }
                    }
                }
                out.extend(lin(b.o_proj, None, &a));
            }
        }
        out
    }

    #[test]
    fn forward_matches_a_naive_attention() {
        let geom = AttnGeom {
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 8,
            rope_theta: 10_000.0,
        };
        let d = 12;
        let (qd, kvd) = (32, 16);
        let mut seed = 7u32;
        let mut rnd = |n: usize| -> Vec<f32> {
            (0..n)
                .map(|_| {
                    seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    (seed >> 8) as f32 / (1u32 << 24) as f32 - 0.5
                })
                .collect()
        };
        let (wq, wk, wv, wo) = (rnd(qd * d), rnd(kvd * d), rnd(kvd * d), rnd(d * qd));
        let (bq, bk, bv) = (rnd(qd), rnd(kvd), rnd(kvd));
        let x = rnd(2 * 5 * d);
        let block = AttnBlock {
            geom,
            bias: [Some(&bq), Some(&bk), Some(&bv)],
            o_proj: &wo,
            d_model: d,
        };
        let pool = ThreadPool::new(2);
        let got = block.forward(&pool, &x, 2, 5, [&wq, &wk, &wv]);
        let want = naive(&block, &x, 2, 5, [&wq, &wk, &wv]);
        assert_eq!(got.len(), want.len());
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert!((a - b).abs() < 1e-4, "element {i}: {a} vs {b}");
        }
    }
}
