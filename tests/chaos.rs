//! The chaos suite (issue 34): what a shared node throws at cudapool, against the fake driver.
//! Every scenario here failed on the build before it (d1b5f06), as its doc says.
//!
//! (a) group members killed with SIGKILL at random instants while they churn under a group
//!     limit, watched by an observer: the group never passes its limit, nobody hangs, nothing
//!     is held at the end.
//! (b) the runtime directory on a full filesystem: programs run without their page; a group
//!     member that cannot have its ledger refuses with one line. Never a signal.
//! (c) planted, truncated, oversized and garbage pages and ledgers, by this user and (as
//!     root) by another uid: nothing crashes, nothing hangs, a squatted directory is walked
//!     around with one line.
//! (d) readers reading while a writer cuts and regrows its file: never a signal.
//! (e) threads allocating at once near the device's size, every pool kind and way in: no
//!     false out-of-memory.
//! And crowds: 1,000 processes joining one group at once.
//!
//! `CHAOS_SECONDS` sets the length of (a) (default 30).

mod common;
use common::*;
use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A runtime directory of this test's own (removed first), so scenarios do not meet.
fn runtime_dir(what: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("chaos-{what}"));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// (e) Eight threads allocating random sizes at once near the device's size, for every pool
/// kind, both ways in (`cuMemAlloc` and the stream-ordered pair) and with and without a
/// limit: not one out-of-memory answer, since what they hold at once is far below the device.
/// Before: `simple` got 6 to 11 false OOMs in 20 rounds ("cached after reclaim 0 B, device free
/// 909 MiB": one thread's reclaim emptied the cache while another was between its failed call
/// and its own reclaim), and, that fixed, others took the room a reclaim made before its retry.
fn no_false_oom(kind: &str, rounds: &str) {
    for way in ["sync", "async"] {
        for limit in [None, Some("512MiB")] {
            let mut env = vec![("CUDAPOOL_POOL", kind), ("CUDAPOOL_LOG", "error")];
            if let Some(l) = limit {
                env.push(("CUDAPOOL_MEMORY_LIMIT", l));
            }
            let what = format!("{kind} {way} limit {limit:?}");
            let o = finish(
                chaos(&["race", way, rounds, "8"], &env),
                Duration::from_secs(300),
                &what,
            );
            assert!(
                o.status.success() && o.stdout.contains("race ooms=0"),
                "{what}: {:?}\n{}{}",
                o.status,
                o.stdout,
                o.stderr.lines().take(5).collect::<Vec<_>>().join("\n")
            );
        }
    }
}

#[test]
fn no_false_oom_under_simple() {
    no_false_oom("simple", "50");
}

#[test]
fn no_false_oom_under_split() {
    no_false_oom("split", "200");
}

#[test]
fn no_false_oom_under_binned() {
    no_false_oom("binned", "200");
}

#[test]
fn no_false_oom_under_none() {
    no_false_oom("none", "100");
}

/// A member process whose stdout is read by a thread that records when it last made progress.
struct Churner {
    child: Child,
    last: Arc<AtomicU64>,
    /// What it says on stderr.
    err: std::path::PathBuf,
}

fn now_ms(t0: Instant) -> u64 {
    t0.elapsed().as_millis() as u64
}

/// Where churner `seed` of runtime directory `dir` writes its stderr (beside the directory).
fn said_by(dir: &Path, seed: u64) -> std::path::PathBuf {
    dir.with_extension(format!("churner-{seed}.err"))
}

fn churner(dir: &Path, seed: u64, t0: Instant) -> Churner {
    let d = dir.to_str().unwrap();
    let mut child = chaos(
        &["churn", &seed.to_string()],
        &[
            ("CUDAPOOL_RUNTIME_DIR", d),
            ("CUDAPOOL_GROUP", "churn"),
            ("CUDAPOOL_GROUP_LIMIT", "64MiB"),
            ("CUDAPOOL_LOG", "error"),
        ],
    )
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(std::fs::File::create(said_by(dir, seed)).unwrap())
    .spawn()
    .expect("spawn");
    let last = Arc::new(AtomicU64::new(now_ms(t0)));
    let (l2, out) = (last.clone(), child.stdout.take().unwrap());
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            if line.is_err() {
                break;
            }
            l2.store(now_ms(t0), Ordering::Relaxed);
        }
    });
    Churner {
        child,
        last,
        err: said_by(dir, seed),
    }
}

/// A member that made no progress for 5 s is waited for 20 s more: on a loaded machine a
/// starved one goes on (said, not failed); a hung one does not, and fails the test. [Under two
/// busy loops and other work beside the suite, a member was 6.4 s without progress, and the
/// bare 5 s check failed the test.]
fn assert_progresses(m: &mut Churner, t0: Instant) {
    let quiet = || now_ms(t0).saturating_sub(m.last.load(Ordering::Relaxed));
    let first = quiet();
    if first < 5000 {
        return;
    }
    let seen = m.last.load(Ordering::Relaxed);
    let waited = Instant::now();
    while waited.elapsed() < Duration::from_secs(20) {
        if m.last.load(Ordering::Relaxed) != seen {
            println!("a member was slow: {first} ms without progress, then went on");
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let exited = m.child.try_wait().ok().flatten();
    let said = std::fs::read_to_string(&m.err).unwrap_or_default();
    match exited {
        Some(status) => panic!(
            "a member ended ({status}) and made no progress for {} ms; it said: {said}",
            quiet()
        ),
        None => panic!(
            "a member made no progress for {} ms (hung); it said: {said}",
            quiet()
        ),
    }
}

/// (a) Four members churn under a 64 MiB group limit; every 20 to 100 ms one of them is
/// killed with SIGKILL at whatever instant it is at (holding the ledger's mutex, joining,
/// between the driver and the ledger) and replaced. An observer reads the ledger all along:
/// neither what it records nor what its live members hold ever passes the limit. No member
/// stops making progress for 5 s and 20 s more (a hang; a starved one goes on within them). At the end, with every member gone, the group holds
/// nothing and the next reader removes its ledger.
#[test]
fn members_killed_at_any_instant_never_break_the_group() {
    let dir = runtime_dir("kill");
    let seconds: u64 = std::env::var("CHAOS_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    let t0 = Instant::now();
    let limit = 64u64 << 20;
    let stop = Arc::new(AtomicBool::new(false));
    let worst = Arc::new(Mutex::new((0u64, 0u64, 0u64)));
    let observer = {
        let (stop, worst, dir) = (stop.clone(), worst.clone(), dir.clone());
        std::thread::spawn(move || {
            let mut reads = 0u64;
            while !stop.load(Ordering::Relaxed) {
                for v in cudapool::limits::group::ledgers(false, Some(&dir))
                    .into_iter()
                    .flatten()
                {
                    for (i, (_, l, live)) in v.devices.iter().enumerate() {
                        let recorded = v.recorded[i];
                        assert_eq!(*l, limit, "the limit the first member fixed");
                        assert!(recorded <= limit, "the ledger records {recorded} > {limit}");
                        assert!(*live <= limit, "live members hold {live} > {limit}");
                        let mut w = worst.lock().unwrap();
                        w.0 = w.0.max(recorded);
                        w.1 = w.1.max(*live);
                    }
                }
                reads += 1;
                worst.lock().unwrap().2 = reads;
                // A read a millisecond, not a core: on a two-core machine a spinning observer
                // starved the members it watches into the "no progress for 5 s" check.
                std::thread::sleep(Duration::from_millis(1));
            }
        })
    };
    let mut seed = 1u64;
    let mut members: Vec<Churner> = (0..4)
        .map(|_| {
            seed += 1;
            churner(&dir, seed, t0)
        })
        .collect();
    let mut kills = 0;
    let mut rng = 0x2545f4914f6cdd1du64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    while t0.elapsed() < Duration::from_secs(seconds) {
        std::thread::sleep(Duration::from_millis(20 + next() % 81));
        let i = (next() % members.len() as u64) as usize;
        // SAFETY: SIGKILL to a child of ours that we have not reaped.
        unsafe { libc::kill(members[i].child.id() as libc::pid_t, libc::SIGKILL) };
        let _ = members[i].child.wait();
        kills += 1;
        seed += 1;
        members[i] = churner(&dir, seed, t0);
        for m in &mut members {
            assert_progresses(m, t0);
        }
        assert!(!observer.is_finished(), "the observer saw the limit passed");
    }
    stop.store(true, Ordering::Relaxed);
    observer.join().expect("the observer saw the limit passed");
    for m in &mut members {
        let _ = m.child.kill();
        let _ = m.child.wait();
    }
    let (recorded, live, reads) = *worst.lock().unwrap();
    println!(
        "{kills} members killed in {seconds} s; {reads} reads of the ledger; the most recorded {recorded}, held by live members {live}, limit {limit}"
    );
    assert!(kills > 0 && reads > 0 && recorded > 0, "nothing happened");
    // No member failed a call on its own, killed or not: a panic in the pool or an error other
    // than out-of-memory ends a churner with a line, which the progress check above sees only
    // when it comes last. [Before: 2 of 68 churners said "the grown arena serves the request".]
    for s in 2..=seed {
        let said = std::fs::read_to_string(said_by(&dir, s)).unwrap_or_default();
        assert!(
            !said.contains("internal error") && !said.contains("chaos:"),
            "churner {s} said: {said}"
        );
    }
    // Every member gone: nothing held, and the reader that saw it so removed the ledger.
    let views: Vec<_> = cudapool::limits::group::ledgers(false, Some(&dir))
        .into_iter()
        .flatten()
        .collect();
    assert_eq!(views.len(), 1);
    assert!(views[0].members.is_empty());
    assert!(
        views[0].devices.iter().all(|(_, _, live)| *live == 0),
        "{:?}",
        views[0].devices
    );
    assert!(
        !dir.join("group-churn").exists(),
        "a ledger with no live member is removed by its user's next reader"
    );
}

/// (b) `/dev/shm` full (a container's 64 MiB, filled by DataLoader workers): a program runs and
/// exits 0 without its page, saying so in one line; with room for its page but not for a group
/// ledger, a group member refuses allocations with one line. Never a signal. Before: SIGBUS
/// (exit 135) at the first write into the page, and a member died inside `Group::reap` holding
/// the ledger's mutex.
#[test]
fn a_full_runtime_filesystem_costs_the_page_never_the_program() {
    // No room at all.
    let full = "cat /dev/zero > /dev/shm/fill 2>/dev/null; LD_PRELOAD=$SHIM exec $CHAOS once";
    let Some(o) = in_small_shm("256k", full, &[]) else {
        return;
    };
    assert!(
        o.status.signal().is_none(),
        "killed by a signal: {:?}\n{}",
        o.status,
        o.stderr
    );
    assert!(
        o.status.success() && o.stdout.contains("once ok"),
        "{}{}",
        o.stdout,
        o.stderr
    );
    assert_eq!(
        o.stderr
            .lines()
            .filter(|l| l.contains("no live stats page"))
            .count(),
        1,
        "{}",
        o.stderr
    );
    // Room for the page, none for the ledger.
    let some = "head -c 200000 /dev/zero > /dev/shm/fill; LD_PRELOAD=$SHIM exec $CHAOS once";
    let o = in_small_shm("256k", some, &[("CUDAPOOL_GROUP", "full")]).unwrap();
    assert!(
        o.status.signal().is_none(),
        "killed by a signal: {:?}\n{}",
        o.status,
        o.stderr
    );
    assert_eq!(o.status.code(), Some(1), "{}{}", o.stdout, o.stderr);
    assert!(
        o.stderr.contains("CUDAPOOL_GROUP")
            && o.stderr.contains("cannot reserve")
            && o.stderr.contains("refusing CUDA allocations"),
        "{}",
        o.stderr
    );
}

/// Overwrites `len` bytes at `offset` of `path` with `bytes` repeated.
fn scribble(path: &Path, offset: u64, bytes: &[u8]) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(bytes, offset).unwrap();
}

/// (c) Garbage of this user's in the runtime directory: pages that are links, FIFOs, huge,
/// cut short or random; a ledger whose lock word names a thread that does not exist, one with
/// impossible figures, one of the wrong size. Programs and group members run (the bad ledger
/// rebuilt with one line, within seconds), `cudapool stat -v` ends, the exporter answers.
/// Before: a garbage lock word hung every joiner forever, silently.
#[test]
fn garbage_in_the_runtime_directory_neither_crashes_nor_hangs() {
    let dir = runtime_dir("garbage");
    let d = dir.to_str().unwrap();
    let env = [("CUDAPOOL_RUNTIME_DIR", d)];
    // A member makes the directory and a valid ledger of group "g" and is killed: the ledger
    // stays (a member that exits takes it with it when it is the last). Each garbage case
    // below starts from such a leftover.
    let genv = [("CUDAPOOL_RUNTIME_DIR", d), ("CUDAPOOL_GROUP", "g")];
    let ledger = dir.join("group-g");
    let size = cudapool::limits::group::ledger::ledger_bytes();
    let leftover = || {
        finish(
            chaos(&["fill", "1048576", "0", "kill"], &genv),
            Duration::from_secs(20),
            "a member killed",
        );
        assert_eq!(std::fs::metadata(&ledger).unwrap().len() as usize, size);
    };
    leftover();
    // Pages of every kind of wrong.
    let link = dir.join("page-1");
    std::os::unix::fs::symlink("/etc/passwd", &link).unwrap();
    let fifo = std::ffi::CString::new(dir.join("page-2").to_str().unwrap()).unwrap();
    // SAFETY: mkfifo of a NUL-terminated path in our own directory.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    std::fs::File::create(dir.join("page-3"))
        .unwrap()
        .set_len(1 << 40)
        .unwrap();
    std::fs::write(dir.join("page-4"), b"short").unwrap();
    std::fs::write(dir.join("page-5"), vec![0xa5u8; 12345]).unwrap();
    // The lock word of a thread that does not exist: the old joiner waited on it forever.
    scribble(
        &ledger,
        cudapool::limits::group::ledger::mutex_offset() as u64,
        &0x3fff_fff0u32.to_ne_bytes(),
    );
    let t = Instant::now();
    let o = finish(
        chaos(&["once"], &genv),
        Duration::from_secs(60),
        "joiner of a garbage lock",
    );
    assert!(o.status.success(), "{}", o.stderr);
    assert!(o.stderr.contains("held by no live process"), "{}", o.stderr);
    println!("a joiner got past a garbage lock word in {:?}", t.elapsed());
    assert!(
        !ledger.exists(),
        "the joiner, its last member, took it when it exited"
    );
    // Impossible figures: rebuilt with a line.
    leftover();
    let figures = cudapool::limits::group::ledger::mutex_offset()
        + std::mem::size_of::<libc::pthread_mutex_t>();
    scribble(&ledger, figures as u64, &[0xffu8; 4096]);
    let o = finish(
        chaos(&["once"], &genv),
        Duration::from_secs(60),
        "joiner of garbage figures",
    );
    assert!(o.status.success(), "{}", o.stderr);
    assert!(o.stderr.contains("rebuilt"), "{}", o.stderr);
    // The wrong size: rebuilt too.
    leftover();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&ledger)
        .unwrap()
        .set_len(1000)
        .unwrap();
    let o = finish(
        chaos(&["once"], &genv),
        Duration::from_secs(60),
        "joiner of a short ledger",
    );
    assert!(
        o.status.success() && o.stderr.contains("rebuilt"),
        "{}",
        o.stderr
    );
    // A program with no group, the readers.
    let o = finish(chaos(&["once"], &env), Duration::from_secs(20), "a program");
    assert!(o.status.success(), "{}", o.stderr);
    let mut stat = Command::new(env!("CARGO_BIN_EXE_cudapool"));
    stat.args(["stat", "-v"]).env("CUDAPOOL_RUNTIME_DIR", d);
    let o = finish(stat, Duration::from_secs(20), "cudapool stat -v");
    assert!(o.status.success(), "{}{}", o.stdout, o.stderr);
    for n in ["page-2", "page-3", "page-4", "page-5"] {
        assert!(o.stdout.contains(n), "stat -v names {n}: {}", o.stdout);
    }
    assert!(link.exists() && std::fs::read("/etc/passwd").is_ok());
}

/// (d) Readers (`cudapool stat`, in a loop) while the owner of a ledger and of a page cuts
/// them to nothing and grows them back as fast as it can: every read ends, none by a signal.
/// Before: the exporter checked a ledger's size, then mapped it: SIGBUS after 55 scrapes.
#[test]
fn readers_survive_files_cut_and_regrown_under_them() {
    let dir = runtime_dir("cut");
    let d = dir.to_str().unwrap();
    let genv = [("CUDAPOOL_RUNTIME_DIR", d), ("CUDAPOOL_GROUP", "cut")];
    let mut holder = chaos(&["once", "hold"], &genv)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(holder.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.starts_with("once ok"), "{line}");
    // Copies of the live files, cut and regrown by a thread of ours (their owner).
    let page = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .find(|e| e.file_name().to_string_lossy().starts_with("page-"))
        .expect("the holder's page")
        .path();
    let victims = [
        (dir.join("page-77777"), std::fs::read(&page).unwrap()),
        (
            dir.join("group-cut2"),
            std::fs::read(dir.join("group-cut")).unwrap(),
        ),
    ];
    for (p, bytes) in &victims {
        std::fs::write(p, bytes).unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let cutter = {
        let stop = stop.clone();
        let v: Vec<(PathBuf, u64)> = victims
            .iter()
            .map(|(p, b)| (p.clone(), b.len() as u64))
            .collect();
        std::thread::spawn(move || {
            let files: Vec<(std::fs::File, u64)> = v
                .iter()
                .map(|(p, n)| (std::fs::OpenOptions::new().write(true).open(p).unwrap(), *n))
                .collect();
            while !stop.load(Ordering::Relaxed) {
                for (f, n) in &files {
                    let _ = f.set_len(0);
                    let _ = f.set_len(*n);
                }
            }
        })
    };
    for i in 0..100 {
        let mut stat = Command::new(env!("CARGO_BIN_EXE_cudapool"));
        stat.args(["stat", "-v"]).env("CUDAPOOL_RUNTIME_DIR", d);
        let o = finish(stat, Duration::from_secs(20), "cudapool stat");
        assert!(
            o.status.success(),
            "read {i}: {:?} (signal {:?})\n{}",
            o.status,
            o.status.signal(),
            o.stderr
        );
    }
    // And the library's own readers in this process, many times over.
    for _ in 0..300 {
        let _ = cudapool::report::pages::live(false, Some(&dir));
        let _ = cudapool::limits::group::ledgers(false, Some(&dir));
    }
    stop.store(true, Ordering::Relaxed);
    cutter.join().unwrap();
    drop(holder.stdin.take());
    assert!(holder.wait().unwrap().success());
}

/// (c) by another uid (root only: `setpriv` makes one without a user entry). User 4242 squats
/// this user's default runtime directory name and plants a link and a file at two of its old
/// alternates: group members still join, both in the one directory of this user's with a
/// random name they walk around to, with one line naming user 4242 and the remedy. Before: a
/// file planted at the ledger's path made every member refuse all allocations.
#[test]
fn another_user_cannot_block_a_group_by_squatting() {
    if uid() != 0 {
        eprintln!("not root: no other uid to squat with; not checked");
        return;
    }
    let me = uid();
    let script = format!(
        "setpriv --reuid 4242 --regid 4242 --clear-groups sh -c 'mkdir /dev/shm/cudapool-{me} && ln -s /etc /dev/shm/cudapool-{me}.1 && echo x > /dev/shm/cudapool-{me}.2' || exit 98; \
         LD_PRELOAD=$SHIM CUDAPOOL_GROUP=sq $CHAOS once && LD_PRELOAD=$SHIM CUDAPOOL_GROUP=sq $CHAOS once && echo dirs=$(find /dev/shm -maxdepth 1 -type d -user {me} -name 'cudapool-{me}.*' | wc -l) && ls -ld /dev/shm/cudapool-{me}.* && $CLI stat -v"
    );
    let Some(o) = in_small_shm("64m", &script, &[]) else {
        return;
    };
    assert!(
        o.status.success(),
        "{:?}\n{}{}",
        o.status,
        o.stdout,
        o.stderr
    );
    assert!(o.stdout.matches("once ok").count() == 2, "{}", o.stdout);
    assert!(
        o.stderr.contains("belongs to user 4242") && o.stderr.contains("have root remove it"),
        "{}",
        o.stderr
    );
    assert!(o.stdout.contains("drwx------"), "made 0700: {}", o.stdout);
    assert!(
        o.stdout.contains("dirs=1"),
        "one walk-around directory for both: {}",
        o.stdout
    );
}

/// Crowds: 1,000 processes join one group at once and hold their allocation together (a group
/// of 1,000 live members); each says how long its first allocation took from its first driver
/// call (set-up and join included). Before: the 65th member was refused ("group ... has 64
/// members already"). The figures are printed (the target is p99 under 1 s); the test
/// asserts that everyone got in.
#[test]
fn a_thousand_processes_join_one_group() {
    let dir = runtime_dir("crowd");
    let d = dir.to_str().unwrap();
    raise_open_files();
    let n: usize = std::env::var("CHAOS_CROWD")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1000);
    let env = [
        ("CUDAPOOL_RUNTIME_DIR", d),
        ("CUDAPOOL_GROUP", "crowd"),
        ("CUDAPOOL_GROUP_LIMIT", "100GiB"),
        ("CUDAPOOL_LOG", "error"),
        ("FAKECU_TOTAL_MEM", "8589934592"),
    ];
    // What the joiners say on stderr, one file for all (shown when one was refused).
    let said = dir.with_extension("stderr");
    let err = std::fs::File::create(&said).unwrap();
    let t = Instant::now();
    let mut kids: Vec<Child> = (0..n)
        .map(|_| {
            chaos(&["once", "hold"], &env)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(err.try_clone().unwrap())
                .spawn()
                .expect("spawn")
        })
        .collect();
    let spawned = t.elapsed();
    let mut us = Vec::new();
    let mut failed = Vec::new();
    for k in &mut kids {
        let mut line = String::new();
        BufReader::new(k.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        match line.trim().strip_prefix("once ok us=") {
            Some(v) => us.push(v.parse::<u64>().unwrap()),
            None => failed.push(line),
        }
    }
    let all_in = t.elapsed();
    let members = cudapool::limits::group::ledgers(false, Some(&dir))
        .into_iter()
        .flatten()
        .map(|v| v.members.len())
        .sum::<usize>();
    for k in &mut kids {
        drop(k.stdin.take());
        let _ = k.wait();
    }
    us.sort();
    let q = |p: f64| {
        us.get(((us.len() as f64 * p) as usize).min(us.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0)
    };
    println!(
        "{n} joiners: spawned in {spawned:?}, all in after {all_in:?}; first allocation p50 {} ms, p99 {} ms, max {} ms; {members} live members seen at once",
        q(0.5) / 1000,
        q(0.99) / 1000,
        us.last().copied().unwrap_or(0) / 1000
    );
    let said = std::fs::read_to_string(&said).unwrap_or_default();
    assert!(
        failed.is_empty(),
        "{} refused; their stderr began: {}",
        failed.len(),
        said.lines().take(4).collect::<Vec<_>>().join("\n")
    );
    assert_eq!(members, n, "every joiner a live member at once");
}
