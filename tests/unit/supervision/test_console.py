"""Unit tests for ``launcher.supervision.console``: console writes never block, a backlog is bounded and counted.

Real pipes and socket pairs; the "event loop" is the test calling ``flush_ready`` as a selector would.
"""

import fcntl
import logging
import os
import socket

import pytest

from launcher.supervision.console import Console, ConsoleHandler

F_SETPIPE_SZ = 1031


@pytest.fixture
def pipe():
    read_fd, write_fd = os.pipe()
    fcntl.fcntl(write_fd, F_SETPIPE_SZ, 4096)  # one page: full after a few lines
    yield read_fd, write_fd
    for fd in (read_fd, write_fd):
        try:
            os.close(fd)
        except OSError:
            pass


def read_all(fd: int) -> bytes:
    os.set_blocking(fd, False)
    data = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            return data
        if not chunk:
            return data
        data += chunk


def lines(first: int, count: int) -> bytes:
    return b"".join(b"[rank 0] line %06d\n" % i for i in range(first, first + count))


def test_unread_pipe_buffers_then_drops_whole_chunks_and_counts_them(pipe):
    read_fd, write_fd = pipe
    console = Console(write_fd, "stdout", limit=8192)
    assert os.get_blocking(write_fd)  # the inherited descriptor is left as it was
    chunks = [lines(i * 100, 100) for i in range(10)]  # 2 KiB each; pipe 4 KiB + buffer 8 KiB
    for chunk in chunks:
        console.write(chunk)  # returns although nobody reads
    assert console.dropped_bytes > 0 and console.dropped_lines == console.dropped_bytes // len(b"[rank 0] line 000000\n")
    shown = read_all(read_fd)
    while console._pending:  # pylint: disable=protected-access  # the event loop's job
        console.flush_ready()
        shown += read_all(read_fd)
    kept = len(shown) + console.dropped_bytes
    assert kept == sum(map(len, chunks))
    assert shown == b"".join(chunks)[:len(shown)]  # what was shown is a gapless prefix here
    assert shown.endswith(b"\n")  # whole lines only: drops are whole chunks


def test_attach_watches_the_fd_only_while_there_is_a_backlog(pipe):
    read_fd, write_fd = pipe
    console = Console(write_fd, "stdout", limit=1 << 20)
    calls = []
    console.attach(lambda fd, callback: calls.append(("add", fd)), lambda fd: calls.append(("remove", fd)))
    console.write(b"x" * 100)
    assert calls == []  # the pipe took it at once
    console.write(b"y" * 10000)
    assert calls == [("add", console.fd)]
    read_all(read_fd)
    console.flush_ready()
    read_all(read_fd)
    console.flush_ready()
    assert calls == [("add", console.fd), ("remove", console.fd)]
    console.detach()


def test_finish_waits_for_a_reader_then_drops_the_rest(pipe):
    read_fd, write_fd = pipe
    console = Console(write_fd, "stderr")
    console.write(b"z" * 20000)
    assert console.finish(0.05) > 0  # nobody reads: dropped after the wait
    assert console.dropped_bytes == 20000 - len(read_all(read_fd))
    assert console.finish(0.05) == 0


def test_reader_gone_makes_writes_no_ops(pipe):
    read_fd, write_fd = pipe
    console = Console(write_fd, "stdout")
    os.close(read_fd)
    console.write(b"lost\n")  # EPIPE (SIGPIPE is ignored by Python): no exception
    console.write(b"lost too\n")
    assert console.dropped_bytes == 0 and not console._pending  # pylint: disable=protected-access


def test_socket_console_never_blocks():
    ours, theirs = socket.socketpair()
    with ours, theirs:
        console = Console(ours.fileno(), "stdout", limit=4096)
        for _ in range(200):
            console.write(b"s" * 4096)
        assert console.dropped_bytes > 0
        assert ours.getblocking()  # MSG_DONTWAIT per send: the shared socket stays blocking


def test_regular_file_is_written_as_is(tmp_path):
    fd = os.open(tmp_path / "out", os.O_WRONLY | os.O_CREAT)
    try:
        console = Console(fd, "stdout", limit=16)
        console.write(b"a" * 1000)
        assert console.fd == fd and console.dropped_bytes == 0
    finally:
        os.close(fd)
    assert (tmp_path / "out").read_bytes() == b"a" * 1000


def test_handler_writes_log_lines_through_the_console(pipe):
    read_fd, write_fd = pipe
    logger = logging.getLogger("test_console_handler")
    logger.propagate = False
    handler = ConsoleHandler(Console(write_fd, "stderr", limit=1024))
    logger.addHandler(handler)
    try:
        for i in range(1000):  # ~40 KB into a 4 KiB pipe nobody reads: must not block
            logger.warning("message %d", i)
    finally:
        logger.removeHandler(handler)
    assert read_all(read_fd).startswith(b"message 0\nmessage 1\n")
    assert handler.console.dropped_lines > 0
