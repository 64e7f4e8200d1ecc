"""The filter between a sandbox's terminal and a person's (executor/terminal_filter.py): what passes.

Each case is fed whole and also one byte at a time (a sequence split at every place), which must give the
same bytes. The dropped classes are what a hostile program would use to make the person's terminal answer
(typed input), set its clipboard or title, or pass sequences on to an outer terminal.
"""

from __future__ import annotations

import random
import time

import pytest

from adk_sandbox.executor.terminal_filter import MAX_CSI, TerminalFilter


def shown(data: bytes) -> bytes:
    """``data`` through a new filter, fed whole; the same fed one byte at a time is checked to match."""
    whole = TerminalFilter()
    at_once = whole.feed(data) + whole.flush()
    single = TerminalFilter()
    by_byte = b"".join(single.feed(data[i : i + 1]) for i in range(len(data))) + single.flush()
    assert by_byte == at_once, (data, by_byte, at_once)
    return at_once


PASSED = [
    b"plain text\r\n",
    "ünïcödé € 日本語 😀\n".encode(),
    b"\t\x08\x07bell and backspace\x0e\x0f",
    b"\x1b[31mred\x1b[0m \x1b[1;38;5;208mx\x1b[38;2;10;20;30my\x1b[58:2::1:2:3mz",
    b"\x1b[H\x1b[2J\x1b[10;20H\x1b[K\x1b[1A\x1b[3B\x1b[2C\x1b[D\x1b[5G\x1b[7d",
    b"\x1b[?1049h\x1b[?25l\x1b[?2004h\x1b[?1h\x1b=\x1b[?1000;1006h\x1b[?1049l\x1b[?25h\x1b>",
    b"\x1b[2;30r\x1b[S\x1b[T\x1b[L\x1b[M\x1b[P\x1b[@\x1b[X\x1b[3g\x1b[Z",
    b"\x1b7\x1b8\x1b[s\x1b[u\x1bD\x1bM\x1bE\x1bH\x1bc",
    b"\x1b(B\x1b(0lqk\x1b(B\x1b)0\x1b#8",
    b"\x1b[2 q\x1b[!p\x1b[>4;2m\x1b[?7h\x1b[4h\x1b[4l",
]

DROPPED = {
    "OSC 52 clipboard, BEL": b"\x1b]52;c;c3RvbGVu\x07",
    "OSC 52 clipboard, ST": b"\x1b]52;c;c3RvbGVu\x1b\\",
    "OSC 2 title": b"\x1b]2;PWNED\x07",
    "OSC 0 title": b"\x1b]0;PWNED\x1b\\",
    "OSC 4 colour set": b"\x1b]4;1;rgb:ff/00/00\x07",
    "OSC 11 colour query": b"\x1b]11;?\x07",
    "OSC 8 hyperlink": b"\x1b]8;;http://evil\x1b\\link\x1b]8;;\x1b\\",
    "OSC 1337 vendor": b"\x1b]1337;File=inline=1:AAAA\x07",
    "OSC 777 notify": b"\x1b]777;notify;a;b\x07",
    "DCS tmux pass-through": b"\x1bPtmux;\x1b\x1b]52;c;eA==\x07\x1b\\",
    "DCS DECRQSS": b"\x1bP$qm\x1b\\",
    "APC": b"\x1b_Gf=100;AAAA\x1b\\",
    "PM": b"\x1b^private\x1b\\",
    "SOS": b"\x1bXstring\x1b\\",
    "DA1": b"\x1b[c",
    "DA1 0": b"\x1b[0c",
    "DA2": b"\x1b[>c",
    "DA3": b"\x1b[=c",
    "DSR": b"\x1b[5n",
    "CPR": b"\x1b[6n",
    "DEC DSR": b"\x1b[?6n",
    "DECRQM": b"\x1b[?2004$p",
    "DECRQM ANSI": b"\x1b[4$p",
    "XTVERSION": b"\x1b[>q",
    "XTWINOPS report": b"\x1b[18t",
    "XTWINOPS resize": b"\x1b[8;1;1t",
    "XTWINOPS iconify": b"\x1b[2t",
    "kitty keyboard query": b"\x1b[?u",
    "kitty keyboard push": b"\x1b[>1u",
    "DECREQTPARM": b"\x1b[x",
    "media copy": b"\x1b[5i",
    "DECID": b"\x1bZ",
    "leave UTF-8": b"\x1b%@",
    "8-bit controls": b"\x1b G",
    "ENQ answerback": b"\x05",
    "C1 CSI as UTF-8": b"\xc2\x9b6n",
    "C1 OSC as UTF-8": b"\xc2\x9d",
    "C1 DCS as UTF-8": b"\xc2\x90",
    "raw C1 CSI": b"\x9b",
    "raw C1 OSC": b"\x9d",
}


@pytest.mark.parametrize("data", PASSED)
def test_what_drawing_needs_passes_unchanged(data: bytes) -> None:
    assert shown(data) == data


@pytest.mark.parametrize("name", sorted(DROPPED))
def test_what_works_the_persons_terminal_is_dropped(name: str) -> None:
    data = DROPPED[name]
    result = shown(b"before " + data + b" after")
    assert b"before " in result and b" after" in result
    assert b"\x1b]" not in result and b"\x1bP" not in result and b"\x1b[c" not in result, result
    assert b"\x9b" not in result.replace("\u009b".encode(), b"")  # no raw C1 byte
    assert "\u009b".encode() not in result and "\u009d".encode() not in result
    inner = result.replace(b"before ", b"").replace(b" after", b"")
    assert b"\x1b" not in inner, (name, inner)
    if name.startswith("raw C1"):  # not UTF-8: shown as U+FFFD, which no terminal acts on
        assert inner == "\ufffd".encode()
        return
    filt = TerminalFilter()
    filt.feed(data)
    filt.flush()
    assert filt.dropped >= 1


def test_a_huge_string_is_skipped_without_holding_it() -> None:
    """1 MB of OSC 52 in pieces: nothing of it is shown, nothing is held, the text after it shows."""
    filt = TerminalFilter()
    out = filt.feed(b"\x1b]52;c;")
    for _ in range(1024):
        out += filt.feed(b"A" * 1024)
        assert len(filt._sequence) <= MAX_CSI
    out += filt.feed(b"\x07visible")
    assert out == b"visible"


def test_an_overlong_csi_is_dropped_whole() -> None:
    assert shown(b"a\x1b[" + b"1;" * 100 + b"mb") == b"ab"


def test_can_and_sub_abort_a_sequence() -> None:
    assert shown(b"\x1b]52;c;eA==\x18text") == b"text"
    assert shown(b"\x1b[12\x1atext") == b"text"


def test_a_character_split_across_feeds_and_invalid_bytes() -> None:
    filt = TerminalFilter()
    euro = "€".encode()
    assert filt.feed(euro[:1]) == b""
    assert filt.feed(euro[1:]) == euro
    assert shown(b"\xff\xfeok") == "\ufffd\ufffdok".encode()


def test_random_bytes_never_raise_nor_pass_a_string_or_a_c1() -> None:
    rng = random.Random(35)
    alphabet = b"\x1b[]P_^X\x07\\\x9b\x9d\x90\xc2;?>=$ 0123456789cmntuqpABC\x18\x1aabc\x05"
    for _ in range(300):
        data = bytes(rng.choice(alphabet) for _ in range(rng.randint(1, 200)))
        result = shown(data)
        for marker in (b"\x1b]", b"\x1bP", b"\x1b_", b"\x1b^", b"\x1bX", b"\x1b[c", b"\x1b[6n", b"\x1bZ"):
            assert marker not in result, (data, result)
        assert "\u009b".encode() not in result and "\u009d".encode() not in result
        decoded = result.decode("utf-8")  # always valid UTF-8
        assert "\x9b" not in decoded


def test_plain_text_goes_fast() -> None:
    """Not a timing assertion beyond "does not hang": the rate is printed for the record."""
    text = ("a line of output from a build, with some text in it 0123456789\r\n" * 200_000).encode()
    filt = TerminalFilter()
    started = time.perf_counter()
    out = filt.feed(text)
    seconds = time.perf_counter() - started
    assert out == text
    assert seconds < 30
    print(f"plain text: {len(text) / seconds / 1e6:.0f} MB/s")
