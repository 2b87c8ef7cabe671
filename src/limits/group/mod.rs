//! Group budgets (`CUDAPOOL_GROUP`): processes of one user on one machine that name the same
//! group share one hard limit per GPU. A mechanism below the state: it keeps the ledger and
//! answers whether bytes fit; the state decides when to ask.
//!
//! **The ledger** ([`ledger`]) is one file per group in the user's runtime directory
//! (`rundir`), mapped shared by every member; how it is opened, checked, rebuilt and read from
//! outside is said there. A process that asked for a group and cannot join it refuses
//! allocations with one line (it asked for a limit it cannot have).
//!
//! **Devices** are slots matched by UUID, so members with different `CUDA_VISIBLE_DEVICES`
//! share the right GPU. The first member to use a GPU fixes its limit.
//!
//! **Exact under races.** A reservation is taken before the driver is asked and given back
//! after the driver frees, under the ledger's mutex (process-shared and robust): the members'
//! driver memory never passes the limit at any instant. A member that dies holding the mutex
//! hands it to the next, which recomputes every total from the members' own figures. Every wait
//! for the mutex is bounded ([`LOCK_WAIT`]): a lock word that names no live process (garbage, or
//! a holder gone without the kernel's robust list) is reset in place when no other member lives;
//! while others do, the member waits at most [`LOCK_GIVE_UP`], then refuses with one line.
//!
//! **Crash-proof.** A member holds an open-file-description lock on its byte of the ledger for
//! its whole life. The kernel drops it when the process dies, however it dies, and whatever PID
//! namespace it ran in (the containers of a Kubernetes pod share `/dev/shm` but not their pids:
//! a pid check would take a live member for dead and give its share away). A member that finds
//! another's byte unlocked returns its share to the group; this happens before anyone is
//! refused, and a joiner takes a free byte first, so whoever holds the mutex lives. (A child
//! forked without `exec` keeps the description and so its parent's lock: the parent's share then
//! comes back when both are gone, which errs on the safe side.)
//!
//! **Crowds.** A joiner looks for a free member byte starting from a place of its own (its pid),
//! so a thousand processes joining at once do not all probe the same slots.
//!
//! **Idle cache is lent.** A member short of room asks the others: it writes what it wants on
//! each one's slot and wakes it (a futex on the slot's request counter, shared between
//! processes). Each member has a small thread, started when it joins, that sleeps on that futex,
//! gives back cached memory that is ready now (through the lender the state installs; nothing
//! waits for the program's work), and acknowledges. The asker waits until there is room, every
//! member asked has answered, or [`LEND_WAIT`] has passed.
//!
//! Uses: `budget` (its `Shared`), `rundir`, `flags`, `config`, `log`.

pub mod ledger;

use crate::base::config::LogLevel::{Debug, Warn};
use crate::limits::budget::Shared;
use crate::log_at;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use ledger::{ledgers, ledgers_in, LedgerView, DEVICES, MEMBERS};
use ledger::{DeviceSlot, Ledger, Mapping, Opened};

/// How long a member short of room waits for the others to lend their idle cache.
pub const LEND_WAIT: Duration = Duration::from_millis(200);
/// One wait for the ledger's mutex; after it, the member looks at who could be holding it.
pub const LOCK_WAIT: Duration = Duration::from_secs(1);
/// The longest a member waits for the mutex while other members live.
pub const LOCK_GIVE_UP: Duration = Duration::from_secs(10);

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// This process's membership of a group.
pub struct Group {
    name: String,
    map: Mapping,
    /// This member's slot (its byte is locked for the Group's life).
    me: usize,
    /// The group's limit differed from this process's: said once.
    warned: AtomicBool,
    /// The mutex could not be had within [`LOCK_GIVE_UP`]: said once; every later use fails
    /// at once rather than waiting again.
    stuck: AtomicBool,
}

// SAFETY: the ledger is shared memory; its plain fields are touched only under its
// process-shared mutex, the rest through atomics. The mapping lives as long as the Group.
unsafe impl Send for Group {}
// SAFETY: as above.
unsafe impl Sync for Group {}

impl std::fmt::Debug for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Group({}, member {})", self.name, self.me)
    }
}

/// The ledger under its mutex.
struct Locked<'a>(&'a Group);

impl<'a> Locked<'a> {
    /// The mutex is ours: readers from outside see the ledger being written until we let go.
    fn new(g: &'a Group) -> Locked<'a> {
        // SAFETY: mapped for the Group's life; `seq` is an atomic.
        let seq = unsafe { &(*g.map.ledger).seq };
        if seq.load(Ordering::Relaxed) % 2 == 1 {
            seq.fetch_add(1, Ordering::AcqRel); // left odd by a holder that died
        }
        seq.fetch_add(1, Ordering::AcqRel);
        Locked(g)
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        // SAFETY: the mutex this guard locked; `seq` is an atomic in the same mapping.
        unsafe {
            (*self.0.map.ledger).seq.fetch_add(1, Ordering::Release);
            libc::pthread_mutex_unlock(&mut (*self.0.map.ledger).mutex)
        };
    }
}

impl std::ops::Deref for Locked<'_> {
    type Target = Ledger;
    fn deref(&self) -> &Ledger {
        // SAFETY: mapped for the Group's life; under the mutex.
        unsafe { &*self.0.map.ledger }
    }
}

impl std::ops::DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut Ledger {
        // SAFETY: as above; the mutex makes this the only writer of the plain fields.
        unsafe { &mut *self.0.map.ledger }
    }
}

fn fd_of(map: &Mapping) -> libc::c_int {
    use std::os::fd::AsRawFd;
    map.fd.as_raw_fd()
}

impl Group {
    /// Joins group `name` (its ledger made if absent) in this user's runtime directory
    /// (`configured`: `CUDAPOOL_RUNTIME_DIR`): takes a member byte, then the slot under it.
    pub fn join(name: &str, configured: Option<&std::path::Path>) -> Result<Arc<Group>, String> {
        let (dir, said) = crate::base::rundir::mine(configured)?;
        if let Some(line) = said {
            log_at!(Warn, "{line}");
        }
        let (map, door, opened) = ledger::open_for_join(&dir, name)?;
        if let Opened::Rebuilt(why) = opened {
            log_at!(
                Warn,
                "group {name}: its ledger {} was not a valid ledger ({why}) and no member was alive: rebuilt",
                dir.file(&ledger::file_name(name)).display()
            );
        }
        let fd = fd_of(&map);
        // A free byte, looked for from a place of our own.
        let start = std::process::id() as usize % MEMBERS;
        let me = (0..MEMBERS)
            .map(|k| (start + k) % MEMBERS)
            .find(|&i| ledger::try_lock(fd, ledger::member_byte(i), 1))
            .ok_or(format!("group {name} has {MEMBERS} members already"))?;
        let alone = !ledger::others_live(fd);
        let group = Group {
            name: name.to_string(),
            map,
            me,
            warned: AtomicBool::new(false),
            stuck: AtomicBool::new(false),
        };
        {
            let mut l = group.lock()?;
            if alone {
                // Nobody else lives: whatever the slots say is the dead's.
                for i in 0..MEMBERS {
                    l.members[i].live = 0;
                    l.members[i].reserved = [0; DEVICES];
                }
                for d in 0..DEVICES {
                    l.devices[d].total = 0;
                }
            } else {
                // The slot's last holder is dead (we hold its byte): its share comes back.
                group.give_back(&mut l, me);
            }
            let m = &mut l.members[me];
            m.live = 1;
            m.pid = std::process::id() as u64;
            m.joined_ns = now_ns();
            m.reserved = [0; DEVICES];
            // Nothing asked of the slot's last holder is pending for us.
            for w in &m.want {
                w.store(0, Ordering::Relaxed);
            }
            m.served
                .store(m.request.load(Ordering::Acquire), Ordering::Release);
        }
        drop(door);
        log_at!(Debug, "joined group {name} as member {me}");
        Ok(Arc::new(group))
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The ledger under its mutex, waited for at most [`LOCK_GIVE_UP`]; a member that died
    /// holding it leaves totals to recompute; a lock word no live process can hold is reset.
    fn lock(&self) -> Result<Locked<'_>, String> {
        if self.stuck.load(Ordering::Relaxed) {
            return Err(format!("group {}: its ledger's lock is stuck", self.name));
        }
        let deadline = Instant::now() + LOCK_GIVE_UP;
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
                    if Instant::now() > deadline {
                        self.stuck.store(true, Ordering::Relaxed);
                        let why = format!(
                            "group {}: its ledger's lock has been held for more than {} s while other members live ({}); refusing what needs it",
                            self.name,
                            LOCK_GIVE_UP.as_secs(),
                            std::io::Error::from_raw_os_error(e)
                        );
                        log_at!(Warn, "{why}");
                        return Err(why);
                    }
                }
            }
        }
    }

    /// Whether member `i` is alive: its byte is locked by someone (never asked of ourselves).
    fn alive(&self, i: usize) -> bool {
        ledger::held(fd_of(&self.map), ledger::member_byte(i), 1)
    }

    /// Returns member `i`'s share to the group and frees its slot (under the mutex).
    fn give_back(&self, l: &mut Locked, i: usize) {
        if l.members[i].live == 0 {
            return;
        }
        let mut gone = 0u64;
        for d in 0..DEVICES {
            let r = std::mem::take(&mut l.members[i].reserved[d]);
            gone = gone.saturating_add(r);
            l.devices[d].total = l.devices[d].total.saturating_sub(r);
        }
        l.members[i].live = 0;
        log_at!(
            Debug,
            "group {}: member {i} (pid {}) is gone; {gone} bytes back to the group",
            self.name,
            l.members[i].pid
        );
    }

    /// Returns the share of every dead member to the group (under the mutex).
    fn reap(&self, l: &mut Locked) {
        for i in 0..MEMBERS {
            if i != self.me && l.members[i].live != 0 && !self.alive(i) {
                self.give_back(l, i);
            }
        }
    }

    /// The slot of the GPU `uuid`, claimed with `limit` (this process's; 0: none) if no member
    /// used it before. Warns once when the group's limit is not the one this process names.
    pub fn device(
        self: &Arc<Self>,
        uuid: [u8; 16],
        limit: Option<u64>,
    ) -> Result<GroupDevice, String> {
        let mut l = self.lock()?;
        let slot = match (0..DEVICES).find(|&d| l.devices[d].used != 0 && l.devices[d].uuid == uuid)
        {
            Some(d) => d,
            None => {
                let d = (0..DEVICES)
                    .find(|&d| l.devices[d].used == 0)
                    .ok_or(format!("group {}: {DEVICES} GPUs already", self.name))?;
                l.devices[d] = DeviceSlot {
                    uuid,
                    used: 1,
                    limit: limit.unwrap_or(0),
                    total: 0,
                };
                d
            }
        };
        let group_limit = l.devices[slot].limit;
        drop(l);
        if let Some(mine) = limit.filter(|&m| m != group_limit) {
            if !self.warned.swap(true, Ordering::Relaxed) {
                log_at!(
                    Warn,
                    "group {}: CUDAPOOL_GROUP_LIMIT gives {mine} bytes for this GPU, but the group's first member fixed {}; following the group",
                    self.name,
                    if group_limit == 0 { "no limit".to_string() } else { format!("{group_limit} bytes") }
                );
            }
        }
        Ok(GroupDevice {
            group: self.clone(),
            slot,
        })
    }

    /// Asks the other members to give back idle cache on device `slot` until `bytes` fit, and
    /// waits for it (at most `wait`; less once every member asked has answered). Whether they
    /// fit now (the caller charges them again).
    pub fn borrow(&self, slot: usize, bytes: u64, wait: Duration) -> bool {
        let fits = |l: &Locked| {
            let d = &l.devices[slot];
            d.limit == 0 || d.total.saturating_add(bytes) <= d.limit
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

    /// The group's figures on device `slot` for a reader (stats, the C API): (live members that
    /// use the GPU, reserved total, limit), the dead reaped first. A member that holds nothing
    /// on the GPU (torchrun's agent, which joins at its first CUDA call) is not counted.
    fn figures(&self, slot: usize) -> (u64, u64, u64) {
        match self.lock() {
            Ok(mut l) => {
                self.reap(&mut l);
                let members = (0..MEMBERS)
                    .filter(|&i| l.members[i].live != 0 && l.members[i].reserved[slot] > 0)
                    .count();
                (members as u64, l.devices[slot].total, l.devices[slot].limit)
            }
            Err(_) => (0, 0, 0),
        }
    }

    /// (reserved total, limit) on device `slot`, as the ledger says now (for the allocation
    /// path: no reaping).
    fn totals(&self, slot: usize) -> (u64, u64) {
        match self.lock() {
            Ok(l) => (l.devices[slot].total, l.devices[slot].limit),
            Err(_) => (u64::MAX, 1),
        }
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

/// One GPU of a group, as this member's budget draws on it.
#[derive(Clone)]
pub struct GroupDevice {
    group: Arc<Group>,
    slot: usize,
}

impl std::fmt::Debug for GroupDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GroupDevice({:?}, slot {})", self.group, self.slot)
    }
}

/// What a member reads of its group on one GPU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GroupFigures {
    pub members: u64,
    pub reserved: u64,
    pub limit: u64,
}

impl GroupDevice {
    pub fn figures(&self) -> GroupFigures {
        let (members, reserved, limit) = self.group.figures(self.slot);
        GroupFigures {
            members,
            reserved,
            limit,
        }
    }

    pub fn group_name(&self) -> &str {
        self.group.name()
    }
}

impl Shared for GroupDevice {
    fn try_reserve(&self, bytes: u64) -> bool {
        let g = &*self.group;
        let Ok(mut l) = g.lock() else { return false };
        let fits = |l: &Locked| {
            let d = &l.devices[self.slot];
            d.total
                .checked_add(bytes)
                .is_some_and(|t| d.limit == 0 || t <= d.limit)
        };
        if !fits(&l) {
            // Before refusing anyone: the share of members that died comes back.
            g.reap(&mut l);
            if !fits(&l) {
                return false;
            }
        }
        let total = &mut l.devices[self.slot].total;
        *total = total.saturating_add(bytes);
        let mine = &mut l.members[g.me].reserved[self.slot];
        *mine = mine.saturating_add(bytes);
        true
    }

    fn force_reserve(&self, bytes: u64) {
        let g = &*self.group;
        if let Ok(mut l) = g.lock() {
            let total = &mut l.devices[self.slot].total;
            *total = total.saturating_add(bytes);
            let mine = &mut l.members[g.me].reserved[self.slot];
            *mine = mine.saturating_add(bytes);
        }
    }

    fn release(&self, bytes: u64) {
        let g = &*self.group;
        if let Ok(mut l) = g.lock() {
            let mine = &mut l.members[g.me].reserved[self.slot];
            let b = bytes.min(*mine);
            *mine -= b;
            let total = &mut l.devices[self.slot].total;
            *total = total.saturating_sub(b);
        }
    }

    fn room(&self) -> u64 {
        let (reserved, limit) = self.group.totals(self.slot);
        match limit {
            0 => u64::MAX,
            limit => limit.saturating_sub(reserved),
        }
    }

    fn limit(&self) -> u64 {
        self.group.totals(self.slot).1
    }

    fn borrow(&self, bytes: u64) -> bool {
        self.group.borrow(self.slot, bytes, LEND_WAIT)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A member asked to lend before its lending thread first ran (a busy machine starts a
    /// thread late) still answers: before, that thread began from the request count it found,
    /// missed the one already made, and the asker was refused after its wait (seen as a flaky
    /// `a_sleeping_members_idle_cache_is_lent_to_another` under load).
    #[test]
    fn a_request_made_before_the_lending_thread_runs_is_served() {
        let dir = std::env::temp_dir().join(format!("cudapool-group-late-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let a = Group::join("late", Some(&dir)).expect("a joins");
        let b = Group::join("late", Some(&dir)).expect("b joins");
        let uuid = [7; 16];
        let da = a.device(uuid, Some(64 << 20)).expect("a's device");
        let db = b.device(uuid, Some(64 << 20)).expect("b's device");
        assert!(da.try_reserve(48 << 20), "a caches 48 MiB");
        let asker =
            std::thread::spawn(move || db.group.borrow(db.slot, 32 << 20, Duration::from_secs(3)));
        // The request is made (and its wake lost) before a's thread exists.
        let pending = || {
            let l = a.lock().expect("the ledger");
            let m = &l.members[a.me];
            m.request.load(Ordering::Acquire) != m.served.load(Ordering::Acquire)
        };
        let asked = Instant::now();
        while !pending() {
            assert!(asked.elapsed() < Duration::from_secs(3), "b never asked");
            std::thread::sleep(Duration::from_millis(1));
        }
        let lender = da.clone();
        a.serve(Box::new(move |_, bytes| {
            lender.release(bytes);
            bytes
        }));
        assert!(asker.join().unwrap(), "a's idle cache was lent to b");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
