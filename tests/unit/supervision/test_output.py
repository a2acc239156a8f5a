"""Unit tests for ``launcher.supervision.output``: teeing a rank's pipe to its log file and the prefixed console.

Real pipes and files; the console is an ``io.BytesIO``. Read ends are non-blocking, as
``LocalProcessGroup`` sets them up.
"""

import io
import os
import threading

import pytest

from launcher.supervision import output as output_mod
from launcher.supervision.output import RankOutput, open_log, tail_lines


class Pipe:
    """A rank's pipe: ``write`` feeds it, ``out`` tees it."""

    def __init__(self, log_path, console, label="rank 3"):
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.read_fd, False)
        self.log_path = log_path
        self.out = RankOutput(self.read_fd, open_log(log_path), label, console)

    def write(self, data: bytes) -> None:
        os.write(self.write_fd, data)

    def close_writer(self) -> None:
        if self.write_fd >= 0:
            os.close(self.write_fd)
            self.write_fd = -1

    def file_bytes(self) -> bytes:
        with open(self.log_path, "rb") as fh:
            return fh.read()


@pytest.fixture
def pipes(tmp_path):
    made = []

    def make(console=None, label="rank 3", name="attempt_0/rank_3.log"):
        p = Pipe(str(tmp_path / "logs" / name), console, label)
        made.append(p)
        return p

    yield make
    for p in made:
        p.close_writer()
        p.out.close()


def test_prefix_on_every_line(pipes):
    console = io.BytesIO()
    p = pipes(console)
    p.write(b"a\nbb\n\nccc\n")
    assert p.out.pump() is True
    assert console.getvalue() == b"[rank 3] a\n[rank 3] bb\n[rank 3] \n[rank 3] ccc\n"


def test_a_line_without_newline_is_shown_once_it_reaches_the_bound(pipes, monkeypatch):
    """A huge line (or output that never ends a line) is shown in bounded pieces, not held forever."""
    monkeypatch.setattr(output_mod, "MAX_PARTIAL", 16)
    console = io.BytesIO()
    p = pipes(console)
    p.write(b"0123456789abcdefXY")
    p.out.pump()
    assert console.getvalue() == b"[rank 3] 0123456789abcdefXY\n"
    p.write(b"Z\n")
    p.out.pump()
    assert console.getvalue() == b"[rank 3] 0123456789abcdefXY\n[rank 3] Z\n"
    assert p.file_bytes() == b"0123456789abcdefXYZ\n"  # the file is untouched


def test_a_progress_bar_redrawn_with_carriage_returns_is_shown_redraw_by_redraw(pipes):
    """tqdm writes "\\r<bar>" per update and "\\n" at the end: each complete redraw reaches the console
    with the prefix (on a terminal the line is overwritten in place), the file gets the raw bytes."""
    console = io.BytesIO()
    p = pipes(console)
    p.write(b"\r 0%|  | 0/2")
    p.out.pump()
    assert console.getvalue() == b"[rank 3] \r"  # the redraw after a \r waits for the next boundary
    p.write(b"\r50%|# | 1/2\r100%|##| 2/2")
    p.out.pump()
    assert console.getvalue() == b"[rank 3] \r[rank 3]  0%|  | 0/2\r[rank 3] 50%|# | 1/2\r"
    p.write(b"\ndone\n")
    p.out.pump()
    assert console.getvalue().endswith(b"\r[rank 3] 100%|##| 2/2\n[rank 3] done\n")
    assert p.file_bytes() == b"\r 0%|  | 0/2\r50%|# | 1/2\r100%|##| 2/2\ndone\n"


def test_crlf_is_one_line_end(pipes):
    console = io.BytesIO()
    p = pipes(console)
    p.write(b"a\r\nb\r\nc")
    p.out.pump()
    assert console.getvalue() == b"[rank 3] a\r\n[rank 3] b\r\n"
    p.write(b"\r\n")
    p.out.pump()
    assert console.getvalue() == b"[rank 3] a\r\n[rank 3] b\r\n[rank 3] c\r\n"


def test_a_partial_line_is_prefixed_once_across_chunks(pipes):
    console = io.BytesIO()
    p = pipes(console)
    for piece in (b"a", b"b", b"c\nd", b"e\n"):
        p.write(piece)
        p.out.pump()
    assert console.getvalue() == b"[rank 3] abc\n[rank 3] de\n"


def test_partial_lines_wait_for_their_newline_and_are_flushed_at_close(pipes):
    console = io.BytesIO()
    p = pipes(console)
    p.write(b"hel")
    assert p.out.pump() is True
    assert console.getvalue() == b""
    assert p.file_bytes() == b"hel"  # the file is written at once
    p.write(b"lo\nwor")
    p.out.pump()
    assert console.getvalue() == b"[rank 3] hello\n"
    p.write(b"ld")
    p.out.pump()
    assert console.getvalue() == b"[rank 3] hello\n"
    p.close_writer()
    assert p.out.pump() is False  # end of stream closes the output
    assert console.getvalue() == b"[rank 3] hello\n[rank 3] world\n"
    assert p.file_bytes() == b"hello\nworld"  # raw: no newline invented in the file
    assert (p.out.read_fd, p.out.log_fd) == (-1, -1)


def test_file_gets_the_raw_bytes_unmodified(pipes):
    console = io.BytesIO()
    p = pipes(console)
    raw = b"progress 10%\rprogress 50%\r\n\x00\xff\xfe not utf-8 \xe4\xb8\n\n\ttab\nno newline at end"
    p.write(raw[:20])
    p.out.pump()
    p.write(raw[20:])
    p.out.pump()
    p.close_writer()
    p.out.pump()
    assert p.file_bytes() == raw
    assert b"[rank 3]" not in p.file_bytes()
    assert console.getvalue() == (b"[rank 3] progress 10%\r[rank 3] progress 50%\r\n"  # a lone \r ends a redraw
                                  b"[rank 3] \x00\xff\xfe not utf-8 \xe4\xb8\n[rank 3] \n[rank 3] \ttab\n"
                                  b"[rank 3] no newline at end\n")


def test_log_file_is_appended_not_truncated(pipes, tmp_path):
    path = tmp_path / "logs" / "attempt_0" / "rank_3.log"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"earlier attempt\n")
    p = pipes(None)
    p.write(b"new\n")
    p.out.pump()
    assert p.file_bytes() == b"earlier attempt\nnew\n"


def test_open_log_creates_directories_and_is_not_inherited(tmp_path):
    fd = open_log(str(tmp_path / "a" / "b" / "rank_0.log"))
    try:
        assert os.get_inheritable(fd) is False
        assert (tmp_path / "a" / "b" / "rank_0.log").exists()
    finally:
        os.close(fd)


def test_pump_on_an_empty_pipe_returns_true_and_writes_nothing(pipes):
    console = io.BytesIO()
    p = pipes(console)
    assert p.out.pump() is True
    assert console.getvalue() == b"" and p.file_bytes() == b""
    assert p.out.read_fd >= 0


def test_without_console_only_the_file_is_written(pipes):
    p = pipes(None)
    p.write(b"one\ntwo")
    p.out.pump()
    p.close_writer()
    assert p.out.pump() is False
    assert p.file_bytes() == b"one\ntwo"


def test_drain_does_not_block_when_a_writer_still_holds_the_pipe(pipes):
    console = io.BytesIO()
    p = pipes(console)
    p.write(b"last words\npartial")
    done = threading.Event()
    thread = threading.Thread(target=lambda: (p.out.drain(), done.set()), daemon=True)
    thread.start()
    finished = done.wait(2.0)
    if not finished:
        p.close_writer()  # unblock the thread before failing
        thread.join(2.0)
    assert finished, "drain() blocked on a pipe whose writer is still open"
    assert console.getvalue() == b"[rank 3] last words\n[rank 3] partial\n"
    assert p.file_bytes() == b"last words\npartial"
    assert p.out.read_fd == -1
    with pytest.raises(BrokenPipeError):  # the read end is closed: a straggler gets EPIPE, not a hang
        p.write(b"late output\n")
    assert p.file_bytes() == b"last words\npartial"


def test_drain_reads_everything_already_buffered_in_several_chunks(pipes, monkeypatch):
    monkeypatch.setattr(output_mod, "CHUNK", 1000)
    console = io.BytesIO()
    p = pipes(console)
    lines = [b"line %05d" % i for i in range(3000)]  # 33 kB: fits the pipe buffer, many chunks
    payload = b"\n".join(lines) + b"\n"
    p.write(payload)
    p.out.drain()
    assert p.file_bytes() == payload
    assert console.getvalue() == b"".join(b"[rank 3] " + line + b"\n" for line in lines)


def test_drain_after_eof_and_after_close(pipes):
    console = io.BytesIO()
    p = pipes(console)
    p.write(b"x\n")
    p.close_writer()
    p.out.drain()
    p.out.drain()  # already closed: no error
    p.out.close()
    assert console.getvalue() == b"[rank 3] x\n"


def test_console_error_does_not_stop_file_writing(pipes):
    console = io.BytesIO()
    p = pipes(console)
    p.write(b"shown\n")
    p.out.pump()
    console.close()  # the terminal went away
    p.write(b"after close\nmore\n")
    assert p.out.pump() is True
    assert p.out.console is None
    p.write(b"still logged\npartial")
    p.out.pump()
    p.close_writer()
    assert p.out.pump() is False
    assert p.file_bytes() == b"shown\nafter close\nmore\nstill logged\npartial"


class BrokenConsole:
    def __init__(self):
        self.writes = 0

    def write(self, data):
        self.writes += 1
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self):
        pass


def test_broken_pipe_console_is_dropped_after_the_first_error(pipes):
    console = BrokenConsole()
    p = pipes(console)
    for _ in range(3):
        p.write(b"line\n")
        p.out.pump()
    p.close_writer()
    p.out.pump()
    assert console.writes == 1
    assert p.file_bytes() == b"line\n" * 3


def test_two_ranks_never_interleave_mid_line(pipes):
    console = io.BytesIO()
    a = pipes(console, "rank 0", "rank_0.log")
    b = pipes(console, "rank 1", "rank_1.log")
    a.write(b"alpha-")
    b.write(b"beta-")
    a.out.pump()
    b.out.pump()
    a.write(b"one\n")
    b.write(b"two\n")
    b.out.pump()
    a.out.pump()
    assert console.getvalue() == b"[rank 1] beta-two\n[rank 0] alpha-one\n"


# --------------------------------------------------------------------------- tail_lines

def test_tail_lines(tmp_path):
    path = tmp_path / "rank.log"
    path.write_bytes(b"".join(b"line %d\n" % i for i in range(30)))
    assert tail_lines(str(path), 3) == ["line 27", "line 28", "line 29"]
    assert tail_lines(str(path)) == [f"line {i}" for i in range(20, 30)]


def test_tail_lines_short_and_empty_files(tmp_path):
    path = tmp_path / "rank.log"
    path.write_bytes(b"only\nno newline")
    assert tail_lines(str(path), 10) == ["only", "no newline"]
    path.write_bytes(b"")
    assert tail_lines(str(path)) == []


def test_tail_lines_missing_file(tmp_path):
    assert tail_lines(str(tmp_path / "missing.log")) == []


def test_tail_lines_reads_only_the_end_and_survives_bad_utf8(tmp_path):
    path = tmp_path / "rank.log"
    path.write_bytes(b"A" * 100000 + b"\nbad \xff\xfe\nlast\n")
    lines = tail_lines(str(path), 10, max_bytes=64)
    assert lines[-2:] == ["bad \ufffd\ufffd", "last"]
    assert len("".join(lines)) < 64


def test_full_disk_log_file_warns_once_and_the_console_goes_on(tmp_path, caplog):
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)
    console = io.BytesIO()
    full = os.open("/dev/full", os.O_WRONLY)  # every write fails with ENOSPC, as on a full disk
    out = RankOutput(read_fd, full, "rank 2", console, log_path="/logs/rank_2.log")
    try:
        with caplog.at_level("WARNING", logger="launcher.supervision.output"):
            for i in range(3):
                os.write(write_fd, b"step %d\n" % i)
                assert out.pump() is True
        assert out.log_fd == -1  # no longer written
        assert console.getvalue() == b"[rank 2] step 0\n[rank 2] step 1\n[rank 2] step 2\n"
        warnings = [r.getMessage() for r in caplog.records]
        assert len(warnings) == 1 and "rank 2" in warnings[0] and "/logs/rank_2.log" in warnings[0], warnings
        assert "No space left on device" in warnings[0]
    finally:
        os.close(write_fd)
        out.close()


def test_torch_rank_prefix_is_not_doubled_on_the_console(pipes):
    """torch's excepthook writes "[rank3]: " before each traceback line; the console says "[rank 3] "
    once, the log file keeps the rank's bytes, and another rank's prefix is left alone."""
    console = io.BytesIO()
    p = pipes(console)
    raw = b"[rank3]: Traceback (most recent call last):\n\n[rank3]: RuntimeError: x\nsee [rank3]: here\n[rank4]: y\n"
    p.write(raw)
    p.out.pump()
    assert console.getvalue() == (b"[rank 3] Traceback (most recent call last):\n[rank 3] \n[rank 3] RuntimeError: x\n"
                                  b"[rank 3] see [rank3]: here\n[rank 3] [rank4]: y\n")
    assert p.file_bytes() == raw


# -- files-only ranks: spliced into the file in the kernel, drained whatever the file does (issue 27) --
def test_a_files_only_rank_is_spliced_into_its_file_after_what_it_held(pipes, tmp_path, monkeypatch):
    path = tmp_path / "logs" / "attempt_0" / "rank_3.log"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"earlier\n")  # the O_APPEND position is kept once append mode is off
    calls = []
    real = os.splice
    monkeypatch.setattr(output_mod.os, "splice", lambda *a, **k: calls.append(a) or real(*a, **k))
    p = pipes(None)
    assert p.out._splice
    payload = b"".join(b"line %06d\n" % i for i in range(5000))  # 60 kB: one pipe's worth
    p.write(payload)
    while p.out._move():
        pass
    p.close_writer()
    assert p.out.pump() is False
    assert path.read_bytes() == b"earlier\n" + payload
    assert calls and len(calls) <= 3  # the kernel moved it, a pipe's worth a call


def test_a_files_only_rank_on_a_full_disk_warns_once_and_its_pipe_is_still_drained(tmp_path, caplog):
    read_fd, write_fd = output_mod.rank_pipe()
    os.set_blocking(read_fd, False)
    full = os.open("/dev/full", os.O_WRONLY)  # ENOSPC on every write (splice: EINVAL, then the copy fails)
    out = RankOutput(read_fd, full, "rank 5", None, log_path="/logs/rank_5.log")
    try:
        with caplog.at_level("WARNING", logger="launcher.supervision.output"):
            for _ in range(40):  # 40 x 64 KiB: more than the pipe holds, so only draining lets it through
                os.write(write_fd, b"x" * 65535 + b"\n")
                while out._move():
                    pass
        assert out.log_fd == -1
        warnings = [r.getMessage() for r in caplog.records]
        assert len(warnings) == 1 and "rank 5: cannot write its log file /logs/rank_5.log (No space left" in warnings[0]
    finally:
        os.close(write_fd)
        out.close()


def test_the_rank_pipe_is_enlarged():
    read_fd, write_fd = output_mod.rank_pipe()
    try:
        assert output_mod.fcntl.fcntl(write_fd, 1032) == output_mod.PIPE_SIZE  # F_GETPIPE_SZ
    finally:
        os.close(read_fd)
        os.close(write_fd)
