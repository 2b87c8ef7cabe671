//! The driver side of reuse safety: each context's queues, the events that order a new queue
//! after the others, and the events that fence freed blocks. Uses the queue tracker, the pool's
//! `Clock` trait and the driver; nothing above them.
//!
//! [`ContextClock`] is the pool's [`Clock`] for one context. It owns the context's
//! [`Queues`] (which queues received work, see `queues`) and answers the tracker's questions
//! with events and stream queries:
//! - *ordering a new queue*: an event on each other active queue (the legacy stream stands for
//!   per-thread default streams, which it synchronizes with), plus the events recorded on
//!   streams as they were destroyed; the new queue waits for all of them;
//! - *a fence* (under `Fenced`): an event on each active queue, plus those of destroyed
//!   streams; complete when all are. When the context's queues cannot be trusted (a queue could
//!   not be ordered, or per-thread default stream work went through an entry point cudapool
//!   does not watch), a fence covers the legacy stream (which follows every blocking and
//!   per-thread stream) and every live stream instead.
//!
//! No event is recorded while a graph capture is under way anywhere in the process: an event
//! on the legacy stream could invalidate the capture. Freed blocks then wait, and the pool
//! grows; a queue that needs ordering then cannot be ordered (`Queues::unordered`).
//!
//! A safety net: on housekeeping ticks, a stream the program created and that has no work
//! cudapool saw is asked whether it is idle; if it is not, work reached it through an entry
//! point cudapool does not watch, and the context falls back to fences for good (one warning).
//!
//! Uses: `queues`, `pool` (its `Clock`), `driver`, `flags`, `config`, `addr_hash`, `per_thread`,
//! `sync`, `cu`.

use crate::addr_hash::AddrMap as HashMap;
use crate::config::Reuse;
use crate::cu::*;
use crate::driver::{call, Driver};
use crate::flags::{capturing_somewhere, exiting, unwatched_work};
use crate::pool::{Clock, FenceId, ReuseRule};
use crate::queues::{QueueDevice, QueueKey, Queues};
use crate::sync::lock;
use std::sync::atomic::{AtomicU64, Ordering::*};
use std::sync::Mutex;

/// The stream a call means: the handle the program passed, with 0 made explicit (the
/// per-thread default stream through a `_ptsz`/`_ptds` entry point, the legacy one otherwise).
pub fn resolve(stream: usize, ptsz: bool) -> usize {
    match stream {
        0 if ptsz => CU_STREAM_PER_THREAD,
        0 => CU_STREAM_LEGACY,
        _ => stream,
    }
}

/// The key of a [`resolve`]d stream, as the pool and the queue tracker see it: its handle, or
/// for the per-thread default stream a key of the calling thread's own (handles are 8-aligned
/// pointers, so keys cannot clash).
pub fn key(stream: usize) -> crate::pool::StreamKey {
    match stream {
        CU_STREAM_PER_THREAD => (crate::per_thread::thread_number() << 3) | 2,
        s => s as u64,
    }
}

/// Whether `q` is some thread's per-thread default stream.
fn is_per_thread(q: QueueKey) -> bool {
    q & 7 == 2
}

/// Whether `stream` is capturing a graph now. Asks the driver only while some capture is under
/// way in the process.
pub fn capturing(driver: &Driver, stream: usize) -> bool {
    if !capturing_somewhere() {
        return false;
    }
    let mut status: std::ffi::c_int = 0;
    call!(driver, stream_is_capturing(stream as CUstream, &mut status)) == CUDA_SUCCESS
        && status == CU_STREAM_CAPTURE_STATUS_ACTIVE
}

/// The events of one fence.
struct Fence {
    /// Recorded for this fence; back to the spare list when it retires.
    own: Vec<usize>,
    /// Shared with other fences; destroyed by the clock once complete.
    zombies: Vec<usize>,
}

/// The clock of one context (see the module doc).
///
/// Invariants: `created` holds the live streams the program created in this context, with
/// their flags; `zombies` the events recorded on destroyed streams that had work, not yet seen
/// complete; every event in `fences` and `spare` belongs to this context.
pub struct ContextClock {
    driver: &'static Driver,
    ctx: usize,
    reuse: Reuse,
    queues: Queues,
    created: Mutex<Vec<(usize, u32)>>,
    zombies: Mutex<Vec<usize>>,
    fences: Mutex<HashMap<FenceId, Fence>>,
    next: AtomicU64,
    spare: Mutex<Vec<usize>>,
}

impl ContextClock {
    pub fn new(driver: &'static Driver, ctx: usize, reuse: Reuse) -> Self {
        ContextClock {
            driver,
            ctx,
            reuse,
            queues: Queues::default(),
            created: Mutex::new(Vec::new()),
            zombies: Mutex::new(Vec::new()),
            fences: Mutex::new(HashMap::default()),
            next: AtomicU64::new(1),
            spare: Mutex::new(Vec::new()),
        }
    }

    /// Work is about to be issued on the queue `q` of this context.
    pub fn work_on(&self, q: QueueKey) {
        self.queues.work_on(q, self);
    }

    /// The program created `stream` in this context.
    pub fn stream_created(&self, stream: usize, flags: u32) {
        lock(&self.created).push((stream, flags));
    }

    /// The program is about to destroy `stream`: its last work is remembered (a zombie event)
    /// for the fences and for ordering new queues, and its handle may come back for another
    /// stream, so every thread reports its next work again.
    pub fn stream_destroying(&self, stream: usize) {
        lock(&self.created).retain(|&(s, _)| s != stream);
        let q = key(stream);
        if self.queues.active().contains(&q) {
            if let Some(ev) = self.record_on(stream) {
                lock(&self.zombies).push(ev);
            }
            self.queues.forget(q);
        }
        crate::queues::bump_epoch();
    }

    /// Whether the queues can be trusted: no queue went unordered, no work went unwatched.
    fn trusted(&self) -> bool {
        !self.queues.unordered() && !unwatched_work()
    }

    /// The stream to record on for work on `q` issued by any thread.
    fn source(q: QueueKey) -> usize {
        if q == CU_STREAM_LEGACY as QueueKey || is_per_thread(q) {
            CU_STREAM_LEGACY
        } else {
            q as usize
        }
    }

    /// The stream the calling thread issues `q`'s work on.
    fn target(q: QueueKey) -> usize {
        if is_per_thread(q) {
            CU_STREAM_PER_THREAD
        } else {
            q as usize
        }
    }

    /// An event recorded now on `stream`, in this context.
    fn record_on(&self, stream: usize) -> Option<usize> {
        let d = self.driver;
        d.in_context(self.ctx, || {
            let ev = match lock(&self.spare).pop() {
                Some(ev) => ev,
                None => {
                    let mut ev: CUevent = std::ptr::null_mut();
                    if call!(d, event_create(&mut ev, CU_EVENT_DISABLE_TIMING)) != CUDA_SUCCESS {
                        return None;
                    }
                    ev as usize
                }
            };
            if call!(d, event_record(ev as CUevent, stream as CUstream)) == CUDA_SUCCESS {
                Some(ev)
            } else {
                lock(&self.spare).push(ev);
                None
            }
        })
    }

    /// Complete, or unknowable (an error: the event or its context is gone).
    fn complete(&self, ev: usize) -> bool {
        call!(self.driver, event_query(ev as CUevent)) != CUDA_ERROR_NOT_READY
    }

    /// Destroys the zombie events that have completed.
    fn prune_zombies(&self) {
        let mut z = lock(&self.zombies);
        let d = self.driver;
        z.retain(|&ev| {
            let done = self.complete(ev);
            if done {
                call!(d, event_destroy(ev as CUevent));
            }
            !done
        });
    }

    /// The safety net (see the module doc): a created stream with no work cudapool saw must be
    /// idle.
    fn check_unwatched(&self) {
        if !self.trusted() || capturing_somewhere() {
            return;
        }
        let active = self.queues.active();
        let quiet: Vec<usize> = lock(&self.created)
            .iter()
            .map(|&(s, _)| s)
            .filter(|&s| !active.contains(&key(s)))
            .collect();
        let d = self.driver;
        let busy = d.in_context(self.ctx, || {
            quiet.into_iter().find(|&s| {
                call!(d, stream_query(s as CUstream)) == CUDA_ERROR_NOT_READY
                    && !self.queues.active().contains(&key(s))
            })
        });
        if let Some(s) = busy {
            crate::log_at!(
                crate::config::LogLevel::Warn,
                "stream {s:#x} runs device work that reached the driver through an entry point cudapool does not watch; freed memory now waits for fences in this context"
            );
            self.queues.mark_unordered();
        }
    }
}

impl QueueDevice for ContextClock {
    fn order_after(&self, new: QueueKey, others: &[QueueKey]) -> bool {
        let zombies = lock(&self.zombies).clone();
        let target = Self::target(new);
        let mut sources: Vec<usize> = others.iter().map(|&q| Self::source(q)).collect();
        sources.sort_unstable();
        sources.dedup();
        // A queue follows its own earlier work, and the legacy stream follows every blocking
        // and per-thread stream by itself.
        sources.retain(|&s| s != target && !(target == CU_STREAM_LEGACY && s == CU_STREAM_LEGACY));
        if sources.is_empty() && zombies.is_empty() {
            return true;
        }
        if capturing_somewhere() {
            return false;
        }
        let mut own = Vec::with_capacity(sources.len());
        for s in sources {
            match self.record_on(s) {
                Some(ev) => own.push(ev),
                None => {
                    lock(&self.spare).extend(own);
                    return false;
                }
            }
        }
        let d = self.driver;
        let ok = d.in_context(self.ctx, || {
            own.iter().chain(&zombies).all(|&ev| {
                call!(d, stream_wait_event(target as CUstream, ev as CUevent, 0)) == CUDA_SUCCESS
            })
        });
        // The waits took the events' state: they may be recorded again at once.
        lock(&self.spare).extend(own);
        ok
    }

    fn idle(&self, q: QueueKey) -> bool {
        if is_per_thread(q) {
            // Only its own thread can name it; it never retires.
            return false;
        }
        let d = self.driver;
        d.in_context(self.ctx, || {
            call!(d, stream_query(q as usize as CUstream)) == CUDA_SUCCESS
        })
    }
}

impl Clock for ContextClock {
    fn rule(&self) -> ReuseRule {
        match self.reuse {
            Reuse::Immediate => ReuseRule::Immediate,
            Reuse::Auto if self.queues.one_queue() && !unwatched_work() => ReuseRule::OneQueue,
            Reuse::Auto => ReuseRule::Fenced,
        }
    }

    fn issue(&self) -> Option<FenceId> {
        if capturing_somewhere() || exiting() {
            return None;
        }
        self.tick();
        self.prune_zombies();
        let mut streams: Vec<usize> = if self.trusted() {
            self.queues.active().into_iter().map(Self::source).collect()
        } else {
            std::iter::once(CU_STREAM_LEGACY)
                .chain(lock(&self.created).iter().map(|&(s, _)| s))
                .collect()
        };
        streams.sort_unstable();
        streams.dedup();
        let mut own = Vec::with_capacity(streams.len());
        for s in streams {
            match self.record_on(s) {
                Some(ev) => own.push(ev),
                None => {
                    lock(&self.spare).extend(own);
                    return None;
                }
            }
        }
        let zombies = lock(&self.zombies).clone();
        let id = self.next.fetch_add(1, Relaxed);
        lock(&self.fences).insert(id, Fence { own, zombies });
        Some(id)
    }

    fn is_done(&self, f: FenceId) -> bool {
        let fences = lock(&self.fences);
        let Some(fence) = fences.get(&f) else {
            return true;
        };
        fence
            .own
            .iter()
            .chain(&fence.zombies)
            .all(|&ev| self.complete(ev))
    }

    fn wait(&self, f: FenceId) {
        let events: Vec<usize> = match lock(&self.fences).get(&f) {
            Some(fence) => fence.own.iter().chain(&fence.zombies).copied().collect(),
            None => return,
        };
        for ev in events {
            call!(self.driver, event_synchronize(ev as CUevent));
        }
    }

    fn retire(&self, f: FenceId) {
        if let Some(fence) = lock(&self.fences).remove(&f) {
            lock(&self.spare).extend(fence.own);
        }
    }

    fn tick(&self) {
        if self.reuse == Reuse::Immediate || exiting() {
            return;
        }
        if self.queues.tick(self) {
            self.check_unwatched();
        }
    }
}
