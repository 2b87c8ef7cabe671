//! Room another process is giving back: the driver refused an allocation of a Slurm job on a
//! GPU it shares, while a job suspended for it (preemption by suspend, gang scheduling) is still
//! copying its memory to the host. Slurm starts the preemptor tens of milliseconds after its
//! SIGTSTP to the preempted job (32 ms, measured with the suite's Slurm), and gives that job
//! 2 s before it stops it: an allocation made meanwhile would find the GPU still full. So such
//! a refusal waits for room, up to [`WINDOW`], polling the device's free memory. Nothing tells
//! it sooner that none is coming: a sleep copies everything first and unmaps at the end (on an
//! H200 a wait that gave up after a second without the free memory rising missed a 30 GiB
//! sleep, whose room came at 3.4 s), so a refusal no room follows costs the whole window. A wait that gave up is not made again for [`AGAIN`]:
//! a program that probes the GPU's memory by its refusals pays it once, not at every probe.
//!
//! Only in a Slurm job (the mandatory mode's job, or the TaskProlog's `slurm-<id>` group), and
//! only where NVML lists another process on the GPU (or cannot say): alone on its GPU, a job's
//! refusal is final at once, as before. A wait ends at once when the process itself begins to
//! fall asleep (its own job suspended): its sleep waits for the calls under way, and Slurm
//! freezes it 2 s after its SIGTSTP (in the suite, a job suspended a moment after its start held
//! 424 MiB through the other job's time slice, most likely frozen in such a wait).

use super::Shim;
use crate::base::config::LogLevel::Info;
use crate::base::cu::CUdevice;
use crate::base::log::fmt_bytes;
use crate::log_at;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// The longest a refused allocation waits for room: Slurm's 2 s, and the unmaps at the end.
const WINDOW: Duration = Duration::from_millis(2500);
/// After a wait that gave up, none is made for this long.
const AGAIN: Duration = Duration::from_secs(5);
/// How often the free memory is read meanwhile.
const POLL: Duration = Duration::from_millis(20);

/// When the last wait gave up (ns since the first wait's start of the process, 0: never).
static GAVE_UP: AtomicU64 = AtomicU64::new(0);
/// The process's clock for [`GAVE_UP`].
static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

fn now_ns() -> u64 {
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64 + 1
}

impl Shim {
    /// The driver refused `bytes` on `dev`: room made elsewhere, by root's arbiter (an
    /// overcommitted job) or by another job giving memory back now (see the module's notes).
    /// Whether the caller should try again.
    pub(crate) fn room_made_elsewhere(&self, dev: CUdevice, bytes: u64) -> bool {
        self.ask_arbiter(dev, bytes) || self.wait_for_released(dev, bytes)
    }

    /// Waits (see the module's notes) until the device's free memory, with this process's own
    /// cache, covers `bytes`.
    fn wait_for_released(&self, dev: CUdevice, bytes: u64) -> bool {
        let slurm = self.config.job.is_some()
            || self
                .config
                .group
                .as_deref()
                .is_some_and(|g| g.starts_with("slurm-"));
        let gave_up = GAVE_UP.load(Relaxed);
        if !slurm || (gave_up != 0 && now_ns() - gave_up < AGAIN.as_nanos() as u64) {
            return false;
        }
        // The driver's free memory is the current context's device's: `dev` is another one
        // only for `cuMemCreate` naming its device, which then does not wait.
        if self.driver.current_device().ok() != Some(dev) {
            return false;
        }
        let me = std::process::id();
        let alone = self
            .budgets
            .uuid(dev, self.driver)
            .and_then(|u| crate::driver::nvml::processes(&u))
            .is_some_and(|list| list.iter().all(|&(pid, _)| pid == me));
        if alone {
            return false;
        }
        // Each reading holds its own permission (none during a capture: then no wait).
        let free = || {
            let calls = crate::base::flags::own_calls()?;
            self.driver.own(&calls).mem_get_info().ok().map(|(f, _)| f)
        };
        let start = Instant::now();
        loop {
            let Some(room) = free() else {
                return false;
            };
            // The retry gives this process's own cache back first: it counts as room.
            if room.saturating_add(self.cached_bytes(dev)) >= bytes {
                log_at!(
                    Info,
                    "the driver refused {} on device {dev}; another process gave memory back within {:.2} s",
                    fmt_bytes(bytes),
                    start.elapsed().as_secs_f64()
                );
                return true;
            }
            if start.elapsed() >= WINDOW {
                GAVE_UP.store(now_ns(), Relaxed);
                return false;
            }
            // This process is being put to sleep (a suspend of its own job): its sleep waits
            // for the calls under way, this one included, and must end within Slurm's 2 s.
            if super::sleep::state() == super::sleep::State::FallingAsleep {
                return false;
            }
            std::thread::sleep(POLL);
        }
    }
}
