//! `CachingPool::check`: the invariants written on the pool's `State`, and its core's.

use super::{CachingPool, State, READY};

impl State {
    /// Every invariant of the pool's state under its lock: its core's, the held-back bytes the
    /// sum of the ready blocks waiting for a fence, the sealed batches oldest first.
    pub(super) fn check(&self) -> Result<(), String> {
        let st = self;
        st.core.check()?;
        let held_back: u64 = st
            .pending
            .iter()
            .chain(st.sealed.iter().flat_map(|b| b.blocks.iter()))
            .filter(|w| w.lane == READY)
            .map(|w| st.core.block_size(w.ptr))
            .sum();
        if held_back != st.held_back {
            return Err(format!(
                "held back {} but the waiting ready blocks hold {held_back}",
                st.held_back
            ));
        }
        let epochs: Vec<u64> = st.sealed.iter().map(|b| b.epoch).collect();
        if epochs.windows(2).any(|w| w[0] >= w[1]) || epochs.last().is_some_and(|&e| e > st.epoch) {
            return Err(format!(
                "sealed epochs {epochs:?} out of order (now {})",
                st.epoch
            ));
        }
        Ok(())
    }
}

impl CachingPool {
    /// After an operation (`after` names it), in a debug build of the library (the preload
    /// suite's): the pool's invariants, or a panic that says what broke and after what (the
    /// hook's boundary reports it). Every trim and release (`always`) is validated; of other
    /// operations one in a stride that keeps the validations' time near the operations' own
    /// (a check walks every block: a replay of thousands of blocks through the library would
    /// otherwise take minutes). Release builds and the pool's own tests (whose property tests
    /// check after each step) never validate here.
    pub(super) fn validate_after(&self, after: &str, always: bool) {
        #[cfg(all(debug_assertions, not(test)))]
        {
            use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
            static OPS: AtomicU64 = AtomicU64::new(0);
            static STRIDE: AtomicU64 = AtomicU64::new(1);
            if !always
                && !OPS
                    .fetch_add(1, Relaxed)
                    .is_multiple_of(STRIDE.load(Relaxed).max(1))
            {
                return;
            }
            let t = std::time::Instant::now();
            let valid = self.lock().check();
            if let Err(why) = valid {
                panic!("the pool's invariants broke after {after}: {why}");
            }
            // About 20 us per operation of a debug build: a check of that time runs each time.
            let stride = t.elapsed().as_nanos() as u64 / 20_000;
            STRIDE.store(stride.clamp(1, 1024), Relaxed);
        }
        #[cfg(not(all(debug_assertions, not(test))))]
        let _ = (after, always);
    }
}
