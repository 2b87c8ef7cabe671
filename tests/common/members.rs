//! Group members for the tests of groups (`tests/groups.rs`, `tests/group_waits.rs`,
//! `tests/sleep_groups.rs`): a group name of its own, and client processes that join it and
//! are read line by line.

use super::*;
use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdin, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

/// A group name no other test (nor an earlier run) uses; its ledger is removed when dropped.
pub struct Group(pub String);

impl Group {
    pub fn new(what: &str) -> Group {
        static N: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "t{}-{what}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let g = Group(name);
        // The runtime directory, as a member makes it (files are planted in it below).
        cudapool::base::rundir_find::mine(None).expect("a runtime directory");
        let _ = std::fs::remove_file(g.ledger());
        g
    }

    pub fn ledger(&self) -> String {
        // SAFETY: getuid has no preconditions.
        format!(
            "/dev/shm/cudapool-{}/group-{}",
            unsafe { libc::getuid() },
            self.0
        )
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.ledger());
    }
}

/// A client process running one scenario; it ends its scenario when its stdin closes.
pub struct Member {
    pub child: Child,
    pub stdin: Option<ChildStdin>,
    out: BufReader<std::process::ChildStdout>,
    pub lines: Vec<String>,
}

impl Member {
    pub fn start(args: &[&str], env: &[(&str, &str)]) -> Member {
        Member::start_logged(args, env, None)
    }

    /// [`start`](Self::start), its stderr into `log` when given.
    pub fn start_logged(
        args: &[&str],
        env: &[(&str, &str)],
        log: Option<&std::path::Path>,
    ) -> Member {
        let f = fixture();
        let mut cmd = Command::new(f.dir.join("client"));
        cmd.arg("dlsym").args(args).current_dir(&f.dir);
        for (k, _) in std::env::vars() {
            if k.starts_with("CUDAPOOL_") || k.starts_with("FAKECU_") || k == "CLIENT_DEVICE" {
                cmd.env_remove(k);
            }
        }
        super::cache_idle(&mut cmd);
        cmd.env("LD_LIBRARY_PATH", &f.dir)
            .env("LD_PRELOAD", &f.lib)
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(match log {
                Some(p) => Stdio::from(std::fs::File::create(p).unwrap()),
                None => Stdio::null(),
            });
        let mut child = cmd.spawn().expect("client");
        let stdin = child.stdin.take();
        let out = BufReader::new(child.stdout.take().unwrap());
        Member {
            child,
            stdin,
            out,
            lines: Vec::new(),
        }
    }

    /// The `key=value` pairs of the next line starting with `tag `.
    pub fn line(&mut self, tag: &str) -> std::collections::HashMap<String, String> {
        loop {
            let mut l = String::new();
            let n = self.out.read_line(&mut l).unwrap();
            assert!(
                n > 0,
                "client ended before {tag:?}; it said: {:?}",
                self.lines
            );
            self.lines.push(l.clone());
            if l.split_whitespace().next() == Some(tag) {
                return l
                    .split_whitespace()
                    .filter_map(|kv| kv.split_once('='))
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect();
            }
        }
    }

    pub fn num(&mut self, tag: &str, key: &str) -> u64 {
        self.line(tag)[key].parse().unwrap()
    }

    /// Ends the scenario; its exit status.
    pub fn finish(mut self) -> i32 {
        drop(self.stdin.take());
        self.child.wait().unwrap().code().unwrap_or(-1)
    }
}

pub const MB8: u64 = 8 << 20;

/// What `cudapool stat` prints.
pub fn stat() -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_cudapool"))
        .arg("stat")
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `cudapool stat` again every 50 ms until `done` holds for what it prints (returned), for at
/// most 10 s: what another process does meanwhile shows there when it has happened.
pub fn stat_until(what: &str, done: impl Fn(&str) -> bool) -> String {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let text = stat();
        if done(&text) {
            return text;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what}, within 10 s: {text}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

pub fn in_group(g: &Group, limit: &str) -> Vec<(String, String)> {
    vec![
        ("CUDAPOOL_GROUP".into(), g.0.clone()),
        ("CUDAPOOL_GROUP_LIMIT".into(), limit.into()),
    ]
}

/// A process that joins `g` (limit 64 MiB), allocates and frees a little, and exits.
pub fn join(g: &Group) -> Run {
    client("dlsym", &["basic"], &env_of(&in_group(g, "64MiB")))
}

pub fn env_of(v: &[(String, String)]) -> Vec<(&str, &str)> {
    v.iter()
        .map(|(k, val)| (k.as_str(), val.as_str()))
        .collect()
}
