//! Content hashes of full KV blocks for prefix caching.
//!
//! A block's hash chains its parent's hash, its tokens and the request's `cache_salt`
//! (first block only, so differently salted requests never share anything), as vLLM
//! does: equal hashes mean equal prefixes from position 0, not just equal blocks.
//! Two differently keyed 64-bit SipHash runs give 128 bits, which makes an accidental
//! collision (and with it another request's keys and values) vanishingly unlikely.

use std::hash::{Hash, Hasher};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockHash(pub u128);

pub fn hash_block(parent: Option<BlockHash>, tokens: &[u32], salt: Option<&str>) -> BlockHash {
    let half = |key: u8| {
        // `DefaultHasher::new()` is SipHash with fixed keys: stable within a process.
        let mut h = std::collections::hash_map::DefaultHasher::new();
        key.hash(&mut h);
        parent.map(|p| p.0).hash(&mut h);
        tokens.hash(&mut h);
        salt.hash(&mut h);
        h.finish()
    };
    BlockHash(((half(1) as u128) << 64) | half(2) as u128)
}

/// Extends `hashes` to cover every full block of `tokens`.
pub fn extend_block_hashes(
    hashes: &mut Vec<BlockHash>,
    tokens: &[u32],
    block_size: usize,
    salt: Option<&str>,
) {
    let full = tokens.len() / block_size;
    while hashes.len() < full {
        let i = hashes.len();
        let parent = hashes.last().copied();
        let salt = if i == 0 { salt } else { None };
        hashes.push(hash_block(
            parent,
            &tokens[i * block_size..(i + 1) * block_size],
            salt,
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_depends_on_parent_tokens_and_salt() {
        let a = hash_block(None, &[1, 2, 3], None);
        assert_eq!(a, hash_block(None, &[1, 2, 3], None));
        assert_ne!(a, hash_block(None, &[1, 2, 4], None));
        assert_ne!(a, hash_block(None, &[1, 2, 3], Some("s")));
        assert_ne!(
            hash_block(Some(a), &[5], None),
            hash_block(None, &[5], None)
        );
        let mut hs = Vec::new();
        extend_block_hashes(&mut hs, &[1, 2, 3, 4, 5], 2, None);
        assert_eq!(hs.len(), 2);
        assert_eq!(hs[0], hash_block(None, &[1, 2], None));
        assert_eq!(hs[1], hash_block(Some(hs[0]), &[3, 4], None));
    }
}
