"""Run Lightning's multi-process XLA path on a machine without a TPU: N OS processes, each with its own XLA:CPU
device, whose collectives travel over gloo on loopback.

torch_xla does not run collectives between XLA:CPU processes (they hang: pytorch/xla#9089), and PJRT's own spawn
starts one *thread* per device on the CPU. Two pieces replace exactly that and nothing else:

``install(rank, world_size, init_method)``, in a replica process, replaces

- the transport of ``torch_xla.core.xla_model.all_reduce``: the operands are copied to the host, reduced over the
  processes by a gloo process group of the harness's own (SUM, MUL, MIN, MAX; ``torch.distributed``'s default group
  is *not* initialised, so code that asks ``torch.distributed.is_initialized()`` sees what it sees on a TPU), scaled,
  and copied back: into the same XLA tensors for a list, into a new XLA tensor for a single tensor;
- ``xm.all_gather`` and ``xm.reduce_scatter``, whose native lowerings would bypass the ``all_reduce`` above: they
  become torch_xla's own all-reduce based all-gather (what ``xm.all_gather`` does by default) and an all-reduce
  followed by this replica's slice;
- the replica queries of ``torch_xla.runtime``: ``world_size``, ``global_ordinal``, ``local_ordinal`` and
  ``global_device_count`` answer for this process in a world of ``world_size`` processes on one host.

Everything above the transport stays real: ``xm.collective_broadcast``, ``xm.rendezvous``/``xla_rendezvous`` (with
their ``torch_xla.sync()`` barriers and host reads) and ``xm.mesh_reduce`` run torch_xla's code, which reaches the
transport through ``xm.all_reduce``; Lightning's strategies, launchers and loops, the XLA device, its lazy tensors and
compiled graphs, and the optimizers are untouched.

``simulated_tpu_host(world_size)``, in the main process, presents a TPU host of ``world_size`` chips to Lightning by
answering its TPU hardware queries (chips on the PCI bus, libtpu present) and replaces ``xmp.spawn``: instead of
PJRT's process pool it forks ``world_size`` processes (the function and its arguments pickled first, as PJRT does
whatever the start method), each of which calls ``install`` and then the function with its rank, as PJRT's workers
do. The main process itself never starts the XLA runtime, as on a TPU VM.

Every collective is recorded, per rank, as ``op`` (the torch_xla calls that led to the transport, outermost first,
e.g. ``mesh_reduce[reduce]>rendezvous[reduce]>all_gather>all_reduce``), reduce type, scale, and the dtype and shape
of each operand. Before each transport the ranks exchange that record: if they differ, every rank raises
``CollectiveDivergence`` with both records and the calls before it, instead of waiting for a peer that will never
issue the same collective. A rank that finishes announces it the same way, so a peer still waiting on a collective
fails at once. Every wait is bounded by ``timeout`` (the gloo group's), and the spawner kills the processes at its
own deadline.

What the transport costs on the XLA device is counted apart (``transport_cost``): reading the operands runs the
pending graph and transfers it to the host, where a TPU would keep the collective inside the step's graph. Counts
of what the *step* costs are the device counters minus that.

Known limit: the transport also replaces torch_xla's in-place update of the reduced tensors (a host round trip and
``copy_``). A bug in that update is invisible here: in particular the loss of the all-reduce of ``p.grad.data`` under
functionalization after an in-place edit of the gradients through an alias (``docs/upstream-bugs.md``). Numeric
single-process tests with a simulated world size cover that.
"""
import contextlib
import datetime
import json
import os
import pickle
import signal
import socket
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Union

import torch
import torch.distributed as dist

_REDUCE_OPS = {"sum": "SUM", "mul": "PRODUCT", "min": "MIN", "max": "MAX"}
_COST_COUNTERS = {"executions": "ExecuteTime", "transfers": "TransferFromDeviceTime", "compiles": "CompileTime"}
# set while the transport carries a collective through the host (``in_transport``)
_transport = threading.local()


def in_transport() -> bool:
    """Whether this thread is inside the transport of a collective: its host reads and copies are the harness's,
    where a TPU keeps the collective inside the step's graph (``helpers.xla_waits`` leaves them out)."""
    return getattr(_transport, "active", False)


# the harness installed in this process, if any
ACTIVE: Optional["GlooXlaCollectives"] = None


class CollectiveDivergence(AssertionError):
    """The replicas issued different collectives: on a TPU, a hang."""


class GlooXlaCollectives:
    """The replacement installed in one replica process.

    ``calls`` holds, for each transport (each ``xm.all_reduce`` that reached gloo), how many tensors it reduced;
    ``log`` the record of every transport; ``transport_cost`` the device executions, transfers and compilations the
    transport itself caused.
    """

    def __init__(self, rank: int, world_size: int, group: Any, timeout: float) -> None:
        self.rank = rank
        self.world_size = world_size
        self.timeout = timeout
        self.calls: List[int] = []
        self.log: List[Dict[str, Any]] = []
        self.transport_cost = {k: 0 for k in _COST_COUNTERS}
        self._group = group
        self._path: List[str] = []
        self._saved: Dict[Any, Dict[str, Callable]] = {}

    # ------------------------------------------------------------------ the gloo group, host side
    def _gloo_all_reduce(self, host: torch.Tensor, op: str = "SUM") -> None:
        opts = dist.AllreduceOptions()
        opts.reduceOp = getattr(dist.ReduceOp, op)
        self._group.allreduce([host], opts).wait(datetime.timedelta(seconds=self.timeout))

    def _gloo_all_gather_bytes(self, payload: bytes) -> List[bytes]:
        size = torch.tensor([len(payload)], dtype=torch.int64)
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world_size)]
        self._group.allgather([sizes], [size]).wait(datetime.timedelta(seconds=self.timeout))
        longest = int(max(int(s) for s in sizes))
        data = torch.zeros(longest, dtype=torch.uint8)
        data[: len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8) if payload else data[:0]
        out = [torch.zeros(longest, dtype=torch.uint8) for _ in range(self.world_size)]
        self._group.allgather([out], [data]).wait(datetime.timedelta(seconds=self.timeout))
        return [bytes(o[: int(s)].tolist()) for o, s in zip(out, sizes)]

    def _agree(self, entry: Dict[str, Any]) -> None:
        """Exchange ``entry`` with every rank; raise ``CollectiveDivergence`` on all of them if any differs."""
        entries = [json.loads(b) for b in self._gloo_all_gather_bytes(json.dumps(entry, sort_keys=True).encode())]
        if any(e != entries[0] for e in entries):
            index = len(self.log)
            lines = [f"collective #{index} differs across the {self.world_size} ranks (on a TPU: a hang):"]
            lines += [f"  rank {r}: {e}" for r, e in enumerate(entries)]
            lines.append(f"  the {min(index, 5)} collectives before it on rank {self.rank}:")
            lines += [f"    #{index - len(self.log[-5:]) + i}: {e}" for i, e in enumerate(self.log[-5:])]
            raise CollectiveDivergence("\n".join(lines))

    # ------------------------------------------------------------------ what replaces torch_xla's functions
    @contextlib.contextmanager
    def _carrying(self) -> Iterator[None]:
        _transport.active = True
        try:
            yield
        finally:
            _transport.active = False

    @contextlib.contextmanager
    def _called(self, name: str) -> Iterator[None]:
        self._path.append(name)
        try:
            yield
        finally:
            self._path.pop()

    def all_reduce(
        self,
        reduce_type: str,
        inputs: Union[torch.Tensor, Sequence[torch.Tensor]],
        scale: float = 1.0,
        groups: Optional[List[List[int]]] = None,
        pin_layout: bool = True,
    ) -> Union[torch.Tensor, Sequence[torch.Tensor]]:
        """Same contract as ``xm.all_reduce``: a list is reduced in place and returned, a single tensor gives a new
        reduced tensor."""
        if reduce_type not in _REDUCE_OPS:
            raise NotImplementedError(f"gloo harness: reduce type {reduce_type!r} is not carried")
        if groups:
            raise NotImplementedError(f"gloo harness: replica groups are not carried ({groups!r})")
        single = isinstance(inputs, torch.Tensor)
        tensors = [inputs] if single else list(inputs)
        entry = {
            "op": ">".join(self._path + ["all_reduce"]),
            "reduce": reduce_type,
            "scale": float(scale),
            "tensors": [[str(t.dtype).replace("torch.", ""), list(t.shape)] for t in tensors],
        }
        self._agree(entry)
        self.log.append(entry)
        self.calls.append(len(tensors))
        if not tensors:
            return inputs
        with self._carrying():
            return self._carry(reduce_type, inputs, tensors, scale, single)

    def _carry(self, reduce_type: str, inputs: Any, tensors: List[torch.Tensor], scale: float, single: bool) -> Any:
        from helpers.xla_metrics import XLACounters

        before = {k: XLACounters.get(v) for k, v in _COST_COUNTERS.items()}
        results: List[torch.Tensor] = [None] * len(tensors)  # type: ignore[list-item]
        by_dtype: Dict[torch.dtype, List[int]] = {}
        for i, t in enumerate(tensors):
            by_dtype.setdefault(t.dtype, []).append(i)
        for dtype, indices in by_dtype.items():
            # one graph and one device-to-host transfer per dtype, one collective over the flat buffer
            host = torch.cat([tensors[i].detach().reshape(-1) for i in indices]).cpu()
            self._gloo_all_reduce(host, _REDUCE_OPS[reduce_type])
            if scale != 1.0:
                host = host * scale if host.is_floating_point() else (host * scale).to(dtype)
            offset = 0
            for i in indices:
                results[i] = host[offset:offset + tensors[i].numel()].view(tensors[i].shape)
                offset += tensors[i].numel()
        for key, name in _COST_COUNTERS.items():
            self.transport_cost[key] += XLACounters.get(name) - before[key]
        if single:
            return results[0].to(device=inputs.device, dtype=inputs.dtype)
        for t, r in zip(tensors, results):
            t.copy_(r.to(t.device))
        return inputs

    def _traced(self, name: str, original: Callable, label: Callable[..., str] = lambda *a, **k: "") -> Callable:
        def call(*args: Any, **kwargs: Any) -> Any:
            tag = label(*args, **kwargs)
            with self._called(f"{name}[{tag}]" if tag else name):
                return original(*args, **kwargs)

        return call

    def all_gather(self, value: torch.Tensor, dim: int = 0, groups: Optional[List[List[int]]] = None,
                   output: Optional[torch.Tensor] = None, pin_layout: bool = True, **_: Any) -> torch.Tensor:
        import torch_xla.core.xla_model as xm

        if not isinstance(value, torch.Tensor):
            raise NotImplementedError("gloo harness: all_gather of a list of tensors is not carried")
        with self._called("all_gather"):
            result = xm._all_gather_using_all_reduce(value, dim=dim, groups=groups, pin_layout=pin_layout)
        if output is not None:
            output.copy_(result)
            return output
        return result

    def reduce_scatter(self, reduce_type: str, input: torch.Tensor, scale: float, scatter_dim: int,
                       shard_count: int, groups: Optional[List[List[int]]] = None,
                       output: Optional[torch.Tensor] = None, pin_layout: bool = True, **_: Any) -> torch.Tensor:
        if not isinstance(input, torch.Tensor) or shard_count != self.world_size:
            raise NotImplementedError("gloo harness: reduce_scatter of one tensor over all replicas only")
        with self._called("reduce_scatter"):
            reduced = self.all_reduce(reduce_type, input, scale=scale, groups=groups)
        result = reduced.chunk(shard_count, dim=scatter_dim)[self.rank]
        if output is not None:
            output.copy_(result)
            return output
        return result

    def finish(self) -> None:
        """Tell the other ranks this one issues no more collectives: a peer still inside one fails at once."""
        self._agree({"op": "end of the run", "collectives issued": len(self.log)})

    def _replace(self, module: Any, name: str, value: Callable) -> None:
        self._saved.setdefault(module, {})[name] = getattr(module, name)
        setattr(module, name, value)

    def uninstall(self) -> None:
        """Put the torch_xla functions back."""
        for module, originals in self._saved.items():
            for name, value in originals.items():
                setattr(module, name, value)
        self._saved.clear()


def install(rank: int, world_size: int, init_method: str, timeout: float = 60.0,
            per_host: Optional[int] = None) -> GlooXlaCollectives:
    """Join the harness's gloo group at ``init_method`` (``tcp://HOST:PORT``, served by rank 0) as ``rank`` and route
    torch_xla's collectives and replica queries through it. ``timeout`` (seconds) bounds the rendezvous and every
    collective, so a missing peer fails the run instead of hanging it. ``per_host`` processes make a host (all of
    them by default): the local ordinal and the host index follow from it, as on a pod."""
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr

    host, port = init_method[len("tcp://"):].rsplit(":", 1)
    span = datetime.timedelta(seconds=timeout)
    store = dist.TCPStore(host, int(port), world_size, rank == 0, timeout=span)
    group = dist.ProcessGroupGloo(store, rank, world_size, span)
    harness = GlooXlaCollectives(rank, world_size, group, timeout)
    harness._replace(xr, "world_size", lambda: world_size)
    harness._replace(xr, "global_ordinal", lambda: rank)
    per_host = per_host or world_size
    harness._replace(xr, "local_ordinal", lambda: rank % per_host)
    harness._replace(xr, "host_index", lambda: rank // per_host)
    harness._replace(xr, "global_device_count", lambda: world_size)
    harness._replace(xm, "all_reduce", harness.all_reduce)
    harness._replace(xm, "all_gather", harness.all_gather)
    harness._replace(xm, "reduce_scatter", harness.reduce_scatter)
    harness._replace(xm, "collective_broadcast",
                     harness._traced("collective_broadcast", xm.collective_broadcast))
    harness._replace(xm, "xla_rendezvous", harness._traced("rendezvous", xm.xla_rendezvous, lambda *a, **k: k.get("tag") or ""))
    harness._replace(xm, "mesh_reduce", harness._traced("mesh_reduce", xm.mesh_reduce, lambda tag, *a, **k: tag))
    global ACTIVE
    ACTIVE = harness
    return harness


# ---------------------------------------------------------------------------------------------- the main process
def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RankFailure(AssertionError):
    """A replica process failed, was killed at the deadline, or the replicas' collectives diverged."""


class SimulatedTPUHost:
    """What ``simulated_tpu_host`` installed; ``records`` holds each rank's record of its last spawn."""

    def __init__(self, world_size: int, record_dir: Path, timeout: float, deadline: float,
                 per_host: Optional[int] = None) -> None:
        self.world_size = world_size
        self.per_host = per_host
        self.record_dir = record_dir
        self.timeout = timeout
        self.deadline = deadline
        self.spawns = 0
        self.records: List[Dict[str, Any]] = []
        self.all_records: List[List[Dict[str, Any]]] = []
        # each spawn's exit codes of its replica processes, rank by rank
        self.exit_codes: List[List[Optional[int]]] = []

    def spawn(self, fn: Callable, args: tuple = (), nprocs: Optional[int] = None, join: bool = True,
              daemon: bool = False, start_method: str = "spawn") -> None:
        """``xmp.spawn`` with PJRT's arguments: ``nprocs=None`` starts one process per chip of the host."""
        import torch_xla

        if nprocs not in (None, 1):
            raise ValueError(f"Unsupported nprocs ({nprocs}). Please use nprocs=1 or None (default).")
        if torch_xla._XLAC._xla_runtime_is_initialized():
            raise RuntimeError("Runtime is already initialized. Do not use the XLA device before calling xmp.spawn.")
        if nprocs == 1:
            raise NotImplementedError("simulated TPU host: nprocs=1 runs in the calling process, not through here")
        payload = pickle.dumps((fn, args))  # PJRT pickles them whatever the start method
        init_method = f"tcp://127.0.0.1:{free_port()}"
        self.spawns += 1
        ctx = torch.multiprocessing.get_context(start_method)
        procs = []
        for rank in range(self.world_size):
            out = self.record_dir / f"spawn{self.spawns}-rank{rank}.json"
            procs.append(ctx.Process(target=_replica_main,
                                     args=(rank, self.world_size, init_method, payload, str(out), self.timeout,
                                           self.per_host)))
        for p in procs:
            p.start()
        end = time.monotonic() + self.deadline
        failed = False
        while any(p.is_alive() for p in procs) and time.monotonic() < end:
            time.sleep(0.05)
            # a rank that failed leaves its peers inside a collective until the gloo timeout: stop them now
            if any(p.exitcode not in (None, 0) for p in procs):
                failed = True
                time.sleep(2.0)  # let the peers raise their own divergence error if they have one
                break
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join()
        self.records = [self._read(self.record_dir / f"spawn{self.spawns}-rank{r}.json") for r in range(self.world_size)]
        self.all_records.append(self.records)
        codes = [p.exitcode for p in procs]
        self.exit_codes.append(codes)
        if failed or codes != [0] * self.world_size:
            report = "\n".join(
                f"--- rank {r} (exit code {c}):\n{(rec.get('error') or '(no error recorded: killed)')[-3000:]}"
                for r, (c, rec) in enumerate(zip(codes, self.records))
            )
            raise RankFailure(f"spawn #{self.spawns}: replica processes failed\n{report}")
        check_same_collectives(self.records)

    @staticmethod
    def _read(path: Path) -> Dict[str, Any]:
        return json.loads(path.read_text()) if path.exists() else {"log": [], "error": None}


def check_same_collectives(records: List[Dict[str, Any]]) -> None:
    """Every rank issued the same sequence of collectives (op, reduce type, scale, dtypes and shapes)."""
    first = records[0]["log"]
    for rank, rec in enumerate(records[1:], start=1):
        if rec["log"] != first:
            pairs = [f"#{i}: rank 0 {a} | rank {rank} {b}" for i, (a, b) in enumerate(zip(first, rec["log"])) if a != b]
            raise CollectiveDivergence(
                f"rank 0 issued {len(first)} collectives, rank {rank} {len(rec['log'])}; first differences:\n"
                + "\n".join(pairs[:5])
            )


def _replica_main(rank: int, world_size: int, init_method: str, payload: bytes, out: str, timeout: float,
                  per_host: Optional[int]) -> None:
    # a runner started in the background has SIGINT ignored, and children inherit it
    signal.signal(signal.SIGINT, signal.default_int_handler)
    record: Dict[str, Any] = {"rank": rank, "log": [], "transport_cost": {}, "error": None}
    harness = None
    code = 0
    try:
        harness = install(rank, world_size, init_method, timeout, per_host)
        # PJRT's worker setup (`torch_xla._internal.pjrt.initialize_multiprocess`) starts the runtime before it calls
        # the function, so ranks read from `torch_xla.runtime` are final from the start: do the same
        import torch_xla

        torch_xla.device()
        fn, args = pickle.loads(payload)
        before = set(threading.enumerate())
        fn(rank, *args)
        # the threads the function started and left running (a device loader's, Lightning's): in a real worker they
        # are still inside torch_xla when the process goes away
        record["threads_left"] = sorted(t.name for t in threading.enumerate() if t.is_alive() and t not in before)
        harness.finish()
    except BaseException:
        record["error"] = traceback.format_exc()
        sys.stderr.write(f"[rank {rank}] {record['error']}")
        code = 1
    finally:
        if harness is not None:
            record["log"] = harness.log
            record["transport_cost"] = harness.transport_cost
            record["calls"] = harness.calls
        Path(out).write_text(json.dumps(record))
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


@contextlib.contextmanager
def simulated_tpu_host(world_size: int, record_dir: Union[str, Path], timeout: float = 60.0,
                       deadline: float = 180.0, per_host: Optional[int] = None) -> Iterator[SimulatedTPUHost]:
    """In the main process: present a TPU host with ``world_size`` chips to Lightning and spawn through the harness.
    With ``per_host``, the replicas see a pod of ``world_size / per_host`` hosts instead (local ordinals and host
    indices as on a pod), while one main process stands for all of them.

    Call it before the ``Trainer`` or ``LightningLite`` is built, with ``PJRT_DEVICE`` unset (as on a TPU VM) and
    without having started the XLA runtime. The TPU queries answered here are hardware queries only: the chips on the
    PCI bus and whether libtpu is installed.
    """
    import torch_xla.distributed.xla_multiprocessing as xmp

    import lightning_lite.accelerators.tpu as tpu_accelerator
    import lightning_lite.strategies.launchers.xla as lite_launcher

    record_dir = Path(record_dir)
    record_dir.mkdir(parents=True, exist_ok=True)
    host = SimulatedTPUHost(world_size, record_dir, timeout, deadline, per_host)
    saved = [
        (tpu_accelerator, "_tpu_chip_count", lambda: world_size),
        (tpu_accelerator, "_libtpu_found", lambda: True),
        (lite_launcher, "_tpu_devices_per_chip", lambda: 1),
        (xmp, "spawn", host.spawn),
    ]
    originals = [(m, n, getattr(m, n)) for m, n, _ in saved]
    for module, name, value in saved:
        setattr(module, name, value)
    try:
        yield host
    finally:
        for module, name, value in originals:
            setattr(module, name, value)
