pub mod bench;
pub mod convert;
pub mod generate;
pub mod models;
pub mod tokenize;

use pagellm_model::registry::DEFAULT_MODEL;

/// `--model` and `--threads`, shared by every subcommand that runs a model.
#[derive(clap::Args, Debug, Clone)]
pub struct ModelArgs {
    /// A registry name (see `pagellm models list`), a GGUF file or a Hugging Face directory.
    #[arg(short, long, default_value = DEFAULT_MODEL)]
    pub model: String,
    /// Worker threads (0 = one per core).
    #[arg(short, long, default_value_t = 0)]
    pub threads: usize,
}
