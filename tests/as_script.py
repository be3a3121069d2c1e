"""`python -m tests.as_script SCRIPT ARGS` runs SCRIPT as `python SCRIPT ARGS` does: as `__main__`, with its
folder first on sys.path and its path as sys.argv[0]. The suite's `run_script` forks it from a trial's zygote,
which can run a module (`python -m`) but not a path."""

from __future__ import annotations

import os
import runpy
import sys


def main() -> None:
    """Run the script named by the first argument, with the rest as its arguments."""
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path[0] = os.path.dirname(os.path.abspath(script))  # where `python -c`/`-m` put the folder run from
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
