//! The runtime directory: where a user's live-stats pages (`report::publish`) and group ledgers
//! (`group`) live, in a place no other user can squat, plant in, or fill for them.
//!
//! **Where.** `CUDAPOOL_RUNTIME_DIR` when set; otherwise `/dev/shm/cudapool-<uid>`, a directory
//! of the user, mode 0700. `/dev/shm` is what the processes of one machine share (the containers
//! of a Kubernetes pod too), and a directory of one's own in it cannot be entered, renamed or
//! filled by another user (the sticky bit keeps them from moving ours; 0700 keeps them out).
//!
//! **Squatted.** `/dev/shm` is writable by everyone, so another user can take the name first.
//! Then the first of `/dev/shm/cudapool-<uid>.1` ... `.7` that is ours, or else the first that
//! is free, is used instead, with one line naming the squatter's uid and the remedy. Every
//! process of the user walks the same names in the same order, so they still meet.
//!
//! **Trust.** Every check is made on the descriptor, never on the path: the directory is opened
//! with `O_DIRECTORY | O_NOFOLLOW` and must be a directory of this user that no one else may
//! write; its files are opened through that descriptor (`openat`), never through a link.
//!
//! Uses: nothing of the crate (the base layer).

use std::ffi::{CStr, CString};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

/// The default's parent.
pub const SHM: &str = "/dev/shm";
/// How many alternates are walked when the default name is taken by another user.
pub const ALTERNATES: usize = 7;

fn uid() -> u32 {
    // SAFETY: getuid has no preconditions.
    unsafe { libc::getuid() }
}

fn errno() -> std::io::Error {
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

/// The default directory of user `uid`, or its `k`-th alternate (0: the default).
pub fn default_path(uid: u32, k: usize) -> PathBuf {
    match k {
        0 => PathBuf::from(format!("{SHM}/cudapool-{uid}")),
        k => PathBuf::from(format!("{SHM}/cudapool-{uid}.{k}")),
    }
}

/// An open, checked runtime directory.
#[derive(Debug)]
pub struct RunDir {
    fd: OwnedFd,
    path: PathBuf,
    /// Its owner, as `fstat` says.
    pub owner: u32,
}

/// What is at a candidate path.
enum Found {
    Usable(RunDir),
    Absent,
    /// A directory, but another user's or one others may write: never used as it is (why).
    Shared(String),
    /// Not a directory we can use at all (a link, a file, an error): why.
    Unusable(String),
}

/// Opens `path` as a directory (never through a link) and checks it belongs to `owner` and
/// that no one else may write in it. Nothing about it is changed.
fn open_dir(path: &Path, owner: u32) -> Found {
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
    })
}

fn lstat_uid(c: &CStr) -> Option<u32> {
    // SAFETY: a zeroed stat is a valid out-struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a valid out-pointer.
    (unsafe { libc::lstat(c.as_ptr(), &mut st) } == 0).then_some(st.st_uid)
}

/// Makes directory `path` (mode 0700; only its last component) and opens it. Only a directory
/// this call made has its mode set (a umask may have taken the owner's bits); one that was
/// there already is used as it is, or not at all.
fn make_dir(path: &Path, owner: u32) -> Found {
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

/// The private directory of user `uid` inside a shared one (`CUDAPOOL_RUNTIME_DIR` naming
/// `/tmp`, a team's folder, another user's directory).
pub fn private_in(shared: &Path, uid: u32) -> PathBuf {
    shared.join(format!("cudapool-{uid}"))
}

/// The remedy every refusal names.
const REMEDY: &str = "set CUDAPOOL_RUNTIME_DIR to a directory of yours that no other user may write (it is made 0700 if absent)";

/// This user's runtime directory (made if absent), and a line to say once when it is not the
/// default because another user took that name. `Err` is one line: why there is none.
///
/// `configured` (`CUDAPOOL_RUNTIME_DIR`): a directory of this user that no one else may write
/// is used as it is; one another user owns or others may write (`/tmp`, a team's folder) is
/// used through a private `cudapool-<uid>` made inside it; nothing of it is ever changed.
pub fn mine(configured: Option<&Path>) -> Result<(RunDir, Option<String>), String> {
    let me = uid();
    if let Some(p) = configured {
        let shared = match make_dir(p, me) {
            Found::Usable(d) => return Ok((d, None)),
            Found::Shared(why) => why,
            Found::Unusable(why) => return Err(format!("CUDAPOOL_RUNTIME_DIR: {why}; {REMEDY}")),
            Found::Absent => return Err(format!("CUDAPOOL_RUNTIME_DIR: {} vanished", p.display())),
        };
        let private = private_in(p, me);
        return match make_dir(&private, me) {
            Found::Usable(d) => Ok((d, None)),
            Found::Shared(why) | Found::Unusable(why) => Err(format!(
                "CUDAPOOL_RUNTIME_DIR: {shared}, and its private {why}; {REMEDY}"
            )),
            Found::Absent => Err(format!(
                "CUDAPOOL_RUNTIME_DIR: {} vanished",
                private.display()
            )),
        };
    }
    let mut squatted: Option<(PathBuf, String)> = None;
    let mut first_absent = None;
    for k in 0..=ALTERNATES {
        let path = default_path(me, k);
        match open_dir(&path, me) {
            Found::Usable(d) => {
                let said = squat_line(&squatted, &d.path);
                return Ok((d, said));
            }
            Found::Absent => {
                first_absent.get_or_insert(path);
            }
            Found::Shared(why) | Found::Unusable(why) => {
                squatted.get_or_insert((path, why));
            }
        }
    }
    let Some(path) = first_absent else {
        let why = squatted.map_or_else(String::new, |(_, w)| w);
        return Err(format!(
            "no runtime directory: {why}, and so are its {ALTERNATES} alternates; {REMEDY}"
        ));
    };
    match make_dir(&path, me) {
        Found::Usable(d) => {
            let said = squat_line(&squatted, &d.path);
            Ok((d, said))
        }
        Found::Shared(why) | Found::Unusable(why) => Err(format!("{why}; {REMEDY}")),
        Found::Absent => Err(format!("{} vanished", path.display())),
    }
}

fn squat_line(squatted: &Option<(PathBuf, String)>, used: &Path) -> Option<String> {
    squatted.as_ref().map(|(p, why)| {
        format!(
            "{why}: using {} instead; to take {} back, have root remove it (or set CUDAPOOL_RUNTIME_DIR to a directory of yours)",
            used.display(),
            p.display()
        )
    })
}

/// What a reader says of a user's default runtime directory that someone else took.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Squat {
    /// The user whose name was taken.
    pub uid: u32,
    /// The name taken, and why it cannot be used.
    pub path: PathBuf,
    pub why: String,
    /// The name that user's processes use instead (`None`: every name is taken).
    pub used: Option<PathBuf>,
}

impl Squat {
    /// One line: what was taken, what is used instead, and the remedy.
    pub fn line(&self) -> String {
        match &self.used {
            Some(u) => format!(
                "{}: user {}'s processes use {} instead; to take it back, have root remove {} (or set CUDAPOOL_RUNTIME_DIR to a directory of yours)",
                self.why,
                self.uid,
                u.display(),
                self.path.display()
            ),
            None => format!(
                "{}, and so are all {ALTERNATES} alternates: user {}'s processes run without live pages or groups; have root remove them, or {REMEDY}",
                self.why, self.uid
            ),
        }
    }
}

/// The default runtime directories of this user (of every user named in `/dev/shm`, with
/// `all_users`) that are not theirs to use: the first name taken, and the name in use instead.
/// With `CUDAPOOL_RUNTIME_DIR` set nothing is walked, so nothing is said.
pub fn squats(all_users: bool, configured: Option<&Path>) -> Vec<Squat> {
    if configured.is_some() {
        return Vec::new();
    }
    let mut users = vec![uid()];
    if all_users {
        if let Ok(entries) = std::fs::read_dir(SHM) {
            for e in entries.flatten() {
                let name = e.file_name();
                let Some(rest) = name.to_str().and_then(|n| n.strip_prefix("cudapool-")) else {
                    continue;
                };
                let u = rest.split_once('.').map_or(rest, |(u, _)| u);
                if let Ok(u) = u.parse::<u32>() {
                    users.push(u);
                }
            }
        }
        users.sort_unstable();
        users.dedup();
    }
    let mut out = Vec::new();
    for u in users {
        let mut taken: Option<(PathBuf, String)> = None;
        let mut used = None;
        for k in 0..=ALTERNATES {
            let path = default_path(u, k);
            match open_dir(&path, u) {
                Found::Usable(_) => {
                    used = Some(path);
                    break;
                }
                Found::Absent => {}
                Found::Shared(why) | Found::Unusable(why) => {
                    taken.get_or_insert((path, why));
                }
            }
        }
        if let Some((path, why)) = taken {
            let every = used.is_none()
                && (0..=ALTERNATES)
                    .all(|k| !matches!(open_dir(&default_path(u, k), u), Found::Absent));
            if used.is_some() || every {
                out.push(Squat {
                    uid: u,
                    path,
                    why,
                    used,
                });
            }
        }
    }
    out
}

/// Every runtime directory a reader looks in: with `configured` (`CUDAPOOL_RUNTIME_DIR`), that
/// one (it must belong to the reader, or to anyone when `all_users`) or, when it is shared,
/// the private `cudapool-<uid>` directories inside it (the reader's, or everyone's); else the
/// default and its alternates of this user, or of every user (`all_users`, root). Each is
/// checked as the writers check theirs: a directory of the user its name says, that no one
/// else may write. Nothing is changed.
pub fn readable(all_users: bool, configured: Option<&Path>) -> Vec<RunDir> {
    let me = uid();
    if let Some(p) = configured {
        let Ok(c) = CString::new(p.as_os_str().as_encoded_bytes()) else {
            return Vec::new();
        };
        let owner = if all_users {
            match lstat_uid(&c) {
                Some(u) => u,
                None => return Vec::new(),
            }
        } else {
            me
        };
        return match open_dir(p, owner) {
            Found::Usable(d) => vec![d],
            Found::Shared(_) if !all_users => match open_dir(&private_in(p, me), me) {
                Found::Usable(d) => vec![d],
                _ => Vec::new(),
            },
            Found::Shared(_) => users_in(p, |u, _| private_in(p, u)),
            _ => Vec::new(),
        };
    }
    let mut out = Vec::new();
    if !all_users {
        for k in 0..=ALTERNATES {
            if let Found::Usable(d) = open_dir(&default_path(me, k), me) {
                out.push(d);
            }
        }
        return out;
    }
    users_in(Path::new(SHM), default_path)
}

/// The usable directories `cudapool-<uid>[.k]` in `parent`, each checked against the uid its
/// name gives; `at(uid, k)` is where that name lies.
fn users_in(parent: &Path, at: impl Fn(u32, usize) -> PathBuf) -> Vec<RunDir> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(parent) else {
        return out;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix("cudapool-")) else {
            continue;
        };
        let (u, k) = match rest.split_once('.') {
            Some((u, k)) => (
                u,
                k.parse::<usize>()
                    .ok()
                    .filter(|&k| (1..=ALTERNATES).contains(&k)),
            ),
            None => (rest, Some(0)),
        };
        let (Ok(u), Some(k)) = (u.parse::<u32>(), k) else {
            continue;
        };
        let path = at(u, k);
        if path.file_name() != Some(name.as_os_str()) {
            continue; // an alternate's name where only private directories live
        }
        if let Found::Usable(d) = open_dir(&path, u) {
            out.push(d);
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    out
}

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
    fn a_configured_directory_is_made_0700_and_files_open_through_it() {
        let d = scratch("made").join("run");
        let (dir, said) = mine(Some(&d)).expect("made");
        assert!(said.is_none());
        let mode = std::fs::metadata(&d).unwrap().permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
            0o700
        );
        let fd = dir
            .open("f", libc::O_RDWR | libc::O_CREAT | libc::O_EXCL)
            .unwrap();
        reserve(fd.as_raw_fd(), 4096).unwrap();
        assert_eq!(std::fs::metadata(d.join("f")).unwrap().len(), 4096);
        assert_eq!(dir.names(10), vec!["f".to_string()]);
        assert!(
            dir.open("../f", libc::O_RDONLY).is_err(),
            "a name with a slash"
        );
        dir.unlink("f");
        assert!(dir.names(10).is_empty());
    }

    #[test]
    fn a_link_or_a_file_or_a_writable_directory_is_refused() {
        let base = scratch("refused");
        let target = base.join("target");
        std::fs::create_dir(&target).unwrap();
        let link = base.join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(mine(Some(&link)).is_err(), "a link to a directory");
        let file = base.join("file");
        std::fs::write(&file, b"x").unwrap();
        assert!(mine(Some(&file)).is_err(), "a file");
        // A directory of ours that others may write is never changed: a private directory
        // inside it is used instead, and readers look there too.
        let open = base.join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::os::unix::fs::PermissionsExt::from_mode(0o1777))
            .unwrap();
        let (d, _) = mine(Some(&open)).expect("a private directory inside");
        assert_eq!(d.path(), private_in(&open, uid()));
        let mode = std::fs::metadata(&open).unwrap().permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o7777,
            0o1777,
            "the shared directory kept its mode"
        );
        let seen = readable(false, Some(&open));
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].path(), d.path());
        // An existing directory of ours with a loose mode is not tightened either.
        let loose = base.join("loose");
        std::fs::create_dir(&loose).unwrap();
        std::fs::set_permissions(&loose, std::os::unix::fs::PermissionsExt::from_mode(0o2775))
            .unwrap();
        assert!(mine(Some(&loose)).is_ok());
        let mode = std::fs::metadata(&loose).unwrap().permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o7777,
            0o2775
        );
    }

    #[test]
    fn the_lock_names_its_holder_to_another_process_only() {
        let d = scratch("lock");
        let (dir, _) = mine(Some(&d)).unwrap();
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
