//! The whole library under `LD_PRELOAD`, against a fake `libcuda.so.1`, with C clients that
//! reach the driver by linking, by `dlopen`+`dlsym`, and by `cuGetProcAddress_v2` (docs/design.md,
//! test layer 2). Needs a C compiler (`cc`); no GPU.

#[path = "../common/mod.rs"]
mod common;

use common::*;

use std::collections::HashMap;

use std::path::{Path, PathBuf};

use std::process::Command;

fn threads_under_limit(pool: &str) {
    let r = ok(client(
        "gpa",
        &["threads", "16", "3000", "1048576"],
        &[("CUDAPOOL_MEMORY_LIMIT", "8MiB"), ("CUDAPOOL_POOL", pool)],
    ));
    let t = r.line("threads");
    assert_eq!(t["errors"], "0", "{}", r.stdout);
    assert!(
        t["ooms"].parse::<u64>().unwrap() > 0,
        "the limit was under pressure"
    );
    assert!(t["ok"].parse::<u64>().unwrap() > 1000);
    assert!(
        t["driver_peak"].parse::<u64>().unwrap() <= 8 * MIB,
        "the driver itself never held more than the limit: {}",
        t["driver_peak"]
    );
    let end = r.line("end");
    assert_eq!(
        (end["live"].as_str(), end["allocated"].as_str()),
        ("0", "0"),
        "{pool}"
    );
    assert_eq!(
        end["reserved"], end["cached"],
        "{pool}: what is left is cache"
    );
    assert!(end["peak"].parse::<u64>().unwrap() <= 8 * MIB);
}

fn ranges(mode: &str, scenario: &str, shim: bool, env: &[(&str, &str)]) -> Run {
    let f = fixture();
    ok(run_program(
        &f.dir.join("ranges"),
        &[mode, scenario],
        shim,
        env,
    ))
}

fn which(name: &str) -> Result<PathBuf, ()> {
    std::env::var_os("PATH")
        .and_then(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join(name))
                .find(|p| p.is_file())
        })
        .ok_or(())
}

fn python3() -> PathBuf {
    which("python3").expect("python3 is needed for the Python module's tests")
}

// ---- issue 6: every allocation API counts ---------------------------------------------------

fn memapi(mode: &str, scenario: &str, env: &[(&str, &str)]) -> Run {
    let f = fixture();
    let mut all = vec![("CUDAPOOL_MEMORY_LIMIT", "64MiB")];
    all.extend_from_slice(env);
    ok(run_program(
        &f.dir.join("memapi"),
        &[mode, scenario],
        true,
        &all,
    ))
}

const MEMAPI_MODES: [&str; 3] = ["dlsym", "gpa", "gpa-ptsz"];

// The tests, in files by what they cover.
mod capture;
mod first_steps;
mod frictions;
mod give_back;
mod ipc;
mod newcomer_four;
mod newcomer_nvml_oom;
mod overhead;
mod replay;
mod reuse_and_reports;
mod sleep;
mod sleep_attacks;
mod stats_and_apis;
mod ways_in_and_limits;
