//! Human-readable figures: the memory status (`CUDAPOOL_REPORT`, `cudapool_memory_status`).

use crate::budget::DeviceStats;
use crate::config::ReportTarget;
use crate::shim::Shim;
use std::fmt::Write as _;

/// `1536` -> `1.50 KiB`; exact bytes below 1 KiB.
pub fn fmt_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if b < 1024 {
        return format!("{b} B");
    }
    let mut v = b as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.2} {}", UNITS[unit])
}

fn limit(l: u64) -> String {
    if l == 0 {
        "none".into()
    } else {
        fmt_bytes(l)
    }
}

/// One device's block of the status text.
pub fn device_status(dev: i32, s: &DeviceStats) -> String {
    let hit_rate = if s.alloc_calls == 0 {
        0.0
    } else {
        100.0 * s.cache_hits as f64 / s.alloc_calls as f64
    };
    let mut out = String::new();
    let _ = writeln!(
        out,
        "device {dev}: limit {} (soft {})",
        limit(s.hard_limit),
        limit(s.soft_limit)
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
        "  reserved  {} (peak {}) in {} segments, cached {}",
        fmt_bytes(s.reserved),
        fmt_bytes(s.reserved_peak),
        s.segments,
        fmt_bytes(s.cached)
    );
    let _ = writeln!(
        out,
        "  calls: {} allocs, {} frees, {} cache hits ({hit_rate:.1}%); driver: {} allocs, {} frees; {} reclaim retries, {} OOMs",
        s.alloc_calls, s.free_calls, s.cache_hits, s.driver_allocs, s.driver_frees, s.reclaim_retries, s.ooms
    );
    out
}

/// The whole status: a header line and one block per device the shim has seen.
pub fn memory_status(shim: &Shim) -> String {
    let mut out = format!(
        "memory status (cudapool {}, pool {}, pid {})\n",
        env!("CARGO_PKG_VERSION"),
        shim.pool_kind().name(),
        std::process::id()
    );
    let devices = shim.devices_seen();
    if devices.is_empty() {
        out.push_str("no device memory used\n");
    }
    for dev in devices {
        out.push_str(&device_status(dev, &shim.device_stats(dev)));
    }
    out
}

/// At exit, where `CUDAPOOL_REPORT` says.
pub fn write_exit_report(shim: &Shim) {
    let Some(target) = &shim.config.report else {
        return;
    };
    let text = memory_status(shim);
    match target {
        ReportTarget::Stderr => {
            for line in text.lines() {
                crate::log::line(line);
            }
        }
        ReportTarget::File(path) => {
            if let Err(e) = std::fs::write(path, &text) {
                crate::log::line(&format!("cannot write report to {}: {e}", path.display()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_formatting() {
        assert_eq!(fmt_bytes(0), "0 B");
        assert_eq!(fmt_bytes(1023), "1023 B");
        assert_eq!(fmt_bytes(1536), "1.50 KiB");
        assert_eq!(fmt_bytes(64 << 20), "64.00 MiB");
        assert_eq!(fmt_bytes(3 << 30), "3.00 GiB");
    }

    #[test]
    fn device_block_shows_every_counter() {
        let s = DeviceStats {
            allocated: 1 << 20,
            alloc_calls: 4,
            cache_hits: 1,
            ooms: 2,
            hard_limit: 1 << 30,
            ..Default::default()
        };
        let t = device_status(0, &s);
        assert!(t.contains("limit 1.00 GiB (soft none)"), "{t}");
        assert!(
            t.contains("4 allocs") && t.contains("(25.0%)") && t.contains("2 OOMs"),
            "{t}"
        );
    }
}
