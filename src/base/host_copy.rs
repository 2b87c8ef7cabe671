//! Host memory of one's own for what a sleep keeps of device memory: anonymous pages,
//! huge where the kernel has them, given back when dropped. The pool holds one in each asleep
//! handle's record; the sleep (`state::sleep`) makes, fills and empties them.

/// Host memory of its own (anonymous pages, given back when dropped): what a handle's live
/// parts hold while asleep, in its first bytes (`len` may be more, when kept from an earlier
/// sleep: the sleep's `Sleep::host_copy`).
pub struct HostCopy {
    pub(crate) ptr: *mut u8,
    pub(crate) len: usize,
}

// SAFETY: the pages are owned by this value alone; nothing else holds the pointer.
unsafe impl Send for HostCopy {}

impl HostCopy {
    /// `None` when the kernel will not give `len` bytes.
    pub fn new(len: u64) -> Option<HostCopy> {
        if len == 0 {
            return Some(HostCopy {
                ptr: std::ptr::NonNull::dangling().as_ptr(),
                len: 0,
            });
        }
        let len = usize::try_from(len).ok()?;
        // SAFETY: a fresh private anonymous mapping; no address is given, nothing is replaced.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return None;
        }
        // Huge pages where the kernel has them: a copy into fresh memory faults 512 times less.
        // SAFETY: advice on the mapping just made, of its length.
        unsafe { libc::madvise(p, len, libc::MADV_HUGEPAGE) };
        Some(HostCopy { ptr: p.cast(), len })
    }

    /// The first `len` bytes (rounded up to 2 MiB, a huge page) as a host copy of their own,
    /// this one keeping the rest; `None` when this one is not larger than that. (Each piece of
    /// a mapping can be unmapped alone.)
    pub fn split_front(&mut self, len: u64) -> Option<HostCopy> {
        let len = usize::try_from(len.next_multiple_of(2 << 20)).ok()?;
        if len == 0 || len >= self.len {
            return None;
        }
        let front = HostCopy { ptr: self.ptr, len };
        // SAFETY: `len < self.len`: the rest of this value's own mapping.
        self.ptr = unsafe { self.ptr.add(len) };
        self.len -= len;
        Some(front)
    }

    /// Makes every page of the copy now (the kernel zeroes each as it faults), so that a copy
    /// into it later finds its pages there; then lends them to the kernel (`MADV_FREE`, see
    /// [`lend_to_kernel`](Self::lend_to_kernel)). `false` where that advice is not had.
    pub fn made_ready(&self) -> bool {
        for off in (0..self.len).step_by(4096) {
            // SAFETY: inside this value's own writable mapping, which nothing else uses yet.
            unsafe { self.ptr.add(off).write_volatile(0) };
        }
        self.lend_to_kernel()
    }

    /// Lets the kernel take the pages back whenever it needs memory (`MADV_FREE`): until then
    /// they stay, and the next sleep writes into pages already there, at 1.6 times the speed
    /// of fresh ones (`benches/gpu/sleep_paths.cu`). What it writes again is kept. `false`
    /// where the kernel has no such advice (the copy is then dropped).
    pub fn lend_to_kernel(&self) -> bool {
        // SAFETY: advice on this value's own mapping, of its length; the bytes are not read
        // again before they are written (a kept copy is only a destination: the sleep's `Sleep::host_copy`).
        self.len == 0 || unsafe { libc::madvise(self.ptr.cast(), self.len, libc::MADV_FREE) } == 0
    }
}

impl Drop for HostCopy {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: the mapping made in `new`, unmapped once, here.
            unsafe { libc::munmap(self.ptr.cast(), self.len) };
        }
    }
}
