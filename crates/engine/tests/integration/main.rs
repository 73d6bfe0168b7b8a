//! The engine's integration tests, built as one test binary: each file is a module,
//! so the crate and its dependencies are compiled and linked once, not once per file.

mod engine_model;
mod scheduler;
mod structured;
