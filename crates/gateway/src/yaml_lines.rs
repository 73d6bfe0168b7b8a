//! Where each key of a YAML file is: a map from dotted paths
//! (`model_list[0].litellm_params.rpm`) to line numbers, so that errors found after
//! deserializing still name the line.

use std::collections::BTreeMap;

use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::Marker;

use crate::config::ConfigError;

pub struct LineIndex {
    lines: BTreeMap<String, usize>,
    order: Vec<String>,
}

enum Frame {
    Map { key: Option<String> },
    Seq { index: usize },
}

struct Recv {
    stack: Vec<Frame>,
    out: LineIndex,
}

impl Recv {
    fn prefix(&self) -> String {
        let mut p = String::new();
        // The last frame's own key is not part of its prefix while it expects one.
        for f in &self.stack {
            match f {
                Frame::Map { key: Some(k) } => {
                    if !p.is_empty() {
                        p.push('.');
                    }
                    p.push_str(k);
                }
                Frame::Map { key: None } => {}
                Frame::Seq { index } => p.push_str(&format!("[{index}]")),
            }
        }
        p
    }

    /// A value (scalar or finished collection) completed in the current frame.
    fn value_done(&mut self) {
        match self.stack.last_mut() {
            Some(Frame::Map { key }) => *key = None,
            Some(Frame::Seq { index }) => *index += 1,
            None => {}
        }
    }
}

impl MarkedEventReceiver for Recv {
    fn on_event(&mut self, ev: Event, mark: Marker) {
        match ev {
            Event::Scalar(value, ..) => {
                if let Some(Frame::Map { key: None }) = self.stack.last() {
                    let prefix = self.prefix();
                    let path = if prefix.is_empty() {
                        value.clone()
                    } else {
                        format!("{prefix}.{value}")
                    };
                    self.out.order.push(path.clone());
                    self.out.lines.entry(path).or_insert(mark.line());
                    if let Some(Frame::Map { key }) = self.stack.last_mut() {
                        *key = Some(value);
                    }
                } else {
                    self.value_done();
                }
            }
            Event::Alias(_) => self.value_done(),
            Event::MappingStart(..) => self.stack.push(Frame::Map { key: None }),
            Event::SequenceStart(..) => self.stack.push(Frame::Seq { index: 0 }),
            Event::MappingEnd | Event::SequenceEnd => {
                self.stack.pop();
                self.value_done();
            }
            _ => {}
        }
    }
}

impl LineIndex {
    pub fn new(text: &str) -> Result<LineIndex, ConfigError> {
        let mut r = Recv {
            stack: Vec::new(),
            out: LineIndex {
                lines: BTreeMap::new(),
                order: Vec::new(),
            },
        };
        Parser::new_from_str(text)
            .load(&mut r, false)
            .map_err(|e| ConfigError(format!("not valid YAML: {e}")))?;
        Ok(r.out)
    }

    /// The line of `path`, or of its nearest ancestor that has one.
    pub fn line(&self, path: &str) -> Option<usize> {
        let mut p = path;
        loop {
            if let Some(&l) = self.lines.get(p) {
                return Some(l);
            }
            let cut = p.rfind(['.', '['])?;
            p = &p[..cut];
        }
    }

    /// Every key path, in file order.
    pub fn paths(&self) -> impl Iterator<Item = String> + '_ {
        self.order.iter().cloned()
    }

    pub fn err(&self, path: &str, msg: impl std::fmt::Display) -> ConfigError {
        match self.line(path) {
            Some(l) => ConfigError(format!("{path} (line {l}): {msg}")),
            None => ConfigError(format!("{path}: {msg}")),
        }
    }
}
