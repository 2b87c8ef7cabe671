//! Unit tests of the report's own formats.

use super::*;

#[test]
fn json_strings_are_escaped() {
    assert_eq!(json_str("a\"b\\c\n\u{1}"), "\"a\\\"b\\\\c\\n\\u0001\"");
}

#[test]
fn byte_formatting() {
    assert_eq!(fmt_bytes(0), "0 B");
    assert_eq!(fmt_bytes(1023), "1023 B");
    assert_eq!(fmt_bytes(1536), "1.50 KiB");
    assert_eq!(fmt_bytes(64 << 20), "64.00 MiB");
    assert_eq!(fmt_bytes(3 << 30), "3.00 GiB");
}

#[test]
fn device_block_shows_every_counter() {
    let s = DeviceStats {
        allocated: 1 << 20,
        requested: 1000 << 10,
        alloc_calls: 4,
        cache_hits: 1,
        ooms: 2,
        hard_limit: 1 << 30,
        ..Default::default()
    };
    let t = device_status(0, &s, "what it counts");
    assert!(t.contains("limit 1.00 GiB (soft none)"), "{t}");
    assert!(t.contains("requested 1000.00 KiB"), "{t}");
    assert!(
        t.contains("4 allocations and 0 frees")
            && t.contains("(25.0%)")
            && t.contains("2 out-of-memory answers"),
        "{t}"
    );
}

#[test]
fn the_sleep_line_says_since_when_and_why() {
    use crate::state::sleep::{Cause, State};
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let mut s = DeviceStats {
        asleep: 512 << 20,
        sleep_state: State::Asleep as u64,
        sleep_cause: Cause::Asked as u64,
        asleep_since_ns: now - 3_000_000_000,
        ..Default::default()
    };
    let line = sleep_line(&s).unwrap();
    assert!(
        line.starts_with("asleep: 512.00 MiB on the host; for 3."),
        "{line}"
    );
    assert!(
        line.ends_with(": asked from outside (cudapool sleep)"),
        "{line}"
    );
    // A page that does not say (an older process's): no reason made up.
    s.asleep_since_ns = 0;
    assert_eq!(sleep_line(&s).unwrap(), "asleep: 512.00 MiB on the host");
    s.sleep_state = State::Awake as u64;
    s.asleep = 0;
    assert_eq!(sleep_line(&s), None);
}
