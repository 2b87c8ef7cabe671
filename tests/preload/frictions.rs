//! What a newcomer met (issue 53), each now said the way a user expects: before, in brackets.

use super::common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

fn cli() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_cudapool"))
}

/// Refused with exit 2 and a line holding `want`.
fn refused(args: &[&str], env: &[(&str, &str)], want: &str) -> String {
    let r = run_program(&cli(), args, false, env);
    assert_eq!(r.code, 2, "{args:?}: {}{}", r.stdout, r.stderr);
    assert!(
        r.stderr.contains(want),
        "{args:?}: want {want:?} in {}",
        r.stderr
    );
    r.stderr
}

/// Items 2, 9 and 10: a leftover `CUDAPOOL_DISABLE` [cancelled `--limit` silently], `--limit
/// 256` [256 bytes, accepted], `--limit 0%` ["0% is not between 0% and 100%"], `top -d 0` and
/// `-d abc` [two different rules].
#[test]
fn the_cli_names_what_would_silently_do_nothing() {
    for v in ["1", "yes"] {
        refused(
            &["run", "--limit", "128MiB", "--", "/bin/true"],
            &[("CUDAPOOL_DISABLE", v)],
            "turns cudapool off, so --limit would do nothing: unset it",
        );
    }
    refused(
        &["run", "--limit", "256", "--", "/bin/true"],
        &[],
        "256 is 256 bytes, less than 1 MiB: did you mean 256MiB",
    );
    let r = run_program(
        &cli(),
        &["run", "--limit", "256B", "--", "/bin/true"],
        false,
        &[],
    );
    assert_eq!(r.code, 0, "bytes said as bytes: {}", r.stderr);
    let e = refused(&["run", "--limit", "0%", "--", "/bin/true"], &[], "0%");
    assert!(e.contains("more than 0% and at most 100%"), "{e}");
    let zero = refused(
        &["top", "-d", "0"],
        &[],
        "is not a number of seconds more than 0",
    );
    let abc = refused(
        &["top", "-d", "abc"],
        &[],
        "is not a number of seconds more than 0",
    );
    assert!(!zero.contains("0 or more") && !abc.contains("0 or more"));
}

/// Item 3: the demo's sample run by hand [usage named "client", no scenario; "cannot get
/// libcuda.so.1"].
#[test]
fn the_sample_says_how_to_run_it() {
    let f = fixture();
    let r = run_program(&f.dir.join("client"), &[], false, &[]);
    assert_eq!(r.code, 2);
    assert!(
        r.stderr.contains("usage: client ") && r.stderr.contains("sample (the demo's workload)"),
        "{}",
        r.stderr
    );
    let r = run_program(
        &f.dir.join("client"),
        &["dlsym", "sample"],
        false,
        &[("LD_LIBRARY_PATH", "/nonexistent")],
    );
    assert!(
        r.stderr
            .contains("no NVIDIA driver here; scripts/demo.sh lays out a fake one"),
        "{}",
        r.stderr
    );
}

/// Item 13: a busy port [the address said twice, no remedy].
#[test]
fn a_busy_port_is_said_once_with_the_remedy() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let r = run_program(&cli(), &["exporter", "--listen", &addr], false, &[]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert_eq!(r.stderr.matches(&addr).count(), 1, "{}", r.stderr);
    assert!(
        r.stderr.contains("choose another with --listen"),
        "{}",
        r.stderr
    );
}

/// Item 16: a program that keeps retrying [one line per refusal: 168 in 25 s] gets its first
/// ten lines, then at most one every 5 s naming how many went unsaid.
#[test]
fn out_of_memory_lines_are_thinned_out() {
    let f = fixture();
    let r = run_program(&f.dir.join("chaos"), &["oom", "40"], true, &[]);
    assert!(r.stdout.contains("oom ooms=40"), "{}", r.stdout);
    let lines = r.stderr.matches("out of memory on device").count();
    assert_eq!(lines, 10, "{}", r.stderr);
}

/// Item 12: `stat` names each process, says "1 member", and `stat PID` shows its group
/// [no name; "1 members"; no group block].
#[test]
fn stat_names_processes_and_shows_a_pids_group() {
    let f = fixture();
    let dir = f.dir.join("stat-names");
    let _ = std::fs::remove_dir_all(&dir);
    let d = dir.to_str().unwrap();
    let mut child = start_holder(&[("CUDAPOOL_RUNTIME_DIR", d), ("CUDAPOOL_GROUP", "names")]);
    let pid = child.id().to_string();
    let r = run_program(
        &cli(),
        &["stat", &pid],
        false,
        &[("CUDAPOOL_RUNTIME_DIR", d)],
    );
    drop(child.stdin.take());
    let _ = child.wait();
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stdout.contains(&format!("pid {pid} (chaos)")),
        "{}",
        r.stdout
    );
    assert!(r.stdout.contains("group names: 1 member\n"), "{}", r.stdout);
}

/// Item 11: `top` on a terminal quits on `q` [it did nothing], and its lines fit the terminal
/// (`src/cli/stat.rs` tests the fitting). A terminal is made with util-linux's `script`.
#[test]
fn top_quits_on_q() {
    if Command::new("script").arg("--version").output().is_err() {
        eprintln!("no `script` (util-linux) to make a terminal: not checked");
        return;
    }
    let cmd = format!("{} top -d 0.3", cli().display());
    let t = std::time::Instant::now();
    let r = run_program(
        Path::new("sh"),
        &[
            "-c",
            "(sleep 1; printf q) | timeout 20 script -qec \"$0\" /dev/null",
            &cmd,
        ],
        false,
        &[],
    );
    assert_eq!(r.code, 0, "q quits: {}{}", r.stdout, r.stderr);
    assert!(t.elapsed() < std::time::Duration::from_secs(15));
    assert!(r.stdout.contains("q to quit"), "{}", r.stdout);
}
