//! Reading the live pages of other processes (`cudapool stat`, `top`, `snapshot`, the
//! exporter). A reader trusts nothing a page's owner controls: each file is opened through its
//! checked runtime directory (`rundir`), never through a link and never blocking, must be a
//! regular file of the directory's owner exactly one page long, and is copied with bounded
//! `pread`s (never mapped: its owner may cut it at any moment, which costs the reader an error,
//! never a signal). The pid a page stands for is the kernel's (the holder of the page's lock),
//! not the page's own claim; how many pages one user's directory may cost a read is bounded.

use super::page::{array_to_stats, DeviceFigures, Page, LAYOUT_VERSION, MAGIC};
use super::publish::{page_name, pid_of_name, PAGE_NAMES};
use crate::base::patience::{wait_until, Patience, PER_FILE, READ_TIME};
use crate::base::pio;
use crate::base::rundir::{self, RunDir};
use crate::base::rundir_find;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Duration;

/// The most pages read from one runtime directory in one pass.
pub const MAX_PAGES_PER_DIR: usize = 4096;
/// A page whose process never finished making it is stale after this long.
const UNFINISHED: std::time::Duration = std::time::Duration::from_secs(10);

/// What a reader sees of one process.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// The process, as the kernel names it to this reader (0: it runs in a pid namespace this
    /// reader cannot see; then `claimed_pid` is all there is).
    pub pid: u32,
    /// The pid the page says (its own namespace's).
    pub claimed_pid: u32,
    /// The user the file belongs to.
    pub uid: u32,
    pub pool: String,
    /// Its group, when it is in one.
    pub group: Option<String>,
    pub updated_ns: u64,
    pub devices: Vec<DeviceFigures>,
}

/// A file found where pages live that could not be read, and why.
#[derive(Debug, Clone)]
pub struct Skipped {
    pub path: PathBuf,
    pub why: String,
    /// Not read because the read's time (or its owner's share of it) ran out.
    pub late: bool,
}

pub(super) fn uid() -> u32 {
    // SAFETY: getuid has no preconditions.
    unsafe { libc::getuid() }
}

/// The pages of every live cudapool process of this user (of every user with `all_users`, for
/// root), in the runtime directories `configured` (`CUDAPOOL_RUNTIME_DIR`) or the defaults
/// name, read within [`READ_TIME`]. A page of this user whose process is gone is removed;
/// nothing of another user is ever touched.
pub fn live(all_users: bool, configured: Option<&Path>) -> (Vec<Snapshot>, Vec<Skipped>) {
    let survey = rundir_find::survey_on(all_users, configured, &mut Default::default());
    let mut patience = Patience::new(READ_TIME, owners(&survey.dirs));
    let (seen, mut skipped) = live_in(&survey.dirs, &mut patience);
    // A survey cut short (a flood of names where the directories live) may have missed some.
    for cut in survey.cut {
        skipped.push(Skipped {
            path: PathBuf::from(rundir::SHM),
            why: format!("not every directory was reached in time ({cut}): run again"),
            late: true,
        });
    }
    (seen, skipped)
}

/// The page of live process `pid` (this user's; any user's with `all_users`), found by its
/// name where its user keeps pages, whatever else the folders hold: `Ok(None)` when it has
/// none.
pub fn read_pid(
    pid: u32,
    configured: Option<&Path>,
    all_users: bool,
) -> Result<Option<Snapshot>, String> {
    let Some((dir, name)) = find_as(pid, configured, all_users) else {
        return Ok(None);
    };
    read_in(&dir, &name, READ_TIME)
}

/// How many users the directories belong to (each gets a share of a read's time).
pub fn owners(dirs: &[RunDir]) -> usize {
    let mut u: Vec<u32> = dirs.iter().map(|d| d.owner).collect();
    u.sort_unstable();
    u.dedup();
    u.len()
}

/// The pages in `dirs`, read within `patience`: what could not be read, or was not read in
/// time, is in the second list, with why.
pub fn live_in(dirs: &[RunDir], patience: &mut Patience) -> (Vec<Snapshot>, Vec<Skipped>) {
    let (mut seen, mut skipped) = (Vec::new(), Vec::new());
    for dir in dirs {
        for name in dir.names(MAX_PAGES_PER_DIR) {
            if pid_of_name(&name).is_none() {
                continue;
            }
            if !patience.may_read(dir.owner) {
                skipped.push(Skipped {
                    path: dir.file(&name),
                    why: patience.why_not(dir.owner),
                    late: true,
                });
                continue;
            }
            match patience.read(dir.owner, |wait| read_in(dir, &name, wait)) {
                Ok(Some(s)) => seen.push(s),
                Ok(None) => {}
                Err(why) => skipped.push(Skipped {
                    path: dir.file(&name),
                    why,
                    late: false,
                }),
            }
        }
    }
    seen.sort_by_key(|s| (s.uid, s.pid, s.claimed_pid));
    (seen, skipped)
}

/// Reads page `name` of `dir`: `Ok(None)` when its process is gone (the file is then removed,
/// if it is this user's). A page a live process is writing is waited on at most `wait`; one
/// nobody holds is read once.
fn read_in(dir: &RunDir, name: &str, wait: Duration) -> Result<Option<Snapshot>, String> {
    let (fd, st) = open_page(dir, name, libc::O_RDONLY)?;
    let named = pid_of_name(name).unwrap_or(0);
    let holder = if named == std::process::id() && dir.owner == uid() {
        Some(named) // our own page: our own lock does not show to us
    } else {
        rundir::lock_holder(fd.as_raw_fd())
    };
    let Some(holder) = holder else {
        let age = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64)
            .saturating_sub(st.st_mtime);
        let finished = read_fd(&fd, Duration::ZERO).is_ok();
        if dir.owner == uid() && (finished || age >= UNFINISHED.as_secs() as i64) {
            remove_if_same(dir, name, &st);
        }
        return Ok(None);
    };
    let mut s = read_fd(&fd, wait)?;
    s.pid = holder;
    s.uid = dir.owner;
    Ok(Some(s))
}

/// Removes `name` if it is still the file `st` describes (not a new page made since).
fn remove_if_same(dir: &RunDir, name: &str, st: &libc::stat) {
    if let Ok((_, now)) = rundir::open_found(dir, name, libc::O_RDONLY) {
        if now.st_ino == st.st_ino && now.st_dev == st.st_dev {
            dir.unlink(name);
        }
    }
}

/// Opens a page, checked: a regular file of the directory's owner, exactly one page long.
pub(super) fn open_page(
    dir: &RunDir,
    name: &str,
    mode: libc::c_int,
) -> Result<(OwnedFd, libc::stat), String> {
    let (fd, st) = rundir::open_found(dir, name, mode)?;
    let size = std::mem::size_of::<Page>();
    if st.st_size as u64 != size as u64 {
        return Err(format!("{} bytes, not one page ({size} bytes)", st.st_size));
    }
    Ok((fd, st))
}

/// Copies the page behind `fd` (consistently, through the seqlock), waiting at most `wait`
/// while its writer is writing: never more than a page at a time.
pub(super) fn read_fd(fd: &OwnedFd, wait: Duration) -> Result<Snapshot, String> {
    let size = std::mem::size_of::<Page>();
    let mut first = vec![0u8; size];
    let mut again = vec![0u8; size];
    let mut failed = None;
    let mut page: Option<Page> = None;
    let whole = wait_until(wait, || {
        let copy = (|| -> Result<Option<Page>, String> {
            pio::read_exact_at(fd.as_raw_fd(), &mut first, 0)?;
            // SAFETY: the buffer is exactly one Page long; Page is plain old data (atomics are
            // plain integers in memory); read_unaligned copes with the Vec's alignment.
            let p: Page = unsafe { std::ptr::read_unaligned(first.as_ptr() as *const Page) };
            if p.magic != MAGIC || p.version != LAYOUT_VERSION {
                return Err("not a cudapool page (magic or layout version)".into());
            }
            let seq = p.seq.load(Ordering::Relaxed);
            if seq % 2 == 1 {
                return Ok(None);
            }
            // A read is one copy: if seq was even and the same at both ends, it is whole.
            pio::read_exact_at(fd.as_raw_fd(), &mut again, 0)?;
            // SAFETY: as above; `again` is exactly one Page long too.
            let p2: Page = unsafe { std::ptr::read_unaligned(again.as_ptr() as *const Page) };
            Ok((p2.seq.load(Ordering::Relaxed) == seq).then_some(p))
        })();
        match copy {
            Ok(Some(p)) => {
                page = Some(p);
                true
            }
            Ok(None) => false,
            Err(e) => {
                failed = Some(e);
                true
            }
        }
    });
    if let Some(e) = failed {
        return Err(e);
    }
    let Some(page) = page.filter(|_| whole) else {
        return Err(format!("being written (waited {} ms)", wait.as_millis()));
    };
    let text = |b: &[u8]| printable(b.split(|&c| c == 0).next().unwrap_or(&[]));
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
    let group = text(&page.group);
    Ok(Snapshot {
        pid: page.pid,
        claimed_pid: page.pid,
        uid: 0,
        pool: text(&page.pool),
        group: (!group.is_empty()).then_some(group),
        updated_ns: page.updated_ns.load(Ordering::Relaxed),
        devices,
    })
}

/// Reads the page at `path` (in a checked directory of this user, or `CUDAPOOL_RUNTIME_DIR`),
/// whatever process holds it: for tests and tools that know the file.
pub fn read_path(path: &Path) -> Result<Snapshot, String> {
    let (parent, name) = split(path)?;
    let (dir, _) = rundir_find::mine(Some(parent))?;
    let (fd, _) = open_page(&dir, name, libc::O_RDONLY)?;
    let mut s = read_fd(&fd, PER_FILE)?;
    s.uid = dir.owner;
    Ok(s)
}

fn split(path: &Path) -> Result<(&Path, &str), String> {
    match (path.parent(), path.file_name().and_then(|n| n.to_str())) {
        (Some(p), Some(n)) => Ok((p, n)),
        _ => Err(format!("{}: not a file's path", path.display())),
    }
}

/// Finds the page of this user's live process `pid` (as the kernel names it).
pub(super) fn find(pid: u32, configured: Option<&Path>) -> Option<(RunDir, String)> {
    find_as(pid, configured, false)
}

/// [`find`], in every user's directory with `all_users` (root's).
pub(super) fn find_as(
    pid: u32,
    configured: Option<&Path>,
    all_users: bool,
) -> Option<(RunDir, String)> {
    // By name first, where the process's user keeps its pages: whatever else a folder holds.
    for dir in rundir_find::for_pid(pid, configured, all_users) {
        for k in 0..PAGE_NAMES {
            let name = page_name(pid, k);
            let Ok((fd, _)) = open_page(&dir, &name, libc::O_RDONLY) else {
                continue;
            };
            if rundir::lock_holder(fd.as_raw_fd()) == Some(pid) {
                return Some((dir, name));
            }
        }
    }
    // A walk-around directory, or a page named in another pid namespace: every name read.
    for dir in rundir_find::readable(all_users, configured) {
        for name in dir.names(MAX_PAGES_PER_DIR) {
            if pid_of_name(&name).is_none() {
                continue;
            }
            let Ok((fd, _)) = open_page(&dir, &name, libc::O_RDONLY) else {
                continue;
            };
            if rundir::lock_holder(fd.as_raw_fd()) == Some(pid) {
                drop(fd);
                return Some((dir, name));
            }
        }
    }
    None
}

/// Whether this user has a live cudapool process `pid`.
pub fn exists(pid: u32, configured: Option<&Path>) -> bool {
    find(pid, configured).is_some()
}

/// Text a page holds, as a reader may print it: every byte outside printable ASCII becomes
/// `?`, so nothing the page's owner wrote can move a terminal's cursor, colour it or begin a
/// line of its own.
pub fn printable(b: &[u8]) -> String {
    b.iter()
        .map(|&c| {
            if (0x20..0x7f).contains(&c) {
                c as char
            } else {
                '?'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::budget::DeviceStats;
    use crate::report::publish::Publisher;
    use std::ffi::CString;

    /// A fresh runtime directory for one test.
    fn scratch(name: &str) -> (PathBuf, RunDir) {
        let d = std::env::temp_dir().join(format!("cudapool-pages-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let (dir, _) = rundir_find::mine(Some(&d)).unwrap();
        (d, dir)
    }

    fn figures(device: i32) -> DeviceFigures {
        DeviceFigures {
            device,
            uuid: None,
            stats: DeviceStats::default(),
        }
    }

    #[test]
    fn a_page_round_trips_through_the_file() {
        let (d, dir) = scratch("round");
        let p = Publisher::create_in(dir, "split", Some("job-7")).expect("a page");
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
        p.write(|| vec![first.clone(), figures(3)]);
        let (seen, skipped) = live(false, Some(&d));
        assert!(skipped.is_empty(), "{skipped:?}");
        assert_eq!(seen.len(), 1);
        let r = &seen[0];
        assert_eq!(r.pid, std::process::id());
        assert_eq!(r.pool, "split");
        assert_eq!(r.group.as_deref(), Some("job-7"));
        assert_eq!(r.devices, vec![first, figures(3)]);
        assert!(r.updated_ns > 0);
        let path = p.path();
        let mode = std::fs::metadata(&path).unwrap().permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o077,
            0,
            "owner only"
        );
        p.remove();
        assert!(!path.exists());
    }

    /// docs/design.md, trap 9: a link planted at the page's name is never followed (the file it
    /// points to stays as it was): it is taken for a stale entry and replaced by a new page.
    #[test]
    fn a_link_at_the_page_name_is_never_written_through() {
        let (d, dir) = scratch("link");
        let victim = d.with_extension("victim");
        std::fs::write(&victim, b"keep me").unwrap();
        let name = page_name(std::process::id(), 0);
        std::os::unix::fs::symlink(&victim, d.join(&name)).unwrap();
        let p = Publisher::create_in(dir, "split", None).expect("a page beside the link");
        p.write(|| vec![figures(0)]);
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep me");
        assert!(!std::fs::symlink_metadata(p.path())
            .unwrap()
            .file_type()
            .is_symlink());
    }

    /// A page of our pid whose holder is gone is stale: replaced, and a reader removes one.
    #[test]
    fn a_stale_page_is_replaced_and_a_readers_pass_removes_the_dead() {
        let (d, dir) = scratch("stale");
        std::fs::write(d.join(page_name(std::process::id(), 0)), b"old").unwrap();
        let p = Publisher::create_in(dir, "binned", None).expect("replaced");
        p.write(|| vec![figures(0)]);
        assert_eq!(live(false, Some(&d)).0[0].pool, "binned");
        // A finished page of a pid that holds no lock: its process is gone.
        let bytes = std::fs::read(p.path()).unwrap();
        let dead = d.join("page-999999");
        std::fs::write(&dead, &bytes).unwrap();
        let (seen, _) = live(false, Some(&d));
        assert_eq!(seen.len(), 1);
        assert!(!dead.exists(), "the dead page was removed");
        // An unfinished one (no magic) young enough to be in the making stays.
        let young = d.join("page-999998");
        std::fs::write(&young, vec![0u8; bytes.len()]).unwrap();
        live(false, Some(&d));
        assert!(young.exists());
    }

    /// A reader never blocks (a FIFO), never reads more than a page (a huge file), and takes a
    /// page cut short for what it is.
    #[test]
    fn the_reader_never_blocks_nor_reads_more_than_a_page() {
        let (d, dir) = scratch("odd");
        let fifo = CString::new(d.join("page-1").as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: mkfifo of a NUL-terminated path in our own directory.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        std::fs::File::create(d.join("page-2"))
            .unwrap()
            .set_len(1 << 30)
            .unwrap(); // sparse: costs no memory
        let p = Publisher::create_in(dir, "split", None).unwrap();
        p.write(|| vec![figures(0)]);
        let bytes = std::fs::read(p.path()).unwrap();
        std::fs::write(d.join("page-3"), &bytes[..bytes.len() / 2]).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let dd = d.clone();
        std::thread::spawn(move || {
            let _ = tx.send(live(false, Some(&dd)));
        });
        let (seen, skipped) = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("the reader returned");
        assert_eq!(seen.len(), 1);
        let why = |n: &str| {
            skipped
                .iter()
                .find(|s| s.path.ends_with(n))
                .map(|s| s.why.clone())
                .unwrap_or_default()
        };
        assert!(why("page-1").contains("not a regular file"), "{skipped:?}");
        assert!(why("page-2").contains("not one page"), "{skipped:?}");
        assert!(why("page-3").contains("not one page"), "{skipped:?}");
    }

    /// A page cut and grown again by its owner while a reader reads it costs the reader an
    /// error at worst, never a signal (the reader copies, never maps).
    #[test]
    fn a_page_cut_while_read_is_an_error_never_a_signal() {
        let (d, dir) = scratch("cut");
        let p = Publisher::create_in(dir, "split", None).unwrap();
        p.write(|| vec![figures(0)]);
        // A page in the making (no magic yet, no holder): young, so readers leave it be.
        let mut bytes = std::fs::read(p.path()).unwrap();
        bytes[..8].fill(0);
        let victim = d.join("page-4");
        std::fs::write(&victim, &bytes).unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s2 = stop.clone();
        let v2 = victim.clone();
        let size = bytes.len() as u64;
        let cutter = std::thread::spawn(move || {
            let f = std::fs::OpenOptions::new().write(true).open(&v2).unwrap();
            while !s2.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = f.set_len(0);
                let _ = f.set_len(size);
            }
        });
        for _ in 0..2000 {
            let _ = live(false, Some(&d));
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        cutter.join().unwrap();
        assert!(victim.exists(), "a page in the making is left to its maker");
    }

    /// A page of another user is skipped, unread and untouched. Making one needs root;
    /// elsewhere this test says it did not run.
    #[test]
    fn the_reader_skips_files_of_another_user() {
        let (d, dir) = scratch("owner");
        let p = Publisher::create_in(dir, "split", None).unwrap();
        p.write(|| vec![figures(0)]);
        let other = d.join("page-5");
        std::fs::copy(p.path(), &other).unwrap();
        if uid() != 0 {
            eprintln!("not root: the file of another user could not be made; not checked");
            return;
        }
        let c = CString::new(other.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: chown of our own file to the conventional `nobody`.
        assert_eq!(unsafe { libc::chown(c.as_ptr(), 65534, 65534) }, 0);
        let (_, skipped) = live(false, Some(&d));
        assert!(
            skipped
                .iter()
                .any(|s| s.why.contains("owned by user 65534")),
            "{skipped:?}"
        );
        assert!(other.exists(), "another user's file is never removed");
    }
}
