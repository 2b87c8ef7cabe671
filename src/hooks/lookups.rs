//! Hooks on the memory queries: `cuMemGetInfo` (seen through the limit) and
//! `cuMemGetAddressRange` (the driver's own answer).
//!
//! Uses: `hooks::guard`, `state`, `driver`, `cu`.
#![allow(non_snake_case)]

use super::guard::{hook, put_some, to_result, OnBadConfig};
use crate::cu::*;
use crate::driver::{call, Driver};
use std::ffi::c_uint;

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
