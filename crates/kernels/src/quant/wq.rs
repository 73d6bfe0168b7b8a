//! The weight formats of quantized checkpoints (AWQ, GPTQ, compressed-tensors): scalar
//! definitions of their arithmetic.
//!
//! GGML formats carry their scales inside each block. The checkpoint formats keep them
//! beside the weight, so a weight here is its element data plus [`QuantParams`]:
//!
//! | type       | element data (row-major, `cols` per row)        | params                      |
//! |------------|-------------------------------------------------|-----------------------------|
//! | `I8`       | one `i8` per element                             | one scale per row           |
//! | `U4`       | two per byte, element `2j` in the low nibble of byte `j` | scale (and zero point) per group of `group` columns |
//! | `F8E4M3`   | one OCP E4M3 byte per element                    | one scale per row           |
//!
//! `U4`'s nibble order is compressed-tensors' `pack-quantized` order read as bytes
//! (an int32 holding eight values, value `k` at bits `4k`, little-endian), so those
//! checkpoints are used where they are mapped; AWQ's and GPTQ's int32 packings run
//! along other dimensions and are repacked into it once at load. A value is
//! `scale * (q - zero)`, with `zero = 8` for symmetric weights.
//!
//! Every kernel here is defined to the bit (the SIMD twins in `wq_avx2` reproduce it):
//!
//! * `I8` against [`BlockQ8`] activations: per 32-column chunk the exact integer lanes
//!   of `q · q_x` (the `lanes` of `dot_scalar`), multiplied into eight f32 lanes with
//!   `fma(lane, d_x, acc)`, then `hsum8`; the matmul driver applies the row scale once
//!   at the end (`· scale_row`).
//! * `U4` against [`BlockQ8`] activations, the zero point taken out once per group
//!   rather than from every weight (as ggml's Q4_1 does with its `m · s` term):
//!   `Σ_g scale_g · Σ_b d_b Σ_e q_e x_e  −  Σ_g scale_g · zero_g · Σ_b d_b Σ_e x_e`.
//!   Per group, eight f32 lanes start at zero and take `fma(lane, d_x, acc_g)` for each
//!   chunk's exact integer lanes of `q · q_x` (`q` the raw nibbles, 0..=15); then
//!   `acc = fma(acc_g, scale_g, acc)` lane by lane, and `corr = fma(scale_g · zero_g,
//!   m_g, corr)` with `m_g` the chunks' [`u4_act_sums`] added in order. The result is
//!   `hsum8(acc) − corr`. The activation sums are made once per activation row and
//!   shared by every weight, so the inner loop is unpack, `maddubs`, `madd`, convert
//!   and one FMA per chunk.
//! * `I8` against activations quantized per token (W8A8, [`quantize_row_i8_tok`]): the
//!   exact i32 sum of the whole row, converted to f32; the driver multiplies by the
//!   weight row's scale and then the token's.
//! * `F8E4M3` against f32 activations: 32 f32 lanes, lane `e % 32` accumulating
//!   `fma(w[e], x[e], acc)` in column order, reduced as `((l0 + l1) + (l2 + l3))` over
//!   the four 8-lane groups and then `hsum8`; the driver applies the row scale.

use super::dot_scalar::{fma_lanes, hsum8, lanes};
use super::{BlockQ8, GgmlType};

/// How the activations of an `I8` weight are quantized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActQuant {
    /// Per 32 values ([`BlockQ8`]): weight-only quantization, activations near f32.
    Block32,
    /// One scale per token (W8A8, as vLLM's dynamic per-token INT8 activations).
    PerToken,
}

/// The scales (and zero points) of an `I8`, `U4` or `F8E4M3` weight of `rows × cols`.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantParams {
    /// Columns per scale: `cols` for one scale per row.
    pub group: usize,
    /// `rows × cols / group` scales, row-major.
    pub scales: Vec<f32>,
    /// Zero points beside `scales` (`U4` only; `None` = symmetric, zero 8).
    pub zeros: Option<Vec<u8>>,
    /// Activation quantization (`I8` only).
    pub act: ActQuant,
    /// Act-order (GPTQ `desc_act`): the weight's columns are stored in this order, so
    /// stored column `j` multiplies input element `perm[j]`; the groups are contiguous
    /// in stored order. The matmul gathers the input into that order before
    /// quantizing it; dequantized rows come back in input order.
    pub perm: Option<Vec<u32>>,
}

impl QuantParams {
    /// One scale per row, symmetric.
    pub fn per_row(scales: Vec<f32>, act: ActQuant, cols: usize) -> Self {
        Self {
            group: cols,
            scales,
            zeros: None,
            act,
            perm: None,
        }
    }

    /// Checks the params against a `ty` weight of `rows × cols`; the error names what
    /// does not fit.
    pub fn check(&self, ty: GgmlType, rows: usize, cols: usize) -> Result<(), String> {
        if !matches!(ty, GgmlType::I8 | GgmlType::U4 | GgmlType::F8E4M3) {
            return Err(format!("{} weights carry no separate scales", ty.name()));
        }
        if !cols.is_multiple_of(32) {
            return Err(format!(
                "{} weights need a multiple of 32 columns, got {cols}",
                ty.name()
            ));
        }
        if ty != GgmlType::U4 && self.group != cols {
            return Err(format!(
                "{} weights have one scale per row; group size {} given for {cols} columns",
                ty.name(),
                self.group
            ));
        }
        if self.group == 0 || !self.group.is_multiple_of(32) || !cols.is_multiple_of(self.group) {
            return Err(format!(
                "group size {} does not divide the {cols} columns into whole groups of a \
                 multiple of 32",
                self.group
            ));
        }
        let n = rows * (cols / self.group);
        if self.scales.len() != n {
            return Err(format!(
                "{} scales for {rows} rows of {} groups (want {n})",
                self.scales.len(),
                cols / self.group
            ));
        }
        if let Some(bad) = self.scales.iter().find(|s| !s.is_finite()) {
            return Err(format!("scale {bad} is not finite"));
        }
        if let Some(z) = &self.zeros {
            if ty != GgmlType::U4 {
                return Err(format!("{} weights take no zero points", ty.name()));
            }
            if z.len() != n {
                return Err(format!("{} zero points for {n} groups", z.len()));
            }
            if let Some(bad) = z.iter().find(|&&z| z > 15) {
                return Err(format!("zero point {bad} does not fit in 4 bits"));
            }
        }
        if let Some(p) = &self.perm {
            if p.len() != cols {
                return Err(format!("act order of {} columns for {cols}", p.len()));
            }
            let mut seen = vec![false; cols];
            for &c in p {
                match seen.get_mut(c as usize) {
                    Some(s) if !*s => *s = true,
                    _ => return Err(format!("act order is not a permutation (column {c})")),
                }
            }
        }
        if self.act == ActQuant::PerToken && ty != GgmlType::I8 {
            return Err(format!(
                "per-token activations go with I8 weights, not {}",
                ty.name()
            ));
        }
        Ok(())
    }

    /// Scales of row `r` (`cols / group` values).
    pub fn row_scales(&self, r: usize, cols: usize) -> &[f32] {
        let g = cols / self.group;
        &self.scales[r * g..(r + 1) * g]
    }

    /// Zero points of row `r`, if asymmetric.
    pub fn row_zeros(&self, r: usize, cols: usize) -> Option<&[u8]> {
        let g = cols / self.group;
        self.zeros.as_ref().map(|z| &z[r * g..(r + 1) * g])
    }
}

/// An OCP FP8 E4M3 byte as f32. The byte's exponent and mantissa bits are moved into
/// an f16's (the bias difference is exactly 2⁻⁸, subnormals included), which is how
/// the SIMD twin decodes eight at once. E4M3's NaN (`S.1111.111`) has no meaning in a
/// weight; it decodes to ±480 here, and [`f32_to_e4m3`] never produces it.
#[inline(always)]
pub fn e4m3_to_f32(b: u8) -> f32 {
    let h = ((b as u16 & 0x80) << 8) | ((b as u16 & 0x7F) << 7);
    half::f16::from_bits(h).to_f32() * 256.0
}

/// The largest finite E4M3 value.
pub const E4M3_MAX: f32 = 448.0;

/// Rounds `v` to the nearest E4M3 value (ties to even), saturating at ±448, as
/// PyTorch's `to(torch.float8_e4m3fn)` does after the clamp every FP8 quantizer
/// applies. NaN becomes 0.
pub fn f32_to_e4m3(v: f32) -> u8 {
    if v.is_nan() {
        return 0;
    }
    let sign = if v.is_sign_negative() { 0x80u8 } else { 0 };
    let a = v.abs().min(E4M3_MAX);
    if a < 2f32.powi(-6) {
        // Subnormals are multiples of 2^-9; a carry to 8 is the smallest normal, 0x08.
        return sign | (a * 512.0).round_ties_even() as u8;
    }
    // Binade e holds multiples of 2^(e-3); m in 8..=16, and 16 carries into the
    // exponent field by itself.
    let e = ((a.to_bits() >> 23) & 0xFF) as i32 - 127;
    let m = (a / 2f32.powi(e - 3)).round_ties_even() as i32;
    sign | (((e + 7) << 3) + m - 8) as u8
}

/// The value of `U4` element `e` of a row.
#[inline(always)]
pub fn u4_at(row: &[u8], e: usize) -> u8 {
    (row[e / 2] >> (4 * (e % 2))) & 0xF
}

/// Dequantizes row `r` (`src`, its element data) of an `I8`, `U4` or `F8E4M3` weight,
/// in input order (an act-order row is scattered back through `p.perm`).
pub fn dequantize_row_wq(ty: GgmlType, p: &QuantParams, r: usize, src: &[u8], dst: &mut [f32]) {
    match &p.perm {
        None => dequantize_stored(ty, p, r, src, dst),
        Some(perm) => {
            let mut stored = vec![0f32; dst.len()];
            dequantize_stored(ty, p, r, src, &mut stored);
            for (&c, v) in perm.iter().zip(stored) {
                dst[c as usize] = v;
            }
        }
    }
}

fn dequantize_stored(ty: GgmlType, p: &QuantParams, r: usize, src: &[u8], dst: &mut [f32]) {
    let cols = dst.len();
    let s = p.row_scales(r, cols);
    match ty {
        GgmlType::I8 => {
            for (y, &q) in dst.iter_mut().zip(src) {
                *y = q as i8 as f32 * s[0];
            }
        }
        GgmlType::F8E4M3 => {
            for (y, &q) in dst.iter_mut().zip(src) {
                *y = e4m3_to_f32(q) * s[0];
            }
        }
        GgmlType::U4 => {
            let z = p.row_zeros(r, cols);
            for (e, y) in dst.iter_mut().enumerate() {
                let g = e / p.group;
                let zero = z.map_or(8, |z| z[g]);
                *y = (u4_at(src, e) as i32 - zero as i32) as f32 * s[g];
            }
        }
        other => panic!("{} is not a checkpoint weight format", other.name()),
    }
}

/// Quantizes one token's activations to `i8` with one scale (`amax / 127`, values
/// `round_half_even(x · 127 / amax)`), returning the scale; an all-zero row gets 0.
pub fn quantize_row_i8_tok(x: &[f32], q: &mut [i8]) -> f32 {
    assert_eq!(x.len(), q.len(), "quantize_row_i8_tok: length mismatch");
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let id = 127.0 / amax;
    if amax == 0.0 || !id.is_finite() {
        q.fill(0);
        return 0.0;
    }
    for (q, &v) in q.iter_mut().zip(x) {
        *q = (v * id).round_ties_even() as i8;
    }
    amax / 127.0
}

/// Dot products of one `U4` row against `n_act` rows of [`BlockQ8`] activations (see
/// the module docs); `scales`/`zeros` are the row's groups, `sums` the activations'
/// [`u4_act_sums`].
pub type DotU4Fn = fn(
    w_row: &[u8],
    scales: &[f32],
    zeros: Option<&[u8]>,
    group: usize,
    acts: &[BlockQ8],
    sums: &[f32],
    n_act: usize,
    out: &mut [f32; 4],
);

/// `d · Σ qs` of each activation block (one f32 rounding of an exact integer sum),
/// the term a `U4` kernel multiplies by a group's zero point.
pub fn u4_act_sums(acts: &[BlockQ8], out: &mut [f32]) {
    assert_eq!(acts.len(), out.len(), "one sum per activation block");
    for (o, y) in out.iter_mut().zip(acts) {
        *o = y.d * y.qs.iter().map(|&q| q as i32).sum::<i32>() as f32;
    }
}

/// Dot products of one `I8` row against `n_act` token rows quantized by
/// [`quantize_row_i8_tok`] (`acts` holds them back to back): the exact integer sums.
pub type DotI8TokFn = fn(w_row: &[u8], acts: &[i8], n_act: usize, out: &mut [f32; 4]);

/// Checks a `U4` kernel's arguments; returns 32-blocks per row.
#[inline(always)]
pub(super) fn check_u4(
    w_row: &[u8],
    scales: &[f32],
    zeros: Option<&[u8]>,
    group: usize,
    acts: &[BlockQ8],
    sums: &[f32],
    n_act: usize,
) -> usize {
    assert!((1..=4).contains(&n_act), "n_act must be 1..=4, got {n_act}");
    assert!(acts.len().is_multiple_of(n_act), "ragged activation rows");
    assert_eq!(sums.len(), acts.len(), "one activation sum per block");
    let nb = acts.len() / n_act;
    let cols = nb * 32;
    assert_eq!(
        w_row.len() * 2,
        cols,
        "U4 row does not match {cols} columns"
    );
    assert!(
        group > 0 && group.is_multiple_of(32) && cols.is_multiple_of(group),
        "group size {group} does not divide {cols} columns"
    );
    assert_eq!(scales.len(), cols / group, "one scale per group");
    assert!(
        zeros.is_none_or(|z| z.len() == cols / group),
        "one zero per group"
    );
    nb
}

/// The 32 raw nibbles (0..=15) of chunk `b` of a `U4` row, in element order.
#[inline(always)]
fn u4_chunk(w_row: &[u8], b: usize) -> [i8; 32] {
    let bytes = &w_row[16 * b..16 * b + 16];
    let mut q = [0i8; 32];
    for (j, &v) in bytes.iter().enumerate() {
        q[2 * j] = (v & 0xF) as i8;
        q[2 * j + 1] = (v >> 4) as i8;
    }
    q
}

#[allow(clippy::too_many_arguments)]
pub fn dot_u4(
    w_row: &[u8],
    scales: &[f32],
    zeros: Option<&[u8]>,
    group: usize,
    acts: &[BlockQ8],
    sums: &[f32],
    n_act: usize,
    out: &mut [f32; 4],
) {
    let nb = check_u4(w_row, scales, zeros, group, acts, sums, n_act);
    let per_group = group / 32;
    for (i, o) in out.iter_mut().take(n_act).enumerate() {
        let (a, sm) = (&acts[i * nb..(i + 1) * nb], &sums[i * nb..(i + 1) * nb]);
        let mut acc = [0f32; 8];
        let mut corr = 0f32;
        for (g, &s) in scales.iter().enumerate() {
            let blocks = g * per_group..(g + 1) * per_group;
            let mut acc_g = [0f32; 8];
            let mut m = 0f32;
            for b in blocks {
                fma_lanes(&mut acc_g, lanes(&u4_chunk(w_row, b), &a[b].qs), a[b].d);
                m += sm[b];
            }
            for (acc, v) in acc.iter_mut().zip(acc_g) {
                *acc = v.mul_add(s, *acc);
            }
            let zero = zeros.map_or(8, |z| z[g]);
            corr = (s * zero as f32).mul_add(m, corr);
        }
        *o = hsum8(acc) - corr;
    }
}

/// `I8` against [`BlockQ8`] activations, before the row scale.
pub fn dot_i8(w_row: &[u8], acts: &[BlockQ8], n_act: usize, out: &mut [f32; 4]) {
    let nb = super::dot_scalar::check_q(GgmlType::I8, w_row, acts.len(), 32, n_act);
    for (i, o) in out.iter_mut().take(n_act).enumerate() {
        let mut acc = [0f32; 8];
        for (b, y) in acts[i * nb..(i + 1) * nb].iter().enumerate() {
            let q: [i8; 32] = std::array::from_fn(|e| w_row[32 * b + e] as i8);
            fma_lanes(&mut acc, lanes(&q, &y.qs), y.d);
        }
        *o = hsum8(acc);
    }
}

/// Checks an [`DotI8TokFn`]'s arguments; returns the columns.
#[inline(always)]
pub(super) fn check_i8_tok(w_row: &[u8], acts: &[i8], n_act: usize) -> usize {
    assert!((1..=4).contains(&n_act), "n_act must be 1..=4, got {n_act}");
    assert_eq!(
        acts.len(),
        n_act * w_row.len(),
        "activation rows do not match"
    );
    assert!(
        w_row.len().is_multiple_of(32),
        "I8 rows need a multiple of 32 columns"
    );
    w_row.len()
}

pub fn dot_i8_tok(w_row: &[u8], acts: &[i8], n_act: usize, out: &mut [f32; 4]) {
    let cols = check_i8_tok(w_row, acts, n_act);
    for (i, o) in out.iter_mut().take(n_act).enumerate() {
        let a = &acts[i * cols..(i + 1) * cols];
        let s: i32 = w_row
            .iter()
            .zip(a)
            .map(|(&w, &a)| w as i8 as i32 * a as i32)
            .sum();
        *o = s as f32;
    }
}

/// `F8E4M3` against f32 activations, before the row scale.
pub fn dot_f8(w_row: &[u8], acts: &[f32], n_act: usize, out: &mut [f32; 4]) {
    let cols = super::dot_scalar::check_f32(GgmlType::F8E4M3, w_row, acts, n_act);
    assert!(
        cols.is_multiple_of(32),
        "F8E4M3 rows need a multiple of 32 columns"
    );
    for (i, o) in out.iter_mut().take(n_act).enumerate() {
        let a = &acts[i * cols..(i + 1) * cols];
        let mut acc = [0f32; 32];
        for (e, (&w, &x)) in w_row.iter().zip(a).enumerate() {
            acc[e % 32] = e4m3_to_f32(w).mul_add(x, acc[e % 32]);
        }
        let l: [f32; 8] =
            std::array::from_fn(|k| (acc[k] + acc[8 + k]) + (acc[16 + k] + acc[24 + k]));
        *o = hsum8(l);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e4m3_round_trips_every_finite_value() {
        for b in 0u8..=255 {
            if b & 0x7F == 0x7F {
                continue;
            }
            let v = e4m3_to_f32(b);
            let back = f32_to_e4m3(v);
            // +0 and -0 both decode to a zero that re-encodes with its sign.
            assert_eq!(back, b, "byte {b:#04x} = {v}");
        }
        assert_eq!(e4m3_to_f32(0x7E), 448.0);
        assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9));
        assert_eq!(e4m3_to_f32(0x08), 2f32.powi(-6));
        assert_eq!(f32_to_e4m3(1e9), 0x7E, "saturates");
        assert_eq!(f32_to_e4m3(-1e9), 0xFE);
        // 1.0625 lies halfway between 1.0 (mantissa 0) and 1.125 (mantissa 1): even wins.
        assert_eq!(e4m3_to_f32(f32_to_e4m3(1.0625)), 1.0);
        assert_eq!(e4m3_to_f32(f32_to_e4m3(1.1875)), 1.25);
    }

    #[test]
    fn params_check_names_the_problem() {
        let p = QuantParams {
            group: 48,
            scales: vec![1.0; 4],
            zeros: None,
            act: ActQuant::Block32,
            perm: None,
        };
        let e = p.check(GgmlType::U4, 2, 96).unwrap_err();
        assert!(e.contains("group size 48"), "{e}");
        let p = QuantParams { group: 32, ..p };
        let e = p.check(GgmlType::U4, 2, 96).unwrap_err();
        assert!(e.contains("4 scales") && e.contains("want 6"), "{e}");
        let p = QuantParams {
            scales: vec![1.0; 6],
            zeros: Some(vec![16; 6]),
            ..p
        };
        assert!(p.check(GgmlType::U4, 2, 96).unwrap_err().contains("4 bits"));
        let mut perm: Vec<u32> = (0..96).collect();
        perm[5] = 4;
        let p = QuantParams {
            zeros: None,
            perm: Some(perm),
            ..p
        };
        let e = p.check(GgmlType::U4, 2, 96).unwrap_err();
        assert!(e.contains("not a permutation (column 4)"), "{e}");
    }
}
