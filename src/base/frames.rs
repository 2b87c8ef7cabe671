//! The program's own frames of a backtrace (reports, snapshots, and the names NVIDIA's tools
//! show for blocks under `CUDAPOOL_TRACK=2`).

use std::fmt::Write as _;

/// The frames of a backtrace that belong to the program: cudapool's own frames, the Rust
/// runtime's and the unwinder's are dropped. At most `max`.
pub fn program_frames(bt: &std::backtrace::Backtrace, max: usize) -> Vec<String> {
    let text = bt.to_string();
    let mut frames: Vec<String> = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        // Frame lines look like "12: symbol"; "at file:line" lines follow some of them.
        let Some((num, sym)) = line.split_once(": ") else {
            if let Some(at) = line.strip_prefix("at ") {
                if let Some(last) = frames.last_mut() {
                    let _ = write!(last, " ({at})");
                }
            }
            continue;
        };
        if num.parse::<u32>().is_err() {
            continue;
        }
        let ours = [
            "cudapool::",
            "std::",
            "core::",
            "backtrace",
            "__rust",
            "catch_unwind",
            "<alloc::",
        ]
        .iter()
        .any(|p| sym.contains(p))
            || sym.starts_with("cu") && frames.is_empty();
        if ours && frames.is_empty() {
            continue;
        }
        frames.push(sym.to_string());
        if frames.len() == max {
            break;
        }
    }
    frames
}
