//! The `cudapool` command:
//! - `cudapool run [--limit SIZE] [--pool KIND] [--report] -- program args...` sets `LD_PRELOAD`
//!   and the `CUDAPOOL_*` variables, then execs the program (SPEC.md). Bad options are refused
//!   before anything runs.
//! - `cudapool stat [-v] [PID...]`, `cudapool top [-v] [-n N] [-d SECONDS] [PID...]`: live
//!   figures of running cudapool processes (`cli/stat.rs`).
//! - `cudapool plot TRACE -o memory.svg`: a picture of a `CUDAPOOL_TRACE` file (`cli/plot.rs`).
//! - `cudapool snapshot PID [-o FILE] [--format json|torch]`: a running process's snapshot
//!   (`cli/snapshot.rs`).
//! - `cudapool exporter [--listen ADDR:PORT] [--interval SECONDS]`: Prometheus `/metrics` for
//!   every cudapool process of the user (`cli/exporter.rs`).

mod cli {
    pub mod exporter;
    pub mod plot;
    pub mod snapshot;
    pub mod stat;
}

use cudapool::config::{parse_device_limits, PoolKind, SIZE_FORMS};
use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, ExitCode};

const USAGE: &str =
    "usage: cudapool run [--limit SIZE] [--pool KIND] [--report] -- program [args...]

Runs program with libcudapool.so preloaded.
  --limit SIZE   hard limit per device (CUDAPOOL_MEMORY_LIMIT): 8GiB, 1.5G, 50%, 0=8GiB,1=50%
  --pool KIND    split, binned, simple or none (CUDAPOOL_POOL)
  --report       print the memory status at exit (CUDAPOOL_REPORT=stderr)
Other CUDAPOOL_* variables in the environment are passed on.
stat [-v] [PID...]: the live figures of running cudapool processes of this user (-v: say which
  files in /dev/shm were skipped and why); top: the same, refreshed.
plot: allocated, reserved and limit over time from a CUDAPOOL_TRACE file, as SVG.
snapshot PID [-o FILE] [--format json|torch]: a running cudapool process of this user writes
  its snapshot (cudapool's JSON, or PyTorch's pickle for its memory viewer) to FILE, without
  being stopped.
exporter [--listen ADDR:PORT] [--interval SECONDS]: Prometheus /metrics for every cudapool
  process of this user (of every user as root), on 127.0.0.1:9489 unless told.
Groups: CUDAPOOL_GROUP=NAME joins group NAME (processes of this user on this machine with the
  same NAME share one budget per GPU); CUDAPOOL_GROUP_LIMIT=SIZE (or a per-device list) is the
  group's hard limit (the first member fixes it). stat and top show each process's group.";

struct Run {
    limit: Option<String>,
    pool: Option<String>,
    report: bool,
    program: Vec<OsString>,
}

fn parse_run(args: &[OsString]) -> Result<Run, String> {
    let mut run = Run {
        limit: None,
        pool: None,
        report: false,
        program: Vec::new(),
    };
    let mut i = 0;
    while i < args.len() {
        let a = args[i].to_string_lossy().into_owned();
        let mut value = |name: &str| -> Result<String, String> {
            if let Some(v) = a.strip_prefix(&format!("{name}=")) {
                return Ok(v.to_string());
            }
            i += 1;
            args.get(i)
                .map(|v| v.to_string_lossy().into_owned())
                .ok_or_else(|| format!("{name} needs a value"))
        };
        if a == "--" {
            run.program = args[i + 1..].to_vec();
            break;
        } else if a == "--limit" || a.starts_with("--limit=") {
            let v = value("--limit")?;
            parse_device_limits(&v)
                .map_err(|why| format!("invalid --limit {v:?}: {why}; accepted: {SIZE_FORMS}"))?;
            run.limit = Some(v);
        } else if a == "--pool" || a.starts_with("--pool=") {
            let v = value("--pool")?;
            PoolKind::parse(&v)
                .ok_or_else(|| format!("invalid --pool {v:?}; accepted: {}", PoolKind::ACCEPTED))?;
            run.pool = Some(v);
        } else if a == "--report" {
            run.report = true;
        } else if a.starts_with('-') {
            return Err(format!("unknown option {a}"));
        } else {
            run.program = args[i..].to_vec();
            break;
        }
        i += 1;
    }
    if run.program.is_empty() {
        return Err("no program to run".into());
    }
    Ok(run)
}

/// `$CUDAPOOL_LIB`, else `libcudapool.so` beside this binary, in `../lib`, or (installed by
/// `pip`, this binary in a `bin/` folder) in the `cudapool` package of that prefix's Python
/// (`../lib/python3.*/site-packages/cudapool/`, or `dist-packages` on Debian's Python).
fn find_library() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("CUDAPOOL_LIB") {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!("CUDAPOOL_LIB={} is not a file", p.display()))
        };
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot find myself: {e}"))?;
    let dir = exe.parent().ok_or("binary has no folder")?;
    let mut candidates = vec![
        dir.join("libcudapool.so"),
        dir.join("../lib/libcudapool.so"),
    ];
    candidates.extend(pip_installed(&dir.join("../lib")));
    for candidate in candidates {
        if candidate.is_file() {
            return candidate
                .canonicalize()
                .map_err(|e| format!("{}: {e}", candidate.display()));
        }
    }
    Err(format!(
        "libcudapool.so not found beside {} or in ../lib (nor in a pip-installed cudapool \
         package there); set CUDAPOOL_LIB",
        exe.display()
    ))
}

/// `lib/python3.*/{site,dist}-packages/cudapool/libcudapool.so` under `lib`, newest Python
/// first.
fn pip_installed(lib: &std::path::Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(lib) else {
        return Vec::new();
    };
    let mut pythons: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("python3"))
        })
        .collect();
    pythons.sort();
    pythons
        .iter()
        .rev()
        .flat_map(|py| {
            ["site-packages", "dist-packages"]
                .map(|d| py.join(d).join("cudapool").join("libcudapool.so"))
        })
        .collect()
}

fn run(args: &[OsString]) -> Result<std::convert::Infallible, (u8, String)> {
    let r = parse_run(args).map_err(|e| (2, format!("{e}\n{USAGE}")))?;
    let lib = find_library().map_err(|e| (2, e))?;
    let mut preload = OsString::from(&lib);
    if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
        preload.push(":");
        preload.push(old);
    }
    let mut cmd = Command::new(&r.program[0]);
    cmd.args(&r.program[1..]).env("LD_PRELOAD", preload);
    if let Some(l) = &r.limit {
        cmd.env("CUDAPOOL_MEMORY_LIMIT", l);
    }
    if let Some(p) = &r.pool {
        cmd.env("CUDAPOOL_POOL", p);
    }
    if r.report {
        cmd.env("CUDAPOOL_REPORT", "stderr");
    }
    let err = cmd.exec();
    let code = if err.kind() == std::io::ErrorKind::NotFound {
        127
    } else {
        126
    };
    Err((
        code,
        format!("cannot run {}: {err}", r.program[0].to_string_lossy()),
    ))
}

fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    match args
        .first()
        .map(|a| a.to_string_lossy().into_owned())
        .as_deref()
    {
        Some("run") => match run(&args[1..]) {
            Ok(never) => match never {},
            Err((code, msg)) => {
                eprintln!("cudapool: {msg}");
                ExitCode::from(code)
            }
        },
        Some("exporter") => {
            let rest: Vec<String> = args[1..]
                .iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect();
            cli::exporter::exporter(&rest)
        }
        Some(cmd @ ("stat" | "top" | "plot" | "snapshot")) => {
            let rest: Vec<String> = args[1..]
                .iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect();
            let r = match cmd {
                "stat" => cli::stat::stat(&rest),
                "top" => cli::stat::top(&rest),
                "snapshot" => cli::snapshot::snapshot(&rest),
                _ => cli::plot::plot(&rest),
            };
            match r {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("cudapool {cmd}: {e}");
                    ExitCode::from(2)
                }
            }
        }
        Some("--version" | "-V" | "version") => {
            println!("cudapool {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        Some("--help" | "-h" | "help") => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        _ => {
            eprintln!("{USAGE}");
            ExitCode::from(2)
        }
    }
}
