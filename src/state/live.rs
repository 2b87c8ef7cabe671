//! The live table: every allocation the program holds through cudapool, pooled or counted,
//! and (under `CUDAPOOL_TRACK=2`) where each was made.
//!
//! Uses: `addr_hash`, `per_thread`, `cu`.

use crate::addr_hash::AddrBuild;
use crate::budget::Bytes;
use crate::cu::*;
use crate::per_thread::LineId;
use dashmap::DashMap;
use std::backtrace::Backtrace;
use std::sync::Arc;

/// How an allocation reached the driver; decides how its free goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// A block of the context's pool.
    Pool,
    /// Passed through to the driver and counted; the program's free goes to the driver.
    Counted,
    /// From a driver memory pool (`cuMemAllocFromPoolAsync`, the pool's handle): its free goes
    /// to the driver, and the pool's reserved memory is what is charged (see `counted`).
    DriverPool(usize),
}

/// One allocation the program holds. Keyed by its address in the [`LiveTable`].
#[derive(Clone, Copy, Debug)]
pub struct Live {
    /// `CUcontext` it was made in, as an address.
    pub ctx: usize,
    pub device: CUdevice,
    /// What the program asked for (pooled), or the driver's real footprint (counted).
    pub size: u64,
    /// What the program holds: the pool's block (its [`Grant`](crate::pool::Grant) size, at
    /// least `size`), or `size` itself (counted).
    pub handed: u64,
    pub origin: Origin,
    /// The budget line that holds its bytes (the allocating thread's), credited at its free.
    pub holder: LineId,
}

impl Live {
    /// Its bytes as the budget counts them.
    pub fn bytes(&self) -> Bytes {
        Bytes {
            asked: self.size,
            handed: self.handed,
        }
    }
}

/// Invariant: `live` holds exactly the allocations handed to the program and not yet freed,
/// with the size the program asked for (pooled) or the driver's real footprint (counted);
/// `backtraces` holds an entry for some of them (`track >= 2`), never for anything else.
pub struct LiveTable {
    live: DashMap<DevPtr, Live, AddrBuild>,
    backtraces: DashMap<DevPtr, Arc<Backtrace>, AddrBuild>,
    /// `CUDAPOOL_TRACK`.
    track: u8,
}

/// Shards of the live table (a lock each, on its own cache line: 64 KiB in all). With DashMap's
/// default of 4 per core, 16 threads each reusing its own block landed two on one shard about
/// nine times in ten; with 512, about one time in five.
const LIVE_SHARDS: usize = 512;

impl LiveTable {
    pub fn new(track: u8) -> Self {
        LiveTable {
            live: DashMap::with_hasher_and_shard_amount(AddrBuild::default(), LIVE_SHARDS),
            backtraces: DashMap::with_hasher(AddrBuild::default()),
            track,
        }
    }

    /// Enters a new live allocation (and its backtrace under `CUDAPOOL_TRACK=2`: 5-9 µs).
    pub fn insert(&self, ptr: DevPtr, live: Live) {
        self.live.insert(ptr, live);
        if self.track >= 2 {
            self.backtraces
                .insert(ptr, Arc::new(Backtrace::force_capture()));
        }
    }

    /// The live allocation at exactly `ptr`, if any.
    pub fn get(&self, ptr: DevPtr) -> Option<Live> {
        self.live.get(&ptr).map(|l| *l)
    }

    /// Where the live allocation at `ptr` was made (under `CUDAPOOL_TRACK=2`).
    pub fn backtrace(&self, ptr: DevPtr) -> Option<Arc<Backtrace>> {
        self.backtraces.get(&ptr).map(|b| b.clone())
    }

    /// Takes `ptr` out of the table (its free is under way); its backtrace stays until
    /// [`freed`](Self::freed) or [`undo_remove`](Self::undo_remove).
    pub fn remove(&self, ptr: DevPtr) -> Option<Live> {
        self.live.remove(&ptr).map(|(_, l)| l)
    }

    /// The free of a removed allocation succeeded.
    pub fn freed(&self, ptr: DevPtr) {
        if self.track >= 2 {
            self.backtraces.remove(&ptr);
        }
    }

    /// The free of a removed allocation failed: the program still holds it.
    pub fn undo_remove(&self, ptr: DevPtr, live: Live) {
        self.live.insert(ptr, live);
    }

    /// Drops every allocation of context `ctx`, calling `dropped` for each.
    pub fn drop_context(&self, ctx: usize, mut dropped: impl FnMut(&Live)) {
        self.live.retain(|k, l| {
            if l.ctx != ctx {
                return true;
            }
            dropped(l);
            self.backtraces.remove(k);
            false
        });
    }

    /// Bytes of live allocations from the driver pool `pool`.
    pub fn bytes_of_driver_pool(&self, pool: usize) -> u64 {
        self.live
            .iter()
            .filter(|e| e.origin == Origin::DriverPool(pool))
            .map(|e| e.size)
            .sum()
    }

    /// Every live allocation (address, what is known of it, its backtrace when tracked), by
    /// address.
    pub fn all(&self) -> Vec<(DevPtr, Live, Option<Arc<Backtrace>>)> {
        let mut v: Vec<_> = self
            .live
            .iter()
            .map(|e| {
                let bt = self.backtraces.get(e.key()).map(|b| b.clone());
                (*e.key(), *e.value(), bt)
            })
            .collect();
        v.sort_by_key(|e| e.0);
        v
    }
}
