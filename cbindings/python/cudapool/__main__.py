"""``python -m cudapool run [--limit SIZE] [--pool KIND] [--report] -- prog args...`` (and every
other command of the ``cudapool`` CLI): runs the CLI installed with this package, pointed at
this package's library. The CLI checks the options and execs the program with the library
preloaded.
"""

import os
import shutil
import sys
import sysconfig

from . import _source_tree_builds, library_path


def cli_path():
    """The ``cudapool`` command installed beside this package's Python (pip puts it in the
    scripts folder), else a build of the source tree this package sits in, else the first on
    PATH. Raises FileNotFoundError naming every place it looked."""
    places = [
        os.path.join(sysconfig.get_path("scripts"), "cudapool"),
        os.path.join(os.path.dirname(sys.executable), "cudapool"),
    ] + _source_tree_builds("cudapool") + [shutil.which("cudapool") or "(cudapool on PATH)"]
    # The scripts folder is often the interpreter's own: each place once.
    places = list(dict.fromkeys(os.path.normpath(p) if os.sep in p else p for p in places))
    for p in places:
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    raise FileNotFoundError(
        "the cudapool command was not found; tried " + ", ".join(places)
        + ". Install cudapool with pip, or build the source tree (scripts/demo.sh or cargo build"
        " --release)"
    )


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
