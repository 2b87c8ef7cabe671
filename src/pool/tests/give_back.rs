//! Giving back what the program gives back (`CUDAPOOL_CACHE_IDLE`, docs/design.md): a free
//! that finds the cache cold goes back to the upstream at once, a free-and-allocate loop keeps
//! its memory cached. (An idle process's cache: `state::cache_idle` and the preload tests.)

use super::*;
use crate::base::config::CacheIdle;
use std::time::Duration;

const MINUTE: CacheIdle = CacheIdle::After(Duration::from_secs(60));

/// Every kind that caches, classic and expandable, under each reuse rule.
fn pools() -> Vec<(String, Box<dyn Pool>, FakeUpstream)> {
    let mut out = Vec::new();
    for rule in [ReuseRule::OneQueue, ReuseRule::Fenced, ReuseRule::Immediate] {
        for kind in [PoolKind::Split, PoolKind::Binned, PoolKind::Simple] {
            let up = FakeUpstream::unlimited(1 << 40);
            out.push((format!("{kind:?} {rule:?}"), pool(kind, rule).0, up));
        }
        let up = FakeUpstream::unlimited(1 << 40).with_vmm(2 * MIB);
        out.push((format!("expandable {rule:?}"), expandable(rule).0, up));
    }
    out
}

#[test]
fn a_cold_free_goes_back_at_once_and_a_loop_keeps_its_memory() {
    for (what, p, up) in pools() {
        let up = up.with_cache_idle(MINUTE);
        // What a program's own cache gives back: a run of frees, nothing allocated between.
        let blocks: Vec<_> = (0..4)
            .map(|_| p.alloc(64 * MIB, &up).unwrap().held(64 * MIB))
            .collect();
        for (i, b) in blocks.into_iter().enumerate() {
            p.free(b, &up).unwrap();
            let live = (3 - i as u64) * 64 * MIB;
            assert_eq!(
                up.outstanding().1,
                live,
                "{what}: a cold free stayed cached"
            );
        }
        // A loop that frees and allocates again: after a few rounds the cache keeps it.
        for _ in 0..10 {
            let g = p.alloc(64 * MIB, &up).unwrap();
            p.free(g.held(64 * MIB), &up).unwrap();
        }
        assert_eq!(up.outstanding().1, 64 * MIB, "{what}: the loop's block");
        assert!(p.cached_bytes() >= 64 * MIB, "{what}");
        p.check().unwrap();
    }
}

#[test]
fn never_keeps_every_free_and_zero_keeps_none() {
    for (what, p, up) in pools() {
        let up = up.with_cache_idle(CacheIdle::Never);
        let g = p.alloc(64 * MIB, &up).unwrap();
        p.free(g.held(64 * MIB), &up).unwrap();
        assert_eq!(up.outstanding().1, 64 * MIB, "{what}: never");
    }
    for (what, p, up) in pools() {
        let up = up.with_cache_idle(CacheIdle::After(Duration::ZERO));
        for size in [4096, 64 * MIB] {
            for _ in 0..10 {
                let g = p.alloc(size, &up).unwrap();
                p.free(g.held(size), &up).unwrap();
                assert_eq!(up.outstanding().1, 0, "{what}: {size} bytes cached under 0");
            }
        }
    }
}

#[test]
fn a_stream_ordered_free_stays_cached() {
    let up = FakeUpstream::unlimited(1 << 40).with_cache_idle(MINUTE);
    let (p, _) = pool(PoolKind::Split, ReuseRule::Fenced);
    let g = p.alloc_on(64 * MIB, 7, &up).unwrap();
    p.free_on(g.held(64 * MIB), 7, &up).unwrap();
    assert_eq!(
        up.outstanding().1,
        64 * MIB,
        "an ordered free never waits for the device"
    );
    assert_eq!(p.reclaim(&up), 64 * MIB, "the idle thread's reclaim");
    assert_eq!(up.outstanding().1, 0);
}
