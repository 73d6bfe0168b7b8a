//! The prefix cache's contents as a stream of changes, for routers outside the engine
//! (vLLM's KV events, in the spirit of `BlockStored` / `BlockRemoved`).
//!
//! The engine thread appends each step's changes to a [`KvEventLog`] shared with
//! subscribers: a bounded ring of numbered batches plus the current set of hashes.
//! A subscriber starts from a snapshot (the set and its sequence number), then reads
//! the batches after it; one that falls behind the ring gets a fresh snapshot. The
//! engine thread never waits on a subscriber.

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use crate::kv_cache::KvEvent;

/// Batches kept for subscribers that are behind.
const RING: usize = 1024;

#[derive(Default)]
pub struct KvEventLog {
    seq: u64,
    ring: VecDeque<(u64, Arc<Vec<KvEvent>>)>,
    cached: HashSet<u128>,
}

/// What a subscriber reads next.
pub enum KvUpdate {
    /// Everything findable now, as of `seq`.
    Snapshot { seq: u64, hashes: Vec<u128> },
    /// The batches after the subscriber's sequence number, up to `seq`.
    Batches {
        seq: u64,
        batches: Vec<Arc<Vec<KvEvent>>>,
    },
}

impl KvEventLog {
    fn apply(&mut self, events: Vec<KvEvent>) -> u64 {
        for e in &events {
            match e {
                KvEvent::Stored(h) => {
                    self.cached.insert(h.0);
                }
                KvEvent::Removed(h) => {
                    self.cached.remove(&h.0);
                }
                KvEvent::Cleared => self.cached.clear(),
            }
        }
        self.seq += 1;
        self.ring.push_back((self.seq, Arc::new(events)));
        if self.ring.len() > RING {
            self.ring.pop_front();
        }
        self.seq
    }

    pub fn snapshot(&self) -> KvUpdate {
        KvUpdate::Snapshot {
            seq: self.seq,
            hashes: self.cached.iter().copied().collect(),
        }
    }

    /// The batches after `after`, or a snapshot when they are no longer all kept.
    pub fn since(&self, after: u64) -> KvUpdate {
        let oldest = self.ring.front().map_or(self.seq + 1, |b| b.0);
        if after + 1 < oldest && after < self.seq {
            return self.snapshot();
        }
        KvUpdate::Batches {
            seq: self.seq,
            batches: self
                .ring
                .iter()
                .filter(|b| b.0 > after)
                .map(|b| b.1.clone())
                .collect(),
        }
    }
}

/// The engine's side: appends and wakes subscribers.
pub struct KvEventPublisher {
    log: Arc<Mutex<KvEventLog>>,
    seq: watch::Sender<u64>,
}

/// A subscriber's handle: the log and a signal that it grew.
#[derive(Clone)]
pub struct KvEvents {
    pub log: Arc<Mutex<KvEventLog>>,
    pub changed: watch::Receiver<u64>,
}

pub fn channel() -> (KvEventPublisher, KvEvents) {
    let log = Arc::new(Mutex::new(KvEventLog::default()));
    let (tx, rx) = watch::channel(0);
    (
        KvEventPublisher {
            log: log.clone(),
            seq: tx,
        },
        KvEvents { log, changed: rx },
    )
}

impl KvEventPublisher {
    pub fn publish(&self, events: Vec<KvEvent>) {
        if events.is_empty() {
            return;
        }
        if let Ok(mut log) = self.log.lock() {
            let seq = log.apply(events);
            self.seq.send_replace(seq);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv_cache::BlockHash;

    #[test]
    fn subscribers_catch_up_or_restart_from_a_snapshot() {
        let (publisher, sub) = channel();
        publisher.publish(vec![
            KvEvent::Stored(BlockHash(1)),
            KvEvent::Stored(BlockHash(2)),
        ]);
        publisher.publish(vec![KvEvent::Removed(BlockHash(1))]);
        let log = sub.log.lock().unwrap();
        let KvUpdate::Snapshot { seq, mut hashes } = log.snapshot() else {
            panic!()
        };
        hashes.sort();
        assert_eq!((seq, hashes), (2, vec![2]));
        let KvUpdate::Batches { seq, batches } = log.since(1) else {
            panic!()
        };
        assert_eq!(seq, 2);
        assert_eq!(*batches[0], vec![KvEvent::Removed(BlockHash(1))]);
        drop(log);
        for i in 0..RING as u128 + 5 {
            publisher.publish(vec![KvEvent::Stored(BlockHash(100 + i))]);
        }
        let log = sub.log.lock().unwrap();
        assert!(
            matches!(log.since(2), KvUpdate::Snapshot { .. }),
            "lagged subscriber"
        );
        assert!(
            matches!(log.since(log.seq), KvUpdate::Batches { ref batches, .. } if batches.is_empty())
        );
    }
}
