//! Virtual memory, for expandable segments (`pool::split`'s arena) and their export to other
//! processes (`state::ipc_mapped`): reserving address space, mapping chunks of physical memory
//! into it, exporting and importing chunks as POSIX file descriptors.

use super::{call, check, Driver};
use crate::base::cu::*;
use std::ffi::{c_int, c_void};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};

impl Driver {
    /// The granularity of physical memory on `dev` (`cuMemCreate`'s minimum), if this driver
    /// and device support the virtual memory API.
    pub fn vmm_granularity(&self, dev: CUdevice) -> Option<u64> {
        let mut g = 0usize;
        let prop = MemAllocProp::device(dev);
        (call!(self, mem_get_allocation_granularity(&mut g, &prop, 0)) == CUDA_SUCCESS && g > 0)
            .then_some(g as u64)
    }

    /// Reserves `bytes` of device address space, aligned to `align` (no memory behind it).
    pub fn vmm_reserve(&self, bytes: u64, align: u64) -> Result<DevPtr, CUresult> {
        let mut p: DevPtr = 0;
        check(call!(
            self,
            mem_address_reserve(&mut p, bytes as usize, align as usize, 0, 0)
        ))?;
        Ok(p)
    }

    /// Gives back address space from [`vmm_reserve`](Self::vmm_reserve) (nothing mapped in it).
    pub(super) fn vmm_unreserve(&self, at: DevPtr, bytes: u64) -> Result<(), CUresult> {
        check(call!(self, mem_address_free(at, bytes as usize)))
    }

    /// Maps new memory of `dev` at `[at, at + bytes)`, one physical allocation of `chunk`
    /// bytes per chunk (so that any chunk can be unmapped alone), readable and writable by
    /// `dev` and by every device that can access its memory as a peer (what peer access
    /// enabled later would give classic memory). All or nothing.
    pub fn vmm_map(
        &self,
        dev: CUdevice,
        at: DevPtr,
        bytes: u64,
        chunk: u64,
    ) -> Result<(), CUresult> {
        let sizes = vec![chunk; (bytes / chunk) as usize];
        self.map_chunks(at, &sizes, Some(dev), |_| self.create_chunk(dev, chunk))
    }

    /// Maps one handle per entry of `sizes` at `at`, one after the other, the i-th the
    /// physical memory `next(i)` gives (its handle released once mapped: the mapping keeps the
    /// memory), then makes the range readable and writable by `dev` (by default the first
    /// handle's device) and its peers. All or nothing: on any error what was mapped is unmapped.
    fn map_chunks(
        &self,
        at: DevPtr,
        sizes: &[u64],
        mut dev: Option<CUdevice>,
        mut next: impl FnMut(usize) -> Result<MemHandle, CUresult>,
    ) -> Result<(), CUresult> {
        let mut done = 0;
        let mut count = 0;
        let mut result = Ok(());
        for (i, &chunk) in sizes.iter().enumerate() {
            let h = match next(i) {
                Ok(h) => h,
                Err(e) => {
                    result = Err(e);
                    break;
                }
            };
            if dev.is_none() {
                let mut prop = MemAllocProp::device(0);
                if call!(
                    self,
                    mem_get_allocation_properties_from_handle(prop.head_mut(), h)
                ) == CUDA_SUCCESS
                {
                    dev = prop.device_id();
                }
            }
            let mapped = check(call!(self, mem_map(at + done, chunk as usize, 0, h, 0)));
            call!(self, mem_release(h));
            if let Err(e) = mapped {
                result = Err(e);
                break;
            }
            done += chunk;
            count += 1;
        }
        if result.is_ok() {
            let access = self.vmm_access(dev.unwrap_or(0));
            result = check(call!(
                self,
                mem_set_access(at, done as usize, access.as_ptr(), access.len())
            ));
        }
        if result.is_err() {
            let _ = self.vmm_unmap_each(at, &sizes[..count]);
        }
        result
    }

    /// A physical chunk of `dev`, exportable as a POSIX file descriptor while the driver
    /// allows it (the first refusal of that, for any reason but memory, turns it off for the
    /// process: chunks are then plain and their blocks cannot be exported).
    fn create_chunk(&self, dev: CUdevice, chunk: u64) -> Result<MemHandle, CUresult> {
        use Ordering::Relaxed;
        static PLAIN: AtomicBool = AtomicBool::new(false);
        let mut h: MemHandle = 0;
        if !PLAIN.load(Relaxed) {
            let prop = MemAllocProp::exportable(dev);
            match call!(self, mem_create(&mut h, chunk as usize, prop.head(), 0)) {
                CUDA_SUCCESS => return Ok(h),
                CUDA_ERROR_OUT_OF_MEMORY => return Err(CUDA_ERROR_OUT_OF_MEMORY),
                e => {
                    PLAIN.store(true, Relaxed);
                    crate::log_at!(
                        crate::base::config::LogLevel::Info,
                        "cuMemCreate refuses exportable memory (error {e}): expandable segments' blocks cannot cross processes"
                    );
                }
            }
        }
        let prop = MemAllocProp::device(dev);
        check(call!(
            self,
            mem_create(&mut h, chunk as usize, prop.head(), 0)
        ))?;
        Ok(h)
    }

    /// File descriptors for the handles mapped at `handles` (start, bytes), to hand to another
    /// process; each keeps its handle's memory alive until closed. All or nothing.
    pub fn vmm_export(&self, handles: &[(DevPtr, u64)]) -> Result<Vec<OwnedFd>, CUresult> {
        let mut fds = Vec::new();
        for &(at, _) in handles {
            let mut h: MemHandle = 0;
            check(call!(
                self,
                mem_retain_allocation_handle(&mut h, at as usize as *mut c_void)
            ))?;
            let mut fd: c_int = -1;
            let r = call!(
                self,
                mem_export_to_shareable_handle(
                    (&mut fd as *mut c_int).cast(),
                    h,
                    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                    0
                )
            );
            call!(self, mem_release(h));
            check(r)?;
            if fd < 0 {
                return Err(CUDA_ERROR_UNKNOWN);
            }
            // SAFETY: the driver just made this descriptor for us; nothing else owns it.
            fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
        }
        Ok(fds)
    }

    /// Maps one handle per entry of `sizes`, the descriptor of the i-th from `take(i)` (from
    /// another process's [`vmm_export`](Self::vmm_export)), in order into new address space
    /// aligned to `align`, readable and writable by the handles' device and its peers. One
    /// descriptor is open at a time. Returns the range's start; all or nothing.
    pub fn vmm_import(
        &self,
        sizes: &[u64],
        align: u64,
        mut take: impl FnMut(usize) -> Result<OwnedFd, CUresult>,
    ) -> Result<DevPtr, CUresult> {
        let bytes = sizes.iter().sum();
        let at = self.vmm_reserve(bytes, align)?;
        let imported = self.map_chunks(at, sizes, None, |i| {
            let fd = take(i)?;
            let mut h: MemHandle = 0;
            check(call!(
                self,
                mem_import_from_shareable_handle(
                    &mut h,
                    fd.as_raw_fd() as isize as *mut c_void,
                    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
                )
            ))?;
            Ok(h)
        });
        if let Err(e) = imported {
            let _ = self.vmm_unreserve(at, bytes);
            return Err(e);
        }
        Ok(at)
    }

    /// Who may read and write memory of `dev`: `dev`, and its peers.
    fn vmm_access(&self, dev: CUdevice) -> Vec<MemAccessDesc> {
        let mut n: c_int = 0;
        call!(self, device_get_count(&mut n));
        let mut out = vec![MemAccessDesc::read_write(dev)];
        for peer in 0..n {
            let mut can: c_int = 0;
            if peer != dev
                && call!(self, device_can_access_peer(&mut can, peer, dev)) == CUDA_SUCCESS
                && can != 0
            {
                out.push(MemAccessDesc::read_write(peer));
            }
        }
        out
    }

    /// Maps each allocation mapped at `handles` (start, bytes) a second time, one after the
    /// other from `to` (reserved, nothing mapped there), readable and writable like the first:
    /// the same memory at two addresses, until one is unmapped. The access is set once for the
    /// whole run (`cuMemSetAccess` is most of a stitch's time: 85-90 % of one handle's). Returns
    /// how many were mapped, a prefix (the first refusal stops there); when the access cannot be
    /// set, none stays mapped.
    pub fn vmm_stitch(
        &self,
        dev: CUdevice,
        handles: &[(DevPtr, u64)],
        to: DevPtr,
    ) -> Result<usize, CUresult> {
        let mut sizes = Vec::with_capacity(handles.len());
        let mut at = to;
        let mut result = Ok(());
        for &(from, bytes) in handles {
            let mut h: MemHandle = 0;
            result = check(call!(
                self,
                mem_retain_allocation_handle(&mut h, from as usize as *mut c_void)
            ));
            if result.is_err() {
                break;
            }
            result = check(call!(self, mem_map(at, bytes as usize, 0, h, 0)));
            // The mappings keep the memory; the handle retained above is not needed any more.
            call!(self, mem_release(h));
            if result.is_err() {
                break;
            }
            sizes.push(bytes);
            at += bytes;
        }
        if sizes.is_empty() {
            return result.map(|()| 0);
        }
        let access = self.vmm_access(dev);
        let r = check(call!(
            self,
            mem_set_access(to, (at - to) as usize, access.as_ptr(), access.len())
        ));
        if let Err(e) = r {
            let _ = self.vmm_unmap_each(to, &sizes);
            return Err(e);
        }
        Ok(sizes.len())
    }

    /// Unmaps the handles mapped one after the other at `at`, of `sizes` bytes each; every one
    /// is tried, the first error returned.
    pub(super) fn vmm_unmap_each(&self, at: DevPtr, sizes: &[u64]) -> Result<(), CUresult> {
        let mut result = Ok(());
        let mut off = at;
        for &size in sizes {
            result = result.and(check(call!(self, mem_unmap(off, size as usize))));
            off += size;
        }
        result
    }

    /// Unmaps `[at, at + bytes)`, mapped by [`vmm_map`](Self::vmm_map) in chunks of `chunk`;
    /// its memory goes back to the device. No device work may still use it (unlike
    /// `cuMemFree`, `cuMemUnmap` does not wait for the device). Every chunk is tried; the
    /// first error is returned.
    pub(super) fn vmm_unmap(&self, at: DevPtr, bytes: u64, chunk: u64) -> Result<(), CUresult> {
        let mut result = Ok(());
        let mut off = 0;
        while off < bytes {
            let r = check(call!(self, mem_unmap(at + off, chunk as usize)));
            result = result.and(r);
            off += chunk;
        }
        result
    }
}
