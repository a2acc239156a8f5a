"""Stack dumps: the innermost frame of each rank's main thread, and which rank differs."""

from launcher.monitoring.stacks import diagnose, innermost_frame, py_spy_path

PY_SPY = """Process 200: python train.py
Python v3.11.7 (/usr/bin/python3.11)

Thread 201 (idle): "pt_data_worker"
    _worker_loop (worker.py:300)
Thread 200 (active+gil): "MainThread"
    all_reduce (distributed_c10d.py:2501)
    step (train.py:88)
    <module> (train.py:120)
"""

FAULTHANDLER = """Thread 0x00007f0000000001 (most recent call first):
  File "/x/loader.py", line 12 in fetch

Current thread 0x00007f0000000002 (most recent call first):
  File "/x/train.py", line 70 in next_batch
  File "/x/train.py", line 88 in <module>
"""


def test_py_spy_main_thread_is_the_one_whose_id_is_the_pid():
    assert innermost_frame(PY_SPY, 200) == "all_reduce (distributed_c10d.py:2501)"
    assert innermost_frame(PY_SPY) == "_worker_loop (worker.py:300)"  # pid unknown: the first thread


def test_faulthandler_current_thread():
    assert innermost_frame(FAULTHANDLER) == "next_batch (train.py:70)"


def test_nothing_to_read():
    assert innermost_frame("Error: Failed to find python version from target process") is None


def test_diagnosis_names_the_rank_that_differs_first():
    where = {0: "all_reduce (c10d.py:1)", 1: "all_reduce (c10d.py:1)", 2: "fetch (loader.py:12)",
             3: "all_reduce (c10d.py:1)", 4: None}
    assert diagnose(where, [2]) == ["rank 2 (hung) differs from the rest: in fetch (loader.py:12)",
                                    "rank 4: no stacks could be read",
                                    "ranks 0,1,3: in all_reduce (c10d.py:1)"]


def test_all_in_one_place():
    assert diagnose({0: "a (x.py:1)", 1: "a (x.py:1)"}, [0, 1]) == ["ranks 0,1 (hung): in a (x.py:1)"]
    assert diagnose({}, []) == []


def test_py_spy_path_from_the_environment():
    assert py_spy_path({"LAUNCHER_PY_SPY": ""}) is None
    assert py_spy_path({"LAUNCHER_PY_SPY": "/opt/py-spy"}) == "/opt/py-spy"


def test_odd_one_out_is_the_lone_rank_elsewhere():
    from launcher.monitoring.stacks import odd_one_out

    assert odd_one_out({0: "a", 1: "a", 2: "b", 3: "a"}) == 2
    assert odd_one_out({0: "a", 1: "b"}) is None  # two ranks: no majority
    assert odd_one_out({0: "a", 1: "a", 2: "b", 3: "c"}) is None
    assert odd_one_out({0: "a", 1: "a", 2: "a", 3: None}) is None
