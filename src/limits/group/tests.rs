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

/// A suspend posted through the ledger's file by a process that is no member (`relay`, as a
/// job's batch shell does from its signal handler) reaches a member: it is seen as suspended
/// while the poster lives, each member's thread is woken once per posting, and a clear ends it.
/// A file that is not a whole ledger of this version is left alone.
#[test]
fn a_suspend_relayed_through_the_file_reaches_the_members() {
    use std::sync::atomic::AtomicUsize;
    let dir = std::env::temp_dir().join(format!("cudapool-group-suspend-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let a = Group::join("held", Some(&dir), None).expect("a joins");
    let suspends = Arc::new(AtomicUsize::new(0));
    struct Counts(Arc<AtomicUsize>);
    impl Lender for Counts {
        fn lend(&self, _: &[u8; 16], _: u64) -> u64 {
            0
        }
        fn suspend(&self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    a.serve(Box::new(Counts(suspends.clone())));
    let (rundir, _) = crate::base::rundir_find::mine(Some(&dir)).unwrap();
    let path = std::ffi::CString::new(
        rundir
            .file(&ledger::file_name("held"))
            .into_os_string()
            .into_encoded_bytes(),
    )
    .unwrap();
    assert!(!a.suspended());
    // A living poster that is no member (this test's parent, say): pid 1 lives always.
    assert!(relay_suspend(&path, 1));
    assert_eq!(a.suspended_by(), 1);
    let woken = Instant::now();
    while suspends.load(Ordering::SeqCst) == 0 {
        assert!(
            woken.elapsed() < Duration::from_secs(3),
            "the member's thread was not woken"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(relay_suspend(&path, 0));
    assert!(!a.suspended(), "a clear ends it");
    // A poster that died resumes nobody.
    let dead = std::process::Command::new("true").spawn().unwrap();
    let pid = dead.id();
    dead.wait_with_output().unwrap();
    assert!(relay_suspend(&path, pid));
    assert!(!a.suspended(), "a dead poster holds no one");
    assert_eq!(suspends.load(Ordering::SeqCst), 1, "one posting, one sleep");
    let short = dir.join("short");
    std::fs::write(&short, b"CPGROUP").unwrap();
    let short = std::ffi::CString::new(short.into_os_string().into_encoded_bytes()).unwrap();
    assert!(!relay_suspend(&short, 1), "not a whole ledger: left alone");
    let _ = std::fs::remove_dir_all(&dir);
}
