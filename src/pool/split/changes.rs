//! The one place the arena's blocks change kind. The arena (`arena.rs`, `shadows.rs`) decides
//! what its memory does (a growth maps a hole, a stitch leaves a shadow, a release unmaps) and
//! answers with [`Change`]s; [`SplitCore::apply`] alone splits the block it falls in, keeps
//! `blocks`, the free sets, `cached` and the arena's lists of holes and shadows in step, and merges
//! the result with its free neighbours. The arena's range itself comes and goes in `expand.rs`
//! (one hole, made or given back whole).

use super::arena::Change;
use super::block::{Block, Kind};
use super::SplitCore;
use crate::pool::core::READY;

impl SplitCore {
    /// Makes `c` so (see [`Change`]): a free block and a hole merge with free neighbours of
    /// their own kind (a free one: ready ones); a shadow is listed as the arena's.
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
            self.arena.unlist(start, Kind::Shadow);
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
            self.arena.list(c.at, c.len, Kind::Shadow);
        } else {
            self.merge_and_free(c.at, block);
        }
    }
}
