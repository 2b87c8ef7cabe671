//! Diagnostics on stderr, one line each, prefixed `cudapool:` (`CUDAPOOL_LOG`).
//!
//! Writes go straight to fd 2 with one `write(2)`: no lock that a hook could re-enter, no
//! panic if stderr is closed, no allocation of device memory.

use crate::base::config::LogLevel;
use std::sync::atomic::{AtomicU8, Ordering};

static LEVEL: AtomicU8 = AtomicU8::new(LogLevel::Warn as u8);

pub fn set_level(level: LogLevel) {
    LEVEL.store(level as u8, Ordering::Relaxed);
}

pub fn enabled(level: LogLevel) -> bool {
    level as u8 <= LEVEL.load(Ordering::Relaxed)
}

/// Writes `cudapool: <msg>\n` to stderr, whatever the level.
pub fn line(msg: &str) {
    let text = format!("cudapool: {msg}\n");
    // SAFETY: fd 2 is only written to; the buffer is valid for its length. A short or failed
    // write loses a diagnostic, nothing else.
    unsafe {
        libc::write(2, text.as_ptr().cast(), text.len());
    }
}

#[macro_export]
macro_rules! log_at {
    ($level:expr, $($arg:tt)*) => {
        if $crate::base::log::enabled($level) {
            $crate::base::log::line(&format!($($arg)*));
        }
    };
}

/// A UUID as `nvidia-smi -L` prints it: `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
pub fn fmt_uuid(u: &[u8; 16]) -> String {
    let h: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// Bytes for people: `512 B`, `1.50 KiB`, ... `2.00 GiB`.
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
