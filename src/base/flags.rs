//! Process-wide flags that low layers read and higher layers set. They live at the bottom so
//! that whoever reads one never has to import whoever sets it.
//!
//! Uses: nothing of the crate.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering::*};

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

/// Graph captures begun and not yet ended, process-wide (counted by the capture hooks).
static CAPTURES: AtomicI64 = AtomicI64::new(0);

pub fn capture_begun() {
    CAPTURES.fetch_add(1, AcqRel);
}

pub fn capture_ended() {
    let _ = CAPTURES.fetch_update(AcqRel, Acquire, |n| Some((n - 1).max(0)));
}

/// Whether a graph capture is under way anywhere in the process.
pub fn capturing_somewhere() -> bool {
    CAPTURES.load(Acquire) > 0
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
