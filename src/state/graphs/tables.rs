//! The graph memory tables the shim holds (the module's notes say what they count).

use crate::base::addr_hash::AddrMap as HashMap;
use crate::base::cu::*;
use std::sync::atomic::AtomicBool;
use std::sync::Mutex;

/// What one executable graph's allocation nodes take on one device.
#[derive(Clone, Copy)]
pub(super) struct Need {
    pub(super) device: CUdevice,
    pub(super) bytes: u64,
    /// The device's trim epoch when this graph was last mapped (uploaded or launched); mapped
    /// while it equals the device's current epoch.
    pub(super) mapped_in: u64,
}

/// One device's graph memory, as charged.
///
/// Invariant: `charged` bytes are in the device's budget for graphs: the driver's reserve at
/// the last reading (charges ahead of calls in flight are the callers' own, returned when they
/// settle). `epoch` counts trims, from 1.
#[derive(Clone, Copy)]
pub(super) struct Reserve {
    pub(super) charged: u64,
    pub(super) epoch: u64,
}

/// The graph memory tables.
///
/// Invariant: `execs` holds the executable graphs instantiated through the hooks, with memory
/// nodes, not destroyed since; an executable graph absent from it takes no graph memory (or was
/// instantiated before cudapool started).
#[derive(Default)]
pub struct Graphs {
    pub(super) execs: Mutex<HashMap<usize, Vec<Need>>>,
    pub(super) reserves: Mutex<HashMap<CUdevice, Reserve>>,
    /// Whether a graph with memory nodes was ever instantiated: launches skip the tables while
    /// none was.
    pub(super) any: AtomicBool,
}
