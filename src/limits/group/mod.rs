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
//! while others do, the member waits for as long as the mutex keeps changing hands, and refuses
//! with one line once one holder has kept it for [`LOCK_GIVE_UP`].
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

mod exit;
mod lending;
mod lock;
mod mend;
mod suspend;
mod witness;
pub use lending::Lender;
pub use suspend::relay as relay_suspend;
pub use witness::Witness;
pub mod ledger;

use crate::base::config::LogLevel::{Debug, Warn};
use crate::base::limit::Limit;
use crate::limits::budget::Shared;
use crate::log_at;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use ledger::{ledgers, ledgers_in, LedgerView, Suspends, DEVICES, MEMBERS};
use ledger::{DeviceSlot, Ledger, Mapping, Opened};

/// How long a member short of room waits for the others to lend their idle cache.
pub const LEND_WAIT: Duration = Duration::from_millis(200);
/// How long a member short of room waits for one idle member to fall asleep (its device work
/// drains, its memory is copied to the host: about a second for 20 GiB).
pub const SLEEP_WAIT: Duration = Duration::from_secs(60);
/// One wait for the ledger's mutex; after it, the member looks at who could be holding it.
pub const LOCK_WAIT: Duration = Duration::from_secs(1);
/// The longest a member waits for the mutex while other members live and nobody passes it
/// (its `seq` stands still); a mutex that keeps changing hands is waited for on.
pub const LOCK_GIVE_UP: Duration = Duration::from_secs(10);
/// The longest a member waits for the mutex while nobody passes it and its holder goes on
/// (runs or sleeps: starved of CPU on a loaded machine, not stopped).
pub const LOCK_GIVE_UP_RUNNING: Duration = Duration::from_secs(120);

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// This process's membership of a group.
pub struct Group {
    name: String,
    map: Mapping,
    /// The user's runtime folder holding the ledger, for its last member to remove it at exit
    /// ([`leave`](Self::leave)); `None` for a job's ledger in its folder of root (its Epilog
    /// removes it).
    dir: Option<crate::base::rundir::RunDir>,
    /// This member's slot (its byte is locked for the Group's life).
    me: usize,
    /// The group's limit differed from this process's: said once.
    warned: AtomicBool,
    /// The mutex could not be had within [`LOCK_GIVE_UP`]: said once; every later use fails
    /// at once rather than waiting again.
    stuck: AtomicBool,
    /// This member's own figures, kept in its memory too, so that it can record them again in
    /// a ledger that was cut or scribbled: its reserved bytes per device slot, and the GPU
    /// slots it claimed (uuid, the limit it claimed them with).
    mine: [AtomicU64; DEVICES],
    claimed: std::sync::Mutex<Vec<(usize, [u8; 16], u64)>>,
    /// Per device slot, the limit this member enforces whatever the ledger says (the
    /// mandatory mode: the job's share, `NOT_FIXED` otherwise; `u64::MAX`: none).
    fixed: [AtomicU64; DEVICES],
    /// Whether this member ever held memory on each GPU slot (counted once in its `users`).
    ever_used: [AtomicBool; DEVICES],
    /// The ledger's generation this member's share is recorded in.
    generation: std::sync::atomic::AtomicU32,
}

const NOT_FIXED: u64 = 0;

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
    /// `job_dir`: the job's folder of root that holds the ledger instead (the mandatory mode).
    pub fn join(
        name: &str,
        configured: Option<&std::path::Path>,
        job_dir: Option<&std::path::Path>,
    ) -> Result<Arc<Group>, String> {
        let dir = match job_dir {
            // SAFETY: getuid has no preconditions.
            Some(p) => crate::base::rundir::of_job(p, unsafe { libc::getuid() })?,
            None => {
                let (dir, said) = crate::base::rundir_find::mine(configured)?;
                if let Some(line) = said {
                    log_at!(Warn, "{line}");
                }
                dir
            }
        };
        let (map, door, opened) = ledger::open_for_join(&dir, name)?;
        if let Opened::Rebuilt(why) = &opened {
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
            dir: job_dir.is_none().then_some(dir),
            me,
            warned: AtomicBool::new(false),
            stuck: AtomicBool::new(false),
            mine: [const { AtomicU64::new(0) }; DEVICES],
            claimed: std::sync::Mutex::new(Vec::new()),
            fixed: [const { AtomicU64::new(NOT_FIXED) }; DEVICES],
            ever_used: [const { AtomicBool::new(false) }; DEVICES],
            generation: std::sync::atomic::AtomicU32::new(0),
        };
        {
            let mut l = group.lock_at(true)?;
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
        if matches!(opened, Opened::CutUnderMembers) {
            group.wait_for_members();
        }
        log_at!(Debug, "joined group {name} as member {me}");
        Ok(Arc::new(group))
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The ledger under its mutex, waited for at most [`LOCK_GIVE_UP`]; a member that died
    /// holding it leaves totals to recompute; a lock word no live process can hold is reset.
    fn lock(&self) -> Result<Locked<'_>, String> {
        self.lock_at(false)
    }

    /// [`lock`](Self::lock), by a joiner holding the ledger's door when `at_door`.
    fn lock_at(&self, at_door: bool) -> Result<Locked<'_>, String> {
        if self.stuck.load(Ordering::Relaxed) {
            return Err(format!("group {}: its ledger's lock is stuck", self.name));
        }
        match mend::restore(&self.map) {
            Ok(false) => {}
            Ok(true) => log_at!(
                Warn,
                "group {}: its ledger was cut or scribbled under its members: sized, mapped and rebuilt again; this member records its share again",
                self.name
            ),
            Err(e) => return Err(format!("group {}: its ledger was cut: {e}", self.name)),
        }
        let mut l = self.lock_mutex(at_door)?;
        self.record_again(&mut l);
        self.generation
            .store(mend::generation(&self.map), Ordering::Relaxed);
        Ok(l)
    }

    /// Whether the ledger was cut, scribbled or rebuilt since this member last recorded its
    /// share (then its next [`lock`](Self::lock) mends it). Takes no lock: the lending thread
    /// asks every second, and a thousand members locking every second would keep readers out.
    pub(super) fn needs_mending(&self) -> bool {
        mend::damaged(&self.map)
            || mend::generation(&self.map) != self.generation.load(Ordering::Relaxed)
    }

    /// Makes the ledger hold this member again after a rebuild wiped it: its slot, its share
    /// on each GPU and the GPU slots it claimed (under the mutex).
    fn record_again(&self, l: &mut Locked) {
        let me = self.me;
        if l.members[me].live == 1 && l.members[me].pid == std::process::id() as u64 {
            return;
        }
        let claimed = self
            .claimed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        for (slot, uuid, limit) in claimed {
            let d = &mut l.devices[slot];
            if d.used == 0 {
                *d = DeviceSlot {
                    uuid,
                    used: 1,
                    limit,
                    total: 0,
                    peak: 0,
                    refused: 0,
                    users: 0,
                };
            }
        }
        let m = &mut l.members[me];
        m.live = 1;
        m.pid = std::process::id() as u64;
        m.joined_ns = now_ns();
        for (r, mine) in m.reserved.iter_mut().zip(&self.mine) {
            *r = mine.load(Ordering::Relaxed);
        }
        let reserved = m.reserved;
        for (d, r) in l.devices.iter_mut().zip(reserved) {
            d.total = d.total.saturating_add(r);
        }
    }

    /// After a joiner made a cut ledger whole: waits (at most 3 s: each member's lending thread
    /// looks every second) until every other live member has recorded its share again, so
    /// that nothing is handed out twice.
    fn wait_for_members(&self) {
        let fd = fd_of(&self.map);
        let until = Instant::now() + Duration::from_secs(3);
        loop {
            let holding = ledger::others_holding(fd);
            let recorded = match self.lock() {
                Ok(l) => (0..MEMBERS)
                    .filter(|&i| i != self.me && l.members[i].live == 1)
                    .count(),
                Err(_) => return,
            };
            if recorded >= holding {
                return;
            }
            if Instant::now() > until {
                log_at!(
                    Warn,
                    "group {}: {} of its {holding} other members have not recorded their shares again in its cut ledger",
                    self.name,
                    holding - recorded
                );
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The limit this member enforces on device `slot`: its own fixed one, else the ledger's.
    fn limit_of(&self, l: &Locked, slot: usize) -> Limit {
        match self.fixed[slot].load(Ordering::Relaxed) {
            NOT_FIXED => Limit::from_raw(l.devices[slot].limit),
            u64::MAX => Limit::NONE,
            f => Limit::from_raw(f),
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
    /// `fixed`: this process enforces `limit` itself whatever the ledger records (the mandatory
    /// mode), and writes it there for readers.
    pub fn device(
        self: &Arc<Self>,
        uuid: [u8; 16],
        limit: Option<u64>,
        fixed: bool,
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
                    peak: 0,
                    refused: 0,
                    users: 0,
                };
                d
            }
        };
        if fixed {
            let f = limit.filter(|&b| b != 0).unwrap_or(u64::MAX);
            self.fixed[slot].store(f, Ordering::Relaxed);
            l.devices[slot].limit = limit.unwrap_or(0);
        }
        let group_limit = l.devices[slot].limit;
        self.claimed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((slot, uuid, group_limit));
        drop(l);
        if let Some(mine) = limit.filter(|&m| m != group_limit && !fixed) {
            if !self.warned.swap(true, Ordering::Relaxed) {
                log_at!(
                    Warn,
                    "group {}: CUDAPOOL_GROUP_LIMIT gives {mine} bytes for this GPU, but the group's first member fixed {}; following the group",
                    self.name,
                    Limit::from_raw(group_limit).bytes().map_or("no limit".to_string(), |b| format!("{b} bytes"))
                );
            }
        }
        Ok(GroupDevice {
            group: self.clone(),
            slot,
            uuid,
            witness: None,
        })
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
                (
                    members as u64,
                    l.devices[slot].total,
                    self.limit_of(&l, slot).raw(),
                )
            }
            Err(_) => (0, 0, 0),
        }
    }

    /// (reserved total, limit) on device `slot`, as the ledger says now (for the allocation
    /// path: no reaping).
    fn totals(&self, slot: usize) -> (u64, Limit) {
        match self.lock() {
            Ok(l) => (l.devices[slot].total, self.limit_of(&l, slot)),
            // Nothing fits a group whose ledger cannot be read.
            Err(_) => (u64::MAX, Limit::from_raw(1)),
        }
    }
}

/// One GPU of a group, as this member's budget draws on it.
#[derive(Clone)]
pub struct GroupDevice {
    group: Arc<Group>,
    slot: usize,
    /// The GPU's UUID, for the witness.
    uuid: [u8; 16],
    /// The mandatory mode: what the driver says the job holds, checked at each growth
    /// ([`witnessed_by`](Self::witnessed_by)).
    witness: Option<Arc<dyn Witness>>,
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
    /// Adds `bytes` to this member's share and the GPU's total (under the mutex), keeping the
    /// GPU's record: its peak, and its users the first time this member holds memory on it.
    fn add(&self, l: &mut Locked, bytes: u64) {
        let g = &*self.group;
        let mine = &mut l.members[g.me].reserved[self.slot];
        let first = *mine == 0 && !g.ever_used[self.slot].swap(true, Ordering::Relaxed);
        *mine = mine.saturating_add(bytes);
        g.mine[self.slot].store(*mine, Ordering::Relaxed);
        let d = &mut l.devices[self.slot];
        d.total = d.total.saturating_add(bytes);
        d.peak = d.peak.max(d.total);
        if first {
            d.users = d.users.saturating_add(1);
        }
    }

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
        // The driver's figure first, outside the lock (an NVML query takes a while).
        let witnessed = self.witnessed();
        let Ok(mut l) = g.lock() else { return false };
        let fits = |l: &Locked| {
            let limit = g.limit_of(l, self.slot);
            l.devices[self.slot]
                .total
                .checked_add(bytes)
                .is_some_and(|t| limit.admits(t))
        };
        if !fits(&l) {
            // Before refusing anyone: the share of members that died comes back.
            g.reap(&mut l);
            if !fits(&l) {
                let d = &mut l.devices[self.slot];
                d.refused = d.refused.saturating_add(1);
                return false;
            }
        }
        if !self.witness_admits(&mut l, witnessed, bytes) {
            return false;
        }
        self.add(&mut l, bytes);
        true
    }

    fn force_reserve(&self, bytes: u64) {
        if let Ok(mut l) = self.group.lock() {
            self.add(&mut l, bytes);
        }
    }

    fn release(&self, bytes: u64) {
        let g = &*self.group;
        if let Ok(mut l) = g.lock() {
            let mine = &mut l.members[g.me].reserved[self.slot];
            let b = bytes.min(*mine);
            *mine -= b;
            g.mine[self.slot].store(*mine, Ordering::Relaxed);
            let total = &mut l.devices[self.slot].total;
            *total = total.saturating_sub(b);
        }
    }

    fn room(&self) -> u64 {
        let (reserved, limit) = self.group.totals(self.slot);
        limit.room(reserved)
    }

    fn limit(&self) -> Limit {
        self.group.totals(self.slot).1
    }

    fn borrow(&self, bytes: u64) -> bool {
        self.group.borrow(self.slot, bytes, LEND_WAIT)
    }

    fn sleep_idle(&self, bytes: u64, idle: Duration) -> bool {
        self.group.sleep_idle(self.slot, bytes, idle, SLEEP_WAIT)
    }
}

#[cfg(test)]
mod tests;
