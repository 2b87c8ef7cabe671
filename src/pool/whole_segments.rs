//! The kinds whose every block is a whole segment: `simple` (exact sizes) and `binned`
//! (power-of-two classes), over one segment cache.

use super::core::{pick_releases, segment, within, Core, Forgotten, Lane, MIN_BLOCK, READY};
use super::handed::Taken;
use super::types::{BlockSpan, BlockState, BlockView, SegmentView, Upstream};
use crate::base::addr_hash::AddrMap as HashMap;
use crate::base::config::PoolKind;
use crate::base::cu::{CUresult, DevPtr};
use crate::base::limit::Limit;
use std::collections::BTreeMap;

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
    fn take(&mut self, key: u64, lane: Lane, fits: impl Fn(u64) -> bool) -> Option<Taken> {
        for l in [lane, READY] {
            let Some(list) = self.free.get_mut(&(l, key)) else {
                continue;
            };
            if let Some(i) = list.iter().rposition(|p| fits(self.sizes[p])) {
                let ptr = list.swap_remove(i);
                let size = self.sizes[&ptr];
                self.cached -= size;
                self.lanes.remove(&ptr);
                return Some(Taken { ptr, size });
            }
        }
        None
    }

    /// A new segment, handed out whole.
    fn insert(&mut self, ptr: DevPtr, size: u64) -> Taken {
        self.sizes.insert(ptr, size);
        self.reserved += size;
        Taken { ptr, size }
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

    /// A segment is one block: it is the answer unless it is cached.
    fn block_of(&self, ptr: DevPtr) -> Option<BlockSpan> {
        let (&start, &size) = self.sizes.range(..=ptr).next_back()?;
        let cached = |p: DevPtr| self.free.values().any(|list| list.contains(&p));
        (ptr < start + size && !cached(start)).then_some(BlockSpan {
            ptr: start,
            size,
            segment: start,
            expandable: false,
        })
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

    /// The invariant written on the struct, with `key` the kind's key of a size.
    fn check(&self, key: impl Fn(u64) -> u64) -> Result<(), String> {
        for ((&p, &size), (&q, _)) in self.sizes.iter().zip(self.sizes.iter().skip(1)) {
            if p + size > q {
                return Err(format!("segments {p:#x} and {q:#x} overlap"));
            }
        }
        let mut cached = 0u64;
        let mut listed = std::collections::HashSet::new();
        for (&(lane, k), list) in &self.free {
            for p in list {
                let Some(&size) = self.sizes.get(p) else {
                    return Err(format!("cached {p:#x} is no segment"));
                };
                if key(size) != k || !listed.insert(*p) {
                    return Err(format!("cached {p:#x} listed under key {k} or twice"));
                }
                let pending = self.lanes.get(p).map(|&(l, _)| l);
                if pending != (lane != READY).then_some(lane) {
                    return Err(format!(
                        "cached {p:#x} of lane {lane} recorded as {pending:?}"
                    ));
                }
                cached += size;
            }
        }
        if self.lanes.len() != self.lanes.keys().filter(|p| listed.contains(p)).count() {
            return Err("a pending lane recorded for a block not cached".into());
        }
        let reserved: u64 = self.sizes.values().sum();
        if (cached, reserved) != (self.cached, self.reserved) {
            return Err(format!(
                "cached {} reserved {}, but the segments hold {cached} and {reserved}",
                self.cached, self.reserved
            ));
        }
        Ok(())
    }

    fn forget(&mut self) -> Forgotten {
        let r = Forgotten {
            segments: self.sizes.len() as u64,
            bytes: self.reserved,
            arena: None,
        };
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
                expandable: false,
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
        fn block_of(&self, ptr: DevPtr) -> Option<BlockSpan> {
            self.0.block_of(ptr)
        }
        fn segments(&self) -> Vec<SegmentView> {
            self.0.segments()
        }
        fn release_free_segments(&mut self, up: &dyn Upstream, need: u64, _unmap: bool) -> u64 {
            self.0.release(up, need)
        }
        fn cached(&self) -> u64 {
            self.0.cached
        }
        fn reserved(&self) -> u64 {
            self.0.reserved
        }
        fn forget(&mut self) -> Forgotten {
            self.0.forget()
        }
        fn check(&self) -> Result<(), String> {
            self.0.check(|size| Self::key_of_size(size))
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
    fn key_of_size(size: u64) -> u64 {
        size
    }
    fn key_of(&self, ptr: DevPtr) -> u64 {
        Self::key_of_size(self.0.size(ptr))
    }
}

impl Core for SimpleCore {
    fn kind(&self) -> PoolKind {
        PoolKind::Simple
    }
    fn round(&self, size: u64) -> u64 {
        size
    }
    fn take(&mut self, size: u64, lane: Lane, _limit: Limit) -> Option<Taken> {
        self.0.take(size, lane, |_| true)
    }
    fn grow(&mut self, size: u64, up: &dyn Upstream) -> Result<Taken, CUresult> {
        let p = up.alloc(size)?;
        Ok(self.0.insert(p, size))
    }
    segment_cache_core!();
}

/// `binned`: requests fall into power-of-two classes (at least [`MIN_BLOCK`]); a cached block
/// serves any request of its class that it is large enough for. Without a limit every block is
/// a segment of its class's full size, so any block serves any request of its class. Under a
/// limit a segment is exactly the request, so that rounding never costs the program memory it
/// asked for (the contract, docs/design.md).
#[derive(Default)]
pub struct BinnedCore(SegmentCache);

impl BinnedCore {
    fn class(size: u64) -> u64 {
        size.max(MIN_BLOCK).next_power_of_two()
    }
    fn key_of_size(size: u64) -> u64 {
        Self::class(size)
    }
    fn key_of(&self, ptr: DevPtr) -> u64 {
        Self::key_of_size(self.0.size(ptr))
    }
}

impl Core for BinnedCore {
    fn kind(&self) -> PoolKind {
        PoolKind::Binned
    }
    fn round(&self, size: u64) -> u64 {
        Self::class(size)
    }
    fn take(&mut self, size: u64, lane: Lane, _limit: Limit) -> Option<Taken> {
        self.0.take(Self::class(size), lane, |block| block >= size)
    }
    fn grow(&mut self, size: u64, up: &dyn Upstream) -> Result<Taken, CUresult> {
        let sizes: &[u64] = if up.limit().is_none() {
            &[Self::class(size), size]
        } else {
            &[size]
        };
        let (p, got) = segment(up, sizes)?;
        Ok(self.0.insert(p, got))
    }
    segment_cache_core!();
}
