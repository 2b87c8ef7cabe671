//! The caches of the pool kinds, with *immediate* reuse: a block put back is at once a candidate
//! for the next request. Whether a freed block may be put back yet (device work may still touch
//! it) is decided one level up, in [`super::reuse`]. Not thread-safe by themselves: the
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

/// One pool kind's cache of free blocks and the segments behind them.
pub trait Core: Send {
    fn kind(&self) -> PoolKind;
    /// What a request of `size` is rounded to (the key blocks are matched by).
    fn round(&self, size: u64) -> u64;
    /// A cached block for `size`, if one fits. `headroom` is what the upstream could still
    /// grant ([`Upstream::headroom`]): a kind may decline a fit that would strand memory while
    /// a new segment is still affordable.
    fn take(&mut self, size: u64, headroom: u64) -> Option<DevPtr>;
    /// Gets a new segment from `up` able to serve `size` and takes a block from it.
    fn grow(&mut self, size: u64, up: &dyn Upstream) -> Result<DevPtr, CUresult>;
    /// Puts back a block handed out by `take` or `grow`: reusable at once.
    fn put(&mut self, ptr: DevPtr);
    /// The size of the block at `ptr` (handed out, not yet put back).
    fn block_size(&self, ptr: DevPtr) -> u64;
    /// Whether `ptr` lies inside a segment this core holds.
    fn owns(&self, ptr: DevPtr) -> bool;
    /// Every segment and its blocks; blocks not free in the core show as in use.
    fn segments(&self) -> Vec<SegmentView>;
    /// Gives every segment with no block in use back to `up`; returns the bytes released.
    fn release_free_segments(&mut self, up: &dyn Upstream) -> u64;
    /// Bytes in free blocks.
    fn cached(&self) -> u64;
    /// Forgets everything without calling the upstream; returns (segments, bytes) held.
    fn forget(&mut self) -> (u64, u64);
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
/// the cached ones, under their key; `cached` is the sum of their sizes.
#[derive(Default)]
struct SegmentCache {
    sizes: BTreeMap<DevPtr, u64>,
    free: HashMap<u64, Vec<DevPtr>>,
    cached: u64,
}

impl SegmentCache {
    /// The most recently cached block under `key` that `fits`.
    fn take(&mut self, key: u64, fits: impl Fn(u64) -> bool) -> Option<DevPtr> {
        let list = self.free.get_mut(&key)?;
        let i = list.iter().rposition(|p| fits(self.sizes[p]))?;
        let p = list.swap_remove(i);
        self.cached -= self.sizes[&p];
        Some(p)
    }

    fn insert(&mut self, ptr: DevPtr, size: u64) {
        self.sizes.insert(ptr, size);
    }

    fn put(&mut self, ptr: DevPtr, key: u64) {
        self.free.entry(key).or_default().push(ptr);
        self.cached += self.sizes[&ptr];
    }

    fn size(&self, ptr: DevPtr) -> u64 {
        self.sizes[&ptr]
    }

    fn owns(&self, ptr: DevPtr) -> bool {
        within(&self.sizes, ptr, |&s| s)
    }

    /// Gives every cached segment back; one the upstream refuses stays cached.
    fn release_all(&mut self, up: &dyn Upstream) -> u64 {
        let mut released = 0;
        for list in self.free.values_mut() {
            list.retain(|&p| {
                let size = self.sizes[&p];
                let gone = up.free(p, size).is_ok();
                if gone {
                    self.sizes.remove(&p);
                    self.cached -= size;
                    released += size;
                }
                !gone
            });
        }
        released
    }

    fn forget(&mut self) -> (u64, u64) {
        let r = (self.sizes.len() as u64, self.sizes.values().sum());
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
                    state: if free.contains(&ptr) {
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
        fn release_free_segments(&mut self, up: &dyn Upstream) -> u64 {
            self.0.release_all(up)
        }
        fn cached(&self) -> u64 {
            self.0.cached
        }
        fn forget(&mut self) -> (u64, u64) {
            self.0.forget()
        }
    };
}

/// `simple`: every block is a segment of exactly the requested size; a request is served only
/// by a cached block of the same size.
#[derive(Default)]
pub struct SimpleCore(SegmentCache);

impl Core for SimpleCore {
    fn kind(&self) -> PoolKind {
        PoolKind::Simple
    }
    fn round(&self, size: u64) -> u64 {
        size
    }
    fn take(&mut self, size: u64, _headroom: u64) -> Option<DevPtr> {
        self.0.take(size, |_| true)
    }
    fn grow(&mut self, size: u64, up: &dyn Upstream) -> Result<DevPtr, CUresult> {
        let p = up.alloc(size)?;
        self.0.insert(p, size);
        Ok(p)
    }
    fn put(&mut self, ptr: DevPtr) {
        let size = self.0.size(ptr);
        self.0.put(ptr, size);
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
}

impl Core for BinnedCore {
    fn kind(&self) -> PoolKind {
        PoolKind::Binned
    }
    fn round(&self, size: u64) -> u64 {
        Self::class(size)
    }
    fn take(&mut self, size: u64, _headroom: u64) -> Option<DevPtr> {
        self.0.take(Self::class(size), |block| block >= size)
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
    fn put(&mut self, ptr: DevPtr) {
        let class = Self::class(self.0.size(ptr));
        self.0.put(ptr, class);
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
/// requests within [`OVERSIZE_SLACK`] of their size.
pub const MAX_SPLIT: u64 = 256 * MIB;
pub const OVERSIZE_SLACK: u64 = 20 * MIB;
/// Large segments are rounded to this.
pub const LARGE_ROUND: u64 = 2 * MIB;

#[derive(Clone, Copy, Debug)]
struct Block {
    segment: DevPtr,
    size: u64,
    free: bool,
}

#[derive(Clone, Copy, Debug)]
struct Segment {
    size: u64,
    small: bool,
}

/// `split`: best fit over free blocks, splitting a block when the rest is worth keeping,
/// coalescing free neighbours within a segment; small and large requests live in separate
/// segments.
///
/// Invariants: the blocks of a segment tile it exactly (`blocks` holds every block of every
/// segment, keyed by address); two free blocks are never neighbours in one segment (they are
/// merged); `free[small as usize]` holds exactly the free blocks of small (large) segments as
/// (size, address); `cached` is the sum of their sizes.
#[derive(Default)]
pub struct SplitCore {
    blocks: BTreeMap<DevPtr, Block>,
    free: [BTreeSet<(u64, DevPtr)>; 2],
    segments: HashMap<DevPtr, Segment>,
    cached: u64,
}

impl SplitCore {
    fn set(small: bool) -> usize {
        small as usize
    }

    fn mark_free(&mut self, ptr: DevPtr, b: Block) {
        let small = self.segments[&b.segment].small;
        self.blocks.insert(ptr, Block { free: true, ..b });
        self.free[Self::set(small)].insert((b.size, ptr));
        self.cached += b.size;
    }

    fn unmark_free(&mut self, ptr: DevPtr) -> Block {
        let b = self.blocks[&ptr];
        debug_assert!(b.free);
        let small = self.segments[&b.segment].small;
        self.free[Self::set(small)].remove(&(b.size, ptr));
        self.cached -= b.size;
        b
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
}

impl Core for SplitCore {
    fn kind(&self) -> PoolKind {
        PoolKind::Split
    }

    fn round(&self, size: u64) -> u64 {
        round_up(size.max(1), MIN_BLOCK)
    }

    fn take(&mut self, size: u64, headroom: u64) -> Option<DevPtr> {
        let r = self.round(size);
        let small = r <= SMALL_REQUEST;
        let &(found, ptr) = self.free[Self::set(small)].range((r, 0)..).next()?;
        if found >= MAX_SPLIT && (r < MAX_SPLIT || found - r > OVERSIZE_SLACK) {
            // The smallest fit is an oversize block that this request may not take.
            return None;
        }
        let rest = found - r;
        let worth_splitting = if small {
            rest >= MIN_BLOCK
        } else {
            rest > SMALL_REQUEST
        };
        let whole_segment = self.segments.get(&ptr).is_some_and(|seg| seg.size == found);
        if !small && worth_splitting && found < MAX_SPLIT && whole_segment && headroom != u64::MAX {
            // Under a limit, splitting a whole free segment would strand its rest next to a
            // live block, where no reclaim can give it back. Decline: a new segment serves the
            // request, or, near the limit, the reclaim before an OOM releases this one whole
            // and the retry gets a segment that fits. (A tail of a segment already in use is
            // stranded either way: splitting it costs nothing.)
            return None;
        }
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
            self.mark_free(
                ptr + r,
                Block {
                    segment: b.segment,
                    size: rest,
                    free: true,
                },
            );
        } else {
            self.blocks.insert(ptr, Block { free: false, ..b });
        }
        Some(ptr)
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
        self.mark_free(
            seg,
            Block {
                segment: seg,
                size: got,
                free: true,
            },
        );
        // The new block fits, so this cannot miss.
        Ok(self
            .take(size, u64::MAX)
            .expect("a fresh segment serves the request"))
    }

    fn put(&mut self, ptr: DevPtr) {
        let mut b = self.blocks[&ptr];
        debug_assert!(!b.free, "double put of {ptr:#x}");
        let mut start = ptr;
        // Merge with the next block of the same segment.
        let next = ptr + b.size;
        if let Some(&n) = self.blocks.get(&next) {
            if n.free && n.segment == b.segment {
                self.unmark_free(next);
                self.blocks.remove(&next);
                b.size += n.size;
            }
        }
        // And with the previous one.
        if let Some((&pp, &p)) = self.blocks.range(..ptr).next_back() {
            if p.free && p.segment == b.segment && pp + p.size == ptr {
                self.unmark_free(pp);
                self.blocks.remove(&ptr);
                b.size += p.size;
                start = pp;
            }
        }
        self.mark_free(start, b);
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
                        state: if b.free {
                            BlockState::Free
                        } else {
                            BlockState::InUse
                        },
                    })
                    .collect(),
            })
            .collect();
        out.sort_by_key(|s| s.ptr);
        out
    }

    fn release_free_segments(&mut self, up: &dyn Upstream) -> u64 {
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
        for (s, size) in whole {
            if up.free(s, size).is_ok() {
                self.unmark_free(s);
                self.blocks.remove(&s);
                self.segments.remove(&s);
                released += size;
            }
        }
        released
    }

    fn cached(&self) -> u64 {
        self.cached
    }

    fn forget(&mut self) -> (u64, u64) {
        let r = (
            self.segments.len() as u64,
            self.segments.values().map(|s| s.size).sum(),
        );
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
