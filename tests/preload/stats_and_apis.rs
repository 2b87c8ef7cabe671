//! Preload tests: snapshots from outside, leaks, stat, traces, every allocation API and graph memory, the rpath driver.

use super::*;

/// `cudapool snapshot PID` from outside: the process answers while it makes no allocator call
/// (its snapshot thread), in both formats, without a signal; a pid without a page is a clear
/// error.
#[test]
fn a_running_process_writes_its_snapshot_when_asked_from_outside() {
    use std::io::BufRead;
    let f = fixture();
    let cli = PathBuf::from(env!("CARGO_BIN_EXE_cudapool"));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/idle_holder.py");
    let mut cmd = Command::new(python3());
    cmd.arg(&script).arg("20").current_dir(&f.dir);
    cmd.env("LD_LIBRARY_PATH", &f.dir).env("LD_PRELOAD", &f.lib);
    cmd.env("CUDAPOOL_HISTORY", "100")
        .env_remove("CUDAPOOL_POOL");
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python3");
    let mut ready = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut ready)
        .unwrap();
    assert_eq!(ready.trim(), "ready");
    let pid = child.id().to_string();
    // An observer's mistakes stay with the observer: a folder that does not exist, and one
    // where no file can be made (/proc), each said before asking, never written into the
    // program's stderr.
    let r = run_program(
        &cli,
        &["snapshot", &pid, "-o", "/no/such/dir/x.json"],
        false,
        &[],
    );
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains("/no/such/dir: no such folder"),
        "{}",
        r.stderr
    );
    let r = run_program(&cli, &["snapshot", &pid, "-o", "/proc/x.json"], false, &[]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains("/proc/x.json: cannot write beside it"),
        "{}",
        r.stderr
    );
    let json = f.dir.join("outside.json");
    let pickle = f.dir.join("outside.pickle");
    let asked = [
        (json.to_str().unwrap(), "json"),
        (pickle.to_str().unwrap(), "torch"),
    ];
    let mut outs = Vec::new();
    for (out, format) in asked {
        let _ = std::fs::remove_file(out);
        let r = run_program(
            &cli,
            &["snapshot", &pid, "-o", out, "--format", format],
            false,
            &[],
        );
        outs.push(r);
    }
    // `-o -`: on standard output (issue 75, item 13: a file named "-"), no file left behind;
    // a pickle named .json is written as asked and said.
    let r = run_program(&cli, &["snapshot", &pid, "-o", "-"], false, &[]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let on_stdout: serde_json::Value = serde_json::from_str(&r.stdout).expect("JSON on stdout");
    assert!(on_stdout["devices"].is_array(), "{}", r.stdout);
    assert!(!f.dir.join("-").exists());
    let odd = f.dir.join("odd.json");
    let r = run_program(
        &cli,
        &[
            "snapshot",
            &pid,
            "-o",
            odd.to_str().unwrap(),
            "--format",
            "torch",
        ],
        false,
        &[],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stderr
            .contains("PyTorch's pickle though its name ends in .json"),
        "{}",
        r.stderr
    );
    let _ = std::fs::remove_file(&odd);
    let still_running = child.try_wait().unwrap().is_none();
    let _ = child.kill();
    let _ = child.wait();
    assert!(still_running, "the process was not stopped");
    let mut job_err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut job_err).unwrap();
    assert!(
        !job_err.contains("snapshot"),
        "the program's stderr: {job_err}"
    );
    for r in &outs {
        assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    }
    let snap: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let mut sizes: Vec<u64> = snap["devices"][0]["allocations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["size"].as_u64().unwrap())
        .collect();
    sizes.sort();
    assert_eq!(sizes, vec![1000, 12345, 3 << 20]);
    let check = "import pickle,sys; d=pickle.load(open(sys.argv[1],'rb')); \
                 print(sorted(b['requested_size'] for s in d['segments'] for b in s['blocks'] \
                 if b['state']=='active_allocated'), [e['action'] for e in d['device_traces'][0]].count('alloc'))";
    let r = run_program(
        &python3(),
        &["-c", check, pickle.to_str().unwrap()],
        false,
        &[],
    );
    assert_eq!(r.stdout.trim(), "[1000, 12345, 3145728] 3", "{}", r.stderr);
    let r = run_program(&cli, &["snapshot", "1"], false, &[]);
    assert_eq!(r.code, 2);
    assert!(
        r.stderr
            .contains("no cudapool process with pid 1 of this user"),
        "{}",
        r.stderr
    );
}

#[test]
fn tracking_reports_leaks_at_exit_with_backtraces_at_level_2() {
    let r = ok(client("dlsym", &["leak"], &[]));
    assert!(
        !r.stderr.contains("never freed"),
        "no report without CUDAPOOL_TRACK"
    );
    let r = ok(client("dlsym", &["leak"], &[("CUDAPOOL_TRACK", "1")]));
    assert!(
        r.stderr
            .contains("2 allocations never freed, 4.00 MiB in all"),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("3.00 MiB on device 0") && r.stderr.contains("1.00 MiB on device 0"));
    assert!(
        !r.stderr.contains("leaky_helper"),
        "no backtraces at level 1"
    );
    let r = ok(client("link", &["leak"], &[("CUDAPOOL_TRACK", "2")]));
    let frames = r.stderr.matches("leaky_helper").count();
    assert_eq!(frames, 2, "each leak says where it was made: {}", r.stderr);
}

#[test]
fn a_snapshot_shows_segments_blocks_and_live_allocations() {
    let f = fixture();
    let path = f.dir.join("snapshot.json");
    let path = path.to_str().unwrap();
    let r = ok(client(
        "gpa",
        &["leak", path],
        &[("CUDAPOOL_TRACK", "2"), ("CUDAPOOL_POOL", "split")],
    ));
    assert_eq!(r.get("snapshot", "snapshot"), "0");
    assert_eq!(r.get("snapshot_null", "snapshot_null"), "1");
    // Check the structure with Python's JSON parser.
    let check = r#"
import json, sys
s = json.load(open(sys.argv[1]))
assert s["pool"] == "split" and s["track"] == 2
d = s["devices"][0]
assert d["device"] == 0 and d["stats"]["allocated_bytes"] == 4 << 20
live = d["allocations"]
assert sorted(a["size"] for a in live) == [1 << 20, 3 << 20], live
assert all(a["origin"] == "pool" and "leaky_helper" in a["backtrace"][0] for a in live), live
segs = d["segments"]
blocks = [b for g in segs for b in g["blocks"]]
assert {b["state"] for b in blocks} <= {"in_use", "pending", "free"}
for g in segs:
    assert sum(b["size"] for b in g["blocks"]) == g["size"], g
in_use = sorted(b["address"] for b in blocks if b["state"] == "in_use")
assert in_use == sorted(a["address"] for a in live), (in_use, live)
assert sum(g["size"] for g in segs) == d["stats"]["reserved_bytes"]
print("snapshot: ok")
"#;
    let r = run_program(&python3(), &["-c", check, path], false, &[]);
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
}

/// docs/design.md, trap 9: what sits at a live process's page path is not trusted. A
/// FIFO there (nobody writes it) must not make `cudapool stat` hang, and `-v` says what was
/// skipped; a link there is not followed.
#[test]
fn stat_skips_what_is_not_a_page_and_never_blocks() {
    let cli = PathBuf::from(env!("CARGO_BIN_EXE_cudapool"));
    // This test process is alive and publishes nothing: plant things at its page path.
    cudapool::base::rundir_find::mine(None).expect("a runtime directory");
    let page = cudapool::report::publish::default_page_path(std::process::id());
    let _ = std::fs::remove_file(&page);
    let c = std::ffi::CString::new(page.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo of a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let mut child = Command::new(&cli)
        .args(["stat", "-v"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let _ = std::fs::remove_file(&page);
    let status = status.expect("cudapool stat hung on a FIFO at a page path");
    let mut out = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut out).unwrap();
    assert!(status.success(), "{out}");
    assert!(
        out.contains(&format!("skipped {}: not a regular file", page.display())),
        "{out}"
    );
    // A link to a page-sized file of ours: not followed either.
    let target = std::env::temp_dir().join(format!("cudapool-link-target-{}", std::process::id()));
    std::fs::write(&target, vec![0u8; 8192]).unwrap();
    std::os::unix::fs::symlink(&target, &page).unwrap();
    let r = run_program(&cli, &["stat", "-v"], false, &[]);
    let _ = std::fs::remove_file(&page);
    let _ = std::fs::remove_file(&target);
    assert!(r.stdout.contains("cannot open"), "{}", r.stdout);
}

#[test]
fn stat_reads_a_running_process_and_it_leaves_nothing_behind() {
    use std::io::{BufRead, BufReader};
    let f = fixture();
    let cli = PathBuf::from(env!("CARGO_BIN_EXE_cudapool"));
    let mut child = Command::new(f.dir.join("client"))
        .args(["dlsym", "hold", "3"])
        .current_dir(&f.dir)
        .env("LD_LIBRARY_PATH", &f.dir)
        .env("LD_PRELOAD", &f.lib)
        .env("CUDAPOOL_MEMORY_LIMIT", "64MiB")
        .env("CUDAPOOL_LOG", "error")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let held: HashMap<String, String> = line
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let page = cudapool::report::publish::default_page_path(pid);
    assert!(page.exists(), "{} published", page.display());

    let r = run_program(&cli, &["stat", &pid.to_string()], false, &[]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let num = |k: &str| held[k].parse::<u64>().unwrap();
    let fmt = cudapool::report::fmt_bytes;
    for want in [
        format!("pid {pid} (client)  pool split"),
        format!("limit 64.00 MiB  cached {}", fmt(num("cached"))),
        format!("    allocated {} (max", fmt(num("allocated"))),
        format!("{} live\n", num("live")),
        format!(
            "    {} allocs  {} frees",
            num("alloc_calls"),
            num("free_calls")
        ),
        format!("{} OOMs", num("ooms")),
    ] {
        assert!(
            r.stdout.contains(&want),
            "want {want:?} in:\n{}\n(C API: {line})",
            r.stdout
        );
    }
    // Every process of this user, and top (twice, quickly).
    let r = run_program(&cli, &["stat"], false, &[]);
    assert!(r.stdout.contains(&format!("pid {pid}")), "{}", r.stdout);
    let r = run_program(
        &cli,
        &["top", "-n", "2", "-d", "0.1", &pid.to_string()],
        false,
        &[],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.stdout.matches(&format!("pid {pid}")).count(), 2);

    assert!(child.wait().unwrap().success());
    assert!(!page.exists(), "the page is removed at exit");
    let r = run_program(&cli, &["stat", &pid.to_string()], false, &[]);
    assert_eq!(r.code, 2);
    assert!(
        r.stderr.contains("no cudapool process with pid"),
        "{}",
        r.stderr
    );
    let r = run_program(&cli, &["stat", "notapid"], false, &[]);
    assert_eq!(r.code, 2);
}

#[test]
fn a_trace_records_memory_over_time_and_plots() {
    let f = fixture();
    let trace = f.dir.join("trace.json");
    let svg = f.dir.join("memory.svg");
    let _ = std::fs::remove_file(&svg);
    let trace_s = trace.to_str().unwrap();
    ok(client(
        "gpa",
        &["limit", "8388608"],
        &[
            ("CUDAPOOL_MEMORY_LIMIT", "64MiB"),
            ("CUDAPOOL_TRACE", trace_s),
        ],
    ));
    let check = r#"
import json, sys
t = json.load(open(sys.argv[1]))
ev = t["traceEvents"]
assert t["otherData"]["dropped_events"] == 0
counters = [e for e in ev if e["ph"] == "C" and e["name"] == "device 0 memory"]
assert counters and all(set(e["args"]) == {"allocated", "reserved", "limit"} for e in counters)
assert max(e["args"]["allocated"] for e in counters) == 64 << 20
assert all(e["args"]["limit"] == 64 << 20 for e in counters)
assert [e["ts"] for e in counters] == sorted(e["ts"] for e in counters)
ooms = [e for e in ev if e["ph"] == "i" and e["name"] == "oom"]
assert len(ooms) == 1 and ooms[0]["args"] == {"device": 0, "bytes": 8 << 20}, ooms
print("trace: ok")
"#;
    let r = run_program(&python3(), &["-c", check, trace_s], false, &[]);
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);

    let cli = PathBuf::from(env!("CARGO_BIN_EXE_cudapool"));
    let r = run_program(
        &cli,
        &["plot", trace_s, "-o", svg.to_str().unwrap()],
        false,
        &[],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let picture = std::fs::read_to_string(&svg).unwrap();
    assert!(picture.starts_with("<svg"), "an SVG picture");
    for label in [
        "device 0",
        "allocated",
        "reserved",
        "limit",
        "OOM",
        "seconds",
    ] {
        assert!(picture.contains(label), "{label} drawn");
    }
    let r = run_program(&cli, &["plot", trace_s, "-o", "x.png"], false, &[]);
    assert_eq!(r.code, 2);
    let r = run_program(&cli, &["plot", "/etc/hostname", "-o", "x.svg"], false, &[]);
    assert_eq!(r.code, 2);
    assert!(r.stderr.contains("not a trace"), "{}", r.stderr);
}

/// The device's default pool tells cudapool's figures (PyTorch's `backend:cudaMallocAsync`
/// reads `torch.cuda.memory_*` there): reserved and used, current and high, are cudapool's
/// reserved and allocated bytes and peaks; resetting a high resets the peaks; a trim to 0 gives
/// the cache back. Another pool keeps the driver's figures. Before: the default pool read 0
/// while 12 MiB were held, and its trim left cudapool's cache in place.
#[test]
fn the_default_pool_tells_cudapools_figures() {
    for mode in MEMAPI_MODES {
        for pool in ["split", "binned", "simple", "none"] {
            let r = memapi(mode, "defaultpool", &[("CUDAPOOL_POOL", pool)]);
            let what = format!("{mode}/{pool}:\n{}\n{}", r.stdout, r.stderr);
            for tag in ["held", "freed_b", "reset", "trimmed"] {
                let n = |k: &str| r.num(tag, k);
                assert_eq!(n("reserved"), n("cp_reserved"), "{tag}: {what}");
                assert_eq!(n("used"), n("cp_allocated"), "{tag}: {what}");
                assert_eq!(n("reserved_high"), n("cp_peak_reserved"), "{tag}: {what}");
                assert_eq!(n("used_high"), n("cp_peak_allocated"), "{tag}: {what}");
            }
            assert_eq!(r.num("held", "used"), 12 * MIB, "{what}");
            assert!(r.num("held", "reserved") >= 12 * MIB, "{what}");
            assert_eq!(r.num("freed_b", "used"), 8 * MIB, "{what}");
            assert_eq!(r.num("freed_b", "used_high"), 12 * MIB, "{what}");
            assert_eq!(
                r.num("reset", "used_high"),
                8 * MIB,
                "{what}: the high reset"
            );
            assert_eq!(
                r.num("reset", "reserved_high"),
                r.num("reset", "reserved"),
                "{what}"
            );
            assert_eq!(r.num("trimmed", "used"), 0, "{what}");
            assert_eq!(
                r.num("trimmed", "reserved"),
                0,
                "{what}: the cache given back"
            );
            assert_eq!(
                r.num("other", "used"),
                3 * MIB,
                "{what}: the driver's figure"
            );
            assert_eq!(
                r.num("other", "reserved"),
                4 * MIB,
                "{what}: the driver's figure"
            );
            assert_eq!(
                r.num("other", "set_bad_rc"),
                1,
                "{what}: the driver's answer"
            );
        }
    }
}

/// `cuMemAllocAsync`/`cuMemFreeAsync` (and `_ptsz`) are served by the pool: counted, limited,
/// reused at once on the freeing stream and never early on another; a capture's allocation
/// goes to the driver (a memory node: charged with its graph, see
/// `graph_memory_counts_against_the_limit`).
#[test]
fn stream_ordered_allocations_are_pooled_ordered_and_limited() {
    for mode in MEMAPI_MODES {
        for pool in ["split", "binned", "simple"] {
            let r = memapi(mode, "async", &[("CUDAPOOL_POOL", pool)]);
            let what = format!("{mode}/{pool}:\n{}\n{}", r.stdout, r.stderr);
            assert_eq!(r.num("held", "allocated"), 3 * MIB, "{what}");
            assert_eq!(r.get("default_stream", "reused"), "1", "{what}");
            assert_eq!(r.get("streams", "other_stream_got_it"), "0", "{what}");
            assert_eq!(r.get("streams", "same_stream_got_it"), "1", "{what}");
            assert_eq!(r.num("pooled", "driver_async_allocs"), 0, "{what}");
            assert_eq!(r.num("freed", "allocated"), 0, "{what}");
            assert_eq!(r.num("limit", "second"), 2, "{what}: OOM at the limit");
            assert_eq!(r.num("capture", "driver_allocs"), 1, "{what}");
            let freed = r.num("freed", "reserved");
            assert_eq!(
                r.num("captured", "reserved"),
                r.num("after_capture", "reserved"),
                "{what}: a memory node is not memory until its graph is uploaded or launched"
            );
            assert!(r.num("captured", "allocated") >= 7 * MIB, "{what}");
            assert!(freed <= 64 * MIB, "{what}");
            assert_eq!(r.num("bad_free", "r"), 1, "{what}: the driver's own answer");
        }
    }
    // `none`: still counted and limited, through cuMemAlloc.
    let r = memapi("gpa", "async", &[("CUDAPOOL_POOL", "none")]);
    assert_eq!(r.num("held", "allocated"), 3 * MIB);
    assert_eq!(r.num("limit", "second"), 2);
}

/// Managed memory, driver pools, physical memory and arrays count against the limit, at what
/// they really take; host memory does not.
#[test]
fn every_other_allocation_api_counts_against_the_limit() {
    for mode in MEMAPI_MODES {
        let r = memapi(mode, "counted", &[]);
        let what = format!("{mode}:\n{}\n{}", r.stdout, r.stderr);
        // managed
        assert_eq!(r.num("managed_held", "allocated"), 40 * MIB, "{what}");
        assert_eq!(r.num("managed", "second"), 2, "{what}");
        assert_eq!(r.num("managed_freed", "reserved"), 0, "{what}");
        // a driver pool: charged what it reserves, idle or not, until trimmed
        assert_eq!(r.num("pool_held", "reserved"), 40 * MIB, "{what}");
        assert_eq!(r.num("pool_held", "allocated"), 40 * MIB, "{what}");
        assert_eq!(r.num("pool", "second"), 2, "{what}");
        assert_eq!(r.num("pool_idle", "allocated"), 0, "{what}");
        assert_eq!(
            r.num("pool_idle", "reserved"),
            40 * MIB,
            "{what}: idle pool memory counts"
        );
        assert_eq!(r.num("pool_trimmed", "reserved"), 0, "{what}");
        assert_eq!(r.num("pool_destroyed", "reserved"), 40 * MIB, "{what}");
        assert_eq!(r.num("pool_gone", "reserved"), 0, "{what}");
        assert_eq!(r.num("default_pool_held", "reserved"), 10 * MIB, "{what}");
        assert_eq!(
            r.num("host_pool_held", "reserved"),
            0,
            "{what}: host pools are not counted"
        );
        // physical memory
        assert_eq!(r.num("vmm_held", "reserved"), 40 * MIB, "{what}");
        assert_eq!(r.num("vmm", "second"), 2, "{what}");
        assert_eq!(
            r.num("vmm_released_mapped", "reserved"),
            40 * MIB,
            "{what}: still mapped"
        );
        assert_eq!(r.num("vmm_unmapped", "reserved"), 0, "{what}");
        assert_eq!(r.num("vmm_host", "reserved"), 0, "{what}");
        // arrays, at the driver's footprint
        let expected = r.num("arrays", "expected");
        assert_eq!(r.num("arrays_held", "reserved"), expected, "{what}");
        assert_eq!(r.num("arrays_held", "device_used"), expected, "{what}");
        assert_eq!(r.num("arrays_big", "r"), 2, "{what}");
        assert_eq!(r.num("arrays_freed", "reserved"), 0, "{what}");
        assert_eq!(r.num("host_held", "reserved"), 0, "{what}");
        assert_eq!(r.num("host_held", "live"), 0, "{what}");
        // What the shim charged is what the device holds, at every step.
        for tag in [
            "managed_held",
            "pool_held",
            "pool_idle",
            "vmm_held",
            "arrays_held",
        ] {
            assert_eq!(
                r.num(tag, "reserved"),
                r.num(tag, "device_used"),
                "{what}: {tag}"
            );
        }
    }
    // Without the driver's help, an array is charged at least its texels.
    let r = memapi("gpa", "counted", &[("FAKECU_NO_ARRAY_REQUIREMENTS", "1")]);
    let mips: u64 = (0..5).map(|l| (1024u64 >> l) * (1024 >> l) * 4).sum();
    let texels = 1000 * 1000 * 4 + 100 * 100 * 100 * 4 + mips;
    assert!(r.num("arrays_held", "reserved") >= texels);
}

/// Graph memory nodes (issue 35): what the driver maps for graphs is charged when a graph is
/// uploaded or launched and counted until trimmed; an ordinary allocation that needs the room
/// gets it by a trim of the graphs' idle memory; a launch that cannot fit is refused with
/// out-of-memory before it runs; a graph without memory nodes is never checked. Every
/// instantiation entry point is followed (`WithFlags`, the 5-argument one, `WithParams`).
#[test]
fn graph_memory_counts_against_the_limit() {
    for mode in MEMAPI_MODES {
        let r = memapi(mode, "graphs", &[]);
        let what = format!("{mode}:\n{}\n{}", r.stdout, r.stderr);
        let at = |tag: &str, key: &str| r.num(tag, key);
        assert_eq!(
            at("instantiated", "reserved"),
            0,
            "{what}: nothing at instantiation"
        );
        assert_eq!(at("uploaded", "graph_reserve"), 40 * MIB, "{what}");
        assert_eq!(
            at("uploaded", "reserved"),
            40 * MIB,
            "{what}: the upload is charged"
        );
        assert_eq!(
            at("launched", "reserved"),
            40 * MIB,
            "{what}: graphs share the reserve"
        );
        assert_eq!(
            at("eager", "graph_reserve"),
            0,
            "{what}: trimmed for the allocation"
        );
        assert!(at("eager", "allocated") >= 30 * MIB, "{what}");
        assert!(at("eager", "reserved") <= 64 * MIB, "{what}");
        assert_eq!(at("relaunched", "graph_reserve"), 40 * MIB, "{what}");
        assert_eq!(
            at("relaunched", "reserved"),
            40 * MIB,
            "{what}: the cache gave way"
        );
        assert_eq!(
            at("trimmed", "reserved"),
            0,
            "{what}: the program's trim followed"
        );
        assert_eq!(at("trimmed", "graph_reserve"), 0, "{what}");
        assert_eq!(r.num("big", "launch"), 2, "{what}: out of memory");
        assert_eq!(r.num("big", "upload"), 2, "{what}: out of memory");
        assert_eq!(
            at("big_refused", "maps"),
            at("trimmed", "maps") + 1,
            "{what}: the refused graph never reached the driver"
        );
        assert_eq!(at("big_refused", "ooms"), 2, "{what}");
        assert_eq!(
            at("big_refused", "reserved"),
            at("big_refused", "graph_reserve"),
            "{what}: the charge follows the driver after the trim that tried to make room"
        );
        for tag in [
            "uploaded",
            "launched",
            "eager",
            "relaunched",
            "big_refused",
            "trimmed",
        ] {
            assert!(
                at(tag, "device_used") <= 64 * MIB,
                "{what}: {tag} over the limit"
            );
            assert!(
                at(tag, "reserved") >= at(tag, "graph_reserve"),
                "{what}: {tag}"
            );
            assert!(
                at(tag, "device_used") <= at(tag, "reserved"),
                "{what}: {tag} uncounted"
            );
        }
    }
}

/// A program that finds the driver only through its own RUNPATH (cudapool, preloaded, cannot
/// open `libcuda.so.1` by name): cudapool uses the driver the program loaded, and counts its
/// allocation. Before: every hooked call returned "not initialized", with no line at any level.
#[test]
fn the_driver_the_program_found_through_its_rpath_is_the_one_cudapool_uses() {
    let f = fixture();
    let rp = f.dir.join("rpath-only");
    let _ = std::fs::remove_dir_all(&rp);
    std::fs::create_dir_all(&rp).unwrap();
    std::fs::copy(f.dir.join("libcuda.so.1"), rp.join("libcuda.so.1")).unwrap();
    std::os::unix::fs::symlink("libcuda.so.1", rp.join("libcuda.so")).unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c");
    let inc = format!("-I{}", src.display());
    let l = format!("-L{}", rp.display());
    let r = format!("-Wl,-rpath,{}", rp.display());
    cc(
        &[
            &inc,
            "-o",
            "rpath",
            src.join("rpath.c").to_str().unwrap(),
            &l,
            "-lcuda",
            &r,
            "-Wl,--enable-new-dtags",
        ],
        &f.dir,
    );
    let out = Command::new(f.dir.join("rpath"))
        .env_remove("LD_LIBRARY_PATH")
        .env("LD_PRELOAD", &f.lib)
        .env("CUDAPOOL_REPORT", "stderr")
        .output()
        .unwrap();
    let (so, se) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(so.contains("rpath rc=0"), "{so}{se}");
    assert!(se.contains("peak 1.00 MiB"), "cudapool counted it: {se}");
}
