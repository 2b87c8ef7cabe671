//! Sleeps and wakes asked through the page (`cudapool sleep|wake PID`, root's arbiter): the
//! page is their transport; each is a `state::command::Command`, served there one at a time on
//! a thread of its own.

use super::page;
use crate::base::cu::CUDA_ERROR_OPERATING_SYSTEM;
use crate::state::command::Command;

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
        let c = if req.wake {
            Command::Wake
        } else if req.if_idle {
            // The arbiter's request names the idleness it asks for where a sleep names its
            // drain's timeout.
            Command::SleepIfIdleForAnotherJob { idle: req.timeout }
        } else {
            Command::Sleep {
                device: -1,
                timeout: req.timeout,
                cause: crate::state::sleep::Cause::Asked,
            }
        };
        // A refusal is its code, then words for the process's own user only (`SleepAnswer`).
        answered(req.seq, &crate::state::command::serve(c).text());
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
