//! Lending between a group's members: a member short of room asks the others to give back idle
//! cache ([`Group::borrow`]), or asks the members idle longest to sleep ([`Group::sleep_idle`]),
//! and each member's thread answers ([`Group::serve`]), woken through a futex word in its ledger
//! slot. The same thread publishes when its process was last active, at least once a second.

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
        let asked: Vec<(usize, u32)> = {
            let l = match self.short_of(slot, bytes) {
                Ok(l) => l,
                Err(fit) => return fit,
            };
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
            let l = match self.short_of(slot, bytes) {
                Ok(l) => l,
                Err(fit) => return fit,
            };
            let answered = asked.iter().all(|&(i, seq)| {
                let m = &l.members[i];
                m.live == 0 || m.served.load(Ordering::Acquire).wrapping_sub(seq) < u32::MAX / 2
            });
            if answered || Instant::now() > deadline {
                return false;
            }
        }
    }

    /// Asks the members that have been idle for `idle`, longest idle first, one at a time, to
    /// put themselves to sleep on device `slot` until `bytes` fit (each may refuse: busy, or at
    /// its request), waiting for each at most `wait`. Whether they fit now.
    pub fn sleep_idle(&self, slot: usize, bytes: u64, idle: Duration, wait: Duration) -> bool {
        let since = super::now_ns().saturating_sub(idle.as_nanos() as u64);
        let mut idle_ones: Vec<(u64, usize)> = {
            let l = match self.short_of(slot, bytes) {
                Ok(l) => l,
                Err(fit) => return fit,
            };
            (0..MEMBERS)
                .filter(|&i| i != self.me && l.members[i].live != 0)
                .filter(|&i| l.members[i].reserved[slot] > 0)
                .map(|i| (l.members[i].active_ns.load(Ordering::Acquire), i))
                .filter(|&(at, _)| at != 0 && at <= since)
                .collect()
        };
        idle_ones.sort_unstable();
        for (_, i) in idle_ones {
            let seq = {
                let l = match self.short_of(slot, bytes) {
                    Ok(l) => l,
                    Err(fit) => return fit,
                };
                let m = &l.members[i];
                if m.live == 0 {
                    continue;
                }
                m.want[slot].fetch_max(bytes, Ordering::AcqRel);
                m.sleep_idle_ms
                    .store((idle.as_millis() as u64).max(1), Ordering::Release);
                let seq = m.request.fetch_add(1, Ordering::AcqRel).wrapping_add(1);
                futex_wake(&m.request);
                seq
            };
            let deadline = Instant::now() + wait;
            loop {
                std::thread::sleep(Duration::from_millis(2));
                let l = match self.short_of(slot, bytes) {
                    Ok(l) => l,
                    Err(fit) => return fit,
                };
                let m = &l.members[i];
                if m.live == 0
                    || m.served.load(Ordering::Acquire).wrapping_sub(seq) < u32::MAX / 2
                    || Instant::now() > deadline
                {
                    break;
                }
            }
        }
        self.short_of(slot, bytes).err().unwrap_or(false)
    }

    /// The ledger, locked with the dead members reaped, while `bytes` more still do not fit
    /// on device `slot`; else `Err(whether they fit)` (`false`: the ledger could not be locked).
    fn short_of(&self, slot: usize, bytes: u64) -> Result<Locked<'_>, bool> {
        let mut l = self.lock().map_err(|_| false)?;
        self.reap(&mut l);
        let limit = self.limit_of(&l, slot);
        if limit.admits(l.devices[slot].total.saturating_add(bytes)) {
            return Err(true);
        }
        Ok(l)
    }

    /// Starts the thread that answers the other members' requests through `lend` (see
    /// [`Lender`]) and publishes when this process was last active.
    pub fn serve(self: &Arc<Self>, lend: Box<dyn Lender>) {
        let group = self.clone();
        let run = move || {
            // SAFETY: the mapping lives as long as `group`, which this thread holds.
            let me = unsafe { &(*group.map.ledger).members[group.me] };
            // Every request since this process joined counts, also one made before this
            // thread first ran (a busy machine can start it late): from the last one served.
            let mut seen = me.served.load(Ordering::Acquire);
            let mut suspend_seen = 0;
            loop {
                me.active_ns.store(lend.last_active_ns(), Ordering::Release);
                futex_wait(&me.request, seen, Duration::from_secs(1));
                if crate::base::flags::exiting() {
                    return;
                }
                // A ledger cut, scribbled or rebuilt meanwhile holds this member again within a
                // second, idle or not (the lock only when it needs mending).
                if group.needs_mending() {
                    drop(group.lock());
                }
                // The group's suspend, once per posting: the process that posted it sleeps
                // through its own signal (`state::suspend`).
                let by = group.suspended_by();
                if by != suspend_seen {
                    suspend_seen = by;
                    if by != 0 && by != std::process::id() {
                        lend.suspend();
                    }
                }
                let now = me.request.load(Ordering::Acquire);
                if now == seen {
                    continue;
                }
                seen = now;
                let sleep_idle = me.sleep_idle_ms.swap(0, Ordering::AcqRel);
                for d in 0..DEVICES {
                    let want = me.want[d].swap(0, Ordering::AcqRel);
                    if want == 0 {
                        continue;
                    }
                    let uuid = match group.lock() {
                        Ok(l) => l.devices[d].uuid,
                        Err(_) => continue,
                    };
                    let mut gave = lend.lend(&uuid, want);
                    if gave < want && sleep_idle > 0 {
                        gave += lend.sleep_if_idle(&uuid, Duration::from_millis(sleep_idle));
                    }
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

pub(super) fn futex_wake(word: &AtomicU32) {
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

/// What a member's thread asks of its process (the state installs it).
pub trait Lender: Send {
    /// Gives back up to `bytes` of idle cache on GPU `uuid`; returns what it gave.
    fn lend(&self, uuid: &[u8; 16], bytes: u64) -> u64;
    /// Puts the process to sleep on GPU `uuid` if it has been idle for `idle` and holds more
    /// than its request there; returns the bytes it gave back.
    fn sleep_if_idle(&self, uuid: &[u8; 16], idle: Duration) -> u64 {
        let _ = (uuid, idle);
        0
    }
    /// When the process last did device work or allocated (ns since the epoch; 0: unknown).
    fn last_active_ns(&self) -> u64 {
        0
    }
    /// The group was suspended (another of its processes was stopped): puts the process to
    /// sleep, if it sleeps with its group's suspends.
    fn suspend(&self) {}
}

/// A plain function lends: nothing sleeps, idleness unknown.
impl<F: Fn(&[u8; 16], u64) -> u64 + Send> Lender for F {
    fn lend(&self, uuid: &[u8; 16], bytes: u64) -> u64 {
        self(uuid, bytes)
    }
}
