//! `cudapool stat [PID...]` and `cudapool top`: the live figures every cudapool process
//! publishes (`cudapool::report::publish`), read from outside.

use cudapool::report::fmt_bytes;
use cudapool::report::publish::{is_page_file, prefix, read, Snapshot};
use std::path::PathBuf;

/// Every page of this user: (pid, path). Pages of processes that died are removed (only a
/// regular file of this user: anything else in /dev/shm is left alone and not read).
fn pages() -> Vec<(u32, PathBuf)> {
    let prefix = prefix();
    let (dir, stem) = prefix.rsplit_once('/').expect("a path");
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix(stem).and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        // SAFETY: kill with signal 0 only checks that the process exists.
        let alive = unsafe { libc::kill(pid as libc::pid_t, 0) } == 0
            || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
        if alive {
            out.push((pid, e.path()));
        } else if is_page_file(&e.path()) {
            let _ = std::fs::remove_file(e.path());
        }
    }
    out.sort();
    out
}

fn render(s: &Snapshot) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let age = now.saturating_sub(s.updated_ns) as f64 / 1e9;
    let mut out = format!("pid {}  pool {}  updated {age:.1} s ago\n", s.pid, s.pool);
    if s.devices.is_empty() {
        out.push_str("  no device memory used yet\n");
    }
    for (dev, d) in &s.devices {
        let limit = if d.hard_limit == 0 {
            "none".to_string()
        } else {
            fmt_bytes(d.hard_limit)
        };
        let hits = if d.alloc_calls == 0 {
            0.0
        } else {
            100.0 * d.cache_hits as f64 / d.alloc_calls as f64
        };
        out.push_str(&format!(
            "  device {dev}: limit {limit}  allocated {} (peak {})  reserved {} (peak {})  cached {}\n            {} live  {} allocs  {} frees  {hits:.1}% hits  {} driver allocs  {} OOMs\n",
            fmt_bytes(d.allocated),
            fmt_bytes(d.allocated_peak),
            fmt_bytes(d.reserved),
            fmt_bytes(d.reserved_peak),
            fmt_bytes(d.cached),
            d.live_allocations,
            d.alloc_calls,
            d.free_calls,
            d.driver_allocs,
            d.ooms,
        ));
    }
    out
}

/// The text for `pids` (every cudapool process of this user when empty); `Err` if a pid was
/// asked for that publishes nothing. With `verbose`, a note for each file skipped and why.
pub fn stat_text(pids: &[u32], verbose: bool) -> Result<String, String> {
    let all = pages();
    let mut out = String::new();
    for &pid in pids {
        if !all.iter().any(|(p, _)| *p == pid) {
            return Err(format!("no cudapool process with pid {pid} (of this user)"));
        }
    }
    let mut n = 0;
    for (pid, path) in all {
        if !pids.is_empty() && !pids.contains(&pid) {
            continue;
        }
        match read(&path) {
            Ok(s) => {
                out.push_str(&render(&s));
                n += 1;
            }
            Err(why) if verbose => {
                out.push_str(&format!("(skipped {}: {why})\n", path.display()));
            }
            Err(_) => {}
        }
    }
    if n == 0 {
        out.push_str("no cudapool process is running for this user\n");
    }
    Ok(out)
}

/// `cudapool stat [-v] [PID...]`.
pub fn stat(args: &[String]) -> Result<(), String> {
    let verbose = args.iter().any(|a| a == "-v");
    let pids = args
        .iter()
        .filter(|a| *a != "-v")
        .map(|a| a.parse::<u32>().map_err(|_| format!("not a pid: {a}")))
        .collect::<Result<Vec<_>, _>>()?;
    print!("{}", stat_text(&pids, verbose)?);
    Ok(())
}

/// `cudapool top [-v] [-n COUNT] [-d SECONDS] [PID...]`: `stat` again and again, like top.
pub fn top(args: &[String]) -> Result<(), String> {
    let (mut count, mut delay, mut pids, mut verbose) = (u64::MAX, 1.0f64, Vec::new(), false);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "-v" => verbose = true,
            "-n" => {
                count = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .ok_or("-n needs a count")?
            }
            "-d" => {
                delay = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .filter(|d: &f64| *d > 0.0)
                    .ok_or("-d needs seconds")?
            }
            p => pids.push(p.parse::<u32>().map_err(|_| format!("not a pid: {p}"))?),
        }
    }
    for i in 0..count {
        let text = stat_text(&pids, verbose)?;
        // Clear the screen and go home, like top.
        print!("\x1b[H\x1b[2Jcudapool top (every {delay} s, Ctrl-C to quit)\n\n{text}");
        use std::io::Write;
        let _ = std::io::stdout().flush();
        if i + 1 < count {
            std::thread::sleep(std::time::Duration::from_secs_f64(delay));
        }
    }
    Ok(())
}
