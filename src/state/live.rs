//! The live table: every allocation the program holds through cudapool, pooled or counted,
//! and (under `CUDAPOOL_TRACK=2`) where each was made.
//!
//! Each thread has a *front*: slots for its newest few allocations, made of atomics, which
//! only it fills. A block freed soon after by the thread that made it (a cached pair, a
//! temporary) never reaches the shared table: the allocation is plain stores, the free one
//! compare-and-swap. (The shared table, a DashMap with a lock per shard, cost a cached pair
//! 23 of its 89 ns on the fake driver; a front under a lock measured no better.) Older
//! entries move to the shared table, an entry only ever that way and once. A slot's address
//! word is the protocol:
//! - `0`: empty. Only the owning thread fills an empty slot: the record first, then the
//!   address (release).
//! - `p`: the allocation at `p`. Whoever takes it (its owner, or another thread freeing or
//!   dropping it) reads the record, then swaps `p` for `0` with a compare-and-swap: one taker
//!   wins, and the record it read was the one published with `p` (a slot is refilled only
//!   once empty).
//! - `p | MOVING`: its owner is moving it to the shared table (a full front, or a thread that
//!   exited, moved by whoever finds it): in the shared table before the slot empties. A
//!   search that meets it waits for it to settle.
//!
//! A search for an address (a free from another thread, a look-up) tries the calling thread's
//! front, the shared table, every front, then the shared table again: an entry that moved
//! meanwhile is found the second time.

use crate::base::addr_hash::AddrBuild;
use crate::base::cu::*;
use crate::base::per_thread::LineId;
use crate::base::sync::lock;
use crate::limits::budget::Bytes;
use dashmap::DashMap;
use std::backtrace::Backtrace;
use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Mutex};

/// How an allocation reached the driver; decides how its free goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// A block of the context's pool.
    Pool,
    /// Passed through to the driver and counted; the program's free goes to the driver.
    Counted,
    /// From a driver memory pool (`cuMemAllocFromPoolAsync`, the pool's handle): its free goes
    /// to the driver, and the pool's reserved memory is what is charged (see `counted`).
    DriverPool(usize),
    /// A memory node of a graph under capture (`cuMemAllocAsync` on a capturing stream): its
    /// free goes to the driver; nothing is charged for it, as its memory is the graph's, counted
    /// when the graph is uploaded or launched (`graphs`).
    Graph,
}

/// One allocation the program holds. Keyed by its address in the [`LiveTable`].
#[derive(Clone, Copy, Debug)]
pub struct Live {
    /// `CUcontext` it was made in, as an address.
    pub ctx: usize,
    pub device: CUdevice,
    /// What the program asked for (pooled), or the driver's real footprint (counted).
    pub size: u64,
    /// What the program holds: the pool's block (its [`Grant`](crate::pool::Grant) size, at
    /// least `size`), or `size` itself (counted).
    pub handed: u64,
    pub origin: Origin,
    /// The budget line that holds its bytes (the allocating thread's), credited at its free.
    pub holder: LineId,
}

impl Live {
    /// Its bytes as the budget counts them.
    pub fn bytes(&self) -> Bytes {
        Bytes {
            asked: self.size,
            handed: self.handed,
        }
    }
}

/// Slots in a thread's front.
const FRONT: usize = 4;
/// The tag of an address being moved to the shared table (addresses are even where it
/// matters: a search for an odd one finds nothing either way).
const MOVING: u64 = 1;

/// One slot of a front (see the module doc): the address word, then the record.
#[derive(Default)]
struct Slot {
    ptr: AtomicU64,
    rec: [AtomicU64; 7],
}

impl Slot {
    fn write(&self, l: &Live) {
        let (kind, pool) = match l.origin {
            Origin::Pool => (0, 0),
            Origin::Counted => (1, 0),
            Origin::DriverPool(p) => (2, p as u64),
            Origin::Graph => (3, 0),
        };
        let w = [
            l.ctx as u64,
            l.device as u32 as u64,
            l.size,
            l.handed,
            kind,
            pool,
            l.holder.to_bits() as u64,
        ];
        for (a, v) in self.rec.iter().zip(w) {
            a.store(v, Relaxed);
        }
    }

    fn read(&self) -> Live {
        let w: [u64; 7] = std::array::from_fn(|i| self.rec[i].load(Relaxed));
        Live {
            ctx: w[0] as usize,
            device: w[1] as u32 as CUdevice,
            size: w[2],
            handed: w[3],
            origin: match w[4] {
                0 => Origin::Pool,
                1 => Origin::Counted,
                3 => Origin::Graph,
                _ => Origin::DriverPool(w[5] as usize),
            },
            holder: LineId::from_bits(w[6] as u32),
        }
    }

    /// Takes the allocation at `ptr` out of this slot if it is here: `Some(Some)` taken,
    /// `Some(None)` being moved (look again in the shared table once it settled), `None`
    /// not here.
    fn take(&self, ptr: DevPtr) -> Option<Option<Live>> {
        loop {
            let p = self.ptr.load(Acquire);
            if p == ptr | MOVING && ptr != 0 {
                // In the shared table once the slot changes.
                while self.ptr.load(Acquire) == p {
                    std::hint::spin_loop();
                }
                return Some(None);
            }
            if p != ptr || p == 0 {
                return None;
            }
            let l = self.read();
            if self.ptr.compare_exchange(p, 0, AcqRel, Acquire).is_ok() {
                return Some(Some(l));
            }
            // Taken or moved meanwhile: look at the slot again.
        }
    }

    /// The record at `ptr` if this slot holds it now (a consistent read); `None` also once
    /// a move of it has settled (it is in the shared table then).
    fn peek(&self, ptr: DevPtr) -> Option<Live> {
        loop {
            let p = self.ptr.load(Acquire);
            if p == ptr | MOVING && ptr != 0 {
                std::hint::spin_loop();
                continue;
            }
            if p != ptr || p == 0 {
                return None;
            }
            let l = self.read();
            if self.ptr.load(Acquire) == p {
                return Some(l);
            }
        }
    }

    /// Moves what this slot holds to `live` (its owner, or anyone once the owner exited).
    fn evict(&self, live: &DashMap<DevPtr, Live, AddrBuild>) {
        let p = self.ptr.load(Acquire);
        if p == 0 || p & MOVING != 0 {
            return;
        }
        let l = self.read();
        if self
            .ptr
            .compare_exchange(p, p | MOVING, AcqRel, Acquire)
            .is_ok()
        {
            live.insert(p, l);
            self.ptr.store(0, Release);
        }
    }
}

/// A thread's slots in one table. `next` (the slot to fill next) is its owner's alone: a
/// plain load and store.
#[derive(Default)]
struct Front {
    slots: [Slot; FRONT],
    next: AtomicUsize,
}

/// This thread's front in each table it used, by table id.
///
/// Invariant: [`LAST`] names one of them or nothing; dropping this (the thread's exit) clears
/// it first.
struct Fronts(Vec<(u64, Arc<Front>)>);

impl Drop for Fronts {
    fn drop(&mut self) {
        LAST.with(|l| l.set((0, std::ptr::null())));
    }
}

thread_local! {
    static FRONTS: RefCell<Fronts> = const { RefCell::new(Fronts(Vec::new())) };
    /// The front this thread used last and its table's id: found without the borrow and the
    /// search of [`FRONTS`], which holds it (see [`Fronts`]).
    static LAST: Cell<(u64, *const Front)> = const { Cell::new((0, std::ptr::null())) };
}

/// Invariant: the allocations handed to the program and not yet freed are exactly those in
/// `live` and in the fronts' slots (one place each, a moving one possibly both for a moment),
/// with the size the program asked for (pooled) or the driver's real footprint (counted);
/// `fronts` lists every front of this table (a front whose thread exited is emptied into
/// `live` and dropped from the list by the next search). `backtraces` holds an entry for some
/// of them (`track >= 2`, when no front is used), never for anything else.
pub struct LiveTable {
    id: u64,
    live: DashMap<DevPtr, Live, AddrBuild>,
    fronts: Mutex<Vec<Arc<Front>>>,
    backtraces: DashMap<DevPtr, Arc<Backtrace>, AddrBuild>,
    /// `CUDAPOOL_TRACK`.
    track: u8,
}

/// Shards of the live table (a lock each, on its own cache line: 64 KiB in all). With DashMap's
/// default of 4 per core, 16 threads each reusing its own block landed two on one shard about
/// nine times in ten; with 512, about one time in five.
const LIVE_SHARDS: usize = 512;

impl LiveTable {
    pub fn new(track: u8) -> Self {
        static IDS: AtomicU64 = AtomicU64::new(1);
        LiveTable {
            id: IDS.fetch_add(1, Relaxed),
            live: DashMap::with_hasher_and_shard_amount(AddrBuild::default(), LIVE_SHARDS),
            fronts: Mutex::new(Vec::new()),
            backtraces: DashMap::with_hasher(AddrBuild::default()),
            track,
        }
    }

    /// Runs `f` on the calling thread's front in this table, made and registered on first
    /// use; `None` while the thread is being torn down, or when backtraces are kept (every
    /// entry then goes to the shared table, beside its backtrace).
    fn with_front<T>(&self, f: impl FnOnce(&Front) -> T) -> Option<T> {
        if self.track >= 2 {
            return None;
        }
        let (id, last) = LAST.with(Cell::get);
        let front = if id == self.id && !last.is_null() {
            last
        } else {
            self.find_front()?
        };
        // SAFETY: `front` is what `LAST` names (set above when it was not already), a front
        // that this thread's `FRONTS` holds (an `Arc`) until it is dropped, which clears `LAST`
        // first (the `Fronts` invariant); `f` does not reach `FRONTS`. `f` is called in one
        // place only, so the hot path keeps it inlined.
        Some(f(unsafe { &*front }))
    }

    /// The slow way to the calling thread's front: a search of `FRONTS`, which makes and
    /// registers it on first use; `LAST` names it afterwards. `None` while the thread is being
    /// torn down.
    #[cold]
    #[inline(never)]
    fn find_front(&self) -> Option<*const Front> {
        FRONTS
            .try_with(|fronts| {
                let found = fronts
                    .borrow()
                    .0
                    .iter()
                    .find(|e| e.0 == self.id)
                    .map(|e| e.1.clone());
                let fr = found.unwrap_or_else(|| {
                    let fr = Arc::new(Front::default());
                    lock(&self.fronts).push(fr.clone());
                    fronts.borrow_mut().0.push((self.id, fr.clone()));
                    fr
                });
                let at = Arc::as_ptr(&fr);
                LAST.with(|l| l.set((self.id, at)));
                at
            })
            .ok()
    }

    /// Enters a new live allocation (and its backtrace under `CUDAPOOL_TRACK=2`: 5-9 µs).
    pub fn insert(&self, ptr: DevPtr, live: Live) {
        let put = self.with_front(|fr| {
            // The next slot round the ring, emptied first (its entry moves to the shared
            // table) unless another thread freed it already.
            let i = fr.next.load(Relaxed);
            fr.next.store((i + 1) % FRONT, Relaxed);
            let slot = &fr.slots[i];
            slot.evict(&self.live);
            if slot.ptr.load(Acquire) != 0 {
                return false; // still moving under another thread: not ours to fill now
            }
            slot.write(&live);
            slot.ptr.store(ptr, Release);
            true
        });
        if put == Some(true) {
            return;
        }
        self.live.insert(ptr, live);
        if self.track >= 2 {
            self.backtraces
                .insert(ptr, Arc::new(Backtrace::force_capture()));
        }
    }

    /// Finds `ptr` (see the module doc); with `take`, takes it out.
    fn find(&self, ptr: DevPtr, take: bool) -> Option<Live> {
        let in_front = |fr: &Front| {
            fr.slots.iter().find_map(|s| {
                if take {
                    s.take(ptr).flatten()
                } else {
                    s.peek(ptr)
                }
            })
        };
        if let Some(Some(l)) = self.with_front(in_front) {
            return Some(l);
        }
        let shared = || {
            if take {
                self.live.remove(&ptr).map(|(_, l)| l)
            } else {
                self.live.get(&ptr).map(|l| *l)
            }
        };
        if let Some(l) = shared() {
            return Some(l);
        }
        let fronts = self.fronts();
        if let Some(l) = fronts.iter().find_map(|fr| in_front(fr)) {
            return Some(l);
        }
        shared()
    }

    /// Every front; those of threads that exited are emptied into the shared table and
    /// dropped from the list.
    fn fronts(&self) -> Vec<Arc<Front>> {
        let mut fronts = lock(&self.fronts);
        fronts.retain(|fr| {
            if Arc::strong_count(fr) > 1 {
                return true;
            }
            for s in &fr.slots {
                s.evict(&self.live);
            }
            false
        });
        fronts.clone()
    }

    /// Moves every front's entries to the shared table (before a walk over all of them).
    fn flush_fronts(&self) {
        for fr in self.fronts() {
            for s in &fr.slots {
                s.evict(&self.live);
            }
        }
    }

    /// The live allocation at exactly `ptr`, if any.
    pub fn get(&self, ptr: DevPtr) -> Option<Live> {
        self.find(ptr, false)
    }

    /// Where the live allocation at `ptr` was made (under `CUDAPOOL_TRACK=2`).
    pub fn backtrace(&self, ptr: DevPtr) -> Option<Arc<Backtrace>> {
        self.backtraces.get(&ptr).map(|b| b.clone())
    }

    /// Takes `ptr` out of the table (its free is under way); its backtrace stays until
    /// [`freed`](Self::freed) or [`undo_remove`](Self::undo_remove).
    pub fn remove(&self, ptr: DevPtr) -> Option<Live> {
        self.find(ptr, true)
    }

    /// The free of a removed allocation succeeded.
    pub fn freed(&self, ptr: DevPtr) {
        if self.track >= 2 {
            self.backtraces.remove(&ptr);
        }
    }

    /// The free of a removed allocation failed: the program still holds it.
    pub fn undo_remove(&self, ptr: DevPtr, live: Live) {
        // The shared table: its backtrace, if any, stayed.
        self.live.insert(ptr, live);
    }

    /// Drops every allocation of context `ctx`, calling `dropped` for each.
    pub fn drop_context(&self, ctx: usize, mut dropped: impl FnMut(&Live)) {
        self.flush_fronts();
        self.live.retain(|k, l| {
            if l.ctx != ctx {
                return true;
            }
            dropped(l);
            self.backtraces.remove(k);
            false
        });
    }

    /// Bytes of live allocations from the driver pool `pool`.
    pub fn bytes_of_driver_pool(&self, pool: usize) -> u64 {
        self.flush_fronts();
        self.live
            .iter()
            .filter(|e| e.origin == Origin::DriverPool(pool))
            .map(|e| e.size)
            .sum()
    }

    /// Every live allocation (address, what is known of it, its backtrace when tracked), by
    /// address.
    pub fn all(&self) -> Vec<(DevPtr, Live, Option<Arc<Backtrace>>)> {
        self.flush_fronts();
        let mut v: Vec<_> = self
            .live
            .iter()
            .map(|e| {
                let bt = self.backtraces.get(e.key()).map(|b| b.clone());
                (*e.key(), *e.value(), bt)
            })
            .collect();
        v.sort_by_key(|e| e.0);
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::sync::mpsc;

    fn rec(ptr: DevPtr, holder: u32) -> Live {
        Live {
            ctx: 0x1000 + (ptr as usize & 0xff0),
            device: (ptr % 3) as CUdevice,
            size: ptr % 100_000,
            handed: ptr % 100_000 + 512,
            origin: match ptr % 3 {
                0 => Origin::Pool,
                1 => Origin::Counted,
                _ => Origin::DriverPool(0x7000 + ptr as usize % 64 * 8),
            },
            holder: LineId::from_bits(holder),
        }
    }

    /// Eight threads enter allocations; each frees most of its own soon (the fronts), and hands
    /// the rest to the next thread, which frees them (a search of other fronts, or the shared
    /// table after a move); a ninth thread walks the table and looks addresses up meanwhile
    /// (moving fronts to the shared table under the owners' feet). Every allocation is taken
    /// exactly once, with the record it was entered with; the walker never sees a wrong record;
    /// at the end the table is empty. Threads exit with entries in their fronts.
    #[test]
    fn entries_are_found_and_taken_once_whichever_thread_frees_them() {
        const T: u64 = 8;
        const N: u64 = 20_000;
        let table = Arc::new(LiveTable::new(1));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (txs, rxs): (Vec<_>, Vec<_>) = (0..T).map(|_| mpsc::channel::<DevPtr>()).unzip();
        let walker = {
            let (table, stop) = (table.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut walks = 0;
                while !stop.load(SeqCst) {
                    for (p, l, _) in table.all() {
                        assert_eq!(l.size, rec(p, l.holder.to_bits()).size, "{p:#x}");
                    }
                    for p in (0..64).map(|i| (i + 1) * 4096) {
                        if let Some(l) = table.get(p) {
                            assert_eq!(l.handed, rec(p, 0).handed);
                        }
                    }
                    walks += 1;
                }
                walks
            })
        };
        let workers: Vec<_> = rxs
            .into_iter()
            .enumerate()
            .map(|(t, rx)| {
                let table = table.clone();
                let tx = txs[(t + 1) % T as usize].clone();
                std::thread::spawn(move || {
                    let t = t as u64;
                    let mut taken = Vec::new();
                    let mut mine = Vec::new();
                    for i in 0..N {
                        let p = (t * N + i + 1) * 4096;
                        table.insert(p, rec(p, t as u32));
                        mine.push(p);
                        if i % 3 == 0 {
                            tx.send(p).unwrap(); // another thread frees it
                            mine.pop();
                        } else if mine.len() > (i % 7) as usize {
                            let q = mine.remove(0);
                            taken.push((q, table.remove(q)));
                        }
                        while let Ok(q) = rx.try_recv() {
                            taken.push((q, table.remove(q)));
                        }
                    }
                    drop(tx);
                    (taken, mine, rx)
                })
            })
            .collect();
        drop(txs);
        let mut seen = HashSet::new();
        let mut left = Vec::new();
        let mut rxs = Vec::new();
        for w in workers {
            let (taken, mine, rx) = w.join().unwrap();
            for (q, l) in taken {
                let l = l.unwrap_or_else(|| panic!("{q:#x} not found"));
                assert_eq!((l.size, l.ctx), (rec(q, 0).size, rec(q, 0).ctx), "{q:#x}");
                assert_eq!(l.origin, rec(q, 0).origin);
                assert!(seen.insert(q), "{q:#x} taken twice");
            }
            left.extend(mine);
            rxs.push(rx);
        }
        // What the exited threads left in their fronts, and what was still on its way.
        for rx in rxs {
            left.extend(rx.try_iter());
        }
        for q in left {
            assert!(table.remove(q).is_some(), "{q:#x} lost");
            assert!(seen.insert(q));
        }
        stop.store(true, SeqCst);
        assert!(walker.join().unwrap() > 0);
        assert_eq!(seen.len() as u64, T * N, "every allocation taken once");
        assert!(table.all().is_empty());
        assert!(table.remove(4096).is_none(), "a second free finds nothing");
    }
}
