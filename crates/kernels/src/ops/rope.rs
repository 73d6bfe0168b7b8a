//! Rotary position embeddings (RoPE, Su et al. 2021) with a cached cos/sin table.

/// Which dimensions RoPE rotates together within a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Pairs `(2i, 2i+1)`: ggml's "normal" mode, used by GGUF llama checkpoints, whose
    /// converter permutes the Q/K rows of the Hugging Face weights into this order.
    Interleaved,
    /// Pairs `(i, i + head_dim/2)` ("rotate_half"): Hugging Face checkpoints and GGUF qwen2.
    Neox,
}

/// cos/sin of `pos · theta^(-2i/d)` for every position seen so far.
pub struct RopeTable {
    head_dim: usize,
    theta: f32,
    style: RopeStyle,
    /// (positions, head_dim/2) cos values then the same for sin, interleaved per position.
    table: Vec<f32>,
}

impl RopeTable {
    pub fn new(head_dim: usize, theta: f32, style: RopeStyle) -> Self {
        assert!(head_dim.is_multiple_of(2));
        Self {
            head_dim,
            theta,
            style,
            table: Vec::new(),
        }
    }

    pub fn style(&self) -> RopeStyle {
        self.style
    }

    fn n_positions(&self) -> usize {
        self.table.len() / self.head_dim
    }

    /// Extends the table to cover positions `0..n`.
    pub fn ensure(&mut self, n: usize) {
        let half = self.head_dim / 2;
        // Same recurrence as ggml's rope (theta *= theta_scale per pair) so that angles
        // round the same way as the reference implementation.
        let theta_scale = self.theta.powf(-2.0 / self.head_dim as f32);
        for pos in self.n_positions()..n {
            let mut t = pos as f32;
            let start = self.table.len();
            self.table.resize(start + self.head_dim, 0.0);
            for i in 0..half {
                let (s, c) = t.sin_cos();
                self.table[start + i] = c;
                self.table[start + half + i] = s;
                t *= theta_scale;
            }
        }
    }

    /// Rotates every head of every token in `x`, shaped (n_tokens, n_heads, head_dim).
    /// The products are fused the way GCC contracts ggml's `x0*cos - x1*sin` (one
    /// product rounded, the other fused), which is what makes K and Q round to the same f16
    /// values as llama.cpp's.
    /// Positions must be covered by `ensure`.
    pub fn apply(&self, x: &mut [f32], n_heads: usize, positions: &[usize]) {
        assert_eq!(x.len(), positions.len() * n_heads * self.head_dim);
        for (tok, &pos) in x.chunks_exact_mut(n_heads * self.head_dim).zip(positions) {
            self.apply_token(tok, pos);
        }
    }

    /// Rotates one token's heads (`tok`: whole heads, one after another) to position
    /// `pos`.
    pub fn apply_token(&self, tok: &mut [f32], pos: usize) {
        assert!(
            pos < self.n_positions(),
            "rope table not extended to position {pos}"
        );
        assert!(tok.len().is_multiple_of(self.head_dim), "partial head");
        #[cfg(target_arch = "x86_64")]
        if crate::cpu::simd_level() >= crate::cpu::SimdLevel::Avx2 {
            // SAFETY: the AVX2 level is only chosen on CPUs with FMA.
            return unsafe { self.rotate_fma(tok, pos) };
        }
        self.rotate(tok, pos)
    }

    /// [`RopeTable::rotate`] with `mul_add` as one instruction instead of a library call
    /// (an FMA is exactly rounded either way: the same bits).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "fma")]
    unsafe fn rotate_fma(&self, tok: &mut [f32], pos: usize) {
        self.rotate(tok, pos)
    }

    #[inline(always)]
    fn rotate(&self, tok: &mut [f32], pos: usize) {
        let hd = self.head_dim;
        let half = hd / 2;
        let cs = &self.table[pos * hd..(pos + 1) * hd];
        let (cos, sin) = cs.split_at(half);
        for head in tok.chunks_exact_mut(hd) {
            match self.style {
                RopeStyle::Interleaved => {
                    for i in 0..half {
                        let (x0, x1) = (head[2 * i], head[2 * i + 1]);
                        head[2 * i] = x0.mul_add(cos[i], -(x1 * sin[i]));
                        head[2 * i + 1] = x0.mul_add(sin[i], x1 * cos[i]);
                    }
                }
                RopeStyle::Neox => {
                    let (a, b) = head.split_at_mut(half);
                    for i in 0..half {
                        let (x0, x1) = (a[i], b[i]);
                        a[i] = x0.mul_add(cos[i], -(x1 * sin[i]));
                        b[i] = x0.mul_add(sin[i], x1 * cos[i]);
                    }
                }
            }
        }
    }
}
