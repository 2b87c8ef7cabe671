//! What the driver's address queries answer for a pointer inside a pooled block
//! (`cuMemGetAddressRange`, `cuPointerGetAttribute`'s range attributes).
//!
//! A block is the program's allocation: it asked `cuMemAlloc` for it, and the driver would have
//! described exactly that allocation. Answering with the segment instead (the driver's own
//! allocation, bigger, shared with other blocks) makes any program that sizes its buffer from
//! the answer write over its neighbours: Numba's `device_memory_size` and `device_memset` of a
//! pooled array set the whole segment (`CUDA_ERROR_INVALID_VALUE` past its end, other blocks'
//! data before it). So inside a block the program holds, the answer is the block's start and
//! the size the program asked for; inside a pool's memory the program does not hold (cached,
//! or freed and waiting for its fence), it is the driver's answer for memory that is not
//! allocated; any other pointer (host-mapped, managed, IPC imports, virtual memory, counted
//! allocations, another process's) gets the driver's own answer, untouched.
//!
//! Legacy IPC, which exports whole driver allocations, follows the same rule (`state::ipc`).

use super::{Origin, Shim};
use crate::base::cu::*;
use crate::pool::BlockSpan;

impl Shim {
    /// The pooled block holding `ptr` that the program holds, and the size it asked for:
    /// `None` when no pool holds memory there; `Some(None)` inside pooled memory the program
    /// does not hold (cached, pending, in a magazine).
    pub(super) fn held_block(&self, ptr: DevPtr) -> Option<Option<(BlockSpan, u64)>> {
        let held = self.contexts.block_of(ptr)?.and_then(|span| {
            let live = self.live.get(span.ptr)?;
            (live.origin == Origin::Pool).then_some((span, live.size))
        });
        Some(held)
    }

    /// The allocation holding `ptr` as the program sees it: `None` when no pool holds memory
    /// there (the driver's answer is the truth); `Some(Some((start, size)))` inside a pooled
    /// block the program holds; `Some(None)` inside pooled memory the program does not hold
    /// (the hook answers as the driver does for memory that is not allocated).
    pub fn pooled_range(&self, ptr: DevPtr) -> Option<Option<(DevPtr, u64)>> {
        self.held_block(ptr)
            .map(|held| held.map(|(span, size)| (span.ptr, size)))
    }
}
