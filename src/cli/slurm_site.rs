//! The site's settings for `cudapool slurm` and `jobstat`: one file, `/etc/cudapool/slurm.conf`
//! (or `--config FILE`, or `CUDAPOOL_SLURM_CONFIG` in slurmd's environment), lines
//! `no_gpumem=none|SIZE` (the share of a job that asked for no gpumem), `library=PATH` (the
//! library the TaskProlog preloads) and `slurm_bin=DIR` (where Slurm's commands are). When read
//! as root it must be a file of root that nobody else may write. Slurm's commands are run by
//! absolute path, never found through `PATH` (`slurm_command`).

use cudapool::base::config::parse_size;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

pub const DEFAULT_CONFIG: &str = "/etc/cudapool/slurm.conf";
const MAX_CONFIG: u64 = 4096;

/// The site's settings.
#[derive(Debug, Default, PartialEq)]
pub struct Site {
    /// Per GPU, for a job that asked for no gpumem (`None`: no share, no limit).
    pub no_gpumem: Option<u64>,
    pub library: Option<PathBuf>,
    /// Where Slurm's commands are (`slurm_bin=DIR`), when not in a folder Slurm's packages use.
    pub slurm_bin: Option<PathBuf>,
    /// `overcommit=F` (more than 1, at most 16): the node admits F times each GPU's memory in
    /// `gpumem`; a job may hold F times its request, and root's arbiter puts jobs above their
    /// request to sleep for others (idle ones first). `None`: 1, no overcommit.
    pub overcommit: Option<f64>,
    /// `sleep_idle=DURATION`: how long a job's device work must have been idle before the
    /// arbiter may put it to sleep for another ([`SLEEP_IDLE`] by default).
    pub sleep_idle: Option<std::time::Duration>,
    /// `checkpoint=no`: the arbiter leaves a job's process that did not put itself to sleep
    /// holding the GPU (saying so), rather than have the driver checkpoint it (the default).
    pub no_checkpoint: bool,
}

/// How long a job must have been idle before root's arbiter may put it to sleep, unless the
/// site says (`sleep_idle=`).
pub const SLEEP_IDLE: std::time::Duration = std::time::Duration::from_secs(60);

/// The folders Slurm's packages and builds install their commands into, searched in this
/// order when the site names none. Never `PATH`: Slurm gives its prologs none, and a user's
/// `PATH` is the user's.
const SLURM_FOLDERS: [&str; 5] = [
    "/usr/bin",
    "/usr/local/bin",
    "/opt/slurm/bin",
    "/usr/local/slurm/bin",
    "/opt/slurm/current/bin",
];

/// The file `--config` named for this command (`cudapool slurm --config FILE ...`), which every
/// read of the settings follows, the look-up of Slurm's commands too.
static NAMED: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();

/// Records `--config` (once, before anything reads the settings).
pub fn name_config(path: Option<&Path>) {
    let _ = NAMED.set(path.map(Path::to_path_buf));
}

/// Slurm's command `name` (`squeue`, `sacct`, `sacctmgr`) by absolute path: in the site's
/// `slurm_bin=DIR`, else the first of [`SLURM_FOLDERS`] that has it. `Err`: where it was looked
/// for, in one line.
pub fn slurm_command(name: &str) -> Result<std::process::Command, String> {
    let site = site(None).unwrap_or_default();
    let folders: Vec<PathBuf> = match &site.slurm_bin {
        Some(d) => vec![d.clone()],
        None => SLURM_FOLDERS.iter().map(PathBuf::from).collect(),
    };
    folders
        .iter()
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .map(std::process::Command::new)
        .ok_or_else(|| {
            let looked: Vec<String> = folders.iter().map(|d| d.display().to_string()).collect();
            format!(
                "Slurm's {name} is in none of {} (name its folder as slurm_bin=DIR in {DEFAULT_CONFIG})",
                looked.join(", ")
            )
        })
}

pub fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

/// A folder of root that nobody else may write, made (0755) if absent; refused otherwise.
pub fn root_dir(path: &Path) -> Result<(), String> {
    match std::fs::create_dir(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("cannot make {}: {e}", path.display())),
    }
    let m = std::fs::symlink_metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if !m.is_dir() || m.uid() != 0 {
        return Err(format!("{}: not a folder of root", path.display()));
    }
    // Only a folder of root's: set to 0755 (never writable by others).
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// Reads the site's settings. An absent default file is the defaults; as root, a file that is
/// not root's alone is refused.
pub fn site(explicit: Option<&Path>) -> Result<Site, String> {
    let from_env = std::env::var_os("CUDAPOOL_SLURM_CONFIG").map(PathBuf::from);
    let named = explicit
        .map(Path::to_path_buf)
        .or_else(|| NAMED.get().cloned().flatten());
    let (path, must) = match named.or(from_env) {
        Some(p) => (p, true),
        None => (PathBuf::from(DEFAULT_CONFIG), false),
    };
    // As root, a file only root may write; read by a user, theirs to name.
    let text = match cudapool::base::job::read_small(&path, MAX_CONFIG, euid() == 0)? {
        Some(t) => t,
        None if !must => return Ok(Site::default()),
        None => return Err(format!("{}: no such file", path.display())),
    };
    parse_site(&text).map_err(|e| format!("{}: {e}", path.display()))
}

pub fn parse_site(text: &str) -> Result<Site, String> {
    let mut s = Site::default();
    for setting in cudapool::base::job::settings(text) {
        let (k, v) = setting?;
        match k {
            "no_gpumem" => {
                s.no_gpumem = match v {
                    "none" => None,
                    v => Some(parse_size(v).map_err(|e| format!("no_gpumem: {e}"))?),
                }
            }
            "library" => s.library = Some(PathBuf::from(v)),
            "slurm_bin" if Path::new(v).is_absolute() => s.slurm_bin = Some(PathBuf::from(v)),
            "slurm_bin" => return Err(format!("slurm_bin: {v:?} is not an absolute path")),
            "overcommit" => {
                let f: f64 = v
                    .trim()
                    .parse()
                    .map_err(|_| format!("overcommit: {v:?} is not a number"))?;
                if !(1.0..=16.0).contains(&f) {
                    return Err(format!("overcommit: {v} is not from 1 to 16"));
                }
                s.overcommit = (f > 1.0).then_some(f);
            }
            "sleep_idle" => {
                s.sleep_idle = Some(
                    cudapool::base::config::parse_duration(v)
                        .map_err(|e| format!("sleep_idle: {e}"))?,
                )
            }
            "checkpoint" => {
                s.no_checkpoint = match v {
                    "yes" => false,
                    "no" => true,
                    v => return Err(format!("checkpoint: {v:?} is not yes or no")),
                }
            }
            other => {
                return Err(format!(
                    "unknown setting {other:?} (no_gpumem=none|SIZE, library=PATH, slurm_bin=DIR, overcommit=FACTOR, sleep_idle=DURATION, checkpoint=yes|no)"
                ))
            }
        }
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_site_file_is_strict() {
        assert_eq!(
            parse_site("# the site\nno_gpumem=2GiB\nlibrary=/opt/cudapool/libcudapool.so\n"),
            Ok(Site {
                no_gpumem: Some(2 << 30),
                library: Some("/opt/cudapool/libcudapool.so".into()),
                slurm_bin: None,
                overcommit: None,
                sleep_idle: None,
                no_checkpoint: false,
            })
        );
        let s = parse_site("overcommit=2\nsleep_idle=90s\n").unwrap();
        assert_eq!(
            (s.overcommit, s.sleep_idle),
            (Some(2.0), Some(std::time::Duration::from_secs(90)))
        );
        assert_eq!(parse_site("overcommit=1").map(|s| s.overcommit), Ok(None));
        assert_eq!(
            parse_site("checkpoint=no").map(|s| s.no_checkpoint),
            Ok(true)
        );
        assert_eq!(
            parse_site("checkpoint=yes").map(|s| s.no_checkpoint),
            Ok(false)
        );
        for bad in [
            "overcommit=0.5",
            "overcommit=17",
            "overcommit=two",
            "sleep_idle=soon",
            "checkpoint=off",
        ] {
            assert!(parse_site(bad).is_err(), "{bad}");
        }
        assert_eq!(
            parse_site("slurm_bin=/opt/slurm-23/bin").map(|s| s.slurm_bin),
            Ok(Some("/opt/slurm-23/bin".into()))
        );
        assert!(
            parse_site("slurm_bin=bin").is_err(),
            "relative: PATH by the back door"
        );
        assert_eq!(parse_site("no_gpumem=none"), Ok(Site::default()));
        assert!(parse_site("no_gpumen=1G").is_err());
        assert!(parse_site("no_gpumem").is_err());
    }
}
