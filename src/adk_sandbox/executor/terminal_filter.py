"""What a sandbox's terminal may show on a person's terminal: :class:`TerminalFilter` (pure, no I/O).

``adk-sandbox shell`` and ``attach`` pass a hostile program's output through it: drawing passes
(:data:`DEC_MODES`), sequences that answer, set the clipboard or change the terminal are dropped;
:data:`RESTORE` undoes the modes that passed.
See docs/terminals.md, section "What reaches a person's terminal".
"""

from __future__ import annotations

import codecs
import re

__all__ = ["DEC_MODES", "MAX_CSI", "PEEK", "RESTORE", "TerminalFilter"]

#: The longest CSI or ESC sequence passed (after ``ESC [`` or ``ESC``); a longer one is dropped whole.
MAX_CSI = 64
#: How many bytes of a dropped string (OSC, DCS...) are kept, only to name it.
PEEK = 16

#: DEC private modes (``CSI ? Pm h/l``, also saved and restored by ``CSI ? Pm s/r``) that pass: drawing and
#: reporting what the person does in this terminal, nothing that answers on its own, resizes the window,
#: switches the terminal's emulation or changes what its keys send beyond a full-screen program's needs.
DEC_MODES = frozenset(
    {
        1,  # application cursor keys (DECCKM): vim, less, readline
        4,  # smooth scroll
        5,  # reverse video
        6,  # origin mode (relative to the scroll region)
        7,  # autowrap
        9,  # X10 mouse reporting: reports what the person clicks, as the modes 1000.. below
        12,  # cursor blinking
        25,  # cursor visibility
        45,  # reverse wraparound
        47,  # alternate screen (old form)
        66,  # application keypad (as ESC =)
        69,  # left and right margins
        1000,  # mouse reporting: clicks
        1002,  # ... and drags
        1003,  # ... and every motion
        1004,  # focus in and out (fixed sequences, sent when the person switches windows)
        1005,  # mouse coordinates as UTF-8
        1006,  # ... as SGR parameters
        1007,  # the wheel as cursor keys on the alternate screen
        1015,  # mouse coordinates as urxvt's
        1016,  # ... as SGR pixels
        1034,  # the Meta key sets the eighth bit: readline sends it (xterm's smm) at every prompt
        1036,  # the Meta key sends ESC
        1039,  # the Alt key sends ESC
        1047,  # alternate screen
        1048,  # save and restore the cursor
        1049,  # alternate screen with the cursor saved (vim, less, top, htop)
        2004,  # bracketed paste (bash, zsh, python3's REPL, vim)
        2026,  # synchronised output (frames drawn whole; terminals end it by a timeout)
    }
)
# ANSI modes (``CSI Pm h/l``) that pass: insert mode only. Keyboard lock (2), local echo (12, which would echo
# the person's passwords once the session ends) and newline mode (20, what Return sends) stay out.
_ANSI_MODES = frozenset({4})

#: What the CLI writes to the person's terminal when the sandbox's output ends: the modes that passed set
#: back (mouse and focus reporting off, bracketed paste off, the main screen, a visible cursor of the
#: default shape, default colours, no scroll region, normal keys and keypad, the ASCII charset).
RESTORE = (
    b"\x1b[?2026l"
    b"\x1b[?9l\x1b[?1000l\x1b[?1002l\x1b[?1003l\x1b[?1004l\x1b[?1005l\x1b[?1006l\x1b[?1007l"
    b"\x1b[?1015l\x1b[?1016l\x1b[?2004l\x1b[?1049l"
    b"\x1b[!p\x1b[?7h\x1b[?25h\x1b[?12l\x1b[?1l\x1b>\x1b[?5l\x1b[?6l\x1b[?69l\x1b[4l\x1b[r\x1b[0m"
    b"\x1b[>4m\x1b[0 q\x0f\x1b(B"
)

_ESC, _BEL, _CAN, _SUB, _DEL = 0x1B, 0x07, 0x18, 0x1A, 0x7F
# Control bytes in text that pass: BEL, BS, TAB, LF, VT, FF, CR, SO and SI (drawing, the bell). The others
# are dropped: NUL..ACK (ENQ makes some terminals send their answerback), DLE..US (CAN and SUB included),
# DEL; and once decoded, the C1 controls U+0080..U+009F (an 8-bit CSI, OSC, DCS...).
_C0_PASSED = frozenset(b"\x07\x08\t\n\x0b\x0c\r\x0e\x0f")
_C0_DROPPED = bytes(b for b in range(0x20) if b not in _C0_PASSED) + b"\x7f"
_DROPPED_TEXT = re.compile("[\x00-\x06\x10-\x1f\x7f-\x9f]")
# Two-byte ESC sequences that pass: save/restore cursor (7 8), keypad modes (= >), index, next line, tab
# set, reverse index (D E H M), single shifts (N O: the next character from G2/G3), and the full reset (c):
# it makes the terminal answer nothing, undoes what the sandbox set, and `reset` sends it.
_ESC_FINALS = frozenset(b"78=>DEHMNOc")
# ESC + intermediate + final that pass: charset designations G0..G3 (94 and 96 sets: ESC ( 0 draws lines),
# and DEC line size and screen alignment (ESC # 3..8).
_DESIGNATE = frozenset(b"()*+-./")
_DESIGNATED = frozenset(b"0123456789<>=ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
_LINE_SIZE = frozenset(b"345678")
# CSI finals that pass with no private marker and no intermediate: cursor (@ A..H, ` a d e f, I Z), erase
# (J K X), insert/delete lines and characters (L M P), scroll (S T), repeat (b), tab clear (g), SGR (m),
# scroll region (r), save and restore cursor (s u), modes (h l, by list). Not: c (answers), n (answers),
# t (window), x (answers), i (printer), q (keyboard LEDs), p, y and the rest.
_CSI_PLAIN = frozenset(b"@ABCDEFGHIJKLMPSTXZ`abdefghlmrsu")
_CSI_PRIVATE = frozenset(b"hlsrJK")  # after "?": DEC modes (by list), selective erase
_CSI_WITH = {b" ": frozenset(b"q"), b"!": frozenset(b"p"), b'"': frozenset(b"q")}  # shape, soft reset, DECSCA
_STRINGS = {0x5D: "OSC", 0x50: "DCS", 0x5F: "APC", 0x5E: "PM", 0x58: "SOS"}
_OSC_NAMES = {
    b"0": "title",
    b"1": "icon title",
    b"2": "title",
    b"4": "colour",
    b"7": "working directory",
    b"8": "hyperlink",
    b"9": "notification",
    b"52": "clipboard",
    b"104": "colour",
    b"777": "notification",
    b"1337": "iTerm2",
    b"5113": "kitty file transfer",
}
_CSI_NAMES = {
    (b"", b"", ord("c")): "device attributes, answers",
    (b">", b"", ord("c")): "device attributes, answers",
    (b"=", b"", ord("c")): "device attributes, answers",
    (b"", b"", ord("n")): "status report, answers",
    (b"?", b"", ord("n")): "status report, answers",
    (b"", b"$", ord("p")): "mode query, answers",
    (b"?", b"$", ord("p")): "mode query, answers",
    (b">", b"", ord("q")): "version query, answers",
    (b"", b"", ord("t")): "window operation",
    (b"", b"", ord("x")): "parameters query, answers",
    (b"?", b"", ord("u")): "keyboard protocol query, answers",
    (b">", b"", ord("u")): "keyboard protocol",
    (b"<", b"", ord("u")): "keyboard protocol",
    (b"=", b"", ord("u")): "keyboard protocol",
    (b"", b"", ord("i")): "media copy",
    (b"", b"", ord("h")): "mode",
    (b"", b"", ord("l")): "mode",
    (b"?", b"", ord("h")): "mode",
    (b"?", b"", ord("l")): "mode",
}

# A whole CSI sequence at an ESC, decided at once (the byte-by-byte path gives the same answer).
_CSI_WHOLE = re.compile(rb"\x1b\[([0-?]*[ -/]*)([@-~])")
_CSI_BODY = re.compile(rb"([<=>?]?)([0-9:;]*)([ -/]*)")
_PASSED_KEPT = 256  # how many passed CSI sequences are remembered as such
_STRING_END = re.compile(rb"[\x07\x18\x1a\x1b]")

# States of the parser between feeds.
_GROUND, _ESCAPE, _INTERMEDIATE, _CSI, _CSI_SKIP, _STRING, _STRING_ESC = range(7)


class TerminalFilter:
    """Feed it what the sandbox's terminal sends; it returns what may be shown (docs/terminals.md).

    ``feed`` keeps the state of a sequence or a character split across calls; ``flush`` ends the stream
    (an unfinished sequence is dropped, a split character shows as U+FFFD). ``dropped`` counts the
    sequences and control bytes dropped, ``last_dropped`` names the latest (printable ASCII, short: for a
    notice to the person), ``None`` before any.
    """

    def __init__(self) -> None:
        self._state = _GROUND
        self._sequence = bytearray()  # a CSI's body or an ESC's intermediates (at most MAX_CSI bytes)
        self._string = ""  # the kind of the string being skipped: "OSC", "DCS"...
        self._peek = bytearray()  # its first bytes (at most PEEK)
        self._text = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._passed: set[bytes] = set()  # whole CSI sequences seen to pass unchanged (a bounded few)
        self.dropped = 0
        self.last_dropped: str | None = None

    def feed(self, data: bytes) -> bytes:
        """What of ``data`` may be shown, given everything fed before."""
        data = bytes(data)
        out = bytearray()
        at, end = 0, len(data)
        while at < end:
            state = self._state
            if state == _GROUND:
                # The fast path: a run of text up to the next ESC is decoded and copied in one piece.
                stop = data.find(b"\x1b", at)
                if stop < 0:
                    out += self._shown_text(data[at:] if at else data)
                    break
                if stop > at:
                    out += self._shown_text(data[at:stop])
                out += self._end_text()  # a character cut by ESC is invalid
                whole = _CSI_WHOLE.match(data, stop)
                if whole is not None and len(whole[1]) < MAX_CSI:
                    sequence = whole[0]
                    if sequence in self._passed:  # SGR and cursor moves repeat: decided once
                        out += sequence
                    else:
                        shown = self._csi(whole[1], whole[2][0])
                        if shown == sequence and len(self._passed) < _PASSED_KEPT:
                            self._passed.add(sequence)
                        out += shown
                    at = whole.end()
                else:
                    self._state = _ESCAPE
                    at = stop + 1
                continue
            if state == _STRING:
                # Skipped in one piece up to what may end it; only the first PEEK bytes are kept.
                found = _STRING_END.search(data, at)
                stop = end if found is None else found.start()
                if len(self._peek) < PEEK:
                    self._peek += data[at : min(stop, at + PEEK - len(self._peek))]
                at = stop
                if found is None:
                    break
            out += self._step(data[at])
            at += 1
        return bytes(out)

    def flush(self) -> bytes:
        """The end of the stream: an unfinished sequence is dropped, a split character shows as U+FFFD."""
        if self._state in (_STRING, _STRING_ESC):
            self._end_string()
        elif self._state != _GROUND:
            self._count("an unfinished escape sequence")
        self._state = _GROUND
        return self._end_text()

    # -- text -----------------------------------------------------------------------------------------
    def _shown_text(self, data: bytes) -> bytes:
        if data.isascii() and not self._text.getstate()[0]:
            kept = data.translate(None, _C0_DROPPED)  # no character pending: bytes are characters
            if len(kept) != len(data):
                first = next(b for b in data if b in _C0_DROPPED)
                self._count(f"control byte 0x{first:02X}", len(data) - len(kept))
            return kept
        return self._checked(self._text.decode(data))

    def _end_text(self) -> bytes:
        if not self._text.getstate()[0]:
            return b""
        return self._checked(self._text.decode(b"", True))

    def _checked(self, text: str) -> bytes:
        found = _DROPPED_TEXT.search(text)
        if found is not None:
            kept = _DROPPED_TEXT.sub("", text)
            code = ord(found[0])
            name = f"C1 control U+{code:04X}" if code >= 0x80 else f"control byte 0x{code:02X}"
            self._count(name, len(text) - len(kept))
            text = kept
        return text.encode()

    def _control(self, byte: int) -> bytes:
        """A C0 control met inside a sequence.

        A terminal executes it there, so it passes (or is dropped) as in text, and the sequence goes on.
        """
        if byte in _C0_PASSED:
            return bytes((byte,))
        self._count(f"control byte 0x{byte:02X}")
        return b""

    # -- sequences ------------------------------------------------------------------------------------
    def _step(self, byte: int) -> bytes:  # noqa: PLR0911 - one state machine
        state = self._state
        if state in (_STRING, _STRING_ESC):
            return self._in_string(byte)
        if byte in (_CAN, _SUB):  # they abort any sequence
            self._count("an escape sequence cancelled")
            self._state = _GROUND
            return b""
        if state == _ESCAPE:
            return self._after_escape(byte)
        if byte == _ESC:  # a new sequence: this one was never finished
            self._count("an unfinished escape sequence")
            self._state = _ESCAPE
            return b""
        if byte < 0x20:
            return self._control(byte)
        if state == _INTERMEDIATE:
            return self._after_intermediate(byte)
        if state == _CSI_SKIP:  # ignored to the final byte
            if 0x40 <= byte <= 0x7E:
                self._state = _GROUND
            return b""
        # CSI: parameters 0x30..0x3F, intermediates 0x20..0x2F, a final 0x40..0x7E.
        if 0x40 <= byte <= 0x7E:
            self._state = _GROUND
            return self._csi(bytes(self._sequence), byte)
        if byte == _DEL:  # ignored inside a sequence, by terminals too
            return b""
        if len(self._sequence) >= MAX_CSI - 1 or byte > _DEL:
            self._count("an overlong or invalid CSI sequence")
            self._state = _CSI_SKIP
            return b""
        self._sequence.append(byte)
        return b""

    def _after_escape(self, byte: int) -> bytes:  # noqa: PLR0911 - one case a kind
        if byte == 0x5B:  # [
            self._state = _CSI
            self._sequence.clear()
            return b""
        if byte in _STRINGS:
            self._state, self._string = _STRING, _STRINGS[byte]
            self._peek.clear()
            return b""
        if byte == _ESC:  # ESC ESC: the first does nothing in a terminal either; the second starts anew
            return b""
        if byte < 0x20:
            return self._control(byte)
        if byte <= 0x2F:  # an intermediate: ESC ( B, ESC # 8, ESC % G, ESC SP G...
            self._state = _INTERMEDIATE
            self._sequence[:] = bytes((byte,))
            return b""
        self._state = _GROUND
        if byte in _ESC_FINALS:
            return bytes((_ESC, byte))
        if byte == 0x5C:  # a lone ST: ends nothing, does nothing
            return b""
        shown = chr(byte) if byte < _DEL else f"0x{byte:02X}"
        reason = " (answers)" if byte == ord("Z") else ""
        self._count(f"ESC {shown}{reason}")  # ESC Z (answers), ESC 0x9B..., the rest
        return b""

    def _after_intermediate(self, byte: int) -> bytes:
        if byte <= 0x2F:
            if len(self._sequence) < MAX_CSI:
                self._sequence.append(byte)
            return b""
        self._state = _GROUND
        sequence = bytes(self._sequence)
        if len(sequence) == 1 and (
            (sequence[0] in _DESIGNATE and byte in _DESIGNATED) or (sequence == b"#" and byte in _LINE_SIZE)
        ):
            return b"\x1b" + sequence + bytes((byte,))
        shown = (sequence[:8] + bytes((byte,))).decode("ascii", "replace") if byte < _DEL else "..."
        reason = " (leaves UTF-8)" if sequence == b"%" else ""
        self._count(f"ESC {shown}{reason}")  # ESC % @ (leaves UTF-8), ESC SP G (8-bit controls), others
        return b""

    def _csi(self, body: bytes, final: int) -> bytes:
        """``CSI`` + ``body`` + ``final`` if it may pass (some modes taken out), else b""."""
        parts = _CSI_BODY.fullmatch(body)
        if parts is not None:
            marker, params, intermediates = parts[1], parts[2], parts[3]
            shown = self._allowed(marker, params, intermediates, final)
            name = _CSI_NAMES.get((marker, intermediates, final))
            if shown is not None:
                if shown != params:  # some modes taken out
                    text = (body + bytes((final,))).decode("ascii")
                    self._count(f"CSI {text[:24]} (mode)")
                return b"\x1b[" + marker + shown + intermediates + bytes((final,))
        else:
            name = None
        text = (body + bytes((final,))).decode("ascii")
        self._count(f"CSI {text[:24]}" + (f" ({name})" if name else ""))
        return b""

    @staticmethod
    def _allowed(  # noqa: PLR0911 - one case a kind
        marker: bytes, params: bytes, intermediates: bytes, final: int
    ) -> bytes | None:
        """The parameters that pass, or None when nothing of the sequence does."""
        if not marker and not intermediates:
            if final not in _CSI_PLAIN:
                return None
            if final in b"hl":
                return _modes(params, _ANSI_MODES)
            if final == ord("u") and params:  # kitty's keyboard flags; SCORC has none
                return None
            if final == ord("T") and (b";" in params or b":" in params):  # highlight mouse tracking
                return None
            return params
        if marker == b"?" and not intermediates and final in _CSI_PRIVATE:
            return _modes(params, DEC_MODES) if final in b"hlsr" else params
        if marker == b">" and not intermediates and final == ord("m"):
            return params  # modifyOtherKeys (vim); every other ">" asks or reports
        if not marker and intermediates in _CSI_WITH and final in _CSI_WITH[intermediates]:
            return params
        return None

    def _in_string(self, byte: int) -> bytes:
        """A byte of a dropped string.

        BEL, ST, CAN and SUB end it; ESC and another byte end it too, and that byte starts a sequence (as in
        a terminal's parser).
        """
        if self._state == _STRING:
            if byte == _ESC:
                self._state = _STRING_ESC
            elif byte in (_BEL, _CAN, _SUB):
                self._end_string()
                self._state = _GROUND
            elif len(self._peek) < PEEK:
                self._peek.append(byte)
            return b""
        self._end_string()
        if byte in (0x5C, _CAN, _SUB):  # ST, or the ESC cancelled
            self._state = _GROUND
            return b""
        self._state = _ESCAPE
        return self._after_escape(byte)

    def _end_string(self) -> None:
        kind, peek = self._string, bytes(self._peek)
        if kind == "OSC":
            number = peek.split(b";", 1)[0]
            name = _OSC_NAMES.get(number)
            if number.isdigit() and len(number) <= 5:
                kind += " " + number.decode() + (f" ({name})" if name else "")
        elif peek.startswith(b"tmux;"):
            kind += " tmux pass-through"
        self._count(kind)

    def _count(self, name: str, count: int = 1) -> None:
        self.dropped += count
        self.last_dropped = name


def _modes(params: bytes, allowed: frozenset[int]) -> bytes | None:
    """The modes of ``params`` in ``allowed`` (as given), or None if none is."""
    kept = [mode for mode in params.split(b";") if mode.isdigit() and int(mode) in allowed]
    return b";".join(kept) if kept else None
