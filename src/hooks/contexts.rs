//! Hooks on context teardown: a context's cached and live blocks die with it
//! (`cuCtxDestroy`, primary-context reset and last release).
//!
//! Uses: `hooks::guard`, `state`, `driver`, `cu`.
#![allow(non_snake_case)]

use super::guard::{hook, OnBadConfig};
use crate::cu::*;
use crate::driver::{call, Driver};
use crate::state::Shim;

fn destroy(shim: &Shim, ctx: CUcontext, r: CUresult) -> CUresult {
    if r == CUDA_SUCCESS && !ctx.is_null() {
        shim.context_gone(ctx as usize);
    }
    r
}

/// # Safety
/// The driver's contract for this entry point (it takes no pointers).
#[no_mangle]
pub unsafe extern "C" fn cuCtxDestroy_v2(ctx: CUcontext) -> CUresult {
    let real = move |d: &Driver| call!(d, ctx_destroy_v2(ctx));
    hook(OnBadConfig::Forward, real, |shim| {
        destroy(shim, ctx, real(shim.driver))
    })
}

/// # Safety
/// The driver's contract for this entry point (it takes no pointers).
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
