//! The ledger file's lock bytes, which carry no data: member `i`'s liveness byte at `SIZE + i`
//! (an open-file-description lock its member holds for life; the kernel drops it however the
//! member dies), the door at `SIZE + MEMBERS`, and the door's holder byte after it.
//!
//! **Who holds the door.** Open-file-description locks do not name their holder (`F_OFD_GETLK`
//! answers pid -1). So whoever holds the door also holds a classic, process-owned lock on the
//! byte after it, which the kernel does name: a waiter whose door stood still for
//! [`DOOR_WAIT`] asks the kernel who holds it and `/proc` what that process does. A stopped
//! holder (`SIGSTOP`, a debugger) is given up on at once; a holder that runs, or sleeps in a
//! bounded wait of its own, is waited for up to [`DOOR_WAIT_RUNNING`]: on a loaded machine a
//! runnable holder can go without a CPU for longer than `DOOR_WAIT`, and its joiners are not
//! refused for it. A holder the kernel does not name (another pid namespace, a lock taken by
//! an older cudapool, or dropped because its process closed another descriptor of the file)
//! counts as stopped: the wait is what it was before the holder byte, `DOOR_WAIT`.

use super::{Ledger, MEMBERS, SIZE};
use crate::base::procstate;
use crate::base::rundir::flock;
use std::time::{Duration, Instant};

/// The longest wait at a ledger's door while nobody passes it and its holder is stopped, or
/// not known (a crowd that keeps passing is waited for as long as it takes).
pub const DOOR_WAIT: Duration = Duration::from_secs(10);
/// The longest wait at a door nobody passes while its holder runs or sleeps (a starved one).
pub const DOOR_WAIT_RUNNING: Duration = Duration::from_secs(120);

pub(in crate::limits::group) fn member_byte(i: usize) -> i64 {
    (SIZE + i) as i64
}

pub(in crate::limits::group) fn door_byte() -> i64 {
    (SIZE + MEMBERS) as i64
}

/// The byte whose classic lock names the door's holder.
pub(in crate::limits::group) fn holder_byte() -> i64 {
    door_byte() + 1
}

/// Takes an exclusive open-file-description lock on `len` bytes at `start`, without waiting.
pub(in crate::limits::group) fn try_lock(fd: libc::c_int, start: i64, len: usize) -> bool {
    let f = flock(libc::F_WRLCK, start, len);
    // SAFETY: a lock request on our descriptor with a valid flock; never blocks.
    unsafe { libc::fcntl(fd, libc::F_OFD_SETLK, &f) == 0 }
}

pub(in crate::limits::group) fn unlock(fd: libc::c_int, start: i64, len: usize) {
    let f = flock(libc::F_UNLCK, start, len);
    // SAFETY: an unlock on our descriptor with a valid flock.
    unsafe { libc::fcntl(fd, libc::F_OFD_SETLK, &f) };
}

/// Whether another open file description holds a lock on any of `len` bytes at `start` (this
/// descriptor's own locks never show). An error counts as held: the careful answer.
pub(in crate::limits::group) fn held(fd: libc::c_int, start: i64, len: usize) -> bool {
    let mut f = flock(libc::F_WRLCK, start, len);
    // SAFETY: a lock test on our descriptor with a valid flock.
    let r = unsafe { libc::fcntl(fd, libc::F_OFD_GETLK, &mut f) };
    r != 0 || f.l_type != libc::F_UNLCK as libc::c_short
}

/// How many member bytes other processes hold (live members, as the kernel says).
pub(in crate::limits::group) fn others_holding(fd: libc::c_int) -> usize {
    (0..MEMBERS)
        .filter(|&i| held(fd, member_byte(i), 1))
        .count()
}

/// Whether any member other than this descriptor's lives in the ledger.
pub(in crate::limits::group) fn others_live(fd: libc::c_int) -> bool {
    held(fd, member_byte(0), MEMBERS)
}

/// The door, held until dropped (with its holder byte).
pub(in crate::limits::group) struct Door(libc::c_int);

impl Door {
    /// The door just taken on `fd`: the holder byte is taken too, so that waiters can ask the
    /// kernel who holds it (not taken, it only costs them the longer wait).
    fn taken(fd: libc::c_int) -> Door {
        let f = flock(libc::F_WRLCK, holder_byte(), 1);
        // SAFETY: a classic lock request on our descriptor with a valid flock; never blocks.
        unsafe { libc::fcntl(fd, libc::F_SETLK, &f) };
        Door(fd)
    }
}

impl Drop for Door {
    fn drop(&mut self) {
        let f = flock(libc::F_UNLCK, holder_byte(), 1);
        // SAFETY: a classic unlock on our descriptor with a valid flock.
        unsafe { libc::fcntl(self.0, libc::F_SETLK, &f) };
        unlock(self.0, door_byte(), 1);
    }
}

/// Waits at the door of the ledger behind `fd` for as long as others keep passing it (the
/// ledger's `turns` moves); once it has stood still for `wait`, gives up if its holder is
/// stopped or not known, and waits on, up to [`DOOR_WAIT_RUNNING`] in all, while its holder
/// runs. A thousand processes joining at once on a loaded machine take longer than `wait`
/// to pass one by one, and none of them is refused for it.
pub(in crate::limits::group) fn enter(fd: libc::c_int, wait: Duration) -> Result<Door, String> {
    let mut turns = door_turns(fd);
    let mut still_since = Instant::now();
    let mut deadline = still_since + wait;
    let mut pause = Duration::from_micros(50);
    loop {
        if try_lock(fd, door_byte(), 1) {
            return Ok(Door::taken(fd));
        }
        let now = Instant::now();
        if now > deadline {
            let seen = door_turns(fd);
            if seen != turns {
                turns = seen;
                still_since = now;
                deadline = now + wait;
            } else {
                let holder = door_holder(fd);
                let state = holder.and_then(procstate::state);
                let runs = state.is_some_and(procstate::goes_on);
                let stood = now - still_since;
                if !runs || stood >= DOOR_WAIT_RUNNING.max(wait) {
                    return Err(stood_still(holder, state, stood));
                }
                deadline = now + wait.min(DOOR_WAIT_RUNNING - stood);
            }
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(5));
    }
}

/// Why a wait at the door ended, in words.
fn stood_still(holder: Option<u32>, state: Option<u8>, stood: Duration) -> String {
    let why = match state {
        Some(b'T' | b't') => " (stopped)",
        Some(_) => "",
        None => " (stopped?)",
    };
    format!(
        "{} has held the ledger's door for more than {} s without letting anyone in{why}",
        procstate::named("process", holder, state),
        stood.as_secs()
    )
}

/// The pid of the process that holds the door's holder byte, as the kernel says (0: in a pid
/// namespace this process cannot see); `None` when nobody does.
fn door_holder(fd: libc::c_int) -> Option<u32> {
    let mut f = flock(libc::F_WRLCK, holder_byte(), 1);
    // SAFETY: a classic lock test on our descriptor with a valid flock.
    if unsafe { libc::fcntl(fd, libc::F_GETLK, &mut f) } != 0 {
        return None;
    }
    (f.l_type != libc::F_UNLCK as libc::c_short).then_some(f.l_pid.max(0) as u32)
}

/// Takes the door without waiting, for a member that must reset the mutex in place.
pub(in crate::limits::group) fn try_enter(fd: libc::c_int) -> Option<Door> {
    try_lock(fd, door_byte(), 1).then(|| Door::taken(fd))
}

/// The ledger's `turns`, read through the descriptor (a waiter has mapped nothing yet); `None`
/// while the file is too short to hold it (being made).
fn door_turns(fd: libc::c_int) -> Option<u64> {
    let mut b = [0u8; 8];
    let at = std::mem::offset_of!(Ledger, turns) as libc::off_t;
    // SAFETY: reads 8 bytes of our regular file into a buffer of 8.
    let n = unsafe { libc::pread(fd, b.as_mut_ptr().cast(), 8, at) };
    (n == 8).then(|| u64::from_ne_bytes(b))
}
