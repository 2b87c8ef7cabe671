//! Live stats from outside (`cudapool stat`/`top`): every cudapool process publishes its
//! per-device counters in a small shared-memory file, `/dev/shm/cudapool-<uid>-<pid>`, mode
//! 0600 (only the same user can read it), removed at exit. A crashed process's file is removed
//! by the next `cudapool stat`.
//!
//! The page is written when the state's observer is sampled (`report::Reporting`): on slow
//! paths (driver calls, OOMs, reclaims, teardown, limit changes) and every few hundred
//! allocations and frees of a thread on a device (`state::sample_due`), never on a cache hit otherwise. A seqlock
//! keeps readers consistent: the writer makes `seq` odd, writes, makes it even; a reader
//! retries if `seq` was odd or changed.
//!
//! Uses: `budget`.

use crate::budget::DeviceStats;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}
pub const MAGIC: u64 = u64::from_le_bytes(*b"CUDAPOOL");
pub const LAYOUT_VERSION: u32 = 4;
/// The longest path a snapshot request may name (with its NUL).
pub const REQUEST_PATH: usize = 1024;
pub const MAX_DEVICES: usize = 64;
/// Counters per device: [`DeviceStats`] in its order, but with the requested bytes (added in
/// layout 4) last.
pub const FIELDS: usize = 18;

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

/// A UUID as `nvidia-smi -L` prints it: `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
pub fn fmt_uuid(u: &[u8; 16]) -> String {
    let h: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// The shared page. Readers map it read-only.
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
    }
}

/// `/dev/shm/cudapool-<uid>-` (the prefix of every page of this user).
pub fn prefix() -> String {
    format!("/dev/shm/cudapool-{}-", uid())
}

/// This process's page, while it is mapped.
pub struct Publisher {
    page: *mut Page,
    path: CString,
    owner: u32,
    /// What was written last, and when (ns since the epoch).
    writing: Mutex<(Vec<DeviceFigures>, u64)>,
}

// SAFETY: the page is shared memory written under `writing` and read through atomics and the
// seqlock; the pointer stays valid until `unlink` at exit.
unsafe impl Send for Publisher {}
// SAFETY: as above.
unsafe impl Sync for Publisher {}

impl Publisher {
    /// Creates and maps this process's page; `None` (and a debug line) if /dev/shm is unusable
    /// or anything but a stale page of our own is at its path.
    pub fn create(pool: &str, group: Option<&str>) -> Option<Publisher> {
        let path = format!("{}{}", prefix(), std::process::id());
        Self::create_at(std::path::Path::new(&path), pool, group)
    }

    /// Creates and maps a page at `path` (in a directory every user may write to: nothing
    /// found there is trusted). The file is created new, never through a link, mode 0600. A
    /// regular file of ours already there is a stale page (a dead process had our pid): it is
    /// removed, once. Anything else there means no page, never a write through it.
    pub fn create_at(path: &std::path::Path, pool: &str, group: Option<&str>) -> Option<Publisher> {
        let pid = std::process::id();
        let cpath = CString::new(path.as_os_str().as_encoded_bytes()).ok()?;
        let size = std::mem::size_of::<Page>();
        let mut fd = -1;
        for _ in 0..2 {
            // SAFETY: open(2) of a NUL-terminated path; O_EXCL | O_NOFOLLOW: it creates a new
            // file or fails, and never follows a link.
            fd = unsafe {
                libc::open(
                    cpath.as_ptr(),
                    libc::O_CREAT
                        | libc::O_EXCL
                        | libc::O_RDWR
                        | libc::O_NOFOLLOW
                        | libc::O_CLOEXEC,
                    0o600,
                )
            };
            if fd >= 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EEXIST) {
                break;
            }
            match lstat(&cpath) {
                Some(st) if is_regular(&st) && st.st_uid == uid() => {
                    // SAFETY: unlink of a path we checked is a regular file of ours.
                    unsafe { libc::unlink(cpath.as_ptr()) };
                }
                _ => {
                    crate::log_at!(
                        crate::config::LogLevel::Debug,
                        "{} exists and is not a page of this user: no live stats for this process",
                        path.display()
                    );
                    return None;
                }
            }
        }
        if fd < 0 {
            return None;
        }
        // SAFETY: plain syscalls on the file we have just created; every result is checked
        // before use, and the mapping is sized to the file.
        unsafe {
            if libc::ftruncate(fd, size as libc::off_t) != 0 {
                libc::close(fd);
                libc::unlink(cpath.as_ptr());
                return None;
            }
            let p = libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            );
            libc::close(fd);
            if p == libc::MAP_FAILED {
                libc::unlink(cpath.as_ptr());
                return None;
            }
            let page = p as *mut Page;
            let mut name = [0u8; 8];
            let n = pool.len().min(8);
            name[..n].copy_from_slice(&pool.as_bytes()[..n]);
            let header = &mut *page;
            header.version = LAYOUT_VERSION;
            header.pid = pid;
            header.pool = name;
            let group = group.unwrap_or("").as_bytes();
            let n = group.len().min(GROUP_NAME);
            header.group[..n].copy_from_slice(&group[..n]);
            // The magic last: a reader that sees it sees a filled header.
            std::ptr::write_volatile(&mut header.magic, MAGIC);
            Some(Publisher {
                page,
                path: cpath,
                owner: pid,
                writing: Mutex::new((Vec::new(), 0)),
            })
        }
    }

    /// Writes the figures of `devices`. Skips if another thread is writing right now, or in a
    /// forked child (the page is the parent's).
    pub fn write(&self, devices: &[DeviceFigures]) {
        self.write_if(devices, |_, _| true);
    }

    /// Writes `devices` if they differ from what was written last, or that is older than
    /// `heartbeat` (so an idle process's page stays fresh, and its `updated` age says it lives).
    pub fn refresh(&self, devices: &[DeviceFigures], heartbeat: std::time::Duration) {
        self.write_if(devices, |last, at| {
            last != devices || now_ns().saturating_sub(at) >= heartbeat.as_nanos() as u64
        });
    }

    fn write_if(&self, devices: &[DeviceFigures], due: impl FnOnce(&[DeviceFigures], u64) -> bool) {
        if std::process::id() != self.owner {
            return;
        }
        let Ok(mut last) = self.writing.try_lock() else {
            return;
        };
        if !due(&last.0, last.1) {
            return;
        }
        // SAFETY: the page is mapped read-write for the life of the process (until `remove`);
        // only this writer (under `writing`) stores into it.
        let page = unsafe { &mut *self.page };
        page.seq.fetch_add(1, Ordering::AcqRel);
        for d in devices {
            if let Some(slot) = usize::try_from(d.device)
                .ok()
                .and_then(|i| page.devices.get_mut(i))
            {
                // SAFETY: a plain store into our mapping; readers retry on a torn read.
                unsafe {
                    std::ptr::write_volatile(
                        slot,
                        PageDevice {
                            device: d.device,
                            used: 1,
                            uuid: d.uuid.unwrap_or_default(),
                            stats: stats_to_array(&d.stats),
                        },
                    )
                };
            }
        }
        let now = now_ns();
        page.updated_ns.store(now, Ordering::Relaxed);
        page.seq.fetch_add(1, Ordering::AcqRel);
        *last = (devices.to_vec(), now);
    }

    /// Removes the file (at exit). The mapping stays until the process ends.
    /// The snapshot asked for and not yet served, if any.
    pub fn pending_request(&self) -> Option<SnapshotRequest> {
        // SAFETY: the page stays mapped for the life of the process; the request fields are
        // read through atomics, the path as bytes (a torn path fails to open, harmlessly).
        let page = unsafe { &*self.page };
        let seq = page.snap_request.load(Ordering::Acquire);
        if seq == page.snap_served.load(Ordering::Acquire) || std::process::id() != self.owner {
            return None;
        }
        // SAFETY: as above; a copy of plain bytes.
        let raw = unsafe { std::ptr::read_volatile(&page.snap_path) };
        let len = raw.iter().position(|&b| b == 0).unwrap_or(0);
        let path = std::path::PathBuf::from(std::ffi::OsStr::from_bytes(&raw[..len]));
        Some(SnapshotRequest {
            seq,
            torch: page.snap_format.load(Ordering::Relaxed) == 1,
            path,
        })
    }

    /// The request `seq` was served (its file written, or failed for good).
    pub fn served(&self, seq: u64) {
        // SAFETY: as in `pending_request`.
        unsafe { &*self.page }
            .snap_served
            .store(seq, Ordering::Release);
    }

    pub fn remove(&self) {
        if std::process::id() == self.owner {
            // SAFETY: unlink of our own path.
            unsafe { libc::unlink(self.path.as_ptr()) };
        }
    }
}

/// What `cudapool stat` reads of one process.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub pid: u32,
    pub pool: String,
    /// Its group, when it is in one.
    pub group: Option<String>,
    pub updated_ns: u64,
    pub devices: Vec<DeviceFigures>,
}

fn uid() -> libc::uid_t {
    // SAFETY: getuid has no preconditions.
    unsafe { libc::getuid() }
}

fn is_regular(st: &libc::stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFREG
}

/// `lstat(2)`: what is at `path` itself (a link is not followed).
fn lstat(path: &CString) -> Option<libc::stat> {
    // SAFETY: a zeroed stat is a valid out-struct; lstat writes it or fails.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a valid out-pointer.
    (unsafe { libc::lstat(path.as_ptr(), &mut st) } == 0).then_some(st)
}

/// Whether `path` holds something a page reader may look at: a regular file of this user (not
/// a link). For removing stale pages.
pub fn is_page_file(path: &std::path::Path) -> bool {
    CString::new(path.as_os_str().as_encoded_bytes())
        .ok()
        .and_then(|c| lstat(&c))
        .is_some_and(|st| is_regular(&st) && st.st_uid == uid())
}

/// A page found in `/dev/shm`: its path, the process and the user its name says.
#[derive(Clone, Debug)]
pub struct PageFile {
    pub path: std::path::PathBuf,
    pub pid: u32,
    pub uid: u32,
}

/// Every page in `/dev/shm` named for a process that is alive: of this user, or (`all_users`,
/// for root) of every user. A page of this user whose process died is removed (only a regular
/// file of ours: nothing else there is touched or read).
pub fn pages(all_users: bool) -> Vec<PageFile> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir("/dev/shm") else {
        return out;
    };
    let me = uid();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some((owner, pid)) = name
            .strip_prefix("cudapool-")
            .and_then(|rest| rest.split_once('-'))
            .and_then(|(u, p)| Some((u.parse::<u32>().ok()?, p.parse::<u32>().ok()?)))
        else {
            continue;
        };
        if owner != me && !all_users {
            continue;
        }
        // SAFETY: kill with signal 0 only checks that the process exists.
        let alive = unsafe { libc::kill(pid as libc::pid_t, 0) } == 0
            || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
        if alive {
            out.push(PageFile {
                path: e.path(),
                pid,
                uid: owner,
            });
        } else if owner == me && is_page_file(&e.path()) {
            let _ = std::fs::remove_file(e.path());
        }
    }
    out.sort_by_key(|p| (p.pid, p.uid));
    out
}

/// An open file, closed when dropped.
struct Fd(libc::c_int);

impl Drop for Fd {
    fn drop(&mut self) {
        // SAFETY: the descriptor is ours and closed once.
        unsafe { libc::close(self.0) };
    }
}

/// Reads `buf.len()` bytes at offset 0, or fails (a short read included).
fn read_exact_at(fd: &Fd, buf: &mut [u8]) -> Result<(), String> {
    let mut done = 0;
    while done < buf.len() {
        // SAFETY: pread into the unfilled rest of `buf`, whose length bounds the read.
        let n = unsafe {
            libc::pread(
                fd.0,
                buf[done..].as_mut_ptr().cast(),
                buf.len() - done,
                done as libc::off_t,
            )
        };
        match n {
            n if n > 0 => done += n as usize,
            0 => return Err(format!("ended after {done} bytes (truncated while read)")),
            _ if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) => {}
            _ => return Err(format!("read: {}", std::io::Error::last_os_error())),
        }
    }
    Ok(())
}

/// Opens a page found at `path` with `mode` (`O_RDONLY` or `O_RDWR`): never through a link,
/// never blocking (a FIFO opens at once and fails the checks), and only a regular file of
/// `owner` exactly one page long.
fn open_page(path: &std::path::Path, mode: libc::c_int, owner: u32) -> Result<Fd, String> {
    let cpath = CString::new(path.as_os_str().as_encoded_bytes()).map_err(|e| e.to_string())?;
    // SAFETY: open(2) of a NUL-terminated path, never through a link, never blocking.
    let fd = unsafe {
        libc::open(
            cpath.as_ptr(),
            mode | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(format!("cannot open: {}", std::io::Error::last_os_error()));
    }
    let fd = Fd(fd);
    // SAFETY: a zeroed stat is a valid out-struct; fstat writes it for our descriptor.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a descriptor we hold and a valid out-pointer.
    if unsafe { libc::fstat(fd.0, &mut st) } != 0 {
        return Err(format!("cannot stat: {}", std::io::Error::last_os_error()));
    }
    let size = std::mem::size_of::<Page>();
    if !is_regular(&st) {
        return Err("not a regular file".into());
    }
    if st.st_uid != owner {
        return Err(format!("owned by user {}, not by user {owner}", st.st_uid));
    }
    if st.st_size as u64 != size as u64 {
        return Err(format!("{} bytes, not one page ({size} bytes)", st.st_size));
    }
    Ok(fd)
}

/// Reads a page (consistently, through the seqlock). `Err` says why `path` is not one: it is
/// opened without following a link and without blocking (a FIFO), must be a regular file of
/// this user exactly one page long, and no more than a page is ever read from it.
pub fn read(path: &std::path::Path) -> Result<Snapshot, String> {
    read_owned(path, uid())
}

/// [`read`], for a page that must belong to user `owner` (root reading every user's pages).
pub fn read_owned(path: &std::path::Path, owner: u32) -> Result<Snapshot, String> {
    let fd = open_page(path, libc::O_RDONLY, owner)?;
    let size = std::mem::size_of::<Page>();
    let mut first = vec![0u8; size];
    let mut again = vec![0u8; size];
    for _ in 0..100 {
        read_exact_at(&fd, &mut first)?;
        // SAFETY: the buffer is exactly one Page long; Page is plain old data (atomics are
        // plain integers in memory); read_unaligned copes with the Vec's alignment.
        let page: Page = unsafe { std::ptr::read_unaligned(first.as_ptr() as *const Page) };
        if page.magic != MAGIC || page.version != LAYOUT_VERSION {
            return Err("not a cudapool page (magic or layout version)".into());
        }
        let seq = page.seq.load(Ordering::Relaxed);
        if seq % 2 == 1 {
            std::thread::sleep(std::time::Duration::from_millis(1));
            continue;
        }
        // A read is one copy: if seq was even and the same at both ends, it is whole.
        read_exact_at(&fd, &mut again)?;
        // SAFETY: as above; `again` is exactly one Page long too.
        let page2: Page = unsafe { std::ptr::read_unaligned(again.as_ptr() as *const Page) };
        if page2.seq.load(Ordering::Relaxed) != seq {
            continue;
        }
        let pool = String::from_utf8_lossy(&page.pool)
            .trim_end_matches('\0')
            .to_string();
        let devices = page
            .devices
            .iter()
            .filter(|d| d.used == 1)
            .map(|d| DeviceFigures {
                device: d.device,
                uuid: (d.uuid != [0; 16]).then_some(d.uuid),
                stats: array_to_stats(&d.stats),
            })
            .collect();
        let group = String::from_utf8_lossy(&page.group)
            .trim_end_matches('\0')
            .to_string();
        return Ok(Snapshot {
            pid: page.pid,
            pool,
            group: (!group.is_empty()).then_some(group),
            updated_ns: page.updated_ns.load(Ordering::Relaxed),
            devices,
        });
    }
    Err("always being written".into())
}

/// Asks the process whose page is at `page_path` (checked as `read` checks it) to write a
/// snapshot to `target` (absolute; created new by the process) and waits for it, at most
/// `timeout`. The process answers from its snapshot thread within about 50 ms.
pub fn ask_snapshot(
    page_path: &std::path::Path,
    target: &std::path::Path,
    torch: bool,
    timeout: std::time::Duration,
) -> Result<(), String> {
    let bytes = target.as_os_str().as_bytes();
    if !target.is_absolute() || bytes.len() >= REQUEST_PATH || bytes.contains(&0) {
        return Err(format!(
            "{}: not an absolute path of fewer than {REQUEST_PATH} bytes",
            target.display()
        ));
    }
    let fd = open_page(page_path, libc::O_RDWR, uid())?;
    let size = std::mem::size_of::<Page>();
    // SAFETY: mapping `size` bytes of a regular file of exactly that size, shared, read-write.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.0,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(format!("cannot map: {}", std::io::Error::last_os_error()));
    }
    struct Mapping(*mut libc::c_void, usize);
    impl Drop for Mapping {
        fn drop(&mut self) {
            // SAFETY: our own mapping, unmapped once.
            unsafe { libc::munmap(self.0, self.1) };
        }
    }
    let map = Mapping(p, size);
    // SAFETY: the mapping is one whole Page, alive until `map` drops.
    let page = unsafe { &mut *(map.0 as *mut Page) };
    // SAFETY: plain loads from the mapping.
    let (magic, version) = unsafe {
        (
            std::ptr::read_volatile(&page.magic),
            std::ptr::read_volatile(&page.version),
        )
    };
    if magic != MAGIC || version != LAYOUT_VERSION {
        return Err("not a cudapool page of this version (magic or layout version)".into());
    }
    let mut path = [0u8; REQUEST_PATH];
    path[..bytes.len()].copy_from_slice(bytes);
    // SAFETY: plain stores into the mapping; the process reads them after `snap_request`.
    unsafe { std::ptr::write_volatile(&mut page.snap_path, path) };
    page.snap_format.store(torch as u64, Ordering::Relaxed);
    let seq = page.snap_request.fetch_add(1, Ordering::AcqRel) + 1;
    let deadline = std::time::Instant::now() + timeout;
    while page.snap_served.load(Ordering::Acquire) < seq {
        if std::time::Instant::now() > deadline {
            return Err(format!("no answer within {} s", timeout.as_secs()));
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_round_trips_through_the_file() {
        let p = Publisher::create("split", Some("job-7")).expect("/dev/shm usable");
        let s = DeviceStats {
            allocated: 7,
            reserved: 9,
            hard_limit: 1 << 30,
            ooms: 2,
            ..Default::default()
        };
        let uuid = [
            0xb1, 0x30, 0xed, 0x9d, 0xf6, 0x0d, 0x86, 0x09, 0xa9, 0x2c, 0x84, 0xec, 0x86, 0xed,
            0x66, 0xfb,
        ];
        let first = DeviceFigures {
            device: 0,
            uuid: Some(uuid),
            stats: s,
        };
        let other = DeviceFigures {
            device: 3,
            uuid: None,
            stats: DeviceStats::default(),
        };
        p.write(&[first.clone(), other.clone()]);
        let path = std::path::PathBuf::from(format!("{}{}", prefix(), std::process::id()));
        let r = read(&path).expect("readable");
        assert_eq!(r.pid, std::process::id());
        assert_eq!(r.pool, "split");
        assert_eq!(r.group.as_deref(), Some("job-7"));
        assert_eq!(r.devices, vec![first, other]);
        assert_eq!(fmt_uuid(&uuid), "GPU-b130ed9d-f60d-8609-a92c-84ec86ed66fb");
        assert!(pages(false)
            .iter()
            .any(|f| f.path == path && f.pid == std::process::id()));
        assert!(r.updated_ns > 0);
        let mode = std::fs::metadata(&path).unwrap().permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o077,
            0,
            "owner only"
        );
        p.remove();
        assert!(!path.exists());
    }

    /// A fresh directory for one test's files.
    fn scratch(name: &str) -> std::path::PathBuf {
        let d =
            std::env::temp_dir().join(format!("cudapool-publish-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// DESIGN.md trap 9: a link planted at the page's path is never followed (the file it
    /// points to stays as it was) and means no page.
    #[test]
    fn a_link_at_the_page_path_is_never_written_through() {
        let d = scratch("link");
        let target = d.join("victim");
        std::fs::write(&target, b"keep me").unwrap();
        let page = d.join("page");
        std::os::unix::fs::symlink(&target, &page).unwrap();
        assert!(Publisher::create_at(&page, "split", None).is_none());
        assert_eq!(std::fs::read(&target).unwrap(), b"keep me");
        assert!(std::fs::symlink_metadata(&page)
            .unwrap()
            .file_type()
            .is_symlink());
        // A dangling link too: nothing is created where it points.
        let gone = d.join("gone");
        let page2 = d.join("page2");
        std::os::unix::fs::symlink(&gone, &page2).unwrap();
        assert!(Publisher::create_at(&page2, "split", None).is_none());
        assert!(!gone.exists());
    }

    /// A regular file of ours at the path is a stale page (a dead process had our pid): it is
    /// replaced by a fresh one.
    #[test]
    fn a_stale_page_of_our_own_is_replaced() {
        let d = scratch("stale");
        let page = d.join("page");
        std::fs::write(&page, b"old").unwrap();
        let p = Publisher::create_at(&page, "binned", None).expect("replaced");
        p.write(&[DeviceFigures {
            device: 0,
            uuid: None,
            stats: DeviceStats::default(),
        }]);
        assert_eq!(read(&page).unwrap().pool, "binned");
    }

    /// `read` never blocks: a FIFO at a page path (nobody writes it) is skipped at once.
    #[test]
    fn the_reader_never_blocks_on_a_fifo() {
        let d = scratch("fifo");
        let page = d.join("page");
        let c = CString::new(page.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: mkfifo of a NUL-terminated path in our own directory.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let (tx, rx) = std::sync::mpsc::channel();
        let p = page.clone();
        std::thread::spawn(move || {
            let _ = tx.send(read(&p));
        });
        let r = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("read returned (a blocked open or read never does)");
        assert_eq!(r.unwrap_err(), "not a regular file");
    }

    /// `read` never reads more than a page: a huge file is skipped by its size, unread.
    #[test]
    fn the_reader_never_reads_more_than_a_page() {
        let d = scratch("huge");
        let page = d.join("page");
        let f = std::fs::File::create(&page).unwrap();
        f.set_len(1 << 30).unwrap(); // sparse: costs no disk
        let rss = || {
            // SAFETY: a zeroed rusage is a valid out-struct for getrusage.
            let mut u: libc::rusage = unsafe { std::mem::zeroed() };
            // SAFETY: RUSAGE_SELF and a valid out-pointer.
            unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
            u.ru_maxrss as u64 * 1024
        };
        let before = rss();
        let why = read(&page).unwrap_err();
        assert!(why.contains("not one page"), "{why}");
        assert!(rss() < before + (64 << 20), "read a 1 GiB file into memory");
        // A short one (a page cut in half) too.
        let p = Publisher::create_at(&d.join("full"), "split", None).unwrap();
        p.write(&[DeviceFigures {
            device: 0,
            uuid: None,
            stats: DeviceStats::default(),
        }]);
        let bytes = std::fs::read(d.join("full")).unwrap();
        std::fs::write(&page, &bytes[..bytes.len() / 2]).unwrap();
        assert!(read(&page).unwrap_err().contains("not one page"));
    }

    /// A page of another user is skipped (the reader runs for the caller only). Creating a file
    /// of another user needs root; elsewhere this test says it did not run.
    #[test]
    fn the_reader_skips_files_of_another_user() {
        let d = scratch("owner");
        let page = d.join("page");
        let p = Publisher::create_at(&page, "split", None).unwrap();
        p.write(&[DeviceFigures {
            device: 0,
            uuid: None,
            stats: DeviceStats::default(),
        }]);
        assert!(read(&page).is_ok());
        if uid() != 0 {
            eprintln!("not root: the file of another user could not be made; not checked");
            return;
        }
        let c = CString::new(page.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: chown of our own file to the conventional `nobody`.
        assert_eq!(unsafe { libc::chown(c.as_ptr(), 65534, 65534) }, 0);
        let why = read(&page).unwrap_err();
        assert!(why.contains("owned by user 65534"), "{why}");
    }
}
