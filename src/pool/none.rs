//! `none`: no cache. Every block is a segment of its own, straight from the upstream and back.

use super::handed::{Grant, Held};
use super::types::{Pool, SegmentView, Upstream};
use crate::base::config::PoolKind;
use crate::base::cu::{CUresult, DevPtr};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Invariant: `segments`/`bytes` count exactly the blocks handed out and not yet freed or
/// forgotten; nothing is ever cached, so a freed block is the upstream's again at once.
#[derive(Default)]
pub struct NonePool {
    segments: AtomicU64,
    bytes: AtomicU64,
}

impl Pool for NonePool {
    fn kind(&self) -> PoolKind {
        PoolKind::None
    }

    fn alloc(&self, size: u64, up: &dyn Upstream) -> Result<Grant, CUresult> {
        let ptr = up.alloc(size)?;
        self.segments.fetch_add(1, Relaxed);
        self.bytes.fetch_add(size, Relaxed);
        Ok(Grant {
            ptr,
            size,
            from_cache: false,
        })
    }

    fn free(&self, block: Held, up: &dyn Upstream) -> Result<(), CUresult> {
        up.free_for_program(block.ptr, block.size)?;
        self.segments.fetch_sub(1, Relaxed);
        self.bytes.fetch_sub(block.size, Relaxed);
        Ok(())
    }

    fn trim(&self, _up: &dyn Upstream, _need: u64) -> u64 {
        0
    }

    fn cached_bytes(&self) -> u64 {
        0
    }

    fn segments(&self) -> Vec<SegmentView> {
        Vec::new()
    }

    /// Nothing is ever cached: a pointer not live in the shim is the driver's to judge.
    fn owns(&self, _ptr: DevPtr) -> bool {
        false
    }

    fn forget_all(&self) -> super::Forgotten {
        super::Forgotten {
            segments: self.segments.swap(0, Relaxed),
            bytes: self.bytes.swap(0, Relaxed),
            arena: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{contract, FakeUpstream};
    use super::*;

    #[test]
    fn meets_the_pool_contract() {
        contract(|| Box::new(NonePool::default()));
    }

    #[test]
    fn every_free_goes_upstream_at_once() {
        let up = FakeUpstream::new(1 << 30);
        let pool = NonePool::default();
        let a = pool.alloc(1000, &up).unwrap();
        assert!(!a.from_cache);
        assert_eq!(up.outstanding(), (1, 1000));
        pool.free(a.held(1000), &up).unwrap();
        assert_eq!(up.outstanding(), (0, 0));
        let b = pool.alloc(1000, &up).unwrap();
        assert!(!b.from_cache, "none never serves from a cache");
    }
}
