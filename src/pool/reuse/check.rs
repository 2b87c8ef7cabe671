//! `CachingPool::check`: the invariants written on the pool's `State`, and its core's.

use super::{State, READY};

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
