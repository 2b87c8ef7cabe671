//! The `cudapool_*` C API (`include/cudapool.h`). Thread-safe; works preloaded or linked.
//! Every function has a panic boundary and returns a CUDA result code (0 = success) where it
//! returns an `int`.

use crate::abi::hooks::boundary;
use crate::base::cu::*;
use crate::limits::budget::{DeviceBudget, DeviceStats};
use crate::report::REPORTING;
use crate::state::command::{Answer, Command};
use crate::state::{Shim, View};
use std::ffi::{c_char, c_int, c_void, CStr};

/// Mirrors `cudapool_stats` in `include/cudapool.h`. Append fields only, never reorder:
/// `struct_size` lets an old caller keep working with a newer library and the reverse.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CudapoolStats {
    pub struct_size: usize,
    pub device: i32,
    /// `reserved_padding` in the header.
    pub _pad: u32,
    pub allocated_bytes: u64,
    pub peak_allocated_bytes: u64,
    pub reserved_bytes: u64,
    pub peak_reserved_bytes: u64,
    pub cached_bytes: u64,
    pub live_allocations: u64,
    pub segments: u64,
    pub alloc_calls: u64,
    pub free_calls: u64,
    pub cache_hits: u64,
    pub driver_allocs: u64,
    pub driver_frees: u64,
    pub reclaim_retries: u64,
    pub ooms: u64,
    pub hard_limit: u64,
    pub soft_limit: u64,
    /// What the program asked for of `allocated_bytes`, before rounding (appended: a caller
    /// built against an older header gets a `struct_size` that stops before them).
    pub requested_bytes: u64,
    pub peak_requested_bytes: u64,
    /// Of `reserved_bytes`: what the driver took for the process besides its allocations
    /// (appended after the requested bytes).
    pub overhead_bytes: u64,
    /// Device memory asleep, on the host (appended after the overhead), and the process's
    /// sleep state (`CUDAPOOL_STATE_AWAKE` ... `CUDAPOOL_STATE_WAKING`).
    pub asleep_bytes: u64,
    pub sleep_state: u64,
    /// Panics caught at cudapool's boundary in the process (appended after the sleep state).
    pub panics: u64,
}

impl CudapoolStats {
    fn from_stats(device: i32, s: &DeviceStats) -> Self {
        CudapoolStats {
            struct_size: std::mem::size_of::<CudapoolStats>(),
            device,
            _pad: 0,
            allocated_bytes: s.allocated,
            peak_allocated_bytes: s.allocated_peak,
            reserved_bytes: s.reserved,
            peak_reserved_bytes: s.reserved_peak,
            cached_bytes: s.cached,
            live_allocations: s.live_allocations,
            segments: s.segments,
            alloc_calls: s.alloc_calls,
            free_calls: s.free_calls,
            cache_hits: s.cache_hits,
            driver_allocs: s.driver_allocs,
            driver_frees: s.driver_frees,
            reclaim_retries: s.reclaim_retries,
            ooms: s.ooms,
            hard_limit: s.hard_limit,
            soft_limit: s.soft_limit,
            requested_bytes: s.requested,
            peak_requested_bytes: s.requested_peak,
            overhead_bytes: s.overhead,
            asleep_bytes: s.asleep,
            sleep_state: s.sleep_state,
            panics: s.panics,
        }
    }
}

/// Sum over the devices seen; limits are per device, so the sum reports none.
fn all_devices(shim: &Shim) -> DeviceStats {
    let mut t = DeviceStats::default();
    for d in shim.devices_seen() {
        let s = shim.device_stats(d);
        t.allocated += s.allocated;
        t.allocated_peak += s.allocated_peak;
        t.requested += s.requested;
        t.requested_peak += s.requested_peak;
        t.overhead += s.overhead;
        t.reserved += s.reserved;
        t.reserved_peak += s.reserved_peak;
        t.cached += s.cached;
        t.live_allocations += s.live_allocations;
        t.segments += s.segments;
        t.alloc_calls += s.alloc_calls;
        t.free_calls += s.free_calls;
        t.cache_hits += s.cache_hits;
        t.driver_allocs += s.driver_allocs;
        t.driver_frees += s.driver_frees;
        t.reclaim_retries += s.reclaim_retries;
        t.ooms += s.ooms;
        t.asleep += s.asleep;
        t.sleep_state = s.sleep_state;
        t.panics = s.panics;
    }
    t
}

fn valid_device(device: c_int) -> bool {
    (-1..crate::state::MAX_DEVICES as c_int).contains(&device)
}

/// Whether the process has `device` (-1: every device, always): an ordinal below the driver's
/// device count, as the program sees it (after `CUDA_VISIBLE_DEVICES`). Before the program
/// initialised the driver, the count is unknown: any ordinal cudapool can hold is taken.
fn has_device(shim: &Shim, device: c_int) -> bool {
    match shim.driver.device_count() {
        Some(n) => device == -1 || (0..n).contains(&device),
        None => valid_device(device),
    }
}

/// The `struct_size` the caller set at `out` (a struct of the header that starts with it), if
/// `out` is not NULL and the size covers at least that field and the device.
///
/// # Safety
/// `out` is NULL or points to a struct of the header whose `struct_size` the caller set.
unsafe fn caller_size<T>(out: *mut T) -> Option<usize> {
    const HEADER: usize = std::mem::size_of::<usize>() + 8;
    if out.is_null() {
        return None;
    }
    // SAFETY: non-null; the struct starts with the caller's size_t struct_size.
    let theirs = unsafe { *(out as *const usize) };
    (theirs >= HEADER).then_some(theirs)
}

/// Copies `ours` to `out`, at most the `theirs` bytes the caller sized it for, with its
/// `struct_size` (its first field) set to the number copied: a program built against an older or
/// newer header gets the fields both know.
///
/// # Safety
/// `out` is valid for `theirs` bytes of writes; `T` is `repr(C)` and starts with a `usize`.
unsafe fn write_sized<T>(out: *mut T, mut ours: T, theirs: usize) {
    let n = theirs.min(std::mem::size_of::<T>());
    // SAFETY: T starts with its usize struct_size (caller's contract).
    unsafe { *(&mut ours as *mut T as *mut usize) = n };
    // SAFETY: the caller owns `theirs` >= n writable bytes at `out`; `ours` is a local value of
    // at least n bytes; the two cannot overlap.
    unsafe { std::ptr::copy_nonoverlapping((&ours as *const T).cast::<u8>(), out.cast::<u8>(), n) };
}

/// Fills `*out` for `device` (-1: summed over devices). `out->struct_size` must be set by the
/// caller; at most that many bytes are written, and it is set to the number written.
///
/// # Safety
/// Pointers are NULL or valid for the sizes the header documents.
#[no_mangle]
pub unsafe extern "C" fn cudapool_get_stats(device: c_int, out: *mut CudapoolStats) -> c_int {
    boundary(CUDA_ERROR_UNKNOWN as c_int, || {
        // SAFETY: `out` is NULL or the caller's sized struct (this function's contract).
        let Some(theirs) = (unsafe { caller_size(out) }).filter(|_| valid_device(device)) else {
            return CUDA_ERROR_INVALID_VALUE as c_int;
        };
        let Some(shim) = Shim::active() else {
            return CUDA_ERROR_NOT_INITIALIZED as c_int;
        };
        if !has_device(shim, device) {
            return CUDA_ERROR_INVALID_VALUE as c_int;
        }
        // A query is a good moment to refresh what `cudapool stat` shows.
        REPORTING.publish(shim);
        let s = if device < 0 {
            all_devices(shim)
        } else {
            shim.device_stats(device)
        };
        // SAFETY: the caller sized `out` for `theirs` bytes; CudapoolStats is repr(C) and starts
        // with its usize struct_size.
        unsafe { write_sized(out, CudapoolStats::from_stats(device, &s), theirs) };
        CUDA_SUCCESS as c_int
    })
}

/// `cudapool_group_stats` of `include/cudapool.h`: the process's group on one GPU.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CudapoolGroupStats {
    pub struct_size: usize,
    pub device: i32,
    pub reserved_padding: u32,
    pub members: u64,
    pub reserved_bytes: u64,
    pub limit: u64,
    pub process_reserved_bytes: u64,
    pub name: [u8; 72],
}

/// Fills `*out` with the group's figures on `device`, as `cudapool_get_stats` does (struct
/// size first). `CUDA_ERROR_NOT_SUPPORTED` when the process is in no group.
///
/// # Safety
/// Pointers are NULL or valid for the sizes the header documents.
#[no_mangle]
pub unsafe extern "C" fn cudapool_get_group_stats(
    device: c_int,
    out: *mut CudapoolGroupStats,
) -> c_int {
    boundary(CUDA_ERROR_UNKNOWN as c_int, || {
        // SAFETY: `out` is NULL or the caller's sized struct (this function's contract).
        let Some(theirs) =
            (unsafe { caller_size(out) }).filter(|_| valid_device(device) && device >= 0)
        else {
            return CUDA_ERROR_INVALID_VALUE as c_int;
        };
        let Some(shim) = Shim::active() else {
            return CUDA_ERROR_NOT_INITIALIZED as c_int;
        };
        if !has_device(shim, device) {
            return CUDA_ERROR_INVALID_VALUE as c_int;
        }
        let (Some(name), Some(g)) = (shim.group_name(), shim.group_figures(device)) else {
            return CUDA_ERROR_NOT_SUPPORTED as c_int;
        };
        let mut ours = CudapoolGroupStats {
            struct_size: 0,
            device,
            reserved_padding: 0,
            members: g.members,
            reserved_bytes: g.reserved,
            limit: g.limit,
            process_reserved_bytes: shim.device_stats(device).reserved,
            name: [0; 72],
        };
        let n = name.len().min(71);
        ours.name[..n].copy_from_slice(&name.as_bytes()[..n]);
        // SAFETY: the caller sized `out` for `theirs` bytes; CudapoolGroupStats is repr(C) and
        // starts with its usize struct_size.
        unsafe { write_sized(out, ours, theirs) };
        CUDA_SUCCESS as c_int
    })
}

/// Gives every cached block on `device` (-1: every device) back to the driver, after waiting
/// for the device work that may still touch them; returns the bytes released.
#[no_mangle]
pub extern "C" fn cudapool_reclaim(device: c_int) -> usize {
    boundary(0, || match Shim::active() {
        Some(shim) if has_device(shim, device) => shim.reclaim_device(device) as usize,
        _ => 0,
    })
}

/// Puts the process's memory on `device` (-1: every device) to sleep once its device work has
/// drained, and returns when it is asleep (see `state::sleep`). 0, or: 1 a bad device, 3 not
/// active, 600 (`CUDA_ERROR_NOT_READY`) work did not drain within 30 s (a capture under way),
/// 2 no host memory for the copy; the process then stays awake and a line says why.
#[no_mangle]
pub extern "C" fn cudapool_sleep(device: c_int) -> c_int {
    boundary(CUDA_ERROR_UNKNOWN as c_int, || {
        let Some(shim) = Shim::active() else {
            return CUDA_ERROR_NOT_INITIALIZED as c_int;
        };
        if !valid_device(device) || !has_device(shim, device) {
            return CUDA_ERROR_INVALID_VALUE as c_int;
        }
        match shim.serve(Command::Sleep {
            device,
            timeout: crate::state::sleep::DRAIN_TIMEOUT,
            cause: crate::state::sleep::Cause::Program,
        }) {
            Answer::Refused(r) => {
                crate::log_at!(crate::base::config::LogLevel::Warn, "sleep: {}", r.why);
                r.code as c_int
            }
            _ => CUDA_SUCCESS as c_int,
        }
    })
}

/// Wakes the process and returns when its memory is back (0), or 2 when no room came within
/// `CUDAPOOL_WAKE_TIMEOUT` (the contents stay on the host), 3 not active, 1 for a device the
/// machine does not have. Any device (or -1) wakes every device's memory.
#[no_mangle]
pub extern "C" fn cudapool_wake(device: c_int) -> c_int {
    boundary(CUDA_ERROR_UNKNOWN as c_int, || {
        let Some(shim) = Shim::active() else {
            return CUDA_ERROR_NOT_INITIALIZED as c_int;
        };
        if !valid_device(device) || !has_device(shim, device) {
            return CUDA_ERROR_INVALID_VALUE as c_int;
        }
        shim.serve(Command::Wake).code() as c_int
    })
}

/// Applies `f` to the budget of `device`, or of every device used so far for -1.
fn with_budgets(device: c_int, f: impl Fn(&DeviceBudget)) -> c_int {
    boundary(CUDA_ERROR_UNKNOWN as c_int, || {
        if !valid_device(device) {
            return CUDA_ERROR_INVALID_VALUE as c_int;
        }
        let Some(shim) = Shim::active() else {
            return CUDA_ERROR_NOT_INITIALIZED as c_int;
        };
        if !has_device(shim, device) {
            return CUDA_ERROR_INVALID_VALUE as c_int;
        }
        let devices = if device < 0 {
            shim.devices_seen()
        } else {
            vec![device]
        };
        for d in devices {
            f(shim.budget(d));
        }
        CUDA_SUCCESS as c_int
    })
}

/// Sets the peaks of `device` (-1: every device used so far) to the current values.
#[no_mangle]
pub extern "C" fn cudapool_reset_peak_stats(device: c_int) -> c_int {
    with_budgets(device, DeviceBudget::reset_peaks)
}

/// Sets the hard limit of `device` (-1: every device used so far); 0 removes it.
#[no_mangle]
pub extern "C" fn cudapool_set_memory_limit(device: c_int, bytes: usize) -> c_int {
    let r = with_budgets(device, |b| b.set_hard_limit(bytes as u64));
    if r == CUDA_SUCCESS as c_int {
        boundary((), || {
            if let Some(shim) = Shim::active() {
                let devices = if device < 0 {
                    shim.devices_seen()
                } else {
                    vec![device]
                };
                for d in devices {
                    shim.event(d, "limit", bytes as u64);
                }
            }
        });
    }
    r
}

/// Sets hard limits from text in any form `CUDAPOOL_MEMORY_LIMIT` takes, with the library's own
/// parser (the Python package's `set_memory_limit` comes here): a SIZE or a percentage of the
/// device's memory for `device` (-1: every device used so far), or a per-device list
/// (`0=8GiB,1=50%`, with `device` -1) for the devices it names. 0 on success; 1 with `why`
/// filled (snprintf-style, NUL-terminated when `why_len` > 0) for a bad value or a device the
/// process does not have; 3 when the shim is not active. Nothing is set unless all of it is
/// good.
///
/// # Safety
/// `limit` is NULL or NUL-terminated; `why` is NULL or valid for `why_len` bytes of writes.
#[no_mangle]
pub unsafe extern "C" fn cudapool_set_memory_limit_text(
    device: c_int,
    limit: *const c_char,
    why: *mut c_char,
    why_len: usize,
) -> c_int {
    boundary(CUDA_ERROR_UNKNOWN as c_int, || {
        let say = |text: String| {
            if !why.is_null() && why_len > 0 {
                let n = text.len().min(why_len - 1);
                // SAFETY: the caller provides `why_len` writable bytes at `why`; n + 1 <= why_len.
                unsafe {
                    std::ptr::copy_nonoverlapping(text.as_ptr(), why.cast::<u8>(), n);
                    *why.add(n) = 0;
                }
            }
            CUDA_ERROR_INVALID_VALUE as c_int
        };
        if limit.is_null() {
            return say("no limit given".into());
        }
        // SAFETY: non-null and NUL-terminated by the caller's contract.
        let text = unsafe { CStr::from_ptr(limit) }
            .to_string_lossy()
            .into_owned();
        let Some(shim) = Shim::active() else {
            // `why` is written for every answer but success.
            say("cudapool is loaded but not active (CUDAPOOL_DISABLE, a bad CUDAPOOL_* value, or no driver yet)".into());
            return CUDA_ERROR_NOT_INITIALIZED as c_int;
        };
        let limits = match crate::base::config::parse_device_limits(&text) {
            Ok(l) => l,
            Err(e) => {
                return say(format!(
                    "invalid limit {text:?}: {e}; accepted: {}",
                    crate::base::config::SIZE_FORMS
                ))
            }
        };
        let mut plan: Vec<(c_int, crate::base::config::Limit)> = Vec::new();
        match limits.all {
            Some(l) => {
                if !has_device(shim, device) {
                    return say(format!("device {device}: not a device of this process"));
                }
                let devices = if device < 0 {
                    shim.devices_seen()
                } else {
                    vec![device]
                };
                plan.extend(devices.into_iter().map(|d| (d, l)));
            }
            None => {
                if device != -1 {
                    return say(format!(
                        "{text:?} is a per-device list: it names its devices (give device -1)"
                    ));
                }
                for &(d, l) in &limits.per_device {
                    let d = d as c_int;
                    if !has_device(shim, d) {
                        return say(format!("device {d}: not a device of this process"));
                    }
                    plan.push((d, l));
                }
            }
        }
        for (d, l) in plan {
            let total = shim.driver.device_total_mem(d).unwrap_or(0);
            let bytes = l.resolve(total);
            shim.budget(d).set_hard_limit(bytes);
            shim.event(d, "limit", bytes);
        }
        CUDA_SUCCESS as c_int
    })
}

/// Installs the program's out-of-memory handler (`NULL`: none); see `state::oom`.
#[no_mangle]
pub extern "C" fn cudapool_set_oom_handler(
    handler: Option<crate::state::oom::OomHandler>,
    user_data: *mut c_void,
) -> c_int {
    boundary(CUDA_ERROR_UNKNOWN as c_int, || {
        crate::state::oom::set_handler(handler, user_data);
        CUDA_SUCCESS as c_int
    })
}

/// The status text, snprintf-style: writes at most `len` bytes including the NUL and returns
/// the length the whole text needs (without the NUL), or -1 if the shim is not active.
///
/// # Safety
/// Pointers are NULL or valid for the sizes the header documents.
#[no_mangle]
pub unsafe extern "C" fn cudapool_memory_status(buf: *mut c_char, len: usize) -> c_int {
    boundary(-1, || {
        let Some(shim) = Shim::active() else {
            return -1;
        };
        let text = crate::report::memory_status(shim);
        if !buf.is_null() && len > 0 {
            let n = text.len().min(len - 1);
            // SAFETY: the caller provides `len` writable bytes at `buf`; n + 1 <= len.
            unsafe {
                std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), n);
                *buf.add(n) = 0;
            }
        }
        c_int::try_from(text.len()).unwrap_or(c_int::MAX)
    })
}

/// Writes `bytes(shim)` to `path` (the snapshots' common part): 0, or the error code.
fn write_snapshot(
    path: *const c_char,
    bytes: impl FnOnce(&Shim) -> Result<Vec<u8>, String>,
) -> c_int {
    if path.is_null() {
        return CUDA_ERROR_INVALID_VALUE as c_int;
    }
    // SAFETY: non-null and NUL-terminated by the caller's contract.
    let Ok(path) = unsafe { CStr::from_ptr(path) }.to_str() else {
        return CUDA_ERROR_INVALID_VALUE as c_int;
    };
    let Some(shim) = Shim::active() else {
        return CUDA_ERROR_NOT_INITIALIZED as c_int;
    };
    REPORTING.write_trace(shim);
    let path = std::path::Path::new(path);
    match bytes(shim).and_then(|b| crate::base::outfile::write(path, &b)) {
        Ok(_) => CUDA_SUCCESS as c_int,
        Err(e) => {
            crate::base::log::line(&format!("cannot write snapshot: {e}"));
            304
        }
    }
}

/// Writes the snapshot JSON to `path`. 0 on success; 1 (`CUDA_ERROR_INVALID_VALUE`) for a NULL
/// or non-UTF-8 path; 304 (`CUDA_ERROR_OPERATING_SYSTEM`) when the file cannot be written;
/// 3 when the shim is not active.
///
/// # Safety
/// `path` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn cudapool_snapshot(path: *const c_char) -> c_int {
    boundary(CUDA_ERROR_UNKNOWN as c_int, || {
        write_snapshot(path, |shim| {
            Ok(crate::report::snapshot_json(shim).into_bytes())
        })
    })
}

/// Writes the snapshot as PyTorch's snapshot pickle to `path` (`report::torch`). Returns as
/// [`cudapool_snapshot`].
///
/// # Safety
/// `path` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn cudapool_snapshot_torch(path: *const c_char) -> c_int {
    boundary(CUDA_ERROR_UNKNOWN as c_int, || {
        write_snapshot(path, |shim| crate::report::torch::snapshot_torch(shim))
    })
}

static VERSION: &CStr =
    match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
        Ok(v) => v,
        Err(_) => panic!("version string"),
    };

/// The library's version, e.g. "0.1.0". Static storage; never free it.
#[no_mangle]
pub extern "C" fn cudapool_version() -> *const c_char {
    VERSION.as_ptr()
}

/// Debug builds only (the test suite's library, never a release): the next pooled allocation
/// panics inside cudapool, as a bug would, so that a test sees what a panic does.
#[cfg(debug_assertions)]
#[no_mangle]
pub extern "C" fn cudapool_debug_panic_next() {
    crate::base::flags::PANIC_ARMED.store(true, std::sync::atomic::Ordering::Relaxed);
}
