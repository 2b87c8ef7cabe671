//! Suspend frees the GPU (`CUDAPOOL_SUSPEND`; docs/design.md, "Suspend"). A process stopped by
//! SIGTSTP (Slurm's suspend of a job: SIGTSTP to its tasks, two seconds, then SIGSTOP or its
//! cgroup frozen; a shell's Ctrl-Z) first puts its pooled memory to sleep, then stops as SIGTSTP
//! would have stopped it; continued (SIGCONT), its next device work wakes it, as after any sleep.
//! In a group (every Slurm job's processes are in one) the stop of one process suspends the
//! whole group: the other members sleep too, and hold their wakes until it continues, since
//! Slurm signals only a job's tasks and stops the rest, a batch script's background programs,
//! without a word.
//!
//! **The handlers** are installed when the library loads, for SIGTSTP and SIGCONT, only where
//! the program left them at their default (a program that handles SIGTSTP itself keeps it, and
//! stops as it chooses). They only store, count and wake:
//! - in a process whose CUDA is set up, they wake this module's thread ([`start`]), which posts
//!   the group's suspend, sleeps, and stops the process with SIGSTOP unless it continued
//!   meanwhile;
//! - in any other process (a job's batch shell, which is what Slurm signals), they post or
//!   clear the group's suspend in its ledger (`group::relay_suspend`: system calls only, where
//!   the ledger's path is known at load: the mandatory mode's job folder), and SIGTSTP then
//!   stops the process at once.
//!
//! A process asleep for a suspend holds its wakes while it is stopped or its group suspended
//! ([`Shim::hold_while_suspended`]): the time between the sleep and the stop (up to Slurm's two
//! seconds, and a background program's whole suspend until it is frozen) cannot bring the
//! memory back.

use super::Shim;
use crate::base::config::Config;
use crate::base::config::LogLevel::{Info, Warn};
use crate::base::log::fmt_bytes;
use crate::base::sync::lock;
use crate::log_at;
use std::ffi::CString;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, Ordering::SeqCst};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// 1 after a SIGTSTP, 0 after a SIGCONT (the handlers).
static STOPPED: AtomicU32 = AtomicU32::new(0);
/// Bumped by each handler: what the thread waits on.
static EVENTS: AtomicU32 = AtomicU32::new(0);
/// The process whose thread serves the handlers (a child forked without exec has none).
static SERVED_IN: AtomicI32 = AtomicI32::new(0);
/// Whether the handlers were installed at load.
static INSTALLED: AtomicBool = AtomicBool::new(false);
/// The group's ledger, where a process that is no member posts the suspend (the mandatory
/// mode: known at load).
static RELAY: OnceLock<CString> = OnceLock::new();
/// When the process fell asleep for a suspend, until it wakes (then its group's record counts
/// the time).
static ASLEEP_SINCE: Mutex<Option<Instant>> = Mutex::new(None);

/// How long Slurm waits after SIGTSTP before it stops a job (slurmstepd's suspend): a sleep
/// that ends later left the job holding its memory while it was stopped, until then.
pub const SLURM_GRACE: Duration = Duration::from_secs(2);

/// Installs the handlers, when the library loads, if the process sleeps with its suspends
/// (`config`, and the job the library found at load: a job's process always does).
pub fn install_at_load(config: &Config) {
    let share = crate::base::job::share_at_load();
    if !(config.suspend_sleeps() || share.is_some()) {
        return;
    }
    if let Some(s) = &share {
        let path = crate::base::job::ledger_dir(&s.job)
            .join(crate::limits::group::ledger::file_name(&s.group));
        if let Ok(c) = CString::new(path.into_os_string().into_encoded_bytes()) {
            let _ = RELAY.set(c);
        }
    }
    let mut any = false;
    for (sig, handler) in [
        (libc::SIGTSTP, on_tstp as extern "C" fn(libc::c_int)),
        (libc::SIGCONT, on_cont as extern "C" fn(libc::c_int)),
    ] {
        // SAFETY: sigaction with a zeroed struct as the out-pointer only reads the action.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        if unsafe { libc::sigaction(sig, std::ptr::null(), &mut old) } != 0
            || old.sa_sigaction != libc::SIG_DFL
        {
            continue;
        }
        // SAFETY: a handler that only touches atomics and makes system calls (see below),
        // installed with an empty mask and SA_RESTART, so the program's calls go on.
        unsafe {
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = handler as usize;
            act.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut act.sa_mask);
            any |= libc::sigaction(sig, &act, std::ptr::null_mut()) == 0;
        }
    }
    INSTALLED.store(any, SeqCst);
}

fn served_here() -> bool {
    // SAFETY: getpid has no preconditions.
    SERVED_IN.load(SeqCst) == unsafe { libc::getpid() }
}

fn errno_location() -> *mut libc::c_int {
    // SAFETY: the calling thread's errno, always valid.
    unsafe { libc::__errno_location() }
}

/// SIGTSTP: only atomics and system calls (async-signal-safe), errno kept.
extern "C" fn on_tstp(_: libc::c_int) {
    // SAFETY: this thread's errno, read and written back.
    let errno = unsafe { *errno_location() };
    STOPPED.store(1, SeqCst);
    if served_here() {
        EVENTS.fetch_add(1, SeqCst);
        wake(&EVENTS);
    } else {
        // SAFETY: getpid and raise have no preconditions; both are async-signal-safe.
        unsafe {
            if let Some(path) = RELAY.get() {
                crate::limits::group::relay_suspend(path, libc::getpid() as u32);
            }
            // The stop SIGTSTP's default action makes (SIGCONT continues it here).
            libc::raise(libc::SIGSTOP);
        }
    }
    // SAFETY: as above.
    unsafe { *errno_location() = errno };
}

/// SIGCONT: as [`on_tstp`].
extern "C" fn on_cont(_: libc::c_int) {
    // SAFETY: this thread's errno, read and written back.
    let errno = unsafe { *errno_location() };
    STOPPED.store(0, SeqCst);
    if served_here() {
        EVENTS.fetch_add(1, SeqCst);
        wake(&EVENTS);
    } else if let Some(path) = RELAY.get() {
        crate::limits::group::relay_suspend(path, 0);
    }
    // SAFETY: as above.
    unsafe { *errno_location() = errno };
}

fn wake(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE on a word of this process (a private futex); async-signal-safe.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
        );
    }
}

fn wait(word: &AtomicU32, seen: u32) {
    // SAFETY: FUTEX_WAIT on a word of this process without a timeout; it returns at once if the
    // word is no longer `seen`, or at a signal.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            seen,
            std::ptr::null::<libc::timespec>(),
        );
    }
}

impl Shim {
    /// Starts the thread that serves the handlers, once the process's CUDA is set up.
    pub(super) fn start_suspend_thread(&self) {
        start();
    }
}

fn start() {
    if !INSTALLED.load(SeqCst) {
        return;
    }
    // SAFETY: getpid has no preconditions.
    SERVED_IN.store(unsafe { libc::getpid() }, SeqCst);
    let spawned = std::thread::Builder::new()
        .name("cudapool-suspend".into())
        .stack_size(256 << 10)
        .spawn(serve);
    if let Err(e) = spawned {
        SERVED_IN.store(0, SeqCst);
        log_at!(
            Warn,
            "no thread for suspends ({e}): a stop will keep the GPU memory"
        );
    }
}

fn serve() {
    let mut seen = EVENTS.load(SeqCst);
    // Whether this process posted its group's suspend (and clears it when it continues).
    let mut posted = false;
    loop {
        wait(&EVENTS, seen);
        seen = EVENTS.load(SeqCst);
        if crate::base::flags::exiting() {
            return;
        }
        let Some(shim) = Shim::active() else {
            continue;
        };
        let group = shim.joined_group();
        if STOPPED.load(SeqCst) == 1 {
            let since = Instant::now();
            if let Some(g) = &group {
                g.set_suspend(std::process::id());
                posted = true;
            }
            shim.sleep_for_suspend(since);
            // Stopped as SIGTSTP would have, unless a SIGCONT came meanwhile (then the
            // process goes on; its next work wakes it). A SIGCONT between this check and the
            // stop would be lost: the window is a few instructions, the resume seconds away.
            if STOPPED.load(SeqCst) == 1 && EVENTS.load(SeqCst) == seen {
                // SAFETY: a signal to this process.
                unsafe { libc::kill(libc::getpid(), libc::SIGSTOP) };
            }
        } else if posted {
            posted = false;
            if let Some(g) = &group {
                if g.suspended_by() == std::process::id() {
                    g.set_suspend(0);
                }
            }
        }
    }
}

impl Shim {
    /// Sleeps because the process was stopped or its group suspended (at `since`): said in
    /// one line, counted in the group's record, and said louder when it ended after Slurm's
    /// grace or did not happen (the job then held its GPU memory while it was stopped).
    pub(super) fn sleep_for_suspend(&self, since: Instant) {
        if !self.config.suspend_sleeps() {
            return;
        }
        // The device's work drains within Slurm's grace or not at all (a capture under way):
        // the stop comes then anyway, and a sleep still trying would go on after the resume.
        let result = self.sleep(-1, SLURM_GRACE, super::sleep::Cause::Suspend);
        let took = since.elapsed();
        let late = took > SLURM_GRACE;
        let group = self.joined_group();
        match result {
            Ok(m) => {
                if let Some(g) = &group {
                    g.record_suspend(m.device_bytes, late);
                }
                *lock(&ASLEEP_SINCE) = Some(Instant::now());
                if late {
                    log_at!(
                        Warn,
                        "suspended: {} went to the host in {:.1} s, after the {} s Slurm waits before it stops a job: the GPU held it until then",
                        fmt_bytes(m.device_bytes),
                        took.as_secs_f64(),
                        SLURM_GRACE.as_secs()
                    );
                } else {
                    log_at!(
                        Info,
                        "suspended: {} went to the host in {:.2} s",
                        fmt_bytes(m.device_bytes),
                        took.as_secs_f64()
                    );
                }
            }
            Err(r) => {
                if let Some(g) = &group {
                    g.record_suspend(0, true);
                }
                log_at!(
                    Warn,
                    "suspended, and its GPU memory stays while it is stopped: {}",
                    r.why
                );
            }
        }
    }

    /// The process woke: the time it stayed asleep for a suspend, if it slept for one, goes
    /// into its group's record.
    pub(super) fn woke_from_suspend(&self) {
        let Some(since) = lock(&ASLEEP_SINCE).take() else {
            return;
        };
        if let Some(g) = self.joined_group() {
            g.record_suspend_asleep(since.elapsed());
        }
    }

    /// Before a call wakes the process: waits while the process is stopped for a suspend or
    /// its group is suspended (a sleeping process is woken only once it continues).
    pub(super) fn hold_while_suspended(&self) {
        if !self.config.suspend_sleeps() || super::sleep::state() == super::sleep::State::Awake {
            return;
        }
        let group = self.joined_group();
        let stopped = || INSTALLED.load(SeqCst) && STOPPED.load(SeqCst) == 1;
        while stopped() || group.as_ref().is_some_and(|g| g.suspended()) {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}
