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
//! **Nothing around it can crash the process.** The page is written with `pwrite`, never
//! through a mapping: a full filesystem or someone truncating the file costs the page (one
//! warning line, or a page rewritten whole by its thread), never a SIGBUS; the file's blocks
//! are reserved (`posix_fallocate`) when it is made; it is created new in a directory only
//! this user can write, never through a link. **Alive** is the kernel's word: the process holds a
//! classic record lock on the page's first byte for its life (the kernel drops it however the
//! process ends, and names the holder's pid to a reader), so a reader neither trusts the pid
//! the page claims nor confuses two processes of one pid in different pid namespaces.

use super::page::{stats_to_array, DeviceFigures, Page, PageDevice, SnapshotRequest};
use super::page::{GROUP_NAME, LAYOUT_VERSION, MAGIC, MAX_DEVICES};
use crate::base::config::LogLevel::Warn;
use crate::base::pio;
use crate::base::rundir::{self, RunDir};
use crate::base::rundir_find;
use crate::log_at;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// How many names a process tries for its page (`page_name`'s `k`).
pub const PAGE_NAMES: usize = 4;

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
    rundir::default_path(unsafe { libc::getuid() }).join(page_name(pid, 0))
}

/// The pid a page's name gives (`page-<pid>` or `page-<pid>.<k>`).
pub fn pid_of_name(name: &str) -> Option<u32> {
    let rest = name.strip_prefix("page-")?;
    let pid = rest
        .split_once('.')
        .map_or(rest, |(p, k)| if k.parse::<u8>().is_ok() { p } else { "" });
    pid.parse().ok()
}

/// This process's page. It is written with `pwrite` into the file, never through a mapping:
/// someone who truncates it (the user's own cleanup script) costs the page, never a SIGBUS in
/// the program; the page's thread finds it cut and writes it whole again.
pub struct Publisher {
    dir: RunDir,
    name: String,
    /// Kept open: it carries the process's liveness lock.
    fd: OwnedFd,
    owner: u32,
    /// The header (magic, version, pid, pool, group) as written at creation.
    header: Header,
    /// What was written last, when (ns since the epoch), and the page's sequence word.
    writing: Mutex<Written>,
    /// The last ticket given out: a writer takes one before it reads its figures, so a higher
    /// ticket's figures were read later.
    tickets: AtomicU64,
}

#[derive(Clone)]
struct Header {
    pool: [u8; 8],
    group: [u8; GROUP_NAME],
}

/// Invariant: `ticket` is the ticket of the figures in `devices`; a store with a lower ticket
/// (figures read before these were) is dropped, never written over them.
struct Written {
    devices: Vec<DeviceFigures>,
    at: u64,
    seq: u64,
    ticket: u64,
}

/// Where a field lies in the page file.
macro_rules! at {
    ($field:ident) => {
        std::mem::offset_of!(Page, $field) as u64
    };
}

/// `pwrite` of all of `b` at `offset`; `false` if the file took less (a full filesystem).
fn put(fd: &OwnedFd, b: &[u8], offset: u64) -> bool {
    pio::write_all_at(fd.as_raw_fd(), b, offset).is_ok()
}

fn get_u64(fd: &OwnedFd, offset: u64) -> Option<u64> {
    let mut b = [0u8; 8];
    pio::read_exact_at(fd.as_raw_fd(), &mut b, offset).ok()?;
    Some(u64::from_ne_bytes(b))
}

/// The bytes of a plain `#[repr(C)]` value.
fn bytes_of<T: Copy>(v: &T) -> &[u8] {
    // SAFETY: a plain-old-data value viewed as its bytes, for as long as the borrow.
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), std::mem::size_of::<T>()) }
}

impl Publisher {
    /// Creates this process's page in its user's runtime directory (`configured`:
    /// `CUDAPOOL_RUNTIME_DIR`). `None`, with one warning line saying why, when there can be
    /// none: the program runs on without it.
    pub fn create(
        pool: &str,
        group: Option<&str>,
        configured: Option<&std::path::Path>,
    ) -> Option<Publisher> {
        let dir = match rundir_find::mine(configured) {
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

    /// Creates a page in `dir`, new (`O_EXCL`), mode 0600. A page of the same name whose holder
    /// is gone is stale (a dead process had our pid): it is removed, once.
    pub fn create_in(dir: RunDir, pool: &str, group: Option<&str>) -> Result<Publisher, String> {
        let pid = std::process::id();
        let excl = libc::O_CREAT | libc::O_EXCL | libc::O_RDWR;
        let mut made = None;
        'names: for k in 0..PAGE_NAMES {
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
        // The lock first: from now on a reader sees a live process, never a stale file.
        if !rundir::hold(fd.as_raw_fd()) {
            let e = std::io::Error::last_os_error();
            dir.unlink(&name);
            return Err(format!("{}: cannot lock: {e}", dir.file(&name).display()));
        }
        let mut header = Header {
            pool: [0; 8],
            group: [0; GROUP_NAME],
        };
        let n = pool.len().min(8);
        header.pool[..n].copy_from_slice(&pool.as_bytes()[..n]);
        let group = group.unwrap_or("").as_bytes();
        let n = group.len().min(GROUP_NAME);
        header.group[..n].copy_from_slice(&group[..n]);
        let p = Publisher {
            dir,
            name,
            fd,
            owner: pid,
            header,
            writing: Mutex::new(Written {
                devices: Vec::new(),
                at: 0,
                seq: 0,
                ticket: 0,
            }),
            tickets: AtomicU64::new(0),
        };
        if let Err(why) = p.lay_out(0) {
            p.dir.unlink(&p.name);
            return Err(format!("{}: {why}", p.path().display()));
        }
        Ok(p)
    }

    /// Makes the file one whole page (its blocks reserved: a full filesystem costs the page,
    /// with an error, never a signal) with a filled header, the magic written last.
    fn lay_out(&self, seq: u64) -> Result<(), String> {
        let size = std::mem::size_of::<Page>();
        rundir::reserve(self.fd.as_raw_fd(), size)
            .map_err(|e| format!("cannot reserve {size} bytes: {e}"))?;
        let fd = &self.fd;
        let ok = put(fd, &LAYOUT_VERSION.to_ne_bytes(), at!(version))
            && put(fd, &self.owner.to_ne_bytes(), at!(pid))
            && put(fd, &seq.to_ne_bytes(), at!(seq))
            && put(fd, &self.header.pool, at!(pool))
            && put(fd, &self.header.group, at!(group))
            && put(fd, &MAGIC.to_ne_bytes(), at!(magic));
        if !ok {
            return Err(format!("cannot write: {}", std::io::Error::last_os_error()));
        }
        Ok(())
    }

    /// The page's path (for messages and tests).
    pub fn path(&self) -> std::path::PathBuf {
        self.dir.file(&self.name)
    }

    /// Writes the figures `read` returns. Skips if another thread is writing right now, or in
    /// a forked child (the page is the parent's).
    pub fn write(&self, read: impl FnOnce() -> Vec<DeviceFigures>) {
        self.write_if(read, |_, _, _| true, false);
    }

    /// Writes them, waiting for a write under way rather than skipping: after it returns, the
    /// page shows figures read no earlier than this call (what a sleep's asker reads next is
    /// the state its answer names).
    pub fn write_now(&self, read: impl FnOnce() -> Vec<DeviceFigures>) {
        self.write_if(read, |_, _, _| true, true);
    }

    /// Writes the figures if they differ from what was written last, or that is older than
    /// `heartbeat` (so an idle process's page stays fresh, and its `updated` age says it lives).
    pub fn refresh(
        &self,
        read: impl FnOnce() -> Vec<DeviceFigures>,
        heartbeat: std::time::Duration,
    ) {
        self.write_if(
            read,
            |last, devices, at| {
                last != devices || now_ns().saturating_sub(at) >= heartbeat.as_nanos() as u64
            },
            false,
        );
    }

    /// Writes the whole page again if someone cut it, and makes it again if someone removed it
    /// (its thread looks every poll): a page costs its user's edits the page, never the
    /// process, and the process stays visible to `stat` and the exporter.
    pub fn repair(&self) {
        if std::process::id() != self.owner {
            return;
        }
        if rundir::fstat(self.fd.as_raw_fd()).is_ok_and(|st| st.st_nlink == 0) {
            self.make_again();
            return;
        }
        let whole = rundir::fstat(self.fd.as_raw_fd())
            .is_ok_and(|st| st.st_size as usize == std::mem::size_of::<Page>())
            && get_u64(&self.fd, at!(magic)) == Some(MAGIC);
        if whole {
            return;
        }
        let mut w = crate::base::sync::lock(&self.writing);
        if self.lay_out(w.seq).is_ok() {
            let devices = std::mem::take(&mut w.devices);
            self.store(&mut w, &devices);
        }
    }

    /// The page was removed (its name unlinked): a new file at its name takes the place of the
    /// old one under the same descriptor number, locked, laid out and written again.
    fn make_again(&self) {
        let mut w = crate::base::sync::lock(&self.writing);
        let excl = libc::O_CREAT | libc::O_EXCL | libc::O_RDWR;
        for _ in 0..2 {
            match self.dir.open(&self.name, excl) {
                Ok(new) => {
                    // SAFETY: dup2 of a descriptor we own onto our page's own number: the
                    // number now names the new file (the old one's lock went with it).
                    if unsafe { libc::dup2(new.as_raw_fd(), self.fd.as_raw_fd()) } < 0 {
                        return;
                    }
                    // Closing the copy first: a classic lock goes with any close of its file.
                    drop(new);
                    if !rundir::hold(self.fd.as_raw_fd()) || self.lay_out(w.seq).is_err() {
                        return;
                    }
                    let devices = std::mem::take(&mut w.devices);
                    self.store(&mut w, &devices);
                    log_at!(
                        Warn,
                        "the live stats page {} was removed: made again",
                        self.path().display()
                    );
                    return;
                }
                // Something else took the name: it is this process's page name.
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => self.dir.unlink(&self.name),
                Err(_) => return,
            }
        }
    }

    /// The one write path of the figures: takes a ticket, reads the figures, then stores them
    /// under the lock unless figures read later were stored first (a thread that read before
    /// a sleep ended and stores after its answer never shows the state before it).
    fn write_if(
        &self,
        read: impl FnOnce() -> Vec<DeviceFigures>,
        due: impl FnOnce(&[DeviceFigures], &[DeviceFigures], u64) -> bool,
        wait: bool,
    ) {
        if std::process::id() != self.owner {
            return;
        }
        let ticket = self.tickets.fetch_add(1, Ordering::SeqCst) + 1;
        let devices = read();
        let mut w = if wait {
            crate::base::sync::lock(&self.writing)
        } else {
            let Ok(w) = self.writing.try_lock() else {
                return;
            };
            w
        };
        if ticket < w.ticket || !due(&w.devices, &devices, w.at) {
            return;
        }
        w.ticket = ticket;
        self.store(&mut w, &devices);
    }

    /// The seqlock's write: the word odd, the figures, the word even (three `pwrite`s: a
    /// reader that copies the page between them sees the word change and copies again).
    fn store(&self, w: &mut Written, devices: &[DeviceFigures]) {
        let fd = &self.fd;
        // Invariant: `seq` is even between stores.
        w.seq += 1; // odd
        put(fd, &w.seq.to_ne_bytes(), at!(seq));
        for d in devices {
            let Some(i) = usize::try_from(d.device).ok().filter(|&i| i < MAX_DEVICES) else {
                continue;
            };
            let slot = PageDevice {
                device: d.device,
                used: 1,
                uuid: d.uuid.unwrap_or_default(),
                stats: stats_to_array(&d.stats),
            };
            let off = at!(devices) + (i * std::mem::size_of::<PageDevice>()) as u64;
            put(fd, bytes_of(&slot), off);
        }
        let now = now_ns();
        put(fd, &now.to_ne_bytes(), at!(updated_ns));
        w.seq += 1; // even
        put(fd, &w.seq.to_ne_bytes(), at!(seq));
        w.devices = devices.to_vec();
        w.at = now;
    }

    /// The snapshot asked for and not yet served, if any (read from the file: the asker
    /// writes its request there with `pwrite`).
    pub fn pending_request(&self) -> Option<SnapshotRequest> {
        if std::process::id() != self.owner {
            return None;
        }
        let seq = get_u64(&self.fd, at!(snap_request))?;
        if seq == get_u64(&self.fd, at!(snap_served))? {
            return None;
        }
        let format = get_u64(&self.fd, at!(snap_format))?;
        let mut raw = [0u8; super::page::REQUEST_PATH];
        pio::read_exact_at(self.fd.as_raw_fd(), &mut raw, at!(snap_path)).ok()?;
        // A torn path fails to open, harmlessly.
        let len = raw.iter().position(|&b| b == 0).unwrap_or(0);
        let path = std::path::PathBuf::from(std::ffi::OsStr::from_bytes(&raw[..len]));
        Some(SnapshotRequest {
            seq,
            torch: format == 1,
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
        // The reason first: the asker reads it only once `snap_served` says its request.
        put(&self.fd, &why, at!(snap_error));
        put(&self.fd, &seq.to_ne_bytes(), at!(snap_served));
    }

    /// The sleep or wake asked for and not yet served, if any.
    pub fn pending_sleep(&self) -> Option<super::page::SleepRequest> {
        if std::process::id() != self.owner {
            return None;
        }
        let seq = get_u64(&self.fd, at!(sleep_request))?;
        if seq == get_u64(&self.fd, at!(sleep_served))? {
            return None;
        }
        let what = get_u64(&self.fd, at!(sleep_what))?;
        Some(super::page::SleepRequest {
            seq,
            wake: what == 2,
            if_idle: what == 3,
            timeout: std::time::Duration::from_millis(get_u64(&self.fd, at!(sleep_timeout_ms))?),
        })
    }

    /// The sleep or wake `seq` is done: its answer, for the asker.
    pub fn sleep_served(&self, seq: u64, answer: &str) {
        let mut a = [0u8; super::page::REQUEST_ERROR];
        let n = answer.len().min(a.len() - 1);
        a[..n].copy_from_slice(&answer.as_bytes()[..n]);
        put(&self.fd, &a, at!(sleep_answer));
        put(&self.fd, &seq.to_ne_bytes(), at!(sleep_served));
    }

    /// Removes the file (at exit).
    pub fn remove(&self) {
        if std::process::id() == self.owner {
            self.dir.unlink(&self.name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::budget::DeviceStats;

    fn page(name: &str) -> Publisher {
        let d =
            std::env::temp_dir().join(format!("cudapool-publish-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let (dir, _) = rundir_find::mine(Some(&d)).unwrap();
        Publisher::create_in(dir, "split", None).expect("a page")
    }

    fn allocated(n: u64) -> Vec<DeviceFigures> {
        let stats = DeviceStats {
            allocated: n,
            ..Default::default()
        };
        vec![DeviceFigures {
            device: 0,
            uuid: None,
            stats,
        }]
    }

    /// Device 0's `allocated` as the file holds it (the first of a slot's stats).
    fn shown(p: &Publisher) -> u64 {
        let stats = at!(devices) + std::mem::offset_of!(PageDevice, stats) as u64;
        get_u64(&p.fd, stats).unwrap()
    }

    /// A writer that read its figures before another's were read, and stores after them,
    /// is dropped: the page keeps the later figures.
    #[test]
    fn figures_read_earlier_never_replace_figures_read_later() {
        let p = page("order");
        p.write(|| {
            // Read first (ticket 1); meanwhile the state changes and another thread writes.
            let stale = allocated(1);
            p.write_now(|| allocated(2));
            stale
        });
        assert_eq!(shown(&p), 2);
        p.write(|| allocated(3));
        assert_eq!(shown(&p), 3, "a later write still lands");
        p.remove();
    }

    /// `write_now` waits for a write under way instead of skipping, as `write` does.
    #[test]
    fn write_now_waits_for_a_write_under_way() {
        let p = page("wait");
        p.write(|| allocated(1));
        std::thread::scope(|s| {
            let held = crate::base::sync::lock(&p.writing);
            let skipped = s.spawn(|| p.write(|| allocated(5)));
            skipped.join().unwrap();
            let waiting = s.spawn(|| p.write_now(|| allocated(7)));
            std::thread::sleep(std::time::Duration::from_millis(100));
            drop(held);
            waiting.join().unwrap();
        });
        assert_eq!(shown(&p), 7);
        p.remove();
    }
}
