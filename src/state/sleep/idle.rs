//! The group's side of sleep (`CUDAPOOL_SLEEP_IDLE`, `CUDAPOOL_MEMORY_REQUEST`): when this
//! process was last active, as its group's thread publishes it, and a sleep another member
//! asked for, which happens only if the process is idle and above its request.

use super::{Shim, DRAIN_TIMEOUT};
use crate::base::config::LogLevel::{Info, Warn};
use crate::base::log::fmt_bytes;
use crate::base::sync::lock;
use crate::log_at;
use crate::pool::queues;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// How long a process root's arbiter put to sleep busy (above its request, for a job within its
/// own) holds back a wake its own calls ask for: the allocation of the job it slept for, made
/// again at the arbiter's answer, comes first (a busy process would otherwise wake at once and
/// take the room back before the asker's retry, which on a loaded machine took over 2 s).
pub const ARBITER_HOLD: Duration = Duration::from_secs(10);

/// Until when (ns since the epoch) a wake for the program's calls is held: `u64::MAX` while a
/// busy sleep for root's arbiter is under way, [`ARBITER_HOLD`] after it once done, 0 when none.
static HOLD_UNTIL_NS: AtomicU64 = AtomicU64::new(0);

impl Shim {
    /// Before a call of the program wakes the process (a sleep under way has ended: the caller
    /// waited for its turn): if root's arbiter put it to sleep busy less than [`ARBITER_HOLD`]
    /// ago, waits out the rest, at most twice that in all (`cudapool wake` is not held).
    pub(super) fn hold_after_arbiter(&self) {
        let started = std::time::Instant::now();
        while super::cause().0 == super::Cause::Arbiter
            && now_ns() < HOLD_UNTIL_NS.load(Relaxed)
            && started.elapsed() < 2 * ARBITER_HOLD
        {
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// When the process last issued device work or allocated (ns since the epoch), as seen
    /// by the calls of this function: the count of such calls moved since the last one, or not.
    /// Called at least once a second by the group's thread.
    pub fn last_active_ns(&self) -> u64 {
        let allocs = self
            .budgets
            .seen()
            .into_iter()
            .map(|d| self.budget(d).stats(0).alloc_calls)
            .fold(0, u64::wrapping_add);
        let calls = queues::work_calls().wrapping_add(allocs);
        let mut seen = lock(&self.sleep.activity);
        if seen.1 == 0 || seen.0 != calls {
            *seen = (calls, now_ns());
        }
        seen.1
    }

    /// When the process was last seen active, as [`last_active_ns`](Self::last_active_ns) last
    /// found it (0: never looked), without looking again.
    pub fn active_seen_ns(&self) -> u64 {
        lock(&self.sleep.activity).1
    }

    /// Root's arbiter asked, for another job on an overcommitted GPU (`cudapool slurm
    /// arbiter`, which judged the job to hold more than its request): sleeps if the process has
    /// done no device work for `idle`.
    pub fn sleep_if_idle_for_another_job(
        &self,
        idle: Duration,
    ) -> Result<super::Moved, super::Refused> {
        let quiet = now_ns().saturating_sub(self.last_active_ns());
        if quiet < idle.as_nanos() as u64 {
            return Err(super::Refused {
                code: crate::base::cu::CUDA_ERROR_NOT_READY,
                why: format!(
                    "busy: its last device work was {:.1} s ago",
                    quiet as f64 / 1e9
                ),
            });
        }
        // Asked busy (the arbiter's second pass): the asker's retry comes first. Held from
        // before the sleep, which a call of the program waits out and would wake from at once.
        let busy = idle.is_zero();
        if busy {
            HOLD_UNTIL_NS.store(u64::MAX, Relaxed);
        }
        let moved = self.sleep(-1, DRAIN_TIMEOUT, super::Cause::Arbiter);
        if busy {
            let until = match moved {
                Ok(_) => now_ns().saturating_add(ARBITER_HOLD.as_nanos() as u64),
                Err(_) => 0,
            };
            HOLD_UNTIL_NS.store(until, Relaxed);
        }
        let moved = moved?;
        log_at!(
            Info,
            "put to sleep by root's arbiter for another job on the GPU (idle for {:.1} s): {} given back",
            quiet as f64 / 1e9,
            fmt_bytes(moved.device_bytes)
        );
        Ok(moved)
    }

    /// Another member asked: sleeps on the GPU `uuid` if the process has done no device work
    /// for `idle` and holds more there than its `CUDAPOOL_MEMORY_REQUEST`. The device bytes it
    /// gave back.
    pub(crate) fn sleep_if_idle(&self, uuid: &[u8; 16], idle: Duration) -> u64 {
        let Some(dev) = self
            .budgets
            .seen()
            .into_iter()
            .find(|&d| self.budgets.uuid(d, self.driver).as_ref() == Some(uuid))
        else {
            return 0;
        };
        if now_ns().saturating_sub(self.last_active_ns()) < idle.as_nanos() as u64 {
            return 0;
        }
        let held = self.budget(dev).reserved();
        let total = self.driver.device_total_mem(dev).unwrap_or(u64::MAX);
        let request = self
            .config
            .sleep
            .request
            .for_device(dev as u32)
            .map_or(0, |l| l.resolve(total));
        if held <= request {
            return 0;
        }
        match self.sleep(dev, DRAIN_TIMEOUT, super::Cause::Idle) {
            Ok(m) => {
                log_at!(
                    Info,
                    "put to sleep for another member of the group (idle for {idle:?}): {} given back",
                    fmt_bytes(m.device_bytes)
                );
                m.device_bytes
            }
            Err(refused) => {
                // The member that asked goes on to the next idle one, or to its OOM line.
                log_at!(
                    Warn,
                    "asked to sleep for another member of the group, and cannot: {}",
                    refused.why
                );
                0
            }
        }
    }
}
