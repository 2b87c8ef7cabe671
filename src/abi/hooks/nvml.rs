//! NVML's memory figures through the budget (`state::nvml` decides them): the exported
//! `nvmlDeviceGetMemoryInfo` and `nvmlDeviceGetMemoryInfo_v2`, reached by a program linked
//! against `libnvidia-ml.so.1` (the preloaded library's symbols come first) and by one that
//! looks them up with `dlsym` (pynvml; `interpose`'s override hands these out). Each calls the
//! real NVML first, then rewrites the figures of a GPU with a limit; any failure leaves NVML's
//! own answer as it was.

use super::guard::boundary;
use crate::driver;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::atomic::{AtomicPtr, Ordering};

type NvmlReturn = c_int;
const NVML_SUCCESS: NvmlReturn = 0;
const NVML_ERROR_UNKNOWN: NvmlReturn = 999;

#[repr(C)]
pub struct NvmlMemory {
    total: u64,
    free: u64,
    used: u64,
}

#[repr(C)]
pub struct NvmlMemoryV2 {
    version: c_uint,
    total: u64,
    reserved: u64,
    free: u64,
    used: u64,
}

type GetUuid = unsafe extern "C" fn(*mut c_void, *mut c_char, c_uint) -> NvmlReturn;

/// The NVML functions this module replaces: (name, our hook).
pub fn hooks() -> [(&'static CStr, usize); 2] {
    [
        (
            c"nvmlDeviceGetMemoryInfo",
            nvmlDeviceGetMemoryInfo as *const () as usize,
        ),
        (
            c"nvmlDeviceGetMemoryInfo_v2",
            nvmlDeviceGetMemoryInfo_v2 as *const () as usize,
        ),
    ]
}

/// The real functions, as the program's own lookups found them (`remember`) or as found among
/// the loaded libraries.
static REAL_V1: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
static REAL_V2: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
static REAL_UUID: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

/// A `dlsym` of `name` found `real`: our hook for it, if it is one we replace (`None`
/// otherwise). The real one is kept for the hook to call.
pub fn substitute(name: &CStr, real: *mut c_void) -> Option<*mut c_void> {
    let (slot, hook) = match name.to_bytes() {
        b"nvmlDeviceGetMemoryInfo" => (&REAL_V1, hooks()[0].1),
        b"nvmlDeviceGetMemoryInfo_v2" => (&REAL_V2, hooks()[1].1),
        _ => return None,
    };
    if real as usize != hook {
        slot.store(real, Ordering::Release);
    }
    Some(hook as *mut c_void)
}

/// The real function `name`: kept, else looked up past this library (the program linked
/// NVML), else in a loaded `libnvidia-ml.so.1`.
fn real(slot: &AtomicPtr<c_void>, name: &CStr) -> Option<*mut c_void> {
    let p = slot.load(Ordering::Acquire);
    if !p.is_null() {
        return Some(p);
    }
    // SAFETY: the real dlsym with RTLD_NEXT, relative to this library, and a NUL-terminated name.
    let mut p = unsafe { driver::real_dlsym()(libc::RTLD_NEXT, name.as_ptr()) };
    if p.is_null() {
        // SAFETY: dlopen of a library name with RTLD_NOLOAD: only one already loaded.
        let h = unsafe {
            libc::dlopen(
                c"libnvidia-ml.so.1".as_ptr(),
                libc::RTLD_NOW | libc::RTLD_NOLOAD,
            )
        };
        if !h.is_null() {
            // SAFETY: a handle dlopen gave and a NUL-terminated name.
            p = unsafe { driver::real_dlsym()(h, name.as_ptr()) };
        }
    }
    let ours = hooks().iter().any(|&(_, h)| h == p as usize);
    if p.is_null() || ours {
        return None;
    }
    slot.store(p, Ordering::Release);
    Some(p)
}

/// The device's UUID as NVML gives it (`GPU-xxxxxxxx-xxxx-...`), as 16 bytes.
fn uuid_of(device: *mut c_void) -> Option<[u8; 16]> {
    let f = real(&REAL_UUID, c"nvmlDeviceGetUUID")?;
    let mut buf = [0 as c_char; 96];
    // SAFETY: NVML's nvmlDeviceGetUUID(device, char *, length) with a buffer of that length.
    let r = unsafe {
        std::mem::transmute::<*mut c_void, GetUuid>(f)(
            device,
            buf.as_mut_ptr(),
            buf.len() as c_uint,
        )
    };
    if r != NVML_SUCCESS {
        return None;
    }
    // SAFETY: NVML wrote a NUL-terminated string into the buffer.
    let s = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_str().ok()?;
    parse_uuid(s)
}

/// The budget's view of `device`, whose real figures are `total` and `free` (`None`: none
/// applies, or the device's UUID could not be had).
fn budgeted(device: *mut c_void, total: u64, free: u64) -> Option<crate::state::nvml::NvmlView> {
    let uuid = uuid_of(device);
    let v = uuid.and_then(|u| crate::state::nvml::view(&u, total, free));
    crate::log_at!(
        crate::base::config::LogLevel::Debug,
        "nvml: device {:?}: total {total}, free {free} -> {v:?}",
        uuid.map(|u| crate::report::page::fmt_uuid(&u))
    );
    v
}

/// `GPU-b130ed9d-f60d-8609-a92c-84ec86ed66fb` (or `MIG-...`) -> its 16 bytes.
pub fn parse_uuid(s: &str) -> Option<[u8; 16]> {
    let hex: String = s.split_once('-')?.1.chars().filter(|c| *c != '-').collect();
    if hex.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// One of NVML's memory structs: what the budget reads of it and how its view goes back in.
trait Memory {
    /// (total, free) as NVML gave them.
    fn real(&self) -> (u64, u64);
    fn set(&mut self, v: crate::state::nvml::NvmlView);
}

impl Memory for NvmlMemory {
    fn real(&self) -> (u64, u64) {
        (self.total, self.free)
    }
    fn set(&mut self, v: crate::state::nvml::NvmlView) {
        (self.total, self.used, self.free) = (v.total, v.used, v.free);
    }
}

/// `reserved` (what the driver keeps) is what the budget's total leaves beside used and free,
/// so that the four still add up.
impl Memory for NvmlMemoryV2 {
    fn real(&self) -> (u64, u64) {
        (self.total, self.free)
    }
    fn set(&mut self, v: crate::state::nvml::NvmlView) {
        (self.total, self.used, self.free) = (v.total, v.used, v.free);
        self.reserved = v.total.saturating_sub(v.used).saturating_sub(v.free);
    }
}

/// Calls the real function kept in `slot` (`name`), then puts the budget's view of `device`
/// into what it filled.
fn through_budget<M: Memory>(
    slot: &AtomicPtr<c_void>,
    name: &CStr,
    device: *mut c_void,
    memory: *mut M,
) -> NvmlReturn {
    boundary(NVML_ERROR_UNKNOWN, || {
        let Some(f) = real(slot, name) else {
            return NVML_ERROR_UNKNOWN;
        };
        type Real<M> = unsafe extern "C" fn(*mut c_void, *mut M) -> NvmlReturn;
        // SAFETY: `f` is NVML's function `name`, of this signature for this struct; called with
        // the caller's own arguments.
        let r = unsafe { std::mem::transmute::<*mut c_void, Real<M>>(f)(device, memory) };
        if r != NVML_SUCCESS || memory.is_null() {
            return r;
        }
        // SAFETY: NVML just filled it: non-null and valid (the caller's contract).
        let m = unsafe { &mut *memory };
        let (total, free) = m.real();
        if let Some(v) = budgeted(device, total, free) {
            m.set(v);
        }
        r
    })
}

/// `nvmlDeviceGetMemoryInfo`, through the budget.
///
/// # Safety
/// NVML's contract: `device` a handle NVML gave, `memory` NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: *mut c_void,
    memory: *mut NvmlMemory,
) -> NvmlReturn {
    through_budget(&REAL_V1, c"nvmlDeviceGetMemoryInfo", device, memory)
}

/// `nvmlDeviceGetMemoryInfo_v2`, through the budget.
///
/// # Safety
/// NVML's contract: `device` a handle NVML gave, `memory` NULL or valid for reads and writes
/// (its `version` set by the caller).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: *mut c_void,
    memory: *mut NvmlMemoryV2,
) -> NvmlReturn {
    through_budget(&REAL_V2, c"nvmlDeviceGetMemoryInfo_v2", device, memory)
}

#[cfg(test)]
mod tests {
    #[test]
    fn uuids_parse_as_nvml_prints_them() {
        assert_eq!(
            super::parse_uuid("GPU-b130ed9d-f60d-8609-a92c-84ec86ed66fb"),
            Some([
                0xb1, 0x30, 0xed, 0x9d, 0xf6, 0x0d, 0x86, 0x09, 0xa9, 0x2c, 0x84, 0xec, 0x86, 0xed,
                0x66, 0xfb
            ])
        );
        assert_eq!(super::parse_uuid("GPU-123"), None);
        assert_eq!(super::parse_uuid("nonsense"), None);
    }
}
