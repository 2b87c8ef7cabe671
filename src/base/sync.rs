//! Locks that outlive a panic, and the [`Lifetime`] of what another thread may end.
//!
//! Every hook runs inside a panic boundary, so a panic while a lock is held poisons it;
//! cudapool's state stays usable after such a panic (each structure keeps its invariants between
//! statements that can panic), and the program must not lose every later allocation to a
//! poisoned lock.

use std::sync::{Condvar, Mutex, MutexGuard};

/// Locks `m`, taking the guard from a poisoned lock as from a clean one.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A lock for data that one thread uses almost always alone (a thread's magazine, a shard of
/// the live table): taking it is one atomic exchange, giving it back a plain release store
/// (a `Mutex` pays a second atomic exchange there, to learn of sleepers). A thread that finds
/// it taken spins briefly, then yields. Held only for a few dozen instructions, never across
/// a call that may block; a panic under it gives it back (the guard's drop), as [`lock`]
/// does.
#[derive(Default)]
pub struct SpinLock<T> {
    taken: std::sync::atomic::AtomicBool,
    value: std::cell::UnsafeCell<T>,
}

// SAFETY: the value is reached only through a guard, and one guard exists at a time (the
// exchange in `lock`), as with a `Mutex`.
unsafe impl<T: Send> Sync for SpinLock<T> {}

/// The holder of a [`SpinLock`].
pub struct SpinGuard<'a, T>(&'a SpinLock<T>);

impl<T> SpinLock<T> {
    pub const fn new(value: T) -> Self {
        SpinLock {
            taken: std::sync::atomic::AtomicBool::new(false),
            value: std::cell::UnsafeCell::new(value),
        }
    }

    pub fn lock(&self) -> SpinGuard<'_, T> {
        use std::sync::atomic::Ordering::{Acquire, Relaxed};
        let mut spins = 0u32;
        while self.taken.swap(true, Acquire) {
            while self.taken.load(Relaxed) {
                spins += 1;
                if spins < 64 {
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
        }
        SpinGuard(self)
    }
}

impl<T> std::ops::Deref for SpinGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: this guard is the one holder (see `SpinLock`).
        unsafe { &*self.0.value.get() }
    }
}

impl<T> std::ops::DerefMut for SpinGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: this guard is the one holder (see `SpinLock`).
        unsafe { &mut *self.0.value.get() }
    }
}

impl<T> Drop for SpinGuard<'_, T> {
    fn drop(&mut self) {
        self.0
            .taken
            .store(false, std::sync::atomic::Ordering::Release);
    }
}

/// The life of something the program owns and another of its threads may end at any moment (a
/// context, with its streams and events). cudapool passes such a handle to the driver only
/// inside a *use*, and the program's call that ends it (or one of its streams) runs inside
/// [`Lifetime::exclusive`]: the two never overlap, and after the end every use sees it gone.
///
/// Uses prefer themselves: a use waits only while an exclusive section *runs*, never for one
/// that is waiting. So a thread may nest uses, and may ask for a use while it holds a lock that
/// another use's holder wants; the one rule is that an exclusive section takes no lock that is
/// held by a thread waiting to begin a use. (A writer-preferring lock deadlocks here: a thread
/// holding a pool's lock would wait for a use behind a waiting end, which waits for a use whose
/// holder wants the pool's lock.) The price is that an end may wait while uses keep overlapping;
/// uses are short (a few driver calls), so it gets its turn.
///
/// Invariant: `uses` counts the [`Use`]s alive; `exclusive` is set only while `uses == 0`; once
/// `ended` is set it stays set.
#[derive(Default)]
pub struct Lifetime {
    state: Mutex<LifeState>,
    changed: Condvar,
}

#[derive(Default)]
struct LifeState {
    uses: usize,
    exclusive: bool,
    ended: bool,
}

/// A use of a [`Lifetime`]: while it lives, the thing is alive and no exclusive section runs.
#[must_use]
pub struct Use<'a>(&'a Lifetime);

impl Drop for Use<'_> {
    fn drop(&mut self) {
        let mut s = lock(&self.0.state);
        s.uses -= 1;
        if s.uses == 0 {
            self.0.changed.notify_all();
        }
    }
}

impl Lifetime {
    fn wait<'a>(&self, s: MutexGuard<'a, LifeState>) -> MutexGuard<'a, LifeState> {
        self.changed.wait(s).unwrap_or_else(|e| e.into_inner())
    }

    /// A use, or `None` once it has ended. Waits only while an exclusive section runs.
    pub fn enter(&self) -> Option<Use<'_>> {
        let mut s = lock(&self.state);
        while s.exclusive {
            s = self.wait(s);
        }
        if s.ended {
            return None;
        }
        s.uses += 1;
        Some(Use(self))
    }

    /// Whether it has ended.
    pub fn ended(&self) -> bool {
        lock(&self.state).ended
    }

    /// Runs `f` once no use is under way, with new uses held back until it returns; `f` says
    /// (its second value) whether the thing ended. `None` (and `f` not run) if it had ended
    /// already. `f` must not ask for a use, nor take a lock a thread may hold while it asks for
    /// one.
    pub fn exclusive<T>(&self, f: impl FnOnce() -> (T, bool)) -> Option<T> {
        let mut s = lock(&self.state);
        while s.exclusive || s.uses > 0 {
            s = self.wait(s);
        }
        if s.ended {
            return None;
        }
        s.exclusive = true;
        drop(s);
        // Set back even if `f` panics: every later use would wait forever otherwise.
        struct Reopen<'a>(&'a Lifetime, bool);
        impl Drop for Reopen<'_> {
            fn drop(&mut self) {
                let mut s = lock(&self.0.state);
                s.exclusive = false;
                s.ended |= self.1;
                self.0.changed.notify_all();
            }
        }
        let mut reopen = Reopen(self, false);
        let (r, ended) = f();
        reopen.1 = ended;
        Some(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
    use std::sync::Arc;
    use std::time::Duration;

    /// Eight threads add to one counter under a spin lock, reading and writing it in two steps
    /// with a yield between (a lost update shows if two ever hold it at once).
    #[test]
    fn a_spin_lock_has_one_holder_at_a_time() {
        let l = Arc::new(SpinLock::new(0u64));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let l = l.clone();
                std::thread::spawn(move || {
                    for i in 0..2000 {
                        let mut g = l.lock();
                        let v = *g;
                        if i % 100 == 0 {
                            std::thread::yield_now();
                        }
                        *g = v + 1;
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(*l.lock(), 16000);
    }

    #[test]
    fn uses_nest_and_an_end_is_seen_by_every_later_use() {
        let life = Lifetime::default();
        {
            let _a = life.enter().unwrap();
            let _b = life.enter().expect("a thread may nest uses");
        }
        assert_eq!(life.exclusive(|| (7, false)), Some(7));
        assert!(life.enter().is_some(), "not ended");
        assert_eq!(life.exclusive(|| ((), true)), Some(()));
        assert!(life.ended() && life.enter().is_none());
        assert_eq!(life.exclusive(|| ((), false)), None, "already ended");
    }

    #[test]
    fn an_exclusive_section_never_overlaps_a_use() {
        let life = Arc::new(Lifetime::default());
        let inside = Arc::new(AtomicUsize::new(0));
        let overlap = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let users: Vec<_> = (0..4)
            .map(|_| {
                let (life, inside, overlap, stop) =
                    (life.clone(), inside.clone(), overlap.clone(), stop.clone());
                std::thread::spawn(move || {
                    while !stop.load(SeqCst) {
                        let _u = life.enter().unwrap();
                        inside.fetch_add(1, SeqCst);
                        if inside.load(SeqCst) > 1000 {
                            overlap.store(true, SeqCst);
                        }
                        std::hint::spin_loop();
                        inside.fetch_sub(1, SeqCst);
                    }
                })
            })
            .collect();
        for _ in 0..200 {
            life.exclusive(|| {
                // A use inside would show as a non-zero count of threads inside.
                inside.fetch_add(1000, SeqCst);
                let clean = inside.load(SeqCst) == 1000;
                std::thread::sleep(Duration::from_micros(20));
                inside.fetch_sub(1000, SeqCst);
                assert!(clean, "a use ran during the exclusive section");
                ((), false)
            });
        }
        stop.store(true, SeqCst);
        for u in users {
            u.join().unwrap();
        }
        assert!(
            !overlap.load(SeqCst),
            "a use began during the exclusive section"
        );
    }

    #[test]
    fn a_waiting_end_does_not_hold_back_a_new_use() {
        // Thread A holds a use; the end waits for it; thread B must still get a use (a
        // writer-preferring lock would block B, and deadlock if A waited for B).
        let life = Arc::new(Lifetime::default());
        let a = life.enter().unwrap();
        let ender = {
            let life = life.clone();
            std::thread::spawn(move || life.exclusive(|| ((), true)))
        };
        std::thread::sleep(Duration::from_millis(20));
        let b = {
            let life = life.clone();
            std::thread::spawn(move || life.enter().is_some())
        };
        assert!(b.join().unwrap(), "a new use while the end waits");
        drop(a);
        assert_eq!(ender.join().unwrap(), Some(()));
        assert!(life.enter().is_none());
    }
}
