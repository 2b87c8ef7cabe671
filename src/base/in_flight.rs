//! Calls in flight: each caller counts itself in on entry and out on exit, in one of 64 stripes
//! of counters (by thread, each on its own cache line), so that entering costs an increment no
//! other thread's increment contends with; a waiter asks whether every stripe is even.
//!
//! The pattern is Dekker's: a caller enters (SeqCst) and then reads a flag; a waiter sets the
//! flag (SeqCst) and then waits for [`InFlight::quiescent`]. Either the caller sees the flag, or
//! the waiter sees the caller in flight and waits for it to leave.

use std::sync::atomic::{AtomicU64, Ordering::SeqCst};

#[repr(align(128))]
struct Stripe {
    entered: AtomicU64,
    left: AtomicU64,
}

const STRIPES: usize = 64;

/// One kind of call in flight (a `static`: guards borrow it for `'static`).
pub struct InFlight([Stripe; STRIPES]);

/// A call in flight until dropped.
pub struct Entered(&'static Stripe);

impl InFlight {
    pub const fn new() -> InFlight {
        InFlight(
            [const {
                Stripe {
                    entered: AtomicU64::new(0),
                    left: AtomicU64::new(0),
                }
            }; STRIPES],
        )
    }

    /// Counts the calling thread's call in; it counts out when the guard drops.
    pub fn enter(&'static self) -> Entered {
        let s = &self.0[crate::base::per_thread::thread_number() as usize % STRIPES];
        s.entered.fetch_add(1, SeqCst);
        Entered(s)
    }

    /// How many calls entered so far (a figure that moves while calls are made).
    pub fn entered(&self) -> u64 {
        self.0
            .iter()
            .map(|s| s.entered.load(std::sync::atomic::Ordering::Relaxed))
            .fold(0, u64::wrapping_add)
    }

    /// Whether no call is in flight right now: every call that entered before this was asked
    /// has left.
    pub fn quiescent(&self) -> bool {
        self.0
            .iter()
            .all(|s| s.entered.load(SeqCst) == s.left.load(SeqCst))
    }
}

impl Default for InFlight {
    fn default() -> Self {
        InFlight::new()
    }
}

impl Drop for Entered {
    fn drop(&mut self) {
        self.0.left.fetch_add(1, SeqCst);
    }
}
