//! The pool of KV blocks: reference counts, an LRU free list and the prefix-cache index.
//!
//! Every block is always in exactly one of two states: in use (ref count ≥ 1, owned by
//! one or more requests) or free (ref count 0, on the free list). A free block may still
//! hold a cached prefix: it stays findable by its hash until it is handed out again,
//! which makes the free list double as the eviction order. Blocks are taken from the
//! head and returned to the tail, so the least recently freed cached block is evicted
//! first. The list is linked through indices into the block array: allocate, free and
//! "touch" (reclaim a cached free block) are all O(1).

use std::collections::HashMap;

use super::hash::BlockHash;

/// Index of a physical block in the KV cache.
pub type BlockId = u32;

const NIL: u32 = u32::MAX;

/// A change to the prefix cache's contents, as `GET /v1/kv_events` publishes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvEvent {
    /// A full block became findable under this hash.
    Stored(BlockHash),
    /// The block with this hash was evicted (reused for other content).
    Removed(BlockHash),
    /// Every cached prefix was forgotten.
    Cleared,
}

#[derive(Debug, Clone)]
struct Block {
    ref_cnt: u32,
    /// Set once the block is full and registered in the prefix cache.
    hash: Option<BlockHash>,
    prev: u32,
    next: u32,
    on_free_list: bool,
}

pub struct BlockPool {
    blocks: Vec<Block>,
    head: u32,
    tail: u32,
    num_free: usize,
    /// Full blocks by content hash: the prefix cache.
    cached: HashMap<BlockHash, BlockId>,
    /// Changes to `cached` since the last [`BlockPool::take_events`] (KV events).
    events: Vec<KvEvent>,
    enable_caching: bool,
}

impl BlockPool {
    pub fn new(num_blocks: usize, enable_caching: bool) -> Self {
        assert!(num_blocks > 0 && num_blocks < NIL as usize);
        let mut pool = Self {
            blocks: vec![
                Block {
                    ref_cnt: 0,
                    hash: None,
                    prev: NIL,
                    next: NIL,
                    on_free_list: false,
                };
                num_blocks
            ],
            head: NIL,
            tail: NIL,
            num_free: 0,
            cached: HashMap::new(),
            events: Vec::new(),
            enable_caching,
        };
        for b in 0..num_blocks as u32 {
            pool.push_back(b);
        }
        pool
    }

    pub fn num_blocks(&self) -> usize {
        self.blocks.len()
    }

    pub fn num_free(&self) -> usize {
        self.num_free
    }

    /// Fraction of blocks in use (vLLM's `kv_cache_usage_perc`, as a fraction).
    pub fn usage(&self) -> f64 {
        1.0 - self.num_free as f64 / self.blocks.len() as f64
    }

    pub fn ref_count(&self, b: BlockId) -> u32 {
        self.blocks[b as usize].ref_cnt
    }

    /// Whether the block is registered in the prefix cache.
    pub fn is_cached(&self, b: BlockId) -> bool {
        self.blocks[b as usize].hash.is_some()
    }

    pub fn caching_enabled(&self) -> bool {
        self.enable_caching
    }

    /// The cached block holding exactly this prefix block, if any.
    pub fn lookup(&self, hash: &BlockHash) -> Option<BlockId> {
        if !self.enable_caching {
            return None;
        }
        self.cached.get(hash).copied()
    }

    /// Takes `n` blocks off the head of the free list (evicting any cached content) and
    /// gives each a reference; `None`, touching nothing, if fewer than `n` are free.
    pub fn allocate(&mut self, n: usize) -> Option<Vec<BlockId>> {
        if n > self.num_free {
            return None;
        }
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let b = self.head;
            self.unlink(b);
            self.evict(b);
            self.blocks[b as usize].ref_cnt = 1;
            out.push(b);
        }
        Some(out)
    }

    /// Adds a reference to each block (prefix-cache hits), taking free ones off the
    /// free list.
    pub fn touch(&mut self, blocks: &[BlockId]) {
        for &b in blocks {
            if self.blocks[b as usize].ref_cnt == 0 {
                self.unlink(b);
            }
            self.blocks[b as usize].ref_cnt += 1;
        }
    }

    /// Drops one reference from each block, in the given order; blocks reaching zero go
    /// to the tail of the free list (still cached, evicted last-freed-last).
    pub fn free(&mut self, blocks: impl IntoIterator<Item = BlockId>) {
        for b in blocks {
            let blk = &mut self.blocks[b as usize];
            assert!(blk.ref_cnt > 0, "block {b} freed more often than allocated");
            blk.ref_cnt -= 1;
            if blk.ref_cnt == 0 {
                self.push_back(b);
            }
        }
    }

    /// Registers a full block under its content hash. When another block already holds
    /// the same content, this one stays uncached (and is simply reused once freed).
    pub fn cache(&mut self, b: BlockId, hash: BlockHash) {
        if !self.enable_caching || self.blocks[b as usize].hash.is_some() {
            return;
        }
        if let std::collections::hash_map::Entry::Vacant(e) = self.cached.entry(hash) {
            e.insert(b);
            self.blocks[b as usize].hash = Some(hash);
            self.events.push(KvEvent::Stored(hash));
        }
    }

    /// Number of blocks registered in the prefix cache.
    pub fn num_cached(&self) -> usize {
        self.cached.len()
    }

    /// Forgets every cached prefix (only allowed when no block is in use).
    pub fn reset_prefix_cache(&mut self) -> bool {
        if self.num_free != self.blocks.len() {
            return false;
        }
        for b in self.blocks.iter_mut() {
            b.hash = None;
        }
        self.cached.clear();
        self.events.clear();
        self.events.push(KvEvent::Cleared);
        true
    }

    /// The changes to the set of findable prefix blocks since the last call, in order.
    /// Each hash is held by at most one block, so `Removed` means the prefix is gone.
    pub fn take_events(&mut self) -> Vec<KvEvent> {
        std::mem::take(&mut self.events)
    }

    /// Every hash findable in the prefix cache now.
    pub fn cached_hashes(&self) -> impl Iterator<Item = BlockHash> + '_ {
        self.cached.keys().copied()
    }

    /// Checks the pool's internal consistency; used by tests after every operation.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut seen = 0;
        let mut prev = NIL;
        let mut b = self.head;
        while b != NIL {
            let blk = &self.blocks[b as usize];
            if !blk.on_free_list || blk.ref_cnt != 0 {
                return Err(format!(
                    "block {b} on the free list with ref count {}",
                    blk.ref_cnt
                ));
            }
            if blk.prev != prev {
                return Err(format!("free list back link of block {b} is broken"));
            }
            seen += 1;
            if seen > self.blocks.len() {
                return Err("free list has a cycle".into());
            }
            prev = b;
            b = blk.next;
        }
        if prev != self.tail || seen != self.num_free {
            return Err(format!(
                "free list holds {seen} blocks, counter says {}",
                self.num_free
            ));
        }
        let in_use = self.blocks.iter().filter(|b| b.ref_cnt > 0).count();
        if in_use + self.num_free != self.blocks.len() {
            return Err(format!(
                "{in_use} blocks in use + {} free != {} total",
                self.num_free,
                self.blocks.len()
            ));
        }
        for (h, &b) in &self.cached {
            if self.blocks[b as usize].hash.as_ref() != Some(h) {
                return Err(format!(
                    "cache index points at block {b}, which holds other content"
                ));
            }
        }
        Ok(())
    }

    fn evict(&mut self, b: BlockId) {
        // (Records a `Removed` event when the block's hash leaves the index.)
        if let Some(h) = self.blocks[b as usize].hash.take() {
            if self.cached.get(&h) == Some(&b) {
                self.cached.remove(&h);
                self.events.push(KvEvent::Removed(h));
            }
        }
    }

    fn push_back(&mut self, b: BlockId) {
        let tail = self.tail;
        let blk = &mut self.blocks[b as usize];
        debug_assert!(!blk.on_free_list);
        blk.on_free_list = true;
        blk.prev = tail;
        blk.next = NIL;
        if tail == NIL {
            self.head = b;
        } else {
            self.blocks[tail as usize].next = b;
        }
        self.tail = b;
        self.num_free += 1;
    }

    fn unlink(&mut self, b: BlockId) {
        let Block {
            prev,
            next,
            on_free_list,
            ..
        } = self.blocks[b as usize];
        debug_assert!(on_free_list);
        if prev == NIL {
            self.head = next;
        } else {
            self.blocks[prev as usize].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.blocks[next as usize].prev = prev;
        }
        let blk = &mut self.blocks[b as usize];
        blk.on_free_list = false;
        blk.prev = NIL;
        blk.next = NIL;
        self.num_free -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv_cache::hash::hash_block;

    #[test]
    fn allocate_free_and_lru_eviction_order() {
        let mut p = BlockPool::new(4, true);
        let a = p.allocate(3).unwrap();
        assert_eq!(a, vec![0, 1, 2]);
        assert_eq!(p.num_free(), 1);
        assert!(p.allocate(2).is_none(), "cannot allocate more than is free");
        assert_eq!(p.num_free(), 1, "a failed allocation touches nothing");
        let h = hash_block(None, &[1, 2], None);
        p.cache(1, h);
        // Freed in reverse: 2 first, so it is evicted before 1.
        p.free([2, 1, 0]);
        assert_eq!(p.lookup(&h), Some(1));
        let b = p.allocate(2).unwrap();
        assert_eq!(b, vec![3, 2], "head of the free list first");
        assert_eq!(p.lookup(&h), Some(1), "cached block not evicted yet");
        p.touch(&[1]);
        assert_eq!(p.ref_count(1), 1);
        assert_eq!(p.num_free(), 1);
        p.free([1]);
        let c = p.allocate(2).unwrap();
        assert_eq!(c, vec![0, 1]);
        assert_eq!(p.lookup(&h), None, "reusing a cached block evicts it");
        p.check_invariants().unwrap();
    }

    #[test]
    fn shared_block_needs_every_reference_released() {
        let mut p = BlockPool::new(2, true);
        let a = p.allocate(1).unwrap();
        p.touch(&a);
        assert_eq!(p.ref_count(a[0]), 2);
        p.free(a.clone());
        assert_eq!(p.num_free(), 1);
        p.free(a);
        assert_eq!(p.num_free(), 2);
        p.check_invariants().unwrap();
    }
}
