"""Rank hosting a rendezvous the way torch's rank 0 hosts its TCPStore, standard library only.

Attempt 0: rank 0 listens on ``MASTER_ADDR:MASTER_PORT`` (unless ``--no-store-first``), rank 1
exits 3 once the file ``--fail-when`` exists (the test's trigger, given once the warm standbys are
ready), the others wait to be stopped. Attempt 1: each rank appends ``<rank> start <time.time()>``
to ``--out DIR/starts``; rank 0 then takes ``--host-delay`` seconds (a script's work before
``init_process_group``), listens, appends ``0 listen <time>`` and waits for every other rank to
connect; the others connect (again every 10 ms while refused, as torch's client does, only sooner)
and exit 0.
"""

import argparse
import os
import socket
import sys
import time


def note(out, line):
    fd = os.open(os.path.join(out, "starts"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, f"{line}\n".encode())
    os.close(fd)


def connect(address):
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(address, timeout=5).close()
            return
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--fail-when", required=True)
    parser.add_argument("--host-delay", type=float, default=0.05)
    parser.add_argument("--no-store-first", action="store_true")
    args = parser.parse_args()
    rank, attempt = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    address = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
    if attempt == 0:
        store = socket.create_server(address) if rank == 0 and not args.no_store_first else None
        while rank == 1 and not os.path.exists(args.fail_when):
            time.sleep(0.01)
        sys.exit(3) if rank == 1 else time.sleep(60)
        del store
    note(args.out, f"{rank} start {time.time()!r}")
    if rank == 0:
        time.sleep(args.host_delay)
        server = socket.create_server(address)
        note(args.out, f"0 listen {time.time()!r}")
        server.settimeout(30)
        for _ in range(int(os.environ["WORLD_SIZE"]) - 1):
            server.accept()[0].close()
        return
    connect(address)


if __name__ == "__main__":
    main()
