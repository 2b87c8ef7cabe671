//! The tables of device memory the shim does not pool but passes through to the driver and
//! counts, so that no allocation API is a hole in the limit (docs/design.md, trap 4); the
//! accounting itself is `counting`:
//! - driver memory pools (`cuMemAllocFromPoolAsync`): what the pool *reserves* is charged,
//!   read from the driver after every call that can change it;
//! - physical memory of the virtual memory API (`cuMemCreate`): charged from creation until it
//!   is both released and unmapped everywhere, as the driver frees it;
//! - arrays and mipmapped arrays: charged at their real footprint, asked of the driver.
//!
//! Pointer-shaped pass-through allocations (managed, pitched, legacy, captured) live in the live
//! table instead (`Origin::Counted`, `Origin::DriverPool`), entered by
//! [`Shim::alloc_counted`]. Host memory is never counted.

use crate::base::addr_hash::AddrMap as HashMap;
use crate::base::cu::*;
use std::collections::BTreeMap;
use std::sync::Mutex;

/// One driver pool the program allocated from.
///
/// Invariant: `charged` bytes of this pool are in the device's budget: the pool's reserved
/// memory when last read (or, once destroyed, what its live allocations still hold).
pub(super) struct DriverPool {
    /// `None`: the pool lives in host memory and is not counted.
    pub(super) device: Option<CUdevice>,
    pub(super) charged: u64,
    /// Destroyed by the program while allocations of it were live (the driver defers that).
    pub(super) destroyed: bool,
}

/// Physical memory from `cuMemCreate`.
///
/// Invariant: its size is charged while `refs > 0` (creation and every
/// `cuMemRetainAllocationHandle`, minus releases) or `maps > 0` (mappings not yet unmapped).
pub(super) struct Phys {
    pub(super) device: CUdevice,
    pub(super) size: u64,
    pub(super) refs: u32,
    pub(super) maps: u32,
}

/// An array or mipmapped array, charged at `size` until destroyed or its context dies.
pub(super) struct ArrayRec {
    pub(super) ctx: usize,
    pub(super) device: CUdevice,
    pub(super) size: u64,
}

impl Counted {
    /// Virtual-memory mappings and arrays on `dev`: (kind, address, bytes).
    pub fn memory_on(&self, dev: CUdevice) -> Vec<(&'static str, DevPtr, u64)> {
        let handles = crate::base::sync::lock(&self.handles);
        let mut out: Vec<_> = crate::base::sync::lock(&self.maps)
            .iter()
            .filter(|(_, (_, h))| handles.get(h).is_some_and(|p| p.device == dev))
            .map(|(&va, &(bytes, _))| ("vmm", va, bytes))
            .collect();
        drop(handles);
        out.extend(
            crate::base::sync::lock(&self.arrays)
                .iter()
                .filter(|(_, a)| a.device == dev)
                .map(|(&h, a)| ("array", h as DevPtr, a.size)),
        );
        out
    }
}

/// The counted objects of the process, each table behind its own lock (none of them is on a
/// hot path: each of these driver calls costs microseconds).
#[derive(Default)]
pub struct Counted {
    pub(super) pools: Mutex<HashMap<usize, DriverPool>>,
    pub(super) handles: Mutex<HashMap<MemHandle, Phys>>,
    /// Mappings of counted handles: address -> (bytes, handle).
    pub(super) maps: Mutex<BTreeMap<DevPtr, (u64, MemHandle)>>,
    pub(super) arrays: Mutex<HashMap<usize, ArrayRec>>,
}
