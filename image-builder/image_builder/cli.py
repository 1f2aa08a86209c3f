"""`image-builder` command line (filled in by the image builder work)."""

import sys


def main() -> None:
    print("image-builder: not yet implemented", file=sys.stderr)
    sys.exit(2)
