//! Pools: what serves `cuMemAlloc`/`cuMemFree`. Pure Rust, no FFI: a pool gets memory from an
//! [`Upstream`] (the real driver behind the budget in the shim, an in-process fake in tests)
//! and never sees a context, a hook or a raw pointer of the program.
//!
//! Glossary:
//! - *segment*: one allocation obtained from the upstream.
//! - *block*: what the program holds; a whole segment or a piece of one.
//! - *cached*: segment bytes that no block uses and that the pool keeps for reuse.
//!
//! One pool instance serves one CUDA context: every segment it holds dies with that context.

mod none;

pub use none::NonePool;

use crate::config::PoolKind;
use crate::cu::{CUresult, DevPtr};

/// Where a pool gets device memory.
pub trait Upstream {
    /// A new segment of exactly `bytes`, or the error to give the program
    /// (`CUDA_ERROR_OUT_OF_MEMORY` when the limit or the device is full).
    fn alloc(&self, bytes: u64) -> Result<DevPtr, CUresult>;
    /// Gives back a segment obtained from [`alloc`](Self::alloc) with the same `bytes`; each once.
    fn free(&self, ptr: DevPtr, bytes: u64) -> Result<(), CUresult>;
}

/// What [`Pool::alloc`] hands out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grant {
    pub ptr: DevPtr,
    /// Served from cached memory, without asking the upstream.
    pub from_cache: bool,
}

/// A pool kind. Callers guarantee what the pool cannot check cheaply: `free` is called once per
/// block returned by `alloc`, with the size it was asked for (the shim's live table makes sure).
pub trait Pool: Send + Sync {
    fn kind(&self) -> PoolKind;
    /// A block of at least `size` (> 0) bytes.
    fn alloc(&self, size: u64, up: &dyn Upstream) -> Result<Grant, CUresult>;
    /// The program is done with a block. On `Err` the block is still the program's.
    fn free(&self, ptr: DevPtr, size: u64, up: &dyn Upstream) -> Result<(), CUresult>;
    /// Gives every cached segment back to the upstream; returns the bytes released.
    fn reclaim(&self, up: &dyn Upstream) -> u64;
    /// Bytes held for reuse.
    fn cached_bytes(&self) -> u64;
    /// The context died, and its memory with it: forget every segment without calling the
    /// upstream. Returns (segments, bytes) that were held.
    fn forget_all(&self) -> (u64, u64);
}

/// The pool of `kind`. Kinds not built yet fall back to `none`; the caller says so once.
pub fn new_pool(kind: PoolKind) -> Box<dyn Pool> {
    match kind {
        PoolKind::None | PoolKind::Split | PoolKind::Binned | PoolKind::Simple => {
            Box::new(NonePool::default())
        }
    }
}

/// Whether `kind` has its own implementation in this build.
pub fn is_implemented(kind: PoolKind) -> bool {
    kind == PoolKind::None
}

#[cfg(test)]
pub(crate) mod testing {
    //! An in-process upstream and the contract every pool kind must meet.
    use super::*;
    use crate::cu::CUDA_ERROR_OUT_OF_MEMORY;
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    /// Host-side fake: hands out addresses 256-aligned from a counter, remembers what is out,
    /// refuses beyond `capacity`.
    pub struct FakeUpstream {
        pub capacity: u64,
        state: Mutex<(u64, BTreeMap<DevPtr, u64>)>,
    }

    impl FakeUpstream {
        pub fn new(capacity: u64) -> Self {
            FakeUpstream {
                capacity,
                state: Mutex::new((1 << 20, BTreeMap::new())),
            }
        }
        pub fn outstanding(&self) -> (usize, u64) {
            let s = self.state.lock().unwrap();
            (s.1.len(), s.1.values().sum())
        }
    }

    impl Upstream for FakeUpstream {
        fn alloc(&self, bytes: u64) -> Result<DevPtr, CUresult> {
            let mut s = self.state.lock().unwrap();
            let used: u64 = s.1.values().sum();
            if used + bytes > self.capacity {
                return Err(CUDA_ERROR_OUT_OF_MEMORY);
            }
            let p = s.0;
            s.0 += bytes.div_ceil(256) * 256 + 256;
            s.1.insert(p, bytes);
            Ok(p)
        }
        fn free(&self, ptr: DevPtr, bytes: u64) -> Result<(), CUresult> {
            let mut s = self.state.lock().unwrap();
            assert_eq!(s.1.remove(&ptr), Some(bytes), "upstream free of {ptr:#x}");
            Ok(())
        }
    }

    /// The contract: blocks never overlap, every byte comes back, reclaim empties the cache,
    /// the upstream's refusal reaches the caller, and forget_all accounts for everything.
    pub fn contract(make: fn() -> Box<dyn Pool>) {
        let up = FakeUpstream::new(64 << 20);
        let pool = make();
        let sizes = [1u64, 255, 256, 4096, 1 << 20, 3 << 20, 100, 8 << 20];
        let mut held: Vec<(DevPtr, u64)> = Vec::new();
        for &s in &sizes {
            let g = pool.alloc(s, &up).expect("fits");
            for &(p, q) in &held {
                assert!(
                    g.ptr + s <= p || p + q <= g.ptr,
                    "overlap {g:?}+{s} with {p:#x}+{q}"
                );
            }
            held.push((g.ptr, s));
        }
        for (p, s) in held.drain(..) {
            pool.free(p, s, &up).unwrap();
        }
        let cached = pool.cached_bytes();
        assert_eq!(pool.reclaim(&up), cached);
        assert_eq!(pool.cached_bytes(), 0);
        assert_eq!(
            up.outstanding(),
            (0, 0),
            "everything back upstream after reclaim"
        );

        // The upstream's refusal reaches the caller and leaves the pool usable.
        assert_eq!(pool.alloc(65 << 20, &up), Err(CUDA_ERROR_OUT_OF_MEMORY));
        let g = pool.alloc(8 << 20, &up).unwrap();
        let (segments, bytes) = pool.forget_all();
        assert!(segments >= 1 && bytes >= 8 << 20);
        assert_eq!(pool.cached_bytes(), 0);
        let _ = g;
    }
}
