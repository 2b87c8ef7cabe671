//! Hooks on what makes the driver take device memory besides allocations (issue 52): the
//! context's limits (`cuCtxSetLimit`: stack, heap, printf FIFO), module and library loads and
//! unloads. Contexts beyond the primary one are in `contexts`. What they take is charged in
//! `state::overhead`.
#![allow(non_snake_case)]

use super::guard::{hook, OnBadConfig};
use crate::base::cu::*;
use crate::driver::{call, Driver};
use crate::state::overhead::Taker;
use std::ffi::{c_char, c_int, c_uint, c_void};

/// # Safety
/// The driver's contract for this entry point (it takes no pointers).
#[no_mangle]
pub unsafe extern "C" fn cuCtxSetLimit(limit: c_int, value: usize) -> CUresult {
    let real = move |d: &Driver| call!(d, ctx_set_limit(limit, value));
    hook(OnBadConfig::Refuse, real, |shim| {
        shim.set_limit(limit, value, || real(shim.driver))
    })
}

/// A load through `real`, which writes the handle at `out`: measured and charged, unloaded by
/// `unload` again when it does not fit.
fn load(
    what: &'static str,
    out: *mut Opaque,
    library: bool,
    real: impl Fn(&Driver) -> CUresult + Copy,
    unload: impl Fn(&Driver, Opaque) -> CUresult + Copy,
) -> CUresult {
    if out.is_null() {
        return hook(OnBadConfig::Forward, real, |shim| real(shim.driver));
    }
    hook(OnBadConfig::Refuse, real, |shim| {
        // SAFETY: `out` is the program's out-pointer, written by the driver on success.
        let handle = || unsafe { *out } as usize;
        let taker = move || {
            if library {
                Taker::Library(handle())
            } else {
                Taker::Module(handle())
            }
        };
        shim.measured_load(
            what,
            None,
            || real(shim.driver),
            taker,
            |_| {
                let _ = unload(shim.driver, handle() as Opaque);
            },
        )
    })
}

fn module_unload(d: &Driver, m: Opaque) -> CUresult {
    call!(d, module_unload(m))
}

fn library_unload(d: &Driver, l: Opaque) -> CUresult {
    call!(d, library_unload(l))
}

/// # Safety
/// The driver's contract for this entry point: `module` valid for writes, `fname` a path.
#[no_mangle]
pub unsafe extern "C" fn cuModuleLoad(module: *mut Opaque, fname: *const c_char) -> CUresult {
    let real = move |d: &Driver| call!(d, module_load(module, fname));
    load("cuModuleLoad", module, false, real, module_unload)
}

/// # Safety
/// The driver's contract for this entry point: `module` valid for writes, `image` an image.
#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadData(module: *mut Opaque, image: *const c_void) -> CUresult {
    let real = move |d: &Driver| call!(d, module_load_data(module, image));
    load("cuModuleLoadData", module, false, real, module_unload)
}

/// # Safety
/// The driver's contract for this entry point: `module` valid for writes, `image` an image,
/// `options`/`values` `n` entries.
#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadDataEx(
    module: *mut Opaque,
    image: *const c_void,
    n: c_uint,
    options: *mut c_int,
    values: *mut *mut c_void,
) -> CUresult {
    let real = move |d: &Driver| call!(d, module_load_data_ex(module, image, n, options, values));
    load("cuModuleLoadDataEx", module, false, real, module_unload)
}

/// # Safety
/// The driver's contract for this entry point: `module` valid for writes, `fat` a fat binary.
#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadFatBinary(
    module: *mut Opaque,
    fat: *const c_void,
) -> CUresult {
    let real = move |d: &Driver| call!(d, module_load_fat_binary(module, fat));
    load("cuModuleLoadFatBinary", module, false, real, module_unload)
}

/// # Safety
/// The driver's contract for this entry point (it takes no pointers).
#[no_mangle]
pub unsafe extern "C" fn cuModuleUnload(module: Opaque) -> CUresult {
    let real = move |d: &Driver| call!(d, module_unload(module));
    hook(OnBadConfig::Forward, real, |shim| {
        shim.unloaded(Taker::Module(module as usize), || real(shim.driver))
    })
}

/// # Safety
/// The driver's contract for this entry point: `library` valid for writes, the option arrays
/// of their counts.
#[no_mangle]
pub unsafe extern "C" fn cuLibraryLoadData(
    library: *mut Opaque,
    code: *const c_void,
    jit_options: *mut c_int,
    jit_values: *mut *mut c_void,
    n_jit: c_uint,
    lib_options: *mut c_int,
    lib_values: *mut *mut c_void,
    n_lib: c_uint,
) -> CUresult {
    let real = move |d: &Driver| {
        call!(
            d,
            library_load_data(
                library,
                code,
                jit_options,
                jit_values,
                n_jit,
                lib_options,
                lib_values,
                n_lib
            )
        )
    };
    load("cuLibraryLoadData", library, true, real, library_unload)
}

/// # Safety
/// The driver's contract for this entry point: `library` valid for writes, `fname` a path, the
/// option arrays of their counts.
#[no_mangle]
pub unsafe extern "C" fn cuLibraryLoadFromFile(
    library: *mut Opaque,
    fname: *const c_char,
    jit_options: *mut c_int,
    jit_values: *mut *mut c_void,
    n_jit: c_uint,
    lib_options: *mut c_int,
    lib_values: *mut *mut c_void,
    n_lib: c_uint,
) -> CUresult {
    let real = move |d: &Driver| {
        call!(
            d,
            library_load_from_file(
                library,
                fname,
                jit_options,
                jit_values,
                n_jit,
                lib_options,
                lib_values,
                n_lib
            )
        )
    };
    load("cuLibraryLoadFromFile", library, true, real, library_unload)
}

/// # Safety
/// The driver's contract for this entry point (it takes no pointers).
#[no_mangle]
pub unsafe extern "C" fn cuLibraryUnload(library: Opaque) -> CUresult {
    let real = move |d: &Driver| call!(d, library_unload(library));
    hook(OnBadConfig::Forward, real, |shim| {
        shim.unloaded(Taker::Library(library as usize), || real(shim.driver))
    })
}
