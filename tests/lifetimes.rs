//! The program's handles are the program's (docs/design.md, trap 10): the whole library under
//! `LD_PRELOAD`, against the fake driver, which aborts when a destroyed stream, event or context
//! reaches it (the real driver crashes). The program destroys streams and contexts on one
//! thread while others free, allocate and reclaim; host callbacks free and destroy from the
//! driver's own thread. Every scenario runs for every caching pool kind and every way in
//! (linked, dlsym, cuGetProcAddress with and without per-thread streams), as many times in a row
//! as `CPTEST_REPEAT` says (default 3; the closing figures use 50).
//!
//! And the driver's errors, injected with `CUDAPOOL_FAULTS`: the program gets the driver's
//! answer, no block is lost, the counters stay true, and the next call works.

mod common;
use common::*;

fn repeat() -> usize {
    std::env::var("CPTEST_REPEAT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
}

/// Runs `args` for every caching kind and way in, `repeat()` times each; checks that nothing
/// crashed, that `tag`'s line has `errors=0` and `races=0`, and that at the end nothing is
/// allocated and what the shim reserves is what the driver holds. Returns one run's output.
fn everywhere(args: &[&str], tag: &str) -> Run {
    let mut last = None;
    for _ in 0..repeat() {
        for mode in all_modes() {
            for pool in CACHING {
                let r = client(mode, args, &[("CUDAPOOL_POOL", pool)]);
                let what = format!("{args:?} {mode}/{pool}");
                assert_eq!(r.code, 0, "{what} crashed:\n{}\n{}", r.stdout, r.stderr);
                let line = r.line(tag);
                for key in ["errors", "races"] {
                    if let Some(v) = line.get(key) {
                        assert_eq!(v, "0", "{what}: {key}\n{}\n{}", r.stdout, r.stderr);
                    }
                }
                let end = format!("{tag}_end");
                assert_eq!(r.num(&end, "allocated"), 0, "{what}: {}", r.stdout);
                assert_eq!(r.num(&end, "live"), 0, "{what}: {}", r.stdout);
                assert_eq!(
                    r.num(&end, "reserved"),
                    r.num(&format!("{end}_driver"), "used"),
                    "{what}: reserved is what the driver holds\n{}",
                    r.stdout
                );
                last = Some(r);
            }
        }
    }
    last.expect("at least one run")
}

#[test]
fn the_fake_driver_aborts_on_a_destroyed_handle() {
    // The check every test below relies on: without the shim, a program that uses a stream it
    // destroyed is stopped, with the call named.
    let f = fixture();
    for what in ["stream", "event", "context"] {
        let r = run_program(
            &f.dir.join("client"),
            &["dlsym", "misuse", what],
            false,
            &[],
        );
        assert_ne!(r.code, 0, "{what}: {}", r.stdout);
        assert!(
            r.stderr.contains(&format!("was passed a destroyed {what}")),
            "{what}: {}",
            r.stderr
        );
    }
}

#[test]
fn streams_destroyed_on_one_thread_while_others_free() {
    // NVIDIA's simpleCallback in miniature: 8 threads, half destroy their stream while the
    // other half free, 200 rounds.
    let r = everywhere(&["streams-die", "200", "8"], "streams_die");
    assert_eq!(r.get("streams_die", "rounds"), "200");
}

#[test]
fn a_stream_destroyed_while_its_blocks_wait_for_their_fence() {
    let r = everywhere(&["stream-fenced"], "stream_fenced");
    assert_eq!(
        r.get("stream_fenced", "reused_while_busy"),
        "0",
        "{}",
        r.stdout
    );
}

#[test]
fn contexts_destroyed_or_reset_while_other_threads_free_and_reclaim() {
    let r = everywhere(&["ctx-die", "60"], "ctx_die");
    assert_eq!(r.get("ctx_die", "end_errors"), "0", "{}", r.stdout);
}

#[test]
fn host_callbacks_free_and_destroy_from_the_drivers_thread() {
    let r = everywhere(&["callbacks", "100", "4"], "callbacks");
    assert_eq!(r.get("callbacks", "done"), "400", "{}", r.stdout);
}

// ---- injected faults -------------------------------------------------------------------------

/// Runs the `faults` scenario `which` with `CUDAPOOL_FAULTS=faults` for every caching kind
/// (through dlsym and cuGetProcAddress); checks that the faults fired (the shim logs each), that
/// nothing crashed, and the end figures.
fn faulty(which: &str, faults: &str, fired: usize) -> Vec<(&'static str, Run)> {
    let mut out = Vec::new();
    for mode in ["dlsym", "gpa"] {
        for pool in CACHING {
            let faults = expandable_faults(pool, faults);
            let env = [
                ("CUDAPOOL_POOL", pool),
                ("CUDAPOOL_FAULTS", &faults),
                ("CUDAPOOL_LOG", "info"),
            ];
            let r = client(mode, &["faults", which], &env);
            let what = format!("{which} {mode}/{pool}");
            assert_eq!(r.code, 0, "{what}:\n{}\n{}", r.stdout, r.stderr);
            let injected = r.stderr.matches("injected fault").count();
            assert_eq!(injected, fired, "{what}: faults fired\n{}", r.stderr);
            assert_eq!(r.num("faults_end", "allocated"), 0, "{what}: {}", r.stdout);
            assert_eq!(r.num("faults_end", "live"), 0, "{what}");
            assert_eq!(r.num("faults_end", "reserved"), 0, "{what}: nothing lost");
            assert_eq!(
                r.num("faults_end_driver", "used"),
                0,
                "{what}: nothing leaked"
            );
            if let Some(races) = r.line("faults").get("races") {
                assert_eq!(races, "0", "{what}: {}", r.stdout);
            }
            out.push((pool, r));
        }
    }
    out
}

/// With expandable segments (the default; the suite's second run is classic), `split` maps its large blocks: the fault
/// meant for a segment's allocation hits the mapping of the same block (24 MiB blocks, 2 MiB
/// chunks: the third block's first chunk is the 25th), a segment's free the first chunk unmapped.
fn expandable_faults(pool: &str, faults: &str) -> String {
    let expandable = !std::env::var("CPTEST_SEGMENTS").is_ok_and(|m| m == "classic");
    match faults {
        "cuMemAlloc_v2@3" if expandable && pool == "split" => "cuMemCreate@5".into(),
        "cuMemFree_v2@1" if expandable && pool == "split" => "cuMemUnmap@1".into(),
        other => other.into(),
    }
}

#[test]
fn a_failed_driver_allocation_reaches_the_program_and_the_next_one_works() {
    for (pool, r) in faulty("alloc", "cuMemAlloc_v2@3", 1) {
        let rcs: Vec<u32> = r
            .get("faults", "rcs")
            .split(',')
            .map(|c| c.parse().unwrap())
            .collect();
        let ooms = rcs.iter().filter(|&&c| c == 2).count() as u64;
        assert!(
            rcs.iter().all(|&c| c == 0 || c == 2),
            "{pool}: only out of memory: {rcs:?}"
        );
        // split and simple ask the driver for the request's own size: the program sees the
        // error. binned asks for its size class first and the request's size after a refusal:
        // the program may get its block anyway.
        if pool != "binned" {
            assert_eq!(rcs, [0, 0, 2, 0, 0], "{pool}");
        }
        let held = r.line("faults_held");
        assert_eq!(held["ooms"].parse::<u64>().unwrap(), ooms, "{pool}");
        assert_eq!(held["live"].parse::<u64>().unwrap(), 5 - ooms, "{pool}");
        let num = |k: &str| held[k].parse::<u64>().unwrap();
        assert_eq!(
            num("requested"),
            (5 - ooms) * 24 * MIB,
            "{pool}: the counters hold what the program holds"
        );
        // binned hands out its 32 MiB class when the driver granted it.
        let most = if pool == "binned" { 32 * MIB } else { 24 * MIB };
        assert!(
            (num("requested")..=(5 - ooms) * most).contains(&num("allocated")),
            "{pool}: {held:?}"
        );
        assert_eq!(
            held["reserved"],
            r.get("faults_held_driver", "used"),
            "{pool}: reserved is what the driver holds"
        );
        assert_eq!(r.get("faults", "again"), "0", "{pool}: the next call works");
    }
}

#[test]
fn fences_that_fail_to_record_or_answer_keep_their_blocks_safe_and_lose_none() {
    // The first 40 fence events fail to record: the freed blocks wait, then come back.
    faulty("record", "cuEventRecord@1-40", 40);
    // The first 100 queries fail: a fence with an unknown state is not done.
    faulty("query", "cuEventQuery@1-100=999", 100);
}

#[test]
fn a_new_queue_that_cannot_wait_on_the_device_waits_on_the_host() {
    for (pool, r) in faulty("wait", "cuStreamWaitEvent@1", 1) {
        // The block was reused at once (one queue) and the long kernel still read it when the
        // second stream's first work wrote it: without a wait somewhere, that races.
        assert_eq!(r.get("faults", "reused"), "1", "{pool}: {}", r.stdout);
    }
}

#[test]
fn a_segment_the_driver_refuses_to_free_stays_counted_until_it_goes() {
    for (pool, r) in faulty("free", "cuMemFree_v2@1", 1) {
        let first = r.line("faults_first_reclaim");
        assert_eq!(first["segments"], "1", "{pool}: one segment refused");
        assert_eq!(
            first["reserved"],
            r.get("faults_first_reclaim_driver", "used"),
            "{pool}: still counted, still held"
        );
    }
}

#[test]
fn a_fault_naming_a_call_cudapool_never_makes_fails_closed() {
    let r = client(
        "dlsym",
        &["basic"],
        &[("CUDAPOOL_FAULTS", "cuNoSuchThing@1")],
    );
    assert_ne!(r.code, 0);
    assert!(
        r.stderr
            .contains("invalid CUDAPOOL_FAULTS=\"cuNoSuchThing@1\": cudapool never calls"),
        "{}",
        r.stderr
    );
}
