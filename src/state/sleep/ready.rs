//! `CUDAPOOL_SLEEP_READY=1`: host memory made ahead of a sleep. A first sleep writes into fresh
//! anonymous pages, which the kernel zeroes as they fault: on an H200 host that bounds it near
//! 0.45 of the pinned copy's speed, while pages already there take the copy at the slots' own
//! speed (`benches/host/fresh_pages.c`, docs/benchmarks.md). So one thread of cudapool's keeps,
//! while the process is awake, host memory as large as what it holds on its GPUs (what a sleep
//! could have to copy), its pages faulted and then lent to the kernel (`MADV_FREE`: taken back
//! when memory runs short, and then made again by the copy as without the setting). The cost:
//! that much of the process's resident memory, and the faulting, on one core, in the background.

use super::Shim;
use crate::base::config::LogLevel::Debug;
use crate::base::flags::exiting;
use crate::base::log::fmt_bytes;
use crate::base::sync::lock;
use crate::log_at;
use std::sync::Once;
use std::time::Duration;

/// How often the thread looks at what the process holds.
const TICK: Duration = Duration::from_millis(500);
/// Less than this missing is not made (each piece is a mapping of its own).
const LEAST: u64 = 64 << 20;

static STARTED: Once = Once::new();

impl Shim {
    /// Starts the thread once, with the setting on.
    pub(crate) fn start_ready_thread(&self) {
        if !self.config.sleep.ready {
            return;
        }
        STARTED.call_once(|| {
            let run = || loop {
                std::thread::sleep(TICK);
                if exiting() {
                    return;
                }
                if let Some(shim) = Shim::active() {
                    shim.make_ready();
                }
            };
            let spawned = std::thread::Builder::new()
                .name("cudapool-ready".into())
                .stack_size(256 << 10)
                .spawn(run);
            if let Err(e) = spawned {
                crate::base::log::line(&format!(
                    "no thread to make host memory ready for a sleep (CUDAPOOL_SLEEP_READY): {e}"
                ));
            }
        });
    }

    /// One look: awake, makes what is missing of host memory as large as the process holds on
    /// its GPUs (less what spares and earlier pieces hold), or gives back what is beyond it.
    fn make_ready(&self) {
        if super::state() != super::State::Awake {
            return;
        }
        let held: u64 = (self.budgets.seen().into_iter())
            .map(|d| self.budget(d).reserved())
            .sum();
        let spare: u64 = lock(&self.sleep.spare).iter().map(|h| h.len as u64).sum();
        let have = self.sleep.ready_bytes() + spare;
        if held > have + LEAST {
            let want = held - have;
            if super::host_room_for(want).is_err() {
                return;
            }
            let Some(piece) = super::HostCopy::new(want.next_multiple_of(2 << 20)) else {
                return;
            };
            let t = std::time::Instant::now();
            if piece.made_ready() {
                log_at!(
                    Debug,
                    "made {} of host memory ready for a sleep in {:.3} s (CUDAPOOL_SLEEP_READY)",
                    fmt_bytes(piece.len as u64),
                    t.elapsed().as_secs_f64()
                );
                lock(&self.sleep.ready).push(piece);
            }
        } else if have > held + LEAST {
            // The process holds less than before: the largest pieces go until no more is kept
            // than it holds.
            let mut ready = lock(&self.sleep.ready);
            ready.sort_by_key(|h| h.len);
            let mut kept: u64 = ready.iter().map(|h| h.len as u64).sum::<u64>() + spare;
            while kept > held + LEAST {
                let Some(last) = ready.pop() else { break };
                kept -= last.len as u64;
            }
        }
    }
}
