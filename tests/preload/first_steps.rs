//! What a newcomer met in round three (issue 62), each now said the way a user expects: before,
//! in brackets.

use super::common::*;
use std::path::PathBuf;

fn cli() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_cudapool"))
}

/// `cudapool run ARGS` with the fixture's library, the fake driver and `env`.
fn cudapool(args: &[&str], env: &[(&str, &str)]) -> Run {
    let f = fixture();
    let lib = f.lib.to_str().unwrap();
    let mut all = vec![("CUDAPOOL_LIB", lib)];
    all.extend_from_slice(env);
    run_program(&cli(), args, false, &all)
}

/// A new, empty folder of the fixture's, named `name`.
fn fresh(name: &str) -> std::path::PathBuf {
    let dir = fixture().dir.join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The demo's sample: 64 MiB buffers until refused, on the 1 GiB fake device, with `env`.
fn sample(args: &[&str], env: &[(&str, &str)]) -> Run {
    let f = fixture();
    let client = f.dir.join("client");
    let mut all: Vec<&str> = vec!["run"];
    all.extend_from_slice(args);
    all.extend(["--", client.to_str().unwrap(), "dlsym", "sample"]);
    cudapool(&all, env)
}

/// Items 2, 16 and 17: the device itself full [a refused 64 MiB in the peak: "reserved 1.00
/// GiB (peak 1.06 GiB)"], the report in words a user knows ["1 segments", "1 reclaim
/// retries", "134 allocations taken ... (a segment, a handle of an expandable segment or a
/// pass-through allocation each)"], and the GPU's own free memory named as the GPU's ["limit
/// 512 MiB, allocated 512 MiB ... device free 512 MiB"].
#[test]
fn the_exit_report_and_the_oom_line_say_what_happened() {
    for pool in ["split", "binned", "simple"] {
        let r = sample(
            &["--pool", pool, "--report"],
            &[("CUDAPOOL_CACHE_IDLE", "")],
        );
        assert_eq!(r.code, 0, "{pool}: {}", r.stderr);
        // Never above the 1 GiB device: what it refused never held memory.
        let peak = r
            .stderr
            .lines()
            .find_map(|l| {
                l.split_once("cudapool:   reserved  ")?
                    .1
                    .split_once("(peak ")?
                    .1
                    .split_once(')')
            })
            .map(|(p, _)| p.to_string())
            .unwrap_or_else(|| panic!("{pool}: no reserved line: {}", r.stderr));
        let mib = match peak.split_once(' ') {
            Some((n, "GiB")) => n.parse::<f64>().unwrap() * 1024.0,
            Some((n, "MiB")) => n.parse::<f64>().unwrap(),
            _ => panic!("{peak}"),
        };
        assert!(
            mib <= 1024.0,
            "{pool}: a refused request is no peak: {}",
            r.stderr
        );
    }
    // The README's run: cudapool's default segments (the suite's second run would make them
    // classic).
    let r = sample(
        &["--limit", "512MiB", "--report"],
        &[
            ("CUDAPOOL_SEGMENTS", "expandable"),
            ("CUDAPOOL_CACHE_IDLE", ""),
        ],
    );
    let e = &r.stderr;
    assert!(
        e.contains("cached after reclaim 0 B; the GPU itself has 512.00 MiB free"),
        "{e}"
    );
    for plural in [
        "1 segments",
        "1 reclaim retries",
        "1 OOMs",
        "allocations taken",
    ] {
        assert!(!e.contains(plural), "{plural:?} in {e}");
    }
    assert!(
        e.contains("0 retries after giving cache back, 1 out-of-memory answer\n"),
        "{e}"
    );
    assert!(e.contains("from the driver: memory taken "), "{e}");
}

/// Item 18: `--report` on a program that never asks CUDA for memory [printed nothing] says so,
/// once, from the started process only (not from a script's children).
#[test]
fn a_report_of_a_program_without_cuda_says_so() {
    let r = cudapool(&["run", "--report", "--", "sh", "-c", "exec true"], &[]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stderr
            .contains("(true), which asked CUDA for no memory: nothing to report"),
        "{}",
        r.stderr
    );
    let r = cudapool(
        &[
            "run",
            "--report",
            "--",
            "bash",
            "-c",
            "(true); x=$(echo a); echo $x",
        ],
        &[],
    );
    assert_eq!(
        r.stderr.matches("nothing to report").count(),
        1,
        "the forked children are silent: {}",
        r.stderr
    );
    let r = cudapool(&["run", "--", "/bin/true"], &[]);
    assert_eq!(r.stderr, "", "no --report, no line");
}

/// Item 7: a file that is no program [“No such file or directory” for a file that exists].
#[test]
fn a_file_that_is_no_program_is_said_so() {
    let f = fixture();
    let notes = f.dir.join("notes.md");
    std::fs::write(&notes, "# notes\n").unwrap();
    let r = cudapool(&["run", "--", "notes.md"], &[]);
    assert_eq!(r.code, 127, "{}", r.stderr);
    assert!(
        r.stderr.contains("no program notes.md on PATH")
            && r.stderr.contains("name it by its path: ./notes.md"),
        "{}",
        r.stderr
    );
    let r = cudapool(&["run", "--", "./notes.md"], &[]);
    assert_eq!(r.code, 126, "{}", r.stderr);
    assert!(r.stderr.contains("it is not executable"), "{}", r.stderr);
}

/// Items 19, 20 and 21: a misspelt variable [said, then exit 2 without a word that nothing
/// ran]; bare `cudapool` [“cudapool: Routes every…”]; a negative value [clap's tip “use '--
/// -1'”]; `--listen 9489` [no hint of `:9489`]; `--limit abc` [“unknown unit”]; `--limit` over
/// `CUDAPOOL_MEMORY_LIMIT` [silently]; a limit above the device's memory [accepted without a
/// word]; and item 10: the limit echoed in bytes and binary units under `--report`.
#[test]
fn the_cli_says_what_it_did_and_did_not_do() {
    let r = cudapool(&["run", "--", "/bin/true"], &[("CUDAPOOL_POLL", "split")]);
    assert_eq!(r.code, 2);
    assert!(
        r.stderr.contains("the program was not started"),
        "{}",
        r.stderr
    );
    let r = cudapool(&[], &[]);
    assert_eq!(r.code, 2);
    assert!(r.stderr.starts_with("Routes every"), "{}", r.stderr);
    for args in [
        &["replay", "--limit", "-1", "x"][..],
        &["run", "--pool", "-1", "--", "/bin/true"],
        &["top", "-n", "-1"],
    ] {
        let r = cudapool(args, &[]);
        assert_eq!(r.code, 2, "{args:?}");
        assert!(!r.stderr.contains("tip:"), "{args:?}: {}", r.stderr);
    }
    let r = cudapool(&["exporter", "--listen", "9489"], &[]);
    assert!(r.stderr.contains("did you mean :9489?"), "{}", r.stderr);
    let r = cudapool(&["run", "--limit", "abc", "--", "/bin/true"], &[]);
    assert!(r.stderr.contains("\"abc\" is not a size"), "{}", r.stderr);
    let r = cudapool(
        &["run", "--limit", "256M", "--report", "--", "/bin/true"],
        &[("CUDAPOOL_MEMORY_LIMIT", "1GiB")],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    for want in [
        "--limit 256M replaces CUDAPOOL_MEMORY_LIMIT=1GiB of the environment",
        "memory limit 256000000 bytes (244.14 MiB, 0.24 GiB) on each device",
    ] {
        assert!(r.stderr.contains(want), "{want:?} in {}", r.stderr);
    }
    let f = fixture();
    let client = f.dir.join("client");
    let r = cudapool(
        &[
            "run",
            "--limit",
            "2GiB",
            "--",
            client.to_str().unwrap(),
            "dlsym",
            "basic",
        ],
        &[],
    );
    assert!(
        r.stderr
            .contains("the memory limit 2.00 GiB is above the device's 1.00 GiB: it never applies"),
        "{}",
        r.stderr
    );
}

/// Items 12, 14 and 15: files asked for by name follow the umask [always 0600]; `plot -o
/// DIR` and `-o -` [both “draws SVG only”]; the plot names the program and the GPU [“device
/// 0”].
#[test]
fn named_files_and_the_plot() {
    let f = fixture();
    let dir = f.dir.join("named-files");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("t.json");
    let client = f.dir.join("client");
    let cmd = format!(
        "umask 022; exec {} run --limit 256MiB -- {} dlsym sample",
        cli().display(),
        client.display()
    );
    let lib = f.lib.to_str().unwrap();
    let r = run_program(
        std::path::Path::new("sh"),
        &["-c", &cmd],
        false,
        &[
            ("CUDAPOOL_TRACE", trace.to_str().unwrap()),
            ("CUDAPOOL_LIB", lib),
        ],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    use std::os::unix::fs::PermissionsExt as _;
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&trace), 0o644, "the umask's mode");
    let t = trace.to_str().unwrap();
    let r = cudapool(&["plot", t, "-o", dir.to_str().unwrap()], &[]);
    assert!(
        r.stderr.contains("is a folder: name the picture's file"),
        "{}",
        r.stderr
    );
    let r = cudapool(&["plot", t, "-o", "-"], &[]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.starts_with("<svg"), "{}", r.stdout);
    assert!(
        r.stdout.contains("client (pid ") && r.stdout.contains("device 0 (GPU-"),
        "the title names the program and the GPU"
    );
}

/// Items 8, 9 and 11: `stat` lines fit 80 columns (issue 75, item 18; 100 in round three), the whole UUID under `--wide` [about 170
/// columns, 45 of them the UUID]; `stat PID` of a process under another runtime directory hints
/// at the variable [only “no cudapool process”]; `top PID` ends with status 0 when the process
/// does [exit 2, as if the pid were wrong].
#[test]
fn stat_fits_and_top_sees_a_process_end() {
    let f = fixture();
    let dir = f.dir.join("stat-fits");
    let _ = std::fs::remove_dir_all(&dir);
    let d = dir.to_str().unwrap();
    let mut child = start_holder(&[("CUDAPOOL_RUNTIME_DIR", d)]);
    let pid = child.id().to_string();
    let here = [("CUDAPOOL_RUNTIME_DIR", d)];
    let r = cudapool(&["stat", &pid], &here);
    assert_eq!(r.code, 0, "{}", r.stderr);
    for l in r.stdout.lines() {
        assert!(l.chars().count() <= 80, "{} columns: {l}", l.len());
    }
    assert!(
        r.stdout.contains("device 0 (GPU-face0000): limit"),
        "{}",
        r.stdout
    );
    let r = cudapool(&["stat", "--wide", &pid], &here);
    assert!(
        r.stdout
            .contains("(GPU-face0000-1122-3344-5566-778899aabbcc)"),
        "{}",
        r.stdout
    );
    let elsewhere = f.dir.join("stat-fits-elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let r = cudapool(
        &["stat", &pid],
        &[("CUDAPOOL_RUNTIME_DIR", elsewhere.to_str().unwrap())],
    );
    assert_eq!(r.code, 2);
    // Its runtime folder named, read from the process's environment (issue 75, item 6).
    assert!(
        r.stderr.contains(&format!(
            "pid {pid} publishes in {d} (its CUDAPOOL_RUNTIME_DIR): set CUDAPOOL_RUNTIME_DIR={d} here too"
        )),
        "{}",
        r.stderr
    );
    let r = cudapool(&["snapshot", "4194304"], &here);
    assert!(
        r.stderr
            .contains("no cudapool process with pid 4194304 of this user: no process has pid"),
        "{}",
        r.stderr
    );
    // top, watching: the holder ends after a screen or two.
    let mut top = std::process::Command::new(cli());
    top.args(["top", "-d", "0.2", &pid])
        .env("CUDAPOOL_RUNTIME_DIR", d)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let top = top.spawn().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(700));
    drop(child.stdin.take());
    let _ = child.wait();
    let out = top.wait_with_output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stdout.contains(&format!("pid {pid}")), "{stdout}");
    assert!(
        stderr.contains(&format!("pid {pid} ended; the figures above are its last")),
        "{stderr}"
    );
}

/// Items 1 and 3: `replay benches/traces/*` takes the folder's README [exit 2, nothing
/// replayed]: it costs its own line, the traces replay; a PyTorch snapshot without history
/// [replayed its live blocks alone: 1.000] is refused with the remedy, as a CUDAPOOL_TRACE
/// without history is.
#[test]
fn replay_takes_what_it_can_and_refuses_a_snapshot_without_history() {
    let dir = fresh("replay-glob");
    std::fs::write(dir.join("README.md"), "# traces\nOne request a line\n").unwrap();
    std::fs::write(dir.join("a.ops"), "a 1 4096\nf 1\n").unwrap();
    let files = [dir.join("README.md"), dir.join("a.ops")];
    let args: Vec<&str> = ["replay", "--pool", "simple"]
        .into_iter()
        .chain(files.iter().map(|f| f.to_str().unwrap()))
        .collect();
    let r = cudapool(&args, &[]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stdout.contains("a.ops"),
        "the trace replays: {}",
        r.stdout
    );
    assert!(
        r.stderr.contains("README.md: line 2")
            && r.stderr.contains("1 of the 2 files not replayed"),
        "{}",
        r.stderr
    );
    let snap = dir.join("live.pickle");
    let make = "import pickle, sys\n\
        seg = {'device': 0, 'address': 4096, 'total_size': 2 << 20, 'blocks': [\n\
        {'address': 4096, 'size': 2 << 20, 'requested_size': 2 << 20, 'state': 'active_allocated'}]}\n\
        pickle.dump({'segments': [seg], 'device_traces': [[]]}, open(sys.argv[1], 'wb'))\n";
    let r = run_program(
        &super::python3(),
        &["-c", make, snap.to_str().unwrap()],
        false,
        &[],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let r = cudapool(&["replay", snap.to_str().unwrap()], &[]);
    assert_eq!(r.code, 2, "{}", r.stdout);
    assert!(
        r.stderr
            .contains("a snapshot without history (only the blocks alive at the end): record it with torch.cuda.memory._record_memory_history() first"),
        "{}",
        r.stderr
    );
}

/// Item 13: the man pages and completions in `share/` are what `cudapool manual` generates
/// from the command's own definition now [there were none]: a change to an option that is
/// not generated again fails here.
#[test]
fn the_man_pages_and_completions_are_generated_and_current() {
    let dir = fixture().dir.join("manual");
    let _ = std::fs::remove_dir_all(&dir);
    let r = cudapool(&["manual", dir.to_str().unwrap()], &[]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = 0;
    let mut stack = vec![dir.join("share")];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            let rel = p.strip_prefix(&dir).unwrap();
            let kept = std::fs::read(repo.join(rel)).unwrap_or_default();
            assert!(
                kept == std::fs::read(&p).unwrap(),
                "{} is stale: run `cargo build && target/debug/cudapool manual .`",
                rel.display()
            );
            files += 1;
        }
    }
    assert!(files >= 14, "{files} files");
    let main = std::fs::read_to_string(dir.join("share/man/man1/cudapool.1")).unwrap();
    for var in [
        "CUDAPOOL_LIB",
        "CUDAPOOL_SLURM_CONFIG",
        "CUDAPOOL_MEMORY_LIMIT",
    ] {
        assert!(main.contains(var), "{var} in the man page");
    }
    let help = cudapool(&["--help"], &[]).stdout;
    assert!(
        help.contains("CUDAPOOL_SLURM_CONFIG=FILE") && !help.contains("README"),
        "{help}"
    );
    // The packagers' `manual` is offered nowhere, and a pool is completed from its kinds
    // (issue 75, item 10: the completions offered `manual`, and file names for --pool).
    let bash =
        std::fs::read_to_string(dir.join("share/bash-completion/completions/cudapool")).unwrap();
    for shell in [
        "bash-completion/completions/cudapool",
        "zsh/site-functions/_cudapool",
    ] {
        let text = std::fs::read_to_string(dir.join("share").join(shell)).unwrap();
        assert!(!text.contains("manual"), "{shell} offers manual");
    }
    assert!(!help.contains("manual"), "{help}");
    assert!(
        bash.contains(
            "--pool)\n                    COMPREPLY=($(compgen -W \"split binned simple none\""
        ),
        "{bash}"
    );
}

/// Item 24: every key a snapshot holds is in the documented schema [`expandable` was not].
#[test]
fn every_key_of_a_snapshot_is_documented() {
    let dir = fresh("schema");
    let snap = dir.join("s.json");
    ok(client(
        "dlsym",
        &["leak", snap.to_str().unwrap()],
        &[("CUDAPOOL_TRACK", "2")],
    ));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&snap).unwrap()).unwrap();
    let mut keys = std::collections::BTreeSet::new();
    fn walk(v: &serde_json::Value, keys: &mut std::collections::BTreeSet<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, x) in m {
                    keys.insert(k.clone());
                    walk(x, keys);
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|x| walk(x, keys)),
            _ => {}
        }
    }
    walk(&v, &mut keys);
    assert!(keys.contains("expandable"), "{keys:?}");
    let doc = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/observability.md"),
    )
    .unwrap();
    for k in &keys {
        assert!(
            doc.contains(&format!("\"{k}\"")),
            "the snapshot's key {k:?} is not in docs/observability.md's schema"
        );
    }
}

/// Item 22: the README's own program on the fake driver builds, runs and prints what the
/// README shows [there was no such example].
#[test]
fn the_readmes_own_program_runs_as_shown() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let at = readme
        .find("## Your own program, without a GPU")
        .expect("the section");
    let section = &readme[at..][..readme[at..].find("\n## ").unwrap()];
    // A block opens after a blank line with its fence, and ends at the next fence.
    let block = |fence: &str| -> String {
        let open = format!("\n\n{fence}");
        let start = section.find(&open).unwrap() + open.len();
        section[start..][..section[start..].find("```").unwrap()].to_string()
    };
    let code = block("```c\n");
    let commands = block("```sh\n");
    let shown = block("```\n");
    let build = "cc prog.c -I target/demo/include -L target/demo -lcuda -o prog";
    let run = "LD_LIBRARY_PATH=$PWD/target/demo cudapool run --limit 300MiB -- ./prog 2>&1";
    assert!(
        commands.contains(build) && commands.contains(run),
        "{commands}"
    );
    let dir = fixture().dir.join("own-program");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("target")).unwrap();
    let demo = dir.join("target/demo");
    let st = std::process::Command::new("bash")
        .arg(root.join("scripts/fake-driver.sh"))
        .arg(&demo)
        .status()
        .unwrap();
    assert!(st.success());
    std::fs::write(dir.join("prog.c"), code).unwrap();
    let script = format!(
        "cd {} && {build} && PATH={}:$PATH {run}",
        dir.display(),
        cli().parent().unwrap().display()
    );
    let r = run_program(
        std::path::Path::new("sh"),
        &["-c", &script],
        false,
        &[("CUDAPOOL_LIB", fixture().lib.to_str().unwrap())],
    );
    assert_eq!(
        r.stdout, shown,
        "the README's own program is stale: {}",
        r.stderr
    );
}
