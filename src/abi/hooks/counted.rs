//! Hooks on the allocation entry points that pass through to the driver and are counted
//! against the limit: legacy 32-bit `cuMemAlloc`, pitched allocations, driver memory pools,
//! managed memory, arrays (`state::counted`); the virtual memory API's are `virtual_memory`.
#![allow(non_snake_case)]

use super::guard::{hook, put, to_result, OnBadConfig};
use crate::base::cu::*;
use crate::driver::{call, Driver};
use crate::state::default_pool;
use std::ffi::{c_int, c_uint, c_void};

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
        let resolved = crate::state::clock::resolve(stream as usize, ptsz);
        let got = if crate::state::clock::capturing(d, resolved) {
            // A node of the graph being captured: counted at its size.
            shim.alloc_counted(
                size,
                || alloc().map(|p| (p, size)),
                |p| {
                    super::pooled::real_free_async(d, p, stream, ptsz);
                },
            )
        } else {
            match shim.stream_context(resolved) {
                Ok(ctx_dev) => {
                    shim.alloc_from_driver_pool(pool as usize, size, ctx_dev, alloc, |p| {
                        super::pooled::real_free_async(d, p, stream, ptsz);
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

/// A device's default pool gives back cudapool's cache too (`state::default_pool`).
///
/// # Safety
/// The driver's contract for this entry point.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolTrimTo(pool: Opaque, keep: usize) -> CUresult {
    let real = move |d: &Driver| call!(d, mem_pool_trim_to(pool, keep));
    hook(OnBadConfig::Forward, real, |shim| {
        let r = real(shim.driver);
        if r == CUDA_SUCCESS {
            shim.driver_pool_trimmed(pool as usize);
            if let Some(dev) = shim.default_pool_device(pool as usize) {
                shim.default_pool_trim(dev, keep as u64);
            }
        }
        r
    })
}

/// A device's default pool answers cudapool's figures for reserved and used memory, current
/// and high (`state::default_pool`); anything else is the driver's.
///
/// # Safety
/// The driver's contract for this entry point: `value` NULL or valid for the attribute's
/// write (8 bytes for the figures cudapool answers).
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolGetAttribute(
    pool: Opaque,
    attr: c_int,
    value: *mut c_void,
) -> CUresult {
    let real = move |d: &Driver| call!(d, mem_pool_get_attribute(pool, attr, value));
    hook(OnBadConfig::Forward, real, |shim| {
        let ours = default_pool::answered(attr) && !value.is_null();
        let dev = ours
            .then(|| shim.default_pool_device(pool as usize))
            .flatten();
        let Some(dev) = dev else {
            return real(shim.driver);
        };
        let v = shim.default_pool_attribute(dev, attr);
        // SAFETY: non-null; these attributes are 64-bit by the driver's contract.
        unsafe { value.cast::<u64>().write_unaligned(v) };
        CUDA_SUCCESS
    })
}

/// A reset of a default pool's high resets cudapool's peaks too, once the driver took it.
///
/// # Safety
/// The driver's contract for this entry point.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolSetAttribute(
    pool: Opaque,
    attr: c_int,
    value: *mut c_void,
) -> CUresult {
    let real = move |d: &Driver| call!(d, mem_pool_set_attribute(pool, attr, value));
    hook(OnBadConfig::Forward, real, |shim| {
        let r = real(shim.driver);
        let high = matches!(
            attr,
            CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH | CU_MEMPOOL_ATTR_USED_MEM_HIGH
        );
        if r == CUDA_SUCCESS && high {
            if let Some(dev) = shim.default_pool_device(pool as usize) {
                shim.default_pool_highs_reset(dev);
            }
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
