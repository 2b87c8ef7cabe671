//! Hooks on streams and graph capture: stream creation and destruction (what reuse safety
//! fences and orders, `state::clock`) and the capture bookkeeping (`flags`).
#![allow(non_snake_case)]

use super::guard::{hook, OnBadConfig};
use crate::base::cu::*;
use crate::driver::{call, Driver};
use crate::state::Shim;
use std::ffi::{c_int, c_uint, c_void};

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

/// Begins a capture: first what must not be left for the capture to meet (fences owed on the
/// device are waited for now, while nothing forbids it), then no call of cudapool's own
/// reaches the driver until it ends (`flags::capture_beginning`). A begin the driver refuses
/// ends at once.
fn begin(shim: &Shim, real: impl FnOnce(&Driver) -> CUresult) -> CUresult {
    shim.before_capture();
    crate::base::flags::capture_beginning();
    let r = real(shim.driver);
    if r != CUDA_SUCCESS {
        crate::base::flags::capture_ended();
    }
    r
}

/// # Safety
/// The driver's contract for this entry point.
#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCapture(stream: CUstream) -> CUresult {
    let real = move |d: &Driver| call!(d, stream_begin_capture_v1(stream));
    hook(OnBadConfig::Forward, real, |shim| begin(shim, real))
}

/// # Safety
/// The driver's contract for this entry point.
#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCapture_v2(stream: CUstream, mode: c_int) -> CUresult {
    let real = move |d: &Driver| call!(d, stream_begin_capture_v2(stream, mode));
    hook(OnBadConfig::Forward, real, |shim| begin(shim, real))
}

/// # Safety
/// The driver's contract for this entry point.
#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCapture_ptsz(stream: CUstream) -> CUresult {
    let real = move |d: &Driver| call!(d, stream_begin_capture_ptsz(stream));
    hook(OnBadConfig::Forward, real, |shim| begin(shim, real))
}

/// # Safety
/// The driver's contract for this entry point.
#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCapture_v2_ptsz(stream: CUstream, mode: c_int) -> CUresult {
    let real = move |d: &Driver| call!(d, stream_begin_capture_v2_ptsz(stream, mode));
    hook(OnBadConfig::Forward, real, |shim| begin(shim, real))
}

/// Ends a capture: counted as ended when the stream was capturing before the call.
fn end_capture(shim: &Shim, stream: CUstream, real: impl FnOnce(&Driver) -> CUresult) -> CUresult {
    let mut status: c_int = 0;
    let was =
        call!(shim.driver, stream_is_capturing(stream, &mut status)) == CUDA_SUCCESS && status != 0;
    let r = real(shim.driver);
    if was {
        crate::base::flags::capture_ended();
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
    hook(OnBadConfig::Forward, real, |shim| begin(shim, real))
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
    hook(OnBadConfig::Forward, real, |shim| begin(shim, real))
}
