//! The kernels' property tests, built as one test binary: each file is a module,
//! so the crate and its dependencies are compiled and linked once, not once per file.

mod interleave_prop;
mod quant_prop;
mod wq_prop;
