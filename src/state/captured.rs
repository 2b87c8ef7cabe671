//! Blocks a capture's own thread frees inside its capture (docs/design.md, Giving back).
//! The graph may name such a block at every replay (PyTorch with its cache off frees a
//! capture's temporaries while the capture runs), so the block stays the graph's: in use in the
//! pool, never handed to another owner nor given back. Inside the same capture the thread's
//! later allocations may take it again (graph memory reuses what the graph freed, as CUDA's
//! memory nodes and PyTorch's private graph pools do); after the capture it is the graph's for
//! the process's life.

use super::{Live, Shim};
use crate::base::config::LogLevel::Debug;
use crate::base::cu::DevPtr;
use crate::base::flags::{capture_serial, capturing_here};
use crate::limits::budget::Bytes;
use crate::log_at;
use std::cell::RefCell;

/// A block freed inside a capture: its record as the program held it, and the capture's number.
struct Kept {
    ptr: DevPtr,
    live: Live,
    capture: u64,
}

thread_local! {
    /// This thread's blocks freed inside its capture under way (older captures' are dropped:
    /// their graphs keep them).
    static KEPT: RefCell<Vec<Kept>> = const { RefCell::new(Vec::new()) };
}

impl Shim {
    /// A pooled block the program freed while this thread's capture is under way: kept for the
    /// graph (its bytes leave the program's figures; the pool keeps it in use).
    pub(super) fn keep_for_graph(&self, ptr: DevPtr, live: Live) {
        let capture = capture_serial();
        let _ = KEPT.try_with(|k| {
            let mut k = k.borrow_mut();
            k.retain(|e| e.capture == capture);
            k.push(Kept { ptr, live, capture });
        });
        log_at!(Debug, "free {ptr:#x} during a capture: kept for the graph");
    }

    /// Inside this thread's capture, a block of `size` bytes in context `ctx` that the same
    /// capture freed (the smallest that holds it), handed out again; `None` otherwise.
    pub(super) fn reuse_for_graph(&self, ctx: usize, size: u64) -> Option<DevPtr> {
        if !capturing_here() {
            return None;
        }
        let capture = capture_serial();
        let kept = KEPT
            .try_with(|k| {
                let mut k = k.borrow_mut();
                let i = k
                    .iter()
                    .enumerate()
                    .filter(|(_, e)| e.capture == capture && e.live.ctx == ctx)
                    .filter(|(_, e)| e.live.handed >= size)
                    .min_by_key(|(_, e)| e.live.handed)?
                    .0;
                Some(k.swap_remove(i))
            })
            .ok()??;
        let budget = self.budget(kept.live.device);
        let (holder, _) = budget.on_alloc(
            Bytes {
                asked: size,
                handed: kept.live.handed,
            },
            true,
        );
        self.live.insert(
            kept.ptr,
            Live {
                size,
                holder,
                ..kept.live
            },
        );
        log_at!(
            Debug,
            "alloc {size} -> {:#x}: freed earlier in this capture",
            kept.ptr
        );
        Some(kept.ptr)
    }
}
