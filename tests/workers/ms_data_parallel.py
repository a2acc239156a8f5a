"""A stock MindSpore data-parallel script, as a user would run it under msrun (no launcher knowledge).

GRAPH_MODE + ParallelMode.DATA_PARALLEL + TrainOneStepCell, a few steps of a one-layer net on random
data, then ``rank <r> of <n> ok loss=<x>`` on stdout. Used to check that the launcher runs an msrun
script unchanged (issue #10: GROUP_INFO_FILE / MS_ENABLE_GRACEFUL_EXIT broke it).
"""

import os

os.environ.setdefault("GLOG_v", "3")  # MindSpore's C++ side is chatty at WARNING

import numpy as np  # noqa: E402

import mindspore as ms  # noqa: E402
from mindspore import nn  # noqa: E402
from mindspore.communication import get_group_size, get_rank, init  # noqa: E402


def main() -> None:
    ms.set_context(mode=ms.GRAPH_MODE)
    init()
    rank, size = get_rank(), get_group_size()
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
    net = nn.Dense(4, 1)
    loss_net = nn.WithLossCell(net, nn.MSELoss())
    step = nn.TrainOneStepCell(loss_net, nn.SGD(net.trainable_params(), learning_rate=0.01))
    rng = np.random.default_rng(rank)
    for _ in range(3):
        x = ms.Tensor(rng.standard_normal((8, 4)).astype(np.float32))
        y = ms.Tensor(rng.standard_normal((8, 1)).astype(np.float32))
        loss = step(x, y)
    print(f"rank {rank} of {size} ok loss={float(loss.asnumpy()):.4f}", flush=True)


if __name__ == "__main__":
    main()
