"""A minimal ``launcher prestop`` client, for comparison: run as ``python -S prestop_min.py RUN_DIR``.

Sends the same one-line request as ``launcher prestop`` on the run dir's control socket and waits
until the launcher closes the connection (the job has ended). No click, no launcher imports.
"""
import socket
import sys

_sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
_sock.connect(sys.argv[1] + "/control.sock")
_sock.sendall(b'{"command": "gasp", "args": {}}\n')
while _sock.recv(65536):
    pass
