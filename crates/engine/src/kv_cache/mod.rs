//! Paged KV cache bookkeeping: the block pool, prefix-cache hashes and the manager the
//! scheduler talks to.

pub mod block_pool;
pub mod hash;
pub mod manager;

pub use block_pool::{BlockId, BlockPool, KvEvent};
pub use hash::{extend_block_hashes, hash_block, BlockHash};
pub use manager::{ComputedBlocks, KvCacheManager, PrefixCacheStats};
