"""The filter between a sandbox's terminal and a person's (executor/terminal_filter.py): what passes.

Each case is fed whole and also one byte at a time and in two pieces cut at every place (a sequence split
anywhere), which must give the same bytes. The dropped classes are what a hostile program would use to
make the person's terminal answer (typed input), set its clipboard or title, change its window or keys,
or pass sequences on to an outer terminal.
"""

from __future__ import annotations

import random
import re
import time
import tracemalloc

import pytest

from adk_sandbox.executor.terminal_filter import MAX_CSI, PEEK, RESTORE, TerminalFilter


def through(data: bytes, pieces: list[bytes] | None = None) -> tuple[bytes, TerminalFilter]:
    filt = TerminalFilter()
    out = b"".join(filt.feed(piece) for piece in (pieces if pieces is not None else [data]))
    return out + filt.flush(), filt


def shown(data: bytes) -> bytes:
    """``data`` through a new filter, fed whole; the same fed one byte at a time and cut in two anywhere
    must give the same bytes and the same count."""
    at_once, whole = through(data)
    by_byte, single = through(data, [data[i : i + 1] for i in range(len(data))])
    assert by_byte == at_once, (data, by_byte, at_once)
    assert single.dropped == whole.dropped, data
    for cut in range(1, len(data)):
        assert through(data, [data[:cut], data[cut:]])[0] == at_once, (data, cut)
    return at_once


PASSED = {
    "text": b"plain text\r\n",
    "UTF-8": "ünïcödé € 日本語 😀 ✛ Û\n".encode(),
    "controls": b"\t\x08\x07bell and backspace\x0b\x0c\x0e\x0f",
    "SGR": b"\x1b[31mred\x1b[0m \x1b[1;38;5;208mx\x1b[38;2;10;20;30my\x1b[58:2::1:2:3mz\x1b[m",
    "cursor": b"\x1b[H\x1b[2J\x1b[3J\x1b[10;20H\x1b[K\x1b[1A\x1b[3B\x1b[2C\x1b[D\x1b[5G\x1b[7d"
    b"\x1b[2;3f\x1b[E\x1b[F",
    "DEC modes": b"\x1b[?1049h\x1b[?25l\x1b[?2004h\x1b[?1h\x1b=\x1b[?1000;1006h\x1b[?1049l\x1b[?25h\x1b>",
    "more DEC modes": b"\x1b[?47h\x1b[?1047h\x1b[?7l\x1b[?1002h\x1b[?1003h\x1b[?1004h\x1b[?2026h\x1b[?12h",
    "DEC modes saved": b"\x1b[?1049s\x1b[?1049r\x1b[?1J\x1b[?2K",
    "edit and scroll": b"\x1b[2;30r\x1b[S\x1b[T\x1b[3T\x1b[L\x1b[M\x1b[P\x1b[@\x1b[X\x1b[3g\x1b[Z"
    b"\x1b[I\x1b[5b",
    "ESC": b"\x1b7\x1b8\x1b[s\x1b[u\x1bD\x1bM\x1bE\x1bH\x1bc\x1bN\x1bO",
    "charsets": b"\x1b(B\x1b(0lqk\x1b(B\x1b)0\x1b*A\x1b+<\x1b-A\x1b#8\x1b#6",
    "shape, soft reset, keys": b'\x1b[2 q\x1b[ q\x1b[!p\x1b[>4;2m\x1b[>4m\x1b[?7h\x1b[4h\x1b[4l\x1b[1"q',
    "readline meta": b"\x1b[?1034h",
    "restore": RESTORE,
}

DROPPED = {
    "OSC 52 clipboard, BEL": b"\x1b]52;c;c3RvbGVu\x07",
    "OSC 52 clipboard, ST": b"\x1b]52;c;c3RvbGVu\x1b\\",
    "OSC 52 clipboard read": b"\x1b]52;c;?\x07",
    "OSC 2 title": b"\x1b]2;PWNED\x07",
    "OSC 0 title": b"\x1b]0;PWNED\x1b\\",
    "OSC 1 icon": b"\x1b]1;PWNED\x07",
    "OSC 4 colour set": b"\x1b]4;1;rgb:ff/00/00\x07",
    "OSC 10 colour query": b"\x1b]10;?\x07",
    "OSC 11 colour query": b"\x1b]11;?\x07",
    "OSC 12 cursor colour": b"\x1b]12;red\x07",
    "OSC 104 colour reset": b"\x1b]104\x07",
    "OSC 7 directory": b"\x1b]7;file://host/etc\x07",
    "OSC 8 hyperlink": b"\x1b]8;;http://evil\x1b\\link\x1b]8;;\x1b\\",
    "OSC 9 notify": b"\x1b]9;hello\x07",
    "OSC 777 notify": b"\x1b]777;notify;a;b\x07",
    "OSC 1337 vendor": b"\x1b]1337;File=inline=1:AAAA\x07",
    "OSC 5113 kitty": b"\x1b]5113;ac=send\x1b\\",
    "DCS tmux pass-through": b"\x1bPtmux;\x1b\x1b]52;c;eA==\x07\x1b\\",
    "DCS DECRQSS": b"\x1bP$qm\x1b\\",
    "DCS XTGETTCAP": b"\x1bP+q544e\x1b\\",
    "DCS sixel": b"\x1bPq#0;2;0;0;0#0~~@@vv@@~~\x1b\\",
    "APC": b"\x1b_Gf=100;AAAA\x1b\\",
    "PM": b"\x1b^private\x1b\\",
    "SOS": b"\x1bXstring\x1b\\",
    "DA1": b"\x1b[c",
    "DA1 0": b"\x1b[0c",
    "DA2": b"\x1b[>c",
    "DA2 0": b"\x1b[>0c",
    "DA3": b"\x1b[=c",
    "DSR": b"\x1b[5n",
    "CPR": b"\x1b[6n",
    "DEC DSR": b"\x1b[?6n",
    "DEC DSR colour scheme": b"\x1b[?996n",
    "DECRQM": b"\x1b[?2004$p",
    "DECRQM ANSI": b"\x1b[4$p",
    "XTVERSION": b"\x1b[>q",
    "XTVERSION 0": b"\x1b[>0q",
    "XTWINOPS report": b"\x1b[18t",
    "XTWINOPS resize": b"\x1b[8;1;1t",
    "XTWINOPS iconify": b"\x1b[2t",
    "XTWINOPS move": b"\x1b[3;0;0t",
    "XTWINOPS title stack": b"\x1b[22;0;0t",
    "kitty keyboard query": b"\x1b[?u",
    "kitty keyboard push": b"\x1b[>1u",
    "kitty keyboard pop": b"\x1b[<u",
    "kitty keyboard set": b"\x1b[=1;1u",
    "DECREQTPARM": b"\x1b[x",
    "DECREQTPARM 1": b"\x1b[1x",
    "media copy": b"\x1b[5i",
    "keyboard lock": b"\x1b[2h",
    "local echo": b"\x1b[12l",
    "newline mode": b"\x1b[20h",
    "VT52 mode": b"\x1b[?2l",
    "Tektronix mode": b"\x1b[?38h",
    "132 columns": b"\x1b[?3h",
    "logging": b"\x1b[?46h",
    "highlight mouse tracking": b"\x1b[?1001h",
    "in-band resize reports": b"\x1b[?2048h",
    "highlight tracking start": b"\x1b[1;2;3;4;5T",
    "8-bit conformance level": b'\x1b[62;2"p',
    "LEDs": b"\x1b[1q",
    "DECID": b"\x1bZ",
    "leave UTF-8": b"\x1b%@",
    "8-bit controls": b"\x1b G",
    "unknown ESC": b"\x1bk",
    "ENQ answerback": b"\x05",
    "NUL": b"\x00",
    "DEL": b"\x7f",
    "CAN": b"\x18",
    "C1 CSI as UTF-8": b"\xc2\x9b",
    "C1 OSC as UTF-8": b"\xc2\x9d",
    "C1 DCS as UTF-8": b"\xc2\x90",
    "C1 ST as UTF-8": b"\xc2\x9c",
    "C1 APC as UTF-8": b"\xc2\x9f",
    "raw C1 CSI": b"\x9b",
    "raw C1 OSC": b"\x9d",
    "raw C1 DCS": b"\x90",
}


@pytest.mark.parametrize("name", sorted(PASSED))
def test_what_drawing_needs_passes_unchanged(name: str) -> None:
    data = PASSED[name]
    assert shown(data) == data
    assert through(data)[1].dropped == 0


@pytest.mark.parametrize("name", sorted(DROPPED))
def test_what_works_the_persons_terminal_is_dropped(name: str) -> None:
    data = DROPPED[name]
    result = shown(b"before " + data + b" after")
    assert result.startswith(b"before ") and result.endswith(b" after"), result
    inner = result.removeprefix(b"before ").removesuffix(b" after")
    if name.startswith("raw C1"):  # not UTF-8: shown as U+FFFD, which no terminal acts on
        assert inner == "\ufffd".encode()
        return
    assert inner == (b"link" if name == "OSC 8 hyperlink" else b""), (name, inner)  # a link's text stays
    _, filt = through(data)
    assert filt.dropped >= 1
    assert filt.last_dropped and filt.last_dropped.isascii() and filt.last_dropped.isprintable()


def test_the_dropped_are_named() -> None:
    def last(data: bytes) -> str | None:
        return through(data)[1].last_dropped

    assert last(b"\x1b]52;c;AAAA\x07") == "OSC 52 (clipboard)"
    assert last(b"\x1b]2;x\x1b\\") == "OSC 2 (title)"
    assert last(b"\x1b]99999999;x\x07") == "OSC"
    assert last(b"\x1bPtmux;\x1b\x1b[c\x1b\\") == "CSI c (device attributes, answers)"
    assert last(b"\x1bPtmux;hello\x1b\\") == "DCS tmux pass-through"
    assert last(b"\x1b[6n") == "CSI 6n (status report, answers)"
    assert last(b"\x1bZ") == "ESC Z (answers)"
    assert last(b"\x05") == "control byte 0x05"
    assert last("\u009b".encode()) == "C1 control U+009B"
    assert last(b"\x1b[" + b"1;" * 100 + b"m") == "an overlong or invalid CSI sequence"
    assert through(b"text")[1].last_dropped is None


def test_modes_pass_by_list_and_the_rest_are_taken_out() -> None:
    result, filt = through(b"\x1b[?1049;46;2004h\x1b[2;4h\x1b[?2;3l")
    assert result == b"\x1b[?1049;2004h\x1b[4h"
    assert filt.dropped == 3


def test_a_string_ends_at_st_split_across_feeds() -> None:
    filt = TerminalFilter()
    assert filt.feed(b"a\x1b]52;c;AAAA\x1b") == b"a"
    assert filt.feed(b"\\b") == b"b"
    assert filt.dropped == 1


def test_esc_inside_a_string_ends_it_and_starts_a_sequence() -> None:
    """As in a terminal's parser: the string is dropped, what follows is filtered as anything else."""
    assert shown(b"\x1b]0;title\x1b[31mred") == b"\x1b[31mred"
    assert shown(b"\x1bPtmux;\x1b\x1b[6n\x1b[1mx\x1b\\y") == b"\x1b[1mxy"


def test_can_and_sub_abort_a_sequence() -> None:
    assert shown(b"\x1b]52;c;eA==\x18text") == b"text"
    assert shown(b"\x1bPq#0\x1atext") == b"text"
    assert shown(b"\x1b[12\x1atext") == b"text"
    assert shown(b"\x1b\x18text") == b"text"
    assert shown(b"\x1b(\x18text") == b"text"
    assert shown(b"\x1b]2;x\x1b\x18text") == b"text"


def test_controls_inside_a_csi_are_executed_as_a_terminal_does() -> None:
    assert shown(b"\x1b[1\r\n\x05;2H") == b"\r\n\x1b[1;2H"


def test_an_overlong_csi_is_dropped_whole() -> None:
    assert shown(b"a\x1b[" + b"1;" * 100 + b"mb") == b"ab"
    longest = b"\x1b[" + b"1" * (MAX_CSI - 1) + b"m"
    assert shown(longest) == longest
    assert shown(b"\x1b[" + b"1" * MAX_CSI + b"mb") == b"b"
    assert shown(b"\x1b(" + b" " * 1000 + b"Bx") == b"x"


def test_a_huge_string_is_skipped_without_holding_it() -> None:
    """1 MB of OSC 52 in pieces and at once: nothing of it is shown or held, the text after it shows."""
    payload = b"QUJD" * (1 << 18)
    filt = TerminalFilter()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        out = filt.feed(b"\x1b]52;c;")
        for at in range(0, len(payload), 1000):
            out += filt.feed(payload[at : at + 1000])
            assert len(filt._peek) <= PEEK and len(filt._sequence) <= MAX_CSI
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held < 16 * 1024, held
    out += filt.feed(b"\x07visible")
    assert out == b"visible"
    assert filt.dropped == 1 and filt.last_dropped == "OSC 52 (clipboard)"
    assert through(b"\x1b]52;c;" + payload + b"\x1b\\visible")[0] == b"visible"


def test_a_character_split_across_feeds_and_invalid_bytes() -> None:
    filt = TerminalFilter()
    for character in ("€", "😀", "é"):
        encoded = character.encode()
        for cut in range(1, len(encoded)):
            assert filt.feed(encoded[:cut]) == b""
            assert filt.feed(encoded[cut:]) == encoded
    assert shown(b"\xff\xfeok") == "\ufffd\ufffdok".encode()
    assert shown(b"\xe2\x82") == "\ufffd".encode()  # cut by the end of the stream
    assert shown(b"\xe2\x82\x1b[1mx") == "\ufffd".encode() + b"\x1b[1mx"  # cut by a sequence
    assert shown("\ud800".encode("utf-8", "surrogatepass")) == "\ufffd\ufffd\ufffd".encode()


VIM = (
    b"\x1b[?1049h\x1b[22;0;0t\x1b[>4;2m\x1b[?1h\x1b=\x1b[?2004h\x1b[?1004h\x1b[1;24r\x1b[?12h\x1b[?12l"
    b'\x1b[22;2t\x1b[22;1t\x1b[27m\x1b[23m\x1b[29m\x1b[m\x1b[H\x1b[2J\x1b[?25l\x1b[24;1H"x.py" 3L, 40B'
    b"\x1b[1;1H\x1b[38;5;130mimport\x1b[m os\r\n\x1b[38;5;130mdef\x1b[m \x1b[38;5;25mmain\x1b[m():\r\n"
    b'    \x1b[38;2;200;100;0mprint\x1b[m(\x1b[38;5;161m"h\xc3\xa9llo"\x1b[m)\r\n'
    b"\x1b[94m~                                                                               \x1b[m\r\n"
    b"\x1b[1;1H\x1b[?25h\x1b[?4m\x1b[2 q"
    b"\x1b[24;1H\x1b[K\x1b[?2004l\x1b[>4;m\x1b[?1004l\x1b[?1l\x1b>\x1b[?1049l\x1b[23;0;0t\x1b[0 q"
)
VIM_ASKS = (b"\x1b[22;0;0t", b"\x1b[22;2t", b"\x1b[22;1t", b"\x1b[23;0;0t", b"\x1b[?4m")

TOP = (
    b"\x1b[?1h\x1b=\x1b[?25l\x1b[H\x1b[2J\x1b(B\x1b[m"
    b"top - 10:00:00 up 1 day,  1 user,  load average: 0.00, 0.01, 0.05\x1b(B\x1b[m\x1b[39;49m\x1b[K\n"
    b"Tasks:\x1b(B\x1b[m\x1b[39;49m\x1b[1m  97 \x1b(B\x1b[m\x1b[39;49mtotal\x1b[K\n"
    b"\x1b[7m    PID USER      PR  NI    VIRT    RES  %CPU  COMMAND         \x1b(B\x1b[m\x1b[39;49m\x1b[K\n"
    b"\x1b(B\x1b[m      1 root      20   0  167000  11000   0.0  systemd\x1b(B\x1b[m\x1b[39;49m\x1b[K\n"
    b"\x1b[7;1H\x1b[J\x1b[?12l\x1b[?25h\x1b[H\x1b[K\x1b[3;24r\x1b[3;1H\x1bM\x1b[1;24r\x1b[24;1H\x1b[?1l\x1b>"
)

LESS = (
    b"\x1b[?1049h\x1b[22;0;0t\x1b[?1h\x1b=\rline 1\r\nline 2\r\n\x1b[7m(END)\x1b[27m\x1b[K\r\x1b[K"
    b"\x1b[?1l\x1b>\x1b[?1049l"
)

HTOP = (
    b"\x1b[?1049h\x1b[1;40r\x1b(B\x1b[m\x1b[4l\x1b[?7h\x1b[?1h\x1b=\x1b[?1000;1006;1015h\x1b[39;49m\x1b[?25l"
    b"\x1b[H\x1b[2J\x1b[2d  \x1b[1m\x1b[36m0\x1b[39m\x1b[m\x1b[1m[\x1b(0qqqq\x1b(B\x1b[m\x1b[32m||\x1b[31m|"
    b"\x1b[30m\x1b[1m    1.3%\x1b[39m]\x1b[m\x1b[5G\x1b[4X\x1b[4b\x1b[41;1H\x1b[?1000;1006;1015l\x1b[?1049l"
)

READLINE = (
    b"\x1b[?2004huser@sandbox:~$ ls\x08\x08\x1b[K\x1b[1Pl\x1b[C\x1b[1@s\r\n\x1b[?2004l\r"
    b"\x1b[0m\x1b[01;34mdir\x1b[0m  file.txt\r\n\x1b]0;user@sandbox: ~\x07\x1b[?2004hu"
)

PYTHON = (
    b"Python 3.12.3\r\n\x1b[?2004h>>> \x1b[?2004l\r\x1b[?2004h>>> pri\x07nt(1)\r\n\x1b[?2004l\r1\r\n"
    b"\x1b[1;35m>>> \x1b[0m\x1b[?1h\x1b=\x1b[6n"
)


@pytest.mark.parametrize(
    ("sample", "asked"),
    [
        (VIM, VIM_ASKS),
        (TOP, ()),
        (LESS, (b"\x1b[22;0;0t",)),
        (HTOP, ()),
        (READLINE, (b"\x1b]0;user@sandbox: ~\x07",)),
        (PYTHON, (b"\x1b[6n",)),
    ],
)
def test_full_screen_programs_draw_as_before(sample: bytes, asked: tuple[bytes, ...]) -> None:
    """Captured-like output: all of it passes but the window operations, title and queries among it."""
    expected = sample
    for sequence in asked:
        expected = expected.replace(sequence, b"")
    assert shown(sample) == expected


def test_the_output_passes_again_unchanged() -> None:
    """What was shown is only passed things: a second filter has nothing to drop."""
    rng = random.Random(7)
    parts = [*PASSED.values(), *DROPPED.values(), VIM, TOP, HTOP, READLINE, b"\xff", b"\x1b", b"\x1b["]
    for _ in range(200):
        data = b"".join(rng.choice(parts) for _ in range(rng.randint(1, 12)))
        once = shown(data)
        again, filt = through(once)
        assert again == once and filt.dropped == 0, (data, once)


# What may follow an ESC in the output: a whole sequence of the passed kinds.
_ALLOWED_ESC = re.compile(
    rb"\x1b(?:\[[<=>?]?[0-9:;]*[ -/]?[@-~]|[78=>DEHMNOc]|[()*+\-./][0-9A-Za-z<=>]|#[3-8])"
)


def _check_shown(data: bytes, result: bytes) -> None:
    for marker in (b"\x1b]", b"\x1bP", b"\x1b_", b"\x1b^", b"\x1bX", b"\x1b[c", b"\x1b[6n", b"\x1bZ"):
        assert marker not in result, (data, result)
    text = result.decode("utf-8")  # always valid UTF-8
    assert not re.search("[\x00-\x06\x10-\x1a\x1c-\x1f\x7f-\x9f]", text), (data, result)
    at = result.find(b"\x1b")
    while at >= 0:
        assert _ALLOWED_ESC.match(result, at), (data, result, at)
        at = result.find(b"\x1b", at + 1)


def test_random_bytes_never_raise_nor_pass_a_string_or_a_c1() -> None:
    rng = random.Random(35)
    # No UTF-8 lead byte but \xc2: a 0x90/0x9B/0x9D in the output could only be a C1 control.
    alphabet = b'\x1b[]P_^X\x07\\\x9b\x9d\x90\x9c\xc2;:?>=<$!" 0123456789cmntuqphlsrJK(#%ABC\x18\x1a'
    alphabet += b"abc\x05\n"
    for _ in range(400):
        data = bytes(rng.choice(alphabet) for _ in range(rng.randint(1, 200)))
        result = shown(data)
        _check_shown(data, result)
        for raw in (b"\x9b", b"\x9d", b"\x90", b"\x9c"):
            assert raw not in result, (data, result)


def test_a_long_run_of_random_bytes() -> None:
    """1 MB of uniform random bytes in random pieces: never raises, only passed things come out."""
    rng = random.Random(1)
    data = rng.randbytes(1 << 20)
    filt = TerminalFilter()
    out = bytearray()
    at = 0
    while at < len(data):
        size = rng.choice((1, 2, 7, 100, 4096))
        out += filt.feed(data[at : at + size])
        at += size
    out += filt.flush()
    _check_shown(b"random", bytes(out))
    assert filt.dropped > 0
    assert bytes(out) == through(data)[0]


def _rate(data: bytes, piece: int = 65536) -> float:
    best = float("inf")
    for _ in range(3):
        filt = TerminalFilter()
        started = time.perf_counter()
        for at in range(0, len(data), piece):
            filt.feed(data[at : at + piece])
        best = min(best, time.perf_counter() - started)
    return len(data) / best / 1e6


def test_throughput() -> None:
    """Plain text is copied in runs (at least 50 MB/s asserted); the others are printed for the record."""
    plain = b"a line of output from a build, with some text in it 0123456789\r\n" * 80_000
    utf8 = "ünïcödé € 日本語, a line of a build's output\r\n".encode() * 80_000
    cell = b"\x1b[%d;1H\x1b[38;5;208mcol\x1b[0m \x1b[1;32m%d\x1b[K"
    drawn = b"".join(cell % (i % 24 + 1, i) for i in range(100_000))
    clipboard = b"\x1b]52;c;" + b"QUJD" * 1_000_000 + b"\x07"
    samples = {"plain": plain, "utf8": utf8, "drawn": drawn, "osc52": clipboard}
    rates = {name: _rate(data) for name, data in samples.items()}
    print(", ".join(f"{name} {rate:.0f} MB/s" for name, rate in rates.items()))
    assert rates["plain"] >= 50, rates
