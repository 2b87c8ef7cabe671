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

mod handles;

use crate::base::addr_hash::AddrMap as HashMap;
use crate::base::cu::*;
use crate::base::host_copy::HostCopy;
use crate::base::sync::lock;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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
/// Invariant: awake, its size is charged while `refs > 0` (creation and every
/// `cuMemRetainAllocationHandle`, minus releases) or `maps > 0` (mappings not yet unmapped).
/// Asleep (`asleep` set), nothing of it is charged nor in the driver: the driver's handle is
/// released, no value of the driver's stands for it, and its mappings are the record's, not in
/// the maps table (`maps` of them).
pub(super) struct Phys {
    pub(super) device: CUdevice,
    pub(super) size: u64,
    pub(super) refs: u32,
    pub(super) maps: u32,
    /// The program's properties for it, to make it again after a sleep (`None`: not kept).
    pub(super) prop: Option<PropBytes>,
    /// Shared outside the process's own mappings (exported, bound to a multicast object, or
    /// handed out as a dma-buf): it never sleeps.
    pub(super) shared: bool,
    /// Put to sleep: where it was mapped and its bytes on the host (`state::sleep`'s foreign
    /// handles); `None` while awake.
    pub(super) asleep: Option<Box<ProgramAsleep>>,
}

impl Phys {
    /// A handle the program just made.
    pub(super) fn made(device: CUdevice, size: u64, prop: PropBytes) -> Phys {
        Phys {
            device,
            size,
            refs: 1,
            maps: 0,
            prop: Some(prop),
            shared: false,
            asleep: None,
        }
    }
}

/// A program's handle asleep: made again at the wake with the program's properties, mapped
/// where it was with the access it had.
pub(super) struct ProgramAsleep {
    /// Its mappings (address, bytes, offset in the handle, access: device and flags), their
    /// bytes in `host` one after the other.
    pub(super) maps: Vec<AsleepMap>,
    pub(super) host: HostCopy,
}

/// One mapping of an asleep handle of the program's.
pub(super) struct AsleepMap {
    pub(super) at: DevPtr,
    pub(super) bytes: u64,
    pub(super) offset: u64,
    pub(super) access: Vec<(CUdevice, std::ffi::c_int)>,
}

/// One mapping of a counted handle: `bytes` of `handle` (the program's value) from `offset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct VmMap {
    pub(super) bytes: u64,
    pub(super) offset: u64,
    pub(super) handle: MemHandle,
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
        // An asleep handle's mappings are its record's, not the table's.
        let mut out: Vec<_> = crate::base::sync::lock(&self.maps)
            .iter()
            .filter(|(_, m)| handles.get(&m.handle).is_some_and(|p| p.device == dev))
            .map(|(&va, m)| ("vmm", va, m.bytes))
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
    /// By the program's value for each handle (see `aliases`).
    pub(super) handles: Mutex<HashMap<MemHandle, Phys>>,
    /// Mappings of counted handles, by address.
    pub(super) maps: Mutex<BTreeMap<DevPtr, VmMap>>,
    pub(super) arrays: Mutex<HashMap<usize, ArrayRec>>,
    /// The program's handle values that are not the driver's: a handle woken from sleep is
    /// the driver's new one behind the value the program holds, and a value the driver hands
    /// out again while the program holds it for another handle is given to the program as one
    /// of [`SYNTHETIC`]'s. Empty until the first such wake.
    aliases: Mutex<Aliases>,
    /// Whether `aliases` was ever written (until then no handle is looked up).
    remapped: AtomicBool,
}

/// The program's handle values that are not the driver's, kept both ways.
///
/// Invariant: `to_driver` and `to_program` are each other's inverse (one driver value per
/// program value and back).
#[derive(Default)]
struct Aliases {
    to_driver: HashMap<MemHandle, MemHandle>,
    to_program: HashMap<MemHandle, MemHandle>,
}

impl Aliases {
    fn insert(&mut self, program: MemHandle, driver: MemHandle) {
        self.remove(program);
        if let Some(old) = self.to_program.insert(driver, program) {
            self.to_driver.remove(&old);
        }
        self.to_driver.insert(program, driver);
    }

    fn remove(&mut self, program: MemHandle) {
        if let Some(d) = self.to_driver.remove(&program) {
            self.to_program.remove(&d);
        }
    }
}

/// Handle values the program gets instead of a driver value it already holds for another
/// handle: above every user-space address and small index, so no driver value is one of them.
const SYNTHETIC: u64 = 0xFFFF_8000_0000_0000;
static NEXT_SYNTHETIC: AtomicU64 = AtomicU64::new(SYNTHETIC);

impl Counted {
    /// The driver's handle behind the program's value `h`.
    pub fn real(&self, h: MemHandle) -> MemHandle {
        if !self.remapped.load(Ordering::Acquire) {
            return h;
        }
        lock(&self.aliases).to_driver.get(&h).copied().unwrap_or(h)
    }

    /// The program's value for the driver's handle `r`, which the driver just handed out
    /// (made, imported, or retained again): the value the program already holds for it, else
    /// `r` itself, unless the program holds `r` for another handle (a synthetic value then).
    pub fn program_value(&self, r: MemHandle) -> MemHandle {
        if !self.remapped.load(Ordering::Acquire) {
            return r;
        }
        let mut a = lock(&self.aliases);
        if let Some(&k) = a.to_program.get(&r) {
            return k;
        }
        if a.to_driver.contains_key(&r) {
            let s = NEXT_SYNTHETIC.fetch_add(1, Ordering::Relaxed);
            a.insert(s, r);
            return s;
        }
        r
    }

    /// Whether any program value differs from the driver's.
    pub fn remapped(&self) -> bool {
        self.remapped.load(Ordering::Acquire)
    }

    /// A value of the program's own for the driver's handle `r`: a synthetic one (the program
    /// holds `r` for a handle asleep, whose driver handle the sleep released).
    pub(super) fn synthetic_for(&self, r: MemHandle) -> MemHandle {
        let s = NEXT_SYNTHETIC.fetch_add(1, Ordering::Relaxed);
        self.alias(s, r);
        s
    }

    /// The program's value `h` is the driver's `real` from now on.
    pub(super) fn alias(&self, h: MemHandle, real: MemHandle) {
        let mut a = lock(&self.aliases);
        if h == real {
            a.remove(h);
        } else {
            self.remapped.store(true, Ordering::Release);
            a.insert(h, real);
        }
    }

    /// The program's value `h` names no handle any more.
    pub(super) fn unalias(&self, h: MemHandle) {
        if self.remapped.load(Ordering::Acquire) {
            lock(&self.aliases).remove(h);
        }
    }
}
