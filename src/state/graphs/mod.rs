//! Memory the driver reserves for CUDA graphs' memory nodes (a `cuMemAllocAsync` captured into
//! a graph, `cuGraphAddMemAllocNode`), counted in the stats and against the limit.
//!
//! What the driver does (H100, driver 580, `tests/gpu/programs/graph_mem.cu probe`): it maps a graph's
//! memory when the graph is uploaded or launched, inside that call (instantiation takes
//! nothing); the memory stays, shared by every graph of the device (a second 1 GiB graph
//! launched after the first left the reserve at 1 GiB); only `cuDeviceGraphMemTrim` gives it
//! back, and only what no running graph and no unfreed allocation holds. The driver says how
//! much it holds (`CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT`). So:
//! - instantiation records what each executable graph's allocation nodes take per device (the
//!   sum: an upper bound, as the driver may reuse memory inside one graph);
//! - before an upload or launch of a graph not mapped since the device's last trim, that need
//!   is charged ahead; if it does not fit, cudapool gives back its own cache and trims the
//!   graphs' memory (which lets the need fit whenever the driver could reuse what it held),
//!   tries once more, and else refuses the call with out-of-memory: the graph does not run;
//! - after the call, the charge becomes what the driver says it holds;
//! - a trim, the program's or cudapool's own when it reclaims for an allocation, brings the
//!   charge down and marks every graph of the device unmapped.
//!
//! A graph launched again while mapped is not checked (the driver reuses its memory); growth
//! the bound did not foresee (graphs sharing memory launched at once on two streams) is counted
//! at the next reading, whether it fits or not.

mod tables;
use super::{Live, Origin, Shim};
use crate::base::cu::*;
use crate::base::sync::lock;
use std::sync::atomic::Ordering;
pub use tables::Graphs;
use tables::{Need, Reserve};

impl Shim {
    /// An executable graph `exec` was instantiated from `graph`: remember what its memory
    /// nodes take (a reused handle forgets its old record).
    pub fn graph_instantiated(&self, exec: usize, graph: usize) {
        let needs: Vec<Need> = match self.driver.graph_memory_nodes(graph) {
            Ok(per_device) => per_device
                .into_iter()
                .filter(|&(_, bytes)| bytes > 0)
                .map(|(device, bytes)| Need {
                    device,
                    bytes,
                    mapped_in: 0,
                })
                .collect(),
            Err(_) => Vec::new(),
        };
        let mut execs = lock(&self.graphs.execs);
        if needs.is_empty() {
            execs.remove(&exec);
        } else {
            execs.insert(exec, needs);
            self.graphs.any.store(true, Ordering::Release);
        }
    }

    /// An allocation captured into a graph (a memory node): made by `alloc`, the driver's own,
    /// and entered in the live table uncharged (see [`Origin::Graph`]).
    pub(super) fn graph_node_made(
        &self,
        size: u64,
        alloc: impl FnOnce() -> Result<DevPtr, CUresult>,
    ) -> Result<DevPtr, CUresult> {
        let (ctx, dev) = self.current()?;
        let ptr = alloc()?;
        let (holder, _) = self.budget(dev).on_alloc(size, false);
        self.live.insert(
            ptr,
            Live {
                ctx,
                device: dev,
                size,
                handed: size,
                origin: Origin::Graph,
                holder,
            },
        );
        Ok(ptr)
    }

    /// `cuGraphExecDestroy` succeeded. What the graph held stays reserved until a trim.
    pub fn graph_exec_destroyed(&self, exec: usize) {
        if self.graphs.any.load(Ordering::Acquire) {
            lock(&self.graphs.execs).remove(&exec);
        }
    }

    /// Runs `map`, the program's upload or launch of `exec`, within the limit: the need of a
    /// graph not mapped is charged ahead (with a reclaim and a trim if it does not fit, and
    /// out-of-memory if it still does not: `map` is then not run), and the charge is settled to
    /// the driver's reading after the call.
    pub fn graph_mapping(&self, exec: usize, map: impl FnOnce() -> CUresult) -> CUresult {
        if !self.graphs.any.load(Ordering::Acquire) {
            return map();
        }
        let Some(needs) = lock(&self.graphs.execs).get(&exec).cloned() else {
            return map();
        };
        let mut ahead: Vec<(CUdevice, u64)> = Vec::with_capacity(needs.len());
        for need in needs.iter().filter(|n| !self.graph_mapped(n)) {
            match self.charge_counted(need.device, need.bytes) {
                Ok(()) => ahead.push((need.device, need.bytes)),
                Err(e) => {
                    for &(dev, bytes) in &ahead {
                        self.budget(dev).refund(bytes);
                    }
                    return e;
                }
            }
        }
        let r = map();
        for &(dev, bytes) in &ahead {
            self.settle_graphs(dev, bytes);
        }
        if r == CUDA_SUCCESS && !ahead.is_empty() {
            self.graph_mapped_now(exec);
        }
        r
    }

    /// Whether the graph memory of `need` is mapped (since the device's last trim).
    fn graph_mapped(&self, need: &Need) -> bool {
        lock(&self.graphs.reserves)
            .get(&need.device)
            .is_some_and(|r| r.epoch == need.mapped_in)
    }

    /// Marks `exec` mapped on every device it uses, in the current epochs.
    fn graph_mapped_now(&self, exec: usize) {
        let reserves = lock(&self.graphs.reserves);
        if let Some(needs) = lock(&self.graphs.execs).get_mut(&exec) {
            for n in needs.iter_mut() {
                n.mapped_in = reserves.get(&n.device).map_or(0, |r| r.epoch);
            }
        }
    }

    /// Brings the graph charge of `dev` to the driver's reading, returning `ahead` bytes
    /// charged before the call that may have grown it.
    fn settle_graphs(&self, dev: CUdevice, ahead: u64) {
        self.settle_graphs_or(dev, ahead, None);
    }

    /// [`settle_graphs`](Self::settle_graphs), taking `unread` as the reading when the driver
    /// cannot say (`None`: keep the charge).
    fn settle_graphs_or(&self, dev: CUdevice, ahead: u64, unread: Option<u64>) {
        let budget = self.budget(dev);
        let mut reserves = lock(&self.graphs.reserves);
        let rec = reserves.entry(dev).or_insert(Reserve {
            charged: 0,
            epoch: 1,
        });
        let Some(now) = self.driver.graph_reserved(dev).ok().or(unread) else {
            budget.refund(ahead);
            return;
        };
        let before = rec.charged + ahead;
        if now > before {
            budget.force_charge(now - before);
        } else {
            // What was charged ahead and not taken never held memory; below the old charge,
            // the driver gave memory back.
            let unused = (before - now).min(ahead);
            budget.refund(unused);
            budget.uncharge(before - now - unused);
        }
        if now > rec.charged {
            budget.on_driver_alloc();
        } else if now < rec.charged {
            budget.on_driver_free();
        }
        rec.charged = now;
        drop(reserves);
        self.observe(dev);
    }

    /// Graph memory of `dev` was trimmed (`cuDeviceGraphMemTrim`, the program's or cudapool's
    /// own): every graph of the device is unmapped, the charge follows the driver.
    pub fn graphs_trimmed(&self, dev: CUdevice) {
        self.graphs_unmapped(dev, None);
    }

    /// Every graph of `dev` is unmapped (a new epoch); the charge follows the driver, or
    /// `unread` if it cannot say.
    fn graphs_unmapped(&self, dev: CUdevice, unread: Option<u64>) {
        if let Some(r) = lock(&self.graphs.reserves).get_mut(&dev) {
            r.epoch += 1;
        }
        self.settle_graphs_or(dev, 0, unread);
    }

    /// Gives back the graph memory of `dev` (-1: of every device) that no graph is using (part
    /// of a reclaim); the bytes given back.
    pub(super) fn trim_graph_memory(&self, dev: CUdevice) -> u64 {
        if !self.graphs.any.load(Ordering::Acquire) {
            return 0;
        }
        if dev < 0 {
            let devices: Vec<CUdevice> = lock(&self.graphs.reserves).keys().copied().collect();
            return devices.into_iter().map(|d| self.trim_graph_memory(d)).sum();
        }
        let before = match lock(&self.graphs.reserves).get(&dev) {
            Some(r) if r.charged > 0 => r.charged,
            _ => return 0,
        };
        // Not during a graph capture: the trim is cudapool's own call.
        let Some(calls) = crate::base::flags::own_calls() else {
            return 0;
        };
        if self.driver.own(&calls).device_graph_mem_trim(dev) != CUDA_SUCCESS {
            return 0;
        }
        drop(calls);
        self.graphs_trimmed(dev);
        let after = lock(&self.graphs.reserves)
            .get(&dev)
            .map_or(0, |r| r.charged);
        before.saturating_sub(after)
    }

    /// The graph memory of `dev` in its budget now.
    pub(super) fn graph_charged(&self, dev: CUdevice) -> u64 {
        if !self.graphs.any.load(Ordering::Acquire) {
            return 0;
        }
        lock(&self.graphs.reserves)
            .get(&dev)
            .map_or(0, |r| r.charged)
    }

    /// A context died: what the driver held for graphs on its device may have gone with it.
    pub(super) fn graphs_context_gone(&self) {
        if !self.graphs.any.load(Ordering::Acquire) {
            return;
        }
        let devices: Vec<CUdevice> = lock(&self.graphs.reserves).keys().copied().collect();
        for dev in devices {
            // A device whose context is gone may not answer: its graph memory went with it.
            self.graphs_unmapped(dev, Some(0));
        }
    }
}
