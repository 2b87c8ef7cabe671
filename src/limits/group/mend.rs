//! Mending a member's ledger that was cut, scribbled or rebuilt under it (`ledger`'s notes:
//! "Cut or scribbled under its members"): whether it needs it, and the mending itself.

use super::ledger::{check, enter, initialise, Mapping, DOOR_WAIT, MAGIC, SIZE};
use crate::base::rundir;
use crate::base::sigbus;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;

/// Whether the member's mapping needs [`restore`]: a SIGBUS hit it, the file is no longer a
/// ledger's size, or its magic is gone. Costs one `fstat`; takes no lock.
pub(super) fn damaged(m: &Mapping) -> bool {
    let hit = m.guard.is_some_and(sigbus::peek);
    let whole = rundir::fstat(m.fd.as_raw_fd()).is_ok_and(|st| st.st_size as usize == SIZE);
    // SAFETY: the magic is an atomic inside our mapping (zero pages after a SIGBUS).
    let magic = unsafe { (*m.ledger).magic.load(Ordering::Acquire) };
    hit || !whole || magic != MAGIC
}

/// The generation of the ledger a member maps (see `Ledger::generation`).
pub(super) fn generation(m: &Mapping) -> u32 {
    // SAFETY: an atomic inside our mapping.
    unsafe { (*m.ledger).generation.load(Ordering::Acquire) }
}

/// Brings a member's mapping back to a valid ledger when its file was cut (a SIGBUS replaced
/// the mapping with zero pages, or the file is no longer `SIZE` bytes) or scribbled (no magic):
/// behind the door, sized again, mapped again in place, rebuilt if invalid. Whether anything
/// was wrong (each member then records its own share again: `Group::lock`).
pub(super) fn restore(m: &Mapping) -> Result<bool, String> {
    let fd = m.fd.as_raw_fd();
    let hit = m.guard.is_some_and(sigbus::hit);
    let st = rundir::fstat(fd).map_err(|e| e.to_string())?;
    // SAFETY: the magic is an atomic inside our mapping (zero pages after a SIGBUS).
    let magic = unsafe { (*m.ledger).magic.load(Ordering::Acquire) };
    if !hit && st.st_size as usize == SIZE && magic == MAGIC {
        return Ok(false);
    }
    let _door = enter(fd, DOOR_WAIT)?;
    let st = rundir::fstat(fd).map_err(|e| e.to_string())?;
    if st.st_size as usize != SIZE {
        // SAFETY: sizing our ledger's file again (the door held).
        if unsafe { libc::ftruncate(fd, SIZE as libc::off_t) } != 0 {
            return Err(format!(
                "cannot size it again: {}",
                std::io::Error::last_os_error()
            ));
        }
        rundir::reserve(fd, SIZE).map_err(|e| format!("cannot reserve it again: {e}"))?;
    }
    // SAFETY: maps the file again over our own mapping of SIZE bytes, in place, so every
    // pointer into it stays valid.
    let p = unsafe {
        libc::mmap(
            m.ledger.cast(),
            SIZE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_FIXED,
            fd,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(format!(
            "cannot map it again: {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: a whole mapped Ledger; `check` only reads it.
    if check(unsafe { &*m.ledger }).is_err() {
        initialise(m.ledger);
    }
    // SAFETY: an atomic in the whole ledger mapped again: the door turned.
    unsafe { (*m.ledger).turns.fetch_add(1, Ordering::Relaxed) };
    Ok(true)
}
