//! How a group's joiner waits at its ledger's door and mutex (issue 23's groups, under load):
//! a crowd that keeps passing is waited for, a holder that goes on (runs or sleeps, starved of
//! CPU) is waited for longer, a stopped one is given up on after 10 s with one line that names
//! it. Real processes: the C test client under `LD_PRELOAD` against the fake driver, and
//! holders forked by the test.

mod common;
use common::members::*;
use common::*;

/// The group's first member: it makes the ledger and stays, parked, until dropped (its last
/// member takes the ledger when it exits).
fn first_member(g: &Group) -> Member {
    let mut first = Member::start(
        &["park", "1", &MB8.to_string()],
        &env_of(&in_group(g, "64MiB")),
    );
    first.line("parked");
    first
}

/// Takes (`F_WRLCK`) or lets go (`F_UNLCK`) of one byte of `f` as an open file description: the
/// lock a joiner holds on the ledger's door.
fn door_lock(f: &std::fs::File, at: usize, kind: libc::c_int) {
    use std::os::fd::AsRawFd;
    // SAFETY: zero is a valid flock; the fields that matter are set below.
    let mut l: libc::flock = unsafe { std::mem::zeroed() };
    l.l_type = kind as libc::c_short;
    l.l_whence = libc::SEEK_SET as libc::c_short;
    l.l_start = at as libc::off_t;
    l.l_len = 1;
    // SAFETY: a lock request on our own descriptor with a valid flock; never blocks.
    assert_eq!(
        unsafe { libc::fcntl(f.as_raw_fd(), libc::F_OFD_SETLK, &l) },
        0
    );
}

/// A joiner of `g` is refused, saying `line`, after waiting 10 s (and not much more).
fn refused_after_ten_seconds(g: &Group, line: &str) {
    use std::time::{Duration, Instant};
    let t = Instant::now();
    let r = join(g);
    let waited = t.elapsed();
    assert_ne!(r.code, 0);
    assert!(r.stderr.contains(line), "{}", r.stderr);
    assert!(
        (Duration::from_secs(10)..Duration::from_secs(30)).contains(&waited),
        "{waited:?}"
    );
}

/// A ledger's door (joiners pass it one at a time) held for 14 s while it keeps turning (its
/// `turns` moves, as a thousand joiners passing on a loaded machine move it): the joiner waits
/// and gets in. Held by a stopped joiner: the joiner gives up after 10 s with one line.
/// [Before: a joiner gave up after 10 s at the door whatever went on behind it; on a busy
/// machine 38 of 1,000 joiners were refused (chaos's crowd test).]
#[test]
fn a_joiner_waits_while_the_door_turns_and_gives_up_when_it_stands_still() {
    use std::os::unix::fs::FileExt;
    use std::time::{Duration, Instant};
    let g = Group::new("door");
    let _first = first_member(&g);
    let (door, turns) = cudapool::limits::group::ledger::door_offsets();
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(g.ledger())
        .unwrap();
    door_lock(&f, door, libc::F_WRLCK);
    let t = Instant::now();
    let crowd = {
        let f = f.try_clone().unwrap();
        std::thread::spawn(move || {
            let mut b = [0u8; 8];
            for _ in 0..7 {
                std::thread::sleep(Duration::from_secs(2));
                f.read_exact_at(&mut b, turns as u64).unwrap();
                let n = u64::from_ne_bytes(b) + 1;
                f.write_all_at(&n.to_ne_bytes(), turns as u64).unwrap();
            }
            door_lock(&f, door, libc::F_UNLCK);
        })
    };
    let r = join(&g);
    crowd.join().unwrap();
    assert_eq!(r.code, 0, "waited while the door turned: {}", r.stderr);
    assert!(t.elapsed() >= Duration::from_secs(14), "{:?}", t.elapsed());
    door_lock(&f, door, libc::F_WRLCK);
    refused_after_ten_seconds(
        &g,
        "held the ledger's door for more than 10 s without letting anyone in",
    );
    door_lock(&f, door, libc::F_UNLCK);
    assert_eq!(join(&g).code, 0, "the door let go");
}

/// A process of the user that holds a ledger's door as a joiner does (the door's lock, and the
/// classic lock on the byte after it that names it) and then sleeps; killed when dropped.
struct DoorHolder(libc::pid_t);

impl Drop for DoorHolder {
    fn drop(&mut self) {
        // SAFETY: SIGKILL to our own child (stopped or not), then reaping it.
        unsafe {
            libc::kill(self.0, libc::SIGKILL);
            libc::waitpid(self.0, std::ptr::null_mut(), 0);
        }
    }
}

fn hold_door(path: &str) -> DoorHolder {
    use cudapool::limits::group::ledger;
    let path = std::ffi::CString::new(path).unwrap();
    let (door, _) = ledger::door_offsets();
    let holder = ledger::door_holder_offset();
    let mut ready = [0 as libc::c_int; 2];
    // SAFETY: a pipe into an array of two descriptors.
    assert_eq!(unsafe { libc::pipe(ready.as_mut_ptr()) }, 0);
    // SAFETY: the child calls only async-signal-safe functions (open, fcntl, write, pause,
    // _exit) on memory made before the fork, and never returns.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: as above.
        unsafe {
            let fd = libc::open(path.as_ptr(), libc::O_RDWR);
            let lock = |cmd: libc::c_int, at: usize| {
                let mut l: libc::flock = std::mem::zeroed();
                l.l_type = libc::F_WRLCK as libc::c_short;
                l.l_whence = libc::SEEK_SET as libc::c_short;
                l.l_start = at as libc::off_t;
                l.l_len = 1;
                libc::fcntl(fd, cmd, &l) == 0
            };
            if fd < 0 || !lock(libc::F_OFD_SETLK, door) || !lock(libc::F_SETLK, holder) {
                libc::_exit(1);
            }
            libc::write(ready[1], b"x".as_ptr().cast(), 1);
            loop {
                libc::pause();
            }
        }
    }
    let mut b = [0u8; 1];
    // SAFETY: reads one byte into a buffer of one; closes our ends of the pipe.
    unsafe {
        libc::close(ready[1]);
        assert_eq!(
            libc::read(ready[0], b.as_mut_ptr().cast(), 1),
            1,
            "the holder took the door"
        );
        libc::close(ready[0]);
    }
    DoorHolder(pid)
}

/// A ledger's door held for 14 s by a live process that lets nobody in (a joiner starved of
/// CPU on a loaded machine): the joiner waits for it and gets in. Held by the same kind of
/// process stopped (SIGSTOP): the joiner gives up after 10 s with one line that names it.
/// [Before: a joiner gave up after 10 s at any door that stood still; in CI, with other tests
/// beside it, 14 of 1,000 joiners of chaos's crowd test were refused.]
#[test]
fn a_joiner_waits_for_a_door_holder_that_runs_and_not_for_a_stopped_one() {
    use std::time::{Duration, Instant};
    let g = Group::new("holder");
    let _first = first_member(&g);
    let live = hold_door(&g.ledger());
    let t = Instant::now();
    let releaser = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(14));
        drop(live);
    });
    let r = join(&g);
    releaser.join().unwrap();
    assert_eq!(r.code, 0, "waited for a live holder: {}", r.stderr);
    assert!(t.elapsed() >= Duration::from_secs(14), "{:?}", t.elapsed());
    let stopped = hold_door(&g.ledger());
    // SAFETY: SIGSTOP to our own child.
    unsafe { libc::kill(stopped.0, libc::SIGSTOP) };
    refused_after_ten_seconds(
        &g,
        &format!(
            "process {} (state T) has held the ledger's door for more than 10 s without letting anyone in (stopped)",
            stopped.0
        ),
    );
    drop(stopped);
    assert_eq!(join(&g).code, 0, "the door let go");
}

/// A ledger's lock held for 14 s by a live member while others keep passing it (its `seq`
/// moves, as members allocating one after another move it): a joiner waits and gets in, and so
/// does one queued at the ledger's door behind it. Held for 14 s by a live thread that lets
/// nobody pass (starved of CPU): waited for. Held by a stopped process: the joiner gives up
/// after 10 s with one line that names it. [Before: a joiner gave up after 10 s at the lock whatever went
/// on behind it; then one at the door behind a joiner waiting at the lock gave up after 10 s,
/// the door standing still (CI: 20 of 1,000 joiners of chaos's crowd test refused).]
#[test]
fn a_joiner_waits_while_the_lock_changes_hands_and_gives_up_when_it_does_not() {
    use cudapool::limits::group::ledger;
    use std::os::fd::AsRawFd;
    use std::sync::atomic::AtomicU64;
    use std::time::{Duration, Instant};
    let g = Group::new("lock");
    let _first = first_member(&g);
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(g.ledger())
        .unwrap();
    // A live member (its byte held by this process) holding the ledger's lock.
    door_lock(
        &f,
        ledger::member_byte_offset(ledger::MEMBERS - 1),
        libc::F_WRLCK,
    );
    // SAFETY: maps the whole ledger file of ours, shared; unmapped at the end.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            ledger::ledger_bytes(),
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    };
    assert_ne!(base, libc::MAP_FAILED);
    let at = |off: usize| base as usize + off;
    let mutex = at(ledger::mutex_offset()) as *mut libc::pthread_mutex_t;
    // SAFETY: the ledger's process-shared, robust mutex, inside our mapping.
    let lock = || assert_eq!(unsafe { libc::pthread_mutex_lock(mutex) }, 0);
    // SAFETY: as above; this thread holds it.
    let unlock = || assert_eq!(unsafe { libc::pthread_mutex_unlock(mutex) }, 0);
    let seq_at = at(ledger::seq_offset());
    lock();
    let t = Instant::now();
    let crowd = std::thread::spawn(move || {
        // SAFETY: the ledger's seqlock word, an aligned u64 inside the mapping.
        let seq = unsafe { &*(seq_at as *const AtomicU64) };
        for _ in 0..7 {
            std::thread::sleep(Duration::from_secs(2));
            seq.fetch_add(2, std::sync::atomic::Ordering::AcqRel);
        }
    });
    let joiner = || {
        let g = g.0.clone();
        std::thread::spawn(move || {
            let env = vec![
                ("CUDAPOOL_GROUP".to_string(), g),
                ("CUDAPOOL_GROUP_LIMIT".to_string(), "64MiB".to_string()),
            ];
            client("dlsym", &["basic"], &env_of(&env))
        })
    };
    // The first waits at the lock holding the door; the second, at the door behind it.
    let first_joiner = joiner();
    std::thread::sleep(Duration::from_secs(1));
    let second_joiner = joiner();
    crowd.join().unwrap();
    unlock();
    for (who, j) in [("first", first_joiner), ("second", second_joiner)] {
        let r = j.join().unwrap();
        assert_eq!(
            r.code, 0,
            "the {who} joiner waited while the lock changed hands: {}",
            r.stderr
        );
    }
    assert!(t.elapsed() >= Duration::from_secs(14), "{:?}", t.elapsed());
    // Held for 14 s by a live thread that lets nobody pass (a starved holder): waited for.
    let addr = mutex as usize;
    let (held, is_held) = std::sync::mpsc::channel();
    let holder = std::thread::spawn(move || {
        let m = addr as *mut libc::pthread_mutex_t;
        // SAFETY: the ledger's mutex in the test's mapping, locked and unlocked by this thread.
        assert_eq!(unsafe { libc::pthread_mutex_lock(m) }, 0);
        held.send(()).unwrap();
        std::thread::sleep(Duration::from_secs(14));
        // SAFETY: as above.
        assert_eq!(unsafe { libc::pthread_mutex_unlock(m) }, 0);
    });
    is_held.recv().unwrap();
    let t = Instant::now();
    let r = join(&g);
    holder.join().unwrap();
    assert_eq!(r.code, 0, "waited for a live holder: {}", r.stderr);
    assert!(t.elapsed() >= Duration::from_secs(13), "{:?}", t.elapsed());
    // Held by a stopped process: refused after 10 s, with the line naming it.
    // SAFETY: the child only locks the shared mutex it inherited, stops itself and waits to be
    // killed (async-signal-safe in practice: a futex operation, raise and pause).
    let child = unsafe { libc::fork() };
    if child == 0 {
        // SAFETY: as above.
        unsafe {
            libc::pthread_mutex_lock(mutex);
            libc::raise(libc::SIGSTOP);
            loop {
                libc::pause();
            }
        }
    }
    let since = Instant::now();
    while cudapool::base::procstate::state(child as u32) != Some(b'T') {
        assert!(since.elapsed() < Duration::from_secs(10), "the child stops");
        std::thread::sleep(Duration::from_millis(10));
    }
    refused_after_ten_seconds(
        &g,
        &format!("its ledger's lock has been held for more than 10 s by thread {child} (state T)"),
    );
    // SAFETY: SIGKILL to our own stopped child, then reaping it: the mutex's owner died.
    unsafe {
        libc::kill(child, libc::SIGKILL);
        libc::waitpid(child, std::ptr::null_mut(), 0);
    }
    // SAFETY: our own mapping, unmapped once.
    unsafe { libc::munmap(base, ledger::ledger_bytes()) };
    door_lock(
        &f,
        ledger::member_byte_offset(ledger::MEMBERS - 1),
        libc::F_UNLCK,
    );
    assert_eq!(join(&g).code, 0, "the lock let go");
}
