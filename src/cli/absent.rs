//! Why a pid the user named is not a cudapool process this command can see (`stat`, `top`,
//! `snapshot`, `sleep`, `wake`): told apart from what /proc shows of it, so the answer names
//! the cause (no such process, another user's, no cudapool in it, no GPU use yet, another
//! runtime folder) rather than always the runtime folder.

use cudapool::base::rundir::configured_from_env;
use cudapool::report::pages::printable;
use std::io::Read as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

/// The most of a /proc file read (a process's maps or environment can be large; what is looked
/// for is near the start of a normal one, and a reader never reads without bound).
const MOST: u64 = 4 << 20;

/// The line for `pid`, which publishes no page where this command looks; `any_user`: the
/// command reaches every user's processes (root's `sleep` and `wake`), else only this user's.
pub fn no_process(pid: u32, any_user: bool) -> String {
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    let looked = configured_from_env().unwrap_or_else(|| cudapool::base::rundir::default_path(uid));
    let head = if any_user {
        format!("no cudapool process with pid {pid}")
    } else {
        format!("no cudapool process with pid {pid} of this user")
    };
    let why = why(pid, any_user, uid, &looked);
    format!("{head}: {why}")
}

fn why(pid: u32, any_user: bool, uid: u32, looked: &Path) -> String {
    let dir = PathBuf::from(format!("/proc/{pid}"));
    let Ok(meta) = std::fs::metadata(&dir) else {
        return format!("no process has pid {pid}");
    };
    if !any_user && meta.uid() != uid {
        let only = if uid == 0 {
            "this command reaches only root's own"
        } else {
            "only its owner or root can reach it"
        };
        return format!("pid {pid} is another user's (uid {}): {only}", meta.uid());
    }
    let Some(maps) = read(&dir.join("maps")) else {
        return format!(
            "pid {pid} runs, but its memory map cannot be read here to tell why; it publishes nothing in {}",
            looked.display()
        );
    };
    let has = |lib: &str| {
        maps.split(|&b| b == b'\n').any(|l| {
            l.rsplit(|&b| b == b'/')
                .next()
                .is_some_and(|f| f.starts_with(lib.as_bytes()))
        })
    };
    if !has("libcudapool.so") {
        return format!(
            "pid {pid} runs without cudapool (start it with `cudapool run -- PROGRAM`, or with LD_PRELOAD naming libcudapool.so)"
        );
    }
    if !has("libcuda.so") {
        return format!(
            "pid {pid} has cudapool but has not used CUDA yet (it is seen from its first use of the GPU)"
        );
    }
    match runtime_dir(&dir) {
        Some(theirs) if Path::new(&theirs) != looked => format!(
            "pid {pid} publishes in {theirs} (its CUDAPOOL_RUNTIME_DIR): set CUDAPOOL_RUNTIME_DIR={theirs} here too"
        ),
        _ => format!(
            "pid {pid} runs with cudapool and CUDA, but has published nothing in {} yet (it is seen from its first GPU memory)",
            looked.display()
        ),
    }
}

/// At most [`MOST`] bytes of a /proc file; `None` when it cannot be read.
fn read(path: &Path) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    std::fs::File::open(path)
        .ok()?
        .take(MOST)
        .read_to_end(&mut out)
        .ok()?;
    Some(out)
}

/// The process's `CUDAPOOL_RUNTIME_DIR` as it started (its /proc environment), printable:
/// the process's owner wrote it.
fn runtime_dir(dir: &Path) -> Option<String> {
    let env = read(&dir.join("environ"))?;
    env.split(|&b| b == 0)
        .find_map(|kv| kv.strip_prefix(b"CUDAPOOL_RUNTIME_DIR="))
        .filter(|v| !v.is_empty())
        .map(printable)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_cause_is_told_apart() {
        let me = std::process::id();
        // A pid no process has (above the kernel's pid_max limit of 4194304).
        assert!(no_process(4_194_999, false).ends_with("no process has pid 4194999"));
        // This test runs without cudapool.
        let line = no_process(me, false);
        assert!(
            line.contains(&format!("pid {me} runs without cudapool")),
            "{line}"
        );
    }
}
