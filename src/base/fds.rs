//! File descriptors across processes, for the export of mapped memory (`state::ipc_mapped`):
//! a small table in a `memfd` that the exporter writes and invalidates, and `pidfd_getfd`, by
//! which an importer takes a descriptor of the exporter (the same user, and the permission to
//! trace it: what the kernel's ptrace access check allows).
//!
//! **Trust.** The importer checks what it takes on the descriptor: the table is a regular file
//! with the inode the handle names, of exactly the size its count says, its handles' sizes
//! adding up to the span the handle names, and still valid after every handle's descriptor
//! was taken (the exporter invalidates a table before it closes the
//! descriptors it lists, so a table still valid then listed the right ones).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// The table's header: `valid` (1, or 0 once invalidated), `count`, `span` (the bytes of all
/// the handles); then `count` entries of [`ENTRY`] bytes: a descriptor number (4 bytes) and
/// the size of the handle it holds (8 bytes).
const HEADER: usize = 24;
const ENTRY: usize = 12;
/// The most descriptors one table lists (a table of 4 TiB of 2 MiB handles).
pub const MAX_COUNT: u64 = 1 << 21;

fn errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// Marks `fd` close-on-exec (a descriptor that holds device memory must not leak into a
/// program the process runs).
pub fn cloexec(fd: &OwnedFd) {
    // SAFETY: fcntl on a descriptor we own; F_SETFD takes an int.
    unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) };
}

/// An exporter's table of descriptors, in a `memfd` of its own.
pub struct Table {
    fd: OwnedFd,
    /// Its inode, which the handle carries so that the importer can tell it from any other.
    pub ino: u64,
}

impl Table {
    /// A valid table listing `fds`, each a descriptor and the size of the handle it holds.
    pub fn new(fds: &[(i32, u64)]) -> Result<Table, i32> {
        // SAFETY: a NUL-terminated name and valid flags.
        let raw = unsafe { libc::memfd_create(c"cudapool-ipc".as_ptr(), libc::MFD_CLOEXEC) };
        if raw < 0 {
            return Err(errno());
        }
        // SAFETY: memfd_create just gave us this descriptor.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let mut bytes = Vec::with_capacity(HEADER + ENTRY * fds.len());
        let span: u64 = fds.iter().map(|f| f.1).sum();
        for word in [1u64, fds.len() as u64, span] {
            bytes.extend_from_slice(&word.to_le_bytes());
        }
        for (f, size) in fds {
            bytes.extend_from_slice(&f.to_le_bytes());
            bytes.extend_from_slice(&size.to_le_bytes());
        }
        write_all_at(&fd, &bytes, 0)?;
        let ino = fstat(&fd)?.st_ino;
        Ok(Table { fd, ino })
    }

    /// The descriptor's number in this process (what the handle names).
    pub fn raw(&self) -> i32 {
        self.fd.as_raw_fd()
    }

    /// Invalidates the table: an importer that read it before and takes descriptors now will
    /// see that they may no longer be the ones listed.
    pub fn invalidate(&self) {
        let _ = write_all_at(&self.fd, &0u64.to_le_bytes(), 0);
    }
}

/// What an importer reads from a table it took.
#[derive(Debug, PartialEq, Eq)]
pub struct Listed {
    /// The bytes of all the handles.
    pub span: u64,
    /// Each descriptor, and the size of the handle it holds.
    pub fds: Vec<(i32, u64)>,
}

/// Reads the table behind `fd` (a descriptor taken from the exporter), checking it is the one
/// with inode `ino`, valid, and of a consistent size. `Err` names what was wrong.
pub fn read_table(fd: &OwnedFd, ino: u64) -> Result<Listed, &'static str> {
    let st = fstat(fd).map_err(|_| "fstat failed")?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG || st.st_ino != ino {
        return Err("not the exporter's table (the exporter freed the block?)");
    }
    let mut head = [0u8; HEADER];
    read_exact_at(fd, &mut head, 0).map_err(|_| "table too short")?;
    let word = |i: usize| u64::from_le_bytes(head[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
    let (valid, count, span) = (word(0), word(1), word(2));
    if valid != 1 {
        return Err("the export is gone (the exporter freed or unmapped the block)");
    }
    if count == 0
        || count > MAX_COUNT
        || st.st_size as u64 != (HEADER + ENTRY * count as usize) as u64
    {
        return Err("table of an inconsistent size");
    }
    let mut body = vec![0u8; ENTRY * count as usize];
    read_exact_at(fd, &mut body, HEADER as u64).map_err(|_| "table too short")?;
    let fds: Vec<(i32, u64)> = body
        .chunks_exact(ENTRY)
        .map(|b| {
            let fd = i32::from_le_bytes(b[..4].try_into().expect("4 bytes"));
            (fd, u64::from_le_bytes(b[4..].try_into().expect("8 bytes")))
        })
        .collect();
    let sum = fds.iter().try_fold(0u64, |t, &(_, size)| {
        (size > 0).then(|| t.checked_add(size)).flatten()
    });
    if sum != Some(span) {
        return Err("table whose handles do not add up to its span");
    }
    Ok(Listed { span, fds })
}

/// Whether the table behind `fd` is still valid (see [`Table::invalidate`]).
pub fn still_valid(fd: &OwnedFd) -> bool {
    let mut w = [0u8; 8];
    read_exact_at(fd, &mut w, 0).is_ok() && u64::from_le_bytes(w) == 1
}

/// A pidfd of process `pid`.
pub fn pidfd_open(pid: u32) -> Result<OwnedFd, i32> {
    // SAFETY: the syscall takes a pid and flags and returns a new descriptor or -1.
    let r = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if r < 0 {
        return Err(errno());
    }
    // SAFETY: the kernel just gave us this descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(r as i32) })
}

/// A copy, in this process, of descriptor `fd` of the process behind `pidfd`.
pub fn pidfd_getfd(pidfd: &OwnedFd, fd: i32) -> Result<OwnedFd, i32> {
    // SAFETY: the syscall takes a pidfd, a descriptor number and flags; returns a new
    // descriptor (close-on-exec) or -1.
    let r = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) };
    if r < 0 {
        return Err(errno());
    }
    // SAFETY: the kernel just gave us this descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(r as i32) })
}

fn fstat(fd: &OwnedFd) -> Result<libc::stat, i32> {
    // SAFETY: a zeroed stat is a valid out-struct; fd is open.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(errno());
    }
    Ok(st)
}

fn write_all_at(fd: &OwnedFd, mut bytes: &[u8], mut at: u64) -> Result<(), i32> {
    while !bytes.is_empty() {
        // SAFETY: the buffer is valid for `len` bytes of reading.
        let n = unsafe {
            libc::pwrite(
                fd.as_raw_fd(),
                bytes.as_ptr().cast(),
                bytes.len(),
                at as libc::off_t,
            )
        };
        if n <= 0 {
            return Err(if n == 0 { libc::EIO } else { errno() });
        }
        bytes = &bytes[n as usize..];
        at += n as u64;
    }
    Ok(())
}

fn read_exact_at(fd: &OwnedFd, mut buf: &mut [u8], mut at: u64) -> Result<(), i32> {
    while !buf.is_empty() {
        // SAFETY: the buffer is valid for `len` bytes of writing.
        let n = unsafe {
            libc::pread(
                fd.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                at as libc::off_t,
            )
        };
        if n <= 0 {
            return Err(if n == 0 { libc::EIO } else { errno() });
        }
        buf = &mut buf[n as usize..];
        at += n as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_reads_back_until_invalidated_and_only_with_its_inode() {
        let t = Table::new(&[(7, 2 << 20), (9, 16 << 20), (11, 2 << 20)]).unwrap();
        let mine = pidfd_open(std::process::id()).unwrap();
        let fd = pidfd_getfd(&mine, t.raw()).unwrap();
        assert_eq!(
            read_table(&fd, t.ino),
            Ok(Listed {
                span: 20 << 20,
                fds: vec![(7, 2 << 20), (9, 16 << 20), (11, 2 << 20)]
            })
        );
        assert!(read_table(&fd, t.ino + 1).is_err());
        assert!(still_valid(&fd));
        t.invalidate();
        assert!(!still_valid(&fd));
        assert!(read_table(&fd, t.ino).is_err());
    }

    #[test]
    fn a_planted_table_of_the_wrong_size_is_refused() {
        let t = Table::new(&[(3, 4096)]).unwrap();
        // A span its handles do not add up to.
        write_all_at(&t.fd, &8192u64.to_le_bytes(), 16).unwrap();
        assert_eq!(
            read_table(&t.fd, t.ino),
            Err("table whose handles do not add up to its span")
        );
        // A count that the size does not back.
        write_all_at(&t.fd, &5u64.to_le_bytes(), 8).unwrap();
        assert_eq!(
            read_table(&t.fd, t.ino),
            Err("table of an inconsistent size")
        );
        write_all_at(&t.fd, &u64::MAX.to_le_bytes(), 8).unwrap();
        assert!(read_table(&t.fd, t.ino).is_err());
    }
}
