//! Pooled allocations (`cuMemAlloc`, `cuMemAllocAsync` and their frees): the calling thread's
//! context pool against the device's budget, the out-of-memory policy, the live table; and
//! `cuMemGetInfo` seen through the limit.

use super::clock;
use super::contexts::ContextPool;
use super::history::{Action, History};
use super::{Live, Origin, Shim};
use crate::base::config::LogLevel::Debug;
use crate::base::config::{CacheIdle, PoolKind};
use crate::base::cu::*;
use crate::base::flags::own_calls;
use crate::base::limit::Limit;
use crate::driver::nvtx;
use crate::driver::{Driver, Inside, Release};
use crate::limits::budget::{Bytes, DeviceBudget};
use crate::log_at;
use crate::pool::{Held, ThreadCache, Upstream, VirtualMemory};

/// How many more times an allocation is tried while other threads keep giving memory back.
pub(crate) const RELEASE_RETRIES: usize = 4;

impl Shim {
    /// `cuMemAlloc`: a pooled block of `size` (> 0) bytes in the current context.
    pub fn mem_alloc(&self, size: u64) -> Result<DevPtr, CUresult> {
        super::sleep::wake_for_alloc()?;
        if crate::base::flags::panics() > 0 {
            return self.alloc_after_panic(size);
        }
        if crate::base::flags::capturing_here() {
            return self.alloc_in_capture(size);
        }
        self.with_current_pool(|ctx, cp, mine| self.alloc_in(ctx, cp, mine, size, None))?
    }

    /// An allocation once a panic was caught (`base::flags::panics`): the driver's own,
    /// charged and limited as every pass-through allocation, whatever the pool was left as.
    #[cold]
    fn alloc_after_panic(&self, size: u64) -> Result<DevPtr, CUresult> {
        let alloc = || self.driver.mem_alloc(size).map(|p| (p, size));
        self.alloc_counted(size, alloc, |p| {
            let _ = self.driver.release_inside(Inside::ProgramsFree).mem_free(p);
        })
    }

    /// `cuMemAlloc` inside the calling thread's own capture: first what the capture freed.
    #[cold]
    fn alloc_in_capture(&self, size: u64) -> Result<DevPtr, CUresult> {
        self.with_current_pool(|ctx, cp, mine| match self.reuse_for_graph(ctx, size) {
            Some(p) => Ok(p),
            None => self.alloc_in(ctx, cp, mine, size, None),
        })?
    }

    /// `cuMemAllocAsync` of `size` (> 0) bytes on `stream` (as the program passed it; `ptsz`
    /// for the per-thread-default-stream entry point). `driver_alloc` is the driver's own, for an allocation made while `stream` captures a graph: that one goes to
    /// the driver and becomes a memory node of the graph; it is not charged, as what the graph
    /// takes is charged when it is uploaded or launched (`graphs`).
    pub fn mem_alloc_async(
        &self,
        size: u64,
        stream: usize,
        ptsz: bool,
        driver_alloc: impl FnOnce() -> Result<DevPtr, CUresult>,
    ) -> Result<DevPtr, CUresult> {
        let stream = clock::resolve(stream, ptsz);
        if clock::capturing(self.driver, stream) {
            return self.graph_node_made(size, driver_alloc);
        }
        let on = Some(clock::key(stream));
        super::sleep::wake_for_alloc()?;
        if crate::base::flags::panics() > 0 {
            return self.alloc_after_panic(size);
        }
        self.in_stream_context(stream, || {
            self.with_current_pool(|ctx, cp, mine| self.alloc_in(ctx, cp, mine, size, on))?
        })
    }

    /// An allocation in context `ctx`, from `cp`'s pool: first from the thread's own cache in
    /// it (`mine`), where the pool would take it from there anyway.
    fn alloc_in(
        &self,
        ctx: usize,
        cp: &ContextPool,
        mine: Option<&ThreadCache>,
        size: u64,
        on: Option<crate::pool::StreamKey>,
    ) -> Result<DevPtr, CUresult> {
        #[cfg(debug_assertions)]
        if crate::base::flags::PANIC_ARMED.swap(false, std::sync::atomic::Ordering::Relaxed) {
            panic!("a panic injected by a test (cudapool_debug_panic_next)");
        }
        let dev = cp.device;
        let budget = self.budget(dev);
        let pool_alloc = |up: &DriverUpstream| match on {
            Some(s) => cp.pool.alloc_on(size, s, up),
            None => cp.pool.alloc(size, up),
        };
        let hit = mine.and_then(|m| m.take(size));
        // What had gone back to the driver before the pool asked (read only on a miss).
        let mut seen = 0;
        let first = match hit {
            Some(g) => Ok(g),
            None => {
                seen = budget.releases();
                pool_alloc(&self.upstream(dev))
            }
        };
        let grant = match first {
            Ok(g) => g,
            Err(CUDA_ERROR_OUT_OF_MEMORY) => {
                let up = self.upstream(dev);
                // Never report OOM while cached memory could have served the request: the pool
                // has waited for its fences; give free segments back, as few as make room for
                // this request first (the rest of the cache keeps serving), then all of them.
                // Nothing cached is no reason to give up by itself: another thread's reclaim
                // may have emptied the cache since we asked (the release count below says).
                // The last try releases and allocates under one hold of the pool, so that the
                // room it makes is not taken by the pool's other threads first.
                let last_try = |up: &DriverUpstream| cp.pool.alloc_released(size, on, up);
                let mut retried = None;
                for need in [size.next_multiple_of(2 << 20), u64::MAX] {
                    if cp.pool.cached_bytes() == 0 {
                        break;
                    }
                    if cp.pool.trim(&up, need) == 0 && need != u64::MAX {
                        continue;
                    }
                    retried = Some(if need == u64::MAX {
                        last_try(&up)
                    } else {
                        pool_alloc(&up)
                    });
                    if matches!(retried, Some(Ok(_))) {
                        break;
                    }
                }
                // What the driver holds for graphs and no graph is using.
                if !matches!(retried, Some(Ok(_))) && self.trim_graph_memory(dev) > 0 {
                    retried = Some(last_try(&up));
                }
                // In a group short of room: the other members' idle cache, lent.
                if !matches!(retried, Some(Ok(_)))
                    && self.borrow(dev, size.next_multiple_of(2 << 20))
                {
                    retried = Some(pool_alloc(&up));
                }
                // With CUDAPOOL_SLEEP_IDLE: the members idle longest, put to sleep.
                if !matches!(retried, Some(Ok(_)))
                    && self.put_idle_to_sleep(dev, size.next_multiple_of(2 << 20))
                {
                    retried = Some(pool_alloc(&up));
                }
                // On an overcommitted GPU: other jobs idle longest, put to sleep by root's
                // arbiter (when the driver, not this job's share, is what refused); on a GPU
                // a job shares: the memory a job suspended for it is giving back.
                if !matches!(retried, Some(Ok(_)))
                    && self.room_made_elsewhere(dev, size.next_multiple_of(2 << 20))
                {
                    retried = Some(last_try(&up));
                }
                // Memory went back to the driver since we asked (another thread's reclaim or
                // free): try again, while it keeps coming back (bounded).
                for _ in 0..RELEASE_RETRIES {
                    let now = budget.releases();
                    if matches!(retried, Some(Ok(_))) || now == seen {
                        break;
                    }
                    seen = now;
                    retried = Some(last_try(&up));
                }
                if retried.is_some() {
                    budget.on_reclaim_retry();
                }
                match retried {
                    Some(Ok(g)) => g,
                    Some(Err(e)) => return Err(self.failed(dev, size, e)),
                    None => return Err(self.failed(dev, size, CUDA_ERROR_OUT_OF_MEMORY)),
                }
            }
            Err(e) => return Err(self.failed(dev, size, e)),
        };
        let (holder, ops) = budget.on_alloc(
            Bytes {
                asked: size,
                handed: grant.size,
            },
            grant.from_cache,
        );
        self.live.insert(
            grant.ptr,
            Live {
                ctx,
                device: dev,
                size,
                handed: grant.size,
                origin: Origin::Pool,
                holder,
            },
        );
        if self.tools_see_blocks() {
            self.tell_tools(cp, grant.ptr, size, on.is_some());
        }
        if self.history.on() {
            if self.history.settle_due() {
                self.history.settle(|| self.contexts.fenced());
            }
            let frames = self.live.backtrace(grant.ptr);
            let stream = on.unwrap_or(0);
            self.history
                .record(dev, Action::Alloc, grant.ptr, size, stream, frames);
        }
        log_at!(Debug, "alloc {size} -> {:#x} (device {dev})", grant.ptr);
        if !grant.from_cache || super::shim::sample_due(ops) {
            self.observe(dev);
        } else {
            self.changed(dev);
        }
        Ok(grant.ptr)
    }

    /// `cuMemFree`, and `cuMemFreeAsync` when `on` is the stream (as the program passed it,
    /// and whether through a `_ptsz` entry point): gives a block back. A pointer the pool does
    /// not own goes to `driver_free` (the driver's own free of the same kind), so that the
    /// program gets the driver's own answer.
    pub fn mem_free(
        &self,
        ptr: DevPtr,
        on: Option<(usize, bool)>,
        driver_free: impl FnOnce(DevPtr) -> CUresult,
    ) -> CUresult {
        let Some(live) = self.live.remove(ptr) else {
            // Not a live allocation. Inside a pool's segment (a second free, an interior
            // pointer) it must not reach the driver, which would free memory the pool owns.
            if self.contexts.pool_owns(ptr) {
                return CUDA_ERROR_INVALID_VALUE;
            }
            return driver_free(ptr);
        };
        let budget = self.budget(live.device);
        let ops = budget.on_free(live.bytes(), Some(live.holder));
        let result = match live.origin {
            // A block the capturing thread frees while its capture is under way may be named by
            // the graph at every replay: it stays the graph's (`captured`).
            Origin::Pool if crate::base::flags::capturing_here() => {
                self.keep_for_graph(ptr, live);
                CUDA_SUCCESS
            }
            Origin::Pool => {
                if self.tools_see_blocks() {
                    nvtx::block_released(ptr);
                }
                // A free made while its stream captures a graph runs when the graph does: it
                // gets no same-stream reuse, only a fence issued after the capture.
                let on = on
                    .map(|(s, ptsz)| clock::resolve(s, ptsz))
                    .filter(|&s| !clock::capturing(self.driver, s))
                    .map(clock::key);
                // Above the soft limit, or with CUDAPOOL_CACHE_IDLE=0, nothing stays in a
                // thread's cache.
                let keep_nothing = budget.over_soft_limit() || self.config.cache_idle.at_once();
                let freed = self.with_pool_of(live.ctx, |cp, mine| {
                    let block = Held {
                        ptr,
                        asked: live.size,
                        size: live.handed,
                    };
                    // The thread's own cache first, where the pool would keep it anyway.
                    let block = match mine.map(|m| m.keep(block, keep_nothing)) {
                        Some(Ok(())) => return Ok(()),
                        Some(Err(block)) => block,
                        None => block,
                    };
                    let up = self.upstream(live.device);
                    match on {
                        Some(s) => cp.pool.free_on(block, s, &up),
                        None => cp.pool.free(block, &up),
                    }
                });
                match freed {
                    Some(r) => r.err().unwrap_or(CUDA_SUCCESS),
                    // Its context is being torn down right now: the memory is gone with it.
                    None => return CUDA_ERROR_INVALID_VALUE,
                }
            }
            Origin::Counted => {
                let r = driver_free(ptr);
                if r == CUDA_SUCCESS {
                    budget.uncharge(live.size);
                    budget.on_driver_free();
                }
                r
            }
            Origin::Graph => driver_free(ptr),
            Origin::DriverPool(pool) => {
                let r = driver_free(ptr);
                if r == CUDA_SUCCESS {
                    self.driver_pool_freed(pool, live.size);
                }
                r
            }
        };
        if result == CUDA_SUCCESS {
            if self.history.on() {
                let stream = on.map_or(0, |(s, ptsz)| clock::key(clock::resolve(s, ptsz)));
                let dev = live.device;
                self.history
                    .record(dev, Action::FreeRequested, ptr, live.size, stream, None);
                if live.origin == Origin::Pool && self.contexts.is_fenced(ptr) {
                    self.history.free_pending(dev, ptr, live.size, stream);
                } else {
                    self.history
                        .record(dev, Action::FreeCompleted, ptr, live.size, stream, None);
                }
            }
            self.live.freed(ptr);
            log_at!(Debug, "free {ptr:#x}");
            if super::shim::sample_due(ops) {
                self.observe(live.device);
            } else {
                self.changed(live.device);
            }
        } else {
            // The driver refused: the program still holds the block.
            let holder = budget.on_free_undone(live.bytes());
            self.live.undo_remove(ptr, Live { holder, ..live });
        }
        result
    }

    /// An NVTX tool learns of a block the program now holds, named by the API that made it,
    /// its size and, under `CUDAPOOL_TRACK=2`, the first frame of the program that asked.
    #[cold]
    fn tell_tools(&self, cp: &ContextPool, ptr: DevPtr, size: u64, ordered: bool) {
        let segment = cp.pool.block_of(ptr).map_or(ptr, |s| s.segment);
        let api = if ordered {
            "cuMemAllocAsync"
        } else {
            "cuMemAlloc"
        };
        let mut name = format!("{api} {size} B");
        if let Some(bt) = self.live.backtrace(ptr) {
            if let Some(frame) = crate::base::frames::program_frames(&bt, 1).first() {
                name.push_str(" at ");
                name.push_str(frame);
            }
        }
        nvtx::block_held(ptr, size, segment, &name);
    }

    /// `cuMemGetInfo`: the driver's figures (`real`: the program's own call, passed through)
    /// seen through the limit (the README: `cuMemGetInfo` shows the limit).
    pub fn mem_get_info(
        &self,
        real: impl FnOnce() -> Result<(u64, u64), CUresult>,
    ) -> Result<(u64, u64), CUresult> {
        let (driver_free, driver_total) = real()?;
        let dev = self.driver.current_device()?;
        let budget = self.budget(dev);
        let cached = self.cached_bytes(dev);
        let free = driver_free.saturating_add(cached).min(driver_total);
        // The smaller of this process's own room and its group's (its own cache counts as
        // free: it gives it back before it refuses).
        let group = budget.shared().map_or(Limit::NONE, |s| s.limit());
        let Some(limit) = budget.hard_limit().min(group).bytes() else {
            return Ok((free, driver_total));
        };
        let total = limit.min(driver_total);
        let room = budget.room().saturating_add(cached);
        Ok((free.min(room).min(total), total))
    }

    pub(crate) fn upstream<'a>(&'a self, dev: CUdevice) -> DriverUpstream<'a> {
        DriverUpstream {
            driver: self.driver,
            device: dev,
            budget: self.budget(dev),
            tools: self.tools_see_blocks(),
            history: self.history.on().then_some((&self.history, dev)),
            cache_idle: &self.config.cache_idle,
        }
    }

    /// Whether an NVTX tool is told about segments and blocks: a tool is attached, and blocks
    /// are pieces of segments (under `none` every block is the driver's own allocation, which
    /// the tool sees by itself).
    #[inline]
    pub(crate) fn tools_see_blocks(&self) -> bool {
        nvtx::active() && self.config.pool != PoolKind::None
    }
}

/// The upstream of every pool in the shim: the device's budget in front of the real driver
/// (and, when `tools`, each segment registered with the NVTX tool as a heap).
pub struct DriverUpstream<'a> {
    driver: &'a Driver,
    device: CUdevice,
    budget: &'a DeviceBudget,
    tools: bool,
    /// `CUDAPOOL_HISTORY` is on: segments are recorded for this device.
    history: Option<(&'a History, CUdevice)>,
    /// `CUDAPOOL_CACHE_IDLE`.
    cache_idle: &'a CacheIdle,
}

impl Upstream for DriverUpstream<'_> {
    fn virtual_memory(&self) -> Option<&dyn VirtualMemory> {
        Some(self)
    }

    fn alloc(&self, bytes: u64) -> Result<DevPtr, CUresult> {
        if !self.budget.try_charge(bytes) {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        // A segment taken while a capture is under way: in the relaxed mode (see
        // `Driver::relaxed`); the mapped growth of expandable segments needs none.
        let got = if crate::base::flags::capturing_somewhere() {
            self.driver.relaxed(|| self.driver.mem_alloc(bytes))
        } else {
            self.driver.mem_alloc(bytes)
        };
        match got {
            Ok(p) => {
                self.budget.on_driver_alloc();
                if self.tools {
                    nvtx::segment_added(p, bytes);
                }
                if let Some((h, dev)) = self.history {
                    h.record(dev, Action::SegmentAlloc, p, bytes, 0, None);
                }
                Ok(p)
            }
            Err(e) => {
                self.budget.refund(bytes);
                Err(e)
            }
        }
    }

    fn headroom(&self) -> u64 {
        self.budget.room()
    }

    fn limit(&self) -> Limit {
        let group = self.budget.shared().map_or(Limit::NONE, |s| s.limit());
        self.budget.hard_limit().min(group)
    }

    fn over_soft_limit(&self) -> bool {
        self.budget.over_soft_limit()
    }

    fn cache_idle(&self) -> CacheIdle {
        *self.cache_idle
    }

    /// A release of cudapool's own: refused while a graph capture is under way (the real
    /// `cuMemFree` synchronizes, which a capture forbids); the pool keeps the segment.
    fn free(&self, ptr: DevPtr, bytes: u64) -> Result<(), CUresult> {
        let Some(calls) = own_calls() else {
            return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        };
        self.free_segment(self.driver.own(&calls).release(), ptr, bytes)
    }

    /// The program's own free of a block the `none` pool handed it (the whole allocation).
    fn free_for_program(&self, ptr: DevPtr, bytes: u64) -> Result<(), CUresult> {
        let release = self.driver.release_inside(Inside::ProgramsFree);
        self.free_segment(release, ptr, bytes)
    }
    /// False while a graph capture is under way (`cuCtxSynchronize` would end it).
    fn synchronize(&self) -> bool {
        let Some(calls) = own_calls() else {
            return false;
        };
        self.driver.own(&calls).synchronize().is_ok()
    }
}

impl VirtualMemory for DriverUpstream<'_> {
    fn vmm(&self) -> Option<crate::pool::Vmm> {
        let chunk = self.driver.vmm_granularity(self.device)?.max(2 << 20);
        let total = self.driver.device_total_mem(self.device).ok()?;
        Some(crate::pool::Vmm {
            chunk,
            span: total.next_multiple_of(chunk),
        })
    }
    fn reserve(&self, bytes: u64, chunk: u64) -> Result<DevPtr, CUresult> {
        let p = self.driver.vmm_reserve(bytes, chunk)?;
        // The range is one segment (its mapped bytes are charged as they are mapped). No NVTX
        // heap: memcheck reports a heap over address space with nothing mapped, and sees the
        // mapped chunks as allocations of their own (blocks in them are not told apart).
        self.budget.on_driver_alloc();
        Ok(p)
    }
    fn unreserve(&self, at: DevPtr, bytes: u64) {
        if crate::base::flags::exiting() {
            return;
        }
        // Not during a capture: the range stays reserved (its address space only).
        let Some(calls) = own_calls() else {
            return;
        };
        if self
            .driver
            .own(&calls)
            .release()
            .vmm_unreserve(at, bytes)
            .is_ok()
        {
            self.budget.on_driver_free();
        }
    }
    fn map(&self, at: DevPtr, bytes: u64, chunk: u64) -> Result<(), CUresult> {
        if !self.budget.try_charge(bytes) {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        match self.driver.vmm_map(self.device, at, bytes, chunk) {
            Ok(()) => {
                self.budget.on_map(bytes.div_ceil(chunk));
                if let Some((h, dev)) = self.history {
                    h.record(dev, Action::SegmentMap, at, bytes, 0, None);
                }
                Ok(())
            }
            Err(e) => {
                self.budget.refund(bytes);
                Err(e)
            }
        }
    }
    /// Gives the charge back. Refused while a graph capture is under way (see
    /// [`free`](Self::free)).
    fn unmap(&self, at: DevPtr, bytes: u64, chunk: u64) -> Result<(), CUresult> {
        if crate::base::flags::exiting() {
            return Ok(());
        }
        let Some(calls) = own_calls() else {
            return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        };
        let release = self.driver.own(&calls).release();
        // Exports of these chunks go first: their descriptors would keep the memory alive.
        super::ipc_mapped::while_unmapping(at, bytes, || release.vmm_unmap(at, bytes, chunk))?;
        if let Some((h, dev)) = self.history {
            h.record(dev, Action::SegmentUnmap, at, bytes, 0, None);
        }
        self.budget.uncharge(bytes);
        self.budget.on_unmap(bytes.div_ceil(chunk));
        Ok(())
    }
    fn stitch(&self, handles: &[(DevPtr, u64)], to: DevPtr) -> Result<usize, CUresult> {
        if self.tools {
            // A sanitizer would see two allocations over the same memory: nothing is stitched.
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        }
        let n = self.driver.vmm_stitch(self.device, handles, to)?;
        self.budget.on_map(n as u64);
        if let Some((h, dev)) = self.history {
            let mut at = to;
            for &(from, bytes) in &handles[..n] {
                h.record(dev, Action::SegmentMap, at, bytes, 0, None);
                h.record(dev, Action::SegmentUnmap, from, bytes, 0, None);
                at += bytes;
            }
        }
        Ok(n)
    }
    fn unmap_alias(&self, at: DevPtr, bytes: u64) -> Result<(), CUresult> {
        if crate::base::flags::exiting() {
            return Ok(());
        }
        let Some(calls) = own_calls() else {
            return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        };
        let release = self.driver.own(&calls).release();
        super::ipc_mapped::while_unmapping(at, bytes, || release.vmm_unmap(at, bytes, bytes))?;
        self.budget.on_unmap(0);
        Ok(())
    }
}

impl DriverUpstream<'_> {
    /// Frees the segment `[ptr, ptr + bytes)` through `release` and gives its charge back.
    fn free_segment(&self, release: Release<'_>, ptr: DevPtr, bytes: u64) -> Result<(), CUresult> {
        if crate::base::flags::exiting() {
            // Past exit() the driver may be torn down: leak rather than call it.
            return Ok(());
        }
        if self.tools {
            nvtx::segment_removed(ptr);
        }
        release.mem_free(ptr)?;
        if let Some((h, dev)) = self.history {
            h.record(dev, Action::SegmentFree, ptr, bytes, 0, None);
        }
        self.budget.uncharge(bytes);
        self.budget.on_driver_free();
        Ok(())
    }
}
