use anyhow::Result;
use pagellm_model::loader::load_tokenizer;

#[derive(clap::Args)]
pub struct Args {
    #[arg(short, long, default_value = pagellm_model::registry::DEFAULT_MODEL)]
    model: String,
    /// Parse special tokens such as `<|im_start|>` in the text and add BOS/EOS as the model asks.
    #[arg(long)]
    special: bool,
    /// The text to tokenize.
    text: String,
}

pub fn run(a: Args) -> Result<()> {
    let tok = load_tokenizer(&a.model)?;
    let ids = tok.encode(&a.text, a.special, a.special)?;
    println!("{}", serde_json::to_string(&ids)?);
    Ok(())
}
