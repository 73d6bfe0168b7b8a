//! Stop strings over streamed text.
//!
//! Text is released only once it can no longer turn into a stop string: the longest
//! tail that is a prefix of some stop string is held back. When a stop string appears,
//! the text before it is released and the string itself (and anything after) is not,
//! as in vLLM and the OpenAI API.

use pagellm_model::tokenizer::{IncrementalDecoder, Tokenizer};

#[derive(Debug, Clone, Default)]
pub struct StopStrings {
    stops: Vec<String>,
    /// Text decoded but not yet released.
    held: String,
}

/// What one piece of text did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopScan {
    /// Text safe to release (possibly empty).
    Continue(String),
    /// A stop string matched: the text to release before it, and which string it was.
    Stopped { text: String, stop: String },
}

impl StopStrings {
    pub fn new(stops: Vec<String>) -> Self {
        Self {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            held: String::new(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.stops.is_empty()
    }

    /// Adds newly decoded text.
    pub fn push(&mut self, text: &str) -> StopScan {
        if self.stops.is_empty() {
            return StopScan::Continue(text.to_string());
        }
        self.held.push_str(text);
        // The earliest stop string that occurs wins.
        let hit = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()).map(|at| (at, s)))
            .min_by_key(|(at, s)| (*at, std::cmp::Reverse(s.len())));
        if let Some((at, stop)) = hit {
            let stop = stop.clone();
            let text = self.held[..at].to_string();
            self.held.clear();
            return StopScan::Stopped { text, stop };
        }
        let keep = self.partial_tail();
        let release = self.held.len() - keep;
        let out = self.held[..release].to_string();
        self.held.drain(..release);
        StopScan::Continue(out)
    }

    /// Releases everything held back (generation ended for another reason).
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Length in bytes of the longest tail of `held` that starts some stop string.
    fn partial_tail(&self) -> usize {
        let h = &self.held;
        let mut best = 0;
        for s in &self.stops {
            let max = (s.len() - 1).min(h.len());
            for k in (best + 1..=max).rev() {
                let start = h.len() - k;
                if h.is_char_boundary(start) && s.starts_with(&h[start..]) {
                    best = k;
                    break;
                }
            }
        }
        best
    }
}

/// Token ids in, releasable text out: incremental detokenization (which holds back
/// incomplete UTF-8) followed by the stop-string scan.
pub struct Detokenizer {
    decoder: IncrementalDecoder,
    stops: StopStrings,
}

impl Detokenizer {
    pub fn new(stop: Vec<String>) -> Self {
        Self {
            decoder: IncrementalDecoder::new(true),
            stops: StopStrings::new(stop),
        }
    }

    /// Adds one generated token.
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> StopScan {
        let piece = self.decoder.push(tokenizer, id).unwrap_or_default();
        self.stops.push(&piece)
    }

    /// Generation ended for another reason than a stop string: releases what was held
    /// back (a stop string can still match in the decoder's last bytes).
    pub fn finish(&mut self) -> String {
        let tail = self.decoder.finish().unwrap_or_default();
        match self.stops.push(&tail) {
            StopScan::Continue(mut t) => {
                t.push_str(&self.stops.flush());
                t
            }
            StopScan::Stopped { text, .. } => text,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, Option<String>) {
        let mut s = StopStrings::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for p in pieces {
            match s.push(p) {
                StopScan::Continue(t) => out.push_str(&t),
                StopScan::Stopped { text, stop } => {
                    out.push_str(&text);
                    return (out, Some(stop));
                }
            }
        }
        out.push_str(&s.flush());
        (out, None)
    }

    #[test]
    fn stop_string_split_across_pieces_is_not_released() {
        let mut s = StopStrings::new(vec!["END".into()]);
        assert_eq!(s.push("abc E"), StopScan::Continue("abc ".into()));
        assert_eq!(s.push("N"), StopScan::Continue("".into()));
        assert_eq!(
            s.push("D tail"),
            StopScan::Stopped {
                text: "".into(),
                stop: "END".into()
            }
        );
    }

    #[test]
    fn false_start_is_released_and_earliest_stop_wins() {
        assert_eq!(run(&["END"], &["E", "N", "x"]), ("ENx".into(), None));
        assert_eq!(
            run(&["b", "abc"], &["xabc"]),
            ("x".into(), Some("abc".into()))
        );
        assert_eq!(
            run(&["c", "ab"], &["xabc"]),
            ("x".into(), Some("ab".into()))
        );
        assert_eq!(run(&[], &["a", "b"]), ("ab".into(), None));
        assert_eq!(run(&["é!"], &["caf", "é", "?"]), ("café?".into(), None));
    }
}
