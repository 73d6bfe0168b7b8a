use std::path::PathBuf;

use anyhow::{Context, Result};
use pagellm_quant::quantize::{quantize_model, Method, QuantizeOptions};

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum MethodArg {
    /// Weight-only INT8 per output channel (compressed-tensors pack-quantized).
    Int8,
    /// INT8 weights per channel, INT8 activations per token at run time
    /// (compressed-tensors int-quantized).
    W8a8,
    /// INT4 round-to-nearest per group (compressed-tensors pack-quantized).
    Rtn,
    /// FP8 E4M3 weights per channel (compressed-tensors naive-quantized).
    Fp8,
    /// INT4 per group with zero points, activation-aware scales and clipping searched on
    /// --calib text (AutoAWQ's method; AutoAWQ GEMM layout).
    Awq,
    /// INT4 per group from the Hessian of the --calib activations, with error feedback
    /// (GPTQ; GPTQ's layout, symmetric unless --zero-point).
    Gptq,
}

#[derive(clap::Args)]
pub struct Args {
    /// The model to quantize: a registry name, GGUF file or Hugging Face directory.
    #[arg(short, long)]
    model: String,
    /// The quantization method.
    #[arg(long, value_enum)]
    method: MethodArg,
    /// Directory to create.
    #[arg(long)]
    out: PathBuf,
    /// Columns per INT4 scale (128, or 64/32 for models whose widths need them).
    #[arg(long, default_value_t = 128)]
    group_size: usize,
    /// INT4 with a zero point per group (asymmetric) instead of symmetric.
    #[arg(long)]
    zero_point: bool,
    /// FP8 with one scale for the whole tensor instead of one per channel.
    #[arg(long)]
    per_tensor: bool,
    /// GPTQ: quantize columns by decreasing Hessian diagonal (desc_act, stored with
    /// g_idx).
    #[arg(long)]
    act_order: bool,
    /// GPTQ: dampening added to the Hessian diagonal, as a fraction of its mean.
    #[arg(long, default_value_t = 0.01)]
    damp: f32,
    /// W8A8: SmoothQuant, migrating activation outliers into the weights with strength
    /// α (0.5 is llm-compressor's default); needs --calib.
    #[arg(long)]
    smooth_alpha: Option<f32>,
    /// Calibration text (AWQ, GPTQ, SmoothQuant).
    #[arg(long)]
    calib: Option<PathBuf>,
    /// Calibration windows taken from the text, evenly spaced.
    #[arg(long, default_value_t = 32)]
    calib_samples: usize,
    /// Tokens per calibration window.
    #[arg(long, default_value_t = 512)]
    calib_seq_len: usize,
    /// Tokens the AWQ scale search measures its loss on (a subsample of the
    /// calibration tokens; the Q/K/V search takes whole calibration windows, twice as
    /// many tokens, through the attention block).
    #[arg(long, default_value_t = 512)]
    awq_search_tokens: usize,
    /// Worker threads (0 = one per core).
    #[arg(short, long, default_value_t = 0)]
    threads: usize,
    /// No progress bar.
    #[arg(short, long)]
    quiet: bool,
}

pub fn run(a: Args) -> Result<()> {
    let model = pagellm_model::loader::load_model(&a.model)
        .with_context(|| format!("loading {}", a.model))?;
    let method = match a.method {
        MethodArg::Int8 => Method::Int8,
        MethodArg::W8a8 => Method::W8a8,
        MethodArg::Rtn => Method::Rtn,
        MethodArg::Fp8 => Method::Fp8,
        MethodArg::Awq => Method::Awq,
        MethodArg::Gptq => Method::Gptq,
    };
    let calib = a
        .calib
        .as_ref()
        .map(|p| -> Result<_> {
            Ok(pagellm_quant::calib::CalibOptions {
                text: std::fs::read_to_string(p)
                    .with_context(|| format!("--calib {}", p.display()))?,
                source: p.display().to_string(),
                samples: a.calib_samples,
                seq_len: a.calib_seq_len,
            })
        })
        .transpose()?;
    let threads = if a.threads == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        a.threads
    };
    let o = QuantizeOptions {
        method,
        group_size: a.group_size,
        zero_point: a.zero_point,
        per_tensor: a.per_tensor,
        calib,
        awq_search_tokens: a.awq_search_tokens,
        act_order: a.act_order,
        damp: a.damp,
        smooth_alpha: a.smooth_alpha,
        threads,
    };
    let bar = super::eval::layer_bar(a.quiet, "layers");
    let summary = quantize_model(&model, &o, &a.out, |done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    })?;
    bar.finish_and_clear();
    eprintln!(
        "wrote {} ({} linear layers, {:.1} MB, {:.1} s)",
        a.out.display(),
        summary.linear_layers,
        summary.bytes_on_disk as f64 / 1e6,
        summary.seconds
    );
    Ok(())
}
