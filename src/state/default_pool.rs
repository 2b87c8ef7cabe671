//! The device's default memory pool (`cuDeviceGetDefaultMemPool`) tells cudapool's figures
//! (the contract). cudapool serves `cuMemAllocAsync` from its own pool, so the driver's default pool
//! stays empty; programs that read their memory there (PyTorch's `backend:cudaMallocAsync`:
//! `torch.cuda.memory_allocated`, `memory_reserved`, `max_memory_*`, `reset_peak_memory_stats`,
//! `empty_cache`) would see nothing. So, for a device's default pool only:
//! - `cuMemPoolGetAttribute` of reserved and used memory, current and high, answers the device's
//!   reserved and allocated bytes and their peaks. Graph memory is in cudapool's reserved
//!   figure, and PyTorch adds the driver's graph reserve (`cuDeviceGetGraphMemAttribute`) to
//!   the pool's: the default pool's reserved answer leaves graph memory out, so nothing is
//!   counted twice.
//! - `cuMemPoolSetAttribute` of either high (to 0, the driver's only accepted value) resets
//!   cudapool's peaks after the driver's own.
//! - `cuMemPoolTrimTo(keep)` gives back, after the driver's own trim, cudapool's cached memory
//!   on the device until it holds at most `keep` bytes (all of it for 0, waiting for pending
//!   frees as `cudapool_reclaim` does).
//!
//! Every other attribute, and every other pool, keeps the driver's answer.

use super::{Shim, View};
use crate::base::cu::*;
use crate::base::sync::lock;
use std::sync::Mutex;

/// Each device's default pool, as the driver named it when first asked (a pool handle is an
/// address: two devices never share one).
static DEFAULTS: Mutex<Vec<(CUdevice, usize)>> = Mutex::new(Vec::new());

/// Whether `attr` is one the default pool answers with cudapool's figures.
pub fn answered(attr: std::ffi::c_int) -> bool {
    matches!(
        attr,
        CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT
            | CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH
            | CU_MEMPOOL_ATTR_USED_MEM_CURRENT
            | CU_MEMPOOL_ATTR_USED_MEM_HIGH
    )
}

impl Shim {
    /// The device whose default pool `pool` is; `None` for any other pool.
    pub fn default_pool_device(&self, pool: usize) -> Option<CUdevice> {
        let mut known = lock(&DEFAULTS);
        if let Some(&(d, _)) = known.iter().find(|(_, p)| *p == pool) {
            return Some(d);
        }
        // Ask once for each device not asked yet.
        let count = self.driver.device_count().unwrap_or(0);
        for dev in 0..count {
            if known.iter().any(|(d, _)| *d == dev) {
                continue;
            }
            if let Some(p) = self.driver.default_mem_pool(dev) {
                known.push((dev, p));
            }
        }
        known.iter().find(|(_, p)| *p == pool).map(|&(d, _)| d)
    }

    /// What the default pool of `dev` answers for `attr` (one of [`answered`]).
    pub fn default_pool_attribute(&self, dev: CUdevice, attr: std::ffi::c_int) -> u64 {
        let s = self.device_stats(dev);
        let graphs = self.graph_charged(dev);
        let reserved = s.reserved.saturating_sub(graphs);
        match attr {
            CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT => reserved,
            CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH => {
                s.reserved_peak.saturating_sub(graphs).max(reserved)
            }
            CU_MEMPOOL_ATTR_USED_MEM_CURRENT => s.allocated,
            _ => s.allocated_peak,
        }
    }

    /// A high of the default pool of `dev` was reset: so are cudapool's peaks.
    pub fn default_pool_highs_reset(&self, dev: CUdevice) {
        self.budget(dev).reset_peaks();
        self.observe(dev);
    }

    /// `cuMemPoolTrimTo(default pool of dev, keep)`: cudapool's cached memory on `dev` goes back
    /// until the device holds at most `keep` bytes; the bytes released.
    pub fn default_pool_trim(&self, dev: CUdevice, keep: u64) -> u64 {
        if keep == 0 {
            return self.reclaim_device(dev);
        }
        let mut released = 0;
        for (ctx, _) in self.contexts.on_device(dev) {
            let over = self.budget(dev).reserved().saturating_sub(keep);
            if over == 0 {
                break;
            }
            released += self.reclaim_context(ctx, dev, over);
        }
        if released > 0 {
            self.event(dev, "reclaim", released);
        }
        released
    }
}
