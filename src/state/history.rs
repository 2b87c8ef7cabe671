//! `CUDAPOOL_HISTORY=N`: the last N allocator events of each device, for snapshots in
//! PyTorch's format (`device_traces`): allocations, frees, segments from and back to the
//! driver, out-of-memory refusals; each with its stream, a timestamp and (under
//! `CUDAPOOL_TRACK=2`) where the program asked.
//!
//! A free is recorded as requested and completed at once: the block is the program's no more.
//! (When it may be reused depends on the reuse rule and its fence, which the pool decides
//! later; the snapshot's blocks say which are still pending.)
//!
//! Uses: `sync`, `cu`.

use crate::base::cu::*;
use crate::base::sync::lock;
use std::backtrace::Backtrace;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

/// What happened, with PyTorch's names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Alloc,
    FreeRequested,
    FreeCompleted,
    SegmentAlloc,
    SegmentFree,
    /// Memory mapped into, or unmapped from, an expandable segment.
    SegmentMap,
    SegmentUnmap,
    Oom,
}

impl Action {
    pub fn name(self) -> &'static str {
        match self {
            Action::Alloc => "alloc",
            Action::FreeRequested => "free_requested",
            Action::FreeCompleted => "free_completed",
            Action::SegmentAlloc => "segment_alloc",
            Action::SegmentFree => "segment_free",
            Action::SegmentMap => "segment_map",
            Action::SegmentUnmap => "segment_unmap",
            Action::Oom => "oom",
        }
    }
}

/// One event.
#[derive(Clone, Debug)]
pub struct Event {
    pub action: Action,
    pub addr: DevPtr,
    pub size: u64,
    /// The stream it was ordered on (0: none, or the legacy stream).
    pub stream: u64,
    /// Microseconds since the Unix epoch.
    pub time_us: u64,
    pub frames: Option<Arc<Backtrace>>,
}

/// Invariant: each device's ring holds at most `cap` events, oldest first; nothing is kept when
/// `cap` is 0.
pub struct History {
    cap: usize,
    rings: Mutex<HashMap<CUdevice, VecDeque<Event>>>,
}

impl History {
    pub fn new(cap: usize) -> Self {
        History {
            cap,
            rings: Mutex::new(HashMap::new()),
        }
    }

    /// Whether events are kept at all (checked before building one).
    #[inline]
    pub fn on(&self) -> bool {
        self.cap > 0
    }

    pub fn record(
        &self,
        dev: CUdevice,
        action: Action,
        addr: DevPtr,
        size: u64,
        stream: u64,
        frames: Option<Arc<Backtrace>>,
    ) {
        if self.cap == 0 {
            return;
        }
        let time_us = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64);
        let mut rings = lock(&self.rings);
        let ring = rings.entry(dev).or_default();
        if ring.len() == self.cap {
            ring.pop_front();
        }
        ring.push_back(Event {
            action,
            addr,
            size,
            stream,
            time_us,
            frames,
        });
    }

    /// The events of `dev`, oldest first.
    pub fn events(&self, dev: CUdevice) -> Vec<Event> {
        lock(&self.rings)
            .get(&dev)
            .map(|r| r.iter().cloned().collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_newest_events_of_each_device() {
        let h = History::new(3);
        for i in 0..5 {
            h.record(0, Action::Alloc, i, 10, 0, None);
        }
        h.record(1, Action::Oom, 0, 99, 0, None);
        let e = h.events(0);
        assert_eq!(e.iter().map(|e| e.addr).collect::<Vec<_>>(), vec![2, 3, 4]);
        assert_eq!(h.events(1)[0].action, Action::Oom);
        assert!(h.events(2).is_empty());
        let off = History::new(0);
        off.record(0, Action::Alloc, 1, 1, 0, None);
        assert!(!off.on() && off.events(0).is_empty());
    }
}
