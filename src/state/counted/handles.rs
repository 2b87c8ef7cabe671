//! The program's own physical memory (`cuMemCreate`) in the counted tables: each handle's one
//! record, awake or asleep, its mappings, and the value the program holds for it. Tables only:
//! what is charged is `counting`'s, told by each operation what went back to the driver; the
//! driver's side of a sleep and a wake is `sleep::foreign`'s.

use super::{Counted, Phys, ProgramAsleep, VmMap};
use crate::base::addr_hash::AddrMap as HashMap;
use crate::base::cu::*;
use crate::base::sync::lock;

impl Counted {
    /// `cuMemCreate` made the driver's handle `r`: its record, and the value the program gets
    /// (the driver's, unless the program holds that one for a handle asleep, whose driver handle
    /// the sleep released: then a value of its own).
    pub(in crate::state) fn made(&self, r: MemHandle, phys: Phys) -> MemHandle {
        let mut handles = lock(&self.handles);
        let h = match self.program_value(r) {
            h if handles.contains_key(&h) => self.synthetic_for(r),
            h => h,
        };
        handles.insert(h, phys);
        h
    }

    /// The program's handle `h` is shared outside the process: it never sleeps.
    pub(in crate::state) fn shared(&self, h: MemHandle) {
        if let Some(p) = lock(&self.handles).get_mut(&h) {
            p.shared = true;
        }
    }

    /// The program's memory mapped in `[at, at + bytes)` is shared outside the process.
    pub(in crate::state) fn range_shared(&self, at: DevPtr, bytes: u64) {
        let mut handles = lock(&self.handles);
        let maps = lock(&self.maps);
        let first = maps.range(..=at).next_back().map_or(at, |(&p, _)| p);
        for (&p, m) in maps.range(first..at.saturating_add(bytes)) {
            if p + m.bytes > at {
                if let Some(ph) = handles.get_mut(&m.handle) {
                    ph.shared = true;
                }
            }
        }
    }

    /// `cuMemRelease(h)` succeeded: the device and bytes the driver freed, if it did.
    pub(in crate::state) fn released(&self, h: MemHandle) -> Option<(CUdevice, u64)> {
        let mut handles = lock(&self.handles);
        if let Some(p) = handles.get_mut(&h) {
            p.refs = p.refs.saturating_sub(1);
        }
        self.drop_if_free(&mut handles, h)
    }

    /// `cuMemRetainAllocationHandle` handed out `h` again.
    pub(in crate::state) fn retained(&self, h: MemHandle) {
        if let Some(p) = lock(&self.handles).get_mut(&h) {
            p.refs += 1;
        }
    }

    /// `cuMemMap(va, size, offset, h)` succeeded (`h`: the program's value).
    pub(in crate::state) fn mapped(&self, va: DevPtr, size: u64, offset: u64, h: MemHandle) {
        let mut handles = lock(&self.handles);
        if let Some(p) = handles.get_mut(&h) {
            p.maps += 1;
            let m = VmMap {
                bytes: size,
                offset,
                handle: h,
            };
            lock(&self.maps).insert(va, m);
        }
    }

    /// `cuMemUnmap(va, size)` succeeded: every mapping that starts in the range is gone. The
    /// devices and bytes the driver freed with them.
    pub(in crate::state) fn unmapped(&self, va: DevPtr, size: u64) -> Vec<(CUdevice, u64)> {
        let mut handles = lock(&self.handles);
        let gone: Vec<MemHandle> = {
            let mut maps = lock(&self.maps);
            let starts: Vec<DevPtr> = maps
                .range(va..va.saturating_add(size))
                .map(|(&k, _)| k)
                .collect();
            starts
                .into_iter()
                .filter_map(|k| maps.remove(&k).map(|m| m.handle))
                .collect()
        };
        let mut freed = Vec::new();
        for h in gone {
            if let Some(p) = handles.get_mut(&h) {
                p.maps = p.maps.saturating_sub(1);
            }
            freed.extend(self.drop_if_free(&mut handles, h));
        }
        freed
    }

    /// Drops `h` when nothing holds it any more (the driver has freed it): its device and bytes.
    fn drop_if_free(
        &self,
        handles: &mut HashMap<MemHandle, Phys>,
        h: MemHandle,
    ) -> Option<(CUdevice, u64)> {
        let p = handles.get(&h).filter(|p| p.refs == 0 && p.maps == 0)?;
        let freed = (p.device, p.size);
        handles.remove(&h);
        self.unalias(h);
        Some(freed)
    }

    /// The program's handle `key` is asleep: its record holds `asleep`, its mappings leave the
    /// maps table, and no driver value stands for it (the driver's is released).
    pub(in crate::state) fn fell_asleep(&self, key: MemHandle, asleep: ProgramAsleep) {
        let mut handles = lock(&self.handles);
        if let Some(p) = handles.get_mut(&key) {
            p.asleep = Some(Box::new(asleep));
        }
        lock(&self.maps).retain(|_, m| m.handle != key);
        drop(handles);
        self.unalias(key);
    }

    /// The asleep handle `key` was made again as the driver's `real` and mapped where it was:
    /// its mappings are the table's again, and what it kept asleep is handed back. `handles`
    /// is this table's, held by the wake.
    pub(in crate::state) fn woke(
        &self,
        handles: &mut HashMap<MemHandle, Phys>,
        key: MemHandle,
        real: MemHandle,
    ) -> Option<Box<ProgramAsleep>> {
        let a = handles.get_mut(&key)?.asleep.take()?;
        let mut maps = lock(&self.maps);
        for m in &a.maps {
            let vm = VmMap {
                bytes: m.bytes,
                offset: m.offset,
                handle: key,
            };
            maps.insert(m.at, vm);
        }
        drop(maps);
        self.alias(key, real);
        Some(a)
    }

    /// Bytes of the program's own memory of `dev` asleep.
    pub(in crate::state) fn asleep_bytes(&self, dev: CUdevice) -> u64 {
        (lock(&self.handles).values())
            .filter(|p| p.device == dev && p.asleep.is_some())
            .map(|p| p.size)
            .sum()
    }

    /// Whether any handle of the program's is asleep.
    pub(in crate::state) fn any_asleep(&self) -> bool {
        (lock(&self.handles).values()).any(|p| p.asleep.is_some())
    }

    /// The program's handles asleep, each record's own invariants: its mappings fit the handle
    /// and its host copy, and none of them is in the maps table. Returns how many are asleep.
    /// (Called by debug builds of the library only.)
    #[cfg_attr(any(test, not(debug_assertions)), allow(dead_code))]
    pub(in crate::state) fn check_asleep(&self) -> Result<usize, String> {
        let handles = lock(&self.handles);
        let maps = lock(&self.maps);
        let mut n = 0;
        for (&key, p) in handles.iter() {
            let Some(a) = &p.asleep else {
                continue;
            };
            n += 1;
            check_record(p.size, a)?;
            if maps.values().any(|m| m.handle == key) {
                return Err(format!(
                    "the program's handle {key:#x} is asleep and mapped"
                ));
            }
        }
        Ok(n)
    }
}

/// An asleep handle of `size` bytes: its mappings lie inside it and fit its host copy.
fn check_record(size: u64, a: &ProgramAsleep) -> Result<(), String> {
    let copied: u64 = a.maps.iter().map(|m| m.bytes).sum();
    if copied > a.host.len as u64 || a.maps.iter().any(|m| m.offset + m.bytes > size) {
        return Err(format!(
            "the program's handle of {size} bytes: mappings of {copied} bytes do not fit it or its host copy of {}",
            a.host.len
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::AsleepMap;
    use super::*;
    use crate::base::host_copy::HostCopy;

    /// The validator sees what it is for: a mapping outside its handle, mappings that do not
    /// fit the host copy.
    #[test]
    fn the_asleep_handles_validator_finds_each_broken_invariant() {
        let asleep = |offset: u64, bytes: u64, host: u64| ProgramAsleep {
            maps: vec![AsleepMap {
                at: 0x7000_0000,
                bytes,
                offset,
                access: Vec::new(),
            }],
            host: HostCopy::new(host).unwrap(),
        };
        assert_eq!(check_record(2 << 20, &asleep(0, 2 << 20, 2 << 20)), Ok(()));
        let outside = check_record(2 << 20, &asleep(2 << 20, 4096, 4096));
        assert!(outside.unwrap_err().contains("do not fit"));
        let short = check_record(2 << 20, &asleep(0, 8192, 4096));
        assert!(short.unwrap_err().contains("host copy of 4096"));
    }

    /// A record asleep keeps its value while the driver hands the same value out again: the new
    /// handle gets a value of its own, and the woken one its mappings and the driver's new value.
    #[test]
    fn a_handle_asleep_keeps_its_value_and_wakes_with_its_mappings() {
        let c = Counted::default();
        let head = [0u8; 256];
        // SAFETY: 256 readable bytes, more than a CUmemAllocationProp.
        let prop = unsafe { PropBytes::read(head.as_ptr().cast()) };
        let h = c.made(0x10, Phys::made(0, 2 << 20, prop));
        assert_eq!(h, 0x10);
        c.mapped(0x7000_0000, 2 << 20, 0, h);
        let maps = vec![AsleepMap {
            at: 0x7000_0000,
            bytes: 2 << 20,
            offset: 0,
            access: Vec::new(),
        }];
        let host = HostCopy::new(2 << 20).unwrap();
        c.fell_asleep(h, ProgramAsleep { maps, host });
        assert_eq!((c.asleep_bytes(0), c.any_asleep()), (2 << 20, true));
        assert_eq!(c.check_asleep(), Ok(1));
        assert!(lock(&c.maps).is_empty(), "its mappings are its record's");
        // The driver hands out the released value again, for other memory.
        let other = c.made(0x10, Phys::made(0, 4096, prop));
        assert_ne!(other, h, "a value of its own");
        assert_eq!(c.real(other), 0x10);
        let mut handles = lock(&c.handles);
        let kept = c.woke(&mut handles, h, 0x20).expect("asleep");
        drop(handles);
        assert_eq!(kept.maps.len(), 1);
        assert_eq!((c.real(h), c.program_value(0x20)), (0x20, h));
        assert_eq!(lock(&c.maps).get(&0x7000_0000).map(|m| m.handle), Some(h));
        assert_eq!((c.asleep_bytes(0), c.any_asleep()), (0, false));
        assert_eq!(c.check_asleep(), Ok(0));
    }
}
