//! `cudapool exporter [--listen ADDR:PORT] [--interval SECONDS]`: every cudapool process of this
//! user (of every user, run as root) in Prometheus, over HTTP.
//!
//! `GET /metrics` reads the live pages the processes publish (`report::publish`, the same ones
//! `cudapool stat` reads, each checked the same way) at most every `--interval` seconds and
//! answers in the Prometheus text format, or in OpenMetrics when the scraper's `Accept` prefers
//! it (Prometheus itself does). `GET /` is a one-line page naming `/metrics`. Anything else gets
//! 404 or 405.
//!
//! The formats come from one registry type of the `fastmetrics` crate (it writes both; the
//! Prometheus project's `prometheus-client` writes only OpenMetrics). The server is hyper's
//! HTTP/1.1 on a tokio runtime of one thread: each connection is a task of its own, a client
//! has 10 s to send a request's headers and 60 s in all, and at most [`MAX_CONNECTIONS`] are
//! open at once: a new one past that closes the one that has been idle longest. So idle,
//! slow, half-open or flooding clients (a thousand held open) stall no scraper, and the
//! exporter's memory stays bounded; a scraper that connects and asks at once is always served.
//!
//! What a user's files can cost a scrape is bounded too: pages and ledgers are copied, never
//! mapped, each at most its fixed size, and at most `pages::MAX_PAGES_PER_DIR` pages and
//! `group::ledger::MAX_LEDGERS_PER_DIR` ledgers of one runtime directory are read. Run as root,
//! every series carries the `uid` that owns the file it came from; `pid` and `comm` are the
//! kernel's, never the page's word.

use cudapool::base::rundir::configured_from_env;
use cudapool::limits::budget::DeviceStats;
use cudapool::report::page::fmt_uuid;
use cudapool::report::pages::{live, Snapshot};
use fastmetrics::encoder::{EncodeLabelSet, LabelSetEncoder};
use fastmetrics::format::text::{self, EscapingScheme, TextProfile};
use fastmetrics::metrics::{counter::Counter, family::Family, gauge::Gauge};
use fastmetrics::raw::{metadata::Unit, LabelSetSchema};
use fastmetrics::registry::Registry;
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{header, Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Where it listens unless told: this machine only, and a port of its own.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9489";
const MAX_CONNECTIONS: usize = 512;
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(60);

/// `cudapool exporter ...`: runs until killed. 1 if it cannot listen.
pub fn exporter(listen: SocketAddr, interval: Duration) -> ExitCode {
    struct Options {
        listen: SocketAddr,
        interval: Duration,
    }
    let opts = Options { listen, interval };
    let listener = match std::net::TcpListener::bind(opts.listen) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("cudapool exporter: cannot listen on {}: {e}", opts.listen);
            return ExitCode::from(1);
        }
    };
    let addr = listener.local_addr().unwrap_or(opts.listen);
    raise_open_files();
    // SAFETY: geteuid has no preconditions.
    let all_users = unsafe { libc::geteuid() } == 0;
    eprintln!(
        "cudapool exporter: serving http://{addr}/metrics for {} (pages read at most every {} s)",
        if all_users {
            "every user's cudapool processes"
        } else {
            "this user's cudapool processes"
        },
        opts.interval.as_secs_f64()
    );
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cudapool exporter: {e}");
            return ExitCode::from(1);
        }
    };
    let state = Arc::new(Scraper {
        all_users,
        interval: opts.interval,
        cache: Mutex::new(None),
    });
    match runtime.block_on(serve(listener, state)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cudapool exporter: {e}");
            ExitCode::from(1)
        }
    }
}

/// Lets the exporter hold as many descriptors as the hard limit allows (its connections are
/// capped below that anyway).
fn raise_open_files() {
    // SAFETY: a zeroed rlimit is valid; getrlimit fills it, setrlimit reads it.
    unsafe {
        let mut r: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 && r.rlim_cur < r.rlim_max {
            r.rlim_cur = r.rlim_max.min(1 << 16);
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
}

/// The open connections, each with when it was last active (a tick of [`Connections::tick`]).
#[derive(Default)]
struct Connections {
    tick: AtomicU64,
    open: Mutex<Vec<(u64, Arc<AtomicU64>, tokio::task::AbortHandle)>>,
}

impl Connections {
    fn now(&self) -> u64 {
        self.tick.fetch_add(1, Ordering::Relaxed)
    }

    /// Makes room for one more: closes finished entries, then, at the cap, the connection idle
    /// longest.
    fn make_room(&self) {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        open.retain(|(_, _, h)| !h.is_finished());
        if open.len() >= MAX_CONNECTIONS {
            if let Some(oldest) = (0..open.len()).min_by_key(|&i| open[i].1.load(Ordering::Relaxed))
            {
                let (_, _, h) = open.swap_remove(oldest);
                h.abort();
            }
        }
    }

    fn add(&self, id: u64, active: Arc<AtomicU64>, h: tokio::task::AbortHandle) {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if !h.is_finished() {
            open.push((id, active, h));
        }
    }

    fn remove(&self, id: u64) {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        open.retain(|(i, _, _)| *i != id);
    }
}

async fn serve(listener: std::net::TcpListener, scraper: Arc<Scraper>) -> std::io::Result<()> {
    listener.set_nonblocking(true)?;
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let conns = Arc::new(Connections::default());
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(s) => s,
            // Out of descriptors or a connection reset before it was taken: keep serving.
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        conns.make_room();
        let id = conns.now();
        let active = Arc::new(AtomicU64::new(id));
        let (scraper, c2, a2) = (scraper.clone(), conns.clone(), active.clone());
        let task = tokio::spawn(async move {
            let (c3, a3) = (c2.clone(), a2.clone());
            let service = hyper::service::service_fn(move |req| {
                a3.store(c3.now(), Ordering::Relaxed);
                let scraper = scraper.clone();
                async move { Ok::<_, std::convert::Infallible>(scraper.answer(&req)) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service);
            let _ = tokio::time::timeout(CONNECTION_TIMEOUT, conn).await;
            c2.remove(id);
        });
        conns.add(id, active, task.abort_handle());
    }
}

/// One process as a scrape sees it.
struct Process {
    snap: Snapshot,
    comm: String,
}

/// What a scrape reads: the processes and the groups.
struct Seen {
    procs: Vec<Process>,
    groups: Vec<cudapool::limits::group::LedgerView>,
}

struct Scraper {
    all_users: bool,
    interval: Duration,
    /// What was read last, and when.
    cache: Mutex<Option<(Instant, Arc<Seen>)>>,
}

impl Scraper {
    fn answer(&self, req: &Request<Incoming>) -> Response<Full<Bytes>> {
        let head = req.method() == Method::HEAD;
        if req.method() != Method::GET && !head {
            let mut r = reply(
                StatusCode::METHOD_NOT_ALLOWED,
                "text/plain; charset=utf-8",
                "only GET and HEAD\n".into(),
            );
            r.headers_mut()
                .insert(header::ALLOW, header::HeaderValue::from_static("GET, HEAD"));
            return r;
        }
        let mut r = match req.uri().path() {
            "/metrics" => {
                let accept = req
                    .headers()
                    .get(header::ACCEPT)
                    .and_then(|v| v.to_str().ok());
                let openmetrics = prefers_openmetrics(accept.unwrap_or(""));
                let (text, kind) = render(&self.seen(), openmetrics, self.all_users);
                reply(StatusCode::OK, kind, text)
            }
            "/" => reply(
                StatusCode::OK,
                "text/html; charset=utf-8",
                "<html><body>cudapool exporter: <a href=\"/metrics\">/metrics</a></body></html>\n"
                    .into(),
            ),
            _ => reply(
                StatusCode::NOT_FOUND,
                "text/plain; charset=utf-8",
                "not found: the metrics are at /metrics\n".into(),
            ),
        };
        if head {
            *r.body_mut() = Full::new(Bytes::new());
        }
        r
    }

    /// The processes and groups, read again if the last read is older than the interval.
    fn seen(&self) -> Arc<Seen> {
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((at, seen)) = &*cache {
            if at.elapsed() < self.interval {
                return seen.clone();
            }
        }
        let seen = Arc::new(Seen {
            procs: collect(self.all_users),
            groups: cudapool::limits::group::ledgers(
                self.all_users,
                configured_from_env().as_deref(),
            )
            .into_iter()
            .flatten()
            .collect(),
        });
        *cache = Some((Instant::now(), seen.clone()));
        seen
    }
}

fn reply(status: StatusCode, kind: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, header::HeaderValue::from_static(kind));
    h.insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-store"),
    );
    r
}

/// Whether `Accept` prefers OpenMetrics to the Prometheus text format (a q-value above
/// `text/plain`'s and above 0). Prometheus asks `application/openmetrics-text;...;q=0.5,
/// ...text/plain;version=0.0.4;q=0.3,*/*;q=0.2`.
fn prefers_openmetrics(accept: &str) -> bool {
    let (mut om, mut plain) = (0.0f32, 0.0f32);
    for range in accept.split(',') {
        let mut parts = range.split(';');
        let media = parts.next().unwrap_or("").trim().to_ascii_lowercase();
        let q = parts
            .filter_map(|p| p.trim().strip_prefix("q="))
            .find_map(|q| q.trim().parse::<f32>().ok())
            .unwrap_or(1.0);
        match media.as_str() {
            "application/openmetrics-text" => om = om.max(q),
            "text/plain" => plain = plain.max(q),
            _ => {}
        }
    }
    om > 0.0 && om > plain
}

/// Every page of the processes this exporter may read, with each process's name. The pid is
/// the kernel's (the holder of the page's lock) and the name is read from `/proc` for it: a
/// process in a pid namespace the exporter cannot see is left out, since nothing but its own
/// page would name it. One process shows once, whatever its user's files say.
fn collect(all_users: bool) -> Vec<Process> {
    let (seen, _) = live(all_users, configured_from_env().as_deref());
    let mut out: Vec<Process> = Vec::new();
    for snap in seen {
        if snap.pid == 0 || out.iter().any(|p| p.snap.pid == snap.pid) {
            continue;
        }
        let comm = std::fs::read_to_string(format!("/proc/{}/comm", snap.pid))
            .map(|c| c.trim_end().to_string())
            .unwrap_or_default();
        out.push(Process { snap, comm });
    }
    out
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
];

/// The exposition of what was seen: OpenMetrics or the Prometheus text format, with its
/// content type. Counters are named `..._total` in both (OpenMetrics adds the suffix itself).
fn render(seen: &Seen, openmetrics: bool, all_users: bool) -> (String, &'static str) {
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
            reg.register("group_members", "Processes in the group", members.clone())?;
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
                for (uuid, l, total) in &g.devices {
                    let labels = GroupLabels {
                        uid: all_users.then_some(g.uid),
                        group: g.name.clone(),
                        uuid: fmt_uuid(uuid),
                    };
                    let n = g.members.len() as i64;
                    members.with_or_new(&labels, |m| m.set(n));
                    reserved.with_or_new(&labels, |m| {
                        m.set(i64::try_from(*total).unwrap_or(i64::MAX))
                    });
                    limit.with_or_new(&labels, |m| m.set(i64::try_from(*l).unwrap_or(i64::MAX)));
                }
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

    #[test]
    fn accept_picks_the_format() {
        let prometheus = "application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2";
        assert!(prefers_openmetrics(prometheus));
        assert!(!prefers_openmetrics(""));
        assert!(!prefers_openmetrics("*/*"));
        assert!(!prefers_openmetrics("text/plain"));
        assert!(!prefers_openmetrics("application/openmetrics-text;q=0"));
        assert!(prefers_openmetrics("application/openmetrics-text"));
    }
}
