"""The minion_id as a QR code in text, for the sticker on a device (`minion id --qr`, docs/devices.md).

A label printer prints text, so the code is drawn with Unicode block characters: each character is one
module wide and two modules tall (upper half block, lower half block, full block, space), dark modules
are ink. The quiet zone of 4 modules is part of the text, because a scanner needs it on the label too.
"""

from __future__ import annotations

from itertools import zip_longest
from typing import Final

QUIET_ZONE: Final[int] = 4  # modules of light margin ISO/IEC 18004 asks for around a QR code
# (top dark, bottom dark) -> character; dark is ink on the label
_BLOCKS: Final[dict[tuple[bool, bool], str]] = {
    (True, True): "\u2588",  # full block
    (True, False): "\u2580",  # upper half block
    (False, True): "\u2584",  # lower half block
    (False, False): " ",
}


def qr_text(value: str) -> str:
    """`value` as a QR code (model 2, error correction M or better, never Micro QR: phone scanners
    do not read those), one line per two module rows, ending in a newline."""
    import segno  # only `minion id --qr` pays for the import

    code = segno.make_qr(value, error="m")
    rows = [[bool(module) for module in row] for row in code.matrix_iter(scale=1, border=QUIET_ZONE)]
    lines = []
    for top, bottom in zip_longest(rows[0::2], rows[1::2], fillvalue=[False] * len(rows[0])):
        lines.append("".join(_BLOCKS[(t, b)] for t, b in zip(top, bottom, strict=True)))
    return "\n".join(lines) + "\n"
