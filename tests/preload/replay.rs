//! `cudapool replay` (issue 50): each input it reads, replayed through the pool kinds, with
//! figures checked against what the trace holds; bad input refused with the line.

use super::common::*;
use super::python3;
use std::path::PathBuf;

fn cli() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_cudapool"))
}

/// The `--json` lines of a replay: (pool, segments, peak reserved, peak allocated, recorded).
fn replay(args: &[&str]) -> Vec<serde_json::Value> {
    let r = run_program(&cli(), args, false, &[]);
    assert_eq!(r.code, 0, "{args:?}: {}{}", r.stdout, r.stderr);
    r.stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object a line"))
        .collect()
}

fn num(v: &serde_json::Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or_else(|| panic!("{k} in {v}"))
}

/// A plain trace: every caching kind (split both ways), the peak allocated being the trace's
/// own, never more reserved than a kind could need, the header's recorded peak passed on; a
/// limit is obeyed.
#[test]
fn a_plain_trace_replays_through_every_kind() {
    let dir = fixture().dir.join("replay-plain");
    std::fs::create_dir_all(&dir).unwrap();
    let mut text = String::from("# job max_reserved 123456789 max_alloc 1\n");
    // Ten rounds of a 30 MiB and a 3 MiB block beside a 100 MiB one held throughout.
    text.push_str("a 0 104857600\n");
    for i in 0..10 {
        text.push_str(&format!(
            "a {} 31457280\na {} 3145728\n",
            2 * i + 1,
            2 * i + 2
        ));
        text.push_str(&format!("f {}\nf {}\n", 2 * i + 1, 2 * i + 2));
    }
    let file = dir.join("t.ops");
    std::fs::write(&file, text).unwrap();
    let rows = replay(&["replay", "--json", file.to_str().unwrap()]);
    let kinds: Vec<String> = rows
        .iter()
        .map(|r| format!("{} {}", r["pool"], r["segments"]))
        .collect();
    assert_eq!(
        kinds,
        [
            "\"split\" \"expandable\"",
            "\"split\" \"classic\"",
            "\"binned\" \"classic\"",
            "\"simple\" \"classic\""
        ]
    );
    for r in &rows {
        assert_eq!(num(r, "peak_allocated_bytes"), (100 + 30 + 3) << 20, "{r}");
        assert!(num(r, "peak_reserved_bytes") >= (100 + 30 + 3) << 20, "{r}");
        assert!(num(r, "peak_reserved_bytes") <= 256 << 20, "{r}");
        assert_eq!(num(r, "recorded_reserved_bytes"), 123456789);
        assert_eq!(num(r, "allocations"), 21);
    }
    let limited = replay(&[
        "replay",
        "--json",
        "--pool",
        "split",
        "--segments",
        "expandable",
        "--limit",
        "140MiB",
        file.to_str().unwrap(),
    ]);
    assert_eq!(limited.len(), 1);
    assert_eq!(num(&limited[0], "ooms"), 0, "{}", limited[0]);
    assert!(num(&limited[0], "peak_reserved_bytes") <= 140 << 20);
    assert_eq!(num(&limited[0], "limit_bytes"), 140 << 20);
}

/// PyTorch's snapshot with history: a block freed that the history never saw allocated, and
/// one alive at the snapshot from before it, count from the start; PyTorch's reserved peak is
/// rebuilt from its segment events. A `CUDAPOOL_TRACE` written with `CUDAPOOL_HISTORY`
/// replays the program's own allocations.
#[test]
fn a_pytorch_snapshot_and_a_cudapool_trace_replay() {
    let dir = fixture().dir.join("replay-snap");
    std::fs::create_dir_all(&dir).unwrap();
    let snap = dir.join("s.pickle");
    let make = r#"
import pickle, sys
M = 1 << 20
ev = [
    {"action": "segment_map", "addr": 0x1000000, "size": 64 * M},
    {"action": "alloc", "addr": 0x1000000, "size": 10 * M},
    {"action": "free_requested", "addr": 0x9000000, "size": 20 * M},
    {"action": "free_completed", "addr": 0x9000000, "size": 20 * M},
    {"action": "alloc", "addr": 0x2000000, "size": 30 * M},
    {"action": "free_requested", "addr": 0x1000000, "size": 10 * M},
    {"action": "segment_unmap", "addr": 0x1000000, "size": 8 * M},
]
seg = {"device": 0, "address": 0x7000000, "total_size": 200 * M, "blocks": [
    {"address": 0x7000000, "size": 5 * M, "requested_size": 5 * M, "state": "active_allocated"},
    {"address": 0x7500000, "size": 195 * M, "state": "inactive"},
]}
pickle.dump({"segments": [seg], "device_traces": [ev]}, open(sys.argv[1], "wb"))
"#;
    let r = run_program(
        &python3(),
        &["-c", make, snap.to_str().unwrap()],
        false,
        &[],
    );
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let rows = replay(&[
        "replay",
        "--json",
        "--pool",
        "simple",
        snap.to_str().unwrap(),
    ]);
    assert_eq!(rows.len(), 1);
    // Alive from before: the 20 MiB (freed in the history) and the 5 MiB (at the snapshot).
    // Peak: 20 + 5 + 10 at first, then 5 + 10 + 30 = 45 MiB.
    assert_eq!(
        num(&rows[0], "peak_allocated_bytes"),
        45 << 20,
        "{}",
        rows[0]
    );
    // Reserved: 200 MiB at the end, 56 MiB added by the events (64 mapped, 8 unmapped), so
    // 144 at the start and 208 at the peak.
    assert_eq!(num(&rows[0], "recorded_reserved_bytes"), 208 << 20);

    let trace = dir.join("trace.json");
    ok(client(
        "gpa",
        &["limit", "8388608"],
        &[
            ("CUDAPOOL_MEMORY_LIMIT", "64MiB"),
            ("CUDAPOOL_TRACE", trace.to_str().unwrap()),
            ("CUDAPOOL_HISTORY", "1000"),
        ],
    ));
    let rows = replay(&[
        "replay",
        "--json",
        "--pool",
        "split",
        trace.to_str().unwrap(),
    ]);
    assert_eq!(rows.len(), 2, "split, both ways");
    for r in &rows {
        assert!(
            num(r, "allocations") >= 8,
            "eight 8 MiB buffers at least: {r}"
        );
        assert_eq!(num(r, "peak_allocated_bytes"), 64 << 20, "{r}");
    }
}

/// What cannot be replayed is refused with exit 2 and names the file and the line.
#[test]
fn what_is_no_trace_is_refused_with_its_line() {
    let dir = fixture().dir.join("replay-bad");
    std::fs::create_dir_all(&dir).unwrap();
    for (text, want) in [
        ("a 1 100\nf 2\n", "line 2: a free of an ID not allocated"),
        ("a 1 x\n", "line 1: not a number"),
        ("# nothing\n", "no allocation in it"),
        (
            "{\"traceEvents\": []}",
            "write the trace with CUDAPOOL_HISTORY",
        ),
    ] {
        let file = dir.join("bad.ops");
        std::fs::write(&file, text).unwrap();
        let r = run_program(&cli(), &["replay", file.to_str().unwrap()], false, &[]);
        assert_eq!(r.code, 2, "{text:?}: {}{}", r.stdout, r.stderr);
        assert!(
            r.stderr.contains(want),
            "{text:?}: want {want:?} in {}",
            r.stderr
        );
        assert!(r.stderr.contains("bad.ops"), "{}", r.stderr);
    }
    // Expandable segments are split's only, as for CUDAPOOL_SEGMENTS.
    let file = dir.join("good.ops");
    std::fs::write(&file, "a 1 4096\nf 1\n").unwrap();
    let args = ["replay", "--pool", "binned", "--segments", "expandable"];
    let r = run_program(
        &cli(),
        &[&args[..], &[file.to_str().unwrap()]].concat(),
        false,
        &[],
    );
    assert_eq!(r.code, 2, "{}{}", r.stdout, r.stderr);
    assert!(r.stderr.contains("split's only"), "{}", r.stderr);
}

/// A recorded training trace (BERT's, PyTorch's cache off: 30,741 allocations) played through
/// the whole library against the fake's lagging device, each block used by a kernel on one of
/// two queues in turn (the legacy stream and a non-blocking one, as a job's compute stream and
/// NCCL's) and freed with `cuMemFree`, which names no stream: a block freed while a kernel of
/// the other queue may still use it is not handed out before that kernel ends, so the race
/// detector finds nothing, with both kinds of segments; with reuse on the spot
/// (`CUDAPOOL_REUSE=immediate`) it does, so the check bites. Everything is given back at the end.
#[test]
fn a_recorded_trace_on_two_queues_through_the_whole_library_races_nothing() {
    let trace = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/benches/traces/bert.cudapool.ops"
    );
    let run = |segments: &str, reuse: Option<&str>| {
        let mut env = vec![
            ("FAKECU_TOTAL_MEM", "17179869184"),
            ("FAKECU_DEVICES", "1"),
            ("CUDAPOOL_SEGMENTS", segments),
        ];
        if let Some(r) = reuse {
            env.push(("CUDAPOOL_REUSE", r));
        }
        ok(client("link", &["trace", trace, "2", "20", "1"], &env))
    };
    for segments in ["expandable", "classic"] {
        let r = run(segments, None);
        let what = format!("{segments}:\n{}\n{}", r.stdout, r.stderr);
        assert_eq!(r.num("trace", "ops"), 30_741, "{what}");
        assert_eq!(r.get("trace", "races"), "0", "{what}");
        assert_eq!(r.num("trace_end", "allocated"), 0, "{what}");
        assert_eq!(r.num("trace_end", "ooms"), 0, "{what}");
    }
    let r = run("expandable", Some("immediate"));
    assert!(
        r.num("trace", "races") > 0,
        "reuse on the spot must race on two queues:\n{}",
        r.stdout
    );
}

/// A training job's steady steps cost the pool no driver call and no walk beyond its free lists:
/// over the second half of each recorded job (BERT and GPT-2, as PyTorch's cache and as cudapool
/// saw them), every allocation is served from the cache and nothing is mapped, unmapped or made.
/// A build whose freed memory moves between places each step, so that the next step's same
/// request misses, fails here: the stitching build of issue 61 with 2 MiB handles missed 20
/// times over bert.torch's half and cost Llama 3.6 % of its step (docs/gpu/models/stitch-h200.md,
/// run 8). Such a build changes this test together with a GPU A/B of its speed.
#[test]
fn a_recorded_jobs_steady_steps_all_hit_the_cache() {
    for name in ["bert.torch", "bert.cudapool", "gpt2.torch", "gpt2.cudapool"] {
        let trace = format!("{}/benches/traces/{name}.ops", env!("CARGO_MANIFEST_DIR"));
        let env = [("FAKECU_TOTAL_MEM", "68719476736"), ("FAKECU_DEVICES", "1")];
        let r = ok(client("link", &["trace", &trace, "1", "20", "0"], &env));
        let what = format!("{name}:\n{}\n{}", r.stdout, r.stderr);
        for key in ["misses", "maps", "unmaps", "creates", "access"] {
            assert_eq!(r.get("trace_steady", key), "0", "{key} in {what}");
        }
        assert!(r.num("trace_end", "driver_allocs") > 0, "{what}");
    }
}
