//! The pool kinds against the in-process upstream (`testing`): the contract, each kind's own
//! rules, reuse safety under every rule, lagging fences, limits, recorded traces.

use super::testing::{self, contract, FakeClock, FakeUpstream};
use super::*;
use crate::base::cu::{DevPtr, CUDA_ERROR_OUT_OF_MEMORY};
use crate::base::limit::Limit;
use std::sync::Arc;

const MIB: u64 = 1 << 20;
const KINDS: [PoolKind; 4] = [
    PoolKind::Split,
    PoolKind::Binned,
    PoolKind::Simple,
    PoolKind::None,
];

fn pool(kind: PoolKind, rule: ReuseRule) -> (Box<dyn Pool>, Arc<FakeClock>) {
    let clock = FakeClock::new(rule);
    (
        new_pool(kind, false, Stitch::NearLimit, clock.clone()),
        clock,
    )
}

/// `split` with expandable segments.
fn expandable(rule: ReuseRule) -> (Box<dyn Pool>, Arc<FakeClock>) {
    let clock = FakeClock::new(rule);
    (
        new_pool(PoolKind::Split, true, Stitch::NearLimit, clock.clone()),
        clock,
    )
}

#[test]
fn every_kind_meets_the_contract() {
    contract(|| pool(PoolKind::Split, ReuseRule::Immediate).0);
    contract(|| pool(PoolKind::Binned, ReuseRule::Immediate).0);
    contract(|| pool(PoolKind::Simple, ReuseRule::Immediate).0);
    contract(|| pool(PoolKind::Split, ReuseRule::Fenced).0);
    contract(|| pool(PoolKind::Binned, ReuseRule::OneQueue).0);
    contract(|| pool(PoolKind::Simple, ReuseRule::Fenced).0);
    contract(|| expandable(ReuseRule::Immediate).0);
    contract(|| expandable(ReuseRule::OneQueue).0);
    contract(|| expandable(ReuseRule::Fenced).0);
}

/// The contract (docs/design.md): rounding and segment sizes never cost the program memory it asked for.
#[test]
fn near_the_limit_every_kind_fits_what_was_asked() {
    for kind in KINDS {
        for (size, fits) in [
            (8 * MIB, 8),
            (5 * MIB, 12),
            (9 * MIB, 7),
            (7 * MIB, 9),
            (MIB, 64),
        ] {
            let up = FakeUpstream::new(64 * MIB);
            let (p, _) = pool(kind, ReuseRule::Immediate);
            let mut n = 0;
            while p.alloc(size, &up).is_ok() {
                n += 1;
            }
            assert_eq!(n, fits, "{kind:?}: {size} bytes under 64 MiB");
        }
        // Sizes off the 512-byte grid: alignment costs the rounding, and no more than 1%.
        for size in [3000u64, 100_000, 1_500_000] {
            let up = FakeUpstream::new(64 * MIB);
            let (p, _) = pool(kind, ReuseRule::Immediate);
            let mut n = 0u64;
            while p.alloc(size, &up).is_ok() {
                n += 1;
            }
            let best = 64 * MIB / size.div_ceil(512) / 512;
            assert!(
                n * 100 >= best * 99,
                "{kind:?}: {n} of {size} bytes, best {best}"
            );
        }
    }
}

/// `block_of` finds the block that holds any address inside it (what the address queries
/// answer), and nothing where the memory is cached.
#[test]
fn block_of_finds_the_handed_out_block_that_holds_an_address() {
    for kind in KINDS {
        let up = FakeUpstream::new(1 << 30);
        let (p, _) = pool(kind, ReuseRule::Immediate);
        let (ga, gb) = (p.alloc(1000, &up).unwrap(), p.alloc(1000, &up).unwrap());
        let (a, b) = (ga.ptr, gb.ptr);
        if kind == PoolKind::None {
            assert_eq!(
                p.block_of(a),
                None,
                "none: the driver's allocation is the answer"
            );
            continue;
        }
        for (x, at) in [(a, a), (a, a + 999), (b, b + 1)] {
            let span = p.block_of(at).expect("a block");
            assert_eq!(span.ptr, x, "{kind:?}");
            assert!(at < span.ptr + span.size && span.size >= 1000, "{kind:?}");
        }
        let (sa, sb) = (p.block_of(a).unwrap(), p.block_of(b).unwrap());
        assert_eq!(
            sa.segment, a,
            "{kind:?}: the first block starts its segment"
        );
        if kind == PoolKind::Split {
            assert_eq!(sb.segment, a, "split: both in one small segment");
        } else {
            assert_eq!(sb.segment, b, "{kind:?}: every block is a whole segment");
        }
        // (Small frees may wait in a thread's magazine, still blocks to the core; a large
        // one is cached at once under the immediate rule.)
        let gc = p.alloc(8 * MIB, &up).unwrap();
        let c = gc.ptr;
        assert_eq!(p.block_of(c + MIB).map(|s| s.ptr), Some(c), "{kind:?}");
        p.free(gc.held(8 * MIB), &up).unwrap();
        assert_eq!(
            p.block_of(c + MIB),
            None,
            "{kind:?}: cached memory is no block"
        );
        p.free(ga.held(1000), &up).unwrap();
        p.free(gb.held(1000), &up).unwrap();
    }
}

#[test]
fn split_serves_small_requests_from_one_segment_and_coalesces() {
    let up = FakeUpstream::new(1 << 30);
    let (p, _) = pool(PoolKind::Split, ReuseRule::Immediate);
    let a: Vec<_> = (0..8).map(|_| p.alloc(1000, &up).unwrap()).collect();
    assert_eq!(
        up.outstanding(),
        (1, 2 * MIB),
        "one 2 MiB segment for small requests"
    );
    assert!(a.iter().skip(1).all(|g| g.from_cache));
    // Free in an order that needs merging on both sides.
    for i in [1, 3, 0, 2, 5, 7, 6, 4] {
        p.free(a[i].held(1000), &up).unwrap();
    }
    assert_eq!(
        p.cached_bytes(),
        2 * MIB,
        "coalesced back into one free segment"
    );
    assert_eq!(p.reclaim(&up), 2 * MIB);
    assert_eq!(up.outstanding(), (0, 0));
    // Small and large requests never share a segment.
    let s = p.alloc(4096, &up).unwrap();
    let l = p.alloc(3 * MIB, &up).unwrap();
    assert_eq!(up.outstanding().0, 2);
    p.free(s.held(4096), &up).unwrap();
    p.free(l.held(3 * MIB), &up).unwrap();
}

#[test]
fn split_never_splits_oversize_blocks() {
    let up = FakeUpstream::new(8 << 30);
    let (p, _) = pool(PoolKind::Split, ReuseRule::Immediate);
    let big = p.alloc(1200 * MIB, &up).unwrap();
    p.free(big.held(1200 * MIB), &up).unwrap();
    // A 20 MiB request must not carve up the cached 1200 MiB block.
    let small = p.alloc(20 * MIB, &up).unwrap();
    assert!(!small.from_cache);
    // A request within 20 MiB of it may take it whole.
    let near = p.alloc(1190 * MIB, &up).unwrap();
    assert!(near.from_cache && near.ptr == big.ptr);
}

#[test]
fn binned_rounds_to_powers_of_two() {
    let up = FakeUpstream::unlimited(1 << 30);
    let (p, _) = pool(PoolKind::Binned, ReuseRule::Immediate);
    let a = p.alloc(3000, &up).unwrap();
    assert_eq!(up.outstanding(), (1, 4096));
    p.free(a.held(3000), &up).unwrap();
    let b = p.alloc(4000, &up).unwrap();
    assert!(b.from_cache && b.ptr == a.ptr, "same class serves");
    p.alloc(100, &up).unwrap();
    assert_eq!(up.outstanding(), (2, 4096 + 512), "floor of 512 bytes");
    // Under a limit: exact segments, still matched by class.
    let up = FakeUpstream::new(1 << 30);
    let (p, _) = pool(PoolKind::Binned, ReuseRule::Immediate);
    let a = p.alloc(3000, &up).unwrap();
    assert_eq!(up.outstanding(), (1, 3000));
    p.free(a.held(3000), &up).unwrap();
    assert!(
        !p.alloc(3001, &up).unwrap().from_cache,
        "too small for 3001"
    );
    assert!(
        p.alloc(2500, &up).unwrap().from_cache,
        "same class, large enough"
    );
}

#[test]
fn simple_serves_only_the_exact_size() {
    let up = FakeUpstream::new(1 << 30);
    let (p, _) = pool(PoolKind::Simple, ReuseRule::Immediate);
    let a = p.alloc(3000, &up).unwrap();
    p.free(a.held(3000), &up).unwrap();
    assert!(!p.alloc(3001, &up).unwrap().from_cache);
    assert!(p.alloc(3000, &up).unwrap().from_cache);
}

/// Fills a whole segment in every kind, so no spare piece serves the next request.
const WHOLE: u64 = 20 * MIB;
/// A live block large enough that a few freed `WHOLE` blocks are small against what the
/// pool reserves: a miss then grows instead of waiting for their fence.
const BALLAST: u64 = 1 << 30;
const KINDS_CACHING: [PoolKind; 3] = [PoolKind::Split, PoolKind::Binned, PoolKind::Simple];

fn issued(c: &FakeClock) -> u64 {
    c.issued.load(std::sync::atomic::Ordering::SeqCst)
}
fn waited(c: &FakeClock) -> u64 {
    c.waited.load(std::sync::atomic::Ordering::SeqCst)
}

#[test]
fn fenced_blocks_wait_for_their_fence() {
    for kind in KINDS_CACHING {
        let up = FakeUpstream::unlimited(1 << 40);
        let (p, clock) = pool(kind, ReuseRule::Fenced);
        p.alloc(BALLAST, &up).unwrap();
        let a = p.alloc(WHOLE, &up).unwrap();
        p.free(a.held(WHOLE), &up).unwrap();
        let b = p.alloc(WHOLE, &up).unwrap();
        assert_ne!(b.ptr, a.ptr, "{kind:?}: reused before its fence");
        assert_eq!(
            waited(&clock),
            0,
            "{kind:?}: small against reserved: no wait"
        );
        clock.complete_all();
        let c = p.alloc(WHOLE, &up).unwrap();
        assert_eq!(c.ptr, a.ptr, "{kind:?}: reused once its fence is done");
        assert!(c.from_cache);
    }
}

/// Under `OneQueue` (all work on one queue) a freed block is reusable at once by any
/// thread, without a fence.
#[test]
fn one_queue_reuse_is_immediate_for_every_thread() {
    for kind in KINDS_CACHING {
        let up = Arc::new(FakeUpstream::new(1 << 30));
        let (p, clock) = pool(kind, ReuseRule::OneQueue);
        let p: Arc<dyn Pool> = Arc::from(p);
        for size in [WHOLE, 4096] {
            let a = p.alloc(size, &*up).unwrap();
            p.free(a.held(size), &*up).unwrap();
            let b = p.alloc(size, &*up).unwrap();
            assert_eq!(b.ptr, a.ptr, "{kind:?}: the same thread at once");
            p.free(b.held(size), &*up).unwrap();
            let (p2, up2) = (p.clone(), up.clone());
            let c = std::thread::spawn(move || p2.alloc(size, &*up2).unwrap())
                .join()
                .unwrap();
            // (A small block waits in the freeing thread's magazine; the other thread
            // gets another cached piece, never a fresh segment.)
            assert!(c.from_cache, "{kind:?}: another thread from the cache");
            if size == WHOLE {
                assert_eq!(c.ptr, a.ptr, "{kind:?}: another thread at once");
            }
            p.free(c.held(size), &*up).unwrap();
        }
        assert_eq!(issued(&clock), 0, "{kind:?}: no fence");
    }
}

/// A free under `OneQueue` is split and coalesced like any free block: a smaller request
/// takes a piece of it.
#[test]
fn one_queue_frees_are_split_and_coalesced_at_once() {
    let up = FakeUpstream::unlimited(1 << 40);
    let (p, _) = pool(PoolKind::Split, ReuseRule::OneQueue);
    let a = p.alloc(64 * MIB, &up).unwrap();
    p.free(a.held(64 * MIB), &up).unwrap();
    let b = p.alloc(24 * MIB, &up).unwrap();
    let c = p.alloc(24 * MIB, &up).unwrap();
    assert_eq!((b.ptr, c.ptr), (a.ptr, a.ptr + 24 * MIB), "split at once");
    p.free(b.held(24 * MIB), &up).unwrap();
    p.free(c.held(24 * MIB), &up).unwrap();
    assert_eq!(
        p.alloc(64 * MIB, &up).unwrap().ptr,
        a.ptr,
        "coalesced at once"
    );
}

/// docs/design.md, trap 3: a block freed in order on stream `s` is reusable at once by
/// allocations ordered on `s`, from inside the core (best fit, split), by nothing else
/// before its fence.
#[test]
fn stream_ordered_frees_are_reused_on_their_stream_at_once() {
    const S1: StreamKey = 0x1000;
    const S2: StreamKey = 0x2000;
    for kind in KINDS_CACHING {
        let up = FakeUpstream::unlimited(1 << 40);
        let (p, clock) = pool(kind, ReuseRule::Fenced);
        p.alloc(BALLAST, &up).unwrap();
        let a = p.alloc_on(WHOLE, S1, &up).unwrap();
        p.free_on(a.held(WHOLE), S1, &up).unwrap();
        let other = p.alloc_on(WHOLE, S2, &up).unwrap();
        assert_ne!(
            other.ptr, a.ptr,
            "{kind:?}: another stream before the fence"
        );
        let plain = p.alloc(WHOLE, &up).unwrap();
        assert_ne!(
            plain.ptr, a.ptr,
            "{kind:?}: an unordered alloc before the fence"
        );
        let same = p.alloc_on(WHOLE, S1, &up).unwrap();
        assert_eq!(same.ptr, a.ptr, "{kind:?}: its own stream at once");
        assert!(same.from_cache);
        p.free_on(same.held(WHOLE), S1, &up).unwrap();
        if kind == PoolKind::Split {
            // From inside the core: a smaller request on the same stream takes a piece.
            let piece = p.alloc_on(WHOLE / 4, S1, &up).unwrap();
            assert_eq!(piece.ptr, a.ptr, "split: best fit in the stream's lane");
            p.free_on(piece.held(WHOLE / 4), S1, &up).unwrap();
            let whole = p.alloc_on(WHOLE, S1, &up).unwrap();
            assert_eq!(whole.ptr, a.ptr, "split: coalesced again in the lane");
            p.free_on(whole.held(WHOLE), S1, &up).unwrap();
        }
        assert_eq!(waited(&clock), 0);
        // Once its fence is done, any allocation gets it.
        clock.complete_all();
        let later = p.alloc_on(WHOLE, S2, &up).unwrap();
        assert_eq!(
            later.ptr, a.ptr,
            "{kind:?}: any stream once its fence is done"
        );
        // An unordered free is not reusable early by a stream.
        p.free(later.held(WHOLE), &up).unwrap();
        let s1 = p.alloc_on(WHOLE, S1, &up).unwrap();
        assert_ne!(
            s1.ptr, a.ptr,
            "{kind:?}: unordered free, stream alloc, no fence"
        );
    }
}

/// Under `OneQueue`, a stream-ordered free is ready for anyone at once.
#[test]
fn stream_ordered_frees_under_one_queue() {
    let up = FakeUpstream::new(1 << 30);
    let (p, _clock) = pool(PoolKind::Split, ReuseRule::OneQueue);
    let a = p.alloc_on(WHOLE, 1, &up).unwrap();
    p.free_on(a.held(WHOLE), 1, &up).unwrap();
    assert_eq!(p.alloc(WHOLE, &up).unwrap().ptr, a.ptr);
}

/// Fences are sealed by size, by bytes and by count, not only every 64 frees.
#[test]
fn large_frees_are_fenced_at_once_small_ones_in_batches() {
    let up = FakeUpstream::unlimited(1 << 40);
    let (p, clock) = pool(PoolKind::Split, ReuseRule::Fenced);
    let big = p.alloc(4 * MIB, &up).unwrap();
    p.free(big.held(4 * MIB), &up).unwrap();
    assert_eq!(issued(&clock), 1, "a 4 MiB free is fenced at once");
    let small: Vec<_> = (0..63).map(|_| p.alloc(4096, &up).unwrap()).collect();
    for g in &small {
        p.free(g.held(4096), &up).unwrap();
    }
    // (A batch older than 1 ms is sealed too, so a slow machine may have sealed one more.)
    assert!(issued(&clock) <= 2, "63 small frees wait for a batch");
    let one = p.alloc(4096, &up).unwrap();
    p.free(one.held(4096), &up).unwrap();
    assert!(issued(&clock) >= 2, "the 64th seals the batch");
    let before = issued(&clock);
    let mid: Vec<_> = (0..4).map(|_| p.alloc(600 << 10, &up).unwrap()).collect();
    for g in &mid {
        p.free(g.held(600 << 10), &up).unwrap();
    }
    assert_eq!(issued(&clock), before + 1, "2 MiB of frees seal a batch");
}

/// A CPU far ahead of the GPU: fences complete only when the pool takes their blocks back.
/// Each "step" holds 32 x 8 MiB of activations and frees them; with growth bounded by taking
/// the oldest fence's blocks back, reserved stays near the live peak. Without that (fences
/// ignored until they complete by themselves, as before), it grows by every step. Returns the
/// clock, for how the blocks came back.
fn lagging_steps_stay_near_the_live_peak(kind: PoolKind, hands_over: bool) -> Arc<FakeClock> {
    let up = FakeUpstream::unlimited(1 << 40);
    let (p, clock) = pool(kind, ReuseRule::Fenced);
    clock
        .hands_over
        .store(hands_over, std::sync::atomic::Ordering::SeqCst);
    let live_peak = 32 * 8 * MIB;
    for _ in 0..20 {
        let acts: Vec<_> = (0..32).map(|_| p.alloc(8 * MIB, &up).unwrap()).collect();
        for g in acts.iter().rev() {
            p.free(g.held(8 * MIB), &up).unwrap();
        }
    }
    let reserved = up.outstanding().1;
    assert!(
        reserved * 100 <= live_peak * 110,
        "{kind:?}: reserved {reserved} for a live peak of {live_peak}"
    );
    clock
}

#[test]
fn growth_is_bounded_while_fences_lag() {
    for kind in KINDS_CACHING {
        let clock = lagging_steps_stay_near_the_live_peak(kind, false);
        assert!(waited(&clock) > 0, "{kind:?}: it waited instead of growing");
    }
}

/// Where the clock can hand a fence over (every queue's next work waits for it on the device),
/// the pool takes the oldest batch back that way instead of waiting on the host: the same
/// memory bound, no host wait.
#[test]
fn a_clock_that_hands_fences_over_bounds_growth_without_waiting() {
    for kind in KINDS_CACHING {
        let clock = lagging_steps_stay_near_the_live_peak(kind, true);
        assert_eq!(waited(&clock), 0, "{kind:?}: no host wait");
        let handed = clock.handed.load(std::sync::atomic::Ordering::SeqCst);
        assert!(handed > 0, "{kind:?}");
    }
}

/// A clock that may not wait (a graph capture is under way): the pool takes no fenced block
/// back on the strength of a refused wait, never loops on it, and grows instead; a trim gives
/// back nothing that waits for a fence. Once waits are allowed again, the blocks come back.
#[test]
fn a_clock_that_refuses_to_wait_never_hands_a_fenced_block_out() {
    use std::sync::atomic::Ordering::SeqCst;
    for kind in KINDS_CACHING {
        let up = FakeUpstream::unlimited(1 << 40);
        let (p, clock) = pool(kind, ReuseRule::Fenced);
        clock.refuses_waits.store(true, SeqCst);
        let mut freed = std::collections::HashSet::new();
        for _ in 0..20 {
            let acts: Vec<_> = (0..32).map(|_| p.alloc(8 * MIB, &up).unwrap()).collect();
            for g in acts.iter() {
                assert!(
                    !freed.contains(&g.ptr),
                    "{kind:?}: a fenced block handed out"
                );
            }
            for g in acts.iter().rev() {
                freed.insert(g.ptr);
                p.free(g.held(8 * MIB), &up).unwrap();
            }
        }
        assert!(waited(&clock) > 0, "{kind:?}: the pool asked to wait");
        let grown = up.outstanding().1;
        assert!(grown > 32 * 8 * MIB * 2, "{kind:?}: it grew instead");
        p.trim(&up, u64::MAX);
        assert_eq!(
            up.outstanding().1,
            grown,
            "{kind:?}: nothing fenced went back"
        );
        clock.refuses_waits.store(false, SeqCst);
        p.trim(&up, u64::MAX);
        assert!(
            up.outstanding().1 < grown,
            "{kind:?}: waited for, it goes back"
        );
    }
}

/// A thread waiting for a fence does not hold the pool's lock: meanwhile another thread's
/// free and a look at the cache go through; the waiter is served once the fence is done.
#[test]
fn a_wait_for_a_fence_holds_no_lock() {
    use std::sync::atomic::Ordering::SeqCst;
    for kind in KINDS_CACHING {
        let up = Arc::new(FakeUpstream::new(128 * MIB));
        let (p, clock) = pool(kind, ReuseRule::Fenced);
        let p: Arc<dyn Pool> = Arc::from(p);
        let x = p.alloc(4096, &*up).unwrap(); // a 2 MiB segment
        let mut ballast: Vec<_> = [64, 32, 16, 8]
            .map(|mib| p.alloc(mib * MIB, &*up).unwrap().held(mib * MIB))
            .into();
        let a = p.alloc(4 * MIB, &*up).unwrap(); // 126 MiB reserved of 128
        p.free(x.held(4096), &*up).unwrap();
        clock.complete_all(); // x is ready (collected by the next miss)
        p.free(a.held(4 * MIB), &*up).unwrap();
        clock.gate.store(true, SeqCst);
        let (p2, up2) = (p.clone(), up.clone());
        // At the limit: this miss must wait for a's fence.
        let waiter = std::thread::spawn(move || p2.alloc(4 * MIB, &*up2).unwrap());
        while waited(&clock) == 0 {
            std::thread::yield_now();
        }
        // The waiter is inside the wait now; the pool must still serve others.
        let (p3, up3) = (p.clone(), up.clone());
        let eight = ballast.pop().unwrap();
        let other = std::thread::spawn(move || {
            p3.free(eight, &*up3).unwrap();
            p3.cached_bytes()
        });
        let t = std::time::Instant::now();
        while !other.is_finished() && t.elapsed() < std::time::Duration::from_secs(5) {
            std::thread::yield_now();
        }
        let finished = other.is_finished();
        clock.gate.store(false, SeqCst);
        other.join().unwrap();
        assert!(
            finished,
            "{kind:?}: another thread was blocked by a waiting one"
        );
        let b = waiter.join().unwrap();
        assert_eq!(
            b.ptr, a.ptr,
            "{kind:?}: the waiter gets the block it waited for"
        );
    }
}

/// Under a limit with no room to grow, a miss waits for the fences before it fails.
#[test]
fn a_miss_at_the_limit_waits_for_fences_before_it_fails() {
    for kind in KINDS_CACHING {
        // Held back: 4 of 128 MiB, small against reserved; only the limit makes it wait.
        let up = FakeUpstream::new(128 * MIB);
        let (p, clock) = pool(kind, ReuseRule::Fenced);
        p.alloc(124 * MIB, &up).unwrap();
        let a = p.alloc(4 * MIB, &up).unwrap();
        p.free(a.held(4 * MIB), &up).unwrap();
        let b = p.alloc(4 * MIB, &up).unwrap();
        assert_eq!(b.ptr, a.ptr, "{kind:?}: served after the wait");
        assert_eq!(waited(&clock), 1, "{kind:?}");
    }
}

const PYTORCH_TRACE: &str = include_str!("../../../benches/traces/pytorch_transformer.trace");
/// Recorded on an H100 from `benches/gpu/train_mem.py` (3 steps each, caching off).
const GPT_TRACE: &str = include_str!("../../../benches/traces/pytorch_gpt.trace");
const RESNET_TRACE: &str = include_str!("../../../benches/traces/pytorch_resnet50_amp.trace");

/// The recorded PyTorch trace on a GPU lagging by 500 operations, every free fenced (two
/// queues): freed blocks come back in fence order, not in the order the program asks; a
/// pool that splits the first large block that fits reserves 1.6-1.7x what the trace
/// holds, against 1.12x with no lag. Close fits first keep it near the no-lag figure.
#[test]
fn fenced_reuse_on_a_lagging_gpu_stays_near_the_live_peak() {
    for trace in [PYTORCH_TRACE, GPT_TRACE, RESNET_TRACE] {
        let ops = testing::parse_trace(trace);
        let r = testing::replay(PoolKind::Split, &ops, ReuseRule::Fenced, 500, Limit::NONE);
        let ratio = r.peak_reserved as f64 / r.peak_requested as f64;
        assert!(ratio <= 1.25, "peak reserved / peak requested {ratio:.3}");
        assert!(r.waits > 0);
    }
}

/// Recorded PyTorch traces under a limit of 1.25x what they reserve without one: after the
/// first quarter, under 1% of allocations reach the driver, and none fails. (Keeping whole
/// cached segments from being split under any limit made 6% reach it on the GPT.)
#[test]
fn a_limit_above_the_need_costs_no_churn() {
    let cases = [
        (PYTORCH_TRACE, PoolKind::Split),
        (PYTORCH_TRACE, PoolKind::Binned),
        (PYTORCH_TRACE, PoolKind::Simple),
        (GPT_TRACE, PoolKind::Split),
        (RESNET_TRACE, PoolKind::Split),
    ];
    for (i, (trace, kind)) in cases.into_iter().enumerate() {
        let ops = testing::parse_trace(trace);
        let free = testing::replay(kind, &ops, ReuseRule::OneQueue, 0, Limit::NONE);
        let limit = Limit::from_raw(free.peak_reserved + free.peak_reserved / 4);
        let r = testing::replay(kind, &ops, ReuseRule::OneQueue, 0, limit);
        assert_eq!(r.ooms, 0, "case {i}: {kind:?}");
        assert!(
            r.driver_allocs_late * 100 < r.allocs_late,
            "case {i}: {kind:?}: {} driver allocations for {}",
            r.driver_allocs_late,
            r.allocs_late
        );
    }
}

#[test]
fn reclaim_waits_for_fences_then_gives_everything_back() {
    let up = FakeUpstream::new(1 << 30);
    let (p, clock) = pool(PoolKind::Split, ReuseRule::Fenced);
    let a = p.alloc(3 * MIB, &up).unwrap();
    let b = p.alloc(100, &up).unwrap();
    p.free(a.held(3 * MIB), &up).unwrap();
    p.free(b.held(100), &up).unwrap();
    assert!(p.cached_bytes() > 0, "held back blocks count as cached");
    let held = up.outstanding().1;
    assert_eq!(p.reclaim(&up), held);
    assert!(clock.waited.load(std::sync::atomic::Ordering::SeqCst) >= 1);
    assert_eq!(up.outstanding(), (0, 0));
    assert_eq!(p.cached_bytes(), 0);
}

#[test]
fn a_pool_owns_its_segments_even_when_cached() {
    for kind in [PoolKind::Split, PoolKind::Binned, PoolKind::Simple] {
        let up = FakeUpstream::new(1 << 30);
        let (p, _) = pool(kind, ReuseRule::Immediate);
        let a = p.alloc(4096, &up).unwrap();
        assert!(p.owns(a.ptr) && p.owns(a.ptr + 100));
        p.free(a.held(4096), &up).unwrap();
        assert!(p.owns(a.ptr), "{kind:?}: cached is still owned");
        assert!(!p.owns(a.ptr - 1) && !p.owns(1));
        p.reclaim(&up);
        assert!(!p.owns(a.ptr), "{kind:?}: given back");
    }
}

/// The next state of a xorshift64 generator (the random workloads' dice).
fn xorshift(x: &mut u64) {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
}

/// Random sizes and lifetimes: live blocks never overlap, the upstream sees exactly what
/// the pool holds, and everything comes back.
#[test]
fn random_workloads_never_overlap_and_balance() {
    for kind in KINDS {
        for rule in [ReuseRule::Immediate, ReuseRule::OneQueue, ReuseRule::Fenced] {
            let up = FakeUpstream::new(512 * MIB);
            let (p, clock) = pool(kind, rule);
            let mut live: std::collections::BTreeMap<DevPtr, Held> = Default::default();
            let mut x = 0x2545F4914F6CDD1Du64 ^ kind as u64;
            for step in 0..4000 {
                // Every invariant of the pool and its core, after each step (frees included).
                p.check()
                    .unwrap_or_else(|e| panic!("{kind:?}/{rule:?} before step {step}: {e}"));
                xorshift(&mut x);
                if step % 97 == 0 {
                    clock.complete_all();
                }
                if x.is_multiple_of(3) && !live.is_empty() {
                    let (&ptr, &b) = live.iter().nth((x >> 8) as usize % live.len()).unwrap();
                    live.remove(&ptr);
                    p.free(b, &up).unwrap();
                    continue;
                }
                let size = match x % 5 {
                    0 => 1 + (x >> 20) % 4096,
                    1 => 1 + (x >> 20) % MIB,
                    2 => MIB + (x >> 20) % (9 * MIB),
                    _ => 1 + (x >> 20) % (64 * 1024),
                };
                match p.alloc(size, &up) {
                    Ok(g) => {
                        assert!(g.size >= size, "{kind:?}/{rule:?}: {g:?} for {size}");
                        // split hands out the request rounded to 512 bytes, never more (below
                        // its 1 GiB oversize blocks): a rest is split off, however small.
                        if kind == PoolKind::Split {
                            assert_eq!(g.size, size.next_multiple_of(512), "{rule:?}: {g:?}");
                        }
                        if kind == PoolKind::Simple {
                            assert_eq!(g.size, size, "{rule:?}: {g:?}");
                        }
                        if let Some((&q, qb)) = live.range(..=g.ptr + g.size - 1).next_back() {
                            assert!(
                                q + qb.size <= g.ptr,
                                "{kind:?}/{rule:?}: {g:?} overlaps {qb:?}"
                            );
                        }
                        assert!(p.owns(g.ptr) || kind == PoolKind::None);
                        live.insert(g.ptr, g.held(size));
                    }
                    Err(e) => assert_eq!(e, CUDA_ERROR_OUT_OF_MEMORY),
                }
            }
            for (_, b) in std::mem::take(&mut live) {
                p.free(b, &up).unwrap();
            }
            p.reclaim(&up);
            assert_eq!(
                up.outstanding(),
                (0, 0),
                "{kind:?}/{rule:?}: all given back"
            );
            assert_eq!(p.cached_bytes(), 0);
        }
    }
}

mod arena;
mod give_back;
mod sleep;
