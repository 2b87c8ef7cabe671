"""What benches/gpu/torch_lockstep.py and benches/gpu/cpp_lockstep.py share: live worker
processes pinned to one core that take turns (the order rotated each round), and the
figures: the median over the rounds with its spread, and ratios within a turn.

A worker is the calling script run again with `--worker SIZES`; it prints `ready`, then answers
each line `SIZE PAIRS` with one line of figures.
"""
import os
import statistics
import subprocess
import sys


def quantile(v, p):
    v = sorted(v)
    k = (len(v) - 1) * p
    lo = int(k)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def label(s):
    """`4 KiB`, `16 MiB`; a size that is not a whole number of either in bytes."""
    if s >= 1 << 20 and s % (1 << 20) == 0:
        return f"{s >> 20} MiB"
    return f"{s >> 10} KiB" if s >= 1024 and s % 1024 == 0 else f"{s} B"


def spread(v):
    """`median [25th-75th percentile]` of ns figures."""
    return f"{statistics.median(v):.0f} [{quantile(v, .25):.0f}-{quantile(v, .75):.0f}]"


def ratio(q):
    """The median of per-turn ratios with their spread; faster or slower only beyond it."""
    lo, hi = quantile(q, .25), quantile(q, .75)
    verdict = "" if lo <= 1 <= hi else (" faster" if hi < 1 else " slower")
    return f"{statistics.median(q):.2f}x [{lo:.2f}-{hi:.2f}]{verdict}"


def run(script, workers, core, sizes, rounds, pairs):
    """Starts one worker of `script` per (name, environment) in `workers`, pinned to `core`,
    and runs `rounds` rounds of turns over `sizes` (a comma-separated list), `pairs` pairs a
    turn. Returns {(worker index, size): [the worker's answer, split, per round]}."""
    procs = []
    for _, extra in workers:
        env = dict(os.environ)
        env.pop("LD_PRELOAD", None)
        env.update(extra)
        procs.append(subprocess.Popen(
            ["taskset", "-c", str(core), sys.executable, script, "--worker", sizes],
            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1))
    for (name, _), p in zip(workers, procs):
        if p.stdout.readline().strip() != "ready":
            sys.exit(f"{os.path.basename(script)}: the worker of '{name}' did not start")
    answers = {}
    for r in range(rounds):
        order = list(range(len(workers)))
        order = order[r % len(order):] + order[: r % len(order)]
        for size in map(int, sizes.split(",")):
            for w in order:
                procs[w].stdin.write(f"{size} {pairs}\n")
                procs[w].stdin.flush()
                answers.setdefault((w, size), []).append(procs[w].stdout.readline().split())
    for p in procs:
        p.stdin.close()
        p.wait()
    return answers
