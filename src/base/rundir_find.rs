//! Finding runtime directories (`rundir`): the walk around a default name another user took,
//! and the readers' survey of every directory they may read (`cudapool stat`, the exporter).
//!
//! **The walk around.** When `/dev/shm/cudapool-<uid>` is not a directory of the user's, the
//! user's processes use the first (by name) directory of theirs named `cudapool-<uid>.<suffix>`,
//! or make one with a random suffix. No one else can make a directory of this user's, so
//! anything planted at such names is passed over (never opened as ours, never a refusal), and a
//! random name cannot be taken in advance. Two processes of the user that make one at the same
//! moment agree through a lock only they can hold for long (an abstract socket; if a neighbour
//! holds it, the wait is bounded and the race narrow: each process still works).
//!
//! **The survey** reads `/dev/shm` once: only directories at the names of the user (or of every
//! user, as root) are opened, files are passed over by their type alone, so a flood of planted
//! files costs one directory read. The whole survey ends at a deadline, and the directories are
//! opened a round at a time across the uids their names give, so one name's flood cannot use up
//! the others' turns. What it says of squats is bounded ([`MAX_SQUATS`]).

use super::rundir::{
    default_path, lstat_uid, make_dir, open_dir, private_in, uid, Found, RunDir, REMEDY, SHM,
};
use std::collections::BTreeMap;
use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The most squats a survey reports.
pub const MAX_SQUATS: usize = 64;
/// How long a survey of `/dev/shm` may take.
pub const SURVEY_TIME: Duration = Duration::from_millis(800);
/// How long a survey may take to open the directories its read found, after the read: a read
/// that used all of [`SURVEY_TIME`] on a flood still opens what it found (and what earlier
/// surveys found).
pub const OPEN_TIME: Duration = Duration::from_millis(400);

/// Whose directory a name in `/dev/shm` would be: `cudapool-<uid>` (the default: `true`) or
/// `cudapool-<uid>.<suffix>` (a walk-around name: 1 to 32 letters and digits).
fn named_uid(name: &str) -> Option<(u32, bool)> {
    let rest = name.strip_prefix("cudapool-")?;
    let (u, default) = match rest.split_once('.') {
        Some((u, sfx)) => {
            if sfx.is_empty() || sfx.len() > 32 || !sfx.bytes().all(|b| b.is_ascii_alphanumeric()) {
                return None;
            }
            (u, false)
        }
        None => (rest, true),
    };
    if u.is_empty() || u.len() > 10 || !u.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((u.parse().ok()?, default))
}

/// Where a survey of `/dev/shm` stopped, for a reader that surveys again and again (the
/// exporter): the next survey reads on from there, so every name is reached within a bounded
/// number of surveys whatever the folder's order (tmpfs lists the newest names first: a flood
/// planted after a user's directory would otherwise hide it for good), and what earlier
/// surveys found stands until a whole pass of the folder has been read.
#[derive(Debug, Default)]
pub struct Cursor {
    /// The folder stream's position where the last read stopped (`telldir`); `None`: at the
    /// start of a pass.
    at: Option<libc::c_long>,
    /// Names found in the pass under way.
    pass: BTreeMap<u32, Vec<PathBuf>>,
    /// Names of the last whole pass.
    last: BTreeMap<u32, Vec<PathBuf>>,
}

/// Why a survey did not cover everything (for the exporter's scrape).
pub const CUT_READ: &str = "folder read";
pub const CUT_OPEN: &str = "folders opened";

/// The directories (by their type: files are passed over unopened) at users' names in
/// `/dev/shm`, of `only` when given, read from where `cursor` stopped until `deadline`: uid ->
/// paths, each uid's sorted by name, with the names earlier reads found; and whether the read
/// stopped at the deadline.
fn candidates(
    parent: &Path,
    only: Option<u32>,
    deadline: Instant,
    cursor: &mut Cursor,
) -> (BTreeMap<u32, Vec<PathBuf>>, bool) {
    let Ok(c) = CString::new(parent.as_os_str().as_encoded_bytes()) else {
        return (BTreeMap::new(), false);
    };
    // SAFETY: opendir of a NUL-terminated path; checked for NULL below.
    let dir = unsafe { libc::opendir(c.as_ptr()) };
    if dir.is_null() {
        return (BTreeMap::new(), false);
    }
    if let Some(at) = cursor.at {
        // SAFETY: seekdir on the stream opened above, to a position telldir gave.
        unsafe { libc::seekdir(dir, at) };
    }
    let mut n = 0u64;
    let mut cut = false;
    loop {
        n += 1;
        if n.is_multiple_of(4096) && Instant::now() > deadline {
            // SAFETY: telldir on the stream opened above.
            cursor.at = Some(unsafe { libc::telldir(dir) });
            cut = true;
            break;
        }
        // SAFETY: readdir on the stream opened above; the entry lives until the next call.
        let e = unsafe { libc::readdir(dir) };
        if e.is_null() {
            cursor.at = None;
            cursor.last = std::mem::take(&mut cursor.pass);
            break;
        }
        // The type from the directory entry itself, first: a planted file costs no system
        // call and no allocation. (A file system that gives no type is looked at by name.)
        // SAFETY: `e` is a valid entry.
        let t = unsafe { (*e).d_type };
        if t != libc::DT_DIR && t != libc::DT_UNKNOWN {
            continue;
        }
        // SAFETY: d_name is a NUL-terminated array inside the entry.
        let name = unsafe { std::ffi::CStr::from_ptr((*e).d_name.as_ptr()) };
        let Some((u, _)) = name.to_str().ok().and_then(named_uid) else {
            continue;
        };
        if only.is_some_and(|o| o != u) {
            continue;
        }
        if let Ok(name) = name.to_str() {
            cursor.pass.entry(u).or_default().push(parent.join(name));
        }
    }
    // SAFETY: the stream opened above, closed once.
    unsafe { libc::closedir(dir) };
    let mut out = cursor.last.clone();
    for (u, paths) in &cursor.pass {
        out.entry(*u).or_default().extend(paths.iter().cloned());
    }
    for v in out.values_mut() {
        v.sort();
        v.dedup();
    }
    (out, cut)
}

/// Holds the user's lock on making a walk-around directory (an abstract socket named for the
/// uid), waited for at most 200 ms; `None` when it could not be had (the walk goes on without).
fn setup_lock(me: u32) -> Option<std::os::unix::net::UnixListener> {
    use std::os::linux::net::SocketAddrExt as _;
    let addr =
        std::os::unix::net::SocketAddr::from_abstract_name(format!("cudapool-rundir-{me}")).ok()?;
    let until = Instant::now() + Duration::from_millis(200);
    loop {
        if let Ok(l) = std::os::unix::net::UnixListener::bind_addr(&addr) {
            return Some(l);
        }
        if Instant::now() > until {
            return None;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The first usable walk-around directory of user `me` in `parent`, if any, read from where
/// `cursor` stopped (a second look reads on rather than again from the start).
fn first_usable(parent: &Path, me: u32, cursor: &mut Cursor) -> Option<RunDir> {
    let far = Instant::now() + Duration::from_secs(5);
    candidates(parent, Some(me), far, cursor)
        .0
        .remove(&me)
        .unwrap_or_default()
        .into_iter()
        .filter(|p| p != &private_in(parent, me))
        .find_map(|p| match open_dir(&p, me) {
            Found::Usable(d) => Some(d),
            _ => None,
        })
}

fn random_suffix() -> String {
    let mut b = [0u8; 8];
    // SAFETY: getrandom writes at most `b.len()` bytes into our buffer.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n != b.len() as isize {
        // No entropy source: the clock and pid, still no name a neighbour made in advance.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        b = (t ^ ((std::process::id() as u64) << 32)).to_le_bytes();
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// User `me`'s runtime directory when its default name `taken` cannot be used (`why`): the
/// first walk-around directory of theirs, or a new one; and the line to say once.
fn walk_around(
    parent: &Path,
    me: u32,
    taken: &Path,
    why: &str,
) -> Result<(RunDir, Option<String>), String> {
    let said = |used: &Path| {
        Some(format!(
            "{why}: using {} instead; to take {} back, have root remove it (or set CUDAPOOL_RUNTIME_DIR to a directory of yours)",
            used.display(),
            taken.display()
        ))
    };
    // The folder this process walked to before (its page and its group look it up apart):
    // opened by name, no second read of a folder a flood may fill.
    if let Some(d) = WALKED
        .get()
        .filter(|p| p.parent() == Some(parent))
        .and_then(|p| match open_dir(p, me) {
            Found::Usable(d) => Some(d),
            _ => None,
        })
    {
        let line = said(&d.path);
        return Ok((d, line));
    }
    let mut cursor = Cursor::default();
    let found = match first_usable(parent, me, &mut cursor) {
        Some(d) => Some(d),
        None => {
            let _lock = setup_lock(me);
            first_usable(parent, me, &mut cursor).or_else(|| {
                (0..4).find_map(|_| {
                    let path = parent.join(format!("cudapool-{me}.{}", random_suffix()));
                    match make_dir(&path, me) {
                        Found::Usable(d) => Some(d),
                        // taken meanwhile, or vanished: another name
                        _ => None,
                    }
                })
            })
        }
    };
    if let Some(d) = found {
        let _ = WALKED.set(d.path.clone());
        let line = said(&d.path);
        return Ok((d, line));
    }
    Err(format!(
        "{why}, and no directory could be made instead; {REMEDY}"
    ))
}

/// The walk-around folder this process found or made (once).
static WALKED: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// This user's runtime directory (made if absent), and a line to say once when it is not the
/// default because another user took that name. `Err` is one line: why there is none.
///
/// `configured` (`CUDAPOOL_RUNTIME_DIR`): a directory of this user that no one else may write
/// is used as it is; one another user owns or others may write (`/tmp`, a team's folder) is
/// used through a private `cudapool-<uid>` made inside it; nothing of it is ever changed.
pub fn mine(configured: Option<&Path>) -> Result<(RunDir, Option<String>), String> {
    let me = uid();
    if let Some(p) = configured {
        let shared = match make_dir(p, me) {
            Found::Usable(d) => return Ok((d, None)),
            Found::Shared(why) => why,
            Found::Unusable(why) => return Err(format!("CUDAPOOL_RUNTIME_DIR: {why}; {REMEDY}")),
            Found::Absent => return Err(format!("CUDAPOOL_RUNTIME_DIR: {} vanished", p.display())),
        };
        let private = private_in(p, me);
        return match make_dir(&private, me) {
            Found::Usable(d) => Ok((d, None)),
            // Its private name taken by another user: walked around inside it too.
            Found::Shared(why) | Found::Unusable(why) => walk_around(p, me, &private, &why)
                .map_err(|e| format!("CUDAPOOL_RUNTIME_DIR: {shared}, and {e}")),
            Found::Absent => Err(format!(
                "CUDAPOOL_RUNTIME_DIR: {} vanished",
                private.display()
            )),
        };
    }
    let path = default_path(me);
    let why = match make_dir(&path, me) {
        Found::Usable(d) => return Ok((d, None)),
        Found::Shared(why) | Found::Unusable(why) => why,
        Found::Absent => format!("{} vanished", path.display()),
    };
    walk_around(Path::new(SHM), me, &path, &why)
}

/// What a reader says of a user's default runtime directory that someone else took.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Squat {
    /// The user whose name was taken.
    pub uid: u32,
    /// The name taken, and why it cannot be used.
    pub path: PathBuf,
    pub why: String,
    /// The directory that user's processes use instead.
    pub used: Option<PathBuf>,
}

impl Squat {
    /// One line: what was taken, what is used instead, and the remedy.
    pub fn line(&self) -> String {
        match &self.used {
            Some(u) => format!(
                "{}: user {}'s processes use {} instead; to take it back, have root remove {} (or set CUDAPOOL_RUNTIME_DIR to a directory of yours)",
                self.why,
                self.uid,
                u.display(),
                self.path.display()
            ),
            None => format!(
                "{}: user {}'s processes have found no directory instead; have root remove it, or {REMEDY}",
                self.why, self.uid
            ),
        }
    }
}

/// What a survey found, and what it did not cover ([`CUT_READ`], [`CUT_OPEN`]).
#[derive(Debug, Default)]
pub struct Survey {
    pub dirs: Vec<RunDir>,
    pub squats: Vec<Squat>,
    pub cut: Vec<&'static str>,
}

/// Every runtime directory a reader looks in, and the squats it can say, in one bounded read
/// ([`survey_on`] with a cursor of its own).
pub fn survey(all_users: bool, configured: Option<&Path>) -> (Vec<RunDir>, Vec<Squat>) {
    let s = survey_on(all_users, configured, &mut Cursor::default());
    (s.dirs, s.squats)
}

/// Every runtime directory a reader looks in, and the squats it can say, in one bounded read
/// that starts where `cursor`'s last one stopped. With `configured` (`CUDAPOOL_RUNTIME_DIR`):
/// that one (it must belong to the reader, or to anyone when `all_users`) or, when it is
/// shared, the private `cudapool-<uid>` directories inside it; else the default and
/// walk-around directories of this user (its default looked at first, whatever the folder
/// holds), or of every user (`all_users`, root). Then the jobs' folders of root whose ledgers
/// are the reader's (any user's when `all_users`). Each is checked as the writers check theirs.
/// Nothing is changed.
pub fn survey_on(all_users: bool, configured: Option<&Path>, cursor: &mut Cursor) -> Survey {
    let me = uid();
    let mut out = Survey::default();
    if let Some(p) = configured {
        out.dirs = configured_dirs(p, all_users, me);
    } else {
        let only = (!all_users).then_some(me);
        // This user's own default name is opened by name, before the folder is read: no
        // flood, nor the time its reading takes, can hide it.
        if let Some(me) = only {
            if let Found::Usable(d) = open_dir(&default_path(me), me) {
                out.dirs.push(d);
            }
        }
        let read_by = Instant::now() + SURVEY_TIME;
        let (mut by_uid, cut) = candidates(Path::new(SHM), only, read_by, cursor);
        if cut {
            out.cut.push(CUT_READ);
        }
        if let Some(me) = only {
            by_uid
                .entry(me)
                .or_default()
                .retain(|p| p != &default_path(me));
        }
        // The opens have a time of their own: a read cut at its deadline still opens what it
        // (and the passes before it) found.
        let deadline = Instant::now() + OPEN_TIME;
        // A round at a time across the uids the names give.
        let mut round = 0;
        let mut used: BTreeMap<u32, PathBuf> = BTreeMap::new();
        loop {
            let mut any = false;
            for (&u, paths) in by_uid.iter_mut() {
                let Some(p) = paths.get(round) else { continue };
                any = true;
                if Instant::now() > deadline {
                    break;
                }
                if let Found::Usable(d) = open_dir(p, u) {
                    if p != &default_path(u) {
                        used.entry(u).or_insert_with(|| p.clone());
                    }
                    out.dirs.push(d);
                }
            }
            round += 1;
            if !any {
                break;
            }
            if Instant::now() > deadline {
                out.cut.push(CUT_OPEN);
                break;
            }
        }
        by_uid.clear();
        // A user whose processes walked around: what took the default name.
        for (u, walked) in used {
            if out.squats.len() >= MAX_SQUATS {
                break;
            }
            let taken = default_path(u);
            let why = match open_dir(&taken, u) {
                Found::Usable(_) => continue, // theirs again: nothing to say
                Found::Absent => continue,
                Found::Shared(w) | Found::Unusable(w) => w,
            };
            out.squats.push(Squat {
                uid: u,
                path: taken,
                why,
                used: Some(walked),
            });
        }
    }
    let jobs = Path::new(super::job::JOBS_DIR);
    out.dirs
        .extend(super::rundir::job_dirs(jobs, (!all_users).then_some(me)));
    out.dirs.sort_by(|a, b| a.path.cmp(&b.path));
    out
}

/// The directories process `pid`'s page would be in if it is a cudapool process, found by name
/// (no folder is read, so no flood hides them): `configured`'s (as [`survey_on`] reads it), else
/// the default directory of the user the kernel says owns the process (`/proc/PID`) and the
/// directories of the pages it holds open ([`held_page_dirs`]: a walk-around one), then the
/// jobs' folders of root holding that user's ledgers. Empty for another user's process unless
/// `all_users` (root).
pub fn for_pid(pid: u32, configured: Option<&Path>, all_users: bool) -> Vec<RunDir> {
    use std::os::unix::fs::MetadataExt as _;
    let me = uid();
    let Ok(owner) = std::fs::metadata(format!("/proc/{pid}")).map(|m| m.uid()) else {
        return Vec::new();
    };
    if owner != me && !all_users {
        return Vec::new();
    }
    let mut out = match configured {
        Some(p) => configured_dirs(p, all_users, me),
        None => {
            let default = default_path(owner);
            let held = held_page_dirs(pid).into_iter().filter(|p| p != &default);
            let paths: Vec<PathBuf> = std::iter::once(default.clone()).chain(held).collect();
            (paths.iter())
                .filter_map(|p| match open_dir(p, owner) {
                    Found::Usable(d) => Some(d),
                    _ => None,
                })
                .collect()
        }
    };
    let jobs = Path::new(super::job::JOBS_DIR);
    out.extend(super::rundir::job_dirs(jobs, Some(owner)));
    out
}

/// The directories of the page files process `pid` holds open (its page, which carries its
/// liveness lock), as the kernel names them in `/proc/PID/fd` (which the process's user and
/// root may read): a walk-around directory is found without reading `/dev/shm`. Each is still
/// checked by its opener as any other.
fn held_page_dirs(pid: u32) -> Vec<PathBuf> {
    /// The most descriptors looked at.
    const MOST: usize = 1 << 16;
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = Vec::new();
    for fd in fds.take(MOST).flatten() {
        let Ok(target) = std::fs::read_link(fd.path()) else {
            continue;
        };
        let page =
            (target.file_name().and_then(|n| n.to_str())).is_some_and(|n| n.starts_with("page-"));
        match target.parent() {
            Some(dir) if page && target.is_absolute() && !out.iter().any(|o| o == dir) => {
                out.push(dir.to_path_buf())
            }
            _ => {}
        }
    }
    out
}

fn configured_dirs(p: &Path, all_users: bool, me: u32) -> Vec<RunDir> {
    let Ok(c) = CString::new(p.as_os_str().as_encoded_bytes()) else {
        return Vec::new();
    };
    let owner = if all_users {
        match lstat_uid(&c) {
            Some(u) => u,
            None => return Vec::new(),
        }
    } else {
        me
    };
    match open_dir(p, owner) {
        Found::Usable(d) => vec![d],
        Found::Shared(_) => private_dirs_in(p, (!all_users).then_some(me)),
        _ => Vec::new(),
    }
}

/// The usable private directories (`cudapool-<uid>` and walk-around names) of user `only`, or
/// of every user, in a shared `parent`, each checked against the uid its name gives.
fn private_dirs_in(parent: &Path, only: Option<u32>) -> Vec<RunDir> {
    let deadline = Instant::now() + SURVEY_TIME;
    let mut out = Vec::new();
    for (u, paths) in candidates(parent, only, deadline, &mut Cursor::default()).0 {
        for p in paths {
            if let Found::Usable(d) = open_dir(&p, u) {
                out.push(d);
            }
        }
    }
    out
}

/// [`survey`]'s directories.
pub fn readable(all_users: bool, configured: Option<&Path>) -> Vec<RunDir> {
    survey(all_users, configured).0
}

/// [`survey`]'s squats (with `CUDAPOOL_RUNTIME_DIR` set nothing is walked, so none).
pub fn squats(all_users: bool, configured: Option<&Path>) -> Vec<Squat> {
    survey(all_users, configured).1
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd as _;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("cudapool-rundir-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// Issue 60, item 4: a flood of names read a bounded part at a time (here 4,095 a
    /// survey: each read's deadline has passed) [one read from the start each time: a user
    /// listed after the flood was never reached, and nothing said so]. The user is reached
    /// within five surveys wherever the folder lists it, each cut survey says so, and once
    /// found stays found.
    #[test]
    fn a_flood_of_names_delays_a_user_by_a_few_surveys_never_for_good() {
        let d = scratch("flood");
        let me = uid();
        std::fs::create_dir(d.join(format!("cudapool-{me}"))).unwrap();
        for i in 0..20_000 {
            std::fs::write(d.join(format!("f{i}")), "").unwrap();
        }
        let mut cursor = Cursor::default();
        let past = Instant::now();
        let (mut found_at, mut cuts) = (None, 0);
        for call in 1..=10 {
            let (found, cut) = candidates(&d, None, past, &mut cursor);
            cuts += usize::from(cut);
            if found.contains_key(&me) && found_at.is_none() {
                found_at = Some(call);
            }
        }
        assert!(found_at.is_some_and(|c| c <= 5), "found at {found_at:?}");
        assert!(cuts >= 8, "each cut said: {cuts}");
        let (found, _) = candidates(&d, None, past, &mut cursor);
        assert!(found.contains_key(&me), "found stays found");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn only_a_users_names_are_candidates() {
        assert_eq!(named_uid("cudapool-1002"), Some((1002, true)));
        assert_eq!(named_uid("cudapool-1002.1"), Some((1002, false)));
        assert_eq!(
            named_uid("cudapool-1002.0f3a9c2e11d04b7a"),
            Some((1002, false))
        );
        assert_eq!(named_uid("cudapool-1002."), None);
        assert_eq!(named_uid("cudapool-x"), None);
        assert_eq!(named_uid("cudapool-1002.a/b"), None);
        assert_eq!(named_uid("cudapool-99999999999"), None);
        let a = random_suffix();
        assert_eq!(a.len(), 16);
        assert_ne!(a, random_suffix(), "unpredictable");
    }

    #[test]
    fn a_configured_directory_is_made_0700_and_files_open_through_it() {
        let d = scratch("made").join("run");
        let (dir, said) = mine(Some(&d)).expect("made");
        assert!(said.is_none());
        let mode = std::fs::metadata(&d).unwrap().permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
            0o700
        );
        let fd = dir
            .open("f", libc::O_RDWR | libc::O_CREAT | libc::O_EXCL)
            .unwrap();
        super::super::rundir::reserve(fd.as_raw_fd(), 4096).unwrap();
        assert_eq!(std::fs::metadata(d.join("f")).unwrap().len(), 4096);
        assert_eq!(dir.names(10), vec!["f".to_string()]);
        assert!(
            dir.open("../f", libc::O_RDONLY).is_err(),
            "a name with a slash"
        );
        dir.unlink("f");
        assert!(dir.names(10).is_empty());
    }

    #[test]
    fn a_link_or_a_file_or_a_writable_directory_is_refused() {
        let base = scratch("refused");
        let target = base.join("target");
        std::fs::create_dir(&target).unwrap();
        let link = base.join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(mine(Some(&link)).is_err(), "a link to a directory");
        let file = base.join("file");
        std::fs::write(&file, b"x").unwrap();
        assert!(mine(Some(&file)).is_err(), "a file");
        // A directory of ours that others may write is never changed: a private directory
        // inside it is used instead, and readers look there too.
        let open = base.join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::os::unix::fs::PermissionsExt::from_mode(0o1777))
            .unwrap();
        let (d, _) = mine(Some(&open)).expect("a private directory inside");
        assert_eq!(d.path(), private_in(&open, uid()));
        let mode = std::fs::metadata(&open).unwrap().permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o7777,
            0o1777,
            "the shared directory kept its mode"
        );
        // (The machine's own job folders, which readers also list, are not this test's.)
        let seen: Vec<_> = readable(false, Some(&open))
            .into_iter()
            .filter(|d| d.path().starts_with(&open))
            .collect();
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].path(), d.path());
        // An existing directory of ours with a loose mode is not tightened either.
        let loose = base.join("loose");
        std::fs::create_dir(&loose).unwrap();
        std::fs::set_permissions(&loose, std::os::unix::fs::PermissionsExt::from_mode(0o2775))
            .unwrap();
        assert!(mine(Some(&loose)).is_ok());
        let mode = std::fs::metadata(&loose).unwrap().permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o7777,
            0o2775
        );
    }
}
