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

/// A capture's temporary (allocated and freed by the capturing thread inside the capture, as
/// PyTorch with its cache off does) is named by the graph at every replay: it is neither reused
/// nor given back, whatever `CUDAPOOL_CACHE_IDLE` says (on an H200, giving it back made the
/// graph's replay fail with an illegal address).
#[test]
fn a_block_freed_inside_its_capture_stays_the_graphs() {
    for pool in CACHING {
        for idle in ["100ms", "0", "never"] {
            let r = ok(client(
                "gpa",
                &["capture_free"],
                &[("CUDAPOOL_POOL", pool), ("CUDAPOOL_CACHE_IDLE", idle)],
            ));
            let k = r.line("kept");
            let what = format!("{pool}, CUDAPOOL_CACHE_IDLE={idle}: {}", r.stdout);
            assert_eq!(k["reused"], "0", "{what}");
            for tag in ["during", "after", "reclaimed"] {
                let reserved: u64 = r.line(tag)["reserved"].parse().unwrap();
                assert!(reserved >= 128 << 20, "{tag}: {what}");
            }
        }
    }
}
