//! Copies between device memory and the host on a stream of cudapool's own, for sleep and wake
//! (`state::sleep`): the contents of memory that is about to be unmapped, and back.

use super::{call, check, Driver};
use crate::base::cu::*;
use std::ffi::c_void;

/// A non-blocking stream of the current context, made for one sleep or wake and destroyed
/// with it. Its copies never wait for the legacy stream, and, made with the calling thread in
/// the relaxed capture mode, they are no call another thread's capture forbids.
pub struct OwnStream<'a> {
    driver: &'a Driver,
    stream: CUstream,
}

impl Driver {
    /// A new non-blocking stream in the current context.
    pub fn own_stream(&self) -> Result<OwnStream<'_>, CUresult> {
        let mut stream: CUstream = std::ptr::null_mut();
        check(call!(
            self,
            stream_create(&mut stream, CU_STREAM_NON_BLOCKING)
        ))?;
        Ok(OwnStream {
            driver: self,
            stream,
        })
    }
}

impl OwnStream<'_> {
    /// Copies `bytes` from device address `src` to `dst` and waits for the copy.
    ///
    /// # Safety
    /// `dst` is valid for writes of `bytes` bytes and nothing else uses it meanwhile.
    pub unsafe fn to_host(&self, dst: *mut u8, src: DevPtr, bytes: u64) -> Result<(), CUresult> {
        let d = self.driver;
        check(call!(
            d,
            memcpy_dtoh_async(dst.cast::<c_void>(), src, bytes as usize, self.stream)
        ))?;
        self.wait()
    }

    /// Copies `bytes` from `src` to device address `dst` and waits for the copy.
    ///
    /// # Safety
    /// `src` is valid for reads of `bytes` bytes.
    pub unsafe fn to_device(
        &self,
        dst: DevPtr,
        src: *const u8,
        bytes: u64,
    ) -> Result<(), CUresult> {
        let d = self.driver;
        check(call!(
            d,
            memcpy_htod_async(dst, src.cast::<c_void>(), bytes as usize, self.stream)
        ))?;
        self.wait()
    }

    fn wait(&self) -> Result<(), CUresult> {
        check(call!(self.driver, stream_synchronize(self.stream)))
    }
}

impl Drop for OwnStream<'_> {
    fn drop(&mut self) {
        call!(self.driver, stream_destroy_v2(self.stream));
    }
}
