//! Pool-level benchmarks against the in-process upstream (no device, no shim): what each pool
//! kind costs per alloc+free pair, how it scales with threads, and how much memory it reserves
//! for what it is asked on allocation traces. Prints figures; asserts nothing.
//!
//!     cargo bench --bench pool
//!
//! The figures measure the pool's own work. Through the shim a pair also costs the context
//! lookup, the live table and the counters; `scripts/bench-gpu.sh` measures that on a GPU.

use cudapool::base::config::{PoolKind, Stitch};
use cudapool::base::limit::Limit;
use cudapool::pool::testing::{parse_trace, replay, replay_in, FakeClock, FakeUpstream, Op};
use cudapool::pool::{new_pool, Pool, ReuseRule};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Barrier};
use std::time::Instant;

const KINDS: [PoolKind; 4] = [
    PoolKind::Split,
    PoolKind::Binned,
    PoolKind::Simple,
    PoolKind::None,
];

fn make(kind: PoolKind, rule: ReuseRule) -> Box<dyn Pool> {
    let clock = FakeClock::new(rule);
    clock.instant.store(true, Ordering::SeqCst);
    new_pool(kind, false, Stitch::NearLimit, clock)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// ns per alloc+free pair of `size` on one thread, median of 7 runs.
fn pair_ns(kind: PoolKind, rule: ReuseRule, size: u64) -> f64 {
    let up = FakeUpstream::unlimited(1 << 40);
    let pool = make(kind, rule);
    let iters = if kind == PoolKind::None {
        20_000
    } else {
        200_000
    };
    let runs = (0..7)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..iters {
                let g = pool.alloc(size, &up).unwrap();
                pool.free(g.held(size), &up).unwrap();
            }
            t.elapsed().as_nanos() as f64 / iters as f64
        })
        .collect();
    median(runs)
}

/// ns per pair of `f` (run `iters` times), median of 7 runs.
fn per_pair(iters: u64, mut f: impl FnMut(u64)) -> f64 {
    let runs = (0..7)
        .map(|_| {
            let t = Instant::now();
            for i in 0..iters {
                f(i);
            }
            t.elapsed().as_nanos() as f64 / iters as f64
        })
        .collect();
    median(runs)
}

/// The steps of a cached `cuMemAlloc`+`cuMemFree` pair through the shim, each alone (issue 14):
/// the pool, the live table, the device counters, a thread-local lookup.
fn step_costs() -> Vec<(&'static str, f64)> {
    use cudapool::limits::budget::DeviceBudget;
    use cudapool::state::live::LiveTable;
    use cudapool::state::{Live, Origin};
    let n = 1_000_000;
    let up = FakeUpstream::unlimited(1 << 40);
    let pool = make(PoolKind::Split, ReuseRule::OneQueue);
    let pool_pair = per_pair(n, |_| {
        let g = pool.alloc(4096, &up).unwrap();
        pool.free(g.held(4096), &up).unwrap();
    });
    let live = LiveTable::new(0);
    let entry = Live {
        ctx: 1,
        device: 0,
        size: 4096,
        handed: 4096,
        origin: Origin::Pool,
        holder: cudapool::base::per_thread::LineId::SHARED,
    };
    let live_pair = per_pair(n, |i| {
        let p = 0x7f00_0000_0000 + (i % 64) * 4096;
        live.insert(p, entry);
        std::hint::black_box(live.remove(p));
    });
    let budget = DeviceBudget::new(0, 0);
    let counters = per_pair(n, |_| {
        let (holder, _) = budget.on_alloc(4096, true);
        budget.on_free(4096, Some(holder));
    });
    let tls = per_pair(n, |_| {
        std::hint::black_box(cudapool::base::per_thread::thread_number());
    });
    vec![
        ("pool alloc+free (split, 4 KiB, one queue)", pool_pair),
        ("live table insert+remove", live_pair),
        ("device counters (on_alloc, on_free)", counters),
        ("one thread-local lookup here (in the preloaded library each goes through __tls_get_addr: about 10 a pair, callgrind)", tls),
    ]
}

/// Million pairs per second with `threads` threads sharing one pool.
fn throughput(kind: PoolKind, rule: ReuseRule, size: u64, threads: usize) -> f64 {
    let up = Arc::new(FakeUpstream::unlimited(1 << 40));
    let pool: Arc<dyn Pool> = Arc::from(make(kind, rule));
    let iters = 100_000;
    let runs = (0..5)
        .map(|_| {
            let start = Arc::new(Barrier::new(threads + 1));
            let handles: Vec<_> = (0..threads)
                .map(|_| {
                    let (pool, up, start) = (pool.clone(), up.clone(), start.clone());
                    std::thread::spawn(move || {
                        start.wait();
                        for _ in 0..iters {
                            let g = pool.alloc(size, &*up).unwrap();
                            pool.free(g.held(size), &*up).unwrap();
                        }
                    })
                })
                .collect();
            let t = Instant::now();
            start.wait();
            for h in handles {
                h.join().unwrap();
            }
            (threads * iters) as f64 / t.elapsed().as_secs_f64() / 1e6
        })
        .collect();
    median(runs)
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// Log-uniform in [lo, hi).
    fn size(&mut self, lo: u64, hi: u64) -> u64 {
        let (a, b) = ((lo as f64).ln(), (hi as f64).ln());
        let x = (self.next() % 1_000_000) as f64 / 1e6;
        (a + (b - a) * x).exp() as u64
    }
}

/// A training-like trace: each step allocates activations layer by layer, frees them in
/// reverse during "backward", with temporaries in between.
fn synthetic_training(steps: usize) -> Vec<Op> {
    let mut rng = Rng(0x9E3779B97F4A7C15);
    let layers: Vec<u64> = (0..24).map(|_| rng.size(64 << 10, 48 << 20)).collect();
    let mut ops = Vec::new();
    let mut id = 0;
    for _ in 0..steps {
        let mut acts = Vec::new();
        for &l in &layers {
            id += 1;
            ops.push(Op::Alloc(id, l));
            acts.push(id);
            id += 1;
            ops.push(Op::Alloc(id, rng.size(512, 4 << 20)));
            ops.push(Op::Free(id));
        }
        for a in acts.into_iter().rev() {
            id += 1;
            ops.push(Op::Alloc(id, rng.size(4 << 10, 16 << 20)));
            ops.push(Op::Free(id));
            ops.push(Op::Free(a));
        }
    }
    ops
}

/// Random sizes (512 B to 64 MiB, log-uniform) with random lifetimes.
fn synthetic_random(n: usize) -> Vec<Op> {
    let mut rng = Rng(0x2545F4914F6CDD1D);
    let mut live: Vec<u64> = Vec::new();
    let mut ops = Vec::new();
    for id in 1..=n as u64 {
        if !live.is_empty() && rng.next().is_multiple_of(2) {
            let i = (rng.next() % live.len() as u64) as usize;
            ops.push(Op::Free(live.swap_remove(i)));
        }
        ops.push(Op::Alloc(id, rng.size(512, 64 << 20)));
        live.push(id);
    }
    ops.extend(live.into_iter().map(Op::Free));
    ops
}

fn main() {
    let kinds = |k: &PoolKind| k.name();
    println!("# cudapool pool-level benchmark (in-process upstream; `cargo bench --bench pool`)");
    println!(
        "# {} cores here",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!();
    println!("## alloc+free pair, one thread, ns (median of 7 runs), reuse rule same-thread");
    let sizes: [(u64, &str); 6] = [
        (512, "512 B"),
        (4 << 10, "4 KiB"),
        (64 << 10, "64 KiB"),
        (1 << 20, "1 MiB"),
        (16 << 20, "16 MiB"),
        (256 << 20, "256 MiB"),
    ];
    print!("| kind |");
    for (_, name) in sizes {
        print!(" {name} |");
    }
    println!();
    for kind in KINDS {
        print!("| {} |", kinds(&kind));
        for (size, _) in sizes {
            print!(" {:.0} |", pair_ns(kind, ReuseRule::OneQueue, size));
        }
        println!();
    }
    println!();
    println!("## what each step of a cached pair costs, ns per pair (one thread, median of 7)");
    println!("(through the shim a pair also pays the driver's cuCtxGetCurrent, the hook's panic");
    println!("boundary and re-entry guard, and the per-thread pool lookup)");
    for (step, ns) in step_costs() {
        println!("- {step}: {ns:.1}");
    }
    println!();
    println!("## one thread, 4 KiB pairs by reuse rule, ns");
    for kind in [PoolKind::Split, PoolKind::Binned, PoolKind::Simple] {
        let figures: Vec<String> = [ReuseRule::Immediate, ReuseRule::OneQueue, ReuseRule::Fenced]
            .iter()
            .map(|&r| format!("{r:?} {:.0}", pair_ns(kind, r, 4 << 10)))
            .collect();
        println!("- {}: {}", kinds(&kind), figures.join(", "));
    }
    println!();
    println!("## threads sharing one pool, 4 KiB pairs, million pairs/s (x one thread)");
    for kind in [PoolKind::Split, PoolKind::Binned, PoolKind::Simple] {
        let one = throughput(kind, ReuseRule::OneQueue, 4 << 10, 1);
        let figures: Vec<String> = [1usize, 2, 4, 8, 16]
            .iter()
            .map(|&t| {
                let m = if t == 1 {
                    one
                } else {
                    throughput(kind, ReuseRule::OneQueue, 4 << 10, t)
                };
                format!("{t}: {m:.2} ({:.1}x)", m / one)
            })
            .collect();
        println!("- {}: {}", kinds(&kind), figures.join(", "));
    }
    println!();
    println!("## traces: peak reserved / peak requested (driver allocations), peak handed out / peak requested");
    let mut traces: Vec<(String, Vec<Op>)> = vec![
        (
            "synthetic training (24 layers, 20 steps)".into(),
            synthetic_training(20),
        ),
        (
            "synthetic random (20000 ops)".into(),
            synthetic_random(20_000),
        ),
    ];
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/traces");
    if let Ok(entries) = std::fs::read_dir(dir) {
        let mut files: Vec<_> = entries.flatten().map(|e| e.path()).collect();
        files.sort();
        for f in files
            .into_iter()
            .filter(|f| f.extension().is_some_and(|e| e == "trace"))
        {
            let text = std::fs::read_to_string(&f).unwrap();
            traces.push((
                f.file_name().unwrap().to_string_lossy().into(),
                parse_trace(&text),
            ));
        }
    }
    for (name, ops) in &traces {
        let figures: Vec<String> = KINDS
            .iter()
            .map(|&k| {
                let r = replay(k, ops, ReuseRule::Immediate, 0, Limit::NONE);
                let ratio = r.peak_reserved as f64 / r.peak_requested as f64;
                let handed = r.peak_handed as f64 / r.peak_requested as f64;
                format!("{} {ratio:.3} ({}) {handed:.3}", kinds(&k), r.driver_allocs)
            })
            .chain(std::iter::once({
                let r = replay_in(
                    PoolKind::Split,
                    true,
                    Stitch::NearLimit,
                    ops,
                    ReuseRule::Immediate,
                    0,
                    Limit::NONE,
                );
                let ratio = r.peak_reserved as f64 / r.peak_requested as f64;
                let handed = r.peak_handed as f64 / r.peak_requested as f64;
                format!(
                    "split expandable {ratio:.3} ({}) {handed:.3}",
                    r.driver_allocs
                )
            }))
            .collect();
        println!("- {name}, {} ops: {}", ops.len(), figures.join(", "));
    }
    println!();
    println!("## traces on a GPU lagging by 500 operations, fences (two queues): peak reserved / peak requested (waits)");
    for (name, ops) in &traces {
        let figures: Vec<String> = [PoolKind::Split, PoolKind::Binned, PoolKind::Simple]
            .iter()
            .map(|&k| {
                let r = replay(k, ops, ReuseRule::Fenced, 500, Limit::NONE);
                let ratio = r.peak_reserved as f64 / r.peak_requested as f64;
                format!("{} {ratio:.3} ({} waits)", kinds(&k), r.waits)
            })
            .chain(std::iter::once({
                let r = replay_in(
                    PoolKind::Split,
                    true,
                    Stitch::NearLimit,
                    ops,
                    ReuseRule::Fenced,
                    500,
                    Limit::NONE,
                );
                let ratio = r.peak_reserved as f64 / r.peak_requested as f64;
                format!("split expandable {ratio:.3} ({} waits)", r.waits)
            }))
            .collect();
        println!("- {name}: {}", figures.join(", "));
    }
    println!();
    println!("## traces under a limit of 1.25x the unlimited peak reserved: driver allocations / allocations after the first quarter, OOMs");
    for (name, ops) in &traces {
        let figures: Vec<String> = [PoolKind::Split, PoolKind::Binned, PoolKind::Simple]
            .iter()
            .map(|&k| {
                let free = replay(k, ops, ReuseRule::OneQueue, 0, Limit::NONE);
                let limit = Limit::from_raw(free.peak_reserved + free.peak_reserved / 4);
                let r = replay(k, ops, ReuseRule::OneQueue, 0, limit);
                format!(
                    "{} {} / {} ({} OOMs)",
                    kinds(&k),
                    r.driver_allocs_late,
                    r.allocs_late,
                    r.ooms
                )
            })
            .collect();
        println!("- {name}: {}", figures.join(", "));
    }
}
