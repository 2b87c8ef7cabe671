//! Hooks on contexts: a context's cached and live blocks die with it (`cuCtxDestroy`,
//! primary-context reset and last release); and the calling thread's current context, followed
//! through every entry point that changes it, so that an allocation need not ask the driver
//! (`cuCtxSetCurrent`, `cuCtxPushCurrent` set it; pop, create, attach and detach make it
//! unknown until the next set).
#![allow(non_snake_case)]

use super::guard::{hook, OnBadConfig};
use crate::base::cu::*;
use crate::driver::{call, Driver};
use crate::state::{Contexts, Shim};
use std::ffi::{c_int, c_uint, c_void};

/// A destroy ends the context when it succeeds. The real call runs while no thread of
/// cudapool uses the context (`Shim::context_ending`).
fn destroy(shim: &Shim, ctx: CUcontext, real: impl FnOnce(&Driver) -> CUresult) -> CUresult {
    if ctx.is_null() {
        return real(shim.driver);
    }
    shim.context_ending(ctx as usize, || {
        let r = real(shim.driver);
        (r, r == CUDA_SUCCESS)
    })
}

/// # Safety
/// The driver's contract for this entry point (it takes no pointers).
#[no_mangle]
pub unsafe extern "C" fn cuCtxDestroy_v2(ctx: CUcontext) -> CUresult {
    let real = move |d: &Driver| call!(d, ctx_destroy_v2(ctx));
    hook(OnBadConfig::Forward, real, |shim| destroy(shim, ctx, real))
}

/// # Safety
/// The driver's contract for this entry point (it takes no pointers).
#[no_mangle]
pub unsafe extern "C" fn cuCtxDestroy(ctx: CUcontext) -> CUresult {
    let real = move |d: &Driver| call!(d, ctx_destroy_v1(ctx));
    hook(OnBadConfig::Forward, real, |shim| destroy(shim, ctx, real))
}

/// A reset destroys the primary context whatever its reference count.
fn primary_reset(shim: &Shim, dev: CUdevice, real: impl FnOnce(&Driver) -> CUresult) -> CUresult {
    let Some(ctx) = shim.primary_context(dev) else {
        return real(shim.driver);
    };
    shim.context_ending(ctx, || {
        let r = real(shim.driver);
        (r, r == CUDA_SUCCESS)
    })
}

/// A release destroys the primary context when it drops the last reference.
fn primary_release(shim: &Shim, dev: CUdevice, real: impl FnOnce(&Driver) -> CUresult) -> CUresult {
    let Some(ctx) = shim.primary_context(dev) else {
        return real(shim.driver);
    };
    shim.context_ending(ctx, || {
        let r = real(shim.driver);
        (
            r,
            r == CUDA_SUCCESS && !shim.driver.primary_context_active(dev),
        )
    })
}

/// # Safety
/// The driver's contract for this entry point (it takes no pointers).
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) -> CUresult {
    let real = move |d: &Driver| call!(d, primary_ctx_reset_v2(dev));
    hook(OnBadConfig::Forward, real, |shim| {
        primary_reset(shim, dev, real)
    })
}

/// # Safety
/// The driver's contract for this entry point (it takes no pointers).
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxReset(dev: CUdevice) -> CUresult {
    let real = move |d: &Driver| call!(d, primary_ctx_reset_v1(dev));
    hook(OnBadConfig::Forward, real, |shim| {
        primary_reset(shim, dev, real)
    })
}

/// # Safety
/// The driver's contract for this entry point (it takes no pointers).
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult {
    let real = move |d: &Driver| call!(d, primary_ctx_release_v2(dev));
    hook(OnBadConfig::Forward, real, |shim| {
        primary_release(shim, dev, real)
    })
}

/// # Safety
/// The driver's contract for this entry point (it takes no pointers).
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease(dev: CUdevice) -> CUresult {
    let real = move |d: &Driver| call!(d, primary_ctx_release_v1(dev));
    hook(OnBadConfig::Forward, real, |shim| {
        primary_release(shim, dev, real)
    })
}

// ---- the current context, followed -------------------------------------------------------

/// Calls the driver's `real`; after it, the thread's current context is known to be `ctx` if
/// `real` succeeded in setting a non-null one, and is not known otherwise (the driver is asked
/// until the next set). Followed in every state of the shim, re-entered or not.
fn switched(ctx: Option<CUcontext>, real: impl Fn(&Driver) -> CUresult) -> CUresult {
    let r = hook(OnBadConfig::Forward, &real, |shim| real(shim.driver));
    let known = ctx
        .filter(|c| r == CUDA_SUCCESS && !c.is_null())
        .map(|c| c as usize);
    Contexts::set_known_current(known);
    r
}

/// # Safety
/// The driver's contract for this entry point (it takes no pointers).
#[no_mangle]
pub unsafe extern "C" fn cuCtxSetCurrent(ctx: CUcontext) -> CUresult {
    switched(Some(ctx), move |d| call!(d, ctx_set_current(ctx)))
}

/// # Safety
/// The driver's contract for this entry point (it takes no pointers).
#[no_mangle]
pub unsafe extern "C" fn cuCtxPushCurrent_v2(ctx: CUcontext) -> CUresult {
    switched(Some(ctx), move |d| call!(d, ctx_push_current(ctx)))
}

/// # Safety
/// The driver's contract for this entry point (it takes no pointers).
#[no_mangle]
pub unsafe extern "C" fn cuCtxPushCurrent(ctx: CUcontext) -> CUresult {
    switched(Some(ctx), move |d| call!(d, ctx_push_current_v1(ctx)))
}

/// # Safety
/// The driver's contract for this entry point: `pctx` NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn cuCtxPopCurrent_v2(pctx: *mut CUcontext) -> CUresult {
    switched(None, move |d| call!(d, ctx_pop_current(pctx)))
}

/// # Safety
/// The driver's contract for this entry point: `pctx` NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn cuCtxPopCurrent(pctx: *mut CUcontext) -> CUresult {
    switched(None, move |d| call!(d, ctx_pop_current_v1(pctx)))
}

/// A context of its own: what it takes is measured and charged (`state::overhead`); when it
/// does not fit it is destroyed again and the answer is out of memory. The thread's current
/// context is unknown after it, as after any create.
fn created(
    pctx: *mut CUcontext,
    dev: CUdevice,
    real: impl Fn(&Driver) -> CUresult + Copy,
) -> CUresult {
    if pctx.is_null() {
        return switched(None, real);
    }
    let r = hook(OnBadConfig::Refuse, real, |shim| {
        // SAFETY: `pctx` is the program's out-pointer, written by the driver on success.
        let made = || unsafe { *pctx };
        shim.measured_load(
            "cuCtxCreate",
            Some(dev),
            || real(shim.driver),
            || crate::state::overhead::Taker::Context,
            |_| {
                let _ = call!(shim.driver, ctx_destroy_v2(made()));
            },
        )
    });
    Contexts::set_known_current(None);
    r
}

/// # Safety
/// The driver's contract for this entry point: `pctx` valid for writes.
#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate(
    pctx: *mut CUcontext,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    created(pctx, dev, move |d| {
        call!(d, ctx_create_v1(pctx, flags, dev))
    })
}

/// # Safety
/// The driver's contract for this entry point: `pctx` valid for writes.
#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v2(
    pctx: *mut CUcontext,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    created(pctx, dev, move |d| {
        call!(d, ctx_create_v2(pctx, flags, dev))
    })
}

/// # Safety
/// The driver's contract for this entry point: `pctx` valid for writes, `params` for reads.
#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v3(
    pctx: *mut CUcontext,
    params: *mut c_void,
    num_params: c_int,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    created(pctx, dev, move |d| {
        call!(d, ctx_create_v3(pctx, params, num_params, flags, dev))
    })
}

/// # Safety
/// The driver's contract for this entry point: `pctx` valid for writes, `params` for reads.
#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v4(
    pctx: *mut CUcontext,
    params: *mut c_void,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    created(pctx, dev, move |d| {
        call!(d, ctx_create_v4(pctx, params, flags, dev))
    })
}

/// # Safety
/// The driver's contract for this entry point: `pctx` valid for writes.
#[no_mangle]
pub unsafe extern "C" fn cuCtxAttach(pctx: *mut CUcontext, flags: c_uint) -> CUresult {
    switched(None, move |d| call!(d, ctx_attach(pctx, flags)))
}

/// # Safety
/// The driver's contract for this entry point (it takes no pointers).
#[no_mangle]
pub unsafe extern "C" fn cuCtxDetach(ctx: CUcontext) -> CUresult {
    switched(None, move |d| call!(d, ctx_detach(ctx)))
}
