"""Wall time per step on a device-bound model: the fork's Trainer, torch_xla's idiom and Lightning 2.6.6.

When the device's step is longer than the host's Python, what decides the time per step is whether the host keeps
the device busy: a host read of the loss on the training thread waits for every graph in flight, and so does a
host-to-device copy of the next batch (docs/overlap.md, "The device never waits for the Trainer"). torch_xla's
own idiom keeps both off the training thread: ``MpDeviceLoader`` copies the batches to the device on background
threads and the loss is read in an asynchronous step closure (``xm.add_step_closure(fn, args=(loss,),
run_async=True)``). This benchmark measures how close the fork's Trainer (``self.log("train_loss", loss,
prog_bar=True)``, progress bar on, default callbacks) comes to that, and how it compares with Lightning 2.6.6's.

The model is an MLP 768-768-768-768-10, batch 256, SGD. On XLA:CPU every worker runs with one XLA compute thread
(``XLA_FLAGS=--xla_cpu_multi_thread_eigen=false``), so the "device" is one core and the host's Python the other; a
step then takes about 40 ms on the 2-core build machine (torch_xla's idiom, which keeps the device busy). Each row
runs in a fresh process and reports the median wall time of its steady steps (after a warm-up that holds the
compilation). Whole-process timings on a shared machine move from one minute to the next, and have been bimodal from
run to run, so rows are compared only within a round: a round runs every row once, the order reversed every other
round, and each ratio (fork / idiom, fork / 2.6.6, fork / fork: the A/A pair that shows the method's spread) is taken
within the round; the figures are the medians over rounds, with their min..max.

    python -m bench.device_bench [--rounds 5] [--steps 100] [--warmup 20] [--quick]

A worker (one row, one process) is this module run with ``--worker ROW``. No test asserts these times; the tests check
the method (tests/tests_fork/test_device_bench.py).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .report import stamp, write_json, write_markdown_page
from .trees import PL266_VERSION, ROOT, default_pjrt_device, fork_src, install_pl266, module_command, row_env
LAYERS = [768, 768, 768, 768, 10]
BATCH = 256
# table order; the base order of a round (reversed every other round). "fork-aa" is a second run of the fork's
# Trainer, the A/A row: fork / fork-aa shows what the method reads as a difference between two identical rows
ROWS: Tuple[str, ...] = ("idiom", "fork", "pl266", "fork-aa")
LABELS = {
    "idiom": "torch_xla's idiom: `MpDeviceLoader`, loss read in an async step closure, `torch_xla.sync()`",
    "fork": "fork Trainer, loss on the progress bar",
    "pl266": "Lightning 2.6.6 Trainer, the same module",
    "fork-aa": "fork Trainer again (A/A)",
}
# (row A, row B, target of A / B or None)
RATIOS: List[Tuple[str, str, Optional[float]]] = [("fork", "idiom", 1.05), ("fork", "pl266", 0.80),
                                                   ("fork", "fork-aa", None), ("idiom", "pl266", None)]
RATIO_LABELS = {("fork", "idiom"): "fork / idiom", ("fork", "pl266"): "fork / Lightning 2.6.6",
                ("fork", "fork-aa"): "fork / fork (A/A)", ("idiom", "pl266"): "idiom / Lightning 2.6.6"}
# what a ratio without a target is for: idiom / 2.6.6 is as low as fork / 2.6.6 can go while the fork is no faster
# than torch_xla's own loop, so it tells whether the 2.6.6 target can be met on this host at all
RATIO_ROLES = {("fork", "fork-aa"): "1.00 expected", ("idiom", "pl266"): "reference: the floor of fork / 2.6.6"}
SINGLE_THREAD = "--xla_cpu_multi_thread_eigen=false"
QUICK = {"rounds": 2, "steps": 24, "warmup": 8}


# --------------------------------------------------------------------------------------------- worker side
def idiom_row(rows, size: Dict[str, Any], budget_s: float) -> Dict[str, Any]:
    """torch_xla's own training loop: batches from ``MpDeviceLoader`` (copied to the device on its background
    threads), the loss shown by an asynchronous step closure after the step's graph ran, one barrier a step."""
    import torch.nn.functional as F
    import torch_xla
    import torch_xla.core.xla_model as xm
    from torch_xla.distributed.parallel_loader import MpDeviceLoader

    dev = torch_xla.device()
    net = rows.make_net(size["layers"]).to(dev)
    opt = rows.make_optimizer(net.parameters())
    loader = MpDeviceLoader(rows.make_loader(size["layers"], size["batch"], size["steps"]), dev)
    shown: Dict[str, Any] = {"step": -1, "loss": None}
    issued = {"step": -1}

    def settle() -> None:
        # the closures of every step so far have read their loss: a late read is neither in the window nor out of it
        # by chance
        deadline = time.monotonic() + 60
        while shown["step"] < issued["step"] and time.monotonic() < deadline:
            time.sleep(0.001)

    rec = rows.Recorder(True, size["warmup"], size["steps"], budget_s, settle=settle)

    def show(step: int, loss) -> None:
        # on the closure thread: the step's graph has run, so this is one transfer of a computed value
        value = loss.item()
        print(f"step {step} loss {value:.4f}")
        shown.update(step=step, loss=value)

    step = -1
    for step, (x, y) in enumerate(loader):
        rows.host_work(size.get("host_ms", 0.0))
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        xm.add_step_closure(show, args=(step, loss), run_async=True)
        rows.step_barrier()
        issued["step"] = step
        if rec.step_end():
            break
    out = rec.summary()
    settle()  # the last closure may still be running when the budget ended the row
    out["last_loss"] = shown["loss"]
    return out


def worker(args: argparse.Namespace) -> int:
    import torch

    # the host's eager work on one thread (as every row of bench/graph_bench.py); XLA's thread pool is its own
    torch.set_num_threads(1)
    from . import bench_rows as rows  # torch: the worker's process only

    size = {"layers": args.layers, "batch": args.batch, "steps": args.steps, "warmup": args.warmup,
            "host_ms": args.host_ms}
    notes: List[str] = []
    vers = rows.versions()
    if args.worker == "idiom":
        res = idiom_row(rows, size, args.budget)
    else:
        if args.worker == "pl266":
            note = rows.pl266_device_override()
            if note:
                notes.append(note)
        import pytorch_lightning as pl

        vers["lightning"] = pl.__version__
        vers["lightning_path"] = os.path.dirname(pl.__file__)
        res = rows.trainer_row(size, "tpu", args.budget)
    steady = res["step_times"][res["warmup"]:]
    out = {
        "row": args.worker,
        "host_ms": args.host_ms,
        "median_ms": statistics.median(steady) * 1e3,
        # over the whole steady window, both ends synchronised with the device: catches a row that queues work
        "mean_ms": res["s_per_step"] * 1e3,
        "steady_steps": len(steady),
        "steps_done": res["steps_done"],
        "steps_planned": res["steps_planned"],
        "counts_per_step": [res["compiles_per_step"], res["executions_per_step"], res["transfers_per_step"]],
        "host_cpu_ms": res["host_cpu_s_per_step"] * 1e3,
        "last_loss": res["last_loss"],
        "versions": vers,
        "notes": notes,
        "note": res.get("note"),
        "xla_flags": os.environ.get("XLA_FLAGS"),
        "pjrt_device": os.environ.get("PJRT_DEVICE"),
    }
    Path(args.out).write_text(json.dumps(out))
    return 0


# --------------------------------------------------------------------------------------------- driver side
def round_order(r: int, rows: Sequence[str] = ROWS) -> List[str]:
    """The rows in the order round ``r`` runs them: the base order, reversed every other round."""
    return list(rows) if r % 2 == 0 else list(rows)[::-1]


def worker_env(row: str, paths: Dict[str, Optional[str]], base: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """The environment of a row's process: its Lightning (or none) on PYTHONPATH and, on XLA:CPU, one XLA compute
    thread. On a TPU nothing is added to XLA_FLAGS."""
    env = row_env(paths.get(row) or None, base)
    if env.get("PJRT_DEVICE", "CPU").upper() == "CPU":
        flags = env.get("XLA_FLAGS", "")
        if SINGLE_THREAD not in flags.split():
            env["XLA_FLAGS"] = f"{flags} {SINGLE_THREAD}".strip()
    return env


def _kind(row: str) -> str:
    return "idiom" if row == "idiom" else ("pl266" if row == "pl266" else "fork")


def run_row(row: str, paths: Dict[str, Optional[str]], cfg: Dict[str, Any], python: str, log: Path) -> Dict[str, Any]:
    """One row in a fresh process; never raises: a failure comes back as ``{"error": ...}``."""
    fd, out = tempfile.mkstemp(prefix=f"device-{row}-", suffix=".json")
    os.close(fd)
    cmd = module_command(python, "device_bench", "--worker", _kind(row), "--steps", str(cfg["steps"]),
                         "--warmup", str(cfg["warmup"]), "--budget", str(cfg["budget"]), "--batch", str(cfg["batch"]),
                         "--layers", ",".join(map(str, cfg["layers"])), "--host-ms", str(cfg.get("host_ms", 0.0)),
                         "--out", out)
    profile = log.with_suffix(".pyspy.txt") if cfg.get("pyspy") else None
    if profile is not None:
        # every thread sampled, idle ones too (a thread blocked in a wait is what this looks for), without pausing
        # the process; the training thread's share is read afterwards (blocked_share)
        cmd = [cfg["pyspy"], "record", "--idle", "--threads", "--nonblocking", "--format", "raw", "--rate",
               str(PYSPY_RATE), "-o", str(profile), "--", *cmd]
    try:
        with open(log, "w") as f:
            proc = subprocess.run(cmd, env=worker_env(row, paths), stdout=f, stderr=subprocess.STDOUT,
                                  cwd=str(ROOT), timeout=cfg["timeout"])
        if proc.returncode != 0:
            # under the profiler the process that exited is py-spy: the row's own death would have given 0 (below)
            who = f"the profiler (py-spy) itself, not the row, exited {proc.returncode}" if profile else \
                f"exit {proc.returncode}"
            return {"row": row, "error": f"{who}; see {log}", "profiler_failed": bool(profile)}
        text = Path(out).read_text()
        if not text.strip():
            # py-spy exits 0 whatever the process it ran did: a row that died under it leaves its result empty
            return {"row": row, "error": f"no result written{' (profiled: py-spy hides the exit status)' if profile else ''}"
                                         f"; see {log}"}
        res = json.loads(text)
        res["row"] = row
        if profile is not None:
            res["profile"] = blocked_share(profile.read_text(errors="replace")) if profile.exists() else {"error": "no profile"}
        return res
    except subprocess.TimeoutExpired:
        return {"row": row, "error": f"killed after {cfg['timeout']:.0f} s; see {log}"}
    finally:
        Path(out).unlink(missing_ok=True)


PYSPY_RATE = 200
# frames of a wait on another thread (an event, a condition, a queue, a join, a lock) and of the step's barrier
WAIT_FRAMES = ("wait (threading.py", "get (queue.py", "join (threading.py", "_wait_for_tstate_lock (threading.py",
               "acquire (threading.py")
BARRIER_FRAMES = ("step_barrier (", "sync (", "mark_step (", "_barrier (")
# frames that hold the training of a row: samples outside them (start-up, imports, teardown) are left out
TRAINING_FRAMES = ("idiom_row (", "trainer_row (")


def blocked_share(raw: str) -> Dict[str, Any]:
    """Where the training thread's time goes, from a ``py-spy record --threads --idle --format raw`` profile.

    The training thread is the main thread; only its samples inside the row's training (``idiom_row`` or
    ``trainer_row``) count, warm-up included. ``blocked``: the share of those samples waiting on another thread
    (a frame of ``threading``'s waits, ``queue.get`` or a join) outside the step's barrier; ``barrier``: the share
    inside the barrier, where a host that is ahead waits for the device. A wait inside C code that names no such
    frame (a host read of an XLA tensor, ``SimpleQueue.get``) shows under the Python function that called it, and
    is not counted as blocked.
    """
    names: Dict[str, str] = {}
    stacks: List[Tuple[str, List[str], int]] = []
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        head = frames[0]
        tid = head.split(")", 1)[0]
        if ": " in head:
            names[tid] = head.split(": ", 1)[1]
        stacks.append((tid, frames[1:], int(count)))
    main = next((tid for tid, name in names.items() if name == "MainThread"), None)
    total = blocked = barrier = 0
    for tid, frames, count in stacks:
        if tid != main or not any(f.startswith(TRAINING_FRAMES) for f in frames):
            continue
        total += count
        if any(f.startswith(BARRIER_FRAMES) for f in frames):
            barrier += count
        elif any(f.startswith(WAIT_FRAMES) for f in frames):
            blocked += count
    if not total:
        return {"samples": 0, "blocked": None, "barrier": None}
    return {"samples": total, "blocked": blocked / total, "barrier": barrier / total}


def check_row(res: Dict[str, Any], pl266_version: str) -> Optional[str]:
    """Why a finished row does not count (it imported the wrong Lightning, or stopped early), or None."""
    if "error" in res:
        return res["error"]
    got = res.get("versions", {}).get("lightning")
    kind = _kind(res["row"])
    if kind == "pl266" and got != pl266_version:
        return f"imported Lightning {got}, not {pl266_version}"
    if kind == "fork" and not (got or "").startswith("1.8.6"):
        return f"imported Lightning {got}, not the fork (1.8.6+xla)"
    if res["steps_done"] != res["steps_planned"]:
        return f"stopped after {res['steps_done']} of {res['steps_planned']} steps"
    return None


LOSS_RTOL = 1e-3


def loss_mismatch(res: Dict[str, Any], ref: Dict[str, Any]) -> Optional[str]:
    """Same weights, data, optimizer and math: every row ends at the idiom's loss, or it does not train the same."""
    got, want = res.get("last_loss"), ref.get("last_loss")
    if got is None or want is None:
        return None if res is ref else "no last loss to compare"
    if abs(got - want) > LOSS_RTOL * max(abs(want), 1e-12):
        return f"last loss {got:.6f}, the idiom's {want:.6f}: it does not train the same way"
    return None


def measure(rounds: int, cfg: Dict[str, Any], paths: Dict[str, Optional[str]], python: str, log_dir: Path,
            rows: Sequence[str] = ROWS, runner: Callable[..., Dict[str, Any]] = run_row,
            pl266_version: str = "2.6.6") -> Dict[str, Any]:
    """``rounds`` rounds, each running every row once in the round's order. Returns the raw per-round results."""
    log_dir.mkdir(parents=True, exist_ok=True)
    per_round: List[Dict[str, Dict[str, Any]]] = []
    orders: List[List[str]] = []
    for r in range(rounds):
        order = round_order(r, rows)
        orders.append(order)
        got: Dict[str, Dict[str, Any]] = {}
        for row in order:
            res = runner(row, paths, cfg, python, log_dir / f"r{r}-{row}.log")
            if res.get("profiler_failed"):
                # py-spy crashed, not the row (seen: SIGSEGV, 2 of about 60 profiled rows): run the row once more
                print(f"[device] round {r + 1}/{rounds}: {row}: {res['error']}; running it again", flush=True)
                res = dict(runner(row, paths, cfg, python, log_dir / f"r{r}-{row}-again.log"),
                           profiler_failed_before=res["error"])
            why = check_row(res, pl266_version)
            if why:
                res["invalid"] = why
            got[row] = res
            shown = f"{res['median_ms']:.2f} ms/step" if "median_ms" in res else "no time"
            print(f"[device] round {r + 1}/{rounds}: {row}: {shown}" + (f" ({why})" if why else ""), flush=True)
        ref = got.get("idiom")
        if ref is not None and "invalid" not in ref:
            for row, res in got.items():
                bad = None if "invalid" in res else loss_mismatch(res, ref)
                if bad:
                    res["invalid"] = bad
                    print(f"[device] round {r + 1}/{rounds}: {row}: {bad}", flush=True)
        per_round.append(got)
    return {"rounds": rounds, "order": orders, "per_round": per_round, "config": dict(cfg)}


def _valid(res: Optional[Dict[str, Any]]) -> bool:
    return res is not None and "invalid" not in res and "median_ms" in res


def round_ratios(result: Dict[str, Any], a: str, b: str) -> List[Optional[float]]:
    """A / B of the rows' median step times, one per round (None where either row failed that round)."""
    out: List[Optional[float]] = []
    for got in result["per_round"]:
        ra, rb = got.get(a), got.get(b)
        out.append(ra["median_ms"] / rb["median_ms"] if _valid(ra) and _valid(rb) else None)
    return out


def _spread(values: List[float]) -> Dict[str, Optional[float]]:
    if not values:
        return {"median": None, "min": None, "max": None}
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summarize(result: Dict[str, Any], ratios: Sequence[Tuple[str, str, Optional[float]]] = RATIOS) -> Dict[str, Any]:
    rows_present = list(result["per_round"][0]) if result["per_round"] else []
    rows_out = []
    for row in [r for r in ROWS if r in rows_present] + [r for r in rows_present if r not in ROWS]:
        vals = [got.get(row) for got in result["per_round"]]
        ok = [v for v in vals if _valid(v)]
        counts = [statistics.median(v["counts_per_step"][i] for v in ok) for i in range(3)] if ok else None
        rows_out.append(dict(row=row, per_round_ms=[v["median_ms"] if _valid(v) else None for v in vals],
                             counts_per_step=counts, **_spread([v["median_ms"] for v in ok])))
    ratios_out = []
    for a, b, target in ratios:
        per = round_ratios(result, a, b)
        done = [x for x in per if x is not None]
        s = _spread(done)
        ratios_out.append(dict(a=a, b=b, label=RATIO_LABELS.get((a, b), f"{a} / {b}"), per_round=per, target=target,
                               met=None if target is None or s["median"] is None else s["median"] <= target,
                               # a sign count: in how many rounds row A was the slower one
                               a_slower=sum(x > 1 for x in done), rounds=len(done), **s))
    aa = next((r for r in ratios_out if r["a"] == "fork" and r["b"] == "fork-aa"), None)
    aa_spread = None
    if aa and aa["median"] is not None:
        aa_spread = max(abs(1 - x) for x in aa["per_round"] if x is not None)
    failures = [f"round {i + 1}: {row}: {res['invalid']}" for i, got in enumerate(result["per_round"])
                for row, res in got.items() if "invalid" in res]
    return {"rows": rows_out, "ratios": ratios_out, "aa_spread": aa_spread, "failures": failures}


def _f(x: Optional[float], fmt: str = ".2f") -> str:
    return "-" if x is None else format(x, fmt)


def markdown(result: Dict[str, Any], summary: Dict[str, Any], meta: Dict[str, Any]) -> str:
    cfg = result["config"]
    layers = "-".join(map(str, cfg["layers"]))
    vers = meta.get("versions", {})
    flags = f" with `XLA_FLAGS={meta['xla_flags']}` (one XLA compute thread)" if meta.get("xla_flags") else ""
    lines = [
        "# Device-bound step: the fork against torch_xla's idiom and Lightning 2.6.6",
        "",
    ]
    if meta.get("quick"):
        lines += ["**A smoke run (`--quick`): too few rounds and steps to be a measurement.**", ""]
    lines += [
        f"PJRT_DEVICE={meta.get('pjrt_device')}{flags}, torch {vers.get('torch')}, torch_xla {vers.get('torch_xla')}, "
        f"fork {meta.get('fork')}, {meta.get('date')}. MLP {layers}, batch {cfg['batch']}, SGD; the loss shown every "
        f"step. Wall time per steady step: the median of {cfg['steps'] - cfg['warmup']} steps after {cfg['warmup']} "
        f"warm-up steps, every row in a fresh process. {result['rounds']} rounds, each running every row once, the "
        "order reversed every other round; each ratio is taken within a round, then the median over the rounds "
        "(min..max, and each round's value). The A/A row is the fork's Trainer run a second time: its ratio is the "
        "method's own spread.",
        "",
        "| row | what | ms/step (median over rounds) | min..max | per round | compiles / executions / transfers per "
        "step |",
        "|---|---|---|---|---|---|",
    ]
    for r in summary["rows"]:
        per = ", ".join(_f(x, ".1f") for x in r["per_round_ms"])
        counts = " / ".join(_f(x) for x in r["counts_per_step"]) if r["counts_per_step"] else "-"
        lines.append(f"| `{r['row']}` | {LABELS.get(r['row'], r['row'])} | {_f(r['median'], '.1f')} | "
                     f"{_f(r['min'], '.1f')}..{_f(r['max'], '.1f')} | {per} | {counts} |")
    lines += ["", "| ratio | median over rounds | min..max | per round | A slower in | target |",
              "|---|---|---|---|---|---|"]
    for q in summary["ratios"]:
        per = ", ".join(_f(x) for x in q["per_round"])
        if q["target"] is None:
            target = RATIO_ROLES.get((q["a"], q["b"]), "-")
        else:
            target = f"<= {q['target']:.2f}: " + ("-" if q["met"] is None else ("met" if q["met"] else "NOT met"))
        lines.append(f"| {q['label']} | **{_f(q['median'])}** | {_f(q['min'])}..{_f(q['max'])} | {per} | "
                     f"{q['a_slower']} of {q['rounds']} rounds | {target} |")
    lines += [""]
    if summary["aa_spread"] is not None:
        lines.append(f"A/A spread (largest |1 - ratio| of the fork against itself over the rounds): "
                     f"{summary['aa_spread']:.2f}: two runs of the same code differed by up to that within a round. "
                     "`A slower in`: the rounds in which the ratio's first row was the slower one (the A/A row shows "
                     "what chance gives).")
    notes = sorted({n for got in result["per_round"] for res in got.values() for n in res.get("notes", [])})
    notes += summary["failures"]
    if notes:
        lines += ["", "Notes:", ""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def sweep_markdown(points: List[Dict[str, Any]]) -> str:
    """The host-work sweep: per point, each row's time per step, the ratios within rounds, the A/A spread and the
    training thread's blocked share."""
    lines = ["## Host work per step: a sweep", "",
             "The same rows with Python work added to every step on the host (`bench_rows.host_work`, holding the GIL "
             "as user code does, in `training_step` and in the idiom's loop), from none to about twice the device's "
             "step. Each point has its own interleaved rounds and its A/A row. `blocked`: the share of the training "
             "thread's samples (py-spy, `--idle`) spent waiting on another thread outside the step's barrier; "
             "`barrier`: inside it.", "",
             "| host ms/step | idiom ms | fork ms | 2.6.6 ms | fork / idiom | fork / 2.6.6 | idiom / 2.6.6 | A/A spread "
             "| blocked: idiom / fork / 2.6.6 | barrier: idiom / fork / 2.6.6 |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for point in points:
        summary = point["summary"]
        ms = {r["row"]: r["median"] for r in summary["rows"]}
        q = {(r["a"], r["b"]): r for r in summary["ratios"]}

        def ratio(a: str, b: str) -> str:
            r = q.get((a, b))
            return "-" if r is None or r["median"] is None else f"{r['median']:.2f} ({r['min']:.2f}..{r['max']:.2f})"

        def share(key: str) -> str:
            out = []
            for row in ("idiom", "fork", "pl266"):
                vals = [got[row]["profile"][key] for got in point["result"]["per_round"]
                        if row in got and isinstance(got[row].get("profile"), dict)
                        and got[row]["profile"].get(key) is not None]
                out.append(f"{statistics.median(vals):.0%}" if vals else "-")
            return " / ".join(out)

        lines.append(f"| {point['host_ms']:g} | {_f(ms.get('idiom'), '.1f')} | {_f(ms.get('fork'), '.1f')} | "
                     f"{_f(ms.get('pl266'), '.1f')} | {ratio('fork', 'idiom')} | {ratio('fork', 'pl266')} | "
                     f"{ratio('idiom', 'pl266')} | {_f(summary['aa_spread'])} | {share('blocked')} | "
                     f"{share('barrier')} |")
    # a row that failed in a round drops out of that round's ratios; say which, and why
    failed = [f"- {point['host_ms']:g} ms, round {i + 1}: {row}: {res.get('error') or res.get('invalid')}"
              for point in points for i, got in enumerate(point["result"]["per_round"])
              for row, res in got.items() if res.get("error") or res.get("invalid")]
    if failed:
        lines += ["", "Rows that failed, left out of their round's ratios:", ""] + failed
    return "\n".join(lines) + "\n"


def _pyspy(choice: Optional[str]) -> Optional[str]:
    """The py-spy to profile the rows with: ``--pyspy``, else one next to the interpreter or on PATH, else none."""
    import shutil

    if choice == "none":
        return None
    if choice:
        return choice
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worker", choices=("idiom", "fork", "pl266"))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=100, help="steps per row, warm-up included")
    p.add_argument("--warmup", type=int, default=20, help="warm-up steps (compilation), left out")
    p.add_argument("--quick", action="store_true",
                   help=f"a smoke run: {QUICK['rounds']} rounds of {QUICK['steps']} steps ({QUICK['warmup']} warm-up)")
    p.add_argument("--layers", type=lambda s: [int(x) for x in s.split(",")], default=LAYERS)
    p.add_argument("--batch", type=int, default=BATCH)
    p.add_argument("--budget", type=float, default=300.0, help="seconds a row may train (worker)")
    p.add_argument("--host-ms", type=float, default=0.0, help="Python work on the host per step, in ms (worker)")
    p.add_argument("--sweep", type=lambda s: [float(x) for x in s.split(",")], default=None,
                   help="host ms per step to sweep after the main table, e.g. 0,20,40,80 (default: no sweep)")
    p.add_argument("--pyspy", default=None,
                   help="py-spy to profile the sweep's rows with (default: the venv's or PATH's; 'none' for none)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds before a row's process is killed")
    p.add_argument("--fork-path", default=None,
                   help="PYTHONPATH of the fork rows (default: src/ of this checkout, else the fork in the venv)")
    p.add_argument("--pl266-path", default=None, help="PYTHONPATH of Lightning 2.6.6 (default: build/bench/pl266)")
    p.add_argument("--python", default=sys.executable, help="interpreter for the rows (the venv's)")
    p.add_argument("--logs", type=Path, default=ROOT / "build" / "bench" / "device-logs")
    p.add_argument("--out", default=str(ROOT / "results" / "device.json"))
    p.add_argument("--md", default=str(ROOT / "results" / "device.md"))
    args = p.parse_args(argv)
    if args.worker:
        return worker(args)
    if args.quick:
        args.rounds, args.steps, args.warmup = QUICK["rounds"], QUICK["steps"], QUICK["warmup"]
    # every row's process inherits it: TPU on a TPU VM, else XLA on the CPU, unless it is set
    default_pjrt_device()
    stamped = stamp(tree=args.fork_path or (None if fork_src() else "the fork installed in the venv"))
    pl266 = args.pl266_path or str(install_pl266(args.python)[0])
    fork = args.fork_path or (str(fork_src()) if fork_src() else None)
    paths = {"idiom": None, "fork": fork, "fork-aa": fork, "pl266": pl266}
    cfg = {"layers": args.layers, "batch": args.batch, "steps": args.steps, "warmup": args.warmup,
           "budget": args.budget, "timeout": args.timeout}
    t0 = time.perf_counter()
    result = measure(args.rounds, cfg, paths, args.python, args.logs, pl266_version=PL266_VERSION)
    summary = summarize(result)
    points: List[Dict[str, Any]] = []
    pyspy = _pyspy(args.pyspy)
    for host_ms in args.sweep or []:
        point_cfg = dict(cfg, host_ms=host_ms, pyspy=pyspy)
        print(f"[device] sweep: {host_ms:g} ms of host work per step", flush=True)
        got = measure(args.rounds, point_cfg, paths, args.python, args.logs / f"host-{host_ms:g}",
                      pl266_version=PL266_VERSION)
        points.append({"host_ms": host_ms, "result": got, "summary": summarize(got)})
    first = next((res for got in result["per_round"] for res in got.values() if "versions" in res), {})
    fork_res = next((res for got in result["per_round"] for row, res in got.items()
                     if row == "fork" and "versions" in res), {})
    meta = {"pjrt_device": os.environ.get("PJRT_DEVICE"), "date": time.strftime("%Y-%m-%d %H:%M"),
            "xla_flags": worker_env("idiom", paths).get("XLA_FLAGS"), "versions": first.get("versions", {}),
            "fork": fork_res.get("versions", {}).get("lightning"), "quick": args.quick,
            "paths": paths, "seconds": time.perf_counter() - t0, "pyspy": pyspy if points else None}
    write_json(Path(args.out), {"meta": meta, "result": result, "summary": summary, "sweep": points}, stamped)
    text = markdown(result, summary, meta)
    if points:
        text += "\n" + sweep_markdown(points)
    text = write_markdown_page(Path(args.md), text, stamped)
    print(text)
    return 1 if summary["failures"] or any(point["summary"]["failures"] for point in points) else 0


if __name__ == "__main__":
    sys.exit(main())
