"""What a sandbox's terminal may show on a person's terminal: :class:`TerminalFilter` (pure, no I/O).

``adk-sandbox shell`` and ``attach`` copy what a program in the sandbox writes to the person's own terminal
(an xterm, tmux, a terminal in an editor). The program is hostile: it must be able to draw — text,
colours, a full-screen editor, a progress bar — and nothing more. A terminal emulator does more than draw
when told to, and each of these is dropped here:

* **answers**: sequences that make the terminal reply (device attributes ``CSI c``, status and cursor
  position ``CSI n``, mode queries ``CSI $ p``, its version ``CSI > q``, window reports ``CSI t``, the
  kitty keyboard query ``CSI ? u``, ``ESC Z``, ENQ's answerback): the reply arrives as if the person had
  typed it, into the sandbox's shell or, after the sandbox's program ends, into the person's own;
* **strings**: every OSC (clipboard OSC 52 above all, titles OSC 0/1/2 that some terminals report back,
  colours, notifications, hyperlinks, vendor extensions), DCS (tmux's pass-through to an outer terminal,
  DECRQSS, sixel), APC, PM and SOS, to their end (BEL or ST) however long, without holding them;
* **window and printer control**: ``CSI t`` (resize, move, iconify), media copy ``CSI i``;
* **C1 controls** (U+0080..U+009F, as UTF-8 or as raw bytes: a terminal in 8-bit mode reads 0x9B as CSI)
  and a switch out of UTF-8 (``ESC %``), which would make raw C1 bytes mean something;
* any other control byte, ESC sequence or CSI sequence not on the lists below.

What passes: text (UTF-8, also when a character is split across reads; invalid bytes become U+FFFD), TAB,
CR, LF, BS, BEL, SO/SI; ``ESC`` 7 8 = > D E H M N O c and the charset designations (``ESC ( B``,
``ESC ( 0``, ``ESC # 8``...); CSI cursor movement and positioning, erase, insert and delete, scrolling
and its region, tab stops, SGR (16, 256 and true colours, colon sub-parameters), SM/RM and DEC private
modes (alternate screen, cursor, bracketed paste, mouse reporting), save and restore cursor, cursor shape
(``CSI SP q``), soft reset (``CSI ! p``) and xterm's modifyOtherKeys (``CSI > m``), which vim sets.
Everything a full-screen program (vim, top, less, htop, a REPL's line editor) needs to draw, then.

A sequence longer than :data:`MAX_CSI` bytes is dropped whole; a dropped string is skipped as it comes
(nothing of it is held), so memory stays a few bytes whatever the sandbox sends.
"""

from __future__ import annotations

import codecs
import re

__all__ = ["MAX_CSI", "TerminalFilter"]

#: The longest CSI sequence passed (parameters included); a longer one is dropped whole.
MAX_CSI = 64

_ESC, _BEL, _CAN, _SUB = 0x1B, 0x07, 0x18, 0x1A
# Control bytes in text: all but BEL, BS, TAB, LF, VT, FF, CR, SO and SI are dropped, with DEL and the C1
# controls once decoded (U+0080..U+009F).
_DROPPED_TEXT = re.compile("[\x00-\x06\x10-\x1f\x7f-\x9f]")
# Two-byte ESC sequences that pass: save/restore cursor, keypad modes, index, next line, tab set, reverse
# index, single shifts, full reset.
_ESC_FINALS = frozenset(b"78=>DEHMNOc")
# ESC + intermediate + final that pass: charset designations G0..G3 (94 and 96 sets), DEC line size and
# screen alignment (``ESC # 3..8``).
_DESIGNATE = frozenset(b"()*+-./")
_DESIGNATED = frozenset(b"0123456789<>=ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
# CSI finals that pass without a private marker or intermediate (cursor, erase, edit, scroll, tabs,
# repeat, modes, SGR, scroll region, save and restore cursor).
_CSI_PLAIN = frozenset(b"@ABCDEFGHIJKLMPSTXZ`abdefghlmrsu")
_CSI_PRIVATE = frozenset(b"hlrsJK")  # after "?": DEC private modes set/reset/save/restore, selective erase
_CSI_WITH = {b" ": frozenset(b"q"), b"!": frozenset(b"p"), b'"': frozenset(b"q")}  # cursor shape, soft reset
_STRINGS = frozenset(b"]P_^X")  # OSC, DCS, APC, PM, SOS

# States of the parser between feeds.
_GROUND, _ESCAPE, _CSI, _CSI_SKIP, _STRING, _STRING_ESC, _INTERMEDIATE = range(7)


class TerminalFilter:
    """Feed it what the sandbox's terminal sends; it returns what may be shown (see the module docstring).

    ``feed`` keeps the state of a sequence or a character split across calls; ``flush`` ends the stream
    (an unfinished sequence is dropped). ``dropped`` counts the sequences and control bytes dropped.
    """

    def __init__(self) -> None:
        self._state = _GROUND
        self._sequence = bytearray()  # the CSI or ESC sequence being read (at most MAX_CSI bytes)
        self._text = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.dropped = 0

    def feed(self, data: bytes) -> bytes:
        """What of ``data`` may be shown, given everything fed before."""
        out = bytearray()
        view = memoryview(data)
        at, end = 0, len(data)
        while at < end:
            if self._state == _GROUND:
                stop = data.find(b"\x1b", at)
                stop = end if stop < 0 else stop
                if stop > at:
                    out += self._shown_text(view[at:stop])
                if stop < end:
                    self._state, self._sequence = _ESCAPE, bytearray()
                    out += self._shown_text(b"", final=True)  # a character cut by ESC is invalid
                at = stop + 1
                continue
            byte = data[at]
            at += 1
            out += self._step(byte)
        return bytes(out)

    def flush(self) -> bytes:
        """The end of the stream: what is still held (a split character's start shows as U+FFFD)."""
        if self._state != _GROUND:
            self.dropped += 1
            self._state = _GROUND
        return self._shown_text(b"", final=True)

    # -- text -----------------------------------------------------------------------------------------
    def _shown_text(self, data: bytes | memoryview, final: bool = False) -> bytes:
        text = self._text.decode(bytes(data), final)
        if _DROPPED_TEXT.search(text):
            kept = _DROPPED_TEXT.sub("", text)
            self.dropped += len(text) - len(kept)
            text = kept
        return text.encode()

    # -- sequences ------------------------------------------------------------------------------------
    def _step(self, byte: int) -> bytes:  # noqa: PLR0911, PLR0912 - one state machine
        state = self._state
        if byte in (_CAN, _SUB) and state != _GROUND:  # they abort any sequence
            self._drop()
            return b""
        if state == _ESCAPE:
            return self._after_escape(byte)
        if state == _INTERMEDIATE:
            self._state = _GROUND
            if self._sequence[0] in _DESIGNATE and byte in _DESIGNATED:
                return b"\x1b" + bytes(self._sequence) + bytes([byte])
            if self._sequence == b"#" and 0x33 <= byte <= 0x38:
                return b"\x1b#" + bytes([byte])
            self.dropped += 1
            return b""
        if state in (_STRING, _STRING_ESC):
            if byte == _BEL or (state == _STRING_ESC and byte == 0x5C):
                self._drop()  # the string's end
            else:
                self._state = _STRING_ESC if byte == _ESC else _STRING
            return b""
        # CSI: parameters 0x30..0x3F, intermediates 0x20..0x2F, a final 0x40..0x7E.
        if byte == _ESC:  # a new sequence: this one was never finished
            self.dropped += 1
            self._state, self._sequence = _ESCAPE, bytearray()
            return b""
        if byte < 0x20:  # a control byte inside: executed by a terminal, dropped here
            self.dropped += 1
            return b""
        if state == _CSI_SKIP:
            if 0x40 <= byte <= 0x7E:
                self._state = _GROUND
            return b""
        self._sequence.append(byte)
        if 0x40 <= byte <= 0x7E:
            self._state = _GROUND
            return self._csi(bytes(self._sequence))
        if len(self._sequence) >= MAX_CSI or byte > 0x7E:
            self.dropped += 1
            self._state = _CSI_SKIP
        return b""

    def _after_escape(self, byte: int) -> bytes:
        if byte == 0x5B:  # [
            self._state = _CSI
            return b""
        if byte in _STRINGS:
            self._state = _STRING
            return b""
        if byte == _ESC:
            self.dropped += 1  # ESC ESC: the first one is dropped, the second starts anew
            return b""
        if byte in _DESIGNATE or byte == 0x23:  # ESC ( B, ESC # 8
            self._state, self._sequence = _INTERMEDIATE, bytearray([byte])
            return b""
        self._state = _GROUND
        if byte in _ESC_FINALS:
            return bytes([_ESC, byte])
        self.dropped += 1  # ESC Z (answers), ESC % (leaves UTF-8), ESC SP F/G (8-bit controls), others
        return b""

    def _csi(self, sequence: bytes) -> bytes:
        """``CSI`` + ``sequence`` (parameters, intermediates, final) if it may pass, else b""."""
        final, body = sequence[-1], sequence[:-1]
        marker = body[:1] if body[:1] in (b"?", b">", b"=", b"<") else b""
        params = body[len(marker) :]
        intermediates = params.lstrip(b"0123456789;:")
        digits = params[: len(params) - len(intermediates)]
        allowed = False
        if b"?" in digits or b">" in digits:
            allowed = False
        elif not marker and not intermediates:
            allowed = final in _CSI_PLAIN and not (final == ord("u") and digits)
        elif marker == b"?" and not intermediates:
            allowed = final in _CSI_PRIVATE
        elif marker == b">" and not intermediates:
            allowed = final == ord("m")  # modifyOtherKeys (vim); every other ">" asks or reports
        elif not marker and intermediates in _CSI_WITH:
            allowed = final in _CSI_WITH[intermediates]
        if allowed:
            return b"\x1b[" + sequence
        self.dropped += 1
        return b""

    def _drop(self) -> None:
        self.dropped += 1
        self._state, self._sequence = _GROUND, bytearray()
