//! `CUDAPOOL_*` environment parsing (the README's variables). Pure: no driver, no FFI.
//!
//! The environment is read once when the library loads. A bad value does not print anything at
//! load time (a process that makes no CUDA call is never disturbed); it is kept as a
//! [`ConfigError`] and the shim refuses allocations, loudly, at the first CUDA call it sees.
//!
//! What is not wrong enough to refuse but must be said (a file that cannot be written, an
//! unknown `CUDAPOOL_*` name, a soft limit above the hard one) is in [`Config::notes`] and
//! [`names::unknown`]: the library says each once when it becomes active, `cudapool run`
//! refuses before it starts the program.

mod cache_idle;
mod faults;
mod kinds;
pub mod names;
mod sleep;
pub use cache_idle::CacheIdle;
pub use faults::{parse_faults, Fault};
pub use kinds::{PoolKind, Reuse, Segments, Stitch};
pub use sleep::{parse_duration, SleepSettings, DURATION_FORMS};

use std::fmt;
use std::path::PathBuf;

/// `CUDAPOOL_LOG`, ordered from quietest to loudest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    Error,
    Warn,
    Info,
    Debug,
}

/// `CUDAPOOL_REPORT`: where the exit report goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReportTarget {
    Stderr,
    File(PathBuf),
}

/// One limit as written by the user, before the device's total memory is known.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Limit {
    /// Bytes; 0 means "no limit" (as for `cudapool_set_memory_limit`).
    Bytes(u64),
    /// Percent of the device's total memory, in (0, 100].
    Percent(f64),
}

impl Limit {
    /// The limit in bytes for a device with `total` bytes of memory; 0 means none.
    pub fn resolve(self, total: u64) -> u64 {
        match self {
            Limit::Bytes(b) => b,
            Limit::Percent(p) => ((total as f64) * p / 100.0).floor() as u64,
        }
    }
}

/// A SIZE or a per-device list (`0=8GiB,1=50%`). Devices not named have no limit.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DeviceLimits {
    /// Applies to every device (a bare SIZE).
    pub all: Option<Limit>,
    /// (CUDA ordinal, limit) pairs of a per-device list.
    pub per_device: Vec<(u32, Limit)>,
}

impl DeviceLimits {
    /// The limits in words, each size also in bytes and binary units (SIZE's units are
    /// decimal: `256M` is 256,000,000 bytes, 244.14 MiB, where Slurm's `256M` is 256 MiB).
    pub fn words(&self) -> String {
        let one = |l: &Limit| match *l {
            Limit::Bytes(0) => "none".to_string(),
            Limit::Bytes(b) => format!(
                "{b} bytes ({:.2} MiB, {:.2} GiB)",
                b as f64 / (1u64 << 20) as f64,
                b as f64 / (1u64 << 30) as f64
            ),
            Limit::Percent(p) => format!("{p}% of the device's memory"),
        };
        let mut parts: Vec<String> = self
            .per_device
            .iter()
            .map(|(d, l)| format!("device {d}: {}", one(l)))
            .collect();
        if let Some(l) = &self.all {
            parts.push(if parts.is_empty() {
                format!("{} on each device", one(l))
            } else {
                format!("others: {}", one(l))
            });
        }
        parts.join("; ")
    }

    pub fn for_device(&self, ordinal: u32) -> Option<Limit> {
        self.per_device
            .iter()
            .find(|(d, _)| *d == ordinal)
            .map(|(_, l)| *l)
            .or(self.all)
    }

    pub fn is_set(&self) -> bool {
        self.all.is_some() || !self.per_device.is_empty()
    }
}

/// Everything the environment says. `Default` is what an empty environment means.
/// The most events `CUDAPOOL_HISTORY` keeps per device (about 1 GiB of host memory).
pub const MAX_HISTORY: usize = 10_000_000;

#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub pool: PoolKind,
    pub memory_limit: DeviceLimits,
    pub soft_limit: DeviceLimits,
    pub reuse: Reuse,
    pub report: Option<ReportTarget>,
    pub track: u8,
    /// `CUDAPOOL_HISTORY`: allocator events kept per device (0: none).
    pub history: usize,
    pub trace: Option<PathBuf>,
    pub log: LogLevel,
    pub disable: bool,
    /// `CUDAPOOL_FAULTS` (a debug setting, README): driver calls made to fail.
    pub faults: Vec<Fault>,
    /// `CUDAPOOL_GROUP`: the group this process joins (processes of the same user and name
    /// share one budget per GPU).
    pub group: Option<String>,
    /// `CUDAPOOL_GROUP_LIMIT`: the group's hard limit, as this process names it.
    pub group_limit: DeviceLimits,
    /// `CUDAPOOL_SEGMENTS`.
    pub segments: Segments,
    /// Whether `CUDAPOOL_SEGMENTS` was set (rather than defaulted).
    pub segments_set: bool,
    /// `CUDAPOOL_STITCH`.
    pub stitch: Stitch,
    /// `CUDAPOOL_RUNTIME_DIR`: where the live page and group ledgers live (`rundir`), when not
    /// in the default place.
    pub runtime_dir: Option<PathBuf>,
    /// `CUDAPOOL_OOM_SNAPSHOT`: where to write a snapshot at each out-of-memory answer the
    /// program receives (`%p` the pid, `%n` the answer's number).
    pub oom_snapshot: Option<String>,
    /// `CUDAPOOL_OOM_SNAPSHOT_KEEP`: with `%n` in the snapshot's path, how many of this
    /// process's snapshot files are kept (the oldest removed).
    pub oom_snapshot_keep: usize,
    /// The job this process runs in under the mandatory mode (`job`), and what of its
    /// environment the job's share overrode (said once, with the other notes).
    pub job: Option<String>,
    pub job_notes: Vec<String>,
    /// The job runs on a node whose GPU memory is overcommitted (its share file names a
    /// request): a refusal by the driver first asks root's arbiter for room.
    pub job_overcommitted: bool,
    /// Where the group's ledger lives when not in the runtime directory: the job's folder of
    /// root under the mandatory mode (`job::ledger_dir`).
    pub group_dir: Option<PathBuf>,
    /// Whether the group limit is this process's own on every decision (the mandatory mode: the
    /// job's share), whatever the group's ledger records.
    pub group_fixed: bool,
    /// `CUDAPOOL_WAKE_TIMEOUT`, `CUDAPOOL_SLEEP_IDLE`, `CUDAPOOL_MEMORY_REQUEST`.
    pub sleep: SleepSettings,
    /// `CUDAPOOL_CACHE_IDLE`: how long cached memory nothing reuses stays cached.
    pub cache_idle: CacheIdle,
}

/// The characters a group name may use (`CUDAPOOL_GROUP`), and its longest length.
pub const GROUP_CHARS: &str = "1 to 64 of A-Z a-z 0-9 . _ - (not . or .. alone)";
pub const GROUP_MAX: usize = 64;

/// Checks a group name: 1 to 64 of `[A-Za-z0-9._-]`, not `.` or `..` (it names a file).
pub fn parse_group(s: &str) -> Result<String, String> {
    let s = s.trim();
    if s.is_empty() || s.len() > GROUP_MAX {
        return Err(format!("{} characters", s.len()));
    }
    if let Some(c) = s
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!("{c:?} is not allowed"));
    }
    if s == "." || s == ".." {
        return Err("not a name".into());
    }
    Ok(s.to_string())
}

impl Default for Config {
    fn default() -> Self {
        Config {
            // The benchmarks' choice (README): as fast as the other kinds, the least memory
            // reserved on the traces, the most cache hits on a real training run.
            pool: PoolKind::Split,
            memory_limit: DeviceLimits::default(),
            soft_limit: DeviceLimits::default(),
            reuse: Reuse::Auto,
            report: None,
            track: 0,
            history: 0,
            trace: None,
            log: LogLevel::Warn,
            disable: false,
            faults: Vec::new(),
            group: None,
            group_limit: DeviceLimits::default(),
            segments: Segments::Expandable,
            segments_set: false,
            stitch: Stitch::NearLimit,
            runtime_dir: None,
            oom_snapshot: None,
            oom_snapshot_keep: OOM_SNAPSHOT_KEEP,
            sleep: SleepSettings::default(),
            job: None,
            job_overcommitted: false,
            job_notes: Vec::new(),
            group_dir: None,
            group_fixed: false,
            cache_idle: CacheIdle::DEFAULT,
        }
    }
}

/// A variable whose value cannot be used. Displayed as one line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    pub var: &'static str,
    pub value: String,
    pub why: String,
    pub accepted: &'static str,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid {}={:?}: {}; accepted: {}",
            self.var, self.value, self.why, self.accepted
        )
    }
}

pub const SIZE_FORMS: &str = "bytes (1073741824), decimal units k/K/KB/M/MB/G/GB/T/TB (powers of 1000), binary units KiB/MiB/GiB/TiB (powers of 1024), decimals (1.5GiB), a percentage of the device's memory (50%), or a per-device list (0=8GiB,1=50%)";

impl Config {
    /// Reads the process environment.
    pub fn from_env() -> Result<Config, ConfigError> {
        Config::from_lookup(|name| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned()))
    }

    /// Parses from any lookup (tests pass a closure over a table). An empty value means unset.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        let get = |name: &str| get(name).filter(|v| !v.trim().is_empty());
        let bad = |var: &'static str, value: &str, why: &str, accepted: &'static str| ConfigError {
            var,
            value: value.to_string(),
            why: why.to_string(),
            accepted,
        };
        let mut c = Config::default();

        if let Some(v) = get("CUDAPOOL_DISABLE") {
            c.disable = match v.trim() {
                "1" | "true" | "yes" | "on" => true,
                "0" | "false" | "no" | "off" => false,
                _ => {
                    return Err(bad(
                        "CUDAPOOL_DISABLE",
                        &v,
                        "not a switch",
                        "1, true, yes or on; 0, false, no or off",
                    ))
                }
            };
        }
        if let Some(v) = get("CUDAPOOL_POOL") {
            c.pool = PoolKind::parse(&v)
                .ok_or_else(|| bad("CUDAPOOL_POOL", &v, "unknown pool kind", PoolKind::ACCEPTED))?;
        }
        for (var, slot) in [
            ("CUDAPOOL_MEMORY_LIMIT", &mut c.memory_limit),
            ("CUDAPOOL_SOFT_LIMIT", &mut c.soft_limit),
        ] {
            if let Some(v) = get(var) {
                *slot = parse_device_limits(&v).map_err(|why| bad(var, &v, &why, SIZE_FORMS))?;
            }
        }
        if let Some(v) = get("CUDAPOOL_REUSE") {
            c.reuse = match v.trim().to_ascii_lowercase().as_str() {
                "auto" => Reuse::Auto,
                "immediate" => Reuse::Immediate,
                _ => {
                    return Err(bad(
                        "CUDAPOOL_REUSE",
                        &v,
                        "unknown mode",
                        "auto or immediate",
                    ))
                }
            };
        }
        if let Some(v) = get("CUDAPOOL_REPORT") {
            // Switch words are switches, as for CUDAPOOL_DISABLE; anything else names a file.
            c.report = match v.trim() {
                "0" | "false" | "no" | "off" => None,
                "1" | "true" | "yes" | "on" | "stderr" => Some(ReportTarget::Stderr),
                path => Some(ReportTarget::File(absolute(path))),
            };
        }
        if let Some(v) = get("CUDAPOOL_TRACK") {
            c.track = match v.trim() {
                "0" => 0,
                "1" => 1,
                "2" => 2,
                _ => return Err(bad("CUDAPOOL_TRACK", &v, "unknown level", "0, 1 or 2")),
            };
        }
        if let Some(v) = get("CUDAPOOL_HISTORY") {
            c.history = match v.trim().parse::<usize>() {
                Ok(n) if n <= MAX_HISTORY => n,
                _ => {
                    return Err(bad(
                        "CUDAPOOL_HISTORY",
                        &v,
                        "not a count of events",
                        "0 to 10000000",
                    ))
                }
            };
        }
        if let Some(v) = get("CUDAPOOL_TRACE") {
            c.trace = Some(absolute(v.trim()));
        }
        if let Some(v) = get("CUDAPOOL_GROUP") {
            c.group =
                Some(parse_group(&v).map_err(|why| bad("CUDAPOOL_GROUP", &v, &why, GROUP_CHARS))?);
        }
        if let Some(v) = get("CUDAPOOL_RUNTIME_DIR") {
            c.runtime_dir = Some(parse_runtime_dir(&v)?);
        }
        if let Some(v) = get("CUDAPOOL_OOM_SNAPSHOT") {
            c.oom_snapshot = Some(absolute(v.trim()).to_string_lossy().into_owned());
        }
        if let Some(v) = get("CUDAPOOL_OOM_SNAPSHOT_KEEP") {
            c.oom_snapshot_keep = match v.trim().parse::<usize>() {
                Ok(n) if (1..=MAX_KEEP).contains(&n) => n,
                _ => {
                    return Err(bad(
                        "CUDAPOOL_OOM_SNAPSHOT_KEEP",
                        &v,
                        "not a count of files",
                        "1 to 100000 (default 16)",
                    ))
                }
            };
        }
        c.sleep = SleepSettings::from_lookup(&get)?;
        if let Some(v) = get("CUDAPOOL_CACHE_IDLE") {
            c.cache_idle = CacheIdle::parse(&v)
                .map_err(|why| bad("CUDAPOOL_CACHE_IDLE", &v, &why, CacheIdle::ACCEPTED))?;
        }
        if let Some(v) = get("CUDAPOOL_GROUP_LIMIT") {
            c.group_limit = parse_device_limits(&v)
                .map_err(|why| bad("CUDAPOOL_GROUP_LIMIT", &v, &why, SIZE_FORMS))?;
        }
        if let Some(v) = get("CUDAPOOL_SEGMENTS") {
            c.segments_set = true;
            c.segments = match v.trim().to_ascii_lowercase().as_str() {
                "classic" => Segments::Classic,
                "expandable" => Segments::Expandable,
                _ => {
                    return Err(bad(
                        "CUDAPOOL_SEGMENTS",
                        &v,
                        "unknown mode",
                        "classic or expandable",
                    ))
                }
            };
        }
        if let Some(v) = get("CUDAPOOL_STITCH") {
            c.stitch = Stitch::parse(&v)
                .ok_or_else(|| bad("CUDAPOOL_STITCH", &v, "unknown rule", Stitch::ACCEPTED))?;
        }
        if let Some(v) = get("CUDAPOOL_FAULTS") {
            c.faults = parse_faults(&v)
                .map_err(|why| bad("CUDAPOOL_FAULTS", &v, &why, Fault::ACCEPTED))?;
        }
        if let Some(v) = get("CUDAPOOL_LOG") {
            c.log = match v.trim().to_ascii_lowercase().as_str() {
                "error" => LogLevel::Error,
                "warn" | "warning" => LogLevel::Warn,
                "info" => LogLevel::Info,
                "debug" => LogLevel::Debug,
                _ => {
                    return Err(bad(
                        "CUDAPOOL_LOG",
                        &v,
                        "unknown level",
                        "error, warn, info or debug",
                    ))
                }
            };
        }
        // A snapshot at the moment of OOM carries the history leading to it.
        if c.oom_snapshot.is_some() && c.history == 0 && get("CUDAPOOL_HISTORY").is_none() {
            c.history = OOM_SNAPSHOT_HISTORY;
        }
        Ok(c)
    }
}

/// Snapshot files kept by default with `%n` (`CUDAPOOL_OOM_SNAPSHOT_KEEP`), and at most.
pub const OOM_SNAPSHOT_KEEP: usize = 16;
pub const MAX_KEEP: usize = 100_000;

/// A path made absolute against the directory the program started in: a file written at exit
/// lands where the user meant even if the program changed directory meanwhile.
fn absolute(p: &str) -> PathBuf {
    crate::base::outfile::absolute(std::path::Path::new(p))
}

/// `CUDAPOOL_RUNTIME_DIR`'s value: an absolute path (the library and every reader take it so).
pub fn parse_runtime_dir(v: &str) -> Result<PathBuf, ConfigError> {
    let p = PathBuf::from(v.trim());
    if p.is_absolute() {
        Ok(p)
    } else {
        Err(ConfigError {
            var: "CUDAPOOL_RUNTIME_DIR",
            value: v.to_string(),
            why: "not an absolute path".into(),
            accepted: "the absolute path of a directory of yours (made 0700 if absent)",
        })
    }
}

/// `template` (`CUDAPOOL_OOM_SNAPSHOT`) for this process's `n`-th snapshot.
pub fn snapshot_path(template: &str, n: u64) -> String {
    template
        .replace("%p", &std::process::id().to_string())
        .replace("%n", &n.to_string())
}

impl Config {
    /// What must be said of these settings though they are taken: each output file that cannot
    /// be written (checked now, not at exit), and a soft limit at or above the hard one (it
    /// would never apply). One line each.
    pub fn notes(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut file = |var: &str, path: &std::path::Path| {
            if let Err(e) = crate::base::outfile::check(path) {
                out.push(format!("{var}: cannot be written: {e}"));
            }
        };
        if let Some(ReportTarget::File(p)) = &self.report {
            file("CUDAPOOL_REPORT", p);
        }
        if let Some(p) = &self.trace {
            file("CUDAPOOL_TRACE", p);
        }
        if let Some(t) = &self.oom_snapshot {
            file(
                "CUDAPOOL_OOM_SNAPSHOT",
                std::path::Path::new(&snapshot_path(t, 1)),
            );
        }
        out.extend(soft_above_hard(&self.soft_limit, &self.memory_limit));
        out.extend(self.job_notes.iter().cloned());
        out.extend(self.unused());
        out
    }

    /// Whether the process sleeps when it is stopped or its group is suspended
    /// (`CUDAPOOL_SUSPEND`; by default in a Slurm job's group, `slurm-<id>`, which the
    /// TaskProlog and the mandatory mode set; elsewhere a stop of one member must not hold the
    /// others' work unasked).
    pub fn suspend_sleeps(&self) -> bool {
        self.sleep.suspend.unwrap_or_else(|| {
            self.job.is_some()
                || self
                    .group
                    .as_deref()
                    .and_then(|g| g.strip_prefix("slurm-"))
                    .is_some_and(|id| !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()))
        })
    }

    /// Settings that only apply beside another that is not set: ignored, and said so.
    fn unused(&self) -> Vec<String> {
        let set = |l: &DeviceLimits| l.all.is_some() || !l.per_device.is_empty();
        let mut out = Vec::new();
        if self.group.is_none() {
            let only_in_a_group: Vec<&str> = [
                ("CUDAPOOL_GROUP_LIMIT", set(&self.group_limit)),
                ("CUDAPOOL_SLEEP_IDLE", self.sleep.idle.is_some()),
                ("CUDAPOOL_MEMORY_REQUEST", set(&self.sleep.request)),
            ]
            .into_iter()
            .filter(|&(_, on)| on)
            .map(|(name, _)| name)
            .collect();
            if !only_in_a_group.is_empty() {
                out.push(format!(
                    "{}: {} only in a group, and CUDAPOOL_GROUP is not set: ignored",
                    only_in_a_group.join(", "),
                    if only_in_a_group.len() == 1 {
                        "applies"
                    } else {
                        "apply"
                    }
                ));
            }
        }
        if self.oom_snapshot.is_none() && self.oom_snapshot_keep != OOM_SNAPSHOT_KEEP {
            out.push(
                "CUDAPOOL_OOM_SNAPSHOT_KEEP: applies only with CUDAPOOL_OOM_SNAPSHOT, which is not set: ignored"
                    .into(),
            );
        }
        out
    }
}

/// Lines for each device whose soft limit is at or above its hard limit, where both are of
/// one kind (bytes, or percentages of the same device).
fn soft_above_hard(soft: &DeviceLimits, hard: &DeviceLimits) -> Vec<String> {
    let mut devices: Vec<Option<u32>> = vec![None];
    devices.extend(
        soft.per_device
            .iter()
            .chain(&hard.per_device)
            .map(|(d, _)| Some(*d)),
    );
    devices.sort();
    devices.dedup();
    let mut out = Vec::new();
    for d in devices {
        let (s, h) = match d {
            None => (soft.all, hard.all),
            Some(d) => (soft.for_device(d), hard.for_device(d)),
        };
        let above = match (s, h) {
            (Some(Limit::Bytes(s)), Some(Limit::Bytes(h))) => h > 0 && s >= h,
            (Some(Limit::Percent(s)), Some(Limit::Percent(h))) => s >= h,
            _ => false,
        };
        if above {
            let on = d.map_or("every device".to_string(), |d| format!("device {d}"));
            out.push(format!(
                "CUDAPOOL_SOFT_LIMIT is not below CUDAPOOL_MEMORY_LIMIT on {on}: it never applies (the soft limit is where freed blocks start going back to the driver, below the hard limit)"
            ));
        }
    }
    out
}

/// The allocator events kept per device when `CUDAPOOL_OOM_SNAPSHOT` is set and
/// `CUDAPOOL_HISTORY` is not.
pub const OOM_SNAPSHOT_HISTORY: usize = 10_000;

/// Parses a bare SIZE (every device) or a list `ORD=SIZE[,ORD=SIZE...]`.
pub fn parse_device_limits(s: &str) -> Result<DeviceLimits, String> {
    let s = s.trim();
    if !s.contains('=') {
        return Ok(DeviceLimits {
            all: Some(parse_limit(s)?),
            per_device: Vec::new(),
        });
    }
    let mut out = DeviceLimits::default();
    for item in s.split(',') {
        let item = item.trim();
        let (ord, size) = item
            .split_once('=')
            .ok_or_else(|| format!("list item {item:?} is not ORDINAL=SIZE"))?;
        let ord: u32 = ord
            .trim()
            .parse()
            .map_err(|_| format!("{:?} is not a device ordinal", ord.trim()))?;
        if out.per_device.iter().any(|(d, _)| *d == ord) {
            return Err(format!("device {ord} is listed twice"));
        }
        out.per_device.push((ord, parse_limit(size)?));
    }
    Ok(out)
}

/// Parses one SIZE or percentage.
pub fn parse_limit(s: &str) -> Result<Limit, String> {
    let s = s.trim();
    if let Some(p) = s.strip_suffix('%') {
        let p: f64 = p
            .trim()
            .parse()
            .map_err(|_| format!("{:?} is not a percentage", s))?;
        if !(p > 0.0 && p <= 100.0) {
            return Err(format!(
                "{s} is not a share of the device: more than 0% and at most 100%"
            ));
        }
        return Ok(Limit::Percent(p));
    }
    parse_size(s).map(Limit::Bytes)
}

/// Parses a SIZE: `1073741824`, `1.5GiB`, `512 MB`, `2g`. Fractional bytes are rounded down.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    if s.starts_with('-') {
        return Err(format!("{s} is negative"));
    }
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = (&s[..split], s[split..].trim());
    let multiplier: u128 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1_000,
        "m" | "mb" => 1_000_000,
        "g" | "gb" => 1_000_000_000,
        "t" | "tb" => 1_000_000_000_000,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        "tib" => 1 << 40,
        // No digits at all: not a size with a strange unit, but no size.
        _ if num.is_empty() => return Err(format!("{s:?} is not a size")),
        _ => return Err(format!("unknown unit {unit:?}")),
    };
    // Exact decimal arithmetic: "1.5GiB" is 1610612736, not a float approximation.
    let (int_part, frac_part) = num.split_once('.').unwrap_or((num, ""));
    if int_part.is_empty() && frac_part.is_empty() {
        return Err(format!("{s:?} has no number"));
    }
    if frac_part.contains('.') || frac_part.len() > 18 {
        return Err(format!("{num:?} is not a number"));
    }
    let digits = format!("{int_part}{frac_part}");
    let mantissa: u128 = digits
        .parse()
        .map_err(|_| format!("{num:?} is too large"))?;
    let scale = 10u128.pow(frac_part.len() as u32);
    let bytes = mantissa
        .checked_mul(multiplier)
        .ok_or_else(|| format!("{s:?} is too large"))?
        / scale;
    u64::try_from(bytes).map_err(|_| format!("{s:?} is too large"))
}

#[cfg(test)]
mod tests;
