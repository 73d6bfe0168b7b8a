//! The model crate's integration tests, built as one test binary: each file is a module,
//! so the crate and its dependencies are compiled and linked once, not once per file.

mod gguf_fuzz;
mod gguf_write;
mod golden_generate;
mod hf;
mod load_errors;
mod registry;
mod tokenizer;
