"""Make two OS processes, each with its own XLA:CPU device, act as two data-parallel XLA replicas.

torch_xla does not run collectives between XLA:CPU processes (they hang: pytorch/xla#9089), so a DDP run cannot be
checked on a machine without a TPU. ``install`` makes it checkable by replacing, in the process that calls it:

- the transport of ``torch_xla.core.xla_model.all_reduce``: the tensors are copied to the host, summed over the
  processes with ``torch.distributed`` (gloo, over TCP), scaled, and copied back into the same XLA tensors in place.
  ``xm.reduce_gradients`` (and so ``xm.optimizer_step``) looks ``all_reduce`` up in its module at call time, so
  replacing the attribute covers both it and direct ``xm.all_reduce`` calls;
- the world size and ordinal queries: ``torch_xla.runtime.world_size`` returns the number of processes,
  ``torch_xla.runtime.global_ordinal`` and ``local_ordinal`` return this process's rank.

Everything else stays real: Lightning's ``Trainer`` and ``LightningLite``, where the precision plugins place the
reduce in the step, the XLA device, its lazy tensors and compiled graphs, and the optimizer.

Known limit: replacing the transport also replaces torch_xla's in-place update of the reduced tensors (here a host
round trip and ``copy_``). A bug in that update is invisible through this harness; in particular the loss of the
all-reduce of ``p.grad.data`` under functionalization after an in-place edit of the gradients through an alias
(clipping through ``.data``, see ``docs/upstream-bugs.md``) does not show. Numeric single-process tests with a
simulated world size cover that.
"""
import datetime
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

import torch
import torch.distributed as dist


class GlooXlaCollectives:
    """The installed replacement. ``calls`` holds, for each ``all_reduce`` call, how many tensors it reduced."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank = rank
        self.world_size = world_size
        self.calls: List[int] = []
        self._saved: Dict[Any, Dict[str, Callable]] = {}

    def all_reduce(
        self,
        reduce_type: str,
        inputs: Union[torch.Tensor, Sequence[torch.Tensor]],
        scale: float = 1.0,
        groups: Optional[List[List[int]]] = None,
        pin_layout: bool = True,
    ) -> Union[torch.Tensor, Sequence[torch.Tensor]]:
        """Same contract as ``xm.all_reduce``: a list is reduced in place and returned, a single tensor gives a new
        reduced tensor. Only ``REDUCE_SUM`` over all replicas is carried."""
        import torch_xla.core.xla_model as xm

        if reduce_type != xm.REDUCE_SUM:
            raise NotImplementedError(f"gloo harness: only xm.REDUCE_SUM is carried, not {reduce_type!r}")
        if groups:
            raise NotImplementedError(f"gloo harness: replica groups are not carried ({groups!r})")
        single = isinstance(inputs, torch.Tensor)
        tensors = [inputs] if single else list(inputs)
        self.calls.append(len(tensors))
        if not tensors:
            return inputs
        # one graph and one device-to-host transfer for all the tensors, one collective over the flat buffer
        host = torch.cat([t.detach().reshape(-1) for t in tensors]).cpu()
        dist.all_reduce(host, op=dist.ReduceOp.SUM)
        if scale != 1.0:
            host.mul_(scale)
        chunks = []
        offset = 0
        for t in tensors:
            chunks.append(host[offset:offset + t.numel()].view(t.shape))
            offset += t.numel()
        if single:
            return chunks[0].to(device=inputs.device, dtype=inputs.dtype)
        for t, chunk in zip(tensors, chunks):
            t.copy_(chunk.to(t.device))
        return inputs

    def _replace(self, module: Any, name: str, value: Callable) -> None:
        self._saved.setdefault(module, {})[name] = getattr(module, name)
        setattr(module, name, value)

    def uninstall(self) -> None:
        """Put the torch_xla functions back and leave the process group."""
        for module, originals in self._saved.items():
            for name, value in originals.items():
                setattr(module, name, value)
        self._saved.clear()
        if dist.is_initialized():
            dist.destroy_process_group()


def install(rank: int, world_size: int, init_method: str, timeout: float = 60.0) -> GlooXlaCollectives:
    """Join the gloo group at ``init_method`` (e.g. ``tcp://127.0.0.1:PORT``) as ``rank`` and route torch_xla's
    all-reduce and replica queries through it. ``timeout`` (seconds) bounds the rendezvous and every collective, so a
    missing peer fails the run instead of hanging it."""
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr

    dist.init_process_group(
        "gloo",
        init_method=init_method,
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=timeout),
    )
    harness = GlooXlaCollectives(rank, world_size)
    harness._replace(xr, "world_size", lambda: world_size)
    harness._replace(xr, "global_ordinal", lambda: rank)
    harness._replace(xr, "local_ordinal", lambda: rank)
    harness._replace(xm, "all_reduce", harness.all_reduce)
    return harness
