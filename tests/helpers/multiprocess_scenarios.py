"""Training runs with several XLA processes, as a TPU VM runs them, for ``test_xla_multiprocess.py``.

Each scenario runs in a fresh interpreter (``run_scenario``) that plays the main process of a TPU host: it enters
``helpers.gloo_xla_collectives.simulated_tpu_host``, builds a ``Trainer(accelerator="tpu", devices="auto")`` or a
``LightningLite`` with the XLA strategy, and the launcher spawns ``WORLD_SIZE`` replica processes through the
harness. The scenario then runs the one-process reference in plain PyTorch on the CPU, on the same global batches,
and returns both with every rank's collective record.

Data: ``ROWS`` rows. For training, Lightning gives every rank a ``DistributedSampler`` that shuffles (seed 0, reseeded
every epoch); ``GlobalBatches`` gives the reference the concatenation of the ranks' ``s``-th batches as its ``s``-th
batch, so the mean loss over it is the average of the ranks' mean losses. For evaluation rank ``r`` gets rows
``r, r + N, ...``: together, every row once.
"""
import json
import os
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import pytorch_lightning as pl
from pytorch_lightning.utilities.rank_zero import rank_zero_only
import torch
import torch.nn.functional as F
import torchmetrics
from lightning_lite import LightningLite

WORLD_SIZE = 2
BATCH = 4  # rows per replica and step
ROWS = 48
FEATURES = 6
HIDDEN = 8
CLASSES = 3
LR = 0.2
SEED = 11


def make_net() -> torch.nn.Module:
    torch.manual_seed(SEED)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, CLASSES))


def dataset(rows: int = ROWS, skew: bool = False) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(SEED + 1)
    x = torch.randn(rows, FEATURES, generator=g)
    if skew:
        # the odd rows (rank 1's) are far from the even ones (rank 0's): the ranks' local losses differ a lot
        x[1::2] = x[1::2] * 10.0 + 5.0
    y = torch.randint(0, CLASSES, (rows,), generator=g)
    return torch.utils.data.TensorDataset(x, y)


def loader(batch: int = BATCH, **kwargs: Any) -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(dataset(**kwargs), batch_size=batch, shuffle=False)


class GlobalBatches(torch.utils.data.Sampler):
    """The batches of a one-process reference: batch ``s`` of epoch ``e`` is the concatenation, over the ranks, of
    the ``s``-th batch of ``BATCH`` rows that rank's ``DistributedSampler`` (as Lightning builds it for training)
    yields in epoch ``e``."""

    def __init__(self, rows: int = ROWS) -> None:
        self.rows = rows
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Any:
        per_rank = []
        for rank in range(WORLD_SIZE):
            sampler = torch.utils.data.DistributedSampler(range(self.rows), num_replicas=WORLD_SIZE, rank=rank,
                                                          shuffle=True, seed=0)
            sampler.set_epoch(self.epoch)
            per_rank.append(list(sampler))
        for s in range(len(self)):
            yield [i for indices in per_rank for i in indices[s * BATCH:(s + 1) * BATCH]]

    def __len__(self) -> int:
        return self.rows // (WORLD_SIZE * BATCH)


def global_loader(**kwargs: Any) -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(dataset(**kwargs), batch_sampler=GlobalBatches())


def cpu_state(module: torch.nn.Module) -> Dict[str, List]:
    return {k: v.detach().cpu().double().tolist() for k, v in module.state_dict().items()}


def max_diff(a: Dict[str, List], b: Dict[str, List]) -> float:
    assert a.keys() == b.keys(), (a.keys(), b.keys())
    return max(float((torch.tensor(a[k]) - torch.tensor(b[k])).abs().max()) for k in a)


def reference_sgd(steps: int, epochs: int = 1, clip: float = 0.0) -> torch.nn.Module:
    """One process, plain PyTorch on the CPU in float64, on the global batches."""
    net = make_net().double()
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    x, y = dataset().tensors
    sampler = GlobalBatches()
    done = 0
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for rows in sampler:
            if done == steps:
                return net
            opt.zero_grad()
            F.cross_entropy(net(x[rows].double()), y[rows]).backward()
            if clip:
                torch.nn.utils.clip_grad_norm_(net.parameters(), clip)
            opt.step()
            done += 1
    return net


class StepCounts(pl.Callback):
    """Records, in each replica, what every training step cost on the XLA device: compilations, executions and
    device-to-host transfers, minus what the harness's own transport of the collectives cost there."""

    def __init__(self, out_dir: str) -> None:
        self.out_dir = out_dir
        self.rows: List[Dict[str, int]] = []

    @staticmethod
    def _now() -> Dict[str, int]:
        from helpers import gloo_xla_collectives as harness
        from helpers.xla_metrics import XLACounters

        cost = harness.ACTIVE.transport_cost if harness.ACTIVE else {}
        return {
            "compiles": XLACounters.get("CompileTime") - cost.get("compiles", 0),
            "executions": XLACounters.get("ExecuteTime") - cost.get("executions", 0),
            "transfers": XLACounters.get("TransferFromDeviceTime") - cost.get("transfers", 0),
        }

    def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
        # read the running loss, as the progress bar does
        trainer.fit_loop.running_loss.mean()
        self.rows.append({"epoch": trainer.current_epoch, **self._now()})

    def on_train_end(self, trainer: Any, *args: Any) -> None:
        # between two steps of one epoch: validation and checkpoints run between epochs
        deltas = [
            {k: b[k] - a[k] for k in a if k != "epoch"}
            for a, b in zip(self.rows, self.rows[1:])
            if a["epoch"] == b["epoch"]
        ]
        report = {"counts": deltas, "params": cpu_state(trainer.lightning_module.net), **decisions(trainer)}
        Path(self.out_dir, f"rank{trainer.global_rank}.json").write_text(json.dumps(report))


def decisions(trainer: Any) -> Dict[str, Any]:
    """What the callbacks decided, and the metrics they decided from."""
    ckpt = trainer.checkpoint_callback
    return {
        "epochs": trainer.current_epoch,
        "stopped": bool(trainer.should_stop),
        "metrics": {k: float(v) for k, v in trainer.callback_metrics.items()},
        "best_score": float(ckpt.best_model_score),
        "best_path": os.path.basename(ckpt.best_model_path),
        "top_k": sorted(os.path.basename(p) for p in ckpt.best_k_models),
    }


class SyncDistModule(pl.LightningModule):
    """A progress-bar loss and a validation loss logged with ``sync_dist=True``, and a torchmetrics accuracy."""

    def __init__(self) -> None:
        super().__init__()
        self.net = make_net()
        self.val_acc = torchmetrics.classification.MulticlassAccuracy(num_classes=CLASSES, average="micro")

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("train_loss", loss, prog_bar=True, sync_dist=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        logits = self.net(x)
        self.log("val_loss", F.cross_entropy(logits, y), sync_dist=True)
        self.val_acc(logits, y)
        self.log("val_acc", self.val_acc)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("test_loss", F.cross_entropy(self.net(x), y), sync_dist=True)

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> torch.Tensor:
        return self.net(batch[0])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=LR)


def make_lbfgs(params: Any) -> torch.optim.Optimizer:
    return torch.optim.LBFGS(params, lr=1.0, max_iter=4, line_search_fn="strong_wolfe")


class LBFGSModule(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = make_net()

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return make_lbfgs(self.parameters())


def check_identical_sequences(records: List[List[Dict[str, Any]]]) -> None:
    """Every spawn of a scenario: no rank failed, and all ranks issued the same collectives."""
    for spawn in records:
        assert all(r["error"] is None for r in spawn), [r["error"] for r in spawn]
        first = spawn[0]["log"]
        assert first, "no collective was recorded: the run did not go through the harness"
        for rank, r in enumerate(spawn[1:], start=1):
            assert r["log"] == first, f"rank {rank} issued other collectives than rank 0"


class BranchModule(pl.LightningModule):
    """Rank 1 adds a layer's output that rank 0 never computes: on rank 0 that layer gets no gradient."""

    def __init__(self) -> None:
        super().__init__()
        self.net = make_net()
        self.extra = torch.nn.Linear(FEATURES, CLASSES)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        logits = self.net(x)
        if self.global_rank == 1:
            logits = logits + self.extra(x)
        return F.cross_entropy(logits, y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=LR)


class CollectivesLite(LightningLite):
    """Lite's collectives in every rank: a broadcast whose objects differ in pickle length between the ranks, and a
    torchmetrics metric updated with rank-dependent data. Each rank writes what it got to ``rank<R>.json``."""

    def run(self, out_dir: str, what: str) -> None:
        rank = self.global_rank
        report: Dict[str, Any] = {}
        if what == "broadcast":
            report["path"] = str(self.broadcast(Path("/tmp/" + "x" * (rank + 1))))
            report["from_1"] = self.broadcast({"rank": rank, "items": list(range(10 * rank))}, src=1)
        elif what == "metrics":
            module = make_net()  # Lite sets up a module with parameters
            module.mean = torchmetrics.MeanMetric()
            module.accuracy = torchmetrics.classification.MulticlassAccuracy(num_classes=CLASSES, average="micro")
            self.setup(module)
            x, y = dataset().tensors
            mine = slice(rank * 8, (rank + 1) * 8)
            module.mean.update(y[mine].float().to(self.device))
            module.accuracy.update((x[mine, :CLASSES] * 10).to(self.device), y[mine].to(self.device))
            report["mean"] = float(module.mean.compute())
            report["accuracy"] = float(module.accuracy.compute())
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(report))


def run_scenario(name: str, out_dir: str, timeout: float = 240, env: Optional[Dict[str, str]] = None,
                 fork_server: Optional[Callable] = None) -> Dict[str, Any]:
    """Run scenario ``name`` in a new process playing a TPU host's main process; return what it returned.
    ``env``: more environment variables for that process, which it sets itself (e.g. the GCS emulator's, ``gcs_env``;
    read when used); ``fork_server``: the fixture, to fork that process from a preloaded interpreter
    (``helpers.xla_subprocess.run_python``)."""
    from helpers.xla_subprocess import run_python

    # the folder this module is imported from, by the name it was imported as
    root = str(Path(__file__).resolve().parents[len(__name__.split(".")) - 1])
    code = (
        f"import importlib, sys; sys.path.insert(0, {root!r})\n"
        f"scenarios = importlib.import_module({__name__!r})\n"
        f"emit(scenarios.SCENARIOS[{name!r}]({out_dir!r}))\n"
    )
    # a TPU VM's main process: no PJRT_DEVICE (the harness answers the TPU queries), the runtime not started
    return run_python(code, env={"PJRT_DEVICE": None, "CPU_NUM_DEVICES": None}, timeout=timeout,
                      fork_server=fork_server, set_env=env)


def _host(out_dir: str, per_host: Optional[int] = None) -> Any:
    from helpers.gloo_xla_collectives import simulated_tpu_host

    return simulated_tpu_host(WORLD_SIZE, Path(out_dir) / "records", per_host=per_host)


def spawn_trainer(out_dir: str, **kwargs: Any) -> Any:
    """A ``Trainer(accelerator="tpu", devices="auto")`` for the simulated host, quiet and without checkpoints."""
    options = dict(logger=False, enable_checkpointing=False, enable_model_summary=False, enable_progress_bar=False,
                   default_root_dir=out_dir)
    options.update(kwargs)
    return pl.Trainer(accelerator="tpu", devices="auto", **options)


def _records(host: Any) -> List[List[Dict[str, Any]]]:
    return [[{"log": r["log"], "error": r["error"]} for r in records] for records in host.all_records]


# ---------------------------------------------------------------------------------------------------- scenarios
def fit_sync_dist(out_dir: str) -> Dict[str, Any]:
    """fit with validation: a progress-bar loss and a validation loss with ``sync_dist=True``, a torchmetrics
    accuracy, ``ModelCheckpoint(monitor=...)`` and ``EarlyStopping``; then the same on the CPU in one process."""

    def trainer(accelerator: str, devices: Any, train: Any, val: Any, root: str, counts: bool) -> Tuple[Any, Any, Any]:
        checkpoint = pl.callbacks.ModelCheckpoint(dirpath=root, monitor="val_acc", mode="max", save_top_k=2)
        stopping = pl.callbacks.EarlyStopping(monitor="val_loss", patience=1, min_delta=0.05)
        callbacks = [checkpoint, stopping] + ([StepCounts(out_dir)] if counts else [])
        model = SyncDistModule()
        t = pl.Trainer(accelerator=accelerator, devices=devices, max_epochs=6, logger=False, callbacks=callbacks,
                       enable_model_summary=False, enable_progress_bar=False, default_root_dir=root)
        t.fit(model, train, val)
        return t, model, checkpoint

    with _host(out_dir) as host:
        t, model, ckpt = trainer("tpu", "auto", loader(), loader(), os.path.join(out_dir, "xla"), counts=True)
        xla = {"strategy": type(t.strategy).__name__, "params": cpu_state(model.net)}
    t, model, ckpt = trainer("cpu", 1, global_loader(), loader(), os.path.join(out_dir, "cpu"), counts=False)
    cpu = {"params": cpu_state(model.net), **decisions(t)}
    ranks = [json.loads(Path(out_dir, f"rank{r}.json").read_text()) for r in range(WORLD_SIZE)]
    return {"xla": xla, "cpu": cpu, "ranks": ranks, "records": _records(host)}


def lbfgs(out_dir: str) -> Dict[str, Any]:
    """LBFGS with the strong-Wolfe line search, on data whose local losses differ a lot between the ranks: one step,
    whose line search already evaluates the closure a different number of times on each rank's own loss."""
    steps = 1

    with _host(out_dir) as host:
        model = LBFGSModule()
        t = spawn_trainer(out_dir, max_steps=steps)
        t.fit(model, loader(skew=True))
        xla = cpu_state(model.net)

    net = make_net().double()
    opt = make_lbfgs(net.parameters())
    x, y = dataset(skew=True).tensors
    for rows in list(GlobalBatches())[:steps]:
        def closure(rows: List[int] = rows) -> torch.Tensor:
            opt.zero_grad()
            loss = F.cross_entropy(net(x[rows].double()), y[rows])
            loss.backward()
            return loss

        opt.step(closure)
    return {"xla": xla, "cpu": cpu_state(net), "records": _records(host)}


def unused_branch(out_dir: str) -> Dict[str, Any]:
    """A layer that only rank 1's forward uses: every rank must all-reduce the same gradients (rank 0 a zero one)."""
    steps = 4
    with _host(out_dir) as host:
        model = BranchModule()
        t = spawn_trainer(out_dir, max_steps=steps)
        t.fit(model, loader())
        xla = cpu_state(model)

    reference = BranchModule().double()
    opt = torch.optim.SGD(reference.parameters(), lr=LR)
    x, y = dataset().tensors
    for rows in list(GlobalBatches())[:steps]:
        opt.zero_grad()
        losses = []
        for rank in range(WORLD_SIZE):
            mine = rows[rank * BATCH:(rank + 1) * BATCH]
            logits = reference.net(x[mine].double())
            if rank == 1:
                logits = logits + reference.extra(x[mine].double())
            losses.append(F.cross_entropy(logits, y[mine]))
        (sum(losses) / WORLD_SIZE).backward()
        opt.step()
    return {"xla": xla, "cpu": cpu_state(reference), "records": _records(host)}


def resume(out_dir: str) -> Dict[str, Any]:
    """One epoch, then a second Trainer resumes from ``last.ckpt`` for the second: the same weights and callback
    state as two epochs in one go (and as one process on the same global batches)."""
    root = os.path.join(out_dir, "checkpoints")

    def trainer(epochs: int) -> Any:
        checkpoint = pl.callbacks.ModelCheckpoint(dirpath=root, monitor="val_loss", save_last=True, save_top_k=2)
        return pl.Trainer(accelerator="tpu", devices="auto", max_epochs=epochs, logger=False, callbacks=[checkpoint],
                          enable_model_summary=False, enable_progress_bar=False, default_root_dir=out_dir)

    with _host(out_dir) as host:
        trainer(1).fit(SyncDistModule(), loader(), loader())
        model = SyncDistModule()
        second = trainer(2)
        second.fit(model, loader(), loader(), ckpt_path=os.path.join(root, "last.ckpt"))
        xla = cpu_state(model.net)
    last = torch.load(os.path.join(root, "last.ckpt"), map_location="cpu")
    state = [v for k, v in last["callbacks"].items() if k.startswith("ModelCheckpoint")][0]
    return {
        "xla": xla,
        "cpu": cpu_state(reference_sgd(steps=12, epochs=2).float()),
        "epoch": last["epoch"],
        "global_step": last["global_step"],
        "top_k": sorted(os.path.basename(p) for p in state["best_k_models"]),
        "records": _records(host),
    }


def evaluate(out_dir: str) -> Dict[str, Any]:
    """``validate``, ``test`` and ``predict`` on two processes, and what one process computes on all the rows."""
    with _host(out_dir) as host:
        model = SyncDistModule()
        t = spawn_trainer(out_dir, enable_checkpointing=True)
        validated = t.validate(model, loader())
        tested = t.test(model, loader())
        predictions = t.predict(model, loader())
    net = make_net()
    x, y = dataset().tensors
    logits = net(x).detach()
    # rank r predicts rows r, r + N, ...; batch k of rank r holds BATCH of them
    rows = [[(k * BATCH + j) * WORLD_SIZE + r for j in range(BATCH)] for k in range(ROWS // (WORLD_SIZE * BATCH))
            for r in range(WORLD_SIZE)]
    return {
        "xla": {"validate": validated, "test": tested, "predict": [p.tolist() for p in predictions]},
        "cpu": {
            "val_loss": float(F.cross_entropy(logits, y)),
            "val_acc": float((logits.argmax(-1) == y).float().mean()),
            "predict": [logits[r].tolist() for r in rows],
        },
        "records": _records(host),
    }


class RankInfo(pl.Callback):
    """Writes what a process believes of its place in the run, and the rank its distributed sampler serves."""

    def __init__(self, out_dir: str) -> None:
        self.out_dir = out_dir

    def on_train_start(self, trainer: Any, *args: Any) -> None:
        sampler = trainer.train_dataloader.loaders.sampler  # behind torch_xla's MpDeviceLoader
        info = {
            "global_rank": trainer.global_rank,
            "local_rank": trainer.local_rank,
            "node_rank": trainer.node_rank,
            "world_size": trainer.world_size,
            "sampler_rank": sampler.rank,
            "sampler_replicas": sampler.num_replicas,
            "rank_zero_only": rank_zero_only.rank,
        }
        Path(self.out_dir, f"rankinfo-{os.getpid()}.json").write_text(json.dumps(info))


def two_hosts(out_dir: str) -> Dict[str, Any]:
    """fit on a "pod" of two hosts with one process each (one main process stands for both): what each host's first
    process leaves in ``default_root_dir`` for its host's main process."""
    root = os.path.join(out_dir, "root")
    with _host(out_dir, per_host=1) as host:
        model = SyncDistModule()
        t = spawn_trainer(root, max_steps=2, limit_val_batches=0, callbacks=[RankInfo(out_dir)])
        t.fit(model, loader())
    infos = [json.loads(p.read_text()) for p in Path(out_dir).glob("rankinfo-*.json")]
    return {
        "left": sorted(n for n in os.listdir(root) if n.endswith(".ckpt")),
        "ranks": sorted(infos, key=lambda i: i["global_rank"]),
        "records": _records(host),
    }


def final_weights_in_object_storage(out_dir: str) -> Dict[str, Any]:
    """fit with ``default_root_dir`` an fsspec URL (``SCENARIO_ROOT_URL``, e.g. a bucket of the GCS emulator): the
    per-host final-weights file goes there and comes back into the main process's model, then is deleted. Run from
    ``out_dir``, so that a file written to a local path named after the URL would show there."""
    import fsspec

    url = os.environ["SCENARIO_ROOT_URL"]
    os.chdir(out_dir)
    with _host(out_dir) as host:
        model = SyncDistModule()
        spawn_trainer(url, max_steps=2, limit_val_batches=0).fit(model, loader())
    fs, root = fsspec.core.url_to_fs(url)
    fs.invalidate_cache()
    return {
        "xla": cpu_state(model.net),
        "cpu": cpu_state(reference_sgd(steps=2).float()),
        "left_in_storage": sorted(p[len(root) + 1:] for p in fs.find(root)),
        "local": sorted(os.listdir(out_dir)),
        "records": _records(host),
    }


def _lite(what: str) -> Callable[[str], Dict[str, Any]]:
    def scenario(out_dir: str) -> Dict[str, Any]:
        with _host(out_dir) as host:
            CollectivesLite(accelerator="tpu", devices="auto").run(out_dir, what)
        ranks = [json.loads(Path(out_dir, f"rank{r}.json").read_text()) for r in range(WORLD_SIZE)]
        return {"ranks": ranks, "records": _records(host)}

    return scenario


def training_thread_waits(out_dir: str) -> Dict[str, Any]:
    """The sync_dist pattern of ``helpers.xla_waits`` on the simulated host's processes (``tpu_spawn``), with the
    progress bar on: what each steady step cost each process's training thread."""
    from helpers.xla_waits import pattern_loader, pattern_module, WaitsProbe

    with _host(out_dir) as host:
        t = spawn_trainer(out_dir, max_epochs=1, enable_progress_bar=True, callbacks=[WaitsProbe(out_dir=out_dir)])
        t.fit(pattern_module("sync_dist"), pattern_loader(2 * 12))
        ranks = [json.loads(Path(out_dir, f"waits-rank{r}.json").read_text()) for r in range(WORLD_SIZE)]
        return {"ranks": ranks, "records": _records(host)}


def batch_types(out_dir: str) -> Dict[str, Any]:
    """``fit``, ``validate``, ``test`` and ``predict`` (``tpu_spawn``) and a Lite loop (its XLA strategy) on batches
    of every collection type (``helpers.xla_batch_types``): what each rank's steps got."""
    from helpers.xla_batch_types import LayoutsLite, trainer_run

    with _host(out_dir) as host:
        trainer_run(lambda **kwargs: spawn_trainer(out_dir, **kwargs), batches=4, out_dir=out_dir)
        LayoutsLite(accelerator="tpu", devices="auto").run(out_dir)
        strategy = type(spawn_trainer(out_dir).strategy).__name__
    return {
        "strategy": strategy,
        "ranks": [json.loads(Path(out_dir, f"seen-rank{r}.json").read_text()) for r in range(WORLD_SIZE)],
        "lite": [json.loads(Path(out_dir, f"lite-rank{r}.json").read_text()) for r in range(WORLD_SIZE)],
        "records": _records(host),
    }


class WideRows(torch.utils.data.Dataset):
    """``rows`` rows of 2048 features, made on demand (the dataset pickles small): with ``batch_size=1024`` each
    batch is 8 MB, whose copy to the device is still going on when a step ends."""

    def __init__(self, rows: int) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return self.rows

    def __getitem__(self, i: int) -> Any:
        return torch.full((2048,), float(i % 7)), torch.tensor(i % CLASSES)


class WideModule(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(2048, CLASSES)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=LR)


def stops_mid_epoch(out_dir: str) -> Dict[str, Any]:
    """``fit`` with ``max_steps=3`` in an epoch of 16 batches of 8 MB per process, three times: the workers stop while
    their loader is still copying batches ahead. Each run's exit codes, the threads each worker's function left
    running, and the error if a worker failed."""
    from helpers.gloo_xla_collectives import RankFailure

    runs = []
    with _host(out_dir) as host:
        for _ in range(3):
            loader = torch.utils.data.DataLoader(WideRows(WORLD_SIZE * 16 * 1024), batch_size=1024)
            error = None
            try:
                spawn_trainer(out_dir, max_steps=3, limit_val_batches=0).fit(WideModule(), loader)
            except RankFailure as err:
                error = str(err)[-3000:]
            runs.append({"exit_codes": host.exit_codes[-1], "error": error,
                         "threads_left": [r.get("threads_left") for r in host.records]})
    return {"runs": runs}


SCENARIOS: Dict[str, Callable[[str], Dict[str, Any]]] = {
    "stops_mid_epoch": stops_mid_epoch,
    "batch_types": batch_types,
    "two_hosts": two_hosts,
    "evaluate": evaluate,
    "resume": resume,
    "lite_broadcast": _lite("broadcast"),
    "lite_metrics": _lite("metrics"),
    "unused_branch": unused_branch,
    "fit_sync_dist": fit_sync_dist,
    "lbfgs": lbfgs,
    "final_weights_in_object_storage": final_weights_in_object_storage,
    "training_thread_waits": training_thread_waits,
}
