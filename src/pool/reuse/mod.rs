//! Reuse safety (docs/design.md, trap 3): a freed block goes back where the next allocation may take
//! it only when no device work issued before its free can touch it while the new owner's work
//! runs.
//!
//! The driver's own `cuMemFree` waits for the device, and programs rely on it
//! (`alloc tmp; launch(tmp); free tmp`). A pool must give the same guarantee without the wait.
//! What makes it possible is stream order: work on one *queue* (the legacy stream, a thread's
//! per-thread default stream, or one stream) runs in the order it was issued. The [`Clock`]
//! watches which queues of the context receive work and says which rule holds:
//!
//! - [`ReuseRule::OneQueue`]: every piece of device work so far went to one queue. A block
//!   freed now was last used by work on that queue, and any work that uses it next is issued
//!   later: on the same queue it runs after the old work; on another queue, that queue's first
//!   work is made to wait for everything issued before it (the clock does that). So the block
//!   goes straight back into the core, where any allocation of any thread may take it, split it
//!   and coalesce it. This is the rule PyTorch's allocator applies per stream, and it is why a
//!   freed block is reused while the GPU still lags the CPU.
//! - [`ReuseRule::Fenced`]: several queues are active. Which queue last used a block freed with
//!   `cuMemFree` is unknown, so it waits for a *fence*: device work issued after the free on
//!   every active queue, once completed. A stream-ordered free (`cuMemFreeAsync(p, s)`) is
//!   ordered on `s` by the program, so the block goes into the core at once in `s`'s *lane*:
//!   allocations ordered on `s` may take it (best fit, split, coalesce with its lane), others
//!   after the fence ([`Core::promote`]).
//! - [`ReuseRule::Immediate`]: `CUDAPOOL_REUSE=immediate`, no fences at all.
//!
//! A block freed under `OneQueue` stays safe for anyone after the context turns `Fenced`: the
//! first work of every new queue waits for all work issued before it, the old block's last
//! use included.
//!
//! Fences come in batches, sealed by count, by bytes, at once for a large block, and by age, so
//! that one fence serves many blocks and none waits long for its fence to be issued. The pool
//! never waits on the fast path. On a miss, instead of growing, it takes the oldest batch back
//! when the memory held back by fences could serve the request and is large against what the
//! pool reserves (so that a CPU far ahead of the GPU cannot pile up freed memory without
//! bound), or when the limit leaves no room to grow. It takes it back in stream order where
//! the clock can ([`Clock::hand_over`]: every queue's next work waits for the fence on the
//! device, and the host goes on), and otherwise waits for the fence on the host. Under memory
//! pressure ([`Pool::trim`]) it waits for every fence, then gives free segments back. **No wait
//! holds the pool's lock**: a waiting thread gives it up, so other threads' hits, frees and
//! misses go on; a batch is collected by whichever thread finds its fence done first.

use super::core::{Core, Forgotten, Lane, READY};
use super::handed::{Grant, Held, Taken};
use super::types::{
    Asleep, BlockSpan, BlockState, Pool, Restore, Save, SegmentView, StreamKey, Upstream,
};
use crate::base::config::PoolKind;
use crate::base::cu::{CUresult, DevPtr, CUDA_ERROR_INVALID_CONTEXT};
use crate::base::sync::lock;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

mod check;
mod clock;
mod demand;
mod magazines;
mod sleep;
pub use clock::{Clock, FenceId, ImmediateClock, ReuseRule};
use demand::Demand;
pub use magazines::ThreadCache;
use magazines::*;

/// Seal the pending frees once this many are waiting.
const SEAL_COUNT: usize = 64;
/// ... or once they hold this many bytes (or 1/`SEAL_SHARE` of what the pool reserves, if
/// more), or hold a block that large: a large free gets its fence soon, so it can come back as
/// soon as the GPU has passed it, while a pool of gigabytes does not record events for every
/// few megabytes freed.
const SEAL_BYTES: u64 = 2 << 20;
const SEAL_SHARE: u64 = 256;
/// ... or once the oldest has waited this long.
const SEAL_AGE: Duration = Duration::from_millis(1);
/// On a miss, wait for the oldest fence rather than grow while the memory held back by fences
/// is at least 1/`WAIT_SHARE` of what the pool reserves (and could serve the request). On the
/// recorded PyTorch trace replayed on a GPU lagging by 500 operations (`cargo bench`), peak
/// reserved / peak requested is 1.33 with 8, 1.21 with 16, 1.13 with 32, 1.09 with 64, for
/// about as many waits; synthetic random allocations wait twice as often for each doubling.
const WAIT_SHARE: u64 = 32;

/// A freed block waiting for a fence: `lane` is [`READY`] for an unordered free (the block is
/// outside the core until the fence is done) or the stream of a stream-ordered free (the block
/// is in the core, in that lane, and becomes ready when the fence is done).
#[derive(Clone, Copy)]
struct Waiting {
    ptr: DevPtr,
    lane: Lane,
}

struct Sealed {
    fence: FenceId,
    /// The epoch its blocks were freed in.
    epoch: u64,
    blocks: Vec<Waiting>,
}

/// Invariants: a freed block is in exactly one of: a thread's magazine; the core's free lists
/// (ready, or in a stream's lane); `pending` or `sealed` with lane [`READY`] (outside the core).
/// A lane block of the core is also listed, with its lane, in `pending` (epoch `epoch`) or in
/// the `sealed` batch of its epoch, until that batch is collected. A block in use is in none of
/// them. `sealed` is oldest first, its epochs increase, and `done` is the epoch of the newest
/// batch collected (or handed over). `held_back` is the size of the [`READY`]-lane blocks of
/// `pending` and `sealed`; `pending_bytes` the size of all of `pending`, which has waited
/// since `pending_since`. `unproven` counts the blocks that entered the core ready without a
/// completed fence behind them (freed under one queue, or handed over): a check that the
/// device is idle made before such a block arrived says nothing about it. Once `forgotten`
/// (the context died), the pool holds nothing and takes nothing: a free that raced with the
/// teardown is dropped, an allocation refused. `demand` sees every allocation and free past the
/// magazines.
struct State {
    core: Box<dyn Core>,
    pending: Vec<Waiting>,
    pending_bytes: u64,
    pending_since: Option<Instant>,
    sealed: VecDeque<Sealed>,
    /// The epoch of the frees in `pending`.
    epoch: u64,
    done: u64,
    held_back: u64,
    unproven: u64,
    forgotten: bool,
    demand: Demand,
}

/// A caching pool: a [`Core`] behind one lock, with reuse made safe by a [`Clock`], and a
/// magazine per thread in front of it.
pub struct CachingPool {
    id: u64,
    clock: Arc<dyn Clock>,
    state: Mutex<State>,
    /// Every thread's magazine in this pool (the threads hold them too).
    magazines: Mutex<Vec<SharedMagazine>>,
}

impl CachingPool {
    pub fn new(core: Box<dyn Core>, clock: Arc<dyn Clock>) -> Self {
        static IDS: AtomicU64 = AtomicU64::new(1);
        CachingPool {
            id: IDS.fetch_add(1, Ordering::Relaxed),
            magazines: Mutex::new(Vec::new()),
            clock,
            state: Mutex::new(State {
                core,
                pending: Vec::new(),
                pending_bytes: 0,
                pending_since: None,
                sealed: VecDeque::new(),
                epoch: 1,
                done: 0,
                held_back: 0,
                unproven: 0,
                forgotten: false,
                demand: Demand::default(),
            }),
        }
    }

    /// `out`, after the pool's invariants were validated (debug builds: see
    /// [`validate_after`](Self::validate_after)).
    fn checked<T>(&self, after: &str, out: T) -> T {
        self.validate_after(after, false);
        out
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Runs `f` on this thread's magazine in this pool, made and registered on first use;
    /// `None` while the thread is being torn down. Found, it is used in place: no reference
    /// count touched (`f` never re-enters).
    fn with_shared_magazine<T>(&self, f: impl FnOnce(&SharedMagazine) -> T) -> Option<T> {
        MAGAZINES
            .try_with(|mags| {
                if let Some((_, m)) = mags.borrow().iter().find(|(id, _)| *id == self.id) {
                    return f(m);
                }
                let m = SharedMagazine::default();
                lock(&self.magazines).push(m.clone());
                mags.borrow_mut().push((self.id, m.clone()));
                f(&m)
            })
            .ok()
    }

    /// This thread's magazine in this pool (see [`with_shared_magazine`](Self::with_shared_magazine)).
    fn magazine(&self) -> Option<SharedMagazine> {
        self.with_shared_magazine(Arc::clone)
    }

    /// Runs `f` on this thread's magazine in this pool, locked.
    fn with_magazine<T>(&self, f: impl FnOnce(&mut Magazine) -> T) -> Option<T> {
        self.with_shared_magazine(|m| f(&mut m.lock()))
    }

    /// Moves magazine blocks into the core (they are ready): every thread's (`all`), or only
    /// those of threads that have exited.
    fn drain_magazines(&self, st: &mut State, all: bool) {
        let mut mags = lock(&self.magazines);
        mags.retain(|m| {
            let dead = Arc::strong_count(m) == 1;
            if all || dead {
                for ptr in m.lock().take_all() {
                    st.core.put(ptr, READY, 0);
                    st.unproven += 1;
                }
            }
            !dead
        });
    }

    /// A freed block enters the shared state under `rule`: the core at once, or (`Fenced`) the
    /// pending batch, and the core's lane of the stream of a stream-ordered free.
    fn give_back(&self, st: &mut State, ptr: DevPtr, rule: ReuseRule, on: Option<StreamKey>) {
        if rule != ReuseRule::Fenced {
            st.core.put(ptr, READY, 0);
            st.unproven += 1;
            return;
        }
        let bytes = st.core.block_size(ptr);
        let lane = on.unwrap_or(READY);
        if lane == READY {
            st.held_back += bytes;
        } else {
            st.core.put(ptr, lane, st.epoch);
        }
        st.pending.push(Waiting { ptr, lane });
        st.pending_bytes += bytes;
        let now = Instant::now();
        let since = *st.pending_since.get_or_insert(now);
        if st.pending.len() >= SEAL_COUNT
            || st.pending_bytes >= SEAL_BYTES.max(st.core.reserved() / SEAL_SHARE)
            || now.duration_since(since) >= SEAL_AGE
        {
            self.seal(st);
        }
    }

    /// Fences every pending free (one fence for the batch).
    fn seal(&self, st: &mut State) {
        if st.pending.is_empty() {
            return;
        }
        if let Some(fence) = self.clock.issue() {
            let blocks = std::mem::take(&mut st.pending);
            st.sealed.push_back(Sealed {
                fence,
                epoch: st.epoch,
                blocks,
            });
            st.epoch += 1;
            st.pending_bytes = 0;
            st.pending_since = None;
        }
    }

    /// Seals the pending frees that have waited long enough (they are sealed on frees too; this
    /// covers a program that stops freeing).
    fn seal_if_old(&self, st: &mut State) {
        if st
            .pending_since
            .is_some_and(|since| since.elapsed() >= SEAL_AGE)
        {
            self.seal(st);
        }
    }

    /// Moves a batch whose fence is done, or handed over, into the core.
    fn admit(st: &mut State, batch: Sealed) {
        st.done = batch.epoch;
        for w in batch.blocks {
            if w.lane == READY {
                st.held_back -= st.core.block_size(w.ptr);
                st.core.put(w.ptr, READY, 0);
            } else {
                st.core.promote(w.ptr, w.lane, st.done);
            }
        }
    }

    /// Moves the batches whose fence is done into the core, oldest first. Never waits.
    fn collect(&self, st: &mut State) {
        while let Some(front) = st.sealed.front() {
            if !self.clock.is_done(front.fence) {
                break;
            }
            let batch = st.sealed.pop_front().expect("front exists");
            self.clock.retire(batch.fence);
            Self::admit(st, batch);
        }
    }

    /// After waits for `waited` outside the lock: collects the batches of those fences still
    /// at the front (a wait ends on a context's error too, and is then taken as done, see
    /// [`Clock`]), then whatever else is done. Another thread may have collected them already.
    fn collect_waited(&self, st: &mut State, waited: &[FenceId]) {
        while st.sealed.front().is_some_and(|b| waited.contains(&b.fence)) {
            let batch = st.sealed.pop_front().expect("front exists");
            self.clock.retire(batch.fence);
            Self::admit(st, batch);
        }
        self.collect(st);
    }

    /// Takes the oldest batch back before its fence is done: handed over in stream order if
    /// the clock can, or else waited for on the host with the lock given up meanwhile (`st`
    /// is taken again: check `forgotten`). There must be a sealed batch. False with the guard
    /// when nothing could be taken back (the clock may not wait now: a capture is under way).
    fn take_back_oldest<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
    ) -> (MutexGuard<'a, State>, bool) {
        let f = st.sealed.front().expect("a sealed batch").fence;
        if self.clock.hand_over(f) {
            let batch = st.sealed.pop_front().expect("front exists");
            st.unproven += batch.blocks.len() as u64;
            Self::admit(&mut st, batch);
            return (st, true);
        }
        drop(st);
        let waited = self.clock.wait(f);
        let mut st = self.lock();
        if waited {
            self.collect_waited(&mut st, &[f]);
        }
        (st, waited)
    }

    /// Whether no device work can use a free block now, for a core holding mapped memory
    /// (which goes back without the driver waiting for the device): a fence after all work
    /// issued so far is done already. Never waits (a trim waits, see [`Pool::trim`]).
    fn device_idle(&self, st: &State) -> bool {
        if !st.core.unmaps() {
            return false;
        }
        match self.clock.issue() {
            Some(f) => {
                let done = self.clock.is_done(f);
                self.clock.retire(f);
                done
            }
            None => false,
        }
    }

    /// Whether a miss should wait for the oldest fence instead of growing: the memory held back
    /// could serve the request, and either it is large against what the pool reserves or the
    /// limit leaves no room to grow.
    fn should_wait(st: &State, size: u64, up: &dyn Upstream) -> bool {
        if st.sealed.is_empty() || st.held_back < size {
            return false;
        }
        st.held_back * WAIT_SHARE >= st.core.reserved() || up.headroom() < size
    }

    /// `alloc`, and `alloc_on` when `on` names the stream of a stream-ordered allocation.
    fn alloc_ordered(
        &self,
        size: u64,
        on: Option<StreamKey>,
        up: &dyn Upstream,
    ) -> Result<Grant, CUresult> {
        let hit = cache_hit;
        let rule = self.clock.rule();
        // Fast path: this thread's own freed blocks, without the pool's lock.
        if magazines_serve(size, || rule) {
            if let Some(Some(t)) = self.with_magazine(|m| m.pop(size)) {
                return hit(t);
            }
        }
        self.alloc_locked(size, on, up, rule, false)
    }

    /// `alloc_ordered` past the thread's magazine, under the pool's lock from the first look
    /// to the driver's answer; `release_first`: every free segment that is ready goes back to
    /// the upstream first, in the same hold ([`Pool::alloc_released`]). Inlined: a large
    /// block's pair takes this path every time.
    #[inline(always)]
    fn alloc_locked(
        &self,
        size: u64,
        on: Option<StreamKey>,
        up: &dyn Upstream,
        rule: ReuseRule,
        release_first: bool,
    ) -> Result<Grant, CUresult> {
        let hit = cache_hit;
        // Under `Fenced`, a stream-ordered allocation may take its stream's lane.
        let lane = on.filter(|_| rule == ReuseRule::Fenced).unwrap_or(READY);
        let limit = up.limit();
        let mut st = self.lock();
        if st.forgotten {
            return Err(CUDA_ERROR_INVALID_CONTEXT);
        }
        st.demand.on_alloc(up.cache_idle());
        if release_first {
            self.drain_magazines(&mut st, true);
            self.collect(&mut st);
            let idle = self.device_idle(&st);
            st.core.release_free_segments(up, u64::MAX, idle);
        }
        // While fences are still to bring blocks back, only a close fit: blocks come back in
        // fence order, not in the order the program will ask for them, and splitting the
        // first large one that fits fragments the pool (the recorded PyTorch trace on a
        // lagging GPU: 1.62x peak requested taking any fit, against 1.12x with no lag).
        let pending = |st: &State| !st.sealed.is_empty() || !st.pending.is_empty();
        let take = |st: &mut State| {
            if pending(st) {
                st.core.take_close(size, lane, limit)
            } else {
                st.core.take(size, lane, limit)
            }
        };
        if let Some(p) = take(&mut st) {
            return hit(p);
        }
        // A miss is about to cost a driver call: first whatever became reusable.
        self.collect(&mut st);
        self.drain_magazines(&mut st, true);
        if let Some(p) = take(&mut st) {
            return hit(p);
        }
        self.clock.tick();
        self.seal(&mut st);
        while Self::should_wait(&st, size, up) {
            let (guard, progressed) = self.take_back_oldest(st);
            st = guard;
            if st.forgotten {
                return Err(CUDA_ERROR_INVALID_CONTEXT);
            }
            if let Some(p) = take(&mut st) {
                return hit(p);
            }
            if !progressed {
                break;
            }
        }
        if let Some(p) = st.core.take(size, lane, limit) {
            return hit(p);
        }
        st.core.grow(size, up).map(|t| Grant {
            ptr: t.ptr,
            size: t.size,
            from_cache: false,
        })
    }

    /// `free`, and `free_on` when `on` names the stream of a stream-ordered free.
    fn free_ordered(
        &self,
        block: Held,
        on: Option<StreamKey>,
        up: &dyn Upstream,
    ) -> Result<(), CUresult> {
        let rule = self.clock.rule();
        // Fast path: into this thread's magazine, without the pool's lock unless it spills.
        // Above the soft limit, or with `CUDAPOOL_CACHE_IDLE=0`, nothing stays in a magazine.
        let keeps_nothing = || up.over_soft_limit() || up.cache_idle().at_once();
        if magazines_keep(block.asked, || rule, keeps_nothing) {
            let spilled = self.with_magazine(|m| m.push(block));
            match spilled {
                Some(spill) if spill.is_empty() => return Ok(()),
                Some(spill) => {
                    let mut st = self.lock();
                    if !st.forgotten {
                        for b in spill {
                            st.core.put(b.ptr, READY, 0);
                            st.unproven += 1;
                        }
                    }
                    return Ok(());
                }
                None => {}
            }
        }
        let mut st = self.lock();
        if st.forgotten {
            return Ok(()); // the block died with its context
        }
        self.give_back(&mut st, block.ptr, rule, on);
        if !st.demand.keeps_free(up.cache_idle(), on.is_some()) {
            // The program does not take freed memory again lately: it goes back to the
            // driver now, after the wait the driver's own free would have made (for the
            // fences of this and earlier frees, and the device idle for mapped memory).
            drop(st);
            self.trim(up, u64::MAX);
            return Ok(());
        }
        if up.over_soft_limit() {
            // Above the soft limit: whatever is safe to give back goes back now.
            self.seal(&mut st);
            self.collect(&mut st);
            let idle = self.device_idle(&st);
            st.core.release_free_segments(up, u64::MAX, idle);
        } else if rule == ReuseRule::Fenced {
            self.seal_if_old(&mut st);
        }
        Ok(())
    }
}

/// A block taken from the cache, as a grant (on the hit path: inlined).
#[inline(always)]
fn cache_hit(t: Taken) -> Result<Grant, CUresult> {
    Ok(Grant {
        ptr: t.ptr,
        size: t.size,
        from_cache: true,
    })
}

impl Pool for CachingPool {
    fn kind(&self) -> PoolKind {
        self.lock().core.kind()
    }

    fn alloc(&self, size: u64, up: &dyn Upstream) -> Result<Grant, CUresult> {
        self.checked("an allocation", self.alloc_ordered(size, None, up))
    }

    fn alloc_on(&self, size: u64, on: StreamKey, up: &dyn Upstream) -> Result<Grant, CUresult> {
        self.checked("an allocation", self.alloc_ordered(size, Some(on), up))
    }

    fn alloc_released(
        &self,
        size: u64,
        on: Option<StreamKey>,
        up: &dyn Upstream,
    ) -> Result<Grant, CUresult> {
        let out = self.alloc_locked(size, on, up, self.clock.rule(), true);
        self.checked("an allocation after a release", out)
    }

    fn free(&self, block: Held, up: &dyn Upstream) -> Result<(), CUresult> {
        self.checked("a free", self.free_ordered(block, None, up))
    }

    fn free_on(&self, block: Held, on: StreamKey, up: &dyn Upstream) -> Result<(), CUresult> {
        self.checked("a free", self.free_ordered(block, Some(on), up))
    }

    fn thread_cache(&self) -> Option<ThreadCache> {
        Some(ThreadCache {
            magazine: self.magazine()?,
            clock: self.clock.clone(),
            _on_its_thread: std::marker::PhantomData,
        })
    }

    /// Waits for every fence sealed so far (and, for a core that unmaps, for one after all
    /// work issued so far), without the lock, then gives free segments back. Mapped memory is
    /// unmapped only if no block entered the core unproven while the lock was given up.
    fn trim(&self, up: &dyn Upstream, need: u64) -> u64 {
        let (fences, unmaps, idle_fence, mark) = {
            let mut st = self.lock();
            self.drain_magazines(&mut st, true);
            self.seal(&mut st);
            let fences: Vec<FenceId> = st.sealed.iter().map(|b| b.fence).collect();
            let unmaps = st.core.unmaps();
            let idle_fence = if unmaps { self.clock.issue() } else { None };
            (fences, unmaps, idle_fence, st.unproven)
        };
        // Only the fences waited for are taken back (a capture stops the waits). No fence under
        // `immediate` reuse (or during a capture): the upstream waits for the whole context.
        let fences: Vec<FenceId> = fences.into_iter().filter(|&f| self.clock.wait(f)).collect();
        let idle_waited = idle_fence.is_some_and(|f| self.clock.wait(f));
        let idle = match idle_fence {
            Some(_) => idle_waited,
            None => unmaps && self.clock.rule() == ReuseRule::Immediate && up.synchronize(),
        };
        let mut st = self.lock();
        if let Some(f) = idle_fence {
            self.clock.retire(f);
        }
        if st.forgotten {
            return 0;
        }
        self.collect_waited(&mut st, &fences);
        let idle = idle && st.unproven == mark;
        let out = st.core.release_free_segments(up, need, idle);
        drop(st);
        self.validate_after("a trim", true);
        out
    }

    fn sleep(&self, up: &dyn Upstream, save: &mut Save<'_>) -> Result<(), String> {
        self.sleep_arena(up, save)
    }

    fn wake(&self, restore: &mut Restore<'_>) -> Result<Vec<(u64, Asleep)>, CUresult> {
        self.wake_arena(restore)
    }

    fn asleep_bytes(&self) -> u64 {
        let mut st = self.lock();
        st.core.sleeping().map_or(0, |memory| memory.asleep_bytes())
    }

    fn release_ready(&self, up: &dyn Upstream, need: u64) -> u64 {
        let mut st = self.lock();
        self.drain_magazines(&mut st, true);
        self.collect(&mut st);
        let idle = self.device_idle(&st);
        let out = st.core.release_free_segments(up, need, idle);
        drop(st);
        self.validate_after("a release", true);
        out
    }

    fn check(&self) -> Result<(), String> {
        self.lock().check()
    }

    fn cached_bytes(&self) -> u64 {
        let st = self.lock();
        let in_magazines: u64 = lock(&self.magazines)
            .iter()
            .map(|m| {
                let g = m.lock();
                g.all().map(|b| b.size).sum::<u64>()
            })
            .sum();
        st.core.cached() + st.held_back + in_magazines
    }

    fn owns(&self, ptr: DevPtr) -> bool {
        self.lock().core.owns(ptr)
    }

    fn block_of(&self, ptr: DevPtr) -> Option<BlockSpan> {
        self.lock().core.block_of(ptr)
    }

    fn handles_under(&self, ptr: DevPtr) -> Vec<(DevPtr, u64)> {
        self.lock().core.handles_under(ptr)
    }

    fn fenced(&self) -> Vec<DevPtr> {
        let st = self.lock();
        st.pending
            .iter()
            .chain(st.sealed.iter().flat_map(|b| b.blocks.iter()))
            .map(|w| w.ptr)
            .collect()
    }

    fn segments(&self) -> Vec<SegmentView> {
        let mut st = self.lock();
        // A parked block shows merged, as the next allocation will find it.
        st.core.settle();
        let mut waiting: std::collections::HashSet<DevPtr> = st
            .pending
            .iter()
            .chain(st.sealed.iter().flat_map(|b| b.blocks.iter()))
            .filter(|w| w.lane == READY)
            .map(|w| w.ptr)
            .collect();
        for m in lock(&self.magazines).iter() {
            waiting.extend(m.lock().all().map(|b| b.ptr));
        }
        let mut segs = st.core.segments();
        for b in segs.iter_mut().flat_map(|s| s.blocks.iter_mut()) {
            if waiting.contains(&b.ptr) {
                b.state = BlockState::Pending;
            }
        }
        segs
    }

    fn stop_expanding(&self) {
        self.lock().core.stop_expanding();
    }

    fn forget_all(&self) -> Forgotten {
        let mut st = self.lock();
        for m in lock(&self.magazines).drain(..) {
            m.lock().take_all();
        }
        st.pending.clear();
        st.pending_bytes = 0;
        st.pending_since = None;
        st.sealed.clear();
        st.held_back = 0;
        st.forgotten = true;
        st.core.forget()
    }
}
