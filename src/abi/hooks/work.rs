//! Hooks on the entry points that issue device work: kernel launches, copies, memsets, stream
//! memory operations, event records and waits (graph launches are in `graphs`, which reports
//! through [`report`] too). Each reports the queue its work goes to (see `queues`), then calls
//! the driver's own function with the caller's arguments, unchanged, whatever the report did. This is how reuse safety knows when a context's work all
//! went to one queue (`pool::reuse`).
//!
//! Measured on an H100 with PyTorch 2.11 (`docs/gpu/work-survey-h100.txt`): every kernel the
//! profiler saw in a training step came through `cuLaunchKernel` or `cuLaunchKernelEx`, which
//! the CUDA runtime obtains through `cuGetProcAddress`.
//!
//! The report costs a thread-local look-up while a thread keeps issuing work to queues it
//! already reported (plus `cuCtxGetCurrent` for the legacy and per-thread default streams,
//! whose context is the caller's). Entry points that do not touch device memory a pool could
//! hand out (host functions, array-only copies, external semaphores) are not hooked.
#![allow(non_snake_case)]

use crate::base::cu::*;
use crate::driver::{self, Driver};
use std::ffi::{c_int, c_uint, c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Where a hooked call's work goes.
#[derive(Clone, Copy)]
pub(super) enum Queue {
    /// The stream argument of an ordinary entry point (0 is the legacy stream).
    Stream(CUstream),
    /// The stream argument of a `_ptsz` entry point (0 is the per-thread default stream).
    PerThread(CUstream),
    /// A synchronous call of an ordinary entry point: the legacy stream.
    Legacy,
    /// A synchronous `_ptds` call: the calling thread's per-thread default stream.
    PerThreadDefault,
}

impl Queue {
    /// (stream as the driver will see it, through a per-thread entry point)
    fn stream(self) -> (usize, bool) {
        match self {
            Queue::Stream(s) => (s as usize, false),
            Queue::PerThread(s) => (s as usize, true),
            Queue::Legacy => (0, false),
            Queue::PerThreadDefault => (0, true),
        }
    }
}

/// Enters a work call on `q`: wakes the process first if it sleeps (`state::sleep`), and
/// reports the work (see `Shim::work_on`); the returned guard must live until the driver has
/// the work. Never panics. `Err`: the answer to give instead of calling the driver (a wake
/// that found no room).
pub(super) fn report(q: Queue) -> Result<Option<crate::pool::queues::Entered>, CUresult> {
    super::guard::boundary(Ok(None), || {
        let Some(shim) = crate::state::Shim::active() else {
            return Ok(None);
        };
        let entered = crate::state::sleep::enter_work()?;
        if shim.watches_work() {
            let (stream, ptsz) = q.stream();
            shim.work_on(stream, ptsz);
        }
        Ok(Some(entered))
    })
}

/// The real driver function named `name`, resolved once into `slot`.
fn real(slot: &AtomicUsize, name: &CStr) -> usize {
    let p = slot.load(Ordering::Acquire);
    if p != 0 {
        return p;
    }
    let Some(d) = Driver::get() else { return 0 };
    // SAFETY: the driver's handle from dlopen, never closed; a NUL-terminated name.
    let p = unsafe { driver::lookup(d.handle as *mut c_void, name) } as usize;
    slot.store(p, Ordering::Release);
    p
}

/// The start of `CUlaunchConfig`: where `cuLaunchKernelEx` finds its stream.
#[repr(C)]
pub struct LaunchConfigHead {
    pub grid: [c_uint; 3],
    pub block: [c_uint; 3],
    pub shared_mem_bytes: c_uint,
    pub stream: CUstream,
}

/// The stream of a `CUlaunchConfig` (NULL config: the driver's answer will be an error; the
/// legacy stream is reported, harmlessly).
///
/// # Safety
/// `config` is NULL or points to a valid `CUlaunchConfig` (the driver's contract).
unsafe fn config_stream(config: *const LaunchConfigHead) -> CUstream {
    if config.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: non-null and valid by the caller's contract.
    unsafe { (*config).stream }
}

macro_rules! work_hooks {
    ($( $name:ident ( $($arg:ident : $ty:ty),* ) => $queue:expr; )*) => {
        $(
            /// A work hook (see the module doc).
            ///
            /// # Safety
            /// The driver's contract for this entry point; the arguments are passed on unchanged.
            #[no_mangle]
            pub unsafe extern "C" fn $name($($arg: $ty),*) -> CUresult {
                const NAME: &CStr = super::guard::symbol(concat!(stringify!($name), "\0"));
                static REAL: AtomicUsize = AtomicUsize::new(0);
                let _in_flight = match report($queue) {
                    Ok(entered) => entered,
                    Err(r) => return r,
                };
                let p = real(&REAL, NAME);
                if p == 0 {
                    return CUDA_ERROR_NOT_FOUND;
                }
                // SAFETY: `p` is the driver's own export of this name, with this C signature
                // (cuda.h); the caller's arguments are passed on unchanged.
                unsafe {
                    let f: unsafe extern "C" fn($($ty),*) -> CUresult = std::mem::transmute(p);
                    f($($arg),*)
                }
            }
        )*

        /// Every work hook and the driver name it replaces.
        pub fn table() -> Vec<(&'static CStr, *const c_void)> {
            vec![$(
                (super::guard::symbol(concat!(stringify!($name), "\0")), $name as *const c_void),
            )*]
        }
    };
}

type Func = *mut c_void;
type Params = *mut *mut c_void;
type Ptr = *const c_void;
type Ctx = CUcontext;

work_hooks! {
    cuLaunchKernel(f: Func, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shmem: c_uint, s: CUstream, p: Params, e: Params) => Queue::Stream(s);
    cuLaunchKernel_ptsz(f: Func, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shmem: c_uint, s: CUstream, p: Params, e: Params) => Queue::PerThread(s);
    cuLaunchKernelEx(c: *const LaunchConfigHead, f: Func, p: Params, e: Params) => Queue::Stream(
        // SAFETY: the caller's config, NULL or valid (the driver's contract).
        unsafe { config_stream(c) }
    );
    cuLaunchKernelEx_ptsz(c: *const LaunchConfigHead, f: Func, p: Params, e: Params) => Queue::PerThread(
        // SAFETY: the caller's config, NULL or valid (the driver's contract).
        unsafe { config_stream(c) }
    );
    cuLaunchCooperativeKernel(f: Func, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shmem: c_uint, s: CUstream, p: Params) => Queue::Stream(s);
    cuLaunchCooperativeKernel_ptsz(f: Func, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shmem: c_uint, s: CUstream, p: Params) => Queue::PerThread(s);
    cuLaunch(f: Func) => Queue::Legacy;
    cuLaunchGrid(f: Func, w: c_int, h: c_int) => Queue::Legacy;
    cuLaunchGridAsync(f: Func, w: c_int, h: c_int, s: CUstream) => Queue::Stream(s);

    cuMemcpy(d: DevPtr, src: DevPtr, n: usize) => Queue::Legacy;
    cuMemcpy_ptds(d: DevPtr, src: DevPtr, n: usize) => Queue::PerThreadDefault;
    cuMemcpyAsync(d: DevPtr, src: DevPtr, n: usize, s: CUstream) => Queue::Stream(s);
    cuMemcpyAsync_ptsz(d: DevPtr, src: DevPtr, n: usize, s: CUstream) => Queue::PerThread(s);
    cuMemcpyPeer(d: DevPtr, dc: Ctx, src: DevPtr, sc: Ctx, n: usize) => Queue::Legacy;
    cuMemcpyPeer_ptds(d: DevPtr, dc: Ctx, src: DevPtr, sc: Ctx, n: usize) => Queue::PerThreadDefault;
    cuMemcpyPeerAsync(d: DevPtr, dc: Ctx, src: DevPtr, sc: Ctx, n: usize, s: CUstream) => Queue::Stream(s);
    cuMemcpyPeerAsync_ptsz(d: DevPtr, dc: Ctx, src: DevPtr, sc: Ctx, n: usize, s: CUstream) => Queue::PerThread(s);
    cuMemcpyHtoD_v2(d: DevPtr, src: Ptr, n: usize) => Queue::Legacy;
    cuMemcpyHtoD_v2_ptds(d: DevPtr, src: Ptr, n: usize) => Queue::PerThreadDefault;
    cuMemcpyDtoH_v2(d: *mut c_void, src: DevPtr, n: usize) => Queue::Legacy;
    cuMemcpyDtoH_v2_ptds(d: *mut c_void, src: DevPtr, n: usize) => Queue::PerThreadDefault;
    cuMemcpyDtoD_v2(d: DevPtr, src: DevPtr, n: usize) => Queue::Legacy;
    cuMemcpyDtoD_v2_ptds(d: DevPtr, src: DevPtr, n: usize) => Queue::PerThreadDefault;
    cuMemcpyDtoA_v2(d: Func, off: usize, src: DevPtr, n: usize) => Queue::Legacy;
    cuMemcpyDtoA_v2_ptds(d: Func, off: usize, src: DevPtr, n: usize) => Queue::PerThreadDefault;
    cuMemcpyAtoD_v2(d: DevPtr, src: Func, off: usize, n: usize) => Queue::Legacy;
    cuMemcpyAtoD_v2_ptds(d: DevPtr, src: Func, off: usize, n: usize) => Queue::PerThreadDefault;
    cuMemcpy2D_v2(c: Ptr) => Queue::Legacy;
    cuMemcpy2D_v2_ptds(c: Ptr) => Queue::PerThreadDefault;
    cuMemcpy2DUnaligned_v2(c: Ptr) => Queue::Legacy;
    cuMemcpy2DUnaligned_v2_ptds(c: Ptr) => Queue::PerThreadDefault;
    cuMemcpy3D_v2(c: Ptr) => Queue::Legacy;
    cuMemcpy3D_v2_ptds(c: Ptr) => Queue::PerThreadDefault;
    cuMemcpy3DPeer(c: Ptr) => Queue::Legacy;
    cuMemcpy3DPeer_ptds(c: Ptr) => Queue::PerThreadDefault;
    cuMemcpyHtoDAsync_v2(d: DevPtr, src: Ptr, n: usize, s: CUstream) => Queue::Stream(s);
    cuMemcpyHtoDAsync_v2_ptsz(d: DevPtr, src: Ptr, n: usize, s: CUstream) => Queue::PerThread(s);
    cuMemcpyDtoHAsync_v2(d: *mut c_void, src: DevPtr, n: usize, s: CUstream) => Queue::Stream(s);
    cuMemcpyDtoHAsync_v2_ptsz(d: *mut c_void, src: DevPtr, n: usize, s: CUstream) => Queue::PerThread(s);
    cuMemcpyDtoDAsync_v2(d: DevPtr, src: DevPtr, n: usize, s: CUstream) => Queue::Stream(s);
    cuMemcpyDtoDAsync_v2_ptsz(d: DevPtr, src: DevPtr, n: usize, s: CUstream) => Queue::PerThread(s);
    cuMemcpy2DAsync_v2(c: Ptr, s: CUstream) => Queue::Stream(s);
    cuMemcpy2DAsync_v2_ptsz(c: Ptr, s: CUstream) => Queue::PerThread(s);
    cuMemcpy3DAsync_v2(c: Ptr, s: CUstream) => Queue::Stream(s);
    cuMemcpy3DAsync_v2_ptsz(c: Ptr, s: CUstream) => Queue::PerThread(s);
    cuMemcpy3DPeerAsync(c: Ptr, s: CUstream) => Queue::Stream(s);
    cuMemcpy3DPeerAsync_ptsz(c: Ptr, s: CUstream) => Queue::PerThread(s);
    // Batches (CUDA 12.8: with a failure index; 13.0: `_v2`, without), as cuda.h 13.0 spells
    // them.
    cuMemcpyBatchAsync(d: *mut DevPtr, src: *mut DevPtr, sz: *mut usize, n: usize, a: Func, ai: *mut usize, na: usize, fail: *mut usize, s: CUstream) => Queue::Stream(s);
    cuMemcpyBatchAsync_ptsz(d: *mut DevPtr, src: *mut DevPtr, sz: *mut usize, n: usize, a: Func, ai: *mut usize, na: usize, fail: *mut usize, s: CUstream) => Queue::PerThread(s);
    cuMemcpyBatchAsync_v2(d: *mut DevPtr, src: *mut DevPtr, sz: *mut usize, n: usize, a: Func, ai: *mut usize, na: usize, s: CUstream) => Queue::Stream(s);
    cuMemcpyBatchAsync_v2_ptsz(d: *mut DevPtr, src: *mut DevPtr, sz: *mut usize, n: usize, a: Func, ai: *mut usize, na: usize, s: CUstream) => Queue::PerThread(s);
    cuMemcpy3DBatchAsync(n: usize, ops: Func, fail: *mut usize, fl: u64, s: CUstream) => Queue::Stream(s);
    cuMemcpy3DBatchAsync_ptsz(n: usize, ops: Func, fail: *mut usize, fl: u64, s: CUstream) => Queue::PerThread(s);
    cuMemcpy3DBatchAsync_v2(n: usize, ops: Func, fl: u64, s: CUstream) => Queue::Stream(s);
    cuMemcpy3DBatchAsync_v2_ptsz(n: usize, ops: Func, fl: u64, s: CUstream) => Queue::PerThread(s);

    cuMemsetD8_v2(d: DevPtr, v: u8, n: usize) => Queue::Legacy;
    cuMemsetD8_v2_ptds(d: DevPtr, v: u8, n: usize) => Queue::PerThreadDefault;
    cuMemsetD16_v2(d: DevPtr, v: u16, n: usize) => Queue::Legacy;
    cuMemsetD16_v2_ptds(d: DevPtr, v: u16, n: usize) => Queue::PerThreadDefault;
    cuMemsetD32_v2(d: DevPtr, v: c_uint, n: usize) => Queue::Legacy;
    cuMemsetD32_v2_ptds(d: DevPtr, v: c_uint, n: usize) => Queue::PerThreadDefault;
    cuMemsetD2D8_v2(d: DevPtr, pitch: usize, v: u8, w: usize, h: usize) => Queue::Legacy;
    cuMemsetD2D8_v2_ptds(d: DevPtr, pitch: usize, v: u8, w: usize, h: usize) => Queue::PerThreadDefault;
    cuMemsetD2D16_v2(d: DevPtr, pitch: usize, v: u16, w: usize, h: usize) => Queue::Legacy;
    cuMemsetD2D16_v2_ptds(d: DevPtr, pitch: usize, v: u16, w: usize, h: usize) => Queue::PerThreadDefault;
    cuMemsetD2D32_v2(d: DevPtr, pitch: usize, v: c_uint, w: usize, h: usize) => Queue::Legacy;
    cuMemsetD2D32_v2_ptds(d: DevPtr, pitch: usize, v: c_uint, w: usize, h: usize) => Queue::PerThreadDefault;
    cuMemsetD8Async(d: DevPtr, v: u8, n: usize, s: CUstream) => Queue::Stream(s);
    cuMemsetD8Async_ptsz(d: DevPtr, v: u8, n: usize, s: CUstream) => Queue::PerThread(s);
    cuMemsetD16Async(d: DevPtr, v: u16, n: usize, s: CUstream) => Queue::Stream(s);
    cuMemsetD16Async_ptsz(d: DevPtr, v: u16, n: usize, s: CUstream) => Queue::PerThread(s);
    cuMemsetD32Async(d: DevPtr, v: c_uint, n: usize, s: CUstream) => Queue::Stream(s);
    cuMemsetD32Async_ptsz(d: DevPtr, v: c_uint, n: usize, s: CUstream) => Queue::PerThread(s);
    cuMemsetD2D8Async(d: DevPtr, pitch: usize, v: u8, w: usize, h: usize, s: CUstream) => Queue::Stream(s);
    cuMemsetD2D8Async_ptsz(d: DevPtr, pitch: usize, v: u8, w: usize, h: usize, s: CUstream) => Queue::PerThread(s);
    cuMemsetD2D16Async(d: DevPtr, pitch: usize, v: u16, w: usize, h: usize, s: CUstream) => Queue::Stream(s);
    cuMemsetD2D16Async_ptsz(d: DevPtr, pitch: usize, v: u16, w: usize, h: usize, s: CUstream) => Queue::PerThread(s);
    cuMemsetD2D32Async(d: DevPtr, pitch: usize, v: c_uint, w: usize, h: usize, s: CUstream) => Queue::Stream(s);
    cuMemsetD2D32Async_ptsz(d: DevPtr, pitch: usize, v: c_uint, w: usize, h: usize, s: CUstream) => Queue::PerThread(s);

    cuStreamWriteValue32(s: CUstream, a: DevPtr, v: u32, fl: c_uint) => Queue::Stream(s);
    cuStreamWriteValue32_ptsz(s: CUstream, a: DevPtr, v: u32, fl: c_uint) => Queue::PerThread(s);
    cuStreamWriteValue32_v2(s: CUstream, a: DevPtr, v: u32, fl: c_uint) => Queue::Stream(s);
    cuStreamWriteValue32_v2_ptsz(s: CUstream, a: DevPtr, v: u32, fl: c_uint) => Queue::PerThread(s);
    cuStreamWriteValue64(s: CUstream, a: DevPtr, v: u64, fl: c_uint) => Queue::Stream(s);
    cuStreamWriteValue64_ptsz(s: CUstream, a: DevPtr, v: u64, fl: c_uint) => Queue::PerThread(s);
    cuStreamWriteValue64_v2(s: CUstream, a: DevPtr, v: u64, fl: c_uint) => Queue::Stream(s);
    cuStreamWriteValue64_v2_ptsz(s: CUstream, a: DevPtr, v: u64, fl: c_uint) => Queue::PerThread(s);
    cuStreamWaitValue32(s: CUstream, a: DevPtr, v: u32, fl: c_uint) => Queue::Stream(s);
    cuStreamWaitValue32_ptsz(s: CUstream, a: DevPtr, v: u32, fl: c_uint) => Queue::PerThread(s);
    cuStreamWaitValue32_v2(s: CUstream, a: DevPtr, v: u32, fl: c_uint) => Queue::Stream(s);
    cuStreamWaitValue32_v2_ptsz(s: CUstream, a: DevPtr, v: u32, fl: c_uint) => Queue::PerThread(s);
    cuStreamWaitValue64(s: CUstream, a: DevPtr, v: u64, fl: c_uint) => Queue::Stream(s);
    cuStreamWaitValue64_ptsz(s: CUstream, a: DevPtr, v: u64, fl: c_uint) => Queue::PerThread(s);
    cuStreamWaitValue64_v2(s: CUstream, a: DevPtr, v: u64, fl: c_uint) => Queue::Stream(s);
    cuStreamWaitValue64_v2_ptsz(s: CUstream, a: DevPtr, v: u64, fl: c_uint) => Queue::PerThread(s);
    cuStreamBatchMemOp(s: CUstream, n: c_uint, ops: Func, fl: c_uint) => Queue::Stream(s);
    cuStreamBatchMemOp_ptsz(s: CUstream, n: c_uint, ops: Func, fl: c_uint) => Queue::PerThread(s);
    cuStreamBatchMemOp_v2(s: CUstream, n: c_uint, ops: Func, fl: c_uint) => Queue::Stream(s);
    cuStreamBatchMemOp_v2_ptsz(s: CUstream, n: c_uint, ops: Func, fl: c_uint) => Queue::PerThread(s);

    cuEventRecord(ev: CUevent, s: CUstream) => Queue::Stream(s);
    cuEventRecord_ptsz(ev: CUevent, s: CUstream) => Queue::PerThread(s);
    cuEventRecordWithFlags(ev: CUevent, s: CUstream, fl: c_uint) => Queue::Stream(s);
    cuEventRecordWithFlags_ptsz(ev: CUevent, s: CUstream, fl: c_uint) => Queue::PerThread(s);
    cuStreamWaitEvent(s: CUstream, ev: CUevent, fl: c_uint) => Queue::Stream(s);
    cuStreamWaitEvent_ptsz(s: CUstream, ev: CUevent, fl: c_uint) => Queue::PerThread(s);
}

/// Per-thread default stream entry points that issue no work touching memory a pool hands out
/// (queries, attributes, capture bookkeeping, host callbacks, managed-memory and array-only
/// operations). `interpose` hands them out as they are; any other `_ptsz`/`_ptds` entry point
/// that is not hooked goes behind a trampoline that makes reuse wait for fences
/// (`streams::UNWATCHED_WORK`).
pub const HARMLESS_PER_THREAD: &[&str] = &[
    "cuStreamGetPriority_ptsz",
    "cuStreamGetId_ptsz",
    "cuStreamGetFlags_ptsz",
    "cuStreamGetDevice_ptsz",
    "cuStreamGetCtx_ptsz",
    "cuStreamGetCtx_v2_ptsz",
    "cuStreamIsCapturing_ptsz",
    "cuStreamGetCaptureInfo_ptsz",
    "cuStreamGetCaptureInfo_v2_ptsz",
    "cuStreamGetCaptureInfo_v3_ptsz",
    "cuStreamUpdateCaptureDependencies_ptsz",
    "cuStreamUpdateCaptureDependencies_v2_ptsz",
    "cuStreamQuery_ptsz",
    "cuStreamSynchronize_ptsz",
    "cuStreamAddCallback_ptsz",
    "cuLaunchHostFunc_ptsz",
    "cuStreamAttachMemAsync_ptsz",
    "cuStreamCopyAttributes_ptsz",
    "cuStreamGetAttribute_ptsz",
    "cuStreamSetAttribute_ptsz",
    "cuMemPrefetchAsync_ptsz",
    "cuMemPrefetchAsync_v2_ptsz",
    "cuMemcpyHtoA_v2_ptds",
    "cuMemcpyAtoH_v2_ptds",
    "cuMemcpyAtoA_v2_ptds",
    "cuMemcpyHtoAAsync_v2_ptsz",
    "cuMemcpyAtoHAsync_v2_ptsz",
    "cuGraphicsMapResources_ptsz",
    "cuGraphicsUnmapResources_ptsz",
    "cuSignalExternalSemaphoresAsync_ptsz",
    "cuWaitExternalSemaphoresAsync_ptsz",
    "cuMemMapArrayAsync_ptsz",
];
