//! Counters that many threads bump at once: one cache line per stripe, a stripe per thread
//! (by a per-thread number), summed when read. Bumping never touches a line another thread is
//! writing, so the counters cost the hot path no cache-line traffic.
//!
//! Uses: nothing of the crate.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

const STRIPES: usize = 32;

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

/// The four counters of one stripe, alone on their cache line.
#[repr(align(64))]
#[derive(Default)]
struct Line([AtomicU64; FIELDS]);

/// How many counters a [`Striped`] holds.
pub const FIELDS: usize = 4;

/// [`FIELDS`] counters split into stripes (on the heap: a few KiB). Values wrap: a stripe may
/// go "negative" (a block allocated on one thread and freed on another); the sum is exact.
pub struct Striped(Box<[Line; STRIPES]>);

impl Default for Striped {
    fn default() -> Self {
        Striped(Box::new(std::array::from_fn(|_| Line::default())))
    }
}

impl std::fmt::Debug for Striped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let all: Vec<u64> = (0..FIELDS).map(|i| self.get(i)).collect();
        write!(f, "{all:?}")
    }
}

impl Striped {
    fn line(&self) -> &Line {
        &self.0[thread_number() as usize % STRIPES]
    }

    pub fn add(&self, field: usize, n: u64) {
        self.line().0[field].fetch_add(n, Relaxed);
    }

    /// Adds `n[i]` to field `i` for each non-zero `n[i]`, finding the thread's stripe once.
    pub fn add_all(&self, n: [u64; FIELDS]) {
        let line = self.line();
        for (field, n) in line.0.iter().zip(n) {
            if n != 0 {
                field.fetch_add(n, Relaxed);
            }
        }
    }

    pub fn sub(&self, field: usize, n: u64) {
        self.line().0[field].fetch_sub(n, Relaxed);
    }

    pub fn get(&self, field: usize) -> u64 {
        self.0
            .iter()
            .fold(0u64, |acc, l| acc.wrapping_add(l.0[field].load(Relaxed)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn sums_across_threads_exactly() {
        let c = Arc::new(Striped::default());
        let handles: Vec<_> = (0..8)
            .map(|i| {
                let c = c.clone();
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        c.add(1, 3);
                    }
                    // Some threads take away what others added: stripes go below zero.
                    if i % 2 == 0 {
                        c.sub(1, 2500);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(c.get(1), 8 * 3000 - 4 * 2500);
        assert_eq!(c.get(0), 0);
    }
}
