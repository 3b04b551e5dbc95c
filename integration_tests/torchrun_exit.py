"""How a worker launched by ``torchrun`` ends: every rank done, the process group destroyed."""

from __future__ import annotations


def shut_down() -> None:
    """Every rank done, the process group destroyed: a group left to the interpreter's exit may abort a rank in its
    C++ teardown ("terminate called without an active exception", exit -6) after the run itself succeeded."""
    import torch.distributed

    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
