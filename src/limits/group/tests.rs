//! The group's unit tests: lending, a fixed limit, a cut ledger.

use super::*;

/// A member asked to lend before its lending thread first ran (a busy machine starts a
/// thread late) still answers: before, that thread began from the request count it found,
/// missed the one already made, and the asker was refused after its wait (seen as a flaky
/// `a_sleeping_members_idle_cache_is_lent_to_another` under load).
#[test]
fn a_request_made_before_the_lending_thread_runs_is_served() {
    let dir = std::env::temp_dir().join(format!("cudapool-group-late-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let a = Group::join("late", Some(&dir), None).expect("a joins");
    let b = Group::join("late", Some(&dir), None).expect("b joins");
    let uuid = [7; 16];
    let da = a.device(uuid, Some(64 << 20), false).expect("a's device");
    let db = b.device(uuid, Some(64 << 20), false).expect("b's device");
    assert!(da.try_reserve(48 << 20), "a caches 48 MiB");
    let asker =
        std::thread::spawn(move || db.group.borrow(db.slot, 32 << 20, Duration::from_secs(3)));
    // The request is made (and its wake lost) before a's thread exists.
    let pending = || {
        let l = a.lock().expect("the ledger");
        let m = &l.members[a.me];
        m.request.load(Ordering::Acquire) != m.served.load(Ordering::Acquire)
    };
    let asked = Instant::now();
    while !pending() {
        assert!(asked.elapsed() < Duration::from_secs(3), "b never asked");
        std::thread::sleep(Duration::from_millis(1));
    }
    let lender = da.clone();
    a.serve(Box::new(move |_: &[u8; 16], bytes: u64| {
        lender.release(bytes);
        bytes
    }));
    assert!(asker.join().unwrap(), "a's idle cache was lent to b");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The mandatory mode's limit is the member's own (the job's share): an edit of the limit
/// in the ledger, which the user can write, raises nothing (issue 54, case 3).
#[test]
fn a_fixed_limit_holds_whatever_the_ledger_says() {
    let dir = std::env::temp_dir().join(format!("cudapool-group-fixed-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let a = Group::join("fixed", Some(&dir), None).expect("a joins");
    let da = a.device([3; 16], Some(64 << 20), true).expect("a's device");
    assert!(da.try_reserve(64 << 20));
    assert!(!da.try_reserve(1), "held to 64 MiB");
    for edit in [0, u64::MAX >> 8, 1 << 40] {
        a.lock().expect("the ledger").devices[da.slot].limit = edit;
        assert!(!da.try_reserve(8 << 20), "an edit to {edit} raises nothing");
        assert_eq!(da.limit().bytes(), Some(64 << 20));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A ledger cut to 0 bytes under its members costs the file, never a process: each member
/// sizes it, maps it again and records its own share again, so the limit still holds
/// (issue 54, case 8; before: SIGBUS, exit 135).
#[test]
fn a_cut_ledger_is_rebuilt_and_still_holds_the_limit() {
    let dir = std::env::temp_dir().join(format!("cudapool-group-cut-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let a = Group::join("cut", Some(&dir), None).expect("a joins");
    let da = a
        .device([4; 16], Some(64 << 20), false)
        .expect("a's device");
    assert!(da.try_reserve(48 << 20));
    let file = dir.join(ledger::file_name("cut"));
    std::fs::OpenOptions::new()
        .write(true)
        .open(&file)
        .unwrap()
        .set_len(0)
        .unwrap();
    // A raw touch of the mapping past the cut: zero pages, not a SIGBUS.
    // SAFETY: our own mapping; the magic is an atomic.
    let magic = unsafe { (*a.map.ledger).magic.load(Ordering::Acquire) };
    assert_eq!(magic, 0, "the cut mapping reads zero pages");
    assert_eq!(
        da.room(),
        16 << 20,
        "rebuilt, with a's 48 MiB recorded again"
    );
    assert!(!da.try_reserve(32 << 20), "still held to 64 MiB");
    assert!(da.try_reserve(16 << 20));
    assert_eq!(
        std::fs::metadata(&file).unwrap().len() as usize,
        ledger::ledger_bytes()
    );
    let _ = std::fs::remove_dir_all(&dir);
}
