//! The one place the arena's blocks change kind. The arena (`arena.rs`, `shadows.rs`) decides
//! what its memory does (a growth maps a hole, a stitch leaves a shadow, a release unmaps) and
//! answers with a [`Change`]; [`SplitCore::apply`] alone splits the block it falls in, keeps
//! `blocks`, the free sets, `cached` and the arena's `holes` and `shadows` in step, and merges
//! the result with its free neighbours. The arena's range itself comes and goes in `arena.rs`
//! (`open_arena`, `close_arena`: one hole, made or given back whole).

use super::*;

/// The bytes `[at, at + len)`, inside one free block, hole or shadow of the arena, become `to`
/// (a free ready block, a hole or a shadow); what is left of that block on either side keeps
/// its kind. A shadow changes whole, never in part; a block in use never changes here.
#[derive(Clone, Copy, Debug)]
pub(super) struct Change {
    pub(super) at: DevPtr,
    pub(super) len: u64,
    pub(super) to: Kind,
}

impl SplitCore {
    /// Makes `c` so (see [`Change`]): a free block and a hole merge with free neighbours of
    /// their own kind (a free one: ready ones); a shadow is listed in `arena.shadows`.
    pub(super) fn apply(&mut self, c: Change) {
        let (&start, &b) = self
            .blocks
            .range(..=c.at)
            .next_back()
            .expect("a change falls in a block");
        debug_assert!(c.at + c.len <= start + b.size && b.kind != Kind::InUse);
        debug_assert!(c.to != Kind::InUse);
        if b.kind == Kind::Shadow {
            debug_assert!(start == c.at && b.size == c.len, "a shadow changes whole");
            self.arena.shadows.remove(&start);
        } else {
            self.unlist(start, b);
        }
        self.blocks.remove(&start);
        if c.at > start {
            self.mark_free(
                start,
                Block {
                    size: c.at - start,
                    ..b
                },
            );
        }
        let (end, after) = (start + b.size, c.at + c.len);
        if end > after {
            self.mark_free(
                after,
                Block {
                    size: end - after,
                    ..b
                },
            );
        }
        let block = Block {
            size: c.len,
            kind: c.to,
            lane: READY,
            epoch: 0,
            ..b
        };
        if c.to == Kind::Shadow {
            self.blocks.insert(c.at, block);
            self.arena.shadows.insert(c.at, c.len);
        } else {
            self.merge_and_free(c.at, block);
        }
    }
}
