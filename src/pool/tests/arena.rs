//! The pool's tests of `split`'s expandable arena, its parked block and the threads' caches
//! (the helpers are the parent's).

use super::*;
use crate::base::limit::Limit;

// ---- expandable segments (the arena of `split`) ---------------------------------------------

const CHUNK: u64 = 2 * MIB;

fn vmm_upstream(capacity: u64) -> FakeUpstream {
    FakeUpstream::new(capacity).with_vmm(CHUNK)
}

/// Large requests grow one range in place, mapping only the chunks they need; the free rest of
/// the last block counts toward the next request.
#[test]
fn the_arena_grows_in_place_by_whole_chunks() {
    let up = vmm_upstream(1 << 30);
    let (p, _) = expandable(ReuseRule::Immediate);
    let a = p.alloc(3 * MIB, &up).unwrap();
    assert_eq!(up.mapped(), 4 * MIB, "3 MiB needs two chunks");
    let b = p.alloc(5 * MIB, &up).unwrap();
    assert_eq!(
        b.ptr,
        a.ptr + 3 * MIB,
        "the next block follows in the same range"
    );
    assert_eq!(
        up.mapped(),
        8 * MIB,
        "the free 1 MiB counted: two more chunks, not three"
    );
    assert_eq!(up.outstanding().0, 0, "no classic segment");
    assert!(up.backed(a.ptr, a.size) && up.backed(b.ptr, b.size));
    // Small requests keep their own 2 MiB segments.
    p.alloc(1000, &up).unwrap();
    assert_eq!(up.outstanding().0, 1);
}

/// The case classic segments cannot serve without a new segment: a request larger than any
/// free block, next to free memory at the end of the range.
#[test]
fn the_arena_reserves_less_than_classic_segments_where_free_memory_is_split() {
    let run = |exp: bool| {
        let up = vmm_upstream(1 << 30);
        let clock = FakeClock::new(ReuseRule::Immediate);
        let p = new_pool(PoolKind::Split, exp, Stitch::NearLimit, clock);
        let x = p.alloc(40 * MIB, &up).unwrap();
        p.free(x.held(40 * MIB), &up).unwrap();
        let _y = p.alloc(10 * MIB, &up).unwrap();
        let z = p.alloc(35 * MIB, &up).unwrap();
        assert!(up.backed(z.ptr, z.size));
        up.outstanding().1
    };
    assert_eq!(run(false), 76 * MIB);
    assert_eq!(run(true), 46 * MIB, "the free 30 MiB and 6 MiB more");
}

/// Trimming gives back the whole chunks of free blocks, also between live ones, and keeps
/// what shares a chunk with a live block; the memory comes back on the next growth.
#[test]
fn trimming_unmaps_free_chunks_between_live_blocks() {
    let up = vmm_upstream(1 << 30);
    let (p, _) = expandable(ReuseRule::Immediate);
    let a = p.alloc(3 * MIB, &up).unwrap();
    let b = p.alloc(8 * MIB, &up).unwrap();
    let c = p.alloc(3 * MIB, &up).unwrap();
    assert_eq!(up.mapped(), 14 * MIB);
    p.free(b.held(8 * MIB), &up).unwrap();
    // b is [3, 11) MiB: chunks [4, 10) lie wholly inside it.
    assert_eq!(p.trim(&up, u64::MAX), 6 * MIB);
    assert_eq!(up.mapped(), 8 * MIB);
    assert_eq!(
        p.cached_bytes(),
        2 * MIB,
        "the pieces sharing a chunk with a and c"
    );
    assert!(up.backed(a.ptr, a.size) && up.backed(c.ptr, c.size));
    let segs = p.segments();
    assert_eq!(segs.len(), 2, "two mapped runs around the hole: {segs:?}");
    assert!(segs.iter().all(|s| s.expandable));
    assert_eq!(segs.iter().map(|s| s.size).sum::<u64>(), up.mapped());
    // 7 MiB fits the hole with the 2 MiB around it: 6 MiB mapped back (not at the end).
    let d = p.alloc(7 * MIB, &up).unwrap();
    assert!(d.ptr > a.ptr && d.ptr < c.ptr, "{d:?} between a and c");
    assert!(up.backed(d.ptr, d.size));
    assert_eq!(up.mapped(), 14 * MIB);
    for (g, n) in [(a, 3), (c, 3), (d, 7)] {
        p.free(g.held(n * MIB), &up).unwrap();
    }
    p.reclaim(&up);
    assert_eq!(up.mapped(), 0);
    assert_eq!(p.cached_bytes(), 0);
}

/// Unmapping does not wait for the device (unlike a driver free): a free block's memory goes
/// back only after a fence behind all work issued so far, never from the stitching path while
/// that fence is pending.
#[test]
fn unmapping_waits_for_the_device() {
    let up = vmm_upstream(1 << 30);
    for rule in [ReuseRule::OneQueue, ReuseRule::Fenced] {
        let (p, clock) = expandable(rule);
        let a = p.alloc(8 * MIB, &up).unwrap();
        p.free(a.held(8 * MIB), &up).unwrap();
        let before = waited(&clock);
        assert_eq!(
            p.release_ready(&up, u64::MAX),
            0,
            "{rule:?}: the device may still use it"
        );
        assert_eq!(up.mapped(), 8 * MIB);
        assert_eq!(p.trim(&up, u64::MAX), 8 * MIB, "{rule:?}");
        assert!(waited(&clock) > before, "{rule:?}: trim waited for a fence");
        assert_eq!(up.mapped(), 0);
    }
}

/// Mapped bytes count against the limit, and near it a request gets what the limit leaves.
#[test]
fn the_arena_maps_within_the_limit() {
    let up = vmm_upstream(64 * MIB);
    let (p, _) = expandable(ReuseRule::Immediate);
    let mut held = Vec::new();
    while let Ok(g) = p.alloc(8 * MIB, &up) {
        held.push(g);
    }
    assert_eq!(held.len(), 8, "eight 8 MiB blocks under 64 MiB");
    assert_eq!(up.mapped(), 64 * MIB);
    // Free two apart: their memory, stitched to the end of the arena, serves one 16 MiB request
    // at the limit, without a trim, a wait or new memory.
    let five = held.remove(5);
    let one = held.remove(1);
    p.free(five.held(8 * MIB), &up).unwrap();
    p.free(one.held(8 * MIB), &up).unwrap();
    let g = p.alloc(16 * MIB, &up).expect("16 MiB from two 8 MiB holes");
    assert!(up.backed(g.ptr, g.size));
    assert_eq!(up.mapped(), 64 * MIB, "no new memory");
    assert!(up.aliased(g.ptr, one.ptr) || up.aliased(g.ptr, five.ptr));
    // The holes are shadows now: no request gets them.
    let more = p.alloc(8 * MIB, &up);
    assert_eq!(more, Err(CUDA_ERROR_OUT_OF_MEMORY));
    // A trim unmaps the shadows; the memory stays where it is used.
    p.trim(&up, u64::MAX);
    assert_eq!(up.mapped(), 64 * MIB);
    assert!(up.backed(g.ptr, g.size));
    p.free(g.held(16 * MIB), &up).unwrap();
    assert_eq!(p.trim(&up, u64::MAX), 16 * MIB);
    assert_eq!(up.mapped(), 48 * MIB);
}

/// Far from the limit nothing is stitched (a stitch costs the device about a synchronization): the
/// same two holes stay free and the 16 MiB request gets new memory; and without a limit,
/// growths come in large handles.
#[test]
fn far_from_a_limit_nothing_is_stitched() {
    for up in [
        vmm_upstream(1 << 30),
        FakeUpstream::unlimited(1 << 30).with_vmm(CHUNK),
    ] {
        let (p, _) = expandable(ReuseRule::Immediate);
        let held: Vec<_> = (0..8).map(|_| p.alloc(8 * MIB, &up).unwrap()).collect();
        p.free(held[5].held(8 * MIB), &up).unwrap();
        p.free(held[1].held(8 * MIB), &up).unwrap();
        let g = p.alloc(16 * MIB, &up).unwrap();
        assert_eq!(up.stitches.load(std::sync::atomic::Ordering::Relaxed), 0);
        assert_eq!(up.mapped(), 80 * MIB, "new memory for the request");
        assert!(!up.aliased(g.ptr, held[1].ptr) && !up.aliased(g.ptr, held[5].ptr));
    }
    let up = FakeUpstream::unlimited(1 << 33).with_vmm(CHUNK);
    let (p, _) = expandable(ReuseRule::Immediate);
    let g = p.alloc(1 << 30, &up).unwrap();
    assert_eq!(
        up.physical(g.ptr, g.size).len(),
        4,
        "1 GiB in four 256 MiB handles"
    );
}

/// `CUDAPOOL_STITCH=always`: without a limit too, the same growth stitches the two holes'
/// handles (small ones: at most 1/16 of the request that made them) and takes no new memory.
#[test]
fn stitching_always_stitches_without_a_limit() {
    let up = FakeUpstream::unlimited(1 << 30).with_vmm(CHUNK);
    let clock = FakeClock::new(ReuseRule::Immediate);
    let p = new_pool(PoolKind::Split, true, Stitch::Always, clock);
    let held: Vec<_> = (0..8).map(|_| p.alloc(8 * MIB, &up).unwrap()).collect();
    assert_eq!(up.physical(held[0].ptr, 8 * MIB).len(), 4, "2 MiB handles");
    p.free(held[5].held(8 * MIB), &up).unwrap();
    p.free(held[1].held(8 * MIB), &up).unwrap();
    let g = p.alloc(16 * MIB, &up).unwrap();
    assert!(up.stitches.load(std::sync::atomic::Ordering::Relaxed) > 0);
    assert_eq!(up.mapped(), 64 * MIB, "no new memory");
    // The growth starts where the arena ended; both holes' memory is mapped there.
    let from = |h: DevPtr| {
        (0..8)
            .filter(|&i| (0..4).any(|j| up.aliased(g.ptr + i * CHUNK, h + j * CHUNK)))
            .count()
    };
    assert_eq!(from(held[1].ptr) + from(held[5].ptr), 8);
    assert!(up.backed(g.ptr, g.size));
}

/// Once a block was exported through legacy IPC, large requests get classic segments; the
/// arena keeps serving from what it holds.
#[test]
fn stop_expanding_turns_to_classic_segments() {
    let up = vmm_upstream(1 << 30);
    let (p, _) = expandable(ReuseRule::Immediate);
    let a = p.alloc(8 * MIB, &up).unwrap();
    assert!(p.block_of(a.ptr).unwrap().expandable);
    p.stop_expanding();
    let b = p.alloc(8 * MIB, &up).unwrap();
    assert!(!p.block_of(b.ptr).unwrap().expandable);
    assert_eq!(up.outstanding().0, 1, "one classic segment");
    p.free(a.held(8 * MIB), &up).unwrap();
    let c = p.alloc(8 * MIB, &up).unwrap();
    assert_eq!(c.ptr, a.ptr, "the arena's free block still serves");
}

/// A context's end forgets the arena without calling the upstream, and names its reserved
/// range and each mapping in it (they outlive the context).
#[test]
fn forgetting_the_arena_names_what_to_unmap() {
    let up = vmm_upstream(1 << 30);
    let (p, _) = expandable(ReuseRule::Immediate);
    let a = p.alloc(3 * MIB, &up).unwrap();
    let gone = p.forget_all();
    let arena = gone.arena.expect("an arena");
    assert_eq!(
        arena.range,
        (a.ptr, 4 << 30),
        "four times the device's memory"
    );
    // A 3 MiB request grows 4 MiB, in handles of at most 1/16 of it: the smallest, 2 MiB.
    assert_eq!(arena.mapped, vec![(a.ptr, CHUNK), (a.ptr + CHUNK, CHUNK)]);
    assert_eq!(gone.bytes, 4 * MIB);
}

/// Random sizes and lifetimes, trims in between, a lagging clock: live blocks never overlap,
/// in addresses or (through stitched memory) in memory, every live block is mapped, the pool's reserved bytes are what the upstream holds, and
/// everything comes back.
#[test]
fn random_workloads_in_the_arena_stay_mapped_and_balance() {
    for rule in [ReuseRule::Immediate, ReuseRule::OneQueue, ReuseRule::Fenced] {
        let up = vmm_upstream(512 * MIB);
        let (p, clock) = expandable(rule);
        let mut live: std::collections::BTreeMap<DevPtr, Held> = Default::default();
        let mut x = 0x9E3779B97F4A7C15u64 ^ rule as u64;
        for step in 0..6000 {
            // Every invariant of the pool and its arena, after each step (frees included).
            p.check()
                .unwrap_or_else(|e| panic!("{rule:?} before step {step}: {e}"));
            xorshift(&mut x);
            if step % 89 == 0 {
                clock.complete_all();
            }
            if step % 211 == 0 {
                p.trim(&up, (x >> 10) % (64 * MIB));
            }
            if x.is_multiple_of(3) && !live.is_empty() {
                let (&ptr, &b) = live.iter().nth((x >> 8) as usize % live.len()).unwrap();
                live.remove(&ptr);
                p.free(b, &up).unwrap();
                continue;
            }
            let size = match x % 4 {
                0 => 1 + (x >> 20) % MIB,
                1 => MIB + (x >> 20) % (9 * MIB),
                2 => 10 * MIB + (x >> 20) % (40 * MIB),
                _ => 1 + (x >> 20) % (64 * 1024),
            };
            match p.alloc(size, &up) {
                Ok(g) => {
                    assert_eq!(g.size, size.next_multiple_of(512), "{rule:?}: {g:?}");
                    if let Some((&q, qb)) = live.range(..=g.ptr + g.size - 1).next_back() {
                        assert!(q + qb.size <= g.ptr, "{rule:?}: {g:?} overlaps {qb:?}");
                    }
                    live.insert(g.ptr, g.held(size));
                }
                Err(e) => assert_eq!(e, CUDA_ERROR_OUT_OF_MEMORY),
            }
            // Stitched memory has two addresses: no two live blocks share memory through them.
            let mut memory = Vec::new();
            for b in live.values() {
                assert!(
                    up.backed(b.ptr, b.size),
                    "{rule:?} step {step}: {b:?} unmapped"
                );
                memory.extend(up.physical(b.ptr, b.size));
            }
            memory.sort_unstable();
            for w in memory.windows(2) {
                assert!(
                    w[0].0 != w[1].0 || w[0].2 <= w[1].1,
                    "{rule:?} step {step}: two live blocks share memory {w:?}"
                );
            }
            let shown: u64 = p.segments().iter().map(|s| s.size).sum();
            assert_eq!(shown, up.outstanding().1, "{rule:?} step {step}");
        }
        let stitches = up.stitches.load(std::sync::atomic::Ordering::Relaxed);
        assert!(
            stitches > 100,
            "{rule:?}: memory was stitched ({stitches} handles)"
        );
        for (_, b) in std::mem::take(&mut live) {
            p.free(b, &up).unwrap();
        }
        p.reclaim(&up);
        assert_eq!(up.outstanding(), (0, 0), "{rule:?}: all given back");
        assert_eq!(p.cached_bytes(), 0);
    }
}

/// A small segment whose free rest ends exactly where the arena begins (the driver's
/// addresses may be so) is no part of the arena: a growth counts only the arena's own free
/// block before a hole. [Before: the growth counted the small segment's rest, mapped a chunk
/// too few and missed its own request ("the grown arena serves the request", a panic).]
#[test]
fn a_segment_that_ends_where_the_arena_begins_is_not_grown_into() {
    let up = FakeUpstream::new(1 << 30).with_vmm(CHUNK).packed();
    let (p, _) = expandable(ReuseRule::Immediate);
    let small = p.alloc(1000, &up).unwrap();
    let big = p.alloc(3 * MIB, &up).unwrap();
    assert_eq!(
        big.ptr,
        small.ptr + CHUNK,
        "the arena begins where the small segment ends"
    );
    assert!(up.backed(big.ptr, big.size));
    assert_eq!(
        up.mapped(),
        4 * MIB,
        "3 MiB in two chunks of the arena's own"
    );
    p.check().unwrap();
}

/// A group's limit: other members take and give back memory between this process's calls, so
/// the headroom and what the upstream grants move under the pool (stitching near the limit
/// one call, not the next), and segments lie side by side in the address space. Every
/// allocation either succeeds, mapped, or is refused with an out-of-memory error; the pool
/// never panics and its invariants hold after each step.
#[test]
fn a_limit_shared_with_others_moves_under_the_arena_and_nothing_breaks() {
    use std::sync::atomic::Ordering::Relaxed;
    for rule in [ReuseRule::Immediate, ReuseRule::OneQueue, ReuseRule::Fenced] {
        for seed in 1..=6u64 {
            let up = FakeUpstream::new(64 * MIB).with_vmm(CHUNK).packed();
            let (p, clock) = expandable(rule);
            // Up to 8 live blocks of 1 to 8 whole MiB, or any size up to 24 MiB.
            let mut live: [Option<Held>; 8] = [None; 8];
            let mut x = 0x9E3779B97F4A7C15u64.wrapping_mul(seed);
            for step in 0..2500 {
                p.check()
                    .unwrap_or_else(|e| panic!("{rule:?} seed {seed} before step {step}: {e}"));
                xorshift(&mut x);
                up.others
                    .store((x >> 40) % (60 * MIB) / CHUNK * CHUNK, Relaxed);
                if step % 7 == 0 {
                    clock.complete_all();
                }
                if step % 53 == 0 {
                    p.trim(&up, (x >> 10) % (16 * MIB));
                }
                let k = (x >> 5) as usize % 8;
                if let Some(b) = live[k].take() {
                    p.free(b, &up).unwrap();
                }
                let size = if seed % 2 == 0 {
                    (1 + (x >> 20) % 8) * MIB
                } else {
                    1 + (x >> 20) % (24 * MIB)
                };
                let got =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| p.alloc(size, &up)))
                        .unwrap_or_else(|_| {
                            panic!("{rule:?} seed {seed} step {step}: a panic for {size}")
                        });
                match got {
                    Ok(g) => {
                        assert!(up.backed(g.ptr, g.size), "{rule:?} seed {seed} step {step}");
                        live[k] = Some(g.held(size));
                    }
                    Err(e) => assert_eq!(e, CUDA_ERROR_OUT_OF_MEMORY),
                }
            }
            up.others.store(0, Relaxed);
            for b in live.into_iter().flatten() {
                p.free(b, &up).unwrap();
            }
            clock.complete_all();
            p.reclaim(&up);
            assert_eq!(
                up.outstanding(),
                (0, 0),
                "{rule:?} seed {seed}: all given back"
            );
        }
    }
}

// ---- split's parked block --------------------------------------------------------------------

/// A block put back ready is parked (neither listed nor merged) until the next operation; a
/// take of its exact size gets it back at once. Against a core that lists and merges every
/// block as it comes back (`unpark` after each put: split before the parked block), random
/// work of every size class, classic and expandable, gets the same blocks at the same
/// addresses, the same segments from the upstream, and the same figures.
#[test]
fn a_parked_block_leaves_splits_choices_as_they_were() {
    use super::core::{Core, READY};
    use super::split::SplitCore;
    for expandable in [false, true] {
        let make = || {
            if expandable {
                (
                    SplitCore::expandable(),
                    FakeUpstream::unlimited(1 << 40).with_vmm(CHUNK),
                )
            } else {
                (SplitCore::default(), FakeUpstream::unlimited(1 << 40))
            }
        };
        let (mut parks, up_a) = make();
        let (mut lists, up_b) = make();
        let mut live: Vec<(DevPtr, u64)> = Vec::new();
        let (mut hits, mut x) = (0, 0x9E3779B97F4A7C15u64 ^ expandable as u64);
        for step in 0..20000 {
            xorshift(&mut x);
            if step % 1000 == 999 {
                // Trims (they unpark first).
                let need = (x >> 12) % (64 * MIB);
                assert_eq!(
                    parks.release_free_segments(&up_a, need, true),
                    lists.release_free_segments(&up_b, need, true),
                    "step {step}"
                );
            } else if x.is_multiple_of(2) && !live.is_empty() {
                // Mostly the newest block, as programs free (a pair), sometimes any.
                let i = if x.is_multiple_of(3) {
                    (x >> 8) as usize % live.len()
                } else {
                    live.len() - 1
                };
                let (ptr, _) = live.swap_remove(i);
                parks.put(ptr, READY, 0);
                lists.put(ptr, READY, 0);
                lists.unpark();
            } else {
                // Sizes again and again (the pairs parking serves), in every class.
                let size = match (x >> 4) % 8 {
                    0 => 4096,
                    1 => 1 + (x >> 20) % MIB,
                    2 => 2 * MIB,
                    3 => 4 * MIB,
                    4 => MIB + (x >> 20) % (20 * MIB),
                    5 => 16 * MIB,
                    6 => 40 * MIB,
                    _ => 1 + (x >> 20) % (64 * 1024),
                };
                let was_parked = parks.cached();
                let a = parks.take(size, READY, Limit::NONE);
                let b = lists.take(size, READY, Limit::NONE);
                assert_eq!(
                    a.map(|t| (t.ptr, t.size)),
                    b.map(|t| (t.ptr, t.size)),
                    "step {step}, {size} B"
                );
                let t = match a {
                    Some(t) => {
                        hits += (was_parked != parks.cached()) as u32;
                        t
                    }
                    None => {
                        let ta = parks.grow(size, &up_a).unwrap();
                        let tb = lists.grow(size, &up_b).unwrap();
                        assert_eq!((ta.ptr, ta.size), (tb.ptr, tb.size), "step {step}, grown");
                        ta
                    }
                };
                live.push((t.ptr, t.size));
            }
            assert_eq!(parks.cached(), lists.cached(), "step {step}");
            assert_eq!(parks.reserved(), lists.reserved(), "step {step}");
        }
        assert!(hits > 1000, "the parked block served {hits} takes");
        parks.unpark();
        let view = |c: &SplitCore| {
            c.segments()
                .into_iter()
                .map(|s| {
                    (
                        s.ptr,
                        s.size,
                        s.blocks.iter().map(|b| (b.ptr, b.size)).collect::<Vec<_>>(),
                    )
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(view(&parks), view(&lists));
        assert_eq!(up_a.outstanding(), up_b.outstanding());
    }
}

/// A thread's cache ([`ThreadCache`]) takes and keeps exactly where the pool's own `alloc` and
/// `free` would use the thread's magazine, and nowhere else: not under `Fenced`, not above
/// the magazines' block size, not above the soft limit, never a spill. What it keeps, the
/// pool counts as cached and serves; a thread that exited with a cache leaves its blocks to
/// the pool (a trim gives them back).
#[test]
fn a_thread_cache_decides_as_the_pool_does() {
    for kind in KINDS_CACHING {
        let up = FakeUpstream::new(1 << 40);
        let (p, clock) = pool(kind, ReuseRule::OneQueue);
        let mine = p.thread_cache().expect("a caching pool has thread caches");
        let a = p.alloc(4096, &up).unwrap();
        assert!(mine.take(4096).is_none(), "{kind:?}: nothing kept yet");
        assert!(mine.keep(a.held(4096), false).is_ok(), "{kind:?}: kept");
        assert_eq!(
            p.cached_bytes(),
            p.segments().iter().map(|s| s.size).sum::<u64>(),
            "{kind:?}: kept is cached"
        );
        assert!(mine.take(512).is_none(), "{kind:?}: an exact size only");
        let b = mine.take(4096).expect("the block kept");
        assert_eq!(
            (b.ptr, b.size, b.from_cache),
            (a.ptr, a.size, true),
            "{kind:?}"
        );
        // Kept by the cache, served by the pool's own alloc (the same magazine).
        mine.keep(b.held(4096), false).unwrap();
        assert_eq!(
            p.alloc(4096, &up).unwrap().ptr,
            a.ptr,
            "{kind:?}: one magazine"
        );
        // Where the pool's free would not use the magazine, neither does the cache.
        let big = p.alloc(2 << 20, &up).unwrap();
        assert!(
            mine.keep(big.held(2 << 20), false).is_err(),
            "{kind:?}: above 1 MiB"
        );
        let c = p.alloc(8192, &up).unwrap();
        assert!(
            mine.keep(c.held(8192), true).is_err(),
            "{kind:?}: above the soft limit"
        );
        *clock.rule.lock().unwrap() = ReuseRule::Fenced;
        assert!(mine.keep(c.held(8192), false).is_err(), "{kind:?}: fenced");
        *clock.rule.lock().unwrap() = ReuseRule::OneQueue;
        // A full magazine: the cache hands the block back rather than spill.
        let held: Vec<_> = (0..64).map(|_| p.alloc(512, &up).unwrap()).collect();
        let kept = held
            .iter()
            .take_while(|g| mine.keep(g.held(512), false).is_ok())
            .count();
        assert!(
            kept > 0 && kept < 64,
            "{kind:?}: a magazine holds some, not all ({kept})"
        );
        *clock.rule.lock().unwrap() = ReuseRule::Fenced;
        assert!(mine.take(512).is_none(), "{kind:?}: fenced: no take either");
        *clock.rule.lock().unwrap() = ReuseRule::OneQueue;
        // A thread that exits with blocks in its cache leaves them to the pool: cached, and
        // given back by a trim like any other.
        let (p, _) = pool(kind, ReuseRule::OneQueue);
        let p: Arc<dyn Pool> = Arc::from(p);
        let up = Arc::new(FakeUpstream::new(1 << 40));
        let (p2, up2) = (p.clone(), up.clone());
        std::thread::spawn(move || {
            let mine = p2.thread_cache().unwrap();
            let g = p2.alloc(4096 * 3, &*up2).unwrap();
            mine.keep(g.held(4096 * 3), false).unwrap();
        })
        .join()
        .unwrap();
        assert!(up.outstanding().0 > 0, "{kind:?}");
        assert_eq!(
            p.cached_bytes(),
            up.outstanding().1,
            "{kind:?}: all of it cached"
        );
        p.trim(&*up, u64::MAX);
        assert_eq!(up.outstanding(), (0, 0), "{kind:?}: all of it given back");
    }
}

/// A view of the segments shows free blocks as the next allocation will find them: split's
/// parked block (the one freed last, not yet merged) shows merged with its free neighbour,
/// and the view changes no choice of the pool (the same block comes back afterwards).
#[test]
fn segments_show_a_parked_block_merged() {
    for expandable in [false, true] {
        let up = FakeUpstream::new(1 << 40).with_vmm(2 * MIB);
        let clock = FakeClock::new(ReuseRule::OneQueue);
        let p = new_pool(PoolKind::Split, expandable, Stitch::NearLimit, clock);
        let whole = p.alloc(32 * MIB, &up).unwrap();
        p.free(whole.held(32 * MIB), &up).unwrap();
        let a = p.alloc(8 * MIB, &up).unwrap();
        let b = p.alloc(8 * MIB, &up).unwrap();
        assert_eq!(
            b.ptr,
            a.ptr + 8 * MIB,
            "expandable {expandable}: split from one block"
        );
        p.free(b.held(8 * MIB), &up).unwrap(); // parked beside the free rest
        let segs = p.segments();
        for s in &segs {
            for w in s.blocks.windows(2) {
                let adjacent = w[0].ptr + w[0].size == w[1].ptr;
                assert!(
                    !(adjacent && w[0].state == BlockState::Free && w[1].state == BlockState::Free),
                    "expandable {expandable}: two free blocks side by side: {:?}",
                    s.blocks
                );
            }
        }
        assert!(
            segs.iter()
                .flat_map(|s| &s.blocks)
                .any(|v| v.ptr == b.ptr && v.state == BlockState::Free && v.size >= 24 * MIB),
            "expandable {expandable}: the freed block shows merged with the rest: {segs:?}"
        );
        assert_eq!(
            p.alloc(8 * MIB, &up).unwrap().ptr,
            b.ptr,
            "expandable {expandable}"
        );
    }
}
