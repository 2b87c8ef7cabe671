//! Slurm stops a job (issue 78): `scontrol suspend` and preemption by suspend, with the cluster
//! of `tests/slurm.rs` (this file is its module).

use super::*;

/// Issue 78, item 1: `scontrol suspend` of a batch job whose script started its program in the
/// background (Slurm signals the script's shell alone, then freezes the job two seconds later).
/// The program's 400 MiB go to the host within Slurm's 2 s (400, not more: a busy machine's
/// debug build copies a few hundred MB/s); a neighbour on the same (fake, shared) GPU then takes
/// 800 MiB or more; `scontrol resume` brings every byte back at the same addresses and the job
/// ends well. [The suspended job kept its 400 MiB: the neighbour got 78 blocks of 8 MiB.]
pub fn suspend(c: &Cluster) {
    let script = held_job(
        c,
        "suspend",
        "--gres=gpumem:512M",
        400,
        &format!(
            r#"scontrol suspend $j
        for i in $(seq 100); do [ "$(held $p)" -lt $((16 * MIB)) ] && break; sleep 0.05; done
        sleep 2.5
        echo state=$(scontrol show job $j | sed -n 's/.*JobState=\([A-Z]*\).*/\1/p') asleep=$(( $(held $p) / MIB ))
        env -u LD_PRELOAD {chaos} fill 8388608 0 | sed 's/^/neighbour: /'
        scontrol resume $j"#,
            chaos = c.stage.join("fake/chaos").display(),
        ),
    );
    let o = sh(c, &script);
    let all = format!("{}{}", o.stdout, o.stderr);
    let figure = |key: &str| figure(&all, key);
    assert!(figure("before") >= 400, "{all}");
    assert!(all.contains("state=SUSPENDED"), "{all}");
    assert!(figure("asleep") < 16, "asleep while suspended: {all}");
    assert!(
        figure("n") >= 100,
        "the neighbour got the job's memory: {all}"
    );
    assert!(figure("resumed") >= 400, "{all}");
    assert!(all.contains("suspend_hold intact=1"), "{all}");
    assert!(all.contains("end=COMPLETED"), "{all}");
}

/// Issue 78, item 1: preemption by suspend (`PreemptMode=SUSPEND,GANG`, a job of `urgent` over
/// jobs of `low`), on the cluster started again for it. Slurm preempts for CPUs, never for a
/// GRES: it keeps a suspended job's gpumem counted, so the node's gpumem is declared twice the
/// GPU's (2048M on the fake driver's one GiB, which every process shares), as on an
/// overcommitted node. The low job takes every CPU and holds 600 MiB; the urgent one (one CPU,
/// gpumem 768M) makes Slurm suspend it. Its processes give their GPU memory back before they
/// stop, so the urgent job gets its whole share on the GPU, 96 blocks of 8 MiB (without the
/// sleep at SIGTSTP: what the stopped job left, 424 MiB, 53 blocks); when it ends the low job
/// resumes with every byte.
pub fn preemption(c: &Cluster) {
    let restart = |what: &str, env: &[(&str, &std::ffi::OsStr)]| {
        let mut cmd = Command::new("bash");
        cmd.arg(root().join("tests/slurm/cluster.sh"))
            .arg(what)
            .arg(&c.dir);
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.output().unwrap()
    };
    let _ = restart("stop", &[]);
    let up = restart(
        "start",
        &[
            ("PROCTRACK", "cgroup".as_ref()),
            ("PREEMPT", "1".as_ref()),
            ("GPUMEM", "2048M".as_ref()),
            (
                "SLURM_PROLOG",
                c.stage.join("deploy/slurm/prolog.sh").as_os_str(),
            ),
            (
                "SLURM_EPILOG",
                c.stage.join("deploy/slurm/epilog.sh").as_os_str(),
            ),
            ("DEPLOY_DIR", c.stage.join("deploy/slurm").as_os_str()),
            ("CUDAPOOL_BIN_DIR", c.stage.join("bin").as_os_str()),
        ],
    );
    let said = String::from_utf8_lossy(&up.stdout);
    assert!(
        up.status.success() && said.contains("slurm ready"),
        "{said}{}",
        String::from_utf8_lossy(&up.stderr)
    );
    let script = held_job(
        c,
        "preempt",
        "-p low -c $(nproc) --gres=gpumem:768M",
        600,
        r#"timeout 60 srun -p urgent -c 1 --gres=gpumem:768M bash -c 'echo low_$(scontrol show job '$j' | grep -o "JobState=[A-Z]*"); exec $CHAOS fill 8388608 0' 2>&1 | sed 's/^/urgent: /'
        echo "urgent_rc=${PIPESTATUS[0]}"
        squeue -h -o "%i %P %T %r" | sed 's/^/squeue: /'"#,
    );
    let o = sh(c, &script);
    let all = format!("{}{}", o.stdout, o.stderr);
    assert!(figure(&all, "before") >= 600, "{all}");
    assert!(
        all.contains("urgent: low_JobState=SUSPENDED"),
        "Slurm suspended the low job for the urgent one: {all}"
    );
    assert!(
        all.contains("urgent: fill n=96"),
        "the preemptor got its whole 768 MiB share on the GPU: {all}"
    );
    assert!(figure(&all, "resumed") >= 600, "{all}");
    assert!(all.contains("suspend_hold intact=1"), "{all}");
    assert!(all.contains("end=COMPLETED"), "{all}");
}

/// The script of a case: a batch job (`sbatch` with `args`) whose script runs the test client in
/// the background holding `mib` MiB on the fake driver's shared GPU (its board in the stage,
/// folder `name`); "before=" what it holds when ready; then `middle` (with `$j` the job, `$p`
/// the client, `held PID` and `MIB`); then "resumed=" once it holds `mib` again, the client's
/// end and the job's ("end="), and the job's output.
fn held_job(c: &Cluster, name: &str, args: &str, mib: u64, middle: &str) -> String {
    let board = c.stage.join(format!("board-{name}"));
    std::fs::create_dir_all(&board).unwrap();
    format!(
        r#"export FAKECU_BOARD={board} FAKECU_SHARED=1 CUDAPOOL_CACHE_IDLE=never
        held() {{ od -An -t u8 -N8 {board}/$1 2>/dev/null | tr -d ' ' || echo 0; }}
        MIB=1048576
        j=$(sbatch --parsable {args} --output={out} --wrap "{client} gpa suspend_hold {mib} {go} & echo \$! > {pid}; wait")
        for i in $(seq 300); do grep -q ready {out} 2>/dev/null && break; sleep 0.1; done
        p=$(cat {pid})
        echo before=$(( $(held $p) / MIB ))
        {middle}
        for i in $(seq 300); do [ "$(held $p)" -ge $(({mib} * MIB)) ] && break; sleep 0.05; done
        echo resumed=$(( $(held $p) / MIB ))
        touch {go}
        for i in $(seq 200); do squeue -h -j $j 2>/dev/null | grep -q . || break; sleep 0.1; done
        echo end=$(scontrol show job $j | sed -n 's/.*JobState=\([A-Z]*\).*/\1/p')
        cat {out}"#,
        board = board.display(),
        out = c.stage.join(format!("{name}.out")).display(),
        client = c.stage.join("fake/client").display(),
        go = c.stage.join(format!("{name}.go")).display(),
        pid = c.stage.join(format!("{name}.pid")).display(),
    )
}

/// Issue 78, item 1: gang scheduling (`slices`, two jobs on every CPU, 5 s time slices), on the
/// cluster started again for the preemption case. Each job's client holds 600 MiB and works
/// (a copy every 20 ms) on the fake driver's one GiB, which cannot hold both: at each slice the
/// job Slurm suspends sleeps, the one it resumes wakes (waiting for room while the other is
/// still inside its 2 s), for about four slices; then both end with every byte. Each job's
/// program starts a second after its script, as a real one's start takes: Slurm suspends the
/// second job a moment after it starts it, and a program that allocated within that moment
/// would meet the first job still filling the GPU.
pub fn gang(c: &Cluster) {
    let board = c.stage.join("board-gang");
    std::fs::create_dir_all(&board).unwrap();
    let job = |x: &str| {
        format!(
            r#"{x}=$(sbatch --parsable -p slices -c $(nproc) --gres=gpumem:768M --output={out} --wrap "sleep 1; {client} gpa suspend_hold 600 {go}")"#,
            out = c.stage.join(format!("gang-{x}.out")).display(),
            client = c.stage.join("fake/client").display(),
            go = c.stage.join("gang.go").display(),
        )
    };
    let outs = format!(
        "{} {}",
        c.stage.join("gang-a.out").display(),
        c.stage.join("gang-b.out").display()
    );
    let script = format!(
        r#"export FAKECU_BOARD={board} FAKECU_SHARED=1 CUDAPOOL_CACHE_IDLE=never
        {a}
        {b}
        state() {{ scontrol show job $1 | sed -n 's/.*JobState=\([A-Z]*\).*/\1/p'; }}
        used() {{ s=0; for f in {board}/[0-9]*; do case $f in *.ckpt) ;; *) kill -0 ${{f##*/}} 2>/dev/null && s=$((s + $(od -An -t u8 -N8 $f 2>/dev/null | tr -d ' ' || echo 0))) ;; esac; done; echo $((s / 1048576)); }}
        for i in $(seq 44); do echo "slice a=$(state $a) b=$(state $b) used=$(used)"; sleep 0.5; done
        touch {go}
        for i in $(seq 300); do squeue -h -j $a,$b 2>/dev/null | grep -q . || break; sleep 0.1; done
        echo end a=$(state $a) b=$(state $b)
        cat {outs}"#,
        board = board.display(),
        a = job("a"),
        b = job("b"),
        go = c.stage.join("gang.go").display(),
    );
    let o = sh(c, &script);
    let all = format!("{}{}", o.stdout, o.stderr);
    let slices: Vec<&str> = all.lines().filter(|l| l.starts_with("slice ")).collect();
    // Each job ran while the other was suspended, and the other way round.
    assert!(
        slices.iter().any(|l| l.contains("a=RUNNING b=SUSPENDED"))
            && slices.iter().any(|l| l.contains("a=SUSPENDED b=RUNNING")),
        "time-sliced: {all}"
    );
    // Never both jobs' 600 MiB on the one GiB at once (the fake device would have refused).
    let most = slices
        .iter()
        .filter_map(|l| l.rsplit("used=").next()?.trim().parse::<u64>().ok())
        .max()
        .unwrap_or(0);
    assert!(most <= 1024, "{all}");
    assert_eq!(
        all.matches("suspend_hold intact=1").count(),
        2,
        "both jobs found every byte: {all}"
    );
    assert!(all.contains("end a=COMPLETED b=COMPLETED"), "{all}");
}
