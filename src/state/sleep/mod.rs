//! Sleep and wake: the process's pooled device memory moved to host memory and back, at the
//! same addresses, so that every pointer, graph and kernel argument of the program stays valid.
//!
//! What sleeps: the memory of expandable segments (the arena's handles), which can be unmapped
//! and mapped again at its own address; only the parts blocks in use lie on are copied, and
//! cached memory is given back without a copy. What stays on the device: classic segments
//! (whole driver allocations: `split`'s small-request segments, every segment of
//! `CUDAPOOL_SEGMENTS=classic`, `binned` and `simple`), handles another process imported
//! (their memory is shared), and what cudapool does not hold (contexts, modules, graph memory,
//! pass-through allocations).
//!
//! The states, one for the process: awake, falling asleep, asleep, waking ([`State`]). Every
//! work call (launch, copy, memset, event record, stream wait, graph launch) enters through
//! [`enter_work`] (the queue tracker's in-flight count, which it took before, and one load), and
//! every pooled allocation through [`wake_for_alloc`] (one load). A sleep sets *falling asleep*, waits until no such call is
//! in flight (each one that began before passed its work to the driver; each one after waits),
//! waits for the device, and copies and unmaps under the pool's lock. A call that finds the
//! process asleep wakes it first, under the same turn, and proceeds unchanged. Frees need no
//! wake: memory a pool gives back while asleep only drops its host copy (each asleep handle's
//! record in the pool holds it: `pool::Asleep`).
//!
//! A capture in progress postpones a sleep (its device work cannot be drained); the sleep tries
//! again every 10 ms until its timeout. Asleep memory counts against no limit: the unmap gives
//! its charge back, and the wake's map charges it again, waiting for room up to
//! `CUDAPOOL_WAKE_TIMEOUT`.

use super::Shim;
use crate::base::config::LogLevel::{Debug, Info, Warn};
use crate::base::cu::*;
use crate::base::host_copy::HostCopy;
use crate::base::in_flight::Entered;
use crate::base::log::fmt_bytes;
use crate::base::sync::lock;
use crate::log_at;
use crate::pool::queues;
use crate::pool::{Asleep, Mapped, Upstream, VirtualMemory};

mod copy;
mod foreign;
mod idle;
mod ready;
mod table;
use std::sync::atomic::Ordering::*;
use std::time::{Duration, Instant};
pub use table::{cause, state, Cause, Moved, Sleep, State};
use table::{set, set_cause, STATE};

/// Enters a work call: awake, the call counts as in flight until the returned guard drops (a
/// sleep waits for it); asleep, the process is woken first. `Err`: the wake found no room in
/// time (`CUDA_ERROR_OUT_OF_MEMORY`, said in the OOM line); the call must not reach the driver.
#[inline]
pub fn enter_work() -> Result<Entered, CUresult> {
    enter(queues::entered)
}

/// Before a pooled allocation: one load while awake; asleep, the process is woken first (`Err`
/// as for [`enter_work`]). An allocation is not counted in flight: one that passed this load as
/// a sleep began only takes a block or maps new memory, under the pool's lock before or after
/// the sleep's, and the work that uses the block wakes the process first.
#[inline]
pub fn wake_for_alloc() -> Result<(), CUresult> {
    if STATE.load(Relaxed) == State::Awake as u8 {
        return Ok(());
    }
    woken_for_alloc()
}

#[cold]
#[inline(never)]
fn woken_for_alloc() -> Result<(), CUresult> {
    match Shim::active() {
        Some(shim) => shim.wake_for_call(),
        None => Ok(()),
    }
}

/// Whether no work call is in flight.
fn quiescent() -> bool {
    queues::quiescent()
}

#[inline]
fn enter(count_in: fn() -> Entered) -> Result<Entered, CUresult> {
    let e = count_in();
    // SeqCst after the in-flight count's SeqCst increment: a sleep that set its state before
    // this load sees the call in flight, or this load sees the sleep (`base::in_flight`).
    if STATE.load(SeqCst) == State::Awake as u8 {
        return Ok(e);
    }
    drop(e);
    enter_waking(count_in)
}

#[cold]
#[inline(never)]
fn enter_waking(count_in: fn() -> Entered) -> Result<Entered, CUresult> {
    loop {
        if let Some(shim) = Shim::active() {
            shim.wake_for_call()?;
        }
        let e = count_in();
        if STATE.load(SeqCst) == State::Awake as u8 {
            return Ok(e);
        }
    }
}

/// Why a sleep did not happen (the process stays awake): the code the C API returns
/// (`CUDA_ERROR_NOT_READY`: work did not drain; `CUDA_ERROR_OUT_OF_MEMORY`: no host memory for
/// the copy), and the line that says it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refused {
    pub code: CUresult,
    pub why: String,
}

/// Set while a sleep's wait for the device (`Shim::drain`) has not returned.
static DRAINING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// How long a sleep waits for device work to drain by default.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

impl Shim {
    /// Bytes of `dev` asleep (none while awake: nothing sleeps then).
    pub fn asleep_bytes(&self, dev: CUdevice) -> u64 {
        if state() == State::Awake {
            return 0;
        }
        let pooled: u64 = (self.contexts.on_device(dev).iter())
            .map(|(_, cp)| cp.pool.asleep_bytes())
            .sum();
        pooled + self.counted.asleep_bytes(dev)
    }

    /// Whether any memory of the process is asleep.
    fn any_asleep(&self) -> bool {
        let pooled = (self.contexts.on_device(-1).iter()).any(|(_, cp)| cp.pool.asleep_bytes() > 0);
        pooled || self.counted.any_asleep()
    }

    /// After a sleep or a wake (`after`), in a debug build of the library (the preload
    /// suite's): the sleep's records valid, and nothing asleep while awake, or a panic that says
    /// what broke (the boundary of the hook or the C API reports it). The pools validate their
    /// own records after each sleep and wake. Release builds and the library's unit tests never
    /// check.
    fn validate_after(&self, after: &str) {
        #[cfg(all(debug_assertions, not(test)))]
        {
            let broke = match self.counted.check_asleep() {
                Err(why) => Some(why),
                Ok(_) if state() == State::Awake && self.any_asleep() => {
                    Some("awake with memory asleep".to_string())
                }
                Ok(_) => None,
            };
            if let Some(why) = broke {
                panic!("the sleep's invariants broke after {after}: {why}");
            }
        }
        #[cfg(not(all(debug_assertions, not(test))))]
        let _ = after;
    }

    /// Bytes a wake waits for room for (0: none).
    pub fn waking_waits_for(&self) -> u64 {
        self.sleep.waiting_for.load(Relaxed)
    }

    /// Puts the process's memory on `device` (`-1`: every device) to sleep, once its device work
    /// has drained (within `timeout`), for `why` (what the page and `stat` say). On any failure
    /// the process stays awake, with nothing lost, and the error says why.
    pub fn sleep(&self, device: CUdevice, timeout: Duration, why: Cause) -> Result<Moved, Refused> {
        let deadline = Instant::now() + timeout;
        let started = Instant::now();
        let turn = loop {
            let turn = lock(&self.sleep.turn);
            if state() == State::Asleep {
                // Already: nothing was mapped since (every allocation and work call wakes).
                return Ok(Moved::default());
            }
            set(State::FallingAsleep);
            // Every call that entered before the state changed passes its work on.
            while !quiescent() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_micros(50));
            }
            let calls = quiescent().then(crate::base::flags::own_calls).flatten();
            if let Some(calls) = calls {
                break (turn, calls);
            }
            // A capture is under way (or work never drained): its thread must go on.
            set(if self.any_asleep() {
                State::Asleep
            } else {
                State::Awake
            });
            drop(turn);
            if Instant::now() >= deadline {
                return Err(Refused {
                    code: CUDA_ERROR_NOT_READY,
                    why: format!(
                        "device work did not drain within {timeout:?} (a graph capture under way, or a call that never returns); the process stays awake"
                    ),
                });
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let (_turn, calls) = turn;
        let mut moved = Moved::default();
        // Host memory was short (the C API's CUDA_ERROR_OUT_OF_MEMORY).
        let mut short = false;
        // The device's work did not finish in time (CUDA_ERROR_NOT_READY).
        let mut late = false;
        let mut result = Ok(());
        for (ctx, cp) in self.contexts.on_device(device) {
            let Some(_alive) = cp.clock.enter() else {
                continue;
            };
            if let Err(why) = self.drain(ctx, deadline, timeout) {
                late = true;
                result = Err(why);
                break;
            }
            let up = self.upstream(cp.device);
            result = self.in_context(ctx, || {
                cp.pool.sleep(&up, &mut |all, asleep| {
                    self.save(ctx, all, asleep, &up, &mut moved, &mut short)
                })
            });
            if result.is_err() {
                break;
            }
        }
        if result.is_ok() {
            let own = self.driver.own(&calls);
            result = self.save_foreign(own, device, &mut moved, &mut short);
        }
        self.sleep.drop_spares();
        if let Err(why) = result {
            // Back as it was: what was saved is mapped and copied back (the room it left is
            // normally still there; if another process took it, the process stays asleep and
            // its next call waits for room as any wake does).
            let back = self.wake_saved(self.config.sleep.wake_timeout);
            set(if back.is_ok() {
                State::Awake
            } else {
                State::Asleep
            });
            let code = if short {
                CUDA_ERROR_OUT_OF_MEMORY
            } else if late {
                CUDA_ERROR_NOT_READY
            } else {
                CUDA_ERROR_UNKNOWN
            };
            let now = if back.is_ok() {
                "the process stays awake"
            } else {
                "what was moved stays on the host until room comes back"
            };
            self.validate_after("a sleep given up");
            return Err(Refused {
                code,
                why: format!("{why}; {now}"),
            });
        }
        let since = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        set_cause(why, since);
        set(if self.any_asleep() {
            State::Asleep
        } else {
            State::Awake
        });
        moved.seconds = started.elapsed().as_secs_f64();
        self.validate_after("a sleep");
        if let Some(o) = super::shim::observer() {
            o.asleep(self);
        }
        log_at!(
            Info,
            "asleep: {} of device memory given back, {} copied to the host in {:.3} s",
            fmt_bytes(moved.device_bytes),
            fmt_bytes(moved.copied),
            moved.seconds
        );
        Ok(moved)
    }

    /// Waits until the device work of context `ctx` has finished, at most until `deadline`
    /// (100 ms at least). `cuCtxSynchronize` has no timeout, so it runs on a thread of its
    /// own: a kernel that never ends keeps that thread, not the sleep, which is given up (the
    /// program's calls, waiting at the hooks meanwhile, go on). While that thread waits, a
    /// sleep is refused at once.
    fn drain(&self, ctx: usize, deadline: Instant, timeout: Duration) -> Result<(), String> {
        if DRAINING.swap(true, AcqRel) {
            return Err(
                "the device work an earlier sleep waited for has not finished (a kernel that does not end?)"
                    .into(),
            );
        }
        let driver = self.driver;
        let (tx, rx) = std::sync::mpsc::channel();
        let waiting = std::thread::Builder::new()
            .name("cudapool-drain".into())
            .stack_size(64 << 10)
            .spawn(move || {
                // A call on cudapool's own behalf: it holds its own permission for as long as
                // it is in the driver (a capture begun meanwhile finds it admitted before).
                let r = match crate::base::flags::own_calls() {
                    Some(calls) => driver
                        .in_context(ctx, || driver.own(&calls).synchronize())
                        .map_err(|e| format!("the device's work failed (error {e})")),
                    None => Err("a graph capture began; the process stays awake".to_string()),
                };
                DRAINING.store(false, Release);
                let _ = tx.send(r);
            });
        if let Err(e) = waiting {
            DRAINING.store(false, Release);
            return Err(format!("no thread to wait for the device: {e}"));
        }
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(100));
        match rx.recv_timeout(left) {
            Ok(r) => r,
            Err(_) => Err(format!(
                "device work did not finish within {timeout:?} (a kernel that does not end?); the sleep is given up"
            )),
        }
    }

    /// Keeps the live parts of every mapping of `all` on the host, in one host copy each, moved
    /// together ([`copy::move_parts`]), then unmaps them, pushing each unmapped with what it
    /// kept to `asleep` (the pool records it). A handle another process imported stays (its
    /// memory is shared, and would not come back the same).
    fn save(
        &self,
        ctx: usize,
        all: &[Mapped],
        asleep: &mut Vec<(DevPtr, Asleep)>,
        up: &dyn Upstream,
        moved: &mut Moved,
        short: &mut bool,
    ) -> Result<(), String> {
        let vm = up.virtual_memory().ok_or("no virtual memory")?;
        let going: Vec<&Mapped> = all
            .iter()
            .filter(|m| !super::ipc_mapped::exported(m.at, m.bytes))
            .collect();
        let live: u64 = going.iter().flat_map(|m| &m.live).map(|&(_, n)| n).sum();
        // What was made ready ahead is the process's already (`ready`).
        host_room_for(live.saturating_sub(self.sleep.ready_bytes()))
            .inspect_err(|_| *short = true)?;
        let ready_before = self.sleep.ready_bytes();
        let mut hosts = Vec::with_capacity(going.len());
        for m in &going {
            let need: u64 = m.live.iter().map(|&(_, n)| n).sum();
            hosts.push(self.sleep.host_copy(need).ok_or_else(|| {
                *short = true;
                format!(
                    "{} of host memory could not be had for the copy",
                    fmt_bytes(live)
                )
            })?);
        }
        let from_ready = ready_before.saturating_sub(self.sleep.ready_bytes());
        if from_ready > 0 {
            log_at!(
                Debug,
                "the copy goes into {} of host memory made ready ahead",
                fmt_bytes(from_ready)
            );
        }
        // Every handle's parts in one pass, each into its place in its handle's host copy.
        let parts = host_parts(going.iter().map(|m| m.live.iter().copied()).zip(&hosts));
        // SAFETY: each host copy holds its handle's live bytes one after the other, and nothing
        // else uses them meanwhile.
        unsafe { self.move_parts(ctx, &parts, copy::Way::ToHost) }
            .map_err(|e| format!("copy to the host failed (error {e})"))?;
        for (m, host) in going.into_iter().zip(hosts) {
            vm.unmap(m.at, m.bytes, m.bytes)
                .map_err(|e| format!("unmap failed (error {e})"))?;
            let live = m.live.clone();
            asleep.push((m.at, Asleep { live, host }));
            moved.device_bytes += m.bytes;
        }
        moved.copied += live;
        Ok(())
    }

    /// [`copy::move_parts`] through the process's kept pinned slots.
    ///
    /// # Safety
    /// As [`copy::move_parts`].
    unsafe fn move_parts(
        &self,
        ctx: usize,
        parts: &[(DevPtr, *mut u8, u64)],
        way: copy::Way,
    ) -> Result<(), CUresult> {
        // SAFETY: the caller's contract is move_parts'.
        unsafe { copy::move_parts(self.driver, &self.sleep.staging, ctx, parts, way) }
    }

    /// Wakes the process (`cudapool_wake`, `cudapool wake`): its memory mapped again and
    /// copied back. `Err`: no room within `CUDAPOOL_WAKE_TIMEOUT`; what was not woken stays on
    /// the host for the next try.
    pub fn wake(&self) -> Result<Moved, CUresult> {
        let _turn = lock(&self.sleep.turn);
        if state() != State::Asleep {
            return Ok(Moved::default());
        }
        set(State::Waking);
        let r = self.wake_saved(self.config.sleep.wake_timeout);
        set(if r.is_ok() {
            State::Awake
        } else {
            State::Asleep
        });
        if r.is_ok() {
            self.woke_from_suspend();
        }
        self.validate_after("a wake");
        r
    }

    /// A call of the program found the process asleep (or falling asleep): waits for the
    /// sleep to end, then wakes it.
    fn wake_for_call(&self) -> Result<(), CUresult> {
        self.hold_while_suspended();
        // A sleep under way ends first (its turn), so that what it was for is known.
        drop(lock(&self.sleep.turn));
        self.hold_after_arbiter();
        self.wake().map(|_| ())
    }

    /// Maps and fills again every asleep handle, context by context, waiting for room up to
    /// `timeout` (`None`: for ever). The caller holds the turn. A context that ended while
    /// asleep took its pool's records, and their host copies, with it.
    fn wake_saved(&self, timeout: Option<Duration>) -> Result<Moved, CUresult> {
        let started = Instant::now();
        let mut moved = Moved::default();
        for (ctx, cp) in self.contexts.on_device(-1) {
            let Some(_alive) = cp.clock.enter() else {
                continue;
            };
            let up = self.upstream(cp.device);
            loop {
                // The pool is held from the maps to the end of the copies: a release of this
                // memory meanwhile (another thread's free) waits, and then finds it mapped.
                let mut need = 0;
                let woke = cp.pool.wake(&mut |asleep| {
                    need = asleep.iter().map(|&(_, bytes, _)| bytes).sum();
                    self.restore(ctx, asleep, &up)
                });
                match woke {
                    Ok(woke) => {
                        for (bytes, a) in woke {
                            moved.copied += a.kept();
                            moved.device_bytes += bytes;
                            self.sleep.keep_spare(a.host);
                        }
                        self.sleep.waiting_for.store(0, Relaxed);
                        break;
                    }
                    Err(CUDA_ERROR_OUT_OF_MEMORY) => {
                        self.wait_for_room(cp.device, need, started, timeout)?
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        self.wake_foreign(started, timeout, &mut moved)?;
        moved.seconds = started.elapsed().as_secs_f64();
        Ok(moved)
    }

    /// Maps again, all or none, a pool's asleep handles (start, bytes, what is kept) and fills
    /// them; on an error what this try mapped goes back, and the contents stay on the host.
    fn restore(
        &self,
        ctx: usize,
        asleep: &[(DevPtr, u64, &Asleep)],
        up: &dyn VirtualMemory,
    ) -> Result<(), CUresult> {
        let mut mapped = Vec::new();
        let mut failed = None;
        for &(at, bytes, _) in asleep {
            match up.map(at, bytes, bytes) {
                Ok(()) => mapped.push((at, bytes)),
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        let copied = match failed {
            None => {
                let parts = host_parts(
                    asleep
                        .iter()
                        .map(|&(_, _, a)| (a.live.iter().copied(), &a.host)),
                );
                // SAFETY: each host copy holds its handle's live bytes one after the other;
                // the pool's records hold them, under its lock, until the copies are done.
                unsafe { self.move_parts(ctx, &parts, copy::Way::ToDevice) }
            }
            Some(e) => Err(e),
        };
        if copied.is_err() {
            for &(a, b) in &mapped {
                let _ = up.unmap(a, b, b);
            }
        }
        copied
    }

    /// A wake found no room for `need` bytes on `dev`: says so (once), asks the group for
    /// room (another member's idle cache, lent, or idle members put to sleep), else waits a
    /// little. `Err`: `timeout` since `started` has passed (the OOM line names the wake).
    fn wait_for_room(
        &self,
        dev: CUdevice,
        need: u64,
        started: Instant,
        timeout: Option<Duration>,
    ) -> Result<(), CUresult> {
        if timeout.is_some_and(|t| started.elapsed() >= t) {
            self.sleep.waiting_for.store(0, Relaxed);
            super::overhead::asked_by("waking the process from sleep", || {
                self.report_oom(dev, need)
            });
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        if self.sleep.waiting_for.swap(need, Relaxed) == 0 {
            log_at!(
                Warn,
                "waking: waiting for {} of room on device {dev}",
                fmt_bytes(need)
            );
        }
        let arbiter_due = lock(&self.sleep.asked_arbiter)
            .is_none_or(|at| at.elapsed() >= super::arbiter::ASK_EVERY);
        let arbiter = arbiter_due && {
            *lock(&self.sleep.asked_arbiter) = Some(Instant::now());
            self.ask_arbiter(dev, need)
        };
        if !self.borrow(dev, need) && !self.put_idle_to_sleep(dev, need) && !arbiter {
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }
}

/// Host memory kept free beside a sleep's copy, for the rest of the process's life.
const HOST_MARGIN: u64 = 64 << 20;

/// Whether `bytes` more of host memory can be had without the kernel killing the process to
/// get them (a memory cgroup's limit, the node's available memory: `base::host_room`), with
/// [`HOST_MARGIN`] to spare. `Err` says what stands in the way.
pub(super) fn host_room_for(bytes: u64) -> Result<(), String> {
    if bytes == 0 {
        return Ok(());
    }
    match crate::base::host_room::now() {
        Some(room) if bytes.saturating_add(HOST_MARGIN) > room.bytes => Err(format!(
            "the copy needs {} of host memory and {} leaves {}",
            fmt_bytes(bytes),
            room.by,
            fmt_bytes(room.bytes)
        )),
        _ => Ok(()),
    }
}

/// Every live part of each handle with where its bytes lie in the handle's host copy (the
/// parts one after the other).
fn host_parts<'a, P: IntoIterator<Item = (DevPtr, u64)>>(
    handles: impl Iterator<Item = (P, &'a HostCopy)>,
) -> Vec<(DevPtr, *mut u8, u64)> {
    let mut out = Vec::new();
    for (live, host) in handles {
        let mut off = 0usize;
        for (p, n) in live {
            // SAFETY: the host copy holds the sum of the parts' bytes; this part starts at `off`.
            out.push((p, unsafe { host.ptr.add(off) }, n));
            off += n as usize;
        }
    }
    out
}
