//! What every hook runs inside, in one place: [`hook`] is a panic boundary (no unwinding through
//! C), a per-thread re-entry guard (a hook entered from inside a hook goes straight to the
//! driver), and the process state (disabled, refused by a bad setting, or active). Plus the
//! helpers hooks use to write out-pointers and result codes.

use crate::base::cu::*;
use crate::driver::Driver;
use crate::state::{oom, Shim, State};
use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};

thread_local! {
    /// True while this thread runs a hook body.
    static IN_HOOK: Cell<bool> = const { Cell::new(false) };
}

/// Marks this thread as inside a hook until dropped. Holds the address of the thread's own
/// flag, so that leaving costs no second thread-local lookup (the raw pointer also keeps the
/// guard on its thread: it is neither `Send` nor `Sync`).
struct Reentry(*const Cell<bool>);

impl Reentry {
    /// `None` when this thread is already inside a hook.
    fn enter() -> Option<Reentry> {
        IN_HOOK.with(|f| (!f.replace(true)).then_some(Reentry(f)))
    }
}

impl Drop for Reentry {
    fn drop(&mut self) {
        // SAFETY: the flag of this thread, which outlives the guard: the guard lives inside a
        // hook call on this thread and cannot move to another.
        unsafe { (*self.0).set(false) }
    }
}

/// Whether a hook refuses (allocations, memory queries) or forwards (frees, teardown) when a
/// `CUDAPOOL_*` value was bad.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnBadConfig {
    Refuse,
    Forward,
}

/// Runs `body` against the active shim, or `real` against the driver when the shim is
/// disabled, re-entered, or (for `Forward` hooks) refused. Never unwinds.
pub(crate) fn hook(
    on_bad: OnBadConfig,
    real: impl FnOnce(&'static Driver) -> CUresult,
    body: impl Fn(&'static Shim) -> CUresult,
) -> CUresult {
    // No count of boundaries here (the hot path): a hook's body runs with `IN_HOOK` set, which
    // tells the panic hook the panic is one this boundary catches.
    catch_unwind(AssertUnwindSafe(|| {
        let forward = || match Driver::get() {
            Some(d) => real(d),
            None => {
                no_driver_said();
                CUDA_ERROR_NOT_INITIALIZED
            }
        };
        let Some(_guard) = Reentry::enter() else {
            return forward();
        };
        match Shim::state() {
            State::Active(shim) if on_bad == OnBadConfig::Refuse && oom::offered() => {
                with_handler(shim, &body)
            }
            State::Active(shim) => body(shim),
            State::Refused if on_bad == OnBadConfig::Refuse => CUDA_ERROR_NOT_INITIALIZED,
            _ => forward(),
        }
    }))
    .unwrap_or_else(|_| panicked())
}

/// `f`, or `None` when it panicked; meanwhile a panic on this thread is cudapool's to say
/// ([`install_panic_hook`]). For the C API's functions ([`boundary`]); hooks mark themselves
/// through `IN_HOOK` instead, which they set anyway.
fn catching<T>(f: impl FnOnce() -> T) -> Option<T> {
    struct Out;
    impl Drop for Out {
        fn drop(&mut self) {
            let _ = CATCHING.try_with(|c| c.set(c.get() - 1));
        }
    }
    CATCHING.with(|c| c.set(c.get() + 1));
    let _out = Out;
    catch_unwind(AssertUnwindSafe(f)).ok()
}

thread_local! {
    /// How many of the C API's panic boundaries this thread is inside ([`catching`]).
    static CATCHING: Cell<u32> = const { Cell::new(0) };
    /// What the last panic inside a boundary on this thread said, and where (the panic hook keeps
    /// it for [`panicked`]).
    static LAST_PANIC: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// Keeps what a panic inside cudapool's boundaries says for [`panicked`] instead of printing
/// it; any other panic (one of cudapool's own threads) goes to the hook there was before. The
/// hook is this library's own standard library's: a Rust program's panics never reach it.
/// Installed when the library loads.
pub fn install_panic_hook() {
    let before = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let in_hook = IN_HOOK.try_with(Cell::get).unwrap_or(false);
        if !in_hook && CATCHING.try_with(Cell::get).unwrap_or(0) == 0 {
            return before(info);
        }
        let payload = info.payload();
        let what = payload
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
            .unwrap_or("no message");
        let at = info
            .location()
            .map_or(String::new(), |l| format!(" at {}:{}", l.file(), l.line()));
        let _ = LAST_PANIC.try_with(|p| *p.borrow_mut() = Some(format!("{what}{at}")));
    }));
}

/// A panic caught at a boundary (a bug of cudapool's): counted, said in one line through
/// cudapool's logger (the first three; later ones are counted only), and from now on the
/// process's new allocations go to the driver directly (`base::flags::panics`). A hook's call
/// gets `CUDA_ERROR_UNKNOWN`; a function of the C API its documented failure.
#[cold]
#[inline(never)]
fn panicked() -> CUresult {
    let n = crate::base::flags::count_panic();
    if n <= 3 {
        let what = LAST_PANIC
            .try_with(|p| p.borrow_mut().take())
            .ok()
            .flatten()
            .unwrap_or_else(|| "no message".to_string());
        crate::log_at!(
            crate::base::config::LogLevel::Error,
            "internal error (a panic in cudapool: {what}): the call fails, and new allocations go to the driver directly from now on, uncached{}; please report it",
            if n == 3 { "; later panics are only counted (\"panics\" in the stats)" } else { "" }
        );
    }
    CUDA_ERROR_UNKNOWN
}

/// `body` with the program's out-of-memory handler offered (`state::oom`): an out-of-memory
/// answer it would give is held back; the handler runs outside this hook (what it frees goes
/// through cudapool) and may ask for one more try; whatever the program then receives is what
/// is counted and said.
#[cold]
#[inline(never)]
fn with_handler(shim: &'static Shim, body: &impl Fn(&'static Shim) -> CUresult) -> CUresult {
    let (r, found) = oom::deferring(|| body(shim));
    let Some((dev, bytes)) = found else {
        return r;
    };
    if r == CUDA_ERROR_OUT_OF_MEMORY && outside_hook(|| oom::call_handler(dev, bytes)) {
        shim.budget(dev).on_reclaim_retry();
        let (again, found) = oom::deferring(|| body(shim));
        if let Some((dev, bytes)) = found.filter(|_| again == CUDA_ERROR_OUT_OF_MEMORY) {
            shim.report_oom(dev, bytes);
        }
        return again;
    }
    shim.report_oom(dev, bytes);
    r
}

/// Runs `f` as if this thread were in no hook (calls it makes into hooked entry points go
/// through the shim again), then marks it back.
fn outside_hook<T>(f: impl FnOnce() -> T) -> T {
    let was = IN_HOOK.with(|c| c.replace(false));
    struct Back(bool);
    impl Drop for Back {
        fn drop(&mut self) {
            IN_HOOK.with(|c| c.set(self.0));
        }
    }
    let _back = Back(was);
    f()
}

/// Says once why a driver call gets "not initialized": cudapool cannot reach the driver.
fn no_driver_said() {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
        crate::log_at!(
            crate::base::config::LogLevel::Warn,
            "{}; until then every driver call gets CUDA_ERROR_NOT_INITIALIZED",
            Driver::open_failure()
        );
    }
}

/// A panic boundary for exported functions that are not driver hooks.
pub fn boundary<T>(fallback: T, f: impl FnOnce() -> T) -> T {
    catching(f).unwrap_or_else(|| {
        panicked();
        fallback
    })
}

/// Writes `v` through an out-pointer the hook checked to be non-null.
///
/// # Safety
/// `p` must be non-null and valid for a write of `T` (the driver's contract with the caller).
pub(crate) unsafe fn put<T>(p: *mut T, v: T) {
    // SAFETY: guaranteed by the caller.
    unsafe { p.write(v) }
}

/// Writes `v` through `p` unless `p` is NULL.
///
/// # Safety
/// `p` must be NULL or valid for a write of `T`.
pub(crate) unsafe fn put_some<T>(p: *mut T, v: T) {
    if !p.is_null() {
        // SAFETY: non-null, and valid by the caller's contract.
        unsafe { put(p, v) }
    }
}

pub(crate) fn to_result(r: Result<(), CUresult>) -> CUresult {
    r.err().unwrap_or(CUDA_SUCCESS)
}

/// The `CStr` of a symbol name given with its NUL (`concat!(stringify!(name), "\0")`), at compile
/// time.
pub const fn symbol(with_nul: &'static str) -> &'static std::ffi::CStr {
    match std::ffi::CStr::from_bytes_with_nul(with_nul.as_bytes()) {
        Ok(n) => n,
        Err(_) => panic!("a symbol name"),
    }
}
