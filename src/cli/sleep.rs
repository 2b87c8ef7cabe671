//! `cudapool sleep PID... [--group NAME] [--wait] [--timeout DURATION]` and `cudapool wake
//! ...`: a running cudapool process (this user's; any process for root) puts its device memory
//! to sleep, or wakes it. The request goes through the process's live page
//! (`cudapool::report::asks::ask_sleep`); the process runs it on a thread of its own.

use cudapool::report::asks::{ask_sleep, SleepAnswer};
use cudapool::report::pages::live;
use std::time::Duration;

/// How much longer than the drain timeout `--wait` waits for the answer (the copies); it stops
/// as soon as the process is gone.
const COPY_WAIT: Duration = Duration::from_secs(600);

pub fn sleep(
    pids: &[u32],
    group: Option<&str>,
    wake: bool,
    wait: bool,
    timeout: Duration,
) -> Result<(), String> {
    let configured = super::stat::runtime_dir()?;
    let root = super::slurm_site::euid() == 0;
    let mut targets: Vec<u32> = pids.to_vec();
    if let Some(g) = group {
        let (procs, _) = live(root, configured.as_deref());
        let members: Vec<u32> = procs
            .iter()
            .filter(|p| p.group.as_deref() == Some(g) && p.pid != 0)
            .map(|p| p.pid)
            .collect();
        if members.is_empty() {
            return Err(format!("no cudapool process in group {g}"));
        }
        targets.extend(members);
    }
    if targets.is_empty() {
        return Err("name at least one PID, or --group NAME".into());
    }
    targets.sort_unstable();
    targets.dedup();
    let verb = if wake { "wake" } else { "sleep" };
    let mut failed = Vec::new();
    for pid in targets {
        let answer = ask_sleep(
            pid,
            configured.as_deref(),
            wake,
            timeout,
            wait.then_some(timeout + COPY_WAIT),
        );
        match answer {
            Ok(None) => super::out::outln(&format!(
                "{pid}: asked to {verb} (cudapool stat {pid} shows its state)"
            )),
            Ok(Some(SleepAnswer::Already)) => super::out::outln(&format!("{pid}: already asleep")),
            Ok(Some(SleepAnswer::Moved {
                device,
                copied,
                seconds,
            })) => super::out::outln(&format!(
                "{pid}: {}",
                said(device, copied, seconds, wake)
            )),
            Ok(Some(SleepAnswer::Refused { code, why })) => {
                failed.push(format!("{pid}: {}", why.unwrap_or_else(|| refusal(code, wake))))
            }
            Ok(Some(SleepAnswer::Unreadable)) => failed.push(format!(
                "{pid}: its answer is not one cudapool writes (its page was changed by another hand)"
            )),
            Err(e) if e.starts_with("no cudapool process") => {
                failed.push(super::absent::no_process(pid, root))
            }
            Err(e) => failed.push(format!("{pid}: {e}")),
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(failed.join(&format!("\ncudapool {verb}: ")))
    }
}

/// What a refusal's code means, in cudapool's own words: what is printed of another user's
/// process (whose page that user can write), never its text.
fn refusal(code: u32, wake: bool) -> String {
    use cudapool::base::cu::*;
    match code {
        CUDA_ERROR_NOT_READY => "device work did not drain in time (a graph capture under way, or a call that never returns); the process stays awake".into(),
        CUDA_ERROR_OUT_OF_MEMORY if wake => "no room came within its CUDAPOOL_WAKE_TIMEOUT; the contents stay on the host".into(),
        CUDA_ERROR_OUT_OF_MEMORY => "not enough host memory for the copy; the process stays awake".into(),
        CUDA_ERROR_NOT_INITIALIZED => "cudapool is not active in that process".into(),
        CUDA_ERROR_OPERATING_SYSTEM => "the process could not start a thread for it".into(),
        c => format!("refused (error {c}); the process's log says why"),
    }
}

/// Bytes moved, seconds and GB/s, as a line.
fn said(device: u64, copied: u64, seconds: f64, wake: bool) -> String {
    let (device, copied) = (device as f64, copied as f64);
    let rate = if seconds > 0.0 {
        format!("{:.1} GB/s", copied / seconds / 1e9)
    } else {
        "-".into()
    };
    // As `cudapool stat` writes sizes.
    let gib = |b: f64| cudapool::report::fmt_bytes(b as u64);
    if device == 0.0 {
        return if wake {
            "awake (nothing was asleep)".into()
        } else {
            "nothing to put to sleep (no memory of expandable segments; classic segments stay)"
                .into()
        };
    }
    if wake {
        format!(
            "awake: {} of device memory back, {} copied in {seconds:.3} s ({rate})",
            gib(device),
            gib(copied)
        )
    } else {
        format!(
            "asleep: {} of device memory given back, {} copied to the host in {seconds:.3} s ({rate})",
            gib(device),
            gib(copied)
        )
    }
}
