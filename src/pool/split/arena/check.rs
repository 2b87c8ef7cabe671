//! `Arena::check`: the invariants the arena can verify alone (its blocks are `split`'s:
//! `SplitCore::check` verifies its holes, shadows and handles against them).

use super::Arena;

impl Arena {
    /// Without a range nothing else; `mapped` the bytes of the handles (asleep ones too: their
    /// address stays theirs); the memory behind each handle and shadow its own, and each
    /// handle's state its records' (see `memory::Memory::check`).
    pub(in crate::pool::split) fn check(&self) -> Result<(), String> {
        if self.range.is_none()
            && !(self.mem.handles().is_empty()
                && self.shadows.is_empty()
                && self.holes.is_empty()
                && self.mapped == 0)
        {
            return Err("handles, holes, shadows or mapped bytes without an arena".into());
        }
        let mapped: u64 = self.mem.handles().values().map(|h| h.len).sum();
        if mapped != self.mapped {
            return Err(format!(
                "arena mapped {} but its handles hold {mapped}",
                self.mapped
            ));
        }
        self.mem.check(&self.shadows)
    }
}
