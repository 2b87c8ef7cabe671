//! Giving back what nothing reuses (`CUDAPOOL_CACHE_IDLE`, docs/design.md, Giving back): one
//! thread of cudapool's, started with the first pool, ends each window of the setting for
//! every pool; a pool gives back what it cached and nothing took during the window (all of it
//! when the window saw no allocation past the threads' magazines). So an idle process holds
//! its live blocks and not much more once a window or two has passed.

use super::Shim;
use crate::base::flags::{capturing_somewhere, exiting};
use std::sync::Once;
use std::time::Duration;

/// How often the thread looks, as a share of the window: a pool gives back what nothing took
/// at most a window and this much after the last use.
const TICKS_PER_WINDOW: u32 = 4;
const SHORTEST_TICK: Duration = Duration::from_millis(10);
const LONGEST_TICK: Duration = Duration::from_millis(500);

static STARTED: Once = Once::new();

impl Shim {
    /// Starts the idle thread once, when the setting gives cached memory back after a window.
    pub(super) fn start_idle_thread(&self) {
        let Some(window) = self.config.cache_idle.window() else {
            return;
        };
        STARTED.call_once(|| {
            let tick = (window / TICKS_PER_WINDOW).clamp(SHORTEST_TICK, LONGEST_TICK);
            let run = move || loop {
                std::thread::sleep(tick);
                if exiting() {
                    return;
                }
                if let Some(shim) = Shim::active() {
                    shim.release_unused();
                }
            };
            let spawned = std::thread::Builder::new()
                .name("cudapool-idle".into())
                .stack_size(256 << 10)
                .spawn(run);
            if let Err(e) = spawned {
                crate::base::log::line(&format!(
                    "no idle thread (cached memory goes back only under pressure or when freed cold): {e}"
                ));
            }
        });
    }

    /// One tick: every context's pool ends its window if it is due and gives back what nothing
    /// took. Not while a capture is under way anywhere (the pool's waits and the driver's
    /// frees would be refused anyway), nor while the process is not awake (a sleep moves the
    /// pools' memory itself). Returns the bytes released.
    pub(crate) fn release_unused(&self) -> u64 {
        if capturing_somewhere() || super::sleep::state() != super::sleep::State::Awake {
            return 0;
        }
        let mut total = 0;
        for (ctx, cp) in self.contexts.on_device(-1) {
            // Its memory goes back through its context, only while it lives (see `clock`).
            let Some(_alive) = cp.clock.enter() else {
                continue;
            };
            let up = self.upstream(cp.device);
            let released = self.in_context(ctx, || cp.pool.release_unused(&up));
            if released > 0 {
                self.event(cp.device, "idle release", released);
                self.observe(cp.device);
                total += released;
            }
        }
        total
    }
}
