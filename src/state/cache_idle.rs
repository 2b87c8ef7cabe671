//! Giving back what nothing reuses (`CUDAPOOL_CACHE_IDLE`, docs/design.md, Giving back): one
//! thread of cudapool's, started with the first pool, looks a few times a window at each
//! device's count of allocation calls; once a device has seen none for a whole window, its
//! pools give back everything they cache (a reclaim: fences waited for, the device idle before
//! mapped memory goes). So an idle process holds its live blocks and not much more, a window
//! and a tick after its last allocation.

use super::Shim;
use crate::base::cu::CUdevice;
use crate::base::flags::{capturing_somewhere, exiting};
use std::sync::Once;
use std::time::{Duration, Instant};

/// How often the thread looks, as a share of the window.
const TICKS_PER_WINDOW: u32 = 4;
const SHORTEST_TICK: Duration = Duration::from_millis(10);
const LONGEST_TICK: Duration = Duration::from_millis(500);

static STARTED: Once = Once::new();

/// What the idle thread last saw of each device: its allocation calls, since when, and whether
/// its pools gave their cache back since (so an idle device is reclaimed once, not each tick).
#[derive(Default)]
struct Activity {
    seen: Vec<(CUdevice, u64, Instant, bool)>,
}

impl Activity {
    /// Whether `dev`, with `calls` allocation calls now, has seen none for `window` and was not
    /// given back since; marks it given back.
    fn quiet(&mut self, dev: CUdevice, calls: u64, window: Duration, now: Instant) -> bool {
        let Some(e) = self.seen.iter_mut().find(|e| e.0 == dev) else {
            self.seen.push((dev, calls, now, false));
            return false;
        };
        if e.1 != calls {
            *e = (dev, calls, now, false);
            return false;
        }
        if e.3 || now.duration_since(e.2) < window {
            return false;
        }
        e.3 = true;
        true
    }
}

impl Shim {
    /// Starts the idle thread once, when the setting gives cached memory back after a window.
    pub(super) fn start_idle_thread(&self) {
        let Some(window) = self.config.cache_idle.window() else {
            return;
        };
        STARTED.call_once(|| {
            let tick = (window / TICKS_PER_WINDOW).clamp(SHORTEST_TICK, LONGEST_TICK);
            let run = move || {
                let mut activity = Activity::default();
                loop {
                    std::thread::sleep(tick);
                    if exiting() {
                        return;
                    }
                    if let Some(shim) = Shim::active() {
                        shim.release_idle(&mut activity, window);
                    }
                }
            };
            let spawned = std::thread::Builder::new()
                .name("cudapool-idle".into())
                .stack_size(256 << 10)
                .spawn(run);
            if let Err(e) = spawned {
                crate::base::log::line(&format!(
                    "no idle thread (an idle process keeps its cache until pressure): {e}"
                ));
            }
        });
    }

    /// One tick: the pools of every device that saw no allocation call for `window` give
    /// their cache back, once. Not while a capture is under way anywhere (the pool's waits and
    /// the driver's frees would be refused anyway), nor while the process is not awake (a sleep
    /// moves the pools' memory itself). Returns the bytes released.
    fn release_idle(&self, activity: &mut Activity, window: Duration) -> u64 {
        if capturing_somewhere() || super::sleep::state() != super::sleep::State::Awake {
            return 0;
        }
        let now = Instant::now();
        let mut total = 0;
        for dev in self.budgets.seen() {
            let calls = self.budget(dev).alloc_calls();
            if !activity.quiet(dev, calls, window, now) || self.cached_bytes(dev) == 0 {
                continue;
            }
            let released = self.reclaim_pools(dev, "idle release");
            if released > 0 {
                self.observe(dev);
            }
            total += released;
        }
        total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_is_quiet_once_after_a_window_without_allocations() {
        let w = Duration::from_secs(1);
        let t0 = Instant::now();
        let mut a = Activity::default();
        assert!(!a.quiet(0, 5, w, t0), "first seen");
        assert!(!a.quiet(0, 5, w, t0 + w / 2));
        assert!(a.quiet(0, 5, w, t0 + w), "a window without allocations");
        assert!(!a.quiet(0, 5, w, t0 + 2 * w), "given back once");
        assert!(!a.quiet(0, 6, w, t0 + 2 * w), "an allocation");
        assert!(!a.quiet(0, 6, w, t0 + 2 * w + w / 2));
        assert!(a.quiet(0, 6, w, t0 + 3 * w));
        assert!(!a.quiet(1, 0, w, t0 + 3 * w), "another device counts alone");
    }
}
