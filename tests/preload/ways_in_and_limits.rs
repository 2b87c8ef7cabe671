//! Preload tests: how programs reach the driver, limits, bad input, contexts, address queries, NVTX, configuration (IPC: `ipc.rs`).

use super::*;

#[test]
fn the_shim_sees_allocations_every_way_a_program_reaches_the_driver() {
    for mode in all_modes() {
        let r = ok(client(mode, &["basic"], &[("CUDAPOOL_POOL", "none")]));
        let held = r.line("held");
        assert_eq!(held["shim"], "present", "{mode}");
        assert_eq!(held["alloc_calls"], "3", "{mode}: {}", r.stdout);
        assert_eq!(held["live"], "3", "{mode}");
        assert_eq!(held["allocated"], ((4 * MIB) + 4096).to_string(), "{mode}");
        let freed = r.line("freed");
        assert_eq!(freed["free_calls"], "3", "{mode}");
        assert_eq!(freed["allocated"], "0", "{mode}");
        assert_eq!(freed["reserved"], "0", "{mode}");
        assert_eq!(r.get("driver_alloc_calls", "driver_alloc_calls"), "3");
    }
}

#[test]
fn without_the_shim_the_client_sees_no_shim() {
    let f = fixture();
    let r = run_program(&f.dir.join("client"), &["gpa", "basic"], false, &[]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.get("held", "shim"), "absent");
}

#[test]
fn cuda_runtime_style_lookup_gets_the_wrapper_and_the_drivers_answers() {
    for mode in ["gpa", "gpa-ptsz"] {
        let r = ok(client(mode, &["basic"], &[]));
        // Asking cuGetProcAddress_v2 for "cuGetProcAddress" at 12000 hands out the wrapper
        // itself, the one dlsym gave.
        assert_eq!(r.get("gpa_self_is_first", "gpa_self_is_first"), "1");
        // The 11.3 entry point answers "cuMemAlloc"@3020 with the same hook as the 12.0 one.
        assert_eq!(
            r.get("gpa_v1_alloc_is_v2_alloc", "gpa_v1_alloc_is_v2_alloc"),
            "1"
        );
        // A name the driver lacks keeps the driver's answer (the real one's, seen on an H100):
        // CUDA_SUCCESS, status 1 (symbol not found), NULL.
        let m = r.line("gpa_missing");
        assert_eq!(
            (
                m["gpa_missing"].as_str(),
                m["status"].as_str(),
                m["null"].as_str()
            ),
            ("0", "1", "1")
        );
    }
}

#[test]
fn per_thread_stream_flags_reach_the_driver_unchanged() {
    let r = ok(client("gpa-ptsz", &["ptds"], &[]));
    assert_eq!(
        (r.num("memset", "memset"), r.num("memset", "memset_ptds")),
        (0, 1),
        "the per-thread variant, through its trampoline"
    );
    let r = ok(client("gpa", &["ptds"], &[]));
    assert_eq!(
        (r.num("memset", "memset"), r.num("memset", "memset_ptds")),
        (1, 0)
    );
}

/// One thread on its per-thread default stream is one queue: it takes its freed blocks back at
/// once. Another thread's work on its own per-thread stream makes two queues: then a freed
/// block is not handed out while a kernel may still use it, unless handed over (the next work
/// waits for the kernel on the device).
#[test]
fn per_thread_streams_are_queues_of_their_own() {
    for pool in CACHING {
        for mode in ["gpa-ptsz", "gpa", "dlsym"] {
            let r = ok(client(mode, &["ptds"], &[("CUDAPOOL_POOL", pool)]));
            let what = format!("{mode}/{pool}:\n{}", r.stdout);
            assert_eq!(r.get("one_thread_reuse", "one_thread_reuse"), "1", "{what}");
            // Through gpa-ptsz each thread has its own queue; otherwise all work is on the
            // legacy stream, one queue, where reuse is safe at once.
            let expect = if mode == "gpa-ptsz" { "0" } else { "1" };
            let k = "second_thread_reuse_while_busy";
            assert_eq!(r.get(k, k), expect, "{what}");
            assert_eq!(r.get("ptds_races", "ptds_races"), "0", "{what}");
        }
    }
}

#[test]
fn a_64_mib_limit_fits_exactly_eight_8_mib_allocations() {
    for (mode, pool) in all_modes().flat_map(|m| POOLS.map(|p| (m, p))) {
        let r = ok(client(
            mode,
            &["limit", "8388608"],
            &[("CUDAPOOL_MEMORY_LIMIT", "64MiB"), ("CUDAPOOL_POOL", pool)],
        ));
        assert_eq!(r.get("fits", "fits"), "8", "{mode}/{pool}: {}", r.stdout);
        assert_eq!(
            r.get("fits", "err"),
            "2",
            "{mode}: ninth is CUDA_ERROR_OUT_OF_MEMORY"
        );
        assert_eq!(r.num("full", "ooms"), 1);
        assert_eq!(r.num("full", "limit"), 64 * MIB);
        assert_eq!(r.num("full_free", "full_free"), 0);
        assert_eq!(r.num("full_free", "full_total"), 64 * MIB);
        assert_eq!(
            r.get("again", "again"),
            "0",
            "memory comes back after frees"
        );
        assert!(
            r.stderr
                .contains("cudapool: out of memory on device 0: asked 8.00 MiB; limit 64.00 MiB"),
            "one useful OOM line: {}",
            r.stderr
        );
    }
}

#[test]
fn limits_in_every_form_apply_to_the_right_device() {
    let cases: [(&str, &str, u64); 6] = [
        ("0", "64MB", 7),      // 64e6 / 8 MiB = 7.6
        ("0", "25%", 32),      // of 1 GiB
        ("0", "0.0625GiB", 8), // 64 MiB
        ("1", "0=16MiB,1=32MiB", 4),
        ("0", "0=16MiB,1=32MiB", 2),
        ("1", "0=16MiB", 128), // device 1 has no limit: the fake's 1 GiB
    ];
    for (device, limit, fits) in cases {
        let r = ok(client(
            "gpa",
            &["limit", "8388608"],
            &[("CUDAPOOL_MEMORY_LIMIT", limit), ("CLIENT_DEVICE", device)],
        ));
        assert_eq!(r.num("fits", "fits"), fits, "device {device} limit {limit}");
    }
}

#[test]
fn mem_get_info_reflects_the_limit() {
    let r = ok(client(
        "dlsym",
        &["getinfo"],
        &[("CUDAPOOL_MEMORY_LIMIT", "64MiB")],
    ));
    assert_eq!(r.num("free", "total"), 64 * MIB);
    assert_eq!(r.num("free", "free"), 64 * MIB);
    assert_eq!(r.num("after_free", "after_free"), 54 * MIB);
    assert_eq!(r.num("after_free", "after_total"), 64 * MIB);

    // A limit above the device's memory: the device's figures.
    let r = ok(client(
        "dlsym",
        &["getinfo"],
        &[("CUDAPOOL_MEMORY_LIMIT", "4GiB")],
    ));
    assert_eq!(r.num("free", "total"), FAKE_TOTAL);
    assert_eq!(r.num("after_free", "after_free"), FAKE_TOTAL - 10 * MIB);

    // No limit: untouched.
    let r = ok(client("link", &["getinfo"], &[]));
    assert_eq!(
        (r.num("free", "free"), r.num("free", "total")),
        (FAKE_TOTAL, FAKE_TOTAL)
    );
}

#[test]
fn bad_input_gets_the_drivers_own_answer_and_leaves_the_pool_intact() {
    let f = fixture();
    let plain = run_program(&f.dir.join("client"), &["dlsym", "bad"], false, &[]);
    assert_eq!(plain.code, 0, "{}", plain.stderr);
    let keys = [
        "null_out",
        "zero_size",
        "bogus_free",
        "interior_free",
        "first_free",
        "double_free",
        "getinfo_null",
        "pitch_null",
        "pitch_elem",
    ];
    for (mode, pool) in all_modes().flat_map(|m| POOLS.map(|p| (m, p))) {
        let r = ok(client(
            mode,
            &["bad"],
            &[("CUDAPOOL_MEMORY_LIMIT", "512MiB"), ("CUDAPOOL_POOL", pool)],
        ));
        for k in keys {
            assert_eq!(
                r.get(k, k),
                plain.get(k, k),
                "{mode}/{pool}: {k} differs from the driver's"
            );
        }
        assert_eq!(r.get("null_out", "null_out"), "1");
        assert_eq!(r.get("double_free", "double_free"), "1");
        assert_eq!(r.get("first_free", "first_free"), "0");
        assert_eq!(r.get("getinfo_null", "getinfo_null"), "0", "{mode}");
        assert_eq!(
            r.get("getinfo_free_only", "getinfo_free_only"),
            "1",
            "{mode}: limited"
        );
        // A pool block never reaches the driver's free while the pool owns it: with a caching
        // pool only the bogus pointer does; the interior and the second free are answered by
        // the shim.
        let driver_frees = r.num("driver_free_calls", "driver_free_calls");
        assert_eq!(
            driver_frees,
            if pool == "none" { 4 } else { 1 },
            "{mode}/{pool}"
        );
        let after = r.line("after");
        assert_eq!(
            (after["live"].as_str(), after["allocated"].as_str()),
            ("0", "0"),
            "{mode}/{pool}"
        );
        if pool == "none" {
            assert_eq!(after["reserved"], "0", "{mode}");
        } else {
            assert_eq!(
                after["reserved"], after["cached"],
                "{mode}/{pool}: all cached"
            );
        }
    }
}

#[test]
fn many_threads_never_overlap_nor_pass_the_limit() {
    // 16 threads, random sizes up to 1 MiB, each block stamped and checked before its free.
    for pool in POOLS {
        threads_under_limit(pool);
    }
    let r = ok(client(
        "link",
        &["threads", "16", "2000", "65536"],
        &[("CUDAPOOL_POOL", "split")],
    ));
    assert_eq!(r.get("threads", "errors"), "0");
    assert_eq!(r.get("threads", "ooms"), "0");
}

/// Every way a thread changes its current context (set, push, pop, create, destroy, none, another
/// thread, a primary reset) is followed: each allocation lands on its context's device, though
/// a thread that set its context through a hook no longer asks the driver (issue 14 part 1).
#[test]
fn allocations_follow_every_context_switch() {
    for (mode, pool) in all_modes().flat_map(|m| POOLS.map(|p| (m, p))) {
        let r = client(mode, &["ctxswitch"], &[("CUDAPOOL_POOL", pool)]);
        assert!(
            r.code == 0 && r.stdout.contains("switch ok"),
            "{mode}/{pool}: {}{}",
            r.stdout,
            r.stderr
        );
    }
}

#[test]
fn blocks_die_with_their_context() {
    for (mode, pool) in all_modes().flat_map(|m| POOLS.map(|p| (m, p))) {
        let r = ok(client(
            mode,
            &["ctx"],
            &[("CUDAPOOL_MEMORY_LIMIT", "16MiB"), ("CUDAPOOL_POOL", pool)],
        ));
        assert_eq!(r.num("primary_held", "live"), 2, "{mode}");
        for tag in ["primary_reset", "primary_released", "created_destroyed"] {
            let l = r.line(tag);
            assert_eq!(l["live"], "0", "{mode} {tag}: {}", r.stdout);
            assert_eq!(l["allocated"], "0", "{mode} {tag}");
            assert_eq!(l["reserved"], "0", "{mode} {tag}");
            assert_eq!(l["segments"], "0", "{mode} {tag}");
        }
        assert_eq!(
            r.num("primary_one_ref_left", "live"),
            1,
            "{mode}: still referenced"
        );
        assert_eq!(r.num("created_held", "live"), 1, "{mode}");
        assert_eq!(r.num("fresh", "allocated"), 0, "{mode}/{pool}");
        assert_eq!(r.num("fresh", "free_calls"), 1, "{mode}");
        // Before the fresh context: the driver holds nothing for the dead ones.
        let after = r.line("after_contexts");
        assert_eq!(after["used"], "0", "{mode}/{pool}: {}", r.stdout);
        assert_eq!(after["ranges"], "0", "{mode}/{pool}: {}", r.stdout);
    }
}

#[test]
fn pitched_allocations_count_their_real_footprint() {
    for mode in all_modes() {
        let r = ok(client(mode, &["pitch"], &[]));
        assert_eq!(r.num("pitch", "pitch"), 1024, "the fake rounds rows to 512");
        assert_eq!(r.num("pitched", "allocated"), 1024 * 100, "{mode}");
        assert_eq!(r.num("pitched", "live"), 1);
        assert_eq!(r.num("freed", "allocated"), 0);
        assert_eq!(r.num("freed", "reserved"), 0);
    }
    // 1000x100 asks for 100000 bytes but takes 102400: under a 100000-byte limit it is refused,
    // and the driver's allocation is given back.
    let r = client("gpa", &["pitch"], &[("CUDAPOOL_MEMORY_LIMIT", "100000")]);
    assert_eq!(r.code, 3, "{}", r.stdout);
    assert!(r.stderr.contains("failed: 2"), "{}", r.stderr);
}

#[test]
fn address_range_is_the_allocation_the_program_made() {
    for mode in all_modes() {
        for pool in ["none", "split", "binned", "simple"] {
            // A 1 MiB block: under `split` the first piece of a fresh 2 MiB segment, yet the
            // program's allocation is the 1 MiB it asked for.
            let r = ok(client(mode, &["range"], &[("CUDAPOOL_POOL", pool)]));
            assert_eq!(r.get("base_ok", "base_ok"), "1", "{mode} {pool}");
            assert_eq!(r.num("base_ok", "size"), MIB, "{mode} {pool}");
        }
    }
}

/// Numba sizes a device array from `cuMemGetAddressRange` and sets all of it
/// (`device_memset(a, 0, device_memory_size(a))`). Answered with the segment, that overran it
/// (`CUDA_ERROR_INVALID_VALUE` from a block further in, the neighbours' bytes from the first).
#[test]
fn address_queries_describe_the_block_the_program_holds() {
    for mode in ["dlsym", "gpa"] {
        for pool in ["none", "split", "binned", "simple"] {
            let r = ranges(mode, "blocks", true, &[("CUDAPOOL_POOL", pool)]);
            let what = format!("{mode} {pool}:\n{}", r.stdout);
            for tag in ["a", "b"] {
                let l = r.line(tag);
                for (k, v) in [
                    ("range_rc", "0"),
                    ("base_off", "0"),
                    ("size", "1000"),
                    ("attr_rc", "0,0"),
                    ("attr_off", "0"),
                    ("attr_size", "1000"),
                    ("attrs_rc", "0"),
                    ("attrs_off", "0"),
                    ("attrs_size", "1000"),
                    ("type", "2"),
                ] {
                    assert_eq!(l[k], v, "{tag} {k}: {what}");
                }
            }
            let m = r.line("memset");
            assert_eq!(
                (&*m["a_rc"], &*m["b_rc"], &*m["a_ok"], &*m["b_ok"]),
                ("0", "0", "1", "1"),
                "{what}"
            );
            let ipc = r.line("ipc");
            assert_eq!(
                (&*ipc["a_rc"], &*ipc["b_rc"], &*ipc["a_interior_rc"]),
                ("0", "0", "0"),
                "{what}"
            );
            // A freed block is not an allocation, whether the pool keeps its memory or not:
            // the range entries of cuPointerGetAttributes keep what they held (1).
            let l = r.line("freed_b");
            assert_eq!(l["range_rc"], "500", "{what}");
            assert_eq!(l["attr_rc"], "1,1", "{what}");
            assert_eq!((&*l["attrs_rc"], &*l["attrs_size"]), ("0", "1"), "{what}");
        }
    }
}

/// Under an NVTX tool (as compute-sanitizer attaches one), each block the program holds is a
/// region of its segment's heap, named; a freed block is none, whether it waits for its fence,
/// sits in a magazine or is cached; segments that go back take their heaps. The fake tool
/// counts every breach of the protocol (overlaps, regions outside their heap, double
/// unregisters).
#[test]
fn an_nvtx_tool_sees_each_block_the_program_holds() {
    let f = fixture();
    let tool = f.dir.join("libfakenvtx.so");
    let tool = tool.to_str().unwrap();
    // Under expandable segments (the default; the suite's second run is classic) split's 8 MiB block lies in mapped
    // memory, which has no heap: memcheck sees the mapped chunks themselves.
    let expandable = !std::env::var("CPTEST_SEGMENTS").is_ok_and(|m| m == "classic");
    for pool in ["split", "binned", "simple"] {
        let env = [("CUDAPOOL_POOL", pool), ("NVTX_INJECTION64_PATH", tool)];
        let r = ok(run_program(&f.dir.join("nvtx"), &[], true, &env));
        let what = format!("{pool}:\n{}\n{}", r.stdout, r.stderr);
        let mapped = expandable && pool == "split";
        let (c_size, c_name) = if mapped {
            ("0", "-")
        } else {
            ("8388608", "cuMemAlloc 8388608 B")
        };
        for (tag, size, name) in [
            ("a", "1000", "cuMemAlloc 1000 B"),
            ("b", "1000", "cuMemAlloc 1000 B"),
            ("c", c_size, c_name),
            ("again_b", "1000", "cuMemAlloc 1000 B"),
            ("async_e", "4096", "cuMemAllocAsync 4096 B"),
            ("async_f", "4096", "cuMemAllocAsync 4096 B"),
        ] {
            let l = r.stdout.lines().find(|l| l.starts_with(&format!("{tag} ")));
            let want = format!("{tag} size={size} name={name}");
            assert_eq!(l, Some(want.as_str()), "{what}");
        }
        for tag in ["inside_a", "freed_b", "freed_e"] {
            assert_eq!(r.get(tag, "size"), "0", "{tag}: {what}");
        }
        assert_eq!(r.num("held", "regions"), 4 - mapped as u64, "{what}");
        assert_eq!(r.num("freed", "regions"), 0, "{what}");
        let done = r.line("reclaimed");
        assert_eq!(done["heaps"], "0", "{what}");
        assert_eq!(done["heap_regs"], done["heap_unregs"], "{what}");
        let regs = if mapped { "5" } else { "6" };
        assert_eq!(done["region_regs"], regs, "{what}");
        assert_eq!(done["violations"], "0", "{what}");
        assert!(!r.stderr.contains("violation"), "{what}");
    }
    // Under CUDAPOOL_TRACK=2 a region's name also says where the program asked for it.
    let env = [("CUDAPOOL_TRACK", "2"), ("NVTX_INJECTION64_PATH", tool)];
    let r = ok(run_program(&f.dir.join("nvtx"), &[], true, &env));
    let a = r
        .stdout
        .lines()
        .find(|l| l.starts_with("a "))
        .unwrap_or_default();
    assert!(
        a.starts_with("a size=1000 name=cuMemAlloc 1000 B at ") && a.contains("main"),
        "{a}"
    );
    // Under `none` every block is the driver's own allocation, seen by the tool itself: no
    // NVTX call is made, so the tool is never even loaded. Nor is it without a tool.
    let env = [("CUDAPOOL_POOL", "none"), ("NVTX_INJECTION64_PATH", tool)];
    let r = ok(run_program(&f.dir.join("nvtx"), &[], true, &env));
    assert_eq!(r.stdout.trim(), "tool=absent");
}

/// Pinned host memory mapped for the device (Numba's `test_host_alloc_pinned`): every answer,
/// with cudapool, is exactly the driver's.
#[test]
fn memory_cudapool_never_handed_out_gets_the_drivers_answers() {
    for mode in ["dlsym", "gpa"] {
        let plain = ranges(mode, "host", false, &[]);
        assert_eq!(plain.get("host", "range_rc"), "0", "{}", plain.stdout);
        assert_eq!(plain.get("host", "size"), "40");
        assert_eq!(plain.get("host_memset", "zeroed"), "1");
        for pool in ["none", "split", "binned", "simple"] {
            let shim = ranges(mode, "host", true, &[("CUDAPOOL_POOL", pool)]);
            assert_eq!(shim.stdout, plain.stdout, "{mode} {pool}");
        }
    }
}

#[test]
fn legacy_32_bit_entry_points_are_counted() {
    for mode in all_modes() {
        let r = ok(client(
            mode,
            &["legacy"],
            &[("CUDAPOOL_MEMORY_LIMIT", "64MiB")],
        ));
        assert_eq!(
            r.num("legacy_held", "allocated"),
            MIB,
            "{mode}: {}",
            r.stdout
        );
        assert_eq!(r.num("legacy_held", "live"), 1);
        assert_eq!(r.num("legacy_freed", "allocated"), 0);
        assert_eq!(r.num("legacy_freed", "reserved"), 0);
    }
}

#[test]
fn a_bad_value_fails_closed_and_loud() {
    for (var, value) in [
        ("CUDAPOOL_MEMORY_LIMIT", "8GB5"),
        ("CUDAPOOL_MEMORY_LIMIT", "0=1G,0=2G"),
        ("CUDAPOOL_SOFT_LIMIT", "150%"),
        ("CUDAPOOL_POOL", "fastest"),
        ("CUDAPOOL_REUSE", "sometimes"),
    ] {
        let r = client("gpa", &["basic"], &[(var, value)]);
        assert_eq!(
            r.code, 3,
            "{var}={value}: the allocation must fail: {}",
            r.stdout
        );
        assert!(r.stderr.contains("failed: 3"), "{}", r.stderr);
        let ours: Vec<&str> = r
            .stderr
            .lines()
            .filter(|l| l.starts_with("cudapool:"))
            .collect();
        assert_eq!(ours.len(), 1, "exactly one line: {}", r.stderr);
        assert!(ours[0].contains(&format!("{var}={value:?}")), "{}", ours[0]);
        assert!(ours[0].contains("accepted:"), "{}", ours[0]);
    }
}

#[test]
fn processes_that_never_touch_cuda_are_not_disturbed() {
    let env = [
        ("CUDAPOOL_MEMORY_LIMIT", "not-a-size"),
        ("CUDAPOOL_REPORT", "stderr"),
        ("CUDAPOOL_LOG", "debug"),
    ];
    let f = fixture();
    let r = run_program(Path::new("/bin/true"), &[], true, &env);
    assert_eq!((r.code, r.stdout.as_str(), r.stderr.as_str()), (0, "", ""));
    let r = run_program(
        Path::new("/bin/sh"),
        &["-c", "echo hello; exit 7"],
        true,
        &env,
    );
    assert_eq!(
        (r.code, r.stdout.as_str(), r.stderr.as_str()),
        (7, "hello\n", "")
    );
    // Python loads extension modules through dlopen/dlsym: the override is on that path.
    if let Ok(py) = which("python3") {
        let r = run_program(
            &py,
            &["-c", "import ctypes, json; print(json.dumps([1]))"],
            true,
            &env,
        );
        assert_eq!(
            (r.code, r.stdout.as_str(), r.stderr.as_str()),
            (0, "[1]\n", "")
        );
    }
    let r = run_program(&f.dir.join("next_main"), &[], true, &env);
    assert_eq!((r.code, r.stderr.as_str()), (0, ""));
}

#[test]
fn dlsym_rtld_next_resolves_relative_to_its_caller() {
    let f = fixture();
    let wrap = f.dir.join("libnext_wrap.so");
    let preload = format!("{}:{}", f.lib.display(), wrap.display());
    let r = run_program(
        &f.dir.join("next_main"),
        &[],
        false,
        &[("LD_PRELOAD", &preload)],
    );
    assert_eq!(
        r.code, 0,
        "exit 42 means RTLD_NEXT resolved to the wrapper itself: {}",
        r.stderr
    );
    assert_eq!(r.stdout, "getpid=ok\n");
}

#[test]
fn disable_passes_everything_through() {
    let r = ok(client(
        "gpa",
        &["limit", "8388608"],
        &[
            ("CUDAPOOL_MEMORY_LIMIT", "64MiB"),
            ("CUDAPOOL_DISABLE", "1"),
        ],
    ));
    assert_eq!(
        r.num("fits", "fits"),
        128,
        "no limit: the fake's whole 1 GiB"
    );
    assert_eq!(
        r.get("full", "r"),
        "3",
        "the C API says the shim is not active"
    );
}
