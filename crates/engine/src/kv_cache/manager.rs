//! The scheduler-facing KV cache manager (vLLM v1's `KVCacheManager`): which blocks each
//! request owns, prefix-cache lookups, and slot allocation for the tokens a step will
//! compute. It decides placement only; the keys and values themselves live in the
//! model runner's [`pagellm_model::PagedKvCache`].

use std::collections::HashMap;

use super::block_pool::{BlockId, BlockPool};
use super::hash::BlockHash;
use crate::request::RequestId;

/// Prefix-cache counters, in tokens (vLLM's `prefix_cache_queries` / `_hits`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixCacheStats {
    pub queries: u64,
    pub hits: u64,
}

pub struct KvCacheManager {
    pool: BlockPool,
    block_size: usize,
    /// Blocks of each running request, in logical order (its block table).
    req_blocks: HashMap<RequestId, Vec<BlockId>>,
    /// How many leading blocks of each request are registered in the prefix cache.
    num_cached_blocks: HashMap<RequestId, usize>,
    pub prefix_stats: PrefixCacheStats,
}

/// The cached prefix found for a request: blocks to share and the tokens they cover.
#[derive(Debug, Default)]
pub struct ComputedBlocks {
    pub blocks: Vec<BlockId>,
    pub num_tokens: usize,
}

impl KvCacheManager {
    pub fn new(num_blocks: usize, block_size: usize, enable_prefix_caching: bool) -> Self {
        Self {
            pool: BlockPool::new(num_blocks, enable_prefix_caching),
            block_size,
            req_blocks: HashMap::new(),
            num_cached_blocks: HashMap::new(),
            prefix_stats: PrefixCacheStats::default(),
        }
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// See [`BlockPool::take_events`].
    pub fn take_events(&mut self) -> Vec<super::KvEvent> {
        self.pool.take_events()
    }

    pub fn usage(&self) -> f64 {
        self.pool.usage()
    }

    /// The request's block table.
    pub fn blocks(&self, id: RequestId) -> &[BlockId] {
        self.req_blocks.get(&id).map_or(&[], |b| b.as_slice())
    }

    /// Blocks needed to hold `num_tokens` tokens.
    pub fn blocks_for(&self, num_tokens: usize) -> usize {
        num_tokens.div_ceil(self.block_size)
    }

    /// The longest run of cached full blocks at the start of a request of `num_tokens`
    /// tokens with these block hashes. At least the last token is always left to compute
    /// (its logits are needed), as in vLLM.
    pub fn get_computed_blocks(&self, hashes: &[BlockHash], num_tokens: usize) -> ComputedBlocks {
        let mut out = ComputedBlocks::default();
        if self.pool.caching_enabled() {
            let max_blocks = (num_tokens.saturating_sub(1)) / self.block_size;
            for h in hashes.iter().take(max_blocks) {
                match self.pool.lookup(h) {
                    Some(b) => out.blocks.push(b),
                    None => break,
                }
            }
            out.num_tokens = out.blocks.len() * self.block_size;
        }
        out
    }

    /// Counts one admitted request's lookup in the hit-rate counters (first admission
    /// only, so recomputation after preemption is not counted as a hit).
    pub fn record_prefix_lookup(&mut self, queried_tokens: usize, hit_tokens: usize) {
        self.prefix_stats.queries += queried_tokens as u64;
        self.prefix_stats.hits += hit_tokens as u64;
    }

    /// Reserves slots so request `id`, with `num_computed` tokens already in its blocks
    /// (plus `new_computed` cached blocks it is about to share), can compute
    /// `num_new_tokens` more; then registers the blocks that become full in the prefix
    /// cache. `hashes` are the request's full-block hashes so far. Returns false, changing
    /// nothing, when the pool has too few free blocks.
    pub fn allocate_slots(
        &mut self,
        id: RequestId,
        num_computed: usize,
        new_computed: &ComputedBlocks,
        num_new_tokens: usize,
        hashes: &[BlockHash],
    ) -> bool {
        let have = self.req_blocks.get(&id).map_or(0, Vec::len);
        let computed = num_computed + new_computed.num_tokens;
        let total = computed + num_new_tokens;
        let need = self
            .blocks_for(total)
            .saturating_sub(have + new_computed.blocks.len());
        // Cached blocks with no owner sit on the free list; sharing them takes them off.
        let reclaimed = new_computed
            .blocks
            .iter()
            .filter(|&&b| self.pool.ref_count(b) == 0)
            .count();
        if need + reclaimed > self.pool.num_free() {
            return false;
        }
        self.pool.touch(&new_computed.blocks);
        let fresh = self.pool.allocate(need).expect("checked free count above");
        let blocks = self.req_blocks.entry(id).or_default();
        blocks.extend_from_slice(&new_computed.blocks);
        blocks.extend(fresh);

        // Register blocks that this step fills completely (their tokens are known now;
        // their keys and values are written before anyone can read them).
        let cached = self.num_cached_blocks.entry(id).or_insert(0);
        if have == 0 {
            // Shared blocks are cached already.
            *cached = new_computed.blocks.len();
        }
        let full = (total / self.block_size).min(hashes.len());
        for i in *cached..full {
            self.pool.cache(blocks[i], hashes[i]);
        }
        *cached = (*cached).max(full);
        true
    }

    /// Releases a request's blocks, last block first so a prefix's tail is evicted
    /// before its head.
    pub fn free(&mut self, id: RequestId) {
        if let Some(blocks) = self.req_blocks.remove(&id) {
            self.pool.free(blocks.into_iter().rev());
        }
        self.num_cached_blocks.remove(&id);
    }

    /// Drops every cached prefix; only possible while no request holds blocks.
    pub fn reset_prefix_cache(&mut self) -> bool {
        self.pool.reset_prefix_cache()
    }

    /// Pool invariants plus: no block appears in two block tables unless it is shared
    /// through the prefix cache, and ref counts equal the number of tables holding a block.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.pool.check_invariants()?;
        let mut owners: HashMap<BlockId, u32> = HashMap::new();
        for blocks in self.req_blocks.values() {
            for &b in blocks {
                *owners.entry(b).or_default() += 1;
            }
        }
        for b in 0..self.pool.num_blocks() as BlockId {
            let n = owners.get(&b).copied().unwrap_or(0);
            if n != self.pool.ref_count(b) {
                return Err(format!(
                    "block {b}: ref count {} but {n} owners",
                    self.pool.ref_count(b)
                ));
            }
            if n > 1 && !self.pool.is_cached(b) {
                return Err(format!(
                    "block {b} is in {n} block tables but not in the prefix cache"
                ));
            }
        }
        Ok(())
    }
}
