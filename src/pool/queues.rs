//! Which queues of a context receive device work, and when a context is *one queue*.
//!
//! A queue is where device work runs in issue order: the legacy default stream, one thread's
//! per-thread default stream, or one stream the program created. The work hooks (launches,
//! copies, memsets, graph launches, stream memory operations, event records and waits) report
//! every queue they see work on. While all of a context's work so far went to one queue, a
//! freed block may be reused at once by anyone (see `pool::reuse`). Real programs create
//! streams they barely use (PyTorch one that never gets work, cuDNN a few that get one memset
//! at start-up), so what counts is work, not streams:
//!
//! - **Activation.** The first work on a queue is ordered after all work issued so far on the
//!   other active queues (and on destroyed streams): [`QueueDevice::order_after`] records an
//!   event on each and makes the new queue wait for them, before the work is passed on. So a
//!   block reused under one queue can be used on a new queue safely.
//! - **Retirement.** A queue that went idle (its work completed) and got no work through a
//!   whole probation period ([`PROBATION`]) is retired; its next work activates it again, with
//!   the wait. Queues that get work every few hundred milliseconds never retire.
//!
//! The hot path of every work hook is lock-free: a thread remembers the queues it used last
//! (with the [`epoch`] it saw) and skips the report while they match. Retirement bumps the
//! epoch when a probation starts, so every thread reports its next work again (which marks the
//! queue *touched*). A thread that read the old epoch and has not yet passed its work on could
//! still hand the driver work on a queue being retired; [`Entered`] counts every work call in
//! flight, and a queue retires only after a moment when no call was in flight (every call that
//! began before the probation has ended).
//!
//! Pure logic: the driver side (events, stream queries) is behind [`QueueDevice`].

use crate::base::in_flight::InFlight;
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A queue: `LEGACY`, a per-thread default stream's key, or a stream handle (see
/// `streams::key`).
pub type QueueKey = u64;

/// A queue retires only after this long without work.
pub const PROBATION: Duration = Duration::from_millis(200);
/// Housekeeping runs at most this often.
const TICK: Duration = Duration::from_millis(20);

/// What the queue tracker asks the driver.
pub trait QueueDevice {
    /// Makes all work issued from now on `new` wait for all work issued so far on `others`
    /// (and on destroyed streams). False when it cannot (a graph capture is under way).
    fn order_after(&self, new: QueueKey, others: &[QueueKey]) -> bool;
    /// Whether all work issued so far on `q` has completed (false when unknowable).
    fn idle(&self, q: QueueKey) -> bool;
}

// ---- the hot path: work calls in flight, and the epoch ------------------------------------

/// Bumped when cached "this queue is known" answers must be checked again.
static EPOCH: AtomicU64 = AtomicU64::new(1);

/// The current epoch.
pub fn epoch() -> u64 {
    EPOCH.load(SeqCst)
}

/// Makes every thread report its next work again.
pub fn bump_epoch() {
    EPOCH.fetch_add(1, SeqCst);
}

/// Work calls in flight, from before their queue is checked until the driver has them.
static IN_FLIGHT: InFlight = InFlight::new();

/// A work call in flight (see [`IN_FLIGHT`]).
pub type Entered = crate::base::in_flight::Entered;

/// Counts a work call in; out when the guard drops. SeqCst: ordered before the call's read of
/// the epoch (see [`quiescent`]).
pub fn entered() -> Entered {
    IN_FLIGHT.enter()
}

/// How many work calls entered so far.
pub fn work_calls() -> u64 {
    IN_FLIGHT.entered()
}

/// Whether no work call is in flight right now. If so, every call that read the epoch before
/// the last [`bump_epoch`] has passed its work on.
pub fn quiescent() -> bool {
    IN_FLIGHT.quiescent()
}

const REMEMBERED: usize = 4;

thread_local! {
    /// (raw stream, context, epoch) of the queues this thread reported last, newest first.
    static SEEN: RefCell<[(usize, usize, u64); REMEMBERED]> =
        const { RefCell::new([(usize::MAX, 0, 0); REMEMBERED]) };
}

/// Whether this thread already reported work on `stream` (as the program passed it) in
/// context `ctx` since the epoch last changed.
pub fn seen(stream: usize, ctx: usize) -> bool {
    let now = epoch();
    SEEN.try_with(|s| {
        s.borrow()
            .iter()
            .any(|&(st, cx, e)| st == stream && cx == ctx && e == now)
    })
    .unwrap_or(false)
}

/// Remembers that this thread reported work on `stream` in `ctx` at epoch `at` (read before
/// the report).
pub fn remember(stream: usize, ctx: usize, at: u64) {
    let _ = SEEN.try_with(|s| {
        let mut s = s.borrow_mut();
        s.rotate_right(1);
        s[0] = (stream, ctx, at);
    });
}

// ---- one context's queues ------------------------------------------------------------------

struct Active {
    key: QueueKey,
    /// Got work since the probation began.
    touched: bool,
}

/// Invariant: `active` holds each queue that received work and has not retired, once.
#[derive(Default)]
struct State {
    active: Vec<Active>,
    /// When the running probation began (every active queue's `touched` was cleared then).
    probation: Option<Instant>,
    last_tick: Option<Instant>,
}

/// The queues of one context (see the module doc).
#[derive(Default)]
pub struct Queues {
    state: Mutex<State>,
    /// `active.len()`, readable without the lock.
    count: AtomicUsize,
    /// Set for good when a new queue could not be ordered after the others: reuse can no
    /// longer rely on stream order in this context.
    unordered: AtomicBool,
}

impl Queues {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        crate::base::sync::lock(&self.state)
    }

    /// Whether all work so far went to at most one queue (and ordering never failed).
    pub fn one_queue(&self) -> bool {
        self.count.load(Acquire) <= 1 && !self.unordered.load(Acquire)
    }

    /// Whether a new queue once could not be ordered after the others.
    pub fn unordered(&self) -> bool {
        self.unordered.load(Acquire)
    }

    /// The active queues.
    pub fn active(&self) -> Vec<QueueKey> {
        self.lock().active.iter().map(|a| a.key).collect()
    }

    /// Work is about to be issued on `q`. Activates it (ordered after the others) if it is new.
    pub fn work_on(&self, q: QueueKey, dev: &dyn QueueDevice) {
        let mut st = self.lock();
        if let Some(a) = st.active.iter_mut().find(|a| a.key == q) {
            a.touched = true;
            return;
        }
        let others: Vec<QueueKey> = st.active.iter().map(|a| a.key).collect();
        if !dev.order_after(q, &others) {
            self.unordered.store(true, Release);
        }
        st.active.push(Active {
            key: q,
            touched: true,
        });
        self.count.store(st.active.len(), Release);
    }

    /// `q` is gone (a destroyed stream; its last work is the device's to remember).
    pub fn forget(&self, q: QueueKey) {
        let mut st = self.lock();
        st.active.retain(|a| a.key != q);
        self.count.store(st.active.len(), Release);
    }

    /// Reuse can no longer rely on stream order in this context (work went where the tracker
    /// could not see it).
    pub fn mark_unordered(&self) {
        self.unordered.store(true, Release);
    }

    /// At a pool's miss: retires at once every queue whose work has all completed, as a
    /// probation would [`PROBATION`] later. The epoch is bumped first, so every thread reports
    /// its next work again; nothing retires while a work call is in flight (one begun before
    /// the bump may be passing work to a queue without reporting it). So a second queue that
    /// went idle stops costing fences at the next miss. Never waits.
    pub fn retire_idle(&self, dev: &dyn QueueDevice) {
        let mut st = self.lock();
        if st.active.len() < 2 {
            return;
        }
        bump_epoch();
        if !quiescent() {
            return;
        }
        st.active.retain(|a| !dev.idle(a.key));
        self.count.store(st.active.len(), Release);
        st.probation = None;
    }

    /// Housekeeping, at most every [`TICK`] (returns whether it ran): starts a probation, or
    /// retires the queues that stayed untouched and idle through one. Never waits.
    pub fn tick(&self, dev: &dyn QueueDevice) -> bool {
        let now = Instant::now();
        let mut st = self.lock();
        if st.last_tick.is_some_and(|t| now.duration_since(t) < TICK) {
            return false;
        }
        st.last_tick = Some(now);
        if st.active.len() < 2 {
            // One queue (or none) is the best there is: nothing to gain.
            st.probation = None;
            return true;
        }
        match st.probation {
            None => {
                for a in &mut st.active {
                    a.touched = false;
                }
                st.probation = Some(now);
                bump_epoch();
            }
            Some(began) if now.duration_since(began) >= PROBATION => {
                if !quiescent() {
                    return true; // a work call begun before the probation may be in flight
                }
                st.active.retain(|a| a.touched || !dev.idle(a.key));
                self.count.store(st.active.len(), Release);
                st.probation = None;
            }
            Some(_) => {}
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    /// Records what the tracker asked; queues in `busy` are not idle.
    #[derive(Default)]
    struct Dev {
        ordered: RefCell<Vec<(QueueKey, Vec<QueueKey>)>>,
        busy: RefCell<Vec<QueueKey>>,
        refuse: bool,
    }

    impl QueueDevice for Dev {
        fn order_after(&self, new: QueueKey, others: &[QueueKey]) -> bool {
            self.ordered.borrow_mut().push((new, others.to_vec()));
            !self.refuse || others.is_empty()
        }
        fn idle(&self, q: QueueKey) -> bool {
            !self.busy.borrow().contains(&q)
        }
    }

    const LEGACY: QueueKey = 1;
    const S: QueueKey = 0x7000;

    /// The in-flight counters and the epoch are process-wide: these tests take turns.
    static SERIAL: Mutex<()> = Mutex::new(());
    fn serial() -> std::sync::MutexGuard<'static, ()> {
        crate::base::sync::lock(&SERIAL)
    }

    /// A whole probation, with work on legacy during it (legacy stays active).
    fn probation(q: &Queues, dev: &Dev) {
        q.tick(dev);
        q.work_on(LEGACY, dev);
        std::thread::sleep(PROBATION + TICK);
        q.tick(dev);
    }

    #[test]
    fn the_first_work_on_a_new_queue_is_ordered_after_the_others() {
        let _serial = serial();
        let (q, dev) = (Queues::default(), Dev::default());
        q.work_on(LEGACY, &dev);
        assert!(q.one_queue());
        q.work_on(LEGACY, &dev);
        q.work_on(S, &dev);
        assert!(!q.one_queue(), "two queues");
        let ordered = dev.ordered.borrow();
        assert_eq!(ordered[0], (LEGACY, vec![]));
        assert_eq!(ordered[1], (S, vec![LEGACY]), "S waits for legacy");
        assert_eq!(ordered.len(), 2, "known queues are not ordered again");
    }

    #[test]
    fn an_idle_untouched_queue_retires_and_is_ordered_again_on_its_next_work() {
        let _serial = serial();
        let (q, dev) = (Queues::default(), Dev::default());
        q.work_on(LEGACY, &dev);
        q.work_on(S, &dev);
        let e = epoch();
        q.tick(&dev);
        assert!(epoch() > e, "a probation makes every thread report again");
        // Legacy keeps getting work; S does not.
        q.work_on(LEGACY, &dev);
        std::thread::sleep(PROBATION + TICK);
        q.tick(&dev);
        assert!(q.one_queue(), "S retired: one queue again");
        assert_eq!(q.active(), vec![LEGACY]);
        q.work_on(S, &dev);
        assert_eq!(dev.ordered.borrow().last(), Some(&(S, vec![LEGACY])));
    }

    #[test]
    fn busy_or_touched_queues_do_not_retire() {
        let _serial = serial();
        let (q, dev) = (Queues::default(), Dev::default());
        q.work_on(LEGACY, &dev);
        q.work_on(S, &dev);
        dev.busy.borrow_mut().push(S);
        probation(&q, &dev);
        assert!(!q.one_queue(), "S still runs work: not retired");
        dev.busy.borrow_mut().clear();
        std::thread::sleep(TICK);
        q.tick(&dev); // a new probation
        q.work_on(S, &dev); // touched during it
        q.work_on(LEGACY, &dev);
        std::thread::sleep(PROBATION + TICK);
        q.tick(&dev);
        assert_eq!(q.active().len(), 2, "S got work during the probation");
    }

    #[test]
    fn a_work_call_in_flight_holds_the_retirement_back() {
        let _serial = serial();
        let (q, dev) = (Queues::default(), Dev::default());
        q.work_on(LEGACY, &dev);
        q.work_on(S, &dev);
        let call = entered();
        probation(&q, &dev);
        assert_eq!(q.active().len(), 2, "a call in flight may be issuing on S");
        drop(call);
        q.tick(&dev);
        std::thread::sleep(TICK);
        q.tick(&dev);
        assert!(q.one_queue());
    }

    #[test]
    fn at_a_miss_idle_queues_retire_at_once_unless_busy_or_a_call_is_in_flight() {
        let _serial = serial();
        let (q, dev) = (Queues::default(), Dev::default());
        q.work_on(LEGACY, &dev);
        q.work_on(S, &dev);
        dev.busy.borrow_mut().push(LEGACY);
        let call = entered();
        let e = epoch();
        q.retire_idle(&dev);
        assert!(epoch() > e, "every thread reports its next work again");
        assert_eq!(q.active().len(), 2, "a call in flight may be issuing on S");
        drop(call);
        q.retire_idle(&dev);
        assert_eq!(
            q.active(),
            vec![LEGACY],
            "S idle: retired with no probation"
        );
        assert!(q.one_queue());
        q.work_on(S, &dev);
        assert_eq!(dev.ordered.borrow().last(), Some(&(S, vec![LEGACY])));
    }

    #[test]
    fn a_queue_that_cannot_be_ordered_ends_one_queue_reuse_for_good() {
        let _serial = serial();
        let (q, dev) = (
            Queues::default(),
            Dev {
                refuse: true,
                ..Dev::default()
            },
        );
        q.work_on(LEGACY, &dev);
        q.work_on(S, &dev);
        probation(&q, &dev);
        assert_eq!(q.active(), vec![LEGACY], "S retired");
        assert!(!q.one_queue() && q.unordered());
    }

    #[test]
    fn a_thread_remembers_its_queues_until_the_epoch_changes() {
        let _serial = serial();
        assert!(!seen(0x5000, 7));
        let e = epoch();
        remember(0x5000, 7, e);
        assert!(seen(0x5000, 7) || epoch() != e);
        assert!(!seen(0x5000, 8), "another context");
        bump_epoch();
        assert!(!seen(0x5000, 7));
    }
}
