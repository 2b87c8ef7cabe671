//! Giving back what the program gives back (`CUDAPOOL_CACHE_IDLE`, docs/design.md): with
//! cudapool's defaults, memory a program frees with no allocation following is back with the
//! driver when the free returns; a loop that frees and allocates again keeps its block cached;
//! what nothing reuses goes back once the process has been idle a window.

use super::common::members::Member;
use super::common::*;

const MB64: u64 = 64 << 20;

#[test]
fn memory_a_program_gives_back_is_the_drivers_again_when_the_free_returns() {
    // cudapool's default (an empty value is unset): four blocks freed one after another.
    let mut m = Member::start(
        &["cache", "4", &MB64.to_string()],
        &[("CUDAPOOL_CACHE_IDLE", "")],
    );
    let c = m.line("cached");
    assert_eq!(c["reserved"], "0", "{c:?}");
    assert_eq!(c["cached"], "0", "{c:?}");
    assert_eq!(c["driver_frees"], c["driver_allocs"], "{c:?}");
    assert_eq!(m.finish(), 0);
    // Kept until pressure, as before this setting.
    let mut m = Member::start(
        &["cache", "4", &MB64.to_string()],
        &[("CUDAPOOL_CACHE_IDLE", "never")],
    );
    assert_eq!(m.num("cached", "reserved"), 4 * MB64);
    assert_eq!(m.finish(), 0);
}

#[test]
fn a_loop_keeps_its_block_and_an_idle_process_gives_it_back_after_a_window() {
    let r = ok(client(
        "dlsym",
        &["churn", "50", &MB64.to_string(), "10000"],
        &[("CUDAPOOL_CACHE_IDLE", "200ms")],
    ));
    let c = r.line("churned");
    // The first rounds find the cache cold and go back; then the block stays.
    let allocs: u64 = c["driver_allocs"].parse().unwrap();
    assert!(allocs <= 10, "{}", r.stdout);
    assert_eq!(c["reserved"], MB64.to_string(), "{}", r.stdout);
    assert!(c["hits"].parse::<u64>().unwrap() >= 40, "{}", r.stdout);
    // Idle, it goes back within a window and a tick of the idle thread (the client waits up
    // to 10 s: a loaded machine may be slow, but never that slow).
    let a = r.line("rested");
    assert_eq!(a["reserved"], "0", "{}", r.stdout);
    assert_eq!(a["driver_frees"], a["driver_allocs"], "{}", r.stdout);
    // Never: the block stays.
    let r = ok(client(
        "dlsym",
        &["churn", "50", &MB64.to_string(), "300"],
        &[("CUDAPOOL_CACHE_IDLE", "never")],
    ));
    assert_eq!(
        r.line("rested")["reserved"],
        MB64.to_string(),
        "{}",
        r.stdout
    );
}

/// A panic inside cudapool (a bug of its own; injected into an allocation by the debug build's
/// `cudapool_debug_panic_next`): that call fails with `CUDA_ERROR_UNKNOWN`, one line through
/// cudapool's logger says what panicked and where (no standard-library message), the stats
/// count it, and the next allocation goes to the driver directly: it does not get the cached
/// block a pooled one gets (with no panic, the second allocation is a cache hit). [Before: a panic became
/// `CUDA_ERROR_UNKNOWN` and nothing else, and the pool it left went on serving.]
#[test]
fn a_panic_is_said_counted_and_later_allocations_go_to_the_driver() {
    // Expandable segments: a 4 MiB block has a segment of its own (classic ones hold several,
    // so the third allocation would be a hit either way).
    let env = [
        ("CUDAPOOL_CACHE_IDLE", "never"),
        ("CUDAPOOL_SEGMENTS", "expandable"),
    ];
    let calm = ok(client("gpa", &["panic_once", "none"], &env));
    let s = calm.line("panic stats");
    assert_eq!(
        (&s["panics"][..], &s["hits"][..]),
        ("0", "1"),
        "{}",
        calm.stdout
    );
    let r = client("gpa", &["panic_once"], &env);
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("alloc 0 rc=0"), "{}", r.stdout);
    assert!(r.stdout.contains("alloc 1 rc=999"), "{}", r.stdout);
    assert!(
        r.stdout.contains("alloc 2 rc=0") && r.stdout.contains("free 2 rc=0"),
        "{}",
        r.stdout
    );
    let s = r.line("panic stats");
    assert_eq!(s["r"], "0", "{}", r.stdout);
    assert_eq!(s["panics"], "1", "{}", r.stdout);
    assert_eq!(
        s["reused"], "0",
        "the driver's, not the cached block: {}",
        r.stdout
    );
    let said: Vec<&str> = r
        .stderr
        .lines()
        .filter(|l| l.contains("internal error"))
        .collect();
    assert_eq!(said.len(), 1, "{}", r.stderr);
    assert!(
        said[0].contains("a panic injected by a test") && said[0].contains("src/state/pooled.rs:"),
        "{}",
        r.stderr
    );
    assert!(
        !r.stderr.contains("panicked at"),
        "no standard-library message: {}",
        r.stderr
    );
}
