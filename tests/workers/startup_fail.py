"""A rank that fails at start-up the way ``--mode`` says, for the restart policy's failure classes.

It appends ``<rank> <attempt> <pid>`` to ``--ready-file``, then:
  --mode port     on the attempts in ``--fail-attempts``: MindSpore's scheduler's lines for a port
                  still in use on stderr, exit 1; otherwise exit 0
  --mode import   every attempt: import a module that does not exist (ModuleNotFoundError)
"""

import argparse
import os
import sys

RANK = int(os.environ.get("RANK", "0"))
ATTEMPT = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
PORT_IN_USE = ("[WARNING] DISTRIBUTED(31,ffff979150f0,python):2025-08-19-10:34:38.043.650 "
               "[mindspore/ccsrc/distributed/rpc/tcp/tcp_comm.cc:191] StartServerSocket] Failed to call bind, "
               "url: 127.0.0.1:8118 Address already in use\n"
               "[ERROR] DISTRIBUTED(31,ffff979150f0,python):2025-08-19-10:34:38.043.706 "
               "[mindspore/ccsrc/distributed/cluster/topology/meta_server_node.cc:114] InitTCPServer] "
               "Failed to init the tcp server\n")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ready-file")
    parser.add_argument("--mode", default="port")
    parser.add_argument("--fail-attempts", default="0")
    args = parser.parse_args()
    with open(args.ready_file, "a") as f:
        f.write(f"{RANK} {ATTEMPT} {os.getpid()}\n")
    if args.mode == "import":
        import no_such_module_for_the_test  # noqa: F401
    if args.mode == "port" and str(ATTEMPT) in args.fail_attempts.split(","):
        sys.stderr.write(PORT_IN_USE)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
