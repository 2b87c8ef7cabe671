//! The threads' magazines: each thread's freed blocks in one pool, reused by that thread at
//! once while one queue (or no rule) makes them safe for anyone, without the pool's lock. What
//! they hold and when the pool drains them is on [`Magazine`]; the calling thread's handle on
//! its own is the [`ThreadCache`].

use super::{Clock, ReuseRule};
use crate::base::cu::DevPtr;
use crate::base::sync::SpinLock;
use crate::pool::handed::{Grant, Held, Taken};
use std::cell::RefCell;
use std::sync::Arc;

/// Blocks a thread keeps for itself before the oldest half goes to the shared state.
pub(super) const MAGAZINE: usize = 32;
/// Requests larger than this skip the magazines, and a magazine's total stays under
/// [`MAGAZINE_BYTES`]: a thread never sits on much memory the others cannot see, and large
/// freed blocks reach the core at once to be coalesced (what larger magazines cost in
/// memory: docs/benchmarks.md, "The pool's constants").
pub(super) const MAGAZINE_BLOCK: u64 = 1 << 20;
pub(super) const MAGAZINE_BYTES: u64 = 256 << 20;

/// One thread's freed blocks in one pool, reusable by that thread at once while the rule is
/// not `Fenced`. Only its thread pushes and pops; others lock it only to drain it (a miss,
/// reclaim, teardown, a dead thread's leftovers), so its lock is uncontended on the fast path.
/// Every block in it was freed under `OneQueue` or `Immediate`: it is ready for anyone.
#[derive(Default)]
pub(super) struct Magazine {
    /// Blocks as the program gave them back, oldest first.
    pub(super) blocks: Vec<Held>,
    /// Sum of the requests in `blocks`.
    pub(super) requested: u64,
}

impl Magazine {
    /// The newest block that served a request of exactly `size`.
    pub(super) fn pop(&mut self, size: u64) -> Option<Taken> {
        let i = self.blocks.iter().rposition(|b| b.asked == size)?;
        self.requested -= size;
        // The newest block most often: no move of the rest (`remove` calls memmove even then).
        let b = if i + 1 == self.blocks.len() {
            self.blocks.pop().expect("i is an index of blocks")
        } else {
            self.blocks.remove(i)
        };
        Some(Taken {
            ptr: b.ptr,
            size: b.size,
        })
    }

    /// Whether a block of `asked` bytes fits without a spill.
    pub(super) fn has_room_for(&self, asked: u64) -> bool {
        self.blocks.len() < MAGAZINE && self.requested + asked <= MAGAZINE_BYTES
    }

    /// Keeps a freed block; returns the blocks that no longer fit (to go to the core).
    pub(super) fn push(&mut self, block: Held) -> Vec<Held> {
        self.blocks.push(block);
        self.requested += block.asked;
        if self.blocks.len() <= MAGAZINE && self.requested <= MAGAZINE_BYTES {
            return Vec::new();
        }
        let keep = self.blocks.len() / 2;
        let spill: Vec<_> = self.blocks.drain(..self.blocks.len() - keep).collect();
        self.requested -= spill.iter().map(|b| b.asked).sum::<u64>();
        spill
    }

    /// Every block it holds.
    pub(super) fn all(&self) -> impl Iterator<Item = &Held> + '_ {
        self.blocks.iter()
    }

    /// Empties it; returns what it held.
    pub(super) fn take_all(&mut self) -> Vec<DevPtr> {
        self.requested = 0;
        self.blocks.drain(..).map(|b| b.ptr).collect()
    }
}

pub(super) type SharedMagazine = Arc<SpinLock<Magazine>>;

/// Whether an allocation of `size` may take a block from its thread's magazine under `rule`
/// (asked only for a size that magazines keep).
#[inline]
pub(super) fn magazines_serve(size: u64, rule: impl FnOnce() -> ReuseRule) -> bool {
    size <= MAGAZINE_BLOCK && rule() != ReuseRule::Fenced
}

/// Whether a free of a block asked as `asked` bytes may go to its thread's magazine under
/// `rule` (`keeps_nothing`: the upstream is above its soft limit, or caches nothing); each asked only when
/// the answer still depends on it.
#[inline]
pub(super) fn magazines_keep(
    asked: u64,
    rule: impl FnOnce() -> ReuseRule,
    keeps_nothing: impl FnOnce() -> bool,
) -> bool {
    asked <= MAGAZINE_BLOCK && !keeps_nothing() && rule() != ReuseRule::Fenced
}

/// The calling thread's magazine in one pool, held where the caller keeps its per-thread state
/// (the shim: beside its per-thread cache of the context's pool), so that a cached pair reaches
/// it without this module's thread-local table. [`take`](Self::take) and
/// [`keep`](Self::keep) are the pool's own fast paths (`alloc` and `free` run them first), for
/// the cases that need no lock of the pool: they decide exactly as the pool would.
///
/// Invariant: `magazine` is the calling thread's magazine in the pool whose clock is `clock`,
/// and the cache stays on that thread (it is neither `Send` nor `Sync`). A magazine counts its
/// owners to learn that its thread exited (`drain_magazines`): a cache must be dropped on its
/// thread no later than at that thread's exit.
pub struct ThreadCache {
    pub(super) magazine: SharedMagazine,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) _on_its_thread: std::marker::PhantomData<*const ()>,
}

impl ThreadCache {
    /// A block of exactly `size` from this thread's magazine, where the pool's `alloc` would
    /// take one (the rule lets the thread reuse its own blocks at once, and the size is one
    /// that magazines keep). `None`: ask the pool.
    #[inline]
    pub fn take(&self, size: u64) -> Option<Grant> {
        if !magazines_serve(size, || self.clock.rule()) {
            return None;
        }
        let t = self.magazine.lock().pop(size)?;
        Some(Grant {
            ptr: t.ptr,
            size: t.size,
            from_cache: true,
        })
    }

    /// Keeps `block` in this thread's magazine where the pool's `free` would, and only when
    /// the magazine has room (no spill to the pool); `Err(block)`: give it to the pool.
    /// `over_soft_limit`: the upstream is above its soft limit (blocks then go to the pool).
    #[inline]
    pub fn keep(&self, block: Held, over_soft_limit: bool) -> Result<(), Held> {
        if !magazines_keep(block.asked, || self.clock.rule(), || over_soft_limit) {
            return Err(block);
        }
        let mut m = self.magazine.lock();
        if !m.has_room_for(block.asked) {
            return Err(block);
        }
        let spill = m.push(block);
        debug_assert!(spill.is_empty());
        Ok(())
    }
}

thread_local! {
    /// This thread's magazine in each pool it used, by pool id.
    pub(super) static MAGAZINES: RefCell<Vec<(u64, SharedMagazine)>> = const { RefCell::new(Vec::new()) };
}
