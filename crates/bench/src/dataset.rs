//! Prompts to send: `random` (distinct random prompts of `--input-len` tokens),
//! `prefix-repetition` (a few long shared prefixes, each followed by a random suffix:
//! the prefix cache's workload) or a JSONL file of `{"prompt": ..., "output_len": ...}`.
//!
//! With a tokenizer, random prompts are random vocabulary tokens cut to exactly the
//! requested length, as vLLM's random dataset makes them; without one they are random
//! words, about one token each. Token counts in the results always come from the
//! server's reported usage.

use std::path::Path;

use pagellm_model::tokenizer::{TokenAttr, Tokenizer};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub prompt: String,
    pub output_len: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Dataset {
    Random,
    PrefixRepetition,
    File(String),
}

impl std::str::FromStr for Dataset {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "random" => Ok(Dataset::Random),
            "prefix-repetition" | "prefix_repetition" => Ok(Dataset::PrefixRepetition),
            f if f.ends_with(".jsonl") => Ok(Dataset::File(f.to_string())),
            _ => Err(format!(
                "unknown dataset {s:?}: expected random, prefix-repetition or a FILE.jsonl"
            )),
        }
    }
}

#[derive(Debug, Clone)]
pub struct DatasetArgs {
    pub num_prompts: usize,
    pub input_len: usize,
    pub output_len: usize,
    pub prefix_len: usize,
    pub num_prefixes: usize,
    pub seed: u64,
}

/// Words for prompts made without a tokenizer: common, and one token each in most
/// vocabularies once preceded by a space.
const WORDS: &[&str] = &[
    "the", "of", "and", "to", "in", "is", "was", "for", "on", "that", "with", "as", "by", "at",
    "from", "his", "her", "it", "an", "were", "are", "which", "this", "be", "or", "first", "one",
    "their", "after", "also", "new", "has", "had", "two", "time", "year", "city", "world",
    "school", "state", "water", "music", "game", "house", "river", "light", "early", "small",
    "large", "north", "south", "power", "story", "field", "party", "market", "family", "group",
    "night", "road", "line", "life", "team", "book", "film", "war", "land", "place", "club",
];

/// Makes prompts of exactly `len` tokens (with a tokenizer) or `len` words.
struct PromptMaker<'a> {
    tokenizer: Option<&'a Tokenizer>,
    /// Ordinary (non-special) token ids to draw from.
    ids: Vec<u32>,
}

impl<'a> PromptMaker<'a> {
    fn new(tokenizer: Option<&'a Tokenizer>) -> Self {
        let ids = tokenizer.map_or_else(Vec::new, |t| {
            (0..t.vocab_size() as u32)
                .filter(|&id| {
                    t.token_attr(id) == Some(TokenAttr::Normal)
                        && t.token_to_piece(id)
                            .is_some_and(|p| !p.is_empty() && std::str::from_utf8(p).is_ok())
                })
                .collect()
        });
        Self { tokenizer, ids }
    }

    fn make(&self, rng: &mut StdRng, len: usize) -> anyhow::Result<String> {
        let Some(tok) = self.tokenizer else {
            let words: Vec<&str> = (0..len)
                .map(|_| WORDS[rng.gen_range(0..WORDS.len())])
                .collect();
            return Ok(words.join(" "));
        };
        anyhow::ensure!(!self.ids.is_empty(), "the tokenizer has no ordinary tokens");
        // Decoding and re-encoding can merge tokens: top up and cut until exact.
        let mut ids: Vec<u32> = Vec::with_capacity(len);
        for _ in 0..8 {
            while ids.len() < len {
                ids.push(self.ids[rng.gen_range(0..self.ids.len())]);
            }
            let text = tok.decode(&ids[..len], false);
            ids = tok.encode(&text, false, false)?;
            if ids.len() == len {
                return Ok(text);
            }
            ids.truncate(len);
        }
        let text = tok.decode(&ids, false);
        Ok(text)
    }
}

pub fn build(
    kind: &Dataset,
    a: &DatasetArgs,
    tokenizer: Option<&Tokenizer>,
) -> anyhow::Result<Vec<Sample>> {
    anyhow::ensure!(a.num_prompts > 0, "--num-prompts must be at least 1");
    anyhow::ensure!(a.output_len > 0, "--output-len must be at least 1");
    let mut rng = StdRng::seed_from_u64(a.seed);
    let maker = PromptMaker::new(tokenizer);
    match kind {
        Dataset::Random => {
            anyhow::ensure!(a.input_len > 0, "--input-len must be at least 1");
            (0..a.num_prompts)
                .map(|_| {
                    Ok(Sample {
                        prompt: maker.make(&mut rng, a.input_len)?,
                        output_len: a.output_len,
                    })
                })
                .collect()
        }
        Dataset::PrefixRepetition => {
            anyhow::ensure!(
                a.prefix_len > 0 && a.num_prefixes > 0,
                "prefix-repetition needs --prefix-len and --num-prefixes of at least 1"
            );
            let prefixes: Vec<String> = (0..a.num_prefixes)
                .map(|_| maker.make(&mut rng, a.prefix_len))
                .collect::<anyhow::Result<_>>()?;
            (0..a.num_prompts)
                .map(|i| {
                    let suffix = maker.make(&mut rng, a.input_len.max(1))?;
                    Ok(Sample {
                        prompt: format!("{} {suffix}", prefixes[i % prefixes.len()]),
                        output_len: a.output_len,
                    })
                })
                .collect()
        }
        Dataset::File(path) => load_jsonl(Path::new(path), a),
    }
}

/// One `{"prompt": "...", "output_len": N}` object per line (`output_len` optional);
/// the first `num_prompts` lines are used, repeated if the file has fewer.
fn load_jsonl(path: &Path, a: &DatasetArgs) -> anyhow::Result<Vec<Sample>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(line)
            .map_err(|e| anyhow::anyhow!("{}:{}: not JSON: {e}", path.display(), i + 1))?;
        let prompt = v["prompt"].as_str().ok_or_else(|| {
            anyhow::anyhow!("{}:{}: no string field \"prompt\"", path.display(), i + 1)
        })?;
        let output_len = match &v["output_len"] {
            serde_json::Value::Null => a.output_len,
            n => n.as_u64().filter(|&n| n > 0).ok_or_else(|| {
                anyhow::anyhow!(
                    "{}:{}: \"output_len\" must be a positive integer",
                    path.display(),
                    i + 1
                )
            })? as usize,
        };
        rows.push(Sample {
            prompt: prompt.to_string(),
            output_len,
        });
    }
    anyhow::ensure!(!rows.is_empty(), "{} has no prompts", path.display());
    Ok(rows.iter().cycle().take(a.num_prompts).cloned().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> DatasetArgs {
        DatasetArgs {
            num_prompts: 6,
            input_len: 10,
            output_len: 4,
            prefix_len: 20,
            num_prefixes: 2,
            seed: 3,
        }
    }

    #[test]
    fn random_prompts_are_seeded_and_distinct() {
        let a = build(&Dataset::Random, &args(), None).unwrap();
        assert_eq!(a, build(&Dataset::Random, &args(), None).unwrap());
        assert_eq!(a.len(), 6);
        assert_eq!(a[0].prompt.split(' ').count(), 10);
        assert_ne!(a[0].prompt, a[1].prompt);
        assert!(a.iter().all(|s| s.output_len == 4));
    }

    #[test]
    fn prefix_repetition_shares_prefixes_in_turn() {
        let a = build(&Dataset::PrefixRepetition, &args(), None).unwrap();
        let prefix = |s: &Sample| s.prompt.split(' ').take(20).collect::<Vec<_>>().join(" ");
        assert_eq!(prefix(&a[0]), prefix(&a[2]));
        assert_eq!(prefix(&a[1]), prefix(&a[3]));
        assert_ne!(prefix(&a[0]), prefix(&a[1]));
        assert_ne!(a[0].prompt, a[2].prompt, "suffixes differ");
    }

    #[test]
    fn jsonl_errors_name_the_line() {
        let dir = std::env::temp_dir().join(format!("pagellm-bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("d.jsonl");
        std::fs::write(
            &f,
            "{\"prompt\": \"a\", \"output_len\": 3}\n\n{\"prompt\": \"b\"}\n",
        )
        .unwrap();
        let kind = Dataset::File(f.to_str().unwrap().into());
        let s = build(&kind, &args(), None).unwrap();
        assert_eq!(s.len(), 6);
        assert_eq!(
            (s[0].output_len, s[1].output_len, s[2].prompt.as_str()),
            (3, 4, "a")
        );
        std::fs::write(&f, "{\"prompt\": \"a\"}\n{\"text\": 1}\n").unwrap();
        let e = build(&kind, &args(), None).unwrap_err().to_string();
        assert!(e.ends_with(":2: no string field \"prompt\""), "{e}");
        std::fs::write(&f, "{\"prompt\": \"a\", \"output_len\": 0}\n").unwrap();
        assert!(build(&kind, &args(), None).is_err());
        assert!("x.txt".parse::<Dataset>().is_err());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
