//! The process's side of sleep, with no knowledge of the shim: its state and why, its turn,
//! and the host memory the copies go into (see the module's notes). What is asleep is not
//! here: each handle's record holds its own state and host copy.

use crate::base::host_copy::HostCopy;
use crate::base::sync::lock;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::*};
use std::sync::Mutex;

/// The process's sleep state (as `cudapool_stats`, the page and `stat` show it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum State {
    Awake = 0,
    FallingAsleep = 1,
    Asleep = 2,
    Waking = 3,
}

impl State {
    pub fn name(self) -> &'static str {
        match self {
            State::Awake => "awake",
            State::FallingAsleep => "falling asleep",
            State::Asleep => "asleep",
            State::Waking => "waking",
        }
    }

    pub fn from_u8(v: u8) -> State {
        match v {
            1 => State::FallingAsleep,
            2 => State::Asleep,
            3 => State::Waking,
            _ => State::Awake,
        }
    }
}

/// The state; read by every work call and allocation (see [`enter`]).
pub(super) static STATE: AtomicU8 = AtomicU8::new(State::Awake as u8);

/// The process's sleep state now.
pub fn state() -> State {
    State::from_u8(STATE.load(Relaxed))
}

pub(super) fn set(s: State) {
    STATE.store(s as u8, SeqCst);
}

/// Why the process went to sleep (as the page and `stat` show it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Cause {
    /// Not said (a page of an older build, or the process is awake).
    Unknown = 0,
    /// The program's own call (`cudapool_sleep`, `cudapool.sleep()`).
    Program = 1,
    /// Asked from outside through the process's page (`cudapool sleep PID`).
    Asked = 2,
    /// Stopped: SIGTSTP (Slurm's suspend, a shell's Ctrl-Z) or its job's suspend.
    Suspend = 3,
    /// Idle, for another member of its group short of room (`CUDAPOOL_SLEEP_IDLE`).
    Idle = 4,
    /// Idle, for another job on an overcommitted GPU (root's arbiter, `cudapool slurm arbiter`).
    Arbiter = 5,
}

impl Cause {
    pub fn from_u8(v: u8) -> Cause {
        match v {
            1 => Cause::Program,
            2 => Cause::Asked,
            3 => Cause::Suspend,
            4 => Cause::Idle,
            5 => Cause::Arbiter,
            _ => Cause::Unknown,
        }
    }

    /// In words, for `stat`.
    pub fn name(self) -> &'static str {
        match self {
            Cause::Unknown => "why not said",
            Cause::Program => "the program's own call",
            Cause::Asked => "asked from outside (cudapool sleep)",
            Cause::Suspend => "stopped (SIGTSTP: Slurm's suspend or Ctrl-Z)",
            Cause::Idle => "idle, for another member of its group",
            Cause::Arbiter => "idle, for another job on the GPU (root's arbiter)",
        }
    }
}

/// Why the last sleep began, and when (ns since the Unix epoch): written before the state turns
/// asleep, read with it.
static CAUSE: AtomicU8 = AtomicU8::new(Cause::Unknown as u8);
static SINCE_NS: AtomicU64 = AtomicU64::new(0);

pub(super) fn set_cause(c: Cause, now_ns: u64) {
    CAUSE.store(c as u8, Relaxed);
    SINCE_NS.store(now_ns, Relaxed);
}

/// Why the process sleeps and since when (ns since the epoch); `(Unknown, 0)` while awake.
pub fn cause() -> (Cause, u64) {
    match state() {
        State::Awake | State::FallingAsleep => (Cause::Unknown, 0),
        State::Asleep | State::Waking => {
            (Cause::from_u8(CAUSE.load(Relaxed)), SINCE_NS.load(Relaxed))
        }
    }
}

/// What a sleep or wake moved.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Moved {
    /// Device memory given back (sleep) or mapped again (wake).
    pub device_bytes: u64,
    /// Bytes copied.
    pub copied: u64,
    pub seconds: f64,
}

/// The shim's part of sleep: the turn, and the host memory and pinned slots the copies use.
/// What is asleep is each handle's own record: a pool's in its arena (`pool::Asleep`), the
/// program's own in the counted handles (`counted::ProgramAsleep`).
#[derive(Default)]
pub struct Sleep {
    /// Held for the whole of a sleep or a wake: one at a time.
    pub(super) turn: Mutex<()>,
    /// Bytes a wake is waiting for room for (0: none).
    pub(super) waiting_for: AtomicU64,
    /// The count of work calls and allocations last seen, and when it was seen to move (ns
    /// since the epoch; 0: never looked).
    pub(super) activity: Mutex<(u64, u64)>,
    /// The copies' pinned slots, kept once made (`copy`).
    pub(super) staging: Mutex<Vec<super::copy::Slots>>,
    /// Host copies a wake emptied, each given to the kernel to take back when it needs memory
    /// (`HostCopy::lend_to_kernel`): the next sleep's destinations. Dropped at the end of the
    /// sleep that did not reuse them, so they never hold more than the last sleep's bytes.
    pub(super) spare: Mutex<Vec<HostCopy>>,
    /// With `CUDAPOOL_SLEEP_READY=1`: host memory made ahead of a sleep, its pages there
    /// (`HostCopy::made_ready`) and lent to the kernel, carved into host copies by the first
    /// sleep that needs them (`ready`). Kept across sleeps; never more than the process holds.
    pub(super) ready: Mutex<Vec<HostCopy>>,
    /// When a wake waiting for room last asked root's arbiter (`state::arbiter`).
    pub(in crate::state) asked_arbiter: Mutex<Option<std::time::Instant>>,
}

impl Sleep {
    /// A host copy of at least `len` bytes: the smallest spare one that holds them and is not
    /// more than twice their size (and 2 MiB), else a new one (`None`: the kernel will not give
    /// them).
    pub(super) fn host_copy(&self, len: u64) -> Option<HostCopy> {
        let mut spare = lock(&self.spare);
        let best = (spare.iter().enumerate())
            .filter(|(_, h)| (len..=len * 2 + (2 << 20)).contains(&(h.len as u64)))
            .min_by_key(|(_, h)| h.len)
            .map(|(i, _)| i);
        if let Some(i) = best {
            return Some(spare.swap_remove(i));
        }
        drop(spare);
        self.carve_ready(len).or_else(|| HostCopy::new(len))
    }

    /// A host copy of at least `len` bytes carved from the memory made ready ahead (the
    /// smallest piece that holds them, whole when what would be left is under 2 MiB).
    fn carve_ready(&self, len: u64) -> Option<HostCopy> {
        let mut ready = lock(&self.ready);
        let i = (ready.iter().enumerate())
            .filter(|(_, h)| h.len as u64 >= len)
            .min_by_key(|(_, h)| h.len)
            .map(|(i, _)| i)?;
        match ready[i].split_front(len) {
            Some(front) if ready[i].len >= 2 << 20 => Some(front),
            // What is left is under a huge page: the whole piece goes, its rest with it.
            Some(front) => {
                let rest = ready.swap_remove(i);
                drop(rest);
                Some(front)
            }
            None => Some(ready.swap_remove(i)),
        }
    }

    /// Bytes of host memory made ready ahead of a sleep and not yet used.
    pub(super) fn ready_bytes(&self) -> u64 {
        lock(&self.ready).iter().map(|h| h.len as u64).sum()
    }

    /// A wake emptied `host`: kept as a spare where the kernel can take its pages back.
    pub(super) fn keep_spare(&self, host: HostCopy) {
        if host.lend_to_kernel() {
            lock(&self.spare).push(host);
        }
    }

    /// Drops the spares a sleep did not reuse.
    pub(super) fn drop_spares(&self) {
        let old = std::mem::take(&mut *lock(&self.spare));
        drop(old);
    }
}
