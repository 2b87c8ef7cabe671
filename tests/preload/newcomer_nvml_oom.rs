//! Preload tests: the CLI's help, linking, the Python package, the README, NVML, the moment of OOM.

use super::*;

/// The CLI a newcomer meets (issue 38): `--help` for every subcommand and `help SUB`, errors
/// that name the subcommand and the option with exit 2, every `CUDAPOOL_*` variable `run`
/// passes on checked before anything runs, and output into a closed pipe ending quietly with
/// status 0.
#[test]
fn the_cli_helps_and_names_what_is_wrong() {
    let cli = PathBuf::from(env!("CARGO_BIN_EXE_cudapool"));
    let r = run_program(&cli, &["--help"], false, &[]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    for sub in [
        "run", "stat", "top", "plot", "snapshot", "exporter", "config", "slurm",
    ] {
        assert!(r.stdout.contains(sub), "the help lists {sub}: {}", r.stdout);
        for args in [vec![sub, "--help"], vec!["help", sub]] {
            let r = run_program(&cli, &args, false, &[]);
            assert_eq!(r.code, 0, "{args:?}: {}", r.stderr);
            assert!(
                r.stdout.contains(&format!("Usage: cudapool {sub}")),
                "{args:?}: {}",
                r.stdout
            );
        }
    }
    let bad = |args: &[&str], env: &[(&str, &str)], want: &str| {
        let r = run_program(&cli, args, false, env);
        assert_eq!(r.code, 2, "{args:?}: {}", r.stderr);
        assert!(
            r.stderr.contains(want),
            "{args:?}: want {want:?} in {}",
            r.stderr
        );
    };
    bad(
        &["run", "--limit", "-1", "--", "/bin/true"],
        &[],
        "-1 is negative",
    );
    bad(
        &["run", "--frob", "--", "/bin/true"],
        &[],
        "cudapool run: unexpected argument '--frob'",
    );
    bad(
        &["stat", "--frob"],
        &[],
        "cudapool stat: unexpected argument '--frob'",
    );
    bad(&["top", "-d", "0"], &[], "cudapool top: invalid value '0'");
    bad(
        &["snapshot"],
        &[],
        "cudapool snapshot: the following required arguments",
    );
    bad(
        &["config"],
        &[],
        "cudapool config: the following required arguments",
    );
    bad(&["frob"], &[], "cudapool: unrecognized subcommand 'frob'");
    bad(
        &["run", "--", "/bin/true"],
        &[("CUDAPOOL_MEMORY_LIMIT", "abc")],
        "cudapool run: invalid CUDAPOOL_MEMORY_LIMIT=\"abc\"",
    );
    bad(
        &["run", "--", "/bin/true"],
        &[("CUDAPOOL_GROUP", "a/b")],
        "invalid CUDAPOOL_GROUP=\"a/b\"",
    );
    // Into a pipe whose reader is gone: no panic, status 0.
    for args in [vec!["--help"], vec!["stat"], vec!["run", "--help"]] {
        let mut fds = [0; 2];
        // SAFETY: pipe(2) fills two descriptors; the read end is closed at once.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: our own descriptor, closed once.
        unsafe { libc::close(fds[0]) };
        // SAFETY: the write end is ours; the Stdio takes it over.
        let write =
            unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fds[1]) };
        let out = Command::new(&cli)
            .args(&args)
            .stdout(std::process::Stdio::from(write))
            .stderr(std::process::Stdio::piped())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

/// C and C++ users link cudapool the usual ways (issue 38): `cudapool config --cflags --libs`,
/// pkg-config with `cudapool config --pkgconfigdir`, and CMake's `find_package(cudapool)` with
/// `cudapool config --cmakedir`. The worked example builds all three ways, linked against the
/// library (no preload), and runs on the fake driver.
#[test]
fn c_programs_link_cudapool_three_ways() {
    let f = fixture();
    let cli = PathBuf::from(env!("CARGO_BIN_EXE_cudapool"));
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let example = root.join("cbindings/c/print_status.c");
    let config = |what: &str| {
        let r = run_program(&cli, &["config", what], false, &[]);
        assert_eq!(r.code, 0, "config {what}: {}", r.stderr);
        r.stdout.trim().to_string()
    };
    let flags = {
        let r = run_program(&cli, &["config", "--cflags", "--libs"], false, &[]);
        assert_eq!(r.code, 0, "{}", r.stderr);
        r.stdout
    };
    assert!(Path::new(&config("--includedir"))
        .join("cudapool.h")
        .is_file());
    assert!(Path::new(&config("--libdir"))
        .join("libcudapool.so")
        .is_file());
    let dir = f.dir.join("linking");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let build = |out: &str, flags: &str| {
        let mut args = vec![
            "-o".to_string(),
            out.to_string(),
            example.to_str().unwrap().to_string(),
        ];
        args.extend(flags.split_whitespace().map(String::from));
        args.push("-ldl".into());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        cc(&args, &dir);
        dir.join(out)
    };
    let mut built = vec![("cudapool config", build("by_config", &flags))];
    // pkg-config, where the machine has it.
    let pc = config("--pkgconfigdir");
    match Command::new("pkg-config")
        .args(["--cflags", "--libs", "cudapool"])
        .env("PKG_CONFIG_PATH", &pc)
        .output()
    {
        Ok(o) => {
            assert!(
                o.status.success(),
                "pkg-config: {}",
                String::from_utf8_lossy(&o.stderr)
            );
            built.push((
                "pkg-config",
                build("by_pkgconfig", &String::from_utf8_lossy(&o.stdout)),
            ));
        }
        Err(e) => eprintln!("no pkg-config on this machine ({e}): that way not checked"),
    }
    // CMake, from the tests' own pinned venv.
    let cmake = test_venv().parent().unwrap().join("cmake");
    let bdir = dir.join("cmake-build");
    let cmake_dir = config("--cmakedir");
    for args in [
        vec![
            "-S".to_string(),
            root.join("cbindings/c").display().to_string(),
            "-B".into(),
            bdir.display().to_string(),
            format!("-Dcudapool_DIR={cmake_dir}"),
        ],
        vec!["--build".into(), bdir.display().to_string()],
    ] {
        let o = Command::new(&cmake).args(&args).output().expect("cmake");
        assert!(
            o.status.success(),
            "cmake {args:?}:\n{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    built.push(("cmake", bdir.join("print_status")));
    for (how, bin) in built {
        // Linked, not preloaded: the program's own link to the library interposes.
        let r = run_program(&bin, &[], false, &[]);
        assert_eq!(r.code, 0, "{how}: {}{}", r.stdout, r.stderr);
        assert!(
            r.stdout
                .contains("the phase peaked at 10485760 bytes in 4 allocations"),
            "{how}: {}",
            r.stdout
        );
    }
}

/// `python -m cudapool` and `cudapool.library_path()` from the source tree (the package on
/// `PYTHONPATH`, after the set-up's build), and what they say from a layout with no build:
/// every place they tried (issue 38; the wheel's layout is checked by scripts/test-wheel.sh).
#[test]
fn the_python_package_finds_the_cli_and_library_of_its_source_tree() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let py = |pythonpath: &Path, args: &[&str]| {
        let out = Command::new("python3")
            .args(args)
            .current_dir(std::env::temp_dir())
            .env("PYTHONPATH", pythonpath)
            .env_remove("CUDAPOOL_LIB")
            .env_remove("LD_PRELOAD")
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let tree = root.join("cbindings/python");
    let (code, out, err) = py(&tree, &["-m", "cudapool", "--help"]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("Usage: cudapool"), "{out}");
    let (code, out, err) = py(
        &tree,
        &["-c", "import cudapool; print(cudapool.library_path())"],
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.trim()
            .starts_with(&root.join("target").display().to_string())
            && out.trim().ends_with("libcudapool.so"),
        "{out}"
    );
    // The package alone, away from any build: both say what they tried.
    let alone = Path::new(env!("CARGO_TARGET_TMPDIR")).join("python-alone");
    let _ = std::fs::remove_dir_all(&alone);
    std::fs::create_dir_all(alone.join("cudapool")).unwrap();
    for f in ["__init__.py", "__main__.py"] {
        std::fs::copy(
            tree.join("cudapool").join(f),
            alone.join("cudapool").join(f),
        )
        .unwrap();
    }
    let (code, _, err) = py(&alone, &["-m", "cudapool", "--help"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("tried") && err.contains("target/release/cudapool"),
        "{err}"
    );
    let (_, _, err) = py(&alone, &["-c", "import cudapool; cudapool.library_path()"]);
    assert!(
        err.contains("tried") && err.contains("libcudapool.so"),
        "{err}"
    );
}

/// A C programmer without a GPU builds the README's kind of program (the driver API linked,
/// the C API linked) against the fake driver as `scripts/fake-driver.sh` lays it out (what the
/// demo leaves in target/demo): `-I DIR/include $(cudapool config --cflags --libs) -L DIR
/// -lcuda`, then runs it with `LD_LIBRARY_PATH=DIR`. Before: `cuInit` undefined (no SONAME, no
/// libcuda.so, no cuda.h).
#[test]
fn a_c_program_builds_and_runs_on_the_demos_fake_driver() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fake-demo");
    let _ = std::fs::remove_dir_all(&dir);
    let st = Command::new("bash")
        .arg(root.join("scripts/fake-driver.sh"))
        .arg(&dir)
        .status()
        .unwrap();
    assert!(st.success());
    let prog = dir.join("prog.c");
    std::fs::write(
        &prog,
        "#include <stdio.h>\n#include <cuda.h>\n#include <cudapool.h>\n\
         int main(void) {\n  CUdevice d; CUcontext c; CUdeviceptr p;\n\
           if (cuInit(0) || cuDeviceGet(&d, 0) || cuDevicePrimaryCtxRetain(&c, d) || cuCtxSetCurrent(c)) return 3;\n\
           if (cuMemAlloc(&p, 1 << 20)) return 4;\n\
           cudapool_stats s = {.struct_size = sizeof s};\n\
           int r = cudapool_get_stats(0, &s);\n\
           printf(\"stats r=%d allocated=%llu\\n\", r, (unsigned long long)s.allocated_bytes);\n\
           return cuMemFree(p);\n}\n",
    )
    .unwrap();
    let cli = env!("CARGO_BIN_EXE_cudapool");
    let d = dir.display();
    let build = format!(
        "cc -o {d}/prog {d}/prog.c -I {d}/include $({cli} config --cflags --libs) -L {d} -lcuda && LD_LIBRARY_PATH={d} {d}/prog"
    );
    let r = run_program(Path::new("sh"), &["-c", &build], false, &[]);
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stdout.contains("stats r=0 allocated=1048576"),
        "{}",
        r.stdout
    );
}

/// docs/api.md's worked example is what `cbindings/c/print_status.c` prints on the fake driver,
/// the pid masked (issue 46: worked outputs in the docs are checked, not only the README's).
#[test]
fn the_api_pages_worked_example_is_what_print_status_prints() {
    let f = fixture();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let api = std::fs::read_to_string(root.join("docs/api.md")).unwrap();
    let at = api
        .find("cudapool 0.1.0: the phase peaked")
        .expect("the block");
    let want: Vec<&str> = api[at..][..api[at..].find("```").unwrap()]
        .lines()
        .collect();
    let bin = f.dir.join("print_status");
    cc(
        &[
            "-Wall",
            "-Wextra",
            "-Werror",
            &format!("-I{}", root.join("include").display()),
            "-o",
            bin.to_str().unwrap(),
            root.join("cbindings/c/print_status.c").to_str().unwrap(),
            "-ldl",
        ],
        &f.dir,
    );
    // cudapool's defaults (an empty value is unset).
    let r = run_program(
        &bin,
        &[],
        true,
        &[
            ("CUDAPOOL_SEGMENTS", "expandable"),
            ("CUDAPOOL_CACHE_IDLE", ""),
        ],
    );
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let mask = |l: &str| match l.find(", pid ") {
        Some(i) => format!("{}, pid N)", &l[..i]),
        None => l.to_string(),
    };
    let got: Vec<String> = r.stdout.lines().map(mask).collect();
    assert_eq!(got, want, "docs/api.md's worked example is stale");
}

/// The README's worked example is what the demo prints (issue 38): its first two lines are the
/// demo script's own (no GPU here), the rest what `cudapool run --limit 512MiB --report` of the
/// sample prints, stdout and stderr as they come, the pid masked.
#[test]
fn the_readmes_worked_example_is_what_the_demo_prints() {
    let f = fixture();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let demo = std::fs::read_to_string(root.join("scripts/demo.sh")).unwrap();
    let after = &readme[readme.find("## A worked example").expect("the section")..];
    let start = after.find("```\n").expect("its block") + 4;
    let block: Vec<&str> = after[start..][..after[start..].find("```").unwrap()]
        .lines()
        .collect();
    assert!(
        demo.contains(&format!("echo \"{}\"", block[0])),
        "the demo says {:?}",
        block[0]
    );
    // The command as the user can run it again (issue 75, item 14: "-- sample" failed).
    assert_eq!(
        block[1],
        "$ cudapool run --limit 512MiB --report -- target/demo/sample"
    );
    assert!(demo.contains("echo \"\\$ cudapool run --limit $limit --report -- $work/sample\""));
    assert!(demo.contains("limit=${LIMIT:-512MiB}"));
    assert!(demo.contains("--report -- \"$work/sample\""));
    assert!(demo.contains("exec \"$dir/client\" dlsym sample \"$@\""));
    let cli = PathBuf::from(env!("CARGO_BIN_EXE_cudapool"));
    let r = run_program(
        Path::new("sh"),
        &[
            "-c",
            "exec \"$0\" run --limit 512MiB --report -- \"$1\" dlsym sample 2>&1",
            cli.to_str().unwrap(),
            f.dir.join("client").to_str().unwrap(),
        ],
        false,
        // The demo runs cudapool's defaults (the suite's second run would make its segments
        // classic; an empty value is unset).
        &[
            ("CUDAPOOL_SEGMENTS", "expandable"),
            ("CUDAPOOL_CACHE_IDLE", ""),
        ],
    );
    let mask = |l: &str| match l.find(", pid ") {
        Some(i) => format!("{}, pid N)", &l[..i]),
        None => l.to_string(),
    };
    let got: Vec<String> = r.stdout.lines().map(mask).collect();
    let want: Vec<String> = block[2..].iter().map(|l| mask(l)).collect();
    assert_eq!(got, want, "the README's worked example is stale");
}

/// NVML tells the budget (issue 35): through a program that looks NVML up (pynvml's way) and
/// one linked against it, `nvmlDeviceGetMemoryInfo` and `_v2` report, for a GPU with a limit,
/// total = the limit, used = what the process (or its group) holds, free = the room left and
/// never more than the device has free; GPUs without a limit are untouched. In a process that
/// never uses CUDA (as nvidia-smi) the settings decide; in one that does, its budgets.
#[test]
fn nvml_reports_the_budget() {
    let f = fixture();
    const GIB: u64 = 1 << 30;
    let read = |bin: &str, args: &[&str], env: &[(&str, &str)]| {
        let r = run_program(&f.dir.join(bin), args, true, env);
        assert_eq!(
            r.code, 0,
            "{bin} {args:?} {env:?}: {}{}",
            r.stdout, r.stderr
        );
        let figure = |tag: &str, i: u32, key: &str| -> u64 {
            r.stdout
                .lines()
                .find(|l| l.starts_with(&format!("{tag} i={i} ")))
                .and_then(|l| {
                    l.split_whitespace()
                        .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
                })
                .unwrap_or_else(|| panic!("no {tag} {key} for {i}: {}", r.stdout))
                .parse()
                .unwrap()
        };
        // (v1 total, used, free), then v2's (total, reserved, used, free), for devices 0 and 1.
        (0..2)
            .map(|i| {
                (
                    (
                        figure("nvml", i, "total"),
                        figure("nvml", i, "used"),
                        figure("nvml", i, "free"),
                    ),
                    (
                        figure("nvml2", i, "total"),
                        figure("nvml2", i, "reserved"),
                        figure("nvml2", i, "used"),
                        figure("nvml2", i, "free"),
                    ),
                )
            })
            .collect::<Vec<_>>()
    };
    let untouched = (
        (GIB, 108 * MIB, GIB - 108 * MIB),
        (GIB, 8 * MIB, 100 * MIB, GIB - 108 * MIB),
    );
    for bin in ["nvml", "nvml_linked"] {
        // No limit: NVML's own figures.
        assert_eq!(read(bin, &[], &[]), vec![untouched, untouched], "{bin}");
        // A limit for every GPU, in a process that never touches CUDA.
        let b = ((512 * MIB, 0, 512 * MIB), (512 * MIB, 0, 0, 512 * MIB));
        assert_eq!(
            read(bin, &[], &[("CUDAPOOL_MEMORY_LIMIT", "512MiB")]),
            vec![b, b],
            "{bin}"
        );
        // Free never more than the device has: 900 MiB used by others.
        let v = read(
            bin,
            &[],
            &[
                ("CUDAPOOL_MEMORY_LIMIT", "512MiB"),
                ("FAKENVML_USED", &(900 * MIB).to_string()),
            ],
        );
        assert_eq!(v[0].0, (512 * MIB, 0, GIB - 908 * MIB), "{bin}");
        assert_eq!(
            v[0].1,
            (512 * MIB, 512 * MIB - (GIB - 908 * MIB), 0, GIB - 908 * MIB),
            "{bin}"
        );
        // One GPU's limit, in a process holding 64 MiB of it: its own figures.
        let v = read(bin, &["64"], &[("CUDAPOOL_MEMORY_LIMIT", "0=256MiB")]);
        assert_eq!(v[0].0, (256 * MIB, 64 * MIB, 192 * MIB), "{bin}");
        assert_eq!(v[0].1, (256 * MIB, 0, 64 * MIB, 192 * MIB), "{bin}");
        assert_eq!(v[1], untouched, "{bin}: device 1 has no limit");
    }
    // A group: a member holds memory; another member's NVML, and that of a process of the
    // group that never uses CUDA, show the group's limit and what the group holds.
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("nvml-group");
    let _ = std::fs::remove_dir_all(&dir);
    let d = dir.to_str().unwrap();
    let genv = [
        ("CUDAPOOL_RUNTIME_DIR", d),
        ("CUDAPOOL_GROUP", "g"),
        ("CUDAPOOL_GROUP_LIMIT", "96MiB"),
    ];
    let mut holder = Command::new(f.dir.join("chaos"))
        .args(["once", "hold"])
        .env("LD_LIBRARY_PATH", &f.dir)
        .env("LD_PRELOAD", &f.lib)
        .envs(genv)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(holder.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    assert!(line.starts_with("once ok"), "{line}");
    let held = cudapool::limits::group::ledgers(false, Some(&dir))
        .into_iter()
        .flatten()
        .map(|v| v.devices[0].2)
        .next()
        .expect("the group's ledger");
    assert!(held >= MIB, "{held}");
    let v = read("nvml", &[], &genv);
    assert_eq!(
        v[0].0,
        (96 * MIB, held, 96 * MIB - held),
        "a process of the group that never used CUDA"
    );
    let v = read("nvml", &["8"], &genv);
    let held2 = held + 8 * MIB;
    assert!(
        v[0].0 .0 == 96 * MIB && v[0].0 .1 >= held2 && v[0].0 .2 == 96 * MIB - v[0].0 .1,
        "a member holding 8 MiB more: {:?} (the other holds {held})",
        v[0].0
    );
    drop(holder.stdin.take());
    assert!(holder.wait().unwrap().success());
}

/// The moment of out-of-memory (issue 35): the program's handler (Python's
/// `cudapool.set_oom_handler` over `cudapool_set_oom_handler`) frees and its retry succeeds, one
/// that allocates or raises is safe, and `CUDAPOOL_OOM_SNAPSHOT` leaves a snapshot in PyTorch's
/// format at each OOM the program receives, named in the OOM line
/// (`tests/python/check_oom.py`).
#[test]
fn the_oom_handler_and_the_oom_snapshot() {
    fixture();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("oom-snapshots");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let template = dir.join("oom-%p-%n.pickle");
    let r = run_program(
        &python3(),
        &[
            root.join("tests/python/check_oom.py").to_str().unwrap(),
            root.join("cbindings/python").to_str().unwrap(),
            root.join("tests/python").to_str().unwrap(),
        ],
        true,
        &[
            ("CUDAPOOL_MEMORY_LIMIT", "64MiB"),
            ("CUDAPOOL_POOL", "simple"),
            ("CUDAPOOL_OOM_SNAPSHOT", template.to_str().unwrap()),
        ],
    );
    print!("{}", r.stdout);
    assert!(
        r.code == 0 && r.stdout.contains(" 0 failed"),
        "{}{}",
        r.stdout,
        r.stderr
    );
    assert!(
        r.stderr.contains("snapshot of this moment in") && r.stderr.contains("oom-"),
        "the OOM line names the file: {}",
        r.stderr
    );
}

/// A newcomer's mistakes are named at once (issue 46): a misspelt variable is said once by the
/// library with the nearest known name (the program still runs), `cudapool run` refuses it
/// and a soft limit at or above the hard one with exit 2 before anything runs, and `top` into
/// a pipe writes plain screens, each under a time line, with no terminal escapes. Before: the
/// misspelt name was silently ignored everywhere and `top` wrote escapes into the file.
#[test]
fn a_newcomers_mistakes_are_named_at_once() {
    let r = ok(client("dlsym", &["basic"], &[("CUDAPOOL_LIMIT", "1GiB")]));
    let want =
        "unknown variable CUDAPOOL_LIMIT: did you mean CUDAPOOL_MEMORY_LIMIT? (it has no effect)";
    assert_eq!(r.stderr.matches(want).count(), 1, "{}", r.stderr);
    let cli = PathBuf::from(env!("CARGO_BIN_EXE_cudapool"));
    let r = run_program(
        &cli,
        &["run", "--", "/bin/echo", "ran"],
        false,
        &[("CUDAPOOL_LIMIT", "1GiB")],
    );
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains(want), "{}", r.stderr);
    assert!(!r.stdout.contains("ran"), "nothing ran: {}", r.stdout);
    let r = run_program(
        &cli,
        &["run", "--limit", "1GiB", "--", "/bin/echo", "ran"],
        false,
        &[("CUDAPOOL_SOFT_LIMIT", "2GiB")],
    );
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("CUDAPOOL_SOFT_LIMIT"), "{}", r.stderr);
    assert!(!r.stdout.contains("ran"), "nothing ran: {}", r.stdout);
    let r = run_program(&cli, &["top", "-n", "2", "-d", "0.1"], false, &[]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(
        r.stdout.matches("--- cudapool top at ").count(),
        2,
        "{}",
        r.stdout
    );
    assert!(!r.stdout.contains('\x1b'), "{:?}", r.stdout);
}
