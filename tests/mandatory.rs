//! The mandatory mode when the node misbehaves (issue 60), the cases that need no running
//! Slurm: the root Prolog on a `/run` a job's user filled through their ledger, and Slurm's
//! commands where the site put them rather than on `PATH`. The cases that need Slurm's
//! cgroups and accounting are in `tests/slurm.rs`. Before, on 0fa64d2, in brackets.

mod common;
use common::*;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

fn cli() -> &'static str {
    env!("CARGO_BIN_EXE_cudapool")
}

/// Item 3: uid 1001 writes 8 MiB into its job's ledger on a 4 MiB `/run` (a private tmpfs in a
/// mount namespace of the test's own); the root Prolog of uid 1002's next job still writes
/// its share [`.102.new: No space left on device`, rc 1: Slurm drains the node].
#[test]
fn a_user_who_fills_run_through_a_ledger_stops_no_other_job() {
    if uid() != 0 {
        eprintln!("not root: the Prolog runs as root; not checked");
        return;
    }
    let script = format!(
        r#"set -u
        mount -t tmpfs -o size=4M tmpfs /run || exit 97
        cd /
        env -i SLURM_JOB_ID=101 SLURM_JOB_UID=1001 {cli} slurm prolog 2>/dev/null
        echo first_rc=$?
        setpriv --reuid 1001 --regid 65534 --clear-groups sh -c 'head -c 8388608 /dev/zero >> /run/cudapool/jobs/101.d/group-slurm-101' 2>&1 | sed 's/^/user: /'
        echo free_kib=$(df -k --output=avail /run | tail -1)
        env -i SLURM_JOB_ID=102 SLURM_JOB_UID=1002 {cli} slurm prolog
        echo second_rc=$?
        cat /run/cudapool/jobs/102 | tr '\n' ' '; echo
        echo ledger_bytes=$(stat -c %s /run/cudapool/jobs/101.d/group-slurm-101)
        "#,
        cli = cli()
    );
    let mut cmd = Command::new("unshare");
    cmd.args(["-m", "sh", "-c", &script]);
    let o = finish(cmd, Duration::from_secs(60), "prolog on a full /run");
    if o.status.code() == Some(97) {
        eprintln!("no private mount namespace here: not checked");
        return;
    }
    let all = format!("{}{}", o.stdout, o.stderr);
    assert!(all.contains("first_rc=0"), "{all}");
    assert!(all.contains("No space left"), "the user filled /run: {all}");
    assert!(all.contains("second_rc=0"), "the next job's Prolog: {all}");
    assert!(all.contains("group=slurm-102 limit="), "its share: {all}");
    assert!(all.contains("cut back"), "said: {all}");
    let kept = cudapool::limits::group::ledger::SIZE;
    assert!(
        all.contains(&format!("ledger_bytes={kept}")),
        "the ledger cut to its own size ({kept}): {all}"
    );
}

/// Item 7: Slurm's commands where the site put them (`slurm_bin=` in the site's file), with no
/// `PATH` at all, as Slurm runs a Prolog [found by bare name: none, or the wrong one].
#[test]
fn slurms_commands_are_found_where_the_site_put_them() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("slurm-bin");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("bin")).unwrap();
    // A squeue of the site's own: the job's TRES per node.
    std::fs::write(
        dir.join("bin/squeue"),
        "#!/bin/sh\necho 5 gres:gpumem:64M\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(
        dir.join("bin/squeue"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    let site = dir.join("slurm.conf");
    std::fs::write(&site, format!("slurm_bin={}\n", dir.join("bin").display())).unwrap();
    std::fs::set_permissions(&site, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = Command::new(cli())
        .args(["slurm", "--config", site.to_str().unwrap(), "share", "5"])
        .env_clear()
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(stdout.trim(), (64u64 << 20).to_string(), "{stderr}");
    // A folder that does not hold it: said, with where it was looked for.
    std::fs::write(&site, "slurm_bin=/nonexistent\n").unwrap();
    let out = Command::new(cli())
        .args(["slurm", "--config", site.to_str().unwrap(), "share", "5"])
        .env_clear()
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("Slurm's squeue is in none of /nonexistent"),
        "{stderr}"
    );
}

/// The ledger `name` in `dir` read until `done` says its member is gone (at most 5 s): a
/// member's lock goes with its descriptor, and a process another test spawns at that instant
/// holds a copy of the descriptor until its exec closes it.
fn read_when_gone(
    dir: &cudapool::base::rundir::RunDir,
    name: &str,
    done: impl Fn(&cudapool::limits::group::LedgerView) -> bool,
) -> cudapool::limits::group::LedgerView {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let view = cudapool::limits::group::ledger::read(dir, name).expect("read");
        if done(&view) || std::time::Instant::now() > until {
            return view;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Item 8: a job's ledger with no member left stays in its folder of root (the job's Epilog
/// removes it after recording it), and the reader says so [`stat` said "its ledger is removed"
/// while it stayed]; a user's own dead ledger is removed by the reader, as before.
#[test]
fn a_jobs_ledger_without_members_stays_and_is_said_to() {
    if uid() != 0 {
        eprintln!("not root: a job's folder is root's; not checked");
        return;
    }
    use cudapool::limits::group::{ledger, Group};
    let base = Path::new(env!("CARGO_TARGET_TMPDIR")).join("job-ledger");
    let _ = std::fs::remove_dir_all(&base);
    let job = base.join("77.d");
    std::fs::create_dir_all(&job).unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&job, std::fs::Permissions::from_mode(0o755)).unwrap();
    let g = Group::join("slurm-77", None, Some(&job)).expect("joins the job's group");
    drop(g);
    let name = ledger::file_name("slurm-77");
    let dir = cudapool::base::rundir::of_job(&job, 0).unwrap();
    let view = read_when_gone(&dir, &name, |v| v.members.is_empty());
    assert!(view.members.is_empty(), "no member left");
    assert!(
        !view.removed,
        "a job's ledger is not the reader's to remove"
    );
    assert!(job.join(&name).exists(), "it stays for the Epilog");
    // A user's own folder: the dead ledger goes.
    let mine = base.join("mine");
    let g = Group::join("mine", Some(&mine), None).expect("joins");
    drop(g);
    let (dir, _) = cudapool::base::rundir_find::mine(Some(&mine)).unwrap();
    let view = read_when_gone(&dir, &ledger::file_name("mine"), |v| v.removed);
    assert!(view.removed && !mine.join(ledger::file_name("mine")).exists());
    let _ = std::fs::remove_dir_all(&base);
}

/// Issue 74, item 6: the job's user zeroes its GPU slot's `total` word in the job's ledger (a
/// file of theirs), then its `used` word, while a member holds the whole share (1 GiB, 16
/// blocks of 64 MiB). Before, each zeroing let another member take a whole share more (16+16+16
/// blocks); now each member also asks the driver what the job's processes hold (NVML's
/// per-process memory; here the fake driver's board, which the user does not write) and refuses
/// above the share and its slack (16 MiB, and 128 MiB for each of the job's processes on the
/// GPU, while it runs): 16+4+4, never more than 1 GiB + 272 MiB held at once.
/// Run without Slurm: a freezer cgroup `job_<id>`, and the share file as the root Prolog makes
/// them in a private /run.
#[test]
fn a_forged_ledger_cannot_take_a_job_past_its_share() {
    if uid() != 0 {
        eprintln!("not root: the job's cgroup and share file are root's; not checked");
        return;
    }
    let f = fixture();
    let job = (4_100_000 + std::process::id() % 100_000).to_string();
    let top = Path::new("/sys/fs/cgroup/freezer").join(format!("cudapool-witness-{job}"));
    let cg = top.join(format!("job_{job}")).join("step_0");
    if std::fs::create_dir_all(&cg).is_err() {
        eprintln!("no cgroup v1 freezer hierarchy to make a job in: not checked");
        return;
    }
    // The share file and the job's ledger folder, as the root Prolog makes them, in a /run of
    // the test's own (a private mount namespace): the machine's /run/cudapool is never touched
    // (while /run/cudapool/jobs exists the node is in the mandatory mode, for every test and
    // every other checkout on it).
    let jobs = Path::new("/run/cudapool/jobs");
    let gdir = cudapool::base::job::ledger_dir(&job);
    let ledger = gdir.join(format!("group-slurm-{job}"));
    let share_text = cudapool::base::job::share_text(&job, 1 << 30, None);
    let board = f.dir.join(format!("board-{job}"));
    let _ = std::fs::remove_dir_all(&board);
    std::fs::create_dir_all(&board).unwrap();
    use cudapool::limits::group::ledger::slot_word_offset;
    let script = format!(
        r#"set -u
        mount -t tmpfs -o size=16M tmpfs /run || exit 97
        mkdir -p {gdir} && chmod 755 {jobs} {gdir}
        printf '%s' '{share_text}' > {jobs}/{job} && chmod 644 {jobs}/{job}
        : > {ledger} && chmod 600 {ledger}
        run() {{ sh -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' {cg} env LD_PRELOAD={lib} LD_LIBRARY_PATH={dir} FAKECU_BOARD={board} FAKECU_TOTAL_MEM=4294967296 CUDAPOOL_CACHE_IDLE=never {chaos} "$@"; }}
        zero() {{ python3 -c "import sys; f=open(sys.argv[1],'r+b'); f.seek(int(sys.argv[2])); f.write(bytes(8))" {ledger} $1 && echo "zeroed $2"; }}
        run fill 67108864 4 2>&1 | sed 's/^/first: /' &
        sleep 1.5
        zero {total} total
        run fill 67108864 0 2>&1 | sed 's/^/second: /'
        zero {used} used
        run fill 67108864 0 2>&1 | sed 's/^/third: /'
        wait
        "#,
        gdir = gdir.display(),
        jobs = jobs.display(),
        cg = cg.display(),
        lib = f.lib.display(),
        dir = f.dir.display(),
        board = board.display(),
        chaos = f.dir.join("chaos").display(),
        ledger = ledger.display(),
        total = slot_word_offset(0, "total"),
        used = slot_word_offset(0, "used"),
    );
    let mut cmd = Command::new("unshare");
    cmd.args(["-m", "bash", "-c", &script]);
    let o = finish(cmd, Duration::from_secs(60), "a forged ledger");
    let all = format!("{}{}", o.stdout, o.stderr);
    let _ = std::fs::remove_dir_all(&board);
    for d in [&cg, &cg.parent().unwrap().to_path_buf(), &top] {
        let _ = std::fs::remove_dir(d);
    }
    if o.status.code() == Some(97) {
        eprintln!("no private mount namespace here: not checked");
        return;
    }
    let fill = |who: &str| -> u64 {
        all.lines()
            .find_map(|l| l.strip_prefix(&format!("{who}: fill n=")))
            .unwrap_or_else(|| panic!("no {who} fill: {all}"))
            .trim()
            .parse()
            .unwrap()
    };
    assert!(
        all.contains("zeroed total") && all.contains("zeroed used"),
        "{all}"
    );
    assert_eq!(fill("first"), 16, "the whole share: {all}");
    assert_eq!(
        fill("second"),
        4,
        "a zeroed total buys the slack alone (128 MiB for each of 2 processes): {all}"
    );
    assert_eq!(
        fill("third"),
        4,
        "a zeroed slot, the same (the second had ended): {all}"
    );
    assert!(
        all.contains("the driver says its 2 processes hold"),
        "the refusal is said: {all}"
    );
}
