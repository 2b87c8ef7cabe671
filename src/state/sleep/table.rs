//! What is asleep, with no knowledge of the shim: the process's sleep state, each handle's
//! contents on the host, and the release of asleep memory (see the module's notes).

use crate::base::cu::*;
use crate::base::sync::lock;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering::*};
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

/// Host memory of its own (anonymous pages, given back when dropped): what a handle's live
/// parts hold while asleep, in its first bytes (`len` may be more, when kept from an earlier
/// sleep: [`Sleep::host_copy`]).
pub(super) struct HostCopy {
    pub(super) ptr: *mut u8,
    pub(super) len: usize,
}

// SAFETY: the pages are owned by this value alone; nothing else holds the pointer.
unsafe impl Send for HostCopy {}

impl HostCopy {
    /// `None` when the kernel will not give `len` bytes.
    pub(super) fn new(len: u64) -> Option<HostCopy> {
        if len == 0 {
            return Some(HostCopy {
                ptr: std::ptr::NonNull::dangling().as_ptr(),
                len: 0,
            });
        }
        let len = usize::try_from(len).ok()?;
        // SAFETY: a fresh private anonymous mapping; no address is given, nothing is replaced.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return None;
        }
        // Huge pages where the kernel has them: a copy into fresh memory faults 512 times less.
        // SAFETY: advice on the mapping just made, of its length.
        unsafe { libc::madvise(p, len, libc::MADV_HUGEPAGE) };
        Some(HostCopy { ptr: p.cast(), len })
    }

    /// The first `len` bytes (rounded up to 2 MiB, a huge page) as a host copy of their own,
    /// this one keeping the rest; `None` when this one is not larger than that. (Each piece of
    /// a mapping can be unmapped alone.)
    pub(super) fn split_front(&mut self, len: u64) -> Option<HostCopy> {
        let len = usize::try_from(len.next_multiple_of(2 << 20)).ok()?;
        if len == 0 || len >= self.len {
            return None;
        }
        let front = HostCopy { ptr: self.ptr, len };
        // SAFETY: `len < self.len`: the rest of this value's own mapping.
        self.ptr = unsafe { self.ptr.add(len) };
        self.len -= len;
        Some(front)
    }

    /// Makes every page of the copy now (the kernel zeroes each as it faults), so that a copy
    /// into it later finds its pages there; then lends them to the kernel (`MADV_FREE`, see
    /// [`lend_to_kernel`](Self::lend_to_kernel)). `false` where that advice is not had.
    pub(super) fn made_ready(&self) -> bool {
        for off in (0..self.len).step_by(4096) {
            // SAFETY: inside this value's own writable mapping, which nothing else uses yet.
            unsafe { self.ptr.add(off).write_volatile(0) };
        }
        self.lend_to_kernel()
    }

    /// Lets the kernel take the pages back whenever it needs memory (`MADV_FREE`): until then
    /// they stay, and the next sleep writes into pages already there, at 1.6 times the speed
    /// of fresh ones (`benches/gpu/sleep_paths.cu`). What it writes again is kept. `false`
    /// where the kernel has no such advice (the copy is then dropped).
    fn lend_to_kernel(&self) -> bool {
        // SAFETY: advice on this value's own mapping, of its length; the bytes are not read
        // again before they are written (a kept copy is only a destination: `Sleep::host_copy`).
        self.len == 0 || unsafe { libc::madvise(self.ptr.cast(), self.len, libc::MADV_FREE) } == 0
    }
}

impl Drop for HostCopy {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: the mapping made in `new`, unmapped once, here.
            unsafe { libc::munmap(self.ptr.cast(), self.len) };
        }
    }
}

/// One handle's memory while asleep.
pub(super) struct Saved {
    pub(super) dev: CUdevice,
    pub(super) ctx: usize,
    pub(super) bytes: u64,
    /// The parts kept (address, bytes), in `host` one after the other.
    pub(super) live: Vec<(DevPtr, u64)>,
    pub(super) host: HostCopy,
}

/// A handle the program made itself (`cuMemCreate`), asleep: made again at the wake with the
/// program's properties, mapped where it was with the access it had (see `foreign`).
pub(super) struct Foreign {
    pub(super) dev: CUdevice,
    /// The program's value for it (what it passes to `cuMemMap`, `cuMemRelease`, ...).
    pub(super) key: MemHandle,
    pub(super) size: u64,
    pub(super) prop: PropBytes,
    /// References the program holds (its creation and retains, minus releases).
    pub(super) refs: u32,
    /// Its mappings (address, bytes, offset in the handle, access: device and flags), their
    /// bytes in `host` one after the other.
    pub(super) maps: Vec<ForeignMap>,
    pub(super) host: HostCopy,
}

/// One mapping of a [`Foreign`] handle.
pub(super) struct ForeignMap {
    pub(super) at: DevPtr,
    pub(super) bytes: u64,
    pub(super) offset: u64,
    pub(super) access: Vec<(CUdevice, std::ffi::c_int)>,
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

/// The shim's part: what is asleep.
///
/// Invariants: `saved` holds, by address, every handle of a pool whose memory a sleep gave
/// back and no wake or release mapped or dropped since, and `foreign` every handle of the
/// program's own a sleep gave back and no wake made again; none of them is mapped; `count` is
/// their number.
#[derive(Default)]
pub struct Sleep {
    /// Held for the whole of a sleep or a wake: one at a time.
    pub(super) turn: Mutex<()>,
    pub(super) saved: Mutex<BTreeMap<DevPtr, Saved>>,
    pub(super) foreign: Mutex<Vec<Foreign>>,
    pub(super) count: AtomicUsize,
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

thread_local! {
    /// Set while this thread, holding `saved`, gives back memory it just mapped for a wake:
    /// its unmaps are plain ones.
    static OWN_UNMAPS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
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

    /// The invariants written on [`Sleep`], and each record's own: the count is the number of
    /// handles asleep; each saved handle's live parts lie inside it, in order, and fit its host
    /// copy; each of the program's own handles' mappings fit the handle and its host copy;
    /// awake, nothing is asleep. Read under the turn (no sleep or wake meanwhile); a free while
    /// asleep may drop a record meanwhile, so the count is read before and after. (Called by
    /// debug builds and tests only: a release build leaves it unused.)
    #[cfg_attr(not(debug_assertions), allow(dead_code))]
    pub(super) fn check(&self) -> Result<(), String> {
        for _ in 0..3 {
            let before = self.count.load(SeqCst);
            let saved = self.check_saved()?;
            let foreign = self.check_foreign()?;
            if self.count.load(SeqCst) != before {
                continue;
            }
            if before != saved + foreign {
                return Err(format!(
                    "the count says {before} handles asleep, the tables hold {saved} and {foreign}"
                ));
            }
            if state() == State::Awake && before != 0 {
                return Err(format!("awake with {before} handles asleep"));
            }
            return Ok(());
        }
        Ok(())
    }

    #[cfg_attr(not(debug_assertions), allow(dead_code))]
    fn check_saved(&self) -> Result<usize, String> {
        let saved = lock(&self.saved);
        for (&at, s) in saved.iter() {
            let mut end = at;
            let mut live = 0u64;
            for &(p, n) in &s.live {
                if p < end || p.saturating_add(n) > at.saturating_add(s.bytes) {
                    return Err(format!(
                        "handle {at:#x} ({} bytes): its part {p:#x}+{n} is out of order or outside it",
                        s.bytes
                    ));
                }
                end = p + n;
                live += n;
            }
            if live > s.host.len as u64 {
                return Err(format!(
                    "handle {at:#x}: {live} live bytes in a host copy of {}",
                    s.host.len
                ));
            }
        }
        Ok(saved.len())
    }

    #[cfg_attr(not(debug_assertions), allow(dead_code))]
    fn check_foreign(&self) -> Result<usize, String> {
        let foreign = lock(&self.foreign);
        for f in foreign.iter() {
            let copied: u64 = f.maps.iter().map(|m| m.bytes).sum();
            if copied > f.host.len as u64 || f.maps.iter().any(|m| m.offset + m.bytes > f.size) {
                return Err(format!(
                    "the program's handle of {} bytes: mappings of {copied} bytes do not fit it or its host copy of {}",
                    f.size, f.host.len
                ));
            }
        }
        Ok(foreign.len())
    }

    /// After a sleep or a wake (`after`), in a debug build of the library (the preload
    /// suite's): [`check`](Self::check), or a panic that says what broke (the boundary of the
    /// hook or the C API reports it). Release builds and the library's unit tests never check.
    pub(super) fn validate_after(&self, after: &str) {
        #[cfg(all(debug_assertions, not(test)))]
        if let Err(why) = self.check() {
            panic!("the sleep's invariants broke after {after}: {why}");
        }
        #[cfg(not(all(debug_assertions, not(test))))]
        let _ = after;
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

    /// Runs `f`, whose unmaps (through the upstream) are of memory this thread mapped for a
    /// wake, and holds no saved handle: they do not look at `saved` (whose lock the caller
    /// holds).
    pub(super) fn unmapping_own<T>(&self, f: impl FnOnce() -> T) -> T {
        OWN_UNMAPS.with(|o| o.set(true));
        let r = f();
        OWN_UNMAPS.with(|o| o.set(false));
        r
    }

    /// A pool gives back `[at, at + bytes)` (handles of `handle` bytes) while some of it may
    /// be asleep: asleep handles only drop their host copy (their memory went back at the
    /// sleep, and their charge with it); the others are unmapped by `unmap` (at, bytes).
    /// Returns `None` when nothing there is asleep (the caller unmaps it all itself).
    pub(in crate::state) fn unmap_asleep(
        &self,
        at: DevPtr,
        bytes: u64,
        handle: u64,
        mut unmap: impl FnMut(DevPtr, u64) -> Result<(), CUresult>,
    ) -> Option<Result<(), CUresult>> {
        if self.count.load(SeqCst) == 0 || OWN_UNMAPS.with(|o| o.get()) {
            return None;
        }
        let mut saved = lock(&self.saved);
        // Nothing there asleep: the caller's own unmap.
        saved.range(at..at + bytes).next()?;
        let mut result = Ok(());
        let mut p = at;
        while p < at + bytes {
            if let Some(s) = saved.remove(&p) {
                self.count.fetch_sub(1, SeqCst);
                p += s.bytes;
            } else {
                result = result.and(unmap(p, handle));
                p += handle;
            }
        }
        Some(result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The validator sees what it is for: a count the tables do not back, a part outside its
    /// handle, a part that does not fit its host copy.
    #[test]
    fn the_sleep_validator_finds_each_broken_invariant() {
        let s = Sleep::default();
        assert_eq!(s.check(), Ok(()));
        s.count.store(1, SeqCst);
        assert!(s.check().unwrap_err().contains("the count says 1"));
        let saved = |live: Vec<(DevPtr, u64)>, host: u64| Saved {
            dev: 0,
            ctx: 1,
            bytes: 2 << 20,
            live,
            host: HostCopy::new(host).unwrap(),
        };
        let at: DevPtr = 0x7000_0000;
        lock(&s.saved).insert(at, saved(vec![(at, 4096), (at + 8192, 4096)], 8192));
        // Awake with a handle asleep: in the process only a failed wake leaves that, asleep.
        assert!(s
            .check()
            .unwrap_err()
            .contains("awake with 1 handles asleep"));
        lock(&s.saved).insert(at, saved(vec![(at + (2 << 20), 4096)], 4096));
        assert!(s.check().unwrap_err().contains("outside it"));
        lock(&s.saved).insert(at, saved(vec![(at, 8192)], 4096));
        assert!(s
            .check()
            .unwrap_err()
            .contains("8192 live bytes in a host copy of 4096"));
    }
}
