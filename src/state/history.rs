//! `CUDAPOOL_HISTORY=N`: the last N allocator events of each device, for snapshots in
//! PyTorch's format (`device_traces`): allocations, frees, segments from and back to the
//! driver, out-of-memory refusals; each with its stream, a timestamp and (under
//! `CUDAPOOL_TRACK=2`) where the program asked.
//!
//! A free is recorded as requested when the program makes it, and as completed when its block
//! may be reused by anyone: at once when no fence holds it back (one queue, or a thread's
//! magazine), else when the shim next looks and finds its fence done ([`History::settle`]: every
//! [`SETTLE_EVERY`] allocations and at each read of the history). So a snapshot's history tells
//! how much memory waited on fences at each moment, to within those allocations.

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
/// `cap` is 0. `pending` holds the frees recorded as requested and not yet as completed
/// (device, address, size, stream), oldest first, at most [`PENDING_CAP`].
pub struct History {
    cap: usize,
    rings: Mutex<HashMap<CUdevice, VecDeque<Event>>>,
    pending: Mutex<VecDeque<(CUdevice, DevPtr, u64, u64)>>,
    allocs: std::sync::atomic::AtomicU64,
}

/// Frees waiting to be seen completed; past this the oldest is recorded completed at once.
pub const PENDING_CAP: usize = 4096;
/// Pending frees are looked at every this many allocations.
pub const SETTLE_EVERY: u64 = 32;

impl History {
    pub fn new(cap: usize) -> Self {
        History {
            cap,
            rings: Mutex::new(HashMap::new()),
            pending: Mutex::new(VecDeque::new()),
            allocs: 0.into(),
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

    /// A free whose block waits for a fence: its completion is recorded when
    /// [`settle`](Self::settle) finds the fence done.
    pub fn free_pending(&self, dev: CUdevice, addr: DevPtr, size: u64, stream: u64) {
        if self.cap == 0 {
            return;
        }
        let oldest = {
            let mut p = lock(&self.pending);
            p.push_back((dev, addr, size, stream));
            (p.len() > PENDING_CAP).then(|| p.pop_front()).flatten()
        };
        if let Some((dev, addr, size, stream)) = oldest {
            self.record(dev, Action::FreeCompleted, addr, size, stream, None);
        }
    }

    /// Whether an allocation should settle the pending frees now (every [`SETTLE_EVERY`]-th
    /// while any is pending).
    pub fn settle_due(&self) -> bool {
        let n = self
            .allocs
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        n.is_multiple_of(SETTLE_EVERY) && !lock(&self.pending).is_empty()
    }

    /// Records as completed, oldest first, the pending frees whose block `fenced()` (the
    /// blocks still waiting for a fence) no longer lists. `fenced` is called with no lock of
    /// the history held, and only when a free is pending.
    pub fn settle(&self, fenced: impl FnOnce() -> std::collections::HashSet<DevPtr>) {
        if lock(&self.pending).is_empty() {
            return;
        }
        let waiting = fenced();
        let done: Vec<_> = {
            let mut p = lock(&self.pending);
            let all: Vec<_> = p.drain(..).collect();
            let (done, still): (Vec<_>, Vec<_>) =
                all.into_iter().partition(|e| !waiting.contains(&e.1));
            p.extend(still);
            done
        };
        for (dev, addr, size, stream) in done {
            self.record(dev, Action::FreeCompleted, addr, size, stream, None);
        }
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

    #[test]
    fn a_fenced_free_completes_when_its_fence_is_done() {
        let h = History::new(100);
        h.record(0, Action::FreeRequested, 0x1000, 10, 7, None);
        h.free_pending(0, 0x1000, 10, 7);
        h.free_pending(0, 0x2000, 20, 7);
        h.settle(|| [0x1000].into_iter().collect());
        let actions = |h: &History| {
            h.events(0)
                .iter()
                .map(|e| (e.action, e.addr))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            actions(&h),
            vec![
                (Action::FreeRequested, 0x1000),
                (Action::FreeCompleted, 0x2000)
            ]
        );
        h.settle(Default::default);
        assert_eq!(actions(&h)[2], (Action::FreeCompleted, 0x1000));
        let mut asked = false;
        h.settle(|| {
            asked = true;
            Default::default()
        });
        assert!(!asked, "nothing pending: the pools are not asked");
        for i in 0..PENDING_CAP as u64 + 1 {
            h.free_pending(1, i, 1, 0);
        }
        assert_eq!(
            h.events(1).len(),
            1,
            "the oldest, past the cap, completed at once"
        );
    }
}
