//! Lending between a group's members: a member short of room asks the others to give back idle
//! cache ([`Group::borrow`]), and each member's thread answers ([`Group::serve`]), woken through a
//! futex word in its ledger slot.

use super::{Group, Locked, DEVICES, MEMBERS};
use crate::base::config::LogLevel::{Debug, Warn};
use crate::log_at;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

impl Group {
    /// Asks the other members to give back idle cache on device `slot` until `bytes` fit, and
    /// waits for it (at most `wait`; less once every member asked has answered). Whether they
    /// fit now (the caller charges them again).
    pub fn borrow(&self, slot: usize, bytes: u64, wait: Duration) -> bool {
        let fits = |l: &Locked| {
            let limit = self.limit_of(l, slot);
            limit.admits(l.devices[slot].total.saturating_add(bytes))
        };
        let asked: Vec<(usize, u32)> = {
            let Ok(mut l) = self.lock() else { return false };
            self.reap(&mut l);
            if fits(&l) {
                return true;
            }
            (0..MEMBERS)
                .filter(|&i| i != self.me && l.members[i].live != 0)
                .map(|i| {
                    let m = &l.members[i];
                    m.want[slot].fetch_max(bytes, Ordering::AcqRel);
                    let seq = m.request.fetch_add(1, Ordering::AcqRel).wrapping_add(1);
                    futex_wake(&m.request);
                    (i, seq)
                })
                .collect()
        };
        if asked.is_empty() {
            return false;
        }
        let deadline = Instant::now() + wait;
        loop {
            std::thread::sleep(Duration::from_millis(1));
            let Ok(mut l) = self.lock() else { return false };
            self.reap(&mut l);
            if fits(&l) {
                return true;
            }
            let answered = asked.iter().all(|&(i, seq)| {
                let m = &l.members[i];
                m.live == 0 || m.served.load(Ordering::Acquire).wrapping_sub(seq) < u32::MAX / 2
            });
            if answered || Instant::now() > deadline {
                return false;
            }
        }
    }

    /// Starts the thread that answers the other members' requests: `lend(uuid, bytes)` gives
    /// back up to `bytes` of idle cache on that GPU and returns what it gave.
    pub fn serve(self: &Arc<Self>, lend: Lender) {
        let group = self.clone();
        let run = move || {
            // SAFETY: the mapping lives as long as `group`, which this thread holds.
            let me = unsafe { &(*group.map.ledger).members[group.me] };
            // Every request since this process joined counts, also one made before this
            // thread first ran (a busy machine can start it late): from the last one served.
            let mut seen = me.served.load(Ordering::Acquire);
            loop {
                futex_wait(&me.request, seen, Duration::from_secs(1));
                if crate::base::flags::exiting() {
                    return;
                }
                // A ledger cut, scribbled or rebuilt meanwhile holds this member again within a
                // second, idle or not (the lock only when it needs mending).
                if group.needs_mending() {
                    drop(group.lock());
                }
                let now = me.request.load(Ordering::Acquire);
                if now == seen {
                    continue;
                }
                seen = now;
                for d in 0..DEVICES {
                    let want = me.want[d].swap(0, Ordering::AcqRel);
                    if want == 0 {
                        continue;
                    }
                    let uuid = match group.lock() {
                        Ok(l) => l.devices[d].uuid,
                        Err(_) => continue,
                    };
                    let gave = lend(&uuid, want);
                    log_at!(
                        Debug,
                        "group {}: lent {gave} of {want} bytes asked",
                        group.name
                    );
                }
                me.served.store(seen, Ordering::Release);
            }
        };
        let spawned = std::thread::Builder::new()
            .name("cudapool-group".into())
            .stack_size(256 << 10)
            .spawn(run);
        if let Err(e) = spawned {
            log_at!(
                Warn,
                "group {}: no lending thread ({e}): this process's idle cache will not be lent",
                self.name
            );
        }
    }
}

fn futex_wake(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE on a 4-byte aligned word of shared memory (not a private futex: the
    // waiters are other processes).
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
        );
    }
}

fn futex_wait(word: &AtomicU32, seen: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: FUTEX_WAIT on a 4-byte aligned word of shared memory with a valid timeout; it
    // returns at once if the word is no longer `seen`.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAIT, seen, &ts);
    }
}

/// What lends a member's idle cache: `(uuid, bytes)` gives back up to `bytes` on that GPU and
/// returns what it gave.
pub type Lender = Box<dyn Fn(&[u8; 16], u64) -> u64 + Send>;
