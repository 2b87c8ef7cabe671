//! `split`: PyTorch-style best fit over free blocks, splitting and coalescing; with
//! `CUDAPOOL_SEGMENTS=expandable`, large requests live in one *arena*: a reserved address range
//! that grows by mapping memory where a request needs it and gives back the memory of its free
//! blocks (PyTorch's expandable segments).

use super::core::{
    pick_releases, round_up, segment, within, ArenaLeft, Core, Forgotten, Lane, MIB, MIN_BLOCK,
    READY,
};
use super::handed::Taken;
use super::types::{BlockSpan, BlockState, BlockView, SegmentView, Upstream};
use crate::base::addr_hash::AddrMap as HashMap;
use crate::base::config::PoolKind;
use crate::base::cu::{CUresult, DevPtr};
use crate::base::limit::Limit;
use std::collections::{BTreeMap, BTreeSet};

mod arena;
mod block;
mod changes;
mod check;
mod expand;
use arena::Arena;
use block::{Block, Kind};

/// Requests up to this size are *small*: served from segments of [`SMALL_SEGMENT`].
pub const SMALL_REQUEST: u64 = MIB;
pub const SMALL_SEGMENT: u64 = 2 * MIB;
/// Requests below this get segments holding several of them (up to [`MID_SEGMENT`]). 10 MiB
/// rather than PyTorch's 20 (why: docs/benchmarks.md, "The pool's constants").
pub const MID_REQUEST: u64 = 10 * MIB;
pub const MID_SEGMENT: u64 = 10 * MIB;
/// Free blocks at least this large are never split (fragmentation cap); they serve only
/// requests within [`OVERSIZE_SLACK`] of their size (why 1 GiB: docs/benchmarks.md, "The
/// pool's constants").
pub const MAX_SPLIT: u64 = 1024 * MIB;
pub const OVERSIZE_SLACK: u64 = 20 * MIB;
/// Large segments are rounded to this.
pub const LARGE_ROUND: u64 = 2 * MIB;
/// A close fit for a large request leaves at most 1/`CLOSE_FIT` of it (or 1 MiB).
pub const CLOSE_FIT: u64 = 8;
/// Under a limit, a whole cached segment is not split for a request of at least
/// 1/`STRAND_SHARE` of the limit (see `SplitCore::acceptable`).
pub const STRAND_SHARE: u64 = 16;

#[derive(Clone, Copy, Debug)]
struct Segment {
    size: u64,
}

/// Free blocks of one lane, small and large apart, as (size, address).
type FreeSets = [BTreeSet<(u64, DevPtr)>; 2];

/// `split`: best fit over free blocks, splitting a block when the rest is worth keeping,
/// coalescing free neighbours of the same lane within a segment; small and large requests live
/// in separate segments.
///
/// Invariants: the blocks of a segment tile it exactly (`blocks` holds every block of every
/// segment, the arena's included, keyed by address; each carries its segment's `small`, false
/// in the arena); two free blocks of the same lane and mapping are never neighbours in one
/// segment (they are merged); `ready[small as usize]` holds exactly the free mapped [`READY`]
/// blocks of small (large) segments (both but for the `parked` block) and `lanes[l]` those of
/// lane `l` (no empty entry); `arena.holes` holds exactly the free unmapped blocks, and
/// `arena.shadows` the others; `cached` is the free mapped blocks' bytes, `reserved` the classic
/// segments' sizes and the arena's mapped bytes. The handles of `arena.mem` tile the arena's
/// mapped blocks, one entry per physical allocation mapped there (a block in use never lies
/// over a shadow); the memory of a shadow is that of one handle. [`check`](Core::check)
/// verifies every one of these.
#[derive(Default)]
pub struct SplitCore {
    blocks: BTreeMap<DevPtr, Block>,
    ready: FreeSets,
    lanes: HashMap<Lane, FreeSets>,
    segments: HashMap<DevPtr, Segment>,
    cached: u64,
    reserved: u64,
    /// Large requests grow the arena (`CUDAPOOL_SEGMENTS=expandable`) rather than get
    /// segments of their own; off for good once the upstream has no virtual memory, or the
    /// program exported a block through legacy IPC.
    expandable: bool,
    /// The arena: its range, holes, shadows and memory (see [`Arena`]).
    arena: Arena,
    /// The block put back ready last, when no core operation has come since: free and
    /// [`READY`] in `blocks` and counted in `cached`, but in no free set and not yet merged
    /// with its free neighbours (the one exception to both invariants above). A take of its
    /// exact size gets it back without touching the sets; every other operation lists and
    /// merges it first ([`unpark`](Self::unpark)). A free followed by an allocation of the
    /// same size (most of a program's pairs above the thread magazines' 1 MiB) leaves the
    /// core as it was, without a merge and a split.
    parked: Option<DevPtr>,
}

impl SplitCore {
    /// A core whose large requests live in an arena (`CUDAPOOL_SEGMENTS=expandable`).
    pub fn expandable() -> Self {
        SplitCore {
            expandable: true,
            ..Default::default()
        }
    }

    /// The same core, its arena stitching by `rule` (`CUDAPOOL_STITCH`).
    pub fn stitching(mut self, rule: crate::base::config::Stitch) -> Self {
        self.arena.set_stitch(rule);
        self
    }

    fn in_arena(&self, ptr: DevPtr) -> bool {
        self.arena.holds(ptr)
    }

    fn set(small: bool) -> usize {
        small as usize
    }

    fn sets_mut(&mut self, lane: Lane) -> &mut FreeSets {
        if lane == READY {
            &mut self.ready
        } else {
            self.lanes.entry(lane).or_default()
        }
    }

    /// Lists and merges the parked block, if any (see [`SplitCore::parked`]). Visible to the
    /// pool's tests, whose reference core unparks after every put.
    pub(super) fn unpark(&mut self) {
        if let Some(p) = self.parked.take() {
            let b = self.blocks[&p];
            // merge_and_free counts it in `cached` again.
            self.cached -= b.size;
            self.merge_and_free(p, b);
        }
    }

    /// The parked block for a rounded request `r` of `lane`, when taking it leaves the core
    /// exactly as listing it, merging it and the best fit would (see [`SplitCore::parked`]):
    /// it is an exact fit of the request's kind of segment; no free neighbour precedes it (the
    /// merged block would start there); no listed block fits better than it merged with a
    /// free neighbour after it (the best fit would be that block); and the request is not a
    /// queue's that has lane blocks of its own (those come before ready ones).
    fn take_parked(&mut self, r: u64, lane: Lane) -> Option<Taken> {
        let p = self.parked?;
        if lane != READY && !self.lanes.is_empty() {
            return None;
        }
        let b = self.blocks[&p];
        if b.size != r || b.small != (r <= SMALL_REQUEST) {
            return None;
        }
        // The neighbours merge_and_free would merge it with.
        let merges = |n: &Block| n.segment == b.segment && n.kind == b.kind && n.lane == READY;
        if let Some((&pp, prev)) = self.blocks.range(..p).next_back() {
            if pp + prev.size == p && merges(prev) {
                return None;
            }
        }
        let next = p + r;
        let after = self.blocks.get(&next).filter(|n| merges(n));
        let merged = r + after.map_or(0, |n| n.size);
        // The smallest listed fit, but for the neighbour after (it would be merged away).
        let fit = self.ready[Self::set(b.small)]
            .range((r, 0)..)
            .find(|&&(_, at)| after.is_none() || at != next);
        // A tail (the merged block ends where the arena is unmapped) ranks after every other
        // fit (see `lean_fit`).
        let tail = || self.in_arena(p) && self.arena.holes().contains_key(&(p + merged));
        if fit.is_some_and(|&fit| fit < (merged, p) || tail()) {
            return None;
        }
        self.blocks
            .get_mut(&p)
            .expect("the parked block is in blocks")
            .kind = Kind::InUse;
        self.cached -= r;
        self.parked = None;
        Some(Taken { ptr: p, size: r })
    }

    fn mark_free(&mut self, ptr: DevPtr, b: Block) {
        if !b.mapped() {
            self.blocks.insert(
                ptr,
                Block {
                    kind: Kind::Hole,
                    lane: READY,
                    epoch: 0,
                    ..b
                },
            );
            self.arena.list(ptr, b.size, Kind::Hole);
            return;
        }
        let small = b.small;
        self.blocks.insert(
            ptr,
            Block {
                kind: Kind::Free,
                ..b
            },
        );
        self.sets_mut(b.lane)[Self::set(small)].insert((b.size, ptr));
        self.cached += b.size;
    }

    fn unmark_free(&mut self, ptr: DevPtr) -> Block {
        let b = self.blocks[&ptr];
        self.unlist(ptr, b);
        b
    }

    /// Takes the free block `b` at `ptr` out of its free set (or the holes); `blocks` is left
    /// to the caller.
    fn unlist(&mut self, ptr: DevPtr, b: Block) {
        debug_assert!(b.free());
        if b.kind == Kind::Hole {
            self.arena.unlist(ptr, Kind::Hole);
            return;
        }
        let small = Self::set(b.small);
        if b.lane == READY {
            self.ready[small].remove(&(b.size, ptr));
        } else if let Some(sets) = self.lanes.get_mut(&b.lane) {
            sets[small].remove(&(b.size, ptr));
            if sets.iter().all(|s| s.is_empty()) {
                self.lanes.remove(&b.lane);
            }
        }
        self.cached -= b.size;
    }

    /// The smallest free block of at least `r` bytes in `sets`.
    fn fit(sets: Option<&FreeSets>, small: bool, r: u64) -> Option<(u64, DevPtr)> {
        sets?[Self::set(small)].range((r, 0)..).next().copied()
    }

    /// The best ready fit for `r`, PyTorch's way in the arena: a *tail* (a free block that
    /// ends where the arena is unmapped) ranks as its size plus the unmapped space after it,
    /// so holes between live blocks fill first and the tail serves, and grows, only when no
    /// hole holds the request. Taking the tail for a request a hole holds leaves the hole
    /// idle and makes the next large request map its whole size (docs/benchmarks.md, "The
    /// pool's constants"). Skips at most one entry per hole.
    fn lean_fit(&self, small: bool, r: u64) -> Option<(u64, DevPtr)> {
        let set = &self.ready[Self::set(small)];
        if small || self.arena.holes().is_empty() {
            return set.range((r, 0)..).next().copied();
        }
        let mut tail: Option<(u64, (u64, DevPtr))> = None;
        for &(size, ptr) in set.range((r, 0)..) {
            match self.arena.holes().get(&(ptr + size)) {
                Some(&hole) if self.in_arena(ptr) => {
                    if tail.is_none_or(|(rank, _)| size + hole < rank) {
                        tail = Some((size + hole, (size, ptr)));
                    }
                }
                _ => return Some((size, ptr)),
            }
        }
        tail.map(|(_, fit)| fit)
    }

    /// Whether the free block (`found` bytes at `ptr`) may serve a rounded request `r`.
    fn acceptable(&self, found: u64, ptr: DevPtr, r: u64, limit: Limit) -> bool {
        if self.in_arena(ptr) {
            // Any rest of an arena block can be given back while its neighbour lives.
            return true;
        }
        if found >= MAX_SPLIT && (r < MAX_SPLIT || found - r > OVERSIZE_SLACK) {
            // An oversize block that this request may not take.
            return false;
        }
        let small = r <= SMALL_REQUEST;
        let worth_splitting = if small {
            found - r >= MIN_BLOCK
        } else {
            found - r > SMALL_REQUEST
        };
        let whole_segment = || self.segments.get(&ptr).is_some_and(|seg| seg.size == found);
        // Under a limit, splitting a whole free segment made for one large request strands its
        // rest next to a live block, where no reclaim can give it back. For a request that is
        // a large share of the limit, that rest is too: decline, and a new segment serves the
        // request, or, near the limit, the reclaim before an OOM releases this one whole and
        // the retry gets a segment that fits (the README's sample: 64 MiB buffers under 512
        // MiB after a 100 MiB one). Smaller requests split like without a limit: declining
        // them grew the pool to the limit and churned (a PyTorch CNN under 1.25x its need made
        // 5,290 driver allocations in 40 steps and ran at 0.36x). Segments under MID_REQUEST
        // are made to hold several requests; a tail of a segment already in use is stranded
        // either way.
        small
            || !worth_splitting
            || !(MID_REQUEST..MAX_SPLIT).contains(&found)
            || !whole_segment()
            || r.saturating_mul(STRAND_SHARE) < limit.cap()
    }

    /// Preferred segment size for a rounded request `r`; `limited` when a hard limit applies.
    fn preferred_segment(r: u64, limited: bool) -> u64 {
        if r <= SMALL_REQUEST {
            // Under a limit, a whole number of requests: the tail would be memory the program
            // cannot get at.
            if limited {
                r * (SMALL_SEGMENT / r)
            } else {
                SMALL_SEGMENT
            }
        } else if r < MID_REQUEST {
            // A whole number of requests, so a run of equal requests wastes nothing.
            r * (MID_SEGMENT / r).max(1)
        } else {
            round_up(r, LARGE_ROUND)
        }
    }

    /// The best fit for `size` among ready blocks and those of `lane` that leave at most
    /// `waste` bytes (see [`Core::take`], [`Core::take_close`]).
    fn take_within(&mut self, size: u64, lane: Lane, limit: Limit, waste: u64) -> Option<Taken> {
        let r = round_up(size.max(1), MIN_BLOCK);
        // The parked block when the best fit would be it; otherwise it is listed first.
        if let Some(t) = self.take_parked(r, lane) {
            return Some(t);
        }
        self.unpark();
        let small = r <= SMALL_REQUEST;
        let mut candidates = [
            self.lean_fit(small, r),
            (lane != READY)
                .then(|| Self::fit(self.lanes.get(&lane), small, r))
                .flatten(),
        ];
        // The smaller fit first; a lane block before a ready one of the same size (it could
        // serve nobody else yet).
        if candidates[1].is_some_and(|l| candidates[0].is_none_or(|rd| l.0 <= rd.0)) {
            candidates.swap(0, 1);
        }
        let (found, ptr) = candidates
            .into_iter()
            .flatten()
            .find(|&(found, ptr)| found - r <= waste && self.acceptable(found, ptr, r, limit))?;
        // Any rest is split off (below an oversize block), so that what the program holds is
        // its rounded request: a large segment's rest of up to 1 MiB serves no one until its
        // neighbour comes back (requests that small live in small segments), but it is cached
        // memory, not the program's (PyTorch hands it out with the block, and counts it as
        // allocated).
        let rest = found - r;
        let in_arena = self.in_arena(ptr);
        let taken = self
            .blocks
            .get_mut(&ptr)
            .expect("a free block is in blocks");
        let b = *taken;
        let split = rest >= MIN_BLOCK && (b.size < MAX_SPLIT || in_arena);
        taken.kind = Kind::InUse;
        if split {
            taken.size = r;
        }
        self.unlist(ptr, b);
        if split {
            // The rest stays in the block's lane, ready with it.
            self.mark_free(
                ptr + r,
                Block {
                    size: rest,
                    kind: Kind::Free,
                    ..b
                },
            );
            Some(Taken { ptr, size: r })
        } else {
            Some(Taken { ptr, size: b.size })
        }
    }

    /// Makes the free block at `ptr` ready-or-lane `b.lane` again after merging it with free
    /// neighbours of the same lane; `ptr` is not in any free set when called.
    fn merge_and_free(&mut self, ptr: DevPtr, mut b: Block) {
        let mut start = ptr;
        // Merge with the next block of the same segment and lane.
        let next = ptr + b.size;
        if let Some(&n) = self.blocks.get(&next) {
            if n.free() && n.segment == b.segment && n.lane == b.lane && n.mapped() == b.mapped() {
                self.unmark_free(next);
                self.blocks.remove(&next);
                b.size += n.size;
                b.epoch = b.epoch.max(n.epoch);
            }
        }
        // And with the previous one.
        if let Some((&pp, &p)) = self.blocks.range(..ptr).next_back() {
            if p.free()
                && p.segment == b.segment
                && p.lane == b.lane
                && p.mapped() == b.mapped()
                && pp + p.size == ptr
            {
                self.unmark_free(pp);
                self.blocks.remove(&ptr);
                b.size += p.size;
                b.epoch = b.epoch.max(p.epoch);
                start = pp;
            }
        }
        self.mark_free(start, b);
    }

    fn state(b: &Block) -> BlockState {
        match (b.free(), b.lane) {
            (false, _) => BlockState::InUse,
            (true, READY) => BlockState::Free,
            (true, _) => BlockState::Pending,
        }
    }
}

impl Core for SplitCore {
    fn kind(&self) -> PoolKind {
        PoolKind::Split
    }

    fn check(&self) -> Result<(), String> {
        self.check_invariants()
    }

    fn round(&self, size: u64) -> u64 {
        round_up(size.max(1), MIN_BLOCK)
    }

    fn take(&mut self, size: u64, lane: Lane, limit: Limit) -> Option<Taken> {
        self.take_within(size, lane, limit, u64::MAX)
    }

    fn take_close(&mut self, size: u64, lane: Lane, limit: Limit) -> Option<Taken> {
        let r = self.round(size);
        // Small requests come from small segments, where any piece serves.
        let waste = if r <= SMALL_REQUEST {
            u64::MAX
        } else {
            (r / CLOSE_FIT).max(SMALL_REQUEST)
        };
        self.take_within(size, lane, limit, waste)
    }

    fn grow(&mut self, size: u64, up: &dyn Upstream) -> Result<Taken, CUresult> {
        self.unpark();
        let r = self.round(size);
        if self.expandable && r > SMALL_REQUEST && self.reclaim_shadows(r) {
            // Memory moved back to where it makes a larger free block: no driver call.
            if let Some(t) = self.take(size, READY, Limit::NONE) {
                return Ok(t);
            }
        }
        if self.expandable && r > SMALL_REQUEST && self.timed_growth(r, up)? {
            // The arena now has a ready free block this request fits.
            return Ok(self
                .take(size, READY, Limit::NONE)
                .expect("the grown arena serves the request"));
        }
        let preferred = Self::preferred_segment(r, !up.limit().is_none());
        // Near the limit: as many whole requests as the headroom holds; at least the request.
        let near_limit = (up.headroom() / r).max(1) * r;
        let (seg, got) = segment(up, &[preferred, near_limit.min(preferred), r])?;
        self.segments.insert(seg, Segment { size: got });
        self.reserved += got;
        self.mark_free(
            seg,
            Block {
                segment: seg,
                size: got,
                small: r <= SMALL_REQUEST,
                kind: Kind::Free,
                lane: READY,
                epoch: 0,
            },
        );
        // The new block fits, so this cannot miss.
        Ok(self
            .take(size, READY, Limit::NONE)
            .expect("a fresh segment serves the request"))
    }

    fn put(&mut self, ptr: DevPtr, lane: Lane, epoch: u64) {
        self.unpark();
        let b = self
            .blocks
            .get_mut(&ptr)
            .expect("a block handed out is in blocks");
        debug_assert!(b.kind == Kind::InUse, "double put of {ptr:#x}");
        if lane == READY {
            b.kind = Kind::Free;
            b.lane = READY;
            b.epoch = 0;
            self.cached += b.size;
            self.parked = Some(ptr);
            return;
        }
        let b = *b;
        self.merge_and_free(ptr, Block { lane, epoch, ..b });
    }

    fn promote(&mut self, ptr: DevPtr, lane: Lane, done: u64) {
        self.unpark();
        let Some((&start, &b)) = self.blocks.range(..=ptr).next_back() else {
            return;
        };
        if ptr >= start + b.size || !b.free() || b.lane != lane || lane == READY || b.epoch > done {
            return;
        }
        self.unmark_free(start);
        self.merge_and_free(
            start,
            Block {
                lane: READY,
                epoch: 0,
                ..b
            },
        );
    }

    fn block_size(&self, ptr: DevPtr) -> u64 {
        self.blocks[&ptr].size
    }

    fn owns(&self, ptr: DevPtr) -> bool {
        within(&self.blocks, ptr, |b| b.size)
    }

    fn block_of(&self, ptr: DevPtr) -> Option<BlockSpan> {
        let (&start, b) = self.blocks.range(..=ptr).next_back()?;
        (ptr < start + b.size && b.kind == Kind::InUse).then_some(BlockSpan {
            ptr: start,
            size: b.size,
            segment: b.segment,
            expandable: self.in_arena(start),
        })
    }

    fn segments(&self) -> Vec<SegmentView> {
        let mut out: Vec<SegmentView> = self
            .segments
            .iter()
            .filter(|(&ptr, _)| !self.in_arena(ptr))
            .map(|(&ptr, seg)| SegmentView {
                ptr,
                size: seg.size,
                blocks: self
                    .blocks
                    .range(ptr..ptr + seg.size)
                    .map(|(&p, b)| BlockView {
                        ptr: p,
                        size: b.size,
                        state: Self::state(b),
                    })
                    .collect(),
                expandable: false,
            })
            .collect();
        if let Some(a) = self.arena.range() {
            out.extend(self.arena_segments(a));
        }
        out.sort_by_key(|s| s.ptr);
        out
    }

    fn release_free_segments(&mut self, up: &dyn Upstream, need: u64, unmap: bool) -> u64 {
        self.unpark();
        let mut whole: Vec<(DevPtr, u64)> = self
            .segments
            .iter()
            .filter(|(&s, seg)| {
                !self.in_arena(s)
                    && self
                        .blocks
                        .get(&s)
                        .is_some_and(|b| b.free() && b.size == seg.size)
            })
            .map(|(&s, seg)| (s, seg.size))
            .collect();
        let interiors = if unmap {
            // The device is idle: shadows may go, and then handles may be given back.
            self.unmap_shadows(up);
            self.arena_interiors()
        } else {
            Vec::new()
        };
        whole.extend(interiors.iter().copied());
        let mut released = 0;
        for (s, size) in pick_releases(whole, need) {
            if interiors.iter().any(|i| i.0 == s) {
                released += self.unmap_interior(up, s, size);
                continue;
            }
            if up.free(s, size).is_ok() {
                self.unmark_free(s);
                self.blocks.remove(&s);
                self.segments.remove(&s);
                self.reserved -= size;
                released += size;
            }
        }
        self.drop_empty_arena(up);
        released
    }

    fn cached(&self) -> u64 {
        self.cached
    }

    fn settle(&mut self) {
        self.unpark();
    }

    fn reserved(&self) -> u64 {
        self.reserved
    }

    fn forget(&mut self) -> Forgotten {
        let arena = self.arena.range().map(|a| ArenaLeft {
            range: (a.base, a.span),
            mapped: self.arena.mappings(),
        });
        let r = Forgotten {
            segments: self.segments.len() as u64,
            bytes: self.reserved,
            arena,
        };
        *self = SplitCore {
            expandable: self.expandable,
            ..Default::default()
        };
        r
    }

    fn unmaps(&self) -> bool {
        self.arena.mapped() > 0
    }

    fn stop_expanding(&mut self) {
        self.expandable = false;
    }

    fn sleeping(&mut self) -> Option<&mut dyn crate::pool::Sleeping> {
        Some(self)
    }

    fn handles_under(&self, ptr: DevPtr) -> Vec<(DevPtr, u64)> {
        match self.blocks.get(&ptr) {
            Some(b) if b.kind == Kind::InUse && self.in_arena(ptr) => {
                self.arena.handles_of(ptr, b.size)
            }
            _ => Vec::new(),
        }
    }
}
