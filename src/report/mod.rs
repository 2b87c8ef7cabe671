//! Reporting: what the program and its user are shown of the state. The memory status
//! (`CUDAPOOL_REPORT`, `cudapool_memory_status`), the JSON snapshot, the leak report, and
//! [`Reporting`], the observer the crate root installs on the state: it keeps the trace
//! ([`trace`], `CUDAPOOL_TRACE`) and the live page ([`publish`], `cudapool stat`), and writes
//! the exit report. It reads the state through `state::View` only; the state never names it.

pub mod asks;
pub mod page;
pub mod pages;
pub mod publish;
mod serve_sleep;
pub mod torch;
pub mod trace;

use crate::base::config::ReportTarget;
use crate::base::cu::CUdevice;
use crate::base::limit::Limit;
use crate::limits::budget::DeviceStats;
use crate::state::{Observer, View};
use publish::Publisher;
use std::fmt::Write as _;
use std::sync::OnceLock;
use trace::Trace;

/// The observer of the state: the trace and the live page (each made on first use, from the
/// configuration), and the exit report.
pub struct Reporting {
    trace: OnceLock<Option<Trace>>,
    page: OnceLock<Option<Publisher>>,
    /// The snapshot files this process wrote at OOMs with `%n` in their name, oldest first: at
    /// most `CUDAPOOL_OOM_SNAPSHOT_KEEP`, the oldest removed as a new one is written.
    snapshots: std::sync::Mutex<std::collections::VecDeque<String>>,
}

/// The one [`Reporting`] of the process.
pub static REPORTING: Reporting = Reporting {
    trace: OnceLock::new(),
    page: OnceLock::new(),
    snapshots: std::sync::Mutex::new(std::collections::VecDeque::new()),
};

impl Reporting {
    fn trace(&self, view: &dyn View) -> Option<&Trace> {
        self.trace
            .get_or_init(|| view.config().trace.clone().map(Trace::new))
            .as_ref()
    }

    fn page(&self, view: &dyn View) -> Option<&Publisher> {
        self.page
            .get_or_init(|| {
                let page = Publisher::create(
                    view.pool_kind().name(),
                    view.config().group.as_deref(),
                    view.config().runtime_dir.as_deref(),
                );
                if page.is_some() {
                    start_page_thread();
                }
                page
            })
            .as_ref()
    }

    /// Writes the figures of every device seen to the live page.
    pub fn publish(&self, view: &dyn View) {
        if let Some(p) = self.page(view) {
            p.write(|| figures(view));
        }
    }

    /// Writes them if they changed since they were last written (or a second went by).
    fn refresh(&self, view: &dyn View) {
        if let Some(p) = self.page.get().and_then(|p| p.as_ref()) {
            p.refresh(|| figures(view), PAGE_HEARTBEAT);
        }
    }

    /// Writes them now, waiting for a write under way (see [`Publisher::write_now`]).
    fn write_now(&self, view: &dyn View) {
        if let Some(p) = self.page.get().and_then(|p| p.as_ref()) {
            p.write_now(|| figures(view));
        }
    }

    /// Writes the trace file (`CUDAPOOL_TRACE`), if one is configured.
    pub fn write_trace(&self, view: &dyn View) {
        if let Some(t) = self.trace(view) {
            // The figures at this moment (at exit: what the program left), so the curves end
            // where the program is, not at the last sample.
            for d in view.devices_seen() {
                let s = view.device_stats(d);
                t.counter(d, s.allocated, s.reserved, s.hard_limit);
            }
            let allocations: Vec<_> = view
                .devices_seen()
                .into_iter()
                .map(|d| (d, view.history(d)))
                .collect();
            // Whose trace it is, for the plot's titles: the program and each GPU's UUID.
            let program = std::fs::read_to_string("/proc/self/comm").unwrap_or_default();
            let gpus: Vec<String> = view
                .devices_seen()
                .into_iter()
                .filter_map(|d| {
                    let u = view.device_uuid(d)?;
                    Some(format!("\"{d}\":{}", json_str(&page::fmt_uuid(&u))))
                })
                .collect();
            let about = format!(
                ",\"program\":{},\"gpus\":{{{}}}",
                json_str(program.trim_end()),
                gpus.join(",")
            );
            t.write(view.pool_kind().name(), &about, &allocations);
        }
    }
}

impl Reporting {
    /// Records snapshot `path` and removes the oldest past `keep` (one `unlink`, never a scan
    /// of the folder: only files this process wrote are removed). What was removed, for the
    /// OOM line.
    fn keep_last(&self, path: String, keep: usize) -> String {
        let mut kept = crate::base::sync::lock(&self.snapshots);
        kept.retain(|p| *p != path);
        kept.push_back(path);
        let mut gone = Vec::new();
        while kept.len() > keep {
            if let Some(old) = kept.pop_front() {
                // Still a file of ours (never what someone put at the name since).
                use std::os::unix::fs::MetadataExt as _;
                // SAFETY: geteuid has no preconditions.
                let me = unsafe { libc::geteuid() };
                let ours = std::fs::symlink_metadata(&old)
                    .is_ok_and(|m| m.file_type().is_file() && m.uid() == me);
                if ours && std::fs::remove_file(&old).is_ok() {
                    gone.push(old);
                }
            }
        }
        match gone.as_slice() {
            [] => String::new(),
            [one] => format!("; removed {one} (CUDAPOOL_OOM_SNAPSHOT_KEEP={keep})"),
            many => format!(
                "; removed {} older (CUDAPOOL_OOM_SNAPSHOT_KEEP={keep})",
                many.len()
            ),
        }
    }
}

impl Observer for Reporting {
    fn sample(&self, view: &dyn View, dev: CUdevice) {
        if let Some(t) = self.trace(view) {
            let s = view.device_stats(dev);
            t.counter(dev, s.allocated, s.reserved, s.hard_limit);
        }
        self.publish(view);
    }

    fn asleep(&self, view: &dyn View) {
        self.write_now(view);
    }

    fn changed(&self, view: &dyn View, dev: CUdevice) {
        if let Some(t) = self.trace(view) {
            let s = view.device_stats(dev);
            t.counter(dev, s.allocated, s.reserved, s.hard_limit);
        }
    }

    fn event(&self, view: &dyn View, dev: CUdevice, name: &'static str, bytes: u64) {
        if let Some(t) = self.trace(view) {
            t.instant(dev, name, bytes);
        }
        self.sample(view, dev);
    }

    fn oom(&self, view: &dyn View, _dev: CUdevice, _bytes: u64) -> Option<String> {
        let template = view.config().oom_snapshot.as_deref()?;
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        let path = crate::base::config::snapshot_path(template, n);
        Some(match write_oom_snapshot(&path) {
            Ok(bytes) => {
                let mut gone = String::new();
                if template.contains("%n") {
                    gone = self.keep_last(path.clone(), view.config().oom_snapshot_keep);
                }
                format!("snapshot of this moment in {path} ({bytes} bytes, PyTorch's format){gone}")
            }
            Err(e) => format!("no snapshot: {e}"),
        })
    }

    fn run_held(&self, uuid: &[u8; 16], run: &[u8], configured: Option<&std::path::Path>) -> u64 {
        let (procs, _) = pages::live(false, configured);
        procs
            .iter()
            .filter(|s| s.pid != 0 && run_pid_of(s.pid).is_some_and(|r| r == run))
            .flat_map(|s| s.devices.iter())
            .filter(|f| f.uuid.as_ref() == Some(uuid))
            .map(|f| f.stats.reserved)
            .sum()
    }

    fn at_exit(&self, view: &dyn View) {
        write_exit_report(view);
        self.publish(view);
        self.write_trace(view);
        if let Some(p) = self.page(view) {
            p.remove();
        }
    }
}

/// Process `pid`'s `CUDAPOOL_RUN_PID` as it started (its environment, at most 1 MiB read).
fn run_pid_of(pid: u32) -> Option<Vec<u8>> {
    use std::io::Read as _;
    let mut env = Vec::new();
    std::fs::File::open(format!("/proc/{pid}/environ"))
        .ok()?
        .take(1 << 20)
        .read_to_end(&mut env)
        .ok()?;
    env.split(|&b| b == 0)
        .find_map(|kv| kv.strip_prefix(b"CUDAPOOL_RUN_PID="))
        .map(<[u8]>::to_vec)
}

/// The figures of every device seen.
fn figures(view: &dyn View) -> Vec<page::DeviceFigures> {
    view.devices_seen()
        .into_iter()
        .map(|d| page::DeviceFigures {
            device: d,
            uuid: view.device_uuid(d),
            stats: view.device_stats(d),
        })
        .collect()
}

/// How often the page's thread looks for a snapshot request (`cudapool snapshot PID`) and for
/// figures that changed since the page was last written.
const PAGE_POLL: std::time::Duration = std::time::Duration::from_millis(50);
/// The page is written at least this often, changed or not.
const PAGE_HEARTBEAT: std::time::Duration = std::time::Duration::from_secs(1);

/// Answers sleep request `seq` on the page, the state's figures stored first: `stat` run right
/// after `sleep --wait` shows the state the answer names (a skipped or stale write would not).
fn sleep_answered(seq: u64, answer: &str) {
    if let Some(view) = crate::state::view() {
        REPORTING.write_now(view);
    }
    if let Some(page) = REPORTING.page.get().and_then(|p| p.as_ref()) {
        page.sleep_served(seq, answer);
    }
}

/// The page's thread, started with it and gone with the process: it answers `cudapool
/// snapshot PID` within [`PAGE_POLL`], whatever the program is doing (no signal, no stop), and
/// keeps the page's figures at most [`PAGE_POLL`] behind (the hooks write it only on slow paths
/// and every few hundred operations: a program that stops allocating would show old figures).
fn start_page_thread() {
    let watch = || loop {
        std::thread::sleep(PAGE_POLL);
        if crate::base::flags::exiting() {
            return;
        }
        let Some(page) = REPORTING.page.get().and_then(|p| p.as_ref()) else {
            continue;
        };
        page.repair();
        if let Some(view) = crate::state::view() {
            // What the page says of the process's last activity (root's arbiter orders by it).
            view.last_active_ns();
            REPORTING.refresh(view);
        }
        if let Some(req) = page.pending_sleep() {
            serve_sleep::serve_sleep(req, sleep_answered);
        }
        let Some(req) = page.pending_request() else {
            continue;
        };
        // A failure goes back to the asker (`cudapool snapshot` reports it), not to the
        // program's stderr: it is the observer's, not the program's.
        let failed = write_requested_snapshot(&req).err();
        if let Some(e) = &failed {
            crate::log_at!(
                crate::base::config::LogLevel::Debug,
                "snapshot asked from outside: {}: {e}",
                req.path.display()
            );
        }
        page.served(req.seq, failed.as_deref());
    };
    let spawned = std::thread::Builder::new()
        .name("cudapool-page".into())
        .stack_size(256 << 10)
        .spawn(watch);
    if let Err(e) = spawned {
        crate::base::log::line(&format!("no page thread (no snapshots from outside): {e}"));
    }
}

/// Writes the PyTorch snapshot of this moment to `path` (`outfile`: a new file renamed over
/// the name, never through a link or into another user's file); its size.
fn write_oom_snapshot(path: &str) -> Result<usize, String> {
    let view = crate::state::view().ok_or("cudapool is not active")?;
    let bytes = torch::snapshot_torch(view)?;
    crate::base::outfile::write(std::path::Path::new(path), &bytes)
}

/// Writes the snapshot `req` asks for: a new file (never through a link, never a FIFO), mode
/// 0600, which the asker renames into place.
fn write_requested_snapshot(req: &page::SnapshotRequest) -> Result<(), String> {
    let view = crate::state::view().ok_or("cudapool is not active")?;
    if !req.path.is_absolute() {
        return Err("not an absolute path".into());
    }
    let bytes = if req.torch {
        torch::snapshot_torch(view)?
    } else {
        snapshot_json(view).into_bytes()
    };
    crate::base::outfile::create_new(&req.path, &bytes)
}

/// `1536` -> `1.50 KiB`; exact bytes below 1 KiB.
pub use crate::base::log::fmt_bytes;

/// `n` with the noun in the number it needs: "1 segment", "2 segments".
fn count(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// "once", "2 times".
fn times(n: u64) -> String {
    match n {
        1 => "once".into(),
        n => format!("{n} times"),
    }
}

/// What "memory taken" counts for a pool kind: each driver allocation it makes.
pub fn driver_counts(kind: crate::base::config::PoolKind, expandable: bool) -> &'static str {
    use crate::base::config::PoolKind;
    match kind {
        PoolKind::None => "the program's allocations, passed through",
        PoolKind::Split if expandable => {
            "ranges reserved, and each piece of memory mapped into them"
        }
        _ => "segments, and allocations passed through",
    }
}

/// One device's block of the status text; `counts`: what the driver line counts
/// ([`driver_counts`]).
pub fn device_status(dev: i32, s: &DeviceStats, counts: &str) -> String {
    let hit_rate = if s.alloc_calls == 0 {
        0.0
    } else {
        100.0 * s.cache_hits as f64 / s.alloc_calls as f64
    };
    let mut out = String::new();
    let _ = writeln!(
        out,
        "device {dev}: limit {} (soft {})",
        Limit::from_raw(s.hard_limit),
        Limit::from_raw(s.soft_limit)
    );
    let _ = writeln!(
        out,
        "  allocated {} (peak {}) in {} live allocations",
        fmt_bytes(s.allocated),
        fmt_bytes(s.allocated_peak),
        s.live_allocations
    );
    let _ = writeln!(
        out,
        "  requested {} (peak {}) of it, before rounding",
        fmt_bytes(s.requested),
        fmt_bytes(s.requested_peak)
    );
    let _ = writeln!(
        out,
        "  reserved  {} (peak {}) in {}, cached {}",
        fmt_bytes(s.reserved),
        fmt_bytes(s.reserved_peak),
        count(s.segments, "segment", "segments"),
        fmt_bytes(s.cached)
    );
    if s.overhead > 0 {
        let _ = writeln!(
            out,
            "  overhead  {} of it: the driver's own for this process (stack, heap, modules, contexts)",
            fmt_bytes(s.overhead)
        );
    }
    let _ = writeln!(
        out,
        "  calls: {} and {}, {} from the cache ({hit_rate:.1}%); {}, {}",
        count(s.alloc_calls, "allocation", "allocations"),
        count(s.free_calls, "free", "frees"),
        s.cache_hits,
        count(
            s.reclaim_retries,
            "retry after giving cache back",
            "retries after giving cache back"
        ),
        count(s.ooms, "out-of-memory answer", "out-of-memory answers")
    );
    let _ = writeln!(
        out,
        "  from the driver: memory taken {}, given back {} ({counts})",
        times(s.driver_allocs),
        times(s.driver_frees)
    );
    if let Some(line) = sleep_line(s) {
        let _ = writeln!(out, "  {line}");
    }
    out
}

/// A device's sleep as one line ("asleep: 1.00 GiB on the host", "waking: waiting for 2.00 GiB
/// of room (3.00 GiB on the host)"); `None` while awake with nothing asleep. A state number
/// outside the four reads as awake (the figures may come from another process's page).
pub fn sleep_line(s: &DeviceStats) -> Option<String> {
    use crate::state::sleep::State;
    let state = State::from_u8(u8::try_from(s.sleep_state).unwrap_or(0));
    match (state, s.asleep, s.waking_for) {
        (State::Awake, 0, _) => None,
        (State::Waking, on_host, w) if w > 0 => Some(format!(
            "waking: waiting for {} of room ({} on the host)",
            fmt_bytes(w),
            fmt_bytes(on_host)
        )),
        (state, on_host, _) => Some(format!(
            "{}: {} on the host{}",
            state.name(),
            fmt_bytes(on_host),
            why_asleep(s)
        )),
    }
}

/// Since when and why the process sleeps (`; since 12.3 s: stopped (SIGTSTP...)`), when its page
/// says.
fn why_asleep(s: &DeviceStats) -> String {
    use crate::state::sleep::Cause;
    if s.asleep_since_ns == 0 {
        return String::new();
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let cause = Cause::from_u8(u8::try_from(s.sleep_cause).unwrap_or(0));
    format!(
        "; for {:.1} s: {}",
        now.saturating_sub(s.asleep_since_ns) as f64 / 1e9,
        cause.name()
    )
}

/// The whole status: a header line and one block per device the shim has seen.
pub fn memory_status(shim: &dyn View) -> String {
    let kind = shim.pool_kind();
    let expandable = kind == crate::base::config::PoolKind::Split
        && shim.config().segments == crate::base::config::Segments::Expandable;
    let segments = if expandable {
        " with expandable segments"
    } else {
        ""
    };
    let mut out = format!(
        "memory status (cudapool {}, pool {}{segments}, pid {})\n",
        env!("CARGO_PKG_VERSION"),
        kind.name(),
        std::process::id()
    );
    let devices = shim.devices_seen();
    if devices.is_empty() {
        out.push_str("no device memory used\n");
    }
    for dev in devices {
        let counts = driver_counts(kind, expandable);
        out.push_str(&device_status(dev, &shim.device_stats(dev), counts));
    }
    out
}

/// `cudapool run --report` of a program that never asks CUDA for memory: the process the
/// command started (`CUDAPOOL_RUN_PID`, its pid after the exec) says so at exit, so that the
/// silence is not taken for a report lost. Other processes stay silent (a script's `ls`).
pub fn say_when_unused(config: &crate::base::config::Config) {
    let started = std::env::var("CUDAPOOL_RUN_PID")
        .ok()
        .and_then(|p| p.parse::<u32>().ok());
    if config.report.is_some() && started == Some(std::process::id()) {
        // SAFETY: registers a plain extern "C" function with no arguments.
        unsafe { libc::atexit(unused_at_exit) };
    }
}

extern "C" fn unused_at_exit() {
    let _ = std::panic::catch_unwind(|| {
        // A forked child inherits the handler: only the started process itself speaks.
        let started = std::env::var("CUDAPOOL_RUN_PID").ok();
        if started != Some(std::process::id().to_string()) {
            return;
        }
        if !crate::state::cuda_seen() {
            let name = std::fs::read_to_string("/proc/self/comm").unwrap_or_default();
            crate::base::log::line(&format!(
                "loaded into pid {} ({}), which asked CUDA for no memory: nothing to report",
                std::process::id(),
                name.trim()
            ));
        }
    });
}

/// At exit: the leak report (`CUDAPOOL_TRACK`) on stderr, and the status (with the leaks)
/// where `CUDAPOOL_REPORT` says.
pub fn write_exit_report(shim: &dyn View) {
    let leaks = if shim.config().track >= 1 {
        leak_report(shim)
    } else {
        String::new()
    };
    let Some(target) = &shim.config().report else {
        for line in leaks.lines() {
            crate::base::log::line(line);
        }
        return;
    };
    let text = memory_status(shim) + &leaks;
    match target {
        ReportTarget::Stderr => {
            for line in text.lines() {
                crate::base::log::line(line);
            }
        }
        ReportTarget::File(path) => {
            if let Err(e) = crate::base::outfile::write(path, text.as_bytes()) {
                crate::base::log::line(&format!("cannot write the report: {e}"));
            }
        }
    }
}

// ---- snapshot (JSON) and leak report -----------------------------------------------------

/// `s` as a JSON string literal.
fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

pub use crate::base::frames::program_frames;

/// The whole state as JSON (schema in the README, "Snapshot").
pub fn snapshot_json(shim: &dyn View) -> String {
    let mut o = String::new();
    let _ = write!(
        o,
        "{{\"version\":{},\"pid\":{},\"pool\":{},\"track\":{},\"devices\":[",
        json_str(env!("CARGO_PKG_VERSION")),
        std::process::id(),
        json_str(shim.pool_kind().name()),
        shim.config().track
    );
    let live = shim.live_allocations();
    for (i, dev) in shim.devices_seen().into_iter().enumerate() {
        if i > 0 {
            o.push(',');
        }
        let s = shim.device_stats(dev);
        let _ = write!(
            o,
            "{{\"device\":{dev},\"stats\":{{\"allocated_bytes\":{},\"peak_allocated_bytes\":{},\"requested_bytes\":{},\"peak_requested_bytes\":{},\"reserved_bytes\":{},\"peak_reserved_bytes\":{},\"cached_bytes\":{},\"live_allocations\":{},\"segments\":{},\"alloc_calls\":{},\"free_calls\":{},\"cache_hits\":{},\"driver_allocs\":{},\"driver_frees\":{},\"reclaim_retries\":{},\"ooms\":{},\"hard_limit\":{},\"soft_limit\":{}}},\"segments\":[",
            s.allocated, s.allocated_peak, s.requested, s.requested_peak, s.reserved, s.reserved_peak, s.cached,
            s.live_allocations, s.segments, s.alloc_calls, s.free_calls, s.cache_hits,
            s.driver_allocs, s.driver_frees, s.reclaim_retries, s.ooms, s.hard_limit, s.soft_limit
        );
        for (j, (ctx, seg)) in shim.segments(dev).into_iter().enumerate() {
            if j > 0 {
                o.push(',');
            }
            let _ = write!(
                o,
                "{{\"address\":\"{:#x}\",\"size\":{},\"context\":\"{ctx:#x}\",\"expandable\":{},\"blocks\":[",
                seg.ptr, seg.size, seg.expandable
            );
            for (k, b) in seg.blocks.iter().enumerate() {
                if k > 0 {
                    o.push(',');
                }
                let _ = write!(
                    o,
                    "{{\"address\":\"{:#x}\",\"size\":{},\"state\":\"{}\"}}",
                    b.ptr,
                    b.size,
                    b.state.name()
                );
            }
            o.push_str("]}");
        }
        o.push_str("],\"allocations\":[");
        let mut first = true;
        for (ptr, l, bt) in live.iter().filter(|(_, l, _)| l.device == dev) {
            if !first {
                o.push(',');
            }
            first = false;
            let origin = match l.origin {
                crate::state::Origin::Pool => "pool",
                crate::state::Origin::Counted => "counted",
                crate::state::Origin::DriverPool(_) => "driver_pool",
                crate::state::Origin::Graph => "graph",
            };
            let _ = write!(
                o,
                "{{\"address\":\"{ptr:#x}\",\"size\":{},\"block_size\":{},\"origin\":\"{origin}\",\"context\":\"{:#x}\"",
                l.size, l.handed, l.ctx
            );
            if let Some(bt) = bt {
                let frames: Vec<String> =
                    program_frames(bt, 16).iter().map(|f| json_str(f)).collect();
                let _ = write!(o, ",\"backtrace\":[{}]", frames.join(","));
            }
            o.push('}');
        }
        o.push_str("]}");
    }
    o.push_str("]}\n");
    o
}

/// `CUDAPOOL_TRACK`: the allocations never freed, one line each (and where they were made at
/// level 2). Empty when everything was freed.
pub fn leak_report(shim: &dyn View) -> String {
    let live = shim.live_allocations();
    if live.is_empty() {
        return String::new();
    }
    let bytes: u64 = live.iter().map(|(_, l, _)| l.size).sum();
    let mut out = format!(
        "{} allocations never freed, {} in all:\n",
        live.len(),
        fmt_bytes(bytes)
    );
    const SHOWN: usize = 50;
    for (ptr, l, bt) in live.iter().take(SHOWN) {
        let _ = writeln!(
            out,
            "  {ptr:#x}  {} on device {}",
            fmt_bytes(l.size),
            l.device
        );
        if let Some(bt) = bt {
            for f in program_frames(bt, 8) {
                let _ = writeln!(out, "      {f}");
            }
        }
    }
    if live.len() > SHOWN {
        let _ = writeln!(out, "  ... and {} more", live.len() - SHOWN);
    }
    out
}

#[cfg(test)]
mod tests;
