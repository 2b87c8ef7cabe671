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
//! - *a hand-over* (a fence whose blocks the pool takes back before it is done, instead of
//!   waiting on the host): the fence's events are kept as *owed*; the next work on every
//!   queue of the context, new queues included, is made to wait for them on the device
//!   (`cuStreamWaitEvent` on the stream the program is issuing to, inside its own call, so
//!   the stream is alive by the program's contract). Every thread reports its next work again
//!   (the queue tracker's epoch is bumped) before the pool hands a block out, so no work issued
//!   after the block reached the program escapes the wait; work issued before cannot name the
//!   block. Only the newest fence handed over is owed: a fence covers all work issued before
//!   it on every queue that may still run some (the active queues, and destroyed streams
//!   through their pending zombie events; a retired queue was idle), so it covers every older
//!   fence. It is dropped once complete. A hand-over is refused while a capture is under way,
//!   when the queues cannot be trusted (work cudapool does not see would escape it), and while
//!   more than one context of the process has run device work: another context's queues (a
//!   peer device reading the block, a copy between devices) owe nothing to this one's fences,
//!   so there the host waits, as before. A context whose first device work comes while
//!   another context owes a fence waits for that fence on the host first; a hand-over that
//!   finds, once published, that a second context has begun, waits for its fence on the host
//!   itself (either the new context sees the fence owed or the hand-over sees the context:
//!   both sides publish, then look).
//!
//! **Capture-safe** (docs/design.md, "Capture-safe"): every call the clock makes on its own
//! behalf (an event recorded, queried or waited for, a stream queried, made to wait for an
//! event it would not otherwise wait for) runs under a permission of `flags::own_calls`, which
//! is refused while a graph capture is under way anywhere in the process, in any mode: CUDA
//! forbids such calls to every thread during a global capture, a query or wait on the legacy
//! stream conflicts with any capture of a blocking stream, and a query of the capturing
//! stream itself invalidates the capture. Without one the clock does without: no fence is
//! issued (freed blocks wait, the pool grows), none is seen done or waited for (a wait says so
//! and the pool takes nothing back on its strength), no queue is retired, a queue that needs
//! ordering cannot be ordered (`Queues::unordered`), and no hand-over is made. A capture
//! begins with no fence owed: [`settle_all_owed`] waits for them on the host just before. The
//! one call made during a capture is the device-side wait of a queue that pays a fence (on the
//! stream the program is issuing to, as legal as the program's own work there; a capturing
//! stream never pays: its work runs when the graph is launched, which pays).
//!
//! A safety net: on housekeeping ticks, a stream the program created and that has no work
//! cudapool saw is asked whether it is idle; if it is not, work reached it through an entry
//! point cudapool does not watch, and the context falls back to fences for good (one warning).
//!
//! **Handles the program owns are the program's** (docs/design.md, trap 10). The context, its
//! streams, and the events cudapool makes in it can be destroyed by any thread of the program
//! at any moment, and the driver does not check a dead handle: it crashes. So:
//! - every call that passes this context, one of its streams or one of cudapool's events in it
//!   to the driver runs inside a *use* of the context's [`Lifetime`] (an [`Alive`] proves it);
//! - a stream reaches the driver only while it is listed (an active queue, or a created
//!   stream), and the program's `cuStreamDestroy` unlists it inside an exclusive section of
//!   the same lifetime, before the real destroy: no thread can be between "read the handle" and
//!   "passed it to the driver" then, and none finds it afterwards. Its last work is recorded
//!   there (a *zombie* event) so that the blocks it may touch stay fenced;
//! - the context's teardown (`cuCtxDestroy`, primary reset, last primary release) runs the
//!   real call inside an exclusive section and ends the lifetime when the context is gone:
//!   every later use finds it ended and calls nothing (fences count as done: nothing runs in a
//!   dead context);
//! - a zombie event is shared by the fences sealed while it was pending, and destroyed only
//!   once it has completed and no fence holds it (an event handle the driver reuses would
//!   otherwise answer for another).
//!
//! The streams the program passes to the call it is making (its own launch, its own free) are
//! alive for the length of that call by the program's contract; cudapool uses them directly.

mod owed;

pub use owed::settle_all_owed;

use crate::base::addr_hash::AddrMap as HashMap;
use crate::base::config::Reuse;
use crate::base::cu::*;
use crate::base::flags::{capturing_somewhere, exiting, own_calls, unwatched_work};
use crate::base::sync::{lock, Lifetime, Use};
use crate::driver::{Driver, Own};
use crate::pool::queues::{QueueDevice, QueueKey, Queues};
use crate::pool::{Clock, FenceId, ReuseRule};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Mutex};

/// The newest fence handed over, while not seen complete (see `owed`'s notes).
///
/// Invariant: `fence` is the handed-over fence with the highest id, of generation `gen` (one
/// more each hand-over); `waited` maps a queue to the generation its stream was last made to
/// wait for: a queue not listed, or listed with an older generation, must wait for `fence`
/// before its next work.
#[derive(Default)]
struct Owed {
    gen: u64,
    fence: Option<(FenceId, Fence)>,
    waited: HashMap<QueueKey, u64>,
}

/// Contexts of the process that have run device work cudapool saw (and not ended since). A
/// hand-over needs this to be one (see the module doc).
static BUSY_CONTEXTS: AtomicUsize = AtomicUsize::new(0);

/// Every clock made (dropped ones are pruned when it is read): where a context that begins
/// device work looks for fences other contexts owe.
static CLOCKS: Mutex<Vec<std::sync::Weak<ContextClock>>> = Mutex::new(Vec::new());

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
        CU_STREAM_PER_THREAD => (crate::base::per_thread::thread_number() << 3) | 2,
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
    capturing_somewhere() && driver.stream_capturing(stream)
}

/// An event recorded on a stream as the program destroyed it: the stream's last work. Shared
/// (by reference count) with the fences sealed while it was pending.
struct Zombie(usize);

/// The events of one fence.
#[derive(Clone)]
struct Fence {
    /// Recorded for this fence; back to the spare list when it retires.
    own: Vec<usize>,
    /// Shared with other fences; destroyed by the clock once complete and unshared.
    zombies: Vec<Arc<Zombie>>,
}

/// The clock of one context (see the module doc).
///
/// Invariants: `created` holds the live streams the program created in this context, with
/// their flags; `zombies` the events recorded on destroyed streams that had work, not yet seen
/// complete and unshared; every event in `fences`, `owed`, `zombies` and `spare` belongs to
/// this context; an event in `owed` is in no other list but `zombies`. None of them is passed
/// to the driver outside a use of `life` (or the exclusive
/// section of a stream's destroy); once `life` has ended, none is passed at all.
pub struct ContextClock {
    driver: &'static Driver,
    ctx: usize,
    reuse: Reuse,
    life: Lifetime,
    queues: Queues,
    created: Mutex<Vec<(usize, u32)>>,
    zombies: Mutex<Vec<Arc<Zombie>>>,
    fences: Mutex<HashMap<FenceId, Fence>>,
    owed: Mutex<Owed>,
    /// Whether `owed` holds any fence, readable without its lock (the work hook's check).
    owing: AtomicBool,
    /// Whether this context is counted in [`BUSY_CONTEXTS`].
    busy: AtomicBool,
    next: AtomicU64,
    spare: Mutex<Vec<usize>>,
}

/// The clock while its context is known to be alive: inside a use of its lifetime, or inside
/// the exclusive section of a stream's destroy. Every driver call of the clock goes through
/// one.
struct Alive<'a> {
    clock: &'a ContextClock,
    _use: Option<Use<'a>>,
}

impl ContextClock {
    pub fn new(driver: &'static Driver, ctx: usize, reuse: Reuse) -> Self {
        ContextClock {
            driver,
            ctx,
            reuse,
            life: Lifetime::default(),
            queues: Queues::default(),
            created: Mutex::new(Vec::new()),
            zombies: Mutex::new(Vec::new()),
            fences: Mutex::new(HashMap::default()),
            owed: Mutex::new(Owed::default()),
            owing: AtomicBool::new(false),
            busy: AtomicBool::new(false),
            next: AtomicU64::new(1),
            spare: Mutex::new(Vec::new()),
        }
    }

    /// A new clock, listed where other contexts find it (see [`CLOCKS`]).
    pub fn made(driver: &'static Driver, ctx: usize, reuse: Reuse) -> Arc<Self> {
        let c = Arc::new(ContextClock::new(driver, ctx, reuse));
        let mut all = lock(&CLOCKS);
        all.retain(|w| w.strong_count() > 0);
        all.push(Arc::downgrade(&c));
        c
    }

    /// The clock inside a use of its context; `None` once the context is gone.
    fn alive(&self) -> Option<Alive<'_>> {
        Some(Alive {
            clock: self,
            _use: Some(self.life.enter()?),
        })
    }

    /// A use of the context (see the module doc): while it lives, the context is not torn
    /// down. `None` once it is gone. For whoever else passes the context to the driver from a
    /// thread that may not have it current (reclaim).
    pub fn enter(&self) -> Option<Use<'_>> {
        self.life.enter()
    }

    /// Runs `end`, the program's call that may destroy the context, while no use is under way;
    /// `end` says whether the context is gone, and then every later use finds it ended. `None`
    /// (and `end` not run) when it was gone already.
    pub fn ending<T>(&self, end: impl FnOnce() -> (T, bool)) -> Option<T> {
        let r = self.life.exclusive(end);
        if self.life.ended() && self.busy.swap(false, AcqRel) {
            BUSY_CONTEXTS.fetch_sub(1, SeqCst);
        }
        r
    }

    /// Work is about to be issued on the queue `q` of this context, by the calling thread.
    pub fn work_on(&self, q: QueueKey) {
        if let Some(alive) = self.alive() {
            if !self.busy.load(Relaxed)
                && !self.busy.swap(true, AcqRel)
                && BUSY_CONTEXTS.fetch_add(1, SeqCst) > 0
            {
                self.wait_for_others_owed();
            }
            self.queues.work_on(q, &alive);
            if self.owing.load(Acquire) {
                alive.pay(q);
            }
        }
    }

    /// The program created `stream` in this context.
    pub fn stream_created(&self, stream: usize, flags: u32) {
        lock(&self.created).push((stream, flags));
    }

    /// The program is about to destroy `stream`: no thread is using it, and none will (it is
    /// unlisted); its last work is remembered (a zombie event) for the fences and for ordering
    /// new queues. Its handle may come back for another stream, so every thread reports its
    /// next work again.
    pub fn stream_destroying(&self, stream: usize) {
        self.life.exclusive(|| {
            let alive = Alive {
                clock: self,
                _use: None,
            };
            lock(&self.created).retain(|&(s, _)| s != stream);
            let q = key(stream);
            // A stream made later with the same handle owes every fence owed now.
            lock(&self.owed).waited.remove(&q);
            if self.queues.active().contains(&q) {
                if let Some(ev) = alive.record_on(stream, None) {
                    lock(&self.zombies).push(Arc::new(Zombie(ev)));
                }
                self.queues.forget(q);
            }
            ((), false)
        });
        crate::pool::queues::bump_epoch();
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

    fn tick_alive(&self, alive: &Alive) {
        if self.reuse == Reuse::Immediate || exiting() {
            return;
        }
        if self.queues.tick(alive) {
            alive.check_unwatched();
        }
    }
}

impl Alive<'_> {
    /// An event recorded now on `stream`: a listed one, on cudapool's own behalf (`own`), or,
    /// without, the program's own in its current call on it (as legal then as that call).
    fn record_on(&self, stream: usize, own: Option<Own<'_>>) -> Option<usize> {
        let c = self.clock;
        let d = c.driver;
        d.in_context(c.ctx, || {
            let spare = lock(&c.spare).pop();
            let ev = match spare {
                Some(ev) => ev,
                None => d.event_create(CU_EVENT_DISABLE_TIMING).ok()?,
            };
            let recorded = match own {
                Some(own) => own.event_record(ev, stream),
                None => d.record_before_program_call(ev, stream),
            };
            if recorded == CUDA_SUCCESS {
                Some(ev)
            } else {
                lock(&c.spare).push(ev);
                None
            }
        })
    }

    /// An event recorded now on each of `streams`; `None` (the events made so far go back to
    /// the spares) if one cannot be.
    fn record_all(
        &self,
        calls: Own<'_>,
        streams: impl IntoIterator<Item = usize>,
    ) -> Option<Vec<usize>> {
        let mut own = Vec::new();
        for s in streams {
            match self.record_on(s, Some(calls)) {
                Some(ev) => own.push(ev),
                None => {
                    lock(&self.clock.spare).extend(own);
                    return None;
                }
            }
        }
        Some(own)
    }

    /// Whether the work before `ev` has completed. An error (the context hit a sticky error,
    /// or an injected fault) is not completion: the fence stays pending, and a wait ends it.
    fn complete(&self, ev: usize) -> bool {
        let Some(calls) = own_calls() else {
            return false;
        };
        self.clock.driver.own(&calls).event_query(ev) == CUDA_SUCCESS
    }

    /// Destroys the zombie events that have completed and that no fence holds.
    fn prune_zombies(&self, own: Own<'_>) {
        lock(&self.clock.zombies).retain(|z| {
            let gone = Arc::strong_count(z) == 1 && self.complete(z.0);
            if gone {
                own.event_destroy(z.0);
            }
            !gone
        });
    }

    /// The safety net (see the module doc): a created stream with no work cudapool saw must be
    /// idle.
    fn check_unwatched(&self) {
        let c = self.clock;
        if !c.trusted() {
            return;
        }
        let Some(calls) = own_calls() else {
            return;
        };
        let active = c.queues.active();
        let quiet: Vec<usize> = lock(&c.created)
            .iter()
            .map(|&(s, _)| s)
            .filter(|&s| !active.contains(&key(s)))
            .collect();
        let own = c.driver.own(&calls);
        let busy = c.driver.in_context(c.ctx, || {
            quiet.into_iter().find(|&s| {
                own.stream_query(s) == CUDA_ERROR_NOT_READY && !c.queues.active().contains(&key(s))
            })
        });
        if let Some(s) = busy {
            crate::log_at!(
                crate::base::config::LogLevel::Warn,
                "stream {s:#x} runs device work that reached the driver through an entry point cudapool does not watch; freed memory now waits for fences in this context"
            );
            c.queues.mark_unordered();
        }
    }
}

impl QueueDevice for Alive<'_> {
    fn order_after(&self, new: QueueKey, others: &[QueueKey]) -> bool {
        let c = self.clock;
        let zombies = lock(&c.zombies).clone();
        let target = ContextClock::target(new);
        let mut sources: Vec<usize> = others.iter().map(|&q| ContextClock::source(q)).collect();
        sources.sort_unstable();
        sources.dedup();
        // A queue follows its own earlier work, and the legacy stream follows every blocking
        // and per-thread stream by itself.
        sources.retain(|&s| s != target && !(target == CU_STREAM_LEGACY && s == CU_STREAM_LEGACY));
        if sources.is_empty() && zombies.is_empty() {
            return true;
        }
        let Some(calls) = own_calls() else {
            return false;
        };
        let driver = c.driver.own(&calls);
        let Some(own) = self.record_all(driver, sources) else {
            return false;
        };
        let ok = c.driver.in_context(c.ctx, || {
            own.iter().chain(zombies.iter().map(|z| &z.0)).all(|&ev| {
                driver.stream_wait_event(target, ev) == CUDA_SUCCESS
                    // The device could not be told to wait: the host waits instead.
                    || driver.event_synchronize(ev) == CUDA_SUCCESS
            })
        });
        // The waits took the events' state: they may be recorded again at once.
        lock(&c.spare).extend(own);
        ok
    }

    fn idle(&self, q: QueueKey) -> bool {
        if is_per_thread(q) {
            // Only its own thread can name it; it never retires.
            return false;
        }
        let Some(calls) = own_calls() else {
            return false;
        };
        let own = self.clock.driver.own(&calls);
        self.clock.driver.in_context(self.clock.ctx, || {
            own.stream_query(q as usize) == CUDA_SUCCESS
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
        if exiting() {
            return None;
        }
        let calls = own_calls()?;
        let own = self.driver.own(&calls);
        let alive = self.alive()?;
        self.tick_alive(&alive);
        alive.prune_owed();
        alive.prune_zombies(own);
        let mut streams: Vec<usize> = if self.trusted() {
            self.queues.active().into_iter().map(Self::source).collect()
        } else {
            std::iter::once(CU_STREAM_LEGACY)
                .chain(lock(&self.created).iter().map(|&(s, _)| s))
                .collect()
        };
        streams.sort_unstable();
        streams.dedup();
        let own = alive.record_all(own, streams)?;
        let zombies = lock(&self.zombies).clone();
        let id = self.next.fetch_add(1, Relaxed);
        lock(&self.fences).insert(id, Fence { own, zombies });
        Some(id)
    }

    fn is_done(&self, f: FenceId) -> bool {
        // A dead context runs nothing: its fences are done.
        let Some(alive) = self.alive() else {
            return true;
        };
        let fences = lock(&self.fences);
        let Some(fence) = fences.get(&f) else {
            return true;
        };
        let Some(_calls) = own_calls() else {
            return false;
        };
        fence
            .own
            .iter()
            .chain(fence.zombies.iter().map(|z| &z.0))
            .all(|&ev| alive.complete(ev))
    }

    /// Waits without the pool's lock, so `f` may be retired or handed over meanwhile by
    /// another thread: the wait holds the zombie events it waits on (none is destroyed under
    /// it), and an own event recycled meanwhile only makes it wait longer (the pool takes
    /// nothing back on the strength of a wait for a fence it no longer holds).
    /// A capture under way anywhere stops the wait (a host wait is forbidden then): false.
    fn wait(&self, f: FenceId) -> bool {
        let Some(_alive) = self.alive() else {
            return true;
        };
        let Some(fence) = lock(&self.fences).get(&f).cloned() else {
            return true;
        };
        for &ev in fence.own.iter().chain(fence.zombies.iter().map(|z| &z.0)) {
            let Some(calls) = own_calls() else {
                return false;
            };
            // An error here is a sticky one of the context (nothing will run in it again) or
            // an injected fault: either way the wait is over.
            self.driver.own(&calls).event_synchronize(ev);
        }
        true
    }

    fn hand_over(&self, f: FenceId) -> bool {
        self.hand_over_now(f)
    }

    fn retire(&self, f: FenceId) {
        if let Some(fence) = lock(&self.fences).remove(&f) {
            lock(&self.spare).extend(fence.own);
        }
    }

    /// Queries streams: nothing while a capture is under way anywhere (a query of the legacy
    /// or the capturing stream would invalidate it).
    fn tick(&self) {
        let Some(_calls) = own_calls() else {
            return;
        };
        if let Some(alive) = self.alive() {
            if self.reuse != Reuse::Immediate && !exiting() {
                self.queues.retire_idle(&alive);
            }
            self.tick_alive(&alive);
        }
    }
}
