//! The real driver: `libcuda.so.1` opened by the shim itself and a typed table of the entry
//! points the shim calls. The bottom of the stack; it knows nothing of pools or limits.
//!
//! Every lookup here goes through the *real* `dlsym` on the real driver's handle, never through
//! the overridden one (docs/design.md, trap 2), so loading the table cannot re-enter the shim.
//!
//! Every call through the table ([`call!`]) can be made to fail on purpose (`CUDAPOOL_FAULTS`,
//! [`arm_faults`]): a debug setting for testing what cudapool does with the driver's errors.
//! Unarmed, it costs one relaxed load per driver call.

mod anytime;
mod copy;
pub mod nvml;
pub mod nvtx;
mod own;
mod program_vmm;
mod release;
mod vmm;
pub use copy::{OwnStream, Pinned};
pub use own::Own;
pub use release::{Inside, Release};

use crate::base::cu::*;
use std::cell::Cell;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;

type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

/// glibc's own `dlsym`, found by version so that the override in `interpose` is skipped.
/// Stored as an address (0 = not yet resolved) so the `dlsym` trampoline can read it.
pub static REAL_DLSYM: AtomicUsize = AtomicUsize::new(0);

/// Resolves (once) and returns glibc's `dlsym`. Never goes through the override.
pub fn real_dlsym() -> DlsymFn {
    let mut addr = REAL_DLSYM.load(Ordering::Acquire);
    if addr == 0 {
        for version in [c"GLIBC_2.34", c"GLIBC_2.2.5", c"GLIBC_2.17"] {
            // SAFETY: dlvsym with RTLD_NEXT and two NUL-terminated strings; it is not overridden.
            let p = unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), version.as_ptr()) };
            if !p.is_null() {
                addr = p as usize;
                break;
            }
        }
        assert!(addr != 0, "glibc's dlsym not found");
        REAL_DLSYM.store(addr, Ordering::Release);
    }
    // SAFETY: addr is the address of glibc's dlsym, which has this signature.
    unsafe { std::mem::transmute::<usize, DlsymFn>(addr) }
}

/// The trampoline calls this when it needs the real `dlsym` before anything resolved it.
pub extern "C" fn resolve_real_dlsym() -> usize {
    real_dlsym() as usize
}

/// Looks `name` up in `handle` with the real `dlsym`.
///
/// # Safety
/// `handle` is a handle `dlopen` returned (or a pseudo-handle such as `RTLD_DEFAULT`).
pub unsafe fn lookup(handle: *mut c_void, name: &CStr) -> *mut c_void {
    // SAFETY: real dlsym with a valid handle (caller) and a NUL-terminated name.
    unsafe { real_dlsym()(handle, name.as_ptr()) }
}

macro_rules! driver_table {
    ($( $field:ident = $sym:literal : fn($($arg:ty),*); )*) => {
        /// Entry points of the real driver. `None` where this driver does not export the name.
        pub struct Driver {
            /// The `dlopen` handle of the real `libcuda.so.1` (never closed: `RTLD_NODELETE`).
            pub handle: usize,
            $( pub $field: Option<unsafe extern "C" fn($($arg),*) -> CUresult>, )*
        }

        /// (table field, the driver's name) of every entry point the table holds.
        pub const SYMBOLS: &[(&str, &CStr)] = &[$( (stringify!($field), $sym), )*];

        impl Driver {
            fn resolve(handle: *mut c_void) -> Driver {
                Driver {
                    handle: handle as usize,
                    $( $field: {
                        // SAFETY: `handle` came from dlopen. The driver exports `$sym` with exactly
                        // this C signature (cuda.h); a null pointer becomes None by the niche.
                        unsafe {
                            let p = lookup(handle, $sym);
                            std::mem::transmute::<*mut c_void, Option<unsafe extern "C" fn($($arg),*) -> CUresult>>(p)
                        }
                    }, )*
                }
            }
        }
    };
}

driver_table! {
    ctx_get_current = c"cuCtxGetCurrent": fn(*mut CUcontext);
    ctx_get_device = c"cuCtxGetDevice": fn(*mut CUdevice);
    device_total_mem = c"cuDeviceTotalMem_v2": fn(*mut usize, CUdevice);
    device_get_uuid_v2 = c"cuDeviceGetUuid_v2": fn(*mut [u8; 16], CUdevice);
    device_get_uuid_v1 = c"cuDeviceGetUuid": fn(*mut [u8; 16], CUdevice);
    primary_ctx_get_state = c"cuDevicePrimaryCtxGetState": fn(CUdevice, *mut c_uint, *mut c_int);
    primary_ctx_retain = c"cuDevicePrimaryCtxRetain": fn(*mut CUcontext, CUdevice);
    primary_ctx_release_raw = c"cuDevicePrimaryCtxRelease_v2": fn(CUdevice);

    mem_alloc_v2 = c"cuMemAlloc_v2": fn(*mut DevPtr, usize);
    mem_alloc_v1 = c"cuMemAlloc": fn(*mut u32, c_uint);
    mem_free_v2 = c"cuMemFree_v2": fn(DevPtr);
    mem_free_v1 = c"cuMemFree": fn(u32);
    mem_alloc_pitch_v2 = c"cuMemAllocPitch_v2": fn(*mut DevPtr, *mut usize, usize, usize, c_uint);
    mem_alloc_pitch_v1 = c"cuMemAllocPitch": fn(*mut u32, *mut c_uint, c_uint, c_uint, c_uint);
    mem_get_info_v2 = c"cuMemGetInfo_v2": fn(*mut usize, *mut usize);
    mem_get_info_v1 = c"cuMemGetInfo": fn(*mut c_uint, *mut c_uint);
    mem_get_address_range_v2 = c"cuMemGetAddressRange_v2": fn(*mut DevPtr, *mut usize, DevPtr);
    mem_get_address_range_v1 = c"cuMemGetAddressRange": fn(*mut u32, *mut c_uint, u32);
    pointer_get_attribute = c"cuPointerGetAttribute": fn(*mut c_void, c_int, DevPtr);
    pointer_get_attributes = c"cuPointerGetAttributes": fn(c_uint, *mut c_int, *mut *mut c_void, DevPtr);
    ipc_get_mem_handle = c"cuIpcGetMemHandle": fn(*mut CUipcMemHandle, DevPtr);
    ipc_open_mem_handle_v2 = c"cuIpcOpenMemHandle_v2": fn(*mut DevPtr, CUipcMemHandle, c_uint);
    ipc_open_mem_handle_v1 = c"cuIpcOpenMemHandle": fn(*mut DevPtr, CUipcMemHandle, c_uint);
    ipc_close_mem_handle = c"cuIpcCloseMemHandle": fn(DevPtr);
    ctx_destroy_v2 = c"cuCtxDestroy_v2": fn(CUcontext);
    ctx_destroy_v1 = c"cuCtxDestroy": fn(CUcontext);
    primary_ctx_reset_v2 = c"cuDevicePrimaryCtxReset_v2": fn(CUdevice);
    primary_ctx_reset_v1 = c"cuDevicePrimaryCtxReset": fn(CUdevice);
    primary_ctx_release_v2 = c"cuDevicePrimaryCtxRelease_v2": fn(CUdevice);
    primary_ctx_release_v1 = c"cuDevicePrimaryCtxRelease": fn(CUdevice);
    stream_create = c"cuStreamCreate": fn(*mut CUstream, c_uint);
    stream_create_with_priority = c"cuStreamCreateWithPriority": fn(*mut CUstream, c_uint, c_int);
    stream_destroy_v2 = c"cuStreamDestroy_v2": fn(CUstream);
    stream_destroy_v1 = c"cuStreamDestroy": fn(CUstream);
    stream_get_ctx = c"cuStreamGetCtx": fn(CUstream, *mut CUcontext);
    stream_begin_capture_v1 = c"cuStreamBeginCapture": fn(CUstream);
    stream_begin_capture_v2 = c"cuStreamBeginCapture_v2": fn(CUstream, c_int);
    stream_begin_capture_ptsz = c"cuStreamBeginCapture_ptsz": fn(CUstream);
    stream_begin_capture_v2_ptsz = c"cuStreamBeginCapture_v2_ptsz": fn(CUstream, c_int);
    stream_end_capture = c"cuStreamEndCapture": fn(CUstream, *mut *mut c_void);
    stream_is_capturing = c"cuStreamIsCapturing": fn(CUstream, *mut c_int);
    thread_exchange_capture_mode = c"cuThreadExchangeStreamCaptureMode": fn(*mut c_int);
    stream_end_capture_ptsz = c"cuStreamEndCapture_ptsz": fn(CUstream, *mut *mut c_void);
    event_create = c"cuEventCreate": fn(*mut CUevent, c_uint);
    stream_wait_event = c"cuStreamWaitEvent": fn(CUstream, CUevent, c_uint);
    event_record = c"cuEventRecord": fn(CUevent, CUstream);
    event_query = c"cuEventQuery": fn(CUevent);
    event_synchronize = c"cuEventSynchronize": fn(CUevent);
    event_destroy = c"cuEventDestroy_v2": fn(CUevent);
    ctx_push_current = c"cuCtxPushCurrent_v2": fn(CUcontext);
    ctx_pop_current = c"cuCtxPopCurrent_v2": fn(*mut CUcontext);
    ctx_push_current_v1 = c"cuCtxPushCurrent": fn(CUcontext);
    ctx_pop_current_v1 = c"cuCtxPopCurrent": fn(*mut CUcontext);
    ctx_set_current = c"cuCtxSetCurrent": fn(CUcontext);
    ctx_create_v1 = c"cuCtxCreate": fn(*mut CUcontext, c_uint, CUdevice);
    ctx_create_v2 = c"cuCtxCreate_v2": fn(*mut CUcontext, c_uint, CUdevice);
    ctx_create_v3 = c"cuCtxCreate_v3": fn(*mut CUcontext, *mut c_void, c_int, c_uint, CUdevice);
    ctx_create_v4 = c"cuCtxCreate_v4": fn(*mut CUcontext, *mut c_void, c_uint, CUdevice);
    ctx_get_limit = c"cuCtxGetLimit": fn(*mut usize, c_int);
    ctx_set_limit = c"cuCtxSetLimit": fn(c_int, usize);
    device_get_attribute = c"cuDeviceGetAttribute": fn(*mut c_int, c_int, CUdevice);
    module_load = c"cuModuleLoad": fn(*mut Opaque, *const c_char);
    module_load_data = c"cuModuleLoadData": fn(*mut Opaque, *const c_void);
    module_load_data_ex = c"cuModuleLoadDataEx": fn(*mut Opaque, *const c_void, c_uint, *mut c_int, *mut *mut c_void);
    module_load_fat_binary = c"cuModuleLoadFatBinary": fn(*mut Opaque, *const c_void);
    module_unload = c"cuModuleUnload": fn(Opaque);
    library_load_data = c"cuLibraryLoadData": fn(*mut Opaque, *const c_void, *mut c_int, *mut *mut c_void, c_uint, *mut c_int, *mut *mut c_void, c_uint);
    library_load_from_file = c"cuLibraryLoadFromFile": fn(*mut Opaque, *const c_char, *mut c_int, *mut *mut c_void, c_uint, *mut c_int, *mut *mut c_void, c_uint);
    library_unload = c"cuLibraryUnload": fn(Opaque);
    ctx_attach = c"cuCtxAttach": fn(*mut CUcontext, c_uint);
    ctx_detach = c"cuCtxDetach": fn(CUcontext);
    stream_begin_capture_to_graph = c"cuStreamBeginCaptureToGraph": fn(CUstream, *mut c_void, *const c_void, *const c_void, usize, c_int);
    stream_begin_capture_to_graph_ptsz = c"cuStreamBeginCaptureToGraph_ptsz": fn(CUstream, *mut c_void, *const c_void, *const c_void, usize, c_int);
    stream_synchronize = c"cuStreamSynchronize": fn(CUstream);
    stream_query = c"cuStreamQuery": fn(CUstream);

    mem_alloc_async = c"cuMemAllocAsync": fn(*mut DevPtr, usize, CUstream);
    mem_alloc_async_ptsz = c"cuMemAllocAsync_ptsz": fn(*mut DevPtr, usize, CUstream);
    mem_free_async = c"cuMemFreeAsync": fn(DevPtr, CUstream);
    mem_free_async_ptsz = c"cuMemFreeAsync_ptsz": fn(DevPtr, CUstream);
    mem_alloc_from_pool_async = c"cuMemAllocFromPoolAsync": fn(*mut DevPtr, usize, Opaque, CUstream);
    mem_alloc_from_pool_async_ptsz = c"cuMemAllocFromPoolAsync_ptsz": fn(*mut DevPtr, usize, Opaque, CUstream);
    mem_pool_create = c"cuMemPoolCreate": fn(*mut Opaque, *const MemPropHead);
    mem_pool_destroy = c"cuMemPoolDestroy": fn(Opaque);
    mem_pool_trim_to = c"cuMemPoolTrimTo": fn(Opaque, usize);
    mem_pool_get_attribute = c"cuMemPoolGetAttribute": fn(Opaque, c_int, *mut c_void);
    mem_pool_set_attribute = c"cuMemPoolSetAttribute": fn(Opaque, c_int, *mut c_void);
    device_get_default_mem_pool = c"cuDeviceGetDefaultMemPool": fn(*mut Opaque, CUdevice);
    mem_alloc_managed = c"cuMemAllocManaged": fn(*mut DevPtr, usize, c_uint);
    mem_create = c"cuMemCreate": fn(*mut MemHandle, usize, *const MemPropHead, u64);
    mem_release = c"cuMemRelease": fn(MemHandle);
    mem_map = c"cuMemMap": fn(DevPtr, usize, usize, MemHandle, u64);
    mem_unmap = c"cuMemUnmap": fn(DevPtr, usize);
    mem_retain_allocation_handle = c"cuMemRetainAllocationHandle": fn(*mut MemHandle, *mut c_void);
    mem_export_to_shareable_handle = c"cuMemExportToShareableHandle": fn(*mut c_void, MemHandle, c_int, u64);
    mem_import_from_shareable_handle = c"cuMemImportFromShareableHandle": fn(*mut MemHandle, *mut c_void, c_int);
    mem_get_allocation_properties_from_handle = c"cuMemGetAllocationPropertiesFromHandle": fn(*mut MemAllocProp, MemHandle);
    mem_address_reserve = c"cuMemAddressReserve": fn(*mut DevPtr, usize, usize, DevPtr, u64);
    mem_address_free = c"cuMemAddressFree": fn(DevPtr, usize);
    mem_set_access = c"cuMemSetAccess": fn(DevPtr, usize, *const MemAccessDesc, usize);
    mem_get_access = c"cuMemGetAccess": fn(*mut u64, *const MemLocation, DevPtr);
    mem_get_handle_for_address_range = c"cuMemGetHandleForAddressRange": fn(*mut c_void, DevPtr, usize, c_int, u64);
    mem_map_array_async = c"cuMemMapArrayAsync": fn(*mut c_void, c_uint, CUstream);
    mem_map_array_async_ptsz = c"cuMemMapArrayAsync_ptsz": fn(*mut c_void, c_uint, CUstream);
    multicast_create = c"cuMulticastCreate": fn(*mut MemHandle, *const c_void);
    multicast_bind_mem = c"cuMulticastBindMem": fn(MemHandle, usize, MemHandle, usize, usize, u64);
    multicast_bind_addr = c"cuMulticastBindAddr": fn(MemHandle, usize, DevPtr, usize, u64);
    multicast_unbind = c"cuMulticastUnbind": fn(MemHandle, CUdevice, usize, usize);
    multicast_add_device = c"cuMulticastAddDevice": fn(MemHandle, CUdevice);
    mem_get_allocation_granularity = c"cuMemGetAllocationGranularity": fn(*mut usize, *const MemAllocProp, c_int);
    graph_get_nodes = c"cuGraphGetNodes": fn(Opaque, *mut Opaque, *mut usize);
    graph_node_get_type = c"cuGraphNodeGetType": fn(Opaque, *mut c_int);
    graph_mem_alloc_node_get_params = c"cuGraphMemAllocNodeGetParams": fn(Opaque, *mut MemAllocNodeParams);
    device_get_graph_mem_attribute = c"cuDeviceGetGraphMemAttribute": fn(CUdevice, c_int, *mut c_void);
    device_graph_mem_trim = c"cuDeviceGraphMemTrim": fn(CUdevice);
    graph_launch = c"cuGraphLaunch": fn(Opaque, CUstream);
    graph_launch_ptsz = c"cuGraphLaunch_ptsz": fn(Opaque, CUstream);
    graph_upload = c"cuGraphUpload": fn(Opaque, CUstream);
    graph_upload_ptsz = c"cuGraphUpload_ptsz": fn(Opaque, CUstream);
    graph_instantiate_v1 = c"cuGraphInstantiate": fn(*mut Opaque, Opaque, *mut Opaque, *mut c_char, usize);
    graph_instantiate_v2 = c"cuGraphInstantiate_v2": fn(*mut Opaque, Opaque, *mut Opaque, *mut c_char, usize);
    graph_instantiate_with_flags = c"cuGraphInstantiateWithFlags": fn(*mut Opaque, Opaque, u64);
    graph_instantiate_with_params = c"cuGraphInstantiateWithParams": fn(*mut Opaque, Opaque, *mut c_void);
    graph_instantiate_with_params_ptsz = c"cuGraphInstantiateWithParams_ptsz": fn(*mut Opaque, Opaque, *mut c_void);
    graph_exec_destroy = c"cuGraphExecDestroy": fn(Opaque);
    device_get_count = c"cuDeviceGetCount": fn(*mut c_int);
    cu_init = c"cuInit": fn(c_uint);
    device_can_access_peer = c"cuDeviceCanAccessPeer": fn(*mut c_int, CUdevice, CUdevice);
    ctx_synchronize = c"cuCtxSynchronize": fn();
    memcpy_dtoh_async = c"cuMemcpyDtoHAsync_v2": fn(*mut c_void, DevPtr, usize, CUstream);
    mem_host_alloc = c"cuMemHostAlloc": fn(*mut *mut c_void, usize, c_uint);
    mem_free_host = c"cuMemFreeHost": fn(*mut c_void);
    memcpy_htod_async = c"cuMemcpyHtoDAsync_v2": fn(DevPtr, *const c_void, usize, CUstream);
    array_create_v2 = c"cuArrayCreate_v2": fn(*mut Opaque, *const ArrayDesc);
    array_create_v1 = c"cuArrayCreate": fn(*mut Opaque, *const ArrayDescV1);
    array3d_create_v2 = c"cuArray3DCreate_v2": fn(*mut Opaque, *const Array3DDesc);
    array3d_create_v1 = c"cuArray3DCreate": fn(*mut Opaque, *const Array3DDescV1);
    array_destroy = c"cuArrayDestroy": fn(Opaque);
    mipmapped_array_create = c"cuMipmappedArrayCreate": fn(*mut Opaque, *const Array3DDesc, c_uint);
    mipmapped_array_destroy = c"cuMipmappedArrayDestroy": fn(Opaque);
    array_get_memory_requirements = c"cuArrayGetMemoryRequirements": fn(*mut ArrayMemReq, Opaque, CUdevice);
    mipmapped_array_get_memory_requirements = c"cuMipmappedArrayGetMemoryRequirements": fn(*mut ArrayMemReq, Opaque, CUdevice);
    get_proc_address_v1 = c"cuGetProcAddress": fn(*const c_char, *mut *mut c_void, c_int, u64);
    get_proc_address_v2 = c"cuGetProcAddress_v2": fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int);
}

/// The driver once opened. A failed open is not kept: the program may load `libcuda.so.1`
/// later from where only it looks (its own rpath), and then it is found among the loaded
/// libraries.
static DRIVER: OnceLock<Driver> = OnceLock::new();
/// The open by name (which searches the library path) was tried and failed: later tries only
/// look among the libraries already loaded (`RTLD_NOLOAD`, cheap).
static SEARCHED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// What the last failed open said (for the one warning line).
static OPEN_ERROR: std::sync::Mutex<String> = std::sync::Mutex::new(String::new());

thread_local! {
    /// Set while this thread is inside `dlopen` of the driver: a constructor in there that
    /// calls `dlsym` must get plain answers, not wait for the table being built.
    static LOADING: Cell<bool> = const { Cell::new(false) };
}

/// Calls a table entry: `CUDA_ERROR_NOT_FOUND` when the driver lacks it, an armed fault's
/// error (`CUDAPOOL_FAULTS`), else its result.
macro_rules! call {
    ($drv:expr, $field:ident ( $($arg:expr),* )) => {
        match $drv.$field {
            Some(f) => match $crate::driver::injected(stringify!($field)) {
                Some(e) => e,
                // SAFETY: the pointer came from the real driver for this exact signature; the
                // arguments are the caller's own (hooks) or point at locals of the caller.
                None => unsafe { f($($arg),*) },
            },
            None => $crate::base::cu::CUDA_ERROR_NOT_FOUND,
        }
    };
}
pub(crate) use call;

/// A `CUDAPOOL_FAULTS` entry, armed: the calls of table field `field` numbered `from..=to`
/// fail with `code`; `calls` counts the calls made so far.
struct Armed {
    field: &'static str,
    from: u64,
    to: u64,
    code: CUresult,
    calls: AtomicU64,
}

static FAULTS: OnceLock<Vec<Armed>> = OnceLock::new();
static ARMED: AtomicBool = AtomicBool::new(false);

/// The table field of the driver's entry point `name`, if the table holds it.
pub fn field_of(name: &str) -> Option<&'static str> {
    SYMBOLS
        .iter()
        .find(|(_, sym)| sym.to_bytes() == name.as_bytes())
        .map(|(field, _)| *field)
}

/// Arms the faults (once per process; the names were checked with [`field_of`]).
pub fn arm_faults(faults: &[crate::base::config::Fault]) {
    if faults.is_empty() {
        return;
    }
    let armed = faults
        .iter()
        .filter_map(|f| {
            Some(Armed {
                field: field_of(&f.call)?,
                from: f.from,
                to: f.to,
                code: f.code,
                calls: AtomicU64::new(0),
            })
        })
        .collect();
    if FAULTS.set(armed).is_ok() {
        ARMED.store(true, Ordering::Release);
    }
}

/// The error an armed fault makes this call of table field `field` return, if any.
#[inline]
pub fn injected(field: &str) -> Option<CUresult> {
    if !ARMED.load(Ordering::Relaxed) {
        return None;
    }
    injected_slow(field)
}

#[cold]
fn injected_slow(field: &str) -> Option<CUresult> {
    let mut hit = None;
    for f in FAULTS.get()?.iter().filter(|f| f.field == field) {
        let n = f.calls.fetch_add(1, Ordering::AcqRel) + 1;
        if (f.from..=f.to).contains(&n) && hit.is_none() {
            hit = Some(f.code);
            crate::log_at!(
                crate::base::config::LogLevel::Info,
                "injected fault: call {n} of {} returns {}",
                SYMBOLS
                    .iter()
                    .find(|(fl, _)| *fl == field)
                    .map_or(field.into(), |(_, sym)| sym.to_string_lossy()),
                f.code
            );
        }
    }
    hit
}

fn check(r: CUresult) -> Result<(), CUresult> {
    if r == CUDA_SUCCESS {
        Ok(())
    } else {
        Err(r)
    }
}

/// The path of a loaded library named `libcuda.so*` (the driver the program loaded itself).
fn loaded_driver_path() -> Option<std::ffi::CString> {
    unsafe extern "C" fn each(
        info: *mut libc::dl_phdr_info,
        _size: libc::size_t,
        data: *mut c_void,
    ) -> c_int {
        // SAFETY: the loader passes a valid info for the call; `data` is our Option below.
        let (info, found) = unsafe { (&*info, &mut *(data as *mut Option<std::ffi::CString>)) };
        if info.dlpi_name.is_null() {
            return 0;
        }
        // SAFETY: a NUL-terminated path the loader keeps for the object's life.
        let name = unsafe { std::ffi::CStr::from_ptr(info.dlpi_name) };
        let base = name.to_bytes().rsplit(|&b| b == b'/').next().unwrap_or(&[]);
        if base.starts_with(b"libcuda.so") {
            *found = Some(name.to_owned());
            return 1;
        }
        0
    }
    let mut found: Option<std::ffi::CString> = None;
    // SAFETY: the callback only reads what the loader passes and writes our local.
    unsafe { libc::dl_iterate_phdr(Some(each), &mut found as *mut _ as *mut c_void) };
    found
}

impl Driver {
    /// The real driver, opened on first use: by name (the library path), else, once the
    /// program has loaded it from wherever it found it, among the loaded libraries. `None` until
    /// then, and while this very thread is opening it.
    pub fn get() -> Option<&'static Driver> {
        if let Some(d) = DRIVER.get() {
            return Some(d);
        }
        if LOADING.with(|l| l.get()) {
            return None;
        }
        let searched = SEARCHED.swap(true, std::sync::atomic::Ordering::AcqRel);
        let mut flags = libc::RTLD_NOW | libc::RTLD_NODELETE;
        if searched {
            flags |= libc::RTLD_NOLOAD;
        }
        LOADING.with(|l| l.set(true));
        // SAFETY: dlopen of a library name; RTLD_NODELETE keeps it (and every pointer taken
        // from it) valid for the life of the process.
        let mut h = unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), flags) };
        if h.is_null() {
            // Loaded by the program under another name or path (its rpath, `libcuda.so`).
            if let Some(path) = loaded_driver_path() {
                // SAFETY: dlopen of the path of a library already loaded; RTLD_NOLOAD opens
                // nothing new, RTLD_NODELETE as above.
                h = unsafe {
                    libc::dlopen(
                        path.as_ptr(),
                        libc::RTLD_NOW | libc::RTLD_NODELETE | libc::RTLD_NOLOAD,
                    )
                };
            }
        }
        LOADING.with(|l| l.set(false));
        if h.is_null() {
            // SAFETY: dlerror returns NULL or a NUL-terminated message of this thread.
            let e = unsafe { libc::dlerror() };
            if !e.is_null() && !searched {
                // SAFETY: non-null, NUL-terminated (above).
                let msg = unsafe { std::ffi::CStr::from_ptr(e) }
                    .to_string_lossy()
                    .into_owned();
                *crate::base::sync::lock(&OPEN_ERROR) = msg;
            }
            return None;
        }
        Some(DRIVER.get_or_init(|| Driver::resolve(h)))
    }

    /// Why the driver could not be opened, for a warning line: what was tried and the fix.
    pub fn open_failure() -> String {
        let e = crate::base::sync::lock(&OPEN_ERROR).clone();
        format!(
            "libcuda.so.1 could not be opened by name ({}) and is not among the libraries the program loaded; \
             add its folder to LD_LIBRARY_PATH (the program may find it through its own rpath, which cudapool does not see)",
            if e.is_empty() { "no error given" } else { &e }
        )
    }

    /// The calling thread's current context, or `None` if it has none.
    pub fn current_context(&self) -> Result<Option<CUcontext>, CUresult> {
        let mut ctx: CUcontext = std::ptr::null_mut();
        check(call!(self, ctx_get_current(&mut ctx)))?;
        Ok((!ctx.is_null()).then_some(ctx))
    }

    /// The device of the calling thread's current context.
    pub fn current_device(&self) -> Result<CUdevice, CUresult> {
        let mut dev: CUdevice = 0;
        check(call!(self, ctx_get_device(&mut dev)))?;
        Ok(dev)
    }

    /// `cuInit(0)`: for answering a question about devices before the program has asked the
    /// driver anything (NVML's view in a process that never uses CUDA, such as nvidia-smi).
    pub fn init(&self) -> bool {
        call!(self, cu_init(0)) == CUDA_SUCCESS
    }

    /// How many devices this process sees (`None` if the driver cannot say).
    pub fn device_count(&self) -> Option<i32> {
        let mut n: c_int = 0;
        (call!(self, device_get_count(&mut n)) == CUDA_SUCCESS).then_some(n)
    }

    pub fn device_total_mem(&self, dev: CUdevice) -> Result<u64, CUresult> {
        let mut bytes = 0usize;
        check(call!(self, device_total_mem(&mut bytes, dev)))?;
        Ok(bytes as u64)
    }

    /// The device's UUID (`nvidia-smi -L` shows it as `GPU-` and hex), the same whatever
    /// `CUDA_VISIBLE_DEVICES` says.
    pub fn device_uuid(&self, dev: CUdevice) -> Option<[u8; 16]> {
        let mut uuid = [0u8; 16];
        (call!(self, device_get_uuid_v2(&mut uuid, dev)) == CUDA_SUCCESS
            || call!(self, device_get_uuid_v1(&mut uuid, dev)) == CUDA_SUCCESS)
            .then_some(uuid)
    }

    /// `cuCtxGetLimit` of the current context.
    pub fn ctx_limit(&self, which: c_int) -> Result<u64, CUresult> {
        let mut v = 0usize;
        check(call!(self, ctx_get_limit(&mut v, which)))?;
        Ok(v as u64)
    }

    /// A device attribute (`CUdevice_attribute`).
    pub fn device_attribute(&self, attr: c_int, dev: CUdevice) -> Result<i64, CUresult> {
        let mut v: c_int = 0;
        check(call!(self, device_get_attribute(&mut v, attr, dev)))?;
        Ok(v as i64)
    }

    /// Bytes each device's memory nodes take in `graph` (allocation nodes only: the driver
    /// refuses them in child graphs and conditional bodies, so the top level holds them all).
    /// Empty for a graph without memory nodes. `graph` is the handle's value (a bad one gets
    /// the driver's error).
    pub fn graph_memory_nodes(&self, graph: usize) -> Result<Vec<(CUdevice, u64)>, CUresult> {
        let graph = graph as Opaque;
        let mut n = 0usize;
        check(call!(
            self,
            graph_get_nodes(graph, std::ptr::null_mut(), &mut n)
        ))?;
        let mut nodes: Vec<Opaque> = vec![std::ptr::null_mut(); n];
        check(call!(
            self,
            graph_get_nodes(graph, nodes.as_mut_ptr(), &mut n)
        ))?;
        nodes.truncate(n);
        let mut per_device: Vec<(CUdevice, u64)> = Vec::new();
        for node in nodes {
            let mut kind: c_int = -1;
            check(call!(self, graph_node_get_type(node, &mut kind)))?;
            if kind != CU_GRAPH_NODE_TYPE_MEM_ALLOC {
                continue;
            }
            let mut params = MemAllocNodeParams::default();
            check(call!(
                self,
                graph_mem_alloc_node_get_params(node, &mut params)
            ))?;
            if params.props.location_type != CU_MEM_LOCATION_TYPE_DEVICE {
                continue;
            }
            let dev = params.props.location_id;
            match per_device.iter_mut().find(|(d, _)| *d == dev) {
                Some((_, b)) => *b += params.bytesize as u64,
                None => per_device.push((dev, params.bytesize as u64)),
            }
        }
        Ok(per_device)
    }

    /// Device memory the driver holds for graphs on `dev` now.
    pub fn graph_reserved(&self, dev: CUdevice) -> Result<u64, CUresult> {
        let mut v: u64 = 0;
        let out = &mut v as *mut u64 as *mut c_void;
        check(call!(
            self,
            device_get_graph_mem_attribute(dev, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, out)
        ))?;
        Ok(v)
    }

    pub fn mem_alloc(&self, bytes: u64) -> Result<DevPtr, CUresult> {
        let mut p: DevPtr = 0;
        check(call!(self, mem_alloc_v2(&mut p, bytes as usize)))?;
        Ok(p)
    }

    /// `cuMemFree_v2` (reached through `Release`).
    fn mem_free(&self, p: DevPtr) -> Result<(), CUresult> {
        check(call!(self, mem_free_v2(p)))
    }

    /// The default memory pool of `dev` (`cuDeviceGetDefaultMemPool`).
    pub fn default_mem_pool(&self, dev: CUdevice) -> Option<usize> {
        let mut pool: Opaque = std::ptr::null_mut();
        (call!(self, device_get_default_mem_pool(&mut pool, dev)) == CUDA_SUCCESS)
            .then_some(pool as usize)
    }

    /// The driver's allocation that holds `p`: its start and size.
    pub fn address_range(&self, p: DevPtr) -> Result<(DevPtr, u64), CUresult> {
        let (mut base, mut size): (DevPtr, usize) = (0, 0);
        check(call!(
            self,
            mem_get_address_range_v2(&mut base, &mut size, p)
        ))?;
        Ok((base, size as u64))
    }

    /// Closes a mapping `cuIpcOpenMemHandle` gave.
    pub fn ipc_close(&self, p: DevPtr) -> Result<(), CUresult> {
        check(call!(self, ipc_close_mem_handle(p)))
    }

    /// The primary context of `dev` if it is active, without changing its reference count.
    pub fn active_primary_context(&self, dev: CUdevice) -> Option<CUcontext> {
        let (mut flags, mut active) = (0 as c_uint, 0 as c_int);
        if call!(self, primary_ctx_get_state(dev, &mut flags, &mut active)) != CUDA_SUCCESS
            || active == 0
        {
            return None;
        }
        let mut ctx: CUcontext = std::ptr::null_mut();
        if call!(self, primary_ctx_retain(&mut ctx, dev)) != CUDA_SUCCESS {
            return None;
        }
        // Give back the reference just taken; the context stays active (it was before).
        call!(self, primary_ctx_release_raw(dev));
        (!ctx.is_null()).then_some(ctx)
    }

    /// Runs `f` with the context `ctx` (a handle, as an address) current on this thread,
    /// pushing it only if another one is.
    pub fn in_context<T>(&self, ctx: usize, f: impl FnOnce() -> T) -> T {
        let current = self.current_context().ok().flatten().map(|c| c as usize);
        if current == Some(ctx) || call!(self, ctx_push_current(ctx as CUcontext)) != CUDA_SUCCESS {
            return f();
        }
        let r = f();
        let mut popped: CUcontext = std::ptr::null_mut();
        call!(self, ctx_pop_current(&mut popped));
        r
    }

    /// Whether the primary context of `dev` is active.
    pub fn primary_context_active(&self, dev: CUdevice) -> bool {
        let (mut flags, mut active) = (0 as c_uint, 0 as c_int);
        call!(self, primary_ctx_get_state(dev, &mut flags, &mut active)) == CUDA_SUCCESS
            && active != 0
    }

    /// Runs `f` with the calling thread's capture interaction mode relaxed, then puts the mode
    /// back (`cuThreadExchangeStreamCaptureMode`): an allocation made for the program while a
    /// capture is under way elsewhere is then no call a capture forbids (CUDA refuses a
    /// `cuMemAlloc` in the default mode during another thread's global capture, and the
    /// capture dies of it), as PyTorch does for its own `cudaMalloc` during a capture.
    pub fn relaxed<T>(&self, f: impl FnOnce() -> T) -> T {
        let mut mode: c_int = CU_STREAM_CAPTURE_MODE_RELAXED;
        if call!(self, thread_exchange_capture_mode(&mut mode)) != CUDA_SUCCESS {
            return f();
        }
        let r = f();
        call!(self, thread_exchange_capture_mode(&mut mode));
        r
    }
}
