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

use super::metrics::{render, Process, Seen};
use cudapool::base::patience::{Patience, READ_TIME};
use cudapool::base::rundir::configured_from_env;
use cudapool::base::rundir_find::{self, Squat};
use cudapool::report::pages::{live_in, owners, Snapshot};
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

/// The forms `--listen` takes.
pub const LISTEN_FORMS: &str =
    ":PORT (every interface), localhost:PORT, HOST:PORT, IPv4:PORT or [IPv6]:PORT";

/// Where `--listen` says to listen: the addresses to try, in order (the first that binds).
#[derive(Clone, Debug)]
pub struct Listen {
    pub text: String,
    pub addrs: Vec<SocketAddr>,
}

/// Parses `--listen`: `:PORT` is every interface (IPv6 and IPv4 together, or IPv4 alone where
/// the host has no IPv6); a name is resolved, its IPv4 addresses first.
pub fn parse_listen(s: &str) -> Result<Listen, String> {
    let bad = |why: &str| format!("{why}; accepted: {LISTEN_FORMS}");
    let (host, port) = s.rsplit_once(':').ok_or_else(|| match s.parse::<u16>() {
        // A bare port: what was meant is surely every interface on it.
        Ok(_) => bad(&format!("{s:?} has no :PORT (did you mean :{s}?)")),
        Err(_) => bad(&format!("{s:?} has no :PORT")),
    })?;
    let port: u16 = port
        .parse()
        .map_err(|_| bad(&format!("{port:?} is not a port (0 to 65535)")))?;
    let addrs: Vec<SocketAddr> = if host.is_empty() {
        vec![
            SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, port)),
            SocketAddr::from((std::net::Ipv4Addr::UNSPECIFIED, port)),
        ]
    } else if let Some(v6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        let ip: std::net::Ipv6Addr = v6
            .parse()
            .map_err(|_| bad(&format!("{v6:?} is not an IPv6 address")))?;
        vec![SocketAddr::from((ip, port))]
    } else if host.contains(':') {
        return Err(bad(&format!("{s:?}: an IPv6 address goes in brackets")));
    } else {
        use std::net::ToSocketAddrs as _;
        let mut found: Vec<SocketAddr> = (host, port)
            .to_socket_addrs()
            .map_err(|e| bad(&format!("{host:?} does not resolve ({e})")))?
            .collect();
        found.sort_by_key(|a| a.is_ipv6());
        found.dedup();
        found
    };
    if addrs.is_empty() {
        return Err(bad(&format!("{host:?} has no address")));
    }
    Ok(Listen {
        text: s.to_string(),
        addrs,
    })
}

/// `cudapool exporter ...`: runs until killed. 1 if it cannot listen.
pub fn exporter(listen: Listen, interval: Duration) -> ExitCode {
    struct Options {
        interval: Duration,
    }
    let opts = Options { interval };
    let mut last = None;
    let mut bound = None;
    for a in &listen.addrs {
        match std::net::TcpListener::bind(a) {
            Ok(l) => {
                bound = Some(l);
                break;
            }
            Err(e) => last = Some((*a, e)),
        }
    }
    let Some(listener) = bound else {
        let why = match &last {
            Some((_, e)) if e.kind() == std::io::ErrorKind::AddrInUse => format!(
                "{e} (another exporter, or another program, has the port: choose another with --listen, e.g. {}:9490)",
                listen.addrs.first().map_or("127.0.0.1".to_string(), |a| a.ip().to_string())
            ),
            Some((a, e)) if a.to_string() != listen.text => format!("{a}: {e}"),
            Some((_, e)) => e.to_string(),
            None => "no address to listen on".into(),
        };
        eprintln!("cudapool exporter: cannot listen on {}: {why}", listen.text);
        return ExitCode::from(1);
    };
    let Ok(addr) = listener.local_addr() else {
        eprintln!("cudapool exporter: the socket has no address");
        return ExitCode::from(1);
    };
    raise_open_files();
    let all_users = super::slurm_site::euid() == 0;
    eprintln!(
        "cudapool exporter: serving http://{addr}/metrics for {} (pages read at most every {} s)",
        if all_users {
            "every user's cudapool processes"
        } else {
            "this user's cudapool processes"
        },
        opts.interval.as_secs_f64()
    );
    // Requests are answered on one thread; the reads of users' files run beside it, on at most
    // two more (a scrape that reads never holds up `GET /` or another connection).
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(2)
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
        said: Mutex::new(Vec::new()),
        survey: Mutex::new((rundir_find::Cursor::default(), [0; 2])),
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
                async move { Ok::<_, std::convert::Infallible>(scraper.answer(req).await) }
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

struct Scraper {
    all_users: bool,
    interval: Duration,
    /// What was read last, and when.
    cache: Mutex<Option<(Instant, Arc<Seen>)>>,
    /// The squats already said on stderr (each once).
    said: Mutex<Vec<Squat>>,
    /// Where the survey of `/dev/shm` stopped (the next one reads on from there), and how many
    /// surveys were cut short so far, per reason of [`CUTS`].
    survey: Mutex<(rundir_find::Cursor, [u64; 2])>,
}

/// Why a survey was cut short, as the scrape says it.
const CUTS: [&str; 2] = [rundir_find::CUT_READ, rundir_find::CUT_OPEN];

impl Scraper {
    async fn answer(self: Arc<Self>, req: Request<Incoming>) -> Response<Full<Bytes>> {
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
                let me = self.clone();
                match tokio::task::spawn_blocking(move || me.seen()).await {
                    Ok(seen) => {
                        // No figure read from a user's file may end a scrape: a render that
                        // panics anyway answers with why, not with an empty reply.
                        let all = self.all_users;
                        let rendered =
                            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                                render(&seen, openmetrics, all)
                            }));
                        match rendered {
                            Ok((text, kind)) => reply(StatusCode::OK, kind, text),
                            Err(_) => reply(
                                StatusCode::INTERNAL_SERVER_ERROR,
                                "text/plain; charset=utf-8",
                                "cudapool exporter: the figures read could not be rendered\n"
                                    .into(),
                            ),
                        }
                    }
                    Err(e) => reply(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "text/plain; charset=utf-8",
                        format!("cudapool exporter: {e}\n"),
                    ),
                }
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
        let seen = Arc::new(read(self.all_users, &self.survey));
        self.say_squats(&seen.squats);
        *cache = Some((Instant::now(), seen.clone()));
        seen
    }
}

impl Scraper {
    /// Says each squat once on stderr (an operator's log), as long as it lasts.
    fn say_squats(&self, now: &[Squat]) {
        let mut said = self.said.lock().unwrap_or_else(|e| e.into_inner());
        for s in now {
            if !said.contains(s) {
                eprintln!("cudapool exporter: {}", s.line());
            }
        }
        *said = now.to_vec();
    }
}

/// One read of every page and ledger this exporter may read, within [`READ_TIME`] (each user's
/// files getting an equal share of it).
fn read(all_users: bool, survey: &Mutex<(rundir_find::Cursor, [u64; 2])>) -> Seen {
    let t0 = Instant::now();
    let configured = configured_from_env();
    let (found, cuts) = {
        let mut s = survey.lock().unwrap_or_else(|e| e.into_inner());
        let found = rundir_find::survey_on(all_users, configured.as_deref(), &mut s.0);
        for (i, why) in CUTS.iter().enumerate() {
            if found.cut.contains(why) {
                s.1[i] += 1;
            }
        }
        (found, s.1)
    };
    let cut = CUTS.map(|why| (why, found.cut.contains(&why)));
    let cuts = [(CUTS[0], cuts[0]), (CUTS[1], cuts[1])];
    let (dirs, squats) = (found.dirs, found.squats);
    // The survey of the directories is charged to the read's time too.
    let mut patience = Patience::new(READ_TIME.saturating_sub(t0.elapsed()), owners(&dirs));
    let (snaps, skipped_pages) = live_in(&dirs, &mut patience);
    let ledgers = cudapool::limits::group::ledgers_in(&dirs, &mut patience);
    let mut skipped = [("invalid", 0), ("busy", 0), ("time", 0)];
    let mut count = |why: &str, late: bool| {
        let i = if late {
            2
        } else if why.contains("being written") {
            1
        } else {
            0
        };
        skipped[i].1 += 1;
    };
    for s in &skipped_pages {
        count(&s.why, s.late);
    }
    let mut groups = Vec::new();
    for l in ledgers {
        match l {
            Ok(g) => groups.push(g),
            Err((why, late)) => count(&why, late),
        }
    }
    let mut dropped = 0;
    let procs = processes(snaps, &mut dropped);
    skipped[0].1 += dropped;
    Seen {
        procs,
        groups,
        skipped,
        cut,
        cuts,
        squats,
        read: t0.elapsed(),
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

/// The processes of the pages read, with each one's name. The pid is the kernel's (the holder
/// of the page's lock) and the name is read from `/proc` for it: a process in a pid namespace
/// the exporter cannot see is left out, since nothing but its own page would name it. One
/// process shows once, whatever its user's files say.
///
/// A page's figures are the user's to write: a device listed twice (or any figure that would
/// repeat a series) is dropped, counted in `dropped`, so no page can make a scrape fail.
fn processes(seen: Vec<Snapshot>, dropped: &mut usize) -> Vec<Process> {
    let mut out: Vec<Process> = Vec::new();
    for mut snap in seen {
        if snap.pid == 0 || out.iter().any(|p| p.snap.pid == snap.pid) {
            continue;
        }
        let before = snap.devices.len();
        let mut devices_seen = std::collections::HashSet::new();
        snap.devices.retain(|d| devices_seen.insert(d.device));
        *dropped += before - snap.devices.len();
        let comm = std::fs::read_to_string(format!("/proc/{}/comm", snap.pid))
            .map(|c| c.trim_end().to_string())
            .unwrap_or_default();
        out.push(Process { snap, comm });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 54, case 5: a page of another user's that lists device 0 twice, its counters going
    /// down the second time (held by a live process, so read). Before: every scrape panicked
    /// (a counter set below its last value) and answered nothing, for every user.
    #[test]
    fn a_page_listing_a_device_twice_cannot_end_a_scrape() {
        use cudapool::limits::budget::DeviceStats;
        use cudapool::report::page::DeviceFigures;
        let dev = |ooms| DeviceFigures {
            device: 0,
            uuid: Some([1; 16]),
            stats: DeviceStats {
                ooms,
                ..Default::default()
            },
        };
        let snap = |pid, devices| Snapshot {
            pid,
            claimed_pid: pid,
            uid: 1001,
            pool: "split".into(),
            group: None,
            updated_ns: 0,
            devices,
        };
        let mut dropped = 0;
        let procs = processes(
            vec![snap(7, vec![dev(9), dev(2)]), snap(8, vec![dev(1)])],
            &mut dropped,
        );
        assert_eq!(dropped, 1, "the repeated device is dropped and counted");
        let seen = Seen {
            procs,
            groups: Vec::new(),
            skipped: [("invalid", dropped), ("busy", 0), ("time", 0)],
            cut: [(CUTS[0], true), (CUTS[1], false)],
            cuts: [(CUTS[0], 3), (CUTS[1], 0)],
            squats: Vec::new(),
            read: Duration::ZERO,
        };
        let (text, _) = render(&seen, false, true);
        assert!(
            text.contains("cudapool_exporter_survey_incomplete{reason=\"folder read\"} 1")
                && text.contains("cudapool_exporter_surveys_cut_total{reason=\"folder read\"} 3"),
            "{text}"
        );
        assert!(
            text.contains("cudapool_ooms_total{uid=\"1001\",pid=\"7\""),
            "{text}"
        );
        assert!(
            text.contains("cudapool_exporter_skipped_files{reason=\"invalid\"} 1"),
            "{text}"
        );
    }

    #[test]
    fn listen_takes_every_form() {
        let l = parse_listen(":9489").unwrap();
        assert_eq!(l.addrs[0].to_string(), "[::]:9489");
        assert_eq!(l.addrs[1].to_string(), "0.0.0.0:9489");
        let l = parse_listen("localhost:9489").unwrap();
        assert_eq!(l.addrs[0].to_string(), "127.0.0.1:9489", "IPv4 first");
        assert_eq!(
            parse_listen("[::1]:80").unwrap().addrs[0].to_string(),
            "[::1]:80"
        );
        assert_eq!(
            parse_listen("10.1.2.3:0").unwrap().addrs[0].to_string(),
            "10.1.2.3:0"
        );
        for (bad, says) in [
            ("9489", "no :PORT"),
            ("::1:80", "brackets"),
            ("localhost:99999", "not a port"),
            ("[nope]:80", "not an IPv6"),
        ] {
            let e = parse_listen(bad).unwrap_err();
            assert!(e.contains(says) && e.contains(LISTEN_FORMS), "{bad}: {e}");
        }
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
