//! `cudapool slurm prolog|epilog|task-prolog|share`: what Slurm's Prolog, Epilog and TaskProlog
//! do for cudapool (docs/deploying.md), in one program instead of shell. The files in
//! `deploy/slurm/` only hand over to it.
//!
//! **Nothing a user wrote is trusted.** The root Prolog reads the job's id, uid and GPUs from
//! the variables slurmd sets for it (`SLURM_JOB_ID`, `SLURM_JOB_UID`, `SLURM_JOB_GPUS`), and its
//! GPU-memory request from one field Slurm formats, the job's TRES per node (`squeue
//! --noheader --jobs=ID --format=%b`, run directly, never through a shell). Each is checked
//! against a strict grammar; anything else fails closed: the job gets the site's default share,
//! or a share of nothing (every allocation refused), never more, with one line on stderr.
//! Texts a user writes (`--comment`, the job's name) never reach it.
//!
//! **The record.** The root Epilog writes what the job used on the node (its group's peak per
//! GPU, refusals, members) into Slurm's accounting, the job's `AdminComment` (`jobstat`).
//!
//! **The share.** `--gres=gpumem:N` per node, split evenly over the job's GPUs on the node and
//! rounded up (never to 0 unless N is 0; a share of 0 refuses every allocation).
//!
//! **The site's settings** are in one file, `/etc/cudapool/slurm.conf` (`slurm_site`): the share
//! of a job that asked for no gpumem, the library the TaskProlog preloads, where Slurm's
//! commands are (run by absolute path, never through `PATH`, which Slurm gives a Prolog none of).

use super::slurm_site::{euid, root_dir, site, slurm_command, Site, DEFAULT_CONFIG};
use clap::{Args, Subcommand};
use cudapool::base::job::{ledger_dir, JOBS_DIR};
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Args)]
pub struct SlurmArgs {
    #[command(subcommand)]
    what: What,
    /// The site's settings (default /etc/cudapool/slurm.conf, or CUDAPOOL_SLURM_CONFIG)
    #[arg(long, value_name = "FILE", global = true)]
    config: Option<PathBuf>,
}

#[derive(Subcommand)]
enum What {
    /// Slurm's root Prolog: writes the job's share into /run/cudapool/jobs/JOBID (as root)
    Prolog,
    /// Slurm's root Epilog: removes the job's share and its group's folder (as root)
    Epilog,
    /// Slurm's TaskProlog: prints the exports that preload cudapool into the job's group
    TaskProlog,
    /// Root's arbiter on a node whose GPU memory is overcommitted (overcommit= in the site's
    /// settings): puts jobs above their request to sleep for others, idle ones first, busy ones
    /// for a job within its own request (as root, a service)
    Arbiter {
        /// Serve one request, then end (tests)
        #[arg(long)]
        once: bool,
    },
    /// Has the driver checkpoint a process, as the arbiter does for one that does not put
    /// itself to sleep: its CUDA calls wait, its device memory goes to its host memory; with
    /// --restore, brings it back and lets it run (as root; CUDA 12.8 or later drivers)
    Checkpoint {
        /// The process
        pid: u32,
        /// Restore it and unlock its calls instead
        #[arg(long)]
        restore: bool,
    },
    /// Prints a job's share of GPU memory per GPU on this node, in bytes
    Share {
        /// The job's id
        job: String,
        /// The GPUs the job has on this node (as SLURM_JOB_GPUS: 0,1)
        #[arg(long, value_name = "LIST")]
        gpus: Option<String>,
    },
}

use super::jobstat::job_id;

/// How many GPUs a `SLURM_JOB_GPUS` list names (`None` or empty: one). `Err`: not such a list.
fn gpu_count(list: Option<&str>) -> Result<u64, String> {
    let Some(list) = list.filter(|l| !l.is_empty()) else {
        return Ok(1);
    };
    let items: Vec<&str> = list.split(',').collect();
    if items.len() > 64
        || items
            .iter()
            .any(|i| i.is_empty() || i.len() > 4 || !i.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err(format!("{list:?} is not a list of GPU indices"));
    }
    Ok(items.len() as u64)
}

/// The gpumem count (bytes) in Slurm's TRES-per-node field: `N/A` or empty (none asked), or
/// comma-separated `gres[:/]NAME[:TYPE][:COUNT]` with Slurm's K/M/G/T/P (powers of 1024).
/// `Ok(None)`: no gpumem asked. `Err`: the field is not of that grammar, or names gpumem twice.
fn gpumem_of_tres(field: &str) -> Result<Option<u64>, String> {
    let field = field.trim();
    if field.is_empty() || field == "N/A" || field == "(null)" {
        return Ok(None);
    }
    if field.len() > 1024 {
        return Err("longer than any TRES list".into());
    }
    let word = |w: &str| {
        !w.is_empty()
            && w.len() <= 64
            && w.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
    };
    let count = |w: &str| -> Option<u64> {
        let (n, m) = match w.as_bytes().last()? {
            b'K' => (&w[..w.len() - 1], 1u64 << 10),
            b'M' => (&w[..w.len() - 1], 1 << 20),
            b'G' => (&w[..w.len() - 1], 1 << 30),
            b'T' => (&w[..w.len() - 1], 1 << 40),
            b'P' => (&w[..w.len() - 1], 1 << 50),
            _ => (w, 1),
        };
        if n.is_empty() || n.len() > 20 || !n.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        n.parse::<u64>().ok()?.checked_mul(m)
    };
    let looks_count = |w: &str| {
        let n = w.trim_end_matches(['K', 'M', 'G', 'T', 'P']);
        !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())
    };
    let mut found = None;
    for item in field.split(',') {
        let rest = item
            .strip_prefix("gres:")
            .or_else(|| item.strip_prefix("gres/"))
            .unwrap_or(item);
        let parts: Vec<&str> = rest.split(':').collect();
        let bad = || format!("{item:?} is not NAME[:TYPE][:COUNT]");
        if parts.is_empty() || parts.len() > 3 || !word(parts[0]) {
            return Err(bad());
        }
        let n = match parts.len() {
            1 => 1,
            2 => match count(parts[1]) {
                Some(n) => n,
                // NAME:TYPE, unless it reads as a count (one too large is no type).
                // gpumem is a count: its second part is never a type.
                None if word(parts[1]) && !looks_count(parts[1]) && parts[0] != "gpumem" => 1,
                None => return Err(bad()),
            },
            _ => {
                if !word(parts[1]) {
                    return Err(bad());
                }
                count(parts[2]).ok_or_else(bad)?
            }
        };
        if parts[0] == "gpumem" {
            if found.is_some() {
                return Err("gpumem named twice".into());
            }
            found = Some(n);
        }
    }
    Ok(found)
}

/// `bytes` per node split over `gpus`, rounded up.
fn per_gpu(bytes: u64, gpus: u64) -> u64 {
    bytes.div_ceil(gpus.max(1))
}

/// Asks Slurm for the job's TRES per node: one field, one line, no shell. Each line is the raw
/// job id and the field (`%A %b`): the id of an array job names every task of it (the last
/// task keeps the array's id), so the line is picked by its raw id.
fn tres_per_node(job: &str) -> Result<String, String> {
    let out = slurm_command("squeue")?
        .args(["--noheader", "--states=all", "--format=%A %b"])
        .arg(format!("--jobs={job}"))
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("cannot run squeue: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "squeue failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let text = String::from_utf8(out.stdout).map_err(|_| "squeue printed no text".to_string())?;
    let lines: Vec<&str> = text
        .lines()
        .filter_map(|l| {
            let (id, field) = l.trim().split_once(' ').unwrap_or((l.trim(), ""));
            (id == job).then_some(field)
        })
        .collect();
    match lines.as_slice() {
        [one] => Ok(one.trim().to_string()),
        [] => Err(format!("squeue knows no job {job}")),
        _ => Err(format!(
            "squeue printed {} lines for job {job}",
            lines.len()
        )),
    }
}

/// The job's share per GPU: `Ok(Some(bytes))`, `Ok(None)` when it asked for no gpumem, `Err`
/// when what Slurm said cannot be trusted (the caller fails closed).
fn share_of(job: &str, gpus: Option<&str>) -> Result<Option<u64>, String> {
    let gpus = gpu_count(gpus)?;
    let field = tres_per_node(job)?;
    Ok(gpumem_of_tres(&field)
        .map_err(|e| format!("the job's TRES per node {field:?}: {e}"))?
        .map(|b| per_gpu(b, gpus)))
}

/// What a job gets: its share, the site's default, or (when the record cannot be trusted)
/// the default or nothing. `None`: no share at all (no gpumem and no default).
fn decide(
    share: Result<Option<u64>, String>,
    site: &Site,
    say: &mut dyn FnMut(String),
) -> Option<u64> {
    match share {
        Ok(Some(b)) => Some(b),
        Ok(None) => site.no_gpumem,
        Err(why) => {
            let given = site.no_gpumem.unwrap_or(0);
            say(format!(
                "{why}; failing closed: the job's share is {}",
                if given == 0 {
                    "nothing (every allocation refused)".to_string()
                } else {
                    format!("the site's default, {given} bytes per GPU")
                }
            ));
            Some(given)
        }
    }
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

pub fn slurm(a: SlurmArgs) -> ExitCode {
    super::slurm_site::name_config(a.config.as_deref());
    let r = match a.what {
        What::Prolog => prolog(a.config.as_deref()),
        What::Epilog => epilog(),
        What::TaskProlog => task_prolog(a.config.as_deref()),
        What::Arbiter { once } => super::arbiter::arbiter(a.config.as_deref(), once),
        What::Checkpoint { pid, restore } => checkpoint_by_hand(pid, restore),
        What::Share { job, gpus } => job_id(&job).map(|job| match share_of(job, gpus.as_deref()) {
            Ok(Some(b)) => println!("{b}"),
            Ok(None) => println!("none"),
            Err(e) => eprintln!("cudapool slurm share: {e}"),
        }),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cudapool slurm: {e}");
            ExitCode::from(1)
        }
    }
}

/// The job's id as slurmd gives it to every Prolog, Epilog and TaskProlog; without it the
/// command was not started by Slurm, and says so (a user trying it by hand learns why nothing
/// happened, never a silent success).
fn from_slurm(what: &str) -> Result<String, String> {
    env("SLURM_JOB_ID").ok_or_else(|| {
        format!("{what}: SLURM_JOB_ID is not set: not started by Slurm, nothing done (slurmd runs it for each job: docs/deploying.md)")
    })
}

fn prolog(config: Option<&Path>) -> Result<(), String> {
    if euid() != 0 {
        return Err("the prolog runs as root (slurm.conf: Prolog=)".into());
    }
    let job = job_id(&from_slurm("prolog")?)?.to_string();
    let mut said = |l: String| eprintln!("cudapool slurm prolog: job {job}: {l}");
    let site = site(config).unwrap_or_else(|e| {
        said(format!("{e}; using no site settings"));
        Site::default()
    });
    let uid: u32 = env("SLURM_JOB_UID")
        .filter(|u| !u.is_empty() && u.len() <= 10 && u.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|u| u.parse().ok())
        .ok_or("SLURM_JOB_UID is not a uid")?;
    let share = share_of(&job, env("SLURM_JOB_GPUS").as_deref());
    let Some(request) = decide(share, &site, &mut said) else {
        return Ok(());
    };
    // Overcommitted (`overcommit=F`): the job may hold F times its request, which stays its
    // floor (root's arbiter judges by it); else the request is the limit.
    let (bytes, request) = match site.overcommit {
        Some(f) => (
            (request as f64 * f).min(u64::MAX as f64) as u64,
            Some(request),
        ),
        None => (request, None),
    };
    let jobs = Path::new(JOBS_DIR);
    root_dir(jobs.parent().unwrap_or(Path::new("/run")))?;
    root_dir(jobs)?;
    // What other jobs' users wrote past their ledgers goes first: root's writes below need
    // room on /run, which a user could otherwise fill through their own ledger.
    let cut = trim_ledgers(jobs);
    if cut > 0 {
        said(format!(
            "{cut} bytes written past other jobs' ledgers cut back (room on {} for the share files)",
            jobs.display()
        ));
    }
    // The group's folder: root's, holding one file of the job's user, made empty here.
    let gdir = ledger_dir(&job);
    remove_job_dir(&gdir)?;
    root_dir(&gdir)?;
    let gdir_fd = open_dir(&gdir)?;
    let ledger = CString::new(format!("group-slurm-{job}")).map_err(|e| e.to_string())?;
    // SAFETY: openat of a NUL-terminated name in our folder's descriptor; a new file only.
    let fd = unsafe {
        libc::openat(
            gdir_fd.as_raw_fd(),
            ledger.as_ptr(),
            libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            0o600,
        )
    };
    if fd < 0 {
        return Err(format!(
            "cannot make the group's ledger in {}: {}",
            gdir.display(),
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: a descriptor openat just gave us.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: fchown of the file we just made, to the job's user.
    if unsafe { libc::fchown(fd.as_raw_fd(), uid, u32::MAX) } != 0 {
        return Err(format!(
            "cannot give the ledger to user {uid}: {}",
            std::io::Error::last_os_error()
        ));
    }
    // The share file, written whole beside its name and renamed over it.
    let tmp = jobs.join(format!(".{job}.new"));
    let _ = std::fs::remove_file(&tmp);
    {
        use std::io::Write as _;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)
            .map_err(|e| format!("{}: {e}", tmp.display()))?;
        f.write_all(cudapool::base::job::share_text(&job, bytes, request).as_bytes())
            .map_err(|e| format!("{}: {e}", tmp.display()))?;
    }
    std::fs::rename(&tmp, jobs.join(&job)).map_err(|e| format!("{}: {e}", jobs.display()))?;
    Ok(())
}

/// Cuts every job's ledger in `jobs` (`<id>.d/group-*`, files its job's user may write) back to
/// a ledger's size, never through a link; returns the bytes cut. The folders are root's (only
/// root makes names in them), each file is looked at on its descriptor, and at most a few
/// thousand entries are read.
fn trim_ledgers(jobs: &Path) -> u64 {
    let keep = cudapool::limits::group::ledger::SIZE as u64;
    let mut cut = 0;
    let Ok(entries) = std::fs::read_dir(jobs) else {
        return 0;
    };
    for dir in entries.flatten().take(4096) {
        let name = dir.file_name().to_string_lossy().into_owned();
        let is_job = name
            .strip_suffix(".d")
            .is_some_and(|id| super::jobstat::job_id(id).is_ok());
        let Ok(meta) = std::fs::symlink_metadata(dir.path()) else {
            continue;
        };
        if !is_job || !meta.is_dir() || meta.uid() != 0 {
            continue;
        }
        let Ok(files) = std::fs::read_dir(dir.path()) else {
            continue;
        };
        for f in files.flatten().take(64) {
            if !f.file_name().to_string_lossy().starts_with("group-") {
                continue;
            }
            let Ok(file) = std::fs::OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
                .open(f.path())
            else {
                continue;
            };
            match file.metadata() {
                Ok(m) if m.is_file() && m.len() > keep && file.set_len(keep).is_ok() => {
                    cut += m.len() - keep;
                }
                _ => {}
            }
        }
    }
    cut
}

fn open_dir(path: &Path) -> Result<OwnedFd, String> {
    let c = CString::new(path.as_os_str().as_encoded_bytes()).map_err(|e| e.to_string())?;
    // SAFETY: open(2) of a NUL-terminated path, never through a link.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(format!(
            "{}: {}",
            path.display(),
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: a descriptor open just gave us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Removes a job's group folder and what is in it (files only: root made it and nobody else
/// could write in it), never through a link. Absent: nothing to do.
fn remove_job_dir(path: &Path) -> Result<(), String> {
    let m = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(_) => return Ok(()),
    };
    if !m.is_dir() {
        return std::fs::remove_file(path).map_err(|e| format!("{}: {e}", path.display()));
    }
    let fd = open_dir(path)?;
    let entries = std::fs::read_dir(path).map_err(|e| format!("{}: {e}", path.display()))?;
    for e in entries.flatten().take(1024) {
        let Ok(c) = CString::new(e.file_name().as_encoded_bytes()) else {
            continue;
        };
        // SAFETY: unlinkat of a name in our folder's descriptor; a folder is refused.
        unsafe { libc::unlinkat(fd.as_raw_fd(), c.as_ptr(), 0) };
    }
    std::fs::remove_dir(path).map_err(|e| format!("{}: {e}", path.display()))
}

fn epilog() -> Result<(), String> {
    if euid() != 0 {
        return Err("the epilog runs as root (slurm.conf: Epilog=)".into());
    }
    let job = from_slurm("epilog")?;
    let job = job_id(&job)?;
    let jobs = Path::new(JOBS_DIR);
    if std::fs::symlink_metadata(jobs).is_err() {
        return Ok(());
    }
    // What the job used on this node, read before its files go and recorded in Slurm's
    // accounting after (which may wait for the job's record to reach it).
    let mut entry = super::jobstat::node_entry(job);
    if let Some([n, bytes, seconds]) = super::checkpointed::job_record(job) {
        // Processes the arbiter had the driver checkpoint: they did not sleep when asked.
        node_log(&format!(
            "cudapool: job {job}: {n} of its processes did not put themselves to sleep for another job and were checkpointed by the driver (sacct -o AdminComment)"
        ));
        let e = entry.get_or_insert_with(|| serde_json::json!({}));
        e["checkpoints"] = serde_json::json!({ "count": n, "bytes": bytes, "seconds": seconds });
    }
    let _ = std::fs::remove_file(jobs.join(job));
    let removed = remove_job_dir(&ledger_dir(job));
    if let Some(entry) = entry {
        let late = entry["suspends"]["late"].as_u64().unwrap_or(0);
        if late > 0 {
            // The node's log: a suspend that did not free the GPU in time.
            node_log(&format!(
                "cudapool: job {job}: {late} of its processes did not give their GPU memory back within the 2 s Slurm waits when it suspended the job (sacct -o AdminComment)"
            ));
        }
        if let Err(e) = super::jobstat::record(job, entry) {
            eprintln!("cudapool slurm epilog: job {job}: its GPU memory is not recorded: {e}");
        }
    }
    removed
}

/// `cudapool slurm checkpoint PID [--restore]`: one line with what was done and how long it took.
fn checkpoint_by_hand(pid: u32, restore: bool) -> Result<(), String> {
    if euid() != 0 {
        return Err("checkpoint runs as root (it stops another user's CUDA calls)".into());
    }
    let c = super::checkpoint::checkpointer()?;
    let t = std::time::Instant::now();
    if restore {
        c.resume(pid)?;
    } else {
        c.suspend(pid, std::time::Duration::from_secs(10))?;
    }
    println!(
        "pid {pid}: {} in {:.3} s",
        if restore { "restored" } else { "checkpointed" },
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

/// One line in the node's log (syslog, as the daemon facility) and on stderr.
fn node_log(line: &str) {
    eprintln!("{line}");
    if let Ok(c) = std::ffi::CString::new(line.replace('%', "%%")) {
        // SAFETY: a NUL-terminated format without conversions (every % doubled) and no
        // arguments; openlog's identity is a static string.
        unsafe {
            libc::openlog(c"cudapool".as_ptr(), libc::LOG_PID, libc::LOG_DAEMON);
            libc::syslog(libc::LOG_WARNING, c.as_ptr());
        }
    }
}

fn task_prolog(config: Option<&Path>) -> Result<(), String> {
    let say = |l: &str| println!("print cudapool task prolog: {l}");
    let job = from_slurm("task-prolog")?;
    let job = job_id(&job)?;
    let site = match site(config) {
        Ok(s) => s,
        Err(e) => {
            say(&format!("{e}: the job runs without cudapool"));
            return Ok(());
        }
    };
    let lib = match &site.library {
        Some(l) => l.clone(),
        None => match super::run::find_library() {
            Ok(l) => l,
            Err(e) => {
                say(&format!("no libcudapool.so ({e}; set library= in {DEFAULT_CONFIG}): the job runs without cudapool"));
                return Ok(());
            }
        },
    };
    if !lib.is_file() {
        say(&format!(
            "{} is not a file: the job runs without cudapool",
            lib.display()
        ));
        return Ok(());
    }
    let gpus = env("CUDA_VISIBLE_DEVICES").or_else(|| env("SLURM_JOB_GPUS"));
    let mut said = |l: String| say(&l);
    let Some(bytes) = decide(share_of(job, gpus.as_deref()), &site, &mut said) else {
        return Ok(());
    };
    let preload = match env("LD_PRELOAD").filter(|p| !p.is_empty()) {
        Some(p) => format!("{}:{p}", lib.display()),
        None => lib.display().to_string(),
    };
    println!("export LD_PRELOAD={preload}");
    println!("export CUDAPOOL_GROUP=slurm-{job}");
    // A share of nothing: one byte, which no allocation fits (0 would mean no limit).
    println!("export CUDAPOOL_GROUP_LIMIT={}", bytes.max(1));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tres_field_is_read_by_a_strict_grammar() {
        assert_eq!(gpumem_of_tres("gres:gpumem:256M"), Ok(Some(256 << 20)));
        assert_eq!(gpumem_of_tres("gres/gpumem:1G"), Ok(Some(1 << 30)));
        assert_eq!(
            gpumem_of_tres("gres:gpu:2,gres:gpumem:64M"),
            Ok(Some(64 << 20))
        );
        assert_eq!(gpumem_of_tres("gres:gpumem:a100:2G"), Ok(Some(2 << 30)));
        assert_eq!(gpumem_of_tres("gres:gpumem:0"), Ok(Some(0)));
        assert_eq!(gpumem_of_tres("gres:gpumem:1048576"), Ok(Some(1 << 20)));
        assert_eq!(gpumem_of_tres("gres:gpu:1"), Ok(None));
        assert_eq!(gpumem_of_tres("N/A"), Ok(None));
        assert_eq!(gpumem_of_tres(""), Ok(None));
        for forged in [
            "gres:gpumem:64M GRES=gpumem:1T",
            "gres:gpumem:64M\nNodes=vm GRES=gpumem:1T",
            "gres:gpumem:64M,gres:gpumem:1T",
            "plain TresPerNode=gres:gpumem:1P",
            "gres:gpumem:1;id",
            "gres:gpumem:99999999999999999999P",
            "gres:gpumem:1.5G",
            "gres:gpumem:$(id)",
        ] {
            assert!(gpumem_of_tres(forged).is_err(), "{forged:?} refused");
        }
    }

    #[test]
    fn a_share_split_over_gpus_rounds_up_never_to_zero() {
        assert_eq!(per_gpu(1, 2), 1, "gpumem:1 over two GPUs");
        assert_eq!(per_gpu(40 << 30, 2), 20 << 30);
        assert_eq!(per_gpu(7, 2), 4);
        assert_eq!(per_gpu(0, 2), 0, "a share of nothing stays nothing");
        assert_eq!(gpu_count(Some("0,1")), Ok(2));
        assert_eq!(gpu_count(None), Ok(1));
        assert!(gpu_count(Some("0,1;rm")).is_err());
        assert!(gpu_count(Some("0,,1")).is_err());
    }

    #[test]
    fn what_cannot_be_trusted_fails_closed() {
        let mut lines = Vec::new();
        let none = Site::default();
        let eight = Site {
            no_gpumem: Some(8 << 20),
            ..Site::default()
        };
        assert_eq!(decide(Ok(Some(5)), &none, &mut |l| lines.push(l)), Some(5));
        assert_eq!(decide(Ok(None), &none, &mut |l| lines.push(l)), None);
        assert_eq!(
            decide(Ok(None), &eight, &mut |l| lines.push(l)),
            Some(8 << 20)
        );
        assert!(lines.is_empty());
        assert_eq!(
            decide(Err("odd".into()), &none, &mut |l| lines.push(l)),
            Some(0)
        );
        assert_eq!(
            decide(Err("odd".into()), &eight, &mut |l| lines.push(l)),
            Some(8 << 20)
        );
        assert_eq!(lines.len(), 2, "one line each: {lines:?}");
        assert!(lines[0].contains("every allocation refused"));
    }
}
