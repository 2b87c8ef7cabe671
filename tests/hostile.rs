//! The hostile-neighbour suite (issue 44): what another user of the node (uid 1001, made with
//! `setpriv`) and the user's own scripts do to what cudapool opens, against the fake driver.
//! Each case runs as root in a private mount namespace with fresh `/tmp` and `/dev/shm` (so
//! nothing of the machine's is touched), and each failed on the build before it (0a32a2a), as
//! its doc says. A case that needs root or another uid says "not checked" elsewhere.
//!
//! 1. `CUDAPOOL_RUNTIME_DIR` naming a shared directory never changes it.
//! 2. Output files never follow, block on, or write into what a neighbour planted; a path
//!    that cannot be written is said at once, and `cudapool run` refuses it.
//! 3. Odd pages and ledgers, held or not, cannot blind the root exporter.
//! 4. A forged IPC offset: `tests/preload/ipc.rs`, `a_forged_ipc_offset_is_refused`.
//! 5. A process's own page cut by its user costs the page, never the process.
//! 6. `%n` snapshots keep the last `CUDAPOOL_OOM_SNAPSHOT_KEEP`.
//! 7. `cudapool plot` reads bounded input.
//! 8. A squatted runtime directory is walked around, and said by `stat` and the exporter.
//!
//! Issue 54's cases here (the Slurm ones are in `tests/slurm.rs`): 4 (a neighbour's files at a
//! user's names stop nothing: case 8 above), 5 (a page that lists a device twice:
//! `src/cli/exporter.rs`, `a_page_listing_a_device_twice_cannot_end_a_scrape`), 6 (a flood of
//! files), 8 (a removed page: case 5 above; a cut ledger: `src/limits/group/tests.rs`), 9 (links
//! among an output path's folders).

mod common;
use common::*;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The neighbour's uid and the command that makes a shell of theirs.
const N: &str = "setpriv --reuid 1001 --regid 1001 --clear-groups";

/// Runs `script` (sh, `set -u`) as root in a private mount namespace with a fresh tmpfs at
/// `/tmp` and at `/dev/shm`. Its environment: `SHIM`, `CHAOS`, `CLI`, `PY` (the scraper, run
/// as root), `N` (a shell prefix that runs as uid 1001), the fake driver on the library path.
/// `None` (said) when not root.
fn on_node(what: &str, script: &str, env: &[(&str, &str)]) -> Option<Out> {
    if uid() != 0 {
        eprintln!("{what}: not root, so no other uid and no private mounts: not checked");
        return None;
    }
    let full = format!(
        "set -u; {} && mount -t tmpfs -o mode=1777 tmpfs /dev/shm || exit 97\nexport TMPDIR=/tmp\ncd \"$PWD\"\n{script}",
        fresh_tmp()
    );
    let mut cmd = Command::new("unshare");
    cmd.args(["-m", "--propagation", "private", "sh", "-c", &full]);
    let py = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/neighbour.py");
    // What uid 1001 runs must be reachable from a checkout under a 0700 folder.
    let staged = Staged::new();
    script_env(&mut cmd);
    staged
        .apply(&mut cmd)
        .env("PY", format!("python3 {}", py.display()))
        .env("N", N)
        .envs(env.iter().copied());
    let o = finish(cmd, Duration::from_secs(150), what);
    assert_ne!(
        o.status.code(),
        Some(97),
        "{what}: no private mounts: {}",
        o.stderr
    );
    Some(o)
}

/// The shell that mounts a fresh tmpfs at `/tmp` and, where the checkout or its build lives
/// under `/tmp` (a CI runner's clone), binds those folders back into it: the old `/tmp` is
/// seen through `/mnt` for the moment it takes.
fn fresh_tmp() -> String {
    let target = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("the target folder")
        .to_path_buf();
    let mut keep: Vec<PathBuf> = [Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf(), target]
        .into_iter()
        .filter_map(|p| p.canonicalize().ok())
        .filter(|p| p.starts_with("/tmp"))
        .collect();
    keep.sort();
    keep.dedup_by(|b, a| b.starts_with(&*a)); // a folder inside another kept one comes with it
    if keep.is_empty() {
        return "mount -t tmpfs -o mode=1777 tmpfs /tmp".into();
    }
    let mut sh = String::from("mount --bind /tmp /mnt && mount -t tmpfs -o mode=1777 tmpfs /tmp");
    for p in &keep {
        let rel = p.strip_prefix("/tmp").unwrap().display().to_string();
        sh.push_str(&format!(
            " && mkdir -p '/tmp/{rel}' && mount --bind '/mnt/{rel}' '/tmp/{rel}'"
        ));
    }
    sh.push_str(" && umount /mnt");
    sh
}

/// `key=value` of the first line of `out` that starts with `tag`.
fn field(out: &str, tag: &str, key: &str) -> String {
    let line = out
        .lines()
        .find(|l| l.starts_with(tag))
        .unwrap_or_else(|| panic!("no line {tag}:\n{out}"));
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key} on {line}"))
        .to_string()
}

fn scratch(what: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("hostile-{what}"));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Case 1. A root job with `CUDAPOOL_RUNTIME_DIR=/tmp` and with a team's directory (2775, group
/// 1001): neither changes mode, group or setgid bit; the pages live in a private
/// `cudapool-0` made inside, where `stat` finds them. Before: `/tmp` became 0700 (every other
/// user locked out) and the team directory lost its group write and setgid bit.
#[test]
fn a_shared_runtime_directory_is_never_changed() {
    let script = r#"
mkdir /tmp/team && chown 0:1001 /tmp/team && chmod 2775 /tmp/team
for d in /tmp /tmp/team; do
  sleep 3 2>/dev/null | CUDAPOOL_RUNTIME_DIR=$d LD_PRELOAD=$SHIM $CHAOS once hold >/dev/null &
  sleep 1
  echo "stat $d: $(CUDAPOOL_RUNTIME_DIR=$d $CLI stat | head -1)"
  wait
done
echo "modes tmp=$(stat -c %a /tmp) team=$(stat -c %a:%g /tmp/team) private=$(stat -c %a:%u /tmp/cudapool-0) team_private=$(stat -c %a /tmp/team/cudapool-0)"
"#;
    let Some(o) = on_node("runtime directory", script, &[]) else {
        return;
    };
    let all = format!("{}\n{}", o.stdout, o.stderr);
    assert_eq!(field(&o.stdout, "modes", "tmp"), "1777", "{all}");
    assert_eq!(field(&o.stdout, "modes", "team"), "2775:1001", "{all}");
    assert_eq!(field(&o.stdout, "modes", "private"), "700:0", "{all}");
    assert_eq!(field(&o.stdout, "modes", "team_private"), "700", "{all}");
    for d in ["/tmp:", "/tmp/team:"] {
        let line = o.stdout.lines().find(|l| l.contains(d)).unwrap_or("");
        assert!(
            line.contains(": pid "),
            "stat finds the process in {d}\n{all}"
        );
    }
}

/// Case 2. What uid 1001 plants in sticky `/tmp` at the names a root job writes: links to a root
/// 0600 file, FIFOs (also for the next 500 pids of a `%p` snapshot), 0666 files of its own.
/// Nothing is followed, nothing hangs, nothing leaks, each is said in one line; a folder that
/// does not exist is said when the variables are read and `cudapool run` exits 2 before the
/// program starts. Before: the victim overwritten, the program hung on each FIFO (killed
/// after 15 s), the report, trace and snapshot written into the neighbour's files, and the
/// missing folder found only at exit.
#[test]
fn output_files_never_follow_block_on_or_leak_into_what_a_neighbour_planted() {
    let script = r#"
echo secret > /tmp/victim; chmod 600 /tmp/victim
$N ln -s /tmp/victim /tmp/report; $N ln -s /tmp/victim /tmp/trace.json
CUDAPOOL_REPORT=/tmp/report CUDAPOOL_TRACE=/tmp/trace.json LD_PRELOAD=$SHIM $CHAOS once >/dev/null 2>/tmp/err.links
echo "links rc=$? victim=$(cat /tmp/victim)"
$N mkfifo /tmp/r.fifo /tmp/t.fifo /tmp/oom.pickle
t0=$(date +%s)
timeout 15 env CUDAPOOL_REPORT=/tmp/r.fifo CUDAPOOL_TRACE=/tmp/t.fifo CUDAPOOL_OOM_SNAPSHOT=/tmp/oom.pickle LD_PRELOAD=$SHIM $CHAOS oom 1 >/dev/null 2>/tmp/err.fifo
echo "fifo rc=$? s=$(( $(date +%s) - t0 ))"
p=$(sh -c 'echo $$'); names=""; i=1
while [ $i -le 500 ]; do names="$names /tmp/oom-$(( p + i )).pickle"; i=$(( i + 1 )); done
$N mkfifo $names
timeout 15 env CUDAPOOL_OOM_SNAPSHOT=/tmp/oom-%p.pickle LD_PRELOAD=$SHIM $CHAOS oom 1 >/dev/null 2>/tmp/err.fifop
echo "fifo_pid rc=$? planted=$(ls /tmp/oom-*.pickle | wc -l)"
$N sh -c 'touch /tmp/leak /tmp/leak.json /tmp/leak.pickle; chmod 666 /tmp/leak /tmp/leak.json /tmp/leak.pickle'
CUDAPOOL_REPORT=/tmp/leak CUDAPOOL_TRACE=/tmp/leak.json CUDAPOOL_OOM_SNAPSHOT=/tmp/leak.pickle LD_PRELOAD=$SHIM $CHAOS oom 1 >/dev/null 2>/tmp/err.leak
echo "leak rc=$? sizes=$(stat -c %s /tmp/leak /tmp/leak.json /tmp/leak.pickle | paste -sd, -) owner=$(stat -c %u /tmp/leak)"
CUDAPOOL_TRACE=/tmp/nope/t.json $CLI run -- $CHAOS once >/tmp/out.run 2>/tmp/err.run
echo "run_missing rc=$? ran=$(grep -c 'once ok' /tmp/out.run)"
CUDAPOOL_TRACE=/tmp/nope/t.json LD_PRELOAD=$SHIM $CHAOS once >/dev/null 2>/tmp/err.missing
echo "preload_missing rc=$?"
for e in links fifo fifop leak run missing; do sed "s/^/$e: /" /tmp/err.$e >&2; done
"#;
    let Some(o) = on_node("output files", script, &[]) else {
        return;
    };
    let (out, err) = (&o.stdout, &o.stderr);
    let all = format!("{out}\n{err}");
    assert_eq!(field(out, "links", "rc"), "0", "{all}");
    assert_eq!(field(out, "links", "victim"), "secret", "{all}");
    assert!(err.contains("links: cudapool: CUDAPOOL_REPORT: cannot be written: /tmp/report: a symbolic link is there"), "{all}");
    assert_eq!(field(out, "fifo", "rc"), "0", "no hang: {all}");
    assert!(
        field(out, "fifo", "s").parse::<u64>().unwrap() < 10,
        "{all}"
    );
    assert!(err.contains("fifo: cudapool: CUDAPOOL_OOM_SNAPSHOT: cannot be written: /tmp/oom.pickle: a FIFO is there"), "{all}");
    assert!(
        err.contains("no snapshot: /tmp/oom.pickle: a FIFO is there"),
        "{all}"
    );
    assert_eq!(field(out, "fifo_pid", "rc"), "0", "no hang: {all}");
    assert!(
        err.contains("fifop: cudapool: CUDAPOOL_OOM_SNAPSHOT: cannot be written"),
        "{all}"
    );
    assert!(
        err.contains("fifop: cudapool: out of memory") && err.contains("no snapshot"),
        "{all}"
    );
    assert_eq!(field(out, "leak", "rc"), "0", "{all}");
    assert_eq!(
        field(out, "leak", "sizes"),
        "0,0,0",
        "nothing leaked: {all}"
    );
    assert_eq!(field(out, "leak", "owner"), "1001", "{all}");
    assert!(err.contains("the file there belongs to user 1001"), "{all}");
    assert_eq!(field(out, "run_missing", "rc"), "2", "{all}");
    assert_eq!(field(out, "run_missing", "ran"), "0", "{all}");
    assert!(
        err.contains(
            "run: cudapool run: CUDAPOOL_TRACE: cannot be written: /tmp/nope: no such folder"
        ),
        "{all}"
    );
    assert_eq!(field(out, "preload_missing", "rc"), "0", "{all}");
    assert!(
        err.contains(
            "missing: cudapool: CUDAPOOL_TRACE: cannot be written: /tmp/nope: no such folder"
        ),
        "{all}"
    );
}

/// The bytes of a page whose sequence word is odd (a writer that never finishes), and of a
/// ledger likewise: what the neighbour plants by the hundred.
fn odd_files(dir: &Path) -> (PathBuf, PathBuf) {
    use cudapool::report::page::{Page, LAYOUT_VERSION, MAGIC};
    let mut page = vec![0u8; std::mem::size_of::<Page>()];
    let put = |b: &mut Vec<u8>, at: usize, v: &[u8]| b[at..at + v.len()].copy_from_slice(v);
    put(
        &mut page,
        std::mem::offset_of!(Page, magic),
        &MAGIC.to_ne_bytes(),
    );
    put(
        &mut page,
        std::mem::offset_of!(Page, version),
        &LAYOUT_VERSION.to_ne_bytes(),
    );
    put(
        &mut page,
        std::mem::offset_of!(Page, seq),
        &1u64.to_ne_bytes(),
    );
    let ledger_size = cudapool::limits::group::ledger::ledger_bytes();
    let mut ledger = vec![0u8; ledger_size];
    let at = cudapool::limits::group::ledger::seq_offset();
    put(&mut ledger, at, &1u64.to_ne_bytes());
    let (p, l) = (dir.join("odd-page"), dir.join("odd-ledger"));
    std::fs::write(&p, page).unwrap();
    std::fs::write(&l, ledger).unwrap();
    (p, l)
}

/// Case 3. uid 1001 fills its runtime directory with 300 pages and 256 ledgers whose sequence word
/// stays odd, first with no process holding them, then held by a live process of its own. The
/// root exporter answers within its read's time (2 s) and `GET /` at once while it reads, says
/// what it skipped, and still shows root's own process. Before: 33 s a scrape (`GET /` as long)
/// with the files not even held, and 14 s for the ledgers.
#[test]
fn odd_pages_and_ledgers_cannot_blind_the_root_exporter() {
    let d = scratch("odd");
    let (page, ledger) = odd_files(&d);
    let member = cudapool::limits::group::ledger::member_byte_offset(0);
    let port = free_port();
    let script = format!(
        r#"
u=/dev/shm/cudapool-1001; mkdir -m 700 $u
i=1; while [ $i -le 300 ]; do cp {page} $u/page-$(( 100000 + i )); i=$(( i + 1 )); done
i=1; while [ $i -le 256 ]; do cp {ledger} $u/group-g$i; i=$(( i + 1 )); done
chown -R 1001:1001 $u
sleep 30 2>/dev/null | LD_PRELOAD=$SHIM $CHAOS once hold >/dev/null 2>&1 &
mine=$!
$CLI exporter --listen 127.0.0.1:{port} --interval 0 >/dev/null 2>/tmp/exporter.err &
exporter=$!
sleep 1
$PY scrape {port} dead
$N $CHAOS hold $u {member} >/tmp/hold.out 2>&1 &
holder=$!
while ! grep -q holding /tmp/hold.out; do sleep 0.1; kill -0 $holder || break; done
$PY scrape {port} live
kill $holder $exporter $mine
cat /tmp/hold.out /tmp/exporter.err >&2
"#,
        page = page.display(),
        ledger = ledger.display()
    );
    let Some(o) = on_node("odd pages", &script, &[]) else {
        return;
    };
    let (out, err) = (&o.stdout, &o.stderr);
    let all = format!("{out}\n{err}");
    for tag in ["dead", "live"] {
        let m: f64 = field(out, tag, "metrics_s").parse().unwrap();
        let r: f64 = field(out, tag, "root_s").parse().unwrap();
        assert!(m < 4.0, "{tag}: a scrape took {m} s\n{all}");
        assert!(r < 0.5, "{tag}: GET / took {r} s\n{all}");
        assert!(
            out.contains(&format!("{tag} cudapool_processes 1")),
            "{tag}: root's own process shown\n{all}"
        );
    }
    assert!(
        out.lines().any(|l| l
            .starts_with("dead cudapool_exporter_skipped_files{reason=\"invalid\"}")
            && !l.ends_with(" 0")),
        "{all}"
    );
    assert!(
        out.lines().any(|l| (l
            .starts_with("live cudapool_exporter_skipped_files{reason=\"time\"}")
            || l.starts_with("live cudapool_exporter_skipped_files{reason=\"busy\"}"))
            && !l.ends_with(" 0")),
        "{all}"
    );
}

/// Case 5. The user's own cleanup script empties a live process's page (`: > page-*`), then
/// removes it. The process runs on and exits 0; its page is whole again within a poll, and
/// made again once removed, so `stat` sees it. Before: SIGBUS, exit 135; a removed page was
/// never written again.
#[test]
fn a_page_cut_by_its_user_costs_the_page_never_the_process() {
    let d = scratch("cut");
    let dir = d.join("run");
    let script = format!(
        r#"
sleep 6 2>/dev/null | CUDAPOOL_RUNTIME_DIR={dir} LD_PRELOAD=$SHIM $CHAOS once hold >/dev/null &
pid=$!
sleep 1
for f in {dir}/page-*; do : > $f; done
sleep 1.5
echo "stat: $(CUDAPOOL_RUNTIME_DIR={dir} $CLI stat | head -1)"
rm -f {dir}/page-*
sleep 1.5
echo "removed: $(CUDAPOOL_RUNTIME_DIR={dir} $CLI stat | head -1)"
wait $pid
echo "cut rc=$?"
"#,
        dir = dir.display()
    );
    let mut sh = Command::new("sh");
    script_env(sh.args(["-c", &script]));
    let o = finish(sh, Duration::from_secs(60), "cut page");
    let all = format!("{}\n{}", o.stdout, o.stderr);
    assert_eq!(field(&o.stdout, "cut", "rc"), "0", "{all}");
    assert!(
        o.stdout.contains("stat: pid "),
        "the page is whole again\n{all}"
    );
    assert!(
        o.stdout.contains("removed: pid "),
        "a removed page is made again (issue 54, case 8; before: the process vanished)\n{all}"
    );
}

/// A `chaos` client under the shim in `cwd`.
fn chaos_in(args: &[&str], env: &[(&str, &str)]) -> Out {
    finish(chaos(args, env), Duration::from_secs(60), "chaos")
}

/// Case 6. 30 OOMs with `%n` in the snapshot's name and `CUDAPOOL_OOM_SNAPSHOT_KEEP=4`: the last
/// four are kept (27 to 30), each OOM line names the file it removed. Before: 30 files.
#[test]
fn numbered_snapshots_keep_the_last_few() {
    let d = scratch("keep");
    let t = d.join("oom-%n.pickle");
    let o = chaos_in(
        &["oom", "30"],
        &[
            ("CUDAPOOL_OOM_SNAPSHOT", t.to_str().unwrap()),
            ("CUDAPOOL_OOM_SNAPSHOT_KEEP", "4"),
        ],
    );
    assert!(o.status.success(), "{}{}", o.stdout, o.stderr);
    assert!(o.stdout.contains("oom ooms=30"), "{}", o.stdout);
    let mut kept: Vec<String> = std::fs::read_dir(&d)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    kept.sort();
    assert_eq!(
        kept,
        [
            "oom-27.pickle",
            "oom-28.pickle",
            "oom-29.pickle",
            "oom-30.pickle"
        ],
        "{}",
        o.stderr
    );
    assert!(o.stderr.contains("; removed "), "{}", o.stderr);
    assert!(
        o.stderr
            .contains("oom-26.pickle (CUDAPOOL_OOM_SNAPSHOT_KEEP=4)"),
        "{}",
        o.stderr
    );
}

/// Case 7. `cudapool plot` of a trace naming 3,000 devices, of `/dev/zero` and of a FIFO: each
/// refused at once with one line. Before: a 64 MB picture, and `/dev/zero` read forever.
#[test]
fn plot_reads_bounded_input() {
    let d = scratch("plot");
    let mut events = String::from("{\"traceEvents\":[");
    for dev in 0..3000 {
        if dev > 0 {
            events.push(',');
        }
        events.push_str(&format!(
            "{{\"name\":\"device {dev} memory\",\"ph\":\"C\",\"ts\":{dev},\"pid\":1,\"tid\":0,\"args\":{{\"allocated\":1,\"reserved\":2,\"limit\":0}}}}"
        ));
    }
    events.push_str("]}");
    let big = d.join("devices.json");
    std::fs::write(&big, events).unwrap();
    let fifo = d.join("fifo.json");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo of a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let svg = d.join("out.svg");
    for (input, says) in [
        (big.as_path(), "more than 64 devices"),
        (Path::new("/dev/zero"), "a device, not a regular file"),
        (fifo.as_path(), "a FIFO, not a regular file"),
    ] {
        let t0 = Instant::now();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_cudapool"));
        cmd.arg("plot").arg(input).arg("-o").arg(&svg);
        let o = finish(cmd, Duration::from_secs(20), "plot");
        assert_eq!(
            o.status.code(),
            Some(2),
            "{}: {}",
            input.display(),
            o.stderr
        );
        assert!(o.stderr.contains(says), "{}: {}", input.display(), o.stderr);
        assert!(t0.elapsed() < Duration::from_secs(5));
        assert!(!svg.exists());
    }
}

/// Case 8 (issue 44), and issue 54's case 4: uid 1001 takes all eight of the names root's runtime
/// directory had (`cudapool-0`, `.1` to `.7`: a directory and links). Root's programs walk
/// around to a directory of their own with a random name; in a group they get their whole
/// limit; with `CUDAPOOL_RUNTIME_DIR=/tmp` and `/tmp/cudapool-0` planted, likewise. `stat` finds
/// them and names the squat; the exporter says it in a metric and once on its stderr. Before
/// (226784a): every allocation in a group refused (`fill n=0`), and stat said "no cudapool
/// process is running".
#[test]
fn a_squatted_runtime_directory_is_walked_around_and_said() {
    let port = free_port();
    let script = format!(
        r#"
$N sh -c 'mkdir /dev/shm/cudapool-0; for k in 1 2 3 4 5 6 7; do ln -s /etc /dev/shm/cudapool-0.$k; done; touch /tmp/cudapool-0'
export CUDAPOOL_GROUP=mine CUDAPOOL_GROUP_LIMIT=64MiB
LD_PRELOAD=$SHIM $CHAOS fill 8388608 0
CUDAPOOL_RUNTIME_DIR=/tmp LD_PRELOAD=$SHIM $CHAOS fill 8388608 0
sleep 3 2>/dev/null | LD_PRELOAD=$SHIM $CHAOS once hold >/dev/null &
sleep 3 2>/dev/null | CUDAPOOL_RUNTIME_DIR=/tmp LD_PRELOAD=$SHIM $CHAOS once hold >/dev/null &
sleep 1
$CLI stat | sed 's/^/stat: /'
CUDAPOOL_RUNTIME_DIR=/tmp $CLI stat | sed 's/^/tmpstat: /'
$CLI exporter --listen 127.0.0.1:{port} --interval 0 >/dev/null 2>/tmp/exporter.err &
exporter=$!
sleep 1
$PY scrape {port} squat
kill $exporter
sed 's/^/exporter: /' /tmp/exporter.err
wait
"#
    );
    let Some(o) = on_node("squatted", &script, &[]) else {
        return;
    };
    let (out, err) = (&o.stdout, &o.stderr);
    let all = format!("{out}\n{err}");
    assert!(o.status.signal().is_none(), "{all}");
    let n: Vec<&str> = out.lines().filter(|l| l.starts_with("fill n=")).collect();
    assert_eq!(
        n,
        ["fill n=8", "fill n=8"],
        "the whole limit, both ways: {all}"
    );
    assert!(err.contains("using /dev/shm/cudapool-0."), "{all}");
    assert!(err.contains("using /tmp/cudapool-0."), "{all}");
    assert!(out.contains("stat: pid "), "stat finds the process: {all}");
    assert!(out.contains("tmpstat: pid "), "{all}");
    assert!(
        out.contains("note: /dev/shm/cudapool-0 belongs to user 1001"),
        "{all}"
    );
    assert!(
        out.lines().any(|l| l.starts_with("squat cudapool_runtime_dir_squatted{uid=\"0\",path=\"/dev/shm/cudapool-0\",used=\"/dev/shm/cudapool-0."))
            && out.contains("squat cudapool_processes 1"),
        "{all}"
    );
    assert!(
        out.contains("exporter: cudapool exporter: /dev/shm/cudapool-0 belongs to user 1001"),
        "{all}"
    );
}

/// Issue 54, case 6: uid 1001 makes 1.2 million empty files in `/dev/shm`, one at the default
/// name of every uid up to 1.2 M (root's among them), and holds 4,096 odd pages of its own. A
/// root scrape still answers within 3 s and finds root's process within a few scrapes (each
/// reads on where the last one stopped), with a
/// bounded number of squat series and log lines. Before: 15 to 23 s a scrape, 13 MB of squat series, 150,001 lines.
#[test]
fn a_flood_of_files_costs_the_scrape_almost_nothing() {
    let d = scratch("flood");
    let (page, _) = odd_files(&d);
    let port = free_port();
    let script = format!(
        r#"
u=/dev/shm/cudapool-1001; mkdir -m 700 $u
python3 -c '
import os, shutil, sys
for i in range(1, 4097):
    shutil.copyfile(sys.argv[1], f"/dev/shm/cudapool-1001/page-{{100000 + i}}")
for i in range(1200000):
    if i != 1001:
        os.close(os.open(f"/dev/shm/cudapool-{{i}}", os.O_CREAT | os.O_WRONLY, 0o600))
' {page}
chown -R 1001:1001 $u
find /dev/shm -maxdepth 1 -name 'cudapool-*' -type f -exec chown 1001:1001 {{}} + 
echo files=$(ls -f /dev/shm | wc -l)
sleep 60 2>/dev/null | LD_PRELOAD=$SHIM $CHAOS once hold >/dev/null 2>&1 &
mine=$!
$N $CHAOS hold $u 0 >/tmp/hold.out 2>&1 &
holder=$!
while ! grep -q holding /tmp/hold.out; do sleep 0.1; kill -0 $holder || break; done
busy=""
for b in 1 2 3 4; do (while :; do :; done) & busy="$busy $!"; done
$CLI exporter --listen 127.0.0.1:{port} --interval 0 >/dev/null 2>/tmp/exporter.err &
exporter=$!
sleep 1
# Scrapes until three in a row found it (at most 20): how many a loaded machine needs to read
# the whole folder is the machine's, not the exporter's.
k=0; seen=0
while [ $k -lt 20 ] && [ $seen -lt 3 ]; do
  k=$((k+1)); $PY scrape {port} s$k > /tmp/scrape.out; cat /tmp/scrape.out
  if grep -q "^s$k cudapool_processes 1$" /tmp/scrape.out; then seen=$((seen+1)); fi
done
echo scrapes=$k
$CLI stat $mine >/tmp/stat.out 2>&1; echo stat_rc=$?; sed 's/^/stat: /' /tmp/stat.out | head -3
$CLI sleep --wait $mine >/tmp/sleep.out 2>&1; echo sleep_rc=$?; sed 's/^/sleep: /' /tmp/sleep.out | head -3
echo mine=$mine
kill $holder $exporter $mine $busy
echo lines=$(wc -l < /tmp/exporter.err)
"#,
        page = page.display()
    );
    let Some(o) = on_node("flood", &script, &[]) else {
        return;
    };
    let (out, err) = (&o.stdout, &o.stderr);
    let all = format!(
        "{}\n{}",
        out.lines().take(40).collect::<Vec<_>>().join("\n"),
        err
    );
    let files: usize = field(out, "files", "files").parse().unwrap_or(0);
    assert!(files > 1_200_000, "{all}");
    // docs/deploying.md: the process is found within a few scrapes (a loaded machine may make
    // the first ones stop at their time bound: each reads on where the last stopped), and once
    // found stays found: four busy loops run beside (issue 74, item 3: a scrape's opens had no
    // time left after a read cut at its deadline, and lost it again). [Under CI's own load
    // besides, five scrapes of 0.8 s had not read the whole folder yet: a fixed count failed.]
    let scrapes: usize = field(out, "scrapes", "scrapes").parse().unwrap_or(0);
    eprintln!("flood: found after {scrapes} scrapes (3 in a row needed)");
    let found: Vec<bool> = (1..=scrapes)
        .map(|k| out.contains(&format!("s{k} cudapool_processes 1")))
        .collect();
    let first = found.iter().position(|&f| f);
    assert!(first.is_some(), "found in scrapes {found:?}\n{all}");
    assert!(
        found[first.unwrap()..].iter().all(|&f| f),
        "found, then lost: {found:?}\n{all}"
    );
    // A command naming the pid reaches its page by name, whatever /dev/shm holds (its default
    // name is a planted file here: it walked around, and is found through what it holds open).
    let mine = field(out, "mine", "mine");
    assert_eq!(field(out, "stat_rc", "stat_rc"), "0", "{all}");
    assert!(out.contains(&format!("stat: pid {mine}")), "{all}");
    assert_eq!(field(out, "sleep_rc", "sleep_rc"), "0", "{all}");
    assert!(out.contains(&format!("sleep: {mine}: ")), "{all}");
    for tag in (1..=scrapes).map(|k| format!("s{k}")) {
        let tag = tag.as_str();
        let m: f64 = field(out, tag, "metrics_s").parse().unwrap();
        eprintln!("flood: {tag} scrape {m:.2} s under {files} files");
        assert!(m <= 3.0, "{tag}: a scrape took {m} s\n{all}");
        let squats = out
            .lines()
            .filter(|l| l.starts_with(&format!("{tag} cudapool_runtime_dir_squatted{{")))
            .count();
        assert!(squats <= 64, "{squats} squat series\n{all}");
    }
    let lines: usize = field(out, "lines", "lines").parse().unwrap();
    assert!(lines <= 70, "{lines} lines on the exporter's stderr\n{all}");
}

/// Issue 54, case 9: uid 1001 plants `/tmp/plots -> /etc` and `/tmp/reports -> /root` (on a
/// host whose `fs.protected_symlinks` is off, the kernel would let root follow them). Root's
/// `cudapool plot -o /tmp/plots/memory.svg` and `CUDAPOOL_REPORT=/tmp/reports/report.txt` are
/// refused with one line, and nothing is written there. Before: the SVG was written into
/// `/etc`, the report replaced a file of a root-only folder.
#[test]
fn an_output_path_never_passes_through_a_neighbours_link() {
    let d = scratch("links");
    let trace = d.join("trace.json");
    std::fs::write(&trace, r#"{"traceEvents":[]}"#).unwrap();
    let script = format!(
        r#"
sysctl -qw fs.protected_symlinks=0 2>/dev/null || true
mkdir -m 700 /tmp/rootonly
$N sh -c 'ln -s /tmp/rootonly /tmp/plots; ln -s /tmp/rootonly /tmp/reports'
$CLI plot {trace} -o /tmp/plots/memory.svg; echo plot_rc=$?
CUDAPOOL_REPORT=/tmp/reports/report.txt LD_PRELOAD=$SHIM $CHAOS once; echo report_rc=$?
echo written=$(ls /tmp/rootonly | wc -l)
"#,
        trace = trace.display()
    );
    let Some(o) = on_node("folder links", &script, &[]) else {
        return;
    };
    let all = format!("{}\n{}", o.stdout, o.stderr);
    assert_eq!(field(&o.stdout, "plot_rc", "plot_rc"), "2", "{all}");
    assert_eq!(field(&o.stdout, "written", "written"), "0", "{all}");
    assert!(
        o.stderr
            .contains("plots is a link in a folder other users may write"),
        "{all}"
    );
    assert!(
        o.stderr
            .contains("reports is a link in a folder other users may write"),
        "{all}"
    );
}

/// `cudapool sleep|wake PID` across users: a third user gets one line and exit 2 (it is not
/// their process); root puts the user's process to sleep and wakes it through the user's own
/// page, and the process's next copy wakes it again with its data intact.
#[test]
fn root_puts_a_users_process_to_sleep_and_another_user_cannot() {
    let script = r#"
unset XDG_RUNTIME_DIR
mkfifo /tmp/idle.in; exec 3<>/tmp/idle.in
$N env CUDAPOOL_SEGMENTS=expandable LD_PRELOAD=$SHIM ./client gpa sleep_idle </tmp/idle.in >/tmp/idle.out 2>&1 &
pid=$!
while ! grep -q ready /tmp/idle.out; do sleep 0.1; kill -0 $pid || break; done
setpriv --reuid 1002 --regid 1002 --clear-groups $CLI sleep $pid >/tmp/o.other 2>/tmp/e.other
echo "other rc=$? lines=$(wc -l < /tmp/e.other)"
sed 's/^/other_err: /' /tmp/e.other
$CLI sleep --wait $pid | sed 's/^/root_sleep: /'
$N $CLI stat $pid | grep 'asleep:' | sed 's/^ */user_stat: /'
$CLI wake --wait $pid | sed 's/^/root_wake: /'
$CLI sleep --wait $pid >/dev/null; echo "again rc=$?"
echo go >&3
wait $pid; echo "client rc=$?"
sed 's/^/client: /' /tmp/idle.out
"#;
    let Some(o) = on_node("sleep across users", script, &[]) else {
        return;
    };
    let all = format!("{}\n{}", o.stdout, o.stderr);
    assert!(o.stdout.contains("other rc=2 lines=1"), "{all}");
    assert!(
        o.stdout.contains("other_err: ") && o.stdout.contains("no cudapool process"),
        "{all}"
    );
    assert!(
        o.stdout.contains("root_sleep: ") && o.stdout.contains(": asleep: "),
        "{all}"
    );
    assert!(
        o.stdout
            .contains("user_stat: asleep: 70.00 MiB on the host"),
        "{all}"
    );
    assert!(o.stdout.contains(": awake: "), "{all}");
    assert!(o.stdout.contains("again rc=0"), "{all}");
    assert!(o.stdout.contains("client rc=0"), "{all}");
    assert!(o.stdout.contains("client: before_check state=2"), "{all}");
    assert!(o.stdout.contains("client: intact=1"), "{all}");
}
