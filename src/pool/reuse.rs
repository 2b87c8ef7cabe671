//! Reuse safety (DESIGN.md trap 3): a freed block goes back into a [`Core`] only when no device
//! work issued before its free can still touch it.
//!
//! The driver's own `cuMemFree` waits for the device, and programs rely on it
//! (`alloc tmp; launch(tmp); free tmp`). A pool must give the same guarantee without the wait:
//! - in a context that has only one queue per thread (no stream ever created: the legacy
//!   default stream and per-thread default streams), work issued by one thread is in stream
//!   order, so the thread that freed a block may take it back at once;
//! - every other reuse waits for a *fence*: device work issued after the free (events on the
//!   context's streams) that has completed. Frees are fenced in batches, so one fence serves
//!   many blocks, and the fast path never waits for the device.
//!
//! Under memory pressure ([`Pool::reclaim`]) the pool waits for its fences, then gives whole
//! free segments back.

use super::core::Core;
use super::{Grant, Pool, Upstream};
use crate::config::PoolKind;
use crate::cu::{CUresult, DevPtr};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::ThreadId;

/// A fence handle from a [`Clock`].
pub type FenceId = u64;

/// When a freed block may be handed out again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReuseRule {
    /// At once (`CUDAPOOL_REUSE=immediate`).
    Immediate,
    /// At once to the thread that freed it; to others after a fence.
    SameThread,
    /// Only after a fence.
    Fenced,
}

/// The device-side clock of one context: what reuse safety asks the driver.
pub trait Clock: Send + Sync {
    fn rule(&self) -> ReuseRule;
    /// A fence after all device work issued so far that may touch memory freed so far; `None`
    /// when none can be issued now (a graph capture is under way): blocks then stay pending.
    fn issue(&self) -> Option<FenceId>;
    /// Whether the work before `f` has completed. Never waits.
    fn is_done(&self, f: FenceId) -> bool;
    /// Waits until the work before `f` has completed.
    fn wait(&self, f: FenceId);
    /// `f` will not be asked about again.
    fn retire(&self, f: FenceId);
}

/// A clock for `immediate` reuse: never fences.
pub struct ImmediateClock;

impl Clock for ImmediateClock {
    fn rule(&self) -> ReuseRule {
        ReuseRule::Immediate
    }
    fn issue(&self) -> Option<FenceId> {
        None
    }
    fn is_done(&self, _f: FenceId) -> bool {
        true
    }
    fn wait(&self, _f: FenceId) {}
    fn retire(&self, _f: FenceId) {}
}

/// Seal the pending frees once this many are waiting, so none waits for ever.
const MAX_PENDING: usize = 64;

struct Pending {
    ptr: DevPtr,
    /// The request it was handed out for (a same-thread reuse must match it exactly).
    size: u64,
    thread: ThreadId,
}

struct Sealed {
    fence: FenceId,
    blocks: Vec<DevPtr>,
}

/// Invariants: a block is in exactly one of `core` (free and safe to reuse, or in use),
/// `pending` (freed, no fence issued after its free yet) or `sealed` (freed, fence issued, not
/// known to be done). `sealed` is oldest first.
struct State {
    core: Box<dyn Core>,
    pending: Vec<Pending>,
    sealed: VecDeque<Sealed>,
    /// Bytes in `pending` and `sealed` (by the requests they served).
    held_back: u64,
}

/// A caching pool: a [`Core`] behind one lock, with reuse made safe by a [`Clock`].
pub struct CachingPool {
    clock: Arc<dyn Clock>,
    state: Mutex<State>,
}

impl CachingPool {
    pub fn new(core: Box<dyn Core>, clock: Arc<dyn Clock>) -> Self {
        CachingPool {
            clock,
            state: Mutex::new(State {
                core,
                pending: Vec::new(),
                sealed: VecDeque::new(),
                held_back: 0,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Fences every pending free (one fence for the batch).
    fn seal(&self, st: &mut State) {
        if st.pending.is_empty() {
            return;
        }
        if let Some(fence) = self.clock.issue() {
            let blocks = st.pending.drain(..).map(|p| p.ptr).collect();
            st.sealed.push_back(Sealed { fence, blocks });
        }
    }

    /// Moves the batches whose fence is done into the core, oldest first.
    fn collect(&self, st: &mut State, wait: bool) {
        while let Some(front) = st.sealed.front() {
            if wait {
                self.clock.wait(front.fence);
            } else if !self.clock.is_done(front.fence) {
                break;
            }
            let batch = st.sealed.pop_front().expect("front exists");
            self.clock.retire(batch.fence);
            for p in batch.blocks {
                st.held_back -= st.core.block_size(p);
                st.core.put(p);
            }
        }
    }
}

impl Pool for CachingPool {
    fn kind(&self) -> PoolKind {
        self.lock().core.kind()
    }

    fn alloc(&self, size: u64, up: &dyn Upstream) -> Result<Grant, CUresult> {
        let mut st = self.lock();
        let hit = |ptr| {
            Ok(Grant {
                ptr,
                from_cache: true,
            })
        };
        if self.clock.rule() == ReuseRule::SameThread {
            let me = std::thread::current().id();
            if let Some(i) = st
                .pending
                .iter()
                .rposition(|p| p.thread == me && p.size == size)
            {
                let p = st.pending.swap_remove(i);
                st.held_back -= st.core.block_size(p.ptr);
                return hit(p.ptr);
            }
        }
        if let Some(p) = st.core.take(size) {
            return hit(p);
        }
        self.collect(&mut st, false);
        if let Some(p) = st.core.take(size) {
            return hit(p);
        }
        // Fence what is pending now, so it is ready for a later request; then grow.
        self.seal(&mut st);
        st.core.grow(size, up).map(|ptr| Grant {
            ptr,
            from_cache: false,
        })
    }

    fn free(&self, ptr: DevPtr, size: u64, up: &dyn Upstream) -> Result<(), CUresult> {
        let mut st = self.lock();
        if self.clock.rule() == ReuseRule::Immediate {
            st.core.put(ptr);
        } else {
            st.held_back += st.core.block_size(ptr);
            st.pending.push(Pending {
                ptr,
                size,
                thread: std::thread::current().id(),
            });
            if st.pending.len() >= MAX_PENDING {
                self.seal(&mut st);
            }
        }
        if up.over_soft_limit() {
            // Above the soft limit: whatever is safe to give back goes back now.
            self.collect(&mut st, false);
            st.core.release_free_segments(up);
        }
        Ok(())
    }

    fn reclaim(&self, up: &dyn Upstream) -> u64 {
        let mut st = self.lock();
        self.seal(&mut st);
        self.collect(&mut st, true);
        st.core.release_free_segments(up)
    }

    fn cached_bytes(&self) -> u64 {
        let st = self.lock();
        st.core.cached() + st.held_back
    }

    fn owns(&self, ptr: DevPtr) -> bool {
        self.lock().core.owns(ptr)
    }

    fn forget_all(&self) -> (u64, u64) {
        let mut st = self.lock();
        st.pending.clear();
        st.sealed.clear();
        st.held_back = 0;
        st.core.forget()
    }
}
