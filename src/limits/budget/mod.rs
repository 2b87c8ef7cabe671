//! Per-device limits and counters. Pure Rust: it is told about memory, it never asks the driver.
//!
//! Glossary:
//! - *reserved*: bytes this process holds from the driver through the shim (pool segments and
//!   counted pass-through allocations). The hard limit applies to reserved bytes.
//! - *allocated*: bytes the program holds: the blocks handed out and not freed, rounding
//!   included (PyTorch's `allocated_bytes`).
//! - *requested*: what the program asked for of those, before rounding (PyTorch's
//!   `requested_bytes`); never above *allocated*.
//! - *cached*: reserved bytes the pool holds for reuse (reserved - allocated, up to pool slack).
//!
//! The limit is exact under concurrency: bytes are charged with a compare-and-swap *before*
//! the driver is asked, so `reserved` never exceeds the hard limit, whatever the threads do.
//! `reserved` moves only when the driver is called; the per-pair counters are the thread's own.
//!
//! ## The peaks without a shared counter
//! `allocated` is the sum of what each thread's line holds (`HELD`, written by that thread
//! alone). Its peak is kept with *credit*: bytes under the peak that no allocation holds, kept
//! on the threads' lines. Invariant (C): `allocated + every line's credit + unassigned <= peak`,
//! where `unassigned` is credit no line holds. `requested` (`ASKED`) and its peak are kept the
//! same way, with a credit of their own: what follows holds for each [`Figure`].
//! - An allocation of `b` bytes takes `b` of its own thread's credit: by (C), `allocated` stays
//!   under the peak, which does not move.
//! - A free gives its bytes back as credit to the line of the thread that *allocated* them (the
//!   caller keeps that [`LineId`]), so a thread that allocates what another frees keeps its
//!   credit, and a thread's credit is what it freed of its own working set.
//! - A line's credit is in two parts. Its first [`RESERVE`] bytes are *private*: only the
//!   owning thread writes them, with a plain load and store, so a thread that frees and
//!   allocates again its own blocks (a cached pair) touches no shared atomic for the peaks
//!   (4 atomic exchanges fewer a pair: 107 to 89 ns on the fake driver). The rest is shared:
//!   other threads add to it (frees of this thread's blocks) and take from it.
//! - Only when a thread's credit is short does it settle, under a lock: it takes all of
//!   `unassigned`, then the shared credit of the other lines, largest first, what it still
//!   lacks (their private parts, up to [`RESERVE`] each, stay theirs); the peak grows by
//!   whatever is still missing.
//!
//! So the peak is never below the true peak of `allocated`. It is exact when one thread
//! allocates (PyTorch, JAX, CuPy allocate from the Python thread), and otherwise above it by at
//! most [`RESERVE`] per other thread that holds credit: what those threads freed and will
//! likely allocate again. Without the reserve, threads allocating side by side at the peak would
//! take each other's credit in turn, each through the lock. It is read no higher than the
//! reserved peak, which `allocated` never passes. That one counts only memory the driver handed
//! out (a charge it refused is refunded, never recorded); it reads high only by what other
//! threads had charged and were still asking the driver for at the moment memory went back.
//!
//! ## A budget shared with other processes
//! A device's budget may also draw on a [`Shared`] one (a group's ledger: `group`). A charge
//! takes this process's bytes first, then the shared ones, and gives back its own if the shared
//! budget refuses; what goes back to the driver goes back to both. Cache hits never reach it.

use crate::base::limit::Limit;
use crate::base::per_thread::{Line, LineId, Mode, PerThread};
use crate::base::sync::lock;
use std::sync::atomic::{AtomicU64, Ordering::*};
use std::sync::{Mutex, OnceLock};

/// A budget this device shares with other processes: driver memory is reserved from it before
/// the driver is asked and given back after the driver frees.
pub trait Shared: Send + Sync + std::fmt::Debug {
    /// Reserves `bytes` if they fit under the shared limit.
    fn try_reserve(&self, bytes: u64) -> bool;
    /// Reserves `bytes` the driver already handed out, fitting or not.
    fn force_reserve(&self, bytes: u64);
    /// Gives back `bytes` reserved earlier.
    fn release(&self, bytes: u64);
    /// What the shared limit still lets anyone reserve (`u64::MAX`: no limit).
    fn room(&self) -> u64;
    /// The shared limit.
    fn limit(&self) -> Limit;
    /// Asks the others who share it to give back idle memory until `bytes` fit, waiting a
    /// bounded time; whether they fit now (the caller charges again). None to ask by default.
    fn borrow(&self, bytes: u64) -> bool {
        let _ = bytes;
        false
    }
    /// Asks the others who share it and have been idle for `idle` to sleep until `bytes` fit,
    /// longest idle first; whether they fit now. None to ask by default.
    fn sleep_idle(&self, bytes: u64, idle: std::time::Duration) -> bool {
        let _ = (bytes, idle);
        false
    }
}

/// The values of each thread's [`Line`]: bytes held (`allocated`'s share) and asked for
/// (`requested`'s), live allocations, calls, cache hits.
const HELD: usize = 0;
const LIVE: usize = 1;
const ALLOCS: usize = 2;
const FREES: usize = 3;
const HITS: usize = 4;
const ASKED: usize = 5;

/// A figure whose peak is kept with credit (the module doc): its value on the lines, and the
/// index of its credit (on the lines, in `peaks` and in `unassigned`).
#[derive(Clone, Copy, Debug)]
struct Figure {
    field: usize,
    credit: usize,
}
const ALLOCATED: Figure = Figure {
    field: HELD,
    credit: 0,
};
const REQUESTED: Figure = Figure {
    field: ASKED,
    credit: 1,
};

/// The bytes of one allocation: what the program asked for, and what it was handed (the
/// block's size: at least that).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bytes {
    pub asked: u64,
    pub handed: u64,
}

impl Bytes {
    /// What the figure `f` counts of these bytes.
    fn of(self, f: Figure) -> u64 {
        if f.field == HELD {
            self.handed
        } else {
            self.asked
        }
    }
}

/// An allocation handed exactly what it asked for.
impl From<u64> for Bytes {
    fn from(n: u64) -> Self {
        Bytes {
            asked: n,
            handed: n,
        }
    }
}

/// Credit a settling thread leaves on each other line (see the module doc): bounds how far the
/// peak can read above the truth with several threads allocating, per thread.
pub const RESERVE: u64 = 1 << 20;

/// Limits and counters of one device. Nothing on the path of a cached allocation writes a cache
/// line that another thread writes too.
///
/// Invariants: `reserved <= hard_limit` whenever `hard_limit != 0`, the limit was not
/// lowered below the current use, and no driver pool grew past it on its own
/// ([`force_charge`](Self::force_charge)); the peak of `reserved` is `max(reserved_peak,
/// reserved)` (a charge the driver refuses is refunded and never recorded); (C) of the module doc
/// for each [`Figure`] `f`, with `peaks[f.credit]` the peak and `settle[f.credit]` the
/// unassigned credit.
#[derive(Debug, Default)]
pub struct DeviceBudget {
    /// 0 = no limit.
    hard_limit: AtomicU64,
    /// 0 = none. Above it, freed blocks go back to the driver (used by caching pools).
    soft_limit: AtomicU64,
    reserved: AtomicU64,
    /// The highest `reserved` seen just before memory went back (`uncharge`) or forced in.
    reserved_peak: AtomicU64,
    /// Of `reserved`: what the driver took for the process besides its allocations (a
    /// per-thread stack, the device heap, the printf FIFO, module globals, contexts beyond the
    /// primary one: `state::overhead`).
    overhead: AtomicU64,
    /// Bumped each time memory goes back to the driver (after it is uncharged): a thread whose
    /// allocation failed retries if this moved since it asked (another thread released memory
    /// between its failed call and its own reclaim).
    released: AtomicU64,
    /// The credit's peaks of [`ALLOCATED`] and [`REQUESTED`]; written only under `settle`.
    peaks: [AtomicU64; 2],
    /// Credit no thread holds, per figure; taking the lock is what settling means.
    settle: Mutex<[u64; 2]>,
    /// Each thread's own counters: [`HELD`], [`ASKED`], [`LIVE`], [`ALLOCS`], [`FREES`],
    /// [`HITS`], and its credit under each peak.
    lines: PerThread,
    segments: AtomicU64,
    driver_allocs: AtomicU64,
    driver_frees: AtomicU64,
    reclaim_retries: AtomicU64,
    ooms: AtomicU64,
    /// The budget this device shares with other processes, if any (set once, at first use).
    shared: OnceLock<Box<dyn Shared>>,
}

/// A copy of one device's figures at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceStats {
    pub allocated: u64,
    pub allocated_peak: u64,
    pub requested: u64,
    pub requested_peak: u64,
    pub reserved: u64,
    pub reserved_peak: u64,
    pub cached: u64,
    pub live_allocations: u64,
    pub segments: u64,
    pub alloc_calls: u64,
    pub free_calls: u64,
    pub cache_hits: u64,
    pub driver_allocs: u64,
    pub driver_frees: u64,
    pub reclaim_retries: u64,
    pub ooms: u64,
    pub hard_limit: u64,
    pub soft_limit: u64,
    /// Of `reserved`: the driver's own memory for the process (stack, heap, modules, contexts).
    pub overhead: u64,
    /// Device memory asleep (on the host; counted in no limit, not in `reserved`).
    pub asleep: u64,
    /// The process's sleep state: 0 awake, 1 falling asleep, 2 asleep, 3 waking.
    pub sleep_state: u64,
    /// While waking: the bytes the wake waits for room for (0: none).
    pub waking_for: u64,
    /// Panics caught at cudapool's boundary in the process (the same on every device; each one
    /// a bug of cudapool's): from the first on, new allocations went to the driver directly.
    pub panics: u64,
    /// Asleep or waking: why it went to sleep (`state::sleep::Cause`; 0 awake or not said).
    pub sleep_cause: u64,
    /// Asleep or waking: when it went to sleep, ns since the Unix epoch (0 awake).
    pub asleep_since_ns: u64,
    /// When the process last allocated or issued device work, ns since the epoch, in whole
    /// seconds (0: not looked at): what root's arbiter orders idle jobs by.
    pub active_ns: u64,
}

impl DeviceBudget {
    pub fn new(hard_limit: u64, soft_limit: u64) -> Self {
        let b = DeviceBudget::default();
        b.hard_limit.store(hard_limit, Relaxed);
        b.soft_limit.store(soft_limit, Relaxed);
        b
    }

    /// This process's own hard limit on the device.
    pub fn hard_limit(&self) -> Limit {
        Limit::from_raw(self.hard_limit.load(Relaxed))
    }

    pub fn set_hard_limit(&self, bytes: u64) {
        self.hard_limit.store(bytes, Relaxed);
    }

    pub fn soft_limit(&self) -> u64 {
        self.soft_limit.load(Relaxed)
    }

    pub fn reserved(&self) -> u64 {
        self.reserved.load(Relaxed)
    }

    /// Whether a soft limit is set and reserved memory is above it.
    #[inline]
    pub fn over_soft_limit(&self) -> bool {
        let soft = self.soft_limit();
        soft != 0 && self.reserved() > soft
    }

    /// Makes this device's budget draw on `shared` too (once; later calls are ignored).
    pub fn share(&self, shared: Box<dyn Shared>) {
        let _ = self.shared.set(shared);
    }

    /// The shared budget, if this device has one.
    pub fn shared(&self) -> Option<&dyn Shared> {
        self.shared.get().map(|s| &**s)
    }

    /// Charges `bytes` of driver memory if they fit under the hard limit and the shared one.
    /// Call before asking the driver; on the driver's failure, [`uncharge`](Self::uncharge) the
    /// same amount.
    pub fn try_charge(&self, bytes: u64) -> bool {
        if !self.try_charge_own(bytes) {
            return false;
        }
        if let Some(s) = self.shared.get() {
            if !s.try_reserve(bytes) {
                self.reserved.fetch_sub(bytes, AcqRel);
                return false;
            }
        }
        // Not in the peak yet: the driver may still refuse (then `refund`). The peak is read
        // as the larger of the recorded one and `reserved` now, and recorded when memory goes
        // back (`uncharge`), so a charge counts in it once it held memory.
        true
    }

    /// Charges this process's own budget, if it fits.
    fn try_charge_own(&self, bytes: u64) -> bool {
        let limit = self.hard_limit();
        let mut cur = self.reserved.load(Relaxed);
        loop {
            let Some(new) = cur.checked_add(bytes) else {
                return false;
            };
            if !limit.admits(new) {
                return false;
            }
            match self
                .reserved
                .compare_exchange_weak(cur, new, AcqRel, Relaxed)
            {
                Ok(_) => return true,
                Err(seen) => cur = seen,
            }
        }
    }

    /// Charges `bytes` the driver has already handed out behind the shim's back (a driver pool
    /// that grew): they count whether they fit or not.
    pub fn force_charge(&self, bytes: u64) {
        let new = self.reserved.fetch_add(bytes, AcqRel) + bytes;
        self.reserved_peak.fetch_max(new, Relaxed);
        if let Some(s) = self.shared.get() {
            s.force_reserve(bytes);
        }
    }

    /// Returns `bytes` charged earlier whose memory the driver held and has given back: the
    /// figure before they went back is a candidate for the peak.
    pub fn uncharge(&self, bytes: u64) {
        let before = self.reserved.fetch_sub(bytes, AcqRel);
        self.reserved_peak.fetch_max(before, Relaxed);
        if let Some(s) = self.shared.get() {
            s.release(bytes);
        }
    }

    /// Returns `bytes` charged with [`try_charge`](Self::try_charge) that never became memory
    /// (the driver refused, or handed out less than was charged): they never count in the
    /// peak.
    pub fn refund(&self, bytes: u64) {
        self.reserved.fetch_sub(bytes, AcqRel);
        if let Some(s) = self.shared.get() {
            s.release(bytes);
        }
    }

    /// The peak of `reserved`: the recorded one, or the figure now if that is higher.
    fn reserved_peak(&self) -> u64 {
        self.reserved_peak
            .load(Relaxed)
            .max(self.reserved.load(Relaxed))
    }

    /// What this process may still reserve on this device: the room under its own hard limit
    /// and under the shared one, whichever is smaller (`u64::MAX`: no limit).
    pub fn room(&self) -> u64 {
        let own = self.hard_limit().room(self.reserved());
        own.min(self.shared.get().map_or(u64::MAX, |s| s.room()))
    }

    /// Memory the driver actually handed out (one segment or pass-through allocation).
    pub fn on_driver_alloc(&self) {
        self.driver_allocs.fetch_add(1, Relaxed);
        self.segments.fetch_add(1, Relaxed);
    }

    /// `chunks` physical chunks created and mapped into an expandable segment (a driver
    /// allocation each, no new segment).
    pub fn on_map(&self, chunks: u64) {
        self.driver_allocs.fetch_add(chunks, Relaxed);
    }

    /// `chunks` physical chunks unmapped from an expandable segment and released (a driver
    /// free each).
    pub fn on_unmap(&self, chunks: u64) {
        self.driver_frees.fetch_add(chunks, Relaxed);
        self.released.fetch_add(1, Release);
    }

    /// Memory given back to the driver, or dropped with its context.
    pub fn on_driver_free(&self) {
        self.driver_frees.fetch_add(1, Relaxed);
        self.segments.fetch_sub(1, Relaxed);
        self.released.fetch_add(1, Release);
    }

    /// `bytes` the driver took besides allocations, charged with `try_charge`.
    pub fn on_overhead(&self, bytes: u64) {
        self.overhead.fetch_add(bytes, Relaxed);
    }

    /// `bytes` of overhead the driver gave back: uncharged.
    pub fn on_overhead_gone(&self, bytes: u64) {
        self.overhead.fetch_sub(bytes, Relaxed);
        self.uncharge(bytes);
        self.released.fetch_add(1, Release);
    }

    /// Segments that vanished with their context, without a driver call.
    pub fn on_segments_dropped(&self, count: u64, bytes: u64) {
        self.segments.fetch_sub(count, Relaxed);
        self.uncharge(bytes);
        self.released.fetch_add(1, Release);
    }

    /// How many times memory went back to the driver so far: a thread that failed to allocate
    /// retries when this moved since before it asked.
    pub fn releases(&self) -> u64 {
        self.released.load(Acquire)
    }

    /// The program got `bytes`; `from_cache` when no driver call was needed. Returns the line
    /// that holds them, for [`on_release`](Self::on_release), and how many allocations and
    /// frees that line has counted (to sample on every so many).
    pub fn on_alloc(&self, bytes: impl Into<Bytes>, from_cache: bool) -> (LineId, u64) {
        let bytes = bytes.into();
        self.lines.with(|l, id, m| {
            l.add(ALLOCS, 1, m);
            l.add(LIVE, 1, m);
            if from_cache {
                l.add(HITS, 1, m);
            }
            self.hold(l, m, bytes);
            (id, Self::ops(l))
        })
    }

    /// Allocations and frees counted on line `l`.
    fn ops(l: &Line) -> u64 {
        l.get(ALLOCS).wrapping_add(l.get(FREES))
    }

    /// `bytes` more are held: under the thread's credit, or by settling (the module doc).
    #[inline]
    fn hold(&self, l: &Line, m: Mode, bytes: Bytes) {
        for f in [ALLOCATED, REQUESTED] {
            let n = bytes.of(f);
            let mut need = n;
            if m == Mode::Owner {
                // The private part first: the owner alone writes it.
                let p = &l.private[f.credit];
                let have = p.load(Relaxed);
                let used = have.min(n);
                p.store(have - used, Relaxed);
                need -= used;
            }
            if need > 0 {
                let spent = l.credit[f.credit]
                    .fetch_update(Relaxed, Relaxed, |c| c.checked_sub(need))
                    .is_ok();
                if !spent {
                    self.settle(l, need, f);
                }
            }
            // After the credit is spent: (C) holds at every moment.
            l.add(f.field, n, m);
        }
    }

    /// Finds `bytes` of credit of figure `f` for `mine` (the settling thread's line, whose
    /// credit is short), growing the peak by what cannot be found. See the module doc.
    #[cold]
    fn settle(&self, mine: &Line, bytes: u64, f: Figure) {
        let mut settle = lock(&self.settle);
        let unassigned = &mut settle[f.credit];
        let i = f.credit;
        let mut need = bytes;
        // Its own credit first, then what no line holds (all of it: it is nobody's).
        *unassigned += mine.credit[i].swap(0, Relaxed);
        let extra = unassigned.saturating_sub(need);
        need = need.saturating_sub(std::mem::take(unassigned));
        if need > 0 {
            let mut others: Vec<&Line> = self
                .lines
                .lines()
                .map(|(_, l)| l)
                .filter(|l| !std::ptr::eq(*l, mine))
                .collect();
            others.sort_by_key(|l| std::cmp::Reverse(l.credit[i].load(Relaxed)));
            for l in others {
                let take = |c: u64| Some(c - need.min(c));
                if let Ok(c) = l.credit[i].fetch_update(Relaxed, Relaxed, take) {
                    need -= need.min(c);
                }
                if need == 0 {
                    break;
                }
            }
        }
        if need > 0 {
            let peak = &self.peaks[i];
            peak.store(peak.load(Relaxed) + need, Relaxed);
        }
        mine.credit[i].fetch_add(extra, Relaxed);
    }

    /// The program frees `bytes` held by line `holder` (from [`on_alloc`](Self::on_alloc);
    /// `None`: the caller's own). Call *before* the bytes return to the cache or the driver, so
    /// that `allocated <= reserved` holds at every moment. Returns how many allocations and
    /// frees the calling thread's line has counted.
    pub fn on_free(&self, bytes: impl Into<Bytes>, holder: Option<LineId>) -> u64 {
        let bytes = bytes.into();
        self.lines.with(|l, id, m| {
            l.add(FREES, 1, m);
            self.release(l, id, m, bytes, holder);
            Self::ops(l)
        })
    }

    /// The program no longer holds `bytes` of line `holder`, without a free (its context died).
    pub fn on_release(&self, bytes: impl Into<Bytes>, holder: Option<LineId>) {
        let bytes = bytes.into();
        self.lines
            .with(|l, id, m| self.release(l, id, m, bytes, holder));
    }

    fn release(&self, l: &Line, id: LineId, m: Mode, bytes: Bytes, holder: Option<LineId>) {
        l.sub(LIVE, 1, m);
        let to_id = holder.unwrap_or(id);
        let to = self.lines.line(to_id);
        let own = m == Mode::Owner && to_id == id;
        for f in [ALLOCATED, REQUESTED] {
            let n = bytes.of(f);
            l.sub(f.field, n, m);
            // After the bytes left the figure: (C) holds at every moment.
            if own {
                // Its own line: the private part up to RESERVE, the rest shared.
                let p = &to.private[f.credit];
                let v = p.load(Relaxed) + n;
                p.store(v.min(RESERVE), Relaxed);
                if v > RESERVE {
                    to.credit[f.credit].fetch_add(v - RESERVE, Relaxed);
                }
            } else {
                to.credit[f.credit].fetch_add(n, Relaxed);
            }
        }
    }

    /// The driver refused the free announced by [`on_free`](Self::on_free): the program still
    /// holds the block, now on the calling thread's line (returned), and the free is uncounted.
    pub fn on_free_undone(&self, bytes: impl Into<Bytes>) -> LineId {
        let bytes = bytes.into();
        self.lines.with(|l, id, m| {
            l.sub(FREES, 1, m);
            l.add(LIVE, 1, m);
            self.hold(l, m, bytes);
            id
        })
    }

    pub fn on_reclaim_retry(&self) {
        self.reclaim_retries.fetch_add(1, Relaxed);
    }

    pub fn on_oom(&self) {
        self.ooms.fetch_add(1, Relaxed);
    }

    /// Bytes the program holds on this device: the sum of every thread's share (exact when no
    /// allocation or free is under way).
    pub fn allocated(&self) -> u64 {
        self.lines.sum(HELD)
    }

    /// Bytes the program asked for of what it holds.
    pub fn requested(&self) -> u64 {
        self.lines.sum(ASKED)
    }

    /// The peak of figure `f` (now `now`): the credit's figure, never above `bound`, the peak
    /// of a figure never below `f`'s. `requested <= allocated <= reserved` at every moment
    /// (the caller's order: held after the memory is granted, released before it goes back),
    /// so the true peaks are under the reserved one too, which is exact: the bound only
    /// removes what the reserve may add (the module doc).
    fn peak(&self, f: Figure, now: u64, bound: u64) -> u64 {
        self.peaks[f.credit].load(Relaxed).min(bound).max(now)
    }

    /// Sets every peak to the current values: every credit is collected, so the peaks come
    /// down to what is held; except the private credit of other threads alive now (up to
    /// [`RESERVE`] each), which only they may write: by that much a peak may stay above.
    pub fn reset_peaks(&self) {
        let mut unassigned = lock(&self.settle);
        for (_, l) in self.lines.lines() {
            for (u, c) in unassigned.iter_mut().zip(&l.credit) {
                *u += c.swap(0, Relaxed);
            }
        }
        let mut private = |l: &Line| {
            for (u, p) in unassigned.iter_mut().zip(&l.private) {
                *u += p.swap(0, Relaxed);
            }
        };
        self.lines.unowned(&mut private);
        self.lines.with(|l, _, m| {
            if m == Mode::Owner {
                private(l);
            }
        });
        for (u, peak) in unassigned.iter_mut().zip(&self.peaks) {
            peak.store(
                peak.load(Relaxed).saturating_sub(std::mem::take(u)),
                Relaxed,
            );
        }
        self.reserved_peak
            .store(self.reserved.load(Relaxed), Relaxed);
    }

    /// Allocation calls so far, every thread's (a sum over the threads' lines).
    pub fn alloc_calls(&self) -> u64 {
        self.lines.sum(ALLOCS)
    }

    /// The counters now; `cached` is supplied by the pools of this device.
    pub fn stats(&self, cached: u64) -> DeviceStats {
        let allocated = self.allocated();
        let reserved_peak = self.reserved_peak();
        let allocated_peak = self.peak(ALLOCATED, allocated, reserved_peak);
        let requested = self.requested();
        DeviceStats {
            allocated,
            allocated_peak,
            requested,
            requested_peak: self.peak(REQUESTED, requested, allocated_peak),
            reserved: self.reserved.load(Relaxed),
            reserved_peak,
            cached,
            live_allocations: self.lines.sum(LIVE),
            segments: self.segments.load(Relaxed),
            alloc_calls: self.lines.sum(ALLOCS),
            free_calls: self.lines.sum(FREES),
            cache_hits: self.lines.sum(HITS),
            driver_allocs: self.driver_allocs.load(Relaxed),
            driver_frees: self.driver_frees.load(Relaxed),
            reclaim_retries: self.reclaim_retries.load(Relaxed),
            ooms: self.ooms.load(Relaxed),
            overhead: self.overhead.load(Relaxed),
            hard_limit: self.hard_limit.load(Relaxed),
            soft_limit: self.soft_limit.load(Relaxed),
            // The state's to say (`state::sleep`).
            asleep: 0,
            sleep_state: 0,
            waking_for: 0,
            panics: 0,
            sleep_cause: 0,
            asleep_since_ns: 0,
            active_ns: 0,
        }
    }
}

#[cfg(test)]
mod tests;
