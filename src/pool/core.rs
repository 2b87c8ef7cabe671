//! The caches of the pool kinds. A block put back is at once a candidate for the requests its
//! *lane* allows: [`READY`] blocks serve anyone; a block in a queue's lane (a stream-ordered
//! free, see [`super::reuse`]) serves only allocations ordered on that queue until the fence of
//! its batch is done, when [`Core::promote`] makes it ready. Whether and where a freed block may
//! be put back is decided one level up, in [`super::reuse`]. Not thread-safe by themselves: the
//! wrapper holds each behind its lock.
//!
//! Near the limit the program's memory comes first (SPEC.md): a kind never asks the upstream
//! for more than the headroom when a smaller segment would do, and falls back to a segment of
//! the rounded request when its preferred segment is refused.

use super::{BlockState, BlockView, SegmentView, Upstream};
use crate::addr_hash::AddrMap as HashMap;
use crate::config::PoolKind;
use crate::cu::{CUresult, DevPtr, CUDA_ERROR_OUT_OF_MEMORY};
use std::collections::{BTreeMap, BTreeSet};

/// Who may take a free block: [`READY`] (anyone), or the key of the one queue whose ordered
/// allocations may take it before its fence is done (a [`super::StreamKey`], never 0).
pub type Lane = u64;
/// The lane of blocks anyone may take.
pub const READY: Lane = 0;

/// One pool kind's cache of free blocks and the segments behind them.
pub trait Core: Send {
    fn kind(&self) -> PoolKind;
    /// What a request of `size` is rounded to (the key blocks are matched by).
    fn round(&self, size: u64) -> u64;
    /// A free block for `size`: a ready one, or one of `lane` (when it is not [`READY`]).
    /// `limit` is the upstream's hard limit ([`Upstream::limit`]): a kind may decline a fit
    /// that would strand memory the program may need under it.
    fn take(&mut self, size: u64, lane: Lane, limit: u64) -> Option<DevPtr>;
    /// Like [`take`](Self::take), but only a block the request fits closely (while fences are
    /// still to bring blocks back, a closer one may come).
    fn take_close(&mut self, size: u64, lane: Lane, limit: u64) -> Option<DevPtr> {
        self.take(size, lane, limit)
    }
    /// Gets a new segment from `up` able to serve `size` and takes a block from it.
    fn grow(&mut self, size: u64, up: &dyn Upstream) -> Result<DevPtr, CUresult>;
    /// Puts back a block handed out by `take` or `grow`, into `lane`; `epoch` is the batch
    /// whose fence makes a lane block ready (ignored for [`READY`]).
    fn put(&mut self, ptr: DevPtr, lane: Lane, epoch: u64);
    /// The free block of `lane` that holds `ptr`, if any and if its epoch is at most `done`,
    /// becomes ready (and coalesces with ready neighbours).
    fn promote(&mut self, ptr: DevPtr, lane: Lane, done: u64);
    /// The size of the block at `ptr` (handed out, not yet put back).
    fn block_size(&self, ptr: DevPtr) -> u64;
    /// Whether `ptr` lies inside a segment this core holds.
    fn owns(&self, ptr: DevPtr) -> bool;
    /// Every segment and its blocks; blocks not free in the core show as in use, blocks of a
    /// queue's lane as pending.
    fn segments(&self) -> Vec<SegmentView>;
    /// Gives segments with no block in use back to `up` until at least `need` bytes went back
    /// (`u64::MAX`: all of them): the smallest one that is enough alone, else the largest
    /// first. Returns the bytes released. (The driver's free waits for the device, so a free
    /// block of any lane may go.)
    fn release_free_segments(&mut self, up: &dyn Upstream, need: u64) -> u64;
    /// Bytes in free blocks, of every lane.
    fn cached(&self) -> u64;
    /// Bytes of every segment held.
    fn reserved(&self) -> u64;
    /// Forgets everything without calling the upstream; returns (segments, bytes) held.
    fn forget(&mut self) -> (u64, u64);
}

/// Which free segments go back for `need` bytes: the smallest that is enough alone, else
/// the largest first until enough.
fn pick_releases(mut free: Vec<(DevPtr, u64)>, need: u64) -> Vec<(DevPtr, u64)> {
    free.sort_by_key(|&(p, s)| (s, p));
    if need == u64::MAX {
        return free;
    }
    if let Some(&one) = free.iter().find(|&&(_, s)| s >= need) {
        return vec![one];
    }
    let mut out = Vec::new();
    let mut got = 0;
    while got < need {
        let Some(seg) = free.pop() else { break };
        got += seg.1;
        out.push(seg);
    }
    out
}

/// The smallest block and the granularity of `split` and the floor of `binned`.
pub const MIN_BLOCK: u64 = 512;
const MIB: u64 = 1 << 20;

fn round_up(n: u64, to: u64) -> u64 {
    n.div_ceil(to) * to
}

/// Gets a segment of the first size in `sizes` (largest first, the last being the least that
/// serves the request) that fits the upstream's headroom and that the upstream grants.
/// Returns (address, size obtained).
fn segment(up: &dyn Upstream, sizes: &[u64]) -> Result<(DevPtr, u64), CUresult> {
    let last = *sizes.last().expect("at least one size");
    let headroom = up.headroom();
    let mut result = Err(CUDA_ERROR_OUT_OF_MEMORY);
    for &size in sizes {
        if size > headroom && size != last {
            continue;
        }
        result = up.alloc(size).map(|p| (p, size));
        match result {
            Err(CUDA_ERROR_OUT_OF_MEMORY) => continue,
            _ => break,
        }
    }
    result
}

/// Whether `ptr` falls in one of the ranges `[start, start + size)` keyed by start.
fn within<V>(map: &BTreeMap<DevPtr, V>, ptr: DevPtr, size: impl Fn(&V) -> u64) -> bool {
    map.range(..=ptr)
        .next_back()
        .is_some_and(|(&start, v)| ptr < start + size(v))
}

// ---- one segment per block: simple and binned ---------------------------------------------

/// Blocks that are whole segments, cached under a key (`simple`: the size; `binned`: the class).
///
/// Invariant: `sizes` holds every segment (cached or in use) and its size; `free` holds exactly
/// the cached ones, under (lane, key); `lanes` holds (lane, epoch) of exactly the cached ones
/// outside [`READY`]; `cached` is the sum of the cached sizes and `reserved` of all sizes.
#[derive(Default)]
struct SegmentCache {
    sizes: BTreeMap<DevPtr, u64>,
    free: HashMap<(Lane, u64), Vec<DevPtr>>,
    lanes: HashMap<DevPtr, (Lane, u64)>,
    cached: u64,
    reserved: u64,
}

impl SegmentCache {
    /// The most recently cached block under `key` that `fits`, ready or of `lane`.
    fn take(&mut self, key: u64, lane: Lane, fits: impl Fn(u64) -> bool) -> Option<DevPtr> {
        for l in [lane, READY] {
            let Some(list) = self.free.get_mut(&(l, key)) else {
                continue;
            };
            if let Some(i) = list.iter().rposition(|p| fits(self.sizes[p])) {
                let p = list.swap_remove(i);
                self.cached -= self.sizes[&p];
                self.lanes.remove(&p);
                return Some(p);
            }
        }
        None
    }

    fn insert(&mut self, ptr: DevPtr, size: u64) {
        self.sizes.insert(ptr, size);
        self.reserved += size;
    }

    fn put(&mut self, ptr: DevPtr, key: u64, lane: Lane, epoch: u64) {
        self.free.entry((lane, key)).or_default().push(ptr);
        if lane != READY {
            self.lanes.insert(ptr, (lane, epoch));
        }
        self.cached += self.sizes[&ptr];
    }

    fn promote(&mut self, ptr: DevPtr, key: u64, lane: Lane, done: u64) {
        match self.lanes.get(&ptr) {
            Some(&(l, e)) if l == lane && e <= done => {}
            _ => return,
        }
        self.lanes.remove(&ptr);
        if let Some(list) = self.free.get_mut(&(lane, key)) {
            list.retain(|&p| p != ptr);
        }
        self.free.entry((READY, key)).or_default().push(ptr);
    }

    fn size(&self, ptr: DevPtr) -> u64 {
        self.sizes[&ptr]
    }

    fn owns(&self, ptr: DevPtr) -> bool {
        within(&self.sizes, ptr, |&s| s)
    }

    /// Gives cached segments back (see [`Core::release_free_segments`]); one the upstream
    /// refuses stays cached.
    fn release(&mut self, up: &dyn Upstream, need: u64) -> u64 {
        let free: Vec<(DevPtr, u64)> = self
            .free
            .values()
            .flatten()
            .map(|&p| (p, self.sizes[&p]))
            .collect();
        let mut released = 0;
        for (p, size) in pick_releases(free, need) {
            if up.free(p, size).is_err() {
                continue;
            }
            for list in self.free.values_mut() {
                list.retain(|&q| q != p);
            }
            self.lanes.remove(&p);
            self.sizes.remove(&p);
            self.cached -= size;
            self.reserved -= size;
            released += size;
        }
        self.free.retain(|_, list| !list.is_empty());
        released
    }

    fn forget(&mut self) -> (u64, u64) {
        let r = (self.sizes.len() as u64, self.reserved);
        *self = SegmentCache::default();
        r
    }

    fn segments(&self) -> Vec<SegmentView> {
        let free: std::collections::HashSet<DevPtr> =
            self.free.values().flatten().copied().collect();
        self.sizes
            .iter()
            .map(|(&ptr, &size)| SegmentView {
                ptr,
                size,
                blocks: vec![BlockView {
                    ptr,
                    size,
                    state: if self.lanes.contains_key(&ptr) {
                        BlockState::Pending
                    } else if free.contains(&ptr) {
                        BlockState::Free
                    } else {
                        BlockState::InUse
                    },
                }],
            })
            .collect()
    }
}

/// The [`Core`] methods that `simple` and `binned` answer straight from their [`SegmentCache`].
macro_rules! segment_cache_core {
    () => {
        fn block_size(&self, ptr: DevPtr) -> u64 {
            self.0.size(ptr)
        }
        fn owns(&self, ptr: DevPtr) -> bool {
            self.0.owns(ptr)
        }
        fn segments(&self) -> Vec<SegmentView> {
            self.0.segments()
        }
        fn release_free_segments(&mut self, up: &dyn Upstream, need: u64) -> u64 {
            self.0.release(up, need)
        }
        fn cached(&self) -> u64 {
            self.0.cached
        }
        fn reserved(&self) -> u64 {
            self.0.reserved
        }
        fn forget(&mut self) -> (u64, u64) {
            self.0.forget()
        }
        fn put(&mut self, ptr: DevPtr, lane: Lane, epoch: u64) {
            let key = self.key_of(ptr);
            self.0.put(ptr, key, lane, epoch);
        }
        fn promote(&mut self, ptr: DevPtr, lane: Lane, done: u64) {
            if self.0.sizes.contains_key(&ptr) {
                let key = self.key_of(ptr);
                self.0.promote(ptr, key, lane, done);
            }
        }
    };
}

/// `simple`: every block is a segment of exactly the requested size; a request is served only
/// by a cached block of the same size.
#[derive(Default)]
pub struct SimpleCore(SegmentCache);

impl SimpleCore {
    fn key_of(&self, ptr: DevPtr) -> u64 {
        self.0.size(ptr)
    }
}

impl Core for SimpleCore {
    fn kind(&self) -> PoolKind {
        PoolKind::Simple
    }
    fn round(&self, size: u64) -> u64 {
        size
    }
    fn take(&mut self, size: u64, lane: Lane, _limit: u64) -> Option<DevPtr> {
        self.0.take(size, lane, |_| true)
    }
    fn grow(&mut self, size: u64, up: &dyn Upstream) -> Result<DevPtr, CUresult> {
        let p = up.alloc(size)?;
        self.0.insert(p, size);
        Ok(p)
    }
    segment_cache_core!();
}

/// `binned`: requests fall into power-of-two classes (at least [`MIN_BLOCK`]); a cached block
/// serves any request of its class that it is large enough for. Without a limit every block is
/// a segment of its class's full size, so any block serves any request of its class. Under a
/// limit a segment is exactly the request, so that rounding never costs the program memory it
/// asked for (SPEC.md).
#[derive(Default)]
pub struct BinnedCore(SegmentCache);

impl BinnedCore {
    fn class(size: u64) -> u64 {
        size.max(MIN_BLOCK).next_power_of_two()
    }
    fn key_of(&self, ptr: DevPtr) -> u64 {
        Self::class(self.0.size(ptr))
    }
}

impl Core for BinnedCore {
    fn kind(&self) -> PoolKind {
        PoolKind::Binned
    }
    fn round(&self, size: u64) -> u64 {
        Self::class(size)
    }
    fn take(&mut self, size: u64, lane: Lane, _limit: u64) -> Option<DevPtr> {
        self.0.take(Self::class(size), lane, |block| block >= size)
    }
    fn grow(&mut self, size: u64, up: &dyn Upstream) -> Result<DevPtr, CUresult> {
        let sizes: &[u64] = if up.headroom() == u64::MAX {
            &[Self::class(size), size]
        } else {
            &[size]
        };
        let (p, got) = segment(up, sizes)?;
        self.0.insert(p, got);
        Ok(p)
    }
    segment_cache_core!();
}

// ---- split: best fit with splitting and coalescing ----------------------------------------

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
    fn take_within(&mut self, size: u64, lane: Lane, limit: u64, waste: u64) -> Option<DevPtr> {
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
        let rest = found - r;
        let worth_splitting = if small {
            rest >= MIN_BLOCK
        } else {
            rest > SMALL_REQUEST
        };
        let b = self.unmark_free(ptr);
        if worth_splitting && b.size < MAX_SPLIT {
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
        } else {
            self.blocks.insert(ptr, Block { free: false, ..b });
        }
        Some(ptr)
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

    fn take(&mut self, size: u64, lane: Lane, limit: u64) -> Option<DevPtr> {
        self.take_within(size, lane, limit, u64::MAX)
    }

    fn take_close(&mut self, size: u64, lane: Lane, limit: u64) -> Option<DevPtr> {
        let r = self.round(size);
        // Small requests come from small segments, where any piece serves.
        let waste = if r <= SMALL_REQUEST {
            u64::MAX
        } else {
            (r / CLOSE_FIT).max(SMALL_REQUEST)
        };
        self.take_within(size, lane, limit, waste)
    }

    fn grow(&mut self, size: u64, up: &dyn Upstream) -> Result<DevPtr, CUresult> {
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

/// The core of `kind` (`none` has no core: it never caches).
pub fn new_core(kind: PoolKind) -> Option<Box<dyn Core>> {
    match kind {
        PoolKind::Split => Some(Box::new(SplitCore::default())),
        PoolKind::Binned => Some(Box::new(BinnedCore::default())),
        PoolKind::Simple => Some(Box::new(SimpleCore::default())),
        PoolKind::None => None,
    }
}
