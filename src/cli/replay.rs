//! `cudapool replay FILE...`: replays allocation traces through the pool kinds on the
//! in-process fake upstream (no GPU, no driver) and prints each configuration's peak reserved
//! against the trace's peak allocated: how much a job would hold under cudapool, before it
//! touches a GPU.
//!
//! Inputs, told apart by their first bytes:
//! - the plain trace (`a ID SIZE`, `f ID`, `#` comments; a comment naming `max_reserved N` is
//!   the reserved peak its recorder saw);
//! - PyTorch's memory snapshot with history (`torch.cuda.memory._dump_snapshot`, a pickle):
//!   each device's `alloc` and `free_requested` events; blocks alive before the history began
//!   (freed in it, or alive at the snapshot) are allocated first; PyTorch's own reserved peak
//!   is rebuilt from its segment events;
//! - a `CUDAPOOL_TRACE` file written with `CUDAPOOL_HISTORY` on (its `alloc` and `free`
//!   events).
//!
//! A replay is the one-queue case: frees are in request order, with no streams and no lag.
//! With `--limit SIZE` it runs under that hard limit (as `CUDAPOOL_MEMORY_LIMIT`), where the
//! arena stitches free memory into its growths; requests the limit refuses are counted (`ooms`).

use crate::cli::out::outln;
use cudapool::base::config::{PoolKind, Stitch};
use cudapool::base::limit::Limit;
use cudapool::base::log::fmt_bytes;
use cudapool::pool::testing::{replay_in, Op};
use cudapool::pool::ReuseRule;
use serde_pickle::{HashableValue as H, Value as V};
use std::collections::HashMap;

/// One trace to replay: one file, or one device of a snapshot.
pub struct Trace {
    pub name: String,
    pub ops: Vec<Op>,
    /// The reserved peak its recorder saw, when the file says.
    pub recorded_reserved: Option<u64>,
}

/// A configuration replayed: the pool kind, and expandable segments or not.
#[derive(Clone, Copy)]
struct Setup {
    kind: PoolKind,
    expandable: bool,
}

impl Setup {
    /// Its segments as the table and the JSON name them (`stitching`: expandable, stitching
    /// at every growth).
    fn segments(self, stitch: Stitch) -> &'static str {
        match (self.expandable, stitch) {
            (false, _) => "classic",
            (true, Stitch::NearLimit) => "expandable",
            (true, Stitch::Always) => "stitching",
        }
    }
}

/// The configurations `--pool` and `--segments` select (the default: every caching kind, and
/// `split` both ways; only `split` has expandable segments).
fn setups(pool: Option<&str>, segments: Option<&str>) -> Result<Vec<Setup>, String> {
    let kinds = match pool {
        Some(p) => vec![PoolKind::parse(p)
            .ok_or_else(|| format!("unknown pool kind {p:?}; accepted: {}", PoolKind::ACCEPTED))?],
        None => vec![PoolKind::Split, PoolKind::Binned, PoolKind::Simple],
    };
    let ways: &[bool] = match segments {
        Some("expandable") => &[true],
        Some("classic") => &[false],
        Some(s) => {
            return Err(format!(
                "unknown segments {s:?}; accepted: classic, expandable"
            ))
        }
        None => &[true, false],
    };
    let mut out = Vec::new();
    for kind in kinds {
        for &expandable in ways {
            // Only split has expandable segments (as CUDAPOOL_SEGMENTS).
            if expandable && kind != PoolKind::Split {
                continue;
            }
            out.push(Setup { kind, expandable });
        }
    }
    if out.is_empty() {
        return Err(
            "expandable segments are split's only: --segments classic for this kind".into(),
        );
    }
    Ok(out)
}

/// The replay of every file under every configuration, as a table or JSON lines.
pub fn replay(
    files: &[std::path::PathBuf],
    pool: Option<&str>,
    segments: Option<&str>,
    limit: Option<&str>,
    stitch: Option<&str>,
    json: bool,
) -> Result<(), String> {
    let setups = setups(pool, segments)?;
    let stitch = match stitch {
        None => Stitch::NearLimit,
        Some(s) => {
            Stitch::parse(s).ok_or_else(|| format!("--stitch {s:?}: {}", Stitch::ACCEPTED))?
        }
    };
    let limit = match limit {
        Some(l) => match cudapool::base::config::parse_size(l) {
            Ok(0) | Err(_) => return Err(format!("--limit {l:?}: a size such as 8GiB or 7500MiB")),
            Ok(n) => Limit::from_raw(n),
        },
        None => Limit::NONE,
    };
    // A file that cannot be read or is no trace costs its own line, not the others' replay
    // (`replay benches/traces/*` takes the folder's README too); the status says it at the end.
    let mut traces = Vec::new();
    let mut refused = Vec::new();
    for f in files {
        let name = f.display().to_string();
        let loaded = match cudapool::base::outfile::read_bounded(f, MAX_BYTES) {
            Ok(bytes) => load(&name, &bytes),
            Err(e) => Err(e),
        };
        match loaded {
            Ok(t) => traces.extend(t),
            Err(e) if e.starts_with(&name) => refused.push(e),
            Err(e) => refused.push(format!("{name}: {e}")),
        }
    }
    for e in &refused {
        eprintln!("cudapool replay: {e}");
    }
    if traces.is_empty() {
        return Err(match refused.len() {
            1 => "nothing replayed".into(),
            n => format!("nothing replayed: none of the {n} files is a trace"),
        });
    }
    if !json {
        outln(&format!(
            "{:<28} {:<6} {:<10} {:>15} {:>15} {:>7} {:>15}",
            "file", "pool", "segments", "peak reserved", "peak allocated", "ratio", "recorded"
        ));
    }
    for t in &traces {
        for s in &setups {
            let (rule, lag) = (ReuseRule::OneQueue, 0);
            let r = replay_in(s.kind, s.expandable, stitch, &t.ops, rule, lag, limit);
            let ratio = r.peak_reserved as f64 / r.peak_requested.max(1) as f64;
            if json {
                let recorded = t
                    .recorded_reserved
                    .map_or("null".to_string(), |r| r.to_string());
                outln(&format!(
                    "{{\"file\":{},\"pool\":\"{}\",\"segments\":\"{}\",\"peak_reserved_bytes\":{},\"peak_allocated_bytes\":{},\"ratio\":{ratio:.4},\"recorded_reserved_bytes\":{recorded},\"allocations\":{},\"driver_calls\":{},\"driver_calls_late\":{},\"limit_bytes\":{},\"ooms\":{}}}",
                    serde_json::to_string(&t.name).unwrap_or_default(),
                    s.kind.name(),
                    s.segments(stitch),
                    r.peak_reserved,
                    r.peak_requested,
                    t.ops.iter().filter(|o| matches!(o, Op::Alloc(..))).count(),
                    r.driver_allocs,
                    r.driver_allocs_late,
                    limit.bytes().map_or("null".to_string(), |b| b.to_string()),
                    r.ooms,
                ));
            } else {
                let short = std::path::Path::new(&t.name)
                    .file_name()
                    .map_or(t.name.clone(), |n| n.to_string_lossy().into_owned());
                outln(&format!(
                    "{:<28} {:<6} {:<10} {:>15} {:>15} {:>7.3} {:>15}{}",
                    short,
                    s.kind.name(),
                    s.segments(stitch),
                    fmt_bytes(r.peak_reserved),
                    fmt_bytes(r.peak_requested),
                    ratio,
                    t.recorded_reserved.map_or("-".to_string(), fmt_bytes),
                    if r.ooms > 0 {
                        format!("  ({} refused by the limit)", r.ooms)
                    } else {
                        String::new()
                    },
                ));
            }
        }
    }
    match refused.len() {
        0 => Ok(()),
        n => Err(format!(
            "{n} of the {} files not replayed (said above)",
            files.len()
        )),
    }
}

/// The largest file read: a PyTorch snapshot with a long history runs to hundreds of MB.
const MAX_BYTES: u64 = 4 << 30;

/// The traces in one file.
pub fn load(name: &str, bytes: &[u8]) -> Result<Vec<Trace>, String> {
    match bytes.first() {
        // A pickle starts with PROTO (protocol 2 and later).
        Some(0x80) => torch_snapshot(name, bytes),
        Some(b'{') => cudapool_trace(name, bytes),
        _ => {
            let text = std::str::from_utf8(bytes).map_err(|_| {
                "neither a plain trace, a PyTorch snapshot nor a CUDAPOOL_TRACE file".to_string()
            })?;
            Ok(vec![plain(name, text)?])
        }
    }
}

/// The plain trace; an ID allocated twice without a free, or freed unallocated, is an error.
fn plain(name: &str, text: &str) -> Result<Trace, String> {
    let mut ops = Vec::new();
    let mut recorded = None;
    let mut live = std::collections::HashSet::new();
    for (i, line) in text.lines().enumerate() {
        let bad = |what: &str| format!("line {}: {what}: {line:?}", i + 1);
        let line = line.trim();
        if let Some(comment) = line.strip_prefix('#') {
            let words: Vec<&str> = comment.split_whitespace().collect();
            if let Some(w) = words.windows(2).find(|w| w[0] == "max_reserved") {
                recorded = w[1].parse().ok();
            }
            continue;
        }
        let f: Vec<&str> = line.split_whitespace().collect();
        let num = |s: &str| s.parse::<u64>().map_err(|_| bad("not a number"));
        match f.as_slice() {
            [] => {}
            ["a", id, size] => {
                let (id, size) = (num(id)?, num(size)?);
                if size == 0 || !live.insert(id) {
                    return Err(bad("a size of 0, or an ID allocated twice"));
                }
                ops.push(Op::Alloc(id, size));
            }
            ["f", id] => {
                let id = num(id)?;
                if !live.remove(&id) {
                    return Err(bad("a free of an ID not allocated"));
                }
                ops.push(Op::Free(id));
            }
            _ => return Err(bad("expected `a ID SIZE`, `f ID` or `# ...`")),
        }
    }
    if ops.is_empty() {
        return Err("no allocation in it".into());
    }
    Ok(Trace {
        name: name.to_string(),
        ops,
        recorded_reserved: recorded,
    })
}

/// What the events of one device make: allocations by address, with the blocks alive before
/// the events began allocated first.
#[derive(Default)]
struct Builder {
    ops: Vec<Op>,
    /// Allocations of blocks alive before the first event.
    before: Vec<Op>,
    live: HashMap<u64, u64>,
    next: u64,
}

impl Builder {
    fn alloc(&mut self, addr: u64, size: u64) {
        if size == 0 {
            return;
        }
        if let Some(old) = self.live.remove(&addr) {
            // An allocation at a live address: the free between them was not recorded.
            self.ops.push(Op::Free(old));
        }
        self.next += 1;
        self.live.insert(addr, self.next);
        self.ops.push(Op::Alloc(self.next, size));
    }

    fn free(&mut self, addr: u64, size: u64) {
        match self.live.remove(&addr) {
            Some(id) => self.ops.push(Op::Free(id)),
            None if size > 0 => {
                self.next += 1;
                self.before.push(Op::Alloc(self.next, size));
                self.ops.push(Op::Free(self.next));
            }
            None => {}
        }
    }

    /// A block alive at the end that no event allocated.
    fn alive(&mut self, addr: u64, size: u64) {
        if size > 0 && !self.live.contains_key(&addr) {
            self.next += 1;
            self.before.push(Op::Alloc(self.next, size));
            self.live.insert(addr, self.next);
        }
    }

    fn finish(self, name: String, recorded_reserved: Option<u64>) -> Option<Trace> {
        let mut ops = self.before;
        ops.extend(self.ops);
        ops.iter()
            .any(|o| matches!(o, Op::Alloc(..)))
            .then_some(Trace {
                name,
                ops,
                recorded_reserved,
            })
    }
}

fn key<'a>(d: &'a std::collections::BTreeMap<H, V>, k: &str) -> Option<&'a V> {
    d.get(&H::String(k.to_string()))
}

fn int(v: Option<&V>) -> Option<u64> {
    match v? {
        V::I64(n) => u64::try_from(*n).ok(),
        V::Int(n) => n.to_string().parse().ok(),
        _ => None,
    }
}

fn text(v: Option<&V>) -> Option<&str> {
    match v? {
        V::String(s) => Some(s),
        _ => None,
    }
}

const NO_HISTORY: &str = "a snapshot without history (only the blocks alive at the end): record it with torch.cuda.memory._record_memory_history() first";
/// The same, for a snapshot cudapool wrote (`allocator_settings` names its pool): its history
/// is cudapool's own.
const NO_HISTORY_OURS: &str = "a snapshot cudapool wrote without history (only the blocks alive at that moment): run the program with CUDAPOOL_HISTORY=N (say 100000) set, then snapshot it again";

/// PyTorch's snapshot with history: one trace per device with events.
fn torch_snapshot(name: &str, bytes: &[u8]) -> Result<Vec<Trace>, String> {
    let opts = serde_pickle::DeOptions::new().replace_unresolved_globals();
    let v = serde_pickle::value_from_slice(bytes, opts)
        .map_err(|e| format!("not a readable pickle: {e}"))?;
    let V::Dict(top) = v else {
        return Err("not a PyTorch memory snapshot (no dict at the top)".into());
    };
    let ours = matches!(key(&top, "allocator_settings"), Some(V::Dict(a)) if key(a, "cudapool_pool").is_some());
    let no_history = if ours { NO_HISTORY_OURS } else { NO_HISTORY };
    let Some(V::List(devices)) = key(&top, "device_traces") else {
        return Err(no_history.into());
    };
    let segments = match key(&top, "segments") {
        Some(V::List(s)) => s.as_slice(),
        _ => &[],
    };
    let mut out = Vec::new();
    let with_events = devices
        .iter()
        .filter(|d| matches!(d, V::List(e) if !e.is_empty()))
        .count();
    // PyTorch writes `device_traces` always, empty without a history: the live blocks alone
    // are no run to replay (as a CUDAPOOL_TRACE without CUDAPOOL_HISTORY).
    if with_events == 0 {
        return Err(no_history.into());
    }
    for (dev, events) in devices.iter().enumerate() {
        let V::List(events) = events else { continue };
        let mut b = Builder::default();
        let dicts = events.iter().filter_map(|e| match e {
            V::Dict(d) => Some(d),
            _ => None,
        });
        let has_requested = dicts
            .clone()
            .any(|d| text(key(d, "action")) == Some("free_requested"));
        let free_action = if has_requested {
            "free_requested"
        } else {
            "free_completed"
        };
        // PyTorch's reserved bytes over the events, relative to where they began.
        let (mut reserved, mut top_reserved, mut seen_segment) = (0i128, 0i128, false);
        for d in dicts {
            let (Some(action), Some(addr)) = (text(key(d, "action")), int(key(d, "addr"))) else {
                continue;
            };
            let size = int(key(d, "size")).unwrap_or(0);
            match action {
                "alloc" => b.alloc(addr, size),
                a if a == free_action => b.free(addr, size),
                "segment_alloc" | "segment_map" => {
                    reserved += size as i128;
                    seen_segment = true;
                }
                "segment_free" | "segment_unmap" => {
                    reserved -= size as i128;
                    seen_segment = true;
                }
                _ => {}
            }
            top_reserved = top_reserved.max(reserved);
        }
        // The segments at the snapshot: blocks alive before the history, and the reserved
        // bytes at the end (the start is the end less what the events added).
        let mut end_reserved = 0i128;
        for s in segments {
            let V::Dict(s) = s else { continue };
            if int(key(s, "device")).is_some_and(|d| d != dev as u64) {
                continue;
            }
            end_reserved += int(key(s, "total_size")).unwrap_or(0) as i128;
            let mut at = int(key(s, "address")).unwrap_or(0);
            let Some(V::List(blocks)) = key(s, "blocks") else {
                continue;
            };
            for bl in blocks {
                let V::Dict(bl) = bl else { continue };
                let size = int(key(bl, "size")).unwrap_or(0);
                let addr = int(key(bl, "address")).unwrap_or(at);
                let state = text(key(bl, "state")).unwrap_or("");
                if state.starts_with("active") {
                    let asked = int(key(bl, "requested_size")).unwrap_or(size);
                    b.alive(addr, asked);
                }
                at = addr + size;
            }
        }
        let recorded = seen_segment.then(|| (end_reserved - reserved + top_reserved).max(0) as u64);
        let trace_name = if with_events > 1 {
            format!("{name} (device {dev})")
        } else {
            name.to_string()
        };
        out.extend(b.finish(trace_name, recorded));
    }
    if out.is_empty() {
        return Err("no allocation in the snapshot's history".into());
    }
    Ok(out)
}

/// A `CUDAPOOL_TRACE` file: its `alloc` and `free` events, one trace per device.
fn cudapool_trace(name: &str, bytes: &[u8]) -> Result<Vec<Trace>, String> {
    let v: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| format!("not readable JSON: {e}"))?;
    // cudapool's JSON snapshot (`cudapool_snapshot`, `cudapool snapshot`): one moment's blocks.
    if v.get("devices").is_some() && v.get("pool").is_some() && v.get("traceEvents").is_none() {
        return Err("a cudapool JSON snapshot: the blocks alive at one moment, no run to replay; replay a CUDAPOOL_TRACE written with CUDAPOOL_HISTORY=N, or a snapshot taken with --format torch under CUDAPOOL_HISTORY=N".into());
    }
    let events = v
        .get("traceEvents")
        .and_then(|e| e.as_array())
        .ok_or("not a CUDAPOOL_TRACE file (no traceEvents)")?;
    let mut devices: std::collections::BTreeMap<u64, Builder> = Default::default();
    for e in events {
        let name = e.get("name").and_then(|n| n.as_str());
        let args = e.get("args");
        let arg = |k: &str| args.and_then(|a| a.get(k)).and_then(|x| x.as_u64());
        let (Some(dev), Some(addr)) = (arg("device"), arg("addr")) else {
            continue;
        };
        let size = arg("bytes").unwrap_or(0);
        let b = devices.entry(dev).or_default();
        match name {
            Some("alloc") => b.alloc(addr, size),
            Some("free") => b.free(addr, size),
            _ => {}
        }
    }
    let many = devices.len() > 1;
    let out: Vec<Trace> = devices
        .into_iter()
        .filter_map(|(dev, b)| {
            let n = if many {
                format!("{name} (device {dev})")
            } else {
                name.to_string()
            };
            b.finish(n, None)
        })
        .collect();
    if out.is_empty() {
        return Err(
            "no allocation events in it: write the trace with CUDAPOOL_HISTORY=N set too".into(),
        );
    }
    Ok(out)
}
