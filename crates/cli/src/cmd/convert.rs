use std::path::PathBuf;

use anyhow::Result;

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum Format {
    /// A Hugging Face directory: config.json, model.safetensors, tokenizer.json.
    Hf,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum Dtype {
    Bf16,
    F32,
}

#[derive(clap::Args)]
pub struct Args {
    /// Output format.
    #[arg(long = "to", value_enum)]
    to: Format,
    /// Weight type of the written tensors.
    #[arg(long, value_enum, default_value = "bf16")]
    dtype: Dtype,
    /// The GGUF model to convert (registry name or path).
    input: String,
    /// Directory to create.
    out_dir: PathBuf,
}

pub fn run(a: Args) -> Result<()> {
    let Format::Hf = a.to;
    let dtype = match a.dtype {
        Dtype::Bf16 => pagellm_model::hf::HfDtype::Bf16,
        Dtype::F32 => pagellm_model::hf::HfDtype::F32,
    };
    pagellm_model::hf::convert_gguf_to_hf(&a.input, &a.out_dir, dtype)?;
    eprintln!("wrote {}", a.out_dir.display());
    Ok(())
}
