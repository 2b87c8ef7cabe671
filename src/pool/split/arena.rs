//! `split`'s expandable arena (`CUDAPOOL_SEGMENTS=expandable`): one reserved address range for
//! large requests that grows by mapping chunks where a request needs memory and gives back the
//! chunks under free blocks. The best fit over its blocks is `split`'s own; this file is how the
//! range gets and loses memory.
//!
//! Uses: `pool::split`, `pool::core`, `pool::types`, `cu`.

use super::*;

/// The expandable range of large requests: `span` bytes of address space at `base`, of which
/// `mapped` bytes have memory behind them, mapped and unmapped in whole `chunk`s.
#[derive(Clone, Copy, Debug)]
pub(super) struct Arena {
    pub(super) base: DevPtr,
    pub(super) span: u64,
    pub(super) chunk: u64,
    pub(super) mapped: u64,
}

impl Arena {
    pub(super) fn holds(&self, ptr: DevPtr) -> bool {
        ptr >= self.base && ptr - self.base < self.span
    }
}

impl SplitCore {
    /// The arena, reserved on first use; `None` when the upstream has no virtual memory (or
    /// refuses the reservation): large requests then get classic segments.
    pub(super) fn arena(&mut self, up: &dyn Upstream) -> Option<Arena> {
        if let Some(a) = self.arena {
            return Some(a);
        }
        let Vmm { chunk, span } = up.vmm()?;
        let span = round_up(span.max(chunk), chunk);
        let base = up.reserve(span, chunk).ok()?;
        let a = Arena {
            base,
            span,
            chunk,
            mapped: 0,
        };
        self.arena = Some(a);
        self.segments.insert(base, Segment { size: span });
        self.mark_free(
            base,
            Block {
                segment: base,
                size: span,
                small: false,
                free: true,
                mapped: false,
                lane: READY,
                epoch: 0,
            },
        );
        Some(a)
    }

    /// Maps memory into the arena so that a ready free block fits the rounded request `r`:
    /// at the hole that needs the fewest new chunks (counting the ready free block that ends
    /// where it starts), the lowest such. `Ok(false)`: no arena, or no hole large enough
    /// (classic segments serve); an error: the upstream refused the memory.
    pub(super) fn grow_arena(&mut self, r: u64, up: &dyn Upstream) -> Result<bool, CUresult> {
        let Some(a) = self.arena(up) else {
            self.expandable = false;
            return Ok(false);
        };
        let mut best: Option<(u64, DevPtr)> = None;
        for (&h, &len) in &self.holes {
            let before = self
                .blocks
                .range(..h)
                .next_back()
                .filter(|(&p, b)| b.free && b.mapped && b.lane == READY && p + b.size == h)
                .map_or(0, |(_, b)| b.size);
            let need = round_up(r.saturating_sub(before).max(1), a.chunk);
            if need <= len && best.is_none_or(|(n, _)| need < n) {
                best = Some((need, h));
            }
        }
        let Some((need, at)) = best else {
            return Ok(false);
        };
        up.map(at, need, a.chunk)?;
        let hole = self.unmark_free(at);
        self.blocks.remove(&at);
        if hole.size > need {
            self.mark_free(
                at + need,
                Block {
                    size: hole.size - need,
                    ..hole
                },
            );
        }
        self.reserved += need;
        if let Some(a) = self.arena.as_mut() {
            a.mapped += need;
        }
        self.merge_and_free(
            at,
            Block {
                segment: a.base,
                size: need,
                small: false,
                free: true,
                mapped: true,
                lane: READY,
                epoch: 0,
            },
        );
        Ok(true)
    }

    /// The whole chunks inside each ready free block of the arena, as (start, bytes), with
    /// the block they lie in.
    pub(super) fn arena_interiors(&self) -> Vec<(DevPtr, u64, DevPtr)> {
        let Some(a) = self.arena else {
            return Vec::new();
        };
        self.blocks
            .range(a.base..a.base + a.span)
            .filter(|(_, b)| b.free && b.mapped && b.lane == READY)
            .filter_map(|(&p, b)| {
                let start = a.base + round_up(p - a.base, a.chunk);
                let end = a.base + (p + b.size - a.base) / a.chunk * a.chunk;
                (end > start).then(|| (start, end - start, p))
            })
            .collect()
    }

    /// Unmaps `[at, at + len)`, whole chunks inside the ready free arena block at `block`,
    /// one chunk at a time (a chunk the upstream keeps stays mapped and free); what is left of
    /// the block on either side stays free and mapped. Returns the bytes unmapped.
    pub(super) fn unmap_interior(
        &mut self,
        up: &dyn Upstream,
        at: DevPtr,
        len: u64,
        block: DevPtr,
    ) -> u64 {
        let Some(a) = self.arena else {
            return 0;
        };
        let mut block = block;
        let mut done = 0;
        for c in (at..at + len).step_by(a.chunk as usize) {
            if up.unmap(c, a.chunk, a.chunk).is_err() {
                // The chunk stays mapped, in the free block the next chunk is carved from.
                continue;
            }
            let b = self.unmark_free(block);
            self.blocks.remove(&block);
            if c > block {
                self.mark_free(
                    block,
                    Block {
                        size: c - block,
                        ..b
                    },
                );
            }
            let end = block + b.size;
            let after = c + a.chunk;
            if end > after {
                self.mark_free(
                    after,
                    Block {
                        size: end - after,
                        ..b
                    },
                );
            }
            self.merge_and_free(
                c,
                Block {
                    size: a.chunk,
                    mapped: false,
                    ..b
                },
            );
            block = after;
            done += a.chunk;
        }
        self.reserved -= done;
        if let Some(a) = self.arena.as_mut() {
            a.mapped -= done;
        }
        done
    }

    /// An arena with nothing mapped gives its address range back (a reclaim leaves nothing).
    pub(super) fn drop_empty_arena(&mut self, up: &dyn Upstream) {
        let Some(a) = self.arena.filter(|a| a.mapped == 0) else {
            return;
        };
        up.unreserve(a.base, a.span);
        self.unmark_free(a.base);
        self.blocks.remove(&a.base);
        self.segments.remove(&a.base);
        self.arena = None;
    }

    /// The arena's runs of mapped blocks, as segments.
    pub(super) fn arena_segments(&self, a: Arena) -> Vec<SegmentView> {
        let mut out: Vec<SegmentView> = Vec::new();
        let mut open = false;
        for (&p, b) in self.blocks.range(a.base..a.base + a.span) {
            if !b.mapped {
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
