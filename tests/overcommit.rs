//! More jobs than a GPU holds (issue 78, item 2): on a node whose GPU memory is overcommitted
//! (`overcommit=` in the site's settings), a job refused by the driver asks root's arbiter
//! (`cudapool slurm arbiter`), which puts another job idle above its request to sleep; the idle
//! job finds every byte again when it works. Run without Slurm: freezer cgroups `job_<id>` and
//! the share files as the root Prolog writes them, in a private /run; the fake driver's one
//! 1 GiB device shared by every process (`FAKECU_SHARED`), its per-process record standing for
//! the kernel driver's (what NVML lists).

mod common;
use common::*;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// Job A (root's; request 512 MiB, may hold 1 GiB) holds 600 MiB and is idle; job B (uid
/// 1001's, the same) fills 8 MiB blocks until refused. Without the arbiter B gets what A left;
/// with it, A is put to sleep and B gets 800 MiB or more; A, at its next work, wakes with every
/// byte intact. A job at or under its request is never put to sleep: with A holding 200 MiB, B
/// gets what is left. B holding the GPU idle is put to sleep in turn for A's wake; B holding it
/// busy is not, and A's wake ends at its timeout with the OOM line. B's physical memory of its
/// own (`cuMemCreate`, passed through uncached) asks as its cached blocks do. A keeping its GPU
/// busy above its request is put to sleep all the same for B within its own. A that runs no
/// cudapool, so cannot sleep, is checkpointed by the driver instead and restored when B has
/// ended, also by an arbiter restarted meanwhile. A process in no job, or a line that is no
/// request, gets a refusal.
#[test]
fn an_idle_job_above_its_request_sleeps_for_another_and_wakes_intact() {
    if uid() != 0 {
        eprintln!(
            "not root: the jobs' cgroups, share files and the arbiter are root's; not checked"
        );
        return;
    }
    let base = 4_300_000 + std::process::id() % 100_000;
    let (a, b) = (base.to_string(), (base + 1).to_string());
    let top = Path::new("/sys/fs/cgroup/freezer").join(format!("cudapool-overcommit-{base}"));
    let memcg = Path::new("/sys/fs/cgroup/memory").join(format!("cudapool-overcommit-{base}"));
    let cg = |job: &str| top.join(format!("job_{job}")).join("step_0");
    if std::fs::create_dir_all(cg(&a)).is_err() || std::fs::create_dir_all(cg(&b)).is_err() {
        eprintln!("no cgroup v1 freezer hierarchy to make jobs in: not checked");
        return;
    }
    // What uid 1001 runs, where it can reach it (a checkout may be in a folder of root's alone).
    let staged = Staged::new();
    let scratch = open_temp_dir("/tmp/cudapool-overcommit-");
    let board = scratch.join("board");
    std::fs::create_dir_all(&board).unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&board, std::fs::Permissions::from_mode(0o1777)).unwrap();
    // As the Prolog writes them with overcommit=2: a request of 512 MiB, twice that the limit.
    let share = |job: &str| cudapool::base::job::share_text(job, 1 << 30, Some(512 << 20));
    let script = format!(
        r#"set -u
        mount -t tmpfs -o size=16M tmpfs /run || exit 97
        J=/run/cudapool/jobs
        mkdir -p $J/{a}.d $J/{b}.d && chmod 755 /run/cudapool $J $J/{a}.d $J/{b}.d
        printf '%s' '{share_a}' > $J/{a} && printf '%s' '{share_b}' > $J/{b} && chmod 644 $J/{a} $J/{b}
        : > $J/{a}.d/group-slurm-{a} && : > $J/{b}.d/group-slurm-{b} && chmod 600 $J/*.d/group-*
        chown 1001:1001 $J/{b}.d/group-slurm-{b}
        printf 'overcommit=2\nsleep_idle=1s\n' > /run/cudapool/site.conf && chmod 644 /run/cudapool/site.conf
        export LD_LIBRARY_PATH={dir} FAKECU_BOARD={board} FAKECU_SHARED=1 FAKECU_TOTAL_MEM=1073741824
        in_job() {{ cg=$1; shift; sh -c 'echo $$ > "$0/cgroup.procs" && {{ [ -z "${{A_MEMCG:-}}" ] || echo $$ > "$A_MEMCG/cgroup.procs"; }} && exec "$@"' $cg env LD_PRELOAD={lib} CUDAPOOL_CACHE_IDLE=never CUDAPOOL_LOG=info "$@"; }}
        # Job A holds MIB, idle, until its file exists; then checks every byte. (Each wait for
        # a process to be ready allows 30 s: the suite runs beside other work.)
        hold() {{ rm -f {s}/go; in_job {cga} env ${{A_ENV:-A=1}} {client} gpa suspend_hold $1 {s}/go ${{A_IDLE-idle}} > {s}/a.out 2>&1 &
          a=$!; for i in $(seq 300); do grep -q ready {s}/a.out && break; sleep 0.1; done; sleep 2; }}
        as_b() {{ in_job {cgb} setpriv --reuid 1001 --regid 1001 --clear-groups env "$@"; }}
        release() {{ touch {s}/go; wait $a; grep -h 'suspend_hold\|arbiter\|waking\|out of memory\|client:\|ignored' {s}/a.out | sed "s/^/a$1: /"; }}
        fill() {{ in_job {cgb} setpriv --reuid 1001 --regid 1001 --clear-groups env {chaos} fill 8388608 0 2>&1 | grep -h 'fill n=\|arbiter' | sed "s/^/b$1: /"; }}
        ask() {{ python3 -c "import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect('/run/cudapool/arbiter.sock'); s.sendall(sys.argv[1].encode()+b'\\n'); print('asked:', s.recv(200).decode().strip())" "$1"; }}
        hold 600; fill 1; release 1
        {cli} slurm --config /run/cudapool/site.conf arbiter 2> {s}/arbiter.log &
        arb=$!
        for i in $(seq 50); do [ -S /run/cudapool/arbiter.sock ] && break; sleep 0.1; done
        # A asks, through its environment, for a request as large as the GPU: not its to raise.
        A_ENV=CUDAPOOL_MEMORY_REQUEST=2GiB hold 600; fill 2; release 2
        hold 200; fill 3; release 3
        # B fills the GPU (A asleep for it) and holds it, idle: A's next work wakes it, and
        # its wake asks the arbiter, which puts B to sleep in turn.
        hold 600
        as_b {chaos} fill 8388608 12 > {s}/b4.out 2>&1 &
        b=$!; for i in $(seq 300); do grep -q 'fill n=' {s}/b4.out && break; sleep 0.1; done; sleep 1.5
        grep -h 'fill n=' {s}/b4.out | sed "s/^/b4: /"; release 4; wait $b
        # B fills the GPU and keeps working: A's wake waits its 2 s, then the OOM line.
        A_ENV=CUDAPOOL_WAKE_TIMEOUT=2s hold 600
        rm -f {s}/go-b; as_b {client} gpa suspend_hold 904 {s}/go-b > {s}/b5.out 2>&1 &
        b=$!; for i in $(seq 300); do grep -q ready {s}/b5.out && break; sleep 0.1; done
        release 5; touch {s}/go-b; wait $b; grep -h 'suspend_hold' {s}/b5.out | sed "s/^/b5: /"
        # B makes physical memory of its own (cuMemCreate, passed through uncached): it asks
        # the arbiter as a cached allocation does, and A sleeps for it.
        hold 600; as_b {chaos} fill 8388608 0 create 2>&1 | grep -h 'fill n=\|arbiter' | sed "s/^/b6: /"; release 6
        # A keeps its GPU busy above its request: B, within its own, has A put to sleep all
        # the same (busy work is no claim on lent memory).
        A_IDLE= hold 600; fill 7; release 7
        # B allocates from a driver pool of its own: the driver's refusal asks the arbiter too.
        hold 600; as_b {chaos} fill 8388608 0 pool 2>&1 | grep -h 'fill n=\|arbiter\|chaos' | sed "s/^/b8: /"; release 8
        # A runs no cudapool (as a program that clears LD_PRELOAD, or a library that will
        # not sleep) and keeps its GPU busy: asked, it does not sleep, so the driver
        # checkpoints it for B, within its request; once B has ended, A is restored.
        A_ENV=LD_PRELOAD= A_IDLE= hold 600; fill 9
        for i in $(seq 150); do grep -q 'restored by the driver' {s}/arbiter.log && break; sleep 0.1; done
        release 9; sed 's/^/record9: /' $J/{a}.d/arbiter
        # The same, with the arbiter restarted while A is checkpointed and B holds the GPU:
        # the new arbiter finds A in root's list and restores it when B has ended.
        A_ENV=LD_PRELOAD= A_IDLE= hold 600
        as_b {chaos} fill 8388608 4 > {s}/b10.out 2>&1 &
        b=$!; for i in $(seq 300); do grep -q 'fill n=' {s}/b10.out && break; sleep 0.1; done
        grep -h 'fill n=' {s}/b10.out | sed "s/^/b10: /"
        kill $arb; wait $arb 2>/dev/null
        sed 's/^/listed10: /' /run/cudapool/arbiter.checkpointed
        {cli} stat 2>&1 | grep 'checkpointed by the driver' | sed 's/^/stat10: /'
        {cli} slurm --config /run/cudapool/site.conf arbiter 2>> {s}/arbiter.log &
        arb=$!
        wait $b
        for i in $(seq 150); do [ "$(grep -c 'restored by the driver' {s}/arbiter.log)" -ge 2 ] && break; sleep 0.1; done
        release 10
        # The same A in a memory cgroup with 100 MiB to spare: a checkpoint there would have
        # the kernel kill it, so it keeps its memory (said), and B gets what is left.
        if mkdir -p {memcg} 2>/dev/null; then
          export A_MEMCG={memcg}; A_ENV=LD_PRELOAD= A_IDLE= hold 600; unset A_MEMCG
          echo $(( $(cat {memcg}/memory.usage_in_bytes) + 104857600 )) > {memcg}/memory.limit_in_bytes
          fill 11; release 11
        fi
        ask "room face0000000000000000000000000000 8388608"
        ask "sleep everyone"
        python3 -c "import socket; idle=[socket.socket(socket.AF_UNIX) for _ in range(4)]; [c.connect('/run/cudapool/arbiter.sock') for c in idle]; s=socket.socket(socket.AF_UNIX); s.connect('/run/cudapool/arbiter.sock'); print('fifth:', s.recv(200).decode().strip())"
        kill $arb; wait $arb 2>/dev/null
        sed 's/^/arbiter: /' {s}/arbiter.log
        "#,
        share_a = share(&a),
        share_b = share(&b),
        dir = staged.dir.display(),
        board = board.display(),
        lib = staged.dir.join("libcudapool.so").display(),
        client = staged.dir.join("client").display(),
        chaos = staged.dir.join("chaos").display(),
        cga = cg(&a).display(),
        cgb = cg(&b).display(),
        cli = staged.dir.join("cudapool").display(),
        s = scratch.display(),
        memcg = memcg.display(),
    );
    let mut cmd = Command::new("unshare");
    cmd.args(["-m", "bash", "-c", &script]);
    let o = finish(cmd, Duration::from_secs(300), "overcommit");
    let all = format!("{}{}", o.stdout, o.stderr);
    let _ = std::fs::remove_dir_all(&scratch);
    for job in [&a, &b] {
        let _ = std::fs::remove_dir(cg(job));
        let _ = std::fs::remove_dir(cg(job).parent().unwrap());
    }
    let _ = std::fs::remove_dir(&top);
    let _ = std::fs::remove_dir(&memcg);
    if o.status.code() == Some(97) {
        eprintln!("no private mount namespace here: not checked");
        return;
    }
    let blocks = |tag: &str| -> u64 {
        all.lines()
            .find_map(|l| l.strip_prefix(&format!("{tag}: fill n=")))
            .unwrap_or_else(|| panic!("no {tag} fill: {all}"))
            .trim()
            .parse()
            .unwrap()
    };
    for round in [1, 2, 3, 4, 6, 7, 8, 9, 10] {
        assert!(
            all.contains(&format!("a{round}: suspend_hold intact=1")),
            "round {round}: A's bytes: {all}"
        );
    }
    // Without the arbiter: what A left (1 GiB less its 600 MiB).
    assert!(blocks("b1") <= 53, "{all}");
    // With it: A (idle, 600 MiB above its 512 MiB request) slept, and B took its room.
    assert!(blocks("b2") >= 100, "{all}");
    assert!(
        all.contains(&format!("put to sleep for job {b}")),
        "the node's log names both jobs: {all}"
    );
    // A at 200 MiB, under its request: never put to sleep; B gets what is left.
    assert!(blocks("b3") <= 103, "{all}");
    // A's own environment could not make it unsleepable.
    assert!(
        all.contains(&format!(
            "a2: cudapool: CUDAPOOL_MEMORY_REQUEST ignored: job {a}'s request is its gpumem"
        )),
        "{all}"
    );
    // Rounds 2, 4 (A for B's fill, then B for A's wake), 5 (A for B), 6 (A for B's uncached
    // memory), 7 (A busy, for B within its request) and 8 (A for B's driver pool): never in
    // round 3.
    assert_eq!(all.matches("put to sleep for job").count(), 7, "{all}");
    // Round 7: busy above its request is no shield.
    assert!(blocks("b7") >= 100, "{all}");
    assert!(
        all.contains(&format!("put to sleep for job {b} (pid"))
            && all.contains("busy above its request, for a job within its own"),
        "{all}"
    );
    // Round 6: memory passed through uncached asks too; round 8: a driver pool's growth.
    assert!(blocks("b6") >= 100, "{all}");
    assert!(blocks("b8") >= 100, "{all}");
    // Round 4: B, idle above its request, put to sleep for A's wake.
    assert!(blocks("b4") >= 100, "{all}");
    assert!(
        all.contains(&format!("put to sleep for job {a}")),
        "B slept for A's wake: {all}"
    );
    // Round 5: B busy, A's wake found no room within its 2 s: the OOM line names the wake,
    // and B's bytes are intact.
    assert!(
        all.contains("a5: cudapool: out of memory on device 0")
            && all.contains("by waking the process from sleep"),
        "{all}"
    );
    assert!(all.contains("b5: suspend_hold intact=1"), "{all}");
    assert!(
        all.contains("did not sleep for job") && all.contains("busy"),
        "the arbiter says why B stayed: {all}"
    );
    // Rounds 9 and 10: A, above its request, did not sleep (it runs no cudapool): the driver
    // checkpointed it for B, and restored it once B had ended, every byte intact, also
    // across a restart of the arbiter; the job's record counts both.
    assert!(blocks("b9") >= 100, "{all}");
    assert!(blocks("b10") >= 100, "{all}");
    assert_eq!(
        all.matches(&format!("did not put itself to sleep for job {b}"))
            .count(),
        2,
        "{all}"
    );
    assert!(
        all.contains("checkpointed by the driver in")
            && all.matches("restored by the driver after").count() == 2,
        "{all}"
    );
    assert!(
        all.lines()
            .any(|l| l.starts_with("listed10: ") && l.contains(&format!(" {a} "))),
        "root's list names A while it is checkpointed: {all}"
    );
    assert!(
        all.lines().any(|l| l.starts_with("stat10: pid ")
            && l.contains(&format!("checkpointed by the driver for another job (root's arbiter; it did not sleep when asked): job {a}, 600.00 MiB"))),
        "cudapool stat as root says who is checkpointed and why: {all}"
    );
    assert!(
        all.contains(&format!("job {a} (pid"))
            && all.contains("is still checkpointed: restored when its GPU has room"),
        "the restarted arbiter took A up again: {all}"
    );
    assert!(
        all.lines()
            .any(|l| l.starts_with("record9: checkpoints=1 bytes=") && l.contains(" seconds=")),
        "{all}"
    );
    // Round 11 (where a cgroup v1 memory hierarchy exists): A's host memory has no room for
    // what it holds, so the driver does not checkpoint it; it keeps it, said, and is intact.
    if all.contains("a11: ") {
        assert!(all.contains("a11: suspend_hold intact=1"), "{all}");
        assert!(blocks("b11") <= 53, "{all}");
        assert!(
            all.contains("keeps 629145600 bytes above its request: its host memory has room for")
                && all.contains("a checkpoint there would have the kernel kill it"),
            "{all}"
        );
    } else {
        eprintln!("no cgroup v1 memory hierarchy: round 11 not checked");
    }
    // Who asks is the kernel's to say, and a request is one strict line.
    assert!(
        all.contains("asked: refused the asking process runs in no job"),
        "{all}"
    );
    assert!(all.contains("asked: refused not a request"), "{all}");
    // A user holding requests open holds back only their own.
    assert!(
        all.contains("fifth: refused 4 requests of this user already"),
        "{all}"
    );
}

/// The root Prolog on an overcommitted node (`overcommit=2`): the job's share file names its
/// request (its gpumem, 64 MiB) and lets it hold twice that; without the setting, the request
/// is the limit, as before. A bad factor is refused with the accepted range.
#[test]
fn the_prolog_writes_the_request_and_the_overcommitted_limit() {
    if uid() != 0 {
        eprintln!("not root: the Prolog runs as root; not checked");
        return;
    }
    let dir = open_temp_dir("/tmp/cudapool-overcommit-prolog-");
    std::fs::create_dir_all(dir.join("bin")).unwrap();
    std::fs::write(
        dir.join("bin/squeue"),
        "#!/bin/sh\necho 7 gres:gpumem:64M\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(
        dir.join("bin/squeue"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    let script = format!(
        r#"set -u
        mount -t tmpfs -o size=4M tmpfs /run || exit 97
        cd /
        for f in 2 1 0.5; do
          printf 'slurm_bin={bin}\novercommit=%s\n' $f > {dir}/site.conf && chmod 644 {dir}/site.conf
          env -i SLURM_JOB_ID=7 SLURM_JOB_UID=1001 {cli} slurm --config {dir}/site.conf prolog 2>&1 | sed "s/^/said$f: /"
          echo "share$f: $(tr '\n' ' ' < /run/cudapool/jobs/7 2>/dev/null)"
          rm -rf /run/cudapool/jobs/7 /run/cudapool/jobs/7.d
        done
        "#,
        bin = dir.join("bin").display(),
        dir = dir.display(),
        cli = env!("CARGO_BIN_EXE_cudapool"),
    );
    let mut cmd = Command::new("unshare");
    cmd.args(["-m", "sh", "-c", &script]);
    let o = finish(cmd, Duration::from_secs(60), "prolog with overcommit");
    let _ = std::fs::remove_dir_all(&dir);
    if o.status.code() == Some(97) {
        eprintln!("no private mount namespace here: not checked");
        return;
    }
    let all = format!("{}{}", o.stdout, o.stderr);
    let mib = 1u64 << 20;
    assert!(
        all.contains(&format!(
            "share2: group=slurm-7 limit={} request={} ",
            128 * mib,
            64 * mib
        )),
        "{all}"
    );
    assert!(
        all.contains(&format!("share1: group=slurm-7 limit={} \n", 64 * mib)),
        "{all}"
    );
    assert!(all.contains("overcommit: 0.5 is not from 1 to 16"), "{all}");
}
