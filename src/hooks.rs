//! The C ABI of the shim: every `cu*` memory entry point it replaces, in one place.
//!
//! Each hook is exported under the driver's name (for programs linked with `-lcuda`) and is
//! what `interpose` hands out for `dlsym` and `cuGetProcAddress` lookups. A hook only checks
//! and converts raw pointers and result codes; what happens lives in `shim` (safe Rust).
//!
//! Every hook runs inside [`hook`]: a panic boundary (no unwinding through C), a per-thread
//! re-entry guard (a hook entered from inside a hook goes straight to the driver), and the
//! process state (disabled, refused by a bad setting, or active).
//!
//! Bad input (NULL out-pointers, size 0) is passed to the real driver untouched, so the program
//! gets the driver's own answer.
#![allow(non_snake_case)]

use crate::cu::*;
use crate::driver::{call, Driver};
use crate::shim::{Shim, State};
use std::cell::Cell;
use std::ffi::{c_int, c_uint, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};

thread_local! {
    /// True while this thread runs a hook body.
    static IN_HOOK: Cell<bool> = const { Cell::new(false) };
}

/// Marks this thread as inside a hook until dropped.
struct Reentry;

impl Reentry {
    /// `None` when this thread is already inside a hook.
    fn enter() -> Option<Reentry> {
        IN_HOOK.with(|f| (!f.replace(true)).then_some(Reentry))
    }
}

impl Drop for Reentry {
    fn drop(&mut self) {
        IN_HOOK.with(|f| f.set(false));
    }
}

/// Whether a hook refuses (allocations, memory queries) or forwards (frees, teardown) when a
/// `CUDAPOOL_*` value was bad.
#[derive(Clone, Copy, PartialEq, Eq)]
enum OnBadConfig {
    Refuse,
    Forward,
}

/// Runs `body` against the active shim, or `real` against the driver when the shim is
/// disabled, re-entered, or (for `Forward` hooks) refused. Never unwinds.
fn hook(
    on_bad: OnBadConfig,
    real: impl FnOnce(&'static Driver) -> CUresult,
    body: impl FnOnce(&'static Shim) -> CUresult,
) -> CUresult {
    catch_unwind(AssertUnwindSafe(|| {
        let forward = || Driver::get().map_or(CUDA_ERROR_NOT_INITIALIZED, real);
        let Some(_guard) = Reentry::enter() else {
            return forward();
        };
        match Shim::state() {
            State::Active(shim) => body(shim),
            State::Refused if on_bad == OnBadConfig::Refuse => CUDA_ERROR_NOT_INITIALIZED,
            _ => forward(),
        }
    }))
    .unwrap_or(CUDA_ERROR_UNKNOWN)
}

/// A panic boundary for exported functions that are not driver hooks.
pub fn boundary<T>(fallback: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(fallback)
}

/// Writes `v` through an out-pointer the hook checked to be non-null.
///
/// # Safety
/// `p` must be non-null and valid for a write of `T` (the driver's contract with the caller).
unsafe fn put<T>(p: *mut T, v: T) {
    // SAFETY: guaranteed by the caller.
    unsafe { p.write(v) }
}

/// Writes `v` through `p` unless `p` is NULL.
///
/// # Safety
/// `p` must be NULL or valid for a write of `T`.
unsafe fn put_some<T>(p: *mut T, v: T) {
    if !p.is_null() {
        // SAFETY: non-null, and valid by the caller's contract.
        unsafe { put(p, v) }
    }
}

fn to_result(r: Result<(), CUresult>) -> CUresult {
    r.err().unwrap_or(CUDA_SUCCESS)
}

// ---- allocation -------------------------------------------------------------------------

/// # Safety
/// The driver's contract for this entry point: out-pointers are NULL or valid for writes
/// (NULL gets the driver's own answer).
#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut DevPtr, bytesize: usize) -> CUresult {
    let real = |d: &Driver| call!(d, mem_alloc_v2(dptr, bytesize));
    hook(OnBadConfig::Refuse, real, |shim| {
        if dptr.is_null() || bytesize == 0 {
            return real(shim.driver);
        }
        to_result(shim.mem_alloc(bytesize as u64).map(|p| {
            // SAFETY: checked non-null above; the caller passes a writable CUdeviceptr.
            unsafe { put(dptr, p) }
        }))
    })
}

/// The legacy 32-bit `cuMemAlloc`: passed through to the driver's own and counted.
///
/// # Safety
/// The driver's contract for this entry point: out-pointers are NULL or valid for writes
/// (NULL gets the driver's own answer).
#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc(dptr: *mut u32, bytesize: c_uint) -> CUresult {
    let real = |d: &Driver| call!(d, mem_alloc_v1(dptr, bytesize));
    hook(OnBadConfig::Refuse, real, |shim| {
        if dptr.is_null() || bytesize == 0 {
            return real(shim.driver);
        }
        let d = shim.driver;
        let got = shim.alloc_counted(
            bytesize as u64,
            || {
                let mut p = 0u32;
                match call!(d, mem_alloc_v1(&mut p, bytesize)) {
                    CUDA_SUCCESS => Ok((p as DevPtr, bytesize as u64)),
                    e => Err(e),
                }
            },
            |p| {
                call!(d, mem_free_v1(p as u32));
            },
        );
        to_result(got.map(|p| {
            // SAFETY: checked non-null above.
            unsafe { put(dptr, p as u32) }
        }))
    })
}

/// # Safety
/// The driver's contract for this entry point: out-pointers are NULL or valid for writes
/// (NULL gets the driver's own answer).
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut DevPtr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    elem: c_uint,
) -> CUresult {
    let real = |d: &Driver| call!(d, mem_alloc_pitch_v2(dptr, pitch, width, height, elem));
    hook(OnBadConfig::Refuse, real, |shim| {
        let Some(least) = width.checked_mul(height).filter(|&n| n > 0) else {
            return real(shim.driver);
        };
        if dptr.is_null() || pitch.is_null() {
            return real(shim.driver);
        }
        let d = shim.driver;
        let mut row_pitch = 0usize;
        let got = shim.alloc_counted(
            least as u64,
            || {
                let mut p = 0 as DevPtr;
                match call!(
                    d,
                    mem_alloc_pitch_v2(&mut p, &mut row_pitch, width, height, elem)
                ) {
                    CUDA_SUCCESS => Ok((p, row_pitch as u64 * height as u64)),
                    e => Err(e),
                }
            },
            |p| {
                call!(d, mem_free_v2(p));
            },
        );
        to_result(got.map(|p| {
            // SAFETY: both checked non-null above.
            unsafe {
                put(dptr, p);
                put(pitch, row_pitch);
            }
        }))
    })
}

/// # Safety
/// The driver's contract for this entry point: out-pointers are NULL or valid for writes
/// (NULL gets the driver's own answer).
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocPitch(
    dptr: *mut u32,
    pitch: *mut c_uint,
    width: c_uint,
    height: c_uint,
    elem: c_uint,
) -> CUresult {
    let real = |d: &Driver| call!(d, mem_alloc_pitch_v1(dptr, pitch, width, height, elem));
    hook(OnBadConfig::Refuse, real, |shim| {
        let least = width as u64 * height as u64;
        if dptr.is_null() || pitch.is_null() || least == 0 {
            return real(shim.driver);
        }
        let d = shim.driver;
        let mut row_pitch = 0 as c_uint;
        let got = shim.alloc_counted(
            least,
            || {
                let mut p = 0u32;
                match call!(
                    d,
                    mem_alloc_pitch_v1(&mut p, &mut row_pitch, width, height, elem)
                ) {
                    CUDA_SUCCESS => Ok((p as DevPtr, row_pitch as u64 * height as u64)),
                    e => Err(e),
                }
            },
            |p| {
                call!(d, mem_free_v1(p as u32));
            },
        );
        to_result(got.map(|p| {
            // SAFETY: both checked non-null above.
            unsafe {
                put(dptr, p as u32);
                put(pitch, row_pitch);
            }
        }))
    })
}

// ---- free -------------------------------------------------------------------------------

/// # Safety
/// The driver's contract for this entry point: out-pointers are NULL or valid for writes
/// (NULL gets the driver's own answer).
#[no_mangle]
pub unsafe extern "C" fn cuMemFree_v2(dptr: DevPtr) -> CUresult {
    let real = move |d: &Driver| call!(d, mem_free_v2(dptr));
    hook(OnBadConfig::Forward, real, |shim| {
        shim.mem_free(dptr, |p| call!(shim.driver, mem_free_v2(p)))
    })
}

/// # Safety
/// The driver's contract for this entry point: out-pointers are NULL or valid for writes
/// (NULL gets the driver's own answer).
#[no_mangle]
pub unsafe extern "C" fn cuMemFree(dptr: u32) -> CUresult {
    let real = move |d: &Driver| call!(d, mem_free_v1(dptr));
    hook(OnBadConfig::Forward, real, |shim| {
        shim.mem_free(dptr as DevPtr, |p| {
            call!(shim.driver, mem_free_v1(p as u32))
        })
    })
}

// ---- queries ----------------------------------------------------------------------------

/// # Safety
/// The driver's contract for this entry point: out-pointers are NULL or valid for writes
/// (NULL gets the driver's own answer).
#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    let real = |d: &Driver| call!(d, mem_get_info_v2(free, total));
    hook(OnBadConfig::Refuse, real, |shim| {
        if free.is_null() && total.is_null() {
            return real(shim.driver);
        }
        // The driver fills whichever out-pointer is non-NULL; so does the hook, through the limit.
        to_result(shim.mem_get_info().map(|(f, t)| {
            // SAFETY: each written only when non-null.
            unsafe {
                put_some(free, f as usize);
                put_some(total, t as usize);
            }
        }))
    })
}

/// # Safety
/// The driver's contract for this entry point: out-pointers are NULL or valid for writes
/// (NULL gets the driver's own answer).
#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo(free: *mut c_uint, total: *mut c_uint) -> CUresult {
    let real = |d: &Driver| call!(d, mem_get_info_v1(free, total));
    hook(OnBadConfig::Refuse, real, |shim| {
        if free.is_null() && total.is_null() {
            return real(shim.driver);
        }
        let clamp = |v: u64| v.min(c_uint::MAX as u64) as c_uint;
        to_result(shim.mem_get_info().map(|(f, t)| {
            // SAFETY: each written only when non-null.
            unsafe {
                put_some(free, clamp(f));
                put_some(total, clamp(t));
            }
        }))
    })
}

/// Answers for the driver's real allocation. Every block the `none` pool hands out is one, so
/// the driver's answer is the truth (DESIGN.md trap 7); sub-allocating pools will answer with
/// their segment here.
///
/// # Safety
/// The driver's contract for this entry point: out-pointers are NULL or valid for writes
/// (NULL gets the driver's own answer).
#[no_mangle]
pub unsafe extern "C" fn cuMemGetAddressRange_v2(
    base: *mut DevPtr,
    size: *mut usize,
    dptr: DevPtr,
) -> CUresult {
    let real = move |d: &Driver| call!(d, mem_get_address_range_v2(base, size, dptr));
    hook(OnBadConfig::Forward, real, |shim| real(shim.driver))
}

/// # Safety
/// The driver's contract for this entry point: out-pointers are NULL or valid for writes
/// (NULL gets the driver's own answer).
#[no_mangle]
pub unsafe extern "C" fn cuMemGetAddressRange(
    base: *mut u32,
    size: *mut c_uint,
    dptr: u32,
) -> CUresult {
    let real = move |d: &Driver| call!(d, mem_get_address_range_v1(base, size, dptr));
    hook(OnBadConfig::Forward, real, |shim| real(shim.driver))
}

// ---- context teardown: cached and live blocks die with their context --------------------

fn destroy(shim: &Shim, ctx: CUcontext, r: CUresult) -> CUresult {
    if r == CUDA_SUCCESS && !ctx.is_null() {
        shim.context_gone(ctx as usize);
    }
    r
}

/// # Safety
/// The driver's contract for this entry point: out-pointers are NULL or valid for writes
/// (NULL gets the driver's own answer).
#[no_mangle]
pub unsafe extern "C" fn cuCtxDestroy_v2(ctx: CUcontext) -> CUresult {
    let real = move |d: &Driver| call!(d, ctx_destroy_v2(ctx));
    hook(OnBadConfig::Forward, real, |shim| {
        destroy(shim, ctx, real(shim.driver))
    })
}

/// # Safety
/// The driver's contract for this entry point: out-pointers are NULL or valid for writes
/// (NULL gets the driver's own answer).
#[no_mangle]
pub unsafe extern "C" fn cuCtxDestroy(ctx: CUcontext) -> CUresult {
    let real = move |d: &Driver| call!(d, ctx_destroy_v1(ctx));
    hook(OnBadConfig::Forward, real, |shim| {
        destroy(shim, ctx, real(shim.driver))
    })
}

/// A reset destroys the primary context whatever its reference count.
fn primary_reset(shim: &Shim, dev: CUdevice, real: impl FnOnce(&Driver) -> CUresult) -> CUresult {
    let primary = shim.primary_context(dev);
    let r = real(shim.driver);
    if let (CUDA_SUCCESS, Some(ctx)) = (r, primary) {
        shim.context_gone(ctx);
    }
    r
}

/// A release destroys the primary context when it drops the last reference.
fn primary_release(shim: &Shim, dev: CUdevice, real: impl FnOnce(&Driver) -> CUresult) -> CUresult {
    let primary = shim.primary_context(dev);
    let r = real(shim.driver);
    if let (CUDA_SUCCESS, Some(ctx)) = (r, primary) {
        if !shim.driver.primary_context_active(dev) {
            shim.context_gone(ctx);
        }
    }
    r
}

/// # Safety
/// The driver's contract for this entry point: out-pointers are NULL or valid for writes
/// (NULL gets the driver's own answer).
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) -> CUresult {
    let real = move |d: &Driver| call!(d, primary_ctx_reset_v2(dev));
    hook(OnBadConfig::Forward, real, |shim| {
        primary_reset(shim, dev, real)
    })
}

/// # Safety
/// The driver's contract for this entry point: out-pointers are NULL or valid for writes
/// (NULL gets the driver's own answer).
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxReset(dev: CUdevice) -> CUresult {
    let real = move |d: &Driver| call!(d, primary_ctx_reset_v1(dev));
    hook(OnBadConfig::Forward, real, |shim| {
        primary_reset(shim, dev, real)
    })
}

/// # Safety
/// The driver's contract for this entry point: out-pointers are NULL or valid for writes
/// (NULL gets the driver's own answer).
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult {
    let real = move |d: &Driver| call!(d, primary_ctx_release_v2(dev));
    hook(OnBadConfig::Forward, real, |shim| {
        primary_release(shim, dev, real)
    })
}

/// # Safety
/// The driver's contract for this entry point: out-pointers are NULL or valid for writes
/// (NULL gets the driver's own answer).
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease(dev: CUdevice) -> CUresult {
    let real = move |d: &Driver| call!(d, primary_ctx_release_v1(dev));
    hook(OnBadConfig::Forward, real, |shim| {
        primary_release(shim, dev, real)
    })
}

// ---- streams: which work a fence must cover (see `streams`) -------------------------------

fn created(shim: &Shim, stream: *mut CUstream, flags: c_uint, r: CUresult) -> CUresult {
    if r == CUDA_SUCCESS && !stream.is_null() {
        // SAFETY: non-null, and the driver has just written the new stream there.
        shim.stream_created(unsafe { *stream } as usize, flags);
    }
    r
}

/// # Safety
/// The driver's contract for this entry point: `stream` NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn cuStreamCreate(stream: *mut CUstream, flags: c_uint) -> CUresult {
    let real = move |d: &Driver| call!(d, stream_create(stream, flags));
    hook(OnBadConfig::Forward, real, |shim| {
        created(shim, stream, flags, real(shim.driver))
    })
}

/// # Safety
/// The driver's contract for this entry point: `stream` NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn cuStreamCreateWithPriority(
    stream: *mut CUstream,
    flags: c_uint,
    priority: c_int,
) -> CUresult {
    let real = move |d: &Driver| call!(d, stream_create_with_priority(stream, flags, priority));
    hook(OnBadConfig::Forward, real, |shim| {
        created(shim, stream, flags, real(shim.driver))
    })
}

/// # Safety
/// The driver's contract for this entry point.
#[no_mangle]
pub unsafe extern "C" fn cuStreamDestroy_v2(stream: CUstream) -> CUresult {
    let real = move |d: &Driver| call!(d, stream_destroy_v2(stream));
    hook(OnBadConfig::Forward, real, |shim| {
        shim.stream_destroying(stream as usize);
        real(shim.driver)
    })
}

/// # Safety
/// The driver's contract for this entry point.
#[no_mangle]
pub unsafe extern "C" fn cuStreamDestroy(stream: CUstream) -> CUresult {
    let real = move |d: &Driver| call!(d, stream_destroy_v1(stream));
    hook(OnBadConfig::Forward, real, |shim| {
        shim.stream_destroying(stream as usize);
        real(shim.driver)
    })
}

fn begun(r: CUresult) -> CUresult {
    if r == CUDA_SUCCESS {
        crate::streams::capture_begun();
    }
    r
}

/// # Safety
/// The driver's contract for this entry point.
#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCapture(stream: CUstream) -> CUresult {
    let real = move |d: &Driver| call!(d, stream_begin_capture_v1(stream));
    hook(OnBadConfig::Forward, real, |shim| begun(real(shim.driver)))
}

/// # Safety
/// The driver's contract for this entry point.
#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCapture_v2(stream: CUstream, mode: c_int) -> CUresult {
    let real = move |d: &Driver| call!(d, stream_begin_capture_v2(stream, mode));
    hook(OnBadConfig::Forward, real, |shim| begun(real(shim.driver)))
}

/// # Safety
/// The driver's contract for this entry point.
#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCapture_ptsz(stream: CUstream) -> CUresult {
    let real = move |d: &Driver| call!(d, stream_begin_capture_ptsz(stream));
    hook(OnBadConfig::Forward, real, |shim| begun(real(shim.driver)))
}

/// # Safety
/// The driver's contract for this entry point.
#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCapture_v2_ptsz(stream: CUstream, mode: c_int) -> CUresult {
    let real = move |d: &Driver| call!(d, stream_begin_capture_v2_ptsz(stream, mode));
    hook(OnBadConfig::Forward, real, |shim| begun(real(shim.driver)))
}

/// Ends a capture: counted as ended when the stream was capturing before the call.
fn end_capture(shim: &Shim, stream: CUstream, real: impl FnOnce(&Driver) -> CUresult) -> CUresult {
    let mut status: c_int = 0;
    let was =
        call!(shim.driver, stream_is_capturing(stream, &mut status)) == CUDA_SUCCESS && status != 0;
    let r = real(shim.driver);
    if was {
        crate::streams::capture_ended();
    }
    r
}

/// # Safety
/// The driver's contract for this entry point: `graph` NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn cuStreamEndCapture(stream: CUstream, graph: *mut *mut c_void) -> CUresult {
    let real = move |d: &Driver| call!(d, stream_end_capture(stream, graph));
    hook(OnBadConfig::Forward, real, |shim| {
        end_capture(shim, stream, real)
    })
}

/// # Safety
/// The driver's contract for this entry point: `graph` NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn cuStreamEndCapture_ptsz(
    stream: CUstream,
    graph: *mut *mut c_void,
) -> CUresult {
    let real = move |d: &Driver| call!(d, stream_end_capture_ptsz(stream, graph));
    hook(OnBadConfig::Forward, real, |shim| {
        end_capture(shim, stream, real)
    })
}

/// Every hook and the driver name it replaces; `interpose` substitutes by this table.
pub fn table() -> [(&'static std::ffi::CStr, *const c_void); 28] {
    [
        (c"cuStreamCreate", cuStreamCreate as *const c_void),
        (
            c"cuStreamCreateWithPriority",
            cuStreamCreateWithPriority as *const c_void,
        ),
        (c"cuStreamDestroy_v2", cuStreamDestroy_v2 as *const c_void),
        (c"cuStreamDestroy", cuStreamDestroy as *const c_void),
        (
            c"cuStreamBeginCapture",
            cuStreamBeginCapture as *const c_void,
        ),
        (
            c"cuStreamBeginCapture_v2",
            cuStreamBeginCapture_v2 as *const c_void,
        ),
        (
            c"cuStreamBeginCapture_ptsz",
            cuStreamBeginCapture_ptsz as *const c_void,
        ),
        (
            c"cuStreamBeginCapture_v2_ptsz",
            cuStreamBeginCapture_v2_ptsz as *const c_void,
        ),
        (c"cuStreamEndCapture", cuStreamEndCapture as *const c_void),
        (
            c"cuStreamEndCapture_ptsz",
            cuStreamEndCapture_ptsz as *const c_void,
        ),
        (c"cuMemAlloc_v2", cuMemAlloc_v2 as *const c_void),
        (c"cuMemAlloc", cuMemAlloc as *const c_void),
        (c"cuMemAllocPitch_v2", cuMemAllocPitch_v2 as *const c_void),
        (c"cuMemAllocPitch", cuMemAllocPitch as *const c_void),
        (c"cuMemFree_v2", cuMemFree_v2 as *const c_void),
        (c"cuMemFree", cuMemFree as *const c_void),
        (c"cuMemGetInfo_v2", cuMemGetInfo_v2 as *const c_void),
        (c"cuMemGetInfo", cuMemGetInfo as *const c_void),
        (
            c"cuMemGetAddressRange_v2",
            cuMemGetAddressRange_v2 as *const c_void,
        ),
        (
            c"cuMemGetAddressRange",
            cuMemGetAddressRange as *const c_void,
        ),
        (c"cuCtxDestroy_v2", cuCtxDestroy_v2 as *const c_void),
        (c"cuCtxDestroy", cuCtxDestroy as *const c_void),
        (
            c"cuDevicePrimaryCtxReset_v2",
            cuDevicePrimaryCtxReset_v2 as *const c_void,
        ),
        (
            c"cuDevicePrimaryCtxReset",
            cuDevicePrimaryCtxReset as *const c_void,
        ),
        (
            c"cuDevicePrimaryCtxRelease_v2",
            cuDevicePrimaryCtxRelease_v2 as *const c_void,
        ),
        (
            c"cuDevicePrimaryCtxRelease",
            cuDevicePrimaryCtxRelease as *const c_void,
        ),
        (
            c"cuGetProcAddress_v2",
            crate::interpose::cuGetProcAddress_v2 as *const c_void,
        ),
        (
            c"cuGetProcAddress",
            crate::interpose::cuGetProcAddress as *const c_void,
        ),
    ]
}
