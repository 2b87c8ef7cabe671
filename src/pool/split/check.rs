//! `SplitCore::check`: the invariants written on [`SplitCore`] and [`Block`], verified from
//! scratch (mimalloc's `mi_segment_is_valid` in spirit). The pool's property tests and every
//! replay of a debug build run it after each operation; release builds never do.

use super::block::{Block, Kind};
use super::{FreeSets, SplitCore};
use crate::base::cu::DevPtr;
use crate::pool::core::Lane;
use crate::pool::core::READY;
use std::collections::BTreeMap;
use std::collections::HashMap as StdMap;

/// Fails with `why` unless `ok`.
fn ensure(ok: bool, why: impl FnOnce() -> String) -> Result<(), String> {
    if ok {
        Ok(())
    } else {
        Err(why())
    }
}

impl SplitCore {
    /// Every invariant of the core, or the first one broken.
    pub(super) fn check_invariants(&self) -> Result<(), String> {
        self.check_tiling()?;
        self.check_sets()?;
        self.check_figures()?;
        self.check_arena()
    }

    /// The blocks of each segment tile it exactly, carry its `small`, and no two free blocks of
    /// the same lane and mapping are neighbours (but the parked one).
    fn check_tiling(&self) -> Result<(), String> {
        let mut seen = 0;
        let mut segments: Vec<(DevPtr, u64)> =
            self.segments.iter().map(|(&p, s)| (p, s.size)).collect();
        segments.sort_unstable();
        for w in segments.windows(2) {
            ensure(w[0].0 + w[0].1 <= w[1].0, || {
                format!("segments {:#x} and {:#x} overlap", w[0].0, w[1].0)
            })?;
        }
        for (base, size) in segments {
            let in_arena = self.arena.range().is_some_and(|a| a.base == base);
            let mut at = base;
            let mut prev: Option<Block> = None;
            for (&p, b) in self.blocks.range(base..base + size) {
                seen += 1;
                ensure(p == at, || {
                    format!("segment {base:#x}: a gap or overlap at {at:#x} (next block {p:#x})")
                })?;
                ensure(b.segment == base && b.size > 0, || {
                    format!("block {p:#x} names segment {:#x} in {base:#x}", b.segment)
                })?;
                let first = self.blocks[&base].small;
                ensure(b.small == first && !(in_arena && b.small), || {
                    format!("block {p:#x}: small {} in a segment of {first}", b.small)
                })?;
                ensure(b.mapped() || in_arena, || {
                    format!("block {p:#x}: unmapped outside the arena")
                })?;
                if let Some(q) = prev {
                    let parked = self.parked == Some(p) || self.parked == Some(at - q.size);
                    ensure(
                        parked || !(q.free() && q.kind == b.kind && q.lane == b.lane),
                        || format!("free neighbours {:#x} and {p:#x} not merged", at - q.size),
                    )?;
                }
                prev = Some(*b);
                at = p + b.size;
            }
            ensure(at == base + size, || {
                format!(
                    "segment {base:#x}: its blocks end at {at:#x}, not {:#x}",
                    base + size
                )
            })?;
        }
        ensure(seen == self.blocks.len(), || {
            format!("{} blocks lie in no segment", self.blocks.len() - seen)
        })
    }

    /// The free sets hold exactly the free mapped blocks of their lane and kind (the parked
    /// one in none), the holes the free unmapped ones, the shadows the others.
    fn check_sets(&self) -> Result<(), String> {
        let mut ready: FreeSets = Default::default();
        let mut lanes: StdMap<Lane, FreeSets> = StdMap::new();
        let mut holes = BTreeMap::new();
        let mut shadows = BTreeMap::new();
        for (&p, b) in &self.blocks {
            match b.kind {
                Kind::Hole => {
                    ensure(b.lane == READY, || format!("hole {p:#x} in a lane"))?;
                    holes.insert(p, b.size);
                }
                Kind::Shadow => {
                    shadows.insert(p, b.size);
                }
                Kind::Free if self.parked == Some(p) => {
                    ensure(b.lane == READY, || format!("parked {p:#x} in a lane"))?;
                }
                Kind::Free if b.lane == READY => {
                    ready[Self::set(b.small)].insert((b.size, p));
                }
                Kind::Free => {
                    lanes.entry(b.lane).or_default()[Self::set(b.small)].insert((b.size, p));
                }
                Kind::InUse => {}
            }
        }
        if let Some(p) = self.parked {
            ensure(
                self.blocks.get(&p).is_some_and(|b| b.kind == Kind::Free),
                || format!("parked {p:#x} is no free mapped block"),
            )?;
        }
        ensure(ready == self.ready, || {
            "the ready sets differ from the blocks".into()
        })?;
        ensure(!self.lanes.contains_key(&READY), || {
            "a lane entry for READY".into()
        })?;
        ensure(lanes.len() == self.lanes.len(), || {
            format!(
                "{} lanes listed, {} hold blocks",
                self.lanes.len(),
                lanes.len()
            )
        })?;
        for (l, sets) in &lanes {
            ensure(self.lanes.get(l) == Some(sets), || {
                format!("lane {l}'s sets differ from the blocks")
            })?;
        }
        ensure(&holes == self.arena.holes(), || {
            "the holes differ from the blocks".into()
        })?;
        ensure(&shadows == self.arena.shadows(), || {
            "the shadows differ from the blocks".into()
        })
    }

    /// `cached` and `reserved` are the sums they are said to be.
    fn check_figures(&self) -> Result<(), String> {
        let cached: u64 = self
            .blocks
            .values()
            .filter(|b| b.kind == Kind::Free)
            .map(|b| b.size)
            .sum();
        ensure(cached == self.cached, || {
            format!(
                "cached {} but free mapped blocks hold {cached}",
                self.cached
            )
        })?;
        let classic: u64 = self
            .segments
            .iter()
            .filter(|(&p, _)| self.arena.range().is_none_or(|a| a.base != p))
            .map(|(_, s)| s.size)
            .sum();
        let reserved = classic + self.arena.mapped();
        ensure(reserved == self.reserved, || {
            format!(
                "reserved {} but segments and arena hold {reserved}",
                self.reserved
            )
        })
    }

    /// The arena's own invariants (`Arena::check`); then its handles tile exactly the arena's
    /// mapped blocks, in multiples of its chunk, and the arena is the segment of its span: no
    /// memory lies under two live blocks.
    fn check_arena(&self) -> Result<(), String> {
        self.arena.check()?;
        let Some(a) = self.arena.range() else {
            return Ok(());
        };
        ensure(
            self.segments.get(&a.base).is_some_and(|s| s.size == a.span),
            || "the arena is not the segment of its span".into(),
        )?;
        // The mapped runs of blocks, as handles must tile them.
        let mut runs: Vec<(DevPtr, u64)> = Vec::new();
        for (&p, b) in self.blocks.range(a.base..a.base + a.span) {
            if !b.mapped() {
                continue;
            }
            match runs.last_mut() {
                Some(r) if r.0 + r.1 == p => r.1 += b.size,
                _ => runs.push((p, b.size)),
            }
        }
        let mut handles = self.arena.handles().iter().peekable();
        for (start, len) in runs {
            let mut at = start;
            while at < start + len {
                let Some((&h, hl)) = handles.next().map(|(h, r)| (h, r.len)) else {
                    return Err(format!("mapped {at:#x} has no handle"));
                };
                ensure(h == at && hl > 0 && hl % a.chunk == 0, || {
                    format!("handle {h:#x} ({hl}) where {at:#x} was due")
                })?;
                at += hl;
            }
            ensure(at == start + len, || {
                format!("handle at {:#x} reaches past its mapped run", at)
            })?;
        }
        ensure(handles.next().is_none(), || {
            "a handle over no mapped block".into()
        })
    }
}
