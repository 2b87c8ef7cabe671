//! `split`'s blocks: what each is ([`Kind`]) and what it records ([`Block`]). A leaf: the core
//! (`mod.rs`) keeps them, the arena (`arena/`) reads them through its view.

use crate::base::cu::DevPtr;
use crate::pool::core::{Lane, READY};

/// What a block is. Only the arena has the last two, chunk-aligned at both ends and in no free
/// set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    /// Handed out: the program's (or a thread magazine's, or waiting for its fence).
    InUse,
    /// Mapped and free: in the free set of its lane and size class (or parked).
    Free,
    /// Free with nothing mapped: in `arena.holes`.
    Hole,
    /// One handle whose memory was stitched elsewhere in the arena: mapped, but no block may use
    /// it (in `arena.shadows`).
    Shadow,
}

#[derive(Clone, Copy, Debug)]
pub(super) struct Block {
    pub(super) segment: DevPtr,
    pub(super) size: u64,
    /// Its segment holds small requests (the same for every block of a segment).
    pub(super) small: bool,
    pub(super) kind: Kind,
    /// For a free block: who may take it (see [`Lane`]).
    pub(super) lane: Lane,
    /// For a free block of a queue's lane: the batch whose fence makes it ready.
    pub(super) epoch: u64,
}

impl Block {
    /// Free: mapped or a hole.
    pub(super) fn free(&self) -> bool {
        matches!(self.kind, Kind::Free | Kind::Hole)
    }

    /// Memory of its own is behind it (in use or free; a shadow's memory is a handle's
    /// elsewhere).
    pub(super) fn mapped(&self) -> bool {
        matches!(self.kind, Kind::InUse | Kind::Free)
    }

    /// Mapped, free and ready: what a growth may extend, stitch from or move memory back into.
    pub(super) fn ready(&self) -> bool {
        self.kind == Kind::Free && self.lane == READY
    }
}
