//! What lies behind `split`'s expandable arena: which physical allocation (*handle*) is mapped
//! where, and what each one's memory is doing (mapped, mapped at shadows too, or asleep on the
//! host). The blocks, holes and shadows are `split`'s (`mod.rs`); this is the memory under them,
//! with one owner, so that no memory can come to lie under two live blocks, and one record per
//! handle, so that where its bytes are is said once.

use crate::base::addr_hash::AddrMap as HashMap;
use crate::base::cu::DevPtr;
use crate::pool::types::Asleep;
use std::collections::BTreeMap;

/// What a handle's memory is doing.
pub(super) enum Held {
    /// Mapped at the handle's address only.
    Mapped,
    /// Mapped at the handle's address and at this many shadows (stitched from there).
    Shadowed(u32),
    /// Given back by a sleep: nothing mapped, what blocks lay on kept on the host. A release
    /// drops it (the host copy with it); a wake maps it again.
    Asleep(Asleep),
}

/// One physical allocation where blocks may use it.
pub(in crate::pool::split) struct Handle {
    pub(in crate::pool::split) len: u64,
    /// Its memory (what its shadows name).
    id: u64,
    pub(super) held: Held,
}

impl Handle {
    pub(super) fn asleep(&self) -> bool {
        matches!(self.held, Held::Asleep(_))
    }

    pub(super) fn shadowed(&self) -> bool {
        matches!(self.held, Held::Shadowed(_))
    }
}

/// The arena's physical memory.
///
/// Invariants: `handles` holds each physical allocation where blocks may use it (start -> its
/// record; they tile the arena's mapped blocks exactly, which `SplitCore::check` verifies), each
/// with memory of its own (`owner`: id -> start, one handle per id); `shadows` the memory behind
/// each shadow (start -> id), always a handle's of the same size, and a handle is
/// `Shadowed(n)` exactly when `n > 0` shadows name its memory; an asleep handle has no shadow,
/// and its kept parts lie inside it, in order, and fit its host copy.
#[derive(Default)]
pub(super) struct Memory {
    handles: BTreeMap<DevPtr, Handle>,
    owner: HashMap<u64, DevPtr>,
    shadows: HashMap<DevPtr, u64>,
    next: u64,
}

impl Memory {
    /// New memory of `len` bytes mapped at `at`: a handle of its own.
    pub(super) fn made(&mut self, at: DevPtr, len: u64) {
        self.next += 1;
        let id = self.next;
        let held = Held::Mapped;
        self.handles.insert(at, Handle { len, id, held });
        self.owner.insert(id, at);
    }

    /// The handle at `from` is mapped at `to` as well (a stitch, or memory moved back to a
    /// shadow of its own): it is the handle there, and `from` keeps its memory as a shadow.
    /// Nothing changes when `from` is no handle, or is asleep (nothing is mapped to move).
    pub(super) fn moved(&mut self, from: DevPtr, to: DevPtr) {
        let Some(h) = self.handles.remove(&from) else {
            return;
        };
        let n = match h.held {
            Held::Mapped => 0,
            Held::Shadowed(n) => n,
            Held::Asleep(_) => {
                self.handles.insert(from, h);
                return;
            }
        };
        let id = h.id;
        // Moved back to one of its own shadows: that one is the handle now, `from` a shadow.
        let n = if self.shadows.get(&to) == Some(&id) {
            self.shadows.remove(&to);
            n
        } else {
            n + 1
        };
        self.shadows.insert(from, id);
        self.owner.insert(id, to);
        let held = Held::Shadowed(n);
        self.handles.insert(to, Handle { held, ..h });
    }

    /// The handle at `at` is gone: unmapped (its memory went back), or dropped asleep (its host
    /// copy with it). Its record, if there was one.
    pub(super) fn unmapped(&mut self, at: DevPtr) -> Option<Handle> {
        let h = self.handles.remove(&at)?;
        self.owner.remove(&h.id);
        Some(h)
    }

    /// The shadow at `at` was unmapped (its memory stays, a handle elsewhere).
    pub(super) fn shadow_unmapped(&mut self, at: DevPtr) {
        let Some(id) = self.shadows.remove(&at) else {
            return;
        };
        let h = self.owner.get(&id).and_then(|p| self.handles.get_mut(p));
        if let Some(h) = h {
            h.held = match h.held {
                Held::Shadowed(n) if n > 1 => Held::Shadowed(n - 1),
                _ => Held::Mapped,
            };
        }
    }

    /// The handle at `at`, mapped, was unmapped by a sleep that kept `asleep`. `false` (nothing
    /// changes) when it is no handle mapped at its address alone.
    pub(super) fn fell_asleep(&mut self, at: DevPtr, asleep: Asleep) -> bool {
        match self.handles.get_mut(&at) {
            Some(h) if matches!(h.held, Held::Mapped) => {
                h.held = Held::Asleep(asleep);
                true
            }
            _ => false,
        }
    }

    /// Every asleep handle is mapped again: their records (bytes, what was kept).
    pub(super) fn woke(&mut self) -> Vec<(u64, Asleep)> {
        let mut out = Vec::new();
        for h in self.handles.values_mut() {
            if h.asleep() {
                if let Held::Asleep(a) = std::mem::replace(&mut h.held, Held::Mapped) {
                    out.push((h.len, a));
                }
            }
        }
        out
    }

    /// The handles, by start.
    pub(super) fn handles(&self) -> &BTreeMap<DevPtr, Handle> {
        &self.handles
    }

    /// The memory behind the handle or shadow at `at`.
    pub(super) fn id(&self, at: DevPtr) -> Option<u64> {
        (self.handles.get(&at).map(|h| h.id)).or_else(|| self.shadows.get(&at).copied())
    }

    /// Where memory `id` is a handle.
    pub(super) fn handle_of(&self, id: u64) -> Option<DevPtr> {
        self.owner.get(&id).copied()
    }

    /// The invariants above, `shadows` being the arena's shadow blocks (start -> bytes).
    pub(super) fn check(&self, shadows: &BTreeMap<DevPtr, u64>) -> Result<(), String> {
        let mut named: HashMap<u64, u32> = HashMap::default();
        for (&s, &id) in &self.shadows {
            let len = shadows.get(&s);
            let handle = self.handle_of(id).and_then(|h| self.handles.get(&h));
            if len.is_none() || handle.is_none_or(|h| Some(&h.len) != len) {
                return Err(format!(
                    "shadow {s:#x}: its memory is no handle of its size, or it is no shadow block"
                ));
            }
            *named.entry(id).or_default() += 1;
        }
        if self.shadows.len() != shadows.len() {
            return Err(format!(
                "{} shadows recorded for {} shadow blocks",
                self.shadows.len(),
                shadows.len()
            ));
        }
        for (&at, h) in &self.handles {
            if self.handle_of(h.id) != Some(at) {
                return Err(format!("handle {at:#x}: its memory is not its own"));
            }
            let n = named.get(&h.id).copied().unwrap_or(0);
            match &h.held {
                Held::Mapped if n == 0 => {}
                Held::Shadowed(k) if *k == n && n > 0 => {}
                Held::Asleep(a) if n == 0 => check_asleep(at, h.len, a)?,
                _ => {
                    return Err(format!(
                        "handle {at:#x}: its state does not match its {n} shadows"
                    ))
                }
            }
        }
        if self.owner.len() != self.handles.len() {
            return Err(format!(
                "{} owners for {} handles",
                self.owner.len(),
                self.handles.len()
            ));
        }
        Ok(())
    }
}

/// An asleep handle's kept parts lie inside it, in order, and fit its host copy.
fn check_asleep(at: DevPtr, len: u64, a: &Asleep) -> Result<(), String> {
    let mut end = at;
    for &(p, n) in &a.live {
        if p < end || p.saturating_add(n) > at.saturating_add(len) {
            return Err(format!(
                "asleep handle {at:#x} ({len} bytes): its part {p:#x}+{n} is out of order or outside it"
            ));
        }
        end = p + n;
    }
    if a.kept() > a.host.len as u64 {
        return Err(format!(
            "asleep handle {at:#x}: {} kept bytes in a host copy of {}",
            a.kept(),
            a.host.len
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::host_copy::HostCopy;

    const H: u64 = 2 << 20;

    fn asleep(live: Vec<(DevPtr, u64)>, host: u64) -> Asleep {
        let host = HostCopy::new(host).unwrap();
        Asleep { live, host }
    }

    /// Each handle's state follows its shadows, a sleep takes only a handle mapped alone, and
    /// the validator finds a state its records do not back and a kept part out of place.
    #[test]
    fn a_handles_record_says_where_its_memory_is() {
        let mut m = Memory::default();
        let (a, b, s) = (0x1000_0000, 0x1000_0000 + H, 0x2000_0000);
        m.made(a, H);
        m.made(b, H);
        let no_shadows = BTreeMap::new();
        assert_eq!(m.check(&no_shadows), Ok(()));
        // Stitched: `a`'s memory is the handle at `s`, `a` a shadow of it.
        m.moved(a, s);
        let shadows = BTreeMap::from([(a, H)]);
        assert!(matches!(m.handles()[&s].held, Held::Shadowed(1)));
        assert_eq!(m.check(&shadows), Ok(()));
        assert!(
            !m.fell_asleep(s, asleep(Vec::new(), 0)),
            "shadowed: it stays"
        );
        // Moved back to its own shadow: the same one shadow, the other way round.
        m.moved(s, a);
        let back = BTreeMap::from([(s, H)]);
        assert!(matches!(m.handles()[&a].held, Held::Shadowed(1)));
        assert_eq!(m.check(&back), Ok(()));
        m.shadow_unmapped(s);
        assert!(matches!(m.handles()[&a].held, Held::Mapped));
        assert_eq!(m.check(&no_shadows), Ok(()));
        // Asleep: nothing moves it, and the validator reads its kept parts.
        assert!(m.fell_asleep(b, asleep(vec![(b, 4096)], 4096)));
        m.moved(b, s);
        assert!(m.handles()[&b].asleep(), "an asleep handle is not stitched");
        assert_eq!(m.check(&no_shadows), Ok(()));
        assert!(m.check(&shadows).unwrap_err().contains("shadow"));
        m.handles.get_mut(&b).unwrap().held = Held::Asleep(asleep(vec![(b + H, 4096)], 4096));
        assert!(m.check(&no_shadows).unwrap_err().contains("outside it"));
        m.handles.get_mut(&b).unwrap().held = Held::Asleep(asleep(vec![(b, 8192)], 4096));
        assert!(m
            .check(&no_shadows)
            .unwrap_err()
            .contains("host copy of 4096"));
        m.handles.get_mut(&b).unwrap().held = Held::Shadowed(1);
        assert!(m.check(&no_shadows).unwrap_err().contains("0 shadows"));
        assert_eq!(m.woke().len(), 0);
        assert!(m.unmapped(b).is_some());
        assert_eq!(m.check(&no_shadows), Ok(()));
    }
}
