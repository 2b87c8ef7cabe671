//! Group budgets (`CUDAPOOL_GROUP`): processes of one user on one machine that name the same
//! group share one hard limit per GPU. A mechanism below the state: it keeps the ledger and
//! answers whether bytes fit; the state decides when to ask.
//!
//! **The ledger** is one file per group and user, `/dev/shm/cudapool-group-<uid>-<name>`,
//! mapped shared by every member. The first member creates it new (`O_EXCL|O_NOFOLLOW`, mode
//! 0600), initialises it and writes its magic last; the others open it only if it is a regular
//! file of this user, exactly one ledger long, of this version (checked on the descriptor, never
//! through a link, never blocking on a FIFO). Anything else at that path is refused with a line
//! saying what it is, and the process refuses allocations (it asked for a limit it cannot
//! have); it is never trusted, never written through.
//!
//! **Devices** are slots matched by UUID, so members with different `CUDA_VISIBLE_DEVICES`
//! share the right GPU. The first member to use a GPU fixes its limit.
//!
//! **Exact under races.** A reservation is taken before the driver is asked and given back
//! after the driver frees, under the ledger's mutex (process-shared and robust): the members'
//! driver memory never passes the limit at any instant. A member that dies holding the mutex
//! hands it to the next, which recomputes every total from the members' own figures.
//!
//! **Crash-proof.** A member holds an open-file-description lock (`F_OFD_SETLK`) on one byte of
//! the ledger for its whole life. The kernel drops it when the process dies, however it dies,
//! and whatever PID namespace it ran in (the containers of a Kubernetes pod share `/dev/shm`
//! but not their pids: a pid check would take a live member for dead and give its share
//! away). A member that finds another's byte unlocked (`F_OFD_GETLK`) returns its share to the
//! group; this happens before anyone is refused. (A child forked without `exec` keeps the
//! description and so its parent's lock: the parent's share then comes back when both are
//! gone, which errs on the safe side.)
//!
//! **Idle cache is lent.** A member short of room asks the others: it writes what it wants on
//! each one's slot and wakes it (a futex on the slot's request counter, shared between
//! processes). Each member has a small thread, started when it joins, that sleeps on that futex,
//! gives back cached memory that is ready now (through the lender the state installs; nothing
//! waits for the program's work), and acknowledges. The asker waits until there is room, every
//! member asked has answered, or [`LEND_WAIT`] has passed.
//!
//! Uses: `budget` (its `Shared`), `flags`, `config`, `log`.

use crate::budget::Shared;
use crate::config::LogLevel::{Debug, Warn};
use crate::log_at;
use std::ffi::CString;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// GPUs a group's ledger holds.
pub const DEVICES: usize = 64;
/// Members a group holds at once.
pub const MEMBERS: usize = 64;
/// How long a member short of room waits for the others to lend their idle cache.
pub const LEND_WAIT: Duration = Duration::from_millis(200);
const MAGIC: u64 = u64::from_le_bytes(*b"CPGROUP\0");
const VERSION: u32 = 1;

/// A GPU of the group. Under the mutex.
#[repr(C)]
struct DeviceSlot {
    uuid: [u8; 16],
    used: u64,
    /// 0: no limit.
    limit: u64,
    /// The members' reserved bytes on it, summed.
    total: u64,
}

/// A member. `live`, `pid`, `joined_ns` and `reserved` are under the mutex; the lending words
/// are atomics.
#[repr(C)]
struct MemberSlot {
    live: u64,
    pid: u64,
    joined_ns: u64,
    /// Bytes it holds from the driver on each device slot.
    reserved: [u64; DEVICES],
    /// Bumped by a member that asks this one to lend (a futex word).
    request: AtomicU32,
    /// The last request it served.
    served: AtomicU32,
    /// Bytes asked of it on each device slot.
    want: [AtomicU64; DEVICES],
}

/// The ledger file. Invariant (under the mutex, after a repair): each device slot's `total` is
/// the sum of the live members' `reserved` on it, and no member's byte lock is free while it is
/// `live` for longer than it takes the next member to notice.
#[repr(C)]
struct Ledger {
    magic: AtomicU64,
    version: u32,
    _pad: u32,
    mutex: libc::pthread_mutex_t,
    devices: [DeviceSlot; DEVICES],
    members: [MemberSlot; MEMBERS],
}

const SIZE: usize = std::mem::size_of::<Ledger>();

/// The ledger's path for group `name` of user `uid`.
pub fn path(uid: u32, name: &str) -> String {
    format!("/dev/shm/cudapool-group-{uid}-{name}")
}

fn uid() -> u32 {
    // SAFETY: getuid has no preconditions.
    unsafe { libc::getuid() }
}

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// The offset of member `i`'s liveness byte (past the ledger's end: locks need no data).
fn lock_byte(i: usize) -> i64 {
    (SIZE + i) as i64
}

/// An OFD lock request (or test) on member `i`'s byte.
fn flock_of(i: usize, kind: libc::c_short) -> libc::flock {
    // SAFETY: flock is plain old data; zero is a valid start.
    let mut f: libc::flock = unsafe { std::mem::zeroed() };
    f.l_type = kind;
    f.l_whence = libc::SEEK_SET as libc::c_short;
    f.l_start = lock_byte(i);
    f.l_len = 1;
    f
}

/// A mapped ledger and the descriptor it came through (kept open: it carries the member's
/// liveness lock).
struct Mapping {
    ledger: *mut Ledger,
    fd: libc::c_int,
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: our own mapping of SIZE bytes and descriptor, released once.
        unsafe {
            libc::munmap(self.ledger.cast(), SIZE);
            libc::close(self.fd);
        }
    }
}

/// What the descriptor `fd` (opened at `path`) is, if it is a regular file of user `owner`.
fn regular_file_of(fd: libc::c_int, path: &str, owner: u32) -> Result<libc::stat, String> {
    // SAFETY: a zeroed stat is a valid out-struct; fstat on our descriptor.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a descriptor we hold and a valid out-pointer.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(format!("cannot stat {path}"));
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(format!("{path} is not a regular file"));
    }
    if st.st_uid != owner {
        return Err(format!(
            "{path} belongs to user {}, not to user {owner}",
            st.st_uid
        ));
    }
    Ok(st)
}

/// Opens the file at `cpath` (`path`) read-write, never through a link, never blocking.
fn open_existing(cpath: &CString, path: &str) -> Result<i32, String> {
    // SAFETY: open(2) of a NUL-terminated path, never through a link, never blocking.
    let fd = unsafe {
        libc::open(
            cpath.as_ptr(),
            libc::O_RDWR | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(format!(
            "cannot open {path}: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(fd)
}

/// Opens (creating if absent) the ledger at `path`, checked as the module doc says.
fn open(path: &str, create: bool) -> Result<Mapping, String> {
    let cpath = CString::new(path).map_err(|e| e.to_string())?;
    let mut created = false;
    let mut fd = -1;
    if create {
        // SAFETY: open(2) of a NUL-terminated path: a new file or nothing, never through a link.
        fd = unsafe {
            libc::open(
                cpath.as_ptr(),
                libc::O_CREAT | libc::O_EXCL | libc::O_RDWR | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                0o600,
            )
        };
        created = fd >= 0;
        if fd < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EEXIST) {
            return Err(format!(
                "cannot create {path}: {}",
                std::io::Error::last_os_error()
            ));
        }
    }
    if fd < 0 {
        fd = open_existing(&cpath, path)?;
    }
    let close = |why: String| {
        // SAFETY: the descriptor just opened, closed once on this error path.
        unsafe { libc::close(fd) };
        Err(why)
    };
    let mut st = match regular_file_of(fd, path, uid()) {
        Ok(st) => st,
        Err(why) => return close(why),
    };
    if created {
        // SAFETY: sizing the file we created.
        if unsafe { libc::ftruncate(fd, SIZE as libc::off_t) } != 0 {
            // SAFETY: unlink of the path we created.
            unsafe { libc::unlink(cpath.as_ptr()) };
            return close(format!("cannot size {path}"));
        }
    } else if st.st_size as usize != SIZE {
        // An empty file is a ledger its creator has not sized yet: wait a moment for it.
        let deadline = Instant::now() + Duration::from_secs(2);
        while st.st_size == 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
            // SAFETY: a descriptor we hold and a valid out-pointer.
            if unsafe { libc::fstat(fd, &mut st) } != 0 {
                break;
            }
        }
        if st.st_size as usize != SIZE {
            return close(format!(
                "{path} is {} bytes, not a group ledger of this version ({SIZE} bytes); remove it once no member of the group runs",
                st.st_size
            ));
        }
    }
    // SAFETY: mapping SIZE bytes of a regular file of exactly that size, shared, read-write.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            SIZE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return close(format!("cannot map {path}"));
    }
    let map = Mapping {
        ledger: p.cast(),
        fd,
    };
    if created {
        // SAFETY: a fresh, zero-filled mapping no other process trusts before the magic; the
        // mutex is initialised in place, process-shared and robust.
        unsafe {
            let l = &mut *map.ledger;
            let mut attr: libc::pthread_mutexattr_t = std::mem::zeroed();
            libc::pthread_mutexattr_init(&mut attr);
            libc::pthread_mutexattr_setpshared(&mut attr, libc::PTHREAD_PROCESS_SHARED);
            libc::pthread_mutexattr_setrobust(&mut attr, libc::PTHREAD_MUTEX_ROBUST);
            libc::pthread_mutex_init(&mut l.mutex, &attr);
            libc::pthread_mutexattr_destroy(&mut attr);
            l.version = VERSION;
            l.magic.store(MAGIC, Ordering::Release);
        }
    } else {
        // The creator writes the magic last: wait a moment for it.
        // SAFETY: the mapping is SIZE bytes; the magic and version are read-only here.
        let l = unsafe { &*map.ledger };
        let deadline = Instant::now() + Duration::from_secs(2);
        while l.magic.load(Ordering::Acquire) != MAGIC {
            if Instant::now() > deadline {
                return Err(format!(
                    "{path} is not a group ledger (no magic); remove it once no member of the group runs"
                ));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        if l.version != VERSION {
            return Err(format!(
                "{path} is a ledger of version {}, not {VERSION}",
                l.version
            ));
        }
    }
    Ok(map)
}

/// This process's membership of a group.
pub struct Group {
    name: String,
    map: Mapping,
    /// This member's slot.
    me: usize,
    /// The group's limit differed from this process's: said once.
    warned: AtomicBool,
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

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        // SAFETY: the mutex this guard locked.
        unsafe { libc::pthread_mutex_unlock(&mut (*self.0.map.ledger).mutex) };
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

impl Group {
    /// Joins group `name` (its ledger created if absent): takes a member slot and its lock.
    pub fn join(name: &str) -> Result<Arc<Group>, String> {
        let path = path(uid(), name);
        let map = open(&path, true)?;
        let mut group = Group {
            name: name.to_string(),
            map,
            me: usize::MAX,
            warned: AtomicBool::new(false),
        };
        let me = {
            let mut l = group.lock()?;
            group.reap(&mut l);
            let free = (0..MEMBERS).find(|&i| l.members[i].live == 0);
            let Some(i) = free else {
                return Err(format!("group {name} has {MEMBERS} members already"));
            };
            // SAFETY: an OFD lock on our own descriptor (fcntl with a valid flock).
            let mut f = flock_of(i, libc::F_WRLCK as libc::c_short);
            if unsafe { libc::fcntl(group.map.fd, libc::F_OFD_SETLK, &mut f) } != 0 {
                return Err(format!(
                    "group {name}: cannot lock member slot {i}: {}",
                    std::io::Error::last_os_error()
                ));
            }
            let m = &mut l.members[i];
            m.live = 1;
            m.pid = std::process::id() as u64;
            m.joined_ns = now_ns();
            m.reserved = [0; DEVICES];
            i
        };
        group.me = me;
        log_at!(Debug, "joined group {name} as member {me}");
        Ok(Arc::new(group))
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The ledger under its mutex; a member that died holding it leaves totals to recompute.
    fn lock(&self) -> Result<Locked<'_>, String> {
        // SAFETY: the mutex lives in our mapping, initialised by the ledger's creator.
        let r = unsafe { libc::pthread_mutex_lock(&mut (*self.map.ledger).mutex) };
        let l = match r {
            0 => Locked(self),
            libc::EOWNERDEAD => {
                let mut l = Locked(self);
                repair(&mut l);
                // SAFETY: we hold the mutex after EOWNERDEAD; the state is repaired.
                unsafe { libc::pthread_mutex_consistent(&mut l.mutex) };
                l
            }
            e => {
                return Err(format!(
                    "group {}: its ledger's lock is unusable ({e})",
                    self.name
                ))
            }
        };
        Ok(l)
    }

    /// Whether member `i` is alive: its byte is locked by someone (never asked of ourselves).
    fn alive(&self, i: usize) -> bool {
        let mut f = flock_of(i, libc::F_WRLCK as libc::c_short);
        // SAFETY: a lock test on our own descriptor with a valid flock.
        let r = unsafe { libc::fcntl(self.map.fd, libc::F_OFD_GETLK, &mut f) };
        r != 0 || f.l_type != libc::F_UNLCK as libc::c_short
    }

    /// Returns the share of every dead member to the group (under the mutex).
    fn reap(&self, l: &mut Locked) {
        for i in 0..MEMBERS {
            if i == self.me || l.members[i].live == 0 || self.alive(i) {
                continue;
            }
            let gone: u64 = l.members[i].reserved.iter().sum();
            for d in 0..DEVICES {
                let r = std::mem::take(&mut l.members[i].reserved[d]);
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
            let mut seen = me.request.load(Ordering::Acquire);
            loop {
                futex_wait(&me.request, seen, Duration::from_secs(1));
                if crate::flags::exiting() {
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

    /// The group's figures on device `slot`: (live members, reserved total, limit).
    fn figures(&self, slot: usize) -> (u64, u64, u64) {
        match self.lock() {
            Ok(l) => (
                (0..MEMBERS).filter(|&i| l.members[i].live != 0).count() as u64,
                l.devices[slot].total,
                l.devices[slot].limit,
            ),
            Err(_) => (0, 0, 0),
        }
    }
}

/// Recomputes every total from the live members' figures (after a member died holding the
/// mutex, perhaps between two of its updates).
fn repair(l: &mut Locked) {
    for d in 0..DEVICES {
        let sum = (0..MEMBERS)
            .filter(|&i| l.members[i].live != 0)
            .map(|i| l.members[i].reserved[d])
            .sum();
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
        l.devices[self.slot].total += bytes;
        l.members[g.me].reserved[self.slot] += bytes;
        true
    }

    fn force_reserve(&self, bytes: u64) {
        let g = &*self.group;
        if let Ok(mut l) = g.lock() {
            l.devices[self.slot].total += bytes;
            l.members[g.me].reserved[self.slot] += bytes;
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
        let (_, reserved, limit) = self.group.figures(self.slot);
        match limit {
            0 => u64::MAX,
            limit => limit.saturating_sub(reserved),
        }
    }

    fn limit(&self) -> u64 {
        self.group.figures(self.slot).2
    }

    fn borrow(&self, bytes: u64) -> bool {
        self.group.borrow(self.slot, bytes, LEND_WAIT)
    }
}

/// A ledger read from outside (`cudapool stat`, the exporter): no membership, no lock taken.
#[derive(Clone, Debug, Default)]
pub struct LedgerView {
    pub name: String,
    pub uid: u32,
    /// (uuid, limit, total reserved) of each GPU the group used.
    pub devices: Vec<([u8; 16], u64, u64)>,
    /// (pid, reserved per GPU, in `devices` order) of each live member.
    pub members: Vec<(u32, Vec<u64>)>,
}

/// Every group ledger in `/dev/shm` of this user (of every user with `all_users`), read.
pub fn ledgers(all_users: bool) -> Vec<Result<LedgerView, String>> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir("/dev/shm") else {
        return out;
    };
    for e in entries.flatten() {
        let fname = e.file_name().to_string_lossy().into_owned();
        let Some((owner, name)) = fname
            .strip_prefix("cudapool-group-")
            .and_then(|rest| rest.split_once('-'))
            .and_then(|(u, n)| Some((u.parse::<u32>().ok()?, n.to_string())))
        else {
            continue;
        };
        if owner != uid() && !all_users {
            continue;
        }
        out.push(read(&e.path().to_string_lossy(), owner).map(|mut v| {
            v.name = name;
            v
        }));
    }
    out
}

/// Reads the ledger at `path` (a regular file of `owner`, one ledger long, never through a
/// link, never blocking). Members are live by their lock, as members see them.
pub fn read(path: &str, owner: u32) -> Result<LedgerView, String> {
    let cpath = CString::new(path).map_err(|e| e.to_string())?;
    let fd = open_existing(&cpath, path)?;
    let checked = regular_file_of(fd, path, owner).and_then(|st| match st.st_size as usize {
        SIZE => Ok(()),
        n => Err(format!(
            "{path} is {n} bytes, not a group ledger of this version"
        )),
    });
    if let Err(why) = checked {
        // SAFETY: our descriptor, closed once.
        unsafe { libc::close(fd) };
        return Err(why);
    }
    // SAFETY: mapping SIZE bytes of a regular file of exactly that size, read-only.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            SIZE,
            libc::PROT_READ,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        // SAFETY: our descriptor, closed once.
        unsafe { libc::close(fd) };
        return Err(format!("cannot map {path}"));
    }
    let map = Mapping {
        ledger: p.cast(),
        fd,
    };
    // SAFETY: SIZE bytes mapped read-only; plain loads (a figure may be a moment old).
    let l = unsafe { &*map.ledger };
    if l.magic.load(Ordering::Acquire) != MAGIC || l.version != VERSION {
        return Err(format!("{path}: not a group ledger of this version"));
    }
    let used: Vec<usize> = (0..DEVICES).filter(|&d| l.devices[d].used != 0).collect();
    let alive = |i: usize| {
        let mut f = flock_of(i, libc::F_WRLCK as libc::c_short);
        // SAFETY: a lock test on our own descriptor with a valid flock.
        let r = unsafe { libc::fcntl(map.fd, libc::F_OFD_GETLK, &mut f) };
        r == 0 && f.l_type != libc::F_UNLCK as libc::c_short
    };
    Ok(LedgerView {
        name: String::new(),
        uid: owner,
        devices: used
            .iter()
            .map(|&d| (l.devices[d].uuid, l.devices[d].limit, l.devices[d].total))
            .collect(),
        members: (0..MEMBERS)
            .filter(|&i| l.members[i].live != 0 && alive(i))
            .map(|i| {
                let m = &l.members[i];
                (m.pid as u32, used.iter().map(|&d| m.reserved[d]).collect())
            })
            .collect(),
    })
}
