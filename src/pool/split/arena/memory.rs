//! What lies behind `split`'s expandable arena: which physical allocation (*handle*) is mapped
//! where. The blocks, holes and shadows are `split`'s (`mod.rs`); this is the memory under them,
//! with one owner, so that no memory can come to lie under two live blocks.

use crate::base::addr_hash::AddrMap as HashMap;
use crate::base::cu::DevPtr;
use std::collections::BTreeMap;

/// The arena's physical memory.
///
/// Invariants: `handles` holds each physical allocation where blocks may use it (start ->
/// bytes; they tile the arena's mapped blocks exactly, which `SplitCore::check` verifies);
/// `memory` the allocation behind each handle and each shadow (start -> id); `owner` where each
/// allocation is a handle (id -> start): one handle per allocation, so a live block's memory is
/// nobody else's. A shadow's allocation is a handle's of the same size.
#[derive(Default)]
pub(super) struct Memory {
    handles: BTreeMap<DevPtr, u64>,
    memory: HashMap<DevPtr, u64>,
    owner: HashMap<u64, DevPtr>,
    next: u64,
}

impl Memory {
    /// New memory of `len` bytes mapped at `at`: a handle of its own.
    pub(super) fn made(&mut self, at: DevPtr, len: u64) {
        self.next += 1;
        self.handles.insert(at, len);
        self.memory.insert(at, self.next);
        self.owner.insert(self.next, at);
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
    }

    /// The handle at `at` was unmapped: its memory went back.
    pub(super) fn unmapped(&mut self, at: DevPtr) {
        self.handles.remove(&at);
        if let Some(id) = self.memory.remove(&at) {
            self.owner.remove(&id);
        }
    }

    /// The shadow at `at` was unmapped (its memory stays, a handle elsewhere).
    pub(super) fn shadow_unmapped(&mut self, at: DevPtr) {
        self.memory.remove(&at);
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
        for (&s, &len) in shadows {
            let handle = self.id(s).and_then(|id| self.handle_of(id));
            if handle.is_none_or(|h| self.handles.get(&h) != Some(&len)) {
                return Err(format!(
                    "shadow {s:#x}: its memory is no handle of {len} bytes"
                ));
            }
        }
        if self.memory.len() != self.handles.len() + shadows.len() {
            return Err("memory recorded for what is neither a handle nor a shadow".into());
        }
        Ok(())
    }
}
