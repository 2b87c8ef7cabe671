//! Hooks on the pooled allocation entry points: `cuMemAlloc`/`cuMemFree` and the stream-ordered
//! `cuMemAllocAsync`/`cuMemFreeAsync` (with `_ptsz`). Each decodes its raw arguments and calls
//! the state (`state::pooled`); bad input goes to the driver untouched.
#![allow(non_snake_case)]

use super::guard::{hook, put, to_result, OnBadConfig};
use crate::base::cu::*;
use crate::driver::{call, Driver};

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
pub(super) fn real_free_async(d: &Driver, p: DevPtr, s: CUstream, ptsz: bool) -> CUresult {
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
        let got = shim.mem_alloc_async(bytesize as u64, stream as usize, ptsz, || {
            let mut p: DevPtr = 0;
            match real_alloc_async(d, &mut p, bytesize, stream, ptsz) {
                CUDA_SUCCESS => Ok(p),
                e => Err(e),
            }
        });
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
