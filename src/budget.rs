//! Per-device limits and counters. Pure Rust: it is told about memory, it never asks the driver.
//!
//! Glossary:
//! - *reserved*: bytes this process holds from the driver through the shim (pool segments and
//!   counted pass-through allocations). The hard limit applies to reserved bytes.
//! - *allocated*: bytes the program holds (what it asked for and has not freed).
//! - *cached*: reserved bytes the pool holds for reuse (reserved - allocated, up to pool slack).
//!
//! The limit is exact under concurrency: bytes are charged with a compare-and-swap *before*
//! the driver is asked, so `reserved` never exceeds the hard limit, whatever the threads do.
//!
//! Uses: `striped`.

use crate::striped::Striped;

/// An atomic alone on its cache line (no false sharing with its neighbours).
#[repr(align(128))]
#[derive(Debug, Default)]
struct Alone(AtomicU64);

impl std::ops::Deref for Alone {
    type Target = AtomicU64;
    fn deref(&self) -> &AtomicU64 {
        &self.0
    }
}

const LIVE: usize = 0;
const ALLOCS: usize = 1;
const FREES: usize = 2;
const HITS: usize = 3;
use std::sync::atomic::{AtomicU64, Ordering::*};

/// Limits and counters of one device. Every field is an atomic; no lock anywhere.
///
/// Invariants: `reserved <= hard_limit` whenever `hard_limit != 0`, the limit was not
/// lowered below the current use, and no driver pool grew past it on its own
/// ([`force_charge`](Self::force_charge)); `reserved_peak >= reserved`;
/// `allocated_peak >= allocated`.
#[derive(Debug, Default)]
pub struct DeviceBudget {
    /// 0 = no limit.
    hard_limit: AtomicU64,
    /// 0 = none. Above it, freed blocks go back to the driver (used by caching pools).
    soft_limit: AtomicU64,
    reserved: AtomicU64,
    reserved_peak: AtomicU64,
    /// Exact and shared (the peak must be exact); written once per alloc and per free, so it
    /// sits on a cache line of its own, away from the fields every call reads.
    allocated: Alone,
    allocated_peak: AtomicU64,
    /// Hot-path counters, striped per thread and summed when read: [`LIVE`], [`ALLOCS`],
    /// [`FREES`], [`HITS`].
    hot: Striped,
    segments: AtomicU64,
    driver_allocs: AtomicU64,
    driver_frees: AtomicU64,
    reclaim_retries: AtomicU64,
    ooms: AtomicU64,
}

/// A copy of one device's figures at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceStats {
    pub allocated: u64,
    pub allocated_peak: u64,
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
}

impl DeviceBudget {
    pub fn new(hard_limit: u64, soft_limit: u64) -> Self {
        let b = DeviceBudget::default();
        b.hard_limit.store(hard_limit, Relaxed);
        b.soft_limit.store(soft_limit, Relaxed);
        b
    }

    pub fn hard_limit(&self) -> u64 {
        self.hard_limit.load(Relaxed)
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

    /// Charges `bytes` of driver memory if it fits under the hard limit. Call before asking the
    /// driver; on the driver's failure, [`uncharge`](Self::uncharge) the same amount.
    pub fn try_charge(&self, bytes: u64) -> bool {
        let limit = self.hard_limit.load(Relaxed);
        let mut cur = self.reserved.load(Relaxed);
        loop {
            let Some(new) = cur.checked_add(bytes) else {
                return false;
            };
            if limit != 0 && new > limit {
                return false;
            }
            match self
                .reserved
                .compare_exchange_weak(cur, new, AcqRel, Relaxed)
            {
                Ok(_) => {
                    self.reserved_peak.fetch_max(new, Relaxed);
                    return true;
                }
                Err(seen) => cur = seen,
            }
        }
    }

    /// Charges `bytes` the driver has already handed out behind the shim's back (a driver pool
    /// that grew): they count whether they fit or not.
    pub fn force_charge(&self, bytes: u64) {
        let new = self.reserved.fetch_add(bytes, AcqRel) + bytes;
        self.reserved_peak.fetch_max(new, Relaxed);
    }

    /// Returns `bytes` charged earlier (memory given back to the driver, or never obtained).
    pub fn uncharge(&self, bytes: u64) {
        self.reserved.fetch_sub(bytes, AcqRel);
    }

    /// Memory the driver actually handed out (one segment or pass-through allocation).
    pub fn on_driver_alloc(&self) {
        self.driver_allocs.fetch_add(1, Relaxed);
        self.segments.fetch_add(1, Relaxed);
    }

    /// Memory given back to the driver, or dropped with its context.
    pub fn on_driver_free(&self) {
        self.driver_frees.fetch_add(1, Relaxed);
        self.segments.fetch_sub(1, Relaxed);
    }

    /// Segments that vanished with their context, without a driver call.
    pub fn on_segments_dropped(&self, count: u64, bytes: u64) {
        self.segments.fetch_sub(count, Relaxed);
        self.uncharge(bytes);
    }

    /// The program got `bytes`; `from_cache` when no driver call was needed.
    pub fn on_alloc(&self, bytes: u64, from_cache: bool) {
        let mut n = [0; crate::striped::FIELDS];
        (n[ALLOCS], n[HITS], n[LIVE]) = (1, from_cache as u64, 1);
        self.hot.add_all(n);
        let now = self.allocated.fetch_add(bytes, Relaxed) + bytes;
        // Read first: the peak's line is written only when the peak really moves.
        if now > self.allocated_peak.load(Relaxed) {
            self.allocated_peak.fetch_max(now, Relaxed);
        }
    }

    /// The program gives back `bytes` (a free, or its context died). Call *before* the bytes
    /// return to the cache or the driver, so that `allocated <= reserved` holds at every moment
    /// and another thread's allocation cannot push the peak past the limit.
    pub fn on_release(&self, bytes: u64) {
        self.hot.sub(LIVE, 1);
        self.allocated.fetch_sub(bytes, Relaxed);
    }

    /// The driver refused the free announced by [`on_release`](Self::on_release): the program
    /// still holds the block.
    pub fn on_release_undone(&self, bytes: u64) {
        self.hot.add(LIVE, 1);
        self.allocated.fetch_add(bytes, Relaxed);
    }

    /// A free call that succeeded.
    pub fn on_free_call(&self) {
        self.hot.add(FREES, 1);
    }

    pub fn on_reclaim_retry(&self) {
        self.reclaim_retries.fetch_add(1, Relaxed);
    }

    pub fn on_oom(&self) {
        self.ooms.fetch_add(1, Relaxed);
    }

    /// Sets both peaks to the current values.
    pub fn reset_peaks(&self) {
        self.allocated_peak
            .store(self.allocated.load(Relaxed), Relaxed);
        self.reserved_peak
            .store(self.reserved.load(Relaxed), Relaxed);
    }

    /// The counters now; `cached` is supplied by the pools of this device.
    pub fn stats(&self, cached: u64) -> DeviceStats {
        DeviceStats {
            allocated: self.allocated.load(Relaxed),
            allocated_peak: self.allocated_peak.load(Relaxed),
            reserved: self.reserved.load(Relaxed),
            reserved_peak: self.reserved_peak.load(Relaxed),
            cached,
            live_allocations: self.hot.get(LIVE),
            segments: self.segments.load(Relaxed),
            alloc_calls: self.hot.get(ALLOCS),
            free_calls: self.hot.get(FREES),
            cache_hits: self.hot.get(HITS),
            driver_allocs: self.driver_allocs.load(Relaxed),
            driver_frees: self.driver_frees.load(Relaxed),
            reclaim_retries: self.reclaim_retries.load(Relaxed),
            ooms: self.ooms.load(Relaxed),
            hard_limit: self.hard_limit.load(Relaxed),
            soft_limit: self.soft_limit.load(Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_64_mib_limit_takes_exactly_eight_8_mib_charges() {
        let b = DeviceBudget::new(64 << 20, 0);
        let ok = (0..9).filter(|_| b.try_charge(8 << 20)).count();
        assert_eq!(ok, 8);
        assert_eq!(b.reserved(), 64 << 20);
        b.uncharge(8 << 20);
        assert!(b.try_charge(8 << 20));
        assert!(!b.try_charge(1));
    }

    #[test]
    fn no_limit_means_no_refusal_but_overflow_is_refused() {
        let b = DeviceBudget::new(0, 0);
        assert!(b.try_charge(u64::MAX - 1));
        assert!(!b.try_charge(2));
    }

    #[test]
    fn concurrent_charges_never_exceed_the_limit() {
        let b = Arc::new(DeviceBudget::new(1000, 0));
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let b = b.clone();
                std::thread::spawn(move || {
                    let mut got = 0u64;
                    for _ in 0..10_000 {
                        if b.try_charge(7) {
                            got += 1;
                            assert!(b.reserved() <= 1000);
                            if got.is_multiple_of(3) {
                                b.uncharge(7);
                                got -= 1;
                            }
                        }
                    }
                    got
                })
            })
            .collect();
        let held: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
        assert_eq!(b.reserved(), held * 7);
        assert!(b.stats(0).reserved_peak <= 1000);
    }

    #[test]
    fn counters_and_peaks() {
        let b = DeviceBudget::new(0, 5);
        b.on_alloc(100, false);
        b.on_alloc(50, true);
        b.on_release(100);
        b.on_free_call();
        let s = b.stats(7);
        assert_eq!((s.allocated, s.allocated_peak), (50, 150));
        assert_eq!((s.alloc_calls, s.free_calls, s.cache_hits), (2, 1, 1));
        assert_eq!((s.live_allocations, s.cached, s.soft_limit), (1, 7, 5));
        b.reset_peaks();
        assert_eq!(b.stats(0).allocated_peak, 50);
    }
}
