//! An in-process upstream, controllable clocks, trace replay, and the contract every pool kind
//! must meet: for tests and benchmarks, no device involved.

use super::handed::Held;
use super::new_pool;
use super::reuse::{Clock, FenceId, ReuseRule};
use super::types::*;
use crate::base::config::{CacheIdle, PoolKind, Stitch};
use crate::base::cu::CUDA_ERROR_OUT_OF_MEMORY;
use crate::base::cu::{CUresult, DevPtr};
use crate::base::limit::Limit;
use std::collections::BTreeMap;
use std::sync::Mutex;

/// Host-side fake: hands out addresses 256-aligned from a counter, remembers what is out,
/// refuses beyond `capacity`. With [`with_vmm`](Self::with_vmm) it also offers virtual memory:
/// reserved ranges, and chunks mapped in them, charged against `capacity` like segments.
pub struct FakeUpstream {
    pub capacity: u64,
    /// Whether `capacity` is a limit the pool is told about (headroom), or only the device.
    limited: bool,
    /// (next address, segments out, bytes out: segments' and mapped chunks')
    state: Mutex<(u64, BTreeMap<DevPtr, u64>, u64)>,
    /// The chunk of the virtual memory offered (0: none).
    chunk: u64,
    vmm: Mutex<Vmem>,
    /// Handles stitched so far.
    pub stitches: std::sync::atomic::AtomicU64,
    /// What [`Upstream::cache_idle`] says (default: never).
    cache_idle: CacheIdle,
    /// The address space left between two segments (256 bytes; 0 when [`packed`](Self::packed)).
    gap: u64,
    /// Bytes other processes hold under the same limit (a group's other members): they
    /// narrow the headroom and the upstream refuses past them. Tests change it between calls.
    pub others: std::sync::atomic::AtomicU64,
}

/// The fake's virtual memory: reserved ranges (start -> size), mappings (start -> (bytes, the
/// physical allocation)), and physical allocations (id -> (bytes, mappings of it)). Memory
/// is charged while a mapping of it is left.
#[derive(Default)]
struct Vmem {
    reserved: BTreeMap<DevPtr, u64>,
    maps: BTreeMap<DevPtr, (u64, u64)>,
    phys: std::collections::HashMap<u64, (u64, u32)>,
    next: u64,
}

impl Vmem {
    /// Whether `[at, at + bytes)` lies in one reserved range and overlaps no mapping.
    fn vacant(&self, at: DevPtr, bytes: u64) -> bool {
        let inside = self
            .reserved
            .range(..=at)
            .next_back()
            .is_some_and(|(&b, &s)| at + bytes <= b + s);
        let before = self
            .maps
            .range(..at)
            .next_back()
            .is_some_and(|(&p, &(l, _))| p + l > at);
        inside && !before && self.maps.range(at..at + bytes).next().is_none()
    }
}

impl FakeUpstream {
    /// A device of `capacity` bytes under a limit of the same size.
    pub fn new(capacity: u64) -> Self {
        FakeUpstream {
            capacity,
            limited: true,
            state: Mutex::new((1 << 20, BTreeMap::new(), 0)),
            chunk: 0,
            vmm: Mutex::default(),
            stitches: 0.into(),
            cache_idle: CacheIdle::Never,
            others: 0.into(),
            gap: 256,
        }
    }
    /// The same, telling its pools to give back freed memory as `CUDAPOOL_CACHE_IDLE=idle`.
    pub fn with_cache_idle(self, idle: CacheIdle) -> Self {
        FakeUpstream {
            cache_idle: idle,
            ..self
        }
    }
    /// The same, handing out addresses with no space between them, from 2 MiB: a segment may
    /// end where the next one, or a reserved range, begins (the driver's addresses may).
    pub fn packed(self) -> Self {
        *self.state.lock().unwrap() = (2 << 20, BTreeMap::new(), 0);
        FakeUpstream { gap: 0, ..self }
    }
    /// The same, offering virtual memory mapped in chunks of `chunk` bytes.
    pub fn with_vmm(self, chunk: u64) -> Self {
        FakeUpstream { chunk, ..self }
    }
    /// Whether every byte of `[ptr, ptr + len)` that lies in a reserved range is mapped.
    pub fn backed(&self, ptr: DevPtr, len: u64) -> bool {
        let v = self.vmm.lock().unwrap();
        let Some((&base, &size)) = v.reserved.range(..=ptr).next_back() else {
            return true;
        };
        if ptr >= base + size {
            return true;
        }
        let mut at = ptr;
        while at < ptr + len {
            match v.maps.range(..=at).next_back() {
                Some((&p, &(l, _))) if p + l > at => at = p + l,
                _ => return false,
            }
        }
        true
    }
    /// Bytes of memory mapped now (memory mapped twice counts once).
    pub fn mapped(&self) -> u64 {
        self.vmm.lock().unwrap().phys.values().map(|p| p.0).sum()
    }
    /// The memory behind `[ptr, ptr + len)`, as (physical allocation, from, to) offsets in it,
    /// for the bytes of it that are mapped.
    pub fn physical(&self, ptr: DevPtr, len: u64) -> Vec<(u64, u64, u64)> {
        let v = self.vmm.lock().unwrap();
        let first = v.maps.range(..=ptr).next_back().map_or(ptr, |(&p, _)| p);
        v.maps
            .range(first..ptr + len)
            .filter(|&(&p, &(l, _))| p + l > ptr)
            .map(|(&p, &(l, id))| {
                let lo = ptr.max(p) - p;
                let hi = (ptr + len).min(p + l) - p;
                (id, lo, hi)
            })
            .collect()
    }
    /// Whether `a` and `b` are mappings of the same memory.
    pub fn aliased(&self, a: DevPtr, b: DevPtr) -> bool {
        let v = self.vmm.lock().unwrap();
        matches!((v.maps.get(&a), v.maps.get(&b)), (Some(x), Some(y)) if x.1 == y.1)
    }
    /// A device of `capacity` bytes with no limit.
    pub fn unlimited(capacity: u64) -> Self {
        FakeUpstream {
            limited: false,
            ..FakeUpstream::new(capacity)
        }
    }
    pub fn outstanding(&self) -> (usize, u64) {
        let s = self.state.lock().unwrap();
        (s.1.len(), s.2)
    }
    fn others(&self) -> u64 {
        self.others.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// A clock whose fences complete when the test says so.
pub struct FakeClock {
    pub rule: std::sync::Mutex<ReuseRule>,
    next: std::sync::atomic::AtomicU64,
    /// Fences up to this id are done.
    done_upto: std::sync::atomic::AtomicU64,
    pub issued: std::sync::atomic::AtomicU64,
    pub waited: std::sync::atomic::AtomicU64,
    /// Every fence is done as soon as it is issued (benchmarks of the bookkeeping alone).
    pub instant: std::sync::atomic::AtomicBool,
    /// Fences are handed over ([`Clock::hand_over`]) rather than waited for; counted.
    pub hands_over: std::sync::atomic::AtomicBool,
    pub handed: std::sync::atomic::AtomicU64,
    /// While set, a wait blocks (a test sees what other threads can do meanwhile).
    pub gate: std::sync::atomic::AtomicBool,
    /// While set, the clock may not wait (as during a graph capture): a wait returns false at
    /// once, the fence not done.
    pub refuses_waits: std::sync::atomic::AtomicBool,
}

impl FakeClock {
    pub fn new(rule: ReuseRule) -> std::sync::Arc<Self> {
        std::sync::Arc::new(FakeClock {
            rule: std::sync::Mutex::new(rule),
            next: 1.into(),
            done_upto: 0.into(),
            issued: 0.into(),
            waited: 0.into(),
            instant: false.into(),
            hands_over: false.into(),
            handed: 0.into(),
            gate: false.into(),
            refuses_waits: false.into(),
        })
    }
    /// Every fence issued so far completes.
    pub fn complete_all(&self) {
        use std::sync::atomic::Ordering::SeqCst;
        self.done_upto.store(self.next.load(SeqCst) - 1, SeqCst);
    }
}

impl Clock for FakeClock {
    fn rule(&self) -> ReuseRule {
        *self.rule.lock().unwrap()
    }
    fn issue(&self) -> Option<FenceId> {
        use std::sync::atomic::Ordering::SeqCst;
        self.issued.fetch_add(1, SeqCst);
        Some(self.next.fetch_add(1, SeqCst))
    }
    fn is_done(&self, f: FenceId) -> bool {
        use std::sync::atomic::Ordering::SeqCst;
        self.instant.load(SeqCst) || f <= self.done_upto.load(SeqCst)
    }
    fn wait(&self, f: FenceId) -> bool {
        use std::sync::atomic::Ordering::SeqCst;
        self.waited.fetch_add(1, SeqCst);
        if self.refuses_waits.load(SeqCst) {
            return false;
        }
        while self.gate.load(SeqCst) {
            std::thread::yield_now();
        }
        self.done_upto.fetch_max(f, SeqCst);
        true
    }
    fn retire(&self, _f: FenceId) {}
    fn hand_over(&self, _f: FenceId) -> bool {
        use std::sync::atomic::Ordering::SeqCst;
        let yes = self.hands_over.load(SeqCst);
        if yes {
            self.handed.fetch_add(1, SeqCst);
        }
        yes
    }
}

/// A clock for a GPU that lags by `lag` operations: a fence completes once `lag` more
/// operations were issued after it ([`LagClock::op`]), or when the pool waits for it.
pub struct LagClock {
    pub rule: ReuseRule,
    lag: u64,
    now: std::sync::atomic::AtomicU64,
    /// The op count at which each fence was issued, by fence id (ids count from 1).
    issued_at: Mutex<Vec<u64>>,
    done_upto: std::sync::atomic::AtomicU64,
    pub waited: std::sync::atomic::AtomicU64,
}

impl LagClock {
    pub fn new(rule: ReuseRule, lag: u64) -> std::sync::Arc<Self> {
        std::sync::Arc::new(LagClock {
            rule,
            lag,
            now: 0.into(),
            issued_at: Mutex::new(Vec::new()),
            done_upto: 0.into(),
            waited: 0.into(),
        })
    }
    /// One more operation issued (the GPU moves on by one).
    pub fn op(&self) {
        self.now.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Clock for LagClock {
    fn rule(&self) -> ReuseRule {
        self.rule
    }
    fn issue(&self) -> Option<FenceId> {
        let mut v = self.issued_at.lock().unwrap();
        v.push(self.now.load(std::sync::atomic::Ordering::SeqCst));
        Some(v.len() as FenceId)
    }
    fn is_done(&self, f: FenceId) -> bool {
        use std::sync::atomic::Ordering::SeqCst;
        let at = self.issued_at.lock().unwrap()[f as usize - 1];
        f <= self.done_upto.load(SeqCst) || at + self.lag <= self.now.load(SeqCst)
    }
    fn wait(&self, f: FenceId) -> bool {
        use std::sync::atomic::Ordering::SeqCst;
        self.waited.fetch_add(1, SeqCst);
        self.done_upto.fetch_max(f, SeqCst);
        true
    }
    fn retire(&self, _f: FenceId) {}
}

/// One allocation trace: `a ID SIZE` and `f ID` lines (`#` comments), as recorded by
/// `benches/gpu/record_trace.py`.
#[derive(Debug, Clone, Copy)]
pub enum Op {
    Alloc(u64, u64),
    Free(u64),
}

pub fn parse_trace(text: &str) -> Vec<Op> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            match f[0] {
                "a" => Op::Alloc(f[1].parse().unwrap(), f[2].parse().unwrap()),
                "f" => Op::Free(f[1].parse().unwrap()),
                other => panic!("bad trace op {other}"),
            }
        })
        .collect()
}

/// What replaying a trace cost.
#[derive(Debug, Default, Clone, Copy)]
pub struct Replay {
    /// Peak bytes held from the upstream, peak bytes the trace asked for and held, and peak
    /// bytes handed out for them (with the rounding).
    pub peak_reserved: u64,
    pub peak_requested: u64,
    pub peak_handed: u64,
    /// Upstream allocations in all, and after the first quarter of the trace.
    pub driver_allocs: u64,
    pub driver_allocs_late: u64,
    /// Allocations after the first quarter.
    pub allocs_late: u64,
    pub ooms: u64,
    /// Fences the pool waited for.
    pub waits: u64,
}

/// The most invariant checks a replay of a debug build makes (see [`replay_in`]).
pub const CHECKS: usize = 2000;

/// Replays `ops` on a pool of `kind` under `rule`, on a GPU lagging by `lag` operations,
/// under a hard `limit`. An allocation the upstream refuses is retried once after a reclaim
/// (as the shim does), then counted as an OOM.
pub fn replay(kind: PoolKind, ops: &[Op], rule: ReuseRule, lag: u64, limit: Limit) -> Replay {
    replay_in(kind, false, Stitch::NearLimit, ops, rule, lag, limit)
}

/// [`replay`], with `expandable` segments (`split` only; an upstream mapping 2 MiB chunks)
/// stitching by `stitch`.
pub fn replay_in(
    kind: PoolKind,
    expandable: bool,
    stitch: Stitch,
    ops: &[Op],
    rule: ReuseRule,
    lag: u64,
    limit: Limit,
) -> Replay {
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    struct Counting(FakeUpstream, AtomicU64, AtomicU64);
    impl Upstream for Counting {
        fn virtual_memory(&self) -> Option<&dyn VirtualMemory> {
            Some(self)
        }

        fn alloc(&self, b: u64) -> Result<u64, u32> {
            let p = self.0.alloc(b)?;
            self.1.fetch_add(1, Relaxed);
            self.2.fetch_max(self.0.outstanding().1, Relaxed);
            Ok(p)
        }
        fn free(&self, p: u64, b: u64) -> Result<(), u32> {
            self.0.free(p, b)
        }
        fn headroom(&self) -> u64 {
            self.0.headroom()
        }
        fn limit(&self) -> Limit {
            self.0.limit()
        }
        fn synchronize(&self) -> bool {
            true
        }
    }

    impl VirtualMemory for Counting {
        fn vmm(&self) -> Option<Vmm> {
            self.0.vmm()
        }
        fn reserve(&self, b: u64, chunk: u64) -> Result<u64, u32> {
            self.0.reserve(b, chunk)
        }
        fn unreserve(&self, at: u64, b: u64) {
            self.0.unreserve(at, b)
        }
        fn map(&self, at: u64, b: u64, chunk: u64) -> Result<(), u32> {
            self.0.map(at, b, chunk)?;
            self.1.fetch_add(1, Relaxed);
            self.2.fetch_max(self.0.outstanding().1, Relaxed);
            Ok(())
        }
        fn unmap(&self, at: u64, b: u64, chunk: u64) -> Result<(), u32> {
            self.0.unmap(at, b, chunk)
        }
        fn stitch(&self, handles: &[(u64, u64)], to: u64) -> Result<usize, u32> {
            let n = self.0.stitch(handles, to)?;
            self.1.fetch_add(n as u64, Relaxed);
            Ok(n)
        }
        fn unmap_alias(&self, at: u64, b: u64) -> Result<(), u32> {
            self.0.unmap_alias(at, b)
        }
    }
    let device = match limit.bytes() {
        None => FakeUpstream::unlimited(1 << 42),
        Some(bytes) => FakeUpstream::new(bytes),
    };
    let up = Counting(device.with_vmm(2 << 20), 0.into(), 0.into());
    let clock = LagClock::new(rule, lag);
    let pool = new_pool(kind, expandable, stitch, clock.clone());
    let mut live: std::collections::HashMap<u64, Held> = Default::default();
    let mut r = Replay::default();
    let (mut requested, mut handed, quarter) = (0u64, 0u64, ops.len() / 4);
    let stride = ops.len().div_ceil(CHECKS).max(1);
    for (i, op) in ops.iter().enumerate() {
        clock.op();
        match *op {
            Op::Alloc(id, size) => {
                let before = up.1.load(Relaxed);
                let g = pool.alloc(size, &up).or_else(|_| {
                    pool.trim(&up, size);
                    pool.alloc(size, &up)
                });
                let Ok(g) = g else {
                    r.ooms += 1;
                    continue;
                };
                if i >= quarter {
                    r.allocs_late += 1;
                    r.driver_allocs_late += up.1.load(Relaxed) - before;
                }
                live.insert(id, g.held(size));
                requested += size;
                handed += g.size;
                r.peak_requested = r.peak_requested.max(requested);
                r.peak_handed = r.peak_handed.max(handed);
            }
            Op::Free(id) => {
                if let Some(b) = live.remove(&id) {
                    pool.free(b, &up).unwrap();
                    requested -= b.asked;
                    handed -= b.size;
                }
            }
        }
        // Debug builds check every invariant after each operation of a short trace, and
        // after [`CHECKS`] operations spread evenly over a long one (and the last): a check
        // walks every block, and the long traces of the replay gate would take an hour.
        if cfg!(debug_assertions) && (i % stride == 0 || i + 1 == ops.len()) {
            if let Err(e) = pool.check() {
                panic!("{kind:?} (expandable {expandable}) after operation {i}, {op:?}: {e}");
            }
        }
    }
    r.peak_reserved = up.2.load(Relaxed);
    r.driver_allocs = up.1.load(Relaxed);
    r.waits = clock.waited.load(Relaxed);
    r
}

impl Upstream for FakeUpstream {
    fn virtual_memory(&self) -> Option<&dyn VirtualMemory> {
        Some(self)
    }

    fn alloc(&self, bytes: u64) -> Result<DevPtr, CUresult> {
        let mut s = self.state.lock().unwrap();
        if s.2 + self.others() + bytes > self.capacity {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        let p = s.0;
        s.0 += bytes.div_ceil(256) * 256 + self.gap;
        s.1.insert(p, bytes);
        s.2 += bytes;
        Ok(p)
    }
    fn free(&self, ptr: DevPtr, bytes: u64) -> Result<(), CUresult> {
        let mut s = self.state.lock().unwrap();
        assert_eq!(s.1.remove(&ptr), Some(bytes), "upstream free of {ptr:#x}");
        s.2 -= bytes;
        Ok(())
    }
    fn headroom(&self) -> u64 {
        if self.limited {
            self.capacity
                .saturating_sub(self.outstanding().1 + self.others())
        } else {
            u64::MAX
        }
    }
    fn limit(&self) -> Limit {
        if self.limited {
            Limit::from_raw(self.capacity)
        } else {
            Limit::NONE
        }
    }
    fn synchronize(&self) -> bool {
        true
    }
    fn cache_idle(&self) -> CacheIdle {
        self.cache_idle
    }
}

impl VirtualMemory for FakeUpstream {
    fn vmm(&self) -> Option<Vmm> {
        (self.chunk > 0).then(|| Vmm {
            chunk: self.chunk,
            span: self.capacity.next_multiple_of(self.chunk),
        })
    }
    fn reserve(&self, bytes: u64, chunk: u64) -> Result<DevPtr, CUresult> {
        assert!(self.chunk > 0 && chunk == self.chunk && bytes.is_multiple_of(chunk));
        let mut s = self.state.lock().unwrap();
        let p = s.0.next_multiple_of(self.chunk);
        s.0 = p + bytes + self.gap.min(1) * self.chunk;
        self.vmm.lock().unwrap().reserved.insert(p, bytes);
        Ok(p)
    }
    fn unreserve(&self, at: DevPtr, bytes: u64) {
        let mut v = self.vmm.lock().unwrap();
        assert_eq!(v.reserved.remove(&at), Some(bytes), "unreserve of {at:#x}");
        assert!(
            !v.maps.range(at..at + bytes).any(|_| true),
            "unreserve of mapped memory"
        );
    }
    fn map(&self, at: DevPtr, bytes: u64, handle: u64) -> Result<(), CUresult> {
        assert!(
            handle > 0 && handle.is_multiple_of(self.chunk),
            "a handle of whole chunks"
        );
        assert!(at.is_multiple_of(self.chunk) && bytes.is_multiple_of(handle) && bytes > 0);
        let mut s = self.state.lock().unwrap();
        let mut v = self.vmm.lock().unwrap();
        assert!(
            v.vacant(at, bytes),
            "map of {at:#x} outside a reservation or over a mapping"
        );
        if s.2 + self.others() + bytes > self.capacity {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        for h in (at..at + bytes).step_by(handle as usize) {
            v.next += 1;
            let id = v.next;
            v.phys.insert(id, (handle, 1));
            v.maps.insert(h, (handle, id));
        }
        s.2 += bytes;
        Ok(())
    }
    fn unmap(&self, at: DevPtr, bytes: u64, handle: u64) -> Result<(), CUresult> {
        assert!(bytes.is_multiple_of(handle) && bytes > 0);
        let mut s = self.state.lock().unwrap();
        let mut v = self.vmm.lock().unwrap();
        for h in (at..at + bytes).step_by(handle as usize) {
            let (len, id) = v.maps.remove(&h).expect("unmap of a mapping");
            assert_eq!(len, handle, "unmap of a whole handle at {h:#x}");
            let p = v.phys.get_mut(&id).expect("its memory");
            p.1 -= 1;
            assert_eq!(
                p.1, 0,
                "unmap of {h:#x} while its memory is mapped elsewhere"
            );
            v.phys.remove(&id);
            s.2 -= handle;
        }
        Ok(())
    }
    fn stitch(&self, handles: &[(DevPtr, u64)], to: DevPtr) -> Result<usize, CUresult> {
        let mut v = self.vmm.lock().unwrap();
        let mut at = to;
        for &(from, bytes) in handles {
            let (len, id) = *v.maps.get(&from).expect("stitch of a mapping");
            assert_eq!(len, bytes, "stitch of a whole handle");
            assert!(v.vacant(at, bytes), "stitch to {at:#x}: not vacant");
            v.maps.insert(at, (len, id));
            v.phys.get_mut(&id).expect("its memory").1 += 1;
            at += bytes;
        }
        self.stitches
            .fetch_add(handles.len() as u64, std::sync::atomic::Ordering::Relaxed);
        Ok(handles.len())
    }
    fn unmap_alias(&self, at: DevPtr, bytes: u64) -> Result<(), CUresult> {
        let mut v = self.vmm.lock().unwrap();
        let (len, id) = v.maps.remove(&at).expect("unmap_alias of a mapping");
        assert_eq!(len, bytes, "unmap_alias of a whole handle");
        let p = v.phys.get_mut(&id).expect("its memory");
        p.1 -= 1;
        assert!(
            p.1 > 0,
            "unmap_alias of {at:#x}: its memory is mapped nowhere else"
        );
        Ok(())
    }
}

#[cfg(test)]
/// The contract: blocks never overlap, every byte comes back, reclaim empties the cache,
/// the upstream's refusal reaches the caller, and forget_all accounts for everything.
pub fn contract(make: fn() -> Box<dyn Pool>) {
    contract_on(make, FakeUpstream::new(64 << 20));
    contract_on(make, FakeUpstream::new(64 << 20).with_vmm(2 << 20));
}

#[cfg(test)]
fn contract_on(make: fn() -> Box<dyn Pool>, up: FakeUpstream) {
    let pool = make();
    let sizes = [1u64, 255, 256, 4096, 1 << 20, 3 << 20, 100, 8 << 20];
    let mut held: Vec<Held> = Vec::new();
    for &s in &sizes {
        let g = pool.alloc(s, &up).expect("fits");
        assert!(g.size >= s, "{g:?} is smaller than the request {s}");
        for h in &held {
            assert!(
                g.ptr + g.size <= h.ptr || h.ptr + h.size <= g.ptr,
                "overlap {g:?} with {h:?}"
            );
        }
        held.push(g.held(s));
    }
    for b in held.drain(..) {
        pool.free(b, &up).unwrap();
    }
    let cached = pool.cached_bytes();
    assert_eq!(pool.reclaim(&up), cached);
    assert_eq!(pool.cached_bytes(), 0);
    assert_eq!(
        up.outstanding(),
        (0, 0),
        "everything back upstream after reclaim"
    );

    // The upstream's refusal reaches the caller and leaves the pool usable.
    assert_eq!(pool.alloc(65 << 20, &up), Err(CUDA_ERROR_OUT_OF_MEMORY));
    let g = pool.alloc(8 << 20, &up).unwrap();
    let gone = pool.forget_all();
    assert!(gone.segments >= 1 && gone.bytes >= 8 << 20);
    assert_eq!(pool.cached_bytes(), 0);
    let _ = g;
}
