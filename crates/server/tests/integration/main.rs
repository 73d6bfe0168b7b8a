//! The server's integration tests, built as one test binary: each file is a module,
//! so the crate and its dependencies are compiled and linked once, not once per file.

#[path = "../common/mod.rs"]
mod common;
mod server;
mod tiny_server;
mod vllm_options;
