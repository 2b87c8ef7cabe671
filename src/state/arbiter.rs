//! A job on a node whose GPU memory is overcommitted (its share file names a request) asks
//! root's arbiter for room when the driver refuses it (`cudapool slurm arbiter`,
//! `base::job::ARBITER_SOCKET`): one line, `room <GPU UUID> <bytes>`; the arbiter puts other
//! jobs idle above their request to sleep and answers `freed <bytes>`. The socket is used only
//! where it is root's, in root's folder: no user can stand in for the arbiter.

use super::Shim;
use crate::base::config::LogLevel::{Info, Warn};
use crate::base::cu::CUdevice;
use crate::base::job::ARBITER_SOCKET;
use crate::base::log::fmt_bytes;
use crate::log_at;
use std::io::{BufRead as _, Write as _};
use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
use std::time::{Duration, Instant};

/// The longest the arbiter's answer is waited for (it waits for each process it asks to
/// drain its work and copy its memory to the host).
const ANSWER: Duration = Duration::from_secs(60);
/// While a wake waits for room, the arbiter is asked at most this often.
pub(super) const ASK_EVERY: Duration = Duration::from_secs(1);

impl Shim {
    /// The driver refused `bytes` on `dev`: in an overcommitted job, asks root's arbiter to
    /// make room. Whether it gave any back (the caller tries again). Not asked when the
    /// process's own limit or its job's share is what stands in the way: the room the arbiter
    /// makes is for jobs within their limits, and other jobs sleep for nothing otherwise.
    pub(crate) fn ask_arbiter(&self, dev: CUdevice, bytes: u64) -> bool {
        if !self.config.job_overcommitted {
            return false;
        }
        let budget = self.budget(dev);
        let within = budget.hard_limit().room(budget.reserved()) >= bytes
            && budget.shared().is_none_or(|s| s.room() >= bytes);
        if !within {
            return false;
        }
        let Some(uuid) = self.budgets.uuid(dev, self.driver) else {
            return false;
        };
        let path = std::path::Path::new(ARBITER_SOCKET);
        let root_socket = std::fs::symlink_metadata(path)
            .is_ok_and(|m| m.file_type().is_socket() && m.uid() == 0);
        let started = Instant::now();
        let answer = root_socket
            .then(|| std::os::unix::net::UnixStream::connect(path).ok())
            .flatten()
            .and_then(|mut s| {
                s.set_write_timeout(Some(Duration::from_secs(1))).ok()?;
                s.set_read_timeout(Some(ANSWER)).ok()?;
                let hex: String = uuid.iter().map(|b| format!("{b:02x}")).collect();
                writeln!(s, "room {hex} {bytes}").ok()?;
                let mut line = String::new();
                std::io::BufReader::new(std::io::Read::take(&s, 128))
                    .read_line(&mut line)
                    .ok()?;
                Some(line)
            });
        let Some(answer) = answer else {
            static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
            if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
                log_at!(
                    Warn,
                    "the driver refused {} on device {dev} and root's arbiter could not be asked ({ARBITER_SOCKET}: not running?); no other job is put to sleep for this one",
                    fmt_bytes(bytes)
                );
            }
            return false;
        };
        let freed: u64 = answer
            .trim()
            .strip_prefix("freed ")
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        if freed > 0 {
            log_at!(
                Info,
                "the driver refused {} on device {dev}: root's arbiter had other jobs give memory back for it (put to sleep or checkpointed), {} given back in {:.2} s",
                fmt_bytes(bytes),
                fmt_bytes(freed),
                started.elapsed().as_secs_f64()
            );
        } else {
            log_at!(
                Info,
                "the driver refused {} on device {dev}: root's arbiter made no room (no other job above its request gave memory back)",
                fmt_bytes(bytes)
            );
        }
        freed > 0
    }
}
