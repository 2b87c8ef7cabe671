//! The process-wide state the hooks act on, and what each hooked call does with it.
//!
//! Data flow: `hooks` (raw pointers, C ABI) call the safe methods here; these find the calling
//! thread's context and its [`Pool`], run the pool against a [`DriverUpstream`] (which charges
//! the device's [`DeviceBudget`] before it asks the real [`Driver`]), and keep the live table.
//!
//! Glossary:
//! - *live table*: every allocation the program holds through the shim, pooled or counted.
//! - *counted*: passed through to the driver (pitched, legacy 32-bit), but charged against the
//!   limit and in the stats like pooled memory.

use crate::addr_hash::{AddrBuild, AddrMap as HashMap};
use crate::budget::{DeviceBudget, DeviceStats};
use crate::config::LogLevel::{Debug, Error, Info, Warn};
use crate::config::{Config, ConfigError, PoolKind};
use crate::cu::*;
use crate::driver::Driver;
use crate::pool::{new_pool, Pool, Upstream};
use crate::report::fmt_bytes;
use crate::streams::ContextClock;
use crate::{log, log_at};
use dashmap::DashMap;
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock};

/// Device ordinals beyond this share one unlimited budget (and a warning says so).
pub const MAX_DEVICES: usize = 64;

/// How an allocation reached the driver; decides how its free goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// A block of the context's pool.
    Pool,
    /// Passed through to the driver and counted; the program's free goes to the driver.
    Counted,
    /// From a driver memory pool (`cuMemAllocFromPoolAsync`, the pool's handle): its free goes
    /// to the driver, and the pool's reserved memory is what is charged (see `counted`).
    DriverPool(usize),
}

/// One allocation the program holds. Keyed by its address in [`Shim::live`].
#[derive(Clone, Copy, Debug)]
pub struct Live {
    /// `CUcontext` it was made in, as an address.
    pub ctx: usize,
    pub device: CUdevice,
    pub size: u64,
    pub origin: Origin,
}

/// The pool of one context, and the clock that makes its reuse safe. Its blocks, segments
/// and events die with the context.
pub struct ContextPool {
    pub device: CUdevice,
    pub clock: Arc<ContextClock>,
    pub pool: Box<dyn Pool>,
}

/// Everything the shim knows. One per process, created at the first CUDA call.
pub struct Shim {
    pub config: Config,
    pub driver: &'static Driver,
    budgets: [OnceLock<DeviceBudget>; MAX_DEVICES],
    overflow_budget: DeviceBudget,
    /// Keyed by `CUcontext` address. An entry exists from the first pooled allocation in that
    /// context until the context is destroyed.
    contexts: RwLock<HashMap<usize, Arc<ContextPool>>>,
    /// Invariant: holds exactly the allocations handed to the program and not yet freed, with
    /// the size the program asked for (pooled) or the driver's real footprint (counted).
    live: DashMap<DevPtr, Live, AddrBuild>,
    /// `CUDAPOOL_TRACK=2`: where each live allocation was made.
    backtraces: DashMap<DevPtr, Arc<std::backtrace::Backtrace>, AddrBuild>,
    /// The shared page `cudapool stat` reads (None if /dev/shm is unusable).
    publisher: Option<crate::publish::Publisher>,
    /// `CUDAPOOL_TRACE`.
    pub trace: Option<crate::trace::Trace>,
    /// Pass-through allocations that are not device pointers (arrays, physical memory) and the
    /// driver pools (see `counted`).
    pub(crate) counted: crate::counted::Counted,
}

/// What the hooks should do, decided once per process.
pub enum State {
    /// Hook: pools, limits and stats apply.
    Active(&'static Shim),
    /// `CUDAPOOL_DISABLE=1`: forward everything untouched.
    PassThrough,
    /// A `CUDAPOOL_*` value was bad: allocations are refused (fail closed).
    Refused,
    /// The real driver could not be opened.
    NoDriver,
}

static CONFIG: OnceLock<Result<Config, ConfigError>> = OnceLock::new();
/// Bumped whenever a context's pool goes away, so per-thread caches of it are dropped.
static GENERATION: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// The last (context, generation, pool) this thread used: the hot path finds its pool here
    /// without the map's lock or a reference-count update.
    static CURRENT: RefCell<Option<(usize, u64, Arc<ContextPool>)>> = const { RefCell::new(None) };
}
static SHIM: OnceLock<Shim> = OnceLock::new();
static REFUSAL_SAID: AtomicBool = AtomicBool::new(false);
static EXITING: AtomicBool = AtomicBool::new(false);

/// Reads the environment once. Called from the load-time constructor, and lazily by anything
/// that runs before it.
pub fn config() -> &'static Result<Config, ConfigError> {
    CONFIG.get_or_init(|| {
        let c = Config::from_env();
        if let Ok(c) = &c {
            log::set_level(c.log);
        }
        c
    })
}

/// Whether the process is past `exit()`: the driver may be gone, so nothing calls it.
pub fn exiting() -> bool {
    EXITING.load(Ordering::Relaxed)
}

extern "C" fn at_exit() {
    EXITING.store(true, Ordering::Relaxed);
    if let Some(shim) = SHIM.get() {
        crate::report::write_exit_report(shim);
        shim.publish_all();
        if let Some(t) = &shim.trace {
            t.write(shim.pool_kind().name());
        }
        if let Some(p) = &shim.publisher {
            p.remove();
        }
    }
}

impl Shim {
    /// The state for this process, setting it up on first use.
    pub fn state() -> State {
        if let Some(s) = SHIM.get() {
            return State::Active(s);
        }
        let config = match config() {
            Ok(c) => c,
            Err(e) => {
                if !REFUSAL_SAID.swap(true, Ordering::Relaxed) {
                    log::line(&format!("{e}; refusing CUDA allocations"));
                }
                return State::Refused;
            }
        };
        if config.disable {
            return State::PassThrough;
        }
        let Some(driver) = Driver::get() else {
            return State::NoDriver;
        };
        let mut fresh = false;
        let shim = SHIM.get_or_init(|| {
            fresh = true;
            Shim::new(config.clone(), driver)
        });
        if fresh {
            log_at!(Info, "active: pool {}", config.pool.name());
            // SAFETY: registers a plain extern "C" function with no arguments.
            unsafe { libc::atexit(at_exit) };
        }
        State::Active(shim)
    }

    /// The shim if it is active (not disabled, refused or driverless).
    pub fn active() -> Option<&'static Shim> {
        match Shim::state() {
            State::Active(s) => Some(s),
            _ => None,
        }
    }

    fn new(config: Config, driver: &'static Driver) -> Shim {
        Shim {
            driver,
            budgets: std::array::from_fn(|_| OnceLock::new()),
            overflow_budget: DeviceBudget::new(0, 0),
            contexts: RwLock::new(HashMap::default()),
            live: DashMap::with_hasher(AddrBuild::default()),
            backtraces: DashMap::with_hasher(AddrBuild::default()),
            publisher: crate::publish::Publisher::create(config.pool.name()),
            trace: config.trace.clone().map(crate::trace::Trace::new),
            counted: Default::default(),
            config,
        }
    }

    /// The budget of `dev`, with its limits resolved on first use.
    pub fn budget(&self, dev: CUdevice) -> &DeviceBudget {
        let Some(slot) = usize::try_from(dev).ok().and_then(|d| self.budgets.get(d)) else {
            log_at!(
                Warn,
                "device ordinal {dev} is beyond {MAX_DEVICES}: no limit applies to it"
            );
            return &self.overflow_budget;
        };
        slot.get_or_init(|| {
            let resolve = |what: &str, spec: Option<crate::config::Limit>| -> u64 {
                let Some(spec) = spec else { return 0 };
                if let crate::config::Limit::Bytes(b) = spec {
                    return b;
                }
                match self.driver.device_total_mem(dev) {
                    Ok(total) => spec.resolve(total),
                    Err(e) => {
                        // Fail closed: a limit we cannot compute allows nothing.
                        log_at!(Error, "device {dev}: cannot read total memory (error {e}) to resolve the {what}; allowing no memory");
                        1
                    }
                }
            };
            let hard = resolve("memory limit", self.config.memory_limit.for_device(dev as u32));
            let soft = resolve("soft limit", self.config.soft_limit.for_device(dev as u32));
            if hard != 0 {
                log_at!(Info, "device {dev}: memory limit {}", fmt_bytes(hard));
            }
            DeviceBudget::new(hard, soft)
        })
    }

    /// Devices whose budget exists (touched by an allocation, a query or the C API).
    pub fn devices_seen(&self) -> Vec<CUdevice> {
        (0..MAX_DEVICES)
            .filter(|&d| self.budgets[d].get().is_some())
            .map(|d| d as CUdevice)
            .collect()
    }

    pub fn device_stats(&self, dev: CUdevice) -> DeviceStats {
        self.budget(dev).stats(self.cached_bytes(dev))
    }

    /// Bytes cached by the pools of every context on `dev`.
    pub fn cached_bytes(&self, dev: CUdevice) -> u64 {
        let contexts = self.contexts.read().unwrap_or_else(|e| e.into_inner());
        contexts
            .values()
            .filter(|c| c.device == dev)
            .map(|c| c.pool.cached_bytes())
            .sum()
    }

    /// The calling thread's context and device; `Err` is the driver's answer (no context).
    fn current(&self) -> Result<(usize, CUdevice), CUresult> {
        let ctx = self
            .driver
            .current_context()?
            .ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
        let dev = self.driver.current_device()?;
        Ok((ctx as usize, dev))
    }

    fn context_pool(&self, ctx: usize, device: CUdevice) -> Arc<ContextPool> {
        if let Some(c) = self
            .contexts
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&ctx)
        {
            return c.clone();
        }
        let mut w = self.contexts.write().unwrap_or_else(|e| e.into_inner());
        w.entry(ctx)
            .or_insert_with(|| {
                let clock = Arc::new(ContextClock::new(self.driver, ctx, self.config.reuse));
                Arc::new(ContextPool {
                    device,
                    pool: new_pool(self.config.pool, clock.clone()),
                    clock,
                })
            })
            .clone()
    }

    fn upstream<'a>(&'a self, budget: &'a DeviceBudget) -> DriverUpstream<'a> {
        DriverUpstream {
            driver: self.driver,
            budget,
        }
    }

    /// Runs `f` with the pool of the calling thread's current context: from the per-thread
    /// cache when it is still valid (no lock, no reference count touched), else from the map,
    /// creating the pool on first use. `f` must not re-enter the shim.
    fn with_current_pool<T>(
        &self,
        f: impl FnOnce(usize, &ContextPool) -> T,
    ) -> Result<T, CUresult> {
        let ctx = self
            .driver
            .current_context()?
            .ok_or(CUDA_ERROR_INVALID_CONTEXT)? as usize;
        let generation = GENERATION.load(Ordering::Acquire);
        let mut f = Some(f);
        let hit = CURRENT.try_with(|c| match &*c.borrow() {
            Some((cx, g, cp)) if *cx == ctx && *g == generation => f.take().map(|f| f(ctx, cp)),
            _ => None,
        });
        if let Ok(Some(r)) = hit {
            return Ok(r);
        }
        let f = f.take().expect("f runs once");
        let dev = self.driver.current_device()?;
        let cp = self.context_pool(ctx, dev);
        let _ = CURRENT.try_with(|c| *c.borrow_mut() = Some((ctx, generation, cp.clone())));
        Ok(f(ctx, &cp))
    }

    /// Runs `f` with the pool of context `ctx`, if it has one (from the per-thread cache when
    /// it is `ctx`'s). `f` must not re-enter the shim.
    fn with_pool_of<T>(&self, ctx: usize, f: impl FnOnce(&ContextPool) -> T) -> Option<T> {
        let generation = GENERATION.load(Ordering::Acquire);
        let mut f = Some(f);
        let hit = CURRENT.try_with(|c| match &*c.borrow() {
            Some((cx, g, cp)) if *cx == ctx && *g == generation => f.take().map(|f| f(cp)),
            _ => None,
        });
        if let Ok(Some(r)) = hit {
            return Some(r);
        }
        let cp = self
            .contexts
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&ctx)
            .cloned()?;
        f.take().map(|f| f(&cp))
    }

    /// `cuMemAlloc`: a pooled block of `size` (> 0) bytes in the current context.
    pub fn mem_alloc(&self, size: u64) -> Result<DevPtr, CUresult> {
        self.with_current_pool(|ctx, cp| self.alloc_in(ctx, cp, size, None))?
    }

    /// `cuMemAllocAsync` of `size` (> 0) bytes on `stream` (as the program passed it; `ptsz`
    /// for the per-thread-default-stream entry point). `driver_alloc` and `driver_free` are the
    /// driver's own, for an allocation made while `stream` captures a graph: that one goes to
    /// the driver (it becomes a node of the graph) and is counted.
    pub fn mem_alloc_async(
        &self,
        size: u64,
        stream: usize,
        ptsz: bool,
        driver_alloc: impl FnOnce() -> Result<DevPtr, CUresult>,
        driver_free: impl FnOnce(DevPtr),
    ) -> Result<DevPtr, CUresult> {
        let stream = crate::streams::resolve(stream, ptsz);
        if crate::streams::capturing(self.driver, stream) {
            return self.alloc_counted(size, || driver_alloc().map(|p| (p, size)), driver_free);
        }
        let on = Some(crate::streams::key(stream));
        self.in_stream_context(stream, || {
            self.with_current_pool(|ctx, cp| self.alloc_in(ctx, cp, size, on))?
        })
    }

    /// Runs `f` with the context of `stream` current (it is, unless the program passed a
    /// stream of another context).
    pub fn in_stream_context<T>(&self, stream: usize, f: impl FnOnce() -> T) -> T {
        let s = stream;
        if s == 0 || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD {
            return f();
        }
        let mut ctx: CUcontext = std::ptr::null_mut();
        let current = self.driver.current_context().ok().flatten();
        if crate::driver::call!(self.driver, stream_get_ctx(s as CUstream, &mut ctx))
            != CUDA_SUCCESS
            || ctx.is_null()
            || Some(ctx) == current
        {
            return f();
        }
        self.driver.in_context(ctx as usize, f)
    }

    /// The calling thread's context and device, for a pass-through allocation on `stream`.
    pub fn stream_context(&self, stream: usize) -> Result<(usize, CUdevice), CUresult> {
        self.in_stream_context(stream, || self.current())
    }

    fn alloc_in(
        &self,
        ctx: usize,
        cp: &ContextPool,
        size: u64,
        on: Option<crate::pool::StreamKey>,
    ) -> Result<DevPtr, CUresult> {
        let dev = cp.device;
        let budget = self.budget(dev);
        let up = self.upstream(budget);
        let pool_alloc = |up: &DriverUpstream| match on {
            Some(s) => cp.pool.alloc_on(size, s, up),
            None => cp.pool.alloc(size, up),
        };
        let grant = match pool_alloc(&up) {
            Ok(g) => g,
            Err(CUDA_ERROR_OUT_OF_MEMORY) => {
                // Never report OOM while cached memory could have served the request: the pool
                // has waited for its fences; give free segments back, as few as make room for
                // this request first (the rest of the cache keeps serving), then all of them.
                let mut retried = None;
                for need in [size.next_multiple_of(2 << 20), u64::MAX] {
                    if cp.pool.cached_bytes() == 0 {
                        break;
                    }
                    if cp.pool.trim(&up, need) == 0 && need != u64::MAX {
                        continue;
                    }
                    retried = Some(pool_alloc(&up));
                    if matches!(retried, Some(Ok(_))) {
                        break;
                    }
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
        self.remember(
            grant.ptr,
            Live {
                ctx,
                device: dev,
                size,
                origin: Origin::Pool,
            },
        );
        budget.on_alloc(size, grant.from_cache);
        log_at!(Debug, "alloc {size} -> {:#x} (device {dev})", grant.ptr);
        if !grant.from_cache || crate::publish::due() {
            self.observe(dev);
        }
        Ok(grant.ptr)
    }

    /// A counted pass-through allocation. `charge` is what is known before the call; `alloc`
    /// returns the address and the real footprint; `release` undoes it if the footprint turns
    /// out not to fit.
    pub fn alloc_counted(
        &self,
        charge: u64,
        alloc: impl FnOnce() -> Result<(DevPtr, u64), CUresult>,
        release: impl FnOnce(DevPtr),
    ) -> Result<DevPtr, CUresult> {
        let (ctx, dev) = self.current()?;
        let budget = self.budget(dev);
        if !budget.try_charge(charge) {
            if self.reclaim_context(ctx, dev) == 0 || !budget.try_charge(charge) {
                return Err(self.failed(dev, charge, CUDA_ERROR_OUT_OF_MEMORY));
            }
            budget.on_reclaim_retry();
        }
        let (ptr, footprint) = match alloc() {
            Ok(r) => r,
            Err(e) => {
                budget.uncharge(charge);
                return Err(self.failed(dev, charge, e));
            }
        };
        if footprint > charge && !budget.try_charge(footprint - charge) {
            release(ptr);
            budget.uncharge(charge);
            return Err(self.failed(dev, footprint, CUDA_ERROR_OUT_OF_MEMORY));
        }
        if footprint < charge {
            budget.uncharge(charge - footprint);
        }
        budget.on_driver_alloc();
        budget.on_alloc(footprint, false);
        self.remember(
            ptr,
            Live {
                ctx,
                device: dev,
                size: footprint,
                origin: Origin::Counted,
            },
        );
        self.observe(dev);
        Ok(ptr)
    }

    /// Enters a new live allocation (and its backtrace under `CUDAPOOL_TRACK=2`).
    pub(crate) fn remember(&self, ptr: DevPtr, live: Live) {
        self.live.insert(ptr, live);
        self.track(ptr);
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
        let Some((_, live)) = self.live.remove(&ptr) else {
            // Not a live allocation. Inside a pool's segment (a second free, an interior
            // pointer) it must not reach the driver, which would free memory the pool owns.
            if self.pool_owns(ptr) {
                return CUDA_ERROR_INVALID_VALUE;
            }
            return driver_free(ptr);
        };
        let budget = self.budget(live.device);
        budget.on_release(live.size);
        let result = match live.origin {
            Origin::Pool => {
                // A free made while its stream captures a graph runs when the graph does: it
                // gets no same-stream reuse, only a fence issued after the capture.
                let on = on
                    .map(|(s, ptsz)| crate::streams::resolve(s, ptsz))
                    .filter(|&s| !crate::streams::capturing(self.driver, s))
                    .map(crate::streams::key);
                let freed = self.with_pool_of(live.ctx, |cp| {
                    let up = self.upstream(budget);
                    match on {
                        Some(s) => cp.pool.free_on(ptr, live.size, s, &up),
                        None => cp.pool.free(ptr, live.size, &up),
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
            Origin::DriverPool(pool) => {
                let r = driver_free(ptr);
                if r == CUDA_SUCCESS {
                    self.driver_pool_freed(pool, live.size);
                }
                r
            }
        };
        if result == CUDA_SUCCESS {
            budget.on_free_call();
            if self.config.track >= 2 {
                self.backtraces.remove(&ptr);
            }
            log_at!(Debug, "free {ptr:#x}");
            if crate::publish::due() {
                self.observe(live.device);
            }
        } else {
            // The driver refused: the program still holds the block.
            budget.on_release_undone(live.size);
            self.live.insert(ptr, live);
        }
        result
    }

    /// Publishes the live stats of every device seen and samples `dev` into the trace. Called
    /// on slow paths, and every few hundred allocations of a thread (see `publish`).
    pub fn observe(&self, dev: CUdevice) {
        if let Some(t) = &self.trace {
            let s = self.budget(dev).stats(0);
            t.counter(dev, s.allocated, s.reserved, s.hard_limit);
        }
        self.publish_all();
    }

    /// Writes the live stats of every device seen to the shared page.
    pub fn publish_all(&self) {
        if let Some(p) = &self.publisher {
            let devices: Vec<_> = self
                .devices_seen()
                .into_iter()
                .map(|d| (d, self.device_stats(d)))
                .collect();
            p.write(&devices);
        }
    }

    /// An event for the trace ("oom", "reclaim", "limit"), and fresh live stats.
    pub fn event(&self, dev: CUdevice, name: &'static str, bytes: u64) {
        if let Some(t) = &self.trace {
            t.instant(dev, name, bytes);
        }
        self.observe(dev);
    }

    /// `CUDAPOOL_TRACK=2`: remembers where the allocation at `ptr` was made.
    fn track(&self, ptr: DevPtr) {
        if self.config.track >= 2 {
            let bt = std::backtrace::Backtrace::force_capture();
            self.backtraces.insert(ptr, Arc::new(bt));
        }
    }

    /// Every live allocation (address, what is known of it, its backtrace when tracked), by
    /// address.
    pub fn live_allocations(&self) -> Vec<(DevPtr, Live, Option<Arc<std::backtrace::Backtrace>>)> {
        let mut v: Vec<_> = self
            .live
            .iter()
            .map(|e| {
                let bt = self.backtraces.get(e.key()).map(|b| b.clone());
                (*e.key(), *e.value(), bt)
            })
            .collect();
        v.sort_by_key(|e| e.0);
        v
    }

    /// Every context's pool segments on `dev`, with the context they belong to.
    pub fn segments(&self, dev: CUdevice) -> Vec<(usize, crate::pool::SegmentView)> {
        let contexts = self.contexts.read().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<_> = contexts
            .iter()
            .filter(|(_, c)| c.device == dev)
            .flat_map(|(&ctx, c)| c.pool.segments().into_iter().map(move |s| (ctx, s)))
            .collect();
        out.sort_by_key(|(_, s)| s.ptr);
        out
    }

    /// Bytes of live allocations from the driver pool `pool`.
    pub fn live_bytes_of_driver_pool(&self, pool: usize) -> u64 {
        self.live
            .iter()
            .filter(|e| e.origin == Origin::DriverPool(pool))
            .map(|e| e.size)
            .sum()
    }

    fn pool_owns(&self, ptr: DevPtr) -> bool {
        let contexts = self.contexts.read().unwrap_or_else(|e| e.into_inner());
        contexts.values().any(|c| c.pool.owns(ptr))
    }

    /// Whether the work hooks report queues: reuse is `auto` and the pool caches.
    pub fn watches_work(&self) -> bool {
        self.config.reuse == crate::config::Reuse::Auto && self.config.pool != PoolKind::None
    }

    /// Device work is about to be issued on `stream` (as the program passed it; `ptsz` for a
    /// per-thread entry point). Lock-free while this thread keeps to queues it reported since
    /// the epoch last changed; else the queue is reported to its context's clock, which orders
    /// a new queue after the others (see `queues`). Work being captured into a graph is not
    /// work yet: its graph's launch is.
    pub fn work_on(&self, stream: usize, ptsz: bool) {
        let stream = crate::streams::resolve(stream, ptsz);
        let implicit = stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD;
        let ctx = if implicit {
            match self.driver.current_context() {
                Ok(Some(c)) => c as usize,
                _ => return,
            }
        } else {
            0
        };
        if crate::queues::seen(stream, ctx) {
            return;
        }
        let at = crate::queues::epoch();
        if crate::streams::capturing(self.driver, stream) {
            return;
        }
        let key = crate::streams::key(stream);
        let reported = self.in_stream_context(stream, || {
            self.with_current_pool(|_, cp| cp.clock.work_on(key))
        });
        if reported.is_ok() {
            crate::queues::remember(stream, ctx, at);
        }
    }

    /// The program created `stream` (a handle, as an address) with `flags` in the current
    /// context.
    pub fn stream_created(&self, stream: usize, flags: u32) {
        if let Ok((ctx, dev)) = self.current() {
            self.context_pool(ctx, dev)
                .clock
                .stream_created(stream, flags);
        }
    }

    /// The program is about to destroy `stream` (a handle, as an address).
    pub fn stream_destroying(&self, stream: usize) {
        let mut ctx: CUcontext = std::ptr::null_mut();
        let handle = stream as CUstream;
        if crate::driver::call!(self.driver, stream_get_ctx(handle, &mut ctx)) != CUDA_SUCCESS {
            return;
        }
        let cp = self
            .contexts
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&(ctx as usize))
            .cloned();
        if let Some(cp) = cp {
            cp.clock.stream_destroying(stream);
        }
    }

    /// `cuMemGetInfo`: the driver's figures seen through the limit (SPEC.md).
    pub fn mem_get_info(&self) -> Result<(u64, u64), CUresult> {
        let (driver_free, driver_total) = self.driver.mem_get_info()?;
        let dev = self.driver.current_device()?;
        let budget = self.budget(dev);
        let cached = self.cached_bytes(dev);
        let free = driver_free.saturating_add(cached).min(driver_total);
        let limit = budget.hard_limit();
        if limit == 0 {
            return Ok((free, driver_total));
        }
        let total = limit.min(driver_total);
        let in_use = budget.reserved().saturating_sub(cached);
        Ok((free.min(limit.saturating_sub(in_use)).min(total), total))
    }

    /// Gives back the cached memory of the pool of `ctx`; returns the bytes released.
    fn reclaim_context(&self, ctx: usize, dev: CUdevice) -> u64 {
        let cp = self
            .contexts
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&ctx)
            .cloned();
        cp.map_or(0, |cp| cp.pool.reclaim(&self.upstream(self.budget(dev))))
    }

    /// Gives back the cached memory of every context on `device` (-1: every device), each with
    /// its context pushed while its pool waits for fences and frees (the C API's reclaim).
    pub fn reclaim_device(&self, device: CUdevice) -> u64 {
        let pools: Vec<(usize, Arc<ContextPool>)> = self
            .contexts
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(_, c)| device < 0 || c.device == device)
            .map(|(&ctx, c)| (ctx, c.clone()))
            .collect();
        pools
            .into_iter()
            .map(|(ctx, cp)| {
                let up = self.upstream(self.budget(cp.device));
                let released = self.driver.in_context(ctx, || cp.pool.reclaim(&up));
                self.event(cp.device, "reclaim", released);
                released
            })
            .sum()
    }

    /// Counts and logs an out-of-memory answer (from the limit or from the driver); returns `err`
    /// unchanged whatever it is.
    pub(crate) fn failed(&self, dev: CUdevice, asked: u64, err: CUresult) -> CUresult {
        if err != CUDA_ERROR_OUT_OF_MEMORY {
            return err;
        }
        let budget = self.budget(dev);
        budget.on_oom();
        self.event(dev, "oom", asked);
        if log::enabled(Warn) {
            let s = self.device_stats(dev);
            let device_free = self
                .driver
                .mem_get_info()
                .map_or("unknown".to_string(), |(f, _)| fmt_bytes(f));
            let limit = match s.hard_limit {
                0 => "none".to_string(),
                l => fmt_bytes(l),
            };
            log::line(&format!(
                "out of memory on device {dev}: asked {}; limit {limit}, allocated {}, reserved {}, cached after reclaim {}, device free {device_free}",
                fmt_bytes(asked),
                fmt_bytes(s.allocated),
                fmt_bytes(s.reserved),
                fmt_bytes(s.cached),
            ));
        }
        err
    }

    /// The context `ctx` is gone (destroyed or reset): its memory went with it. Drop every
    /// record of it without calling the driver (DESIGN.md trap 5).
    pub fn context_gone(&self, ctx: usize) {
        let cp = self
            .contexts
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&ctx);
        GENERATION.fetch_add(1, Ordering::AcqRel);
        let mut dropped = 0u64;
        let mut driver_pools = Vec::new();
        self.live.retain(|k, l| {
            if l.ctx != ctx {
                return true;
            }
            let budget = self.budget(l.device);
            budget.on_release(l.size);
            match l.origin {
                Origin::Counted => budget.on_segments_dropped(1, l.size),
                Origin::DriverPool(pool) => driver_pools.push((pool, l.size)),
                Origin::Pool => {}
            }
            dropped += 1;
            self.backtraces.remove(k);
            false
        });
        if let Some(cp) = cp {
            let (segments, bytes) = cp.pool.forget_all();
            self.budget(cp.device).on_segments_dropped(segments, bytes);
        }
        self.counted_context_gone(ctx);
        for (pool, size) in driver_pools {
            self.driver_pool_freed(pool, size);
        }
        if dropped > 0 {
            log_at!(
                Info,
                "context {ctx:#x} gone with {dropped} live allocations"
            );
        }
        self.publish_all();
    }

    /// The primary context of `dev` if it is active (its address), before a reset or release.
    pub fn primary_context(&self, dev: CUdevice) -> Option<usize> {
        self.driver.active_primary_context(dev).map(|c| c as usize)
    }

    pub fn pool_kind(&self) -> PoolKind {
        self.config.pool
    }
}

/// The upstream of every pool in the shim: the device's budget in front of the real driver.
pub struct DriverUpstream<'a> {
    driver: &'a Driver,
    budget: &'a DeviceBudget,
}

impl Upstream for DriverUpstream<'_> {
    fn alloc(&self, bytes: u64) -> Result<DevPtr, CUresult> {
        if !self.budget.try_charge(bytes) {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        match self.driver.mem_alloc(bytes) {
            Ok(p) => {
                self.budget.on_driver_alloc();
                Ok(p)
            }
            Err(e) => {
                self.budget.uncharge(bytes);
                Err(e)
            }
        }
    }

    fn headroom(&self) -> u64 {
        match self.budget.hard_limit() {
            0 => u64::MAX,
            limit => limit.saturating_sub(self.budget.reserved()),
        }
    }

    fn limit(&self) -> u64 {
        match self.budget.hard_limit() {
            0 => u64::MAX,
            limit => limit,
        }
    }

    fn over_soft_limit(&self) -> bool {
        let soft = self.budget.soft_limit();
        soft != 0 && self.budget.reserved() > soft
    }

    fn free(&self, ptr: DevPtr, bytes: u64) -> Result<(), CUresult> {
        if exiting() {
            // Past exit() the driver may be torn down: leak rather than call it.
            return Ok(());
        }
        self.driver.mem_free(ptr)?;
        self.budget.uncharge(bytes);
        self.budget.on_driver_free();
        Ok(())
    }
}
