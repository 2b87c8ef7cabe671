//! Graph capture: whatever cudapool does on its own behalf (fences, queue retirement, trims,
//! reclaims, growth) leaves a legal program's captures intact, in every capture mode, against
//! a fake driver that enforces CUDA's rules (tests/fake/libcuda_streams.c). The release before
//! these tests queried the capturing and the legacy stream at a pool miss during a capture.

use super::*;

const MODES: [&str; 3] = ["global", "thread_local", "relaxed"];

#[test]
fn captures_survive_whatever_the_pool_does_meanwhile() {
    for (mode, kind, pool, limit) in MODES
        .into_iter()
        .flat_map(|m| ["blocking", "nonblocking"].map(|k| (m, k)))
        .flat_map(|(m, k)| CACHING.map(|p| (m, k, p)))
        .flat_map(|(m, k, p)| ["", "160MiB"].map(|l| (m, k, p, l)))
    {
        let mut env = vec![("CUDAPOOL_POOL", pool)];
        if !limit.is_empty() {
            // Under pressure: the second thread's misses reclaim, and refusals are fine.
            env.push(("CUDAPOOL_MEMORY_LIMIT", limit));
        }
        let r = ok(client("gpa", &["capture", mode, kind], &env));
        let what = format!("{mode}/{kind}/{pool}/limit {limit:?}");
        let c = r.line("capture");
        assert_eq!(
            (
                c["failed"].as_str(),
                c["invalidations"].as_str(),
                c["breaker"].as_str()
            ),
            ("0", "0", "none"),
            "{what}: a capture was broken\n{}\n{}",
            r.stdout,
            r.stderr
        );
        assert_eq!(c["b_errors"], "0", "{what}: {}", r.stderr);
        assert_eq!(c["races"], "0", "{what}: reuse raced device work");
        assert!(
            c["b_steps"].parse::<u64>().unwrap() >= 40,
            "{what}: the second thread worked during the captures"
        );
        let end = r.line("capture_end");
        assert_eq!(
            (end["live"].as_str(), end["allocated"].as_str()),
            ("0", "0"),
            "{what}"
        );
    }
}

#[test]
fn a_program_that_breaks_its_own_capture_gets_the_drivers_error_unchanged() {
    for pool in CACHING {
        let r = ok(client(
            "gpa",
            &["capture_breaks"],
            &[("CUDAPOOL_POOL", pool)],
        ));
        let b = r.line("breaks");
        // 900: not permitted while capturing; 901: the capture was invalidated.
        assert_eq!(
            (
                b["sync"].as_str(),
                b["end"].as_str(),
                b["graph_null"].as_str()
            ),
            ("900", "901", "1"),
            "{pool}"
        );
        assert_eq!(b["reused"], "1", "{pool}: the pool still serves");
        assert!(
            !r.stderr.contains("cudapool:"),
            "{pool}: cudapool adds no line of its own:\n{}",
            r.stderr
        );
    }
}
