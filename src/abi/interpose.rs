//! How the program reaches the hooks (docs/design.md, trap 1). Three ways:
//! 1. exported `cu*` symbols (`hooks`), for programs linked with `-lcuda`;
//! 2. an overridden `dlsym`, for `dlopen("libcuda.so.1")` + `dlsym(handle, name)` (PyTorch,
//!    CuPy, JAX, Numba);
//! 3. `cuGetProcAddress` / `_v2` wrappers, for the CUDA runtime and anything else that asks
//!    the driver for its entry points by base name, version and flags.
//!
//! Ways 2 and 3 call the real lookup with the caller's exact arguments and then substitute a
//! hook only when the answer is *exactly* the real function that hook replaces (pointer
//! identity). So `cudaVersion`, `_ptsz`/`_ptds` flags and `symbolStatus` stay the driver's, and
//! a lookup never returns NULL where the driver returned a function.

use crate::abi::hooks::boundary;
use crate::base::cu::*;
use crate::driver::{self, call, Driver};
use crate::state::{Shim, State};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

/// (real driver function, hook) address pairs, built once the driver is open.
static SUBSTITUTES: OnceLock<Vec<(usize, usize)>> = OnceLock::new();

/// Every hook and the driver name it replaces: the C ABI's (`hooks::table`) and this file's
/// own `cuGetProcAddress` wrappers.
fn hooks() -> &'static [(&'static CStr, usize)] {
    static ALL: OnceLock<Vec<(&'static CStr, usize)>> = OnceLock::new();
    ALL.get_or_init(|| {
        crate::abi::hooks::table()
            .into_iter()
            .map(|(n, h)| (n, h as usize))
            .chain([
                (
                    c"cuGetProcAddress_v2",
                    cuGetProcAddress_v2 as *const () as usize,
                ),
                (c"cuGetProcAddress", cuGetProcAddress as *const () as usize),
            ])
            .collect()
    })
}

/// Whether `name` is one the shim replaces. Cheap: the override runs for every `dlsym`.
fn is_hooked_name(name: &CStr) -> bool {
    let b = name.to_bytes();
    b.starts_with(b"cu") && hooks().iter().any(|(n, _)| *n == name)
}

/// The hook for `p` if `p` is a real driver function the shim replaces; `p` otherwise.
pub fn substitute(p: *mut c_void) -> *mut c_void {
    if p.is_null() || matches!(Shim::state(), State::PassThrough | State::NoDriver) {
        return p;
    }
    // `None` while this thread is inside the driver's dlopen: answer plainly then.
    let Some(drv) = Driver::get() else {
        return p;
    };
    let table = SUBSTITUTES.get_or_init(|| {
        hooks()
            .iter()
            .filter_map(|&(name, hook)| {
                // SAFETY: the driver's handle, from dlopen, never closed.
                let real = unsafe { driver::lookup(drv.handle as *mut c_void, name) };
                (!real.is_null()).then_some((real as usize, hook))
            })
            .collect()
    });
    match table.iter().find(|(real, _)| *real == p as usize) {
        Some(&(_, hook)) => hook as *mut c_void,
        None => p,
    }
}

// ---- per-thread default streams --------------------------------------------------------
//
// Work on a per-thread default stream goes to a queue of the calling thread's own (see
// `queues`). The work hooks (`work`) report it like any other; the per-thread entry points
// that issue no work that matters are handed out as they are (`work::HARMLESS_PER_THREAD`).
// Any other `_ptsz`/`_ptds` entry point, one cudapool does not know, might issue work it
// cannot place: it is handed out behind a trampoline that sets `flags::UNWATCHED_WORK` (so
// reuse waits for fences from then on) and jumps on to the real function. The program obtains
// those entry points by name (`dlsym`) or through `cuGetProcAddress` with the per-thread flag.
// A trampoline is a few instructions of assembly, so one kind serves every signature.

const TRAMPOLINES: usize = 256;
/// The real function each trampoline jumps to (0: slot unused).
static TRAMPOLINE_TARGETS: [AtomicUsize; TRAMPOLINES] =
    [const { AtomicUsize::new(0) }; TRAMPOLINES];
/// Real functions by slot, for handing out the same trampoline to repeated lookups.
static TRAMPOLINE_SLOTS: Mutex<Vec<usize>> = Mutex::new(Vec::new());

// Slot i, 16 bytes at __cudapool_ptds_trampolines + 16*i: set the flag, jump to target i.
#[cfg(target_arch = "x86_64")]
core::arch::global_asm!(
    ".pushsection .text.cudapool_trampolines,\"ax\",@progbits",
    ".balign 16",
    ".globl __cudapool_ptds_trampolines",
    "__cudapool_ptds_trampolines:",
    ".set cudapool_slot, 0",
    ".rept 256",
    "mov byte ptr [rip + {flag}], 1",
    "jmp qword ptr [rip + {targets} + 8 * cudapool_slot]",
    ".balign 16",
    ".set cudapool_slot, cudapool_slot + 1",
    ".endr",
    ".popsection",
    flag = sym crate::base::flags::UNWATCHED_WORK,
    targets = sym TRAMPOLINE_TARGETS,
);

extern "C" {
    static __cudapool_ptds_trampolines: [u8; 16 * TRAMPOLINES];
}

fn is_per_thread_name(name: &[u8]) -> bool {
    name.starts_with(b"cu") && (name.ends_with(b"_ptsz") || name.ends_with(b"_ptds"))
}

/// Whether a per-thread entry point of this name issues no work that matters to reuse.
fn is_harmless(name: &[u8]) -> bool {
    crate::abi::hooks::work::HARMLESS_PER_THREAD
        .iter()
        .any(|h| h.as_bytes() == name)
}

/// The trampoline for the real per-thread entry point `real`. With every slot taken, the flag
/// is set now (the safe side) and `real` is handed out as it is.
fn trampoline(real: *mut c_void) -> *mut c_void {
    let mut slots = crate::base::sync::lock(&TRAMPOLINE_SLOTS);
    let slot = match slots.iter().position(|&r| r == real as usize) {
        Some(i) => i,
        None if slots.len() < TRAMPOLINES => {
            let i = slots.len();
            // The target is in place before anyone can call the slot.
            TRAMPOLINE_TARGETS[i].store(real as usize, Ordering::Release);
            slots.push(real as usize);
            i
        }
        None => {
            crate::base::flags::set_unwatched_work();
            return real;
        }
    };
    // SAFETY: only the address of the trampoline bank is taken; slot < TRAMPOLINES.
    unsafe { (&raw const __cudapool_ptds_trampolines as *const u8).add(16 * slot) as *mut c_void }
}

/// Whether the driver function at `p` is a per-thread-default-stream variant that needs the
/// trampoline (by the name the driver exports it under).
fn needs_trampoline(p: *mut c_void) -> bool {
    // SAFETY: dladdr only reads the loader's tables; `info` is a plain out-struct.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    if unsafe { libc::dladdr(p, &mut info) } == 0 || info.dli_saddr != p || info.dli_sname.is_null()
    {
        return false;
    }
    // SAFETY: dladdr returned a NUL-terminated symbol name of a loaded object.
    let name = unsafe { CStr::from_ptr(info.dli_sname) }.to_bytes();
    is_per_thread_name(name) && !is_harmless(name)
}

/// What a lookup of a driver function hands out: a hook, a per-thread trampoline, or `p`.
fn hand_out(p: *mut c_void, per_thread: bool) -> *mut c_void {
    let s = substitute(p);
    if s != p || p.is_null() || !per_thread {
        return s;
    }
    if matches!(Shim::state(), State::PassThrough | State::NoDriver) {
        return p;
    }
    trampoline(p)
}

// ---- dlsym ------------------------------------------------------------------------------

/// The override. `dlsym(RTLD_NEXT, ...)` resolves relative to its *caller*, which glibc reads
/// from the return address; so that path jumps (not calls) into glibc's `dlsym`, leaving the
/// caller's return address in place. Every other handle goes to [`dlsym_hooked`].
///
/// # Safety
/// `dlsym`'s contract: a valid handle or pseudo-handle and a NUL-terminated name.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    core::arch::naked_asm!(
        "cmp rdi, -1",
        "jne {hooked}",
        "mov rax, qword ptr [rip + {real}]",
        "test rax, rax",
        "jz 2f",
        "jmp rax",
        // First use, before anything resolved glibc's dlsym: resolve it, keeping the
        // arguments and a 16-byte aligned stack, then jump as above.
        "2:",
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {resolve}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "jmp rax",
        hooked = sym dlsym_hooked,
        real = sym driver::REAL_DLSYM,
        resolve = sym driver::resolve_real_dlsym,
    )
}

#[cfg(not(target_arch = "x86_64"))]
compile_error!("cudapool's dlsym override is written for x86_64 only");

/// `dlsym` for every handle but `RTLD_NEXT`: the real answer, substituted when it is a
/// function the shim replaces.
extern "C" fn dlsym_hooked(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    // SAFETY: glibc's dlsym with the caller's own arguments.
    let p = unsafe { driver::real_dlsym()(handle, symbol) };
    if p.is_null() || symbol.is_null() {
        return p;
    }
    boundary(p, || {
        // SAFETY: dlsym's contract: `symbol` is a NUL-terminated string.
        let name = unsafe { CStr::from_ptr(symbol) };
        if is_hooked_name(name) {
            substitute(p)
        } else if name.to_bytes().starts_with(b"nvmlDeviceGetMemoryInfo") {
            crate::abi::hooks::nvml::substitute(name, p).unwrap_or(p)
        } else if is_per_thread_name(name.to_bytes()) && !is_harmless(name.to_bytes()) {
            hand_out(p, true)
        } else {
            p
        }
    })
}

// ---- cuGetProcAddress -------------------------------------------------------------------

/// Substitutes in `*pfn` after a successful real lookup of `symbol`.
///
/// # Safety
/// `pfn` is the caller's out-pointer: NULL or valid for reads and writes; `symbol` is NULL or
/// NUL-terminated.
unsafe fn substitute_out(
    r: CUresult,
    symbol: *const c_char,
    version: c_int,
    flags: u64,
    pfn: *mut *mut c_void,
) -> CUresult {
    if r != CUDA_SUCCESS || pfn.is_null() {
        return r;
    }
    // SAFETY: non-null and valid by the caller's contract with the driver.
    let (before, after) = unsafe {
        let before = *pfn;
        let per_thread = flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM != 0
            && !before.is_null()
            && needs_trampoline(before);
        *pfn = hand_out(before, per_thread);
        (before, *pfn)
    };
    let is_hook = |p: *mut c_void| hooks().iter().any(|&(_, h)| h == p as usize);
    if before == after
        && !is_hook(after)
        && !crate::base::flags::unwatched_work()
        && !symbol.is_null()
        && crate::base::log::enabled(crate::base::config::LogLevel::Info)
    {
        // SAFETY: non-null, NUL-terminated by the driver's contract.
        let name = unsafe { CStr::from_ptr(symbol) };
        let hooked = |n: &CStr| is_hooked_name(n);
        let v2 = std::ffi::CString::new([name.to_bytes(), b"_v2"].concat()).ok();
        if hooked(name) || v2.as_deref().is_some_and(hooked) {
            crate::base::log::line(&format!(
                "cuGetProcAddress({name:?}, {version}, {flags}) gave an entry point cudapool does not know; calls through it bypass the shim"
            ));
        }
    }
    r
}

/// `cuGetProcAddress` (CUDA 11.3+). Also what a lookup of "cuGetProcAddress" itself gets.
///
/// # Safety
/// The driver's contract: `symbol` NUL-terminated, `pfn` (and `symbolStatus`) NULL or
/// valid for writes.
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
) -> CUresult {
    boundary(CUDA_ERROR_UNKNOWN, || {
        let Some(d) = Driver::get() else {
            return CUDA_ERROR_NOT_INITIALIZED;
        };
        let r = call!(d, get_proc_address_v1(symbol, pfn, cuda_version, flags));
        // SAFETY: the caller's own arguments, passed on unchanged.
        unsafe { substitute_out(r, symbol, cuda_version, flags, pfn) }
    })
}

/// `cuGetProcAddress_v2` (CUDA 12.0+), with `symbolStatus`.
///
/// # Safety
/// The driver's contract: `symbol` NUL-terminated, `pfn` (and `symbolStatus`) NULL or
/// valid for writes.
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
    symbol_status: *mut c_int,
) -> CUresult {
    boundary(CUDA_ERROR_UNKNOWN, || {
        let Some(d) = Driver::get() else {
            return CUDA_ERROR_NOT_INITIALIZED;
        };
        let r = call!(
            d,
            get_proc_address_v2(symbol, pfn, cuda_version, flags, symbol_status)
        );
        // SAFETY: the caller's own arguments, passed on unchanged.
        unsafe { substitute_out(r, symbol, cuda_version, flags, pfn) }
    })
}
