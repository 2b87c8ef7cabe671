//! What a sleep of `split` moves: the arena's handles, each with the parts of it that blocks
//! not free lie on (see `Pool::sleep`). Free blocks' contents are not kept.

use super::super::block::Kind;
use super::{Arena, Blocks};
use crate::pool::Mapped;

impl Arena {
    /// Every handle of the arena, by address, with the in-use blocks' parts in it; `None` while
    /// a shadow is mapped (its memory is a handle's elsewhere, which a sleep cannot map back
    /// to two addresses).
    pub(in crate::pool::split) fn mapped_memory(
        &self,
        blocks: &impl Blocks,
    ) -> Option<Vec<Mapped>> {
        if !self.shadows.is_empty() {
            return None;
        }
        let mut out = Vec::new();
        for (&at, &bytes) in self.mem.handles() {
            let end = at + bytes;
            // The block holding `at` may start before it.
            let first = blocks.holding(at).map_or(at, |b| b.at);
            let live = blocks
                .within(first, end)
                .filter(|b| b.kind == Kind::InUse)
                .map(|b| (b.at.max(at), b.end().min(end)))
                .filter(|&(lo, hi)| hi > lo)
                .map(|(lo, hi)| (lo, hi - lo))
                .collect();
            out.push(Mapped { at, bytes, live });
        }
        Some(out)
    }
}
