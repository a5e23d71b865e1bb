"""One process of tests/models/test_simdino.py's two-process run (``torch.distributed.run``, gloo): a float64 SimDINO
head under DDP on this process's share of a fixed global batch; rank 0 saves the loss averaged over the processes
and the (DDP-averaged) gradients, with the authors' MCRLoss beside (``--reduce_cov`` 1 and 0), to ``argv[1]``."""

import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for official.simdino

from official.simdino import MCRLoss  # noqa: E402

from crate_transformer.models.dino import DINOHead, SimDINOLoss  # noqa: E402
from crate_transformer.train.runtime import Runtime  # noqa: E402

VIEWS, BATCH, DIM, EPS = 4, 16, 12, 0.7  # 2 global + 2 local views of a global batch of 16


def problem() -> tuple[DINOHead, DINOHead, torch.Tensor]:
    """The student and teacher heads and the inputs ``(VIEWS, BATCH, DIM)``, the same on every process."""
    torch.manual_seed(0)
    student = DINOHead(DIM, None, hidden_dim=10, bottleneck_dim=6, use_bn=False).double()
    teacher = DINOHead(DIM, None, hidden_dim=10, bottleneck_dim=6, use_bn=False).double().requires_grad_(False)
    return student, teacher, torch.randn(VIEWS, BATCH, DIM, dtype=torch.float64)


def loss_and_grads(loss_fn, student, teacher, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The loss of views ``x`` ``(V, b, D)`` and the student's gradients (``loss_fn(s_out, t_out)`` → loss)."""
    s_out = student(x.reshape(-1, x.shape[-1]))
    t_out = teacher(x[:2].reshape(-1, x.shape[-1]))
    loss = loss_fn(s_out, t_out)
    student.zero_grad()
    loss.backward()
    return loss.detach(), [p.grad.detach().clone() for p in student.parameters()]


def run(rank: int, world: int) -> dict[str, tuple[torch.Tensor, list[torch.Tensor]]]:
    """The loss (averaged over the processes) and the DDP-averaged gradients of each loss, on this process's share."""
    student, teacher, x = problem()
    ddp = torch.nn.parallel.DistributedDataParallel(student)
    share = x[:, rank * BATCH // world : (rank + 1) * BATCH // world]
    ours = SimDINOLoss(eps=EPS)
    results = {}
    fns = {
        "ours": lambda s, t: ours(s, t)[0],
        "official_reduce_cov_1": lambda s, t: MCRLoss(VIEWS, reduce_cov=1, expa_type=1, eps=EPS**2)(s, t)[0],
        "official_reduce_cov_0": lambda s, t: MCRLoss(VIEWS, reduce_cov=0, expa_type=1, eps=EPS**2)(s, t)[0],
    }
    for name, fn in fns.items():
        loss, grads = loss_and_grads(fn, ddp, teacher, share)
        dist.all_reduce(loss)  # the run's loss: the processes' mean (each holds the mean over its own images)
        results[name] = (loss / world, grads)
    return results


def main(out: str) -> None:
    dist.init_process_group("gloo")
    results = run(dist.get_rank(), dist.get_world_size())
    if dist.get_rank() == 0:
        torch.save(results, out)
    # DDP died when run() returned, before the group is destroyed (and the package's teardown, Runtime.close, also
    # collects one left in a reference cycle).  Held by main() until it returned, after destroy_process_group, its
    # C++ Reducer was the group's last owner and ran ~ProcessGroupGloo holding the GIL, joining a gloo worker that
    # waited for the GIL to release the last all_reduce's tensor: the launch hung (issue 52; py-spy: one process in
    # ~Reducer -> ~ProcessGroupGloo -> thread::join, its worker in ~AsyncAllreduceWork -> decref_pyobject ->
    # gil_scoped_acquire)
    Runtime(rank=dist.get_rank(), world=dist.get_world_size()).close()


if __name__ == "__main__":
    main(sys.argv[1])
