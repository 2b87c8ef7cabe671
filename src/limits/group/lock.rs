//! How a member waits for the ledger's mutex ([`Locked`] holds it): a crowd passing it is
//! waited for; a holder that stands still for [`LOCK_GIVE_UP`] is not, unless it goes on (runs
//! or sleeps: a starved one), which is waited for up to [`LOCK_GIVE_UP_RUNNING`].

use super::ledger;
use super::{
    fd_of, Group, Locked, DEVICES, LOCK_GIVE_UP, LOCK_GIVE_UP_RUNNING, LOCK_WAIT, MEMBERS,
};
use crate::base::config::LogLevel::Warn;
use crate::base::procstate;
use crate::log_at;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

impl Group {
    /// The mutex itself (see [`lock`](Self::lock)). A joiner waits for it `at_door`, holding
    /// the ledger's door: while others pass the mutex it turns the door too, or joiners
    /// queued there would take a crowd ahead of it for a stopped holder.
    pub(super) fn lock_mutex(&self, at_door: bool) -> Result<Locked<'_>, String> {
        // SAFETY: mapped for the Group's life; `seq` is an atomic, bumped by each holder.
        let seq = unsafe { &(*self.map.ledger).seq };
        let mut passed = seq.load(Ordering::Acquire);
        let mut still_since = Instant::now();
        let mut deadline = still_since + LOCK_GIVE_UP;
        loop {
            let until = realtime_after(LOCK_WAIT);
            // SAFETY: the mutex lives in our mapping, initialised by the ledger's creator; a
            // valid absolute timeout.
            let r = unsafe { libc::pthread_mutex_timedlock(&mut (*self.map.ledger).mutex, &until) };
            match r {
                0 => return Ok(Locked::new(self)),
                libc::EOWNERDEAD => {
                    let mut l = Locked::new(self);
                    repair(&mut l);
                    // SAFETY: we hold the mutex after EOWNERDEAD; the state is repaired.
                    unsafe { libc::pthread_mutex_consistent(&mut l.mutex) };
                    return Ok(l);
                }
                e => {
                    // Timed out, or unusable: if nobody else lives, nobody can be holding it.
                    let fd = fd_of(&self.map);
                    if !ledger::others_live(fd) {
                        if let Some(_door) = ledger::try_enter(fd) {
                            if !ledger::others_live(fd) {
                                ledger::reset_mutex(self.map.ledger);
                                log_at!(
                                    Warn,
                                    "group {}: its ledger's lock was held by no live process ({}): reset",
                                    self.name,
                                    std::io::Error::from_raw_os_error(e)
                                );
                                continue;
                            }
                        }
                    }
                    let now = Instant::now();
                    let seen = seq.load(Ordering::Acquire);
                    if seen != passed {
                        // Others passed it meanwhile: a crowd, not a stuck holder.
                        passed = seen;
                        still_since = now;
                        deadline = now + LOCK_GIVE_UP;
                        if at_door {
                            // SAFETY: an atomic in the ledger, mapped for the Group's life.
                            unsafe { (*self.map.ledger).turns.fetch_add(1, Ordering::Relaxed) };
                        }
                    } else if now > deadline {
                        // A holder that goes on (a starved one) is waited for longer.
                        let owner = self.mutex_owner();
                        let state = owner.and_then(procstate::state);
                        let stood = now - still_since;
                        if state.is_some_and(procstate::goes_on) && stood < LOCK_GIVE_UP_RUNNING {
                            deadline = now + LOCK_GIVE_UP.min(LOCK_GIVE_UP_RUNNING - stood);
                            continue;
                        }
                        self.stuck.store(true, Ordering::Relaxed);
                        // ETIMEDOUT reads "Connection timed out": said in words instead.
                        let how = match e {
                            libc::ETIMEDOUT => "nobody passed it meanwhile".to_string(),
                            e => std::io::Error::from_raw_os_error(e).to_string(),
                        };
                        let why = format!(
                            "group {}: its ledger's lock has been held for more than {} s by {} while other members live ({how}); refusing what needs it",
                            self.name,
                            stood.as_secs(),
                            procstate::named("thread", owner, state),
                        );
                        log_at!(Warn, "{why}");
                        return Err(why);
                    }
                }
            }
        }
    }
}

impl Group {
    /// The thread that holds the ledger's mutex, as its lock word names it: a robust mutex's
    /// word holds its owner's thread id (the kernel reads it there when the owner dies;
    /// glibc keeps the word first in `pthread_mutex_t`), in the owner's pid namespace. `None`
    /// when it names none.
    fn mutex_owner(&self) -> Option<u32> {
        // SAFETY: the mutex lives in our mapping for the Group's life; its first word is an
        // aligned u32 that the kernel and the holders change atomically.
        let word = unsafe {
            (*(std::ptr::addr_of!((*self.map.ledger).mutex) as *const AtomicU32))
                .load(Ordering::Relaxed)
        };
        let tid = word & libc::FUTEX_TID_MASK;
        (tid != 0).then_some(tid)
    }
}

/// Recomputes every total from the live members' figures (after a member died holding the
/// mutex, perhaps between two of its updates).
fn repair(l: &mut Locked) {
    for d in 0..DEVICES {
        let sum = (0..MEMBERS)
            .filter(|&i| l.members[i].live != 0)
            .fold(0u64, |t, i| t.saturating_add(l.members[i].reserved[d]));
        l.devices[d].total = sum;
    }
}

fn realtime_after(d: Duration) -> libc::timespec {
    // SAFETY: a zeroed timespec is valid; clock_gettime fills it.
    let mut now: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: CLOCK_REALTIME (what pthread_mutex_timedlock measures by) and a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut now) };
    let ns = now.tv_nsec as u64 + d.subsec_nanos() as u64;
    libc::timespec {
        tv_sec: now.tv_sec + d.as_secs() as libc::time_t + (ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (ns % 1_000_000_000) as libc::c_long,
    }
}
