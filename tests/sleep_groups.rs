//! Sleep and wake in a group (`CUDAPOOL_SLEEP_IDLE`, `CUDAPOOL_MEMORY_REQUEST`,
//! `CUDAPOOL_WAKE_TIMEOUT`): real processes, each the C test client under `LD_PRELOAD` against
//! the fake driver, sharing one ledger in /dev/shm.

mod common;
use common::members::*;
use common::*;
use std::io::Write;

/// Sleep and wake in a group: asleep bytes count in no limit (another member gets the room), a
/// member killed with SIGKILL while asleep leaves nothing in the ledger, and a wake without room
/// waits `CUDAPOOL_WAKE_TIMEOUT`, answers out of memory with the OOM line naming the wake,
/// keeps the contents, and wakes once room comes back.
#[test]
fn asleep_bytes_count_in_no_group_limit_and_a_member_killed_asleep_leaves_nothing() {
    let g = Group::new("sleepkill");
    let mut env = in_group(&g, "128MiB");
    env.push(("CUDAPOOL_SEGMENTS".into(), "expandable".into()));
    let mut a = Member::start(&["sleep_hold", "60"], &env_of(&env));
    assert_eq!(a.line("asleep")["state"], "2");
    // Awake, A held 72 MiB (70 in the arena, a 2 MiB small segment): 7 blocks of 8 MiB would
    // be left; asleep it holds 2 MiB.
    let mut b = Member::start(&["take", &MB8.to_string()], &env_of(&env));
    assert_eq!(b.num("took", "n"), 15, "A's asleep 70 MiB are B's to take");
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    let mut c = Member::start(&["take", &MB8.to_string()], &env_of(&env));
    assert_eq!(c.num("took", "n"), 1, "A's 2 MiB are back: 8 MiB free");
    let group = c.line("group");
    assert_eq!(group["members"], "2", "B and C: A is gone");
    assert_eq!(group["reserved"], (128 * MIB).to_string());
    assert_eq!(b.finish(), 0);
    assert_eq!(c.finish(), 0);
}

#[test]
fn a_wake_without_room_waits_answers_out_of_memory_and_loses_nothing() {
    let g = Group::new("wakeroom");
    let mut env = in_group(&g, "128MiB");
    env.push(("CUDAPOOL_SEGMENTS".into(), "expandable".into()));
    env.push(("CUDAPOOL_WAKE_TIMEOUT".into(), "1s".into()));
    let log = fixture().dir.join(format!("{}.stderr", g.0));
    let mut a = Member::start_logged(&["sleep_wait"], &env_of(&env), Some(&log));
    assert_eq!(a.line("asleep")["state"], "2");
    let mut b = Member::start(&["park", "12", &MB8.to_string()], &env_of(&env));
    b.line("parked"); // 96 MiB: 30 MiB left, A needs 70
    let t = std::time::Instant::now();
    a.stdin.as_mut().unwrap().write_all(b"try\n").unwrap();
    assert_eq!(
        a.line("wake")["rc"],
        "2",
        "no room: CUDA_ERROR_OUT_OF_MEMORY"
    );
    assert!(
        t.elapsed() >= std::time::Duration::from_secs(1),
        "it waited"
    );
    let after = a.line("after_try");
    assert_eq!(
        (after["state"].as_str(), after["asleep"].as_str()),
        ("2", "73400320"),
        "still asleep, its contents kept"
    );
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(
        said.contains("by waking the process from sleep") && said.contains("waking: waiting for"),
        "{said}"
    );
    assert_eq!(b.finish(), 0);
    a.stdin.as_mut().unwrap().write_all(b"check\n").unwrap();
    assert_eq!(a.line("woken")["state"], "0");
    assert!(a.lines.iter().any(|l| l == "intact=1\n"), "{:?}", a.lines);
    assert_eq!(a.finish(), 0);
}

/// The program's own virtual memory waking without room: the pool's memory (70 MiB) fits and
/// wakes, the program's 8 MiB does not; the call gets `CUDA_ERROR_OUT_OF_MEMORY` and what could
/// not come back stays on the host, the process still asleep (no work runs half woken); once
/// the room is there, everything comes back intact.
#[test]
fn the_programs_own_memory_without_room_stays_on_the_host_until_there_is() {
    let g = Group::new("wakevmm");
    let mut env = in_group(&g, "128MiB");
    env.push(("CUDAPOOL_SEGMENTS".into(), "expandable".into()));
    env.push(("CUDAPOOL_WAKE_TIMEOUT".into(), "1s".into()));
    let mut a = Member::start(&["sleep_wait", "vmm"], &env_of(&env));
    let asleep = a.line("asleep");
    assert_eq!(asleep["state"], "2");
    assert_eq!(asleep["asleep"], ((70 + 8) * MIB).to_string());
    let mut b = Member::start(&["park", "7", &MB8.to_string()], &env_of(&env));
    b.line("parked"); // 56 MiB: 70 MiB left, A needs 70 + 8
    a.stdin.as_mut().unwrap().write_all(b"try\n").unwrap();
    assert_eq!(
        a.line("wake")["rc"],
        "2",
        "no room: CUDA_ERROR_OUT_OF_MEMORY"
    );
    let after = a.line("after_try");
    assert_eq!(
        (after["state"].as_str(), after["asleep"].as_str()),
        ("2", (8 * MIB).to_string().as_str()),
        "still asleep, the program's own 8 MiB on the host"
    );
    assert_eq!(b.finish(), 0);
    a.stdin.as_mut().unwrap().write_all(b"check\n").unwrap();
    assert_eq!(a.line("woken")["state"], "0");
    assert!(a.lines.iter().any(|l| l == "intact=1\n"), "{:?}", a.lines);
    assert!(
        a.lines.iter().any(|l| l == "vm_intact=1\n"),
        "{:?}",
        a.lines
    );
    assert_eq!(a.finish(), 0);
}

/// `CUDAPOOL_SLEEP_IDLE` (issue 59, part 4): before a member's allocation is refused, a member
/// idle that long is put to sleep (without the variable, nobody is); it wakes when it works
/// again, waiting for room until the other lets go, and finds its data.
#[test]
fn an_idle_member_is_put_to_sleep_before_another_is_refused_and_wakes_when_it_works() {
    let g = Group::new("idle");
    let mut env = in_group(&g, "128MiB");
    env.push(("CUDAPOOL_SEGMENTS".into(), "expandable".into()));
    env.push(("CUDAPOOL_WAKE_TIMEOUT".into(), "0".into()));
    let mut a = Member::start(&["sleep_idle"], &env_of(&env));
    a.line("ready"); // 72 MiB held, then idle
    std::thread::sleep(std::time::Duration::from_millis(2500));
    let mut b = Member::start(&["take", &MB8.to_string()], &env_of(&env));
    assert_eq!(
        b.num("took", "n"),
        7,
        "without CUDAPOOL_SLEEP_IDLE nobody sleeps"
    );
    assert_eq!(b.finish(), 0);
    let mut eager = env.clone();
    eager.push(("CUDAPOOL_SLEEP_IDLE".into(), "1s".into()));
    let mut b = Member::start(&["take", &MB8.to_string()], &env_of(&eager));
    assert_eq!(
        b.num("took", "n"),
        15,
        "A, idle for 2.5 s, slept before B was refused"
    );
    // A works again: its first copy waits for room until B lets go.
    a.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    assert_eq!(a.line("before_check")["state"], "2");
    stat_until("A waits for room, its 70 MiB on the host", |text| {
        text.contains("waking: waiting for 70.00 MiB of room (70.00 MiB on the host)")
    });
    assert_eq!(b.finish(), 0);
    a.line("intact=1"); // every block came back
    assert_eq!(a.finish(), 0);
}

#[test]
fn a_member_at_or_under_its_request_is_never_put_to_sleep_for_another() {
    let g = Group::new("request");
    let mut env = in_group(&g, "128MiB");
    env.push(("CUDAPOOL_SEGMENTS".into(), "expandable".into()));
    let mut aenv = env.clone();
    aenv.push(("CUDAPOOL_MEMORY_REQUEST".into(), "100MiB".into()));
    let mut a = Member::start(&["sleep_idle"], &env_of(&aenv));
    a.line("ready");
    std::thread::sleep(std::time::Duration::from_millis(2500));
    env.push(("CUDAPOOL_SLEEP_IDLE".into(), "1s".into()));
    let mut b = Member::start(&["take", &MB8.to_string()], &env_of(&env));
    assert_eq!(
        b.num("took", "n"),
        7,
        "A holds 72 MiB of its 100 MiB request"
    );
    assert_eq!(b.finish(), 0);
    a.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    assert_eq!(a.line("before_check")["state"], "0", "A never slept");
    assert_eq!(a.finish(), 0);
}

/// `cudapool sleep --group NAME --wait` puts every member of the group to sleep (and no other
/// process); `cudapool wake --group NAME --wait` wakes them.
#[test]
fn the_cli_puts_a_whole_group_to_sleep_and_wakes_it() {
    let g = Group::new("cligroup");
    let mut env = in_group(&g, "256MiB");
    env.push(("CUDAPOOL_SEGMENTS".into(), "expandable".into()));
    let mut a = Member::start(&["sleep_idle"], &env_of(&env));
    let mut b = Member::start(&["sleep_idle"], &env_of(&env));
    let other = Group::new("cliother");
    let mut oenv = in_group(&other, "256MiB");
    oenv.push(("CUDAPOOL_SEGMENTS".into(), "expandable".into()));
    let mut c = Member::start(&["sleep_idle"], &env_of(&oenv));
    for m in [&mut a, &mut b, &mut c] {
        m.line("ready");
    }
    let cli = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_cudapool"))
            .args(args)
            .output()
            .unwrap()
    };
    let out = cli(&["sleep", "--group", &g.0, "--wait"]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for m in [&a, &b] {
        assert!(
            said.contains(&format!("{}: asleep: ", m.child.id())),
            "{said}"
        );
    }
    assert!(!said.contains(&format!("{}:", c.child.id())), "{said}");
    let out = cli(&["wake", "--group", &g.0, "--wait"]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{said}");
    assert_eq!(said.matches(": awake: ").count(), 2, "{said}");
    let out = cli(&["sleep", "--group", "no-such-group"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no cudapool process in group"));
    for mut m in [a, b, c] {
        m.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
        assert_eq!(m.line("before_check")["state"], "0", "awake: {:?}", m.lines);
        m.line("intact=1");
        assert_eq!(m.finish(), 0);
    }
}

/// A member killed with SIGKILL while its wake waits for room leaves nothing behind: the
/// group's ledger no longer counts it, and the room it waited for goes to another.
#[test]
fn a_member_killed_while_waking_leaves_nothing() {
    let g = Group::new("killwake");
    let mut env = in_group(&g, "128MiB");
    env.push(("CUDAPOOL_SEGMENTS".into(), "expandable".into()));
    env.push(("CUDAPOOL_WAKE_TIMEOUT".into(), "0".into()));
    let mut a = Member::start(&["sleep_wait"], &env_of(&env));
    assert_eq!(a.line("asleep")["state"], "2");
    let mut b = Member::start(&["park", "12", &MB8.to_string()], &env_of(&env));
    b.line("parked"); // 96 MiB of 128: A's 70 do not fit
    a.stdin.as_mut().unwrap().write_all(b"try\n").unwrap();
    stat_until("A waits for room", |text| {
        text.contains("waking: waiting for 70.00 MiB of room")
    });
    a.child.kill().unwrap(); // SIGKILL while waking
    a.child.wait().unwrap();
    let mut c = Member::start(&["take", &MB8.to_string()], &env_of(&env));
    assert_eq!(c.num("took", "n"), 4, "A's 2 MiB are back: 32 MiB free");
    let group = c.line("group");
    assert_eq!(group["members"], "2", "B and C: A is gone");
    assert_eq!(group["reserved"], (128 * MIB).to_string());
    assert_eq!(b.finish(), 0);
    assert_eq!(c.finish(), 0);
}
