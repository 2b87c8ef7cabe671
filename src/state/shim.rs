//! The [`Shim`]: the process state as one value, made of parts that each own one concern
//! (budgets, contexts and their pools, the live table, pass-through accounting); its set-up;
//! the read-only [`View`] reporting gets and the [`Observer`] it is told through; when to
//! sample on the hot path. The operations live beside it, by concern (see `state`).

use super::budgets::Budgets;
use super::contexts::Contexts;
use super::counted::Counted;
use super::live::{Live, LiveTable};
use crate::base::config::LogLevel::{Info, Warn};
use crate::base::config::{Config, ConfigError, PoolKind};
use crate::base::cu::*;
use crate::base::log;
use crate::base::log::fmt_bytes;
use crate::driver::Driver;
use crate::limits::budget::{DeviceBudget, DeviceStats};
use crate::log_at;
use crate::pool::SegmentView;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

/// Everything the shim knows. One per process, created at the first CUDA call.
pub struct Shim {
    pub config: Config,
    pub driver: &'static Driver,
    /// Per-device limits and counters.
    pub(super) budgets: Budgets,
    /// Each context's pool and the clock that makes its reuse safe.
    pub(super) contexts: Contexts,
    /// Every allocation the program holds.
    pub(super) live: LiveTable,
    /// Pass-through allocations that are not device pointers (arrays, physical memory) and the
    /// driver pools.
    pub(super) counted: Counted,
    /// Graphs with memory nodes and the driver's graph memory, as charged.
    pub(super) graphs: super::graphs::Graphs,
    /// Segments imported through tagged IPC handles.
    pub(super) imports: super::ipc::Imports,
    pub(super) mapped_imports: super::ipc_mapped::MappedImports,
    /// `CUDAPOOL_HISTORY`: the last allocator events of each device.
    pub(super) history: super::history::History,
    /// What the driver took besides allocations (stack, heap, modules, contexts).
    pub(super) overhead: super::overhead::Overhead,
    /// What is asleep (`sleep`).
    pub(super) sleep: super::sleep::Sleep,
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

/// A read-only view of the state: all that reporting (status text, snapshots, the exit report,
/// the trace, the live page) may see.
pub trait View {
    fn config(&self) -> &Config;
    fn pool_kind(&self) -> PoolKind;
    /// Devices whose budget exists (touched by an allocation, a query or the C API).
    fn devices_seen(&self) -> Vec<CUdevice>;
    fn device_stats(&self, dev: CUdevice) -> DeviceStats;
    /// The device's UUID, if the driver says.
    fn device_uuid(&self, dev: CUdevice) -> Option<[u8; 16]>;
    /// Every context's pool segments on `dev`, with the context they belong to, by address.
    fn segments(&self, dev: CUdevice) -> Vec<(usize, SegmentView)>;
    /// Every live allocation (address, what is known of it, its backtrace when tracked), by
    /// address.
    fn live_allocations(&self) -> Vec<(DevPtr, Live, Option<Arc<std::backtrace::Backtrace>>)>;
    /// `CUDAPOOL_HISTORY`: the last allocator events of `dev`, oldest first.
    fn history(&self, dev: CUdevice) -> Vec<super::history::Event>;
    /// Counted memory that is no live allocation, on `dev`: (kind, address, bytes) of every
    /// virtual-memory mapping (`"vmm"`) and array (`"array"`, its handle as the address).
    fn counted_memory(&self, dev: CUdevice) -> Vec<(&'static str, DevPtr, u64)>;
    /// When the process last issued device work or allocated (ns since the epoch), as seen by
    /// this look (see `Shim::last_active_ns`): the page's thread looks each poll.
    fn last_active_ns(&self) -> u64;
}

/// The state as reporting may see it, once set up and active.
pub fn view() -> Option<&'static dyn View> {
    Shim::active().map(|s| s as &dyn View)
}

/// Whether a CUDA call of the program ever reached cudapool (set up or not).
pub fn cuda_seen() -> bool {
    Shim::cuda_seen()
}

/// Who is told what happens (reporting, installed by the crate root). Called on slow paths
/// and every few hundred allocations of a thread; never from inside a pool's lock.
pub trait Observer: Send + Sync {
    /// The figures of `dev` may have changed.
    fn sample(&self, view: &dyn View, dev: CUdevice);
    /// An allocation or a free on `dev` that [`sample`](Self::sample) was not called for (a
    /// cache hit between samples): only `CUDAPOOL_TRACE`'s counters want every change.
    fn changed(&self, view: &dyn View, dev: CUdevice) {
        let _ = (view, dev);
    }
    /// Something happened on `dev`: `"oom"`, `"reclaim"`, `"limit"`, with its bytes.
    fn event(&self, view: &dyn View, dev: CUdevice, name: &'static str, bytes: u64);
    /// The program receives an out-of-memory answer for `bytes` on `dev`: what the observer
    /// kept of the moment, for the OOM line (`CUDAPOOL_OOM_SNAPSHOT`'s file).
    fn oom(&self, view: &dyn View, dev: CUdevice, bytes: u64) -> Option<String> {
        let _ = (view, dev, bytes);
        None
    }
    /// The process is asleep now: what outside readers see must say so before it may be
    /// stopped (a suspend stops it right after), so this is written at once.
    fn asleep(&self, view: &dyn View) {
        let _ = view;
    }
    /// The process is exiting (the driver may already be gone).
    fn at_exit(&self, view: &dyn View);
    /// What the live cudapool processes of this user whose `CUDAPOOL_RUN_PID` is `run` hold on
    /// the GPU `uuid`, as their pages say (`configured`: `CUDAPOOL_RUNTIME_DIR`). Asked by NVML's
    /// view in a process that never uses CUDA (nvidia-smi in the shell of `cudapool run`).
    fn run_held(&self, uuid: &[u8; 16], run: &[u8], configured: Option<&std::path::Path>) -> u64 {
        let _ = (uuid, run, configured);
        0
    }
}

static ENV_CONFIG: OnceLock<Result<Config, ConfigError>> = OnceLock::new();
static CONFIG: OnceLock<Result<Config, ConfigError>> = OnceLock::new();
/// The group this process joined (`CUDAPOOL_GROUP`), or why it could not.
static GROUP: OnceLock<Result<Option<Arc<crate::limits::group::Group>>, String>> = OnceLock::new();
static SHIM: OnceLock<Shim> = OnceLock::new();
static OBSERVER: OnceLock<&'static dyn Observer> = OnceLock::new();
static REFUSAL_SAID: AtomicBool = AtomicBool::new(false);
/// Set when a call of the program first reached the shim (`Shim::set_up`), whatever came of it.
static CUDA_SEEN: AtomicBool = AtomicBool::new(false);

/// Reads the environment once. Called from the load-time constructor, and lazily by anything
/// that runs before it.
pub fn env_config() -> &'static Result<Config, ConfigError> {
    ENV_CONFIG.get_or_init(|| {
        let c = Config::from_env().and_then(|c| {
            // CUDAPOOL_FAULTS names entry points of the driver's table.
            match c
                .faults
                .iter()
                .find(|f| crate::driver::field_of(&f.call).is_none())
            {
                Some(f) => Err(ConfigError {
                    var: "CUDAPOOL_FAULTS",
                    value: std::env::var("CUDAPOOL_FAULTS").unwrap_or_default(),
                    why: format!("cudapool never calls {}", f.call),
                    accepted: crate::base::config::Fault::ACCEPTED,
                }),
                None => Ok(c),
            }
        });
        if let Ok(c) = &c {
            log::set_level(c.log);
        }
        c
    })
}

/// The settings cudapool acts on: the environment's, with the share of the job this process
/// runs in applied (the mandatory mode: `base::job`). Looked up when first needed (the first
/// CUDA call, or an NVML question), never at load: a process that never touches CUDA reads
/// nothing more than its environment.
pub fn config() -> &'static Result<Config, ConfigError> {
    CONFIG.get_or_init(|| {
        let c = env_config().clone();
        c.and_then(|mut c| {
            match crate::base::job::this_process() {
                Ok(Some(share)) => crate::base::job::apply(&mut c, share),
                Ok(None) => {}
                Err(why) => {
                    return Err(ConfigError {
                        var: "the job's share",
                        value: crate::base::job::JOBS_DIR.to_string(),
                        why,
                        accepted: "a file of root per job, limit=SIZE and optionally group=NAME (docs/deploying.md)",
                    })
                }
            }
            let foreign = c.group.as_deref().and_then(|g| {
                crate::base::job::foreign_slurm_group(g, c.job.as_deref())
            });
            match foreign {
                Some(why) => Err(ConfigError {
                    var: "CUDAPOOL_GROUP",
                    value: c.group.clone().unwrap_or_default(),
                    why,
                    accepted: "a group of your own, or none",
                }),
                None => Ok(c),
            }
        })
    })
}

/// Installs who is told what happens (once; the crate root does it when the library loads).
pub fn set_observer(o: &'static dyn Observer) {
    let _ = OBSERVER.set(o);
}

/// Who is told what happens, once installed (for state that asks it something).
pub(crate) fn observer() -> Option<&'static dyn Observer> {
    OBSERVER.get().copied()
}

extern "C" fn at_exit() {
    crate::base::flags::set_exiting();
    if let (Some(shim), Some(o)) = (SHIM.get(), OBSERVER.get()) {
        o.at_exit(shim);
    }
    // After the report (which reads the group's figures): the last member takes the ledger.
    if let Some(Ok(Some(g))) = GROUP.get() {
        g.leave();
    }
}

// ---- when to sample on the hot path ----------------------------------------------------------

/// Observers are sampled every this many allocations and frees of a thread, unless another
/// sample was taken less than [`MIN_GAP_NS`] ago (a sample reads every thread's counters and
/// writes the shared page: with 16 threads sampling on their own, it cost more than the pairs)...
pub const SAMPLE_EVERY: u32 = 256;
pub const MIN_GAP_NS: u64 = 1_000_000;
/// ... or, checked every this many, when the last sample is older than [`STALE_NS`].
pub const CHECK_EVERY: u32 = 16;
pub const STALE_NS: u64 = 100_000_000;
/// When observers were last sampled (ns on the monotonic clock).
static LAST_SAMPLE_NS: AtomicU64 = AtomicU64::new(0);

fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Whether observers should be sampled after a thread's `ops`-th allocation or free on a device
/// (the count its budget line keeps: [`DeviceBudget::on_alloc`](crate::limits::budget::DeviceBudget)).
pub(crate) fn sample_due(ops: u64) -> bool {
    if !ops.is_multiple_of(CHECK_EVERY as u64) {
        return false;
    }
    let age = now_ns().saturating_sub(LAST_SAMPLE_NS.load(Ordering::Relaxed));
    age > STALE_NS || (ops.is_multiple_of(SAMPLE_EVERY as u64) && age >= MIN_GAP_NS)
}

impl Shim {
    /// The state for this process, setting it up on first use.
    #[inline]
    pub fn state() -> State {
        match SHIM.get() {
            Some(s) => State::Active(s),
            None => Shim::set_up(),
        }
    }

    /// [`state`](Self::state) before the shim is active: reads the settings and sets it up.
    #[cold]
    #[inline(never)]
    fn set_up() -> State {
        CUDA_SEEN.store(true, Ordering::Relaxed);
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
        // A group limit this process cannot keep fails closed, like a bad value.
        let group = GROUP.get_or_init(|| match &config.group {
            Some(name) => crate::limits::group::Group::join(
                name,
                config.runtime_dir.as_deref(),
                config.group_dir.as_deref(),
            )
            .map(Some),
            None => Ok(None),
        });
        let group = match group {
            Ok(g) => g.clone(),
            Err(e) => {
                if !REFUSAL_SAID.swap(true, Ordering::Relaxed) {
                    log::line(&format!("CUDAPOOL_GROUP: {e}; refusing CUDA allocations"));
                }
                return State::Refused;
            }
        };
        let mut fresh = false;
        let shim = SHIM.get_or_init(|| {
            fresh = true;
            Shim {
                budgets: Budgets::new(group.clone()),
                contexts: Contexts::default(),
                live: LiveTable::new(config.track),
                counted: Counted::default(),
                graphs: Default::default(),
                imports: Default::default(),
                mapped_imports: Default::default(),
                history: super::history::History::new(config.history),
                overhead: Default::default(),
                sleep: Default::default(),
                config: config.clone(),
                driver,
            }
        });
        if fresh {
            crate::driver::arm_faults(&config.faults);
            if let Some(g) = &group {
                // Lends this process's idle cache when another member is short.
                shim.serve_group(g);
            }
            shim.start_suspend_thread();
            log_at!(Info, "active: pool {}", config.pool.name());
            // Said once, when the library becomes active (a process that never touches CUDA is
            // never disturbed): names it does not know, files it could not write at exit.
            let names: Vec<String> = std::env::vars_os()
                .filter_map(|(k, _)| k.into_string().ok())
                .collect();
            let unknown = crate::base::config::names::unknown(names.iter().map(String::as_str));
            for line in unknown.iter().chain(&config.notes()) {
                log_at!(Warn, "{line}");
            }
            if config.segments == crate::base::config::Segments::Expandable
                && config.segments_set
                && config.pool != PoolKind::Split
            {
                log_at!(
                    Warn,
                    "CUDAPOOL_SEGMENTS=expandable applies to the split pool only; {} keeps whole segments",
                    config.pool.name()
                );
            }
            // SAFETY: registers a plain extern "C" function with no arguments.
            unsafe { libc::atexit(at_exit) };
        }
        State::Active(shim)
    }

    /// Whether a CUDA call of the program ever reached cudapool (set up or not).
    pub fn cuda_seen() -> bool {
        CUDA_SEEN.load(Ordering::Relaxed)
    }

    /// The shim if it is already set up, without setting it up (for questions a process that
    /// never used CUDA may ask, such as NVML's: answering them must not make it a CUDA process).
    pub fn if_set_up() -> Option<&'static Shim> {
        SHIM.get()
    }

    /// The group this process joined, if any.
    pub(super) fn joined_group(&self) -> Option<Arc<crate::limits::group::Group>> {
        GROUP
            .get()
            .and_then(|g| g.as_ref().ok())
            .and_then(Clone::clone)
    }

    /// The shim if it is active (not disabled, refused or driverless).
    pub fn active() -> Option<&'static Shim> {
        match Shim::state() {
            State::Active(s) => Some(s),
            _ => None,
        }
    }

    /// The budget of `dev`, with its limits resolved on first use.
    pub fn budget(&self, dev: CUdevice) -> &DeviceBudget {
        self.budgets.get(dev, self.driver, &self.config)
    }

    /// Bytes cached by the pools of every context on `dev`.
    pub fn cached_bytes(&self, dev: CUdevice) -> u64 {
        self.contexts.cached_bytes(dev)
    }

    /// The calling thread's context and device; `Err` is the driver's answer (no context).
    pub(super) fn current(&self) -> Result<(usize, CUdevice), CUresult> {
        let ctx = self
            .driver
            .current_context()?
            .ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
        let dev = self.driver.current_device()?;
        Ok((ctx as usize, dev))
    }

    /// Tells the observer the figures of `dev` may have changed. Called on slow paths, and
    /// every few hundred allocations of a thread ([`sample_due`]).
    pub fn observe(&self, dev: CUdevice) {
        LAST_SAMPLE_NS.store(now_ns(), Ordering::Relaxed);
        if let Some(o) = OBSERVER.get() {
            o.sample(self, dev);
        }
    }

    /// After an allocation or a free that did not [`observe`](Self::observe): under
    /// `CUDAPOOL_TRACE` the trace takes the figures of `dev` (so its curves show every change,
    /// not one jump per sample); otherwise nothing.
    #[inline]
    pub fn changed(&self, dev: CUdevice) {
        if self.config.trace.is_some() {
            if let Some(o) = OBSERVER.get() {
                o.changed(self, dev);
            }
        }
    }

    /// Tells the observer of an event ("oom", "reclaim", "limit").
    pub fn event(&self, dev: CUdevice, name: &'static str, bytes: u64) {
        LAST_SAMPLE_NS.store(now_ns(), Ordering::Relaxed);
        if let Some(o) = OBSERVER.get() {
            o.event(self, dev, name, bytes);
        }
    }

    /// Counts and logs an out-of-memory answer (from the limit or from the driver); returns `err`
    /// unchanged whatever it is.
    pub(crate) fn failed(&self, dev: CUdevice, asked: u64, err: CUresult) -> CUresult {
        if err != CUDA_ERROR_OUT_OF_MEMORY || self.deferred_oom(dev, asked) {
            return err;
        }
        self.report_oom(dev, asked);
        err
    }

    /// An out-of-memory answer reaches the program: counted, recorded, handed to the observer
    /// (which may write a snapshot and add a note), and said in one line.
    pub fn report_oom(&self, dev: CUdevice, asked: u64) {
        let budget = self.budget(dev);
        budget.on_oom();
        self.history
            .record(dev, super::history::Action::Oom, 0, asked, 0, None);
        self.event(dev, "oom", asked);
        let note = OBSERVER
            .get()
            .and_then(|o| o.oom(self, dev, asked))
            .map_or(String::new(), |n| format!("; {n}"));
        if log::enabled(Warn) {
            // A line that names a snapshot file (written or removed) is always said.
            let held_back = match oom_line_due() {
                Some(n) => n,
                None if !note.is_empty() => 0,
                None => return,
            };
            let s = self.device_stats(dev);
            // Not asked during a graph capture (a call of cudapool's own).
            let device_free = crate::base::flags::own_calls()
                .and_then(|calls| self.driver.own(&calls).mem_get_info().ok())
                .map_or(
                    "the GPU's free memory not asked during a capture".to_string(),
                    |(f, _)| format!("the GPU itself has {} free", fmt_bytes(f)),
                );
            let limit = crate::base::limit::Limit::from_raw(s.hard_limit).to_string();
            let group = match (self.group_name(), self.budgets.share(dev)) {
                (Some(name), Some(share)) => {
                    let g = share.figures();
                    let glimit = match g.limit {
                        0 => "none".to_string(),
                        l => fmt_bytes(l),
                    };
                    format!(
                        "; group {name}: limit {glimit}, reserved {} by {} members",
                        fmt_bytes(g.reserved),
                        g.members
                    )
                }
                _ => String::new(),
            };
            let by = super::overhead::asking().map_or(String::new(), |w| format!(" by {w}"));
            let overhead = match s.overhead {
                0 => String::new(),
                o => format!(" (the driver's own for this process: {})", fmt_bytes(o)),
            };
            let held_back = match held_back {
                0 => String::new(),
                n => format!(" ({n} more out-of-memory answers since the last line)"),
            };
            log::line(&format!(
                "out of memory on device {dev}: asked {}{by}; limit {limit}, allocated {}, reserved {}{overhead}, cached after reclaim {}; {device_free}{group}{note}{held_back}",
                fmt_bytes(asked),
                fmt_bytes(s.allocated),
                fmt_bytes(s.reserved),
                fmt_bytes(s.cached),
            ));
        }
    }
}

impl View for Shim {
    fn config(&self) -> &Config {
        &self.config
    }

    fn pool_kind(&self) -> PoolKind {
        self.config.pool
    }

    fn devices_seen(&self) -> Vec<CUdevice> {
        self.budgets.seen()
    }

    fn device_stats(&self, dev: CUdevice) -> DeviceStats {
        let mut s = self.budget(dev).stats(self.cached_bytes(dev));
        s.asleep = self.asleep_bytes(dev);
        s.sleep_state = super::sleep::state() as u64;
        s.waking_for = self.waking_waits_for();
        s.panics = crate::base::flags::panics();
        let (cause, since) = super::sleep::cause();
        s.sleep_cause = cause as u64;
        s.asleep_since_ns = since;
        // As last looked at (the page's thread looks each poll), in whole seconds: the figure
        // costs the sampling path nothing, and a busy process's page is not written again for
        // each call.
        s.active_ns = self.active_seen_ns() / 1_000_000_000 * 1_000_000_000;
        s
    }

    fn device_uuid(&self, dev: CUdevice) -> Option<[u8; 16]> {
        self.budgets.uuid(dev, self.driver)
    }

    fn segments(&self, dev: CUdevice) -> Vec<(usize, SegmentView)> {
        self.contexts.segments(dev)
    }

    fn live_allocations(&self) -> Vec<(DevPtr, Live, Option<Arc<std::backtrace::Backtrace>>)> {
        self.live.all()
    }

    fn history(&self, dev: CUdevice) -> Vec<super::history::Event> {
        self.history.settle(|| self.contexts.fenced());
        self.history.events(dev)
    }

    fn counted_memory(&self, dev: CUdevice) -> Vec<(&'static str, DevPtr, u64)> {
        self.counted.memory_on(dev)
    }

    fn last_active_ns(&self) -> u64 {
        Shim::last_active_ns(self)
    }
}

/// The first [`OOM_LINES_FREE`] out-of-memory lines are said; after them, at most one every
/// [`OOM_LINE_EVERY`] (and every one that names a snapshot file), naming how many answers went
/// unsaid meanwhile (a program that retries
/// would otherwise fill its log: 168 lines in 25 s were seen). `Some(unsaid)` when a line is
/// due now.
fn oom_line_due() -> Option<u64> {
    use std::sync::atomic::AtomicU64;
    static SAID: AtomicU64 = AtomicU64::new(0);
    static UNSAID: AtomicU64 = AtomicU64::new(0);
    static LAST_NS: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    if SAID.fetch_add(1, Ordering::Relaxed) < OOM_LINES_FREE {
        LAST_NS.store(now, Ordering::Relaxed);
        return Some(0);
    }
    let last = LAST_NS.load(Ordering::Relaxed);
    if now.saturating_sub(last) >= OOM_LINE_EVERY.as_nanos() as u64
        && LAST_NS
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    {
        return Some(UNSAID.swap(0, Ordering::Relaxed));
    }
    UNSAID.fetch_add(1, Ordering::Relaxed);
    None
}

/// Out-of-memory lines said before they are thinned out.
const OOM_LINES_FREE: u64 = 10;
/// At most one out-of-memory line this often after the first ones.
const OOM_LINE_EVERY: std::time::Duration = std::time::Duration::from_secs(5);
