//! The processes root's arbiter had the driver checkpoint (`checkpoint`), and their way back:
//! a process of a job above its request that did not put itself to sleep when asked (it runs
//! no cudapool, or a library that refuses) has its device memory moved to its host memory by
//! the driver, its CUDA calls waiting meanwhile; it is restored, oldest first, as soon as its
//! GPU has room for what it held (NVML's free memory), as a wake waits for room.
//!
//! **Nothing is lost to a restart.** The list is kept in root's file [`LIST`] (written whole,
//! renamed over); a restarted arbiter reads it and keeps restoring. Each entry names the
//! process by pid and start time (the kernel's, `/proc/PID/stat`), so a pid used again by
//! another process is never restored or touched.
//!
//! **The job's record.** Each checkpoint and restore is one line in the node's log (the
//! arbiter's standard error) and is counted in the job's folder of root (`<job>.d/`
//! [`RECORD`]: checkpoints, bytes, seconds), which the Epilog writes into the job's
//! `AdminComment`.

use super::checkpoint::{checkpointer, State};
use cudapool::base::job::{ledger_dir, read_small};
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Root's list of checkpointed processes (one line each).
pub const LIST: &str = "/run/cudapool/arbiter.checkpointed";
/// A job's checkpoints, in its folder of root: `checkpoints=N bytes=B seconds=S`.
pub const RECORD: &str = "arbiter";
/// Room kept free beside a restored process's bytes (the driver's own needs meanwhile).
const MARGIN: u64 = 64 << 20;
/// How often the restores are tried.
const EVERY: Duration = Duration::from_secs(1);

/// One process the driver checkpointed for the arbiter.
#[derive(Clone, Debug, PartialEq)]
pub struct Frozen {
    pub pid: u32,
    /// The process's start time (clock ticks since boot, the kernel's): with the pid, its name.
    pub start: u64,
    pub uuid: [u8; 16],
    /// What it held on the GPU when checkpointed (NVML's figure): the room its restore needs.
    pub bytes: u64,
    pub job: String,
    /// When it was checkpointed (seconds since the epoch).
    pub since: u64,
}

static FROZEN: Mutex<Vec<Frozen>> = Mutex::new(Vec::new());

/// Seconds since the epoch.
pub fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Process `pid`'s start time, from `/proc/PID/stat` (field 22, after the command's last `)`).
pub fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_ascii_whitespace().nth(19)?.parse().ok()
}

impl Frozen {
    fn line(&self) -> String {
        let hex: String = self.uuid.iter().map(|b| format!("{b:02x}")).collect();
        format!(
            "{} {} {hex} {} {} {}\n",
            self.pid, self.start, self.bytes, self.job, self.since
        )
    }

    fn parse(line: &str) -> Option<Frozen> {
        let w: Vec<&str> = line.split_ascii_whitespace().collect();
        let [pid, start, hex, bytes, job, since] = w[..] else {
            return None;
        };
        let mut uuid = [0u8; 16];
        if hex.len() != 32 {
            return None;
        }
        for (i, b) in uuid.iter_mut().enumerate() {
            *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        let job = super::jobstat::job_id(job).ok()?.to_string();
        Some(Frozen {
            pid: pid.parse().ok()?,
            start: start.parse().ok()?,
            uuid,
            bytes: bytes.parse().ok()?,
            job,
            since: since.parse().ok()?,
        })
    }

    /// Whether the process is still the one checkpointed (same pid, same start).
    fn alive(&self) -> bool {
        start_time(self.pid) == Some(self.start)
    }
}

/// Writes the list whole into root's file (a new file renamed over the old).
fn save(list: &[Frozen]) {
    let text: String = list.iter().map(Frozen::line).collect();
    if let Err(e) = write_root_file(Path::new(LIST), &text) {
        eprintln!(
            "cudapool arbiter: {LIST}: {e} (a restart would not find the checkpointed processes)"
        );
    }
}

/// `text` into `path` (in a folder of root's), through a new file renamed over it. Not
/// `base::outfile::write`: that keeps a replaced file's mode, or takes 0666 less the umask, and
/// these files are read only if nobody but root may write them: here 0644 at most, whatever
/// the umask.
fn write_root_file(path: &Path, text: &str) -> Result<(), String> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let tmp = path.with_extension(format!("new.{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)
        .map_err(|e| e.to_string())?;
    f.write_all(text.as_bytes()).map_err(|e| e.to_string())?;
    std::fs::rename(&tmp, path).map_err(|e| e.to_string())
}

/// Root's list as it stands (`cudapool stat` as root): the processes the driver holds
/// checkpointed for other jobs, those still the process that was checkpointed.
pub fn listed() -> Vec<Frozen> {
    read_small(Path::new(LIST), 1 << 20, true)
        .ok()
        .flatten()
        .unwrap_or_default()
        .lines()
        .filter_map(Frozen::parse)
        .filter(Frozen::alive)
        .collect()
}

/// One line of `cudapool stat` for a process in root's list.
pub fn stat_line(f: &Frozen) -> String {
    format!(
        "pid {}: checkpointed by the driver for another job (root's arbiter; it did not sleep when asked): job {}, {} moved to its host memory {} s ago; restored when its GPU has room\n",
        f.pid,
        f.job,
        cudapool::base::log::fmt_bytes(f.bytes),
        now_s().saturating_sub(f.since)
    )
}

/// Reads root's list at the arbiter's start: the processes still checkpointed or locked are
/// taken up again; the rest (gone, or a pid now another process's) are dropped.
pub fn load() {
    let text = match read_small(Path::new(LIST), 1 << 20, true) {
        Ok(t) => t.unwrap_or_default(),
        Err(e) => {
            eprintln!("cudapool arbiter: {e}: not read");
            return;
        }
    };
    let mut list = cudapool::base::sync::lock(&FROZEN);
    for f in text.lines().filter_map(Frozen::parse) {
        let state = checkpointer().ok().and_then(|c| c.state(f.pid).ok());
        if f.alive() && matches!(state, Some(State::Checkpointed | State::Locked)) {
            eprintln!(
                "cudapool arbiter: job {} (pid {}) is still checkpointed: restored when its GPU has room",
                f.job, f.pid
            );
            list.push(f);
        }
    }
    save(&list);
}

/// Adds a process the driver just checkpointed, and counts it in its job's record.
pub fn add(f: Frozen) {
    count(&f.job, 1, f.bytes, 0);
    let mut list = cudapool::base::sync::lock(&FROZEN);
    // Restored meanwhile by its own user (the driver lets a user checkpoint and restore their
    // own processes) and checkpointed again: one entry.
    list.retain(|x| !(x.pid == f.pid && x.start == f.start));
    list.push(f);
    save(&list);
}

/// Adds to job `job`'s record in its folder of root (left alone when the folder is gone: the
/// job ended, its Epilog ran).
fn count(job: &str, checkpoints: u64, bytes: u64, seconds: u64) {
    let dir = ledger_dir(job);
    if !dir.is_dir() {
        return;
    }
    let path = dir.join(RECORD);
    let [mut n, mut b, mut s] = read_record(&path).unwrap_or_default();
    n += checkpoints;
    b += bytes;
    s += seconds;
    if let Err(e) = write_root_file(&path, &format!("checkpoints={n} bytes={b} seconds={s}\n")) {
        eprintln!("cudapool arbiter: job {job}'s record: {e}");
    }
}

/// A job's record: [checkpoints, bytes, seconds]; `None` when it has none.
pub fn read_record(path: &Path) -> Option<[u64; 3]> {
    let text = read_small(path, 256, true).ok()??;
    let mut out = [0u64; 3];
    for w in text.split_ascii_whitespace() {
        let (k, v) = w.split_once('=')?;
        let i = ["checkpoints", "bytes", "seconds"]
            .iter()
            .position(|x| *x == k)?;
        out[i] = v.parse().ok()?;
    }
    Some(out)
}

/// Job `job`'s record, read by the Epilog from its folder of root.
pub fn job_record(job: &str) -> Option<[u64; 3]> {
    read_record(&ledger_dir(job).join(RECORD)).filter(|r| r[0] > 0)
}

/// Tries the restores every second, for ever (a thread of the arbiter's): oldest first, each
/// when NVML says its GPU has its bytes free and more; one decision at a time with the
/// arbiter's (`deciding`), so the room a restore takes is not counted for an asker meanwhile.
pub fn restore_forever(deciding: &'static Mutex<()>) {
    loop {
        std::thread::sleep(EVERY);
        if cudapool::base::sync::lock(&FROZEN).is_empty() {
            continue;
        }
        let _one = cudapool::base::sync::lock(deciding);
        restore_some();
    }
}

fn restore_some() {
    let mut list = cudapool::base::sync::lock(&FROZEN);
    let before = list.len();
    list.sort_by_key(|f| f.since);
    let mut kept = Vec::new();
    for f in list.drain(..) {
        let held = now_s().saturating_sub(f.since);
        if !f.alive() {
            eprintln!(
                "cudapool arbiter: job {} (pid {}) ended while checkpointed ({held} s)",
                f.job, f.pid
            );
            count(&f.job, 0, 0, held);
            continue;
        }
        let free = cudapool::driver::nvml::free(&f.uuid).unwrap_or(0);
        if free < f.bytes.saturating_add(MARGIN) {
            kept.push(f);
            continue;
        }
        let Ok(c) = checkpointer() else {
            kept.push(f);
            continue;
        };
        match c.resume(f.pid) {
            Ok(()) => {
                eprintln!(
                    "cudapool arbiter: job {} (pid {}) restored by the driver after {held} s: {} bytes back on its GPU",
                    f.job, f.pid, f.bytes
                );
                count(&f.job, 0, 0, held);
            }
            Err(e) => match c.state(f.pid) {
                Ok(State::Running) => {
                    eprintln!(
                        "cudapool arbiter: job {} (pid {}) is running again, restored by someone else",
                        f.job, f.pid
                    );
                    count(&f.job, 0, 0, held);
                }
                Ok(State::Failed) => {
                    eprintln!(
                        "cudapool arbiter: job {} (pid {}): the driver's restore failed for good: {e}",
                        f.job, f.pid
                    );
                    count(&f.job, 0, 0, held);
                }
                _ => kept.push(f),
            },
        }
    }
    *list = kept;
    if list.len() != before {
        save(&list);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_reads_back_and_a_bad_one_is_none() {
        let f = Frozen {
            pid: 42,
            start: 777,
            uuid: [0xab; 16],
            bytes: 600 << 20,
            job: "4300001".into(),
            since: 1_700_000_000,
        };
        assert_eq!(Frozen::parse(&f.line()), Some(f.clone()));
        for bad in [
            "42 777 abab 1 4300001 1",
            "42 777 abababababababababababababababab 1 ../x 1",
            "x 777 abababababababababababababababab 1 4300001 1",
            "42 777 abababababababababababababababab 1 4300001",
        ] {
            assert_eq!(Frozen::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_start_time_is_read_past_a_command_with_spaces_and_parens() {
        let me = std::process::id();
        let t = start_time(me).expect("this process's start time");
        assert!(t > 0);
        assert_eq!(start_time(me), Some(t));
        assert_eq!(start_time(u32::MAX), None);
    }
}
