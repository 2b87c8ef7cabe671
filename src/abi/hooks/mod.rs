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
//!   pools, arrays);
//! - [`virtual_memory`]: the virtual memory API (physical memory counted; handles the program
//!   holds kept valid across a sleep);
//! - [`streams`]: stream creation and destruction, graph capture;
//! - [`graphs`]: graph memory nodes: instantiation, upload and launch, trims;
//! - [`contexts`]: context teardown, and the calling thread's current context followed;
//! - [`lookups`]: `cuMemGetInfo` and the address queries (`cuMemGetAddressRange`,
//!   `cuPointerGetAttribute(s)`) and legacy IPC (`cuIpc*MemHandle`);
//! - [`overhead`]: what makes the driver take memory besides allocations: limits (stack,
//!   heap, printf FIFO), module and library loads;
//! - [`work`]: the entry points that issue device work (they report their queue);
//! - [`guard`]: the panic boundary and re-entry guard they all use.

pub mod contexts;
pub mod counted;
pub mod graphs;
pub mod guard;
pub mod lookups;
pub mod nvml;
pub mod overhead;
pub mod pooled;
pub mod streams;
pub mod virtual_memory;
pub mod work;

pub use guard::boundary;
use std::ffi::{c_void, CStr};

/// `(driver name, hook)` for each `module::name`: a hook is exported under the name it replaces,
/// so the name is taken from the hook itself and the two cannot disagree.
macro_rules! named {
    ($($module:ident :: $name:ident),* $(,)?) => {
        vec![$((guard::symbol(concat!(stringify!($name), "\0")), $module::$name as *const c_void)),*]
    };
}

/// Every hook and the driver name it replaces; `interpose` substitutes by this table.
pub fn table() -> Vec<(&'static CStr, *const c_void)> {
    let mut t = named![
        pooled::cuMemAllocAsync,
        pooled::cuMemAllocAsync_ptsz,
        pooled::cuMemFreeAsync,
        pooled::cuMemFreeAsync_ptsz,
        counted::cuMemAllocFromPoolAsync,
        counted::cuMemAllocFromPoolAsync_ptsz,
        counted::cuMemPoolCreate,
        counted::cuMemPoolDestroy,
        counted::cuMemPoolTrimTo,
        counted::cuMemPoolGetAttribute,
        counted::cuMemPoolSetAttribute,
        counted::cuMemAllocManaged,
        virtual_memory::cuMemCreate,
        virtual_memory::cuMemRelease,
        virtual_memory::cuMemMap,
        virtual_memory::cuMemUnmap,
        virtual_memory::cuMemRetainAllocationHandle,
        virtual_memory::cuMemSetAccess,
        virtual_memory::cuMemGetAllocationPropertiesFromHandle,
        virtual_memory::cuMemExportToShareableHandle,
        virtual_memory::cuMemImportFromShareableHandle,
        virtual_memory::cuMemGetHandleForAddressRange,
        virtual_memory::cuMulticastCreate,
        virtual_memory::cuMulticastBindMem,
        virtual_memory::cuMulticastBindAddr,
        virtual_memory::cuMulticastUnbind,
        virtual_memory::cuMulticastAddDevice,
        virtual_memory::cuMemMapArrayAsync,
        virtual_memory::cuMemMapArrayAsync_ptsz,
        counted::cuArrayCreate_v2,
        counted::cuArrayCreate,
        counted::cuArray3DCreate_v2,
        counted::cuArray3DCreate,
        counted::cuMipmappedArrayCreate,
        counted::cuArrayDestroy,
        counted::cuMipmappedArrayDestroy,
        streams::cuStreamBeginCaptureToGraph,
        streams::cuStreamBeginCaptureToGraph_ptsz,
        streams::cuStreamCreate,
        streams::cuStreamCreateWithPriority,
        streams::cuStreamDestroy_v2,
        streams::cuStreamDestroy,
        streams::cuStreamBeginCapture,
        streams::cuStreamBeginCapture_v2,
        streams::cuStreamBeginCapture_ptsz,
        streams::cuStreamBeginCapture_v2_ptsz,
        streams::cuStreamEndCapture,
        streams::cuStreamEndCapture_ptsz,
        pooled::cuMemAlloc_v2,
        counted::cuMemAlloc,
        counted::cuMemAllocPitch_v2,
        counted::cuMemAllocPitch,
        pooled::cuMemFree_v2,
        pooled::cuMemFree,
        lookups::cuMemGetInfo_v2,
        lookups::cuMemGetInfo,
        lookups::cuMemGetAddressRange_v2,
        lookups::cuMemGetAddressRange,
        lookups::cuPointerGetAttribute,
        lookups::cuPointerGetAttributes,
        lookups::cuIpcGetMemHandle,
        lookups::cuIpcOpenMemHandle_v2,
        lookups::cuIpcOpenMemHandle,
        lookups::cuIpcCloseMemHandle,
        contexts::cuCtxDestroy_v2,
        contexts::cuCtxDestroy,
        contexts::cuDevicePrimaryCtxReset_v2,
        contexts::cuDevicePrimaryCtxReset,
        contexts::cuDevicePrimaryCtxRelease_v2,
        contexts::cuDevicePrimaryCtxRelease,
        contexts::cuCtxSetCurrent,
        contexts::cuCtxPushCurrent_v2,
        contexts::cuCtxPushCurrent,
        contexts::cuCtxPopCurrent_v2,
        contexts::cuCtxPopCurrent,
        overhead::cuCtxSetLimit,
        overhead::cuModuleLoad,
        overhead::cuModuleLoadData,
        overhead::cuModuleLoadDataEx,
        overhead::cuModuleLoadFatBinary,
        overhead::cuModuleUnload,
        overhead::cuLibraryLoadData,
        overhead::cuLibraryLoadFromFile,
        overhead::cuLibraryUnload,
        contexts::cuCtxCreate,
        contexts::cuCtxCreate_v2,
        contexts::cuCtxCreate_v3,
        contexts::cuCtxCreate_v4,
        contexts::cuCtxAttach,
        contexts::cuCtxDetach,
        graphs::cuGraphInstantiate,
        graphs::cuGraphInstantiate_v2,
        graphs::cuGraphInstantiateWithFlags,
        graphs::cuGraphInstantiateWithParams,
        graphs::cuGraphInstantiateWithParams_ptsz,
        graphs::cuGraphLaunch,
        graphs::cuGraphLaunch_ptsz,
        graphs::cuGraphUpload,
        graphs::cuGraphUpload_ptsz,
        graphs::cuGraphExecDestroy,
        graphs::cuDeviceGraphMemTrim,
    ];
    t.extend(work::table());
    t
}
