"""Two OS processes standing for the two hosts of a TPU pod slice, each with its own SPMD XLA:CPU runtime, saving
sharded checkpoints together into one bucket (``state_dict_type="sharded"`` of the SPMD strategies).

On a TPU pod every host runs the same program, its XLA runtime reports ``process_count()`` hosts and this host's
``process_index()``, and the strategy connects the hosts over a gloo group initialised with torch_xla's ``xla://``
init method (``MASTER_ADDR``, ``MASTER_PORT``; rank = process index). Here each process is its own one-host XLA:CPU
runtime (XLA:CPU processes cannot run collectives with each other): the two runtime queries ``process_count`` and
``process_index`` of ``torch_xla.runtime`` are the only thing stood in for (2, and the host's index), after the
runtime started. Everything else is real: torch_xla's ``xla://`` rendezvous, the gloo group over loopback,
``torch.distributed.checkpoint`` with torch_xla's SPMD planner, gcsfs against the GCS emulator, the strategy's own
save, load and remove. As XLA:CPU hosts, each process holds every shard of the model (its mesh is its own devices),
so what a real pod's hosts hold apart, these two hold alike: the save plan spreads those writes over the hosts.

``run_pod(...)`` runs one process per host, each forked by a fork server of its own (``helpers.fork_server``: the
imports are paid once per host, not once per run), running ``host_main``; each host writes a JSON report to
``<report_dir>/host<rank>.json`` at the end. Every wait is bounded: the gloo group's timeout (``GROUP_TIMEOUT``), the
runs' timeout, and a host told to stop inside its writer waits at most ``HANG`` seconds to be killed.
"""
import json
import os
import signal
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Dict, List, Optional

HOSTS = 2
DEVICES = 2  # XLA:CPU devices of each host's own mesh
GROUP_TIMEOUT = 60.0  # seconds: every wait of one host for the other (gloo)
HANG = 60.0  # seconds a host told to stop inside its writer waits to be killed

_HOST = """
from helpers.xla_spmd_pod import host_main
host_main({rank}, {port}, {url!r}, {report_dir!r}, {script!r})
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def host_env(rank: int, env: Dict[str, str]) -> Dict[str, str]:
    """The environment of host ``rank`` (``env`` added): one XLA:CPU runtime of ``DEVICES`` devices. ``POD_HOST``
    names the host, so that each host gets a fork server of its own (``helpers.fork_server``)."""
    return {"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": str(DEVICES), "POD_HOST": str(rank), **env}


def run_pod(servers: List[Any], url: str, report_dir: str, scripts: List[List[str]],
            kill_in_writer: Optional[int] = None, timeout: float = 240) -> Dict[str, Any]:
    """Run one process per host, forked by its fork server (``servers[rank]``), each with its ``scripts[rank]`` (see
    ``host_main``), to their end, at most ``timeout`` seconds. With ``kill_in_writer``, that host is killed with
    ``SIGKILL`` once it announced that it waits inside its writer. Returns the hosts' exit statuses, their reports
    (None for a host killed before it wrote one), their output, and the bucket's objects under ``<url>/last.ckpt`` at
    the moment of the kill."""
    from helpers.gcs_emulator import gcs_objects

    port = free_port()
    with ThreadPoolExecutor(len(servers)) as pool:
        runs = [pool.submit(server.run, _HOST.format(rank=rank, port=port, url=url, report_dir=report_dir,
                                                     script=scripts[rank]), [], timeout)
                for rank, server in enumerate(servers)]
        at_kill = None
        if kill_in_writer is not None:
            announced = Path(report_dir, f"host{kill_in_writer}.in-writer")
            deadline = time.monotonic() + timeout
            while not announced.exists() or not announced.read_text().strip():
                if any(run.done() for run in runs):
                    break  # a host ended first: its result says why
                if time.monotonic() > deadline:
                    raise AssertionError(f"host {kill_in_writer} did not reach its writer within {timeout} s")
                time.sleep(0.05)
            else:
                at_kill = gcs_objects(f"{url}/last.ckpt")
                os.kill(int(announced.read_text()), signal.SIGKILL)
        done = [run.result() for run in runs]
    reports = []
    for rank in range(len(servers)):
        path = Path(report_dir, f"host{rank}.json")
        reports.append(json.loads(path.read_text()) if path.exists() else None)
    return {
        "returncodes": [d.returncode for d in done],
        "reports": reports,
        "at_kill": at_kill,
        "output": "\n".join(f"--- host {r}\n{d.stdout[-3000:]}\n{d.stderr[-6000:]}" for r, d in enumerate(done)),
    }


def _module():
    import torch
    import torchmetrics

    from pytorch_lightning import LightningModule

    class Net(LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
            self.total = torchmetrics.SumMetric()

        def forward(self, x):
            return self.net(x)

    return Net()


def host_main(rank: int, port: int, url: str, report_dir: str, script: List[str]) -> None:
    """One host of the pod. ``script`` is a list of steps, each run in order:

    - ``"train"``: one SGD step (momentum) on a batch that depends on the step's number, the same on every host;
    - ``"save"``: ``strategy.save_checkpoint`` of the model and optimizer state into ``<url>/last.ckpt``;
    - ``"hang-in-writer"``: the next save stops inside this host's writer once its shards are written, announces it
      by writing its process id into ``<report_dir>/host<rank>.in-writer`` and waits (at most ``HANG`` s) to be
      killed;
    - ``"load"``: ``strategy.load_checkpoint`` from ``<url>/last.ckpt`` into a model and optimizer made afresh;
    - ``"remove"``: ``strategy.remove_checkpoint(<url>/last.ckpt)``;
    - ``"setup"``: what the strategy's ``setup`` does for sharded checkpoints (it needs a Trainer otherwise): connect
      the hosts, then a torchmetrics ``SumMetric`` of the model, updated once with 3.0 on each host, computed;
    - ``"save-unshared"``: a save into the relative local path ``unshared/last.ckpt`` from a working directory of
      this host's own (``<report_dir>/host<rank>``): storage the hosts do not share, as a local disk on a pod. The
      report lists what that directory holds afterwards.

    The report: what each step gave (the weights after a train or load, the error of a failed save) and the paths
    this host removed recursively (versions, checkpoints)."""
    import datetime

    import gcsfs
    import torch
    import torch_xla
    import torch_xla.runtime as xr
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

    import lightning_lite.strategies.xla_spmd as lite_spmd
    from pytorch_lightning.accelerators import TPUAccelerator
    from pytorch_lightning.strategies import XLASPMDFSDPStrategy

    from helpers.xla_spmd_runs import listing

    # torch_xla's ``xla://`` rendezvous reads where process 0 listens from the environment
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    lite_spmd._GROUP_TIMEOUT = datetime.timedelta(seconds=GROUP_TIMEOUT)

    removed: List[str] = []
    real_rm = gcsfs.GCSFileSystem.rm

    def recording_rm(self, path, recursive=False, *args, **kwargs):
        # the removals of a version or a checkpoint; the writers' renames (copy, then remove) remove single objects
        if recursive:
            removed.extend(path if isinstance(path, list) else [path])
        return real_rm(self, path, recursive, *args, **kwargs)

    gcsfs.GCSFileSystem.rm = recording_rm

    real_write_data = FsspecWriter.write_data
    hang = {"armed": False}

    def write_data(self, plan, planner):
        future = real_write_data(self, plan, planner)
        future.wait()  # this host's shards are written
        if hang["armed"]:
            announce = Path(report_dir, f"host{rank}.in-writer")
            announce.with_suffix(".partial").write_text(str(os.getpid()))
            announce.with_suffix(".partial").rename(announce)
            time.sleep(HANG)
            raise RuntimeError("the host was not killed while it waited in its writer")
        return future

    FsspecWriter.write_data = write_data

    strategy = XLASPMDFSDPStrategy(state_dict_type="sharded")
    strategy.accelerator = TPUAccelerator()
    model = _module()
    strategy.connect(model)
    strategy.setup_environment()  # SPMD on, the runtime started, the mesh of this host's devices built
    # the stand-in: from here on the runtime reports the pod's hosts, as a pod's runtime does (see the docstring)
    assert torch_xla._XLAC._xla_runtime_is_initialized() and xr.process_count() == 1
    xr.process_count = lambda: HOSTS
    xr.process_index = lambda: rank
    strategy.model_to_device()
    strategy._shard_module()

    def optimizer_for(module):
        return torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.9)

    strategy.optimizers = [optimizer_for(model)]
    path = f"{url}/last.ckpt"
    steps: List[Dict[str, Any]] = []

    def weights():
        return {k: v.detach().cpu().tolist() for k, v in strategy.lightning_module.state_dict().items()}

    def report() -> None:
        json.dump({"rank": rank, "steps": steps, "removed": removed},
                  open(os.path.join(report_dir, f"host{rank}.json"), "w"))

    trained = 0
    for step in script:
        try:
            if step == "train":
                g = torch.Generator().manual_seed(trained)
                x, y = torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)
                optimizer = strategy.optimizers[0]
                optimizer.zero_grad()
                device = strategy.root_device
                loss = torch.nn.functional.cross_entropy(strategy.lightning_module(x.to(device)), y.to(device))
                loss.backward()
                optimizer.step()
                torch_xla.sync()
                trained += 1
                steps.append({"step": step, "weights": weights()})
            elif step == "save":
                checkpoint = {"state_dict": strategy.lightning_module.state_dict(),
                              "optimizer_states": [o.state_dict() for o in strategy.optimizers], "step": trained}
                strategy.save_checkpoint(checkpoint, path)
                # process 0 returns once it committed and removed the older versions: what is in the bucket now
                steps.append({"step": step, "files": listing(path) if rank == 0 else None})
            elif step == "hang-in-writer":
                hang["armed"] = True
                steps.append({"step": step})
            elif step == "load":
                fresh = _module()
                strategy.connect(fresh)
                strategy.model_to_device()
                strategy._shard_module()
                strategy.optimizers = [optimizer_for(fresh)]
                loaded = strategy.load_checkpoint(path)
                steps.append({"step": step, "weights": weights(), "loaded_step": loaded["step"],
                              "momentum_buffers": len(loaded["optimizer_states"][0]["state"])})
            elif step == "save-unshared":
                own = Path(report_dir, f"host{rank}")
                own.mkdir()
                os.chdir(own)
                checkpoint = {"state_dict": strategy.lightning_module.state_dict(), "step": trained}
                try:
                    strategy.save_checkpoint(checkpoint, "unshared/last.ckpt")
                finally:
                    steps.append({"step": step, "files": listing(str(own / "unshared"))})
            elif step == "setup":
                strategy._connect_hosts_for_sharded_checkpoints()
                metric = strategy.lightning_module.total
                metric.update(torch.tensor(3.0, device=strategy.root_device))
                steps.append({"step": step, "sum": float(metric.compute())})
            elif step == "remove":
                strategy.remove_checkpoint(path)
                steps.append({"step": step})
            else:
                raise ValueError(step)
        except BaseException as err:
            if steps and steps[-1]["step"] == step and "error" not in steps[-1]:
                steps[-1]["error"] = f"{type(err).__name__}: {err}"
            else:
                steps.append({"step": step, "error": f"{type(err).__name__}: {err}"})
            report()
            raise
    report()
