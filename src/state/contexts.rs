//! Each CUDA context's pool and the clock that makes its reuse safe, and the per-thread cache
//! the hot path finds them in.

use super::clock::ContextClock;
use crate::base::addr_hash::AddrMap as HashMap;
use crate::base::cu::*;
use crate::pool::{BlockSpan, Pool, SegmentView, ThreadCache};
use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

/// The pool of one context, and the clock that makes its reuse safe. Its blocks, segments
/// and events die with the context.
pub struct ContextPool {
    pub device: CUdevice,
    pub clock: Arc<ContextClock>,
    pub pool: Box<dyn Pool>,
}

/// Invariant: `map` holds, keyed by `CUcontext` address, an entry from the first pooled
/// allocation, stream or work in that context until the context is destroyed.
#[derive(Default)]
pub struct Contexts {
    map: RwLock<HashMap<usize, Arc<ContextPool>>>,
}

/// Bumped whenever a context's pool goes away, so per-thread caches of it are dropped.
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// What a thread knows of its contexts, without asking the driver.
///
/// Invariant: `known` is `(ctx, generation)` when this thread last made `ctx` current through
/// a hook (`cuCtxSetCurrent`, `cuCtxPushCurrent`), and nothing that could change its current
/// context has happened since: every other way to change it through the hooks (pop, create,
/// attach, detach) sets `known` to 0 (not known: the driver is asked), a context's teardown
/// bumps the generation, and the shim's own switches (`Shim::in_context`) mark it not known
/// while they last (the clock's and the teardown's run no code that reads it).
/// `cached` is the last context this thread used, as of a generation, with its pool and this
/// thread's own cache in that pool (see [`Cached`]).
struct ThreadContexts {
    known: Cell<(usize, u64)>,
    cached: RefCell<Option<Cached>>,
}

/// A context's pool as a thread keeps it: the pool, and the thread's cache in it (its magazine:
/// a cached pair reaches it here, with no look-up of its own).
struct Cached {
    ctx: usize,
    generation: u64,
    pool: Arc<ContextPool>,
    mine: Option<ThreadCache>,
}

impl ThreadContexts {
    /// The known context, unless a context went away since it was set (`generation`: now).
    fn known(&self, generation: u64) -> Option<usize> {
        let (ctx, g) = self.known.get();
        (ctx != 0 && g == generation).then_some(ctx)
    }
}

thread_local! {
    /// The hot path finds its context and pool here without the driver, the map's lock or a
    /// reference-count update.
    static CURRENT: ThreadContexts = const {
        ThreadContexts { known: Cell::new((0, 0)), cached: RefCell::new(None) }
    };
}

impl Contexts {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<usize, Arc<ContextPool>>> {
        self.map.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The pool of `ctx`, if it has one.
    pub fn get(&self, ctx: usize) -> Option<Arc<ContextPool>> {
        self.read().get(&ctx).cloned()
    }

    /// The pool of `ctx` (on `device`), made with `make` on first use.
    pub fn get_or_make(&self, ctx: usize, make: impl FnOnce() -> ContextPool) -> Arc<ContextPool> {
        if let Some(c) = self.get(ctx) {
            return c;
        }
        let mut w = self.map.write().unwrap_or_else(|e| e.into_inner());
        w.entry(ctx).or_insert_with(|| Arc::new(make())).clone()
    }

    /// Removes the pool of `ctx` (its context is gone) and drops every thread's cache of it.
    pub fn remove(&self, ctx: usize) -> Option<Arc<ContextPool>> {
        let cp = self
            .map
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&ctx);
        GENERATION.fetch_add(1, Ordering::AcqRel);
        cp
    }

    /// Every pool (with its context), on `device` or (`-1`) on every device.
    pub fn on_device(&self, device: CUdevice) -> Vec<(usize, Arc<ContextPool>)> {
        self.read()
            .iter()
            .filter(|(_, c)| device < 0 || c.device == device)
            .map(|(&ctx, c)| (ctx, c.clone()))
            .collect()
    }

    /// Bytes cached by the pools of every context on `dev`.
    pub fn cached_bytes(&self, dev: CUdevice) -> u64 {
        self.read()
            .values()
            .filter(|c| c.device == dev)
            .map(|c| c.pool.cached_bytes())
            .sum()
    }

    /// Every context's pool segments on `dev`, with the context they belong to, by address.
    pub fn segments(&self, dev: CUdevice) -> Vec<(usize, SegmentView)> {
        let map = self.read();
        let mut out: Vec<_> = map
            .iter()
            .filter(|(_, c)| c.device == dev)
            .flat_map(|(&ctx, c)| c.pool.segments().into_iter().map(move |s| (ctx, s)))
            .collect();
        out.sort_by_key(|(_, s)| s.ptr);
        out
    }

    /// What the pools know of `ptr`: `None` when no pool holds memory there; else the block
    /// holding it, `None` inside when that memory is cached (free in the pool).
    pub fn block_of(&self, ptr: DevPtr) -> Option<Option<BlockSpan>> {
        let map = self.read();
        let cp = map.values().find(|c| c.pool.owns(ptr))?;
        Some(cp.pool.block_of(ptr))
    }

    /// The handles under the held block at `ptr` of an expandable segment (see
    /// [`crate::pool::Pool::handles_under`]).
    pub fn handles_under(&self, ptr: DevPtr) -> Vec<(DevPtr, u64)> {
        let map = self.read();
        map.values()
            .find(|c| c.pool.owns(ptr))
            .map_or_else(Vec::new, |cp| cp.pool.handles_under(ptr))
    }

    /// The freed blocks of every pool still waiting for a fence.
    pub fn fenced(&self) -> std::collections::HashSet<DevPtr> {
        self.read().values().flat_map(|c| c.pool.fenced()).collect()
    }

    /// Whether the freed block at `ptr` waits for a fence in the pool that holds it.
    pub fn is_fenced(&self, ptr: DevPtr) -> bool {
        let map = self.read();
        map.values()
            .find(|c| c.pool.owns(ptr))
            .is_some_and(|c| c.pool.fenced().contains(&ptr))
    }

    /// Whether `ptr` lies inside memory some pool holds.
    pub fn pool_owns(&self, ptr: DevPtr) -> bool {
        self.read().values().any(|c| c.pool.owns(ptr))
    }

    /// The current generation (read it before a lookup whose result goes to
    /// [`remember_for_thread`](Self::remember_for_thread)).
    pub fn generation() -> u64 {
        GENERATION.load(Ordering::Acquire)
    }

    /// Runs `f` with a context, this thread's cached pool of it and the thread's own cache in
    /// that pool, if the cache holds it and no pool went away since: context `ctx`, or (`None`)
    /// the thread's current context when it knows it (see [`ThreadContexts`]). Gives `f` back
    /// otherwise. No driver call, no lock, no reference count touched.
    #[inline(always)]
    pub fn with_thread_cached<T, F: FnOnce(usize, &ContextPool, Option<&ThreadCache>) -> T>(
        ctx: Option<usize>,
        f: F,
    ) -> Result<T, F> {
        let generation = Self::generation();
        let Ok(c) = CURRENT.try_with(|c| c as *const ThreadContexts) else {
            return Err(f);
        };
        // SAFETY: this thread's own value, which lives until the thread's thread-local
        // destructors run; they cannot run during this call, on this thread. (Reached here
        // rather than inside `try_with`, so that `f` is not moved into a closure there.)
        let c = unsafe { &*c };
        let Some(want) = ctx.or_else(|| c.known(generation)) else {
            return Err(f);
        };
        match &*c.cached.borrow() {
            Some(k) if k.ctx == want && k.generation == generation => {
                Ok(f(want, &k.pool, k.mine.as_ref()))
            }
            _ => Err(f),
        }
    }

    /// Caches `cp`, the pool of `ctx` as of `generation`, for this thread, with the thread's
    /// own cache in it.
    pub fn remember_for_thread(ctx: usize, generation: u64, cp: Arc<ContextPool>) {
        let _ = CURRENT.try_with(|c| {
            // The old entry goes first: its thread cache is dropped before a new one is made.
            c.cached.borrow_mut().take();
            let mine = cp.pool.thread_cache();
            *c.cached.borrow_mut() = Some(Cached {
                ctx,
                generation,
                pool: cp,
                mine,
            });
        });
    }

    /// The calling thread's current context, if it knows it without the driver.
    pub fn known_current() -> Option<usize> {
        let generation = Self::generation();
        CURRENT.try_with(|c| c.known(generation)).ok().flatten()
    }

    /// The calling thread made `ctx` current (`None`: it changed its context in a way the shim
    /// does not follow; the driver is asked until it sets one again).
    pub fn set_known_current(ctx: Option<usize>) {
        let generation = Self::generation();
        let _ = CURRENT.try_with(|c| c.known.set((ctx.unwrap_or(0), generation)));
    }
}
