//! Driver calls cudapool makes beside the program's that any moment allows, a capture under
//! way included (what a stream's context is, whether it captures, an event created, what an
//! array or a driver pool takes), and the two made within the program's own call on a stream,
//! as legal then as that call. The calls CUDA forbids during a capture are `Own`'s
//! (`own.rs`).

use super::{call, check, Driver};
use crate::base::cu::*;
use std::ffi::{c_int, c_uint, c_void};

impl Driver {
    /// The context of `stream` (the program's), `None` if the driver cannot say.
    pub fn context_of_stream(&self, stream: usize) -> Option<usize> {
        let mut ctx: CUcontext = std::ptr::null_mut();
        (call!(self, stream_get_ctx(stream as CUstream, &mut ctx)) == CUDA_SUCCESS)
            .then_some(ctx as usize)
    }

    /// Whether `stream` is capturing a graph now.
    pub fn stream_capturing(&self, stream: usize) -> bool {
        let mut status: c_int = 0;
        call!(self, stream_is_capturing(stream as CUstream, &mut status)) == CUDA_SUCCESS
            && status == CU_STREAM_CAPTURE_STATUS_ACTIVE
    }

    /// What an array of `desc` made with deferred mapping (or, with `levels`, a mipmapped
    /// array) occupies on `dev`, asked of the driver through a twin made and destroyed at once;
    /// `None` if the driver cannot say.
    pub fn array_requirements(
        &self,
        desc: &Array3DDesc,
        levels: Option<u32>,
        dev: CUdevice,
    ) -> Option<u64> {
        let mut h: Opaque = std::ptr::null_mut();
        let mut req = ArrayMemReq::default();
        let asked = match levels {
            None if call!(self, array3d_create_v2(&mut h, desc)) == CUDA_SUCCESS => {
                let r = call!(self, array_get_memory_requirements(&mut req, h, dev));
                call!(self, array_destroy(h));
                r
            }
            Some(n) if call!(self, mipmapped_array_create(&mut h, desc, n)) == CUDA_SUCCESS => {
                let r = call!(
                    self,
                    mipmapped_array_get_memory_requirements(&mut req, h, dev)
                );
                call!(self, mipmapped_array_destroy(h));
                r
            }
            _ => CUDA_ERROR_NOT_FOUND,
        };
        (asked == CUDA_SUCCESS && req.size > 0).then_some(req.size as u64)
    }

    /// `cuStreamWaitEvent`: `stream`'s later work waits for `ev` on the device. Only for a
    /// stream that is not capturing, right before the program's own work on it (reuse
    /// safety's owed fence, `state::clock`): as legal then, during a capture elsewhere too, as
    /// the program's work there. Any other wait of cudapool's own is `Own::stream_wait_event`.
    pub fn wait_before_program_work(&self, stream: usize, ev: usize) -> CUresult {
        call!(
            self,
            stream_wait_event(stream as CUstream, ev as CUevent, 0)
        )
    }

    /// `cuEventCreate` with `flags` (any moment allows it).
    pub fn event_create(&self, flags: c_uint) -> Result<usize, CUresult> {
        let mut ev: CUevent = std::ptr::null_mut();
        check(call!(self, event_create(&mut ev, flags)))?;
        Ok(ev as usize)
    }

    /// `cuEventRecord` of `ev` on `stream`, in the program's own call on that stream (its
    /// destroy: reuse safety's last event of it, `state::clock`), as legal then as that call.
    /// Any other record of cudapool's own is `Own::event_record`.
    pub fn record_before_program_call(&self, ev: usize, stream: usize) -> CUresult {
        call!(self, event_record(ev as CUevent, stream as CUstream))
    }

    /// A 64-bit attribute of the driver pool `pool` (`None` if the driver cannot say).
    pub fn mem_pool_attribute(&self, pool: usize, attr: c_int) -> Option<u64> {
        let mut v: u64 = 0;
        let out = &mut v as *mut u64 as *mut c_void;
        (call!(self, mem_pool_get_attribute(pool as Opaque, attr, out)) == CUDA_SUCCESS)
            .then_some(v)
    }
}
