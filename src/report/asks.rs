//! Asking a live process something through its page (`cudapool snapshot`, `sleep`, `wake`): the
//! request is written with `pwrite` into the page of the process the kernel names (never
//! through a mapping), and the answer read back the same way. An answer comes from a file the
//! process's user can write: it is typed and bounded before anyone prints it ([`SleepAnswer`]).

use super::page::{Page, REQUEST_ERROR, REQUEST_PATH};
use super::pages::{find, find_as, open_page, printable, read_fd, uid};
use crate::base::patience::PER_FILE;
use crate::base::pio;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Asks this user's process `pid` to write a snapshot to `target` (absolute; created new by
/// the process) and waits for it, at most `timeout`. The request is written into the page with
/// `pwrite` (never through a mapping). The process answers from its snapshot thread within
/// about 50 ms.
pub fn ask_snapshot(
    pid: u32,
    configured: Option<&Path>,
    target: &Path,
    torch: bool,
    timeout: std::time::Duration,
) -> Result<(), String> {
    let bytes = target.as_os_str().as_bytes();
    if !target.is_absolute() || bytes.len() >= REQUEST_PATH || bytes.contains(&0) {
        return Err(format!(
            "{}: not an absolute path of fewer than {REQUEST_PATH} bytes",
            target.display()
        ));
    }
    let (dir, name) =
        find(pid, configured).ok_or(format!("no cudapool process {pid} of this user"))?;
    let (fd, _) = open_page(&dir, &name, libc::O_RDWR)?;
    read_fd(&fd, PER_FILE)?;
    let at = |field: usize| field as u64;
    let off_path = at(std::mem::offset_of!(Page, snap_path));
    let off_format = at(std::mem::offset_of!(Page, snap_format));
    let off_request = at(std::mem::offset_of!(Page, snap_request));
    let off_served = at(std::mem::offset_of!(Page, snap_served));
    let mut path = [0u8; REQUEST_PATH];
    path[..bytes.len()].copy_from_slice(bytes);
    write_at(&fd, &path, off_path)?;
    write_at(&fd, &(torch as u64).to_ne_bytes(), off_format)?;
    ask(pid, &fd, off_request, off_served, Some(timeout))?;
    let mut why = [0u8; REQUEST_ERROR];
    pio::read_exact_at(
        fd.as_raw_fd(),
        &mut why,
        std::mem::offset_of!(Page, snap_error) as u64,
    )?;
    let len = why.iter().position(|&b| b == 0).unwrap_or(why.len());
    if len > 0 {
        return Err(format!(
            "it could not write {}: {}",
            target.display(),
            printable(&why[..len])
        ));
    }
    Ok(())
}

/// Bumps the request word at `off_request` of process `pid`'s page and, with a `timeout`,
/// waits until the word at `off_served` names the request, or the process is gone.
fn ask(
    pid: u32,
    fd: &OwnedFd,
    off_request: u64,
    off_served: u64,
    timeout: Option<std::time::Duration>,
) -> Result<(), String> {
    let read_u64 = |off: u64| -> Result<u64, String> {
        let mut b = [0u8; 8];
        pio::read_exact_at(fd.as_raw_fd(), &mut b, off)?;
        Ok(u64::from_ne_bytes(b))
    };
    let seq = read_u64(off_request)?.wrapping_add(1);
    write_at(fd, &seq.to_ne_bytes(), off_request)?;
    let Some(timeout) = timeout else {
        return Ok(());
    };
    let deadline = std::time::Instant::now() + timeout;
    while read_u64(off_served)? < seq {
        if std::time::Instant::now() > deadline {
            return Err(format!("no answer within {} s", timeout.as_secs()));
        }
        if gone(pid) {
            return Err(format!("process {pid} ended before it answered"));
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    Ok(())
}

/// A sleep's or wake's answer as a reader takes it from the process's page (which the
/// process's user can write): typed, its figures within their bounds.
#[derive(Clone, Debug, PartialEq)]
pub enum SleepAnswer {
    /// Device bytes given back (or mapped again), bytes copied, seconds.
    Moved {
        device: u64,
        copied: u64,
        seconds: f64,
    },
    /// Not done: the code (a `CUresult`) and, only when the reader is the page's own user,
    /// the process's words (made printable).
    Refused { code: u32, why: Option<String> },
    /// A sleep found the process asleep already.
    Already,
    /// Nothing a process of cudapool writes.
    Unreadable,
}

/// The most device memory one answer may name (1 PiB).
const MOST_DEVICE_BYTES: u64 = 1 << 50;

impl SleepAnswer {
    /// Reads the answer text (`moved DEVICE COPIED SECONDS` or `refused CODE WHY`); the
    /// process's words are kept only when `own` (the reader is the page's user).
    pub fn parse(text: &[u8], own: bool) -> SleepAnswer {
        let text = String::from_utf8_lossy(text);
        let mut w = text.splitn(3, ' ');
        if text == "already" {
            return SleepAnswer::Already;
        }
        match (w.next(), w.next(), w.next()) {
            (Some("moved"), Some(d), Some(rest)) => {
                let mut r = rest.split(' ');
                let device = d.parse::<u64>().ok();
                let copied = r.next().and_then(|v| v.parse::<u64>().ok());
                let seconds = r.next().and_then(|v| v.parse::<f64>().ok());
                match (device, copied, seconds, r.next()) {
                    (Some(device), Some(copied), Some(seconds), None)
                        if device <= MOST_DEVICE_BYTES
                            && copied <= device
                            && seconds.is_finite()
                            && (0.0..=1e6).contains(&seconds) =>
                    {
                        SleepAnswer::Moved {
                            device,
                            copied,
                            seconds,
                        }
                    }
                    _ => SleepAnswer::Unreadable,
                }
            }
            (Some("refused"), Some(code), why) => match code.parse::<u32>() {
                Ok(code) => SleepAnswer::Refused {
                    code,
                    why: own.then(|| printable(why.unwrap_or("").as_bytes())),
                },
                Err(_) => SleepAnswer::Unreadable,
            },
            _ => SleepAnswer::Unreadable,
        }
    }
}

/// Asks process `pid` (this user's; any user's for root) to sleep (`wake`: to wake), a sleep
/// waiting at most `drain` for its device work. With `wait`, waits at most that long for the
/// answer and returns it; else returns `None` once the request is written.
pub fn ask_sleep(
    pid: u32,
    configured: Option<&Path>,
    wake: bool,
    drain: std::time::Duration,
    wait: Option<std::time::Duration>,
) -> Result<Option<SleepAnswer>, String> {
    ask_sleep_what(pid, configured, if wake { 2 } else { 1 }, drain, wait)
}

/// Root's arbiter asks process `pid` to sleep if its device work has been idle for `idle`,
/// and waits at most `wait` for the answer.
pub fn ask_sleep_if_idle(
    pid: u32,
    idle: std::time::Duration,
    wait: std::time::Duration,
) -> Result<Option<SleepAnswer>, String> {
    ask_sleep_what(pid, None, 3, idle, Some(wait))
}

/// The page's `sleep_what` (1 sleep, 2 wake, 3 sleep if idle) with its time in ms.
fn ask_sleep_what(
    pid: u32,
    configured: Option<&Path>,
    what: u64,
    time: std::time::Duration,
    wait: Option<std::time::Duration>,
) -> Result<Option<SleepAnswer>, String> {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let (dir, name) = find_as(pid, configured, root).ok_or(if root {
        format!("no cudapool process {pid}")
    } else {
        format!("no cudapool process {pid} of this user")
    })?;
    let (fd, _) = open_page(&dir, &name, libc::O_RDWR)?;
    read_fd(&fd, PER_FILE)?;
    let at = |field: usize| field as u64;
    write_at(
        &fd,
        &what.to_ne_bytes(),
        at(std::mem::offset_of!(Page, sleep_what)),
    )?;
    write_at(
        &fd,
        &(time.as_millis() as u64).to_ne_bytes(),
        at(std::mem::offset_of!(Page, sleep_timeout_ms)),
    )?;
    ask(
        pid,
        &fd,
        at(std::mem::offset_of!(Page, sleep_request)),
        at(std::mem::offset_of!(Page, sleep_served)),
        wait,
    )?;
    if wait.is_none() {
        return Ok(None);
    }
    let mut a = [0u8; REQUEST_ERROR];
    pio::read_exact_at(
        fd.as_raw_fd(),
        &mut a,
        at(std::mem::offset_of!(Page, sleep_answer)),
    )?;
    let len = a.iter().position(|&b| b == 0).unwrap_or(a.len());
    Ok(Some(SleepAnswer::parse(&a[..len], dir.owner == uid())))
}

/// Whether no process `pid` exists any more (another user's counts as existing).
fn gone(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return true;
    };
    // SAFETY: signal 0 only checks that the process exists; nothing is sent.
    let r = unsafe { libc::kill(pid, 0) };
    r != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
}

fn write_at(fd: &OwnedFd, b: &[u8], offset: u64) -> Result<(), String> {
    pio::write_all_at(fd.as_raw_fd(), b, offset)
        .map_err(|e| format!("cannot write the request: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 74, item 2: a user rewrote its page's answer while root waited, and root's
    /// terminal got escape sequences and a forged figure. An answer is typed and bounded; words
    /// pass only to the page's own user, made printable.
    #[test]
    fn a_sleep_answer_is_typed_and_bounded() {
        assert_eq!(
            SleepAnswer::parse(b"moved 1048576 4096 0.5", false),
            SleepAnswer::Moved {
                device: 1 << 20,
                copied: 4096,
                seconds: 0.5
            }
        );
        for forged in [
            &b"moved 1 2 0.1"[..],              // copied more than moved
            b"moved 1152921504606846976 0 0.1", // 1 EiB
            b"moved 10 1 NaN",
            b"moved 10 1 -1",
            b"moved 10 1 0.1 [2J",
            b"[2J[H[31mFORGED",
            b"refused [31m",
        ] {
            assert_eq!(
                SleepAnswer::parse(forged, true),
                SleepAnswer::Unreadable,
                "{forged:?}"
            );
        }
        let words = b"refused 2 the copy needs [2J\n1002: asleep";
        assert_eq!(
            SleepAnswer::parse(words, false),
            SleepAnswer::Refused { code: 2, why: None }
        );
        assert_eq!(
            SleepAnswer::parse(words, true),
            SleepAnswer::Refused {
                code: 2,
                why: Some("the copy needs ?[2J?1002: asleep".into())
            }
        );
        assert_eq!(printable(b"a\nb\x07\xff"), "a?b??");
        assert_eq!(printable("ok\u{1b}]0;t\u{7}".as_bytes()), "ok?]0;t?");
    }

    #[test]
    fn a_typed_answer_reads_back_as_the_page_wrote_it() {
        use crate::state::command::Answer;
        use crate::state::sleep::{Moved, Refused};
        let moved = Answer::Moved(Moved {
            device_bytes: 600 << 20,
            copied: 500 << 20,
            seconds: 0.25,
        });
        assert_eq!(
            SleepAnswer::parse(moved.text().as_bytes(), true),
            SleepAnswer::Moved {
                device: 600 << 20,
                copied: 500 << 20,
                seconds: 0.25
            }
        );
        assert_eq!(
            SleepAnswer::parse(Answer::Already.text().as_bytes(), true),
            SleepAnswer::Already
        );
        let refused = Answer::Refused(Refused {
            code: 600,
            why: "busy: its last device work was 0.1 s ago".into(),
        });
        assert_eq!(
            SleepAnswer::parse(refused.text().as_bytes(), true),
            SleepAnswer::Refused {
                code: 600,
                why: Some("busy: its last device work was 0.1 s ago".into())
            }
        );
        assert_eq!(
            (moved.code(), Answer::Already.code(), refused.code()),
            (0, 0, 600)
        );
    }
}
