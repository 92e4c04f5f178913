"""Text from the data shown on a terminal.

A dataset's names, ids, tasks and paths are input: printed as they are, an ESC or CSI in them
drives the terminal (clears the screen, sets the title, fakes coloured text), a BEL rings, a
carriage return or newline forges another line. `for_terminal` is what every command line tool
passes such text through before printing it.
"""

from __future__ import annotations

__all__ = ["for_terminal"]

# C0 controls (newline and tab included: a message is one line), DEL and C1 controls as \xNN;
# the bidirectional marks, overrides and isolates (they reorder what follows on the line) and the
# line and paragraph separators (some viewers start a line there) as \uNNNN.
_ESCAPES = {code: f"\\x{code:02x}" for code in (*range(0x20), *range(0x7F, 0xA0))}
_ESCAPES.update({code: f"\\u{code:04x}" for code in (0x061C, 0x200E, 0x200F, 0x2028, 0x2029, *range(0x202A, 0x202F), *range(0x2066, 0x206A))})


def for_terminal(text: object) -> str:
    """`text` with every control character replaced by a visible escape (ESC -> `\\x1b`, BEL ->
    `\\x07`, CSI -> `\\x9b`); other Unicode is kept as it is."""
    return str(text).translate(_ESCAPES)
