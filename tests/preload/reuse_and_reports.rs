//! Preload tests: the exit report, the CLI and header, reuse safety on a lagging GPU, the cache, the Python module, torch snapshots.

use super::*;

#[test]
fn exit_report_goes_to_stderr_or_a_file() {
    let r = ok(client(
        "dlsym",
        &["basic"],
        &[("CUDAPOOL_REPORT", "1"), ("CUDAPOOL_MEMORY_LIMIT", "1GiB")],
    ));
    assert!(
        r.stderr.contains("cudapool: device 0: limit 1.00 GiB"),
        "{}",
        r.stderr
    );
    assert!(
        r.stderr.contains("3 allocations and 3 frees"),
        "{}",
        r.stderr
    );
    let path = fixture().dir.join("report.txt");
    let _ = std::fs::remove_file(&path);
    ok(client(
        "dlsym",
        &["basic"],
        &[("CUDAPOOL_REPORT", path.to_str().unwrap())],
    ));
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains("allocated 0 B (peak 4.00 MiB)"), "{text}");
}

#[test]
fn the_cli_runs_a_program_under_the_shim() {
    let f = fixture();
    let cli = PathBuf::from(env!("CARGO_BIN_EXE_cudapool"));
    let client = f.dir.join("client");
    let client = client.to_str().unwrap();
    let r = run_program(
        &cli,
        &[
            "run", "--limit", "64MiB", "--pool", "none", "--report", "--", client, "gpa", "limit",
            "8388608",
        ],
        false,
        &[],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.get("fits", "fits"), "8");
    assert!(r.stderr.contains("memory status"), "{}", r.stderr);

    let r = run_program(
        &cli,
        &["run", "--limit", "lots", "--", "/bin/true"],
        false,
        &[],
    );
    assert_eq!(r.code, 2);
    assert!(
        r.stderr
            .contains("cudapool run: invalid value 'lots' for '--limit <SIZE>'")
            && r.stderr.contains("accepted"),
        "{}",
        r.stderr
    );
    let r = run_program(
        &cli,
        &["run", "--pool", "magic", "--", "/bin/true"],
        false,
        &[],
    );
    assert_eq!(r.code, 2);
    let r = run_program(&cli, &["run", "--", "/no/such/program"], false, &[]);
    assert_eq!(r.code, 127, "{}", r.stderr);
    let r = run_program(&cli, &["run"], false, &[]);
    assert_eq!(r.code, 2);
}

#[test]
fn the_header_matches_the_library() {
    use cudapool::abi::capi::CudapoolStats;
    use std::mem::{offset_of, size_of};
    let f = fixture();
    let libdir = f.lib.parent().unwrap().to_str().unwrap().to_string();
    let path = format!("{}:{libdir}", f.dir.display());
    let r = run_program(
        &f.dir.join("header_check"),
        &[],
        false,
        &[("LD_LIBRARY_PATH", &path)],
    );
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let v = env!("CARGO_PKG_VERSION");
    assert_eq!(r.get("version", "version"), v);
    assert_eq!(
        r.get("version", "macros"),
        v,
        "CUDAPOOL_VERSION_* follow Cargo.toml"
    );
    assert_eq!(r.num("sizeof", "sizeof"), size_of::<CudapoolStats>() as u64);
    assert_eq!(
        r.num("sizeof", "written"),
        size_of::<CudapoolStats>() as u64
    );
    assert_eq!(r.get("sizeof", "r"), "0", "linked, not preloaded: active");
    assert!(r.num("sizeof", "status_need") > 16);
    assert_eq!(r.get("sizeof", "status_nul"), "1");
    // Each field of a header struct sits where the library's repr(C) struct has it.
    macro_rules! same_offsets {
        ($line:expr, $ty:ty, $($field:ident),*) => {
            let o = r.line($line);
            $( assert_eq!(
                o[stringify!($field)],
                offset_of!($ty, $field).to_string(),
                "offset of {}", stringify!($field)
            ); )*
            assert_eq!(o.len(), [$(stringify!($field)),*].len(), "every field is checked");
        };
    }
    same_offsets!(
        "offsets",
        CudapoolStats,
        struct_size,
        device,
        allocated_bytes,
        peak_allocated_bytes,
        reserved_bytes,
        peak_reserved_bytes,
        cached_bytes,
        live_allocations,
        segments,
        alloc_calls,
        free_calls,
        cache_hits,
        driver_allocs,
        driver_frees,
        reclaim_retries,
        ooms,
        hard_limit,
        soft_limit,
        requested_bytes,
        peak_requested_bytes,
        overhead_bytes,
        asleep_bytes,
        sleep_state,
        panics
    );
    assert_eq!(
        (r.get("snapshot", "null"), r.get("snapshot", "unwritable")),
        ("1".into(), "304".into())
    );
    assert_eq!(r.line("values")["device"], "0");
    assert_eq!(r.line("values")["allocated"], "0");
    let c = r.line("calls");
    assert_eq!(c["reclaim"], "0");
    assert_eq!((c["reset"].as_str(), c["limit"].as_str()), ("0", "0"));
    assert_eq!((c["bad_device"].as_str(), c["null"].as_str()), ("1", "1"));
    assert_eq!(r.get("too_small", "too_small"), "1");
    use cudapool::abi::capi::CudapoolGroupStats;
    same_offsets!(
        "group_offsets",
        CudapoolGroupStats,
        struct_size,
        device,
        members,
        reserved_bytes,
        limit,
        process_reserved_bytes,
        name
    );
    assert_eq!(
        r.num("group", "sizeof"),
        size_of::<CudapoolGroupStats>() as u64
    );
    assert_eq!(r.get("group", "no_group"), "801", "in no group");
    assert_eq!(r.get("group", "null"), "1");
    assert_eq!(r.get("oom_handler", "set"), "0");
    assert_eq!(r.get("oom_handler", "unset"), "0");
}

#[test]
fn the_c_example_prints_the_status_of_a_phase() {
    let f = fixture();
    let r = run_program(&f.dir.join("print_status"), &[], true, &[]);
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stdout
            .contains("the phase peaked at 10485760 bytes in 4 allocations"),
        "{}",
        r.stdout
    );
    assert!(r.stdout.contains("device 0: limit none"), "{}", r.stdout);
    assert!(
        r.stdout.contains("reserved now 0 bytes"),
        "the cache went back: {}",
        r.stdout
    );
    let r = run_program(&f.dir.join("print_status"), &[], false, &[]);
    assert_eq!(r.code, 1);
    assert!(r.stdout.contains("not loaded"));
}

#[test]
fn the_devices_own_out_of_memory_is_counted_and_logged_too() {
    let r = ok(client(
        "dlsym",
        &["limit", "8388608"],
        &[("FAKECU_TOTAL_MEM", "67108864")],
    ));
    assert_eq!(r.num("fits", "fits"), 8, "the fake device holds 64 MiB");
    assert_eq!(r.get("fits", "err"), "2");
    assert_eq!(r.num("full", "ooms"), 1);
    assert_eq!(r.num("full", "limit"), 0);
    assert!(
        r.stderr.contains("asked 8.00 MiB; limit none")
            && r.stderr.contains("the GPU itself has 0 B free"),
        "{}",
        r.stderr
    );
}

#[test]
fn a_freed_block_is_never_reused_while_device_work_may_still_touch_it() {
    for (mode, pool) in ["gpa", "link", "dlsym", "gpa-ptsz"]
        .into_iter()
        .flat_map(|m| CACHING.map(|p| (m, p)))
    {
        let r = ok(client(mode, &["reuse"], &[("CUDAPOOL_POOL", pool)]));
        let one = |k: &str, v: &str| assert_eq!(r.get(k, k), v, "{mode}/{pool}: {k}\n{}", r.stdout);
        // One queue: reuse at once, by any thread.
        one("same_thread_immediate", "1");
        one("other_thread_immediate", "1");
        // A new queue is ordered after the old one at its first work, not at its creation.
        one("created_stream_waits", "0");
        one("late_stream_waits", "1");
        // Two queues: never while the kernel runs.
        one("reused_while_busy", "0");
        one("reused_after_fence", "1");
        one("reused_while_destroyed_stream_busy", "0");
        one("reused_after_destroyed_stream", "1");
        one("reuse_races", "0");
        let c = r.line("records_during_capture");
        assert_eq!(
            c["records_during_capture"], "0",
            "{mode}/{pool}: no fence in a capture"
        );
        assert_eq!(c["capture_violations"], "0");
        let end = r.line("reuse_end");
        assert_eq!(
            (end["live"].as_str(), end["allocated"].as_str()),
            ("0", "0")
        );
        assert!(
            end["hits"].parse::<u64>().unwrap() >= 3,
            "{mode}/{pool}: the cache served"
        );
    }
}

#[test]
fn immediate_reuse_skips_the_fences_when_asked() {
    for pool in CACHING {
        let r = ok(client(
            "gpa",
            &["reuse"],
            &[("CUDAPOOL_POOL", pool), ("CUDAPOOL_REUSE", "immediate")],
        ));
        assert_eq!(
            r.get("reused_while_busy", "reused_while_busy"),
            "1",
            "{pool}"
        );
        assert_eq!(
            r.get("late_stream_waits", "late_stream_waits"),
            "0",
            "{pool}"
        );
    }
}

/// Under a limit, a miss takes back what its fences hold (handed over in stream order, or
/// waited for) and serves the request from the cache, instead of failing or going back to
/// the driver.
#[test]
fn out_of_memory_only_after_waiting_for_fences_and_releasing_the_cache() {
    for (mode, pool) in ["gpa", "link"]
        .into_iter()
        .flat_map(|m| CACHING.map(|p| (m, p)))
    {
        let r = ok(client(
            mode,
            &["pressure"],
            &[("CUDAPOOL_POOL", pool), ("CUDAPOOL_MEMORY_LIMIT", "40MiB")],
        ));
        let what = format!("{mode}/{pool}:\n{}", r.stdout);
        assert_eq!(
            r.get("pressure", "pressure"),
            "0",
            "{what}: served, not OOM"
        );
        let p = r.line("pressure");
        assert!(
            p["waited"] == "1" || p["handed_over"] == "1",
            "{what}: waited for the fence, or handed it over"
        );
        assert_eq!(r.get("pressure", "same"), "1", "{what}: from the cache");
        let end = r.line("pressure_end");
        assert_eq!(end["ooms"], "0");
        assert_eq!(
            end["driver_frees"], "0",
            "{what}: nothing went back to the driver"
        );
    }
}

// ---- issue 11: a GPU that lags the CPU ------------------------------------------------------

/// A training loop whose CPU runs far ahead of the (modelled) GPU. While all work goes to one
/// queue (no stream; a stream created but idle; all work on its own stream; several threads on
/// the legacy stream), reserved memory is what reuse at once would reserve (within 2%; with
/// threads, whose interleaving varies, within a bound of the sum of their live peaks): freed
/// blocks do not pile up while the GPU lags; no fence is waited for; the race detector finds
/// nothing. With two queues, frees wait for fences; reserved memory stays bounded (it does not
/// grow with the number of steps) and nothing races.
#[test]
fn a_lagging_gpu_does_not_pile_up_freed_memory() {
    let reserved = |r: &Run| r.num("lag_end", "reserved");
    for pool in CACHING {
        for layout in ["legacy", "idle-stream", "own-stream", "threads"] {
            let env = [("CUDAPOOL_POOL", pool), ("FAKECU_HOST_NS", "1000")];
            let r = ok(client("gpa", &["lag", layout], &env));
            let what = format!("{layout}/{pool}:\n{}", r.stdout);
            let lag = r.line("lag");
            assert!(
                lag["lag_ns"].parse::<u64>().unwrap() > 10_000_000,
                "{what}: the GPU lags"
            );
            assert_eq!(lag["races"], "0", "{what}");
            assert_eq!(lag["waits"], "0", "{what}: one queue: no fence waited for");
            if layout == "threads" {
                // Four threads interleave differently from run to run, and their peaks may
                // coincide: against the sum of their peaks (split 0.7-1.0x in runs here,
                // binned and simple, which round or match exact sizes, 0.9-1.55x).
                let peaks = lag["live_peak"].parse::<u64>().unwrap();
                let bound = if pool == "split" { 130 } else { 200 };
                assert!(reserved(&r) * 100 <= peaks * bound, "{what}");
                continue;
            }
            let mut env_imm = env.to_vec();
            env_imm.push(("CUDAPOOL_REUSE", "immediate"));
            let baseline = reserved(&ok(client("gpa", &["lag", layout], &env_imm)));
            assert!(
                reserved(&r) * 100 <= baseline * 102,
                "{what}: reserved {} against {baseline} with immediate reuse",
                reserved(&r)
            );
            if pool == "split" {
                let peak = lag["live_peak"].parse::<u64>().unwrap();
                assert!(reserved(&r) * 100 <= peak * 125, "{what}: live peak {peak}");
            }
        }
        // Two queues: bounded, and safe (immediate reuse races here: the detector bites).
        let env = [("CUDAPOOL_POOL", pool)];
        let short = ok(client("gpa", &["lag", "two-streams", "8"], &env));
        let long = ok(client("gpa", &["lag", "two-streams", "32"], &env));
        let what = format!("{pool}:\n{}\n{}", short.stdout, long.stdout);
        assert_eq!(long.get("lag", "races"), "0", "{what}");
        assert_eq!(
            long.get("lag", "waits"),
            "0",
            "{what}: fences handed over in stream order, never waited for on the host"
        );
        assert_eq!(reserved(&long), reserved(&short), "{what}: bounded");
        let peak = long.num("lag", "live_peak");
        assert!(reserved(&long) <= 2 * peak + 64 * MIB, "{what}");
        let unsafe_env = [("CUDAPOOL_POOL", pool), ("CUDAPOOL_REUSE", "immediate")];
        let raced = ok(client("gpa", &["lag", "two-streams", "8"], &unsafe_env));
        assert_ne!(
            raced.get("lag", "races"),
            "0",
            "{pool}: the detector must see races"
        );
    }
}

/// Two queues, a block freed while a long kernel still uses it, and the next allocation of its
/// size takes it back at once: the pool hands the fence over (every queue's next work waits
/// for it on the device) instead of waiting on the host. Whatever stream, thread or new stream
/// then uses the block, nothing races; the freeing stream destroyed at once after the hand-over
/// is never touched again (the fake driver would abort). Without the device-side waits this
/// test reports races (checked by hand: 18 races in `lag two-streams`).
#[test]
fn a_fence_handed_over_in_stream_order_protects_every_later_use() {
    for how in ["other-stream", "other-thread", "legacy", "per-thread"] {
        for destroy in ["", "+destroy"] {
            let how = format!("{how}{destroy}");
            for mode in ["gpa", "link"] {
                let r = ok(client(
                    mode,
                    &["handover", &how],
                    &[("CUDAPOOL_POOL", "split")],
                ));
                let what = format!("{how} {mode}:\n{}\n{}", r.stdout, r.stderr);
                let h = r.line("handover");
                assert_eq!(
                    h["reused"], "1",
                    "{what}: taken back before the kernel ended"
                );
                assert_eq!(h["races"], "0", "{what}");
                assert_eq!(h["host_waits"], "0", "{what}: handed over, not waited for");
            }
        }
    }
    // A second context with device work: the host waits instead (another context's queues
    // owe nothing to this one's fences), and nothing races either; a context whose first work
    // comes after the hand-over waits for the owed fence on the host.
    for how in ["other-stream+ctx", "per-thread+ctx", "late-ctx"] {
        let r = ok(client(
            "gpa",
            &["handover", how],
            &[("CUDAPOOL_POOL", "split")],
        ));
        let h = r.line("handover");
        assert_eq!(h["races"], "0", "{how}: {}", r.stdout);
        assert_ne!(
            h["host_waits"], "0",
            "{how}: waited on the host\n{}",
            r.stdout
        );
    }
    // Immediate reuse takes the block back too, without any wait: the detector must bite.
    let env = [("CUDAPOOL_POOL", "split"), ("CUDAPOOL_REUSE", "immediate")];
    let r = ok(client("gpa", &["handover", "other-stream"], &env));
    assert_ne!(r.get("handover", "races"), "0", "{}", r.stdout);
}

/// Memory goes back to the driver only once no device work uses it: a driver free waits for
/// the device by itself, an unmap of expandable segments does not, so the pool fences first
/// (a reclaim waits for the fence, a free above the soft limit only takes what is done).
#[test]
fn memory_given_back_while_a_kernel_runs_is_never_unmapped_under_it() {
    for segments in ["classic", "expandable"] {
        for (how, soft) in [("reclaim", "0"), ("soft", "1")] {
            for mode in ["gpa", "link"] {
                let env = [
                    ("CUDAPOOL_POOL", "split"),
                    ("CUDAPOOL_SEGMENTS", segments),
                    ("CUDAPOOL_SOFT_LIMIT", soft),
                ];
                let r = ok(client(mode, &["unmap", how], &env));
                let l = r.line("unmap");
                let what = format!("{segments} {how} {mode}: {}\n{}", r.stdout, r.stderr);
                assert_eq!(l["races"], "0", "{what}");
                assert_eq!(l["used"], "0", "{what}: everything went back");
                if how == "reclaim" {
                    assert!(l["released"].parse::<u64>().unwrap() >= 40 * MIB, "{what}");
                }
            }
        }
    }
}

/// The boundary of one-queue reuse: a block reused at once on the legacy stream, then written
/// by the first work on another stream (a new one, or one that had work long ago and went
/// idle): that work waits for the legacy stream's, and nothing races.
#[test]
fn the_first_work_on_another_queue_waits_for_the_reused_blocks_old_work() {
    for mode in ["gpa", "link", "gpa-ptsz"] {
        for pool in CACHING {
            let r = ok(client(mode, &["switch"], &[("CUDAPOOL_POOL", pool)]));
            let b = r.line("boundary");
            assert_eq!(
                (b["reused"].as_str(), b["races"].as_str()),
                ("1", "0"),
                "{mode}/{pool}: {}",
                r.stdout
            );
        }
    }
    for pool in CACHING {
        let r = ok(client("gpa", &["return"], &[("CUDAPOOL_POOL", pool)]));
        let what = format!("{pool}: {}", r.stdout);
        assert_eq!(
            r.get("one_queue_again", "one_queue_again"),
            "1",
            "{what}: retired"
        );
        let b = r.line("boundary");
        assert_eq!(
            (b["reused"].as_str(), b["races"].as_str()),
            ("1", "0"),
            "{what}"
        );
    }
    // Without the shim ordering the new queue (immediate reuse), the same program races.
    let r = ok(client(
        "gpa",
        &["switch"],
        &[("CUDAPOOL_POOL", "split"), ("CUDAPOOL_REUSE", "immediate")],
    ));
    assert_ne!(r.get("boundary", "races"), "0", "{}", r.stdout);
}

#[test]
fn cached_memory_counts_as_free_and_is_reused() {
    for pool in CACHING {
        let r = ok(client(
            "dlsym",
            &["limit", "8388608"],
            &[("CUDAPOOL_MEMORY_LIMIT", "64MiB"), ("CUDAPOOL_POOL", pool)],
        ));
        assert_eq!(r.num("fits", "fits"), 8, "{pool}");
        assert_eq!(
            r.get("again", "again"),
            "0",
            "{pool}: served from the cache"
        );
    }
    // cuMemGetInfo with blocks cached: free includes them.
    let r = ok(client(
        "dlsym",
        &["getinfo"],
        &[
            ("CUDAPOOL_MEMORY_LIMIT", "64MiB"),
            ("CUDAPOOL_POOL", "split"),
        ],
    ));
    assert_eq!(r.num("free", "free"), 64 * MIB);
    assert_eq!(r.num("after_free", "after_free"), 54 * MIB);
}

/// The README's sample: after 512 B, 1, 16 and 100 MiB come and go, 64 MiB buffers must still
/// fill a 512 MiB limit exactly. A pool that splits a cached 100 MiB segment for the first 64 MiB
/// buffer strands the other 36 MiB where no reclaim can reach it, and the eighth buffer fails.
#[test]
fn cached_segments_never_strand_memory_under_a_limit() {
    for pool in POOLS {
        let r = ok(client(
            "dlsym",
            &["sample"],
            &[("CUDAPOOL_MEMORY_LIMIT", "512MiB"), ("CUDAPOOL_POOL", pool)],
        ));
        assert!(
            r.stdout.contains("8 buffers of 64 MiB fit, then error 2"),
            "{pool}: {}",
            r.stdout
        );
    }
}

#[test]
fn the_python_module_reads_and_drives_the_pool() {
    let f = fixture();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/check_cudapool.py");
    let snap = f.dir.join("python_snapshot.json");
    let (script, snap) = (script.to_str().unwrap(), snap.to_str().unwrap());
    let r = run_program(
        &python3(),
        &[script, "loaded", snap],
        true,
        &[("CUDAPOOL_POOL", "split")],
    );
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("python: ok"), "{}", r.stdout);
    let r = run_program(&python3(), &[script, "absent"], false, &[]);
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    // The error names the library's own path (this tree's build), not a placeholder.
    assert!(
        r.stdout.contains(&format!(
            "LD_PRELOAD={}",
            f.lib.canonicalize().unwrap().display()
        )) || r.stdout.contains("LD_PRELOAD=/"),
        "a clear error naming the library: {}",
        r.stdout
    );
    assert!(!r.stdout.contains("/path/to"), "{}", r.stdout);
}

/// `cudapool_snapshot_torch` (through the Python package) writes PyTorch's snapshot pickle:
/// Python's own pickle reads it, and its segments, blocks and trace agree with what the program
/// did, under a caching kind and under `none` (every allocation a segment of its own).
#[test]
fn a_torch_snapshot_reads_back_with_its_blocks_and_history() {
    let f = fixture();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/check_torch_snapshot.py");
    for pool in ["split", "binned", "none"] {
        let snap = f.dir.join(format!("torch_snapshot_{pool}.pickle"));
        let (script, snap) = (script.to_str().unwrap(), snap.to_str().unwrap());
        let env = [
            ("CUDAPOOL_POOL", pool),
            ("CUDAPOOL_HISTORY", "1000"),
            ("CUDAPOOL_TRACK", "2"),
        ];
        let r = run_program(&python3(), &[script, snap], true, &env);
        assert_eq!(r.code, 0, "{pool}: {}{}", r.stdout, r.stderr);
        assert!(r.stdout.contains("torch snapshot: ok"), "{}", r.stdout);
    }
}

/// The history's `free_completed` comes when the block's fence is done, not at the free: a 3 MiB
/// block freed while another queue's work is held has no completion until that work ends.
#[test]
fn a_fenced_free_completes_in_the_history_when_its_fence_is_done() {
    let f = fixture();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/check_history_fences.py");
    let snap = f.dir.join("history_fences.pickle");
    let env = [("CUDAPOOL_HISTORY", "1000")];
    let r = run_program(
        &python3(),
        &[script.to_str().unwrap(), snap.to_str().unwrap()],
        true,
        &env,
    );
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("history fences: ok"), "{}", r.stdout);
}

/// Stitching through the real driver path (`DriverUpstream::stitch`, `Driver::vmm_stitch`): near
/// a limit a growth maps the handles of two freed blocks a second time instead of taking memory;
/// the device's memory in use does not grow, the whole run's access is set by one call, the new
/// block and every live one keep their bytes, and a reclaim afterwards gives everything back.
#[test]
fn near_a_limit_a_growth_stitches_freed_handles_with_one_access_call() {
    let r = ok(client(
        "gpa",
        &["stitch"],
        &[
            ("CUDAPOOL_SEGMENTS", "expandable"),
            ("CUDAPOOL_MEMORY_LIMIT", "256MiB"),
        ],
    ));
    let what = format!("{}{}", r.stdout, r.stderr);
    let s = r.line("stitch");
    assert_eq!(s["new_mib"], "0", "no new memory: {what}");
    assert_eq!(s["maps"], "32", "32 handles of 2 MiB mapped again: {what}");
    assert_eq!(s["set_access"], "1", "one access call for the run: {what}");
    assert_eq!(s["intact"], "1", "{what}");
    assert_eq!(r.get("stitch_end", "used_mib"), "0", "{what}");
}
