//! What lies behind `split`'s expandable arena: which physical allocation (*handle*) is mapped
//! where. The blocks, holes and shadows are `split`'s (`mod.rs`); this is the memory under them,
//! with one owner, so that no memory can come to lie under two live blocks.

use crate::base::addr_hash::AddrMap as HashMap;
use crate::base::cu::DevPtr;
use std::collections::{BTreeMap, BTreeSet};

/// The arena's physical memory.
///
/// Invariants: `handles` holds each physical allocation where blocks may use it (start ->
/// bytes; they tile the arena's mapped blocks exactly, which `SplitCore::check` verifies);
/// `memory` the allocation behind each handle and each shadow (start -> id); `owner` where each
/// allocation is a handle (id -> start): one handle per allocation, so a live block's memory is
/// nobody else's. A shadow block is a run of *aliases*, each the allocation of a handle of its
/// size mapped a second time (`memory` holds each alias's start). `home` holds each
/// allocation's home (id -> start): where it was made, or where it was a handle when the
/// shadow at its home was unmapped; `away` the handles not at their home, whose home is then
/// a shadow of theirs (memory stitched away, which goes home once free: see `shadows.rs`).
#[derive(Default)]
pub(super) struct Memory {
    handles: BTreeMap<DevPtr, u64>,
    memory: HashMap<DevPtr, u64>,
    owner: HashMap<u64, DevPtr>,
    home: HashMap<u64, DevPtr>,
    away: BTreeSet<DevPtr>,
    next: u64,
}

impl Memory {
    /// New memory of `len` bytes mapped at `at`: a handle of its own.
    pub(super) fn made(&mut self, at: DevPtr, len: u64) {
        self.next += 1;
        self.handles.insert(at, len);
        self.memory.insert(at, self.next);
        self.owner.insert(self.next, at);
        self.home.insert(self.next, at);
    }

    /// The handle at `from` is mapped at `to` as well (a stitch, or memory moved back to a
    /// shadow): it is the handle there, and `from` keeps its memory as a shadow. Nothing
    /// changes when `from` is no handle.
    pub(super) fn moved(&mut self, from: DevPtr, to: DevPtr) {
        let (Some(len), Some(&id)) = (self.handles.get(&from).copied(), self.memory.get(&from))
        else {
            return;
        };
        self.handles.remove(&from);
        self.handles.insert(to, len);
        self.memory.insert(to, id);
        self.owner.insert(id, to);
        self.away.remove(&from);
        if self.home.get(&id) != Some(&to) {
            self.away.insert(to);
        }
    }

    /// The handle at `at` was unmapped: its memory went back.
    pub(super) fn unmapped(&mut self, at: DevPtr) {
        self.handles.remove(&at);
        self.away.remove(&at);
        if let Some(id) = self.memory.remove(&at) {
            self.owner.remove(&id);
            self.home.remove(&id);
        }
    }

    /// The alias at `at` was unmapped (its memory stays, a handle elsewhere). If it was the
    /// memory's home, the memory is home where it is now.
    pub(super) fn shadow_unmapped(&mut self, at: DevPtr) {
        let Some(id) = self.memory.remove(&at) else {
            return;
        };
        if let (Some(&h), Some(home)) = (self.owner.get(&id), self.home.get_mut(&id)) {
            if *home == at {
                *home = h;
                self.away.remove(&h);
            }
        }
    }

    /// Whether a handle away from home lies in `[at, at + len)`.
    pub(super) fn away_in(&self, at: DevPtr, len: u64) -> bool {
        self.away.range(at..at + len).next().is_some()
    }

    /// The handles away from home lying whole in `[at, at + len)`, as (start, bytes, home).
    pub(super) fn homes_in(&self, at: DevPtr, len: u64) -> Vec<(DevPtr, u64, DevPtr)> {
        self.away
            .range(at..at + len)
            .filter_map(|&h| {
                let bytes = *self.handles.get(&h)?;
                let home = *self.home.get(&self.id(h)?)?;
                (h + bytes <= at + len).then_some((h, bytes, home))
            })
            .collect()
    }

    /// The aliases that tile the shadow block `[at, at + len)`, in address order; `None` when
    /// they do not tile it (an invariant broken: see [`Memory::check`]).
    pub(super) fn aliases(&self, at: DevPtr, len: u64) -> Option<Vec<Alias>> {
        let mut out = Vec::new();
        let mut p = at;
        while p < at + len {
            let memory = self.id(p)?;
            let handle = self.handle_of(memory).filter(|&h| h != p)?;
            let bytes = *self.handles.get(&handle)?;
            out.push(Alias {
                at: p,
                bytes,
                memory,
                handle,
            });
            p += bytes;
        }
        (p == at + len).then_some(out)
    }

    /// The handles, by start: bytes.
    pub(super) fn handles(&self) -> &BTreeMap<DevPtr, u64> {
        &self.handles
    }

    /// The allocation behind the handle or shadow at `at`.
    pub(super) fn id(&self, at: DevPtr) -> Option<u64> {
        self.memory.get(&at).copied()
    }

    /// Where allocation `id` is a handle.
    pub(super) fn handle_of(&self, id: u64) -> Option<DevPtr> {
        self.owner.get(&id).copied()
    }

    /// The invariants above, `shadows` being the arena's shadows (start -> bytes).
    pub(super) fn check(&self, shadows: &BTreeMap<DevPtr, u64>) -> Result<(), String> {
        let mut ids = std::collections::HashSet::new();
        for &h in self.handles.keys() {
            let id = self.id(h);
            if !id.is_some_and(|id| ids.insert(id) && self.handle_of(id) == Some(h)) {
                return Err(format!("handle {h:#x}: its memory {id:?} is not its own"));
            }
        }
        if self.owner.len() != self.handles.len() {
            return Err(format!(
                "{} owners for {} handles",
                self.owner.len(),
                self.handles.len()
            ));
        }
        let mut aliases = 0;
        for (&s, &len) in shadows {
            let Some(run) = self.aliases(s, len) else {
                return Err(format!(
                    "shadow {s:#x}: its {len} bytes are no run of aliases of handles"
                ));
            };
            aliases += run.len();
        }
        let in_shadow = |p: DevPtr| {
            shadows
                .range(..=p)
                .next_back()
                .is_some_and(|(&s, &len)| p < s + len)
        };
        for (&id, &home) in &self.home {
            let Some(&h) = self.owner.get(&id) else {
                return Err(format!("memory {id} has a home and no handle"));
            };
            let away_ok = if home == h {
                !self.away.contains(&h)
            } else {
                self.away.contains(&h) && in_shadow(home) && self.id(home) == Some(id)
            };
            if !away_ok {
                return Err(format!(
                    "handle {h:#x}: home {home:#x} and the away set disagree"
                ));
            }
        }
        if self.home.len() != self.owner.len() || self.away.len() > self.handles.len() {
            return Err("homes or away handles recorded for what is no handle".into());
        }
        if self.memory.len() != self.handles.len() + aliases {
            return Err("memory recorded for what is neither a handle nor an alias".into());
        }
        Ok(())
    }
}

/// One alias in a shadow block: where it lies, its bytes, its memory, and where that memory is
/// a handle.
#[derive(Clone, Copy, Debug)]
pub(super) struct Alias {
    pub(super) at: DevPtr,
    pub(super) bytes: u64,
    pub(super) memory: u64,
    pub(super) handle: DevPtr,
}
