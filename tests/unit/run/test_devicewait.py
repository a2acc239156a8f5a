"""Who holds a device: the /proc scan with a real process holding a stand-in device file, and
npu-smi's process table in the tool's own layout."""

import os
import subprocess
import sys

from launcher.common import envnames
from launcher.run.devicewait import busy_devices, device_paths, open_holders, parse_npu_smi

# npu-smi info on an Atlas 800T A2 (910B) with a process on NPU 0 (the tool's layout, abridged).
NPU_SMI_BUSY = """\
+------------------------------------------------------------------------------------------------+
| npu-smi 24.1.rc1                 Version: 24.1.rc1                                             |
+---------------------------+---------------+----------------------------------------------------+
| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|
| Chip                      | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |
+===========================+===============+====================================================+
| 0     910B2C              | OK            | 88.6        51                0    / 0             |
| 0                         | 0000:5A:00.0  | 0           0    / 0          20701/ 65536         |
+===========================+===============+====================================================+
| 1     910B2C              | OK            | 99.6        50                0    / 0             |
| 0                         | 0000:19:00.0  | 0           0    / 0          3306 / 65536         |
+===========================+===============+====================================================+
+---------------------------+---------------+----------------------------------------------------+
| NPU     Chip              | Process id    | Process name             | Process memory(MB)      |
+===========================+===============+====================================================+
| 0       0                 | 124528        | python3.8                | 17400                   |
+---------------------------+---------------+----------------------------------------------------+
| 0       0                 | 124529        | python3.8                | 1200                    |
+===========================+===============+====================================================+
| No running processes found in NPU 1                                                            |
+===========================+===============+====================================================+
"""


def test_npu_smi_process_rows_are_read_and_the_device_table_is_not():
    assert parse_npu_smi(NPU_SMI_BUSY) == {0: [124528, 124529]}
    assert parse_npu_smi(NPU_SMI_BUSY.replace("| 0       0                 | 12452", "| junk")) == {}


def test_a_process_holding_a_stand_in_device_file_is_found(tmp_path):
    (tmp_path / "davinci1").write_text("")
    env = {envnames.LAUNCHER_DEV_DIR: str(tmp_path)}
    paths = device_paths([0, 1], env)
    assert paths == {str(tmp_path / "davinci1"): 1}  # davinci0 does not exist here: never waited for
    holder = subprocess.Popen([sys.executable, "-c", "import sys,time; f=open(sys.argv[1]); print(1, flush=True); "
                               "time.sleep(60)", str(tmp_path / "davinci1")], stdout=subprocess.PIPE,
                              start_new_session=True)
    try:
        holder.stdout.readline()
        held = open_holders(paths, root=os.getpid() + 10**7)  # a root that owns nothing
        assert list(held) == [1] and len(held[1]) == 1 and held[1][0].startswith(f"pid {holder.pid} (")
        assert open_holders(paths, root=os.getpid()) == {}  # our own child: never a holder
    finally:
        holder.kill()
        holder.wait()
    assert busy_devices([0, 1], env) == {}


def test_npu_smi_on_path_is_asked(tmp_path, monkeypatch):
    tool = tmp_path / "npu-smi"
    listing = tmp_path / "listing.txt"
    listing.write_text(NPU_SMI_BUSY)
    tool.write_text(f"#!/bin/sh\ncat {listing}\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert busy_devices([0, 1], {}) == {0: ["pid 124528 (npu-smi)", "pid 124529 (npu-smi)"]}
    assert busy_devices([1, 2], {}) == {}
