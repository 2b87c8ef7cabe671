use super::*;
use std::sync::Arc;

/// A shared budget in memory: what `group` keeps in its ledger.
#[derive(Debug, Default)]
struct Pot {
    limit: u64,
    total: Mutex<u64>,
}

#[derive(Debug)]
struct Share(Arc<Pot>);

impl Shared for Share {
    fn try_reserve(&self, bytes: u64) -> bool {
        let mut t = lock(&self.0.total);
        if *t + bytes > self.0.limit {
            return false;
        }
        *t += bytes;
        true
    }
    fn force_reserve(&self, bytes: u64) {
        *lock(&self.0.total) += bytes;
    }
    fn release(&self, bytes: u64) {
        *lock(&self.0.total) -= bytes;
    }
    fn room(&self) -> u64 {
        self.0.limit - *lock(&self.0.total)
    }
    fn limit(&self) -> crate::base::limit::Limit {
        crate::base::limit::Limit::from_raw(self.0.limit)
    }
}

#[test]
fn two_budgets_sharing_one_limit_never_pass_it_and_a_refusal_costs_nothing() {
    let pot = Arc::new(Pot {
        limit: 64 << 20,
        ..Pot::default()
    });
    let (a, b) = (DeviceBudget::new(48 << 20, 0), DeviceBudget::new(0, 0));
    a.share(Box::new(Share(pot.clone())));
    b.share(Box::new(Share(pot.clone())));
    let granted = std::thread::scope(|s| {
        let ta = s.spawn(|| (0..10).filter(|_| a.try_charge(8 << 20)).count());
        let tb = s.spawn(|| (0..10).filter(|_| b.try_charge(8 << 20)).count());
        ta.join().unwrap() + tb.join().unwrap()
    });
    assert_eq!(granted, 8, "64 MiB shared: eight 8 MiB charges in all");
    assert!(a.reserved() <= 48 << 20, "a's own limit holds too");
    assert_eq!(a.reserved() + b.reserved(), *lock(&pot.total));
    let peak = b.stats(0).reserved_peak;
    assert!(!b.try_charge(1), "full");
    assert_eq!(
        b.stats(0).reserved_peak,
        peak,
        "a refused charge leaves no peak"
    );
    assert_eq!(a.room(), 0);
    b.uncharge(8 << 20);
    assert_eq!(
        a.room(),
        ((48 << 20) - a.reserved()).min(8 << 20),
        "room is the smaller of its own and the shared one"
    );
    let fits = a.reserved() < 48 << 20;
    assert_eq!(a.try_charge(8 << 20), fits);
}

#[test]
fn a_64_mib_limit_takes_exactly_eight_8_mib_charges() {
    let b = DeviceBudget::new(64 << 20, 0);
    let ok = (0..9).filter(|_| b.try_charge(8 << 20)).count();
    assert_eq!(ok, 8);
    assert_eq!(b.reserved(), 64 << 20);
    b.uncharge(8 << 20);
    assert!(b.try_charge(8 << 20));
    assert!(!b.try_charge(1));
}

#[test]
fn no_limit_means_no_refusal_but_overflow_is_refused() {
    let b = DeviceBudget::new(0, 0);
    assert!(b.try_charge(u64::MAX - 1));
    assert!(!b.try_charge(2));
}

#[test]
fn concurrent_charges_never_exceed_the_limit() {
    let b = Arc::new(DeviceBudget::new(1000, 0));
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let b = b.clone();
            std::thread::spawn(move || {
                let mut got = 0u64;
                for _ in 0..10_000 {
                    if b.try_charge(7) {
                        got += 1;
                        assert!(b.reserved() <= 1000);
                        if got.is_multiple_of(3) {
                            b.uncharge(7);
                            got -= 1;
                        }
                    }
                }
                got
            })
        })
        .collect();
    let held: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    assert_eq!(b.reserved(), held * 7);
    assert!(b.stats(0).reserved_peak <= 1000);
}

#[test]
fn counters_and_peaks() {
    let b = DeviceBudget::new(0, 5);
    // The shim charges reserved memory before the program holds it.
    assert!(b.try_charge(1000));
    b.on_alloc(100, false);
    b.on_alloc(50, true);
    b.on_free(100, None);
    let s = b.stats(7);
    assert_eq!((s.allocated, s.allocated_peak), (50, 150));
    assert_eq!((s.alloc_calls, s.free_calls, s.cache_hits), (2, 1, 1));
    assert_eq!((s.live_allocations, s.cached, s.soft_limit), (1, 7, 5));
    b.reset_peaks();
    assert_eq!(b.stats(0).allocated_peak, 50);
}

#[test]
fn one_thread_peaks_are_exact_through_any_sequence() {
    // Each allocation is handed a rounded block, sometimes with a rest left on it (as a
    // pool does): the two peaks move apart, and each must be exact.
    let b = DeviceBudget::new(0, 0);
    assert!(b.try_charge(1 << 40));
    let (mut held, mut peak, mut live) = (Vec::new(), [0u64; 2], [0u64; 2]);
    let mut x = 12345u64;
    for step in 0..20_000u64 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        if held.is_empty() || !(x >> 33).is_multiple_of(3) {
            let asked = (x >> 40) % 5000 + 1;
            let handed = asked.next_multiple_of(512) + (x >> 20) % 4 * 4096;
            let n = Bytes { asked, handed };
            b.on_alloc(n, false);
            held.push(n);
            live[0] += handed;
            live[1] += asked;
        } else {
            let n = held.swap_remove((x >> 20) as usize % held.len());
            b.on_free(n, None);
            live[0] -= n.handed;
            live[1] -= n.asked;
        }
        peak = [peak[0].max(live[0]), peak[1].max(live[1])];
        if step % 997 == 0 {
            b.reset_peaks();
            peak = live;
        }
        let s = b.stats(0);
        assert_eq!(
            (s.allocated, s.allocated_peak),
            (live[0], peak[0]),
            "step {step}"
        );
        assert_eq!(
            (s.requested, s.requested_peak),
            (live[1], peak[1]),
            "step {step}"
        );
    }
}

#[test]
fn requested_and_allocated_peak_apart() {
    let b = DeviceBudget::new(0, 0);
    assert!(b.try_charge(1 << 20));
    let wasteful = Bytes {
        asked: 1000,
        handed: 4096,
    };
    b.on_alloc(wasteful, false);
    b.on_free(wasteful, None);
    let (holder, _) = b.on_alloc(
        Bytes {
            asked: 2000,
            handed: 2048,
        },
        true,
    );
    let s = b.stats(0);
    assert_eq!((s.allocated, s.allocated_peak), (2048, 4096));
    assert_eq!((s.requested, s.requested_peak), (2000, 2000));
    // A context's death releases both figures.
    b.on_release(
        Bytes {
            asked: 2000,
            handed: 2048,
        },
        Some(holder),
    );
    let s = b.stats(0);
    assert_eq!((s.allocated, s.requested, s.live_allocations), (0, 0, 0));
}

#[test]
fn the_peak_of_many_threads_is_what_they_held_together() {
    // Each of 8 threads holds at most 64 KiB at a time, and all of them hold exactly that
    // at one moment (a barrier), between rounds of allocations and frees that cross threads.
    const T: usize = 8;
    const X: u64 = 64 << 10;
    let b = Arc::new(DeviceBudget::new(0, 0));
    assert!(b.try_charge(1 << 40));
    let barrier = Arc::new(std::sync::Barrier::new(T));
    let hs: Vec<_> = (0..T)
        .map(|i| {
            let (b, barrier) = (b.clone(), barrier.clone());
            std::thread::spawn(move || {
                for round in 0..200u64 {
                    let piece = 512 << ((i as u64 + round) % 5);
                    let n = X / piece;
                    for _ in 0..n {
                        b.on_alloc(piece, true);
                    }
                    if round == 100 {
                        barrier.wait();
                    }
                    for _ in 0..n {
                        b.on_free(piece, None);
                    }
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    let s = b.stats(0);
    assert_eq!(s.allocated, 0);
    assert_eq!(s.live_allocations, 0);
    assert_eq!(s.allocated_peak, T as u64 * X);
    b.reset_peaks();
    assert_eq!(b.stats(0).allocated_peak, 0);
}

#[test]
fn a_block_freed_on_another_thread_credits_the_thread_that_allocated_it() {
    let b = Arc::new(DeviceBudget::new(0, 0));
    assert!(b.try_charge(1 << 40));
    let (holder, _) = b.on_alloc(1000, false);
    b.on_alloc(24, true);
    let b2 = b.clone();
    std::thread::spawn(move || {
        b2.on_free(1000, Some(holder));
    })
    .join()
    .unwrap();
    // The credit came back to this thread: its next allocation does not move the peak.
    b.on_alloc(900, true);
    let s = b.stats(0);
    assert_eq!((s.allocated, s.allocated_peak), (924, 1024));
    assert_eq!((s.live_allocations, s.alloc_calls, s.free_calls), (2, 3, 1));
    // A free the driver refused: held again, and not counted as a call.
    b.on_free(24, None);
    b.on_free_undone(24);
    let s = b.stats(0);
    assert_eq!((s.allocated, s.live_allocations, s.free_calls), (924, 2, 1));
    assert_eq!(s.cache_hits, 2);
}

/// A thread that frees and allocates its own blocks again (a cached pair) keeps the credit
/// in its private part: no shared credit is written, and the peak stays exact.
#[test]
fn a_threads_own_pairs_use_its_private_credit_only() {
    let b = DeviceBudget::new(0, 0);
    assert!(b.try_charge(1 << 40));
    b.on_alloc(64 << 10, false);
    for _ in 0..1000 {
        let (holder, _) = b.on_alloc(4096, true);
        b.on_free(4096, Some(holder));
    }
    let shared: u64 = b
        .lines
        .lines()
        .map(|(_, l)| l.credit[0].load(Relaxed))
        .sum();
    let private: u64 = b
        .lines
        .lines()
        .map(|(_, l)| l.private[0].load(Relaxed))
        .sum();
    assert_eq!((shared, private), (0, 4096));
    let s = b.stats(0);
    assert_eq!(
        (s.allocated, s.allocated_peak),
        (64 << 10, (64 << 10) + 4096)
    );
    // Past RESERVE, the rest goes to the shared part, where other threads find it.
    let (holder, _) = b.on_alloc(3 * RESERVE, false);
    b.on_free(3 * RESERVE, Some(holder));
    let shared: u64 = b
        .lines
        .lines()
        .map(|(_, l)| l.credit[0].load(Relaxed))
        .sum();
    assert_eq!(shared, 2 * RESERVE);
    b.reset_peaks();
    assert_eq!(
        b.stats(0).allocated_peak,
        64 << 10,
        "its own private credit collected"
    );
}

#[test]
fn settling_takes_other_threads_credit_beyond_their_reserve() {
    let b = Arc::new(DeviceBudget::new(0, 0));
    assert!(b.try_charge(1 << 40));
    let big = 3 * RESERVE;
    b.on_alloc(big, false);
    b.on_free(big, None);
    // This thread now holds `big` of credit; another thread allocating finds what lies
    // beyond this line's reserve, and the peak does not move.
    let b2 = b.clone();
    std::thread::spawn(move || {
        b2.on_alloc(2 * RESERVE, false);
    })
    .join()
    .unwrap();
    assert_eq!(b.stats(0).allocated_peak, big);
    // Past what others can give, the peak grows by exactly what was missing.
    b.on_alloc(RESERVE, false);
    let s = b.stats(0);
    assert_eq!((s.allocated, s.allocated_peak), (big, big));
    let b3 = b.clone();
    std::thread::spawn(move || {
        b3.on_alloc(5, false);
    })
    .join()
    .unwrap();
    assert_eq!(b.stats(0).allocated_peak, big + 5);
}

#[test]
fn the_peak_never_reads_above_the_reserved_peak() {
    // Two threads use the same 512 KiB one after the other. The second cannot take the
    // first's credit (within its reserve), so the credit's peak reads 1 MiB; the reserved
    // peak, 512 KiB, bounds it to the truth.
    let b = Arc::new(DeviceBudget::new(0, 0));
    assert!(b.try_charge(512 << 10));
    b.on_alloc(512 << 10, false);
    b.on_free(512 << 10, None);
    let b2 = b.clone();
    std::thread::spawn(move || {
        b2.on_alloc(512 << 10, true);
    })
    .join()
    .unwrap();
    assert_eq!(b.peaks[ALLOCATED.credit].load(Relaxed), 1 << 20);
    assert_eq!(b.stats(0).allocated_peak, 512 << 10);
}

#[test]
fn a_charge_the_driver_refused_never_counts_in_the_peak() {
    // 1 GiB held, then 64 MiB charged and refused by the driver: the peak stays 1 GiB. Memory
    // that went back keeps its peak.
    let b = DeviceBudget::new(0, 0);
    assert!(b.try_charge(1 << 30));
    assert!(b.try_charge(64 << 20));
    assert_eq!(b.stats(0).reserved_peak, (1 << 30) + (64 << 20), "charged");
    b.refund(64 << 20);
    assert_eq!(b.stats(0).reserved_peak, 1 << 30);
    b.uncharge(512 << 20);
    assert!(b.try_charge(64 << 20));
    b.refund(64 << 20);
    let s = b.stats(0);
    assert_eq!((s.reserved, s.reserved_peak), (512 << 20, 1 << 30));
}
