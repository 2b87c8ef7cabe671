//! The live page's format: what a cudapool process publishes of itself (`publish` writes it,
//! `pages` reads it). One fixed-size `#[repr(C)]` record per process; `LAYOUT_VERSION` changes
//! whenever its layout does.

use crate::limits::budget::DeviceStats;
use std::sync::atomic::AtomicU64;

pub const MAGIC: u64 = u64::from_le_bytes(*b"CUDAPOOL");
pub const LAYOUT_VERSION: u32 = 8;
/// The longest path a snapshot request may name (with its NUL).
pub const REQUEST_PATH: usize = 1024;
/// The longest reason a served request may give for failing (with its NUL).
pub const REQUEST_ERROR: usize = 256;
pub const MAX_DEVICES: usize = 64;
/// Counters per device: [`DeviceStats`] in its order, but with the requested bytes (added in
/// layout 4), the overhead (layout 6), the asleep bytes and the sleep state (layout 7), the
/// panics (layout 8), why and since when it sleeps and when it was last active (layout 9) last.
pub const FIELDS: usize = 26;

/// The longest group name (`CUDAPOOL_GROUP`), NUL-padded in the page.
pub const GROUP_NAME: usize = 64;

/// One device in the page.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct PageDevice {
    pub device: i32,
    /// 1 if the device was used.
    pub used: u32,
    /// Its UUID (all zero if the driver did not say).
    pub uuid: [u8; 16],
    pub stats: [u64; FIELDS],
}

/// What the page says of one device.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceFigures {
    pub device: i32,
    pub uuid: Option<[u8; 16]>,
    pub stats: DeviceStats,
}

pub use crate::base::log::fmt_uuid;

/// The shared page. Its process writes it with `pwrite`; readers copy it with `pread`; nobody
/// maps it (a file someone can truncate is never mapped).
#[repr(C)]
pub struct Page {
    pub magic: u64,
    pub version: u32,
    pub pid: u32,
    /// Odd while the writer is writing.
    pub seq: AtomicU64,
    /// When it was last written, ns since the Unix epoch.
    pub updated_ns: AtomicU64,
    /// The pool kind's name, NUL-padded.
    pub pool: [u8; 8],
    /// The process's group (`CUDAPOOL_GROUP`), NUL-padded; empty when it is in none.
    pub group: [u8; GROUP_NAME],
    pub devices: [PageDevice; MAX_DEVICES],
    /// A snapshot asked from outside (`cudapool snapshot PID`): the asker writes `snap_format`
    /// (0 JSON, 1 PyTorch's pickle) and `snap_path` (absolute, NUL-terminated), then bumps
    /// `snap_request`; the process writes the file there, new, and sets `snap_served` to the
    /// request it served.
    pub snap_request: AtomicU64,
    pub snap_served: AtomicU64,
    pub snap_format: AtomicU64,
    pub snap_path: [u8; REQUEST_PATH],
    /// Why the request `snap_served` names failed, NUL-terminated; empty when it was written.
    /// For the asker to report: an observer's mistake never reaches the program's stderr.
    pub snap_error: [u8; REQUEST_ERROR],
    /// A sleep or wake asked from outside (`cudapool sleep|wake PID`): the asker writes
    /// `sleep_what` (1 sleep, 2 wake, 3 sleep if idle) and `sleep_timeout_ms` (how long a sleep
    /// waits for device work to drain; for 3, how long the work must have been idle), then
    /// bumps `sleep_request`; the process writes `sleep_answer` and then
    /// sets `sleep_served` to the request it served.
    pub sleep_request: AtomicU64,
    pub sleep_served: AtomicU64,
    pub sleep_what: AtomicU64,
    pub sleep_timeout_ms: AtomicU64,
    /// NUL-terminated: `moved DEVICE_BYTES COPIED_BYTES SECONDS`, or `refused WHY`.
    pub sleep_answer: [u8; REQUEST_ERROR],
}

/// A sleep or wake asked through the page.
pub struct SleepRequest {
    pub seq: u64,
    pub wake: bool,
    /// A sleep only if the process's device work has been idle for `timeout` (root's arbiter,
    /// `sleep_what` 3); else `timeout` is how long a sleep waits for its work to drain.
    pub if_idle: bool,
    pub timeout: std::time::Duration,
}

/// A snapshot asked for through the page.
pub struct SnapshotRequest {
    pub seq: u64,
    pub torch: bool,
    pub path: std::path::PathBuf,
}

pub fn stats_to_array(s: &DeviceStats) -> [u64; FIELDS] {
    [
        s.allocated,
        s.allocated_peak,
        s.reserved,
        s.reserved_peak,
        s.cached,
        s.live_allocations,
        s.segments,
        s.alloc_calls,
        s.free_calls,
        s.cache_hits,
        s.driver_allocs,
        s.driver_frees,
        s.reclaim_retries,
        s.ooms,
        s.hard_limit,
        s.soft_limit,
        s.requested,
        s.requested_peak,
        s.overhead,
        s.asleep,
        s.sleep_state,
        s.waking_for,
        s.panics,
        s.sleep_cause,
        s.asleep_since_ns,
        s.active_ns,
    ]
}

pub fn array_to_stats(a: &[u64; FIELDS]) -> DeviceStats {
    DeviceStats {
        allocated: a[0],
        allocated_peak: a[1],
        reserved: a[2],
        reserved_peak: a[3],
        cached: a[4],
        live_allocations: a[5],
        segments: a[6],
        alloc_calls: a[7],
        free_calls: a[8],
        cache_hits: a[9],
        driver_allocs: a[10],
        driver_frees: a[11],
        reclaim_retries: a[12],
        ooms: a[13],
        hard_limit: a[14],
        soft_limit: a[15],
        requested: a[16],
        requested_peak: a[17],
        overhead: a[18],
        asleep: a[19],
        sleep_state: a[20],
        waking_for: a[21],
        panics: a[22],
        sleep_cause: a[23],
        asleep_since_ns: a[24],
        active_ns: a[25],
    }
}
