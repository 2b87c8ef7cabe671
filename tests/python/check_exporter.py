"""`cudapool exporter` against real HTTP and the Prometheus project's own parsers
(prometheus_client, in the test's virtual environment). Run by tests/exporter.rs:

    check_exporter.py CUDAPOOL_BINARY CLIENT LIBCUDAPOOL

The clients are the C test client (its `park` scenario: holds N blocks of SIZE bytes until its
stdin closes) under LD_PRELOAD against the fake driver (LD_LIBRARY_PATH set by the caller).
Prints one PASS/FAIL line per check and "exporter: N passed, M failed"; exits 1 on a failure.
"""
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as parse_openmetrics,
)
from prometheus_client.parser import text_string_to_metric_families as parse_prometheus

CUDAPOOL, CLIENT, LIB = sys.argv[1:4]
OPENMETRICS = "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
MIB = 1 << 20
passed = failed = 0


def check(what, ok, detail=""):
    global passed, failed
    if ok:
        passed += 1
        print(f"PASS {what}")
    else:
        failed += 1
        print(f"FAIL {what}: {detail}")


def park(n, size, *extra, env=None):
    """A client holding n blocks of size bytes; returns it once it holds them."""
    e = dict(os.environ, LD_PRELOAD=LIB, **(env or {}))
    p = subprocess.Popen(
        [CLIENT, "dlsym", "park", str(n), str(size), *extra],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=e,
    )
    line = ""
    while not line.startswith("parked"):
        line = p.stdout.readline()
        if not line:
            raise RuntimeError(f"client {extra} exited: {p.wait()}")
    return p


def release(p):
    p.stdin.close()
    return p.wait(timeout=10)


def exporter(*args):
    """Starts the exporter on a free port; returns (process, base URL)."""
    p = subprocess.Popen(
        [CUDAPOOL, "exporter", "--listen", "127.0.0.1:0", *args],
        stderr=subprocess.PIPE,
        text=True,
    )
    line = p.stderr.readline()
    m = re.search(r"http://(127\.0\.0\.1:\d+)/metrics", line)
    if not m:
        raise RuntimeError(f"exporter said: {line!r}")
    return p, f"http://{m.group(1)}"


def get(url, accept=None, timeout=5):
    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, r.headers.get("Content-Type"), r.read().decode()


def series(families, name, pid):
    """The value of `name`'s sample labelled with `pid`, else None."""
    for f in families:
        for s in f.samples:
            if s.name == name and s.labels.get("pid") == str(pid):
                return s.value
    return None


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))


def settled(base, want):
    """Scrapes until `want(families)` holds (a page is refreshed within 50 ms of a change: the
    process's page thread), at most 3 s; returns the last families."""
    deadline = time.monotonic() + 3
    while True:
        fams = list(parse_prometheus(get(base + "/metrics")[2]))
        if want(fams) or time.monotonic() > deadline:
            return fams
        time.sleep(0.05)


a = park(3, 8 * MIB)
b = park(2, 4 * MIB, "oom", env={"CUDAPOOL_MEMORY_LIMIT": "64MiB", "CUDAPOOL_GROUP": "job-7"})
exp, base = exporter("--interval", "0")
try:
    settled(base, lambda f: series(f, "cudapool_allocated_bytes", b.pid) == 8 * MIB)
    status, ctype, body = get(base + "/metrics")
    check("GET /metrics answers in the Prometheus text format", status == 200 and ctype.startswith("text/plain; version=0.0.4"), ctype)
    fams = list(parse_prometheus(body))
    names = {f.name for f in fams}
    check(
        "prometheus_client's text parser reads it",
        {"cudapool_allocated_bytes", "cudapool_reserved_bytes", "cudapool_ooms", "cudapool_processes"} <= names,
        sorted(names),
    )
    check("allocated equals what client A holds", series(fams, "cudapool_allocated_bytes", a.pid) == 24 * MIB, series(fams, "cudapool_allocated_bytes", a.pid))
    check("allocated equals what client B holds", series(fams, "cudapool_allocated_bytes", b.pid) == 8 * MIB, series(fams, "cudapool_allocated_bytes", b.pid))
    check("requested is what client A asked for", series(fams, "cudapool_requested_bytes", a.pid) == 24 * MIB, series(fams, "cudapool_requested_bytes", a.pid))
    check("B's hard limit is its 64 MiB", series(fams, "cudapool_hard_limit_bytes", b.pid) == 64 * MIB)
    check("B's one out-of-memory answer is counted", series(fams, "cudapool_ooms_total", b.pid) == 1, series(fams, "cudapool_ooms_total", b.pid))
    check("A had none", series(fams, "cudapool_ooms_total", a.pid) == 0)
    check("alloc calls are counters", series(fams, "cudapool_alloc_calls_total", a.pid) == 3)
    procs = [s.value for f in fams for s in f.samples if s.name == "cudapool_processes"]
    check("cudapool_processes counts both (and any other of this user)", procs and procs[0] >= 2, procs)
    labels = next(s.labels for f in fams for s in f.samples if s.name == "cudapool_reserved_bytes" and s.labels.get("pid") == str(b.pid))
    check(
        "labels: pid, comm, device, uuid and the group",
        labels.get("comm") == "client" and labels.get("device") == "0" and labels.get("uuid") == "GPU-face0000-1122-3344-5566-778899aabbcc" and labels.get("group") == "job-7",
        labels,
    )
    greserved = [s for f in fams for s in f.samples if s.name == "cudapool_group_reserved_bytes" and s.labels.get("group") == "job-7"]
    check("the group's reserved bytes: B's", len(greserved) == 1 and greserved[0].value == 8 * MIB, greserved)
    gmembers = [s.value for f in fams for s in f.samples if s.name == "cudapool_group_members" and s.labels.get("group") == "job-7"]
    check("the group's members", gmembers == [1], gmembers)
    # Every family emitted is documented, and they come out in one order.
    doc = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs", "observability.md")).read()
    listed = set()
    for row in re.findall(r"^\| (`cudapool_[^|]*)\|", doc, re.M):
        for name in re.findall(r"`(cudapool_\w+)`", row):
            listed.add(re.sub(r"_total$", "", name))
    emitted = {re.sub(r"_total$", "", f.name) for f in fams}
    check("docs/observability.md lists every family emitted", emitted <= listed, sorted(emitted - listed))
    order = [l.split()[2] for l in body.splitlines() if l.startswith("# TYPE ")]
    again = [l.split()[2] for l in get(base + "/metrics")[2].splitlines() if l.startswith("# TYPE ")]
    check("families in one fixed order", order == sorted(order) and again == order, order)
    labels_a = next(s.labels for f in fams for s in f.samples if s.name == "cudapool_reserved_bytes" and s.labels.get("pid") == str(a.pid))
    check("no group label on a process in no group", "group" not in labels_a, labels_a)

    status, ctype, body = get(base + "/metrics", accept=OPENMETRICS)
    check("OpenMetrics when Accept prefers it", ctype.startswith("application/openmetrics-text") and body.endswith("# EOF\n"), ctype)
    om = list(parse_openmetrics(body))
    check("prometheus_client's OpenMetrics parser reads it", series(om, "cudapool_allocated_bytes", a.pid) == 24 * MIB)
    check("... with the counters", series(om, "cudapool_ooms_total", b.pid) == 1)

    status, ctype, body = get(base + "/")
    check("GET / names /metrics", status == 200 and "/metrics" in body, body)
    for path, want in (("/nope", 404),):
        try:
            get(base + path)
            code = 200
        except urllib.error.HTTPError as e:
            code = e.code
        check(f"GET {path} is {want}", code == want, code)
    try:
        urllib.request.urlopen(urllib.request.Request(base + "/metrics", data=b"x", method="POST"), timeout=5)
        code = 200
    except urllib.error.HTTPError as e:
        code = e.code
    check("POST /metrics is 405", code == 405, code)

    # Clients that never finish a request stall no one.
    host, port = base[len("http://"):].split(":")
    idle = socket.create_connection((host, int(port)))  # half-open: sends nothing
    slow = socket.create_connection((host, int(port)))
    slow.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # and never ends its headers
    t = time.monotonic()
    status, _, body = get(base + "/metrics", timeout=3)
    check("a half-open and a slow client stall no other scrape", status == 200 and time.monotonic() - t < 2, time.monotonic() - t)

    # A client that exits disappears from the next scrape.
    check("client A exits cleanly", release(a) == 0)
    fams = list(parse_prometheus(get(base + "/metrics")[2]))
    check("its series are gone at the next scrape", series(fams, "cudapool_allocated_bytes", a.pid) is None)
    check("B's are still there", series(fams, "cudapool_allocated_bytes", b.pid) == 8 * MIB, series(fams, "cudapool_allocated_bytes", b.pid))

    # Memory stays flat over 1,000 scrapes.
    for _ in range(100):
        get(base + "/metrics")
    before = rss_kib(exp.pid)
    for _ in range(1000):
        get(base + "/metrics")
    after = rss_kib(exp.pid)
    check("1,000 scrapes in a row: memory flat (< 2 MiB growth)", after - before < 2048, f"{before} -> {after} KiB")
    print(f"rss before={before} after={after} KiB")
    idle.close()
    slow.close()

    # Bad input.
    busy = subprocess.run([CUDAPOOL, "exporter", "--listen", base[len("http://"):]], capture_output=True, text=True, timeout=10)
    check("a port in use: exit 1 and why", busy.returncode == 1 and "cannot listen" in busy.stderr, busy.stderr)
    bad = subprocess.run([CUDAPOOL, "exporter", "--listen", "nowhere:port"], capture_output=True, text=True, timeout=10)
    check("a bad address: exit 2, naming the option", bad.returncode == 2 and "cudapool exporter: invalid value 'nowhere:port' for '--listen" in bad.stderr, bad.stderr)
finally:
    exp.kill()
    exp.wait()
    for p in (a, b):
        if p.poll() is None:
            release(p)

print(f"exporter: {passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
