//! What a process is asked to do with its memory, whoever asks, as one typed command with one
//! typed answer, served here: the page (`cudapool sleep|wake PID`, root's arbiter), the C API
//! and Python (`cudapool_sleep`, `cudapool_wake`) and the group's ledger (another member short
//! of room) are transports that build a [`Command`] and carry its [`Answer`] back. The page's
//! words for an answer are [`Answer::text`], which `report::asks::SleepAnswer::parse` reads.

use super::sleep::{state, Cause, Moved, Refused, State};
use super::Shim;
use crate::base::cu::{CUdevice, CUresult, CUDA_ERROR_NOT_INITIALIZED};
use std::time::Duration;

/// A request to the process.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Command {
    /// Sleep on `device` (-1: every device) once device work has drained within `timeout`.
    Sleep {
        device: CUdevice,
        timeout: Duration,
        cause: Cause,
    },
    /// Root's arbiter, for another job: sleep if device work has been idle for `idle`.
    SleepIfIdleForAnotherJob { idle: Duration },
    /// Another member of the group, short of room on the GPU `uuid`: sleep there if idle for
    /// `idle` and above the process's request.
    SleepIfIdleOn { uuid: [u8; 16], idle: Duration },
    /// Another member of the group, short of `bytes` on the GPU `uuid`: give back cached
    /// memory there.
    Lend { uuid: [u8; 16], bytes: u64 },
    /// Wake now (waiting for room up to `CUDAPOOL_WAKE_TIMEOUT`).
    Wake,
}

/// What came of a [`Command`].
#[derive(Clone, Debug, PartialEq)]
pub enum Answer {
    /// Done: what moved (a sleep's or a wake's), or a lend's bytes as `device_bytes`.
    Moved(Moved),
    /// A sleep found the process asleep already.
    Already,
    /// Not done, and why (the process is as it was).
    Refused(Refused),
}

impl Answer {
    /// The device bytes it gave back or mapped again (0 unless moved).
    pub fn device_bytes(&self) -> u64 {
        match self {
            Answer::Moved(m) => m.device_bytes,
            _ => 0,
        }
    }

    /// The page's words for it: `moved DEVICE COPIED SECONDS`, `already` or `refused CODE WHY`.
    pub fn text(&self) -> String {
        match self {
            Answer::Moved(m) => format!("moved {} {} {:.6}", m.device_bytes, m.copied, m.seconds),
            Answer::Already => "already".to_string(),
            Answer::Refused(r) => format!("refused {} {}", r.code, r.why),
        }
    }

    /// As the C API says it: 0 when done (or asleep already), else the refusal's code.
    pub fn code(&self) -> CUresult {
        match self {
            Answer::Refused(r) => r.code,
            _ => 0,
        }
    }
}

impl From<Result<Moved, Refused>> for Answer {
    fn from(r: Result<Moved, Refused>) -> Answer {
        r.map_or_else(Answer::Refused, Answer::Moved)
    }
}

/// Serves `c` in this process (`Refused` when cudapool is not active in it).
pub fn serve(c: Command) -> Answer {
    match Shim::active() {
        Some(shim) => shim.serve(c),
        None => Answer::Refused(Refused {
            code: CUDA_ERROR_NOT_INITIALIZED,
            why: "cudapool is not active in this process".into(),
        }),
    }
}

impl Shim {
    /// Serves `c` (see the module's notes).
    pub fn serve(&self, c: Command) -> Answer {
        let asleep = || state() == State::Asleep;
        match c {
            Command::Wake => match self.wake() {
                Ok(m) => Answer::Moved(m),
                Err(code) => Answer::Refused(Refused {
                    code,
                    why: "no room came within CUDAPOOL_WAKE_TIMEOUT; the contents stay on the host"
                        .into(),
                }),
            },
            Command::Sleep { .. } | Command::SleepIfIdleForAnotherJob { .. } if asleep() => {
                Answer::Already
            }
            Command::Sleep {
                device,
                timeout,
                cause,
            } => self.sleep(device, timeout, cause).into(),
            Command::SleepIfIdleForAnotherJob { idle } => {
                self.sleep_if_idle_for_another_job(idle).into()
            }
            Command::SleepIfIdleOn { uuid, idle } => Answer::Moved(Moved {
                device_bytes: self.sleep_if_idle(&uuid, idle),
                ..Moved::default()
            }),
            Command::Lend { uuid, bytes } => Answer::Moved(Moved {
                device_bytes: self.lend(&uuid, bytes),
                ..Moved::default()
            }),
        }
    }
}

impl Shim {
    /// Serves the group `g`'s requests to this process on the group's thread.
    pub(super) fn serve_group(&self, g: &std::sync::Arc<crate::limits::group::Group>) {
        g.serve(Box::new(MemberSide));
    }
}

/// The group's ledger as a transport: what the group's thread of this process is asked by
/// another member (see `limits::group::Lender`).
struct MemberSide;

impl crate::limits::group::Lender for MemberSide {
    fn lend(&self, uuid: &[u8; 16], bytes: u64) -> u64 {
        let uuid = *uuid;
        serve(Command::Lend { uuid, bytes }).device_bytes()
    }

    fn sleep_if_idle(&self, uuid: &[u8; 16], idle: Duration) -> u64 {
        let uuid = *uuid;
        serve(Command::SleepIfIdleOn { uuid, idle }).device_bytes()
    }

    fn last_active_ns(&self) -> u64 {
        Shim::active().map_or(0, |s| s.last_active_ns())
    }

    fn suspend(&self) {
        // Another process of the group was stopped.
        if let Some(s) = Shim::active() {
            s.sleep_for_suspend(std::time::Instant::now());
        }
    }
}
