//! Sleep under the conditions a hostile or merely crowded node makes: a memory cgroup too small
//! for the host copy, requests piling up, a device that never drains. Each test makes the
//! attack; before its fix, the process was killed, flooded or frozen.

use super::sleep::{ended, started};
use super::*;

/// A memory cgroup of this test's own (v1's memory hierarchy, or v2's where memory is a
/// controller), removed when dropped; its processes go back to where this test runs.
struct MemoryCgroup {
    dir: PathBuf,
    back: PathBuf,
    v2: bool,
}

impl MemoryCgroup {
    /// `None` when this machine lets no test make one (not root, no memory controller): said.
    fn make() -> Option<MemoryCgroup> {
        let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
        let v1 = own.lines().find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, c, p) = (f.next()?, f.next()?, f.next()?);
            c.split(',').any(|c| c == "memory").then(|| p.to_string())
        });
        static MADE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("cudapool-test-{}-{n}", std::process::id());
        let (back, v2) = match v1 {
            Some(p) if Path::new("/sys/fs/cgroup/memory").is_dir() => (
                PathBuf::from("/sys/fs/cgroup/memory").join(p.trim_start_matches('/')),
                false,
            ),
            _ => {
                let root = PathBuf::from("/sys/fs/cgroup");
                let controllers =
                    std::fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default();
                if !controllers.split_whitespace().any(|c| c == "memory") {
                    return None;
                }
                let _ = std::fs::write(root.join("cgroup.subtree_control"), "+memory");
                (root, true)
            }
        };
        let dir = back.join(name);
        std::fs::create_dir(&dir).ok()?;
        Some(MemoryCgroup { dir, back, v2 })
    }

    /// Moves `pid` in and sets the limit to what the cgroup uses now and `headroom` more.
    fn confine(&self, pid: u32, headroom: u64) {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string()).unwrap();
        let (limit, usage) = if self.v2 {
            ("memory.max", "memory.current")
        } else {
            ("memory.limit_in_bytes", "memory.usage_in_bytes")
        };
        let used: u64 = std::fs::read_to_string(self.dir.join(usage))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        std::fs::write(self.dir.join(limit), (used + headroom).to_string()).unwrap();
    }

    /// How often the kernel killed for this cgroup.
    fn oom_kills(&self) -> u64 {
        let file = if self.v2 {
            "memory.events"
        } else {
            "memory.oom_control"
        };
        let text = std::fs::read_to_string(self.dir.join(file)).unwrap_or_default();
        text.lines()
            .find_map(|l| l.strip_prefix("oom_kill ")?.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        if let Ok(pids) = std::fs::read_to_string(self.dir.join("cgroup.procs")) {
            for pid in pids.split_whitespace() {
                let _ = std::fs::write(self.back.join("cgroup.procs"), pid);
            }
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// A sleep whose host copy would not fit under the process's memory cgroup is refused with one
/// line (rc 2) and the process goes on, every byte intact; before, the kernel killed it at the
/// copy (`oom_kill 1`). The same for a sleep another process asks for with `--wait`.
#[test]
fn a_sleep_that_would_not_fit_in_its_memory_cgroup_is_refused_not_killed() {
    let Some(cg) = MemoryCgroup::make() else {
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        assert!(
            !root || !Path::new("/sys/fs/cgroup/memory").is_dir(),
            "root with a v1 memory hierarchy could not make a cgroup"
        );
        eprintln!("skipped: this machine lets no test make a memory cgroup");
        return;
    };
    let cli = PathBuf::from(env!("CARGO_BIN_EXE_cudapool"));
    let (mut child, mut out) = started("sleep_idle");
    let pid = child.id();
    // 70 MiB of live blocks to copy; 32 MiB of room.
    cg.confine(pid, 32 * MIB);
    let r = run_program(&cli, &["sleep", "--wait", &pid.to_string()], false, &[]);
    assert_eq!(r.code, 2, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stderr
            .contains("of host memory and the memory cgroup's limit")
            && r.stderr.contains("the process stays awake"),
        "{}",
        r.stderr
    );
    assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);
    assert_eq!(cg.oom_kills(), 0);
    // The client's own check reads every block into fresh host memory: room for it.
    cg.confine(pid, 512 * MIB);
    let (status, rest) = ended(&mut child, &mut out, "go");
    assert!(status.success(), "{status:?} {rest}");
    assert!(
        rest.contains("before_check state=0"),
        "never asleep: {rest}"
    );
    assert!(rest.contains("intact=1"), "{rest}");
    assert_eq!(cg.oom_kills(), 0);
}

/// The same process with room for its copy sleeps and wakes under the cgroup: the check
/// refuses only what would not fit.
#[test]
fn a_sleep_that_fits_in_its_memory_cgroup_happens() {
    let Some(cg) = MemoryCgroup::make() else {
        eprintln!("skipped: this machine lets no test make a memory cgroup");
        return;
    };
    let cli = PathBuf::from(env!("CARGO_BIN_EXE_cudapool"));
    let (mut child, mut out) = started("sleep_idle");
    let pid = child.id();
    cg.confine(pid, 512 * MIB);
    let r = run_program(&cli, &["sleep", "--wait", &pid.to_string()], false, &[]);
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let (status, rest) = ended(&mut child, &mut out, "go");
    assert!(status.success(), "{rest}");
    assert!(rest.contains("before_check state=2"), "{rest}");
    assert!(rest.contains("intact=1"), "{rest}");
}

/// Threads of process `pid`.
fn threads(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count())
}

/// Issue 74, item 4: 200 sleeps of 100000 s asked of a process whose capture keeps any sleep
/// from draining made 200 threads in it. One request is served at a time: 60 requests cost the
/// process one thread, and the last one asked is the one served once the capture ends.
#[test]
fn a_flood_of_sleep_requests_costs_the_process_one_thread() {
    let cli = PathBuf::from(env!("CARGO_BIN_EXE_cudapool"));
    let (mut child, mut out) = started("capture_hold");
    let pid = child.id();
    let before = threads(pid);
    for _ in 0..60 {
        let r = run_program(
            &cli,
            &["sleep", "--timeout", "100000s", &pid.to_string()],
            false,
            &[],
        );
        assert_eq!(r.code, 0, "{}", r.stderr);
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    let during = threads(pid);
    assert!(
        during <= before + 1,
        "{before} threads before the requests, {during} after"
    );
    let (status, rest) = ended(&mut child, &mut out, "end");
    assert!(status.success(), "{rest}");
    assert!(rest.contains("capture_rc=0"), "{rest}");
    assert!(rest.contains("intact=1"), "{rest}");
}

/// Issue 74, item 5: a kernel that never ends held the sleep in `cuCtxSynchronize`, which has no
/// timeout, and with it every work call of the program (waiting at the hooks for the sleep to
/// end). The wait for the device honours `--timeout`: the sleep is given up, the requester told
/// why, and the program's next call goes on at once.
#[test]
fn a_kernel_that_never_ends_gives_the_sleep_up_at_its_timeout() {
    use std::time::{Duration, Instant};
    let cli = PathBuf::from(env!("CARGO_BIN_EXE_cudapool"));
    let (mut child, mut out) = started("hang_hold");
    let pid = child.id().to_string();
    let mut asker = Command::new(&cli)
        .args(["sleep", "--wait", "--timeout", "500ms", &pid])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t = Instant::now();
    let status = loop {
        if let Some(s) = asker.try_wait().unwrap() {
            break s;
        }
        if t.elapsed() > Duration::from_secs(10) {
            let _ = asker.kill();
            let _ = child.kill();
            panic!("the sleep still waits, 10 s on, for a kernel that never ends");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(asker.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(2), "{err}");
    assert!(
        err.contains("did not finish within 500ms") && err.contains("the process stays awake"),
        "{err}"
    );
    let (status, rest) = ended(&mut child, &mut out, "go");
    assert!(status.success(), "{rest}");
    let memset = rest
        .lines()
        .find(|l| l.starts_with("memset "))
        .unwrap_or("");
    let ms: f64 = memset
        .split("ms=")
        .nth(1)
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(f64::MAX);
    assert!(memset.contains("rc=0") && ms < 2000.0, "{rest}");
    assert!(rest.contains("before_check state=0"), "{rest}");
    assert!(rest.contains("intact=1"), "{rest}");
}
