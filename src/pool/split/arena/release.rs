//! How the arena gives memory back, after the device is idle: its shadows unmapped first (while
//! one maps a handle, unmapping the handle frees nothing), then whole handles inside ready free
//! blocks, and the range itself once nothing is mapped in it.

use super::super::block::Kind;
use super::{Arena, Blocks, Change, Span};
use crate::base::cu::DevPtr;
use crate::pool::types::Upstream;

impl Arena {
    /// The handles lying whole inside each ready free block of the arena, as (start of the
    /// first, bytes of all): handles tile the mapped memory, so those of one block are one run.
    pub(in crate::pool::split) fn interiors(&self, blocks: &impl Blocks) -> Vec<(DevPtr, u64)> {
        let Some(a) = self.range else {
            return Vec::new();
        };
        blocks
            .within(a.base, a.end())
            .filter(|b| b.ready)
            .filter_map(|b| {
                let mut inside = self
                    .mem
                    .handles()
                    .range(b.at..b.end())
                    .filter(|&(&h, r)| h + r.len <= b.end());
                let (&first, first_rec) = inside.next()?;
                let end = inside
                    .next_back()
                    .map_or(first + first_rec.len, |(&h, r)| h + r.len);
                Some((first, end - first))
            })
            .collect()
    }

    /// Unmaps the handles of `[at, at + len)`, whole handles inside one ready free arena
    /// block, one at a time (a handle the upstream keeps stays mapped and free; an asleep one
    /// drops its host copy, with no upstream call); what is left
    /// of the block on either side stays free and mapped. Returns the bytes unmapped and the
    /// holes they leave, for `apply`. Shadows go first ([`unmap_shadows`](Self::unmap_shadows)).
    pub(in crate::pool::split) fn unmap_interior(
        &mut self,
        up: &dyn Upstream,
        at: DevPtr,
        len: u64,
    ) -> (u64, Vec<Change>) {
        let Some(vm) = up.virtual_memory() else {
            return (0, Vec::new());
        };
        let handles: Vec<(DevPtr, u64)> = (self.mem.handles().range(at..at + len))
            .map(|(&h, r)| (h, r.len))
            .collect();
        let mut done = 0;
        let mut changes = Vec::new();
        for (c, hl) in handles {
            let rec = &self.mem.handles()[&c];
            // Memory a shadow still maps (its unmap failed) is not given back: it would stay.
            if rec.shadowed() {
                continue;
            }
            // An asleep handle's memory went back at the sleep: only its host copy goes.
            if !rec.asleep() && vm.unmap(c, hl, hl).is_err() {
                // The handle stays mapped, in the free block the next one is carved from.
                continue;
            }
            self.mem.unmapped(c);
            changes.push(Change {
                at: c,
                len: hl,
                to: Kind::Hole,
            });
            done += hl;
        }
        self.mapped -= done;
        (done, changes)
    }

    /// Unmaps every shadow (no device work may use one: a release after the device is idle);
    /// each becomes a hole (the changes, for `apply`).
    pub(in crate::pool::split) fn unmap_shadows(
        &mut self,
        blocks: &impl Blocks,
        up: &dyn Upstream,
    ) -> Vec<Change> {
        let Some(vm) = up.virtual_memory() else {
            return Vec::new();
        };
        let shadows: Vec<(DevPtr, u64)> = self.shadows.iter().map(|(&p, &l)| (p, l)).collect();
        let mut changes = Vec::new();
        for (p, len) in shadows {
            // Looked up before the driver is asked: nothing may fail between its unmap and
            // the records of it.
            if !blocks
                .holding(p)
                .is_some_and(|b| b.at == p && b.kind == Kind::Shadow)
            {
                continue;
            }
            if vm.unmap_alias(p, len).is_err() {
                continue;
            }
            self.mem.shadow_unmapped(p);
            changes.push(Change {
                at: p,
                len,
                to: Kind::Hole,
            });
        }
        changes
    }

    /// With nothing mapped (no handle, no shadow), gives the range back to the upstream and
    /// returns it: the caller takes its one hole away, then [`closed`](Self::closed).
    pub(in crate::pool::split) fn give_back_range(&mut self, up: &dyn Upstream) -> Option<Span> {
        let a = self
            .range
            .filter(|_| self.mapped == 0 && self.shadows.is_empty())?;
        let vm = up.virtual_memory()?;
        vm.unreserve(a.base, a.span);
        Some(a)
    }

    /// The range is gone (its hole unlisted): the arena is empty again.
    pub(in crate::pool::split) fn closed(&mut self) {
        debug_assert!(self.holes.is_empty() && self.shadows.is_empty() && self.mapped == 0);
        self.range = None;
    }
}
