//! GPTQ (Frantar et al., 2022), as GPTQ's reference code and GPTQModel run it: each
//! linear layer's weight is quantized column by column, and each column's rounding
//! error is spread over the columns not yet quantized, weighted by the inverse Hessian
//! of the layer's calibration inputs.
//!
//! * Hessian `H = 2/n · XᵀX` over the `n` calibration tokens of the layer's input (Q, K
//!   and V share one, as do gate and up). Dead inputs (`H_ii = 0`) get `H_ii = 1` and a
//!   zero weight column.
//! * Act order (`desc_act`): columns are taken by decreasing `H_ii`; the groups are then
//!   contiguous in that order, which is the order the weight is stored in (`perm`).
//! * Dampening `λ = damp · mean(diag H)` on the diagonal (GPTQ's `percdamp`, 0.01),
//!   raised tenfold while `H` is not positive definite.
//! * `U`, the upper Cholesky factor of `H⁻¹` (`cholesky`, `cholesky_inverse`, `cholesky
//!   upper=True` in GPTQ's code), then blocks of 128 columns: inside a block, column `i`
//!   is quantized with its group's parameters, its error `(w − q) / U_ii` is subtracted
//!   from the block's later columns along `U_i,·`; after the block, the block's errors
//!   update every later column in one product.
//! * Group parameters: GPTQ's quantizer (range widened to include 0; symmetric `scale =
//!   amax / 7.5`, zero 8; asymmetric `scale = (max − min) / 15`, `zero = round(−min /
//!   scale)`) on the group's columns as they stand when its first column comes up.
//!   Scales are rounded up to f16, the dtype GPTQ checkpoints store them in, and
//!   asymmetric zero points are kept in 1..=15 because GPTQ's format stores `zero − 1`.
//!
//! Linear algebra (the Hessian product, Cholesky factorizations, the inverse and the
//! block updates) runs in `faer`.

use faer::linalg::matmul::matmul;
use faer::linalg::solvers::DenseSolveCore;
use faer::{Accum, Mat, MatMut, MatRef, Par, Side};

use pagellm_kernels::quant::{ActQuant, GgmlType, QuantParams};

use crate::error::{QuantError, Result};
use crate::rtn::{int4_quant, pack_u4, round, snap_f16, QWeight};

/// Options of the GPTQ solve.
#[derive(Debug, Clone)]
pub struct GptqOptions {
    pub group_size: usize,
    /// Zero points (asymmetric) instead of symmetric.
    pub zero_point: bool,
    /// Quantize columns by decreasing Hessian diagonal (`desc_act`).
    pub act_order: bool,
    /// Dampening as a fraction of the mean Hessian diagonal.
    pub damp: f32,
}

/// Columns updated together (GPTQ's `blocksize`).
const BLOCK: usize = 128;

fn par(threads: usize) -> Par {
    if threads > 1 {
        Par::rayon(threads)
    } else {
        Par::Seq
    }
}

/// `H = 2/n · XᵀX` of the inputs `x` (`tokens × cols`, row-major).
pub fn hessian(x: &[f32], tokens: usize, cols: usize, threads: usize) -> Mat<f32> {
    let xm = MatRef::from_row_major_slice(x, tokens, cols);
    let mut h = Mat::zeros(cols, cols);
    matmul(
        h.as_mut(),
        Accum::Replace,
        xm.transpose(),
        xm,
        2.0 / tokens.max(1) as f32,
        par(threads),
    );
    h
}

/// GPTQ's group parameters: `(scale, zero)` of a group spanning `[min, max]`.
fn group_params(min: f32, max: f32, zero_point: bool) -> (f32, u8) {
    let (lo, hi) = (min.min(0.0), max.max(0.0));
    if zero_point {
        if hi - lo <= 0.0 {
            return (1.0, 8);
        }
        let s = snap_f16((hi - lo) / 15.0);
        (s, round(-lo / s).clamp(1.0, 15.0) as u8)
    } else {
        let amax = lo.abs().max(hi);
        if amax <= 0.0 {
            return (1.0, 8);
        }
        (snap_f16(amax / 7.5), 8)
    }
}

/// The upper Cholesky factor `U` of `(H + λI)⁻¹` (so `(H + λI)⁻¹ = UᵀU`), with `λ`
/// raised tenfold until `H + λI` factors.
fn inverse_factor(h: &Mat<f32>, damp: f32, what: &str) -> Result<Mat<f32>> {
    let n = h.nrows();
    let mean = (0..n).map(|i| h[(i, i)] as f64).sum::<f64>() / n.max(1) as f64;
    let mut frac = damp as f64;
    while frac <= 10.0 {
        let mut hd = h.clone();
        for i in 0..n {
            hd[(i, i)] += (frac * mean) as f32;
        }
        if let Ok(l) = hd.llt(Side::Lower) {
            let inv = l.inverse();
            if let Ok(l2) = inv.llt(Side::Lower) {
                return Ok(l2.L().transpose().to_owned());
            }
        }
        frac *= 10.0;
    }
    Err(QuantError::Invalid(format!(
        "{what}: the calibration Hessian stays singular even with heavy dampening; \
         give more or different --calib text"
    )))
}

/// GPTQ of one weight (`rows × cols`, row-major) with the Hessian `h` of its input. The
/// result is stored in act order when `o.act_order` (its `params.perm` set).
pub fn quantize(
    w: &[f32],
    rows: usize,
    cols: usize,
    h: &Mat<f32>,
    o: &GptqOptions,
    threads: usize,
    what: &str,
) -> Result<QWeight> {
    let g = o.group_size;
    assert!(cols.is_multiple_of(g), "checked by quantize::check");
    let mut h = h.clone();
    // The weight column-major, in the order columns are quantized.
    let mut wc = vec![0f32; rows * cols];
    for (r, row) in w.chunks_exact(cols).enumerate() {
        for (c, &v) in row.iter().enumerate() {
            wc[c * rows + r] = v;
        }
    }
    for i in 0..cols {
        if h[(i, i)] == 0.0 {
            h[(i, i)] = 1.0;
            wc[i * rows..(i + 1) * rows].fill(0.0);
        }
    }
    let perm: Option<Vec<u32>> = o.act_order.then(|| {
        let mut p: Vec<u32> = (0..cols as u32).collect();
        // Stable: equal diagonals keep input order, so inputs sharing a Hessian (Q, K
        // and V; gate and up) get one order.
        p.sort_by(|&a, &b| h[(b as usize, b as usize)].total_cmp(&h[(a as usize, a as usize)]));
        p
    });
    if let Some(p) = &perm {
        let src = wc.clone();
        for (j, &c) in p.iter().enumerate() {
            let c = c as usize;
            wc[j * rows..(j + 1) * rows].copy_from_slice(&src[c * rows..(c + 1) * rows]);
        }
        h = Mat::from_fn(cols, cols, |i, j| h[(p[i] as usize, p[j] as usize)]);
    }
    let u = inverse_factor(&h, o.damp, what)?;
    drop(h);

    let ng = cols / g;
    let mut codes = vec![0u8; rows * cols];
    let mut scales = vec![0f32; rows * ng];
    let mut zeros = vec![8u8; rows * ng];
    // A block holds whole groups, so a group's columns are all inside the block when
    // its parameters are taken.
    let block = g * BLOCK.div_ceil(g);
    let mut err = vec![0f32; rows * block];
    let mut i1 = 0;
    while i1 < cols {
        let i2 = (i1 + block).min(cols);
        let count = i2 - i1;
        for i in 0..count {
            let col = i1 + i;
            if col.is_multiple_of(g) {
                let gi = col / g;
                for r in 0..rows {
                    let (mut min, mut max) = (f32::MAX, f32::MIN);
                    for c in col..col + g {
                        let v = wc[c * rows + r];
                        min = min.min(v);
                        max = max.max(v);
                    }
                    let (s, z) = group_params(min, max, o.zero_point);
                    scales[r * ng + gi] = s;
                    zeros[r * ng + gi] = z;
                }
            }
            let gi = col / g;
            let d = u[(col, col)];
            let (done, rest) = wc.split_at_mut((col + 1) * rows);
            let wcol = &done[col * rows..];
            let ecol = &mut err[i * rows..(i + 1) * rows];
            for r in 0..rows {
                let (s, z) = (scales[r * ng + gi], zeros[r * ng + gi]);
                let q = int4_quant(wcol[r], s, z);
                codes[r * cols + col] = q;
                ecol[r] = (wcol[r] - (q as f32 - z as f32) * s) / d;
            }
            for j in i + 1..count {
                let hij = u[(col, i1 + j)];
                let dst = &mut rest[(j - i - 1) * rows..(j - i) * rows];
                for (a, e) in dst.iter_mut().zip(ecol.iter()) {
                    *a -= e * hij;
                }
            }
        }
        if i2 < cols {
            let e = MatRef::from_column_major_slice(&err[..rows * count], rows, count);
            let later = MatMut::from_column_major_slice_mut(&mut wc[i2 * rows..], rows, cols - i2);
            matmul(
                later,
                Accum::Add,
                e,
                u.as_ref().submatrix(i1, i2, count, cols - i2),
                -1.0,
                par(threads),
            );
        }
        i1 = i2;
    }
    Ok(QWeight {
        ty: GgmlType::U4,
        rows,
        cols,
        data: pack_u4(&codes),
        params: QuantParams {
            group: g,
            scales,
            zeros: o.zero_point.then_some(zeros),
            act: ActQuant::Block32,
            perm,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use pagellm_kernels::quant::wq::dequantize_row_wq;
    use rand::{Rng, SeedableRng};

    fn deq(q: &QWeight) -> Vec<f32> {
        let rb = q.ty.row_bytes(q.cols).unwrap();
        let mut out = vec![0f32; q.rows * q.cols];
        for r in 0..q.rows {
            dequantize_row_wq(
                q.ty,
                &q.params,
                r,
                &q.data[r * rb..(r + 1) * rb],
                &mut out[r * q.cols..(r + 1) * q.cols],
            );
        }
        out
    }

    /// Output error `Σ_t |x_t · (w − ŵ)ᵀ|²` over the calibration rows.
    fn out_err(x: &[f32], n: usize, cols: usize, w: &[f32], wq: &[f32]) -> f64 {
        let rows = w.len() / cols;
        let mut e = 0.0;
        for t in 0..n {
            let xt = &x[t * cols..(t + 1) * cols];
            for r in 0..rows {
                let d: f64 = (0..cols)
                    .map(|c| xt[c] as f64 * (w[r * cols + c] - wq[r * cols + c]) as f64)
                    .sum();
                e += d * d;
            }
        }
        e
    }

    /// On correlated inputs with uneven channel scales, GPTQ's output error is well
    /// below round-to-nearest's with the same groups, with and without act order, and
    /// act order changes only the storage order (the product is taken in input order).
    #[test]
    fn beats_round_to_nearest_on_correlated_inputs() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let (rows, cols, n) = (16, 128, 512);
        let w: Vec<f32> = (0..rows * cols)
            .map(|_| rng.gen_range(-1f32..1.0))
            .collect();
        // Eight latent factors shared by every group of eight inputs, plus noise, with
        // channel magnitudes from 1 to 5.
        let mut x = Vec::with_capacity(n * cols);
        for _ in 0..n {
            let base: Vec<f32> = (0..8).map(|_| rng.gen_range(-1f32..1.0)).collect();
            for c in 0..cols {
                let noise = rng.gen_range(-0.2f32..0.2);
                x.push((base[c % 8] + noise) * (1.0 + (c % 5) as f32));
            }
        }
        let h = hessian(&x, n, cols, 1);
        let rtn = crate::rtn::int4_rtn(&w, rows, cols, 32, true);
        let e_rtn = out_err(&x, n, cols, &w, &deq(&rtn));
        for act_order in [false, true] {
            let o = GptqOptions {
                group_size: 32,
                zero_point: true,
                act_order,
                damp: 0.01,
            };
            let q = quantize(&w, rows, cols, &h, &o, 1, "test").unwrap();
            q.params.check(q.ty, rows, cols).unwrap();
            assert_eq!(q.params.perm.is_some(), act_order);
            let e = out_err(&x, n, cols, &w, &deq(&q));
            assert!(
                e < 0.6 * e_rtn,
                "act order {act_order}: GPTQ {e} vs RTN {e_rtn}"
            );
        }
    }

    #[test]
    fn group_params_keep_zero_minus_one_storable() {
        // An all-positive group would get zero 0; GPTQ's format stores zero − 1.
        let (s, z) = group_params(0.5, 1.5, true);
        assert_eq!(z, 1);
        assert!(s >= 0.1);
        assert_eq!(group_params(-0.75, 0.5, false), (snap_f16(0.1), 8));
    }
}
