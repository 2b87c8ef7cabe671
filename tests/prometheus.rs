//! Prometheus watches cudapool (issue 47): Debian's Prometheus (installed by apt as root when it
//! is missing) scrapes a real `cudapool exporter` with the rules of `deploy/prometheus/`, and a
//! job's figures come back through Prometheus's own HTTP API; `promtool check metrics` passes on
//! a live scrape; `promtool test rules` passes the rules' unit tests.

mod common;
use common::*;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Prometheus and promtool, installed from Debian's packages if absent; `false` if they cannot
/// be (not root). As root, an install that fails fails the test.
fn have_prometheus() -> bool {
    let found = |t: &str| {
        Command::new("sh")
            .args(["-c", &format!("command -v {t}")])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if found("prometheus") && found("promtool") {
        return true;
    }
    if uid() != 0 {
        return false;
    }
    let ok = Command::new("sh")
        .args([
            "-c",
            // dpkg needs the system's sbin folders, which a minimal PATH (CI's) leaves out.
            "export DEBIAN_FRONTEND=noninteractive PATH=\"$PATH:/usr/local/sbin:/usr/sbin:/sbin\"; apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends prometheus >/dev/null",
        ])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "root could not install Debian's prometheus (apt-get said why above)"
    );
    // The package starts its own service where there is an init; this test runs its own.
    let _ = Command::new("sh")
        .args(["-c", "pkill -x prometheus; true"])
        .status();
    ok && found("prometheus") && found("promtool")
}

/// GET `url` (python3's urllib: nothing else need be installed); the body.
fn get(url: &str) -> Option<String> {
    let o = Command::new("python3")
        .args([
            "-c",
            "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())",
            url,
        ])
        .output()
        .ok()?;
    o.status
        .success()
        .then(|| String::from_utf8_lossy(&o.stdout).into_owned())
}

#[test]
fn prometheus_scrapes_the_exporter_and_answers_a_jobs_figures() {
    if !have_prometheus() {
        eprintln!("no prometheus and not root to install it: not checked");
        return;
    }
    let t0 = Instant::now();
    let f = fixture();
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("prometheus-run");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let run = dir.join("run");
    let run_s = run.to_str().unwrap();
    let port = free_port();
    let prom_port = port + 10000;

    // (1) The rules' own unit tests.
    let o = Command::new("promtool")
        .args(["test", "rules", "rules_test.yml"])
        .current_dir(root().join("deploy/prometheus"))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && said.contains("SUCCESS"),
        "{said}{}",
        String::from_utf8_lossy(&o.stderr)
    );

    // A Slurm job's process (group slurm-7, 64 MiB held) and the exporter that reads it.
    let mut job = chaos(
        &["fill", "8388608", "60"],
        &[
            ("CUDAPOOL_RUNTIME_DIR", run_s),
            ("CUDAPOOL_GROUP", "slurm-7"),
            ("CUDAPOOL_GROUP_LIMIT", "64MiB"),
        ],
    );
    let job = Killed(
        job.stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let exporter = Killed(
        Command::new(env!("CARGO_BIN_EXE_cudapool"))
            .args([
                "exporter",
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--interval",
                "0",
            ])
            .env("CUDAPOOL_RUNTIME_DIR", run_s)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let rules = root().join("deploy/prometheus/rules.yml");
    let config = format!(
        "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\nrule_files: ['{}']\nscrape_configs:\n  - job_name: cudapool\n    static_configs: [{{targets: ['127.0.0.1:{port}']}}]\n",
        rules.display()
    );
    std::fs::write(dir.join("prometheus.yml"), config).unwrap();
    let prom = Killed(
        Command::new("prometheus")
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{prom_port}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("prometheus.log")).unwrap())
            .spawn()
            .unwrap(),
    );

    // (2) `promtool check metrics` on a live scrape, once the job holds its memory.
    let metrics_url = format!("http://127.0.0.1:{port}/metrics");
    let mut scrape = String::new();
    while t0.elapsed() < Duration::from_secs(30) {
        scrape = get(&metrics_url).unwrap_or_default();
        let held = scrape.lines().any(|l| {
            l.starts_with("cudapool_group_reserved_bytes")
                && l.contains("slurm-7")
                && l.ends_with(" 67108864")
        });
        if held {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(scrape.contains("cudapool_group_reserved_bytes"), "{scrape}");
    let mut check = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(check.stdin.as_mut().unwrap(), scrape.as_bytes()).unwrap();
    let o = check.wait_with_output().unwrap();
    assert!(
        o.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );

    // (3) Prometheus answers the job's figures through its HTTP API, from the recording rules.
    let query = |q: &str| {
        get(&format!(
            "http://127.0.0.1:{prom_port}/api/v1/query?query={q}"
        ))
        .unwrap_or_default()
    };
    let mut answer = String::new();
    while t0.elapsed() < Duration::from_secs(60) {
        answer = query("cudapool:job_reserved_bytes");
        if answer.contains("\"job\":\"7\"") && answer.contains("\"67108864\"") {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let log = std::fs::read_to_string(dir.join("prometheus.log")).unwrap_or_default();
    assert!(
        answer.contains("\"job\":\"7\"") && answer.contains("\"67108864\""),
        "cudapool:job_reserved_bytes: {answer}\n{}",
        log.lines().rev().take(10).collect::<Vec<_>>().join("\n")
    );
    let members = query("cudapool_group_members%7Bgroup%3D%22slurm-7%22%7D");
    assert!(members.contains("\"1\""), "{members}");
    let processes = query("cudapool:job_processes");
    assert!(
        processes.contains("\"job\":\"7\"") && processes.contains("\"1\""),
        "{processes}"
    );
    drop((prom, exporter, job));
    let _ = f;
    eprintln!("prometheus: {:.1} s", t0.elapsed().as_secs_f64());
}
