//! Sleeps and wakes asked through the page (`cudapool sleep|wake PID`), served by the page's
//! thread one at a time on a thread of their own.

use super::page;
use crate::base::cu::{CUDA_ERROR_NOT_INITIALIZED, CUDA_ERROR_OPERATING_SYSTEM};

/// The last sleep or wake asked through the page that was taken: each runs once.
static SLEEP_TAKEN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Whether a sleep or wake asked through the page is being served.
static SLEEP_SERVING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The longest a sleep asked through the page waits for device work to drain, whatever the
/// request says: a request of hours would hold the one that serves them for hours.
const MOST_DRAIN: std::time::Duration = std::time::Duration::from_secs(600);

/// Runs a sleep or wake asked through the page (`cudapool sleep|wake PID`) on a thread of its
/// own, so that the page keeps showing the state as it goes, and answers it there through
/// `answered` (the request's number and the answer).
pub(super) fn serve_sleep(req: page::SleepRequest, answered: fn(u64, &str)) {
    use std::sync::atomic::Ordering::{AcqRel, Relaxed, Release};
    // One at a time: while one runs, later requests wait on the page, and the newest of them
    // is served when it ends (its answer is theirs). A user who asks 200 times costs the
    // process one thread, not 200.
    if SLEEP_SERVING.swap(true, AcqRel) {
        return;
    }
    if SLEEP_TAKEN.swap(req.seq, Relaxed) == req.seq {
        SLEEP_SERVING.store(false, Release);
        return;
    }
    let req = page::SleepRequest {
        timeout: req.timeout.min(MOST_DRAIN),
        ..req
    };
    let run = move || {
        let moved = |m: crate::state::sleep::Moved| {
            format!("moved {} {} {:.6}", m.device_bytes, m.copied, m.seconds)
        };
        // A refusal is its code, then words for the process's own user only (`SleepAnswer`).
        let answer = match crate::state::Shim::active() {
            None => format!("refused {CUDA_ERROR_NOT_INITIALIZED} cudapool is not active in this process"),
            Some(shim) if req.wake => match shim.wake() {
                Ok(m) => moved(m),
                Err(e) => format!("refused {e} no room came within CUDAPOOL_WAKE_TIMEOUT; the contents stay on the host"),
            },
            Some(_) if crate::state::sleep::state() == crate::state::sleep::State::Asleep => {
                "already".to_string()
            }
            Some(shim) if req.if_idle => match shim.sleep_if_idle_for_another_job(req.timeout) {
                Ok(m) => moved(m),
                Err(r) => format!("refused {} {}", r.code, r.why),
            },
            Some(shim) => match shim.sleep(-1, req.timeout, crate::state::sleep::Cause::Asked) {
                Ok(m) => moved(m),
                Err(r) => format!("refused {} {}", r.code, r.why),
            },
        };
        answered(req.seq, &answer);
        SLEEP_SERVING.store(false, Release);
    };
    let spawned = std::thread::Builder::new()
        .name("cudapool-sleep".into())
        .stack_size(256 << 10)
        .spawn(run);
    if let Err(e) = spawned {
        SLEEP_SERVING.store(false, Release);
        answered(
            req.seq,
            &format!("refused {CUDA_ERROR_OPERATING_SYSTEM} no thread for it: {e}"),
        );
    }
}
