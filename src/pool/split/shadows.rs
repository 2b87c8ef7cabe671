//! The arena's shadows: the first addresses of handles stitched elsewhere (see `arena.rs`).
//! A stitch carves one out of a ready free block; before a growth, memory stitched away moves
//! back where that makes a free block the request fits (no driver call: both addresses map
//! it); a release after the device is idle unmaps them.

use super::changes::Change;
use super::*;

/// A run of arena blocks that could be one free block (see `reclaim_shadows`).
struct Run {
    start: DevPtr,
    bytes: u64,
    /// Its shadows, whose memory moves back into it.
    shadows: Vec<Moved>,
}

/// A shadow whose memory moves back: where it lies, its bytes, its memory, and where that
/// memory is a handle now.
struct Moved {
    at: DevPtr,
    bytes: u64,
    memory: u64,
    handle: DevPtr,
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
        let mut run: Option<Run> = None;
        let mut found = None;
        for (&p, b) in self.blocks.range(a.base..a.base + a.span) {
            let movable = (b.kind == Kind::Shadow)
                .then(|| {
                    let id = self.arena.mem.id(p)?;
                    let at = self.arena.mem.handle_of(id)?;
                    let (&start, owner) = self.blocks.range(..=at).next_back()?;
                    (owner.ready() && start + owner.size >= at + b.size).then_some((id, at))
                })
                .flatten();
            let fits_in = b.ready() || movable.is_some();
            let run_ok = |run: &Run| {
                run.start + run.bytes == p
                    && movable.is_none_or(|(id, at)| {
                        // Its memory must not be one the run holds or uses already.
                        !(run.start..p + b.size).contains(&at)
                            && run
                                .shadows
                                .iter()
                                .all(|s| s.memory != id && !(p..p + b.size).contains(&s.handle))
                    })
            };
            if !fits_in {
                run = None;
                continue;
            }
            match run.as_mut() {
                Some(cur) if run_ok(cur) => cur.bytes += b.size,
                _ => {
                    run = Some(Run {
                        start: p,
                        bytes: b.size,
                        shadows: Vec::new(),
                    })
                }
            }
            let cur = run.as_mut().expect("just set");
            if let Some((memory, handle)) = movable {
                cur.shadows.push(Moved {
                    at: p,
                    bytes: b.size,
                    memory,
                    handle,
                });
            }
            if cur.bytes >= r && !cur.shadows.is_empty() {
                found = run.take();
                break;
            }
        }
        let Some(Run { shadows, .. }) = found else {
            return false;
        };
        for Moved {
            at: s,
            bytes: len,
            handle: at,
            ..
        } in shadows
        {
            // A shadow is a block (see `check`); looked up before anything changes.
            if self.blocks.get(&s).map(|b| b.kind) != Some(Kind::Shadow) {
                continue;
            }
            // The handle's place becomes the shadow, and the shadow free memory.
            self.apply(Change {
                at,
                len,
                to: Kind::Shadow,
            });
            self.arena.mem.moved(at, s);
            self.apply(Change {
                at: s,
                len,
                to: Kind::Free,
            });
        }
        true
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
            if self.blocks.get(&p).map(|b| b.kind) != Some(Kind::Shadow) {
                continue;
            }
            if vm.unmap_alias(p, len).is_err() {
                continue;
            }
            self.arena.mem.shadow_unmapped(p);
            self.apply(Change {
                at: p,
                len,
                to: Kind::Hole,
            });
        }
    }
}
