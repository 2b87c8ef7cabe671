//! The exporter's exposition (`cudapool exporter`): every family, its labels and help, written
//! in the Prometheus text format or OpenMetrics from one `fastmetrics` registry, families in
//! one fixed order. What is read, and how, is `exporter`'s.

use cudapool::base::rundir_find::Squat;
use cudapool::limits::budget::DeviceStats;
use cudapool::report::page::fmt_uuid;
use cudapool::report::pages::Snapshot;
use fastmetrics::encoder::{EncodeLabelSet, LabelSetEncoder};
use fastmetrics::format::text::{self, EscapingScheme, TextProfile};
use fastmetrics::metrics::{counter::Counter, family::Family, gauge::Gauge};
use fastmetrics::raw::{metadata::Unit, LabelSetSchema};
use fastmetrics::registry::Registry;
use std::time::Duration;

/// One process as a scrape sees it.
pub(super) struct Process {
    pub(super) snap: Snapshot,
    pub(super) comm: String,
}

/// What a scrape reads: the processes and the groups, what it could not read, and the users'
/// runtime directories someone else took.
pub(super) struct Seen {
    pub(super) procs: Vec<Process>,
    pub(super) groups: Vec<cudapool::limits::group::LedgerView>,
    /// Files left unread, by reason: `invalid` (not a page or ledger of this version, or not
    /// the directory owner's), `busy` (its live writer was writing all the time it was given),
    /// `time` (the read's time, or its owner's share of it, ran out first).
    pub(super) skipped: [(&'static str, usize); 3],
    /// Whether the last survey of `/dev/shm` was cut short, per reason (the folder's read, or
    /// the opening of the folders found, reached its deadline: the next one reads on).
    pub(super) cut: [(&'static str, bool); 2],
    /// Surveys cut short since the exporter started, per reason.
    pub(super) cuts: [(&'static str, u64); 2],
    pub(super) squats: Vec<Squat>,
    /// How long the read took.
    pub(super) read: Duration,
}

/// The labels of one process's device.
#[derive(Clone, PartialEq, Eq, Hash)]
struct DeviceLabels {
    /// The page's owner, shown when the exporter reads every user's (as root).
    uid: Option<u32>,
    pid: u32,
    comm: String,
    device: i32,
    uuid: String,
    group: Option<String>,
}

impl LabelSetSchema for DeviceLabels {
    fn names() -> Option<&'static [&'static str]> {
        Some(&["uid", "pid", "comm", "device", "uuid", "group"])
    }
}

impl EncodeLabelSet for DeviceLabels {
    fn encode(&self, e: &mut dyn LabelSetEncoder) -> fastmetrics::error::Result<()> {
        if let Some(u) = self.uid {
            e.encode(&("uid", u))?;
        }
        e.encode(&("pid", self.pid))?;
        e.encode(&("comm", self.comm.as_str()))?;
        e.encode(&("device", self.device))?;
        e.encode(&("uuid", self.uuid.as_str()))?;
        if let Some(g) = &self.group {
            e.encode(&("group", g.as_str()))?;
        }
        Ok(())
    }
}

/// The labels of one group's GPU.
#[derive(Clone, PartialEq, Eq, Hash)]
struct GroupLabels {
    uid: Option<u32>,
    group: String,
    uuid: String,
}

impl LabelSetSchema for GroupLabels {
    fn names() -> Option<&'static [&'static str]> {
        Some(&["uid", "group", "uuid"])
    }
}

impl EncodeLabelSet for GroupLabels {
    fn encode(&self, e: &mut dyn LabelSetEncoder) -> fastmetrics::error::Result<()> {
        if let Some(u) = self.uid {
            e.encode(&("uid", u))?;
        }
        e.encode(&("group", self.group.as_str()))?;
        e.encode(&("uuid", self.uuid.as_str()))
    }
}

/// Why files were skipped.
#[derive(Clone, PartialEq, Eq, Hash)]
struct Reason(&'static str);

impl LabelSetSchema for Reason {
    fn names() -> Option<&'static [&'static str]> {
        Some(&["reason"])
    }
}

impl EncodeLabelSet for Reason {
    fn encode(&self, e: &mut dyn LabelSetEncoder) -> fastmetrics::error::Result<()> {
        e.encode(&("reason", self.0))
    }
}

/// A squatted runtime directory: whose, which name, and the name used instead.
#[derive(Clone, PartialEq, Eq, Hash)]
struct SquatLabels {
    uid: u32,
    path: String,
    used: String,
}

impl LabelSetSchema for SquatLabels {
    fn names() -> Option<&'static [&'static str]> {
        Some(&["uid", "path", "used"])
    }
}

impl EncodeLabelSet for SquatLabels {
    fn encode(&self, e: &mut dyn LabelSetEncoder) -> fastmetrics::error::Result<()> {
        e.encode(&("uid", self.uid))?;
        e.encode(&("path", self.path.as_str()))?;
        e.encode(&("used", self.used.as_str()))
    }
}

type Gauges = Family<DeviceLabels, Gauge<i64>>;
type Counters = Family<DeviceLabels, Counter<u64>>;
/// One figure of a device's stats.
type Field = fn(&DeviceStats) -> u64;
/// A metric: name, help, the figure.
type Metric = (&'static str, &'static str, Field);

/// The gauges (in bytes, then plain) and counters of a device, by name, help and field.
const BYTES: &[Metric] = &[
    (
        "allocated",
        "Bytes of device memory the program holds through cudapool, rounding included",
        |s| s.allocated,
    ),
    (
        "requested",
        "Bytes the program asked for of what it holds, before rounding",
        |s| s.requested,
    ),
    (
        "reserved",
        "Bytes cudapool holds from the driver, cached memory included",
        |s| s.reserved,
    ),
    ("cached", "Bytes reserved and free for reuse", |s| s.cached),
    (
        "overhead",
        "Of reserved: what the driver took for the process besides its allocations (stack, heap, modules, contexts)",
        |s| s.overhead,
    ),
    (
        "asleep",
        "Device memory put to sleep: its contents on the host, counted in no limit",
        |s| s.asleep,
    ),
    (
        "peak_allocated",
        "The most bytes the program held at once",
        |s| s.allocated_peak,
    ),
    (
        "peak_requested",
        "The most bytes the program had asked for and held at once",
        |s| s.requested_peak,
    ),
    (
        "peak_reserved",
        "The most bytes cudapool held from the driver at once",
        |s| s.reserved_peak,
    ),
    (
        "hard_limit",
        "The hard limit on the process's device memory (0: none)",
        |s| s.hard_limit,
    ),
    (
        "soft_limit",
        "Above this much reserved memory, freed blocks go back to the driver (0: none)",
        |s| s.soft_limit,
    ),
];
const COUNTS: &[Metric] = &[
    ("live_allocations", "Allocations the program holds", |s| {
        s.live_allocations
    }),
    ("segments", "Driver allocations cudapool holds", |s| {
        s.segments
    }),
    (
        "sleep_state",
        "The process's sleep state: 0 awake, 1 falling asleep, 2 asleep, 3 waking",
        |s| s.sleep_state,
    ),
];
const COUNTERS: &[Metric] = &[
    ("alloc_calls", "Allocation calls", |s| s.alloc_calls),
    ("free_calls", "Free calls", |s| s.free_calls),
    ("cache_hits", "Allocations served from the cache", |s| {
        s.cache_hits
    }),
    (
        "driver_allocs",
        "Allocations cudapool asked the driver for",
        |s| s.driver_allocs,
    ),
    ("driver_frees", "Frees cudapool made to the driver", |s| {
        s.driver_frees
    }),
    (
        "reclaims",
        "Times cached memory was given back and an allocation retried",
        |s| s.reclaim_retries,
    ),
    ("ooms", "Out-of-memory answers to the program", |s| s.ooms),
    (
        "panics",
        "Panics caught at cudapool's boundary (bugs of cudapool's; from the first on, new allocations go to the driver directly)",
        |s| s.panics,
    ),
];

/// The exposition of what was seen: OpenMetrics or the Prometheus text format, with its
/// content type. Counters are named `..._total` in both (OpenMetrics adds the suffix itself).
pub(super) fn render(seen: &Seen, openmetrics: bool, all_users: bool) -> (String, &'static str) {
    let procs = &seen.procs;
    let build = || -> fastmetrics::error::Result<String> {
        let mut reg = Registry::builder().with_namespace("cudapool").build()?;
        let count = Gauge::<i64>::new(procs.len() as i64);
        reg.register("processes", "cudapool processes publishing figures", count)?;
        let mut families: Vec<(Gauges, Field)> = Vec::new();
        for &(name, help, field) in BYTES {
            let f = Gauges::default();
            reg.register_with_unit(name, help, Unit::Bytes, f.clone())?;
            families.push((f, field));
        }
        for &(name, help, field) in COUNTS {
            let f = Gauges::default();
            reg.register(name, help, f.clone())?;
            families.push((f, field));
        }
        let mut counters: Vec<(Counters, Field)> = Vec::new();
        for &(name, help, field) in COUNTERS {
            let f = Counters::default();
            let name = if openmetrics {
                name.to_string()
            } else {
                format!("{name}_total")
            };
            reg.register(name, help, f.clone())?;
            counters.push((f, field));
        }
        let updated = Family::<DeviceLabels, Gauge<f64>>::default();
        reg.register_with_unit(
            "last_update_timestamp",
            "When the process last published its figures (Unix time)",
            Unit::Seconds,
            updated.clone(),
        )?;
        for p in procs {
            for d in &p.snap.devices {
                let labels = DeviceLabels {
                    uid: all_users.then_some(p.snap.uid),
                    pid: p.snap.pid,
                    comm: p.comm.clone(),
                    device: d.device,
                    uuid: d.uuid.as_ref().map_or(String::new(), fmt_uuid),
                    group: p.snap.group.clone(),
                };
                for (f, field) in &families {
                    let v = i64::try_from(field(&d.stats)).unwrap_or(i64::MAX);
                    f.with_or_new(&labels, |g| g.set(v));
                }
                for (f, field) in &counters {
                    f.with_or_new(&labels, |c| c.set(field(&d.stats)));
                }
                updated.with_or_new(&labels, |g| g.set(p.snap.updated_ns as f64 / 1e9));
            }
        }
        if !seen.groups.is_empty() {
            let members = Family::<GroupLabels, Gauge<i64>>::default();
            let reserved = Family::<GroupLabels, Gauge<i64>>::default();
            let limit = Family::<GroupLabels, Gauge<i64>>::default();
            reg.register(
                "group_members",
                "The group's processes that hold memory on the GPU",
                members.clone(),
            )?;
            reg.register_with_unit(
                "group_reserved",
                "Bytes every member of the group holds from the driver on the GPU",
                Unit::Bytes,
                reserved.clone(),
            )?;
            reg.register_with_unit(
                "group_limit",
                "The group's hard limit on the GPU (0: none)",
                Unit::Bytes,
                limit.clone(),
            )?;
            for g in &seen.groups {
                for (i, (uuid, l, total)) in g.devices.iter().enumerate() {
                    let labels = GroupLabels {
                        uid: all_users.then_some(g.uid),
                        group: g.name.clone(),
                        uuid: fmt_uuid(uuid),
                    };
                    let n = g.users_of(i).count() as i64;
                    members.with_or_new(&labels, |m| m.set(n));
                    reserved.with_or_new(&labels, |m| {
                        m.set(i64::try_from(*total).unwrap_or(i64::MAX))
                    });
                    limit.with_or_new(&labels, |m| m.set(i64::try_from(*l).unwrap_or(i64::MAX)));
                }
            }
        }
        // The exporter's own: what its last read left and how long it took, and the users'
        // runtime directories someone else took.
        let skipped = Family::<Reason, Gauge<i64>>::default();
        reg.register(
            "exporter_skipped_files",
            "Files the last read left unread: invalid (not a page or ledger, or not its directory's owner's), busy (written all the time it was given), time (its user's share of the read's time ran out)",
            skipped.clone(),
        )?;
        for (reason, n) in seen.skipped {
            skipped.with_or_new(&Reason(reason), |g| g.set(n as i64));
        }
        let cut = Family::<Reason, Gauge<i64>>::default();
        reg.register(
            "exporter_survey_incomplete",
            "1 when the last survey of /dev/shm was cut short at its deadline (folder read: names left unread, read on at the next scrape; folders opened: directories found but not opened): some users' processes may be missing from this scrape",
            cut.clone(),
        )?;
        for (reason, c) in seen.cut {
            cut.with_or_new(&Reason(reason), |g| g.set(i64::from(c)));
        }
        let cuts = Family::<Reason, Counter<u64>>::default();
        reg.register(
            if openmetrics {
                "exporter_surveys_cut"
            } else {
                "exporter_surveys_cut_total"
            },
            "Surveys of /dev/shm cut short at their deadline since the exporter started, per reason",
            cuts.clone(),
        )?;
        for (reason, n) in seen.cuts {
            cuts.with_or_new(&Reason(reason), |c| c.set(n));
        }
        let took = Gauge::<f64>::new(seen.read.as_secs_f64());
        reg.register_with_unit(
            "exporter_read_duration",
            "How long the last read of the pages and ledgers took",
            Unit::Seconds,
            took,
        )?;
        if !seen.squats.is_empty() {
            let squatted = Family::<SquatLabels, Gauge<i64>>::default();
            reg.register(
                "runtime_dir_squatted",
                "1 for each user's default runtime directory that another user took (its processes use the next name, or run without pages)",
                squatted.clone(),
            )?;
            for q in &seen.squats {
                let labels = SquatLabels {
                    uid: q.uid,
                    path: q.path.display().to_string(),
                    used: q
                        .used
                        .as_ref()
                        .map_or(String::new(), |u| u.display().to_string()),
                };
                squatted.with_or_new(&labels, |g| g.set(1));
            }
        }
        let profile = if openmetrics {
            TextProfile::OpenMetricsV1_0_0 {
                escaping_scheme: EscapingScheme::Underscores,
            }
        } else {
            TextProfile::PrometheusV0_0_4
        };
        let mut out = String::new();
        text::encode(&mut out, &reg, profile)?;
        Ok(out)
    };
    let kind = if openmetrics {
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    } else {
        "text/plain; version=0.0.4; charset=utf-8"
    };
    match build() {
        Ok(text) => (in_order(&text), kind),
        Err(e) => (format!("# cudapool exporter: {e}\n"), kind),
    }
}

/// The exposition with its metric families in one fixed order, by name (the registry keeps
/// them in a hash map: another order on every scrape otherwise). A family is its metadata lines
/// (`# HELP`, `# TYPE`, `# UNIT` of one name, in whatever order they come) and the samples
/// after them; OpenMetrics' `# EOF` stays last.
fn in_order(text: &str) -> String {
    let mut families: Vec<(String, String)> = Vec::new();
    let mut head = String::new();
    let mut eof = String::new();
    let mut in_samples = true;
    for line in text.split_inclusive('\n') {
        if line.trim_end() == "# EOF" {
            eof.push_str(line);
            continue;
        }
        let meta = ["# HELP ", "# TYPE ", "# UNIT "]
            .iter()
            .find_map(|p| line.strip_prefix(p))
            .and_then(|rest| rest.split_whitespace().next());
        if let Some(name) = meta {
            let same = families.last().is_some_and(|(n, _)| n == name);
            if in_samples || !same {
                families.push((name.to_string(), String::new()));
            }
            in_samples = false;
        } else {
            in_samples = true;
        }
        match families.last_mut() {
            Some((_, body)) => body.push_str(line),
            None => head.push_str(line),
        }
    }
    families.sort_by(|a, b| a.0.cmp(&b.0));
    let mut out = head;
    for (_, body) in families {
        out.push_str(&body);
    }
    out.push_str(&eof);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_come_out_in_one_order() {
        let a = "# TYPE b gauge\n# HELP b x\nb 1\n# TYPE a gauge\n# UNIT a bytes\n# HELP a y\na{p=\"1\"} 2\n# EOF\n";
        assert_eq!(
            in_order(a),
            "# TYPE a gauge\n# UNIT a bytes\n# HELP a y\na{p=\"1\"} 2\n# TYPE b gauge\n# HELP b x\nb 1\n# EOF\n"
        );
    }
}
