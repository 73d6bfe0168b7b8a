//! Choosing a replica for a request.
//!
//! `prefix-aware` sends a request to the replica that holds the longest run of its
//! prompt's KV blocks. For pagellm replicas the blocks are exact: the gateway hashes
//! the prompt's token ids the way the engine does (same tokenizer, chat template and
//! chained block hash) and matches them against the hashes each replica publishes as
//! its KV events. For other servers it falls back to the gateway's own routing history
//! over text chunks (what SGLang's cache-aware router does). A load guard overrides the
//! prefix when the chosen replica is much busier than the idlest one.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::Rng;

use crate::config::{LoadGuard, Policy};
use crate::replica::Replica;

/// A request's prompt as block hashes.
#[derive(Debug, Clone)]
pub enum PrefixKey {
    /// The engine's own block hashes of the prompt's token ids, for one block size.
    Exact {
        block_size: usize,
        hashes: Vec<u128>,
    },
    /// Chained hashes of fixed-size chunks of the prompt text.
    Text(Vec<u128>),
    None,
}

impl PrefixKey {
    pub fn hashes(&self) -> (&[u128], bool) {
        match self {
            PrefixKey::Exact { hashes, .. } => (hashes, true),
            PrefixKey::Text(h) => (h, false),
            PrefixKey::None => (&[], false),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    RoundRobin,
    LeastOutstanding,
    PowerOfTwo,
    PrefixHit,
    NoPrefix,
    /// A prefix is held, but less of the prompt than `cache_threshold`.
    LowMatch,
    LoadGuard,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::RoundRobin => "round_robin",
            Reason::LeastOutstanding => "least_outstanding",
            Reason::PowerOfTwo => "power_of_two",
            Reason::PrefixHit => "prefix_hit",
            Reason::NoPrefix => "no_prefix",
            Reason::LowMatch => "low_match",
            Reason::LoadGuard => "load_guard",
        }
    }
}

pub struct Decision {
    pub replica: Arc<Replica>,
    pub reason: Reason,
    /// Leading prompt blocks the replica was believed to hold.
    pub matched_blocks: usize,
}

pub struct Router {
    pub policy: Policy,
    pub guard: LoadGuard,
    pub cache_threshold: f64,
    /// How long scraped metrics count as current.
    pub fresh: Duration,
    rr: AtomicUsize,
}

impl Router {
    pub fn new(policy: Policy, guard: LoadGuard, cache_threshold: f64, fresh: Duration) -> Self {
        Self {
            policy,
            guard,
            cache_threshold,
            fresh,
            rr: AtomicUsize::new(0),
        }
    }

    /// Picks among `candidates` (already filtered to available replicas, non-empty).
    pub fn pick(&self, candidates: &[Arc<Replica>], key: &PrefixKey) -> Option<Decision> {
        if candidates.is_empty() {
            return None;
        }
        let now = Instant::now();
        let start = self.rr.fetch_add(1, Ordering::Relaxed);
        let n = candidates.len();
        let decision = |r: Arc<Replica>, reason, matched| Decision {
            replica: r,
            reason,
            matched_blocks: matched,
        };
        let d = match self.policy {
            Policy::RoundRobin => decision(candidates[start % n].clone(), Reason::RoundRobin, 0),
            Policy::LeastOutstanding => decision(
                least(candidates, start, &|r| {
                    r.in_flight.load(Ordering::Relaxed) as f64
                }),
                Reason::LeastOutstanding,
                0,
            ),
            Policy::PowerOfTwo => {
                let mut rng = rand::thread_rng();
                let a = &candidates[rng.gen_range(0..n)];
                let b = &candidates[rng.gen_range(0..n)];
                let r = if b.load_score(self.fresh) < a.load_score(self.fresh) {
                    b
                } else {
                    a
                };
                decision(r.clone(), Reason::PowerOfTwo, 0)
            }
            Policy::PrefixAware => self.prefix_aware(candidates, key, now, start),
        };
        let (hashes, _) = key.hashes();
        if !hashes.is_empty() {
            d.replica.prefix.lock().unwrap().note_routed(hashes, now);
        }
        Some(d)
    }

    fn prefix_aware(
        &self,
        candidates: &[Arc<Replica>],
        key: &PrefixKey,
        now: Instant,
        start: usize,
    ) -> Decision {
        let (hashes, exact) = key.hashes();
        let load = |r: &Replica| r.load_score(self.fresh);
        let idlest = least(candidates, start, &load);
        let min_load = load(&idlest);
        let mut best: Option<(usize, f64, &Arc<Replica>)> = None;
        if !hashes.is_empty() {
            for r in candidates {
                let m = r.prefix.lock().unwrap().matched(hashes, exact, now);
                let l = load(r);
                let better = match best {
                    None => m > 0,
                    Some((bm, bl, _)) => m > bm || (m == bm && l < bl),
                };
                if better {
                    best = Some((m, l, r));
                }
            }
        }
        match best {
            Some((m, _, _)) if (m as f64) < self.cache_threshold * hashes.len() as f64 => {
                Decision {
                    replica: idlest,
                    reason: Reason::LowMatch,
                    matched_blocks: 0,
                }
            }
            Some((m, l, r)) => {
                let overloaded = l - min_load > self.guard.abs && l > self.guard.rel * min_load;
                if overloaded {
                    Decision {
                        replica: idlest,
                        reason: Reason::LoadGuard,
                        matched_blocks: 0,
                    }
                } else {
                    Decision {
                        replica: r.clone(),
                        reason: Reason::PrefixHit,
                        matched_blocks: m,
                    }
                }
            }
            None => Decision {
                replica: idlest,
                reason: Reason::NoPrefix,
                matched_blocks: 0,
            },
        }
    }
}

/// The candidate with the lowest `score`; scanning from a rotating `start` breaks ties
/// fairly instead of always favouring the first replica.
fn least(
    candidates: &[Arc<Replica>],
    start: usize,
    score: &dyn Fn(&Replica) -> f64,
) -> Arc<Replica> {
    let n = candidates.len();
    (0..n)
        .map(|i| &candidates[(start + i) % n])
        .min_by(|a, b| score(a).total_cmp(&score(b)))
        .expect("non-empty")
        .clone()
}

/// Chained 128-bit hashes of 64-byte chunks of `text` (whole chunks only), for servers
/// whose KV blocks the gateway cannot compute.
pub fn text_hashes(text: &str) -> Vec<u128> {
    use std::hash::{Hash, Hasher};
    const CHUNK: usize = 64;
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len() / CHUNK);
    let mut parent = 0u128;
    for c in bytes.chunks_exact(CHUNK) {
        let half = |k: u8| {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            (k, parent, c).hash(&mut h);
            h.finish()
        };
        parent = ((half(1) as u128) << 64) | half(2) as u128;
        out.push(parent);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Deployment;

    fn replica(id: &str) -> Arc<Replica> {
        Arc::new(Replica::new(Deployment {
            id: id.into(),
            group: "g".into(),
            upstream_model: "m".into(),
            api_base: format!("http://{id}/v1"),
            api_key: None,
            rpm: None,
            tpm: None,
            max_concurrency: None,
        }))
    }

    fn exact(hashes: &[u128]) -> PrefixKey {
        PrefixKey::Exact {
            block_size: 16,
            hashes: hashes.to_vec(),
        }
    }

    fn router(abs: f64, rel: f64) -> Router {
        Router::new(
            Policy::PrefixAware,
            LoadGuard { abs, rel },
            0.5,
            Duration::from_secs(1),
        )
    }

    /// Three replicas with KV events connected; b holds blocks 1-3, c block 1.
    fn held() -> [Arc<Replica>; 3] {
        let rs = [replica("a"), replica("b"), replica("c")];
        for r in &rs {
            r.prefix.lock().unwrap().snapshot([]);
        }
        rs[1].prefix.lock().unwrap().stored([1, 2, 3]);
        rs[2].prefix.lock().unwrap().stored([1]);
        rs
    }

    fn loads(rs: &[Arc<Replica>], l: [usize; 3]) {
        for (r, l) in rs.iter().zip(l) {
            r.in_flight.store(l, Ordering::Relaxed);
        }
    }

    #[test]
    fn prefix_aware_follows_the_longest_held_prefix_until_the_load_guard() {
        let key = exact(&[1, 2, 3, 4]);
        let r = router(4.0, 1.5);
        let rs = held();
        let d = r.pick(&rs, &key).unwrap();
        assert_eq!(
            (d.replica.dep.id.as_str(), d.reason),
            ("b", Reason::PrefixHit)
        );
        assert_eq!(d.matched_blocks, 3);

        // b busier than the idlest by 5 (> 4) and more than 1.5 times: the guard moves
        // the request, and the replica it went to now counts as holding the prefix.
        loads(&rs, [1, 6, 3]);
        let d = r.pick(&rs, &key).unwrap();
        assert_eq!(
            (d.replica.dep.id.as_str(), d.reason),
            ("a", Reason::LoadGuard)
        );
        assert_eq!(
            rs[0]
                .prefix
                .lock()
                .unwrap()
                .matched(&[1, 2, 3, 4], true, Instant::now()),
            4
        );

        // Within SGLang's default thresholds the prefix wins at the same loads.
        let rs = held();
        loads(&rs, [1, 6, 3]);
        let d = router(64.0, 1.5).pick(&rs, &key).unwrap();
        assert_eq!(
            (d.replica.dep.id.as_str(), d.reason),
            ("b", Reason::PrefixHit)
        );
        // Both conditions must hold: 6 - 5 = 1 is over 0.5, but 6 is not over 1.5 × 5.
        let rs = held();
        loads(&rs, [5, 6, 5]);
        let d = router(0.5, 1.5).pick(&rs, &key).unwrap();
        assert_eq!(
            (d.replica.dep.id.as_str(), d.reason),
            ("b", Reason::PrefixHit)
        );

        // A prompt nobody holds goes to the idlest replica, which then counts it as held
        // (routed, its blocks not yet reported) for the next request with that prefix.
        let rs = held();
        loads(&rs, [0, 6, 5]);
        let fresh = exact(&[9, 10]);
        let d = r.pick(&rs, &fresh).unwrap();
        assert_eq!(
            (d.replica.dep.id.as_str(), d.reason),
            ("a", Reason::NoPrefix)
        );
        loads(&rs, [3, 6, 5]);
        let d = r.pick(&rs, &fresh).unwrap();
        assert_eq!(
            (d.replica.dep.id.as_str(), d.reason),
            ("a", Reason::PrefixHit)
        );
        // A held prefix shorter than half the prompt (a shared system prompt) does not
        // pull the request: c holds 1 of 4 blocks, b 3; with b gone, c is no magnet.
        let rs = held();
        loads(&rs, [0, 0, 2]);
        let d = r.pick(&rs[..], &exact(&[1, 5, 6, 7])).unwrap();
        assert_eq!(d.reason, Reason::LowMatch);
        assert_ne!(d.replica.dep.id, "c");
        let d = r
            .pick(&[rs[0].clone(), rs[2].clone()], &exact(&[1, 2, 3, 4]))
            .unwrap();
        assert_eq!(
            (d.replica.dep.id.as_str(), d.reason),
            ("a", Reason::LowMatch)
        );
        // An eviction event takes a block away from the replica.
        rs[1].prefix.lock().unwrap().removed([2]);
        let m = rs[1]
            .prefix
            .lock()
            .unwrap()
            .matched(&[1, 2, 3, 4], true, Instant::now());
        assert_eq!(m, 1);
    }

    #[test]
    fn deployment_rpm_is_counted_under_one_lock() {
        let mut dep = replica("a").dep.clone();
        dep.rpm = Some(3);
        let r = Replica::new(dep);
        let now = Instant::now();
        assert!((0..3).all(|_| r.reserve(now)));
        assert!(!r.reserve(now));
        assert!(!r.available(now));
        let wait = r.limit_wait(now).unwrap();
        assert_eq!(wait, Duration::from_secs(60));
        // A minute later the window is empty again.
        assert!(r.reserve(now + Duration::from_secs(60)));
    }
}
