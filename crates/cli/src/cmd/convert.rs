use std::path::PathBuf;

use anyhow::{Context, Result};

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum Format {
    /// A Hugging Face directory: config.json, model.safetensors, tokenizer.json.
    Hf,
    /// A GGUF v3 file, as llama.cpp's convert_hf_to_gguf.py writes it (for llama.cpp's
    /// tools); the input may be any model pagellm loads.
    Gguf,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum Dtype {
    Bf16,
    F16,
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
    /// llama.cpp's pre-tokenizer name (tokenizer.ggml.pre) for --to gguf, when it
    /// cannot be told from the model.
    #[arg(long)]
    gguf_pre: Option<String>,
    /// The model to convert: for --to hf a GGUF file or registry name; for --to gguf
    /// anything pagellm loads.
    input: String,
    /// Directory (--to hf) or file (--to gguf) to create.
    out_dir: PathBuf,
}

pub fn run(a: Args) -> Result<()> {
    if let Format::Gguf = a.to {
        use pagellm_model::gguf::write::{write_gguf, GgufDtype};
        let dtype = match a.dtype {
            Dtype::Bf16 => GgufDtype::Bf16,
            Dtype::F16 => GgufDtype::F16,
            Dtype::F32 => GgufDtype::F32,
        };
        let model = pagellm_model::loader::load_model(&a.input)
            .with_context(|| format!("loading {}", a.input))?;
        write_gguf(&model, &a.out_dir, dtype, a.gguf_pre.as_deref())?;
        eprintln!("wrote {}", a.out_dir.display());
        return Ok(());
    }
    let dtype = match a.dtype {
        Dtype::Bf16 => pagellm_model::hf::HfDtype::Bf16,
        Dtype::F16 => pagellm_model::hf::HfDtype::F16,
        Dtype::F32 => pagellm_model::hf::HfDtype::F32,
    };
    pagellm_model::hf::convert_gguf_to_hf(&a.input, &a.out_dir, dtype)?;
    eprintln!("wrote {}", a.out_dir.display());
    Ok(())
}
