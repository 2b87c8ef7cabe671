//! Live stats from outside (`cudapool stat`/`top`, the exporter): every cudapool process
//! publishes its per-device counters in a small file of its user's runtime directory
//! (`rundir`), `page-<pid>`, mode 0600, removed at exit. A crashed process's page is removed
//! by the next reader of its user (`pages`).
//!
//! The page is written when the state's observer is sampled (`report::Reporting`): on slow
//! paths (driver calls, OOMs, reclaims, teardown, limit changes) and every few hundred
//! allocations and frees of a thread on a device (`state::sample_due`), never on a cache hit
//! otherwise. A seqlock keeps readers consistent: the writer makes `seq` odd, writes, makes it
//! even; a reader retries if `seq` was odd or changed.
//!
//! **Nothing around it can crash the process.** The file's blocks are reserved
//! (`posix_fallocate`) before it is mapped, so a full filesystem costs the page (one warning
//! line), never a SIGBUS at the first write; the file is created new in a directory only this
//! user can write, never through a link. **Alive** is the kernel's word: the process holds a
//! classic record lock on the page's first byte for its life (the kernel drops it however the
//! process ends, and names the holder's pid to a reader), so a reader neither trusts the pid
//! the page claims nor confuses two processes of one pid in different pid namespaces.
//!
//! Uses: `report::page`, `rundir`, `log`, `config`.

use super::page::{stats_to_array, DeviceFigures, Page, PageDevice, SnapshotRequest};
use super::page::{GROUP_NAME, LAYOUT_VERSION, MAGIC};
use crate::base::config::LogLevel::Warn;
use crate::base::rundir::{self, RunDir};
use crate::log_at;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::Ordering;
use std::sync::Mutex;

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// The page's name for process `pid` (`.k` when another process of that pid, in another pid
/// namespace, holds the plain name).
pub fn page_name(pid: u32, k: usize) -> String {
    match k {
        0 => format!("page-{pid}"),
        k => format!("page-{pid}.{k}"),
    }
}

/// Where the page of process `pid` of this user lies when the runtime directory is the default
/// and nobody squats it (for tests and tools; readers find pages with `pages::live`).
pub fn default_page_path(pid: u32) -> std::path::PathBuf {
    // SAFETY: getuid has no preconditions.
    rundir::default_path(unsafe { libc::getuid() }, 0).join(page_name(pid, 0))
}

/// The pid a page's name gives (`page-<pid>` or `page-<pid>.<k>`).
pub fn pid_of_name(name: &str) -> Option<u32> {
    let rest = name.strip_prefix("page-")?;
    let pid = rest
        .split_once('.')
        .map_or(rest, |(p, k)| if k.parse::<u8>().is_ok() { p } else { "" });
    pid.parse().ok()
}

/// This process's page, while it is mapped.
pub struct Publisher {
    page: *mut Page,
    dir: RunDir,
    name: String,
    /// Kept open: it carries the process's liveness lock.
    _fd: OwnedFd,
    owner: u32,
    /// What was written last, and when (ns since the epoch).
    writing: Mutex<(Vec<DeviceFigures>, u64)>,
}

// SAFETY: the page is shared memory written under `writing` and read through atomics and the
// seqlock; the pointer stays valid for the life of the process (it is never unmapped).
unsafe impl Send for Publisher {}
// SAFETY: as above.
unsafe impl Sync for Publisher {}

impl Publisher {
    /// Creates and maps this process's page in its user's runtime directory (`configured`:
    /// `CUDAPOOL_RUNTIME_DIR`). `None`, with one warning line saying why, when there can be
    /// none: the program runs on without it.
    pub fn create(
        pool: &str,
        group: Option<&str>,
        configured: Option<&std::path::Path>,
    ) -> Option<Publisher> {
        let dir = match rundir::mine(configured) {
            Ok((dir, said)) => {
                if let Some(line) = said {
                    log_at!(Warn, "{line}");
                }
                dir
            }
            Err(why) => {
                log_at!(Warn, "no live stats page for this process: {why}");
                return None;
            }
        };
        match Self::create_in(dir, pool, group) {
            Ok(p) => Some(p),
            Err(why) => {
                log_at!(Warn, "no live stats page for this process: {why}");
                None
            }
        }
    }

    /// Creates and maps a page in `dir`, new (`O_EXCL`), mode 0600. A page of the same name
    /// whose holder is gone is stale (a dead process had our pid): it is removed, once.
    pub fn create_in(dir: RunDir, pool: &str, group: Option<&str>) -> Result<Publisher, String> {
        let pid = std::process::id();
        let size = std::mem::size_of::<Page>();
        let excl = libc::O_CREAT | libc::O_EXCL | libc::O_RDWR;
        let mut made = None;
        'names: for k in 0..4 {
            let name = page_name(pid, k);
            for _ in 0..2 {
                match dir.open(&name, excl) {
                    Ok(fd) => {
                        made = Some((name, fd));
                        break 'names;
                    }
                    Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
                    Err(e) => return Err(format!("{}: {e}", dir.file(&name).display())),
                }
                // Someone's page of our pid: a live one (another pid namespace) keeps it.
                match rundir::open_found(&dir, &name, libc::O_RDONLY) {
                    Ok((fd, _)) if rundir::lock_holder(fd.as_raw_fd()).is_some() => continue 'names,
                    _ => dir.unlink(&name),
                }
            }
        }
        let Some((name, fd)) = made else {
            return Err(format!(
                "no free page name for pid {pid} in {}",
                dir.path().display()
            ));
        };
        let fail = |why: String| {
            dir.unlink(&name);
            Err(format!("{}: {why}", dir.file(&name).display()))
        };
        // The lock first: from now on a reader sees a live process, never a stale file.
        if !rundir::hold(fd.as_raw_fd()) {
            return fail(format!("cannot lock: {}", std::io::Error::last_os_error()));
        }
        if let Err(e) = rundir::reserve(fd.as_raw_fd(), size) {
            return fail(format!("cannot reserve {size} bytes: {e}"));
        }
        // SAFETY: mapping `size` bytes of a file of ours whose blocks are all allocated.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return fail(format!("cannot map: {}", std::io::Error::last_os_error()));
        }
        let page = p as *mut Page;
        let mut kind = [0u8; 8];
        let n = pool.len().min(8);
        kind[..n].copy_from_slice(&pool.as_bytes()[..n]);
        // SAFETY: a fresh mapping of a whole Page (zero-filled by fallocate) that no reader
        // trusts before the magic.
        unsafe {
            let header = &mut *page;
            header.version = LAYOUT_VERSION;
            header.pid = pid;
            header.pool = kind;
            let group = group.unwrap_or("").as_bytes();
            let n = group.len().min(GROUP_NAME);
            header.group[..n].copy_from_slice(&group[..n]);
            // The magic last: a reader that sees it sees a filled header.
            std::ptr::write_volatile(&mut header.magic, MAGIC);
        }
        Ok(Publisher {
            page,
            dir,
            name,
            _fd: fd,
            owner: pid,
            writing: Mutex::new((Vec::new(), 0)),
        })
    }

    /// The page's path (for messages and tests).
    pub fn path(&self) -> std::path::PathBuf {
        self.dir.file(&self.name)
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
        // SAFETY: the page is mapped read-write for the life of the process; only this writer
        // (under `writing`) stores into it.
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

    /// The request `seq` was served: its file written, or (`error`) failed for good, which the
    /// asker reads and reports.
    pub fn served(&self, seq: u64, error: Option<&str>) {
        let mut why = [0u8; super::page::REQUEST_ERROR];
        if let Some(e) = error {
            let n = e.len().min(why.len() - 1);
            why[..n].copy_from_slice(&e.as_bytes()[..n]);
        }
        // SAFETY: as in `pending_request`; a plain store of bytes the asker reads only after
        // `snap_served` (Release below).
        unsafe {
            std::ptr::write_volatile(&mut (*self.page).snap_error, why);
            (*self.page).snap_served.store(seq, Ordering::Release);
        }
    }

    /// Removes the file (at exit). The mapping stays until the process ends.
    pub fn remove(&self) {
        if std::process::id() == self.owner {
            self.dir.unlink(&self.name);
        }
    }
}
