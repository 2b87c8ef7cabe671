//! Copies between device memory and the host for sleep and wake (`state::sleep`): on streams of
//! cudapool's own, through pinned host memory of its own (a copy from pageable memory runs at a
//! fraction of the bus's speed: 1.5 GB/s against 55 pinned, H200).

use super::{call, check, Driver};
use crate::base::cu::*;
use std::ffi::{c_uint, c_void};

/// A non-blocking stream of the current context, destroyed when dropped. Its copies never wait
/// for the legacy stream; made by a thread in the relaxed capture mode, they are no call
/// another thread's capture forbids.
pub struct OwnStream<'a> {
    driver: &'a Driver,
    stream: CUstream,
}

/// Pinned host memory of the current context, freed when dropped.
pub struct Pinned<'a> {
    driver: &'a Driver,
    ptr: *mut u8,
    len: usize,
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

    /// `len` bytes of pinned host memory, usable in every context (`CU_MEMHOSTALLOC_PORTABLE`).
    pub fn pinned(&self, len: usize) -> Result<Pinned<'_>, CUresult> {
        const PORTABLE: c_uint = 1;
        let mut p: *mut c_void = std::ptr::null_mut();
        check(call!(self, mem_host_alloc(&mut p, len, PORTABLE)))?;
        Ok(Pinned {
            driver: self,
            ptr: p.cast(),
            len,
        })
    }
}

// SAFETY: pinned host memory is plain memory any thread may use; the value owns it alone.
unsafe impl Send for Pinned<'_> {}

impl Pinned<'_> {
    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.ptr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for Pinned<'_> {
    fn drop(&mut self) {
        call!(self.driver, mem_free_host(self.ptr.cast()));
    }
}

impl OwnStream<'_> {
    /// Queues a copy of `bytes` from device address `src` to `dst` (see [`wait`](Self::wait)).
    ///
    /// # Safety
    /// `dst` is pinned memory valid for writes of `bytes` bytes that nothing else uses until
    /// the copy is waited for.
    pub unsafe fn to_host(&self, dst: *mut u8, src: DevPtr, bytes: u64) -> Result<(), CUresult> {
        let d = self.driver;
        check(call!(
            d,
            memcpy_dtoh_async(dst.cast::<c_void>(), src, bytes as usize, self.stream)
        ))
    }

    /// Queues a copy of `bytes` from `src` to device address `dst` (see [`wait`](Self::wait)).
    ///
    /// # Safety
    /// `src` is pinned memory valid for reads of `bytes` bytes, unchanged until the copy is
    /// waited for.
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
        ))
    }

    /// Waits for every copy queued so far.
    pub fn wait(&self) -> Result<(), CUresult> {
        check(call!(self.driver, stream_synchronize(self.stream)))
    }
}

impl Drop for OwnStream<'_> {
    fn drop(&mut self) {
        call!(self.driver, stream_destroy_v2(self.stream));
    }
}
