"""Stands in for the job's interpreter in checkpoint-conversion tests: ``fake_transform.py -c SCRIPT``.

Reads the conversion job (JSON on stdin) like ``mstransform.TRANSFORM_SCRIPT`` and, by
``FAKE_TRANSFORM_MODE``:
  ok       writes ``converted <rank>`` into every target rank's file;
  fail     writes nothing, prints an error and MindSpore's C++ location on stderr, exits 3;
  partial  writes rank 0's file only, then writes its pid to ``FAKE_TRANSFORM_READY`` and waits to be
           killed (a crash mid-conversion).
Each run appends one line to ``FAKE_TRANSFORM_LOG`` when set (how many conversions ran).
"""

import json
import os
import signal
import sys


def main():
    job = json.load(sys.stdin)
    mode = os.environ.get("FAKE_TRANSFORM_MODE", "ok")
    if os.environ.get("FAKE_TRANSFORM_LOG"):
        with open(os.environ["FAKE_TRANSFORM_LOG"], "a") as log:
            log.write(f"{mode}\n")
    if mode == "fail":
        print("ValueError: the strategy files do not match", file=sys.stderr)
        print("- C++ Call Stack:\nmindspore/ccsrc/frontend/parallel/tensor_layout/tensor_transform.cc:390 "
              "TransformOperators", file=sys.stderr)  # MindSpore's errors end with the source location
        return 3
    for rank in job["ranks"]:
        out = os.path.join(job["tmp"], f"rank_{rank}", job["name"])
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with open(out, "w") as fh:
            fh.write(f"converted {rank} from {sorted(job['sources'])}")
        if mode == "partial":
            ready = os.environ["FAKE_TRANSFORM_READY"]
            with open(ready + ".tmp", "w") as fh:
                fh.write(str(os.getpid()))
            os.rename(ready + ".tmp", ready)
            while True:
                signal.pause()
    return 0


if __name__ == "__main__":
    sys.exit(main())
