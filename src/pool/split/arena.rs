//! `split`'s expandable arena (`CUDAPOOL_SEGMENTS=expandable`): one reserved address range for
//! large requests that grows by mapping memory where a request needs it and gives back the
//! memory of its free blocks. The best fit over its blocks is `split`'s own; this file is how the
//! range gets and loses memory:
//! - near a limit, a growth first *stitches* the handles (physical allocations) that lie whole
//!   inside ready free blocks elsewhere in the arena: each is mapped a second time where the
//!   request grows, and its first address becomes a *shadow* that no block may use, so the
//!   holes left between live blocks serve the growth without an unmap, a copy or a wait
//!   (GMLake's stitching, over expandable segments). A growth's handles are stitched in one
//!   upstream call that sets their access once. Only then is new memory made. Without a
//!   limit, or far from it (more than 1/[`STITCH_NEAR_LIMIT`] of it left after the growth),
//!   nothing is stitched: jobs whose steps reshuffle memory (BERT, ViT, T5) stitch every step,
//!   some twenty handles a growth at about 1.1 ms (p50; p99 2.5-4.8 ms, H200), and ViT ran
//!   0.69-0.82 times PyTorch's speed with it against 0.82-1.00 without, for 0.3 % less memory
//!   (BERT 4 % less). (*Lending* is another thing: a group member giving its idle cache to
//!   another.)
//! - before a growth, memory stitched away moves back where that makes a free block the request
//!   fits ([`SplitCore::reclaim_shadows`], no driver call; the shadows live in `shadows.rs`);
//! - new memory comes in handles as large as the growth allows (powers of two of the chunk up
//!   to a cap: one handle costs tens of microseconds however large it is, and a 4 GiB growth in
//!   2 MiB handles took 80-90 ms on an H100); under a limit smaller, so that stitching finds
//!   whole handles in free blocks and a reclaim stays fine;
//! - a release (after the device is idle) unmaps the shadows, then whole handles inside ready
//!   free blocks.

use super::changes::Change;
use super::*;
use crate::base::cu::CUDA_ERROR_NOT_SUPPORTED;

/// `timed!(self, field, expr)`: `expr`, its time added to the growth's `field` under the
/// `stitch-timing` feature (see `timing.rs`); just `expr` otherwise.
macro_rules! timed {
    ($core:expr, $field:ident, $e:expr) => {{
        #[cfg(feature = "stitch-timing")]
        let t = std::time::Instant::now();
        let out = $e;
        #[cfg(feature = "stitch-timing")]
        {
            $core.timing.$field += timing::since(t);
        }
        out
    }};
}

/// The range reserved is this many times the device's memory: stitched memory leaves shadows
/// that hold address space (not memory) until the next release.
const SPAN_PER_MEMORY: u64 = 4;
/// A growth stitches only when, after it, less than 1/`STITCH_NEAR_LIMIT` of the limit would be
/// left: a loose limit costs no stitching.
const STITCH_NEAR_LIMIT: u64 = 8;
/// The largest handle a growth makes.
pub const MAX_HANDLE: u64 = 256 * MIB;
/// Under a limit, a handle is at most 1/`HANDLES_PER_REQUEST` of the request that grows the
/// arena: stitching needs handles that lie whole inside the free blocks later requests leave. Replayed
/// (`cudapool replay`, the traces of `benches/traces/`), peak reserved
/// over peak allocated at most 1.005-1.020 with 2 MiB handles, 1.027 at 1/16, 1.050 at 1/4,
/// 1.064 with 256 MiB handles for every growth.
const HANDLES_PER_REQUEST: u64 = 16;
/// Under a limit, a handle is at most 1/`HANDLES_PER_LIMIT` of it.
const HANDLES_PER_LIMIT: u64 = 64;

/// Where the arena lies: `span` bytes of address space reserved at `base`, mapped in handles
/// that are multiples of `chunk`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Span {
    pub(super) base: DevPtr,
    pub(super) span: u64,
    pub(super) chunk: u64,
}

impl Span {
    pub(super) fn holds(&self, ptr: DevPtr) -> bool {
        ptr >= self.base && ptr - self.base < self.span
    }
}

/// The expandable range of large requests, with everything that belongs to it: its address
/// range, the bytes mapped with memory of their own, its holes and shadows, and the physical
/// memory behind them. `SplitCore` holds one; what the arena does to its blocks goes through
/// one function (`changes.rs`), which keeps `holes` and `shadows` in step with them.
///
/// Invariants: without a `range` everything else is empty (and `mapped` 0); `holes` holds
/// exactly the arena's free blocks with nothing mapped, `shadows` exactly its shadow blocks
/// (start -> bytes each), `mapped` the bytes of `mem`'s handles (shadows not counted: their
/// memory is a handle's elsewhere). [`SplitCore::check`] verifies them.
#[derive(Default)]
pub(super) struct Arena {
    pub(super) range: Option<Span>,
    pub(super) mapped: u64,
    pub(super) holes: BTreeMap<DevPtr, u64>,
    pub(super) shadows: BTreeMap<DevPtr, u64>,
    /// Its physical memory: its handles, and the memory behind each handle and shadow (see
    /// [`memory::Memory`]).
    pub(super) mem: memory::Memory,
}

impl Arena {
    /// Whether `ptr` lies in the arena's range.
    pub(super) fn holds(&self, ptr: DevPtr) -> bool {
        self.range.is_some_and(|a| a.holds(ptr))
    }

    /// Every mapping in the arena (start, bytes): handles and shadows.
    pub(super) fn mappings(&self) -> Vec<(DevPtr, u64)> {
        let mut out: Vec<(DevPtr, u64)> =
            self.mem.handles().iter().map(|(&p, &l)| (p, l)).collect();
        out.extend(self.shadows.iter().map(|(&p, &l)| (p, l)));
        out.sort_unstable();
        out
    }

    /// The handles under `[ptr, ptr + size)` (mapped memory), in address order.
    pub(super) fn handles_of(&self, ptr: DevPtr, size: u64) -> Vec<(DevPtr, u64)> {
        let handles = self.mem.handles();
        let first = handles.range(..=ptr).next_back().map_or(ptr, |(&h, _)| h);
        handles
            .range(first..ptr + size)
            .filter(|&(&h, &l)| h + l > ptr)
            .map(|(&h, &l)| (h, l))
            .collect()
    }
}

/// The handle sizes a growth of `bytes` maps, in order: powers of two times `chunk`, each the
/// largest that fits what is left, at most `cap`.
fn handle_sizes(bytes: u64, chunk: u64, cap: u64) -> Vec<u64> {
    let mut out = Vec::new();
    let mut rest = bytes;
    while rest >= chunk {
        let mut h = chunk;
        while h * 2 <= rest.min(cap) {
            h *= 2;
        }
        out.push(h);
        rest -= h;
    }
    out
}

impl SplitCore {
    /// [`grow_arena`](Self::grow_arena), timed under the `stitch-timing` feature.
    pub(super) fn timed_growth(&mut self, r: u64, up: &dyn Upstream) -> Result<bool, CUresult> {
        #[cfg(feature = "stitch-timing")]
        {
            self.timing = Default::default();
            let t = std::time::Instant::now();
            let out = self.grow_arena(r, up);
            self.timing.total = timing::since(t);
            timing::record(self.timing);
            out
        }
        #[cfg(not(feature = "stitch-timing"))]
        self.grow_arena(r, up)
    }

    /// The arena's range, reserved on first use; `None` when the upstream has no virtual
    /// memory (or refuses the reservation): large requests then get classic segments.
    pub(super) fn reserve_arena(&mut self, up: &dyn Upstream) -> Option<Span> {
        if let Some(a) = self.arena.range {
            return Some(a);
        }
        let vm = up.virtual_memory()?;
        let Vmm { chunk, span } = vm.vmm()?;
        let span = round_up(span.max(chunk), chunk).saturating_mul(SPAN_PER_MEMORY);
        let base = vm.reserve(span, chunk).ok()?;
        let a = Span { base, span, chunk };
        self.open_arena(a);
        Some(a)
    }

    /// The arena's range `a`, just reserved: one segment, one hole.
    pub(super) fn open_arena(&mut self, a: Span) {
        self.arena.range = Some(a);
        self.segments.insert(a.base, Segment { size: a.span });
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

    /// The arena's range `a`, given back: it was one hole, with nothing mapped.
    pub(super) fn close_arena(&mut self, a: Span) {
        self.unmark_free(a.base);
        self.blocks.remove(&a.base);
        self.segments.remove(&a.base);
        self.arena.range = None;
    }

    /// Maps memory into the arena so that a ready free block fits the rounded request `r`:
    /// at the hole that needs the fewest new chunks (counting the ready free block that ends
    /// where it starts), the lowest such; stitched handles first (see the module's notes), new
    /// ones for the rest. `Ok(false)`: no arena, or no hole large enough (classic segments
    /// serve); an error: the upstream refused the memory (what was stitched stays, free).
    pub(super) fn grow_arena(&mut self, r: u64, up: &dyn Upstream) -> Result<bool, CUresult> {
        let Some(a) = self.reserve_arena(up) else {
            self.expandable = false;
            return Ok(false);
        };
        let Some((need, at)) = self.best_hole(r, a.chunk) else {
            let shadows = self.arena.shadows.len();
            if shadows == 0 || !timed!(self, sync, up.synchronize()) {
                return Ok(false);
            }
            // Shadows took the address space: the device is idle now, they may go.
            self.unmap_shadows(up);
            if self.arena.shadows.len() == shadows {
                return Ok(false);
            }
            return self.grow_arena(r, up);
        };
        let room = self.arena.holes[&at];
        // Stitching only near a limit (see the module's notes).
        let near = |limit: u64| up.headroom() < need.saturating_add(limit / STITCH_NEAR_LIMIT);
        let stitched = if up.limit().bytes().is_some_and(near) {
            self.stitch_into(at, need, room, up)
        } else {
            0
        };
        let made = timed!(
            self,
            map,
            self.map_handles(at + stitched, need.saturating_sub(stitched), r, a.chunk, up)
        );
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

    /// The hole to grow at for `r`, and the bytes it needs mapped (see [`grow_arena`]).
    ///
    /// [`grow_arena`]: Self::grow_arena
    fn best_hole(&self, r: u64, chunk: u64) -> Option<(u64, DevPtr)> {
        let mut best: Option<(u64, DevPtr)> = None;
        for (&h, &len) in &self.arena.holes {
            let before = self
                .blocks
                .range(..h)
                .next_back()
                .filter(|(&p, b)| b.ready() && p + b.size == h)
                .map_or(0, |(_, b)| b.size);
            let need = round_up(r.saturating_sub(before).max(1), chunk);
            if need <= len && best.is_none_or(|(n, _)| need < n) {
                best = Some((need, h));
            }
        }
        best
    }

    /// Stitches handles lying whole inside ready free blocks (the smallest blocks first: the
    /// holes the request did not fit) to `[at, at + need)`, in address order there; the block
    /// that ends at `at` is left alone (the growth extends it). The last handle may reach past
    /// `need` (up to `room`): its memory is held already, and what the request leaves of it
    /// stays free. Returns the bytes stitched.
    fn stitch_into(&mut self, at: DevPtr, need: u64, room: u64, up: &dyn Upstream) -> u64 {
        let (Some(a), Some(vm)) = (self.arena.range, up.virtual_memory()) else {
            return 0;
        };
        let mut blocks: Vec<(u64, DevPtr)> = self
            .blocks
            .range(a.base..a.base + a.span)
            .filter(|(&p, b)| b.ready() && p + b.size != at && b.size >= a.chunk)
            .map(|(&p, b)| (b.size, p))
            .collect();
        blocks.sort_unstable();
        // Everything looked up before the driver is asked: nothing may fail (nor panic)
        // between a mapping and the records of it.
        let mut picked: Vec<(DevPtr, u64)> = Vec::new();
        let mut done = 0;
        'blocks: for (size, p) in blocks {
            let inside = self
                .arena
                .mem
                .handles()
                .range(p..p + size)
                .filter(|&(&h, &len)| h + len <= p + size);
            for (&h, &len) in inside {
                if self.arena.mem.id(h).is_none() || done + len > room {
                    continue;
                }
                picked.push((h, len));
                done += len;
                if done >= need {
                    break 'blocks;
                }
            }
        }
        let stitched = timed!(self, stitch, vm.stitch(&picked, at)).unwrap_or(0);
        #[cfg(feature = "stitch-timing")]
        {
            self.timing.handles += stitched as u64;
        }
        let mut to = at;
        for &(h, len) in &picked[..stitched.min(picked.len())] {
            self.apply(Change {
                at: h,
                len,
                to: Kind::Shadow,
            });
            self.arena.mem.moved(h, to);
            to += len;
        }
        to - at
    }

    /// Maps new memory at `[at, at + bytes)` for the rounded request `r`, in handles of
    /// [`handle_sizes`] (at most [`MAX_HANDLE`]; under a limit also 1/[`HANDLES_PER_REQUEST`]
    /// of `r` and 1/[`HANDLES_PER_LIMIT`] of the limit), a call per run of one size; all or
    /// nothing.
    fn map_handles(
        &mut self,
        at: DevPtr,
        bytes: u64,
        r: u64,
        chunk: u64,
        up: &dyn Upstream,
    ) -> Result<(), CUresult> {
        if bytes == 0 {
            return Ok(());
        }
        let vm = up.virtual_memory().ok_or(CUDA_ERROR_NOT_SUPPORTED)?;
        let cap = match up.limit().bytes() {
            // Nothing is stitched: handles as large as the growth allows.
            None => MAX_HANDLE,
            Some(limit) => (limit / HANDLES_PER_LIMIT)
                .min(r / HANDLES_PER_REQUEST)
                .clamp(chunk, MAX_HANDLE),
        };
        let sizes = handle_sizes(bytes, chunk, cap);
        let mut runs: Vec<(DevPtr, u64, u64)> = Vec::new();
        let mut off = at;
        for h in sizes {
            match runs.last_mut() {
                Some(run) if run.2 == h => run.1 += h,
                _ => runs.push((off, h, h)),
            }
            off += h;
        }
        for (i, &(p, len, h)) in runs.iter().enumerate() {
            if let Err(e) = vm.map(p, len, h) {
                for &(p, len, h) in &runs[..i] {
                    let _ = vm.unmap(p, len, h);
                }
                return Err(e);
            }
        }
        for (p, len, h) in runs {
            for s in (p..p + len).step_by(h as usize) {
                self.arena.mem.made(s, h);
            }
        }
        self.reserved += bytes;
        self.arena.mapped += bytes;
        Ok(())
    }

    /// The handles lying whole inside each ready free block of the arena, as (start of the
    /// first, bytes of all): handles tile the mapped memory, so those of one block are one run.
    pub(super) fn arena_interiors(&self) -> Vec<(DevPtr, u64)> {
        let Some(a) = self.arena.range else {
            return Vec::new();
        };
        self.blocks
            .range(a.base..a.base + a.span)
            .filter(|(_, b)| b.ready())
            .filter_map(|(&p, b)| {
                let mut inside = self
                    .arena
                    .mem
                    .handles()
                    .range(p..p + b.size)
                    .filter(|&(&h, &len)| h + len <= p + b.size);
                let (&first, &first_len) = inside.next()?;
                let end = inside
                    .next_back()
                    .map_or(first + first_len, |(&h, &l)| h + l);
                Some((first, end - first))
            })
            .collect()
    }

    /// Unmaps the handles of `[at, at + len)`, whole handles inside one ready free arena
    /// block, one at a time (a handle the upstream keeps stays mapped and free); what is left
    /// of the block on either side stays free and mapped. Returns the bytes unmapped. Shadows
    /// go first ([`unmap_shadows`](Self::unmap_shadows)): while one maps a handle, unmapping
    /// the handle frees nothing.
    pub(super) fn unmap_interior(&mut self, up: &dyn Upstream, at: DevPtr, len: u64) -> u64 {
        let Some(vm) = up.virtual_memory() else {
            return 0;
        };
        let handles: Vec<(DevPtr, u64)> = self
            .arena
            .mem
            .handles()
            .range(at..at + len)
            .map(|(&h, &l)| (h, l))
            .collect();
        // Memory a shadow still maps (its unmap failed) is not given back: it would stay.
        let shadowed: std::collections::HashSet<u64> = self
            .arena
            .shadows
            .keys()
            .filter_map(|&s| self.arena.mem.id(s))
            .collect();
        let mut done = 0;
        for (c, hl) in handles {
            if self
                .arena
                .mem
                .id(c)
                .is_some_and(|id| shadowed.contains(&id))
            {
                continue;
            }
            if vm.unmap(c, hl, hl).is_err() {
                // The handle stays mapped, in the free block the next one is carved from.
                continue;
            }
            self.arena.mem.unmapped(c);
            self.apply(Change {
                at: c,
                len: hl,
                to: Kind::Hole,
            });
            done += hl;
        }
        self.reserved -= done;
        self.arena.mapped -= done;
        done
    }

    /// An arena with nothing mapped gives its address range back (a reclaim leaves nothing).
    pub(super) fn drop_empty_arena(&mut self, up: &dyn Upstream) {
        let Some(a) = self
            .arena
            .range
            .filter(|_| self.arena.mapped == 0 && self.arena.shadows.is_empty())
        else {
            return;
        };
        let Some(vm) = up.virtual_memory() else {
            return;
        };
        vm.unreserve(a.base, a.span);
        self.close_arena(a);
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
