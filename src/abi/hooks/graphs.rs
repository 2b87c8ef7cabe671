//! Hooks on CUDA graphs' memory (`state::graphs`): instantiation records what a graph's memory
//! nodes take, uploads and launches are held to the limit, trims and destruction are followed.
//!
//! The instantiation hooks replace every name the driver exports for it; the two 5-argument
//! ones pass all five on (a driver whose export takes fewer ignores the rest).
#![allow(non_snake_case)]

use super::guard::{hook, OnBadConfig};
use super::work::{report, Queue};
use crate::base::cu::*;
use crate::driver::{call, Driver};
use crate::state::Shim;
use std::ffi::{c_char, c_void};

/// Runs `real`, an instantiation, and records what the new executable graph's memory nodes
/// take.
fn instantiated(exec: *mut Opaque, graph: Opaque, real: impl Fn(&Driver) -> CUresult) -> CUresult {
    hook(OnBadConfig::Forward, &real, |shim| {
        let r = real(shim.driver);
        if r == CUDA_SUCCESS && !exec.is_null() {
            // SAFETY: non-null, and the driver just wrote the new executable graph there.
            let e = unsafe { *exec };
            shim.graph_instantiated(e as usize, graph as usize);
        }
        r
    })
}

/// # Safety
/// The driver's contract for this entry point.
#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiate(
    exec: *mut Opaque,
    graph: Opaque,
    error_node: *mut Opaque,
    log: *mut c_char,
    log_size: usize,
) -> CUresult {
    instantiated(exec, graph, |d| {
        call!(
            d,
            graph_instantiate_v1(exec, graph, error_node, log, log_size)
        )
    })
}

/// # Safety
/// The driver's contract for this entry point.
#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiate_v2(
    exec: *mut Opaque,
    graph: Opaque,
    error_node: *mut Opaque,
    log: *mut c_char,
    log_size: usize,
) -> CUresult {
    instantiated(exec, graph, |d| {
        call!(
            d,
            graph_instantiate_v2(exec, graph, error_node, log, log_size)
        )
    })
}

/// # Safety
/// The driver's contract for this entry point.
#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiateWithFlags(
    exec: *mut Opaque,
    graph: Opaque,
    flags: u64,
) -> CUresult {
    instantiated(exec, graph, |d| {
        call!(d, graph_instantiate_with_flags(exec, graph, flags))
    })
}

/// # Safety
/// The driver's contract for this entry point.
#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiateWithParams(
    exec: *mut Opaque,
    graph: Opaque,
    params: *mut c_void,
) -> CUresult {
    instantiated(exec, graph, |d| {
        call!(d, graph_instantiate_with_params(exec, graph, params))
    })
}

/// # Safety
/// The driver's contract for this entry point.
#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiateWithParams_ptsz(
    exec: *mut Opaque,
    graph: Opaque,
    params: *mut c_void,
) -> CUresult {
    instantiated(exec, graph, |d| {
        call!(d, graph_instantiate_with_params_ptsz(exec, graph, params))
    })
}

/// Runs `real`, an upload or launch of `exec`, held to the limit (`Shim::graph_mapping`).
fn mapping(exec: Opaque, real: impl Fn(&Driver) -> CUresult) -> CUresult {
    hook(OnBadConfig::Refuse, &real, |shim: &'static Shim| {
        shim.graph_mapping(exec as usize, || real(shim.driver))
    })
}

/// # Safety
/// The driver's contract for this entry point.
#[no_mangle]
pub unsafe extern "C" fn cuGraphLaunch(exec: Opaque, stream: CUstream) -> CUresult {
    let _in_flight = match report(Queue::Stream(stream)) {
        Ok(entered) => entered,
        Err(r) => return r,
    };
    mapping(exec, |d| call!(d, graph_launch(exec, stream)))
}

/// # Safety
/// The driver's contract for this entry point.
#[no_mangle]
pub unsafe extern "C" fn cuGraphLaunch_ptsz(exec: Opaque, stream: CUstream) -> CUresult {
    let _in_flight = match report(Queue::PerThread(stream)) {
        Ok(entered) => entered,
        Err(r) => return r,
    };
    mapping(exec, |d| call!(d, graph_launch_ptsz(exec, stream)))
}

/// # Safety
/// The driver's contract for this entry point.
#[no_mangle]
pub unsafe extern "C" fn cuGraphUpload(exec: Opaque, stream: CUstream) -> CUresult {
    mapping(exec, |d| call!(d, graph_upload(exec, stream)))
}

/// # Safety
/// The driver's contract for this entry point.
#[no_mangle]
pub unsafe extern "C" fn cuGraphUpload_ptsz(exec: Opaque, stream: CUstream) -> CUresult {
    mapping(exec, |d| call!(d, graph_upload_ptsz(exec, stream)))
}

/// # Safety
/// The driver's contract for this entry point.
#[no_mangle]
pub unsafe extern "C" fn cuGraphExecDestroy(exec: Opaque) -> CUresult {
    let real = move |d: &Driver| call!(d, graph_exec_destroy(exec));
    hook(OnBadConfig::Forward, real, |shim| {
        let r = real(shim.driver);
        if r == CUDA_SUCCESS {
            shim.graph_exec_destroyed(exec as usize);
        }
        r
    })
}

/// # Safety
/// The driver's contract for this entry point.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGraphMemTrim(dev: CUdevice) -> CUresult {
    let real = move |d: &Driver| call!(d, device_graph_mem_trim(dev));
    hook(OnBadConfig::Forward, real, |shim| {
        let r = real(shim.driver);
        if r == CUDA_SUCCESS {
            shim.graphs_trimmed(dev);
        }
        r
    })
}
