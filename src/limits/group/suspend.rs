//! A group's suspend: when one of the group's processes is stopped (Slurm suspends a job by
//! SIGTSTP to its tasks, then stops every process of it two seconds later), the memory of the
//! whole group goes to the host, not only the stopped process's (`state::suspend` decides
//! when). The ledger's `suspend` word holds the pid of the process that posted it; posting
//! wakes every member's thread, which puts its process to sleep ([`Lender::suspend`]), and a
//! member holds its wakes while the word is set and its poster lives ([`Group::suspended`]).
//! [`relay`] posts or clears the word from a signal handler of a process that is no member (a
//! job's batch shell, which is what Slurm signals): system calls only.
//!
//! [`Lender::suspend`]: super::Lender::suspend

use super::ledger::{Ledger, MAGIC, SIZE, VERSION};
use super::lending::futex_wake;
use super::Group;
use std::ffi::CStr;
use std::sync::atomic::Ordering::{AcqRel, Acquire, SeqCst};

impl Group {
    /// Posts the group's suspend as process `pid` (0: ends it), and wakes every member's thread.
    pub fn set_suspend(&self, pid: u32) {
        // SAFETY: the mapping lives as long as `self`.
        post(unsafe { &*self.map.ledger }, u64::from(pid));
    }

    /// The pid that posted the group's suspend, 0 when none (also when its poster is gone: a
    /// process that died stopped resumes nobody).
    pub fn suspended_by(&self) -> u32 {
        // SAFETY: as above.
        let pid = unsafe { &*self.map.ledger }.suspend.load(Acquire);
        match u32::try_from(pid) {
            Ok(p) if p != 0 && alive(p) => p,
            _ => 0,
        }
    }

    /// Whether the group is suspended (see [`suspended_by`](Self::suspended_by)).
    pub fn suspended(&self) -> bool {
        self.suspended_by() != 0
    }

    /// Counts a member's sleep for a suspend: the bytes it gave back, and whether it was late.
    pub fn record_suspend(&self, bytes: u64, late: bool) {
        // SAFETY: as above.
        let l = unsafe { &*self.map.ledger };
        l.suspend_sleeps.fetch_add(1, AcqRel);
        l.suspend_bytes.fetch_add(bytes, AcqRel);
        if late {
            l.suspend_late.fetch_add(1, AcqRel);
        }
    }

    /// Counts the time a member stayed asleep for a suspend, when it wakes.
    pub fn record_suspend_asleep(&self, asleep: std::time::Duration) {
        // SAFETY: as above.
        let l = unsafe { &*self.map.ledger };
        let ms = u64::try_from(asleep.as_millis()).unwrap_or(u64::MAX);
        l.suspend_asleep_ms.fetch_add(ms, AcqRel);
    }
}

fn alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks that the process exists; a process of another user answers
    // EPERM, which is alive too.
    unsafe { libc::kill(pid as libc::pid_t, 0) == 0 || *libc::__errno_location() == libc::EPERM }
}

/// Stores the word and wakes every member slot's thread (a dead slot's bump is forgotten by
/// its next joiner). No lock: a signal handler may call it.
fn post(l: &Ledger, pid: u64) {
    l.suspend.store(pid, SeqCst);
    for m in &l.members {
        m.request.fetch_add(1, AcqRel);
        futex_wake(&m.request);
    }
}

/// Posts (`pid`) or clears (0) the suspend of the group whose ledger is at `path`, from a
/// process that is no member; only system calls, so a signal handler may call it (the caller
/// keeps `errno`). The file must be a regular file of this user holding a whole ledger of this
/// version; otherwise nothing is done (`false`).
pub fn relay(path: &CStr, pid: u32) -> bool {
    // SAFETY: open, fstat, mmap, munmap and close on our own descriptor and mapping; the
    // mapping covers a whole `Ledger` (the file is at least that long), whose every bit
    // pattern is valid, and is only read through atomics here. The user's own file could be
    // cut meanwhile only by the user: that would fault this process, not another's.
    unsafe {
        let fd = libc::open(
            path.as_ptr(),
            libc::O_RDWR | libc::O_CLOEXEC | libc::O_NOFOLLOW | libc::O_NONBLOCK,
        );
        if fd < 0 {
            return false;
        }
        let mut st: libc::stat = std::mem::zeroed();
        let usable = libc::fstat(fd, &mut st) == 0
            && st.st_mode & libc::S_IFMT == libc::S_IFREG
            && st.st_uid == libc::getuid()
            && st.st_size as u64 >= SIZE as u64;
        let p = if usable {
            libc::mmap(
                std::ptr::null_mut(),
                SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        } else {
            libc::MAP_FAILED
        };
        libc::close(fd);
        if p == libc::MAP_FAILED {
            return false;
        }
        let l = &*(p as *const Ledger);
        let valid = l.magic.load(Acquire) == MAGIC && l.version == VERSION;
        if valid {
            post(l, u64::from(pid));
        }
        libc::munmap(p, SIZE);
        valid
    }
}
