//! Hooks on the memory queries: `cuMemGetInfo` (seen through the limit), and the address
//! queries that must describe a pooled block as the program's allocation
//! (`cuMemGetAddressRange`, `cuPointerGetAttribute(s)`' range, `cuIpcGetMemHandle`).
#![allow(non_snake_case)]

use super::guard::{hook, put, put_some, to_result, OnBadConfig};
use crate::base::cu::*;
use crate::driver::{call, Driver};
use crate::state::{ipc::tag, ipc::untag, HandleBytes, IpcExport};
use std::ffi::{c_int, c_uint, c_void};

/// The device's (free, total) bytes, by the program's own `cuMemGetInfo` passed through.
fn device_info(d: &Driver) -> Result<(u64, u64), CUresult> {
    let (mut free, mut total) = (0usize, 0usize);
    match call!(d, mem_get_info_v2(&mut free, &mut total)) {
        CUDA_SUCCESS => Ok((free as u64, total as u64)),
        e => Err(e),
    }
}

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
        to_result(
            shim.mem_get_info(|| device_info(shim.driver))
                .map(|(f, t)| {
                    // SAFETY: each written only when non-null.
                    unsafe {
                        put_some(free, f as usize);
                        put_some(total, t as usize);
                    }
                }),
        )
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
        to_result(
            shim.mem_get_info(|| device_info(shim.driver))
                .map(|(f, t)| {
                    // SAFETY: each written only when non-null.
                    unsafe {
                        put_some(free, clamp(f));
                        put_some(total, clamp(t));
                    }
                }),
        )
    })
}

/// The pointer attributes that describe the allocation holding a pointer.
const RANGE: [c_int; 2] = [
    CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
    CU_POINTER_ATTRIBUTE_RANGE_SIZE,
];

/// What the driver answers `cuMemGetAddressRange` for an address that is not allocated.
const NOT_ALLOCATED_RANGE: CUresult = CUDA_ERROR_NOT_FOUND;
/// What the driver answers `cuPointerGetAttribute` for an address that is not allocated.
const NOT_ALLOCATED_ATTRIBUTE: CUresult = CUDA_ERROR_INVALID_VALUE;

/// Inside a pooled block the program holds, the block as its allocation (its start, the size
/// the program asked for); inside pooled memory it does not hold, the driver's answer for an
/// address that is not allocated;
/// any other pointer, the driver's own answer (`state::ranges` says why).
///
/// # Safety
/// The driver's contract for this entry point: out-pointers are NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetAddressRange_v2(
    base: *mut DevPtr,
    size: *mut usize,
    dptr: DevPtr,
) -> CUresult {
    let real = move |d: &Driver| call!(d, mem_get_address_range_v2(base, size, dptr));
    hook(OnBadConfig::Forward, real, |shim| {
        match shim.pooled_range(dptr) {
            None => real(shim.driver),
            Some(None) => NOT_ALLOCATED_RANGE,
            Some(Some((b, s))) => {
                // SAFETY: each written only when non-null.
                unsafe {
                    put_some(base, b);
                    put_some(size, s as usize);
                }
                CUDA_SUCCESS
            }
        }
    })
}

/// The 32-bit form: as [`cuMemGetAddressRange_v2`] where the answer fits in 32 bits.
///
/// # Safety
/// The driver's contract for this entry point: out-pointers are NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetAddressRange(
    base: *mut u32,
    size: *mut c_uint,
    dptr: u32,
) -> CUresult {
    let real = move |d: &Driver| call!(d, mem_get_address_range_v1(base, size, dptr));
    hook(OnBadConfig::Forward, real, |shim| {
        match shim.pooled_range(dptr as DevPtr) {
            Some(Some((b, s))) if b <= u32::MAX as u64 && s <= c_uint::MAX as u64 => {
                // SAFETY: each written only when non-null.
                unsafe {
                    put_some(base, b as u32);
                    put_some(size, s as c_uint);
                }
                CUDA_SUCCESS
            }
            Some(None) => NOT_ALLOCATED_RANGE,
            _ => real(shim.driver),
        }
    })
}

/// `CU_POINTER_ATTRIBUTE_RANGE_START_ADDR` and `_RANGE_SIZE` as [`cuMemGetAddressRange_v2`]
/// answers them; every other attribute is the driver's.
///
/// # Safety
/// The driver's contract: `data` NULL or valid for a write of the attribute's type.
#[no_mangle]
pub unsafe extern "C" fn cuPointerGetAttribute(
    data: *mut c_void,
    attribute: c_int,
    ptr: DevPtr,
) -> CUresult {
    let real = move |d: &Driver| call!(d, pointer_get_attribute(data, attribute, ptr));
    hook(OnBadConfig::Forward, real, |shim| {
        if data.is_null() || !RANGE.contains(&attribute) {
            return real(shim.driver);
        }
        match shim.pooled_range(ptr) {
            None => real(shim.driver),
            Some(None) => NOT_ALLOCATED_ATTRIBUTE,
            Some(Some((b, s))) => {
                // SAFETY: non-null; the attribute's type is a `CUdeviceptr` (start) or a
                // `size_t` (size), both 64 bits here.
                unsafe { write_range(data, attribute, b, s) };
                CUDA_SUCCESS
            }
        }
    })
}

/// The driver's answers, then the range attributes among them for a pooled block; inside
/// pooled memory the program does not hold, the range entries keep what they held before the
/// call, as the driver leaves them for an address that is not allocated (measured: H100,
/// driver 580).
///
/// # Safety
/// The driver's contract: `attributes` and `data` hold `count` entries, each `data[i]` NULL or
/// valid for a write of `attributes[i]`'s type.
#[no_mangle]
pub unsafe extern "C" fn cuPointerGetAttributes(
    count: c_uint,
    attributes: *mut c_int,
    data: *mut *mut c_void,
    ptr: DevPtr,
) -> CUresult {
    let real = move |d: &Driver| call!(d, pointer_get_attributes(count, attributes, data, ptr));
    hook(OnBadConfig::Forward, real, |shim| {
        if attributes.is_null() || data.is_null() {
            return real(shim.driver);
        }
        // The range entries (attribute, out-pointer). The runtime's `cudaPointerGetAttributes`
        // asks for none: it goes straight to the driver, without looking at any pool.
        let entries: Vec<(c_int, *mut c_void)> = (0..count as usize)
            // SAFETY: i < count, within both arrays (the caller's contract).
            .map(|i| unsafe { (*attributes.add(i), *data.add(i)) })
            .filter(|&(a, out)| !out.is_null() && RANGE.contains(&a))
            .collect();
        if entries.is_empty() {
            return real(shim.driver);
        }
        let Some(answer) = shim.pooled_range(ptr) else {
            return real(shim.driver);
        };
        // What the range entries hold before the call.
        let before: Vec<std::mem::MaybeUninit<u64>> = entries
            .iter()
            // SAFETY: each is valid for 8 bytes (a range attribute's type); copied as possibly
            // uninitialized bytes, never read as a value.
            .map(|&(_, out)| unsafe { out.cast::<std::mem::MaybeUninit<u64>>().read_unaligned() })
            .collect();
        let r = real(shim.driver);
        if r != CUDA_SUCCESS {
            return r;
        }
        for (&(a, out), old) in entries.iter().zip(before) {
            // SAFETY: non-null and valid for 8 bytes, as above.
            unsafe {
                match answer {
                    Some((b, s)) => write_range(out, a, b, s),
                    None => out
                        .cast::<std::mem::MaybeUninit<u64>>()
                        .write_unaligned(old),
                }
            }
        }
        r
    })
}

/// Writes the start or the size of a range for a range attribute; nothing for any other.
///
/// # Safety
/// `out` is non-null and valid for a write of 8 bytes when `attribute` is a range attribute.
unsafe fn write_range(out: *mut c_void, attribute: c_int, start: DevPtr, size: u64) {
    // SAFETY: guaranteed by the caller.
    unsafe {
        match attribute {
            CU_POINTER_ATTRIBUTE_RANGE_START_ADDR => put(out.cast::<DevPtr>(), start),
            CU_POINTER_ATTRIBUTE_RANGE_SIZE => put(out.cast::<usize>(), size as usize),
            _ => {}
        }
    }
}

/// Legacy IPC exports a whole driver allocation: a pooled block further into its segment is
/// exported as the segment's handle tagged with the block's offset, which the importer's
/// cudapool takes out (`state::ipc`); a block of an expandable segment as a handle of its
/// mapped chunks (`state::ipc_mapped`). Everything else is the driver's.
///
/// # Safety
/// The driver's contract: `handle` NULL or valid for a write of a `CUipcMemHandle`.
#[no_mangle]
pub unsafe extern "C" fn cuIpcGetMemHandle(handle: *mut CUipcMemHandle, dptr: DevPtr) -> CUresult {
    let real = move |d: &Driver| call!(d, ipc_get_mem_handle(handle, dptr));
    hook(OnBadConfig::Forward, real, |shim| {
        match shim.ipc_export(dptr) {
            IpcExport::Driver => real(shim.driver),
            IpcExport::NotAllocated => CUDA_ERROR_INVALID_VALUE,
            IpcExport::Refused(e) => e,
            IpcExport::Mapped(bytes) => {
                if handle.is_null() {
                    return CUDA_ERROR_INVALID_VALUE;
                }
                // SAFETY: non-null, valid for a write of a whole handle by the caller's
                // contract (64 bytes, any value valid).
                unsafe { *handle.cast::<HandleBytes>() = bytes };
                CUDA_SUCCESS
            }
            IpcExport::Tagged(offset) => {
                let r = real(shim.driver);
                if r != CUDA_SUCCESS || handle.is_null() {
                    return r;
                }
                // SAFETY: non-null, and the driver just wrote a whole handle there (64 bytes, any
                // value valid).
                let bytes = unsafe { &mut *handle.cast::<HandleBytes>() };
                if tag(bytes, offset) {
                    CUDA_SUCCESS
                } else {
                    CUDA_ERROR_NOT_SUPPORTED
                }
            }
        }
    })
}

/// A handle's 64 bytes (both are plain bytes of the same size).
fn bytes_of(h: CUipcMemHandle) -> HandleBytes {
    // SAFETY: `CUipcMemHandle` is `[c_char; 64]` in a `repr(C)` struct: any bytes are valid.
    unsafe { std::mem::transmute(h) }
}

fn handle_of(b: HandleBytes) -> CUipcMemHandle {
    // SAFETY: as in `bytes_of`.
    unsafe { std::mem::transmute(b) }
}

/// Opens a tagged handle as the block it names (`state::ipc`), through `open` (the driver's
/// open of the same version); any other handle is the driver's.
fn ipc_open(
    pdptr: *mut DevPtr,
    handle: CUipcMemHandle,
    open: impl Fn(&Driver, *mut DevPtr, CUipcMemHandle) -> CUresult,
) -> CUresult {
    let real = |d: &Driver| open(d, pdptr, handle);
    hook(OnBadConfig::Forward, real, |shim| {
        if let Some(r) = shim.ipc_open_mapped(&bytes_of(handle)) {
            if pdptr.is_null() {
                return CUDA_ERROR_INVALID_VALUE;
            }
            return to_result(r.map(|at| {
                // SAFETY: non-null (checked), valid for writes by the caller's contract.
                unsafe { put(pdptr, at) }
            }));
        }
        let Some((clean, offset)) = untag(&bytes_of(handle)) else {
            return real(shim.driver);
        };
        if pdptr.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let open_segment = |clean: &HandleBytes| {
            let mut base: DevPtr = 0;
            match open(shim.driver, &mut base, handle_of(*clean)) {
                CUDA_SUCCESS => Ok(base),
                e => Err(e),
            }
        };
        to_result(shim.ipc_open_tagged(clean, offset, open_segment).map(|at| {
            // SAFETY: non-null (checked), valid for writes by the caller's contract.
            unsafe { put(pdptr, at) }
        }))
    })
}

/// # Safety
/// The driver's contract: `pdptr` NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn cuIpcOpenMemHandle_v2(
    pdptr: *mut DevPtr,
    handle: CUipcMemHandle,
    flags: c_uint,
) -> CUresult {
    ipc_open(pdptr, handle, |d, p, h| {
        call!(d, ipc_open_mem_handle_v2(p, h, flags))
    })
}

/// # Safety
/// The driver's contract: `pdptr` NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn cuIpcOpenMemHandle(
    pdptr: *mut DevPtr,
    handle: CUipcMemHandle,
    flags: c_uint,
) -> CUresult {
    ipc_open(pdptr, handle, |d, p, h| {
        call!(d, ipc_open_mem_handle_v1(p, h, flags))
    })
}

/// Closes what a tagged open gave (the segment's driver mapping goes with its last close);
/// anything else is the driver's.
///
/// # Safety
/// The driver's contract for this entry point (a plain address).
#[no_mangle]
pub unsafe extern "C" fn cuIpcCloseMemHandle(dptr: DevPtr) -> CUresult {
    let real = move |d: &Driver| call!(d, ipc_close_mem_handle(dptr));
    hook(OnBadConfig::Forward, real, |shim| {
        if let Some(r) = shim.ipc_close_mapped(dptr) {
            return r;
        }
        let close = |base: DevPtr| call!(shim.driver, ipc_close_mem_handle(base));
        shim.ipc_close(dptr, close)
            .unwrap_or_else(|| real(shim.driver))
    })
}
