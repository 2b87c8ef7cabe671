//! NVIDIA's tools see each pooled block as an allocation of its own, through the NVTX memory
//! API (docs/design.md, trap 8): a pool segment is a sub-allocator heap, each block the program holds
//! is a region in it (named by the API that made it and its size), and a freed block, waiting
//! for its fence or cached, is no region. compute-sanitizer's memcheck then reports accesses
//! outside the regions of a heap (past a block, after its free), and initcheck's
//! `--track-unused-memory` stops counting the unused rest of a segment.
//!
//! The calls go through NVIDIA's header-only NVTX v3 (`src/nvtx_mem.c`, headers vendored in
//! `third_party/nvtx3`), whose loader attaches the tool the process was started under
//! (`NVTX_INJECTION64_PATH`, which compute-sanitizer sets). Without that variable at start,
//! [`active`] is false and nothing here is ever called: the cost is one relaxed load.

use crate::base::addr_hash::AddrMap as HashMap;
use crate::base::cu::DevPtr;
use crate::base::sync::lock;
use std::ffi::{c_char, c_void, CString};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Mutex, OnceLock};

extern "C" {
    fn cudapool_nvtx_init();
    fn cudapool_nvtx_heap_register(ptr: u64, size: u64) -> *mut c_void;
    fn cudapool_nvtx_heap_unregister(heap: *mut c_void);
    fn cudapool_nvtx_region_register(heap: *mut c_void, ptr: u64, size: u64, name: *const c_char);
    fn cudapool_nvtx_region_unregister(ptr: u64);
}

static ACTIVE: AtomicBool = AtomicBool::new(false);

/// Each registered segment's heap handle (an address), by the segment's address.
///
/// Invariant: holds exactly the segments registered and not yet unregistered, each once.
fn heaps() -> &'static Mutex<HashMap<DevPtr, usize>> {
    static HEAPS: OnceLock<Mutex<HashMap<DevPtr, usize>>> = OnceLock::new();
    HEAPS.get_or_init(Default::default)
}

/// Each registered region (a block the program holds), by address, with the heap it lies in.
///
/// Invariant: holds exactly the regions registered, not unregistered, in heaps still
/// registered. Blocks of expandable segments have no heap and no region: memcheck sees their
/// mapped memory as the driver's own allocations.
fn regions() -> &'static Mutex<HashMap<DevPtr, usize>> {
    static REGIONS: OnceLock<Mutex<HashMap<DevPtr, usize>>> = OnceLock::new();
    REGIONS.get_or_init(Default::default)
}

/// Whether a tool may be listening (decided once, at load).
#[inline]
pub fn active() -> bool {
    ACTIVE.load(Relaxed)
}

/// At load: NVTX is used only when the process was started under a tool.
pub fn init() {
    if std::env::var_os("NVTX_INJECTION64_PATH").is_some() {
        ACTIVE.store(true, Relaxed);
    }
}

fn ensure_domain() {
    static DOMAIN: OnceLock<()> = OnceLock::new();
    // SAFETY: no arguments; NVTX's own loader runs once inside.
    DOMAIN.get_or_init(|| unsafe { cudapool_nvtx_init() });
}

/// A new segment from the driver.
pub fn segment_added(ptr: DevPtr, size: u64) {
    ensure_domain();
    // SAFETY: plain values; the tool only records the range.
    let heap = unsafe { cudapool_nvtx_heap_register(ptr, size) };
    if !heap.is_null() {
        lock(heaps()).insert(ptr, heap as usize);
    }
}

/// A segment goes back to the driver (or died with its context): its heap and regions go.
pub fn segment_removed(ptr: DevPtr) {
    let Some(heap) = lock(heaps()).remove(&ptr) else {
        return;
    };
    lock(regions()).retain(|_, h| *h != heap);
    // SAFETY: a handle the tool gave for this segment, unregistered once (removed above).
    unsafe { cudapool_nvtx_heap_unregister(heap as *mut c_void) };
}

/// The program now holds `size` bytes at `ptr`, inside the segment at `segment`; `name` says
/// what made it.
pub fn block_held(ptr: DevPtr, size: u64, segment: DevPtr, name: &str) {
    let Some(heap) = lock(heaps()).get(&segment).copied() else {
        return;
    };
    let name = CString::new(name).ok();
    let name_ptr = name.as_ref().map_or(std::ptr::null(), |n| n.as_ptr());
    // SAFETY: the segment's live heap handle; the name outlives the call.
    unsafe { cudapool_nvtx_region_register(heap as *mut c_void, ptr, size, name_ptr) };
    lock(regions()).insert(ptr, heap);
}

/// The program freed the block at `ptr` (a block with no region is no news to the tool).
pub fn block_released(ptr: DevPtr) {
    if lock(regions()).remove(&ptr).is_none() {
        return;
    }
    // SAFETY: a plain address; the tool looks the region up by it.
    unsafe { cudapool_nvtx_region_unregister(ptr) };
}
