//! A terminal's keys for `cudapool top`: `q` read as it is pressed (the terminal out of line
//! mode and echo while `top` runs, restored when it ends or on Ctrl-C), and the width lines are
//! fitted to.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// The terminal's settings before `top` changed them, for the restore (also from Ctrl-C).
static SAVED: Mutex<Option<libc::termios>> = Mutex::new(None);
static HANDLER: AtomicBool = AtomicBool::new(false);

pub struct Keys;

fn restore() {
    if let Some(t) = *SAVED.lock().unwrap_or_else(|e| e.into_inner()) {
        // SAFETY: tcsetattr on the standard input with the settings read from it.
        unsafe { libc::tcsetattr(0, libc::TCSANOW, &t) };
    }
}

extern "C" fn on_interrupt(_: libc::c_int) {
    // Best effort: a lock held by the interrupted thread is skipped, never waited on.
    if let Ok(saved) = SAVED.try_lock() {
        if let Some(t) = *saved {
            // SAFETY: tcsetattr is async-signal-safe; the settings read at the start.
            unsafe { libc::tcsetattr(0, libc::TCSANOW, &t) };
        }
    }
    // SAFETY: _exit ends the process at once (async-signal-safe).
    unsafe { libc::_exit(130) };
}

impl Keys {
    /// Keys from the standard input when it is a terminal; `None` otherwise.
    pub fn new() -> Option<Keys> {
        // SAFETY: isatty and tcgetattr on the standard input, into our own struct.
        let mut t: libc::termios = unsafe { std::mem::zeroed() };
        if unsafe { libc::isatty(0) } != 1 || unsafe { libc::tcgetattr(0, &mut t) } != 0 {
            return None;
        }
        *SAVED.lock().unwrap_or_else(|e| e.into_inner()) = Some(t);
        if !HANDLER.swap(true, Ordering::Relaxed) {
            // SAFETY: installs a plain extern "C" handler for SIGINT.
            unsafe {
                libc::signal(
                    libc::SIGINT,
                    on_interrupt as *const () as libc::sighandler_t,
                )
            };
        }
        let mut raw = t;
        raw.c_lflag &= !(libc::ICANON | libc::ECHO);
        raw.c_cc[libc::VMIN] = 0;
        raw.c_cc[libc::VTIME] = 0;
        // SAFETY: tcsetattr on the standard input with settings derived from its own.
        unsafe { libc::tcsetattr(0, libc::TCSANOW, &raw) };
        Some(Keys)
    }

    /// Waits `wait` for keys; whether `q` (or `Q`) was pressed meanwhile.
    pub fn quit_within(&self, wait: std::time::Duration) -> bool {
        let end = std::time::Instant::now() + wait;
        loop {
            let left = end.saturating_duration_since(std::time::Instant::now());
            let mut p = libc::pollfd {
                fd: 0,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: poll on one pollfd of ours.
            let n = unsafe { libc::poll(&mut p, 1, left.as_millis().min(i32::MAX as u128) as i32) };
            if n <= 0 {
                return false;
            }
            let mut b = [0u8; 16];
            // SAFETY: read into our buffer, at most its size.
            let got = unsafe { libc::read(0, b.as_mut_ptr().cast(), b.len()) };
            if got <= 0 {
                return false;
            }
            if b[..got as usize].iter().any(|&c| c == b'q' || c == b'Q') {
                return true;
            }
        }
    }
}

impl Drop for Keys {
    fn drop(&mut self) {
        restore();
    }
}

/// The terminal's width in columns, when the standard output is one.
pub fn width() -> Option<usize> {
    // SAFETY: a zeroed winsize is valid; TIOCGWINSZ fills it for a terminal.
    let mut w: libc::winsize = unsafe { std::mem::zeroed() };
    // SAFETY: ioctl on the standard output's descriptor into our struct.
    let r = unsafe { libc::ioctl(1, libc::TIOCGWINSZ, &mut w) };
    (r == 0 && w.ws_col > 0).then_some(w.ws_col as usize)
}
