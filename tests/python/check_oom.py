"""The moment of out-of-memory (issue 35), under cudapool with a 64 MiB limit and the fake driver
(tests/preload.rs runs it): the program's handler frees and its retry succeeds (counted as a
reclaim retry, no OOM reaches the program); a handler that allocates gets its own answer at
once and is not called again from inside itself; one that raises is a "no"; and
CUDAPOOL_OOM_SNAPSHOT writes a snapshot in PyTorch's format at each OOM the program receives.
Prints "oom: N passed, M failed"."""
import os
import pickle
import sys

sys.path[:0] = [sys.argv[1], sys.argv[2]]
import cudapool  # noqa: E402
import fake_driver  # noqa: E402

MIB = 1 << 20
passed = failed = 0


def check(what, ok, detail=""):
    global passed, failed
    if ok:
        passed += 1
        print("PASS", what)
    else:
        failed += 1
        print("FAIL", what, detail)


cu = fake_driver.driver()
held = []
while True:
    r, p = fake_driver.allocate(cu, 8 * MIB)
    if r:
        break
    held.append(p)
check("the limit fills with 8 blocks of 8 MiB", len(held) == 8 and r == 2, (len(held), r))
base = cudapool.memory_stats(0)

calls = []


def freeing(device, nbytes):
    calls.append((device, nbytes))
    cu.cuMemFree_v2(held.pop())  # through cudapool: outside its hook
    return True


cudapool.set_oom_handler(freeing)
r, p = fake_driver.allocate(cu, 8 * MIB)
s = cudapool.memory_stats(0)
check("a handler that frees: the retry succeeds", r == 0 and p != 0, r)
check("... called once, with the device and the bytes", calls == [(0, 8 * MIB)], calls)
check("... no OOM reached the program", s["ooms"] == base["ooms"], (base["ooms"], s["ooms"]))
check("... its retry is counted", s["reclaim_retries"] > base["reclaim_retries"], s["reclaim_retries"])
held.append(p)

inner = []


def allocating(device, nbytes):
    inner.append(fake_driver.allocate(cu, 8 * MIB)[0])
    return False


cudapool.set_oom_handler(allocating)
r, _ = fake_driver.allocate(cu, 8 * MIB)
check("a handler that allocates: its own allocation fails at once, not called inside itself", inner == [2], inner)
check("... and the program gets the OOM", r == 2, r)
check("... both OOMs counted", cudapool.memory_stats(0)["ooms"] == s["ooms"] + 2, cudapool.memory_stats(0)["ooms"])


def raising(device, nbytes):
    raise RuntimeError("a handler's own error")


cudapool.set_oom_handler(raising)
r, _ = fake_driver.allocate(cu, 8 * MIB)
check("a handler that raises: a plain OOM, the process goes on", r == 2, r)
cudapool.set_oom_handler(None)
r, _ = fake_driver.allocate(cu, 8 * MIB)
check("no handler: a plain OOM", r == 2, r)

snap = os.environ.get("CUDAPOOL_OOM_SNAPSHOT")
if snap:
    # Received: the one that filled the limit, the handler's own and the program's, the one
    # after the raising handler, the one with none.
    paths = [snap.replace("%p", str(os.getpid())).replace("%n", str(n)) for n in range(1, 7)]
    check("a snapshot for each OOM received (5 here)", all(os.path.exists(p) for p in paths[:5]) and not os.path.exists(paths[5]), [os.path.exists(p) for p in paths])
    d = pickle.load(open(paths[0], "rb"))
    actions = [e["action"] for e in d["device_traces"][0]]
    check("it loads with pickle, with the history leading to the OOM", "oom" in actions and actions.count("alloc") >= 8, actions[-5:])
    check("... and the segments of the moment", sum(b["size"] for g in d["segments"] for b in g["blocks"]) == 64 * MIB, len(d["segments"]))
for p in held:
    cu.cuMemFree_v2(p)
print(f"oom: {passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
