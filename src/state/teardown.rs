//! Contexts that die (their memory goes with them, the driver is not called) and giving
//! cached memory back (before an out-of-memory answer, or when the program asks).

use super::{Origin, Shim, View};
use crate::base::config::LogLevel::Info;
use crate::base::cu::*;
use crate::driver::Inside;
use crate::log_at;

impl Shim {
    /// Gives back cached memory of the pool of `ctx` until `need` bytes went back
    /// (`u64::MAX`: all of it); returns the bytes released.
    pub(crate) fn reclaim_context(&self, ctx: usize, dev: CUdevice, need: u64) -> u64 {
        let Some(cp) = self.contexts.get(ctx) else {
            return 0;
        };
        // Its segments go back to the driver only while the context lives (see `clock`).
        let Some(_alive) = cp.clock.enter() else {
            return 0;
        };
        cp.pool.trim(&self.upstream(dev), need)
    }

    /// Gives back the cached memory of every context on `device` (-1: every device), each with
    /// its context pushed while its pool waits for fences and frees (the C API's reclaim).
    pub fn reclaim_device(&self, device: CUdevice) -> u64 {
        self.reclaim_pools(device, "reclaim") + self.trim_graph_memory(device)
    }

    /// Gives back the cached memory of every context's pool on `device` (-1: every device),
    /// each with its context pushed while its pool waits for fences and frees; each release is
    /// told to the observer as `event`. Returns the bytes released.
    pub(crate) fn reclaim_pools(&self, device: CUdevice, event: &'static str) -> u64 {
        self.contexts
            .on_device(device)
            .into_iter()
            .map(|(ctx, cp)| {
                // Another thread of the program may be destroying this context: it is pushed,
                // and its fences waited for, only inside a use of it (see `clock`).
                let Some(_alive) = cp.clock.enter() else {
                    return 0;
                };
                let up = self.upstream(cp.device);
                let released = self.in_context(ctx, || cp.pool.reclaim(&up));
                self.event(cp.device, event, released);
                released
            })
            .sum()
    }

    /// Runs `end`, the program's call that may destroy the context `ctx` (`cuCtxDestroy`, a
    /// primary context's reset or release), while no thread of cudapool passes `ctx`, its
    /// streams or its events to the driver; `end` returns the driver's answer and whether the
    /// context is gone. If it is, every later use of it in cudapool finds it ended, and its
    /// records are dropped ([`context_gone`](Self::context_gone)).
    pub fn context_ending(&self, ctx: usize, end: impl FnOnce() -> (CUresult, bool)) -> CUresult {
        // A context's end is work: a sleep or wake under way (which may copy in this very
        // context) finishes first, and a sleeping process wakes first (its memory is back
        // before the context that held some of it goes).
        let _entered = match super::sleep::enter_work() {
            Ok(e) => e,
            Err(e) => return e,
        };
        let mut end = Some(end);
        let mut run = || (end.take().expect("the call is made once"))();
        let (r, gone) = match self.contexts.get(ctx) {
            Some(cp) => cp
                .clock
                .ending(|| {
                    let (r, gone) = run();
                    ((r, gone), gone)
                })
                // Already ended (a context of the same address died before): the driver's
                // call to answer, without the exclusive section.
                .unwrap_or_else(&mut run),
            None => run(),
        };
        if gone {
            self.context_gone(ctx);
        }
        r
    }

    /// The context `ctx` is gone (destroyed or reset): its memory went with it. Drop every
    /// record of it without calling the driver (docs/design.md, trap 5).
    pub fn context_gone(&self, ctx: usize) {
        self.overhead_context_gone(ctx);
        let cp = self.contexts.remove(ctx);
        let mut dropped = 0u64;
        let mut driver_pools = Vec::new();
        self.live.drop_context(ctx, |l| {
            let budget = self.budget(l.device);
            budget.on_release(l.bytes(), Some(l.holder));
            match l.origin {
                Origin::Counted => budget.on_segments_dropped(1, l.size),
                Origin::DriverPool(pool) => driver_pools.push((pool, l.size)),
                Origin::Pool | Origin::Graph => {}
            }
            dropped += 1;
        });
        if let Some(cp) = cp {
            if self.tools_see_blocks() {
                for s in cp.pool.segments() {
                    crate::driver::nvtx::segment_removed(s.ptr);
                }
            }
            let gone = cp.pool.forget_all();
            self.budget(cp.device)
                .on_segments_dropped(gone.segments, gone.bytes);
            // Mapped memory and reserved address space are the process's, not the context's:
            // they go back now (the context's work is over, nothing uses them).
            if let Some(arena) = gone.arena.filter(|_| !crate::base::flags::exiting()) {
                let release = self.driver.release_inside(Inside::ContextEnd);
                for (at, len) in arena.mapped {
                    // Exports of these chunks go first: their descriptors would keep the memory.
                    let _ = super::ipc_mapped::while_unmapping(at, len, || {
                        release.vmm_unmap(at, len, len)
                    });
                }
                let _ = release.vmm_unreserve(arena.range.0, arena.range.1);
            }
        }
        self.counted_context_gone(ctx);
        for (pool, size) in driver_pools {
            self.driver_pool_freed(pool, size);
        }
        if dropped > 0 {
            log_at!(
                Info,
                "context {ctx:#x} gone with {dropped} live allocations"
            );
        }
        for dev in self.devices_seen() {
            self.observe(dev);
        }
    }

    /// The primary context of `dev` if it is active (its address), before a reset or release.
    pub fn primary_context(&self, dev: CUdevice) -> Option<usize> {
        self.driver.active_primary_context(dev).map(|c| c as usize)
    }
}
