//! `cudapool stat [PID...]` and `cudapool top`: the live figures every cudapool process
//! publishes (`cudapool::report::publish`), read from outside.

use cudapool::base::config::parse_runtime_dir;
use cudapool::base::limit::Limit;
use cudapool::base::rundir::configured_from_env;
use cudapool::base::rundir_find::{squats, survey};
use cudapool::report::fmt_bytes;
use cudapool::report::page::fmt_uuid;
use cudapool::report::pages::{live, printable, read_pid, Snapshot};
use std::path::PathBuf;

/// The GPU as `stat` names it: the short form of its UUID (as `nvidia-smi -L` starts it), the
/// whole one under `--wide`.
fn gpu_name(uuid: &[u8; 16], wide: bool) -> String {
    let full = fmt_uuid(uuid);
    if wide {
        full
    } else {
        full.chars().take("GPU-12345678".len()).collect()
    }
}

/// One process's figures, in lines of at most 80 columns (figures up to 999.99 GiB, counts up
/// to a million, two-digit device ordinals; the whole UUID under `--wide` goes beyond).
/// The name of user `uid` (the system's user database), or its number.
fn user_name(uid: u32) -> String {
    let mut pw: libc::passwd = zeroed_passwd();
    let mut buf = vec![0 as libc::c_char; 4096];
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer is to a live local of the size given; the answer points into `buf`.
    let rc = unsafe { libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr(), buf.len(), &mut found) };
    if rc != 0 || found.is_null() || pw.pw_name.is_null() {
        return uid.to_string();
    }
    // SAFETY: a NUL-terminated name inside `buf`, which lives until the end of this function.
    let name = unsafe { std::ffi::CStr::from_ptr(pw.pw_name) };
    printable(name.to_bytes())
}

fn zeroed_passwd() -> libc::passwd {
    // SAFETY: passwd is plain data (integers and pointers), for which all zeroes is valid.
    unsafe { std::mem::zeroed() }
}

/// One process's block; `other`: it is another user's (root reads every user's): say whose.
fn render(s: &Snapshot, wide: bool, other: bool) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let age = now.saturating_sub(s.updated_ns) as f64 / 1e9;
    let group = s
        .group
        .as_ref()
        .map_or(String::new(), |g| format!("  group {g}"));
    // A process in a pid namespace this reader cannot see: the pid its page gives, said so.
    let pid = match s.pid {
        0 => format!("{} (its own pid namespace's)", s.claimed_pid),
        p => p.to_string(),
    };
    // The name the process gives itself (the kernel's record of it), as ps shows it.
    let comm = std::fs::read_to_string(format!("/proc/{}/comm", s.pid))
        .ok()
        .filter(|_| s.pid != 0)
        .map_or(String::new(), |c| {
            format!(" ({})", printable(c.trim_end().as_bytes()))
        });
    let user = if other {
        format!("  user {}", user_name(s.uid))
    } else {
        String::new()
    };
    let mut out = format!(
        "pid {pid}{comm}{user}  pool {}{group}  updated {age:.1} s ago\n",
        s.pool
    );
    if s.devices.is_empty() {
        out.push_str("  no device memory used yet\n");
    }
    for f in &s.devices {
        let (dev, d) = (f.device, &f.stats);
        let limit = Limit::from_raw(d.hard_limit).to_string();
        let hits = if d.alloc_calls == 0 {
            0.0
        } else {
            100.0 * d.cache_hits as f64 / d.alloc_calls as f64
        };
        let gpu = f
            .uuid
            .map_or(String::new(), |u| format!(" ({})", gpu_name(&u, wide)));
        let overhead = match d.overhead {
            0 => String::new(),
            o => format!("  overhead {}", fmt_bytes(o)),
        };
        let asleep =
            cudapool::report::sleep_line(d).map_or(String::new(), |l| format!("    {l}\n"));
        out.push_str(&format!(
            "  device {dev}{gpu}: limit {limit}  cached {}\n",
            fmt_bytes(d.cached)
        ));
        out.push_str(&format!(
            "    allocated {} (max {})  reserved {} (max {})\n",
            fmt_bytes(d.allocated),
            fmt_bytes(d.allocated_peak),
            fmt_bytes(d.reserved),
            fmt_bytes(d.reserved_peak),
        ));
        out.push_str(&format!(
            "    requested {} (max {})  {} live\n",
            fmt_bytes(d.requested),
            fmt_bytes(d.requested_peak),
            d.live_allocations,
        ));
        out.push_str(&format!(
            "    {} allocs  {} frees  {hits:.1}% from the cache\n",
            d.alloc_calls, d.free_calls,
        ));
        out.push_str(&format!(
            "    {} driver allocs  {} OOMs{overhead}\n",
            d.driver_allocs, d.ooms,
        ));
        out.push_str(&asleep);
    }
    out
}

/// `CUDAPOOL_RUNTIME_DIR` as every reader (`stat`, `top`, `snapshot`, `sleep`, `wake`) takes
/// it: checked as the library checks it (an absolute path), and a folder that is not there is
/// said, never read in silence as if it held no process.
pub fn runtime_dir() -> Result<Option<PathBuf>, String> {
    let Some(v) = std::env::var_os("CUDAPOOL_RUNTIME_DIR").filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    let p = parse_runtime_dir(&v.to_string_lossy()).map_err(|e| e.to_string())?;
    match std::fs::symlink_metadata(&p) {
        Ok(m) if m.is_dir() => Ok(Some(p)),
        Ok(_) => Err(format!(
            "CUDAPOOL_RUNTIME_DIR={}: not a directory",
            p.display()
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(format!(
            "CUDAPOOL_RUNTIME_DIR={}: no such directory: no cudapool process has used it (a process makes it when it first publishes); unset CUDAPOOL_RUNTIME_DIR to read the default",
            p.display()
        )),
        Err(e) => Err(format!("CUDAPOOL_RUNTIME_DIR={}: {e}", p.display())),
    }
}

/// The text for `pids` (every cudapool process of this user when empty); `Err` if a pid was
/// asked for that publishes nothing. With `verbose`, a note for each file skipped and why.
pub fn stat_text(pids: &[u32], verbose: bool, wide: bool) -> Result<String, String> {
    let configured = runtime_dir()?;
    // Root reads every user's processes (who holds the GPU, who sleeps and why), as `ps` does.
    let me = super::slurm_site::euid();
    let root = me == 0;
    let (mut all, skipped) = live(root, configured.as_deref());
    let mut out = String::new();
    for &pid in pids {
        if all.iter().any(|s| s.pid == pid) {
            continue;
        }
        // Not among what the read reached: looked up by its name, whatever the folders hold.
        match read_pid(pid, configured.as_deref(), root) {
            Ok(Some(s)) => all.push(s),
            Ok(None) => return Err(super::absent::no_process(pid, false)),
            Err(e) => return Err(format!("process {pid}: its page could not be read: {e}")),
        }
    }
    let late = skipped.iter().filter(|s| s.late).count();
    let mut n = 0;
    for s in &all {
        if !pids.is_empty() && !pids.contains(&s.pid) {
            continue;
        }
        out.push_str(&render(s, wide, s.uid != me));
        n += 1;
    }
    if verbose {
        let read = survey(root, configured.as_deref()).0;
        let read: Vec<String> = read
            .iter()
            .map(|d| d.path().display().to_string())
            .collect();
        out.push_str(&format!(
            "(read {})\n",
            if read.is_empty() {
                "no folder: none of this user's exists".to_string()
            } else {
                read.join(", ")
            }
        ));
        for s in &skipped {
            out.push_str(&format!("(skipped {}: {})\n", s.path.display(), s.why));
        }
    }
    if n == 0 && late > 0 {
        // Never "no process" when the read did not finish: it may have missed them.
        return Err(format!(
            "{out}could not finish reading in time ({late} {} not reached: a flood of files where the pages live, or a loaded machine); run again{}",
            if late == 1 { "place" } else { "places" },
            if verbose { "" } else { " (stat -v lists what was skipped)" }
        ));
    }
    if n == 0 {
        out.push_str(if root {
            "no cudapool process is running\n"
        } else {
            "no cudapool process is running for this user\n"
        });
    }
    // A default runtime directory another user took: where this user's processes went.
    for sq in squats(false, configured.as_deref()) {
        out.push_str(&format!("note: {}\n", sq.line()));
    }
    // The groups of the processes shown (every group of this user when no pid was named).
    let shown: Vec<&str> = all
        .iter()
        .filter(|s| pids.is_empty() || pids.contains(&s.pid))
        .filter_map(|s| s.group.as_deref())
        .collect();
    out.push_str(&groups_text(verbose, (!pids.is_empty()).then_some(&shown)));
    if root {
        // Processes root's arbiter had the driver checkpoint (they may run no cudapool).
        for f in super::checkpointed::listed() {
            if pids.is_empty() || pids.contains(&f.pid) {
                out.push_str(&super::checkpointed::stat_line(&f));
            }
        }
    }
    Ok(out)
}

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// Every group of this user: per GPU its limit, its total and each live member's part.
fn groups_text(verbose: bool, only: Option<&Vec<&str>>) -> String {
    let mut out = String::new();
    for g in cudapool::limits::group::ledgers(false, configured_from_env().as_deref()) {
        let g = match g {
            Ok(g) if only.is_some_and(|o| !o.contains(&g.name.as_str())) => continue,
            Ok(g) => g,
            Err(why) if verbose => {
                out.push_str(&format!("(skipped a group ledger: {why})\n"));
                continue;
            }
            Err(_) => continue,
        };
        if g.members.is_empty() {
            // Its last member is gone: the reader removed the ledger (it held nothing), unless
            // it is a job's, which the job's Epilog removes.
            out.push_str(&format!(
                "group {}: no member left ({})\n",
                g.name,
                if g.removed {
                    "its ledger is removed"
                } else {
                    "its ledger stays until its owner removes it"
                }
            ));
            continue;
        }
        // Members that hold nothing on any GPU (torchrun's agent, one asleep) are said apart.
        let holding = match (g.users(), g.members.len()) {
            (u, n) if u == n => String::new(),
            (0, _) => ", none holding GPU memory (asleep, or not using the GPU)".into(),
            (u, _) => format!(", {u} holding GPU memory (the others asleep, or not using the GPU)"),
        };
        out.push_str(&format!(
            "group {}: {}{holding}\n",
            g.name,
            plural(g.members.len(), "member", "members")
        ));
        for (i, (uuid, limit, total)) in g.devices.iter().enumerate() {
            let limit = Limit::from_raw(*limit).to_string();
            let parts: Vec<String> = g
                .users_of(i)
                .map(|(pid, r)| format!("pid {pid} {}", fmt_bytes(r[i])))
                .collect();
            let parts = match parts.is_empty() {
                true => String::new(),
                false => format!("  ({})", parts.join(", ")),
            };
            out.push_str(&format!(
                "  {}: limit {limit}  reserved {}{parts}\n",
                fmt_uuid(uuid),
                fmt_bytes(*total),
            ));
        }
    }
    out
}

/// `cudapool stat [-v] [-w] [PID...]`.
pub fn stat(pids: &[u32], verbose: bool, wide: bool) -> Result<(), String> {
    super::out::out(&stat_text(pids, verbose, wide)?);
    Ok(())
}

/// `cudapool top [-v] [-w] [-n COUNT] [-d SECONDS] [PID...]`: `stat` again and again, like
/// top. A named process that ends ends it too (status 0): its last figures stay on the screen.
pub fn top(pids: &[u32], verbose: bool, wide: bool, count: u64, delay: f64) -> Result<(), String> {
    // SAFETY: isatty on the standard output's descriptor.
    let terminal = unsafe { libc::isatty(1) } == 1;
    // On a terminal, `q` quits: its keys are read one at a time (restored at the end).
    let keys = terminal.then(super::keys::Keys::new).flatten();
    for i in 0..count {
        let text = match stat_text(pids, verbose, wide) {
            Ok(t) => t,
            Err(e) if i == 0 => return Err(e),
            Err(_) => {
                let root = super::slurm_site::euid() == 0;
                let (all, _) = live(root, configured_from_env().as_deref());
                let gone: Vec<String> = pids
                    .iter()
                    .filter(|p| !all.iter().any(|s| s.pid == **p))
                    .map(|p| p.to_string())
                    .collect();
                eprintln!(
                    "cudapool top: pid {} ended; the figures above are its last",
                    gone.join(", pid ")
                );
                return Ok(());
            }
        };
        if terminal {
            // Clear the screen and go home, like top; lines fit the terminal's width.
            let quit = if keys.is_some() { "q" } else { "Ctrl-C" };
            let text = fit(&text, super::keys::width().unwrap_or(usize::MAX));
            super::out::out(&format!(
                "\x1b[H\x1b[2Jcudapool top (every {delay} s, {quit} to quit)\n\n{text}"
            ));
        } else {
            // Into a pipe or a file: plain screens, one after another, each under a time line.
            super::out::out(&format!("--- cudapool top at {}\n{text}", local_time()));
        }
        if i + 1 < count {
            let wait = std::time::Duration::from_secs_f64(delay);
            match &keys {
                Some(k) if k.quit_within(wait) => break,
                Some(_) => {}
                None => std::thread::sleep(wait),
            }
        }
    }
    Ok(())
}

/// Now, as the local clock says: `2026-11-26 15:41:07`.
fn local_time() -> String {
    // SAFETY: time(NULL), then localtime_r into our own struct; strftime into our buffer.
    unsafe {
        let t = libc::time(std::ptr::null_mut());
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&t, &mut tm).is_null() {
            return format!("{t} (Unix time)");
        }
        let mut buf = [0u8; 32];
        let n = libc::strftime(
            buf.as_mut_ptr().cast(),
            buf.len(),
            c"%Y-%m-%d %H:%M:%S".as_ptr(),
            &tm,
        );
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }
}

/// `text` with every line longer than `width` broken where its fields part (two spaces), the
/// rest indented under it: a narrow terminal shows whole fields, never a word cut in two.
fn fit(text: &str, width: usize) -> String {
    let mut out = String::new();
    for line in text.lines() {
        if line.chars().count() <= width {
            out.push_str(line);
            out.push('\n');
            continue;
        }
        let indent = line.len() - line.trim_start().len() + 4;
        let mut cur = String::new();
        for (k, field) in line
            .trim_start()
            .split("  ")
            .filter(|f| !f.is_empty())
            .enumerate()
        {
            let lead = if k == 0 {
                line.len() - line.trim_start().len()
            } else {
                indent
            };
            if !cur.is_empty() && cur.chars().count() + 2 + field.chars().count() > width {
                out.push_str(&cur);
                out.push('\n');
                cur.clear();
            }
            if cur.is_empty() {
                cur = format!("{}{field}", " ".repeat(lead));
            } else {
                cur.push_str("  ");
                cur.push_str(field);
            }
        }
        out.push_str(&cur);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_lines_break_between_fields() {
        let line = "  device 0 (GPU-aa): limit none  allocated 1.00 MiB (peak 1.00 MiB)  reserved 2.00 MiB (peak 2.00 MiB)  cached 1.00 MiB";
        let out = fit(line, 60);
        for l in out.lines() {
            assert!(l.chars().count() <= 60, "{l:?}");
        }
        assert!(
            out.contains("allocated 1.00 MiB (peak 1.00 MiB)"),
            "fields whole: {out}"
        );
        assert_eq!(fit("short", 60), "short\n");
        assert!(local_time().len() >= 19);
    }

    #[test]
    fn a_process_fits_80_columns_at_its_largest() {
        let big = 999 << 30;
        let stats = cudapool::limits::budget::DeviceStats {
            allocated: big,
            allocated_peak: big,
            requested: big,
            requested_peak: big,
            reserved: big,
            reserved_peak: big,
            cached: big,
            overhead: big,
            hard_limit: big,
            live_allocations: 999_999,
            alloc_calls: 999_999,
            free_calls: 999_999,
            cache_hits: 999_999,
            driver_allocs: 999_999,
            ooms: 999_999,
            ..Default::default()
        };
        let s = Snapshot {
            pid: 4_194_303,
            claimed_pid: 4_194_303,
            uid: 0,
            pool: "binned".into(),
            group: Some("team-a".into()),
            updated_ns: 0,
            devices: vec![cudapool::report::page::DeviceFigures {
                device: 15,
                uuid: Some([0xab; 16]),
                stats,
            }],
        };
        let text = render(&s, false, false);
        assert!(text.contains("999.00 GiB (max 999.00 GiB)"), "{text}");
        for l in text.lines() {
            assert!(
                l.chars().count() <= 80,
                "{} columns: {l}",
                l.chars().count()
            );
        }
    }
}
