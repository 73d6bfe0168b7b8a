//! Run-time CPU feature detection, done once.

use std::sync::OnceLock;

/// The instruction-set level a kernel family dispatches on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum SimdLevel {
    /// Portable Rust, no explicit SIMD.
    Scalar,
    /// x86-64 AVX2 + FMA + F16C.
    Avx2,
}

/// The best level this CPU supports. `PAGELLM_SIMD=scalar` forces the portable path.
pub fn simd_level() -> SimdLevel {
    static LEVEL: OnceLock<SimdLevel> = OnceLock::new();
    *LEVEL.get_or_init(detect)
}

fn detect() -> SimdLevel {
    if std::env::var("PAGELLM_SIMD").is_ok_and(|v| v.eq_ignore_ascii_case("scalar")) {
        return SimdLevel::Scalar;
    }
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
        {
            return SimdLevel::Avx2;
        }
    }
    SimdLevel::Scalar
}
