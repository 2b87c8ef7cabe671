//! Live stats from outside (`cudapool stat`/`top`): every cudapool process publishes its
//! per-device counters in a small shared-memory file, `/dev/shm/cudapool-<uid>-<pid>`, mode
//! 0600 (only the same user can read it), removed at exit. A crashed process's file is removed
//! by the next `cudapool stat`.
//!
//! The page is written when the state's observer is sampled (`report::Reporting`): on slow
//! paths (driver calls, OOMs, reclaims, teardown, limit changes) and every few hundred
//! allocations of a thread (`state::sample_due`), never on a cache hit otherwise. A seqlock
//! keeps readers consistent: the writer makes `seq` odd, writes, makes it even; a reader
//! retries if `seq` was odd or changed.
//!
//! Uses: `budget`.

use crate::budget::DeviceStats;
use std::ffi::CString;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}
pub const MAGIC: u64 = u64::from_le_bytes(*b"CUDAPOOL");
pub const LAYOUT_VERSION: u32 = 1;
pub const MAX_DEVICES: usize = 64;
/// Counters per device, in [`DeviceStats`] order.
pub const FIELDS: usize = 16;

/// One device in the page.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct PageDevice {
    pub device: i32,
    /// 1 if the device was used.
    pub used: u32,
    pub stats: [u64; FIELDS],
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
    pub devices: [PageDevice; MAX_DEVICES],
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
    }
}

/// `/dev/shm/cudapool-<uid>-` (the prefix of every page of this user).
pub fn prefix() -> String {
    // SAFETY: getuid has no preconditions.
    format!("/dev/shm/cudapool-{}-", unsafe { libc::getuid() })
}

/// This process's page, while it is mapped.
pub struct Publisher {
    page: *mut Page,
    path: CString,
    owner: u32,
    writing: Mutex<()>,
}

// SAFETY: the page is shared memory written under `writing` and read through atomics and the
// seqlock; the pointer stays valid until `unlink` at exit.
unsafe impl Send for Publisher {}
// SAFETY: as above.
unsafe impl Sync for Publisher {}

impl Publisher {
    /// Creates and maps the page; `None` (and a debug line) if /dev/shm is unusable.
    pub fn create(pool: &str) -> Option<Publisher> {
        let pid = std::process::id();
        let path = CString::new(format!("{}{pid}", prefix())).ok()?;
        let size = std::mem::size_of::<Page>();
        // SAFETY: plain syscalls on a path we own; every result is checked before use, and the
        // mapping is sized to the file.
        unsafe {
            let fd = libc::open(
                path.as_ptr(),
                libc::O_CREAT | libc::O_RDWR | libc::O_TRUNC | libc::O_CLOEXEC,
                0o600,
            );
            if fd < 0 {
                return None;
            }
            if libc::ftruncate(fd, size as libc::off_t) != 0 {
                libc::close(fd);
                libc::unlink(path.as_ptr());
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
                libc::unlink(path.as_ptr());
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
            // The magic last: a reader that sees it sees a filled header.
            std::ptr::write_volatile(&mut header.magic, MAGIC);
            Some(Publisher {
                page,
                path,
                owner: pid,
                writing: Mutex::new(()),
            })
        }
    }

    /// Writes the figures of `devices`. Skips if another thread is writing right now, or in a
    /// forked child (the page is the parent's).
    pub fn write(&self, devices: &[(i32, DeviceStats)]) {
        if std::process::id() != self.owner {
            return;
        }
        let Ok(_w) = self.writing.try_lock() else {
            return;
        };
        // SAFETY: the page is mapped read-write for the life of the process (until `remove`);
        // only this writer (under `writing`) stores into it.
        let page = unsafe { &mut *self.page };
        page.seq.fetch_add(1, Ordering::AcqRel);
        for &(dev, ref s) in devices {
            if let Some(slot) = usize::try_from(dev)
                .ok()
                .and_then(|d| page.devices.get_mut(d))
            {
                // SAFETY: a plain store into our mapping; readers retry on a torn read.
                unsafe {
                    std::ptr::write_volatile(
                        slot,
                        PageDevice {
                            device: dev,
                            used: 1,
                            stats: stats_to_array(s),
                        },
                    )
                };
            }
        }
        let now = now_ns();
        page.updated_ns.store(now, Ordering::Relaxed);
        page.seq.fetch_add(1, Ordering::AcqRel);
    }

    /// Removes the file (at exit). The mapping stays until the process ends.
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
    pub updated_ns: u64,
    pub devices: Vec<(i32, DeviceStats)>,
}

/// Reads a page (consistently, through the seqlock); `None` if it is not a cudapool page.
pub fn read(path: &std::path::Path) -> Option<Snapshot> {
    let bytes = std::fs::read(path).ok()?;
    if bytes.len() < std::mem::size_of::<Page>() {
        return None;
    }
    for _ in 0..100 {
        let bytes = std::fs::read(path).ok()?;
        if bytes.len() < std::mem::size_of::<Page>() {
            return None;
        }
        // SAFETY: the buffer is at least one Page long; Page is plain old data (atomics are
        // plain integers in memory); read_unaligned copes with the Vec's alignment.
        let page: Page = unsafe { std::ptr::read_unaligned(bytes.as_ptr() as *const Page) };
        if page.magic != MAGIC || page.version != LAYOUT_VERSION {
            return None;
        }
        let seq = page.seq.load(Ordering::Relaxed);
        if seq % 2 == 1 {
            std::thread::sleep(std::time::Duration::from_millis(1));
            continue;
        }
        // A file read is one copy: if seq was even at both ends of the copy, it is whole.
        let again = std::fs::read(path).ok()?;
        // SAFETY: as above.
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
            .map(|d| (d.device, array_to_stats(&d.stats)))
            .collect();
        return Some(Snapshot {
            pid: page.pid,
            pool,
            updated_ns: page.updated_ns.load(Ordering::Relaxed),
            devices,
        });
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_round_trips_through_the_file() {
        let p = Publisher::create("split").expect("/dev/shm usable");
        let s = DeviceStats {
            allocated: 7,
            reserved: 9,
            hard_limit: 1 << 30,
            ooms: 2,
            ..Default::default()
        };
        p.write(&[(0, s), (3, DeviceStats::default())]);
        let path = std::path::PathBuf::from(format!("{}{}", prefix(), std::process::id()));
        let r = read(&path).expect("readable");
        assert_eq!(r.pid, std::process::id());
        assert_eq!(r.pool, "split");
        assert_eq!(r.devices.len(), 2);
        assert_eq!(r.devices[0], (0, s));
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
}
