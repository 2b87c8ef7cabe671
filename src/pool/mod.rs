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

pub mod core;
mod handed;
mod none;
pub mod queues;
pub mod reuse;
pub mod split;
pub mod testing;
#[cfg(test)]
mod tests;
mod types;
pub mod whole_segments;

pub use self::core::{ArenaLeft, Forgotten};
pub use handed::{Grant, Held, Taken};
pub use none::NonePool;
pub use reuse::{CachingPool, Clock, FenceId, ImmediateClock, ReuseRule, ThreadCache};
pub use types::*;

use crate::base::config::{PoolKind, Stitch};

/// The core of `kind` (`none` has no core: it never caches); `expandable`: large requests of
/// `split` grow one range of mapped memory (`CUDAPOOL_SEGMENTS=expandable`; the other kinds
/// keep whole segments); `stitch`: when that range maps its free blocks' memory again
/// (`CUDAPOOL_STITCH`).
pub fn new_core(kind: PoolKind, expandable: bool, stitch: Stitch) -> Option<Box<dyn core::Core>> {
    match kind {
        PoolKind::Split if expandable => {
            Some(Box::new(split::SplitCore::expandable().stitching(stitch)))
        }
        PoolKind::Split => Some(Box::new(split::SplitCore::default())),
        PoolKind::Binned => Some(Box::new(whole_segments::BinnedCore::default())),
        PoolKind::Simple => Some(Box::new(whole_segments::SimpleCore::default())),
        PoolKind::None => None,
    }
}

/// The pool of `kind`, its reuse made safe by `clock` (`expandable`, `stitch`: see
/// [`new_core`]).
pub fn new_pool(
    kind: PoolKind,
    expandable: bool,
    stitch: Stitch,
    clock: std::sync::Arc<dyn Clock>,
) -> Box<dyn Pool> {
    match new_core(kind, expandable, stitch) {
        Some(core) => Box::new(CachingPool::new(core, clock)),
        None => Box::new(NonePool::default()),
    }
}
