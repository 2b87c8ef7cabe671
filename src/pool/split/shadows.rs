//! The arena's shadows: the first addresses of handles stitched elsewhere (see `arena.rs`).
//! A stitch carves one out of a ready free block; memory stitched away goes home as soon as
//! the block over it is free and ready ([`SplitCore::send_home`]), and before a growth moves
//! again where that makes a free block the request fits ([`SplitCore::reclaim_shadows`]):
//! both addresses map it, so neither calls the driver, and a job whose steps need the same
//! stitched block every step finds it again without stitching; a release after the device is
//! idle unmaps them.

use super::changes::{Change, Move};
use super::memory::Alias;
use super::*;

/// A run of arena blocks that could be one free block (see `reclaim_shadows`).
struct Run {
    start: DevPtr,
    bytes: u64,
    /// The aliases in its shadows, whose memory moves back into it.
    aliases: Vec<Alias>,
}

impl SplitCore {
    /// Before a growth for the rounded request `r`: the first run of neighbouring arena blocks,
    /// each free and ready or a shadow whose memory lies free and ready where it is a handle
    /// now (outside the run), that holds `r`: its shadows' memory moves back (each handle
    /// becomes the shadow; no driver call: both addresses map the memory), and the run is one
    /// free block. Stitching moves memory whenever a growth finds none; without this, the same
    /// steps of a training job stitched again every iteration. Returns whether memory moved.
    pub(super) fn reclaim_shadows(&mut self, r: u64) -> bool {
        let Some(a) = self.arena.range else {
            return false;
        };
        if self.arena.shadows.is_empty() {
            return false;
        }
        // Only a stretch of such blocks that holds `r` with a shadow in it is looked at alias by
        // alias: most are smaller than a request that missed.
        let mut found = None;
        let mut stretch: Option<(DevPtr, u64, bool)> = None;
        let mut blocks = self.blocks.range(a.base..a.base + a.span);
        loop {
            let next = blocks.next();
            let fits = next.filter(|(_, b)| b.ready() || b.kind == Kind::Shadow);
            if let Some((&p, b)) = fits {
                let shadow = b.kind == Kind::Shadow;
                match stretch.as_mut() {
                    Some(s) => {
                        s.1 += b.size;
                        s.2 |= shadow;
                    }
                    None => stretch = Some((p, b.size, shadow)),
                }
                continue;
            }
            if let Some((start, bytes, true)) = stretch.take().filter(|s| s.1 >= r) {
                found = self.find_run(r, start, start + bytes);
                if found.is_some() {
                    break;
                }
            }
            if next.is_none() {
                break;
            }
        }
        let Some(Run { aliases, .. }) = found else {
            return false;
        };
        let moves: Vec<Move> = aliases
            .iter()
            .map(|x| Move {
                from: x.handle,
                to: x.at,
                len: x.bytes,
            })
            .collect();
        self.move_memory(&moves, true);
        true
    }

    /// The first run for `r` (see [`reclaim_shadows`]) among the blocks that start in
    /// `[from, to)`.
    ///
    /// [`reclaim_shadows`]: Self::reclaim_shadows
    fn find_run(&self, r: u64, from: DevPtr, to: DevPtr) -> Option<Run> {
        let mut run: Option<Run> = None;
        let mut units: Vec<(DevPtr, u64, Option<Alias>)> = Vec::new();
        'blocks: for (&p, b) in self.blocks.range(from..to) {
            // A shadow's aliases count one by one: each moves back, or ends the run, alone.
            units.clear();
            if b.kind == Kind::Shadow {
                let Some(aliases) = self.arena.mem.aliases(p, b.size) else {
                    run = None;
                    continue;
                };
                units.extend(aliases.into_iter().map(|x| (x.at, x.bytes, Some(x))));
            } else if b.ready() {
                units.push((p, b.size, None));
            } else {
                run = None;
                continue;
            }
            for &(p, bytes, alias) in &units {
                let alias = alias.filter(|x| self.within(x.handle, x.bytes, Kind::Free));
                if b.kind == Kind::Shadow && alias.is_none() {
                    run = None;
                    continue;
                }
                let end = p + bytes;
                // The run may take this: it follows on, holds no handle whose memory the run
                // moves, and moves no memory the run holds or moves already.
                let joins = |cur: &Run| {
                    cur.start + cur.bytes == p
                        && cur.aliases.iter().all(|s| !(p..end).contains(&s.handle))
                        && alias.is_none_or(|x| {
                            !(cur.start..end).contains(&x.handle)
                                && cur.aliases.iter().all(|s| s.memory != x.memory)
                        })
                };
                match run.as_mut() {
                    Some(cur) if joins(cur) => cur.bytes += bytes,
                    _ => {
                        run = Some(Run {
                            start: p,
                            bytes,
                            aliases: Vec::new(),
                        })
                    }
                }
                let Some(cur) = run.as_mut() else {
                    continue;
                };
                cur.aliases.extend(alias);
                if cur.bytes >= r && !cur.aliases.is_empty() {
                    break 'blocks;
                }
            }
        }
        run.filter(|cur| cur.bytes >= r && !cur.aliases.is_empty())
    }
    /// The block of `size` bytes just parked at `ptr` (see [`SplitCore::parked`]): if memory
    /// stitched away lies in it, it is listed and merged instead, and the memory goes home.
    pub(super) fn park_or_send_home(&mut self, ptr: DevPtr, size: u64) {
        if self.arena.mem.away_in(ptr, size) {
            self.unpark();
            self.send_home(ptr);
        }
    }

    /// Memory stitched away from the ready free block at `ptr` (or the one holding it) goes
    /// home: each handle lying whole in it whose home is a shadow moves back there (no driver
    /// call: both addresses map it), and its place here becomes the shadow. The requests that
    /// took that memory before the stitch take it there again, and leave the stitched range
    /// whole for the request it was stitched for (GMLake keeps its stitched blocks beside the
    /// ones they join, for the same reason); without this, the stitched memory was taken for
    /// other requests and the same stitch was made again every step.
    pub(super) fn send_home(&mut self, ptr: DevPtr) {
        let Some((&p, b)) = self.blocks.range(..=ptr).next_back() else {
            return;
        };
        let size = b.size;
        if !b.ready() || !self.arena.mem.away_in(p, size) {
            return;
        }
        let moves: Vec<Move> = self
            .arena
            .mem
            .homes_in(p, size)
            .into_iter()
            .map(|(from, len, to)| Move { from, to, len })
            .collect();
        self.move_memory(&moves, true);
    }

    /// Unmaps every shadow (no device work may use one: a release after the device is idle);
    /// each becomes a hole.
    pub(super) fn unmap_shadows(&mut self, up: &dyn Upstream) {
        let Some(vm) = up.virtual_memory() else {
            return;
        };
        let shadows: Vec<(DevPtr, u64)> =
            self.arena.shadows.iter().map(|(&p, &l)| (p, l)).collect();
        for (p, len) in shadows {
            // Looked up before the driver is asked: nothing may fail between its unmap and
            // the records of it.
            let Some(aliases) = self.arena.mem.aliases(p, len) else {
                continue;
            };
            for x in aliases {
                if vm.unmap_alias(x.at, x.bytes).is_err() {
                    continue;
                }
                self.arena.mem.shadow_unmapped(x.at);
                self.apply(Change {
                    at: x.at,
                    len: x.bytes,
                    to: Kind::Hole,
                });
            }
        }
    }
}
