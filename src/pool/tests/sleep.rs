//! The pool's tests of sleep and wake: each asleep handle's record in the arena holds what was
//! kept, a release drops it without an unmap, and a wake maps it all or none (the helpers are
//! the parent's; the fake upstream panics on an unmap of what is not mapped).

use super::*;
use crate::base::cu::CUresult;
use crate::base::host_copy::HostCopy;

const CHUNK: u64 = 2 * MIB;

/// A sleep's `save` as the shim's, without the copy: every handle it is handed is unmapped
/// and recorded asleep with a host copy of its live bytes. Returns the handles handed.
fn sleep_all(p: &dyn Pool, up: &FakeUpstream) -> Vec<Mapped> {
    let mut handed = Vec::new();
    p.sleep(up, &mut |all, asleep| {
        let vm = up.virtual_memory().unwrap();
        for m in all {
            vm.unmap(m.at, m.bytes, m.bytes)
                .map_err(|e| e.to_string())?;
            let live = m.live.clone();
            let host = HostCopy::new(live.iter().map(|&(_, n)| n).sum()).unwrap();
            asleep.push((m.at, Asleep { live, host }));
        }
        handed.extend_from_slice(all);
        Ok(())
    })
    .unwrap();
    handed
}

/// A wake's `restore` as the shim's, without the copy: each handle mapped again, or `fail`.
fn wake_all(p: &dyn Pool, up: &FakeUpstream, fail: Option<CUresult>) -> Result<u64, CUresult> {
    let woke = p.wake(&mut |asleep| {
        let vm = up.virtual_memory().unwrap();
        for &(at, bytes, _) in asleep {
            vm.map(at, bytes, bytes)?;
        }
        match fail {
            Some(e) => {
                for &(at, bytes, _) in asleep {
                    vm.unmap(at, bytes, bytes)?;
                }
                Err(e)
            }
            None => Ok(()),
        }
    })?;
    Ok(woke.iter().map(|(bytes, _)| bytes).sum())
}

/// A sleep leaves each handle's record asleep with its live parts; a second sleep is handed
/// nothing; a wake maps them back and they are mapped again, and a failed one keeps them asleep.
#[test]
fn a_sleep_records_each_handle_asleep_and_a_wake_maps_it_back() {
    let up = FakeUpstream::new(1 << 30).with_vmm(CHUNK);
    let (p, _clock) = expandable(ReuseRule::Immediate);
    let a = p.alloc(3 * MIB, &up).unwrap();
    let b = p.alloc(6 * MIB, &up).unwrap();
    let mapped = up.mapped();
    assert!(mapped >= 9 * MIB);
    let handed = sleep_all(p.as_ref(), &up);
    let live: Vec<(DevPtr, u64)> = handed.iter().flat_map(|m| m.live.clone()).collect();
    assert!(live.iter().any(|&(q, _)| q == a.ptr), "a's bytes are kept");
    assert_eq!(live.iter().map(|&(_, n)| n).sum::<u64>(), 9 * MIB);
    assert_eq!(up.mapped(), 0, "every handle given back");
    assert_eq!(p.asleep_bytes(), mapped);
    assert_eq!(p.check(), Ok(()));
    assert!(
        sleep_all(p.as_ref(), &up).is_empty(),
        "nothing awake to hand"
    );
    assert_eq!(
        wake_all(p.as_ref(), &up, Some(CUDA_ERROR_OUT_OF_MEMORY)),
        Err(CUDA_ERROR_OUT_OF_MEMORY)
    );
    assert_eq!(p.asleep_bytes(), mapped, "a failed wake keeps them asleep");
    assert_eq!(p.check(), Ok(()));
    assert_eq!(wake_all(p.as_ref(), &up, None), Ok(mapped));
    assert_eq!((p.asleep_bytes(), up.mapped()), (0, mapped));
    assert!(up.backed(a.ptr, a.size) && up.backed(b.ptr, b.size));
    assert_eq!(p.check(), Ok(()));
    assert_eq!(
        wake_all(p.as_ref(), &up, None),
        Ok(0),
        "nothing left asleep"
    );
}

/// Memory a pool gives back while asleep only drops its record (the fake panics on an unmap
/// of what is not mapped), and the arena stays valid; a growth afterwards maps new memory.
#[test]
fn a_release_of_asleep_memory_drops_its_record_without_an_unmap() {
    let up = FakeUpstream::new(1 << 30).with_vmm(CHUNK);
    let (p, _clock) = expandable(ReuseRule::Immediate);
    let a = p.alloc(8 * MIB, &up).unwrap();
    let b = p.alloc(8 * MIB, &up).unwrap();
    sleep_all(p.as_ref(), &up);
    let asleep = p.asleep_bytes();
    assert!(asleep >= 16 * MIB);
    p.free(a.held(8 * MIB), &up).unwrap();
    let released = p.trim(&up, u64::MAX);
    assert!(
        released >= 8 * MIB,
        "the free block's handles went ({released})"
    );
    assert_eq!(p.asleep_bytes(), asleep - released);
    assert_eq!(up.mapped(), 0, "nothing was mapped, nothing unmapped");
    assert_eq!(p.check(), Ok(()));
    assert_eq!(wake_all(p.as_ref(), &up, None), Ok(asleep - released));
    assert!(up.backed(b.ptr, b.size));
    let c = p.alloc(8 * MIB, &up).unwrap();
    assert!(up.backed(c.ptr, c.size));
    assert_eq!(p.check(), Ok(()));
}
