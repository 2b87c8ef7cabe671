"""Holds three allocations (1000, 3 MiB and 12345 bytes) and then makes no allocator call for
SECONDS: the process `cudapool snapshot PID` must answer anyway (run by tests/preload.rs).

usage: idle_holder.py SECONDS
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fake_driver import allocate, driver  # noqa: E402

cu = driver()
for s in (1000, 3 << 20, 12345):
    assert allocate(cu, s)[0] == 0
print("ready", flush=True)
time.sleep(float(sys.argv[1]))
