//! Weights repacked eight rows at a time (row-interleaved, "R8"), made once at load.
//!
//! A GGML row stores its 32-element blocks one after another, so a dot product reads one
//! weight row against one activation row and an activation block is loaded once per row.
//! The interleaved layout stores, for each group of eight rows and each 32-column block,
//! the eight rows' scales side by side and then their quants four columns at a time:
//! one 32-byte load holds four columns of all eight rows, and one broadcast of four
//! activation bytes feeds all eight rows (`vpdpbusd` / `vpmaddubsw` on eight 32-bit
//! lanes). llama.cpp's repack buffers and ik_llama.cpp's `_R8` types use the same idea.
//!
//! ## Layout of one group block (8 rows × 32 columns)
//!
//! | type | bytes | contents |
//! |---|---|---|
//! | Q4_0 | 144 | `d[8]` (f16), then 4 chunks of 32 bytes |
//! | Q4_1 | 160 | `d[8]`, `m[8]` (f16), then 4 chunks of 32 bytes |
//! | Q8_0 | 272 | `d[8]` (f16), then 8 chunks of 32 bytes |
//! | Q4_K | 1184 | 256 columns: `d[8]`, `dmin[8]`, unpacked scales and mins, 32 chunks |
//! | Q6_K | 1680 | 256 columns: `d[8]`, scales in pairs, per 32 columns 4 nibble chunks and 2 top-bit chunks |
//!
//! Q4 chunk `c`, byte `4r + j` is byte `4c + j` of row `r`'s GGML block: its low nibble is
//! column `4c + j` and its high nibble column `16 + 4c + j`. Q8_0 chunk `c`, byte `4r + j`
//! is column `4c + j` of row `r` plus 128, stored unsigned. A group's blocks follow each
//! other along the row, and groups follow each other: the repacked weight has exactly
//! the bytes of the original (Q4_K: 2.8% more, its 6-bit scales stored unpacked; see
//! `repack_q4_k`).
//!
//! Q6_K keeps each column's top two bits within 192 bytes of its low four (see
//! `repack_q6_k`): an earlier layout that put them a kilobyte apart decoded 18% slower
//! than the file layout.
//!
//! On CPUs with 512-bit registers, [`R16Fn`] kernels take two neighbouring groups per call
//! (one group per register half) and up to [`ACT_ROWS`] activation rows; each lane does
//! what the one-group kernels do, so they give the same bits. There the groups are stored
//! in pairs (see `pair_up`): per block, each unit of the first group (its eight f16
//! scales, a 32-byte quant chunk, …) followed by the same unit of the second, so one
//! 64-byte load holds four columns of sixteen rows, and a call reads one sequential
//! stream; an odd last group stays whole (see [`Interleaved::paired`]). Two groups read
//! side by side from two places a few kilobytes apart streamed from memory at less than
//! half the speed (the hardware prefetcher follows one stream well, two short
//! interleaved ones badly), which kept decoding on the one-group kernels before.
//!
//! ## Arithmetic (the definition every kernel family reproduces bit for bit)
//!
//! For weight row `r` and activation row `m` ([`BlockQ8`], with its block sums `Σa` as
//! exact integers), per block in column order (K-quants: see `interleave_twin`'s
//! `r8k_q4_k_ref` and `r8k_q6_k_ref`):
//!
//! ```text
//! isum = Σ q·a − o·Σa          (exact i32; o = 8 for Q4_0, 128 for Q8_0, 0 for Q4_1)
//! acc  = fma(d_w · d_a, f32(isum), acc)
//! acc  = fma(m_w, s_a, acc)    (Q4_1 only; s_a = the activation block's `s`)
//! ```
//!
//! starting from `acc = 0`. The integer sum is exact in every family, and the float steps
//! are the same operations in the same order, so the scalar twin (`interleave_twin`'s
//! `r8_ref`), the AVX2 kernels and the AVX-512 VNNI kernels give the same bits, and a
//! pair's result never depends on which other rows share the call (batch invariance).

use super::blocks::scales_mins_k4;
use super::interleave_twin as twin;
use super::{BlockQ8, BlockQ8K, GgmlType, SimdLevel};

/// Rows per interleaved group.
pub const R8: usize = 8;

/// A weight matrix repacked into the interleaved layout (see the module docs). Its
/// bytes are a range of a buffer that may hold other weights too: a model's repacked
/// weights share one buffer on huge pages (see [`Interleaved::repack_into`]).
pub struct Interleaved {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    buf: std::sync::Arc<Vec<u8>>,
    start: usize,
    paired: bool,
}

/// Dot products of one interleaved group (`group`: the group's `cols / 32` blocks) with
/// `na` (1 to 4) activation rows stored back to back in `acts`, their exact block sums in
/// `isums`: `out[m][j] = dot(row j of the group, activation row m)`.
pub type R8Fn =
    fn(group: &[u8], acts: &[BlockQ8], isums: &[i32], na: usize, out: &mut [[f32; R8]; 4]);

/// As [`R8Fn`] for the K-quants' interleaved groups, against [`BlockQ8K`] activations.
pub type R8KFn = fn(group: &[u8], acts: &[BlockQ8K], na: usize, out: &mut [[f32; R8]; 4]);

/// Rows of a two-group call.
pub const R16: usize = 2 * R8;

/// Most activation rows of a two-group call.
pub const ACT_ROWS: usize = 8;

/// Dot products of two neighbouring interleaved groups (`g0`, `g1`, of the same length)
/// with `na` (1 to [`ACT_ROWS`]) activation rows: `out[m][j]` is row `j` of `g0` for `j < 8` and row
/// `j - 8` of `g1` otherwise, `pair` holding both as [`Interleaved::pair`] gives them.
/// The bits are those of two [`R8Fn`] calls.
pub type R16Fn =
    fn(pair: &[u8], acts: &[BlockQ8], isums: &[i32], na: usize, out: &mut [[f32; R16]; ACT_ROWS]);

/// As [`R16Fn`] for the K-quants' interleaved groups; `sums` holds each activation
/// block's [`SubSums`].
pub type R16KFn = fn(
    pair: &[u8],
    acts: &[BlockQ8K],
    sums: &[SubSums],
    na: usize,
    out: &mut [[f32; R16]; ACT_ROWS],
);

/// A [`BlockQ8K`]'s eight 32-column sums (its `bsums` added in pairs) split as
/// `sum = 128·hi + lo` with `lo` in 0..=127 and `hi` in -32..=31, four to a 32-bit word
/// as i8: `[lo 0–3, lo 4–7, hi 0–3, hi 4–7]`. The two-group Q4_K kernel meets each word
/// with a weight row's four mins in one `vpdpbusd` (u8 mins times i8 parts), so a
/// super-block's `Σ_j m_j·sum_j` takes four of them and stays exact. Each sum is at most
/// 32 · 128 in magnitude, so the parts fit.
pub type SubSums = [i32; 4];

/// [`SubSums`] of each activation block.
pub fn block_sub_sums(acts: &[BlockQ8K], out: &mut [SubSums]) {
    for (a, o) in acts.iter().zip(out.iter_mut()) {
        let sum = |j: usize| a.bsums[2 * j] as i32 + a.bsums[2 * j + 1] as i32;
        let word = |f: &dyn Fn(i32) -> i32, t: usize| {
            i32::from_le_bytes(std::array::from_fn(|i| f(sum(4 * t + i)) as i8 as u8))
        };
        let (lo, hi) = (|s: i32| s & 127, |s: i32| s >> 7);
        *o = [word(&lo, 0), word(&lo, 1), word(&hi, 0), word(&hi, 1)];
    }
}

/// Bytes of one group block (8 rows × one block of `ty`: 32 columns, 256 for the
/// K-quants), for the types that have an interleaved layout.
pub fn group_block_bytes(ty: GgmlType) -> Option<usize> {
    match ty {
        GgmlType::Q4_0 => Some(144),
        GgmlType::Q4_1 => Some(160),
        GgmlType::Q8_0 => Some(272),
        GgmlType::Q4_K => Some(Q4K_GROUP_BLOCK),
        GgmlType::Q6_K => Some(Q6K_GROUP_BLOCK),
        _ => None,
    }
}

impl Interleaved {
    /// Repacks `rows` GGML rows of `ty` (`data`, `cols` columns each) into a buffer of
    /// its own. `None` when `ty` has no interleaved layout or `rows` is not a multiple of
    /// eight.
    pub fn repack(ty: GgmlType, data: &[u8], rows: usize, cols: usize) -> Option<Self> {
        Self::repack_as(ty, data, rows, cols, Self::pairs_groups(ty))
    }

    /// As [`Interleaved::repack`], with the groups paired or not whatever this CPU's
    /// kernels take (for tests comparing kernel families on one machine).
    pub fn repack_as(
        ty: GgmlType,
        data: &[u8],
        rows: usize,
        cols: usize,
        paired: bool,
    ) -> Option<Self> {
        let len = Self::packed_len(ty, rows, cols)?;
        let mut out = crate::mem::zeroed_huge::<u8>(len);
        Self::repack_into_as(ty, data, rows, cols, &mut out, paired, |_| {}).then_some(())?;
        let buf = std::sync::Arc::new(out);
        Some(Self::in_buffer_as(ty, rows, cols, buf, 0, paired))
    }

    /// Whether this CPU's kernels take `ty`'s groups in pairs: where a two-group kernel
    /// ([`r16_kernel`], [`r16k_kernel`]) exists.
    pub fn pairs_groups(ty: GgmlType) -> bool {
        r16_kernel(ty).is_some() || r16k_kernel(ty).is_some()
    }

    /// Bytes the interleaved copy of `rows` × `cols` of `ty` takes; `None` when `ty` has
    /// no interleaved layout or `rows` is not a multiple of eight.
    pub fn packed_len(ty: GgmlType, rows: usize, cols: usize) -> Option<usize> {
        let gbb = group_block_bytes(ty)?;
        ty.row_bytes(cols)?;
        (rows > 0 && rows.is_multiple_of(R8)).then(|| rows / R8 * (cols / ty.block_elems()) * gbb)
    }

    /// Repacks into `out` (exactly [`Interleaved::packed_len`] bytes), calling
    /// `release(n)` each time the first `n` bytes of `data` have been repacked and will
    /// not be read again, so that a caller can drop their pages while the rest is still
    /// being copied: a large weight is then never resident twice. False when the weight
    /// has no interleaved layout or `data` or `out` has the wrong size.
    pub fn repack_into(
        ty: GgmlType,
        data: &[u8],
        rows: usize,
        cols: usize,
        out: &mut [u8],
        release: impl FnMut(usize),
    ) -> bool {
        let paired = Self::pairs_groups(ty);
        Self::repack_into_as(ty, data, rows, cols, out, paired, release)
    }

    /// As [`Interleaved::repack_into`], with the groups paired or not.
    pub fn repack_into_as(
        ty: GgmlType,
        data: &[u8],
        rows: usize,
        cols: usize,
        out: &mut [u8],
        paired: bool,
        mut release: impl FnMut(usize),
    ) -> bool {
        let (Some(len), Some(gbb), Some(rb)) = (
            Self::packed_len(ty, rows, cols),
            group_block_bytes(ty),
            ty.row_bytes(cols),
        ) else {
            return false;
        };
        if out.len() != len || data.len() < rows * rb {
            return false;
        }
        let nb = cols / ty.block_elems();
        // About a megabyte of source rows at a time, in whole pairs of groups.
        let step = ((1 << 20) / (R8 * rb) + 1).next_multiple_of(2);
        let (src_group, out_group) = (R8 * rb, nb * gbb);
        for (k, o) in out.chunks_mut(step * out_group).enumerate() {
            let src = &data[k * step * src_group..][..o.len() / out_group * src_group];
            match ty {
                GgmlType::Q4_K => repack_q4_k(src, nb, o),
                GgmlType::Q6_K => repack_q6_k(src, nb, o),
                _ => repack_32(ty, src, nb, o),
            }
            if paired {
                for region in o.chunks_exact_mut(2 * out_group) {
                    pair_up(ty, region, nb, gbb);
                }
            }
            release(k * step * src_group + src.len());
        }
        true
    }

    /// The interleaved weight whose bytes [`Interleaved::repack_into`] wrote at
    /// `buf[start..]`.
    pub fn in_buffer(
        ty: GgmlType,
        rows: usize,
        cols: usize,
        buf: std::sync::Arc<Vec<u8>>,
        start: usize,
    ) -> Self {
        Self::in_buffer_as(ty, rows, cols, buf, start, Self::pairs_groups(ty))
    }

    /// As [`Interleaved::in_buffer`] for bytes [`Interleaved::repack_into_as`] wrote.
    pub fn in_buffer_as(
        ty: GgmlType,
        rows: usize,
        cols: usize,
        buf: std::sync::Arc<Vec<u8>>,
        start: usize,
        paired: bool,
    ) -> Self {
        let len = Self::packed_len(ty, rows, cols).expect("a repackable weight");
        assert!(
            start + len <= buf.len(),
            "interleaved bytes outside their buffer"
        );
        Self {
            ty,
            rows,
            cols,
            buf,
            start,
            paired,
        }
    }

    /// The interleaved bytes.
    pub fn bytes(&self) -> &[u8] {
        let len = Self::packed_len(self.ty, self.rows, self.cols).expect("made by repack");
        &self.buf[self.start..self.start + len]
    }

    /// Bytes of one group (8 rows, all columns).
    pub fn group_bytes(&self) -> usize {
        self.cols / self.ty.block_elems() * group_block_bytes(self.ty).expect("made by repack")
    }

    /// Whether the groups are stored in pairs (see the module docs and `pair_up`): then
    /// [`Interleaved::pair`] gives the pairs and [`Interleaved::group`] only an odd last
    /// group.
    pub fn paired(&self) -> bool {
        self.paired
    }

    /// Whether group `g` is stored whole (not one of a pair).
    pub fn whole(&self, g: usize) -> bool {
        !self.paired || g >= self.rows / R16 * 2
    }

    /// The bytes of group `g` (rows `8g..8g + 8`), which must be stored whole.
    pub fn group(&self, g: usize) -> &[u8] {
        assert!(
            g < self.rows / R8,
            "group {g} of a {}-row weight",
            self.rows
        );
        assert!(self.whole(g), "group {g} is one of a pair");
        let gb = self.group_bytes();
        &self.buf[self.start + g * gb..self.start + (g + 1) * gb]
    }

    /// The bytes of groups `2i` and `2i + 1` (rows `16i..16i + 16`) of a paired weight
    /// (see `pair_up`).
    pub fn pair(&self, i: usize) -> &[u8] {
        assert!(self.paired, "the groups are not paired");
        assert!(
            i < self.rows / R16,
            "pair {i} of a {}-row weight",
            self.rows
        );
        let pb = 2 * self.group_bytes();
        &self.buf[self.start + i * pb..self.start + (i + 1) * pb]
    }

    /// Block `b` of group `g` in the layout of a group stored whole.
    pub fn group_block(&self, g: usize, b: usize) -> Vec<u8> {
        let gbb = group_block_bytes(self.ty).expect("made by repack");
        if self.whole(g) {
            return self.group(g)[b * gbb..][..gbb].to_vec();
        }
        let src = &self.pair(g / 2)[2 * b * gbb..][..2 * gbb];
        let mut blk = vec![0u8; gbb];
        for (off, w) in units(self.ty, gbb) {
            blk[off..off + w].copy_from_slice(&src[2 * off + (g % 2) * w..][..w]);
        }
        blk
    }

    /// Row `r` back in its GGML layout (for tests: repacking loses nothing). The
    /// 32-wide types only.
    pub fn ggml_row(&self, r: usize) -> Vec<u8> {
        assert_eq!(self.ty.block_elems(), 32, "a 32-wide type");
        let scale_fields = if self.ty == GgmlType::Q4_1 { 2 } else { 1 };
        let (g, rr) = (r / R8, r % R8);
        let mut row = Vec::with_capacity(self.ty.row_bytes(self.cols).expect("whole blocks"));
        for b in 0..self.cols / 32 {
            let blk = self.group_block(g, b);
            for f in 0..scale_fields {
                row.extend_from_slice(&blk[f * 16 + 2 * rr..][..2]);
            }
            let q = &blk[16 * scale_fields..];
            let (chunks, flip) = if self.ty == GgmlType::Q8_0 {
                (8, 0x80)
            } else {
                (4, 0)
            };
            for c in 0..chunks {
                row.extend((0..4).map(|j| q[32 * c + 4 * rr + j] ^ flip));
            }
        }
        row
    }
}

/// How many bytes at offset `off` of a group block of `ty` the two-group kernels read
/// as one unit (a scale or quant vector of eight rows): paired, each unit of the first
/// group is followed by the same unit of the second (see [`pair_up`]).
fn unit_bytes(ty: GgmlType, off: usize) -> usize {
    match ty {
        GgmlType::Q4_K if off < 32 => 16,
        GgmlType::Q4_K if off < Q4K_MINS => 8,
        GgmlType::Q6_K if off < 144 => 16,
        GgmlType::Q4_0 if off < 16 => 16,
        GgmlType::Q4_1 if off < 32 => 16,
        GgmlType::Q8_0 if off < 16 => 16,
        _ => 32,
    }
}

/// The units of a group block of `ty` (`gbb` bytes) as (offset, bytes), in order.
fn units(ty: GgmlType, gbb: usize) -> impl Iterator<Item = (usize, usize)> {
    let mut off = 0;
    std::iter::from_fn(move || {
        (off < gbb).then(|| {
            let w = unit_bytes(ty, off);
            off += w;
            (off - w, w)
        })
    })
}

/// Turns two whole groups (`region`: `nb` group blocks of the first, then of the
/// second) into their pair: per block `b`, each unit of the first group followed by the
/// same unit of the second, so that one 64-byte load holds four columns of all sixteen
/// rows and a two-group call reads one sequential stream.
fn pair_up(ty: GgmlType, region: &mut [u8], nb: usize, gbb: usize) {
    let whole = region.to_vec();
    let (g0, g1) = whole.split_at(nb * gbb);
    for b in 0..nb {
        let dst = &mut region[2 * b * gbb..][..2 * gbb];
        for (off, w) in units(ty, gbb) {
            dst[2 * off..][..w].copy_from_slice(&g0[b * gbb + off..][..w]);
            dst[2 * off + w..][..w].copy_from_slice(&g1[b * gbb + off..][..w]);
        }
    }
}

/// Repacks rows of a 32-wide type (see the module docs' table).
fn repack_32(ty: GgmlType, data: &[u8], nb: usize, out: &mut [u8]) {
    let (bb, gbb) = (
        ty.block_bytes(),
        group_block_bytes(ty).expect("interleaved type"),
    );
    let rb = nb * bb;
    let scale_fields = if ty == GgmlType::Q4_1 { 2 } else { 1 };
    let (chunks, flip) = if ty == GgmlType::Q8_0 {
        (8, 0x80)
    } else {
        (4, 0)
    };
    for (g, og) in out.chunks_exact_mut(nb * gbb).enumerate() {
        for (b, o) in og.chunks_exact_mut(gbb).enumerate() {
            for r in 0..R8 {
                let s = &data[(g * R8 + r) * rb + b * bb..][..bb];
                for f in 0..scale_fields {
                    o[f * 16 + 2 * r..][..2].copy_from_slice(&s[2 * f..2 * f + 2]);
                }
                let qs = &s[2 * scale_fields..];
                let q = &mut o[16 * scale_fields..];
                for c in 0..chunks {
                    for j in 0..4 {
                        q[32 * c + 4 * r + j] = qs[4 * c + j] ^ flip;
                    }
                }
            }
        }
    }
}

/// Bytes of one Q4_K group block (8 rows × 256 columns).
pub const Q4K_GROUP_BLOCK: usize = 1184;

/// Where a Q4_K group block's mins start (see [`repack_q4_k`]).
pub const Q4K_MINS: usize = 96;

/// Repacks Q4_K rows: per group block `d[8]`, `dmin[8]` (f16), the unpacked 6-bit
/// scales `sc[j][r]` (u8, sub-block `j`, row `r`) and mins four to a row, `m[t][r][i]` =
/// sub-block `4t + i` (one 32-bit lane per row, which `vpdpbusd` meets with four
/// activation sums at once; see [`SubSums`]), then per pair of
/// sub-blocks `p` eight chunks of 32 bytes, chunk `c` byte `4r + j` = byte `32p + 4c + j`
/// of row `r`'s quants.
fn repack_q4_k(data: &[u8], nb: usize, out: &mut [u8]) {
    let rb = nb * 144;
    for (g, og) in out.chunks_exact_mut(nb * Q4K_GROUP_BLOCK).enumerate() {
        for (b, o) in og.chunks_exact_mut(Q4K_GROUP_BLOCK).enumerate() {
            for r in 0..R8 {
                let s = &data[(g * R8 + r) * rb + b * 144..][..144];
                o[2 * r..2 * r + 2].copy_from_slice(&s[0..2]);
                o[16 + 2 * r..16 + 2 * r + 2].copy_from_slice(&s[2..4]);
                let (sc, m) = scales_mins_k4(s[4..16].try_into().expect("12 bytes"));
                for j in 0..8 {
                    o[32 + 8 * j + r] = sc[j];
                    o[Q4K_MINS + 32 * (j / 4) + 4 * r + j % 4] = m[j];
                }
                let qs = &s[16..];
                for p in 0..4 {
                    for c in 0..8 {
                        for jj in 0..4 {
                            o[160 + 256 * p + 32 * c + 4 * r + jj] = qs[32 * p + 4 * c + jj];
                        }
                    }
                }
            }
        }
    }
}

/// Bytes of one Q6_K group block (8 rows × 256 columns): the GGML blocks' bytes.
pub const Q6K_GROUP_BLOCK: usize = 1680;

/// The 6-bit codes (0 to 63) of a GGML Q6_K block's 256 elements, in column order.
fn q6_k_codes(blk: &[u8], code: &mut [u8; 256]) {
    for n in 0..2 {
        let (ql, qh) = (&blk[64 * n..][..64], &blk[128 + 32 * n..][..32]);
        let out = &mut code[128 * n..][..128];
        for l in 0..32 {
            out[l] = (ql[l] & 15) | (qh[l] & 3) << 4;
            out[32 + l] = (ql[32 + l] & 15) | (qh[l] >> 2 & 3) << 4;
            out[64 + l] = (ql[l] >> 4) | (qh[l] >> 4 & 3) << 4;
            out[96 + l] = (ql[32 + l] >> 4) | (qh[l] >> 6) << 4;
        }
    }
}

/// Repacks Q6_K rows: per group block `d[8]` (f16), the scales as pairs
/// (`16 + 16t + 2r + i` = scale `2t + i` of row `r`, i8), then per 32-column sub-block `j`
/// 192 bytes: four chunks of nibbles laid out as Q4's (chunk `c` byte `4r + jj`: the low
/// four bits of column `4c + jj` in its low nibble, of column `16 + 4c + jj` in its high
/// one) and two chunks of top bits (chunk `h` byte `4r + jj`, bits `2t..2t + 2`: the top
/// two bits of column `16h + 4t + jj`), so a column's six bits sit within 192 bytes.
fn repack_q6_k(data: &[u8], nb: usize, out: &mut [u8]) {
    let rb = nb * 210;
    let mut code = [0u8; 256];
    for (g, og) in out.chunks_exact_mut(nb * Q6K_GROUP_BLOCK).enumerate() {
        for (b, o) in og.chunks_exact_mut(Q6K_GROUP_BLOCK).enumerate() {
            for r in 0..R8 {
                let s = &data[(g * R8 + r) * rb + b * 210..][..210];
                q6_k_codes(s, &mut code);
                o[2 * r..2 * r + 2].copy_from_slice(&s[208..210]);
                for t in 0..8 {
                    o[16 + 16 * t + 2 * r..][..2].copy_from_slice(&s[192 + 2 * t..][..2]);
                }
                for (j, code) in code.chunks_exact(32).enumerate() {
                    let q = &mut o[144 + 192 * j..][..192];
                    for c in 0..4 {
                        for jj in 0..4 {
                            let (lo, hi) = (code[4 * c + jj], code[16 + 4 * c + jj]);
                            q[32 * c + 4 * r + jj] = (lo & 15) | (hi & 15) << 4;
                        }
                    }
                    for h in 0..2 {
                        for jj in 0..4 {
                            q[128 + 32 * h + 4 * r + jj] = (0..4)
                                .map(|t| (code[16 * h + 4 * t + jj] >> 4) << (2 * t))
                                .fold(0, |a, v| a | v);
                        }
                    }
                }
            }
        }
    }
}

/// Checks a K-quant call's lengths; returns the number of super-blocks per row.
pub(super) fn check_r8k(ty: GgmlType, group: &[u8], acts: &[BlockQ8K], na: usize) -> usize {
    let gbb = group_block_bytes(ty).expect("interleaved type");
    assert!((1..=4).contains(&na), "1 to 4 activation rows, got {na}");
    assert!(group.len().is_multiple_of(gbb), "partial group block");
    let nb = group.len() / gbb;
    assert!(acts.len() >= na * nb, "activations too short");
    nb
}

/// Checks a two-group call's lengths; returns the number of blocks per row.
pub(super) fn check_r16(
    ty: GgmlType,
    pair: &[u8],
    acts: &[BlockQ8],
    isums: &[i32],
    na: usize,
) -> usize {
    assert!(
        (1..=ACT_ROWS).contains(&na),
        "1 to {ACT_ROWS} activation rows, got {na}"
    );
    let gbb = group_block_bytes(ty).expect("interleaved type");
    assert!(
        pair.len().is_multiple_of(2 * gbb),
        "partial pair of group blocks"
    );
    let nb = check_r8(ty, &pair[..pair.len() / 2], acts, isums, 1);
    assert!(
        acts.len() >= na * nb && isums.len() >= na * nb,
        "activations too short"
    );
    nb
}

/// As [`check_r16`] for the K-quants.
pub(super) fn check_r16k(
    ty: GgmlType,
    pair: &[u8],
    acts: &[BlockQ8K],
    sums: &[SubSums],
    na: usize,
) -> usize {
    assert!(
        (1..=ACT_ROWS).contains(&na),
        "1 to {ACT_ROWS} activation rows, got {na}"
    );
    let gbb = group_block_bytes(ty).expect("interleaved type");
    assert!(
        pair.len().is_multiple_of(2 * gbb),
        "partial pair of group blocks"
    );
    let nb = check_r8k(ty, &pair[..pair.len() / 2], acts, 1);
    assert!(
        acts.len() >= na * nb && sums.len() >= na * nb,
        "activations too short"
    );
    nb
}

/// The exact integer sum of each activation block's quants, for the interleaved kernels'
/// offsets.
pub fn block_isums(acts: &[BlockQ8], out: &mut [i32]) {
    for (a, o) in acts.iter().zip(out.iter_mut()) {
        *o = a.qs.iter().map(|&q| q as i32).sum();
    }
}

/// Checks a call's lengths; returns the number of blocks per row.
pub(super) fn check_r8(
    ty: GgmlType,
    group: &[u8],
    acts: &[BlockQ8],
    isums: &[i32],
    na: usize,
) -> usize {
    let gbb = group_block_bytes(ty).expect("interleaved type");
    assert!((1..=4).contains(&na), "1 to 4 activation rows, got {na}");
    assert!(group.len().is_multiple_of(gbb), "partial group block");
    let nb = group.len() / gbb;
    assert!(
        acts.len() >= na * nb && isums.len() >= na * nb,
        "activations too short"
    );
    nb
}

/// The interleaved K-quant kernel for `ty` on this CPU.
pub fn r8k_kernel(ty: GgmlType) -> Option<R8KFn> {
    r8k_kernel_at(crate::cpu::simd_level(), ty)
}

/// The interleaved K-quant kernel for `ty` of SIMD family `level`, if `ty` has one and
/// this CPU can run it. Every family gives the same bits.
pub fn r8k_kernel_at(level: SimdLevel, ty: GgmlType) -> Option<R8KFn> {
    if !matches!(ty, GgmlType::Q4_K | GgmlType::Q6_K) || level > crate::cpu::supported() {
        return None;
    }
    match level {
        SimdLevel::Scalar if ty == GgmlType::Q4_K => Some(twin::r8k_q4_k_ref),
        SimdLevel::Scalar => Some(twin::r8k_q6_k_ref),
        // SAFETY: the CPU supports `level` (checked above).
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 => Some(unsafe { super::interleave_x86::kernel_k(ty) }),
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx512Vnni => Some(unsafe { super::interleave_x86::kernel_k_vnni(ty) }),
        #[cfg(not(target_arch = "x86_64"))]
        _ => None,
    }
}

/// The interleaved kernel for `ty` on this CPU.
pub fn r8_kernel(ty: GgmlType) -> Option<R8Fn> {
    r8_kernel_at(crate::cpu::simd_level(), ty)
}

/// The interleaved kernel for `ty` of SIMD family `level`, if `ty` has one and this CPU
/// can run it. Every family gives the same bits.
pub fn r8_kernel_at(level: SimdLevel, ty: GgmlType) -> Option<R8Fn> {
    if ty.block_elems() != 32 {
        return None;
    }
    group_block_bytes(ty)?;
    if level > crate::cpu::supported() {
        return None;
    }
    match level {
        SimdLevel::Scalar => Some(match ty {
            GgmlType::Q4_0 => twin::r8_q4_0_ref,
            GgmlType::Q4_1 => twin::r8_q4_1_ref,
            _ => twin::r8_q8_0_ref,
        }),
        // SAFETY: the CPU supports `level` (checked above).
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 => Some(unsafe { super::interleave_x86::kernel(ty) }),
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx512Vnni => Some(unsafe { super::interleave_x86::kernel_vnni(ty) }),
        #[cfg(not(target_arch = "x86_64"))]
        _ => None,
    }
}

/// The two-group kernel for `ty` on this CPU: families with 512-bit registers have one.
pub fn r16_kernel(ty: GgmlType) -> Option<R16Fn> {
    r16_kernel_at(crate::cpu::simd_level(), ty)
}

/// The two-group kernel for `ty` of SIMD family `level`, if it has one and this CPU can
/// run it.
pub fn r16_kernel_at(level: SimdLevel, ty: GgmlType) -> Option<R16Fn> {
    r8_kernel_at(level, ty)?;
    match level {
        // SAFETY: `r8_kernel_at` checked that the CPU supports `level`.
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx512Vnni => Some(unsafe { super::interleave_x512::kernel(ty) }),
        _ => None,
    }
}

/// The two-group K-quant kernel for `ty` on this CPU.
pub fn r16k_kernel(ty: GgmlType) -> Option<R16KFn> {
    r16k_kernel_at(crate::cpu::simd_level(), ty)
}

/// As [`r16_kernel_at`] for the K-quants.
pub fn r16k_kernel_at(level: SimdLevel, ty: GgmlType) -> Option<R16KFn> {
    r8k_kernel_at(level, ty)?;
    match level {
        // SAFETY: `r8k_kernel_at` checked that the CPU supports `level`.
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx512Vnni => Some(unsafe { super::interleave_x512::kernel_k(ty) }),
        _ => None,
    }
}

/// Whether weights are repacked at load: yes unless `PAGELLM_REPACK=0` (to measure the
/// GGML-layout kernels, or to keep the mapped file as the only copy).
pub fn repack_enabled() -> bool {
    !matches!(std::env::var("PAGELLM_REPACK").as_deref(), Ok("0"))
}
