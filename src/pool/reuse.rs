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
use super::{Grant, Pool, StreamKey, Upstream};
use crate::config::PoolKind;
use crate::cu::{CUresult, DevPtr};
use crate::striped::thread_number;
use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

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
/// Blocks a thread keeps for itself before the oldest half goes to the shared state.
const MAGAZINE: usize = 32;
/// Requests larger than this skip the magazines, and a magazine's total stays under
/// [`MAGAZINE_BYTES`]: a thread never sits on much memory the others cannot see, and large
/// freed blocks reach the core at once to be coalesced (with 64 MiB here, peak reserved / peak
/// requested on the recorded PyTorch trace went from 1.124 to 1.155).
const MAGAZINE_BLOCK: u64 = 1 << 20;
const MAGAZINE_BYTES: u64 = 256 << 20;

/// One thread's freed blocks in one pool, reusable by that thread at once when the rule allows
/// (`SameThread`, `Immediate`). Only its thread pushes and pops; others lock it only to drain it
/// (reclaim, teardown, a dead thread's leftovers), so its lock is uncontended on the fast path.
#[derive(Default)]
struct Magazine {
    /// (block, the request it served), oldest first
    blocks: Vec<(DevPtr, u64)>,
    /// Sum of the requests in `blocks`.
    requested: u64,
}

type SharedMagazine = Arc<Mutex<Magazine>>;

thread_local! {
    /// This thread's magazine in each pool it used, by pool id.
    static MAGAZINES: RefCell<Vec<(u64, SharedMagazine)>> = const { RefCell::new(Vec::new()) };
}

fn lock_magazine(m: &Mutex<Magazine>) -> MutexGuard<'_, Magazine> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

struct Pending {
    ptr: DevPtr,
    /// The request it was handed out for (a same-thread or same-stream reuse must match it
    /// exactly).
    size: u64,
    thread: u64,
    /// The stream of a stream-ordered free (`cuMemFreeAsync`): later work on that stream runs
    /// after the free, so allocations on it may take the block at once.
    stream: Option<StreamKey>,
}

struct Sealed {
    fence: FenceId,
    blocks: Vec<Pending>,
}

/// Invariants: a freed block is in exactly one of a thread's magazine (reusable by that thread
/// under `SameThread`/`Immediate`), `core` (free and safe to reuse by anyone), `pending` (freed,
/// no fence issued after its free yet) or `sealed` (freed, fence issued, not known to be done);
/// a block in use is in none of them. `sealed` is oldest first. `held_back` is the size of the
/// blocks in `pending` and `sealed`.
struct State {
    core: Box<dyn Core>,
    pending: Vec<Pending>,
    sealed: VecDeque<Sealed>,
    /// Bytes in `pending` and `sealed` (by the requests they served).
    held_back: u64,
}

/// A caching pool: a [`Core`] behind one lock, with reuse made safe by a [`Clock`], and a
/// magazine per thread in front of it.
pub struct CachingPool {
    id: u64,
    clock: Arc<dyn Clock>,
    state: Mutex<State>,
    /// Every thread's magazine in this pool (the threads hold them too).
    magazines: Mutex<Vec<SharedMagazine>>,
    /// Set once the magazines were drained after the rule became `Fenced`.
    fenced_drained: std::sync::atomic::AtomicBool,
}

impl CachingPool {
    pub fn new(core: Box<dyn Core>, clock: Arc<dyn Clock>) -> Self {
        static IDS: AtomicU64 = AtomicU64::new(1);
        CachingPool {
            id: IDS.fetch_add(1, Ordering::Relaxed),
            magazines: Mutex::new(Vec::new()),
            fenced_drained: false.into(),
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

    /// Runs `f` on this thread's magazine in this pool, creating and registering it on first
    /// use. `None` while the thread is being torn down.
    fn with_magazine<T>(&self, f: impl FnOnce(&mut Magazine) -> T) -> Option<T> {
        MAGAZINES
            .try_with(|mags| {
                let mut mags = mags.borrow_mut();
                let m = match mags.iter().find(|(id, _)| *id == self.id) {
                    Some((_, m)) => m.clone(),
                    None => {
                        let m = SharedMagazine::default();
                        self.magazines
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .push(m.clone());
                        mags.push((self.id, m.clone()));
                        m
                    }
                };
                drop(mags);
                let mut guard = lock_magazine(&m);
                f(&mut guard)
            })
            .ok()
    }

    /// Moves magazine blocks into the shared state: every thread's (`all`), or only those of
    /// threads that have exited. Under `Immediate` they go to the core, else to `pending`.
    fn drain_magazines(&self, st: &mut State, all: bool) {
        let mut mags = self.magazines.lock().unwrap_or_else(|e| e.into_inner());
        let immediate = self.clock.rule() == ReuseRule::Immediate;
        mags.retain(|m| {
            let dead = Arc::strong_count(m) == 1;
            if all || dead {
                let mut g = lock_magazine(m);
                g.requested = 0;
                for (ptr, size) in g.blocks.drain(..) {
                    if immediate {
                        st.core.put(ptr);
                    } else {
                        st.held_back += st.core.block_size(ptr);
                        st.pending.push(Pending {
                            ptr,
                            size,
                            thread: 0,
                            stream: None,
                        });
                    }
                }
            }
            !dead
        });
    }

    /// A freed block enters the shared state: the core at once under `Immediate`, else the
    /// pending list (fenced in a batch later), tagged with the stream of a stream-ordered free.
    fn give_back(
        &self,
        st: &mut State,
        ptr: DevPtr,
        size: u64,
        rule: ReuseRule,
        stream: Option<StreamKey>,
    ) {
        if rule == ReuseRule::Immediate {
            st.core.put(ptr);
            return;
        }
        st.held_back += st.core.block_size(ptr);
        st.pending.push(Pending {
            ptr,
            size,
            thread: thread_number(),
            stream,
        });
        if st.pending.len() >= MAX_PENDING {
            self.seal(st);
        }
    }

    /// Fences every pending free (one fence for the batch).
    fn seal(&self, st: &mut State) {
        if st.pending.is_empty() {
            return;
        }
        if let Some(fence) = self.clock.issue() {
            let blocks = st.pending.drain(..).collect();
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
            for Pending { ptr: p, .. } in batch.blocks {
                st.held_back -= st.core.block_size(p);
                st.core.put(p);
            }
        }
    }

    /// `alloc`, and `alloc_on` when `on` names the stream of a stream-ordered allocation.
    fn alloc_ordered(
        &self,
        size: u64,
        on: Option<StreamKey>,
        up: &dyn Upstream,
    ) -> Result<Grant, CUresult> {
        let hit = |ptr| {
            Ok(Grant {
                ptr,
                from_cache: true,
            })
        };
        let rule = self.clock.rule();
        // Fast path: this thread's own freed blocks, without the pool's lock.
        if rule != ReuseRule::Fenced {
            let mine = self.with_magazine(|m| {
                let i = m.blocks.iter().rposition(|b| b.1 == size)?;
                m.requested -= size;
                Some(m.blocks.remove(i).0)
            });
            if let Some(Some(ptr)) = mine {
                return hit(ptr);
            }
        }
        let mut st = self.lock();
        if rule == ReuseRule::Fenced && !self.fenced_drained.swap(true, Ordering::AcqRel) {
            // Blocks kept while no stream existed must now be fenced like any other; under
            // this rule no block enters a magazine again, so once is enough.
            self.drain_magazines(&mut st, true);
        }
        // A block freed by this thread (while it is the only queue it uses), or freed in order
        // on the stream this allocation is ordered on, is safe to take before its fence.
        if rule == ReuseRule::SameThread || on.is_some() {
            let me = thread_number();
            let same_thread = rule == ReuseRule::SameThread;
            let fits = |p: &Pending| {
                p.size == size
                    && ((same_thread && p.thread == me) || (on.is_some() && p.stream == on))
            };
            if let Some(i) = st.pending.iter().rposition(fits) {
                let p = st.pending.swap_remove(i);
                st.held_back -= st.core.block_size(p.ptr);
                return hit(p.ptr);
            }
            if on.is_some() {
                // Already fenced, fence not done: still safe on its own stream.
                let found = st.sealed.iter_mut().rev().find_map(|b| {
                    let i = b
                        .blocks
                        .iter()
                        .rposition(|p| p.stream == on && p.size == size)?;
                    Some(b.blocks.swap_remove(i).ptr)
                });
                if let Some(ptr) = found {
                    st.held_back -= st.core.block_size(ptr);
                    return hit(ptr);
                }
            }
        }
        if let Some(p) = st.core.take(size, up.headroom()) {
            return hit(p);
        }
        self.collect(&mut st, false);
        if let Some(p) = st.core.take(size, up.headroom()) {
            return hit(p);
        }
        // A miss is about to cost a driver call: first share what the threads keep in their
        // magazines (at once under `Immediate`, after a fence otherwise), so no thread grows
        // the pool while another sits on free blocks.
        self.drain_magazines(&mut st, true);
        if rule == ReuseRule::Immediate {
            if let Some(p) = st.core.take(size, up.headroom()) {
                return hit(p);
            }
        }
        self.seal(&mut st);
        st.core.grow(size, up).map(|ptr| Grant {
            ptr,
            from_cache: false,
        })
    }

    /// `free`, and `free_on` when `on` names the stream of a stream-ordered free.
    fn free_ordered(
        &self,
        ptr: DevPtr,
        size: u64,
        on: Option<StreamKey>,
        up: &dyn Upstream,
    ) -> Result<(), CUresult> {
        let rule = self.clock.rule();
        // Fast path: into this thread's magazine. The block's size is asked of the core under
        // the lock only when the magazine spills.
        if rule != ReuseRule::Fenced && size <= MAGAZINE_BLOCK && !up.over_soft_limit() {
            let spilled = self.with_magazine(|m| {
                m.blocks.push((ptr, size));
                m.requested += size;
                if m.blocks.len() <= MAGAZINE && m.requested <= MAGAZINE_BYTES {
                    return Vec::new();
                }
                let keep = m.blocks.len() / 2;
                let spill: Vec<_> = m.blocks.drain(..m.blocks.len() - keep).collect();
                m.requested -= spill.iter().map(|b| b.1).sum::<u64>();
                spill
            });
            match spilled {
                Some(spill) if spill.is_empty() => return Ok(()),
                Some(spill) => {
                    let mut st = self.lock();
                    for (p, s) in spill {
                        self.give_back(&mut st, p, s, rule, None);
                    }
                    return Ok(());
                }
                None => {}
            }
        }
        let mut st = self.lock();
        self.give_back(&mut st, ptr, size, rule, on);
        if up.over_soft_limit() {
            // Above the soft limit: whatever is safe to give back goes back now.
            self.collect(&mut st, false);
            st.core.release_free_segments(up);
        }
        Ok(())
    }
}

impl Pool for CachingPool {
    fn kind(&self) -> PoolKind {
        self.lock().core.kind()
    }

    fn alloc(&self, size: u64, up: &dyn Upstream) -> Result<Grant, CUresult> {
        self.alloc_ordered(size, None, up)
    }

    fn alloc_on(&self, size: u64, on: StreamKey, up: &dyn Upstream) -> Result<Grant, CUresult> {
        self.alloc_ordered(size, Some(on), up)
    }

    fn free(&self, ptr: DevPtr, size: u64, up: &dyn Upstream) -> Result<(), CUresult> {
        self.free_ordered(ptr, size, None, up)
    }

    fn free_on(
        &self,
        ptr: DevPtr,
        size: u64,
        on: StreamKey,
        up: &dyn Upstream,
    ) -> Result<(), CUresult> {
        self.free_ordered(ptr, size, Some(on), up)
    }

    fn reclaim(&self, up: &dyn Upstream) -> u64 {
        let mut st = self.lock();
        self.drain_magazines(&mut st, true);
        self.seal(&mut st);
        self.collect(&mut st, true);
        st.core.release_free_segments(up)
    }

    fn cached_bytes(&self) -> u64 {
        let st = self.lock();
        let in_magazines: u64 = self
            .magazines
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|m| {
                let g = lock_magazine(m);
                g.blocks
                    .iter()
                    .map(|b| st.core.block_size(b.0))
                    .sum::<u64>()
            })
            .sum();
        st.core.cached() + st.held_back + in_magazines
    }

    fn owns(&self, ptr: DevPtr) -> bool {
        self.lock().core.owns(ptr)
    }

    fn segments(&self) -> Vec<super::SegmentView> {
        let st = self.lock();
        let mut waiting: std::collections::HashSet<DevPtr> = st
            .pending
            .iter()
            .map(|p| p.ptr)
            .chain(
                st.sealed
                    .iter()
                    .flat_map(|b| b.blocks.iter().map(|p| p.ptr)),
            )
            .collect();
        for m in self
            .magazines
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            waiting.extend(lock_magazine(m).blocks.iter().map(|b| b.0));
        }
        let mut segs = st.core.segments();
        for b in segs.iter_mut().flat_map(|s| s.blocks.iter_mut()) {
            if waiting.contains(&b.ptr) {
                b.state = super::BlockState::Pending;
            }
        }
        segs
    }

    fn forget_all(&self) -> (u64, u64) {
        let mut st = self.lock();
        for m in self
            .magazines
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            let mut g = lock_magazine(&m);
            g.blocks.clear();
            g.requested = 0;
        }
        st.pending.clear();
        st.sealed.clear();
        st.held_back = 0;
        st.core.forget()
    }
}
