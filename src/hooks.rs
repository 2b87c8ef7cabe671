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
        shim.mem_free(dptr, None, |p| call!(shim.driver, mem_free_v2(p)))
    })
}

/// # Safety
/// The driver's contract for this entry point: out-pointers are NULL or valid for writes
/// (NULL gets the driver's own answer).
#[no_mangle]
pub unsafe extern "C" fn cuMemFree(dptr: u32) -> CUresult {
    let real = move |d: &Driver| call!(d, mem_free_v1(dptr));
    hook(OnBadConfig::Forward, real, |shim| {
        shim.mem_free(dptr as DevPtr, None, |p| {
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

/// # Safety
/// The driver's contract for this entry point.
#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCaptureToGraph(
    stream: CUstream,
    graph: *mut c_void,
    deps: *const c_void,
    edges: *const c_void,
    n: usize,
    mode: c_int,
) -> CUresult {
    let real = move |d: &Driver| {
        call!(
            d,
            stream_begin_capture_to_graph(stream, graph, deps, edges, n, mode)
        )
    };
    hook(OnBadConfig::Forward, real, |shim| begun(real(shim.driver)))
}

/// # Safety
/// The driver's contract for this entry point.
#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCaptureToGraph_ptsz(
    stream: CUstream,
    graph: *mut c_void,
    deps: *const c_void,
    edges: *const c_void,
    n: usize,
    mode: c_int,
) -> CUresult {
    let real = move |d: &Driver| {
        call!(
            d,
            stream_begin_capture_to_graph_ptsz(stream, graph, deps, edges, n, mode)
        )
    };
    hook(OnBadConfig::Forward, real, |shim| begun(real(shim.driver)))
}

// ---- stream-ordered allocation: pooled, reusable at once on the freeing stream ------------

/// The driver's `cuMemAllocAsync` or its `_ptsz` variant.
fn real_alloc_async(d: &Driver, p: *mut DevPtr, n: usize, s: CUstream, ptsz: bool) -> CUresult {
    if ptsz {
        call!(d, mem_alloc_async_ptsz(p, n, s))
    } else {
        call!(d, mem_alloc_async(p, n, s))
    }
}

/// The driver's `cuMemFreeAsync` or its `_ptsz` variant.
fn real_free_async(d: &Driver, p: DevPtr, s: CUstream, ptsz: bool) -> CUresult {
    if ptsz {
        call!(d, mem_free_async_ptsz(p, s))
    } else {
        call!(d, mem_free_async(p, s))
    }
}

fn alloc_async(dptr: *mut DevPtr, bytesize: usize, stream: CUstream, ptsz: bool) -> CUresult {
    let real = move |d: &Driver| real_alloc_async(d, dptr, bytesize, stream, ptsz);
    hook(OnBadConfig::Refuse, real, |shim| {
        if dptr.is_null() || bytesize == 0 {
            return real(shim.driver);
        }
        let d = shim.driver;
        let got = shim.mem_alloc_async(
            bytesize as u64,
            stream as usize,
            ptsz,
            || {
                let mut p: DevPtr = 0;
                match real_alloc_async(d, &mut p, bytesize, stream, ptsz) {
                    CUDA_SUCCESS => Ok(p),
                    e => Err(e),
                }
            },
            |p| {
                real_free_async(d, p, stream, ptsz);
            },
        );
        to_result(got.map(|p| {
            // SAFETY: checked non-null above; the caller passes a writable CUdeviceptr.
            unsafe { put(dptr, p) }
        }))
    })
}

fn free_async(dptr: DevPtr, stream: CUstream, ptsz: bool) -> CUresult {
    let real = move |d: &Driver| real_free_async(d, dptr, stream, ptsz);
    hook(OnBadConfig::Forward, real, |shim| {
        shim.mem_free(dptr, Some((stream as usize, ptsz)), |p| {
            real_free_async(shim.driver, p, stream, ptsz)
        })
    })
}

/// # Safety
/// The driver's contract for this entry point: `dptr` NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync(
    dptr: *mut DevPtr,
    bytesize: usize,
    stream: CUstream,
) -> CUresult {
    alloc_async(dptr, bytesize, stream, false)
}

/// # Safety
/// The driver's contract for this entry point: `dptr` NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync_ptsz(
    dptr: *mut DevPtr,
    bytesize: usize,
    stream: CUstream,
) -> CUresult {
    alloc_async(dptr, bytesize, stream, true)
}

/// # Safety
/// The driver's contract for this entry point.
#[no_mangle]
pub unsafe extern "C" fn cuMemFreeAsync(dptr: DevPtr, stream: CUstream) -> CUresult {
    free_async(dptr, stream, false)
}

/// # Safety
/// The driver's contract for this entry point.
#[no_mangle]
pub unsafe extern "C" fn cuMemFreeAsync_ptsz(dptr: DevPtr, stream: CUstream) -> CUresult {
    free_async(dptr, stream, true)
}

// ---- driver memory pools: passed through, what they reserve is counted --------------------

fn real_alloc_from_pool(
    d: &Driver,
    p: *mut DevPtr,
    n: usize,
    pool: Opaque,
    s: CUstream,
    ptsz: bool,
) -> CUresult {
    if ptsz {
        call!(d, mem_alloc_from_pool_async_ptsz(p, n, pool, s))
    } else {
        call!(d, mem_alloc_from_pool_async(p, n, pool, s))
    }
}

fn alloc_from_pool(
    dptr: *mut DevPtr,
    bytesize: usize,
    pool: Opaque,
    stream: CUstream,
    ptsz: bool,
) -> CUresult {
    let real = move |d: &Driver| real_alloc_from_pool(d, dptr, bytesize, pool, stream, ptsz);
    hook(OnBadConfig::Refuse, real, |shim| {
        let d = shim.driver;
        if dptr.is_null() || bytesize == 0 || pool.is_null() {
            return real(d);
        }
        let alloc = || {
            let mut p: DevPtr = 0;
            match real_alloc_from_pool(d, &mut p, bytesize, pool, stream, ptsz) {
                CUDA_SUCCESS => Ok(p),
                e => Err(e),
            }
        };
        let size = bytesize as u64;
        let resolved = crate::streams::resolve(stream as usize, ptsz);
        let got = if crate::streams::capturing(d, resolved) {
            // A node of the graph being captured: counted at its size.
            shim.alloc_counted(
                size,
                || alloc().map(|p| (p, size)),
                |p| {
                    real_free_async(d, p, stream, ptsz);
                },
            )
        } else {
            match shim.stream_context(resolved) {
                Ok(ctx_dev) => {
                    shim.alloc_from_driver_pool(pool as usize, size, ctx_dev, alloc, |p| {
                        real_free_async(d, p, stream, ptsz);
                        call!(d, stream_synchronize(resolved as CUstream));
                    })
                }
                Err(_) => return real(d),
            }
        };
        to_result(got.map(|p| {
            // SAFETY: checked non-null above.
            unsafe { put(dptr, p) }
        }))
    })
}

/// # Safety
/// The driver's contract for this entry point: `dptr` NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync(
    dptr: *mut DevPtr,
    bytesize: usize,
    pool: Opaque,
    stream: CUstream,
) -> CUresult {
    alloc_from_pool(dptr, bytesize, pool, stream, false)
}

/// # Safety
/// The driver's contract for this entry point: `dptr` NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync_ptsz(
    dptr: *mut DevPtr,
    bytesize: usize,
    pool: Opaque,
    stream: CUstream,
) -> CUresult {
    alloc_from_pool(dptr, bytesize, pool, stream, true)
}

/// # Safety
/// The driver's contract for this entry point: `pool` NULL or valid for writes, `props` NULL
/// or a valid `CUmemPoolProps`.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolCreate(pool: *mut Opaque, props: *const MemPropHead) -> CUresult {
    let real = move |d: &Driver| call!(d, mem_pool_create(pool, props));
    hook(OnBadConfig::Forward, real, |shim| {
        let r = real(shim.driver);
        if r == CUDA_SUCCESS && !pool.is_null() && !props.is_null() {
            // SAFETY: both non-null; the driver accepted `props` and wrote the new pool.
            let (p, head) = unsafe { (*pool, &*props) };
            shim.driver_pool_created(p as usize, head.location_type, head.location_id);
        }
        r
    })
}

/// # Safety
/// The driver's contract for this entry point.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolDestroy(pool: Opaque) -> CUresult {
    let real = move |d: &Driver| call!(d, mem_pool_destroy(pool));
    hook(OnBadConfig::Forward, real, |shim| {
        let live = shim.live_bytes_of_driver_pool(pool as usize);
        let r = real(shim.driver);
        if r == CUDA_SUCCESS {
            shim.driver_pool_destroyed(pool as usize, live);
        }
        r
    })
}

/// # Safety
/// The driver's contract for this entry point.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolTrimTo(pool: Opaque, keep: usize) -> CUresult {
    let real = move |d: &Driver| call!(d, mem_pool_trim_to(pool, keep));
    hook(OnBadConfig::Forward, real, |shim| {
        let r = real(shim.driver);
        if r == CUDA_SUCCESS {
            shim.driver_pool_trimmed(pool as usize);
        }
        r
    })
}

// ---- managed memory: passed through and counted -------------------------------------------

/// # Safety
/// The driver's contract for this entry point: `dptr` NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocManaged(
    dptr: *mut DevPtr,
    bytesize: usize,
    flags: c_uint,
) -> CUresult {
    let real = move |d: &Driver| call!(d, mem_alloc_managed(dptr, bytesize, flags));
    hook(OnBadConfig::Refuse, real, |shim| {
        if dptr.is_null() || bytesize == 0 {
            return real(shim.driver);
        }
        let d = shim.driver;
        let size = bytesize as u64;
        let got = shim.alloc_counted(
            size,
            || {
                let mut p: DevPtr = 0;
                match call!(d, mem_alloc_managed(&mut p, bytesize, flags)) {
                    CUDA_SUCCESS => Ok((p, size)),
                    e => Err(e),
                }
            },
            |p| {
                call!(d, mem_free_v2(p));
            },
        );
        to_result(got.map(|p| {
            // SAFETY: checked non-null above.
            unsafe { put(dptr, p) }
        }))
    })
}

// ---- virtual memory management: physical memory is counted until the driver frees it ------

/// # Safety
/// The driver's contract for this entry point: `handle` NULL or valid for writes, `prop` NULL
/// or a valid `CUmemAllocationProp`.
#[no_mangle]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut MemHandle,
    size: usize,
    prop: *const MemPropHead,
    flags: u64,
) -> CUresult {
    let real = move |d: &Driver| call!(d, mem_create(handle, size, prop, flags));
    hook(OnBadConfig::Refuse, real, |shim| {
        if handle.is_null() || prop.is_null() || size == 0 {
            return real(shim.driver);
        }
        // SAFETY: non-null; a `CUmemAllocationProp` starts with these fields.
        let head = unsafe { &*prop };
        let d = shim.driver;
        let got = shim.mem_create(size as u64, (head.location_type, head.location_id), || {
            let mut h: MemHandle = 0;
            match call!(d, mem_create(&mut h, size, prop, flags)) {
                CUDA_SUCCESS => Ok(h),
                e => Err(e),
            }
        });
        to_result(got.map(|h| {
            // SAFETY: checked non-null above.
            unsafe { put(handle, h) }
        }))
    })
}

/// # Safety
/// The driver's contract for this entry point.
#[no_mangle]
pub unsafe extern "C" fn cuMemRelease(handle: MemHandle) -> CUresult {
    let real = move |d: &Driver| call!(d, mem_release(handle));
    hook(OnBadConfig::Forward, real, |shim| {
        let r = real(shim.driver);
        if r == CUDA_SUCCESS {
            shim.mem_released(handle);
        }
        r
    })
}

/// # Safety
/// The driver's contract for this entry point.
#[no_mangle]
pub unsafe extern "C" fn cuMemMap(
    ptr: DevPtr,
    size: usize,
    offset: usize,
    handle: MemHandle,
    flags: u64,
) -> CUresult {
    let real = move |d: &Driver| call!(d, mem_map(ptr, size, offset, handle, flags));
    hook(OnBadConfig::Forward, real, |shim| {
        let r = real(shim.driver);
        if r == CUDA_SUCCESS {
            shim.mem_mapped(ptr, size as u64, handle);
        }
        r
    })
}

/// # Safety
/// The driver's contract for this entry point.
#[no_mangle]
pub unsafe extern "C" fn cuMemUnmap(ptr: DevPtr, size: usize) -> CUresult {
    let real = move |d: &Driver| call!(d, mem_unmap(ptr, size));
    hook(OnBadConfig::Forward, real, |shim| {
        let r = real(shim.driver);
        if r == CUDA_SUCCESS {
            shim.mem_unmapped(ptr, size as u64);
        }
        r
    })
}

/// # Safety
/// The driver's contract for this entry point: `handle` NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn cuMemRetainAllocationHandle(
    handle: *mut MemHandle,
    addr: *mut c_void,
) -> CUresult {
    let real = move |d: &Driver| call!(d, mem_retain_allocation_handle(handle, addr));
    hook(OnBadConfig::Forward, real, |shim| {
        let r = real(shim.driver);
        if r == CUDA_SUCCESS && !handle.is_null() {
            // SAFETY: non-null, and the driver has just written the handle there.
            shim.mem_retained(unsafe { *handle });
        }
        r
    })
}

// ---- arrays: passed through, counted at their real footprint -----------------------------

/// Creates an array of `desc` through `create` (which writes the handle to a local), counted.
fn array_create(
    out: *mut Opaque,
    desc: Option<Array3DDesc>,
    levels: Option<u32>,
    real: impl Fn(&Driver, *mut Opaque) -> CUresult,
) -> CUresult {
    hook(
        OnBadConfig::Refuse,
        |d| real(d, out),
        |shim| {
            let d = shim.driver;
            let Some(desc) = desc.filter(|_| !out.is_null()) else {
                return real(d, out);
            };
            let got = shim.array_create(&desc, levels, || {
                let mut h: Opaque = std::ptr::null_mut();
                match real(d, &mut h) {
                    CUDA_SUCCESS => Ok(h),
                    e => Err(e),
                }
            });
            to_result(got.map(|h| {
                // SAFETY: checked non-null above.
                unsafe { put(out, h) }
            }))
        },
    )
}

/// Reads a descriptor the program passed (NULL gives `None`, for the driver's own answer).
///
/// # Safety
/// `p` is NULL or points to a valid `T`.
unsafe fn read_desc<T: Copy + Into<Array3DDesc>>(p: *const T) -> Option<Array3DDesc> {
    // SAFETY: non-null by the check; valid by the caller's contract.
    (!p.is_null()).then(|| unsafe { *p }.into())
}

/// # Safety
/// The driver's contract for this entry point.
#[no_mangle]
pub unsafe extern "C" fn cuArrayCreate_v2(arr: *mut Opaque, desc: *const ArrayDesc) -> CUresult {
    // SAFETY: the caller's descriptor, NULL or valid.
    let d3 = unsafe { read_desc(desc) };
    array_create(arr, d3, None, |d, out| call!(d, array_create_v2(out, desc)))
}

/// # Safety
/// The driver's contract for this entry point.
#[no_mangle]
pub unsafe extern "C" fn cuArrayCreate(arr: *mut Opaque, desc: *const ArrayDescV1) -> CUresult {
    // SAFETY: the caller's descriptor, NULL or valid.
    let d3 = unsafe { read_desc(desc) };
    array_create(arr, d3, None, |d, out| call!(d, array_create_v1(out, desc)))
}

/// # Safety
/// The driver's contract for this entry point.
#[no_mangle]
pub unsafe extern "C" fn cuArray3DCreate_v2(
    arr: *mut Opaque,
    desc: *const Array3DDesc,
) -> CUresult {
    // SAFETY: the caller's descriptor, NULL or valid.
    let d3 = unsafe { read_desc(desc) };
    array_create(arr, d3, None, |d, out| {
        call!(d, array3d_create_v2(out, desc))
    })
}

/// # Safety
/// The driver's contract for this entry point.
#[no_mangle]
pub unsafe extern "C" fn cuArray3DCreate(arr: *mut Opaque, desc: *const Array3DDescV1) -> CUresult {
    // SAFETY: the caller's descriptor, NULL or valid.
    let d3 = unsafe { read_desc(desc) };
    array_create(arr, d3, None, |d, out| {
        call!(d, array3d_create_v1(out, desc))
    })
}

/// # Safety
/// The driver's contract for this entry point.
#[no_mangle]
pub unsafe extern "C" fn cuMipmappedArrayCreate(
    arr: *mut Opaque,
    desc: *const Array3DDesc,
    levels: c_uint,
) -> CUresult {
    // SAFETY: the caller's descriptor, NULL or valid.
    let d3 = unsafe { read_desc(desc) };
    array_create(arr, d3, Some(levels), |d, out| {
        call!(d, mipmapped_array_create(out, desc, levels))
    })
}

/// # Safety
/// The driver's contract for this entry point.
#[no_mangle]
pub unsafe extern "C" fn cuArrayDestroy(arr: Opaque) -> CUresult {
    let real = move |d: &Driver| call!(d, array_destroy(arr));
    hook(OnBadConfig::Forward, real, |shim| {
        let r = real(shim.driver);
        if r == CUDA_SUCCESS {
            shim.array_destroyed(arr as usize);
        }
        r
    })
}

/// # Safety
/// The driver's contract for this entry point.
#[no_mangle]
pub unsafe extern "C" fn cuMipmappedArrayDestroy(arr: Opaque) -> CUresult {
    let real = move |d: &Driver| call!(d, mipmapped_array_destroy(arr));
    hook(OnBadConfig::Forward, real, |shim| {
        let r = real(shim.driver);
        if r == CUDA_SUCCESS {
            shim.array_destroyed(arr as usize);
        }
        r
    })
}

/// Every hook and the driver name it replaces; `interpose` substitutes by this table.
pub fn table() -> [(&'static std::ffi::CStr, *const c_void); 52] {
    [
        (c"cuMemAllocAsync", cuMemAllocAsync as *const c_void),
        (
            c"cuMemAllocAsync_ptsz",
            cuMemAllocAsync_ptsz as *const c_void,
        ),
        (c"cuMemFreeAsync", cuMemFreeAsync as *const c_void),
        (c"cuMemFreeAsync_ptsz", cuMemFreeAsync_ptsz as *const c_void),
        (
            c"cuMemAllocFromPoolAsync",
            cuMemAllocFromPoolAsync as *const c_void,
        ),
        (
            c"cuMemAllocFromPoolAsync_ptsz",
            cuMemAllocFromPoolAsync_ptsz as *const c_void,
        ),
        (c"cuMemPoolCreate", cuMemPoolCreate as *const c_void),
        (c"cuMemPoolDestroy", cuMemPoolDestroy as *const c_void),
        (c"cuMemPoolTrimTo", cuMemPoolTrimTo as *const c_void),
        (c"cuMemAllocManaged", cuMemAllocManaged as *const c_void),
        (c"cuMemCreate", cuMemCreate as *const c_void),
        (c"cuMemRelease", cuMemRelease as *const c_void),
        (c"cuMemMap", cuMemMap as *const c_void),
        (c"cuMemUnmap", cuMemUnmap as *const c_void),
        (
            c"cuMemRetainAllocationHandle",
            cuMemRetainAllocationHandle as *const c_void,
        ),
        (c"cuArrayCreate_v2", cuArrayCreate_v2 as *const c_void),
        (c"cuArrayCreate", cuArrayCreate as *const c_void),
        (c"cuArray3DCreate_v2", cuArray3DCreate_v2 as *const c_void),
        (c"cuArray3DCreate", cuArray3DCreate as *const c_void),
        (
            c"cuMipmappedArrayCreate",
            cuMipmappedArrayCreate as *const c_void,
        ),
        (c"cuArrayDestroy", cuArrayDestroy as *const c_void),
        (
            c"cuMipmappedArrayDestroy",
            cuMipmappedArrayDestroy as *const c_void,
        ),
        (
            c"cuStreamBeginCaptureToGraph",
            cuStreamBeginCaptureToGraph as *const c_void,
        ),
        (
            c"cuStreamBeginCaptureToGraph_ptsz",
            cuStreamBeginCaptureToGraph_ptsz as *const c_void,
        ),
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
