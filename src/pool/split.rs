//! `split`: PyTorch-style best fit over free blocks, splitting and coalescing.
//!
//! Uses: `pool::core`, `pool::types`, `addr_hash`, `config`, `cu`.

use super::core::{
    pick_releases, round_up, segment, within, Core, Lane, Taken, MIB, MIN_BLOCK, READY,
};
use super::types::{BlockSpan, BlockState, BlockView, SegmentView, Upstream};
use crate::addr_hash::AddrMap as HashMap;
use crate::config::PoolKind;
use crate::cu::{CUresult, DevPtr};
use std::collections::{BTreeMap, BTreeSet};

/// Requests up to this size are *small*: served from segments of [`SMALL_SEGMENT`].
pub const SMALL_REQUEST: u64 = MIB;
pub const SMALL_SEGMENT: u64 = 2 * MIB;
/// Requests below this get segments holding several of them (up to [`MID_SEGMENT`]). 10 MiB
/// rather than PyTorch's 20: peak reserved / peak requested goes from 1.243 to 1.161 on the
/// synthetic training trace of `cargo bench --bench pool`, for 1.113 -> 1.124 on the recorded
/// PyTorch trace.
pub const MID_REQUEST: u64 = 10 * MIB;
pub const MID_SEGMENT: u64 = 10 * MIB;
/// Free blocks at least this large are never split (fragmentation cap); they serve only
/// requests within [`OVERSIZE_SLACK`] of their size. At 256 MiB the recorded GPT trace
/// (`cargo bench`: a 537 MB logits tensor and its gradient) reserved 1.144x its peak; at 1 GiB
/// (or no cap, as in PyTorch), 1.084x, every other trace unchanged.
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
struct Block {
    segment: DevPtr,
    size: u64,
    free: bool,
    /// For a free block: who may take it (see [`Lane`]).
    lane: Lane,
    /// For a free block of a queue's lane: the batch whose fence makes it ready.
    epoch: u64,
}

#[derive(Clone, Copy, Debug)]
struct Segment {
    size: u64,
    small: bool,
}

/// Free blocks of one lane, small and large apart, as (size, address).
type FreeSets = [BTreeSet<(u64, DevPtr)>; 2];

/// `split`: best fit over free blocks, splitting a block when the rest is worth keeping,
/// coalescing free neighbours of the same lane within a segment; small and large requests live
/// in separate segments.
///
/// Invariants: the blocks of a segment tile it exactly (`blocks` holds every block of every
/// segment, keyed by address); two free blocks of the same lane are never neighbours in one
/// segment (they are merged); `ready[small as usize]` holds exactly the free [`READY`] blocks
/// of small (large) segments and `lanes[l]` those of lane `l` (no empty entry); `cached` is the
/// sum of the free blocks' sizes, `reserved` of the segments'.
#[derive(Default)]
pub struct SplitCore {
    blocks: BTreeMap<DevPtr, Block>,
    ready: FreeSets,
    lanes: HashMap<Lane, FreeSets>,
    segments: HashMap<DevPtr, Segment>,
    cached: u64,
    reserved: u64,
}

impl SplitCore {
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

    fn mark_free(&mut self, ptr: DevPtr, b: Block) {
        let small = self.segments[&b.segment].small;
        self.blocks.insert(ptr, Block { free: true, ..b });
        self.sets_mut(b.lane)[Self::set(small)].insert((b.size, ptr));
        self.cached += b.size;
    }

    fn unmark_free(&mut self, ptr: DevPtr) -> Block {
        let b = self.blocks[&ptr];
        debug_assert!(b.free);
        let small = Self::set(self.segments[&b.segment].small);
        if b.lane == READY {
            self.ready[small].remove(&(b.size, ptr));
        } else if let Some(sets) = self.lanes.get_mut(&b.lane) {
            sets[small].remove(&(b.size, ptr));
            if sets.iter().all(|s| s.is_empty()) {
                self.lanes.remove(&b.lane);
            }
        }
        self.cached -= b.size;
        b
    }

    /// The smallest free block of at least `r` bytes in `sets`.
    fn fit(sets: Option<&FreeSets>, small: bool, r: u64) -> Option<(u64, DevPtr)> {
        sets?[Self::set(small)].range((r, 0)..).next().copied()
    }

    /// Whether the free block (`found` bytes at `ptr`) may serve a rounded request `r`.
    fn acceptable(&self, found: u64, ptr: DevPtr, r: u64, limit: u64) -> bool {
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
        let whole_segment = self.segments.get(&ptr).is_some_and(|seg| seg.size == found);
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
            || !whole_segment
            || r.saturating_mul(STRAND_SHARE) < limit
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
    fn take_within(&mut self, size: u64, lane: Lane, limit: u64, waste: u64) -> Option<Taken> {
        let r = round_up(size.max(1), MIN_BLOCK);
        let small = r <= SMALL_REQUEST;
        let mut candidates = [
            Self::fit(Some(&self.ready), small, r),
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
        let b = self.unmark_free(ptr);
        if rest >= MIN_BLOCK && b.size < MAX_SPLIT {
            self.blocks.insert(
                ptr,
                Block {
                    size: r,
                    free: false,
                    ..b
                },
            );
            // The rest stays in the block's lane, ready with it.
            self.mark_free(
                ptr + r,
                Block {
                    size: rest,
                    free: true,
                    ..b
                },
            );
            Some(Taken { ptr, size: r })
        } else {
            self.blocks.insert(ptr, Block { free: false, ..b });
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
            if n.free && n.segment == b.segment && n.lane == b.lane {
                self.unmark_free(next);
                self.blocks.remove(&next);
                b.size += n.size;
                b.epoch = b.epoch.max(n.epoch);
            }
        }
        // And with the previous one.
        if let Some((&pp, &p)) = self.blocks.range(..ptr).next_back() {
            if p.free && p.segment == b.segment && p.lane == b.lane && pp + p.size == ptr {
                self.unmark_free(pp);
                self.blocks.remove(&ptr);
                b.size += p.size;
                b.epoch = b.epoch.max(p.epoch);
                start = pp;
            }
        }
        self.mark_free(start, b);
    }
}

impl Core for SplitCore {
    fn kind(&self) -> PoolKind {
        PoolKind::Split
    }

    fn round(&self, size: u64) -> u64 {
        round_up(size.max(1), MIN_BLOCK)
    }

    fn take(&mut self, size: u64, lane: Lane, limit: u64) -> Option<Taken> {
        self.take_within(size, lane, limit, u64::MAX)
    }

    fn take_close(&mut self, size: u64, lane: Lane, limit: u64) -> Option<Taken> {
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
        let r = self.round(size);
        let preferred = Self::preferred_segment(r, up.headroom() != u64::MAX);
        // Near the limit: as many whole requests as the headroom holds; at least the request.
        let near_limit = (up.headroom() / r).max(1) * r;
        let (seg, got) = segment(up, &[preferred, near_limit.min(preferred), r])?;
        self.segments.insert(
            seg,
            Segment {
                size: got,
                small: r <= SMALL_REQUEST,
            },
        );
        self.reserved += got;
        self.mark_free(
            seg,
            Block {
                segment: seg,
                size: got,
                free: true,
                lane: READY,
                epoch: 0,
            },
        );
        // The new block fits, so this cannot miss.
        Ok(self
            .take(size, READY, u64::MAX)
            .expect("a fresh segment serves the request"))
    }

    fn put(&mut self, ptr: DevPtr, lane: Lane, epoch: u64) {
        let b = self.blocks[&ptr];
        debug_assert!(!b.free, "double put of {ptr:#x}");
        let epoch = if lane == READY { 0 } else { epoch };
        self.merge_and_free(ptr, Block { lane, epoch, ..b });
    }

    fn promote(&mut self, ptr: DevPtr, lane: Lane, done: u64) {
        let Some((&start, &b)) = self.blocks.range(..=ptr).next_back() else {
            return;
        };
        if ptr >= start + b.size || !b.free || b.lane != lane || lane == READY || b.epoch > done {
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
        (ptr < start + b.size && !b.free).then_some(BlockSpan {
            ptr: start,
            size: b.size,
            segment: b.segment,
        })
    }

    fn segments(&self) -> Vec<SegmentView> {
        let mut out: Vec<SegmentView> = self
            .segments
            .iter()
            .map(|(&ptr, seg)| SegmentView {
                ptr,
                size: seg.size,
                blocks: self
                    .blocks
                    .range(ptr..ptr + seg.size)
                    .map(|(&p, b)| BlockView {
                        ptr: p,
                        size: b.size,
                        state: match (b.free, b.lane) {
                            (false, _) => BlockState::InUse,
                            (true, READY) => BlockState::Free,
                            (true, _) => BlockState::Pending,
                        },
                    })
                    .collect(),
            })
            .collect();
        out.sort_by_key(|s| s.ptr);
        out
    }

    fn release_free_segments(&mut self, up: &dyn Upstream, need: u64) -> u64 {
        let whole: Vec<(DevPtr, u64)> = self
            .segments
            .iter()
            .filter(|(s, seg)| {
                self.blocks
                    .get(s)
                    .is_some_and(|b| b.free && b.size == seg.size)
            })
            .map(|(&s, seg)| (s, seg.size))
            .collect();
        let mut released = 0;
        for (s, size) in pick_releases(whole, need) {
            if up.free(s, size).is_ok() {
                self.unmark_free(s);
                self.blocks.remove(&s);
                self.segments.remove(&s);
                self.reserved -= size;
                released += size;
            }
        }
        released
    }

    fn cached(&self) -> u64 {
        self.cached
    }

    fn reserved(&self) -> u64 {
        self.reserved
    }

    fn forget(&mut self) -> (u64, u64) {
        let r = (self.segments.len() as u64, self.reserved);
        *self = SplitCore::default();
        r
    }
}
