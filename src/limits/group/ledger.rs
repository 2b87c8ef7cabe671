//! A group's ledger: the file its members share (`group-<name>` in the user's runtime
//! directory, `rundir`), its format, how a joiner opens it, and how it is read from outside.
//!
//! **Format.** One `#[repr(C)]` [`Ledger`]: a magic and version, a process-shared robust mutex,
//! [`DEVICES`] GPU slots and [`MEMBERS`] member slots. Past its end lie lock bytes that carry
//! no data: member `i`'s liveness byte at `SIZE + i` (an open-file-description lock its member
//! holds for life; the kernel drops it however the member dies), the door at `SIZE + MEMBERS`
//! and the byte that names the door's holder after it (`door.rs`).
//!
//! **The door.** A joiner holds the door (an exclusive lock) from opening the file until it
//! holds its member byte; so does whoever rebuilds or removes the ledger. So a ledger is
//! removed or rebuilt only while no member lives in it and nobody is joining it, and a joiner
//! that waited at the door of a ledger removed meanwhile (its link count is 0) opens the new
//! one. Every wait at the door is bounded.
//!
//! **Nothing in it is trusted.** A joiner checks the file on its descriptor (a regular file of
//! this user), reserves its blocks before mapping it (a full filesystem costs the join, never a
//! SIGBUS), and checks every figure ([`check`]). A file that is not a valid ledger is rebuilt,
//! with one line, when no member lives in it; while members do, it is refused. Readers copy it
//! with bounded `pread`s into their own memory and never map it.
//!
//! **Cut or scribbled under its members.** A member's mapping is guarded (`sigbus`): a cut
//! file costs zero pages, never the process; at its next use the member sizes and maps the file
//! again, rebuilds it if invalid (`mend::restore`), and records its own share again.

use crate::base::patience::{wait_until, Patience, PER_FILE, READ_TIME};
use crate::base::pio;
use crate::base::rundir::{self, RunDir};
use crate::base::rundir_find;
use crate::base::sigbus;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

/// GPUs a group's ledger holds.
pub const DEVICES: usize = 32;
/// Members a group holds at once.
pub const MEMBERS: usize = 1024;
pub(super) const MAGIC: u64 = u64::from_le_bytes(*b"CPGROUP\0");
pub(super) const VERSION: u32 = 8;
/// More bytes than any GPU has: a figure above it is impossible (64 PiB).
pub const SANE: u64 = 1 << 56;
/// The most ledgers read from one runtime directory in one pass.
pub const MAX_LEDGERS_PER_DIR: usize = 256;

/// A GPU of the group. Under the mutex.
#[repr(C)]
pub(super) struct DeviceSlot {
    pub uuid: [u8; 16],
    /// 1 once a member claimed it (0 or 1: anything else is impossible).
    pub used: u64,
    /// 0: no limit.
    pub limit: u64,
    /// The members' reserved bytes on it, summed (the dead ones' until they are reaped).
    pub total: u64,
    /// The most `total` ever was, the reservations the group refused, and how many members
    /// ever held memory on it: the job's record (`cudapool slurm epilog`, `jobstat`).
    pub peak: u64,
    pub refused: u64,
    pub users: u64,
}

/// A member. `live`, `pid`, `joined_ns` and `reserved` are under the mutex; the lending words
/// are atomics.
#[repr(C)]
pub(super) struct MemberSlot {
    /// 1 while a member holds it (0 or 1); alive only while its byte is locked too.
    pub live: u64,
    pub pid: u64,
    pub joined_ns: u64,
    /// Bytes it holds from the driver on each device slot.
    pub reserved: [u64; DEVICES],
    /// Bumped by a member that asks this one to lend (a futex word).
    pub request: AtomicU32,
    /// The last request it served.
    pub served: AtomicU32,
    /// Bytes asked of it on each device slot.
    pub want: [AtomicU64; DEVICES],
    /// When it last did device work or allocated, as its lending thread saw (ns since the
    /// epoch, refreshed at least once a second; 0: not yet known).
    pub active_ns: AtomicU64,
    /// With a request: put yourself to sleep if idle this long (ms; 0: only lend cache).
    pub sleep_idle_ms: AtomicU64,
}

/// The ledger file. Invariant (under the mutex, after a repair): each device slot's `total` is
/// the sum of the `reserved` of the members marked live on it, and every figure is below
/// [`SANE`].
#[repr(C)]
pub(super) struct Ledger {
    pub magic: AtomicU64,
    pub version: u32,
    /// Changed by every rebuild ([`initialise`]): a member whose ledger was rebuilt under it
    /// sees another generation than the one it recorded its share in.
    pub generation: AtomicU32,
    /// A seqlock for readers from outside, who never take the mutex: odd while a member holds
    /// the mutex, bumped again when it lets go (a member that died holding it left it odd: the
    /// next holder makes it even first).
    pub seq: AtomicU64,
    /// Bumped by each joiner that passed the door (see [`enter`]): a waiter that sees it move
    /// knows the door turns and waits on; one that sees it stand still for [`DOOR_WAIT`] gives
    /// up. Read by waiters through the descriptor, before they map anything.
    pub turns: AtomicU64,
    /// The group's suspend (`suspend`): the pid of the process that posted it, 0 when none. Any
    /// process of the group's user may post or clear it, also from a signal handler; members
    /// hold their wakes while it is set and its poster lives.
    pub suspend: AtomicU64,
    /// The members' sleeps for a suspend, the device bytes they gave back, how many ended
    /// later than the 2 seconds Slurm gives before it stops a job, and the milliseconds they
    /// stayed asleep (each counted when the member wakes): the job's record.
    pub suspend_sleeps: AtomicU64,
    pub suspend_bytes: AtomicU64,
    pub suspend_late: AtomicU64,
    pub suspend_asleep_ms: AtomicU64,
    pub mutex: libc::pthread_mutex_t,
    pub devices: [DeviceSlot; DEVICES],
    pub members: [MemberSlot; MEMBERS],
}

/// A ledger file's whole size: nothing past it is ever read (the root Prolog cuts back a job's
/// ledger that its user grew, `cudapool slurm prolog`).
pub const SIZE: usize = std::mem::size_of::<Ledger>();

/// The file name of group `name`'s ledger.
pub fn file_name(name: &str) -> String {
    format!("group-{name}")
}

/// A ledger mapped by a member, and the descriptor it came through (kept open: it carries the
/// member's liveness lock).
pub(super) struct Mapping {
    pub ledger: *mut Ledger,
    pub fd: OwnedFd,
    /// Its slot in `sigbus` (a cut file costs the mapping, never the process).
    pub guard: Option<usize>,
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if let Some(g) = self.guard {
            sigbus::unguard(g);
        }
        // SAFETY: our own mapping of SIZE bytes, unmapped once (the descriptor closes itself).
        unsafe { libc::munmap(self.ledger.cast(), SIZE) };
    }
}

/// Why the figures of `l` are impossible, if they are.
pub(super) fn check(l: &Ledger) -> Result<(), String> {
    if l.magic.load(Ordering::Acquire) != MAGIC {
        return Err("no ledger's magic".into());
    }
    if l.version != VERSION {
        return Err(format!("version {}, not {VERSION}", l.version));
    }
    for (d, s) in l.devices.iter().enumerate() {
        if s.used > 1 || s.total >= SANE || s.limit >= SANE || s.peak >= SANE {
            return Err(format!("GPU slot {d} holds impossible figures"));
        }
    }
    for (i, m) in l.members.iter().enumerate() {
        if m.live > 1 || m.reserved.iter().any(|&r| r >= SANE) {
            return Err(format!("member slot {i} holds impossible figures"));
        }
    }
    Ok(())
}

/// Writes a fresh ledger into `l` (zeroed, its mutex process-shared and robust, the magic
/// last). Only while nobody else uses it: the door held and no member alive.
pub(super) fn initialise(l: *mut Ledger) {
    // SAFETY: `l` is a whole mapped Ledger that no other process uses now (the caller holds the
    // door and no member byte is held); zero is a valid bit pattern for every field, and the
    // mutex is then initialised in place.
    unsafe {
        std::ptr::write_bytes(l.cast::<u8>(), 0, SIZE);
    }
    reset_mutex(l);
    let generation = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.subsec_nanos() | 1);
    // SAFETY: as above; the magic last, so that a joiner that sees it sees the rest.
    unsafe {
        (*l).generation.store(generation, Ordering::Release);
        (*l).version = VERSION;
        (*l).magic.store(MAGIC, Ordering::Release);
    }
}

/// Makes the ledger's mutex usable again, in place (its lock word named a holder that no
/// longer exists). Only while nobody else uses it, as for [`initialise`].
pub(super) fn reset_mutex(l: *mut Ledger) {
    // SAFETY: as in `initialise`: nobody else touches the mutex while the door is held and no
    // other member lives.
    unsafe {
        let l = &mut *l;
        std::ptr::write_bytes(
            (&mut l.mutex as *mut libc::pthread_mutex_t).cast::<u8>(),
            0,
            std::mem::size_of::<libc::pthread_mutex_t>(),
        );
        let mut attr: libc::pthread_mutexattr_t = std::mem::zeroed();
        libc::pthread_mutexattr_init(&mut attr);
        libc::pthread_mutexattr_setpshared(&mut attr, libc::PTHREAD_PROCESS_SHARED);
        libc::pthread_mutexattr_setrobust(&mut attr, libc::PTHREAD_MUTEX_ROBUST);
        libc::pthread_mutex_init(&mut l.mutex, &attr);
        libc::pthread_mutexattr_destroy(&mut attr);
    }
}

fn map(fd: &OwnedFd) -> Result<*mut Ledger, String> {
    // SAFETY: mapping SIZE bytes of a regular file of ours whose blocks were reserved.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            SIZE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(format!("cannot map: {}", std::io::Error::last_os_error()));
    }
    Ok(p.cast())
}

/// What a joiner found, for its one line.
pub(super) enum Opened {
    /// A new ledger, or a valid one.
    Fine,
    /// A file that was no valid ledger, rebuilt (no member lived in it): why it was not.
    Rebuilt(String),
    /// A ledger cut while members live in it, made whole again: the joiner waits for them to
    /// record their shares again before it takes any.
    CutUnderMembers,
}

/// Opens group `name`'s ledger in `dir` for a joiner, creating it if absent, and returns it
/// mapped with the door held (the joiner takes its member byte, then lets the door go). A file
/// of ours that is no valid ledger is rebuilt when no member lives in it; while members do, it
/// is refused. Anything but a regular file of ours is refused.
pub(super) fn open_for_join(dir: &RunDir, name: &str) -> Result<(Mapping, Door, Opened), String> {
    let fname = file_name(name);
    let path = dir.file(&fname);
    let me = dir.owner;
    for _ in 0..8 {
        let fd = dir
            .open(&fname, libc::O_RDWR | libc::O_CREAT)
            .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
        let st = rundir::fstat(fd.as_raw_fd()).map_err(|e| format!("{}: {e}", path.display()))?;
        if !rundir::is_regular(&st) {
            return Err(format!("{} is not a regular file", path.display()));
        }
        if st.st_uid != me {
            return Err(format!(
                "{} belongs to user {}, not to user {me}",
                path.display(),
                st.st_uid
            ));
        }
        let door =
            enter(fd.as_raw_fd(), DOOR_WAIT).map_err(|e| format!("{}: {e}", path.display()))?;
        // Removed while we waited (its last member gone): open the new one.
        let st = rundir::fstat(fd.as_raw_fd()).map_err(|e| format!("{}: {e}", path.display()))?;
        if st.st_nlink == 0 {
            continue;
        }
        let others = others_live(fd.as_raw_fd());
        let size = st.st_size;
        // Cut under live members (shorter than a ledger): made whole again; they record
        // their shares again at their next use (`Group::lock`), which the joiner waits for.
        let cut = others && (size as usize) < SIZE;
        if size as usize != SIZE {
            if others && !cut {
                return Err(format!(
                    "{} is {size} bytes, not a group ledger of this version ({SIZE} bytes), and members use it; remove it once no member of the group runs",
                    path.display()
                ));
            }
            // SAFETY: sizing a regular file of ours that nobody else uses now (door held).
            if unsafe { libc::ftruncate(fd.as_raw_fd(), SIZE as libc::off_t) } != 0 {
                return Err(format!(
                    "cannot size {}: {}",
                    path.display(),
                    std::io::Error::last_os_error()
                ));
            }
        }
        rundir::reserve(fd.as_raw_fd(), SIZE).map_err(|e| {
            if size == 0 {
                dir.unlink(&fname);
            }
            format!("cannot reserve {SIZE} bytes for {}: {e}", path.display())
        })?;
        let ledger = map(&fd).map_err(|e| format!("{}: {e}", path.display()))?;
        let guard = sigbus::guard(ledger.cast(), SIZE);
        let mapping = Mapping { ledger, fd, guard };
        // SAFETY: a whole mapped Ledger; `check` only reads it.
        let valid = if size as usize == SIZE {
            check(unsafe { &*ledger })
        } else if size == 0 {
            Err(String::new())
        } else {
            Err(format!("{size} bytes, not {SIZE}"))
        };
        let opened = match valid {
            Ok(()) if cut => Opened::CutUnderMembers,
            Ok(()) => Opened::Fine,
            Err(_) if cut => {
                initialise(ledger);
                Opened::CutUnderMembers
            }
            Err(why) if others => {
                return Err(format!(
                    "{} is damaged ({why}) while members use it; refusing",
                    path.display()
                ))
            }
            Err(why) => {
                initialise(ledger);
                if why.is_empty() {
                    Opened::Fine
                } else {
                    Opened::Rebuilt(why)
                }
            }
        };
        // SAFETY: an atomic in the whole ledger just mapped (or initialised).
        unsafe { (*ledger).turns.fetch_add(1, Ordering::Relaxed) };
        return Ok((mapping, door, opened));
    }
    Err(format!(
        "{} keeps being removed while joining",
        path.display()
    ))
}

/// A ledger read from outside (`cudapool stat`, the exporter): no membership, no lock taken, no
/// mapping. Dead members are left out and their shares with them.
#[derive(Clone, Debug, Default)]
pub struct LedgerView {
    pub name: String,
    /// The file's owner.
    pub uid: u32,
    /// The ledger this reader removed because no member lived in it (a job's ledger in its
    /// folder of root is the job's Epilog's to remove, and stays).
    pub removed: bool,
    /// (uuid, limit, reserved by the live members) of each GPU the group used.
    pub devices: Vec<([u8; 16], u64, u64)>,
    /// (pid, reserved per GPU, in `devices` order) of each live member.
    pub members: Vec<(u32, Vec<u64>)>,
    /// What the ledger itself records as reserved on each GPU (in `devices` order): the live
    /// members' shares and the dead ones' not yet reaped. Never above the limit.
    pub recorded: Vec<u64>,
    /// (peak reserved, reservations refused, members that ever held memory) of each GPU, in
    /// `devices` order: the group's record since its ledger was made.
    pub record: Vec<(u64, u64, u64)>,
    /// The members' sleeps for the group's suspends (`suspend`).
    pub suspends: Suspends,
}

/// A group's sleeps for its suspends: how many, the device bytes they gave back, those that
/// ended after Slurm's 2 s or did not happen (the job held GPU memory while it was stopped), and
/// the milliseconds the members stayed asleep (each counted when it wakes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Suspends {
    pub sleeps: u64,
    pub bytes: u64,
    pub late: u64,
    pub asleep_ms: u64,
}

impl LedgerView {
    /// The live members that use GPU `i` (of `devices`): hold memory on it. A member that joined
    /// but never allocated there (torchrun's agent, a data-loading process) is no user of it.
    pub fn users_of(&self, i: usize) -> impl Iterator<Item = &(u32, Vec<u64>)> {
        self.members
            .iter()
            .filter(move |(_, r)| r.get(i).is_some_and(|&b| b > 0))
    }

    /// The live members that use any of the group's GPUs.
    pub fn users(&self) -> usize {
        self.members
            .iter()
            .filter(|(_, r)| r.iter().any(|&b| b > 0))
            .count()
    }
}

mod door;
mod layout;
pub(in crate::limits::group) use door::{
    enter, held, member_byte, others_holding, others_live, try_enter, try_lock, Door,
};
pub use door::{DOOR_WAIT, DOOR_WAIT_RUNNING};
pub use layout::*;

/// Every group ledger of this user (of every user with `all_users`) in the runtime directories
/// `configured` or the defaults name, read within the reader's usual time. A ledger of this
/// user with no live member shows 0 reserved and is removed; nothing of another user is ever
/// touched.
pub fn ledgers(
    all_users: bool,
    configured: Option<&std::path::Path>,
) -> Vec<Result<LedgerView, String>> {
    let dirs = rundir_find::readable(all_users, configured);
    let mut owners: Vec<u32> = dirs.iter().map(|d| d.owner).collect();
    owners.sort_unstable();
    owners.dedup();
    let mut patience = Patience::new(READ_TIME, owners.len());
    ledgers_in(&dirs, &mut patience)
        .into_iter()
        .map(|r| r.map_err(|(why, _)| why))
        .collect()
}

/// The ledgers in `dirs`, read within `patience`; an error says why, and whether it is that
/// the time ran out (`true`).
pub fn ledgers_in(
    dirs: &[RunDir],
    patience: &mut Patience,
) -> Vec<Result<LedgerView, (String, bool)>> {
    let mut out = Vec::new();
    for dir in dirs {
        let names: Vec<String> = dir
            .names(usize::MAX)
            .into_iter()
            .filter(|n| n.starts_with("group-"))
            .take(MAX_LEDGERS_PER_DIR)
            .collect();
        for fname in names {
            if !patience.may_read(dir.owner) {
                let why = format!(
                    "{}: {}",
                    dir.file(&fname).display(),
                    patience.why_not(dir.owner)
                );
                out.push(Err((why, true)));
                continue;
            }
            let name = fname["group-".len()..].to_string();
            let r = patience.read(dir.owner, |wait| read_within(dir, &fname, wait));
            out.push(
                r.map(|mut v| {
                    v.name = name;
                    v
                })
                .map_err(|why| (why, false)),
            );
        }
    }
    out
}

/// Reads ledger `fname` of `dir`, as [`ledgers`] says, waiting at most a reader's usual time
/// for a live writer.
pub fn read(dir: &RunDir, fname: &str) -> Result<LedgerView, String> {
    read_within(dir, fname, PER_FILE)
}

/// Reads ledger `fname` of `dir`; while a live member holds its lock, waits at most `wait`. A
/// ledger no member lives in is read once, never waited on.
pub fn read_within(dir: &RunDir, fname: &str, wait: Duration) -> Result<LedgerView, String> {
    let path = dir.file(fname);
    // SAFETY: getuid has no preconditions.
    // (A job's folder of root is the root Epilog's to empty, after it recorded the ledger.)
    let mine = dir.owner == unsafe { libc::getuid() } && !dir.of_job;
    // Our own: read-write, to remove it if it is dead (a write lock needs a writable file).
    let mode = if mine { libc::O_RDWR } else { libc::O_RDONLY };
    let (fd, st) =
        rundir::open_found(dir, fname, mode).map_err(|e| format!("{}: {e}", path.display()))?;
    if st.st_size as usize != SIZE {
        return Err(format!(
            "{}: {} bytes, not a group ledger of this version",
            path.display(),
            st.st_size
        ));
    }
    let mut copy: Box<std::mem::MaybeUninit<Ledger>> = Box::new_uninit();
    // SAFETY: the box holds SIZE bytes; viewed as bytes to be filled by pread.
    let bytes = unsafe { std::slice::from_raw_parts_mut(copy.as_mut_ptr().cast::<u8>(), SIZE) };
    bytes.fill(0);
    // A consistent copy: the seqlock even and the same before and after.
    let at = std::mem::offset_of!(Ledger, seq) as u64;
    let seq = || -> Result<u64, String> {
        let mut b = [0u8; 8];
        pio::read_exact_at(fd.as_raw_fd(), &mut b, at)?;
        Ok(u64::from_ne_bytes(b))
    };
    // Odd: a member holds the mutex, or died holding it. With no member alive (their record
    // locks say it, one test for all of them), nobody can be writing: the copy is as whole as
    // it will ever be, and what it records belongs to nobody. Only a live one is waited on.
    let anyone = || held(fd.as_raw_fd(), member_byte(0), MEMBERS);
    let mut failed = None;
    let mut first = true;
    let whole = wait_until(wait, || {
        let mut try_copy = || -> Result<bool, String> {
            let before = seq()?;
            if before % 2 == 1 {
                return Ok(false);
            }
            pio::read_exact_at(fd.as_raw_fd(), bytes, 0)?;
            Ok(seq()? == before)
        };
        match try_copy() {
            Ok(true) => true,
            Ok(false) if first && !anyone() => {
                failed = Some(None);
                true
            }
            Ok(false) => {
                first = false;
                false
            }
            Err(e) => {
                failed = Some(Some(format!("{}: {e}", path.display())));
                true
            }
        }
    });
    match failed {
        Some(Some(e)) => return Err(e),
        Some(None) => pio::read_exact_at(fd.as_raw_fd(), bytes, 0)
            .map_err(|e| format!("{}: {e}", path.display()))?,
        None if !whole => {
            return Err(format!(
                "{}: being written (waited {} ms)",
                path.display(),
                wait.as_millis()
            ))
        }
        None => {}
    }
    // SAFETY: every byte is written; every bit pattern is a valid Ledger (integers, atomics
    // and an opaque mutex that is never used in this copy).
    let l = unsafe { copy.assume_init() };
    check(&l).map_err(|why| format!("{}: not a valid group ledger ({why})", path.display()))?;
    let used: Vec<usize> = (0..DEVICES).filter(|&d| l.devices[d].used != 0).collect();
    let live: Vec<usize> = (0..MEMBERS)
        .filter(|&i| l.members[i].live != 0 && held(fd.as_raw_fd(), member_byte(i), 1))
        .collect();
    let removed = live.is_empty() && mine && remove_if_dead(dir, fname, &fd, &st);
    Ok(LedgerView {
        name: String::new(),
        uid: dir.owner,
        removed,
        devices: used
            .iter()
            .map(|&d| {
                let total = live
                    .iter()
                    .fold(0u64, |t, &i| t.saturating_add(l.members[i].reserved[d]));
                (l.devices[d].uuid, l.devices[d].limit, total)
            })
            .collect(),
        members: live
            .iter()
            .map(|&i| {
                let m = &l.members[i];
                (m.pid as u32, used.iter().map(|&d| m.reserved[d]).collect())
            })
            .collect(),
        recorded: used.iter().map(|&d| l.devices[d].total).collect(),
        record: used
            .iter()
            .map(|&d| {
                let s = &l.devices[d];
                (
                    s.peak,
                    s.refused.min(SANE),
                    s.users.min(MEMBERS as u64 * 1024),
                )
            })
            .collect(),
        suspends: Suspends {
            sleeps: l.suspend_sleeps.load(Ordering::Acquire).min(SANE),
            bytes: l.suspend_bytes.load(Ordering::Acquire).min(SANE),
            late: l.suspend_late.load(Ordering::Acquire).min(SANE),
            asleep_ms: l.suspend_asleep_ms.load(Ordering::Acquire).min(SANE),
        },
    })
}

/// Removes a ledger of ours in which no member lives, behind its door (no joiner is let in
/// meanwhile; one that waited finds it unlinked and makes a new one).
/// Whether it was removed.
pub(super) fn remove_if_dead(dir: &RunDir, fname: &str, fd: &OwnedFd, st: &libc::stat) -> bool {
    let Some(_door) = try_enter(fd.as_raw_fd()) else {
        return false; // someone is joining
    };
    if others_live(fd.as_raw_fd()) {
        return false;
    }
    if let Ok((_, now)) = rundir::open_found(dir, fname, libc::O_RDONLY) {
        if now.st_ino == st.st_ino && now.st_dev == st.st_dev {
            dir.unlink(fname);
            return true;
        }
    }
    false
}
