//! Process-wide flags that low layers read and higher layers set. They live at the bottom so
//! that whoever reads one never has to import whoever sets it.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering::*};

/// Set once the process is past `exit()`: the driver may be gone, so nothing calls it.
static EXITING: AtomicBool = AtomicBool::new(false);

/// Whether the process is past `exit()`.
pub fn exiting() -> bool {
    EXITING.load(Relaxed)
}

/// The process is past `exit()` (set by the exit handler, `state`).
pub fn set_exiting() {
    EXITING.store(true, Relaxed);
}

/// Graph captures begun (or beginning) and not yet ended, process-wide (counted by the
/// capture hooks).
static CAPTURES: AtomicI64 = AtomicI64::new(0);

/// Permissions of [`own_calls`] given and not yet dropped, process-wide.
static OWN_CALLS: AtomicI64 = AtomicI64::new(0);

/// How long a capture's begin waits for the permissions given before it (see
/// [`capture_beginning`]).
const BEGIN_PATIENCE: std::time::Duration = std::time::Duration::from_secs(1);

/// A program's capture is about to begin (its `cuStreamBeginCapture*` is about to reach the
/// driver): from now on no permission of [`own_calls`] is given, and this waits (at most
/// [`BEGIN_PATIENCE`]) until those given before are dropped, so that no call cudapool checked
/// before the capture reaches the driver after it began. A call still held past that is one
/// that blocks in the driver (a host wait), which the driver admitted before the capture.
/// [`capture_ended`] undoes it, also when the begin failed.
pub fn capture_beginning() {
    let _ = HERE.try_with(|n| n.set(n.get() + 1));
    let _ = SERIAL.try_with(|n| n.set(n.get() + 1));
    CAPTURES.fetch_add(1, SeqCst);
    let start = std::time::Instant::now();
    while OWN_CALLS.load(SeqCst) > 0 && start.elapsed() < BEGIN_PATIENCE {
        std::thread::yield_now();
    }
}

pub fn capture_ended() {
    let _ = HERE.try_with(|n| n.set(n.get().saturating_sub(1)));
    let _ = CAPTURES.fetch_update(SeqCst, SeqCst, |n| Some((n - 1).max(0)));
}

thread_local! {
    /// Captures the calling thread began and has not ended.
    static HERE: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
    /// Captures the calling thread began, ever: names the one under way.
    static SERIAL: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// The number of the calling thread's latest capture (its captures counted from 1).
pub fn capture_serial() -> u64 {
    SERIAL.try_with(|n| n.get()).unwrap_or(0)
}

/// Whether the calling thread began a graph capture it has not ended (a block it frees now
/// may be named by the graph: `state::pooled` keeps it for the graph).
#[inline]
pub fn capturing_here() -> bool {
    // One load when no capture is under way anywhere (the free's hot path): the thread-local
    // is read out of line, so its address is not computed on every free.
    capturing_somewhere() && began_here()
}

#[cold]
#[inline(never)]
fn began_here() -> bool {
    HERE.try_with(|n| n.get() > 0).unwrap_or(false)
}

/// Whether a graph capture is under way anywhere in the process.
pub fn capturing_somewhere() -> bool {
    CAPTURES.load(SeqCst) > 0
}

/// Permission to call the driver on cudapool's own behalf (a query, a synchronization, an
/// event, a release of memory): held for the length of the calls, it keeps any capture from
/// beginning meanwhile. `None` while a capture is under way anywhere in the process: CUDA
/// forbids such calls then, or they would change what the program captures (docs/design.md,
/// "Capture-safe"), and the caller does without.
pub fn own_calls() -> Option<OwnCalls> {
    OWN_CALLS.fetch_add(1, SeqCst);
    if CAPTURES.load(SeqCst) > 0 {
        OWN_CALLS.fetch_sub(1, SeqCst);
        return None;
    }
    Some(OwnCalls(()))
}

/// A permission of [`own_calls`]; dropping it gives it back.
#[must_use]
pub struct OwnCalls(());

impl Drop for OwnCalls {
    fn drop(&mut self) {
        OWN_CALLS.fetch_sub(1, SeqCst);
    }
}

/// Set for good once per-thread default stream work went through an entry point cudapool does
/// not watch: `interpose` hands those out behind a trampoline (assembly) that stores 1 here;
/// reuse safety (`state::clock`) reads it.
pub static UNWATCHED_WORK: AtomicBool = AtomicBool::new(false);

/// Whether work may have gone where cudapool cannot see it (see [`UNWATCHED_WORK`]).
pub fn unwatched_work() -> bool {
    UNWATCHED_WORK.load(Acquire)
}

/// Marks that work may have gone where cudapool cannot see it.
pub fn set_unwatched_work() {
    UNWATCHED_WORK.store(true, Release);
}

/// Panics caught at the hooks' boundary (each one a bug of cudapool's, `abi::hooks::guard`):
/// counted for the stats, and from the first one on the process's new allocations go to the
/// driver directly (`state::pooled`), whatever the pool's state was left as.
static PANICS: AtomicU64 = AtomicU64::new(0);

/// How many panics the hooks' boundary caught.
pub fn panics() -> u64 {
    PANICS.load(Relaxed)
}

/// One more panic caught; returns how many now.
pub fn count_panic() -> u64 {
    PANICS.fetch_add(1, Relaxed) + 1
}

/// A panic armed for the next pooled allocation (debug builds only: the test that injects one,
/// through `cudapool_debug_panic_next`).
#[cfg(debug_assertions)]
pub static PANIC_ARMED: AtomicBool = AtomicBool::new(false);
