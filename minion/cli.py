"""`minion` command line (filled in by the hardware and join work)."""

import sys


def main() -> None:
    print("minion: not yet implemented", file=sys.stderr)
    sys.exit(2)
