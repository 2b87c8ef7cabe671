//! The driver calls cudapool makes on its own behalf that CUDA forbids during a graph capture,
//! or that would change what a program captures: a synchronization, a query of a stream or an
//! event, an event recorded or waited for on the program's streams, the device's free memory,
//! a trim of a driver pool or of graph memory. They are reached only through [`Own`], which
//! [`Driver::own`] gives for an [`OwnCalls`] permission (`base::flags::own_calls`, `None` while
//! a capture is under way anywhere): the capture rule is the compiler's to check, not each call
//! site's to remember. An `Own` borrows the permission, so it cannot outlive it.
//!
//! The program's own calls of the same entry points pass through in the hooks (`call!` in
//! `abi/hooks`); nothing else in the library names the driver's table (`scripts/check-layers.py`
//! says so).

use super::{call, check, Driver};
use crate::base::cu::*;
use crate::base::flags::OwnCalls;

/// The driver, for calls on cudapool's own behalf (see the module's notes).
#[derive(Clone, Copy)]
pub struct Own<'a> {
    d: &'a Driver,
}

impl Driver {
    /// The calls [`Own`] holds, for as long as `calls` is held.
    pub fn own<'a>(&'a self, _calls: &'a OwnCalls) -> Own<'a> {
        Own { d: self }
    }
}

impl<'a> Own<'a> {
    /// The driver behind it (for the calls any moment allows).
    pub fn driver(&self) -> &'a Driver {
        self.d
    }

    /// `cuCtxSynchronize`: waits for the current context's work.
    pub fn synchronize(&self) -> Result<(), CUresult> {
        check(call!(self.d, ctx_synchronize()))
    }

    /// `cuMemGetInfo_v2`: the device's (free, total) bytes.
    pub fn mem_get_info(&self) -> Result<(u64, u64), CUresult> {
        let (mut free, mut total) = (0usize, 0usize);
        check(call!(self.d, mem_get_info_v2(&mut free, &mut total)))?;
        Ok((free as u64, total as u64))
    }

    /// `cuEventRecord` of `ev` on `stream`.
    pub fn event_record(&self, ev: usize, stream: usize) -> CUresult {
        call!(self.d, event_record(ev as CUevent, stream as CUstream))
    }

    /// `cuEventQuery`: `CUDA_SUCCESS` once the work before `ev` is done.
    pub fn event_query(&self, ev: usize) -> CUresult {
        call!(self.d, event_query(ev as CUevent))
    }

    /// `cuEventSynchronize`: waits on the host for the work before `ev`.
    pub fn event_synchronize(&self, ev: usize) -> CUresult {
        call!(self.d, event_synchronize(ev as CUevent))
    }

    /// `cuEventDestroy_v2`.
    pub fn event_destroy(&self, ev: usize) -> CUresult {
        call!(self.d, event_destroy(ev as CUevent))
    }

    /// `cuStreamQuery`: `CUDA_SUCCESS` when `stream` is idle, `CUDA_ERROR_NOT_READY` when not.
    pub fn stream_query(&self, stream: usize) -> CUresult {
        call!(self.d, stream_query(stream as CUstream))
    }

    /// `cuStreamWaitEvent`: `stream`'s later work waits for `ev` on the device.
    pub fn stream_wait_event(&self, stream: usize, ev: usize) -> CUresult {
        call!(
            self.d,
            stream_wait_event(stream as CUstream, ev as CUevent, 0)
        )
    }

    /// `cuMemPoolTrimTo`: the driver pool `pool` keeps at most `keep` bytes unused.
    pub fn mem_pool_trim_to(&self, pool: usize, keep: u64) -> CUresult {
        call!(self.d, mem_pool_trim_to(pool as Opaque, keep as usize))
    }

    /// `cuDeviceGraphMemTrim`: the graph memory `dev` holds unused goes back to the device.
    pub fn device_graph_mem_trim(&self, dev: CUdevice) -> CUresult {
        call!(self.d, device_graph_mem_trim(dev))
    }
}
