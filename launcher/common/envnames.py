"""Every environment variable name the launcher reads or sets, in one place.

Names are grouped by who defines the contract: the legacy Ascend scripts, torchrun, msrun (MindSpore
dynamic cluster), MindCluster / the Ascend Operator, and the launcher itself. See
``docs/ascend-reference.md`` sections 1, 2 and 6 for where each comes from.
"""

# --- Legacy Ascend per-rank variables (train_start.sh / utils.sh) --------------------------------
RANK_TABLE_FILE = "RANK_TABLE_FILE"
RANK_ID = "RANK_ID"
RANK_SIZE = "RANK_SIZE"
DEVICE_ID = "DEVICE_ID"
ASCEND_DEVICE_ID = "ASCEND_DEVICE_ID"
DEVICE_NUM = "DEVICE_NUM"
DEVICE_INDEX = "DEVICE_INDEX"  # TensorFlow: the global rank (legacy scripts hard-coded 8*server)
SERVER_ID = "SERVER_ID"  # index of this server in the rank table
SERVER_NUM = "SERVER_NUM"
JOB_ID = "JOB_ID"
HCCL_IF_IP = "HCCL_IF_IP"
GROUP_INFO_FILE = "GROUP_INFO_FILE"
RESTORE_RANKS = "RESTORE_RANKS"
RESTORE_RANKS_MAP = "RESTORE_RANKS_MAP"

# --- torchrun ---------------------------------------------------------------------------------
RANK = "RANK"
LOCAL_RANK = "LOCAL_RANK"
WORLD_SIZE = "WORLD_SIZE"
LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
GROUP_RANK = "GROUP_RANK"
GROUP_WORLD_SIZE = "GROUP_WORLD_SIZE"
ROLE_RANK = "ROLE_RANK"
ROLE_WORLD_SIZE = "ROLE_WORLD_SIZE"
ROLE_NAME = "ROLE_NAME"
MASTER_ADDR = "MASTER_ADDR"
MASTER_PORT = "MASTER_PORT"
TORCHELASTIC_RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"
TORCHELASTIC_MAX_RESTARTS = "TORCHELASTIC_MAX_RESTARTS"
TORCHELASTIC_RUN_ID = "TORCHELASTIC_RUN_ID"
TORCHELASTIC_USE_AGENT_STORE = "TORCHELASTIC_USE_AGENT_STORE"
TORCHELASTIC_ERROR_FILE = "TORCHELASTIC_ERROR_FILE"
TORCHELASTIC_SIGNALS_TO_HANDLE = "TORCHELASTIC_SIGNALS_TO_HANDLE"
PYTHON_EXEC = "PYTHON_EXEC"  # read: the interpreter for a COMMAND ending in .py, as in torchrun
OMP_NUM_THREADS = "OMP_NUM_THREADS"
TORCH_NCCL_ASYNC_ERROR_HANDLING = "TORCH_NCCL_ASYNC_ERROR_HANDLING"
PYTHONUNBUFFERED = "PYTHONUNBUFFERED"  # torchrun runs `python -u`; the legacy scripts export it
PYTHONBREAKPOINT = "PYTHONBREAKPOINT"  # ranks without the terminal: breakpoint() prints a hint
PYTHONPATH = "PYTHONPATH"
LAUNCHER_PY_SPY = "LAUNCHER_PY_SPY"  # read: the py-spy for hang dumps; empty: use faulthandler only
LAUNCHER_IMPORTS_FILE = "LAUNCHER_IMPORTS_FILE"  # --preload auto: where the ranks record their imports
LAUNCHER_HEARTBEAT_FILE = "LAUNCHER_HEARTBEAT_FILE"  # --heartbeat-timeout: the rank's heartbeat slot (mmap'd)
LAUNCHER_DEV_DIR = "LAUNCHER_DEV_DIR"  # read: where the davinci<N> device files are (default /dev)
LAUNCHER_CONFIG = "LAUNCHER_CONFIG"  # read: the --config file (launcher run)
LAUNCHER_DEVICES = "LAUNCHER_DEVICES"  # set for --health-check: this node's device ids, comma-separated

# --- msrun / MindSpore dynamic cluster --------------------------------------------------------
MS_ROLE = "MS_ROLE"
MS_ROLE_SCHED = "MS_SCHED"
MS_ROLE_WORKER = "MS_WORKER"
MS_SCHED_HOST = "MS_SCHED_HOST"
MS_SCHED_PORT = "MS_SCHED_PORT"
MS_WORKER_NUM = "MS_WORKER_NUM"
MS_LOCAL_WORKER = "MS_LOCAL_WORKER"
MS_NODE_RANK = "MS_NODE_RANK"
MS_NODE_ID = "MS_NODE_ID"
MS_SERVER_NUM = "MS_SERVER_NUM"
MS_TOPO_TIMEOUT = "MS_TOPO_TIMEOUT"
MS_ENABLE_GRACEFUL_EXIT = "MS_ENABLE_GRACEFUL_EXIT"
MS_ENABLE_TFT = "MS_ENABLE_TFT"

# --- MindCluster / Ascend Operator / Kubernetes -----------------------------------------------
XDL_IP = "XDL_IP"
POD_IP = "POD_IP"
MINDX_TASK_ID = "MINDX_TASK_ID"
MINDX_FRAMEWORK = "framework"  # the MindX samples export the framework name in lower case
ASCEND_VISIBLE_DEVICES = "ASCEND_VISIBLE_DEVICES"
TASKD_PROCESS_ENABLE = "TASKD_PROCESS_ENABLE"
LD_PRELOAD = "LD_PRELOAD"
PROCESS_RECOVER = "PROCESS_RECOVER"
HIGH_AVAILABILITY = "HIGH_AVAILABILITY"
ENABLE_RESTART_FAULT_PROCESS = "ENABLE_RESTART_FAULT_PROCESS"
XDG_RUNTIME_DIR = "XDG_RUNTIME_DIR"

# --- The launcher's own variables, exported to every rank -------------------------------------
LAUNCHER_RUN_DIR = "LAUNCHER_RUN_DIR"
LAUNCHER_ATTEMPT = "LAUNCHER_ATTEMPT"
LAUNCHER_PHYSICAL_DEVICE_ID = "LAUNCHER_PHYSICAL_DEVICE_ID"  # the NPU's id on the host (rank table device_id)
LAUNCHER_GRACEFUL_EXIT_FILE = "LAUNCHER_GRACEFUL_EXIT_FILE"
LAUNCHER_GASP_SAVE_ALLOWED = "LAUNCHER_GASP_SAVE_ALLOWED"
LAUNCHER_RESUME_SOURCE_RANK = "LAUNCHER_RESUME_SOURCE_RANK"
LAUNCHER_RESUME_CHECKPOINT = "LAUNCHER_RESUME_CHECKPOINT"
LAUNCHER_RESUME_STEP = "LAUNCHER_RESUME_STEP"
LAUNCHER_RESUME_KIND = "LAUNCHER_RESUME_KIND"  # "breakpoint" or "periodic"
LAUNCHER_RESUME_DCP_DIR = "LAUNCHER_RESUME_DCP_DIR"  # the global torch.distributed.checkpoint step dir
LAUNCHER_RESUME_SAVED_WORLD_SIZE = "LAUNCHER_RESUME_SAVED_WORLD_SIZE"  # ranks that wrote the step
LAUNCHER_DEBUG_RANK = "LAUNCHER_DEBUG_RANK"  # --debug-rank: the rank holding the terminal
LAUNCHER_CONTROL_SOCKET = "LAUNCHER_CONTROL_SOCKET"  # --pdb: where a failing rank asks for the terminal
LAUNCHER_JOB_TOKEN = "LAUNCHER_JOB_TOKEN"  # "<job>.<leaf>": finds the job's processes that left their group

# --- Read by the launcher itself (not an option of `launcher run`) ------------------------------
LAUNCHER_CGROUP = "LAUNCHER_CGROUP"  # "off": no job cgroup, even where cgroup v2 is writable
# --coordinator-user's etcd password (a Kubernetes Secret as env var); removed before the ranks start
LAUNCHER_COORDINATOR_PASSWORD = "LAUNCHER_COORDINATOR_PASSWORD"

# --- Options of `launcher run` read from the environment (LAUNCHER_<OPTION>) -------------------
ENV_PREFIX = "LAUNCHER_"
