//! `cudapool slurm arbiter`: root's arbiter on a node whose GPU memory is overcommitted
//! (`overcommit=F` in the site's settings, docs/deploying.md). A job may then hold F times its
//! `gpumem` request, and the jobs together may ask for more than a GPU has. When the driver
//! refuses a job's allocation, its process asks the arbiter for room (one line on root's socket,
//! [`ARBITER_SOCKET`]); the arbiter puts other jobs' processes to sleep, those idle longest
//! first, and answers with the bytes they gave back.
//!
//! **What it trusts.** Who asks: the kernel's credentials of the socket's peer, and that pid's
//! job from its cgroups (root's, as Slurm made them), never a word the asker writes. Which jobs
//! hold what on the GPU: NVML's per-process figures (the driver's), each process placed in its
//! job by its cgroups. A job's request: its share file, root's. A job at or under its request is
//! never asked, whatever its processes say. Idleness: each process answers for itself through
//! its page (it sleeps only if its device work has been idle for `sleep_idle`), and the order
//! (longest idle first) is what the pages say, which a job can only use to be asked first. A
//! job that keeps its GPU busy is not safe above its request either: when no idle job makes
//! enough room for an asker still within its own request, the jobs above theirs are put to
//! sleep, busy or not (the request is the promise; the rest is lent). A process above its
//! request that does not put itself to sleep then (it runs no cudapool, or a library that
//! refuses) is checkpointed by the driver, its device memory moved to its own host memory
//! (`checkpointed`), and restored when its GPU has room again (`checkpoint=no` in the site's
//! settings leaves it holding the GPU, said in one line).
//! Each decision is said in one line on the arbiter's standard error (the node's log).

use super::slurm_site::{site, SLEEP_IDLE};
use cudapool::base::job::{job_of_pid, read_share, ARBITER_SOCKET, JOBS_DIR};
use cudapool::report::asks::{ask_sleep_if_idle, SleepAnswer};
use std::collections::BTreeMap;
use std::io::{BufRead as _, Write as _};
use std::os::fd::AsRawFd as _;
use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _, PermissionsExt as _};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::time::Duration;

/// How long a process asked to sleep has to answer (its device work drains first).
const ANSWER: Duration = Duration::from_secs(20);
/// How long the driver may wait for a process's CUDA calls under way before it checkpoints it.
const LOCK_WITHIN: Duration = Duration::from_secs(10);
/// The longest request line read.
const LINE: u64 = 128;
/// Requests of one user read at once, at most: each waits up to 2 s for its line, so a user who
/// opens connections and sends nothing holds only their own requests back, not other users'.
const PER_USER: usize = 4;

/// Requests being read, by user (the socket's peer's uid).
static READING: std::sync::Mutex<BTreeMap<u32, usize>> = std::sync::Mutex::new(BTreeMap::new());
/// One decision at a time: the room each frees is counted for its asker alone.
static DECIDING: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Serves the socket until killed (`once`: one request, for tests).
pub fn arbiter(config: Option<&Path>, once: bool) -> Result<(), String> {
    if super::slurm_site::euid() != 0 {
        return Err("the arbiter runs as root (it puts other users' jobs to sleep)".into());
    }
    let site = site(config)?;
    let Some(factor) = site.overcommit else {
        return Err(
            "the site's settings set no overcommit= (more than 1): nothing to arbitrate".into(),
        );
    };
    let idle = site.sleep_idle.unwrap_or(SLEEP_IDLE);
    let checkpoint = !site.no_checkpoint;
    let socket = Path::new(ARBITER_SOCKET);
    super::slurm_site::root_dir(socket.parent().unwrap_or(Path::new("/run")))?;
    match std::fs::symlink_metadata(socket) {
        Ok(m) if m.file_type().is_socket() && m.uid() == 0 => {
            std::fs::remove_file(socket).map_err(|e| format!("{}: {e}", socket.display()))?
        }
        Ok(_) => return Err(format!("{}: not root's socket", socket.display())),
        Err(_) => {}
    }
    let listener = UnixListener::bind(socket).map_err(|e| format!("{}: {e}", socket.display()))?;
    // Every job's process may ask; who asked is the kernel's to say.
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o666))
        .map_err(|e| format!("{}: {e}", socket.display()))?;
    eprintln!(
        "cudapool arbiter: serving {} (overcommit {factor}, jobs idle {:.0} s may sleep for others; {})",
        socket.display(),
        idle.as_secs_f64(),
        match (checkpoint, super::checkpoint::checkpointer()) {
            (false, _) => "checkpoint=no".to_string(),
            (true, Ok(_)) => "a process that does not sleep is checkpointed by the driver".into(),
            (true, Err(e)) => format!("{e}: a process that does not sleep keeps its memory"),
        }
    );
    if checkpoint {
        super::checkpointed::load();
        std::thread::Builder::new()
            .name("restores".into())
            .spawn(|| super::checkpointed::restore_forever(&DECIDING))
            .map_err(|e| format!("cannot start the restores' thread: {e}"))?;
    }
    let how = How { idle, checkpoint };
    for stream in listener.incoming() {
        let Ok(mut stream) = stream else { continue };
        let Some((pid, uid)) = peer(&stream) else {
            let _ = writeln!(stream, "refused no credentials");
            continue;
        };
        if once {
            serve(stream, pid, how);
            break;
        }
        {
            let mut reading = cudapool::base::sync::lock(&READING);
            let n = reading.entry(uid).or_default();
            if *n >= PER_USER {
                let _ = writeln!(stream, "refused {PER_USER} requests of this user already");
                continue;
            }
            *n += 1;
        }
        let served = std::thread::Builder::new().spawn(move || {
            serve(stream, pid, how);
            if let Some(n) = cudapool::base::sync::lock(&READING).get_mut(&uid) {
                *n -= 1;
            }
        });
        if served.is_err() {
            if let Some(n) = cudapool::base::sync::lock(&READING).get_mut(&uid) {
                *n -= 1;
            }
        }
    }
    Ok(())
}

/// What the site lets the arbiter do.
#[derive(Clone, Copy)]
struct How {
    /// A job's processes must have been idle this long to be put to sleep in the first pass.
    idle: Duration,
    /// A process that does not put itself to sleep in the second pass is checkpointed.
    checkpoint: bool,
}

/// One request of process `pid`: `room <GPU UUID, 32 hex digits> <bytes>`; answered
/// `freed <bytes>` or `refused <why>`.
fn serve(mut stream: UnixStream, pid: u32, how: How) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let _ = stream.set_write_timeout(Some(Duration::from_secs(2)));
    let mut line = String::new();
    let read = std::io::BufReader::new(std::io::Read::take(&stream, LINE)).read_line(&mut line);
    let answer = match (read, parse(&line)) {
        (Ok(_), Some((uuid, bytes))) => {
            let _one = cudapool::base::sync::lock(&DECIDING);
            decide(pid, &uuid, bytes, how)
        }
        _ => "refused not a request".to_string(),
    };
    let _ = writeln!(stream, "{answer}");
}

/// The pid and uid of the socket's peer, as the kernel says.
fn peer(stream: &UnixStream) -> Option<(u32, u32)> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: SO_PEERCRED into a ucred of ours, its size given.
    let r = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (r == 0 && cred.pid > 0).then_some((cred.pid as u32, cred.uid))
}

/// `room HEX32 BYTES`.
fn parse(line: &str) -> Option<([u8; 16], u64)> {
    let mut w = line.split_ascii_whitespace();
    if w.next()? != "room" {
        return None;
    }
    let hex = w.next()?;
    let bytes: u64 = w.next()?.parse().ok()?;
    if w.next().is_some() || hex.len() != 32 {
        return None;
    }
    let mut uuid = [0u8; 16];
    for (i, b) in uuid.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some((uuid, bytes))
}

/// A job's processes on the GPU (pid, bytes) and its request.
struct Held {
    procs: Vec<(u32, u64)>,
    request: u64,
}

impl Held {
    fn bytes(&self) -> u64 {
        self.procs.iter().map(|p| p.1).sum()
    }
}

/// The overcommitted jobs on the GPU `uuid`, by the driver's figures.
fn jobs_on(uuid: &[u8; 16]) -> BTreeMap<String, Held> {
    let mut jobs: BTreeMap<String, Held> = BTreeMap::new();
    for (pid, used) in cudapool::driver::nvml::processes(uuid).unwrap_or_default() {
        let Some(job) = job_of_pid(pid) else {
            continue;
        };
        if let Some(h) = jobs.get_mut(&job) {
            h.procs.push((pid, used));
            continue;
        }
        let Ok(Some(share)) = read_share(Path::new(JOBS_DIR), &job) else {
            continue;
        };
        if let Some(request) = share.request {
            jobs.insert(
                job,
                Held {
                    procs: vec![(pid, used)],
                    request,
                },
            );
        }
    }
    jobs
}

/// Which jobs the arbiter asks, in two passes: first those idle for the site's `sleep_idle`;
/// then, only for an asker still within its request, every job above its own, idle or not (a
/// request is what a job is promised; what it holds above it is lent, and taken back whether
/// or not the job keeps its GPU busy).
#[derive(Clone, Copy, PartialEq)]
enum Pass {
    Idle(Duration),
    AboveRequest,
}

/// Makes room for `bytes` on the GPU `uuid` for process `pid`'s job: asks the processes of other
/// jobs above their request, idle longest first, to sleep if idle for `how.idle`; if that is
/// not enough and the job stays within its request with `bytes` more, asks them to sleep now,
/// and has the driver checkpoint each that does not (`how.checkpoint`).
fn decide(pid: u32, uuid: &[u8; 16], bytes: u64, how: How) -> String {
    let Some(asker) = job_of_pid(pid) else {
        return "refused the asking process runs in no job".into();
    };
    if !matches!(read_share(Path::new(JOBS_DIR), &asker), Ok(Some(s)) if s.request.is_some()) {
        return format!("refused job {asker} is not an overcommitted job");
    }
    // Each process's last activity, as its page says (0: not said), for the order.
    let active: BTreeMap<u32, u64> = cudapool::report::pages::live(true, None)
        .0
        .into_iter()
        .filter(|s| s.pid != 0)
        .map(|s| {
            let at = s
                .devices
                .iter()
                .map(|d| d.stats.active_ns)
                .max()
                .unwrap_or(0);
            (s.pid, at)
        })
        .collect();
    let mut freed = 0u64;
    for pass in [Pass::Idle(how.idle), Pass::AboveRequest] {
        let jobs = jobs_on(uuid);
        if pass == Pass::AboveRequest {
            // The asker's own figures, read now: within its request with `bytes` more.
            let mine = jobs.get(&asker).map_or(0, Held::bytes);
            let request = jobs.get(&asker).map(|h| h.request).or_else(|| {
                read_share(Path::new(JOBS_DIR), &asker)
                    .ok()
                    .flatten()
                    .and_then(|s| s.request)
            });
            if freed >= bytes || request.is_none_or(|r| mine.saturating_add(bytes) > r) {
                break;
            }
        }
        let mut asked: Vec<(u64, u32, String)> = jobs
            .iter()
            .filter(|(job, h)| **job != asker && h.bytes() > h.request)
            .flat_map(|(job, h)| {
                h.procs
                    .iter()
                    .map(|&(p, _)| (active.get(&p).copied().unwrap_or(0), p, job.clone()))
            })
            .collect();
        asked.sort();
        for (_, p, job) in asked {
            if freed >= bytes {
                break;
            }
            // Never a job at or under its request: its figures read again before each.
            if jobs_on(uuid)
                .get(&job)
                .is_none_or(|h| h.bytes() <= h.request)
            {
                continue;
            }
            let given = match ask(p, &job, pid, &asker, pass) {
                Asked::Moved(device) => device,
                Asked::CouldNot if pass == Pass::AboveRequest && how.checkpoint => {
                    checkpoint(p, &job, uuid, pid, &asker)
                }
                Asked::CouldNot if pass == Pass::AboveRequest => {
                    eprintln!(
                        "cudapool arbiter: job {job} (pid {p}) keeps its GPU memory above its request (checkpoint=no)"
                    );
                    0
                }
                _ => 0,
            };
            freed = freed.saturating_add(given);
        }
    }
    if freed == 0 {
        eprintln!(
            "cudapool arbiter: no room made for job {asker} (pid {pid}, {bytes} bytes): no other job idle above its request"
        );
    }
    format!("freed {freed}")
}

/// What came of asking a process to sleep.
enum Asked {
    /// It slept: the device bytes it gave back.
    Moved(u64),
    /// It stayed awake for a reason it may have (busy within `sleep_idle`, asleep already).
    Stayed,
    /// It did not sleep and gave no such reason: no page, no answer, a refusal.
    CouldNot,
}

/// Asks process `p` of `job` to sleep for process `pid` of `asker` (in `pass`) and says what
/// came of it in one line.
fn ask(p: u32, job: &str, pid: u32, asker: &str, pass: Pass) -> Asked {
    let (idle, how) = match pass {
        Pass::Idle(idle) => (idle, ""),
        Pass::AboveRequest => (
            Duration::ZERO,
            ", busy above its request, for a job within its own",
        ),
    };
    match ask_sleep_if_idle(p, idle, ANSWER) {
        Ok(Some(SleepAnswer::Moved { device, .. })) => {
            eprintln!(
                "cudapool arbiter: job {job} (pid {p}) put to sleep for job {asker} (pid {pid}){how}: {device} bytes given back"
            );
            Asked::Moved(device)
        }
        Ok(Some(other)) => {
            let (why, asked) = match other {
                SleepAnswer::Refused { code, .. }
                    if code == cudapool::base::cu::CUDA_ERROR_NOT_READY =>
                {
                    (
                        "busy (device work within sleep_idle)".to_string(),
                        Asked::Stayed,
                    )
                }
                SleepAnswer::Refused { code, .. } => {
                    (format!("refused (error {code})"), Asked::CouldNot)
                }
                SleepAnswer::Already => ("already asleep".to_string(), Asked::Stayed),
                _ => ("no readable answer".to_string(), Asked::CouldNot),
            };
            eprintln!("cudapool arbiter: job {job} (pid {p}) did not sleep for job {asker}: {why}");
            asked
        }
        Ok(None) => Asked::CouldNot,
        Err(e) => {
            eprintln!("cudapool arbiter: job {job} (pid {p}): {e}");
            Asked::CouldNot
        }
    }
}

/// Process `p` of `job`, above its request, did not put itself to sleep for process `pid` of
/// `asker`, within its own: the driver checkpoints it (its CUDA calls wait, its device memory
/// goes to its host memory) where its host memory can take what it holds, and it is restored
/// when its GPU has room (`checkpointed`). Returns the bytes it gave back, each outcome said
/// in one line.
fn checkpoint(p: u32, job: &str, uuid: &[u8; 16], pid: u32, asker: &str) -> u64 {
    let said = |what: String| eprintln!("cudapool arbiter: job {job} (pid {p}) {what}");
    let Some(held) = cudapool::driver::nvml::process_used(uuid, p).filter(|&b| b > 0) else {
        return 0;
    };
    let c = match super::checkpoint::checkpointer() {
        Ok(c) => c,
        Err(e) => {
            said(format!("keeps {held} bytes above its request: {e}"));
            return 0;
        }
    };
    if let Some(room) = cudapool::base::host_room::of_pid(p).filter(|r| r.bytes < held) {
        said(format!(
            "keeps {held} bytes above its request: its host memory has room for {} ({}), and a checkpoint there would have the kernel kill it",
            room.bytes, room.by
        ));
        return 0;
    }
    let Some(start) = super::checkpointed::start_time(p) else {
        return 0;
    };
    let t = std::time::Instant::now();
    match c.suspend(p, LOCK_WITHIN) {
        Ok(()) => {
            said(format!(
                "did not put itself to sleep for job {asker} (pid {pid}): checkpointed by the driver in {:.2} s, {held} bytes given back",
                t.elapsed().as_secs_f64()
            ));
            super::checkpointed::add(super::checkpointed::Frozen {
                pid: p,
                start,
                uuid: *uuid,
                bytes: held,
                job: job.to_string(),
                since: super::checkpointed::now_s(),
            });
            held
        }
        Err(e) => {
            said(format!("keeps {held} bytes above its request: {e}"));
            0
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_request_is_one_strict_line() {
        let hex = "00112233445566778899aabbccddeeff";
        let (uuid, bytes) = super::parse(&format!("room {hex} 4096\n")).unwrap();
        assert_eq!((uuid[0], uuid[15], bytes), (0x00, 0xff, 4096));
        for bad in [
            "room".to_string(),
            format!("room {hex}"),
            format!("room {hex} -1"),
            format!("room {hex} 1 2"),
            format!("sleep {hex} 1"),
            "room 0011 1".to_string(),
            format!("room {} 1", "zz".repeat(16)),
        ] {
            assert_eq!(super::parse(&bad), None, "{bad}");
        }
    }
}
