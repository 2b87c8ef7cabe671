//! Whether the program takes freed memory again (docs/design.md, Giving back). A free stays in
//! the cache only while the program lately allocated right after freeing (it is *warm*);
//! otherwise its memory goes back to the driver, as the driver's own free would have given
//! it. And what the cache held that nothing took during a window of `CUDAPOOL_CACHE_IDLE`,
//! which the shim's idle thread gives back.
//!
//! A program with its own caching allocator (PyTorch with its cache on, CuPy's pool, JAX's,
//! RMM's) frees only when it means to give memory back: an `empty_cache()` is a run of frees
//! with no allocation between them, so it finds the cache cold. A program that frees and
//! allocates at a rate (C++ loops, PyTorch with its cache off, Numba) turns warm after
//! [`WARM_REUSES`] allocations that each followed a free, within one window.

use crate::base::config::CacheIdle;
use std::time::{Duration, Instant};

/// Allocations that followed a free within one window that make the cache warm: it then stays
/// warm for a window after the last of them.
pub(super) const WARM_REUSES: u32 = 3;

/// Invariants: `reuses` counts the allocations that followed a free since `since`; `warm_until`
/// is `None` or one window after a reuse that brought `reuses` to [`WARM_REUSES`];
/// `low_water` is at most what the core cached, less the request, at every allocation past the
/// magazines since `window_start`, and at most what it cached then; `allocs` counts those
/// allocations.
#[derive(Default)]
pub(super) struct Demand {
    /// The last operation past the magazines was a free.
    after_free: bool,
    reuses: u32,
    since: Option<Instant>,
    warm_until: Option<Instant>,
    low_water: u64,
    window_start: Option<Instant>,
    allocs: u64,
}

/// What nothing took during a window that just ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Unused {
    /// No allocation came past the magazines: everything cached, magazines included.
    All,
    /// The least the core held, less what each allocation took.
    Bytes(u64),
}

impl Demand {
    /// An allocation past the magazines (under the pool's lock) of `size` bytes, with `cached`
    /// bytes in the core before it takes its block. One clock read, only right after a free.
    pub(super) fn on_alloc(&mut self, size: u64, cached: u64, idle: CacheIdle) {
        self.allocs += 1;
        self.low_water = self.low_water.min(cached.saturating_sub(size));
        if !std::mem::take(&mut self.after_free) {
            return;
        }
        let Some(window) = idle.window() else {
            return;
        };
        let now = Instant::now();
        if self.since.is_none_or(|s| now.duration_since(s) > window) {
            self.since = Some(now);
            self.reuses = 0;
        }
        self.reuses += 1;
        if self.reuses >= WARM_REUSES {
            self.warm_until = Some(now + window);
        }
    }

    /// A free past the magazines: whether its memory stays cached (`ordered`: a stream-ordered
    /// free, which never waits for the device, so it stays, and the idle thread gives it back).
    pub(super) fn keeps_free(&mut self, idle: CacheIdle, ordered: bool) -> bool {
        self.after_free = true;
        match idle {
            CacheIdle::Never => true,
            _ if ordered => true,
            CacheIdle::After(d) if d.is_zero() => false,
            CacheIdle::After(_) => self.warm_until.is_some_and(|t| Instant::now() < t),
        }
    }

    /// At a tick of the idle thread, with `cached` bytes in the core now: `None` while the
    /// window that began at the last end is not over (the first tick only begins one); at its
    /// end, what nothing took during it, and the next window begins.
    pub(super) fn window_end(
        &mut self,
        cached: u64,
        window: Duration,
        now: Instant,
    ) -> Option<Unused> {
        let ended = match self.window_start {
            Some(start) if now.duration_since(start) >= window => Some(if self.allocs == 0 {
                Unused::All
            } else {
                Unused::Bytes(self.low_water.min(cached))
            }),
            Some(_) => return None,
            None => None,
        };
        self.window_start = Some(now);
        self.low_water = cached;
        self.allocs = 0;
        ended
    }

    /// The cache has just given memory back: the window's figure starts again from `cached`.
    pub(super) fn released(&mut self, cached: u64) {
        self.low_water = self.low_water.min(cached);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const IDLE: CacheIdle = CacheIdle::After(Duration::from_secs(60));

    #[test]
    fn a_run_of_frees_is_cold_and_a_free_alloc_loop_turns_warm() {
        let mut d = Demand::default();
        // empty_cache(): frees one after another, nothing allocated between them.
        for _ in 0..10 {
            assert!(!d.keeps_free(IDLE, false));
        }
        // A loop: the first frees go back, then the cache keeps them.
        let mut kept = Vec::new();
        for _ in 0..6 {
            d.on_alloc(1 << 20, 0, IDLE);
            kept.push(d.keeps_free(IDLE, false));
        }
        assert_eq!(kept, [false, false, true, true, true, true]);
    }

    #[test]
    fn never_keeps_everything_zero_nothing_and_ordered_frees_stay() {
        let mut d = Demand::default();
        assert!(d.keeps_free(CacheIdle::Never, false));
        let zero = CacheIdle::After(Duration::ZERO);
        for _ in 0..10 {
            d.on_alloc(512, 0, zero);
            assert!(!d.keeps_free(zero, false));
        }
        assert!(d.keeps_free(IDLE, true));
    }

    #[test]
    fn warmth_ends_a_window_after_the_last_reuse() {
        let short = CacheIdle::After(Duration::from_millis(20));
        let mut d = Demand::default();
        for _ in 0..WARM_REUSES {
            d.keeps_free(short, false);
            d.on_alloc(512, 0, short);
        }
        assert!(d.keeps_free(short, false));
        std::thread::sleep(Duration::from_millis(30));
        assert!(!d.keeps_free(short, false));
    }

    #[test]
    fn a_window_reports_what_nothing_took() {
        let w = Duration::from_secs(1);
        let t0 = Instant::now();
        let mut d = Demand::default();
        assert_eq!(
            d.window_end(100, w, t0),
            None,
            "the first tick begins a window"
        );
        assert_eq!(d.window_end(100, w, t0 + w / 2), None);
        assert_eq!(d.window_end(100, w, t0 + w), Some(Unused::All));
        // Allocations took the cache down to 30 at the least.
        d.on_alloc(50, 100, IDLE);
        d.on_alloc(20, 50, IDLE);
        assert_eq!(d.window_end(80, w, t0 + 2 * w), Some(Unused::Bytes(30)));
        // The next window starts from what is cached now.
        d.on_alloc(10, 80, IDLE);
        assert_eq!(d.window_end(80, w, t0 + 3 * w), Some(Unused::Bytes(70)));
    }
}
