//! The driver's checkpoint API (`cuCheckpointProcess*`, CUDA 12.8 and later drivers), used by
//! root's arbiter from outside a process: for a job's process that cannot put itself to sleep
//! (it does not run cudapool, or runs a library that refuses), the driver locks its CUDA calls,
//! moves its device memory into the process's own host memory and gives the GPU memory back;
//! a restore brings it back at the same addresses and an unlock lets its calls go on.
//!
//! A process's states, as the driver names them: running → locked → checkpointed → (restore)
//! locked → (unlock) running. Locked or checkpointed, each of its CUDA calls waits.
//!
//! The driver is opened here with `dlopen` (the CLI is never preloaded); its symbols are found
//! with the real `dlsym`, as everywhere in cudapool.

use cudapool::base::cu::CUresult;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::OnceLock;
use std::time::Duration;

type Init = unsafe extern "C" fn(c_uint) -> CUresult;
type GetState = unsafe extern "C" fn(c_int, *mut c_int) -> CUresult;
type WithArgs = unsafe extern "C" fn(c_int, *mut c_void) -> CUresult;

/// `CUcheckpointLockArgs`: a timeout, the rest reserved (zero).
#[repr(C)]
struct LockArgs {
    timeout_ms: c_uint,
    reserved0: c_uint,
    reserved1: [u64; 7],
}

/// A process's state, as `cuCheckpointProcessGetState` says it (`CUprocessState`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    Running,
    Locked,
    Checkpointed,
    /// An uncorrectable error during a checkpoint or restore.
    Failed,
    /// A state this build does not name (a newer driver's: checkpointing, restoring, ...).
    Other(c_int),
}

/// The entry points, resolved once.
pub struct Checkpointer {
    get_state: GetState,
    lock: WithArgs,
    checkpoint: WithArgs,
    restore: WithArgs,
    unlock: WithArgs,
}

/// The driver's checkpoint API, or why there is none (no driver, or one older than CUDA 12.8).
pub fn checkpointer() -> Result<&'static Checkpointer, String> {
    static C: OnceLock<Result<Checkpointer, String>> = OnceLock::new();
    C.get_or_init(open).as_ref().map_err(Clone::clone)
}

fn open() -> Result<Checkpointer, String> {
    // SAFETY: dlopen of a library name; RTLD_NODELETE keeps every pointer taken from it valid.
    let h = unsafe {
        libc::dlopen(
            c"libcuda.so.1".as_ptr(),
            libc::RTLD_NOW | libc::RTLD_NODELETE,
        )
    };
    if h.is_null() {
        return Err("libcuda.so.1 cannot be opened".into());
    }
    let find = |name: &std::ffi::CStr| {
        // SAFETY: real dlsym on the handle dlopen gave and a NUL-terminated name.
        let p = unsafe { cudapool::driver::lookup(h, name) };
        (!p.is_null()).then_some(p)
    };
    let missing = "the driver has no checkpoint API (cuCheckpointProcessLock: CUDA 12.8 or later)";
    let (Some(init), Some(get_state), Some(lock), Some(checkpoint), Some(restore), Some(unlock)) = (
        find(c"cuInit"),
        find(c"cuCheckpointProcessGetState"),
        find(c"cuCheckpointProcessLock"),
        find(c"cuCheckpointProcessCheckpoint"),
        find(c"cuCheckpointProcessRestore"),
        find(c"cuCheckpointProcessUnlock"),
    ) else {
        return Err(missing.into());
    };
    // SAFETY: each pointer is the driver's entry point of that name, with the signature
    // cuda.h gives it (`CUresult f(int pid, Args *args)`, the state's `CUprocessState *`).
    unsafe {
        let init = std::mem::transmute::<*mut c_void, Init>(init);
        let r = init(0);
        if r != 0 {
            return Err(format!("cuInit failed (error {r})"));
        }
        Ok(Checkpointer {
            get_state: std::mem::transmute::<*mut c_void, GetState>(get_state),
            lock: std::mem::transmute::<*mut c_void, WithArgs>(lock),
            checkpoint: std::mem::transmute::<*mut c_void, WithArgs>(checkpoint),
            restore: std::mem::transmute::<*mut c_void, WithArgs>(restore),
            unlock: std::mem::transmute::<*mut c_void, WithArgs>(unlock),
        })
    }
}

fn check(what: &str, r: CUresult) -> Result<(), String> {
    if r == 0 {
        Ok(())
    } else {
        Err(format!("{what} failed (error {r})"))
    }
}

impl Checkpointer {
    /// Process `pid`'s state; `Err` when it is no CUDA process the driver knows (or not ours
    /// to ask).
    pub fn state(&self, pid: u32) -> Result<State, String> {
        let mut s: c_int = -1;
        // SAFETY: the driver writes one CUprocessState into our local.
        check("cuCheckpointProcessGetState", unsafe {
            (self.get_state)(pid as c_int, &mut s)
        })?;
        Ok(match s {
            0 => State::Running,
            1 => State::Locked,
            2 => State::Checkpointed,
            3 => State::Failed,
            other => State::Other(other),
        })
    }

    /// Locks `pid`'s CUDA calls (waiting at most `within` for those under way) and moves its
    /// device memory to its host memory. A checkpoint that fails unlocks the process again.
    pub fn suspend(&self, pid: u32, within: Duration) -> Result<(), String> {
        let mut args = LockArgs {
            timeout_ms: within.as_millis().clamp(1, u32::MAX as u128) as c_uint,
            reserved0: 0,
            reserved1: [0; 7],
        };
        // SAFETY: the driver reads the lock arguments (reserved fields zero) from our local.
        check("cuCheckpointProcessLock", unsafe {
            (self.lock)(pid as c_int, (&mut args as *mut LockArgs).cast())
        })?;
        // SAFETY: no arguments (null is the documented default).
        let r = unsafe { (self.checkpoint)(pid as c_int, std::ptr::null_mut()) };
        if r != 0 {
            // SAFETY: as above.
            unsafe { (self.unlock)(pid as c_int, std::ptr::null_mut()) };
            return check("cuCheckpointProcessCheckpoint", r);
        }
        Ok(())
    }

    /// Brings `pid`'s device memory back (same GPU, same addresses) and unlocks its calls.
    /// `Err` leaves it checkpointed (a restore the GPU has no room for), or says it failed.
    pub fn resume(&self, pid: u32) -> Result<(), String> {
        if self.state(pid)? == State::Checkpointed {
            // SAFETY: no arguments (null: the same GPUs as at the checkpoint).
            check("cuCheckpointProcessRestore", unsafe {
                (self.restore)(pid as c_int, std::ptr::null_mut())
            })?;
        }
        // SAFETY: no arguments.
        check("cuCheckpointProcessUnlock", unsafe {
            (self.unlock)(pid as c_int, std::ptr::null_mut())
        })
    }
}
