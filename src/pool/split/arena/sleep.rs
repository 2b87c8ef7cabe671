//! What a sleep and a wake of `split` move: the arena's handles, each with the parts of it that
//! blocks not free lie on (see `Pool::sleep`). Free blocks' contents are not kept. Each
//! handle's record (`memory::Held`) says whether it is asleep, and holds what was kept.

use super::super::block::Kind;
use super::memory::Held;
use super::{Arena, Blocks};
use crate::base::cu::DevPtr;
use crate::pool::{Asleep, Mapped};

impl Arena {
    /// Every handle of the arena mapped (not asleep), by address, with the in-use blocks' parts
    /// in it; `None` while a shadow is mapped (its memory is a handle's elsewhere, which a sleep
    /// cannot map back to two addresses).
    pub(in crate::pool::split) fn awake_memory(&self, blocks: &impl Blocks) -> Option<Vec<Mapped>> {
        if !self.shadows.is_empty() {
            return None;
        }
        let mut out = Vec::new();
        for (&at, h) in self.mem.handles().iter().filter(|(_, h)| !h.asleep()) {
            let end = at + h.len;
            // The block holding `at` may start before it.
            let first = blocks.holding(at).map_or(at, |b| b.at);
            let live = blocks
                .within(first, end)
                .filter(|b| b.kind == Kind::InUse)
                .map(|b| (b.at.max(at), b.end().min(end)))
                .filter(|&(lo, hi)| hi > lo)
                .map(|(lo, hi)| (lo, hi - lo))
                .collect();
            out.push(Mapped {
                at,
                bytes: h.len,
                live,
            });
        }
        Some(out)
    }

    /// The handle at `at` was unmapped by a sleep that kept `asleep` (dropped, with a debug
    /// build's panic, if it is no handle mapped there alone: the sleep was handed only those).
    pub(in crate::pool::split) fn fell_asleep(&mut self, at: DevPtr, asleep: Asleep) {
        let recorded = self.mem.fell_asleep(at, asleep);
        debug_assert!(
            recorded,
            "a sleep unmapped {at:#x}, which is no mapped handle"
        );
    }

    /// Every handle asleep: (start, bytes, what is kept), by address.
    pub(in crate::pool::split) fn asleep(&self) -> Vec<(DevPtr, u64, &Asleep)> {
        (self.mem.handles().iter())
            .filter_map(|(&at, h)| match &h.held {
                Held::Asleep(a) => Some((at, h.len, a)),
                _ => None,
            })
            .collect()
    }

    /// Every handle asleep was mapped again and filled.
    pub(in crate::pool::split) fn woke(&mut self) -> Vec<(u64, Asleep)> {
        self.mem.woke()
    }

    /// Bytes of the handles asleep.
    pub(in crate::pool::split) fn asleep_bytes(&self) -> u64 {
        (self.mem.handles().values())
            .filter(|h| h.asleep())
            .map(|h| h.len)
            .sum()
    }
}
