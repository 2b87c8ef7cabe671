//! Sleep and wake (`state::sleep`) against the fake driver, whose device memory is host memory:
//! a kernel or copy on memory unmapped under it faults, so data that comes back intact was
//! really copied out and mapped back at the same addresses.

use super::*;

const EXPANDABLE: (&str, &str) = ("CUDAPOOL_SEGMENTS", "expandable");

/// The client running `scenario` under the shim with expandable segments, its stdin and stdout
/// piped, once it said "ready"; its stdout from there on.
pub(super) fn started(
    scenario: &str,
) -> (
    std::process::Child,
    std::io::BufReader<std::process::ChildStdout>,
) {
    started_with(scenario, &[], std::process::Stdio::null())
}

/// [`started`], with `env` too and its stderr to `stderr`.
fn started_with(
    scenario: &str,
    env: &[(&str, &str)],
    stderr: impl Into<std::process::Stdio>,
) -> (
    std::process::Child,
    std::io::BufReader<std::process::ChildStdout>,
) {
    use std::io::BufRead;
    let f = fixture();
    let mut cmd = Command::new(f.dir.join("client"));
    cmd.args(["gpa", scenario]).current_dir(&f.dir);
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("CUDAPOOL_")) {
        cmd.env_remove(k);
    }
    cmd.env("LD_LIBRARY_PATH", &f.dir)
        .env("LD_PRELOAD", &f.lib)
        .env(EXPANDABLE.0, EXPANDABLE.1)
        .envs(env.iter().copied());
    let mut child = cmd
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(stderr)
        .spawn()
        .expect("client");
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while line.trim() != "ready" {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "the client ended");
    }
    (child, out)
}

/// Sends `line` to a client [`started`] gave and waits for it to end: its exit status and the
/// rest of what it printed.
pub(super) fn ended(
    child: &mut std::process::Child,
    out: &mut std::io::BufReader<std::process::ChildStdout>,
    line: &str,
) -> (std::process::ExitStatus, String) {
    use std::io::Write;
    child
        .stdin
        .as_mut()
        .unwrap()
        .write_all(format!("{line}\n").as_bytes())
        .unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(out, &mut rest).unwrap();
    (child.wait().unwrap(), rest)
}

/// What the arena holds of the client's blocks: 64 MiB, 3 MiB + 5 bytes (4 MiB), the 2 MiB
/// scratch block.
const ARENA_LIVE: u64 = (64 + 4 + 2) * MIB;

#[test]
fn every_kind_of_work_call_wakes_the_process_and_the_data_comes_back() {
    for waker in [
        "launch", "memset", "copy", "alloc", "event", "wait", "graph", "api",
    ] {
        for mode in ["gpa", "dlsym"] {
            let r = ok(client(mode, &["sleep", waker], &[EXPANDABLE]));
            let what = format!("{waker} ({mode})");
            assert_eq!(r.get("slept", "rc"), "0", "{what}: {}", r.stderr);
            assert_eq!(r.get("slept", "again"), "0", "{what}: a second sleep");
            let (before, asleep, woken) = (r.line("before"), r.line("asleep"), r.line("woken"));
            let n = |m: &std::collections::HashMap<String, String>, k: &str| -> u64 {
                m[k].parse().unwrap()
            };
            assert_eq!(asleep["state"], "2", "{what}: asleep");
            // The status report (cudapool_memory_status, CUDAPOOL_REPORT) says it too, and why.
            let status = r.get("report_asleep", "status");
            assert!(
                status.starts_with("__asleep:_70.00_MiB_on_the_host;_for_")
                    && status.ends_with("_s:_the_program's_own_call"),
                "{what}: {status}"
            );
            assert_eq!(r.get("report_woken", "status"), "none", "{what}");
            assert_eq!(n(&asleep, "asleep"), ARENA_LIVE, "{what}: {}", r.stdout);
            // The device gave back the live blocks' memory and the cache (32 MiB), uncopied.
            assert!(
                n(&asleep, "used") + ARENA_LIVE + 32 * MIB <= n(&before, "used"),
                "{what}: the device memory went back: {}",
                r.stdout
            );
            assert!(
                n(&asleep, "reserved") + ARENA_LIVE + 32 * MIB <= n(&before, "reserved"),
                "{what}: asleep bytes count in no limit: {}",
                r.stdout
            );
            assert_eq!(
                (woken["state"].as_str(), woken["asleep"].as_str()),
                ("0", "0"),
                "{what}: the call woke it: {}",
                r.stdout
            );
            assert_eq!(
                (r.get("intact", "intact"), r.get("intact", "races")),
                ("1".to_string(), "0".to_string()),
                "{what}: {}",
                r.stdout
            );
            assert_eq!(
                (r.get("again", "slept"), r.get("again", "intact")),
                ("0".to_string(), "1".to_string()),
                "{what}: a second sleep into the first one's host copies: {}",
                r.stdout
            );
            let end = r.line("end");
            assert_eq!(end["state"], "0", "{what}");
        }
    }
}

#[test]
fn a_sleep_waits_for_work_in_flight_on_every_stream() {
    let r = ok(client("gpa", &["sleep_busy"], &[EXPANDABLE]));
    assert_eq!(r.get("slept", "rc"), "0", "{}", r.stderr);
    assert_eq!(r.get("slept", "races"), "0", "unmapped under a kernel");
    assert_eq!(r.get("asleep", "state"), "2");
    assert_eq!(r.get("intact", "intact"), "1", "{}", r.stdout);
    assert_eq!(r.get("intact", "races"), "0");
}

#[test]
fn two_threads_racing_a_wake_both_find_their_data() {
    for _ in 0..5 {
        let r = ok(client("gpa", &["sleep_threads"], &[EXPANDABLE]));
        let t = r.line("threads_intact");
        assert_eq!(t["threads_intact"], "1,1", "{}", r.stdout);
        assert_eq!(t["all_intact"], "1");
        assert_eq!(r.get("woken", "state"), "0");
    }
}

#[test]
fn a_free_while_asleep_drops_the_host_copy_without_waking() {
    let r = ok(client("gpa", &["sleep_free"], &[EXPANDABLE]));
    let (asleep, freed) = (r.line("asleep"), r.line("freed"));
    assert_eq!(freed["state"], "2", "a free does not wake: {}", r.stdout);
    assert_eq!(
        asleep["asleep"].parse::<u64>().unwrap() - freed["asleep"].parse::<u64>().unwrap(),
        64 * MIB,
        "the freed block's memory is asleep no more: {}",
        r.stdout
    );
    assert_eq!(r.get("intact", "intact"), "1", "{}", r.stdout);
    assert_eq!(r.get("woken", "asleep"), "0");
    let end = r.line("end");
    assert_eq!(end["state"], "0");
}

#[test]
fn a_capture_under_way_postpones_the_sleep_and_stays_valid() {
    let r = ok(client("gpa", &["sleep_capture"], &[EXPANDABLE]));
    let s = r.line("slept");
    assert_eq!(
        (
            s["rc"].as_str(),
            s["capture_rc"].as_str(),
            s["returned_during_capture"].as_str()
        ),
        ("0", "0", "0"),
        "{}\n{}",
        r.stdout,
        r.stderr
    );
    assert_eq!(r.get("asleep", "state"), "2");
    assert_eq!(r.get("intact", "intact"), "1");
}

#[test]
fn classic_segments_and_the_none_pool_stay_and_nothing_is_lost() {
    for env in [
        vec![("CUDAPOOL_SEGMENTS", "classic")],
        vec![("CUDAPOOL_POOL", "none")],
        vec![("CUDAPOOL_POOL", "binned")],
    ] {
        let r = ok(client("gpa", &["sleep", "copy"], &env));
        assert_eq!(r.get("slept", "rc"), "0", "{env:?}");
        let asleep = r.line("asleep");
        assert_eq!(
            (asleep["state"].as_str(), asleep["asleep"].as_str()),
            ("0", "0"),
            "{env:?}: nothing can sleep, the process stays awake: {}",
            r.stdout
        );
        assert_eq!(r.get("intact", "intact"), "1", "{env:?}");
    }
}

/// `cudapool sleep|wake PID` from outside: the process's page carries the request, the process
/// runs it on a thread of its own, `stat` shows the state, and its next copy wakes it.
#[test]
fn the_cli_puts_a_process_to_sleep_and_wakes_it() {
    let cli = PathBuf::from(env!("CARGO_BIN_EXE_cudapool"));
    let (mut child, mut out) = started("sleep_idle");
    let pid = child.id().to_string();
    let cudapool = |args: &[&str]| run_program(&cli, args, false, &[]);

    let r = cudapool(&["sleep", "--wait", &pid]);
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stdout.contains(&format!("{pid}: asleep: "))
            && r.stdout.contains("70.00 MiB of device memory given back")
            && r.stdout.contains("GB/s"),
        "{}",
        r.stdout
    );
    let r = cudapool(&["stat", &pid]);
    assert!(
        r.stdout.contains("    asleep: 70.00 MiB on the host"),
        "{}",
        r.stdout
    );
    let r = cudapool(&["wake", "--wait", &pid]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stdout.contains(&format!("{pid}: awake: ")),
        "{}",
        r.stdout
    );
    // Without --wait: asked, and done soon after.
    let r = cudapool(&["sleep", &pid]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(
        r.stdout.trim(),
        format!("{pid}: asked to sleep (cudapool stat {pid} shows its state)")
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !cudapool(&["stat", &pid]).stdout.contains("asleep: ") {
        assert!(std::time::Instant::now() < deadline, "never asleep");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // Asked again: said so (issue 75, item 11: it said "nothing to put to sleep").
    let r = cudapool(&["sleep", "--wait", &pid]);
    assert_eq!(
        (r.code, r.stdout.trim()),
        (0, format!("{pid}: already asleep").as_str())
    );
    // The program's own next copy wakes it, transparently.
    let (status, rest) = ended(&mut child, &mut out, "go");
    assert!(status.success(), "{rest}");
    assert!(rest.contains("before_check state=2"), "{rest}");
    assert!(rest.contains("intact=1"), "{rest}");

    // Bad input: one line, exit 2.
    let r = cudapool(&["sleep", "1"]);
    assert_eq!(r.code, 2);
    assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);
    assert!(r.stderr.contains("no cudapool process"), "{}", r.stderr);
    let r = cudapool(&["sleep", "abc"]);
    assert_eq!(r.code, 2);
    assert!(
        r.stderr.contains("not a process id: \"abc\""),
        "{}",
        r.stderr
    );
    let r = cudapool(&["wake"]);
    assert_eq!(r.code, 2);
    assert!(r.stderr.contains("name at least one PID"), "{}", r.stderr);
    let r = cudapool(&["sleep", "--timeout", "soon", &pid]);
    assert_eq!(r.code, 2);
    assert!(r.stderr.contains("--timeout"), "{}", r.stderr);
}

/// A sleep whose device work cannot drain (a capture held open past `--timeout`): the process
/// stays awake, the command says why and exits 2, and the capture is untouched.
#[test]
fn a_sleep_that_cannot_drain_leaves_the_process_awake_and_says_why() {
    let cli = PathBuf::from(env!("CARGO_BIN_EXE_cudapool"));
    let (mut child, mut out) = started("capture_hold");
    let pid = child.id().to_string();
    let t = std::time::Instant::now();
    let r = run_program(
        &cli,
        &["sleep", "--wait", "--timeout", "300ms", &pid],
        false,
        &[],
    );
    assert_eq!(r.code, 2, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stderr.contains("did not drain within 300ms")
            && r.stderr.contains("the process stays awake"),
        "{}",
        r.stderr
    );
    assert!(t.elapsed() < std::time::Duration::from_secs(5));
    let (status, rest) = ended(&mut child, &mut out, "end");
    assert!(status.success(), "{rest}");
    assert!(
        rest.contains("capture_rc=0"),
        "the capture survived: {rest}"
    );
    assert!(rest.contains("after state=0"), "awake: {rest}");
    assert!(rest.contains("intact=1"), "{rest}");
}

/// The Python package: `sleep`, `wake`, `is_asleep` and the stats (`tests/python/check_sleep.py`).
#[test]
fn the_python_package_puts_the_process_to_sleep_and_wakes_it() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/check_sleep.py");
    let r = run_program(&python3(), &[script.to_str().unwrap()], true, &[EXPANDABLE]);
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("sleep: ok"), "{}", r.stdout);
}

/// Host memory that cannot be had for the copy (the address space limited): the sleep returns
/// `CUDA_ERROR_OUT_OF_MEMORY`, one line names the bytes, and the process stays awake with its
/// data.
#[test]
fn a_sleep_without_host_memory_leaves_the_process_awake_and_names_the_bytes() {
    let r = ok(client("gpa", &["sleep_no_host"], &[EXPANDABLE]));
    // Issue 74, item 7: a device the machine does not have (the fake has one) is an error for
    // a wake as for a sleep.
    let bad = r.line("bad_device");
    assert_eq!((bad["sleep"].as_str(), bad["wake"].as_str()), ("1", "1"));
    assert_eq!(r.get("slept", "rc"), "2", "{}{}", r.stdout, r.stderr);
    assert!(
        r.stderr
            .contains("of host memory could not be had for the copy")
            && r.stderr.contains("the process stays awake"),
        "{}",
        r.stderr
    );
    let after = r.line("after");
    assert_eq!(
        (after["state"].as_str(), after["asleep"].as_str()),
        ("0", "0"),
        "{}",
        r.stdout
    );
    assert_eq!(r.get("intact", "intact"), "1");
}

/// The program's own virtual memory (`cuMemCreate`, `cuMemMap`) sleeps with the pool's: its
/// handles go back to the device (one plain, one asked shareable but never shared), an
/// exported one stays, every byte comes back at the
/// same address, and the handle values the program holds still map, retain, answer properties
/// and release, also after the driver made the memory again under other values.
#[test]
fn the_programs_own_virtual_memory_sleeps_and_its_handles_still_work() {
    for waker in ["copy", "launch", "api"] {
        let r = ok(client("gpa", &["sleep_vmm", waker], &[EXPANDABLE]));
        let what = format!("{waker}: {}{}", r.stdout, r.stderr);
        assert_eq!(r.get("vmm", "slept"), "0", "{what}");
        // The pool's live blocks and two of the handles (2 MiB each); not the exported one,
        // nor the one mapped in half.
        assert_eq!(
            r.num("vmm_asleep", "asleep"),
            ARENA_LIVE + 4 * MIB,
            "{what}"
        );
        assert!(r.num("vmm", "dropped") >= ARENA_LIVE + 4 * MIB, "{what}");
        assert_eq!(r.get("vmm", "retained_same"), "1", "{what}");
        let line = r.line("vmm");
        for key in [
            "intact",
            "retain_same",
            "props",
            "distinct",
            "new_ok",
            "pool",
            "partial",
        ] {
            let got = r
                .stdout
                .lines()
                .find(|l| l.starts_with("vmm intact="))
                .and_then(|l| {
                    l.split(' ')
                        .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
                });
            assert_eq!(got, Some("1"), "{key}: {what} {line:?}");
        }
        let again = r
            .stdout
            .lines()
            .find(|l| l.starts_with("vmm again"))
            .unwrap_or("");
        assert_eq!(again, "vmm again slept=0 intact=1", "{what}");
        let end = r
            .stdout
            .lines()
            .find(|l| l.starts_with("vmm released"))
            .unwrap_or("");
        assert_eq!(end, "vmm released=1 extra_refused=1 vm_left=0", "{what}");
    }
}

/// A context's end is work: a primary context reset while asleep wakes the process first (a
/// sleep under way would finish first), so nothing of the dead context is left asleep, and the
/// context made again serves allocations.
#[test]
fn a_context_reset_while_asleep_wakes_the_process_first() {
    // Expandable segments named: under the suite's classic run nothing would sleep.
    let r = ok(client("gpa", &["sleep_reset"], &[EXPANDABLE]));
    let what = format!("{}{}", r.stdout, r.stderr);
    assert_eq!(r.get("reset_asleep", "state"), "2", "{what}");
    assert!(r.num("reset_asleep", "asleep") > 0, "{what}");
    assert_eq!(r.get("reset_done", "state"), "0", "{what}");
    assert_eq!(r.num("reset_done", "asleep"), 0, "{what}");
    assert_eq!(r.get("reset", "slept"), "0", "{what}");
    assert_eq!(r.get("reset", "after_ok"), "1", "{what}");
}

/// `cudapool sleep --wait PID` whose process ends before it answers (stopped, then killed)
/// says so and exits 2 at once, instead of waiting out `--timeout` and the copies' allowance.
#[test]
fn a_sleep_waited_for_ends_when_the_process_does() {
    let cli = PathBuf::from(env!("CARGO_BIN_EXE_cudapool"));
    let (mut child, _out) = started("sleep_idle");
    let pid = child.id();
    // SAFETY: a child of this test; SIGSTOP only stops it.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGSTOP) }, 0);
    let mut asker = std::process::Command::new(&cli)
        .args(["sleep", "--wait", "--timeout", "300ms", &pid.to_string()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(800));
    assert!(
        asker.try_wait().unwrap().is_none(),
        "still waiting for the copies"
    );
    child.kill().unwrap();
    child.wait().unwrap();
    let t = std::time::Instant::now();
    let status = loop {
        if let Some(s) = asker.try_wait().unwrap() {
            break s;
        }
        if t.elapsed() > std::time::Duration::from_secs(10) {
            let _ = asker.kill();
            panic!("cudapool sleep --wait still waits 10 s after its process ended");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(asker.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(2), "{err}");
    assert!(err.contains("ended before it answered"), "{err}");
}

/// A sleep's and a wake's driver calls grow with the blocks, not with their bytes: eight blocks of
/// 32 MiB are unmapped, made again and mapped as at most eight handles, three times over, every
/// handle given back made again and every byte copied out copied in. (A build that mapped such
/// blocks in 2 MiB handles made 128 a wake; on an H200 each costs some 60-120 us, and 20 GiB in
/// 256 MiB blocks woke at 36.5 GB/s against 47.8.)
#[test]
fn a_wake_makes_a_handle_per_block_not_per_chunk() {
    let r = ok(client("gpa", &["sleep_cost", "8", "32"], &[EXPANDABLE]));
    let rounds: Vec<HashMap<&str, u64>> = r
        .stdout
        .lines()
        .filter(|l| l.starts_with("sleep_cost "))
        .map(|l| {
            l.split_whitespace()
                .filter_map(|kv| kv.split_once('='))
                .filter_map(|(k, v)| Some((k, v.parse::<u64>().ok()?)))
                .collect()
        })
        .collect();
    assert_eq!(rounds.len(), 3, "{}\n{}", r.stdout, r.stderr);
    for (i, f) in rounds.iter().enumerate() {
        assert_eq!(f["intact"], 1, "round {i}: {}", r.stdout);
        assert!(
            (1..=8).contains(&f["creates"]) && f["maps"] == f["creates"],
            "round {i}: a wake of 8 blocks made {} handles and {} maps",
            f["creates"],
            f["maps"]
        );
        assert_eq!(f["unmaps"], f["creates"], "round {i}: {}", r.stdout);
        assert_eq!(f["copies_in"], f["copies_out"], "round {i}: {}", r.stdout);
    }
}

/// `CUDAPOOL_SLEEP_READY=1`: while the process is awake, host memory as large as what it holds
/// is made ahead (its pages faulted), and the first sleep copies into it; the data comes back
/// intact. Without the setting nothing is made ahead.
#[test]
fn with_sleep_ready_the_first_sleep_copies_into_memory_made_ahead() {
    let cli = PathBuf::from(env!("CARGO_BIN_EXE_cudapool"));
    for ready in ["1", "0"] {
        let f = fixture();
        let log = f
            .dir
            .join(format!("sleep-ready-{ready}-{}.log", std::process::id()));
        let (mut child, mut out) = started_with(
            "sleep_idle",
            &[("CUDAPOOL_SLEEP_READY", ready), ("CUDAPOOL_LOG", "debug")],
            std::fs::File::create(&log).unwrap(),
        );
        let said = || std::fs::read_to_string(&log).unwrap_or_default();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while ready == "1" && !said().contains("of host memory ready for a sleep") {
            assert!(
                std::time::Instant::now() < deadline,
                "nothing made ready: {}",
                said()
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        if ready == "0" {
            std::thread::sleep(std::time::Duration::from_millis(1200));
        }
        let pid = child.id().to_string();
        let r = run_program(&cli, &["sleep", "--wait", &pid], false, &[]);
        assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
        let (status, rest) = ended(&mut child, &mut out, "go");
        assert!(status.success() && rest.contains("intact=1"), "{rest}");
        let text = said();
        let _ = std::fs::remove_file(&log);
        if ready == "1" {
            assert!(
                text.contains("the copy goes into 70.00 MiB of host memory made ready ahead"),
                "{text}"
            );
        } else {
            assert!(!text.contains("made ready"), "{text}");
        }
    }
}
