//! The C ABI of the shim: every `cu*` entry point it replaces, in files by what they serve.
//!
//! Each hook is exported under the driver's name (for programs linked with `-lcuda`) and is
//! what `interpose` hands out for `dlsym` and `cuGetProcAddress` lookups. A hook only checks
//! and converts raw pointers and result codes, inside [`guard::hook`]; what happens lives in
//! `state` (safe Rust). Bad input (NULL out-pointers, size 0) goes to the real driver
//! untouched, so the program gets the driver's own answer.
//!
//! - [`pooled`]: `cuMemAlloc`/`cuMemFree` and the stream-ordered family;
//! - [`counted`]: allocations passed through and counted (pitched, legacy, managed, driver
//!   pools, virtual memory, arrays);
//! - [`streams`]: stream creation and destruction, graph capture;
//! - [`contexts`]: context teardown;
//! - [`lookups`]: `cuMemGetInfo`, `cuMemGetAddressRange`;
//! - [`work`]: the entry points that issue device work (they report their queue);
//! - [`guard`]: the panic boundary and re-entry guard they all use.
//!
//! Uses: its own files.

pub mod contexts;
pub mod counted;
pub mod guard;
pub mod lookups;
pub mod pooled;
pub mod streams;
pub mod work;

pub use guard::boundary;
use std::ffi::{c_void, CStr};

/// Every hook and the driver name it replaces; `interpose` substitutes by this table.
pub fn table() -> Vec<(&'static CStr, *const c_void)> {
    let mut t = vec![
        (c"cuMemAllocAsync", pooled::cuMemAllocAsync as *const c_void),
        (
            c"cuMemAllocAsync_ptsz",
            pooled::cuMemAllocAsync_ptsz as *const c_void,
        ),
        (c"cuMemFreeAsync", pooled::cuMemFreeAsync as *const c_void),
        (
            c"cuMemFreeAsync_ptsz",
            pooled::cuMemFreeAsync_ptsz as *const c_void,
        ),
        (
            c"cuMemAllocFromPoolAsync",
            counted::cuMemAllocFromPoolAsync as *const c_void,
        ),
        (
            c"cuMemAllocFromPoolAsync_ptsz",
            counted::cuMemAllocFromPoolAsync_ptsz as *const c_void,
        ),
        (
            c"cuMemPoolCreate",
            counted::cuMemPoolCreate as *const c_void,
        ),
        (
            c"cuMemPoolDestroy",
            counted::cuMemPoolDestroy as *const c_void,
        ),
        (
            c"cuMemPoolTrimTo",
            counted::cuMemPoolTrimTo as *const c_void,
        ),
        (
            c"cuMemAllocManaged",
            counted::cuMemAllocManaged as *const c_void,
        ),
        (c"cuMemCreate", counted::cuMemCreate as *const c_void),
        (c"cuMemRelease", counted::cuMemRelease as *const c_void),
        (c"cuMemMap", counted::cuMemMap as *const c_void),
        (c"cuMemUnmap", counted::cuMemUnmap as *const c_void),
        (
            c"cuMemRetainAllocationHandle",
            counted::cuMemRetainAllocationHandle as *const c_void,
        ),
        (
            c"cuArrayCreate_v2",
            counted::cuArrayCreate_v2 as *const c_void,
        ),
        (c"cuArrayCreate", counted::cuArrayCreate as *const c_void),
        (
            c"cuArray3DCreate_v2",
            counted::cuArray3DCreate_v2 as *const c_void,
        ),
        (
            c"cuArray3DCreate",
            counted::cuArray3DCreate as *const c_void,
        ),
        (
            c"cuMipmappedArrayCreate",
            counted::cuMipmappedArrayCreate as *const c_void,
        ),
        (c"cuArrayDestroy", counted::cuArrayDestroy as *const c_void),
        (
            c"cuMipmappedArrayDestroy",
            counted::cuMipmappedArrayDestroy as *const c_void,
        ),
        (
            c"cuStreamBeginCaptureToGraph",
            streams::cuStreamBeginCaptureToGraph as *const c_void,
        ),
        (
            c"cuStreamBeginCaptureToGraph_ptsz",
            streams::cuStreamBeginCaptureToGraph_ptsz as *const c_void,
        ),
        (c"cuStreamCreate", streams::cuStreamCreate as *const c_void),
        (
            c"cuStreamCreateWithPriority",
            streams::cuStreamCreateWithPriority as *const c_void,
        ),
        (
            c"cuStreamDestroy_v2",
            streams::cuStreamDestroy_v2 as *const c_void,
        ),
        (
            c"cuStreamDestroy",
            streams::cuStreamDestroy as *const c_void,
        ),
        (
            c"cuStreamBeginCapture",
            streams::cuStreamBeginCapture as *const c_void,
        ),
        (
            c"cuStreamBeginCapture_v2",
            streams::cuStreamBeginCapture_v2 as *const c_void,
        ),
        (
            c"cuStreamBeginCapture_ptsz",
            streams::cuStreamBeginCapture_ptsz as *const c_void,
        ),
        (
            c"cuStreamBeginCapture_v2_ptsz",
            streams::cuStreamBeginCapture_v2_ptsz as *const c_void,
        ),
        (
            c"cuStreamEndCapture",
            streams::cuStreamEndCapture as *const c_void,
        ),
        (
            c"cuStreamEndCapture_ptsz",
            streams::cuStreamEndCapture_ptsz as *const c_void,
        ),
        (c"cuMemAlloc_v2", pooled::cuMemAlloc_v2 as *const c_void),
        (c"cuMemAlloc", counted::cuMemAlloc as *const c_void),
        (
            c"cuMemAllocPitch_v2",
            counted::cuMemAllocPitch_v2 as *const c_void,
        ),
        (
            c"cuMemAllocPitch",
            counted::cuMemAllocPitch as *const c_void,
        ),
        (c"cuMemFree_v2", pooled::cuMemFree_v2 as *const c_void),
        (c"cuMemFree", pooled::cuMemFree as *const c_void),
        (
            c"cuMemGetInfo_v2",
            lookups::cuMemGetInfo_v2 as *const c_void,
        ),
        (c"cuMemGetInfo", lookups::cuMemGetInfo as *const c_void),
        (
            c"cuMemGetAddressRange_v2",
            lookups::cuMemGetAddressRange_v2 as *const c_void,
        ),
        (
            c"cuMemGetAddressRange",
            lookups::cuMemGetAddressRange as *const c_void,
        ),
        (
            c"cuCtxDestroy_v2",
            contexts::cuCtxDestroy_v2 as *const c_void,
        ),
        (c"cuCtxDestroy", contexts::cuCtxDestroy as *const c_void),
        (
            c"cuDevicePrimaryCtxReset_v2",
            contexts::cuDevicePrimaryCtxReset_v2 as *const c_void,
        ),
        (
            c"cuDevicePrimaryCtxReset",
            contexts::cuDevicePrimaryCtxReset as *const c_void,
        ),
        (
            c"cuDevicePrimaryCtxRelease_v2",
            contexts::cuDevicePrimaryCtxRelease_v2 as *const c_void,
        ),
        (
            c"cuDevicePrimaryCtxRelease",
            contexts::cuDevicePrimaryCtxRelease as *const c_void,
        ),
    ];
    t.extend(work::table());
    t
}
