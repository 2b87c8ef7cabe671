//! The program's own virtual memory (what it made with `cuMemCreate` and mapped itself), as a
//! sleep takes it away and a wake makes it again: the same properties, the same addresses and
//! offsets, the same access.

use super::{call, check, Driver};
use crate::base::cu::*;
use std::ffi::{c_int, c_void};

impl Driver {
    /// The access flags device `dev` has on the mapping at `at` (0: none, or the driver will
    /// not say).
    pub fn vmm_access_of(&self, dev: CUdevice, at: DevPtr) -> u64 {
        let mut flags = 0u64;
        let loc = MemLocation::device(dev);
        match call!(self, mem_get_access(&mut flags, &loc, at)) {
            CUDA_SUCCESS => flags,
            _ => 0,
        }
    }

    /// New physical memory of `bytes` as `prop` says (a program's own properties).
    pub fn vmm_create_as(&self, prop: &PropBytes, bytes: u64) -> Result<MemHandle, CUresult> {
        let mut h: MemHandle = 0;
        check(call!(
            self,
            mem_create(&mut h, bytes as usize, prop.as_ptr(), 0)
        ))?;
        Ok(h)
    }

    /// Maps `bytes` of handle `h` from `offset` at `at`, then gives `access` (device, flags)
    /// to the range. On an error nothing stays mapped.
    pub fn vmm_map_as(
        &self,
        at: DevPtr,
        bytes: u64,
        offset: u64,
        h: MemHandle,
        access: &[(CUdevice, c_int)],
    ) -> Result<(), CUresult> {
        check(call!(
            self,
            mem_map(at, bytes as usize, offset as usize, h, 0)
        ))?;
        let descs: Vec<MemAccessDesc> = access
            .iter()
            .map(|&(d, f)| MemAccessDesc::new(d, f))
            .collect();
        let r = if descs.is_empty() {
            Ok(())
        } else {
            check(call!(
                self,
                mem_set_access(at, bytes as usize, descs.as_ptr(), descs.len())
            ))
        };
        if r.is_err() {
            call!(self, mem_unmap(at, bytes as usize));
        }
        r
    }

    /// Unmaps `[at, at + bytes)` (one mapping).
    pub(super) fn vmm_unmap_one(&self, at: DevPtr, bytes: u64) -> Result<(), CUresult> {
        check(call!(self, mem_unmap(at, bytes as usize)))
    }

    /// Drops one reference to `h`.
    pub(super) fn vmm_release(&self, h: MemHandle) -> Result<(), CUresult> {
        check(call!(self, mem_release(h)))
    }

    /// One more reference to the handle mapped at `at`.
    pub fn vmm_retain(&self, at: DevPtr) -> Result<MemHandle, CUresult> {
        let mut h: MemHandle = 0;
        check(call!(
            self,
            mem_retain_allocation_handle(&mut h, at as usize as *mut c_void)
        ))?;
        Ok(h)
    }
}
