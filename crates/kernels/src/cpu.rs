//! Run-time CPU feature detection, done once.

use std::sync::OnceLock;

/// The instruction-set level a kernel family dispatches on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum SimdLevel {
    /// Portable Rust, no explicit SIMD.
    Scalar,
    /// x86-64 AVX2 + FMA + F16C.
    Avx2,
    /// AVX2 level plus AVX-512 F/BW/VL with VNNI (`vpdpbusd`).
    Avx512Vnni,
}

/// The best level this CPU supports. `PAGELLM_SIMD=scalar` forces the portable path,
/// `PAGELLM_SIMD=avx2` caps the level at AVX2 (to compare kernel families on one
/// machine); `PAGELLM_SIMD=reference` selects [`Numerics::Reference`] by default and
/// leaves the level alone.
pub fn simd_level() -> SimdLevel {
    static LEVEL: OnceLock<SimdLevel> = OnceLock::new();
    *LEVEL.get_or_init(detect)
}

/// Checks `PAGELLM_SIMD` (unset, empty, `scalar`, `avx2` or `reference`, any case) and
/// `PAGELLM_REPACK` (unset, `0` or `1`); anything else is an error naming the value,
/// which the kernels would otherwise ignore.
pub fn check_env() -> Result<(), String> {
    if let Ok(v) = std::env::var("PAGELLM_REPACK") {
        if !["", "0", "1"].contains(&v.as_str()) {
            return Err(format!(
                "PAGELLM_REPACK={v}: expected 0 (keep weights in their file layout) or 1 \
                 (repack them at load, the default)"
            ));
        }
    }
    match std::env::var("PAGELLM_SIMD") {
        Ok(v)
            if !v.is_empty()
                && !["scalar", "avx2", "reference"]
                    .iter()
                    .any(|k| v.eq_ignore_ascii_case(k)) =>
        {
            Err(format!(
                "PAGELLM_SIMD={v}: expected scalar, avx2 or reference (or unset for the best \
                 kernels this CPU runs)"
            ))
        }
        _ => Ok(()),
    }
}

fn detect() -> SimdLevel {
    let cap = match std::env::var("PAGELLM_SIMD") {
        Ok(v) if v.eq_ignore_ascii_case("scalar") => SimdLevel::Scalar,
        Ok(v) if v.eq_ignore_ascii_case("avx2") => SimdLevel::Avx2,
        _ => SimdLevel::Avx512Vnni,
    };
    supported().min(cap)
}

/// The best level this CPU supports, whatever `PAGELLM_SIMD` says.
pub fn supported() -> SimdLevel {
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
        {
            if is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx512vnni")
            {
                return SimdLevel::Avx512Vnni;
            }
            return SimdLevel::Avx2;
        }
    }
    SimdLevel::Scalar
}

/// Every level, lowest first.
pub const LEVELS: [SimdLevel; 3] = [SimdLevel::Scalar, SimdLevel::Avx2, SimdLevel::Avx512Vnni];

/// The name of `level`, as `PAGELLM_SIMD` and the reports spell it.
pub fn level_name(level: SimdLevel) -> &'static str {
    match level {
        SimdLevel::Scalar => "scalar",
        SimdLevel::Avx2 => "avx2",
        SimdLevel::Avx512Vnni => "avx512vnni",
    }
}

/// The arithmetic a forward pass uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Numerics {
    /// The kernels of [`simd_level`]: activations quantized per weight type, integer
    /// dot products, f16 keys and values in attention.
    #[default]
    Fast,
    /// The float reference: every weight row dequantized to f32 and multiplied with the
    /// f32 activations (no activation quantization), attention in f32 without f16
    /// roundings; every sum in a fixed order of eight f32 lanes, so the result is the
    /// same on every machine. What the fast kernels' fidelity is measured against.
    Reference,
}

/// The numerics a new workspace starts with: [`Numerics::Reference`] under
/// `PAGELLM_SIMD=reference`, else [`Numerics::Fast`].
pub fn default_numerics() -> Numerics {
    static N: OnceLock<Numerics> = OnceLock::new();
    *N.get_or_init(|| {
        if std::env::var("PAGELLM_SIMD").is_ok_and(|v| v.eq_ignore_ascii_case("reference")) {
            Numerics::Reference
        } else {
            Numerics::Fast
        }
    })
}
