//! How much host memory this process may still take without the kernel killing it: the
//! smallest of the node's available memory (`MemAvailable`) and, at each level of the process's
//! memory cgroup (v1 `memory.limit_in_bytes`, v2 `memory.max`, up to its hierarchy's root),
//! the limit less what the level uses. A sleep asks before it copies device memory to the host:
//! past an `RLIMIT_AS` the kernel refuses the mapping, but past a cgroup's limit it gives the
//! mapping and kills the process at the first page it cannot charge.
//!
//! What a level uses leaves out its inactive file pages (`memory.stat`), which the kernel takes
//! back before it kills: the page cache, and the pages of host copies a wake gave back
//! (`MADV_FREE`, which the kernel keeps on that list). Only files the kernel writes are read
//! (`/proc/self/...`, the cgroup filesystems it mounted, each found through
//! `/proc/self/mountinfo`), each bounded in size.

use std::path::{Path, PathBuf};

/// The most of one kernel file read (mountinfo of a node with many containers included).
const MOST: u64 = 1 << 20;

/// The host memory the process may still take, and what bounds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Room {
    pub bytes: u64,
    /// What bounds it, for a user: "the node's available memory" or the cgroup's file.
    pub by: String,
}

/// The room now; `None` when nothing could be read (no `/proc`): nothing known, nothing refused.
pub fn now() -> Option<Room> {
    of("self")
}

/// The room of process `pid` (root's arbiter, before the driver moves that process's device
/// memory into its host memory): its cgroups as the kernel names them, read through this
/// process's own mounts.
pub fn of_pid(pid: u32) -> Option<Room> {
    of(&pid.to_string())
}

fn of(proc_name: &str) -> Option<Room> {
    let meminfo = read("/proc/meminfo");
    let node = meminfo
        .as_deref()
        .and_then(mem_available)
        .map(|bytes| Room {
            bytes,
            by: "the node's available memory (MemAvailable)".into(),
        });
    let cgroups = match (
        read(format!("/proc/{proc_name}/cgroup")),
        read("/proc/self/mountinfo"),
    ) {
        (Some(c), Some(m)) => cgroup_dirs(&c, &m),
        _ => Vec::new(),
    };
    let levels = cgroups.into_iter().filter_map(|(dir, v2)| level(&dir, v2));
    node.into_iter().chain(levels).min_by_key(|r| r.bytes)
}

fn read(path: impl AsRef<Path>) -> Option<String> {
    use std::io::Read;
    let mut s = String::new();
    let f = std::fs::File::open(path).ok()?;
    f.take(MOST).read_to_string(&mut s).ok()?;
    Some(s)
}

/// `MemAvailable` of `/proc/meminfo`, in bytes.
fn mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kb.checked_mul(1024)
}

/// Every directory whose limit binds the process (its memory cgroup and each ancestor up to
/// its hierarchy's mount), with whether it is cgroup v2, from `/proc/self/cgroup` and
/// `/proc/self/mountinfo`.
fn cgroup_dirs(proc_cgroup: &str, mountinfo: &str) -> Vec<(PathBuf, bool)> {
    let mut out = Vec::new();
    for line in proc_cgroup.lines() {
        let mut f = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        let v2 = controllers.is_empty();
        if !v2 && !controllers.split(',').any(|c| c == "memory") {
            continue;
        }
        for (root, point) in mounts(mountinfo, v2) {
            // The process's cgroup as seen under this mount (whose root may be a subtree).
            let Some(rel) = under(path, &root) else {
                continue;
            };
            let top = PathBuf::from(&point);
            let mut dir = top.join(rel);
            if !v2 || dir.join("memory.max").exists() || dir.join("memory.current").exists() {
                loop {
                    out.push((dir.clone(), v2));
                    if dir == top || !dir.pop() {
                        break;
                    }
                }
            }
            break;
        }
    }
    out
}

/// `path` relative to the mount's `root`, when it lies under it.
fn under<'a>(path: &'a str, root: &str) -> Option<&'a str> {
    if root == "/" {
        return Some(path.trim_start_matches('/'));
    }
    let rest = path.strip_prefix(root)?;
    (rest.is_empty() || rest.starts_with('/')).then(|| rest.trim_start_matches('/'))
}

/// The (root, mount point) of each cgroup mount with the memory controller (v1) or of each
/// cgroup2 mount (v2), from mountinfo (`ID PARENT MAJ:MIN ROOT POINT OPTS ... - TYPE SRC SUPER`).
fn mounts(mountinfo: &str, v2: bool) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let l: Vec<&str> = left.split(' ').collect();
        let r: Vec<&str> = right.split(' ').collect();
        if l.len() < 5 || r.is_empty() {
            continue;
        }
        let ok = match (v2, r[0]) {
            (true, "cgroup2") => true,
            (false, "cgroup") => r
                .get(2)
                .is_some_and(|o| o.split(',').any(|x| x == "memory")),
            _ => false,
        };
        if ok {
            out.push((unescape(l[3]), unescape(l[4])));
        }
    }
    out
}

/// mountinfo's octal escapes (`\040` for a space).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// One level's room: its limit less what it uses (its inactive file pages left out); `None`
/// when it has no limit or its files cannot be read.
fn level(dir: &Path, v2: bool) -> Option<Room> {
    let (limit_file, usage_file, inactive) = if v2 {
        ("memory.max", "memory.current", "inactive_file")
    } else {
        (
            "memory.limit_in_bytes",
            "memory.usage_in_bytes",
            "total_inactive_file",
        )
    };
    let limit: u64 = read(dir.join(limit_file))?.trim().parse().ok()?;
    // v1 writes "no limit" as a page-rounded i64::MAX.
    if limit >= i64::MAX as u64 / 2 {
        return None;
    }
    let usage: u64 = read(dir.join(usage_file))?.trim().parse().ok()?;
    let reclaimable = read(dir.join("memory.stat"))
        .and_then(|s| stat_field(&s, inactive))
        .unwrap_or(0);
    Some(Room {
        bytes: limit.saturating_sub(usage.saturating_sub(reclaimable)),
        by: format!(
            "the memory cgroup's limit ({})",
            dir.join(limit_file).display()
        ),
    })
}

fn stat_field(stat: &str, key: &str) -> Option<u64> {
    stat.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTS: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
41 31 0:38 /job\\0401 /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn meminfo_gives_bytes() {
        let m = "MemTotal:       24683656 kB\nMemAvailable:   1000 kB\n";
        assert_eq!(mem_available(m), Some(1_024_000));
        assert_eq!(mem_available("MemTotal: 1 kB\n"), None);
    }

    #[test]
    fn v1_memory_cgroup_and_its_ancestors_are_found() {
        let dirs = cgroup_dirs("4:memory:/a/b\n3:cpu:/x\n", MOUNTS);
        let want: Vec<(PathBuf, bool)> = [
            "/sys/fs/cgroup/memory/a/b",
            "/sys/fs/cgroup/memory/a",
            "/sys/fs/cgroup/memory/",
        ]
        .iter()
        .map(|p| (PathBuf::from(p), false))
        .collect();
        assert_eq!(dirs, want);
    }

    #[test]
    fn a_cgroup_outside_the_mounts_root_binds_nothing_read() {
        // The v2 mount's root is /job 1: a process in /other is not under it.
        assert!(cgroup_dirs("0::/other\n", MOUNTS).is_empty());
        assert_eq!(under("/job 1/step", "/job 1"), Some("step"));
        assert_eq!(under("/job 10", "/job 1"), None);
        assert_eq!(
            mounts(MOUNTS, true),
            vec![("/job 1".into(), "/sys/fs/cgroup/unified".into())]
        );
    }

    #[test]
    fn a_level_is_its_limit_less_what_it_cannot_give_back() {
        let d = std::env::temp_dir().join(format!("cudapool-room-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let put = |f: &str, s: &str| std::fs::write(d.join(f), s).unwrap();
        put("memory.limit_in_bytes", "1000\n");
        put("memory.usage_in_bytes", "900\n");
        put("memory.stat", "cache 5\ntotal_inactive_file 300\n");
        assert_eq!(level(&d, false).map(|r| r.bytes), Some(400));
        put("memory.limit_in_bytes", "9223372036854771712\n");
        assert_eq!(level(&d, false), None, "no limit");
        put("memory.max", "max\n");
        put("memory.current", "10\n");
        assert_eq!(level(&d, true), None, "v2, no limit");
        put("memory.max", "100\n");
        put("memory.stat", "inactive_file 20\n");
        assert_eq!(level(&d, true).map(|r| r.bytes), Some(100));
        put("memory.current", "70\n");
        assert_eq!(level(&d, true).map(|r| r.bytes), Some(50));
        std::fs::remove_dir_all(&d).unwrap();
    }
}
