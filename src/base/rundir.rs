//! The runtime directory: where a user's live-stats pages (`report::publish`) and group ledgers
//! (`group`) live, in a place no other user can squat, plant in, or fill for them.
//!
//! **Where.** `CUDAPOOL_RUNTIME_DIR` when set; otherwise `/dev/shm/cudapool-<uid>`, a directory
//! of the user, mode 0700. `/dev/shm` is what the processes of one machine share (the containers
//! of a Kubernetes pod too), and a directory of one's own in it cannot be entered, renamed or
//! filled by another user (the sticky bit keeps them from moving ours; 0700 keeps them out).
//!
//! **Squatted.** `/dev/shm` is writable by everyone, so another user can take the name first.
//! Then the user's processes walk around it (`rundir_find::mine`): to a directory of theirs named
//! `cudapool-<uid>.<random>`, which no one else can predict, and which no one else can make
//! (a directory of another owner at such a name is passed over), with one line naming the
//! squatter and the remedy. Every process and reader of the user finds it by its owner.
//! A Slurm job in the mandatory mode keeps its group's ledger in a folder root made for it
//! ([`of_job`]).
//!
//! **Trust.** Every check is made on the descriptor, never on the path: the directory is opened
//! with `O_DIRECTORY | O_NOFOLLOW` and must be a directory of this user that no one else may
//! write; its files are opened through that descriptor (`openat`), never through a link.

use std::ffi::{CStr, CString};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

/// The default's parent.
pub const SHM: &str = "/dev/shm";
pub(super) fn uid() -> u32 {
    // SAFETY: getuid has no preconditions.
    unsafe { libc::getuid() }
}

pub(super) fn errno() -> std::io::Error {
    std::io::Error::last_os_error()
}

/// `fstat(2)` of a descriptor.
pub fn fstat(fd: libc::c_int) -> std::io::Result<libc::stat> {
    // SAFETY: a zeroed stat is a valid out-struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes `st` for a descriptor or fails.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(errno());
    }
    Ok(st)
}

pub fn is_regular(st: &libc::stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFREG
}

/// The default directory of user `uid`.
pub fn default_path(uid: u32) -> PathBuf {
    PathBuf::from(format!("{SHM}/cudapool-{uid}"))
}

/// An open, checked runtime directory.
#[derive(Debug)]
pub struct RunDir {
    pub(super) fd: OwnedFd,
    pub(super) path: PathBuf,
    /// Its owner, as `fstat` says (for a job's folder of root: the owner of its files).
    pub owner: u32,
    /// A job's folder of root ([`of_job`]): its files are removed by the root Epilog only,
    /// never by a reader.
    pub of_job: bool,
}

/// What is at a candidate path.
pub(super) enum Found {
    Usable(RunDir),
    Absent,
    /// A directory, but another user's or one others may write: never used as it is (why).
    Shared(String),
    /// Not a directory we can use at all (a link, a file, an error): why.
    Unusable(String),
}

/// Opens `path` as a directory (never through a link) and checks it belongs to `owner` and
/// that no one else may write in it. Nothing about it is changed.
pub(super) fn open_dir(path: &Path, owner: u32) -> Found {
    let Ok(c) = CString::new(path.as_os_str().as_encoded_bytes()) else {
        return Found::Unusable(format!("{}: not a path", path.display()));
    };
    // SAFETY: open(2) of a NUL-terminated path; O_NOFOLLOW: a link fails, never followed.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        let e = errno();
        if e.raw_os_error() == Some(libc::ENOENT) {
            return Found::Absent;
        }
        // A link or a file at the name: whose?
        return Found::Unusable(match lstat_uid(&c).filter(|&u| u != owner) {
            Some(u) => format!("{} belongs to user {u} ({e})", path.display()),
            None => format!("{}: {e}", path.display()),
        });
    }
    // SAFETY: a descriptor open(2) just gave us, owned from here on.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let st = match fstat(fd.as_raw_fd()) {
        Ok(st) => st,
        Err(e) => return Found::Unusable(format!("{}: {e}", path.display())),
    };
    if st.st_uid != owner {
        return Found::Shared(format!("{} belongs to user {}", path.display(), st.st_uid));
    }
    if st.st_mode & 0o022 != 0 {
        return Found::Shared(format!(
            "{} may be written by other users (mode {:o})",
            path.display(),
            st.st_mode & 0o7777
        ));
    }
    Found::Usable(RunDir {
        fd,
        path: path.to_path_buf(),
        owner,
        of_job: false,
    })
}

pub(super) fn lstat_uid(c: &CStr) -> Option<u32> {
    // SAFETY: a zeroed stat is a valid out-struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a valid out-pointer.
    (unsafe { libc::lstat(c.as_ptr(), &mut st) } == 0).then_some(st.st_uid)
}

/// Makes directory `path` (mode 0700; only its last component) and opens it. Only a directory
/// this call made has its mode set (a umask may have taken the owner's bits); one that was
/// there already is used as it is, or not at all.
pub(super) fn make_dir(path: &Path, owner: u32) -> Found {
    let Ok(c) = CString::new(path.as_os_str().as_encoded_bytes()) else {
        return Found::Unusable(format!("{}: not a path", path.display()));
    };
    // SAFETY: mkdir(2) of a NUL-terminated path.
    if unsafe { libc::mkdir(c.as_ptr(), 0o700) } != 0 {
        let e = errno();
        if e.raw_os_error() != Some(libc::EEXIST) {
            return Found::Unusable(format!("cannot make {}: {e}", path.display()));
        }
        return open_dir(path, owner);
    }
    let found = open_dir(path, owner);
    if let Found::Usable(d) = &found {
        // SAFETY: fchmod through the descriptor of the directory this call just made.
        unsafe { libc::fchmod(d.fd.as_raw_fd(), 0o700) };
    }
    found
}

/// A job's folder of root (the mandatory mode's `/run/cudapool/jobs/<id>.d`, made by the root
/// prolog): a directory of root nobody else may write, whose files belong to user `files_of`.
/// Nothing in it can be removed, replaced or added by that user.
pub fn of_job(path: &Path, files_of: u32) -> Result<RunDir, String> {
    match open_dir(path, 0) {
        Found::Usable(mut d) => {
            d.owner = files_of;
            d.of_job = true;
            Ok(d)
        }
        Found::Absent => Err(format!(
            "{}: absent (the root prolog makes it for each job)",
            path.display()
        )),
        Found::Shared(why) | Found::Unusable(why) => Err(format!(
            "{why}: not a folder of root that only root may write"
        )),
    }
}

/// The jobs' folders of root in `jobs` (the mandatory mode's), each as a reader sees it: the
/// files of the user who owns its ledger (`uid`, or any user when `None`).
pub fn job_dirs(jobs: &Path, uid: Option<u32>) -> Vec<RunDir> {
    let mut out = Vec::new();
    if !matches!(open_dir(jobs, 0), Found::Usable(_)) {
        return out;
    }
    let Ok(entries) = std::fs::read_dir(jobs) else {
        return out;
    };
    for e in entries.flatten().take(4096) {
        let name = e.file_name();
        let Some(id) = name.to_str().and_then(|n| n.strip_suffix(".d")) else {
            continue;
        };
        if id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(mut d) = of_job(&jobs.join(&name), 0) else {
            continue;
        };
        // Whose files: the owner of the job's ledger (the prolog made it for the job's user).
        let ledger = format!("group-slurm-{id}");
        let Ok(c) = CString::new(ledger) else {
            continue;
        };
        // SAFETY: a zeroed stat is a valid out-struct.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fstatat relative to our directory's descriptor, never through a link.
        let r = unsafe {
            libc::fstatat(
                d.fd.as_raw_fd(),
                c.as_ptr(),
                &mut st,
                libc::AT_SYMLINK_NOFOLLOW,
            )
        };
        if r != 0 || uid.is_some_and(|u| u != st.st_uid) {
            continue;
        }
        d.owner = st.st_uid;
        out.push(d);
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    out
}

/// The private directory of user `uid` inside a shared one (`CUDAPOOL_RUNTIME_DIR` naming
/// `/tmp`, a team's folder, another user's directory).
pub fn private_in(shared: &Path, uid: u32) -> PathBuf {
    shared.join(format!("cudapool-{uid}"))
}

/// The remedy every refusal names.
pub(super) const REMEDY: &str = "set CUDAPOOL_RUNTIME_DIR to a directory of yours that no other user may write (it is made 0700 if absent)";

/// `CUDAPOOL_RUNTIME_DIR` as a reader outside the library (the CLI) finds it: the library reads
/// it through `config`, once.
pub fn configured_from_env() -> Option<PathBuf> {
    std::env::var_os("CUDAPOOL_RUNTIME_DIR")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// An `open(2)` flag set for a file found in a runtime directory: never through a link, never
/// blocking (a FIFO opens at once and fails the checks), closed on exec.
const FOUND: libc::c_int = libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC;

impl RunDir {
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The path of file `name` in it (for messages).
    pub fn file(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    fn cname(name: &str) -> std::io::Result<CString> {
        if name.is_empty() || name.contains('/') || name == "." || name == ".." {
            return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
        }
        CString::new(name).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))
    }

    /// Opens file `name` with `flags` (`O_RDONLY`, `O_RDWR`, with `O_CREAT`/`O_EXCL`: mode 0600).
    pub fn open(&self, name: &str, flags: libc::c_int) -> std::io::Result<OwnedFd> {
        let c = Self::cname(name)?;
        // SAFETY: openat(2) relative to our directory's descriptor, of a NUL-terminated name
        // with no slash, never through a link.
        let fd = unsafe { libc::openat(self.fd.as_raw_fd(), c.as_ptr(), flags | FOUND, 0o600) };
        if fd < 0 {
            return Err(errno());
        }
        // SAFETY: a descriptor openat just gave us.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// Removes file `name` (never a directory).
    pub fn unlink(&self, name: &str) {
        if let Ok(c) = Self::cname(name) {
            // SAFETY: unlinkat relative to our directory's descriptor; a directory is refused.
            unsafe { libc::unlinkat(self.fd.as_raw_fd(), c.as_ptr(), 0) };
        }
    }

    /// The names in it (at most `max`: a reader bounds what one user's files may cost it).
    pub fn names(&self, max: usize) -> Vec<String> {
        let mut out = Vec::new();
        // SAFETY: dup of our descriptor: fdopendir takes the copy and closedir closes it.
        let dup = unsafe { libc::fcntl(self.fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
        if dup < 0 {
            return out;
        }
        // SAFETY: a directory descriptor of ours, handed over to the stream.
        let dir = unsafe { libc::fdopendir(dup) };
        if dir.is_null() {
            // SAFETY: fdopendir failed, the copy is still ours.
            unsafe { libc::close(dup) };
            return out;
        }
        // SAFETY: rewind the shared offset (the copy shares it with `fd`).
        unsafe { libc::rewinddir(dir) };
        while out.len() < max {
            // SAFETY: readdir on a stream we opened; the entry is valid until the next call.
            let e = unsafe { libc::readdir(dir) };
            if e.is_null() {
                break;
            }
            // SAFETY: d_name is a NUL-terminated array inside the entry.
            let name = unsafe { CStr::from_ptr((*e).d_name.as_ptr()) };
            if let Ok(n) = name.to_str() {
                if n != "." && n != ".." {
                    out.push(n.to_string());
                }
            }
        }
        // SAFETY: the stream opened above, closed once (with the copy).
        unsafe { libc::closedir(dir) };
        out
    }
}

/// Opens a file found at `name` in `dir` and checks it on the descriptor: a regular file of the
/// directory's owner. Its size is for the caller to check (and to read no more than). `Err`
/// says why, without the path (the caller names it).
pub fn open_found(
    dir: &RunDir,
    name: &str,
    flags: libc::c_int,
) -> Result<(OwnedFd, libc::stat), String> {
    let fd = dir
        .open(name, flags)
        .map_err(|e| format!("cannot open: {e}"))?;
    let st = fstat(fd.as_raw_fd()).map_err(|e| e.to_string())?;
    if !is_regular(&st) {
        return Err("not a regular file".into());
    }
    if st.st_uid != dir.owner {
        return Err(format!(
            "owned by user {}, not by user {}",
            st.st_uid, dir.owner
        ));
    }
    Ok((fd, st))
}

/// Reserves `size` bytes of the file (its blocks, not only its length: on tmpfs a length alone
/// is sparse, and the first write into a mapping of a full filesystem is a SIGBUS).
pub fn reserve(fd: libc::c_int, size: usize) -> std::io::Result<()> {
    // SAFETY: posix_fallocate on a descriptor of ours; it returns the error, not errno.
    let r = unsafe { libc::posix_fallocate(fd, 0, size as libc::off_t) };
    match r {
        0 => Ok(()),
        e => Err(std::io::Error::from_raw_os_error(e)),
    }
}

/// A lock request of `kind` on `len` bytes at `start` of a file (for `fcntl`).
pub fn flock(kind: libc::c_int, start: i64, len: usize) -> libc::flock {
    // SAFETY: flock is plain old data; zero is a valid start.
    let mut f: libc::flock = unsafe { std::mem::zeroed() };
    f.l_type = kind as libc::c_short;
    f.l_whence = libc::SEEK_SET as libc::c_short;
    f.l_start = start;
    f.l_len = len as libc::off_t;
    f
}

/// The pid of the process that holds a classic (process-owned) write lock on byte 0 of `fd`'s
/// file, as the kernel says: `Some(0)` if it lives in a pid namespace this process cannot see,
/// `None` if nobody holds it (or only this process does).
pub fn lock_holder(fd: libc::c_int) -> Option<u32> {
    let mut f = flock(libc::F_WRLCK, 0, 1);
    // SAFETY: a lock test on our descriptor with a valid flock.
    if unsafe { libc::fcntl(fd, libc::F_GETLK, &mut f) } != 0 {
        return None;
    }
    (f.l_type != libc::F_UNLCK as libc::c_short).then_some(f.l_pid.max(0) as u32)
}

/// Takes a classic write lock on byte 0 of `fd`'s file for this process (kept until the process
/// ends or closes a descriptor of that file; a child does not inherit it). Whether it was taken.
pub fn hold(fd: libc::c_int) -> bool {
    let f = flock(libc::F_WRLCK, 0, 1);
    // SAFETY: a lock request on our descriptor with a valid flock; never blocks.
    unsafe { libc::fcntl(fd, libc::F_SETLK, &f) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("cudapool-rundir-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn the_lock_names_its_holder_to_another_process_only() {
        let d = scratch("lock");
        let dir = match open_dir(&d, uid()) {
            Found::Usable(dir) => dir,
            _ => panic!("a scratch directory of ours"),
        };
        let fd = dir
            .open("p", libc::O_RDWR | libc::O_CREAT | libc::O_EXCL)
            .unwrap();
        reserve(fd.as_raw_fd(), 64).unwrap();
        assert!(hold(fd.as_raw_fd()));
        // This process's own lock does not conflict with itself.
        assert_eq!(lock_holder(fd.as_raw_fd()), None);
        // SAFETY: fork in a test; the child only tests the lock and exits.
        let child = unsafe { libc::fork() };
        if child == 0 {
            let seen = lock_holder(fd.as_raw_fd());
            // SAFETY: getppid has no preconditions; _exit ends the child at once.
            unsafe {
                libc::_exit(if seen == Some(libc::getppid() as u32) {
                    0
                } else {
                    1
                })
            };
        }
        let mut status = 0;
        // SAFETY: waiting for our own child.
        unsafe { libc::waitpid(child, &mut status, 0) };
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "the child saw the parent's pid"
        );
    }
}
