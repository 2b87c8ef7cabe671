//! The mandatory mode (docs/deploying.md): a site preloads cudapool for every process of a node
//! (`/etc/ld.so.preload`) and its scheduler's root prolog writes each job's share into a file
//! only root can write, `/run/cudapool/jobs/<jobid>`. A process belongs to the job its cgroup
//! path names (Slurm puts every task in `.../job_<id>/step_<n>/...`): something a process cannot
//! forge, unlike `SLURM_JOB_ID` in its environment. Such a process is in the job's group
//! (`slurm-<id>` unless the file names another) under the file's limit; its environment may lower
//! that limit, never raise it, and cannot turn cudapool off.
//!
//! The file, checked on its descriptor (and its folder likewise, never through a link): a
//! regular file of root that nobody else may write, at most 4 KiB, lines `limit=SIZE` (or a
//! per-device list) and optionally `group=NAME`. A limit of 0 there is a share of nothing: every
//! allocation is refused (elsewhere 0 means "no limit").
//!
//! **Where the job's group lives.** Its ledger is `/run/cudapool/jobs/<jobid>.d/group-<group>`:
//! a folder of root the user cannot write, holding one file of the user's that root's prolog
//! made. The user's processes write their reservations into it but cannot remove, replace or
//! move it, and no variable moves it elsewhere (`CUDAPOOL_RUNTIME_DIR` places only pages). The
//! limit each member enforces is the share read here, on every decision: the ledger's own limit
//! field is only what readers display. A process outside the job cannot name `slurm-<jobid>` on
//! a node that runs the mandatory mode ([`foreign_slurm_group`]).

use super::config::{parse_device_limits, parse_group, Config, DeviceLimits, Limit};
use std::io::Read as _;
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _};
use std::path::Path;

/// Applies the share of the job this process runs in (the mandatory mode, `job`): the job's
/// group and limit; the environment may lower the limit, never raise it, nor name another
/// group, nor turn cudapool off. What it overrode is said (`notes`).
pub fn apply(c: &mut Config, share: JobShare) {
    let job = &share.job;
    if c.disable {
        c.disable = false;
        c.job_notes.push(format!(
            "CUDAPOOL_DISABLE ignored: this process runs in job {job}, whose GPU memory is held to its share"
        ));
    }
    if let Some(g) = c.group.as_ref().filter(|g| **g != share.group) {
        c.job_notes.push(format!(
            "CUDAPOOL_GROUP={g} ignored: this process runs in job {job}, group {}",
            share.group
        ));
    }
    c.group = Some(share.group.clone());
    let lower = match (c.group_limit.all, share.limit.all) {
        (Some(Limit::Bytes(mine)), Some(Limit::Bytes(theirs))) if mine > 0 && mine < theirs => {
            Some(c.group_limit.clone())
        }
        _ => None,
    };
    match lower {
        Some(l) => c.group_limit = l,
        None => {
            if c.group_limit.is_set() && c.group_limit != share.limit {
                c.job_notes.push(format!(
                    "CUDAPOOL_GROUP_LIMIT ignored: job {job}'s share is the limit (the environment may only lower it, as one SIZE)"
                ));
            }
            c.group_limit = share.limit;
        }
    }
    if !c.faults.is_empty() {
        c.faults.clear();
        c.job_notes.push(format!(
            "CUDAPOOL_FAULTS ignored: this process runs in job {job}, whose GPU memory is held to its share"
        ));
    }
    if c.sleep.suspend == Some(false) {
        c.sleep.suspend = None;
        c.job_notes.push(format!(
            "CUDAPOOL_SUSPEND=keep ignored: this process runs in job {job}, whose GPU memory goes back when Slurm suspends it"
        ));
    }
    if let Some(r) = share.request {
        // The floor root's arbiter judges by: the environment cannot raise it (a job at or
        // under its request is never put to sleep for another).
        if c.sleep.request.is_set() {
            c.job_notes.push(format!(
                "CUDAPOOL_MEMORY_REQUEST ignored: job {job}'s request is its gpumem"
            ));
        }
        c.sleep.request = DeviceLimits {
            all: Some(Limit::Bytes(r)),
            ..DeviceLimits::default()
        };
        c.job_overcommitted = true;
    }
    c.group_dir = Some(ledger_dir(job));
    c.group_fixed = true;
    c.job = Some(share.job);
}

/// The folder of root that holds job `job`'s group ledger (made by the prolog).
pub fn ledger_dir(job: &str) -> std::path::PathBuf {
    Path::new(JOBS_DIR).join(format!("{job}.d"))
}

/// A group this process may not join: `slurm-<id>` named by a process that does not run in job
/// `<id>`, on a node that runs the mandatory mode (its jobs folder exists). Such a name is the
/// job's, and a process outside it could otherwise fix or fill the job's group. `None`: fine.
pub fn foreign_slurm_group(group: &str, my_job: Option<&str>) -> Option<String> {
    let id = group.strip_prefix("slurm-")?;
    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) || my_job == Some(id) {
        return None;
    }
    std::fs::symlink_metadata(JOBS_DIR).ok()?;
    Some(format!(
        "group {group} is Slurm job {id}'s, and this process does not run in that job ({}): it may not join it",
        my_job.map_or("in no job".to_string(), |j| format!("in job {j}"))
    ))
}

/// Where the root prolog writes the jobs' files.
pub const JOBS_DIR: &str = "/run/cudapool/jobs";
/// Where root's arbiter listens on a node whose GPU memory is overcommitted (`cudapool slurm
/// arbiter`), in root's folder beside the jobs'.
pub const ARBITER_SOCKET: &str = "/run/cudapool/arbiter.sock";

/// The job process `pid` runs in, from its cgroups (at most 64 KiB read, as the kernel keeps
/// them: no user can forge them); `None` when it is in none or is gone.
pub fn job_of_pid(pid: u32) -> Option<String> {
    let mut text = String::new();
    std::fs::File::open(format!("/proc/{pid}/cgroup"))
        .ok()?
        .take(64 << 10)
        .read_to_string(&mut text)
        .ok()?;
    job_of_cgroups(&text)
}
const MAX_FILE: u64 = 4096;

/// What a job's file says.
#[derive(Clone, Debug, PartialEq)]
pub struct JobShare {
    pub job: String,
    pub group: String,
    pub limit: DeviceLimits,
    /// On a node whose GPU memory is overcommitted (`overcommit=` in the site's settings): the
    /// job's `gpumem` per GPU, its floor; root's arbiter may put the job to sleep for another
    /// while it holds more than this and is idle (`cudapool slurm arbiter`).
    pub request: Option<u64>,
}

/// The job id a cgroup listing (`/proc/self/cgroup`'s text) names, read only where Slurm
/// tracks its tasks and no user can place a process: cgroup v1's `freezer` hierarchy
/// (`.../job_<id>/step_<n>/...`, root's alone), or v2's single hierarchy under
/// `slurmstepd.scope/job_<id>/` (a process can move only between cgroups whose common
/// ancestor it may write, and that scope is root's). Any other hierarchy is ignored: a user may
/// own cgroups in one (systemd's delegation of `user@UID.service` in `name=systemd`) and name a
/// folder there `job_<n>`.
pub fn job_of_cgroups(text: &str) -> Option<String> {
    let job = |c: &str| {
        let id = c.strip_prefix("job_")?;
        (!id.is_empty() && id.len() <= 20 && id.bytes().all(|b| b.is_ascii_digit()))
            .then(|| id.to_string())
    };
    text.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_, controllers, path) = (f.next()?, f.next()?, f.next()?);
        let parts: Vec<&str> = path.split('/').collect();
        if controllers.split(',').any(|c| c == "freezer") {
            parts.iter().find_map(|c| job(c))
        } else if controllers.is_empty() {
            // v2: the component right after `slurmstepd.scope`.
            let at = parts.iter().position(|c| *c == "slurmstepd.scope")?;
            job(parts.get(at + 1)?)
        } else {
            None
        }
    })
}

/// The text of job `job`'s share file: its group and `bytes` per GPU (0: a share of nothing),
/// and on an overcommitted node its `request` per GPU. The one writer of the format
/// [`read_share`] reads (the root Prolog, `cudapool slurm`).
pub fn share_text(job: &str, bytes: u64, request: Option<u64>) -> String {
    match request {
        Some(r) => format!("group=slurm-{job}\nlimit={bytes}\nrequest={r}\n"),
        None => format!("group=slurm-{job}\nlimit={bytes}\n"),
    }
}

/// The text of a small regular file, checked on its descriptor (never through a link, never a
/// FIFO or a device, at most `max` bytes); with `root_only`, refused unless it is root's and
/// nobody else may write it. `Ok(None)`: there is none. The share files and the site's
/// settings (`cudapool slurm`) are read so.
pub fn read_small(path: &Path, max: u64, root_only: bool) -> Result<Option<String>, String> {
    let f = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let m = f
        .metadata()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if !m.is_file() || m.len() > max {
        return Err(format!("{}: not a small regular file", path.display()));
    }
    if root_only && (m.uid() != 0 || m.mode() & 0o022 != 0) {
        return Err(format!(
            "{}: not a file of root that only root may write",
            path.display()
        ));
    }
    let mut text = String::new();
    f.take(max)
        .read_to_string(&mut text)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(Some(text))
}

/// Reads a job's file in `dir` (see the module's notes). `Ok(None)`: no file for the job.
pub fn read_share(dir: &Path, job: &str) -> Result<Option<JobShare>, String> {
    let meta = match std::fs::symlink_metadata(dir) {
        Ok(m) => m,
        Err(_) => return Ok(None),
    };
    if !meta.is_dir() || meta.uid() != 0 || meta.mode() & 0o022 != 0 {
        return Err(format!(
            "{}: not a folder of root that only root may write",
            dir.display()
        ));
    }
    let path = dir.join(job);
    let Some(text) = read_small(&path, MAX_FILE, true)? else {
        return Ok(None);
    };
    let mut share = JobShare {
        job: job.to_string(),
        group: format!("slurm-{job}"),
        limit: DeviceLimits::default(),
        request: None,
    };
    let mut limit = false;
    for setting in settings(&text) {
        let (k, v) = setting.map_err(|e| format!("{}: {e}", path.display()))?;
        match k {
            "limit" => {
                share.limit = parse_device_limits(v)
                    .map_err(|e| format!("{}: limit: {e}", path.display()))?;
                limit = true;
            }
            "group" => {
                share.group =
                    parse_group(v).map_err(|e| format!("{}: group: {e}", path.display()))?;
            }
            "request" => {
                share.request =
                    Some(v.trim().parse().map_err(|_| {
                        format!("{}: request: not a number of bytes", path.display())
                    })?);
            }
            other => return Err(format!("{}: unknown {other:?}", path.display())),
        }
    }
    if !limit {
        return Err(format!("{}: no limit=", path.display()));
    }
    // A share of nothing: one byte, which no allocation fits (0 would mean no limit).
    let nothing = |l: &Option<Limit>| matches!(l, Some(Limit::Bytes(0)));
    if nothing(&share.limit.all) {
        share.limit.all = Some(Limit::Bytes(1));
    }
    for (_, l) in share.limit.per_device.iter_mut() {
        if matches!(l, Limit::Bytes(0)) {
            *l = Limit::Bytes(1);
        }
    }
    Ok(Some(share))
}

/// The job's share as looked up when the library loaded, on a node that runs the mandatory
/// mode: then descriptors are not yet the program's to exhaust.
static AT_LOAD: std::sync::OnceLock<Result<Option<JobShare>, String>> = std::sync::OnceLock::new();

/// Whether this node runs the mandatory mode (the jobs' folder exists). `Err`: it cannot be
/// told (a stat that failed otherwise than "absent"), which callers take as yes.
fn mandatory_node() -> Result<bool, std::io::Error> {
    match std::fs::symlink_metadata(JOBS_DIR) {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// Looks the job's share up when the library loads (the crate's constructor), so that a
/// program cannot starve the look-up by taking every descriptor before its first CUDA call. On
/// a node without the mandatory mode, one failed stat is all.
pub fn look_up_at_load() {
    if !matches!(mandatory_node(), Ok(false)) {
        let _ = AT_LOAD.set(look_up());
    }
}

/// The job share found when the library loaded, if any (without looking again: for what the
/// load itself sets up).
pub fn share_at_load() -> Option<JobShare> {
    match AT_LOAD.get() {
        Some(Ok(Some(share))) => Some(share.clone()),
        _ => None,
    }
}

/// This process's job share, if it runs in a job whose file exists: `Err` is one line (a file
/// that is there but cannot be trusted fails closed: the caller refuses allocations, as does a
/// process whose job cannot be told on a node that runs the mandatory mode). The answer found
/// when the library loaded stands; one that failed then is sought again now.
pub fn this_process() -> Result<Option<JobShare>, String> {
    match AT_LOAD.get() {
        Some(Ok(share)) => Ok(share.clone()),
        _ => look_up(),
    }
}

fn look_up() -> Result<Option<JobShare>, String> {
    match mandatory_node() {
        Ok(false) => return Ok(None),
        Ok(true) => {}
        Err(e) => {
            return Err(format!(
                "{JOBS_DIR}: {e}: cannot tell whether this node holds jobs to their shares"
            ))
        }
    }
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").map_err(|e| {
        format!("/proc/self/cgroup: {e}: cannot tell which job this process runs in, so its share cannot be kept")
    })?;
    let Some(job) = job_of_cgroups(&cgroups) else {
        return Ok(None);
    };
    read_share(Path::new(JOBS_DIR), &job)
}

/// The `NAME=VALUE` lines of a settings file (the share files, the site's `slurm.conf`), each
/// name and value trimmed; blank lines and `#` comments skipped; a line without `=` is an error.
pub fn settings(text: &str) -> impl Iterator<Item = Result<(&str, &str), String>> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|line| {
            line.split_once('=')
                .map(|(k, v)| (k.trim(), v.trim()))
                .ok_or_else(|| format!("{line:?} is not NAME=VALUE"))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::config::Limit;

    #[test]
    fn the_job_is_the_one_the_cgroup_path_names() {
        let v1 = "12:freezer:/slurm/uid_1000/job_4242/step_0/task_1\n3:cpu:/\n";
        assert_eq!(job_of_cgroups(v1).as_deref(), Some("4242"));
        let v2 = "0::/system.slice/slurmstepd.scope/job_77/step_batch/user/task_0\n";
        assert_eq!(job_of_cgroups(v2).as_deref(), Some("77"));
        assert_eq!(job_of_cgroups("0::/user.slice/session-3.scope\n"), None);
        assert_eq!(job_of_cgroups("0::/job_x/\n"), None);
    }

    /// Issue 60, item 2: a `job_<n>` folder in a hierarchy a user may own (systemd's
    /// delegation, listed before `freezer`) [was taken: the process left its job].
    #[test]
    fn a_job_folder_in_a_users_hierarchy_is_not_the_job() {
        let forged = "13:name=systemd:/user.slice/user-1001.slice/user@1001.service/job_424242\n\
                      12:freezer:/slurm/uid_1001/job_7/step_0/task_0\n1:cpu,cpuacct:/job_9\n";
        assert_eq!(job_of_cgroups(forged).as_deref(), Some("7"));
        let v2 = "0::/user.slice/user-1001.slice/user@1001.service/job_424242/x\n";
        assert_eq!(job_of_cgroups(v2), None, "a user's own v2 subtree");
        assert_eq!(
            job_of_cgroups("3:cpu:/slurm/job_5\n"),
            None,
            "not the freezer"
        );
    }

    #[test]
    fn a_share_file_is_read_only_from_root_and_checked() {
        if unsafe { libc::geteuid() } != 0 {
            return; // files of root are needed
        }
        let d = std::env::temp_dir().join(format!("cudapool-jobs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("9"), "limit=64MiB\n").unwrap();
        let s = read_share(&d, "9").unwrap().unwrap();
        assert_eq!(s.group, "slurm-9");
        std::fs::write(d.join("14"), share_text("14", 5 << 20, None)).unwrap();
        let written = read_share(&d, "14").unwrap().unwrap();
        assert_eq!(
            (written.group.as_str(), written.limit.all),
            ("slurm-14", Some(Limit::Bytes(5 << 20)))
        );
        assert_eq!(s.limit.all, Some(Limit::Bytes(64 << 20)));
        std::fs::write(d.join("10"), "group=team\nlimit=0=1GiB,1=2GiB\n").unwrap();
        let s = read_share(&d, "10").unwrap().unwrap();
        assert_eq!(s.group, "team");
        assert_eq!(s.limit.for_device(1), Some(Limit::Bytes(2 << 30)));
        assert_eq!(read_share(&d, "11").unwrap(), None);
        std::fs::write(d.join("12"), "limit=lots\n").unwrap();
        assert!(read_share(&d, "12").is_err());
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(d.join("9"), std::fs::Permissions::from_mode(0o666)).unwrap();
        assert!(read_share(&d, "9").unwrap_err().contains("only root"));
        std::os::unix::fs::symlink(d.join("10"), d.join("13")).unwrap();
        assert!(read_share(&d, "13").is_err(), "never through a link");
        let _ = std::fs::remove_dir_all(&d);
    }
}
