//! Suspend frees the GPU (issue 78, item 1): a process stopped by SIGTSTP (Slurm's suspend, a
//! shell's Ctrl-Z) gives its pooled GPU memory back before it stops and gets it back, every byte
//! at the same address, when it continues; in a group, the stop of one process puts the whole
//! group to sleep. The fake driver's device is shared here (`FAKECU_BOARD` with
//! `FAKECU_SHARED=1`): what one process gives back is what another can take, as on a GPU.
//! Before, on 03f5232, in brackets.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A folder of the test's own for the board, the flag files and the runtime directory.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn scratch(name: &str) -> Scratch {
    let d = open_temp_dir(&format!("/tmp/cudapool-suspend-{name}-"));
    std::fs::create_dir_all(d.join("board")).unwrap();
    Scratch(d)
}

/// What process `pid` holds on device 0, as the fake driver's board says.
fn held(board: &Path, pid: u32) -> u64 {
    std::fs::read(board.join(pid.to_string()))
        .ok()
        .and_then(|b| {
            b.get(..8)
                .map(|w| u64::from_ne_bytes(w.try_into().unwrap()))
        })
        .unwrap_or(0)
}

/// Whether process `pid` is stopped (its state in /proc: `T`).
fn stopped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, r)| r.starts_with('T')))
        .unwrap_or(false)
}

/// Waits up to `limit` for `what` to hold.
fn until(limit: Duration, mut what: impl FnMut() -> bool) -> bool {
    let t = Instant::now();
    while t.elapsed() < limit {
        if what() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    what()
}

fn signal(pid: u32, sig: &str) {
    let s = Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .status()
        .unwrap();
    assert!(s.success(), "kill -{sig} {pid}");
}

/// The client holding `mib` MiB until `go` exists (`suspend_hold`), on the shared fake device
/// of `s`, with `env`; returned once it said "ready".
fn holder(s: &Scratch, mib: u64, go: &Path, env: &[(&str, &str)]) -> Child {
    let go = go.to_str().unwrap();
    started(s, &["suspend_hold", &mib.to_string(), go], env)
}

/// The client's scenario `args` on the shared fake device of `s`, with `env`; returned once it
/// said "ready".
fn started(s: &Scratch, args: &[&str], env: &[(&str, &str)]) -> Child {
    let f = fixture();
    let mut cmd = Command::new(f.dir.join("client"));
    cmd.arg("gpa").args(args).current_dir(&s.0);
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("CUDAPOOL_")) {
        cmd.env_remove(k);
    }
    cmd.env("LD_LIBRARY_PATH", &f.dir)
        .env("LD_PRELOAD", &f.lib)
        .env("FAKECU_BOARD", s.0.join("board"))
        .env("FAKECU_SHARED", "1")
        .env("CUDAPOOL_RUNTIME_DIR", s.0.join("run"))
        .env("CUDAPOOL_CACHE_IDLE", "never")
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("client");
    use std::io::BufRead;
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while line.trim() != "ready" {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "the holder ended before it was ready"
        );
    }
    child.stdout = Some(out.into_inner());
    child
}

/// How many blocks of 8 MiB another process (no cudapool) takes on the shared device now.
fn neighbour_fill(s: &Scratch) -> u64 {
    let f = fixture();
    let o = Command::new(f.dir.join("chaos"))
        .args(["fill", &(8 * MIB).to_string(), "0"])
        .env_remove("LD_PRELOAD")
        .env("LD_LIBRARY_PATH", &f.dir)
        .env("FAKECU_BOARD", s.0.join("board"))
        .env("FAKECU_SHARED", "1")
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    out.lines()
        .find_map(|l| l.strip_prefix("fill n="))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no fill line: {out}"))
}

/// What `cudapool stat PID` prints for the process of `s`.
fn stat_of(s: &Scratch, pid: u32) -> String {
    let o = Command::new(env!("CARGO_BIN_EXE_cudapool"))
        .args(["stat", &pid.to_string()])
        .env("CUDAPOOL_RUNTIME_DIR", s.0.join("run"))
        .output()
        .unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Lets the holder end (`go`) and returns what it printed, stderr too.
fn finish_holder(child: Child, go: &Path) -> String {
    std::fs::write(go, b"").unwrap();
    printed(child)
}

/// Waits for `child` and returns what it printed, stderr too.
fn printed(child: Child) -> String {
    let o = child.wait_with_output().unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A process that holds 512 MiB of the 1 GiB device, stopped by SIGTSTP: with
/// `CUDAPOOL_SUSPEND=sleep` it stops holding almost nothing, a neighbour gets 1 GiB less its
/// crumbs, and continued it finds every byte again [it stopped holding 512 MiB; the neighbour
/// got 64 blocks]. Without the setting (a process in no group), it keeps its memory, as before.
/// (cudapool stops a process that slept with SIGSTOP, also where the kernel would drop a
/// SIGTSTP: in a process group with no parent outside it, as Slurm's tasks are, which Slurm
/// stops 2 s later all the same.)
#[test]
fn a_stopped_process_gives_its_gpu_memory_back_and_finds_it_again() {
    for (setting, sleeps) in [("sleep", true), ("", false)] {
        let s = scratch("alone");
        let go = s.0.join("go");
        let env: &[(&str, &str)] = if setting.is_empty() {
            &[]
        } else {
            &[("CUDAPOOL_SUSPEND", "sleep")]
        };
        let child = holder(&s, 512, &go, env);
        let pid = child.id();
        let board = s.0.join("board");
        assert!(held(&board, pid) >= 512 * MIB, "it holds its 512 MiB");
        signal(pid, "TSTP");
        if sleeps {
            assert!(
                until(Duration::from_secs(10), || stopped(pid)),
                "SIGTSTP stops it, its memory given back first"
            );
        } else {
            // Left to the kernel: it stops the process, or drops the signal where the process
            // group has no parent outside it (as under `setsid`, or CI's runner).
            std::thread::sleep(Duration::from_millis(500));
        }
        let asleep = held(&board, pid);
        // What `cudapool stat` says of it: asleep, since when and why.
        let said = stat_of(&s, pid);
        let got = neighbour_fill(&s);
        signal(pid, "CONT");
        let back = until(Duration::from_secs(10), || held(&board, pid) >= 512 * MIB);
        let out = finish_holder(child, &go);
        if sleeps {
            assert!(
                said.contains("asleep: ")
                    && said.contains(": stopped (SIGTSTP: Slurm's suspend or Ctrl-Z)"),
                "{said}"
            );
            assert!(asleep < 16 * MIB, "stopped, it holds {asleep} B: {out}");
            assert!(got >= 120, "the neighbour got {got} blocks of 8 MiB: {out}");
            assert!(back, "continued, its work brought its memory back: {out}");
        } else {
            assert!(asleep >= 512 * MIB, "kept: {asleep} B: {out}");
            assert!(got <= 64, "the neighbour got {got} blocks: {out}");
        }
        assert!(out.contains("suspend_hold intact=1"), "{setting:?}: {out}");
    }
}

/// A process stopped in the middle of a graph capture cannot sleep (the captured work cannot be
/// drained): it stops within Slurm's 2 s all the same, keeping its memory, and says so; when it
/// continues, its capture ends well and its data is intact. [It stopped only after 30 s, when
/// its sleep gave up.]
#[test]
fn a_process_stopped_during_a_capture_stops_in_time_and_keeps_its_memory() {
    use std::io::Write;
    let s = scratch("capture");
    let mut child = started(&s, &["capture_hold"], &[("CUDAPOOL_SUSPEND", "sleep")]);
    let pid = child.id();
    let board = s.0.join("board");
    let before = held(&board, pid);
    let t = Instant::now();
    signal(pid, "TSTP");
    let stop = until(Duration::from_secs(40), || stopped(pid)).then(|| t.elapsed());
    let kept = held(&board, pid);
    signal(pid, "CONT");
    writeln!(child.stdin.take().unwrap(), "end").unwrap();
    let out = printed(child);
    assert!(
        stop.is_some_and(|d| d < Duration::from_secs(10)),
        "stopped after {stop:?}: {out}"
    );
    assert!(
        before > 0 && kept >= before,
        "kept {kept} of {before} B: {out}"
    );
    assert!(
        out.contains("its GPU memory stays while it is stopped"),
        "{out}"
    );
    assert!(
        out.contains("capture_rc=0") && out.contains("intact=1"),
        "{out}"
    );
}

/// Two members of a group hold 256 MiB each; only the first is stopped (as Slurm signals only a
/// job's tasks, never a program its batch script started in the background). The second sleeps
/// too, and holds its work (a copy every 20 ms) without waking while the first stays stopped;
/// when the first continues, the second wakes by itself. [The second kept its 256 MiB.] The
/// group's record (what the root Epilog writes into a job's `AdminComment`) counts both sleeps,
/// their bytes and the time each stayed asleep, at least the half second the test waits
/// (issue 78, item 4). [Before: the time was not recorded.]
#[test]
fn the_stop_of_one_member_puts_its_group_to_sleep() {
    let s = scratch("group");
    let go = s.0.join("go");
    let env = [
        ("CUDAPOOL_GROUP", "suspended"),
        ("CUDAPOOL_SUSPEND", "sleep"),
    ];
    let first = holder(&s, 256, &go, &env);
    let second = holder(&s, 256, &go, &env);
    let (a, b) = (first.id(), second.id());
    let board = s.0.join("board");
    let t0 = Instant::now();
    signal(a, "TSTP");
    let both_asleep = until(Duration::from_secs(10), || {
        stopped(a) && held(&board, a) < 16 * MIB && held(&board, b) < 16 * MIB
    });
    // Held: the second's copies wait while the first is stopped.
    std::thread::sleep(Duration::from_millis(500));
    let second_held = held(&board, b);
    let second_stopped = stopped(b);
    signal(a, "CONT");
    let woke = until(Duration::from_secs(10), || held(&board, b) >= 256 * MIB);
    let run = s.0.join("run");
    let record = || {
        cudapool::limits::group::ledgers(false, Some(&run))
            .into_iter()
            .flatten()
            .find(|v| v.name == "suspended")
            .map(|v| v.suspends)
            .unwrap_or_default()
    };
    // Each member's time is counted when it wakes: the first's at its next copy.
    until(Duration::from_secs(10), || record().asleep_ms >= 1000);
    let r = record();
    let bound = t0.elapsed().as_millis() as u64 * 2;
    let out_b = finish_holder(second, &go);
    let out_a = finish_holder(first, &go);
    let all = format!("first: {out_a}\nsecond: {out_b}");
    assert!(both_asleep, "both asleep: {all}");
    assert!(
        second_held < 16 * MIB && !second_stopped,
        "the second, running, stays asleep while the first is stopped ({second_held} B): {all}"
    );
    assert!(woke, "the second woke once the first continued: {all}");
    assert!(
        out_a.contains("suspend_hold intact=1") && out_b.contains("suspend_hold intact=1"),
        "{all}"
    );
    assert_eq!(r.sleeps, 2, "{r:?}: {all}");
    assert!(r.bytes >= 512 * MIB, "{r:?}: {all}");
    assert!(
        (1000..=bound).contains(&r.asleep_ms),
        "asleep at least 0.5 s each, at most since the stop ({bound} ms): {r:?}: {all}"
    );
}

/// The mandatory mode, as Slurm suspends a batch job: the job's batch shell started the program
/// in the background, and Slurm signals only the shell (its task), then freezes the job's
/// cgroup (two seconds later; here once the program is asleep, so that a busy machine's slow
/// copy fails nothing); at resume, SIGCONT to the shell, then the cgroup thawed. The shell
/// (no CUDA, no member) posts the suspend in the job's ledger from its signal handler; the
/// program sleeps and its memory is free for a neighbour while the job is frozen; after the
/// resume it finds every byte. [The program kept its 600 MiB: the neighbour got 53 blocks.]
/// Run without Slurm: a freezer cgroup `job_<id>` and the share file as the root Prolog makes
/// them, in a private /run (`tests/slurm.rs` runs the same with Slurm's own suspend).
#[test]
fn a_job_suspended_as_slurm_does_it_frees_the_gpu_for_its_whole_stop() {
    if uid() != 0 {
        eprintln!("not root: the job's cgroup and share file are root's; not checked");
        return;
    }
    let f = fixture();
    let s = scratch("job");
    let job = (4_200_000 + std::process::id() % 100_000).to_string();
    let top = Path::new("/sys/fs/cgroup/freezer").join(format!("cudapool-suspend-{job}"));
    let cg = top.join(format!("job_{job}")).join("step_batch");
    if std::fs::create_dir_all(&cg).is_err() {
        eprintln!("no cgroup v1 freezer hierarchy to make a job in: not checked");
        return;
    }
    let gdir = cudapool::base::job::ledger_dir(&job);
    let script = format!(
        r#"set -u
        mount -t tmpfs -o size=16M tmpfs /run || exit 97
        mkdir -p {gdir} && chmod 755 /run/cudapool/jobs {gdir}
        printf '%s' '{share}' > /run/cudapool/jobs/{job} && chmod 644 /run/cudapool/jobs/{job}
        : > {gdir}/group-slurm-{job} && chmod 600 {gdir}/group-slurm-{job}
        held() {{ od -An -t u8 -N8 {board}/$1 2>/dev/null | tr -d ' ' || echo 0; }}
        MIB=1048576
        sh -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' {cg} env LD_PRELOAD={lib} LD_LIBRARY_PATH={dir} \
          FAKECU_BOARD={board} FAKECU_SHARED=1 CUDAPOOL_CACHE_IDLE=never \
          bash -c '{client} gpa suspend_hold 600 {go} > {scratch}/out 2>&1 & echo $! > {scratch}/pid; wait' &
        shell=$!
        for i in $(seq 200); do grep -q ready {scratch}/out 2>/dev/null && break; sleep 0.05; done
        p=$(cat {scratch}/pid)
        echo before=$(( $(held $p) / MIB ))
        # Slurm freezes the job 2 s after its SIGTSTP; the sleep's time is the machine's (a
        # busy one can take longer): the freeze waits for it here, and its time is only shown.
        t0=$(date +%s%N); kill -TSTP $shell
        for i in $(seq 400); do [ "$(held $p)" -lt $((16 * MIB)) ] && break; sleep 0.05; done
        echo asleep_after_ms=$(( ($(date +%s%N) - t0) / 1000000 ))
        sleep 0.5; echo FROZEN > {cg}/freezer.state
        # The kernel freezes each task as it reaches a point it can stop at (FREEZING until the
        # last has): Slurm's suspend waits for FROZEN too.
        for i in $(seq 100); do [ "$(cat {cg}/freezer.state)" = FROZEN ] && break; sleep 0.05; done
        echo frozen=$(cat {cg}/freezer.state) asleep=$(( $(held $p) / MIB ))
        env -u LD_PRELOAD LD_LIBRARY_PATH={dir} FAKECU_BOARD={board} FAKECU_SHARED=1 {chaos} fill 8388608 0 | sed 's/^/neighbour: /'
        kill -CONT $shell; echo THAWED > {cg}/freezer.state
        for i in $(seq 200); do [ "$(held $p)" -ge $((600 * MIB)) ] && break; sleep 0.05; done
        echo resumed=$(( $(held $p) / MIB ))
        touch {go}; wait $shell; echo shell_rc=$?
        cat {scratch}/out
        "#,
        share = cudapool::base::job::share_text(&job, 1 << 30, None),
        gdir = gdir.display(),
        cg = cg.display(),
        lib = f.lib.display(),
        dir = f.dir.display(),
        board = s.0.join("board").display(),
        client = f.dir.join("client").display(),
        chaos = f.dir.join("chaos").display(),
        go = s.0.join("go").display(),
        scratch = s.0.display(),
    );
    let mut cmd = Command::new("unshare");
    cmd.args(["-m", "bash", "-c", &script]);
    let o = finish(cmd, Duration::from_secs(90), "a job suspended");
    let all = format!("{}{}", o.stdout, o.stderr);
    let _ = std::fs::write(cg.join("freezer.state"), "THAWED");
    for d in [&cg, &cg.parent().unwrap().to_path_buf(), &top] {
        let _ = std::fs::remove_dir(d);
    }
    if o.status.code() == Some(97) {
        eprintln!("no private mount namespace here: not checked");
        return;
    }
    let figure = |key: &str| figure(&all, key);
    assert!(figure("before") >= 600, "{all}");
    assert!(all.contains("frozen=FROZEN"), "{all}");
    assert!(figure("asleep") < 16, "asleep while frozen: {all}");
    assert!(
        figure("n") >= 120,
        "the neighbour got the job's memory: {all}"
    );
    assert!(figure("resumed") >= 600, "{all}");
    assert!(all.contains("suspend_hold intact=1"), "{all}");
    assert_eq!(figure("shell_rc"), 0, "{all}");
}
