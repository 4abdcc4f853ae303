"""Progress on stderr: a redrawn bar on a terminal, throttled plain lines anywhere else."""

from __future__ import annotations

import io

from gputopo.app.progress import Progress


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_plain_lines_are_throttled_but_the_first_and_last_always_show() -> None:
    out, clock = io.StringIO(), _Clock()
    with Progress("bench x", 10, stream=out, tty=False, min_interval_s=2.0, clock=clock) as p:
        for step in range(10):
            clock.now = step * 0.5  # a step every half second: a line every 2 s at most
            p.advance(1, f"step {step + 1}")
    lines = out.getvalue().splitlines()
    assert lines == [
        "bench x: 1/10 step 1",
        "bench x: 5/10 step 5",
        "bench x: 9/10 step 9",
        "bench x: 10/10 step 10",
        "bench x: done in 4.5 s",
    ]
    assert "\r" not in out.getvalue()
    assert "\x1b" not in out.getvalue()


def test_a_terminal_gets_one_redrawn_bar() -> None:
    out, clock = io.StringIO(), _Clock()
    with Progress("bench y", 4, stream=out, tty=True, clock=clock) as p:
        for step in range(4):
            clock.now = step * 1.0
            p.advance(1)
    text = out.getvalue()
    frames = text.split("\r\x1b[K")[1:]
    assert len(frames) == 4
    assert frames[1] == "bench y [############............] 2/4"
    assert frames[-1].startswith("bench y [########################] 4/4\n")
    assert text.endswith("bench y: done in 3.0 s\n")
    assert text.count("\n") == 2  # the bar's line ends once, then the summary


def test_a_stream_that_is_not_a_terminal_gets_plain_lines() -> None:
    out = io.StringIO()  # isatty() is False
    Progress("bench z", 1, stream=out).advance(1)
    assert out.getvalue() == "bench z: 1/1\n"
