//! A shared file cut under a mapping costs the file, never the process (issue 54, case 8).
//!
//! A group's ledger is a file of the user's, mapped by every member. If anyone cuts it
//! (`truncate -s 0`, an editor, a full disk), a touch of the mapping past the new end is a
//! SIGBUS, which would kill every member. cudapool registers each such mapping here; a SIGBUS
//! whose address lies in one has its range replaced by private zero pages (the touch then goes
//! on), and the range is marked hit: its owner rebuilds from the file at its next use. A SIGBUS
//! anywhere else goes to whatever handler the program had before, or ends the process as it
//! would have without cudapool.
//!
//! Residual, said in docs/deploying.md: a cut in the microseconds a member holds the ledger's
//! robust mutex leaves that thread's robust-mutex list pointing into zero pages.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Once;

const SLOTS: usize = 8;

/// A guarded range: its start and length (0: free slot), and whether a SIGBUS hit it.
struct Range {
    start: AtomicUsize,
    len: AtomicUsize,
    hit: AtomicBool,
}

#[allow(clippy::declare_interior_mutable_const)]
const FREE: Range = Range {
    start: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    hit: AtomicBool::new(false),
};
static RANGES: [Range; SLOTS] = [FREE; SLOTS];
static INSTALL: Once = Once::new();
/// The program's handler before ours (written once, before ours is installed).
static mut PREVIOUS: Option<libc::sigaction> = None;

/// Guards `len` bytes at `start` (a shared mapping of a file others may cut). The slot to ask
/// [`hit`] about and give to [`unguard`]; `None` when every slot is taken (unguarded).
pub fn guard(start: *mut libc::c_void, len: usize) -> Option<usize> {
    INSTALL.call_once(install);
    for (i, r) in RANGES.iter().enumerate() {
        if r.len
            .compare_exchange(0, usize::MAX, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            r.hit.store(false, Ordering::Relaxed);
            r.start.store(start as usize, Ordering::Release);
            r.len.store(len, Ordering::Release);
            return Some(i);
        }
    }
    None
}

/// Stops guarding slot `i` (before its range is unmapped).
pub fn unguard(i: usize) {
    if let Some(r) = RANGES.get(i) {
        r.len.store(0, Ordering::Release);
    }
}

/// Whether a SIGBUS hit slot `i`'s range since the last call (its range now holds zero pages
/// of this process alone).
pub fn hit(i: usize) -> bool {
    RANGES
        .get(i)
        .is_some_and(|r| r.hit.swap(false, Ordering::AcqRel))
}

/// Whether a SIGBUS hit slot `i`'s range, without taking the news (see [`hit`]).
pub fn peek(i: usize) -> bool {
    RANGES.get(i).is_some_and(|r| r.hit.load(Ordering::Acquire))
}

fn install() {
    // SAFETY: a zeroed sigaction is valid; we fill the handler, flags and an empty mask.
    let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
    sa.sa_sigaction = on_sigbus as *const () as usize;
    sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_NODEFER;
    // SAFETY: sa_mask is a valid sigset_t inside `sa`.
    unsafe { libc::sigemptyset(&mut sa.sa_mask) };
    // SAFETY: a zeroed sigaction is a valid out-struct.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: `PREVIOUS` is written here only, inside `Once`, before our handler (its only
    // reader) can run.
    unsafe {
        if libc::sigaction(libc::SIGBUS, &sa, &mut old) == 0 {
            PREVIOUS = Some(old);
        }
    }
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel hands a valid siginfo for a SA_SIGINFO handler.
    let addr = unsafe { (*info).si_addr() } as usize;
    for r in &RANGES {
        let len = r.len.load(Ordering::Acquire);
        let start = r.start.load(Ordering::Acquire);
        if len == 0 || len == usize::MAX || addr < start || addr >= start.saturating_add(len) {
            continue;
        }
        // SAFETY: replaces our own guarded mapping, in place, with private zero pages (mmap is
        // a plain system call, safe in a handler); the faulting touch then goes on.
        let p = unsafe {
            libc::mmap(
                start as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if p != libc::MAP_FAILED {
            r.hit.store(true, Ordering::Release);
            return;
        }
    }
    // Not ours: as if cudapool were not there.
    // SAFETY: written once before this handler was installed, never again.
    let previous = unsafe { *std::ptr::addr_of!(PREVIOUS) };
    match previous {
        Some(p) if p.sa_sigaction != libc::SIG_DFL && p.sa_sigaction != libc::SIG_IGN => {
            if p.sa_flags & libc::SA_SIGINFO != 0 {
                // SAFETY: the program's own three-argument handler, as it installed it.
                let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    unsafe { std::mem::transmute(p.sa_sigaction) };
                f(sig, info, ctx);
            } else {
                // SAFETY: the program's own one-argument handler, as it installed it.
                let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(p.sa_sigaction) };
                f(sig);
            }
        }
        _ => {
            // The default action: returning re-runs the touch, which now ends the process.
            // SAFETY: a zeroed sigaction with SIG_DFL is valid.
            let mut dfl: libc::sigaction = unsafe { std::mem::zeroed() };
            dfl.sa_sigaction = libc::SIG_DFL;
            // SAFETY: restores the default disposition of SIGBUS.
            unsafe { libc::sigaction(libc::SIGBUS, &dfl, std::ptr::null_mut()) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;
    use std::os::fd::AsRawFd as _;

    #[test]
    fn a_cut_file_under_a_guarded_mapping_reads_zeros_and_is_said() {
        let path = std::env::temp_dir().join(format!("cudapool-sigbus-{}", std::process::id()));
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        f.write_all(&[7u8; 8192]).unwrap();
        // SAFETY: a shared mapping of 8 KiB of our own file.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                8192,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        let slot = guard(p, 8192).expect("a slot");
        f.set_len(0).unwrap();
        // SAFETY: inside our mapping; past the file's end now, which is what is tested.
        let v = unsafe { std::ptr::read_volatile(p.cast::<u8>().add(4096)) };
        assert_eq!(v, 0, "zero pages in place of the cut file");
        assert!(hit(slot), "the cut is said");
        assert!(!hit(slot), "once");
        unguard(slot);
        // SAFETY: our own mapping, unmapped once.
        unsafe { libc::munmap(p, 8192) };
        let _ = std::fs::remove_file(&path);
    }
}
