//! What NVML says of this process's whole footprint on a GPU (its context, the driver's own
//! memory and its allocations together): for a group's limit to count each member's context
//! (`CUDAPOOL_GROUP_LIMIT`), and for a module load or a new context to be charged what the
//! process took (`state::overhead`). NVML is loaded (`libnvidia-ml.so.1`) the first time either
//! needs it, never otherwise; the real NVML's symbols are found with the real `dlsym` (this
//! library's own NVML hooks are not involved).
//!
//! `None` when NVML is absent, does not know the GPU, or lists no process of this pid (a
//! process in a pid namespace NVML does not see: a container without the host's pid namespace).

use super::lookup;
use std::ffi::{c_char, c_int, c_uint, c_void, CString};
use std::sync::OnceLock;

/// `nvmlProcessInfo_t` (v2/v3 layout).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct ProcessInfo {
    pid: c_uint,
    used: u64,
    gpu_instance: c_uint,
    compute_instance: c_uint,
}

type Init = unsafe extern "C" fn() -> c_int;
type ByUuid = unsafe extern "C" fn(*const c_char, *mut *mut c_void) -> c_int;
type Procs = unsafe extern "C" fn(*mut c_void, *mut c_uint, *mut ProcessInfo) -> c_int;
type MemoryInfo = unsafe extern "C" fn(*mut c_void, *mut Memory) -> c_int;

/// `nvmlMemory_t`.
#[repr(C)]
#[derive(Default)]
struct Memory {
    total: u64,
    free: u64,
    used: u64,
}

struct Nvml {
    by_uuid: ByUuid,
    procs: Procs,
    memory: Option<MemoryInfo>,
}

fn nvml() -> Option<&'static Nvml> {
    static N: OnceLock<Option<Nvml>> = OnceLock::new();
    N.get_or_init(|| {
        // SAFETY: dlopen of a library name; the handle is kept for the process's life.
        let h = unsafe {
            libc::dlopen(
                c"libnvidia-ml.so.1".as_ptr(),
                libc::RTLD_NOW | libc::RTLD_NODELETE,
            )
        };
        if h.is_null() {
            return None;
        }
        // SAFETY: real dlsym on the handle dlopen gave; each symbol has NVML's documented
        // signature (nvml.h), and a missing one is left out.
        unsafe {
            let init = lookup(h, c"nvmlInit_v2");
            let by_uuid = lookup(h, c"nvmlDeviceGetHandleByUUID");
            let mut procs = lookup(h, c"nvmlDeviceGetComputeRunningProcesses_v3");
            if procs.is_null() {
                procs = lookup(h, c"nvmlDeviceGetComputeRunningProcesses_v2");
            }
            if init.is_null() || by_uuid.is_null() || procs.is_null() {
                return None;
            }
            let memory = lookup(h, c"nvmlDeviceGetMemoryInfo");
            let init: Init = std::mem::transmute::<*mut c_void, Init>(init);
            if init() != 0 {
                return None;
            }
            Some(Nvml {
                by_uuid: std::mem::transmute::<*mut c_void, ByUuid>(by_uuid),
                procs: std::mem::transmute::<*mut c_void, Procs>(procs),
                memory: (!memory.is_null())
                    .then(|| std::mem::transmute::<*mut c_void, MemoryInfo>(memory)),
            })
        }
    })
    .as_ref()
}

/// A GPU's name for NVML: `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
use crate::base::log::fmt_uuid as uuid_text;

/// Bytes process `pid` holds on the GPU `uuid`, as NVML counts them (what `nvidia-smi` shows).
pub fn process_used(uuid: &[u8; 16], pid: u32) -> Option<u64> {
    processes(uuid)?
        .into_iter()
        .find(|&(p, _)| p == pid)
        .map(|(_, used)| used)
}

/// The free memory of the GPU `uuid`, as NVML counts it (every process's, the driver's
/// reserve left out): what root's arbiter waits for before it restores a process.
pub fn free(uuid: &[u8; 16]) -> Option<u64> {
    let n = nvml()?;
    let dev = device(n, uuid)?;
    let mut m = Memory::default();
    // SAFETY: NVML writes one nvmlMemory_t into our local.
    (unsafe { (n.memory?)(dev, &mut m) } == 0).then_some(m.free)
}

fn device(n: &Nvml, uuid: &[u8; 16]) -> Option<*mut c_void> {
    let name = CString::new(uuid_text(uuid)).ok()?;
    let mut dev: *mut c_void = std::ptr::null_mut();
    // SAFETY: NVML's lookup by a NUL-terminated UUID into our out-pointer.
    (unsafe { (n.by_uuid)(name.as_ptr(), &mut dev) } == 0).then_some(dev)
}

/// Every compute process NVML lists on the GPU `uuid` (at most 256) with the bytes it holds
/// there: its pid (as NVML's pid namespace names it) and those bytes.
pub fn processes(uuid: &[u8; 16]) -> Option<Vec<(u32, u64)>> {
    let n = nvml()?;
    let dev = device(n, uuid)?;
    let mut infos = [ProcessInfo::default(); 256];
    let mut count = infos.len() as c_uint;
    // SAFETY: NVML fills at most `count` entries of our array and writes the number back.
    if unsafe { (n.procs)(dev, &mut count, infos.as_mut_ptr()) } != 0 {
        return None;
    }
    Some(
        infos[..(count as usize).min(infos.len())]
            .iter()
            .filter(|p| p.used != NOT_AVAILABLE)
            .map(|p| (p.pid, p.used))
            .collect(),
    )
}

/// `NVML_VALUE_NOT_AVAILABLE`: NVML lists a process whose memory it cannot tell (some virtual
/// GPUs); such a process is left out, as one NVML does not list.
const NOT_AVAILABLE: u64 = u64::MAX;

#[cfg(test)]
mod tests {
    #[test]
    fn a_uuid_is_named_as_nvml_names_it() {
        let mut u = [0u8; 16];
        u[0] = 0xfa;
        u[1] = 0xce;
        assert_eq!(
            super::uuid_text(&u),
            "GPU-face0000-0000-0000-0000-000000000000"
        );
    }
}
