//! Hooks on the virtual memory API (`state::counted`, `state::sleep::foreign`): physical memory
//! from `cuMemCreate` is counted until the driver frees it; every call on the program's virtual
//! memory is work (a sleep waits for it, and it wakes a sleeping process first); and the
//! program's handle values are passed to the driver as the driver's own (they differ once a
//! sleep made a handle again: `Shim::real_handle`), and the driver's handed back as the
//! program's (`Shim::program_handle`). A handle shared outside the process (exported, given to
//! a multicast object or as a dma-buf) never sleeps.
#![allow(non_snake_case)]

use super::guard::{hook, put, to_result, OnBadConfig};
use crate::base::cu::*;
use crate::driver::{call, Driver};
use crate::state::Shim;
use std::ffi::{c_int, c_uint, c_void};

/// A hook on the program's own virtual memory: `body` runs as work (see `state::sleep`: a
/// sleep waits for it, and a sleeping process is woken first; a wake that finds no room answers
/// its code instead). Without the shim, `real`.
fn vm_hook(
    real: impl FnOnce(&'static Driver) -> CUresult,
    body: impl Fn(&'static Shim) -> CUresult,
) -> CUresult {
    hook(
        OnBadConfig::Forward,
        real,
        |shim| match crate::state::sleep::enter_work() {
            Ok(_in) => body(shim),
            Err(e) => e,
        },
    )
}

/// After the driver wrote a handle at `out` (`r` its answer): the program's value for it goes
/// there instead (see `Shim::program_handle`), and is returned.
///
/// # Safety
/// `out` is NULL or valid for reads and writes of a handle.
unsafe fn give_program_handle(shim: &Shim, r: CUresult, out: *mut MemHandle) -> Option<MemHandle> {
    if r != CUDA_SUCCESS || out.is_null() {
        return None;
    }
    // SAFETY: non-null, and the driver has just written the handle there.
    let h = shim.program_handle(unsafe { *out });
    // SAFETY: as above.
    unsafe { put(out, h) };
    Some(h)
}

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
        if let Err(e) = crate::state::sleep::wake_for_alloc() {
            return e;
        }
        // SAFETY: non-null; a `CUmemAllocationProp` starts with these fields.
        let head = unsafe { &*prop };
        // SAFETY: non-null, and a whole `CUmemAllocationProp` by the driver's contract.
        let bytes = unsafe { PropBytes::read(prop) };
        let d = shim.driver;
        let got = shim.mem_create(
            size as u64,
            (head.location_type, head.location_id),
            bytes,
            || {
                let mut h: MemHandle = 0;
                match call!(d, mem_create(&mut h, size, prop, flags)) {
                    CUDA_SUCCESS => Ok(h),
                    e => Err(e),
                }
            },
        );
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
    vm_hook(real, |shim| {
        let r = call!(shim.driver, mem_release(shim.real_handle(handle)));
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
    vm_hook(real, |shim| {
        let h = shim.real_handle(handle);
        let r = call!(shim.driver, mem_map(ptr, size, offset, h, flags));
        if r == CUDA_SUCCESS {
            shim.mem_mapped(ptr, size as u64, offset as u64, handle);
        }
        r
    })
}

/// # Safety
/// The driver's contract for this entry point.
#[no_mangle]
pub unsafe extern "C" fn cuMemUnmap(ptr: DevPtr, size: usize) -> CUresult {
    let real = move |d: &Driver| call!(d, mem_unmap(ptr, size));
    vm_hook(real, |shim| {
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
    vm_hook(real, |shim| {
        let r = real(shim.driver);
        // SAFETY: the driver's contract on `handle`.
        if let Some(h) = unsafe { give_program_handle(shim, r, handle) } {
            shim.mem_retained(h);
        }
        r
    })
}

/// # Safety
/// The driver's contract for this entry point.
#[no_mangle]
pub unsafe extern "C" fn cuMemSetAccess(
    ptr: DevPtr,
    size: usize,
    desc: *const MemAccessDesc,
    count: usize,
) -> CUresult {
    let real = move |d: &Driver| call!(d, mem_set_access(ptr, size, desc, count));
    vm_hook(real, |shim| real(shim.driver))
}

/// # Safety
/// The driver's contract for this entry point.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetAllocationPropertiesFromHandle(
    prop: *mut MemAllocProp,
    handle: MemHandle,
) -> CUresult {
    let real = move |d: &Driver| call!(d, mem_get_allocation_properties_from_handle(prop, handle));
    vm_hook(real, |shim| {
        let h = shim.real_handle(handle);
        call!(
            shim.driver,
            mem_get_allocation_properties_from_handle(prop, h)
        )
    })
}

/// # Safety
/// The driver's contract for this entry point.
#[no_mangle]
pub unsafe extern "C" fn cuMemExportToShareableHandle(
    out: *mut c_void,
    handle: MemHandle,
    kind: c_int,
    flags: u64,
) -> CUresult {
    let real = move |d: &Driver| call!(d, mem_export_to_shareable_handle(out, handle, kind, flags));
    vm_hook(real, |shim| {
        shim.mem_shared(handle);
        let h = shim.real_handle(handle);
        call!(
            shim.driver,
            mem_export_to_shareable_handle(out, h, kind, flags)
        )
    })
}

/// # Safety
/// The driver's contract for this entry point: `handle` NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn cuMemImportFromShareableHandle(
    handle: *mut MemHandle,
    os_handle: *mut c_void,
    kind: c_int,
) -> CUresult {
    let real =
        move |d: &Driver| call!(d, mem_import_from_shareable_handle(handle, os_handle, kind));
    hook(OnBadConfig::Forward, real, |shim| {
        let r = real(shim.driver);
        // SAFETY: the driver's contract on `handle`.
        unsafe { give_program_handle(shim, r, handle) };
        r
    })
}

/// # Safety
/// The driver's contract for this entry point: `handle` NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn cuMulticastCreate(
    handle: *mut MemHandle,
    prop: *const c_void,
) -> CUresult {
    let real = move |d: &Driver| call!(d, multicast_create(handle, prop));
    hook(OnBadConfig::Forward, real, |shim| {
        let r = real(shim.driver);
        // SAFETY: the driver's contract on `handle`.
        unsafe { give_program_handle(shim, r, handle) };
        r
    })
}

/// # Safety
/// The driver's contract for this entry point.
#[no_mangle]
pub unsafe extern "C" fn cuMulticastBindMem(
    mc: MemHandle,
    mc_offset: usize,
    mem: MemHandle,
    mem_offset: usize,
    size: usize,
    flags: u64,
) -> CUresult {
    let real = move |d: &Driver| {
        call!(
            d,
            multicast_bind_mem(mc, mc_offset, mem, mem_offset, size, flags)
        )
    };
    vm_hook(real, |shim| {
        shim.mem_shared(mem);
        let (m, h) = (shim.real_handle(mc), shim.real_handle(mem));
        call!(
            shim.driver,
            multicast_bind_mem(m, mc_offset, h, mem_offset, size, flags)
        )
    })
}

/// # Safety
/// The driver's contract for this entry point.
#[no_mangle]
pub unsafe extern "C" fn cuMulticastBindAddr(
    mc: MemHandle,
    mc_offset: usize,
    ptr: DevPtr,
    size: usize,
    flags: u64,
) -> CUresult {
    let real = move |d: &Driver| call!(d, multicast_bind_addr(mc, mc_offset, ptr, size, flags));
    vm_hook(real, |shim| {
        shim.range_shared(ptr, size as u64);
        let m = shim.real_handle(mc);
        call!(
            shim.driver,
            multicast_bind_addr(m, mc_offset, ptr, size, flags)
        )
    })
}

/// # Safety
/// The driver's contract for this entry point.
#[no_mangle]
pub unsafe extern "C" fn cuMulticastUnbind(
    mc: MemHandle,
    dev: CUdevice,
    mc_offset: usize,
    size: usize,
) -> CUresult {
    let real = move |d: &Driver| call!(d, multicast_unbind(mc, dev, mc_offset, size));
    hook(OnBadConfig::Forward, real, |shim| {
        let m = shim.real_handle(mc);
        call!(shim.driver, multicast_unbind(m, dev, mc_offset, size))
    })
}

/// # Safety
/// The driver's contract for this entry point.
#[no_mangle]
pub unsafe extern "C" fn cuMulticastAddDevice(mc: MemHandle, dev: CUdevice) -> CUresult {
    let real = move |d: &Driver| call!(d, multicast_add_device(mc, dev));
    hook(OnBadConfig::Forward, real, |shim| {
        call!(shim.driver, multicast_add_device(shim.real_handle(mc), dev))
    })
}

/// # Safety
/// The driver's contract for this entry point.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetHandleForAddressRange(
    out: *mut c_void,
    ptr: DevPtr,
    size: usize,
    kind: c_int,
    flags: u64,
) -> CUresult {
    let real = move |d: &Driver| {
        call!(
            d,
            mem_get_handle_for_address_range(out, ptr, size, kind, flags)
        )
    };
    vm_hook(real, |shim| {
        shim.range_shared(ptr, size as u64);
        real(shim.driver)
    })
}

/// `CUarrayMapInfo`'s handle fields: where `memHandleType` and `memHandle` lie, and its size.
const MAP_INFO_HANDLE_TYPE: usize = 60;
const MAP_INFO_HANDLE: usize = 64;
const MAP_INFO_SIZE: usize = 96;

/// Calls `map` with `infos` (`count` `CUarrayMapInfo`s) whose generic handles are the driver's:
/// a copy when the program's values differ from the driver's, else the program's own list.
///
/// # Safety
/// `infos` is NULL or valid for reads of `count` `CUarrayMapInfo`s.
unsafe fn with_real_handles(
    shim: &Shim,
    infos: *mut c_void,
    count: c_uint,
    map: impl FnOnce(*mut c_void) -> CUresult,
) -> CUresult {
    if infos.is_null() || !shim.handles_remapped() {
        return map(infos);
    }
    let n = count as usize * MAP_INFO_SIZE;
    // SAFETY: the caller's contract.
    let mut copy = unsafe { std::slice::from_raw_parts(infos.cast::<u8>(), n) }.to_vec();
    for info in copy.chunks_exact_mut(MAP_INFO_SIZE) {
        let kind = c_int::from_ne_bytes(info[MAP_INFO_HANDLE_TYPE..][..4].try_into().expect("4"));
        if kind == 0 {
            let field = &mut info[MAP_INFO_HANDLE..][..8];
            let h = MemHandle::from_ne_bytes((&*field).try_into().expect("8"));
            field.copy_from_slice(&shim.real_handle(h).to_ne_bytes());
        }
    }
    // The driver reads the list as `CUarrayMapInfo`s: a u64-aligned copy.
    let mut aligned = vec![0u64; n / 8];
    for (w, b) in aligned.iter_mut().zip(copy.chunks_exact(8)) {
        *w = u64::from_ne_bytes(b.try_into().expect("8"));
    }
    map(aligned.as_mut_ptr().cast())
}

/// # Safety
/// The driver's contract for this entry point.
#[no_mangle]
pub unsafe extern "C" fn cuMemMapArrayAsync(
    infos: *mut c_void,
    count: c_uint,
    stream: CUstream,
) -> CUresult {
    let real = move |d: &Driver| call!(d, mem_map_array_async(infos, count, stream));
    hook(OnBadConfig::Forward, real, |shim| {
        let map = |i| call!(shim.driver, mem_map_array_async(i, count, stream));
        // SAFETY: the driver's contract on `infos`.
        unsafe { with_real_handles(shim, infos, count, map) }
    })
}

/// # Safety
/// The driver's contract for this entry point.
#[no_mangle]
pub unsafe extern "C" fn cuMemMapArrayAsync_ptsz(
    infos: *mut c_void,
    count: c_uint,
    stream: CUstream,
) -> CUresult {
    let real = move |d: &Driver| call!(d, mem_map_array_async_ptsz(infos, count, stream));
    hook(OnBadConfig::Forward, real, |shim| {
        let map = |i| call!(shim.driver, mem_map_array_async_ptsz(i, count, stream));
        // SAFETY: the driver's contract on `infos`.
        unsafe { with_real_handles(shim, infos, count, map) }
    })
}
