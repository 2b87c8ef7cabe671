//! What a sleep of `split` moves: the arena's handles, each with the parts of it that blocks
//! not free lie on (see `Pool::sleep`). Free blocks' contents are not kept.

use super::{Kind, SplitCore};
use crate::pool::Mapped;

impl SplitCore {
    /// Every handle of the arena, by address, with the in-use blocks' parts in it; `None` while
    /// a shadow is mapped (its memory is a handle's elsewhere, which a sleep cannot map back
    /// to two addresses).
    pub(super) fn mapped_memory(&self) -> Option<Vec<Mapped>> {
        if !self.arena.shadows.is_empty() {
            return None;
        }
        let mut out = Vec::new();
        for (&at, &bytes) in self.arena.mem.handles() {
            let end = at + bytes;
            // The block holding `at` may start before it.
            let first = self.blocks.range(..=at).next_back().map_or(at, |(&p, _)| p);
            let live = self
                .blocks
                .range(first..end)
                .filter(|(_, b)| b.kind == Kind::InUse)
                .map(|(&p, b)| (p.max(at), (p + b.size).min(end)))
                .filter(|&(lo, hi)| hi > lo)
                .map(|(lo, hi)| (lo, hi - lo))
                .collect();
            out.push(Mapped { at, bytes, live });
        }
        Some(out)
    }
}
