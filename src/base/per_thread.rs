//! Values each thread owns and writes alone, summed when read: the hot path's counters cost no
//! shared cache line and no locked instruction (a plain load and store on a line only the
//! calling thread writes). Plus a number for the calling thread.
//!
//! A [`PerThread`] gives each thread a [`Line`] of its own the first time the thread uses it.
//! A line outlives its thread: when the thread exits, its line is released and the next new
//! thread adopts it, values and all (sums stay exact; no value is lost with a thread).

use crate::base::sync::lock;
use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Mutex, OnceLock};

/// A number for the calling thread, unique in the process (cheaper than `thread::current()`);
/// 0 while the thread is being torn down.
pub fn thread_number() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local!(static MINE: Cell<u64> = const { Cell::new(0) });
    MINE.try_with(|m| {
        if m.get() == 0 {
            m.set(NEXT.fetch_add(1, Relaxed));
        }
        m.get()
    })
    .unwrap_or(0)
}

/// How many values a [`Line`] holds.
pub const FIELDS: usize = 6;

/// Lines come in chunks of this many, made on demand.
const CHUNK: usize = 64;
/// At most this many lines (threads alive at once); more threads share one line.
const MAX_LINES: usize = CHUNK * 64;

/// One thread's values, alone on their cache lines.
///
/// Invariant: while `owned` is set, only the owning thread writes `values` (by [`Line::add`]
/// in [`Mode::Owner`]) and `private`; anyone may read them. While it is clear, `private` is
/// written only under the [`PerThread`]'s adopting lock ([`PerThread::unowned`]), so by no
/// two threads at once. [`Line::credit`] is the exception: any thread may add to it or take
/// it, so every write to it is an atomic read-modify-write.
#[repr(align(128))]
#[derive(Default)]
pub struct Line {
    /// Shared with the owning thread's thread-local, which clears it when the thread exits
    /// (whether or not this `Line` still exists then).
    owned: Arc<AtomicBool>,
    values: [AtomicU64; FIELDS],
    /// Values others may take from or add to (the budget's credit under each peak).
    pub credit: [AtomicU64; 2],
    /// The owner's own part of that credit: a load and a store, no read-modify-write.
    pub private: [AtomicU64; 2],
}

/// Whether the caller owns the line it got ([`PerThread::with`]), or shares it (a thread being
/// torn down, or beyond [`MAX_LINES`] threads).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Mode {
    Owner,
    Shared,
}

/// Which line of a [`PerThread`] (to find it again from another thread: [`PerThread::line`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct LineId(u32);

impl LineId {
    /// The line shared by threads without one of their own.
    pub const SHARED: LineId = LineId(u32::MAX);

    /// As a number (to be kept in an atomic), and back.
    pub fn to_bits(self) -> u32 {
        self.0
    }
    pub fn from_bits(bits: u32) -> LineId {
        LineId(bits)
    }
}

impl Line {
    /// Adds `n` (wrapping) to value `field`.
    #[inline]
    pub fn add(&self, field: usize, n: u64, mode: Mode) {
        let v = &self.values[field];
        match mode {
            // The owner is the only writer: a load and a store are exact, and cost no lock.
            Mode::Owner => v.store(v.load(Relaxed).wrapping_add(n), Relaxed),
            Mode::Shared => {
                v.fetch_add(n, Relaxed);
            }
        }
    }

    /// Subtracts `n` (wrapping) from value `field`.
    #[inline]
    pub fn sub(&self, field: usize, n: u64, mode: Mode) {
        self.add(field, n.wrapping_neg(), mode)
    }

    pub fn get(&self, field: usize) -> u64 {
        self.values[field].load(Relaxed)
    }
}

/// One [`Line`] per thread that used it. Values wrap: a line may go "negative" (a block
/// allocated on one thread and freed on another); the sum is exact.
///
/// Invariant: lines `0..made` of `chunks` exist and are never removed (a [`LineId`] stays
/// valid as long as the `PerThread`); `shared` is the line of threads without one, written only
/// atomically.
pub struct PerThread {
    id: u64,
    chunks: Box<[OnceLock<Box<[Line; CHUNK]>>]>,
    made: AtomicUsize,
    /// Held while a line is adopted or made.
    adopting: Mutex<()>,
    shared: Line,
}

/// The calling thread's lines, by the id of their [`PerThread`], with their ownership flags;
/// released when the thread exits.
///
/// Invariant: [`LAST`] names one of them or nothing; dropping this clears it before any line
/// is released.
#[derive(Default)]
struct Mine(Vec<(u64, LineId, Arc<AtomicBool>)>);

impl Drop for Mine {
    fn drop(&mut self) {
        LAST.with(|l| l.set((0, LineId::SHARED, std::ptr::null())));
        for (_, _, owned) in &self.0 {
            // Release: the next owner sees every value this thread stored.
            owned.store(false, Release);
        }
    }
}

thread_local! {
    static MINE: RefCell<Mine> = const { RefCell::new(Mine(Vec::new())) };
    /// The line this thread used last, its id and its [`PerThread`]'s id: owned by this thread
    /// while set (see [`Mine`]), found without the borrow and the search of [`MINE`]. (A line
    /// never moves while its `PerThread` lives, and an id names one `PerThread` only: a
    /// `PerThread` dropped since cannot match.)
    static LAST: Cell<(u64, LineId, *const Line)> = const { Cell::new((0, LineId::SHARED, std::ptr::null())) };
}

impl Default for PerThread {
    fn default() -> Self {
        static IDS: AtomicU64 = AtomicU64::new(1);
        PerThread {
            id: IDS.fetch_add(1, Relaxed),
            chunks: (0..MAX_LINES / CHUNK).map(|_| OnceLock::new()).collect(),
            made: AtomicUsize::new(0),
            adopting: Mutex::new(()),
            shared: Line::default(),
        }
    }
}

impl std::fmt::Debug for PerThread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let all: Vec<u64> = (0..FIELDS).map(|i| self.sum(i)).collect();
        write!(f, "{all:?}")
    }
}

impl PerThread {
    /// Line `id` (any thread's).
    #[inline]
    pub fn line(&self, id: LineId) -> &Line {
        let i = id.0 as usize;
        match self.chunks.get(i / CHUNK).and_then(|c| c.get()) {
            Some(chunk) => &chunk[i % CHUNK],
            None => &self.shared,
        }
    }

    /// Runs `f` on the calling thread's line (adopted or made on first use), or on the shared
    /// line while the thread is being torn down.
    #[inline]
    pub fn with<R>(&self, f: impl FnOnce(&Line, LineId, Mode) -> R) -> R {
        let (pt, id, line) = LAST.with(Cell::get);
        if pt == self.id {
            // SAFETY: set below from `self.line(id)` of this `PerThread` (ids are never
            // reused), whose lines stay in place as long as it lives.
            return f(unsafe { &*line }, id, Mode::Owner);
        }
        let id = MINE
            .try_with(|mine| {
                if let Some((_, id, _)) = mine.borrow().0.iter().find(|e| e.0 == self.id) {
                    return Some(*id);
                }
                let (id, owned) = self.adopt()?;
                mine.borrow_mut().0.push((self.id, id, owned));
                Some(id)
            })
            .ok()
            .flatten();
        if let Some(id) = id {
            LAST.with(|l| l.set((self.id, id, self.line(id))));
        }
        match id {
            Some(id) => f(self.line(id), id, Mode::Owner),
            None => f(&self.shared, LineId::SHARED, Mode::Shared),
        }
    }

    /// A released line (its values kept), or a new one; owned by the caller from now on.
    /// `None` when [`MAX_LINES`] threads own one each.
    #[cold]
    fn adopt(&self) -> Option<(LineId, Arc<AtomicBool>)> {
        let _g = lock(&self.adopting);
        let made = self.made.load(Relaxed);
        for i in 0..made {
            let owned = &self.line(LineId(i as u32)).owned;
            // Acquire: this thread sees every value the line's last owner stored.
            if owned
                .compare_exchange(false, true, Acquire, Relaxed)
                .is_ok()
            {
                return Some((LineId(i as u32), owned.clone()));
            }
        }
        if made == MAX_LINES {
            return None;
        }
        let chunk = self.chunks[made / CHUNK]
            .get_or_init(|| Box::new(std::array::from_fn(|_| Line::default())));
        let owned = &chunk[made % CHUNK].owned;
        owned.store(true, Relaxed);
        self.made.store(made + 1, Release);
        Some((LineId(made as u32), owned.clone()))
    }

    /// Runs `f` on every line no thread owns, while none can be adopted (their `private`
    /// values are then no thread's to write but `f`'s).
    pub fn unowned(&self, mut f: impl FnMut(&Line)) {
        let _g = lock(&self.adopting);
        let made = self.made.load(Acquire);
        for i in 0..made {
            let l = self.line(LineId(i as u32));
            // Acquire: `f` sees every value the line's last owner stored.
            if !l.owned.load(Acquire) {
                f(l);
            }
        }
    }

    /// Every line made so far, the shared one first.
    pub fn lines(&self) -> impl Iterator<Item = (LineId, &Line)> {
        let made = self.made.load(Acquire);
        std::iter::once((LineId::SHARED, &self.shared))
            .chain((0..made).map(|i| (LineId(i as u32), self.line(LineId(i as u32)))))
    }

    /// The sum of value `field` over every line (wrapping).
    pub fn sum(&self, field: usize) -> u64 {
        self.lines()
            .fold(0u64, |acc, (_, l)| acc.wrapping_add(l.get(field)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn sums_across_threads_exactly() {
        let c = Arc::new(PerThread::default());
        let handles: Vec<_> = (0..8)
            .map(|i| {
                let c = c.clone();
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        c.with(|l, _, m| l.add(1, 3, m));
                    }
                    // Some threads take away what others added: lines go below zero.
                    if i % 2 == 0 {
                        c.with(|l, _, m| l.sub(1, 2500, m));
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(c.sum(1), 8 * 3000 - 4 * 2500);
        assert_eq!(c.sum(0), 0);
    }

    #[test]
    fn a_line_outlives_its_thread_and_is_adopted_with_its_values() {
        let c = Arc::new(PerThread::default());
        for _ in 0..50 {
            let c2 = c.clone();
            std::thread::spawn(move || c2.with(|l, _, m| l.add(0, 1, m)))
                .join()
                .unwrap();
        }
        assert_eq!(c.sum(0), 50);
        // One after the other, every thread adopted the line the last one released.
        assert_eq!(c.made.load(Relaxed), 1);
        // Threads alive at once own a line each.
        let barrier = Arc::new(std::sync::Barrier::new(4));
        let hs: Vec<_> = (0..4)
            .map(|_| {
                let (c, b) = (c.clone(), barrier.clone());
                std::thread::spawn(move || {
                    c.with(|l, _, m| l.add(0, 2, m));
                    b.wait();
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert_eq!(c.made.load(Relaxed), 4);
        assert_eq!(c.sum(0), 58);
    }

    /// A thread still counting after its line was released (from a thread-local destructor
    /// that runs after the one that releases it) no longer writes that line as its owner:
    /// another thread may own it by then.
    #[test]
    fn a_thread_past_its_lines_release_counts_on_the_shared_line() {
        struct CountsAtExit(Arc<PerThread>, std::sync::mpsc::Sender<(LineId, Mode)>);
        impl Drop for CountsAtExit {
            fn drop(&mut self) {
                let seen = self.0.with(|l, id, m| {
                    l.add(0, 1, m);
                    (id, m)
                });
                let _ = self.1.send(seen);
            }
        }
        thread_local!(static AT_EXIT: RefCell<Option<CountsAtExit>> = const { RefCell::new(None) });
        let c = Arc::new(PerThread::default());
        let (tx, rx) = std::sync::mpsc::channel();
        let c2 = c.clone();
        std::thread::spawn(move || {
            // Registered before the thread's lines: destroyed after them.
            AT_EXIT.with(|e| *e.borrow_mut() = Some(CountsAtExit(c2.clone(), tx)));
            c2.with(|l, _, m| l.add(0, 1, m));
        })
        .join()
        .unwrap();
        assert_eq!(rx.recv().unwrap(), (LineId::SHARED, Mode::Shared));
        assert_eq!(c.sum(0), 2);
    }

    #[test]
    fn owners_never_lose_an_update_among_many_threads() {
        // More threads than any fixed number of stripes: two threads never share a line.
        let c = Arc::new(PerThread::default());
        let hs: Vec<_> = (0..48)
            .map(|_| {
                let c = c.clone();
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        c.with(|l, _, m| l.add(2, 1, m));
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert_eq!(c.sum(2), 48 * 20_000);
    }
}
