//! A hasher for maps keyed by device addresses and handles: one multiply and a fold, instead
//! of SipHash (which cost ~13% of an alloc+free pair). The keys are not attacker-chosen.
//! Device addresses are aligned (their low bits are zero), so the fold brings high bits down:
//! hashbrown picks buckets from the low bits, DashMap shards from the high ones.

use std::hash::{BuildHasherDefault, Hasher};

#[derive(Default, Clone, Copy)]
pub struct AddrHasher(u64);

impl Hasher for AddrHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0 ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }

    fn finish(&self) -> u64 {
        self.0 ^ (self.0 >> 29)
    }
}

pub type AddrBuild = BuildHasherDefault<AddrHasher>;
pub type AddrMap<K, V> = std::collections::HashMap<K, V, AddrBuild>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn aligned_addresses_spread_over_low_and_high_bits() {
        let b = AddrBuild::default();
        let hashes: Vec<u64> = (0..1024u64)
            .map(|i| b.hash_one(0x7f00_0000_0000 + i * 512))
            .collect();
        let low: std::collections::HashSet<u64> = hashes.iter().map(|h| h & 0x3ff).collect();
        let high: std::collections::HashSet<u64> = hashes.iter().map(|h| h >> 58).collect();
        assert!(low.len() > 600, "low bits: {} distinct of 1024", low.len());
        assert_eq!(high.len(), 64, "every top-6-bit shard is used");
    }
}
