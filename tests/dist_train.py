"""``fairseq-train`` that also writes each rank's parameters after every update, for
the data-parallel, update-freq and resume tests (tests/test_distributed.py).

With ``DUMP_DIR`` set, rank R writes ``DUMP_DIR/rank{R}.update{N}.pt`` (the model's
state dict) after update N; everything else is ``fairseq_cli.train.cli_main``.

fairseq's ``c10d`` wrapper passes ``device_ids=[device_id]`` to torch's
DistributedDataParallel, which torch refuses for a CPU module, so ``--cpu`` runs can
only use ``legacy_ddp`` in fairseq itself. ``C10D_ON_CPU=1`` makes this script build
torch's DDP without device ids for CPU modules (what fairseq builds on a GPU, minus
the device placement), so the CPU tests exercise torch's real DDP reducer: gradients
are averaged by autograd hooks armed in DDP's forward, the behaviour the criteria
must cope with on GPUs.
"""
import os

import torch
from fairseq.trainer import Trainer

_train_step = Trainer.train_step


def _dumping_train_step(self, samples, raise_oom=False):
    out = _train_step(self, samples, raise_oom)
    dump = os.environ.get("DUMP_DIR")
    if dump:
        state = {k: v.detach().clone() for k, v in self.get_model().state_dict().items()}
        torch.save(state, os.path.join(dump, f"rank{self.data_parallel_rank}.update{self.get_num_updates()}.pt"))
    return out


Trainer.train_step = _dumping_train_step

if os.environ.get("C10D_ON_CPU"):
    from fairseq.models import distributed_fairseq_model as dfm

    _DDP = dfm.DistributedDataParallel

    def _cpu_ddp(module, device_ids=None, output_device=None, **kwargs):
        if next(module.parameters()).device.type == "cpu":
            device_ids, output_device = None, None
        return _DDP(module, device_ids=device_ids, output_device=output_device, **kwargs)

    dfm.DistributedDataParallel = _cpu_ddp

if __name__ == "__main__":
    from fairseq_cli.train import cli_main

    cli_main()
