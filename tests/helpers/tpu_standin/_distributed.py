"""The stand-in's ``torch.distributed`` backend ``"tpu"``: the collectives of TorchTPU's backend, carried by gloo.

Each collective copies its device tensors to the host, runs the same collective of a gloo process group (over
loopback: the stand-in is one host) and waits for it, then copies the results back into the device tensors. The
returned ``Work`` is complete. Like TorchTPU's, the backend is registered for the ``"tpu"`` device only:
collectives of CPU tensors on a group made with ``init_process_group("tpu")`` fail as they do on a TPU VM.

Gloo has no ``AVG``: an average is the ``SUM`` divided by the group's size, on the host.
"""
from datetime import timedelta
from typing import List, Sequence, Tuple

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import (
    AllgatherOptions,
    AllreduceCoalescedOptions,
    AllreduceOptions,
    Backend as C10dBackend,
    BarrierOptions,
    BroadcastOptions,
    ReduceOp,
    ReduceOptions,
    ReduceScatterOptions,
    Store,
    Work,
)
from torch.futures import Future

BACKEND_NAME = "tpu"


class _CompletedWork(Work):
    """The work of a collective that has finished: its future holds the result."""

    def __init__(self, result: object) -> None:
        super().__init__()
        self._future: Future = Future()
        self._future.set_result(result)

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def get_future(self) -> Future:
        return self._future


def _host(tensors: Sequence[torch.Tensor]) -> List[torch.Tensor]:
    return [tensor.cpu() for tensor in tensors]


def _copy_back(devices: Sequence[torch.Tensor], hosts: Sequence[torch.Tensor]) -> None:
    for device_tensor, host_tensor in zip(devices, hosts):
        device_tensor.copy_(host_tensor)


def _gloo_op(op: ReduceOp) -> Tuple[ReduceOp, bool]:
    """The op that gloo runs for ``op``, and whether its result is then divided by the group's size."""
    if op == ReduceOp.AVG:
        return ReduceOp.SUM, True
    return op, False


class GlooBridge(C10dBackend):
    """A ``torch.distributed`` backend for the stand-in device that runs every collective through gloo.

    ``torch.distributed`` creates it (``Backend.register_backend``'s creator) with the group's store, rank, size
    and timeout; the gloo group of the same ranks uses the same store and timeout.
    """

    def __init__(self, store: Store, rank: int, size: int, timeout: timedelta) -> None:
        super().__init__(rank, size)
        options = dist.ProcessGroupGloo._Options()
        options._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
        options._timeout = timeout
        self._gloo = dist.ProcessGroupGloo(store, rank, size, options)

    def getBackendName(self) -> str:
        return BACKEND_NAME

    def allreduce(self, tensors: List[torch.Tensor], opts: AllreduceOptions) -> Work:
        hosts = _host(tensors)
        gloo_opts = AllreduceOptions()
        gloo_opts.reduceOp, average = _gloo_op(opts.reduceOp)
        gloo_opts.timeout = opts.timeout
        self._gloo.allreduce(hosts, gloo_opts).wait()
        if average:
            for host in hosts:
                host.div_(self.size())
        _copy_back(tensors, hosts)
        return _CompletedWork(tensors)

    def allreduce_coalesced(self, tensors: List[torch.Tensor], opts: AllreduceCoalescedOptions) -> Work:
        single = AllreduceOptions()
        single.reduceOp = opts.reduceOp
        single.timeout = opts.timeout
        for tensor in tensors:
            self.allreduce([tensor], single)
        return _CompletedWork(tensors)

    def reduce(self, tensors: List[torch.Tensor], opts: ReduceOptions) -> Work:
        hosts = _host(tensors)
        gloo_opts = ReduceOptions()
        gloo_opts.reduceOp, average = _gloo_op(opts.reduceOp)
        gloo_opts.rootRank = opts.rootRank
        gloo_opts.rootTensor = opts.rootTensor
        gloo_opts.timeout = opts.timeout
        self._gloo.reduce(hosts, gloo_opts).wait()
        if average and self.rank() == opts.rootRank:
            for host in hosts:
                host.div_(self.size())
        _copy_back(tensors, hosts)
        return _CompletedWork(tensors)

    def broadcast(self, tensors: List[torch.Tensor], opts: BroadcastOptions) -> Work:
        hosts = _host(tensors)
        self._gloo.broadcast(hosts, opts).wait()
        _copy_back(tensors, hosts)
        return _CompletedWork(tensors)

    def allgather(
        self, output_lists: List[List[torch.Tensor]], inputs: List[torch.Tensor], opts: AllgatherOptions
    ) -> Work:
        host_lists = [_host(outputs) for outputs in output_lists]
        self._gloo.allgather(host_lists, _host(inputs), opts).wait()
        for outputs, hosts in zip(output_lists, host_lists):
            _copy_back(outputs, hosts)
        return _CompletedWork(output_lists)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: AllgatherOptions) -> Work:
        host_output = output.cpu()
        self._gloo.all_gather_single(host_output, input.cpu(), opts).wait()
        output.copy_(host_output)
        return _CompletedWork([output])

    def all_gather_single_coalesced(
        self, outputs: List[torch.Tensor], inputs: List[torch.Tensor], opts: AllgatherOptions
    ) -> Work:
        for output, input in zip(outputs, inputs):
            self.all_gather_single(output, input, opts)
        return _CompletedWork(outputs)

    def reduce_scatter(
        self, outputs: List[torch.Tensor], input_lists: List[List[torch.Tensor]], opts: ReduceScatterOptions
    ) -> Work:
        host_outputs = _host(outputs)
        gloo_opts = ReduceScatterOptions()
        gloo_opts.reduceOp, average = _gloo_op(opts.reduceOp)
        gloo_opts.timeout = opts.timeout
        self._gloo.reduce_scatter(host_outputs, [_host(inputs) for inputs in input_lists], gloo_opts).wait()
        if average:
            for host in host_outputs:
                host.div_(self.size())
        _copy_back(outputs, host_outputs)
        return _CompletedWork(outputs)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: ReduceScatterOptions) -> Work:
        return self.reduce_scatter([output], [list(input.chunk(self.size()))], opts)

    def barrier(self, opts: BarrierOptions) -> Work:
        self._gloo.barrier(opts).wait()
        return _CompletedWork(None)


def register() -> None:
    """Register the backend ``"tpu"`` for the ``"tpu"`` device, as TorchTPU registers its own."""
    dist.Backend.register_backend(BACKEND_NAME, GlooBridge, devices=[BACKEND_NAME])
