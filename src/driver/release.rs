//! The driver calls that give memory back: `cuMemFree`, `cuMemUnmap`, `cuMemAddressFree` and
//! `cuMemRelease`. A release synchronizes or changes what the device holds, so a capture forbids
//! one made on cudapool's own behalf (the pool would lose memory a graph names, or the capture
//! would end). They are reached only through [`Release`], and there are two doors to it, each
//! named where it is used:
//! - [`Own::release`]: cudapool's own releases (a pool's trim and release, a sleep, the close of
//!   an opened export), under the permission no capture gives (`own.rs`);
//! - [`Driver::release_inside`]: a release made inside a call that releases memory by itself, for
//!   the reason [`Inside`] names: the program's own free (the `none` pool passes it on), the end
//!   of a context, an open of another process's block that failed half way, a wake putting the
//!   program's handles back as they were. The call's own rules are the program's, as the
//!   driver's would be.

use super::{Driver, Own};
use crate::base::cu::*;

/// Why a release is made without cudapool's own permission: it is part of a call that gives
/// memory back by itself (see the module's notes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Inside {
    /// The program's own `cuMemFree` of memory the `none` pool handed it, or the undoing of a
    /// pass-through allocation the budget refused after the driver made it.
    ProgramsFree,
    /// The program ended a context (`cuCtxDestroy`, a primary context's reset or last
    /// release): the arena's mappings and range go with it.
    ContextEnd,
    /// An open of another process's exported block (`cuIpcOpenMemHandle`) that failed after
    /// mapping part of it.
    FailedOpen,
    /// A wake putting the program's own handles back as they were: what it made and mapped
    /// goes again when it finds no room (the memory stays asleep), and a handle the program had
    /// released keeps no reference of the wake's.
    Wake,
}

/// The driver's releases (see the module's notes).
#[derive(Clone, Copy)]
pub struct Release<'a> {
    d: &'a Driver,
}

impl<'a> Own<'a> {
    /// cudapool's own releases, under this permission.
    pub fn release(&self) -> Release<'a> {
        Release { d: self.driver() }
    }
}

impl Driver {
    /// Releases made inside a call that releases memory by itself, for `why`.
    pub fn release_inside(&self, why: Inside) -> Release<'_> {
        let _ = why;
        Release { d: self }
    }
}

impl Release<'_> {
    /// `cuMemFree_v2` of `p` (a whole driver allocation).
    pub fn mem_free(&self, p: DevPtr) -> Result<(), CUresult> {
        self.d.mem_free(p)
    }

    /// Unmaps `[at, at + bytes)`, mapped in handles of `chunk` bytes; every handle is tried, the
    /// first error returned. No device work may still use it (`cuMemUnmap` does not wait).
    pub fn vmm_unmap(&self, at: DevPtr, bytes: u64, chunk: u64) -> Result<(), CUresult> {
        self.d.vmm_unmap(at, bytes, chunk)
    }

    /// Unmaps the handles mapped one after the other at `at`, of `sizes` bytes each.
    pub fn vmm_unmap_each(&self, at: DevPtr, sizes: &[u64]) -> Result<(), CUresult> {
        self.d.vmm_unmap_each(at, sizes)
    }

    /// Unmaps one mapping `[at, at + bytes)` of the program's own memory.
    pub fn vmm_unmap_one(&self, at: DevPtr, bytes: u64) -> Result<(), CUresult> {
        self.d.vmm_unmap_one(at, bytes)
    }

    /// Gives back reserved address space (nothing mapped in it).
    pub fn vmm_unreserve(&self, at: DevPtr, bytes: u64) -> Result<(), CUresult> {
        self.d.vmm_unreserve(at, bytes)
    }

    /// Drops one reference to the physical allocation `h`.
    pub fn vmm_release(&self, h: MemHandle) -> Result<(), CUresult> {
        self.d.vmm_release(h)
    }
}
