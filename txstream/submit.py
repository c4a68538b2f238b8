"""spark-submit's entry point for txstream.

    spark-submit --master spark://HOST:7077 $(python -m txstream.submit --path) run pkg.module:Class ...

spark-submit runs a Python *file* as the driver; this module is that file, and runs the
`txstream` command with the arguments after it. The master, `--conf` and the rest of
spark-submit's options reach the run through its JVM (spark/setup.py: they win over txstream's
defaults, and `txstream run --master` is then not needed).
"""
from __future__ import annotations

import os
import sys


def main() -> int:
    if sys.argv[1:] == ["--path"]:
        print(os.path.abspath(__file__))
        return 0
    # Run as a file, this module's directory (the txstream package) is sys.path[0]: its module
    # names (errors, settings, kafka, ...) must not shadow top-level ones.
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    from txstream.cli.main import main as txstream

    return txstream(args=sys.argv[1:], prog_name="txstream")


if __name__ == "__main__":
    sys.exit(main())
