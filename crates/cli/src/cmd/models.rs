use anyhow::Result;
use pagellm_model::registry;

#[derive(clap::Subcommand)]
pub enum ModelsCmd {
    /// Download a model from the registry into the cache.
    Pull {
        /// Registry name, e.g. smollm2-135m.
        name: String,
    },
    /// List known models and whether each is in the cache.
    List,
}

pub fn run(cmd: ModelsCmd) -> Result<()> {
    match cmd {
        ModelsCmd::Pull { name } => {
            let path = registry::pull(&name, true)?;
            println!("{}", path.display());
        }
        ModelsCmd::List => {
            println!("{:<22} {:>10}  {:<8} PATH", "NAME", "SIZE", "PRESENT");
            for m in registry::known_models() {
                let present = registry::is_present(m.name);
                let default = if m.name == registry::DEFAULT_MODEL {
                    " (default)"
                } else {
                    ""
                };
                println!(
                    "{:<22} {:>7} MB  {:<8} {}{}",
                    m.name,
                    m.size / 1_000_000,
                    if present { "yes" } else { "no" },
                    registry::model_path(m.name).display(),
                    default
                );
            }
            println!("cache: {}", registry::home_dir().display());
        }
    }
    Ok(())
}
