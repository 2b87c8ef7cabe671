//! The one way cudapool writes a file a user named (`CUDAPOOL_REPORT`, `CUDAPOOL_TRACE`,
//! `CUDAPOOL_OOM_SNAPSHOT`, `cudapool_snapshot*`, the CLI's `-o`): a path in a directory other
//! users may write is theirs until proven otherwise (docs/design.md, "What cudapool opens on a shared node").
//!
//! **How.** The folder is opened once; what is at the name is looked at without following it
//! (`fstatat(AT_SYMLINK_NOFOLLOW)`): a symbolic link, a FIFO, a device, a directory or a file
//! another user owns is refused with one line, never opened. The bytes go into a new file beside
//! the name (`O_CREAT | O_EXCL | O_NOFOLLOW`, mode 0666 less the umask, as any tool makes a
//! file the user named, or the mode of the file it replaces),
//! which is then renamed over the name: nothing is ever truncated or written in place, a reader
//! never sees half a file, and whatever a neighbour plants at the name between the look and the
//! rename is replaced, never followed or written into (in a sticky directory the kernel refuses
//! a rename over another user's file).
//!
//! **The folders.** The path's folders are opened one at a time from `/` (or from the working
//! directory), never through a link in a folder that anyone but root and this user may write
//! (`/tmp`, a team's folder): a neighbour's link there, to `/etc` say, is refused with one line,
//! also on a host whose `fs.protected_symlinks` is off. A link in a folder only root or this user
//! can write is followed, its target walked the same way.
//!
//! **When.** [`check`] says at once whether a path can be written: the library calls it when it
//! reads the variables, `cudapool run` before it starts the program (a long job never learns at
//! exit that its trace is lost).

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

fn errno() -> std::io::Error {
    std::io::Error::last_os_error()
}

/// A path split into its open folder and its last component.
struct Target {
    dir: OwnedFd,
    name: CString,
    /// What is at the name now (a regular file of this user), if anything.
    existing: Option<libc::stat>,
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

/// What kind of thing a mode says, for messages.
fn kind(mode: libc::mode_t) -> &'static str {
    match mode & libc::S_IFMT {
        libc::S_IFLNK => "a symbolic link",
        libc::S_IFIFO => "a FIFO",
        libc::S_IFCHR | libc::S_IFBLK => "a device",
        libc::S_IFDIR => "a directory",
        libc::S_IFSOCK => "a socket",
        _ => "not a regular file",
    }
}

/// A folder a link in it may be followed from: one that only root or this user may write.
fn trusted_folder(fd: libc::c_int) -> bool {
    // SAFETY: a zeroed stat is a valid out-struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat of our descriptor into `st`.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return false;
    }
    (st.st_uid == 0 || st.st_uid == euid()) && st.st_mode & 0o022 == 0
}

fn open_at(
    dirfd: libc::c_int,
    name: &std::ffi::CStr,
    flags: libc::c_int,
) -> std::io::Result<OwnedFd> {
    // SAFETY: openat relative to our descriptor (or AT_FDCWD) of a NUL-terminated name.
    let fd = unsafe { libc::openat(dirfd, name.as_ptr(), flags | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(errno());
    }
    // SAFETY: a descriptor openat just gave us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Opens `folder` one component at a time (see the module's notes): never through a link that
/// sits in a folder others may write. `Err` is one line.
fn open_folder(folder: &Path) -> Result<OwnedFd, String> {
    use std::collections::VecDeque;
    use std::os::unix::ffi::OsStrExt as _;
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW;
    let root = |abs: bool| open_at(libc::AT_FDCWD, if abs { c"/" } else { c"." }, flags);
    let parts = |p: &Path| -> VecDeque<Vec<u8>> {
        p.components()
            .filter_map(|c| match c {
                std::path::Component::Normal(n) => Some(n.as_bytes().to_vec()),
                std::path::Component::ParentDir => Some(b"..".to_vec()),
                _ => None,
            })
            .collect()
    };
    let mut cur = root(folder.is_absolute()).map_err(|e| format!("{}: {e}", folder.display()))?;
    let mut todo = parts(folder);
    let mut links = 0;
    while let Some(part) = todo.pop_front() {
        let c =
            CString::new(part.clone()).map_err(|_| format!("{}: not a path", folder.display()))?;
        match open_at(cur.as_raw_fd(), &c, flags) {
            Ok(next) => cur = next,
            Err(e) if matches!(e.raw_os_error(), Some(libc::ELOOP) | Some(libc::ENOTDIR)) => {
                let mut buf = [0u8; 4096];
                // SAFETY: readlinkat of a name in our folder into our buffer, bounded by its size.
                let n = unsafe {
                    libc::readlinkat(
                        cur.as_raw_fd(),
                        c.as_ptr(),
                        buf.as_mut_ptr().cast(),
                        buf.len(),
                    )
                };
                if n < 0 {
                    return Err(format!(
                        "{}: {} is not a folder",
                        folder.display(),
                        String::from_utf8_lossy(&part)
                    ));
                }
                if !trusted_folder(cur.as_raw_fd()) {
                    return Err(format!(
                        "{}: {} is a link in a folder other users may write; cudapool never writes through one (name the folder it points to)",
                        folder.display(),
                        String::from_utf8_lossy(&part)
                    ));
                }
                links += 1;
                if links > 40 {
                    return Err(format!("{}: too many links", folder.display()));
                }
                let target =
                    Path::new(std::ffi::OsStr::from_bytes(&buf[..n as usize])).to_path_buf();
                if target.is_absolute() {
                    cur = root(true).map_err(|e| format!("{}: {e}", folder.display()))?;
                }
                for p in parts(&target).into_iter().rev() {
                    todo.push_front(p);
                }
            }
            Err(e) => {
                return Err(match e.raw_os_error() {
                    Some(libc::ENOENT) => format!("{}: no such folder ({e})", folder.display()),
                    Some(libc::EACCES) => format!(
                        "{}: cannot be entered by this user ({e}): a folder on its way is closed",
                        folder.display()
                    ),
                    Some(libc::ENOTDIR) => format!("{}: not a folder ({e})", folder.display()),
                    _ => format!("{}: {e}", folder.display()),
                })
            }
        }
    }
    Ok(cur)
}

/// Opens `path`'s folder and looks at its name: `Err` is why it cannot be written.
fn target(path: &Path) -> Result<Target, String> {
    let name = path
        .file_name()
        .filter(|n| !n.is_empty())
        .ok_or_else(|| format!("{}: not a file's path", path.display()))?;
    let folder = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let dir = open_folder(folder)?;
    // SAFETY: faccessat on our directory descriptor and a static name, effective ids.
    if unsafe {
        libc::faccessat(
            dir.as_raw_fd(),
            c".".as_ptr(),
            libc::W_OK | libc::X_OK,
            libc::AT_EACCESS,
        )
    } != 0
    {
        return Err(format!(
            "{}: cannot write in this folder ({})",
            folder.display(),
            errno()
        ));
    }
    let name = CString::new(name.as_encoded_bytes())
        .map_err(|_| format!("{}: not a path", path.display()))?;
    // SAFETY: a zeroed stat is a valid out-struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstatat relative to our descriptor, never following a link.
    let r = unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            name.as_ptr(),
            &mut st,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    let existing = if r == 0 {
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(format!(
                "{}: {} is there; cudapool writes only regular files",
                path.display(),
                kind(st.st_mode)
            ));
        }
        if st.st_uid != euid() {
            return Err(format!(
                "{}: the file there belongs to user {}; cudapool never writes into another user's file",
                path.display(),
                st.st_uid
            ));
        }
        Some(st)
    } else if errno().raw_os_error() == Some(libc::ENOENT) {
        None
    } else {
        return Err(format!("{}: {}", path.display(), errno()));
    };
    Ok(Target {
        dir,
        name,
        existing,
    })
}

/// Whether `path` can be written by [`write`]: its folder exists and this process may write
/// in it, and nothing but a regular file of this user is at its name. `Err` is one line.
pub fn check(path: &Path) -> Result<(), String> {
    let t = target(path)?;
    // The folder takes a new file as `write` makes one, tried now and removed: a read-only or
    // pseudo file system (/proc) refuses here, not at exit.
    let (tmp, _fd) = create_beside(&t, path)?;
    // SAFETY: unlinkat of the file just made, relative to the folder's descriptor.
    unsafe { libc::unlinkat(t.dir.as_raw_fd(), tmp.as_ptr(), 0) };
    Ok(())
}

/// `path` made absolute against the current directory (a program may change directory before
/// the file is written at exit).
pub fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

/// Writes `bytes` as the whole of `path`: a new file beside it renamed over the name (see the
/// module's notes). Returns the number of bytes written.
pub fn write(path: &Path, bytes: &[u8]) -> Result<usize, String> {
    let t = target(path)?;
    let (tmp, fd) = create_beside(&t, path)?;
    let fail = |why: String| {
        // SAFETY: unlinkat of our own new file, relative to the folder's descriptor.
        unsafe { libc::unlinkat(t.dir.as_raw_fd(), tmp.as_ptr(), 0) };
        Err(format!("{}: {why}", path.display()))
    };
    // A file it replaces keeps its mode; a new one has the umask's (from its creation).
    if let Some(st) = t.existing {
        // SAFETY: fchmod of the file we just made.
        unsafe { libc::fchmod(fd.as_raw_fd(), st.st_mode & 0o777) };
    }
    let mut done = 0;
    while done < bytes.len() {
        // SAFETY: write(2) of the unwritten rest of `bytes`, bounded by its length.
        let n = unsafe {
            libc::write(
                fd.as_raw_fd(),
                bytes[done..].as_ptr().cast(),
                bytes.len() - done,
            )
        };
        match n {
            n if n > 0 => done += n as usize,
            _ if errno().raw_os_error() == Some(libc::EINTR) => {}
            _ => return fail(errno().to_string()),
        }
    }
    drop(fd);
    // SAFETY: renameat of our new file over the name, both relative to the folder.
    let r = unsafe {
        libc::renameat(
            t.dir.as_raw_fd(),
            tmp.as_ptr(),
            t.dir.as_raw_fd(),
            t.name.as_ptr(),
        )
    };
    if r != 0 {
        return fail(format!("cannot replace it: {}", errno()));
    }
    Ok(bytes.len())
}

/// Makes a new file beside the target, with a name nobody could have guessed to plant.
fn create_beside(t: &Target, path: &Path) -> Result<(CString, OwnedFd), String> {
    static N: AtomicU64 = AtomicU64::new(0);
    let base = t.name.to_string_lossy();
    // Short enough for NAME_MAX whatever the target's name.
    let stem: String = base.chars().take(180).collect();
    for _ in 0..16 {
        let nonce = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let tmp = format!(
            ".{stem}.{}-{}-{nonce:x}.part",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let c = CString::new(tmp).map_err(|_| format!("{}: not a path", path.display()))?;
        // SAFETY: openat relative to our folder: a new file (never an existing one, never
        // through a link), closed on exec.
        let fd = unsafe {
            libc::openat(
                t.dir.as_raw_fd(),
                c.as_ptr(),
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                0o666,
            )
        };
        if fd >= 0 {
            // SAFETY: a descriptor openat just gave us.
            return Ok((c, unsafe { OwnedFd::from_raw_fd(fd) }));
        }
        if errno().raw_os_error() != Some(libc::EEXIST) {
            return Err(format!(
                "{}: cannot write beside it: {}",
                path.display(),
                errno()
            ));
        }
    }
    Err(format!("{}: no free name beside it", path.display()))
}

/// Creates `path` new (`O_EXCL`, never through a link, mode 0666 less the umask) and writes `bytes` into it:
/// for a file another process of this user asked for by a name of its own making (`cudapool
/// snapshot`), which that process then renames with [`replace`].
pub fn create_new(path: &Path, bytes: &[u8]) -> Result<(), String> {
    use std::io::Write as _;
    let t = target(path)?;
    // SAFETY: openat of a new file in our folder's descriptor, never through a link.
    let fd = unsafe {
        libc::openat(
            t.dir.as_raw_fd(),
            t.name.as_ptr(),
            libc::O_WRONLY
                | libc::O_CREAT
                | libc::O_EXCL
                | libc::O_NOFOLLOW
                | libc::O_NONBLOCK
                | libc::O_CLOEXEC,
            0o666,
        )
    };
    if fd < 0 {
        return Err(errno().to_string());
    }
    // SAFETY: a descriptor openat just gave us, owned by the File from here.
    let mut f = unsafe { std::fs::File::from_raw_fd(fd) };
    f.write_all(bytes).map_err(|e| e.to_string())
}

/// Renames `from` (a complete new file of this user) over `to`, with `to` checked as [`write`]
/// checks its target.
pub fn replace(from: &Path, to: &Path) -> Result<(), String> {
    let src = target(from)?;
    let dst = target(to)?;
    // SAFETY: renameat between two folders we opened, of NUL-terminated names.
    let r = unsafe {
        libc::renameat(
            src.dir.as_raw_fd(),
            src.name.as_ptr(),
            dst.dir.as_raw_fd(),
            dst.name.as_ptr(),
        )
    };
    if r != 0 {
        return Err(format!("{}: {}", to.display(), errno()));
    }
    Ok(())
}

/// Reads at most `max` bytes of a regular file (never a FIFO or device: opened without
/// blocking and checked on the descriptor). `Err` says why, with the path.
pub fn read_bounded(path: &Path, max: u64) -> Result<Vec<u8>, String> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let meta = f
        .metadata()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if !meta.file_type().is_file() {
        use std::os::unix::fs::MetadataExt as _;
        return Err(format!(
            "{}: {}, not a regular file",
            path.display(),
            kind(meta.mode() as libc::mode_t)
        ));
    }
    if meta.len() > max {
        return Err(format!(
            "{}: {} bytes, more than the {} bytes read at most",
            path.display(),
            meta.len(),
            max
        ));
    }
    let mut out = Vec::with_capacity(meta.len() as usize);
    // The file may grow while read: never more than `max` bytes.
    f.take(max + 1)
        .read_to_end(&mut out)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if out.len() as u64 > max {
        return Err(format!(
            "{}: more than the {max} bytes read at most",
            path.display()
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("cudapool-out-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn writes_new_and_replaces_keeping_the_mode() {
        let d = scratch("new");
        let p = d.join("report.txt");
        assert!(check(&p).is_ok());
        assert_eq!(write(&p, b"one").unwrap(), 3);
        assert_eq!(std::fs::read(&p).unwrap(), b"one");
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        // New: as the umask says (read without changing it: tests run in threads).
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let umask = status
            .lines()
            .find_map(|l| l.strip_prefix("Umask:"))
            .map(|m| u32::from_str_radix(m.trim(), 8).unwrap())
            .unwrap();
        assert_eq!(mode, 0o666 & !umask);
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o640)).unwrap();
        write(&p, b"two, longer").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two, longer");
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o640);
        // Nothing is left beside it.
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 1);
    }

    #[test]
    fn a_link_a_fifo_a_directory_or_a_missing_folder_is_refused() {
        let d = scratch("refused");
        let victim = d.join("victim");
        std::fs::write(&victim, b"keep me").unwrap();
        let link = d.join("link");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        let e = write(&link, b"x").unwrap_err();
        assert!(e.contains("symbolic link"), "{e}");
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep me");
        let fifo = d.join("fifo");
        let c = CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo of a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = check(&fifo).unwrap_err();
        assert!(e.contains("FIFO"), "{e}");
        let e = read_bounded(&fifo, 10).unwrap_err();
        assert!(e.contains("FIFO"), "{e}");
        assert!(check(&d).unwrap_err().contains("directory"));
        let e = check(&d.join("nope/x")).unwrap_err();
        assert!(e.contains("no such folder"), "{e}");
        assert!(read_bounded(Path::new("/dev/zero"), 10)
            .unwrap_err()
            .contains("device"));
    }

    /// A link standing for a folder of the path, in a folder others may write (a neighbour's
    /// `/tmp/reports -> /etc`), is never followed; one in a folder of our own is (issue 54,
    /// case 9; before, the folder was opened by its path and the link followed).
    #[test]
    fn a_link_among_the_folders_is_followed_only_where_no_one_else_writes() {
        use std::os::unix::fs::PermissionsExt as _;
        let d = scratch("folders");
        let shared = d.join("shared");
        let kept = d.join("kept");
        std::fs::create_dir_all(&shared).unwrap();
        std::fs::create_dir_all(&kept).unwrap();
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
        std::os::unix::fs::symlink(&kept, shared.join("reports")).unwrap();
        let e = write(&shared.join("reports/report.txt"), b"x").unwrap_err();
        assert!(
            e.contains("a link in a folder other users may write"),
            "{e}"
        );
        assert!(!kept.join("report.txt").exists());
        assert!(create_new(&shared.join("reports/part"), b"x").is_err());
        // Our own folder: the link is ours to follow.
        std::os::unix::fs::symlink(&kept, d.join("mine")).unwrap();
        write(&d.join("mine/report.txt"), b"ok").unwrap();
        assert_eq!(std::fs::read(kept.join("report.txt")).unwrap(), b"ok");
        create_new(&d.join("part"), b"new").unwrap();
        replace(&d.join("part"), &d.join("mine/done")).unwrap();
        assert_eq!(std::fs::read(kept.join("done")).unwrap(), b"new");
    }

    #[test]
    fn reads_are_bounded() {
        let d = scratch("bounded");
        let p = d.join("big");
        std::fs::write(&p, vec![b'x'; 100]).unwrap();
        assert_eq!(read_bounded(&p, 100).unwrap().len(), 100);
        assert!(read_bounded(&p, 99).unwrap_err().contains("more than"));
    }
}
