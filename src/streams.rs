//! The driver side of reuse safety: each context's streams, and the events that fence them.
//!
//! A fence for a context is complete when every piece of device work issued before it, on any
//! stream of the context, has completed. It is made of:
//! - an event on the legacy default stream: legacy-stream work starts only after all earlier
//!   work of every *blocking* stream (and of the per-thread default streams), so this event
//!   covers all of those;
//! - an event on each live *non-blocking* stream (those do not synchronize with legacy);
//! - the events recorded on streams as they were destroyed (their last work may still run).
//!
//! No fence is issued while a graph capture is under way anywhere in the process: an event on
//! the legacy stream could invalidate the capture. Freed blocks then wait, and the pool grows.

use crate::addr_hash::AddrMap as HashMap;
use crate::config::Reuse;
use crate::cu::*;
use crate::driver::{call, Driver};
use crate::pool::{Clock, FenceId, ReuseRule};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering::*};
use std::sync::Mutex;

/// Graph captures begun and not yet ended, process-wide.
static CAPTURES: AtomicI64 = AtomicI64::new(0);

pub fn capture_begun() {
    CAPTURES.fetch_add(1, AcqRel);
}

pub fn capture_ended() {
    let _ = CAPTURES.fetch_update(AcqRel, Acquire, |n| Some((n - 1).max(0)));
}

/// The stream a stream-ordered call means: the handle the program passed, with 0 made explicit
/// (the per-thread default stream through a `_ptsz` entry point, the legacy one otherwise).
pub fn resolve(stream: usize, ptsz: bool) -> usize {
    match stream {
        0 if ptsz => CU_STREAM_PER_THREAD,
        0 => CU_STREAM_LEGACY,
        _ => stream,
    }
}

/// The pool's key for a [`resolve`]d stream: its handle, or for the per-thread default stream
/// a key of the calling thread's own (handles are 8-aligned pointers, so keys cannot clash).
pub fn key(stream: usize) -> crate::pool::StreamKey {
    match stream {
        CU_STREAM_PER_THREAD => (crate::striped::thread_number() << 3) | 2,
        s => s as u64,
    }
}

/// Whether `stream` is capturing a graph now. Asks the driver only while some capture is under
/// way in the process.
pub fn capturing(driver: &Driver, stream: usize) -> bool {
    if CAPTURES.load(Acquire) == 0 {
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
/// Invariants: `non_blocking` holds the live non-blocking streams created in this context;
/// `zombies` the events recorded on destroyed streams and not yet seen complete; every event in
/// `fences` and `spare` belongs to this context.
pub struct ContextClock {
    driver: &'static Driver,
    ctx: usize,
    reuse: Reuse,
    /// Set for good once the program creates a stream in this context.
    streams_created: AtomicBool,
    non_blocking: Mutex<Vec<usize>>,
    zombies: Mutex<Vec<usize>>,
    fences: Mutex<HashMap<FenceId, Fence>>,
    next: AtomicU64,
    spare: Mutex<Vec<usize>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl ContextClock {
    pub fn new(driver: &'static Driver, ctx: usize, reuse: Reuse) -> Self {
        ContextClock {
            driver,
            ctx,
            reuse,
            streams_created: AtomicBool::new(false),
            non_blocking: Mutex::new(Vec::new()),
            zombies: Mutex::new(Vec::new()),
            fences: Mutex::new(HashMap::default()),
            next: AtomicU64::new(1),
            spare: Mutex::new(Vec::new()),
        }
    }

    /// The program created `stream` in this context.
    ///
    /// Blocks handed back at once to the thread that freed them (no stream existed then) may
    /// still be touched by work issued earlier on the legacy or a per-thread stream. A stream
    /// created now would not wait for that work, so it is made to: it waits for an event on the
    /// legacy stream, which follows every blocking and per-thread stream.
    pub fn stream_created(&self, stream: usize, flags: u32) {
        if self.reuse == Reuse::Auto && CAPTURES.load(Acquire) == 0 {
            if let Some(ev) = self.record_on(CU_STREAM_LEGACY) {
                let d = self.driver;
                d.in_context(self.ctx, || {
                    call!(d, stream_wait_event(stream as CUstream, ev as CUevent, 0));
                });
                // The wait took the event's state: it may be recorded again at once.
                lock(&self.spare).push(ev);
            }
        }
        self.streams_created.store(true, Release);
        if flags & CU_STREAM_NON_BLOCKING != 0 {
            lock(&self.non_blocking).push(stream);
        }
    }

    /// The program is about to destroy `stream`: its last work is fenced from now on.
    pub fn stream_destroying(&self, stream: usize) {
        lock(&self.non_blocking).retain(|&s| s != stream);
        if let Some(ev) = self.record_on(stream) {
            lock(&self.zombies).push(ev);
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
}

impl Clock for ContextClock {
    fn rule(&self) -> ReuseRule {
        match self.reuse {
            Reuse::Immediate => ReuseRule::Immediate,
            Reuse::Auto
                if self.streams_created.load(Acquire)
                    || crate::interpose::PER_THREAD_STREAMS_USED.load(Acquire) =>
            {
                ReuseRule::Fenced
            }
            Reuse::Auto => ReuseRule::SameThread,
        }
    }

    fn issue(&self) -> Option<FenceId> {
        if CAPTURES.load(Acquire) > 0 || crate::shim::exiting() {
            return None;
        }
        self.prune_zombies();
        let streams: Vec<usize> = std::iter::once(CU_STREAM_LEGACY)
            .chain(lock(&self.non_blocking).iter().copied())
            .collect();
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
}
