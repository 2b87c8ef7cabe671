"""``python -m cudapool run [--limit SIZE] [--pool KIND] [--report] -- prog args...`` (and every
other command of the ``cudapool`` CLI): runs the CLI installed with this package, pointed at
this package's library. The CLI checks the options and execs the program with the library
preloaded.
"""

import os
import shutil
import sys
import sysconfig

from . import library_path


def cli_path():
    """The ``cudapool`` command installed beside this package's Python (pip puts it in the
    scripts folder), else the first on PATH, else a build of the source tree."""
    here = os.path.dirname(os.path.abspath(__file__))
    places = [
        os.path.join(sysconfig.get_path("scripts"), "cudapool"),
        os.path.join(os.path.dirname(sys.executable), "cudapool"),
        shutil.which("cudapool") or "",
        os.path.join(here, "..", "..", "target", "release", "cudapool"),
    ]
    for p in places:
        if p and os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    raise FileNotFoundError("the cudapool command was not found; install cudapool with pip")


def main():
    try:
        cli, lib = cli_path(), library_path()
    except FileNotFoundError as e:
        print(f"cudapool: {e}", file=sys.stderr)
        return 2
    env = dict(os.environ, CUDAPOOL_LIB=lib)
    os.execve(cli, [cli] + sys.argv[1:], env)


if __name__ == "__main__":
    sys.exit(main())
