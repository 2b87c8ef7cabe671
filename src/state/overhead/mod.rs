//! Device memory the driver takes for the process besides its allocations (issue 52), charged
//! against the limit and the group like any allocation and shown as its own figure
//! ("overhead"):
//!
//! - `cuCtxSetLimit`: the per-thread stack, for every thread slot of the device (the driver
//!   takes `(new - default) x SMs x threads per SM` at once: 64 KiB is 16.6 GB on an H100), the
//!   device heap (`CU_LIMIT_MALLOC_HEAP_SIZE`, taken when a kernel first mallocs: charged when
//!   it is set, before it can be taken) and the printf FIFO. Known before the call: charged
//!   first, the call refused when it does not fit.
//! - module and library loads (`cuModuleLoad*`, `cuLibraryLoad*`): their device globals. The
//!   driver does not say their size: it is measured before and after the call, less what
//!   cudapool itself took from the driver meanwhile, by the process's own footprint as NVML
//!   counts it where NVML lists the process (the device's free memory moves with every other
//!   tenant's allocations: beside a busy neighbour, loads were charged nothing or too much),
//!   else by the device's free memory; charged after, and the module unloaded again when it
//!   does not fit.
//! - a context beyond the primary one (`cuCtxCreate*`): measured the same way, destroyed again
//!   when it does not fit.
//!
//! What is charged goes back when the driver gives it back: a limit lowered, a module or library
//! unloaded, a context destroyed or reset (everything charged in it).
//!
//! Invariant: every entry of `held` is in its device's budget as overhead, once.

mod held;
use super::Shim;
use crate::base::cu::*;
pub use held::{asked_by, asking, Overhead, Taker};
use held::{Held, ASKING};
use std::ffi::c_int;

const STACK: c_int = 0;
const PRINTF_FIFO: c_int = 1;
const MALLOC_HEAP: c_int = 2;
const ATTR_SMS: c_int = 16;
const ATTR_THREADS_PER_SM: c_int = 39;
/// The limits' defaults on every GPU so far (part of every context's own footprint).
const DEFAULTS: [u64; 3] = [1024, 1 << 20, 8 << 20];

/// A reading of what the driver has taken, before or after a load (`Shim::taken_so_far`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Taken {
    /// The process's bytes on the device by NVML's count; `None` where NVML is absent or does not
    /// list this process (another pid namespace).
    own: Option<u64>,
    /// The device's free bytes.
    free: Option<u64>,
}

impl Taken {
    /// What was taken between `self` and `after`: the process's own growth where NVML gave both
    /// readings, else the fall of the device's free memory; `None` where neither was read.
    fn grew_by(&self, after: &Taken) -> Option<u64> {
        match (self.own, after.own, self.free, after.free) {
            (Some(a), Some(b), _, _) => Some(b.saturating_sub(a)),
            (_, _, Some(a), Some(b)) => Some(a.saturating_sub(b)),
            _ => None,
        }
    }
}

fn limit_name(which: c_int) -> &'static str {
    match which {
        STACK => "cuCtxSetLimit(CU_LIMIT_STACK_SIZE)",
        PRINTF_FIFO => "cuCtxSetLimit(CU_LIMIT_PRINTF_FIFO_SIZE)",
        _ => "cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE)",
    }
}

impl Shim {
    /// Charges `bytes` on `dev` as overhead asked by `what`, after the reclaim and borrow steps
    /// every allocation gets; `Err` is the out-of-memory answer, said in one line.
    fn charge_overhead(
        &self,
        dev: CUdevice,
        bytes: u64,
        what: &'static str,
    ) -> Result<(), CUresult> {
        ASKING.with(|a| a.set(Some(what)));
        let r = self.charge_counted(dev, bytes);
        ASKING.with(|a| a.set(None));
        r?;
        self.budget(dev).on_overhead(bytes);
        Ok(())
    }

    fn give_overhead_back(&self, h: &Held) {
        self.budget(h.dev).on_overhead_gone(h.bytes);
        self.observe(h.dev);
    }

    fn hold(&self, taker: Taker, ctx: usize, dev: CUdevice, bytes: u64) {
        let mut held = crate::base::sync::lock(&self.overhead.held);
        held.push(Held {
            taker,
            ctx,
            dev,
            bytes,
        });
        drop(held);
        self.observe(dev);
    }

    /// The current context and its device, when the driver says.
    fn here(&self) -> Option<(usize, CUdevice)> {
        let ctx = self.driver.current_context().ok()??;
        let dev = self.driver.current_device().ok()?;
        Some((ctx as usize, dev))
    }

    /// `cuCtxSetLimit(which, value)`: the stack, heap and printf FIFO charged before the call
    /// (see the module's notes); any other limit goes through.
    pub fn set_limit(
        &self,
        which: c_int,
        value: usize,
        real: impl FnOnce() -> CUresult,
    ) -> CUresult {
        if !(STACK..=MALLOC_HEAP).contains(&which) {
            return real();
        }
        let Some((ctx, dev)) = self.here() else {
            return real();
        };
        let _one_at_a_time = crate::base::sync::lock(&self.overhead.limits);
        let per = if which == STACK {
            let sms = self
                .driver
                .device_attribute(ATTR_SMS, dev)
                .unwrap_or(0)
                .max(0) as u64;
            let threads = self
                .driver
                .device_attribute(ATTR_THREADS_PER_SM, dev)
                .unwrap_or(0)
                .max(0) as u64;
            sms * threads
        } else {
            1
        };
        let default = DEFAULTS[which as usize];
        let want = (value as u64).saturating_sub(default).saturating_mul(per);
        let had = self.held_by(Taker::Limit(which), ctx);
        if want > had {
            if let Err(e) = self.charge_overhead(dev, want - had, limit_name(which)) {
                return e;
            }
        }
        let r = real();
        let keep = if r == CUDA_SUCCESS { want } else { had };
        self.replace_held(Taker::Limit(which), ctx, dev, keep, want.max(had));
        r
    }

    /// Bytes held for `taker` in context `ctx`.
    fn held_by(&self, taker: Taker, ctx: usize) -> u64 {
        crate::base::sync::lock(&self.overhead.held)
            .iter()
            .filter(|h| h.taker == taker && h.ctx == ctx)
            .map(|h| h.bytes)
            .sum()
    }

    /// After a limit's call: `taker` in `ctx` holds `keep` bytes, of `charged` now charged.
    fn replace_held(&self, taker: Taker, ctx: usize, dev: CUdevice, keep: u64, charged: u64) {
        let mut held = crate::base::sync::lock(&self.overhead.held);
        held.retain(|h| !(h.taker == taker && h.ctx == ctx));
        if keep > 0 {
            held.push(Held {
                taker,
                ctx,
                dev,
                bytes: keep,
            });
        }
        drop(held);
        if charged > keep {
            self.give_overhead_back(&Held {
                taker,
                ctx,
                dev,
                bytes: charged - keep,
            });
        } else {
            self.observe(dev);
        }
    }

    /// A load that takes device memory the driver does not announce (`what` names it): `load`
    /// runs, what it took is measured and charged; when it does not fit, `undo` gives it back
    /// (unload, destroy) and the answer is out of memory. `taker` names the handle `load` made.
    /// `on`: the device the load takes memory on, when it is not the current context's (a
    /// context created on another GPU): then it is not measured (nothing to compare with).
    pub fn measured_load(
        &self,
        what: &'static str,
        on: Option<CUdevice>,
        load: impl FnOnce() -> CUresult,
        taker: impl FnOnce() -> Taker,
        undo: impl FnOnce(Taker),
    ) -> CUresult {
        let Some((_, dev)) = self.here().filter(|&(_, d)| on.is_none_or(|o| o == d)) else {
            return load();
        };
        let before = self.taken_so_far(dev);
        let ours = self.budget(dev).reserved();
        let r = load();
        if r != CUDA_SUCCESS {
            return r;
        }
        let taker = taker();
        // The new context is current after a create, on the same device (checked above).
        let (ctx, _) = self.here().unwrap_or((0, dev));
        let after = self.taken_so_far(dev);
        let Some(grew) = before.grew_by(&after) else {
            return r;
        };
        let ours_now = self.budget(dev).reserved();
        let took = grew.saturating_sub(ours_now.saturating_sub(ours));
        if took == 0 {
            return r;
        }
        match self.charge_overhead(dev, took, what) {
            Ok(()) => {
                self.hold(taker, ctx, dev, took);
                r
            }
            Err(e) => {
                undo(taker);
                e
            }
        }
    }

    /// What the driver has taken on `dev` so far, two ways: the process's own footprint as NVML
    /// counts it (exact whatever the GPU's other tenants do meanwhile) where NVML lists this
    /// process, and the device's free memory (which moves with every other process's
    /// allocations too) always, both read by calls of cudapool's own: none during a capture.
    fn taken_so_far(&self, dev: CUdevice) -> Taken {
        let Some(calls) = crate::base::flags::own_calls() else {
            return Taken::default();
        };
        let own = self
            .budgets
            .uuid(dev, self.driver)
            .and_then(|u| crate::driver::nvml::process_used(&u, std::process::id()));
        let free = self
            .driver
            .own(&calls)
            .mem_get_info()
            .ok()
            .map(|(free, _)| free);
        Taken { own, free }
    }

    /// A module or library was unloaded (`real` succeeded): what it held goes back.
    pub fn unloaded(&self, taker: Taker, real: impl FnOnce() -> CUresult) -> CUresult {
        let r = real();
        if r == CUDA_SUCCESS {
            self.give_back_where(|h| h.taker == taker);
        }
        r
    }

    /// Context `ctx` is gone (destroyed, reset): everything charged in it goes back, itself
    /// included.
    pub(super) fn overhead_context_gone(&self, ctx: usize) {
        self.give_back_where(|h| h.ctx == ctx);
    }

    /// Gives back every entry `gone` picks, and forgets them.
    fn give_back_where(&self, gone: impl Fn(&Held) -> bool) {
        let gone: Vec<Held> = {
            let mut held = crate::base::sync::lock(&self.overhead.held);
            let (gone, kept) = std::mem::take(&mut *held)
                .into_iter()
                .partition(|h| gone(h));
            *held = kept;
            gone
        };
        for h in &gone {
            self.give_overhead_back(h);
        }
    }
}
