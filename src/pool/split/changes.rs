//! The one place the arena's blocks change kind. The arena (`arena.rs`, `shadows.rs`) decides
//! what its memory does (a growth maps a hole, a stitch leaves a shadow, a release unmaps) and
//! answers with a [`Change`]; [`SplitCore::apply`] alone splits the block it falls in, keeps
//! `blocks`, the free sets, `cached` and the arena's `holes` and `shadows` in step, and merges
//! the result with its free neighbours. The arena's range itself comes and goes in `arena.rs`
//! (`open_arena`, `close_arena`: one hole, made or given back whole).

use super::*;

/// The bytes `[at, at + len)`, inside one free block, hole or shadow of the arena, become `to`
/// (a free ready block, a hole or a shadow); what is left of that block on either side keeps
/// its kind. A shadow changes at the bounds of its aliases; a block in use never changes here.
#[derive(Clone, Copy, Debug)]
pub(super) struct Change {
    pub(super) at: DevPtr,
    pub(super) len: u64,
    pub(super) to: Kind,
}

impl SplitCore {
    /// Makes `c` so (see [`Change`]): a free block and a hole merge with free neighbours of
    /// their own kind (a free one: ready ones), a shadow with neighbouring shadows (one block
    /// per run of aliases, listed in `arena.shadows`).
    pub(super) fn apply(&mut self, c: Change) {
        let (&start, &b) = self
            .blocks
            .range(..=c.at)
            .next_back()
            .expect("a change falls in a block");
        debug_assert!(c.at + c.len <= start + b.size && b.kind != Kind::InUse);
        debug_assert!(c.to != Kind::InUse);
        if b.kind == Kind::Shadow {
            self.arena.shadows.remove(&start);
        } else {
            self.unlist(start, b);
        }
        self.blocks.remove(&start);
        if c.at > start {
            self.keep(
                start,
                Block {
                    size: c.at - start,
                    ..b
                },
            );
        }
        let (end, after) = (start + b.size, c.at + c.len);
        if end > after {
            self.keep(
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
            self.merge_shadow(c.at, block);
        } else {
            self.merge_and_free(c.at, block);
        }
    }

    /// What a change leaves of the block it fell in, listed as before.
    fn keep(&mut self, at: DevPtr, b: Block) {
        if b.kind == Kind::Shadow {
            self.blocks.insert(at, b);
            self.arena.shadows.insert(at, b.size);
        } else {
            self.mark_free(at, b);
        }
    }

    /// The shadow `b` at `at`, one block with the shadows either side of it.
    fn merge_shadow(&mut self, at: DevPtr, mut b: Block) {
        let mut start = at;
        if let Some(n) = self.blocks.get(&(at + b.size)).copied() {
            if n.kind == Kind::Shadow {
                self.blocks.remove(&(at + b.size));
                self.arena.shadows.remove(&(at + b.size));
                b.size += n.size;
            }
        }
        if let Some((&pp, &p)) = self.blocks.range(..at).next_back() {
            if p.kind == Kind::Shadow && pp + p.size == at {
                self.blocks.remove(&pp);
                self.arena.shadows.remove(&pp);
                b.size += p.size;
                start = pp;
            }
        }
        self.blocks.insert(start, b);
        self.arena.shadows.insert(start, b.size);
    }

    /// Whether `[at, at + len)` lies inside one block of kind `kind` (ready, if free).
    pub(super) fn within(&self, at: DevPtr, len: u64, kind: Kind) -> bool {
        self.blocks.range(..=at).next_back().is_some_and(|(&p, b)| {
            b.kind == kind && at + len <= p + b.size && (kind != Kind::Free || b.ready())
        })
    }

    /// Memory changes place without a driver call, each [`Move`]'s bytes mapped at both its
    /// ends: where it is a handle (inside a ready free block) it becomes a shadow, and it is
    /// the handle at `to`. With `free_to`, `to` (aliases in a shadow block) becomes a free
    /// block; without, it is left as it is (a hole a growth is about to map). Moves that
    /// continue each other at both ends change their blocks together, one change for a run of
    /// handles rather than one per handle.
    pub(super) fn move_memory(&mut self, moves: &[Move], free_to: bool) {
        let mut i = 0;
        while i < moves.len() {
            let mut run = moves[i];
            let mut j = i + 1;
            while let Some(m) = moves.get(j) {
                if m.from != run.from + run.len || m.to != run.to + run.len {
                    break;
                }
                run.len += m.len;
                j += 1;
            }
            let parts = &moves[i..j];
            let whole = |core: &Self, m: Move| {
                core.within(m.from, m.len, Kind::Free)
                    && (!free_to || core.within(m.to, m.len, Kind::Shadow))
            };
            let pieces: &[Move] = if whole(self, run) {
                std::slice::from_ref(&run)
            } else {
                parts
            };
            for &m in pieces {
                self.apply(Change {
                    at: m.from,
                    len: m.len,
                    to: Kind::Shadow,
                });
            }
            for m in parts {
                self.arena.mem.moved(m.from, m.to);
            }
            if free_to {
                for &m in pieces {
                    self.apply(Change {
                        at: m.to,
                        len: m.len,
                        to: Kind::Free,
                    });
                }
            }
            i = j;
        }
    }
}

/// Memory that changes place (see [`SplitCore::move_memory`]): `len` bytes, handles at `from`,
/// mapped at `to` as well.
#[derive(Clone, Copy, Debug)]
pub(super) struct Move {
    pub(super) from: DevPtr,
    pub(super) to: DevPtr,
    pub(super) len: u64,
}
