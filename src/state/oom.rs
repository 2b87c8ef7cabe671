//! The moment of out-of-memory: the program's handler (`cudapool_set_oom_handler`), and what
//! an out-of-memory answer the program receives leaves behind (counted, said in one line, and
//! handed to the observer, which writes `CUDAPOOL_OOM_SNAPSHOT`).
//!
//! **The handler** runs on the allocating thread, outside every hook (what it frees or
//! allocates goes through cudapool as any call does) and with no cudapool lock held, after
//! cudapool's own reclaim failed and before the program gets `CUDA_ERROR_OUT_OF_MEMORY`. A
//! non-zero return asks for one more try, counted as a reclaim retry. An allocation hook that
//! can offer it *defers* the out-of-memory answers found meanwhile ([`deferring`]): they are
//! kept on the thread, not yet counted nor said, until it is known whether the program receives
//! one. A handler never runs inside itself: an allocation it makes that fails gets its answer
//! at once.

use super::Shim;
use crate::base::cu::CUdevice;
use std::cell::Cell;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// `cudapool_oom_handler` of `include/cudapool.h`.
pub type OomHandler = unsafe extern "C" fn(c_int, usize, *mut c_void) -> c_int;

/// The handler and its user data (an address).
static HANDLER: Mutex<Option<(OomHandler, usize)>> = Mutex::new(None);
/// Whether a handler is set: what every allocation hook asks (one relaxed load: the hot path
/// never takes the lock above).
static SET: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// `Some` while a hook defers out-of-memory answers: the first one found, if any.
    static DEFERRED: Cell<Option<Option<(CUdevice, u64)>>> = const { Cell::new(None) };
    /// True while this thread runs the handler.
    static IN_HANDLER: Cell<bool> = const { Cell::new(false) };
}

/// Sets the handler (`None` removes it).
pub fn set_handler(h: Option<OomHandler>, user_data: *mut c_void) {
    let mut slot = crate::base::sync::lock(&HANDLER);
    *slot = h.map(|h| (h, user_data as usize));
    SET.store(slot.is_some(), Ordering::Release);
}

/// Whether a handler may run on this thread now (one is set, and this thread is not in it).
#[inline]
pub fn offered() -> bool {
    SET.load(Ordering::Relaxed) && not_in_handler()
}

/// Apart, so that the thread-local lookup is made only when a handler is set (inlined, the
/// compiler hoists it above the test: one more lookup on every allocation).
#[cold]
#[inline(never)]
fn not_in_handler() -> bool {
    !IN_HANDLER.with(|c| c.get())
}

/// Runs `f` deferring the out-of-memory answers it finds; its result and the first one found.
pub fn deferring<T>(f: impl FnOnce() -> T) -> (T, Option<(CUdevice, u64)>) {
    let outer = DEFERRED.with(|d| d.replace(Some(None)));
    let r = f();
    let found = DEFERRED.with(|d| d.replace(outer)).flatten();
    (r, found)
}

/// Records an out-of-memory answer if this thread defers them; whether it did.
fn defer(dev: CUdevice, asked: u64) -> bool {
    DEFERRED.with(|d| match d.get() {
        Some(None) => {
            d.set(Some(Some((dev, asked))));
            true
        }
        Some(Some(_)) => true,
        None => false,
    })
}

/// Calls the handler for `bytes` on `dev` (the caller has left its hook); whether it asks for
/// one more try.
pub fn call_handler(dev: CUdevice, bytes: u64) -> bool {
    let Some((h, data)) = *crate::base::sync::lock(&HANDLER) else {
        return false;
    };
    IN_HANDLER.with(|c| c.set(true));
    // SAFETY: a handler the program installed with its own user data, called as
    // `cudapool_oom_handler` documents it.
    let again = unsafe { h(dev, bytes as usize, data as *mut c_void) } != 0;
    IN_HANDLER.with(|c| c.set(false));
    again
}

impl Shim {
    /// An out-of-memory answer is about to reach the program, unless this thread defers it
    /// (then it is kept for [`report_oom`](Self::report_oom)). Whether it was deferred.
    pub(crate) fn deferred_oom(&self, dev: CUdevice, asked: u64) -> bool {
        defer(dev, asked)
    }
}
