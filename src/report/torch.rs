//! Snapshots in PyTorch's format (`cudapool_snapshot_torch`): the pickle that
//! `torch.cuda.memory._snapshot()` produces and that `pytorch.org/memory_viz` and
//! `python -m torch.cuda._memory_viz` read. The mapping (also in the README):
//! - each pool segment is a `segment` whose `blocks` tile it: a block the program holds is
//!   `active_allocated` (with the size it asked for as `requested_size`, and where it asked
//!   under `CUDAPOOL_TRACK=2`), a freed block waiting for its fence or in a thread's magazine is
//!   `active_pending_free`, a cached one `inactive`;
//! - an allocation that is no piece of a pool segment (every block under `none`, and the
//!   counted pass-through ones: pitched, managed, legacy, driver pools) is a segment of its own
//!   with one active block, and so is each virtual-memory mapping (`cuMemMap`: NCCL's buffers)
//!   and array, so the viewer shows the process's whole memory (`origin` says which);
//! - `device_traces` is `CUDAPOOL_HISTORY` (empty lists without it).

use crate::base::cu::*;
use crate::pool::BlockState;
use crate::state::history::Event;
use crate::state::{Origin, View};
use serde::Serialize;
use std::collections::HashMap;

#[derive(Serialize)]
struct Frame {
    filename: String,
    line: u64,
    name: String,
}

#[derive(Serialize)]
struct Block {
    address: u64,
    size: u64,
    requested_size: u64,
    state: &'static str,
    frames: Vec<Frame>,
}

#[derive(Serialize)]
struct Segment {
    device: i64,
    address: u64,
    total_size: u64,
    allocated_size: u64,
    active_size: u64,
    requested_size: u64,
    stream: u64,
    segment_type: &'static str,
    segment_pool_id: (u64, u64),
    is_expandable: bool,
    frames: Vec<Frame>,
    origin: &'static str,
    blocks: Vec<Block>,
}

#[derive(Serialize)]
struct TraceEntry {
    action: &'static str,
    addr: u64,
    size: u64,
    stream: u64,
    time_us: u64,
    device_free: u64,
    frames: Vec<Frame>,
}

#[derive(Serialize)]
struct Snapshot {
    segments: Vec<Segment>,
    device_traces: Vec<Vec<TraceEntry>>,
    allocator_settings: HashMap<&'static str, String>,
}

/// "symbol (file:line:column)" as `program_frames` gives them, in PyTorch's frame fields.
fn frames(bt: Option<&std::backtrace::Backtrace>) -> Vec<Frame> {
    let Some(bt) = bt else { return Vec::new() };
    crate::base::frames::program_frames(bt, 16)
        .into_iter()
        .filter(|f| !f.starts_with("<unknown>"))
        .map(|f| {
            let (name, at) = match f.rsplit_once(" (") {
                Some((n, at)) => (n.to_string(), at.trim_end_matches(')').to_string()),
                None => (f, String::new()),
            };
            // "path:line:column" (or "path:line"), else no place.
            let mut parts = at.rsplitn(3, ':').collect::<Vec<_>>();
            parts.reverse();
            let (filename, line) = match parts.as_slice() {
                [file, line, _] | [file, line] => (file.to_string(), line.parse().unwrap_or(0)),
                _ => (at.clone(), 0),
            };
            Frame {
                filename,
                line,
                name,
            }
        })
        .collect()
}

fn segment_type(size: u64) -> &'static str {
    if size <= 2 << 20 {
        "small"
    } else {
        "large"
    }
}

/// A segment that is one allocation, wholly active: memory that is no piece of a pool segment.
fn whole(
    dev: CUdevice,
    addr: DevPtr,
    size: u64,
    origin: &'static str,
    frames: Vec<Frame>,
) -> Segment {
    Segment {
        device: dev as i64,
        address: addr,
        total_size: size,
        allocated_size: size,
        active_size: size,
        requested_size: size,
        stream: 0,
        segment_type: segment_type(size),
        segment_pool_id: (0, 0),
        is_expandable: origin == "vmm",
        frames: Vec::new(),
        origin,
        blocks: vec![Block {
            address: addr,
            size,
            requested_size: size,
            state: "active_allocated",
            frames,
        }],
    }
}

/// The process's memory as PyTorch's snapshot pickle.
pub fn snapshot_torch(view: &dyn View) -> Result<Vec<u8>, String> {
    let live = view.live_allocations();
    let held: HashMap<DevPtr, usize> = live.iter().enumerate().map(|(i, l)| (l.0, i)).collect();
    let devices = view.devices_seen();
    let mut segments = Vec::new();
    let mut in_pool_segments = std::collections::HashSet::new();
    for &dev in &devices {
        for (_, seg) in view.segments(dev) {
            let mut s = Segment {
                device: dev as i64,
                address: seg.ptr,
                total_size: seg.size,
                allocated_size: 0,
                active_size: 0,
                requested_size: 0,
                stream: 0,
                segment_type: segment_type(seg.size),
                segment_pool_id: (0, 0),
                is_expandable: seg.expandable,
                frames: Vec::new(),
                origin: "pool",
                blocks: Vec::new(),
            };
            for b in &seg.blocks {
                let l = held.get(&b.ptr).map(|&i| &live[i]);
                let state = match (b.state, l) {
                    (BlockState::InUse, Some(_)) => "active_allocated",
                    (BlockState::InUse, None) | (BlockState::Pending, _) => "active_pending_free",
                    (BlockState::Free, _) => "inactive",
                };
                let requested = l.map_or(b.size, |l| l.1.size.min(b.size));
                if state == "active_allocated" {
                    in_pool_segments.insert(b.ptr);
                    s.allocated_size += b.size;
                    s.requested_size += requested;
                }
                if state != "inactive" {
                    s.active_size += b.size;
                }
                s.blocks.push(Block {
                    address: b.ptr,
                    size: b.size,
                    requested_size: if state == "active_allocated" {
                        requested
                    } else {
                        0
                    },
                    state,
                    frames: frames(l.and_then(|l| l.2.as_deref())),
                });
            }
            segments.push(s);
        }
    }
    // Allocations that are no piece of a pool segment: a segment each.
    for (ptr, l, bt) in &live {
        if in_pool_segments.contains(ptr) {
            continue;
        }
        let origin = match l.origin {
            Origin::Pool => "pool",
            Origin::Counted => "counted",
            Origin::DriverPool(_) => "driver_pool",
            Origin::Graph => "graph",
        };
        segments.push(whole(l.device, *ptr, l.size, origin, frames(bt.as_deref())));
    }
    // Counted memory that is no live allocation: virtual-memory mappings (NCCL's buffers,
    // PyTorch's expandable segments, JAX) and arrays.
    for &dev in &devices {
        for (origin, addr, size) in view.counted_memory(dev) {
            segments.push(whole(dev, addr, size, origin, Vec::new()));
        }
    }
    segments.sort_by_key(|s| (s.device, s.address));
    let max_dev = devices.iter().copied().max().unwrap_or(0).max(0) as usize;
    let device_traces = (0..=max_dev)
        .map(|d| {
            view.history(d as CUdevice)
                .iter()
                .map(|e: &Event| TraceEntry {
                    action: e.action.name(),
                    addr: e.addr,
                    size: e.size,
                    stream: e.stream,
                    time_us: e.time_us,
                    device_free: 0,
                    frames: frames(e.frames.as_deref()),
                })
                .collect()
        })
        .collect();
    let mut allocator_settings = HashMap::new();
    allocator_settings.insert("cudapool_pool", view.pool_kind().name().to_string());
    let snap = Snapshot {
        segments,
        device_traces,
        allocator_settings,
    };
    serde_pickle::to_vec(&snap, serde_pickle::SerOptions::new()).map_err(|e| e.to_string())
}
