//! Whether the program takes freed memory again (docs/design.md, Giving back). A free stays in
//! the cache only while the program lately allocated right after freeing (the cache is
//! *warm*); otherwise its memory goes back to the driver, as the driver's own free would have
//! given it. (What a warm cache holds goes back when the process is idle: the shim's idle
//! thread, `state::cache_idle`.)
//!
//! A program with its own caching allocator (PyTorch with its cache on, CuPy's pool, JAX's,
//! RMM's) frees only when it means to give memory back: an `empty_cache()` is a run of frees
//! with no allocation between them, so it finds the cache cold. A program that frees and
//! allocates at a rate (C++ loops, PyTorch with its cache off, Numba) turns warm after
//! [`WARM_REUSES`] allocations that each followed a free, within one window.

use crate::base::config::CacheIdle;
use std::time::Instant;

/// Allocations that followed a free within one window that make the cache warm: it then stays
/// warm for a window after the last of them.
pub(super) const WARM_REUSES: u32 = 3;

/// Invariants: `reuses` counts the allocations past the magazines that followed a free since
/// `since`; `warm_until` is `None` or one window after a reuse that brought `reuses` to
/// [`WARM_REUSES`].
#[derive(Default)]
pub(super) struct Demand {
    /// The last operation past the magazines was a free.
    after_free: bool,
    reuses: u32,
    since: Option<Instant>,
    warm_until: Option<Instant>,
}

impl Demand {
    /// An allocation past the magazines (under the pool's lock). One clock read, only right
    /// after a free.
    pub(super) fn on_alloc(&mut self, idle: CacheIdle) {
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

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
            d.on_alloc(IDLE);
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
            d.on_alloc(zero);
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
            d.on_alloc(short);
        }
        assert!(d.keeps_free(short, false));
        std::thread::sleep(Duration::from_millis(30));
        assert!(!d.keeps_free(short, false));
    }
}
