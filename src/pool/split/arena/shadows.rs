//! The arena's shadows: the first addresses of handles stitched elsewhere (see `mod.rs`).
//! A stitch carves one out of a ready free block; before a growth, memory stitched away moves
//! back where that makes a free block the request fits (no driver call: both addresses map
//! it); a release after the device is idle unmaps them.

use super::super::block::Kind;
use super::{Arena, Blocks, Change};
use crate::base::cu::DevPtr;

/// A run of arena blocks that could be one free block (see [`Arena::reclaim`]).
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

impl Arena {
    /// Before a growth for the rounded request `r`: the first run of neighbouring arena blocks,
    /// each free and ready or a shadow whose memory lies free and ready where it is a handle
    /// now (outside the run), that holds `r`: its shadows' memory moves back (each handle
    /// becomes the shadow; no driver call: both addresses map the memory), and the run is one
    /// free block. Stitching moves memory whenever a growth finds none; without this, the same
    /// steps of a training job stitched again every iteration. Returns the changes for `apply`
    /// (none: nothing moved).
    pub(in crate::pool::split) fn reclaim(&mut self, blocks: &impl Blocks, r: u64) -> Vec<Change> {
        let Some(a) = self.range else {
            return Vec::new();
        };
        if self.shadows.is_empty() {
            return Vec::new();
        }
        let mut run: Option<Run> = None;
        let mut found = None;
        for b in blocks.within(a.base, a.end()) {
            let p = b.at;
            let movable = (b.kind == Kind::Shadow)
                .then(|| {
                    let id = self.mem.id(p)?;
                    let at = self.mem.handle_of(id)?;
                    let owner = blocks.holding(at)?;
                    (owner.ready && owner.end() >= at + b.size).then_some((id, at))
                })
                .flatten();
            let fits_in = b.ready || movable.is_some();
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
            return Vec::new();
        };
        let mut changes = Vec::new();
        for Moved {
            at: s,
            bytes: len,
            handle: at,
            ..
        } in shadows
        {
            // A shadow is a block (see `check`); looked up before anything changes.
            if !blocks
                .holding(s)
                .is_some_and(|b| b.at == s && b.kind == Kind::Shadow)
            {
                continue;
            }
            // The handle's place becomes the shadow, and the shadow free memory.
            changes.push(Change {
                at,
                len,
                to: Kind::Shadow,
            });
            self.mem.moved(at, s);
            changes.push(Change {
                at: s,
                len,
                to: Kind::Free,
            });
        }
        changes
    }
}
