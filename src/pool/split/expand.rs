//! How `SplitCore` uses its arena (`arena/`): it shows the arena its blocks ([`View`]), asks it
//! to grow, reclaim or release, and applies the changes it answers with; the arena's range
//! comes and goes here as one segment that is one hole.

use super::arena::{Blocks, Change, Seen, Span};
use super::block::{Block, Kind};
use super::SplitCore;
use crate::base::cu::{CUresult, DevPtr};
use crate::pool::core::READY;
use crate::pool::types::{BlockView, SegmentView, Upstream};
use crate::pool::{Asleep, Mapped};
use std::collections::BTreeMap;

fn seen(at: DevPtr, b: &Block) -> Seen {
    Seen {
        at,
        size: b.size,
        kind: b.kind,
        ready: b.ready(),
    }
}

/// The core's blocks, as the arena may read them (a borrow of `blocks` alone, beside the
/// arena's own).
struct View<'a>(&'a BTreeMap<DevPtr, Block>);

impl Blocks for View<'_> {
    fn within(&self, from: DevPtr, to: DevPtr) -> impl Iterator<Item = Seen> + '_ {
        self.0.range(from..to).map(|(&p, b)| seen(p, b))
    }

    fn before(&self, at: DevPtr) -> Option<Seen> {
        self.0.range(..at).next_back().map(|(&p, b)| seen(p, b))
    }

    fn holding(&self, at: DevPtr) -> Option<Seen> {
        self.0.range(..=at).next_back().map(|(&p, b)| seen(p, b))
    }
}

impl SplitCore {
    /// Makes each of `changes`, in order.
    fn apply_all(&mut self, changes: Vec<Change>) {
        for c in changes {
            self.apply(c);
        }
    }

    /// [`grow_arena`](Self::grow_arena), timed under the `stitch-timing` feature.
    pub(super) fn timed_growth(&mut self, r: u64, up: &dyn Upstream) -> Result<bool, CUresult> {
        #[cfg(feature = "stitch-timing")]
        {
            self.arena.growth_begins();
            let t = std::time::Instant::now();
            let out = self.grow_arena(r, up);
            self.arena.growth_ends(t.elapsed().as_nanos() as u64);
            out
        }
        #[cfg(not(feature = "stitch-timing"))]
        self.grow_arena(r, up)
    }

    /// Maps memory into the arena so that a ready free block fits the rounded request `r`
    /// (`Arena::best_hole`): stitched handles first near a limit, new ones for the rest.
    /// `Ok(false)`: no arena, or no hole large enough (classic segments serve); an error: the
    /// upstream refused the memory (what was stitched stays, free).
    fn grow_arena(&mut self, r: u64, up: &dyn Upstream) -> Result<bool, CUresult> {
        if self.reserve_arena(up).is_none() {
            self.expandable = false;
            return Ok(false);
        }
        let Some((need, at)) = self.arena.best_hole(&View(&self.blocks), r) else {
            let shadows = self.arena.shadows().len();
            if shadows == 0 || !self.arena.synchronize(up) {
                return Ok(false);
            }
            // Shadows took the address space: the device is idle now, they may go.
            self.unmap_shadows(up);
            if self.arena.shadows().len() == shadows {
                return Ok(false);
            }
            return self.grow_arena(r, up);
        };
        let room = self.arena.holes()[&at];
        let stitched = if self.arena.stitches(need, up) {
            let (bytes, changes) = self.arena.stitch(&View(&self.blocks), at, need, room, up);
            self.apply_all(changes);
            bytes
        } else {
            0
        };
        let fresh = need.saturating_sub(stitched);
        let made = self.arena.map_new(at + stitched, fresh, r, up);
        if made.is_ok() {
            self.reserved += fresh;
        }
        let need = need.max(stitched);
        let grown = if made.is_ok() { need } else { stitched };
        if grown > 0 {
            self.apply(Change {
                at,
                len: grown,
                to: Kind::Free,
            });
        }
        made.map(|()| true)
    }

    /// The arena's range, reserved on first use and then made one segment that is one hole;
    /// `None` when the upstream has no virtual memory (or refuses the reservation).
    pub(super) fn reserve_arena(&mut self, up: &dyn Upstream) -> Option<Span> {
        let (a, new) = self.arena.reserve(up)?;
        if new {
            self.segments
                .insert(a.base, super::Segment { size: a.span });
            self.mark_free(
                a.base,
                Block {
                    segment: a.base,
                    size: a.span,
                    small: false,
                    kind: Kind::Hole,
                    lane: READY,
                    epoch: 0,
                },
            );
        }
        Some(a)
    }

    /// Before a growth for the rounded request `r`: memory stitched away moves back where that
    /// makes a free block the request fits (`Arena::reclaim`). Whether memory moved.
    pub(super) fn reclaim_shadows(&mut self, r: u64) -> bool {
        let changes = self.arena.reclaim(&View(&self.blocks), r);
        let moved = !changes.is_empty();
        self.apply_all(changes);
        moved
    }

    /// Unmaps every shadow, each becoming a hole (after the device is idle).
    pub(super) fn unmap_shadows(&mut self, up: &dyn Upstream) {
        let changes = self.arena.unmap_shadows(&View(&self.blocks), up);
        self.apply_all(changes);
    }

    /// The handles lying whole inside each ready free block of the arena (see
    /// `Arena::interiors`).
    pub(super) fn arena_interiors(&self) -> Vec<(DevPtr, u64)> {
        self.arena.interiors(&View(&self.blocks))
    }

    /// Unmaps the whole handles of `[at, at + len)`, inside one ready free arena block; the
    /// bytes unmapped.
    pub(super) fn unmap_interior(&mut self, up: &dyn Upstream, at: DevPtr, len: u64) -> u64 {
        let (done, changes) = self.arena.unmap_interior(up, at, len);
        self.apply_all(changes);
        self.reserved -= done;
        done
    }

    /// An arena with nothing mapped gives its address range back (a reclaim leaves nothing).
    pub(super) fn drop_empty_arena(&mut self, up: &dyn Upstream) {
        let Some(a) = self.arena.give_back_range(up) else {
            return;
        };
        self.unmark_free(a.base);
        self.blocks.remove(&a.base);
        self.segments.remove(&a.base);
        self.arena.closed();
    }

    /// The arena's runs of mapped blocks, as segments.
    pub(super) fn arena_segments(&self, a: Span) -> Vec<SegmentView> {
        let mut out: Vec<SegmentView> = Vec::new();
        let mut open = false;
        for (&p, b) in self.blocks.range(a.base..a.base + a.span) {
            if !b.mapped() {
                open = false;
                continue;
            }
            if !open {
                out.push(SegmentView {
                    ptr: p,
                    size: 0,
                    blocks: Vec::new(),
                    expandable: true,
                });
                open = true;
            }
            let seg = out.last_mut().expect("opened above");
            seg.size += b.size;
            seg.blocks.push(BlockView {
                ptr: p,
                size: b.size,
                state: Self::state(b),
            });
        }
        out
    }
}

/// What a sleep and a wake see of the arena (see `Arena::awake_memory` and the others).
impl crate::pool::Sleeping for SplitCore {
    fn awake_memory(&self) -> Option<Vec<Mapped>> {
        self.arena.awake_memory(&View(&self.blocks))
    }
    fn fell_asleep(&mut self, at: DevPtr, asleep: Asleep) {
        self.arena.fell_asleep(at, asleep);
    }
    fn asleep(&self) -> Vec<(DevPtr, u64, &Asleep)> {
        self.arena.asleep()
    }
    fn woke(&mut self) -> Vec<(u64, Asleep)> {
        self.arena.woke()
    }
    fn asleep_bytes(&self) -> u64 {
        self.arena.asleep_bytes()
    }
}
