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

/// The demo's sample: 64 MiB buffers until refused, on the 1 GiB fake device.
fn sample(args: &[&str]) -> Run {
    let f = fixture();
    let client = f.dir.join("client");
    let mut all: Vec<&str> = vec!["run"];
    all.extend_from_slice(args);
    all.extend(["--", client.to_str().unwrap(), "dlsym", "sample"]);
    cudapool(&all, &[])
}

/// Items 2, 16 and 17: the device itself full [a refused 64 MiB in the peak: "reserved 1.00
/// GiB (peak 1.06 GiB)"], the report in words a user knows ["1 segments", "1 reclaim
/// retries", "134 allocations taken ... (a segment, a handle of an expandable segment or a
/// pass-through allocation each)"], and the GPU's own free memory named as the GPU's ["limit
/// 512 MiB, allocated 512 MiB ... device free 512 MiB"].
#[test]
fn the_exit_report_and_the_oom_line_say_what_happened() {
    for pool in ["split", "binned", "simple"] {
        let r = sample(&["--pool", pool, "--report"]);
        assert_eq!(r.code, 0, "{pool}: {}", r.stderr);
        assert!(
            r.stderr.contains("reserved  1.00 GiB (peak 1.00 GiB)"),
            "{pool}: a refused request is no peak: {}",
            r.stderr
        );
    }
    let r = sample(&["--limit", "512MiB", "--report"]);
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
        e.contains("1 retry after emptying the cache, 1 out-of-memory answer\n"),
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
