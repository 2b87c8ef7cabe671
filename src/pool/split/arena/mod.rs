//! `split`'s expandable arena (`CUDAPOOL_SEGMENTS=expandable`): one reserved address range for
//! large requests that grows by mapping memory where a request needs it and gives back the
//! memory of its free blocks. The best fit over its blocks is `split`'s own; the arena is how
//! the range gets and loses memory, and it owns that memory:
//! - near a limit, a growth first *stitches* the handles (physical allocations) that lie whole
//!   inside ready free blocks elsewhere in the arena: each is mapped a second time where the
//!   request grows, and its first address becomes a *shadow* that no block may use, so the
//!   holes left between live blocks serve the growth without an unmap, a copy or a wait
//!   (GMLake's stitching, over expandable segments). A growth's handles are stitched in one
//!   upstream call that sets their access once. Only then is new memory made. Without a
//!   limit, or far from it (more than 1/`STITCH_NEAR_LIMIT` of it left after the growth),
//!   nothing is stitched (what stitching at every growth costs: docs/benchmarks.md). (*Lending*
//!   is another thing: a group member giving its idle cache to another.)
//! - before a growth, memory stitched away moves back where that makes a free block the request
//!   fits ([`Arena::reclaim`], no driver call; `shadows.rs`);
//! - new memory comes in handles as large as the growth allows (powers of two of the chunk up
//!   to a cap: one handle costs about as much however large it is); under a limit smaller, so
//!   that stitching finds whole handles in free blocks and a reclaim stays fine (`grow.rs`);
//! - a release (after the device is idle) unmaps the shadows, then whole handles inside ready
//!   free blocks (`release.rs`).
//!
//! The arena reads `split`'s blocks through [`Blocks`] only and never writes one: each of its
//! operations changes its own memory records and answers with the [`Change`]s of block kind
//! that `SplitCore::apply` makes, in order. `apply` tells it which blocks became or stopped
//! being holes and shadows ([`Arena::list`], [`Arena::unlist`]).

mod check;
mod grow;
mod memory;
mod release;
mod shadows;
mod sleep;
mod timing;

use super::block::Kind;
use crate::base::config::Stitch;
use crate::base::cu::DevPtr;
use std::collections::BTreeMap;

/// Where the arena lies: `span` bytes of address space reserved at `base`, mapped in handles
/// that are multiples of `chunk`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Span {
    pub(super) base: DevPtr,
    pub(super) span: u64,
    pub(super) chunk: u64,
}

impl Span {
    pub(super) fn holds(&self, ptr: DevPtr) -> bool {
        ptr >= self.base && ptr - self.base < self.span
    }

    fn end(&self) -> DevPtr {
        self.base + self.span
    }
}

/// The bytes `[at, at + len)`, inside one free block, hole or shadow of the arena, become `to`
/// (a free ready block, a hole or a shadow); what is left of that block on either side keeps
/// its kind. A shadow changes whole, never in part; a block in use never changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Change {
    pub(super) at: DevPtr,
    pub(super) len: u64,
    pub(super) to: Kind,
}

/// One of `split`'s blocks as the arena sees it.
#[derive(Clone, Copy, Debug)]
pub(super) struct Seen {
    pub(super) at: DevPtr,
    pub(super) size: u64,
    pub(super) kind: Kind,
    /// Free, mapped and of no queue's lane: what a growth may extend, stitch from or move
    /// memory back into.
    pub(super) ready: bool,
}

impl Seen {
    fn end(&self) -> DevPtr {
        self.at + self.size
    }
}

/// What the arena may read of `split`'s blocks (`SplitCore` answers).
pub(super) trait Blocks {
    /// The blocks that start in `[from, to)`, in address order.
    fn within(&self, from: DevPtr, to: DevPtr) -> impl Iterator<Item = Seen> + '_;
    /// The last block that starts before `at`.
    fn before(&self, at: DevPtr) -> Option<Seen>;
    /// The block that holds `at` (the last one that starts at or before it).
    fn holding(&self, at: DevPtr) -> Option<Seen>;
}

/// The expandable range of large requests, with everything that belongs to it: its address
/// range, the bytes mapped with memory of their own, its holes and shadows, and the physical
/// memory behind them. `SplitCore` holds one.
///
/// Invariants: without a `range` everything else is empty (and `mapped` 0); `holes` holds
/// exactly the arena's free blocks with nothing mapped, `shadows` exactly its shadow blocks
/// (start -> bytes each), `mapped` the bytes of `mem`'s handles (shadows not counted: their
/// memory is a handle's elsewhere). [`Arena::check`] verifies what the arena alone can see;
/// `SplitCore::check` the rest against its blocks.
#[derive(Default)]
pub(super) struct Arena {
    range: Option<Span>,
    mapped: u64,
    holes: BTreeMap<DevPtr, u64>,
    shadows: BTreeMap<DevPtr, u64>,
    /// Its physical memory: its handles, and the memory behind each handle and shadow (see
    /// [`memory::Memory`]).
    mem: memory::Memory,
    /// When a growth stitches (`CUDAPOOL_STITCH`): near a limit, or at every growth.
    stitch: Stitch,
    /// The growth under way's times (diagnostics only: empty without `stitch-timing`).
    #[cfg_attr(not(feature = "stitch-timing"), allow(dead_code))]
    timing: timing::Growth,
}

impl Arena {
    /// Its growths stitch by `rule` from now on.
    pub(super) fn set_stitch(&mut self, rule: Stitch) {
        self.stitch = rule;
    }

    /// Whether `ptr` lies in the arena's range.
    pub(super) fn holds(&self, ptr: DevPtr) -> bool {
        self.range.is_some_and(|a| a.holds(ptr))
    }

    /// The arena's range, once reserved.
    pub(super) fn range(&self) -> Option<Span> {
        self.range
    }

    /// The bytes mapped with memory of their own.
    pub(super) fn mapped(&self) -> u64 {
        self.mapped
    }

    /// The free blocks with nothing mapped (start -> bytes).
    pub(super) fn holes(&self) -> &BTreeMap<DevPtr, u64> {
        &self.holes
    }

    /// The shadows (start -> bytes).
    pub(super) fn shadows(&self) -> &BTreeMap<DevPtr, u64> {
        &self.shadows
    }

    /// The handles (start -> record).
    pub(super) fn handles(&self) -> &BTreeMap<DevPtr, memory::Handle> {
        self.mem.handles()
    }

    /// A block of kind `kind` (a hole or a shadow; nothing else is the arena's to list) now
    /// lies at `[at, at + len)`.
    pub(super) fn list(&mut self, at: DevPtr, len: u64, kind: Kind) {
        match kind {
            Kind::Hole => self.holes.insert(at, len),
            Kind::Shadow => self.shadows.insert(at, len),
            Kind::InUse | Kind::Free => None,
        };
    }

    /// The block of kind `kind` at `at` is gone (merged, changed or given back).
    pub(super) fn unlist(&mut self, at: DevPtr, kind: Kind) {
        match kind {
            Kind::Hole => self.holes.remove(&at),
            Kind::Shadow => self.shadows.remove(&at),
            Kind::InUse | Kind::Free => None,
        };
    }

    /// Every mapping in the arena (start, bytes): handles not asleep, and shadows.
    pub(super) fn mappings(&self) -> Vec<(DevPtr, u64)> {
        let mut out: Vec<(DevPtr, u64)> = (self.mem.handles().iter())
            .filter(|(_, h)| !h.asleep())
            .map(|(&p, h)| (p, h.len))
            .collect();
        out.extend(self.shadows.iter().map(|(&p, &l)| (p, l)));
        out.sort_unstable();
        out
    }

    /// The handles under `[ptr, ptr + size)` (mapped memory), in address order.
    pub(super) fn handles_of(&self, ptr: DevPtr, size: u64) -> Vec<(DevPtr, u64)> {
        let handles = self.mem.handles();
        let first = handles.range(..=ptr).next_back().map_or(ptr, |(&h, _)| h);
        handles
            .range(first..ptr + size)
            .filter(|&(&h, r)| h + r.len > ptr)
            .map(|(&h, r)| (h, r.len))
            .collect()
    }
}
