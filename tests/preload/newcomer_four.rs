//! What a newcomer met in round four (issue 75), each now said or drawn the way a user expects:
//! before, in brackets.

use super::common::*;
use super::python3;
/// Plays `ops` (benches/traces' format: `a ID SIZE`, `f ID`) through the driver API with `env`.
fn play(name: &str, ops: &str, env: &[(&str, &str)]) -> Run {
    let file = fixture().dir.join(name);
    std::fs::write(&file, ops).unwrap();
    ok(client(
        "link",
        &["trace", file.to_str().unwrap(), "1", "0", "0"],
        env,
    ))
}

/// Item 4: the trace's allocated curve follows every allocation and free, cache hits included, and ends
/// where the program left it. Before, counters were taken only on slow paths: a ramp of eight
/// cached allocations showed as one jump, and a program that freed everything ended its picture
/// with 64 MiB allocated (read as a leak).
#[test]
fn a_traces_curve_follows_each_cached_allocation_and_ends_at_exit() {
    let trace = fixture().dir.join("ramp.json");
    // Twice: eight 8 MiB blocks, then all freed (the second ramp is served by the cache).
    let mut text = String::new();
    for round in 0..2 {
        for i in 0..8 {
            text += &format!("a {} {}\n", round * 8 + i, 8 << 20);
        }
        for i in 0..8 {
            text += &format!("f {}\n", round * 8 + i);
        }
    }
    let trace_s = trace.to_str().unwrap();
    play("ramp.ops", &text, &[("CUDAPOOL_TRACE", trace_s)]);
    let check = r#"
import json, sys
t = json.load(open(sys.argv[1]))
c = [e["args"]["allocated"] >> 20 for e in t["traceEvents"] if e["ph"] == "C" and e["name"] == "device 0 memory"]
steps = [8 * k for k in range(1, 9)] + [8 * k for k in range(7, -1, -1)]
def has(seq, sub):
    it = iter(seq)
    return all(any(x == want for x in it) for want in sub)
assert has(c, steps + steps), c
assert c[-1] == 0, c
print("ramp: ok")
"#;
    let r = run_program(&python3(), &["-c", check, trace_s], false, &[]);
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
}

/// Item 12: the exit report's driver line says what its counts count, for each pool kind [each
/// said "an expandable segment takes it 2 MiB at a time", and the counts did not follow it].
#[test]
fn the_reports_driver_line_says_what_it_counts() {
    // Three 3 MiB blocks, freed, then three more (a pool serves them from its cache).
    let mut ops = String::new();
    for round in 0..2 {
        for i in 0..3 {
            ops += &format!("a {} {}\n", round * 3 + i, 3 << 20);
        }
        for i in 0..3 {
            ops += &format!("f {}\n", round * 3 + i);
        }
    }
    let line = |pool: &str, segments: &str| {
        let r = play(
            "three.ops",
            &ops,
            &[
                ("CUDAPOOL_POOL", pool),
                ("CUDAPOOL_SEGMENTS", segments),
                ("CUDAPOOL_REPORT", "yes"),
                ("CUDAPOOL_CACHE_IDLE", ""),
            ],
        );
        r.stderr
            .lines()
            .find_map(|l| {
                l.split_once("from the driver: ")
                    .map(|(_, t)| t.to_string())
            })
            .unwrap_or_else(|| panic!("{pool}: no driver line in {}", r.stderr))
    };
    // Nothing pooled: the program's six allocations are the driver's.
    assert_eq!(
        line("none", "classic"),
        "memory taken 6 times, given back 6 times (the program's allocations, passed through)"
    );
    for pool in ["binned", "simple"] {
        let l = line(pool, "classic");
        assert!(
            l.ends_with("(segments, and allocations passed through)"),
            "{pool}: {l}"
        );
        // Every block was freed: what was taken was given back (at its free or at exit).
        let n = |what: &str| {
            l.split_once(what)
                .unwrap()
                .1
                .split(' ')
                .next()
                .unwrap()
                .to_string()
        };
        assert_eq!(n("memory taken "), n("given back "), "{pool}: {l}");
    }
    let l = line("split", "expandable");
    assert!(
        l.ends_with("(ranges reserved, and each piece of memory mapped into them)"),
        "{l}"
    );
    assert!(!line("split", "classic").contains("expandable"));
}

/// Item 6: a pid that publishes nothing is told apart by what /proc shows of it [every case
/// blamed CUDAPOOL_RUNTIME_DIR]: a process without cudapool, one with cudapool that has not
/// used CUDA yet, another user's (as root), one under another runtime folder
/// (`first_steps.rs`'s `stat_fits_and_top_sees_a_process_end`), and none.
#[test]
fn a_pid_that_publishes_nothing_is_told_apart() {
    use std::os::unix::process::CommandExt as _;
    let f = fixture();
    let cli = std::path::PathBuf::from(env!("CARGO_BIN_EXE_cudapool"));
    let said = |pid: u32| {
        let r = run_program(&cli, &["stat", &pid.to_string()], false, &[]);
        assert_eq!(r.code, 2, "{}{}", r.stdout, r.stderr);
        r.stderr
    };
    let mut plain = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let mut preloaded = std::process::Command::new("sleep")
        .arg("30")
        .env("LD_PRELOAD", &f.lib)
        .spawn()
        .unwrap();
    // The library is loaded before `sleep` runs its main: give the loader a moment.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let e = said(plain.id());
    assert!(
        e.contains(&format!(
            "pid {} runs without cudapool (start it with `cudapool run -- PROGRAM`",
            plain.id()
        )),
        "{e}"
    );
    let e = said(preloaded.id());
    assert!(
        e.contains(&format!(
            "pid {} has cudapool but has not used CUDA yet",
            preloaded.id()
        )),
        "{e}"
    );
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        let mut theirs = std::process::Command::new("sleep")
            .arg("30")
            .uid(65534)
            .gid(65534)
            .spawn()
            .unwrap();
        let e = said(theirs.id());
        assert!(
            e.contains(&format!(
                "pid {} is another user's (uid 65534): this command reaches only root's own",
                theirs.id()
            )),
            "{e}"
        );
        let _ = theirs.kill();
        let _ = theirs.wait();
    }
    for c in [&mut plain, &mut preloaded] {
        let _ = c.kill();
        let _ = c.wait();
    }
    assert!(said(4_194_999).ends_with("no process has pid 4194999\n"));
}

/// Items 7 and 15: every reader checks `CUDAPOOL_RUNTIME_DIR` as `run` does and `stat -v` names
/// the folders it read [a relative or missing folder read in silence: "no cudapool process"];
/// `run` refuses before anything runs a trace it could not write (`/proc`) [said at exit], a
/// runtime folder it cannot make [one line, then ran], and a `CUDAPOOL_LIB` that is no cudapool
/// library [ran the program without cudapool, status 0].
#[test]
fn readers_and_run_refuse_settings_that_would_do_nothing() {
    let f = fixture();
    let cli = std::path::PathBuf::from(env!("CARGO_BIN_EXE_cudapool"));
    let refused = |args: &[&str], env: &[(&str, &str)], want: &str| {
        let r = run_program(&cli, args, false, env);
        assert_eq!(r.code, 2, "{args:?} {env:?}: {}{}", r.stdout, r.stderr);
        assert!(
            r.stderr.contains(want),
            "{args:?} {env:?}: want {want:?} in {}",
            r.stderr
        );
    };
    let missing = f.dir.join("no-such-runtime-dir");
    let _ = std::fs::remove_dir_all(&missing);
    for args in [
        &["stat"][..],
        &["stat", "-v", "1"],
        &["top", "-n", "1"],
        &["snapshot", "1"],
        &["sleep", "1"],
        &["wake", "1"],
    ] {
        refused(
            args,
            &[("CUDAPOOL_RUNTIME_DIR", "rel")],
            "invalid CUDAPOOL_RUNTIME_DIR=\"rel\": not an absolute path",
        );
        refused(
            args,
            &[("CUDAPOOL_RUNTIME_DIR", missing.to_str().unwrap())],
            ": no such directory: no cudapool process has used it",
        );
    }
    let here = f.dir.join("read-here");
    std::fs::create_dir_all(&here).unwrap();
    let r = run_program(
        &cli,
        &["stat", "-v"],
        false,
        &[("CUDAPOOL_RUNTIME_DIR", here.to_str().unwrap())],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    // The folders read, named: this one among them (a node in the mandatory mode, or one where
    // a job's folder was left, lists /run/cudapool/jobs/<id>.d too: not this test's to own).
    let read = r
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("(read ").and_then(|l| l.strip_suffix(')')))
        .unwrap_or_else(|| panic!("no (read ...) line: {}", r.stdout));
    assert!(
        read.split(", ")
            .any(|d| std::path::Path::new(d) == here.as_path()),
        "{}",
        r.stdout
    );

    let lib = f.lib.to_str().unwrap();
    let run = |env: &[(&str, &str)], want: &str| {
        let mut all = vec![("CUDAPOOL_LIB", lib)];
        all.extend_from_slice(env);
        refused(&["run", "--", "true"], &all, want);
    };
    run(
        &[("CUDAPOOL_TRACE", "/proc/cudapool-trace.json")],
        "CUDAPOOL_TRACE: cannot be written: /proc/cudapool-trace.json",
    );
    run(
        &[("CUDAPOOL_RUNTIME_DIR", "/proc/cudapool-rt")],
        "CUDAPOOL_RUNTIME_DIR: cannot make /proc/cudapool-rt",
    );
    refused(
        &["run", "--", "true"],
        &[("CUDAPOOL_LIB", "/etc/passwd")],
        "CUDAPOOL_LIB=/etc/passwd: not a shared library",
    );
    let libc = [
        "/lib/x86_64-linux-gnu/libc.so.6",
        "/usr/lib64/libc.so.6",
        "/lib64/libc.so.6",
    ]
    .into_iter()
    .find(|p| std::path::Path::new(p).is_file());
    if let Some(libc) = libc {
        refused(
            &["run", "--", "true"],
            &[("CUDAPOOL_LIB", libc)],
            "a shared library, but not cudapool's",
        );
    }
}

/// Item 8: a folder closed to the user is said as such [an executable under it got "not
/// executable (chmod +x)", a report path under it "no such folder (Permission denied)"]. Root
/// enters every folder, so this runs as another uid (nobody), from a staged copy it can reach.
#[test]
fn a_closed_folder_is_said_as_one() {
    use std::os::unix::fs::PermissionsExt as _;
    use std::os::unix::process::CommandExt as _;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("a_closed_folder_is_said_as_one: needs root (to run as another uid); not run");
        return;
    }
    let staged = Staged::new();
    // Inside the stage (root's, 0755, removed when it drops, a failed assertion included).
    let closed = staged.dir.join("closed");
    std::fs::create_dir(&closed).unwrap();
    let prog = closed.join("prog");
    std::fs::write(&prog, "#!/bin/sh\nexit 0\n").unwrap();
    std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).unwrap();
    let as_nobody = |args: &[&str], env: &[(&str, &str)]| {
        let out = std::process::Command::new(staged.dir.join("cudapool"))
            .args(args)
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("CUDAPOOL_LIB", staged.dir.join("libcudapool.so"))
            .envs(env.iter().copied())
            .current_dir("/")
            .uid(65534)
            .gid(65534)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let p = prog.to_str().unwrap();
    let (code, e) = as_nobody(&["run", "--", p], &[]);
    assert_eq!(code, Some(126), "{e}");
    assert!(
        e.contains(&format!(
            "cannot run {p}: a folder on its path cannot be entered by this user"
        )),
        "{e}"
    );
    let report = closed.join("report.txt");
    let (code, e) = as_nobody(
        &["run", "--", "/bin/true"],
        &[("CUDAPOOL_REPORT", report.to_str().unwrap())],
    );
    assert_eq!(code, Some(2), "{e}");
    assert!(
        e.contains(&format!(
            "{}: cannot be entered by this user (Permission denied",
            closed.display()
        )),
        "{e}"
    );
}

/// Item 19: replay's refusals of cudapool's own snapshots name cudapool's remedy [a torch
/// snapshot cudapool wrote without history got PyTorch's `_record_memory_history()` advice; a
/// JSON snapshot got "no traceEvents" without a word of what it is].
#[test]
fn replay_refuses_cudapools_own_snapshots_with_cudapools_remedy() {
    let f = fixture();
    let cli = std::path::PathBuf::from(env!("CARGO_BIN_EXE_cudapool"));
    let dir = f.dir.join("replay-ours");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut holder = start_holder(&[]);
    let pid = holder.id().to_string();
    let torch = dir.join("s.pickle");
    let json = dir.join("s.json");
    for (out, format) in [(&torch, "torch"), (&json, "json")] {
        let r = run_program(
            &cli,
            &[
                "snapshot",
                &pid,
                "--format",
                format,
                "-o",
                out.to_str().unwrap(),
            ],
            false,
            &[],
        );
        assert_eq!(r.code, 0, "{format}: {}", r.stderr);
    }
    drop(holder.stdin.take());
    let _ = holder.wait();
    let refused = |file: &std::path::Path, want: &str| {
        let r = run_program(&cli, &["replay", file.to_str().unwrap()], false, &[]);
        assert_eq!(r.code, 2, "{}{}", r.stdout, r.stderr);
        assert!(r.stderr.contains(want), "want {want:?} in {}", r.stderr);
    };
    refused(
        &torch,
        "a snapshot cudapool wrote without history (only the blocks alive at that moment): run the program with CUDAPOOL_HISTORY=N",
    );
    refused(
        &json,
        "a cudapool JSON snapshot: the blocks alive at one moment, no run to replay",
    );
}

/// Item 20: NVML in a process of `cudapool run` that never uses CUDA (nvidia-smi in the shell of
/// `cudapool run --limit 256MiB -- bash`) shows as used what the run's programs hold [0 MiB
/// used while the program held its memory]; a process of another run does not count them.
#[test]
fn nvidia_smi_in_a_runs_shell_sees_what_its_programs_hold() {
    let f = fixture();
    let dir = f.dir.join("nvml-run");
    let _ = std::fs::remove_dir_all(&dir);
    let d = dir.to_str().unwrap();
    let run = "4194301";
    let env = [
        ("CUDAPOOL_RUNTIME_DIR", d),
        ("CUDAPOOL_MEMORY_LIMIT", "256MiB"),
        ("CUDAPOOL_RUN_PID", run),
    ];
    let mut holder = start_holder(&env);
    let (procs, _) = cudapool::report::pages::live(false, Some(&dir));
    let held: u64 = procs
        .iter()
        .filter(|s| s.pid == holder.id())
        .flat_map(|s| s.devices.iter())
        .filter(|d| d.device == 0)
        .map(|d| d.stats.reserved)
        .sum();
    assert!(held >= 1 << 20, "the holder's page: {held}");
    let used = |run: &str| {
        let env = [env[0], env[1], ("CUDAPOOL_RUN_PID", run)];
        let r = run_program(&f.dir.join("nvml"), &[], true, &env);
        assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
        r.stdout
            .lines()
            .find(|l| l.starts_with("nvml i=0 "))
            .and_then(|l| l.split_whitespace().find_map(|kv| kv.strip_prefix("used=")))
            .unwrap_or_else(|| panic!("{}", r.stdout))
            .parse::<u64>()
            .unwrap()
    };
    assert_eq!(used(run), held, "the run's shell");
    assert_eq!(used("4194302"), 0, "another run");
    drop(holder.stdin.take());
    let _ = holder.wait();
}
