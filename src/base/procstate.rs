//! What another process (or thread) is doing, as the kernel says in `/proc/ID/stat`: for a
//! waiter that must tell a holder that is stopped from one that only has no CPU yet.

/// The state letter of process or thread `id` (`R`, `S`, `D`, `T`, `Z`, ...): the first field
/// after the command's closing parenthesis (the command may hold any byte). `None`: 0, gone,
/// or hidden from this process.
pub fn state(id: u32) -> Option<u8> {
    if id == 0 {
        return None;
    }
    let stat = std::fs::read(format!("/proc/{id}/stat")).ok()?;
    let close = stat.iter().rposition(|&b| b == b')')?;
    stat.get(close + 2).copied()
}

/// Whether a process in `state` goes on by itself: running or runnable, sleeping, or in an
/// uninterruptible wait (not stopped, traced, a zombie or dead).
pub fn goes_on(state: u8) -> bool {
    matches!(state, b'R' | b'S' | b'D' | b'W' | b'I')
}

/// How a holder is named in a line: "process 123 (state T)", "process 123 (gone)", or "another
/// process" when the kernel named none.
pub fn named(what: &str, id: Option<u32>, state: Option<u8>) -> String {
    match (id, state) {
        (Some(p), Some(s)) if p > 0 => format!("{what} {p} (state {})", s as char),
        (Some(p), None) if p > 0 => format!("{what} {p} (gone)"),
        _ => format!("another {what}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_runs_and_a_stopped_child_is_seen_stopped() {
        let me = std::process::id();
        assert!(state(me).is_some_and(goes_on));
        assert_eq!(state(0), None);
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        // SAFETY: SIGSTOP to our own child.
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGSTOP) };
        let t = std::time::Instant::now();
        while state(pid) != Some(b'T') && t.elapsed().as_secs() < 5 {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(state(pid), Some(b'T'));
        assert!(!goes_on(b'T') && !goes_on(b'Z'));
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(state(pid), None, "reaped: gone");
        assert_eq!(named("process", Some(7), Some(b'T')), "process 7 (state T)");
        assert_eq!(named("process", Some(0), None), "another process");
    }
}
