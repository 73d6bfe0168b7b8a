//! Splitting a server-sent-event byte stream into events, whatever the read boundaries.

/// Accumulates bytes and yields each complete event's `data` payload.
#[derive(Default)]
pub struct SseSplitter {
    buf: Vec<u8>,
}

/// Bytes buffered for one event at most: a chunk is a few hundred bytes; an upstream
/// that never ends an event is cut off instead of growing the gateway's memory.
pub const MAX_EVENT: usize = 8 << 20;

impl SseSplitter {
    /// Appends `bytes`; returns the data of every event completed by them, or an error
    /// when one event grows past [`MAX_EVENT`].
    pub fn push(&mut self, bytes: &[u8]) -> Result<Vec<String>, String> {
        self.buf.extend_from_slice(bytes);
        let mut out = Vec::new();
        loop {
            let end = find_end(&self.buf);
            let Some((at, len)) = end else {
                break;
            };
            let ev: Vec<u8> = self.buf.drain(..at + len).collect();
            let text = String::from_utf8_lossy(&ev[..at]);
            let mut data = String::new();
            for line in text.lines() {
                if let Some(d) = line.strip_prefix("data:") {
                    if !data.is_empty() {
                        data.push('\n');
                    }
                    data.push_str(d.strip_prefix(' ').unwrap_or(d));
                }
            }
            if !data.is_empty() {
                out.push(data);
            }
        }
        if self.buf.len() > MAX_EVENT {
            return Err(format!("an event exceeded {MAX_EVENT} bytes"));
        }
        Ok(out)
    }

    /// Bytes of an unfinished event.
    #[cfg(test)]
    pub fn pending(&self) -> usize {
        self.buf.len()
    }
}

fn find_end(b: &[u8]) -> Option<(usize, usize)> {
    let lf = b.windows(2).position(|w| w == b"\n\n").map(|i| (i, 2));
    let crlf = b.windows(4).position(|w| w == b"\r\n\r\n").map(|i| (i, 4));
    match (lf, crlf) {
        (Some(a), Some(c)) => Some(if a.0 <= c.0 { a } else { c }),
        (a, c) => a.or(c),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_split_anywhere_come_out_whole() {
        let text = b"data: {\"a\":1}\n\ndata: [DONE]\r\n\r\n";
        for cut in 0..text.len() {
            let mut s = SseSplitter::default();
            let mut got = s.push(&text[..cut]).unwrap();
            got.extend(s.push(&text[cut..]).unwrap());
            assert_eq!(
                got,
                vec!["{\"a\":1}".to_string(), "[DONE]".to_string()],
                "cut {cut}"
            );
            assert_eq!(s.pending(), 0);
        }
    }

    #[test]
    fn an_endless_event_is_refused() {
        let mut s = SseSplitter::default();
        assert!(s.push(&vec![b'x'; MAX_EVENT + 1]).is_err());
    }
}
