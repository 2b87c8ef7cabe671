//! What a pool kind's cache is ([`Core`]), and what the kinds share. The kinds: `split`
//! (`split.rs`), `simple` and `binned` (`whole_segments.rs`). A block put back is at once a
//! candidate for the requests its
//! *lane* allows: [`READY`] blocks serve anyone; a block in a queue's lane (a stream-ordered
//! free, see [`super::reuse`]) serves only allocations ordered on that queue until the fence of
//! its batch is done, when [`Core::promote`] makes it ready. Whether and where a freed block may
//! be put back is decided one level up, in [`super::reuse`]. Not thread-safe by themselves: the
//! wrapper holds each behind its lock.
//!
//! Near the limit the program's memory comes first (the contract, docs/design.md): a kind never asks the upstream
//! for more than the headroom when a smaller segment would do, and falls back to a segment of
//! the rounded request when its preferred segment is refused.

use super::handed::Taken;
pub use super::types::{ArenaLeft, Forgotten};
use super::types::{BlockSpan, SegmentView, Upstream};
use crate::base::config::PoolKind;
use crate::base::cu::{CUresult, DevPtr, CUDA_ERROR_OUT_OF_MEMORY};
use crate::base::limit::Limit;
use std::collections::BTreeMap;

/// Who may take a free block: [`READY`] (anyone), or the key of the one queue whose ordered
/// allocations may take it before its fence is done (a [`super::types::StreamKey`], never 0).
pub type Lane = u64;
/// The lane of blocks anyone may take.
pub const READY: Lane = 0;

/// One pool kind's cache of free blocks and the segments behind them.
pub trait Core: Send {
    fn kind(&self) -> PoolKind;
    /// What a request of `size` is rounded to (the key blocks are matched by).
    fn round(&self, size: u64) -> u64;
    /// A free block for `size`: a ready one, or one of `lane` (when it is not [`READY`]).
    /// `limit` is the upstream's hard limit ([`Upstream::limit`]): a kind may decline a fit
    /// that would strand memory the program may need under it.
    fn take(&mut self, size: u64, lane: Lane, limit: Limit) -> Option<Taken>;
    /// Like [`take`](Self::take), but only a block the request fits closely (while fences are
    /// still to bring blocks back, a closer one may come).
    fn take_close(&mut self, size: u64, lane: Lane, limit: Limit) -> Option<Taken> {
        self.take(size, lane, limit)
    }
    /// Gets a new segment from `up` able to serve `size` and takes a block from it.
    fn grow(&mut self, size: u64, up: &dyn Upstream) -> Result<Taken, CUresult>;
    /// Puts back a block handed out by `take` or `grow`, into `lane`; `epoch` is the batch
    /// whose fence makes a lane block ready (ignored for [`READY`]).
    fn put(&mut self, ptr: DevPtr, lane: Lane, epoch: u64);
    /// The free block of `lane` that holds `ptr`, if any and if its epoch is at most `done`,
    /// becomes ready (and coalesces with ready neighbours).
    fn promote(&mut self, ptr: DevPtr, lane: Lane, done: u64);
    /// The size of the block at `ptr` (handed out, not yet put back).
    fn block_size(&self, ptr: DevPtr) -> u64;
    /// Whether `ptr` lies inside a segment this core holds.
    fn owns(&self, ptr: DevPtr) -> bool;
    /// The block holding `ptr` if it is not free in this core (see [`super::Pool::block_of`]).
    fn block_of(&self, ptr: DevPtr) -> Option<BlockSpan>;
    /// Every segment and its blocks; blocks not free in the core show as in use, blocks of a
    /// queue's lane as pending.
    fn segments(&self) -> Vec<SegmentView>;
    /// Gives segments with no block in use back to `up` until at least `need` bytes went back
    /// (`u64::MAX`: all of them): the smallest one that is enough alone, else the largest
    /// first; with `unmap` (no device work uses a free block now), also the whole chunks of
    /// mapped memory inside ready free blocks. Returns the bytes released. (The driver's free
    /// waits for the device, so a free block of any lane may go.)
    fn release_free_segments(&mut self, up: &dyn Upstream, need: u64, unmap: bool) -> u64;
    /// Whether the core holds mapped memory, which [`release_free_segments`] gives back only
    /// with `unmap` (`cuMemUnmap` does not wait for the device).
    ///
    /// [`release_free_segments`]: Self::release_free_segments
    fn unmaps(&self) -> bool {
        false
    }
    /// Large requests get classic segments from now on (a block was exported through legacy
    /// IPC, which mapped memory cannot be).
    fn stop_expanding(&mut self) {}
    /// See [`super::Pool::handles_under`].
    fn handles_under(&self, ptr: DevPtr) -> Vec<(DevPtr, u64)> {
        let _ = ptr;
        Vec::new()
    }
    /// Its memory as a sleep and a wake see it (see [`super::Pool::sleep`]); `None`: nothing
    /// of it sleeps.
    fn sleeping(&mut self) -> Option<&mut dyn super::Sleeping> {
        None
    }
    /// Brings free blocks to the state every operation of the core would find them in first
    /// (split lists and merges its parked block), so that a view of the segments shows what
    /// the next allocation will see. Changes no choice the core makes.
    fn settle(&mut self) {}
    /// Bytes in free blocks, of every lane.
    fn cached(&self) -> u64;
    /// Bytes of every segment held.
    fn reserved(&self) -> u64;
    /// Forgets everything without calling the upstream; says what was held, and what the
    /// context's end does not take with it.
    fn forget(&mut self) -> Forgotten;
    /// Every invariant written on the core, verified from scratch, or the first one broken
    /// (tests and debug replays run it after each operation; it costs a walk of every block).
    fn check(&self) -> Result<(), String>;
}

/// Which free segments go back for `need` bytes: the smallest that is enough alone, else
/// the largest first until enough.
pub(super) fn pick_releases(mut free: Vec<(DevPtr, u64)>, need: u64) -> Vec<(DevPtr, u64)> {
    free.sort_by_key(|&(p, s)| (s, p));
    if need == u64::MAX {
        return free;
    }
    if let Some(&one) = free.iter().find(|&&(_, s)| s >= need) {
        return vec![one];
    }
    let mut out = Vec::new();
    let mut got = 0;
    while got < need {
        let Some(seg) = free.pop() else { break };
        got += seg.1;
        out.push(seg);
    }
    out
}

/// The smallest block and the granularity of `split` and the floor of `binned`.
pub const MIN_BLOCK: u64 = 512;
pub(super) const MIB: u64 = 1 << 20;

pub(super) fn round_up(n: u64, to: u64) -> u64 {
    n.div_ceil(to) * to
}

/// Gets a segment of the first size in `sizes` (largest first, the last being the least that
/// serves the request) that fits the upstream's headroom and that the upstream grants.
/// Returns (address, size obtained).
pub(super) fn segment(up: &dyn Upstream, sizes: &[u64]) -> Result<(DevPtr, u64), CUresult> {
    let last = *sizes.last().expect("at least one size");
    let headroom = up.headroom();
    let mut result = Err(CUDA_ERROR_OUT_OF_MEMORY);
    let mut refused = None;
    for &size in sizes {
        // A size the upstream just refused is not asked again.
        if (size > headroom && size != last) || refused == Some(size) {
            continue;
        }
        refused = Some(size);
        result = up.alloc(size).map(|p| (p, size));
        match result {
            Err(CUDA_ERROR_OUT_OF_MEMORY) => continue,
            _ => break,
        }
    }
    result
}

/// Whether `ptr` falls in one of the ranges `[start, start + size)` keyed by start.
pub(super) fn within<V>(map: &BTreeMap<DevPtr, V>, ptr: DevPtr, size: impl Fn(&V) -> u64) -> bool {
    map.range(..=ptr)
        .next_back()
        .is_some_and(|(&start, v)| ptr < start + size(v))
}
