"""Timing the exporter while a hostile neighbour's files are read (tests/hostile.rs).

    neighbour.py scrape PORT TAG        GET /metrics, and GET / while it is being answered;
                                        print "TAG metrics_s=... root_s=..." and the exporter's
                                        own lines
"""
import sys
import threading
import time
import urllib.request


def scrape(port, tag):
    got = {}

    def metrics():
        t = time.monotonic()
        url = f"http://127.0.0.1:{port}/metrics"
        got["body"] = urllib.request.urlopen(url, timeout=120).read().decode()
        got["s"] = time.monotonic() - t

    th = threading.Thread(target=metrics)
    th.start()
    time.sleep(0.1)
    t = time.monotonic()
    urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=120).read()
    root = time.monotonic() - t
    th.join()
    print(f"{tag} metrics_s={got['s']:.3f} root_s={root:.3f}")
    for line in got["body"].splitlines():
        if line.startswith(("cudapool_exporter_", "cudapool_processes", "cudapool_runtime_dir")):
            print(tag, line)


if __name__ == "__main__":
    if sys.argv[1] == "scrape":
        scrape(int(sys.argv[2]), sys.argv[3])
    else:
        sys.exit(f"neighbour.py: unknown {sys.argv[1]}")
