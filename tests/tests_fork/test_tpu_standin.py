"""The "tpu" device of TorchTPU as Lightning meets it: tensors and views live on it, training on it matches the CPU, it
has random generators of its own, autocast lowers matrix products to bfloat16 on it, checkpoints map to and from it,
and DDP runs over its ``torch.distributed`` backend.

On a machine without a TPU the device is the stand-in of ``tests/helpers/tpu_standin``. The installed torch-tpu
loads itself when torch is imported unless ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` is set before, and this session may
have imported torch already: every scenario runs in a fresh interpreter with that variable set, calls
``install()``, and prints its findings as JSON. The stand-in needs torch >= 2.11 (TorchTPU's floor): in the
torch_xla environment (torch 2.9) the module is skipped.

On a TPU VM, ``PL_TORCH_TPU_REAL=1`` (as for ``helpers.torch_tpu_runs``) runs the same scenarios on the real device:
torch-tpu loads at ``import torch``, ``install()`` only checks that ``torch.accelerator`` reports a ``"tpu"``, and the
tests of what only the stand-in offers (several devices in one process, its refusals, the DDP runs that spawn their own
ranks) are skipped.
"""
import json
import os
import subprocess
import sys
import textwrap
from importlib.metadata import PackageNotFoundError, version
from importlib.util import find_spec
from pathlib import Path
from typing import Any, Dict, Optional

import pytest
from packaging.version import Version

TESTS = Path(__file__).resolve().parents[1]
#: a bound on one scenario, its cold build of the extension included (about a minute on 2 cores)
SCENARIO_TIMEOUT = 300
RESULT_MARKER = "@@STANDIN@@"
#: ``PL_TORCH_TPU_REAL=1``: the scenarios run on the real torch-tpu (a TPU VM) instead of the stand-in
REAL_TPU = os.environ.get("PL_TORCH_TPU_REAL") == "1"


def _torch_reason() -> Optional[str]:
    try:
        torch_version = Version(version("torch"))
    except PackageNotFoundError:
        return "torch is not installed"
    if torch_version.release[:2] < (2, 11):
        return f"TorchTPU and its stand-in need torch >= 2.11, this environment has torch {torch_version}"
    return None


pytestmark = [
    pytest.mark.tpu_standin,
    pytest.mark.skipif(_torch_reason() is not None, reason=str(_torch_reason())),
]
standin_only = pytest.mark.skipif(REAL_TPU, reason="checks what only the stand-in offers (PL_TORCH_TPU_REAL=1)")

_EMIT = f"""\
import json
import torch


def emit(value):
    print({RESULT_MARKER!r} + json.dumps(value), flush=True)


"""
_STANDIN = "from helpers.tpu_standin import install\n\n\n"
_REAL = '''\
def install(device_count=None):
    """torch-tpu loaded the device at ``import torch``: nothing to install."""
    assert torch.accelerator.current_accelerator(check_available=True) == torch.device("tpu"), (
        "PL_TORCH_TPU_REAL=1, but torch-tpu registered no device"
    )


'''


def run_scenario(tmp_path: Path, code: str, env: Optional[Dict[str, str]] = None) -> Any:
    """Run ``code`` as a script in a fresh interpreter and return the value it passed to ``emit``.

    On the stand-in (the default), the torch-tpu autoload is off unless ``env`` says otherwise and ``install`` is
    the stand-in's; with ``PL_TORCH_TPU_REAL=1``, the environment is left as it is and ``install`` only checks the real
    device. The script is a file: ``torch.multiprocessing``'s spawn re-imports it.
    """
    script = tmp_path / "scenario.py"
    script.write_text(_EMIT + (_REAL if REAL_TPU else _STANDIN) + textwrap.dedent(code))
    full_env = {key: value for key, value in os.environ.items() if key != "TPU_STANDIN_DEVICES"}
    if not REAL_TPU:
        full_env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    full_env.update(env or {})
    full_env["PYTHONPATH"] = os.pathsep.join([str(TESTS), full_env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, str(script)],
        env=full_env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=SCENARIO_TIMEOUT,
    )
    results = [line[len(RESULT_MARKER):] for line in proc.stdout.splitlines() if line.startswith(RESULT_MARKER)]
    assert proc.returncode == 0 and results, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return json.loads(results[-1])


def test_tensors_live_on_a_tpu_device(tmp_path):
    result = run_scenario(
        tmp_path,
        """
        install()
        x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
        on_device = x.to("tpu")
        # pinned host memory, which DataLoader(pin_memory=True) asks the accelerator for
        pinned = x.pin_memory()
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x), batch_size=2, pin_memory=True)
        emit({
            "device": str(on_device.device), "type": on_device.device.type, "is_tpu": on_device.is_tpu,
            "back": on_device.cpu().tolist(), "expected": x.tolist(), "sum": (on_device * 2).sum().item(),
            "module": str(torch.nn.Linear(2, 2).tpu().weight.device),
            "accelerator": str(torch.accelerator.current_accelerator()),
            "accelerator_available": torch.accelerator.is_available(),
            "pinned": [pinned.is_pinned(), x.is_pinned(), all(batch.is_pinned() for batch, in loader)],
            "from_pinned": pinned.to("tpu", non_blocking=True).cpu().tolist(),
        })
        """,
    )
    assert result["device"] == "tpu:0" and result["type"] == "tpu" and result["is_tpu"]
    assert result["back"] == result["expected"] == result["from_pinned"]
    assert result["sum"] == 2 * sum(range(12))
    assert result["module"] == "tpu:0"
    assert (result["accelerator"], result["accelerator_available"]) == ("tpu", True)
    assert result["pinned"] == [True, False, True]


@standin_only
def test_the_stand_in_has_the_devices_it_is_asked_for(tmp_path):
    result = run_scenario(
        tmp_path,
        """
        install()
        install()  # idempotent
        try:
            install(device_count=3)
            other_count = None
        except RuntimeError as err:
            other_count = str(err)
        x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
        on_second = x.to("tpu:1")
        # memory that a kernel allocates for an existing tensor (arange resizes its output) is the tensor's device's
        resized = torch.arange(6.0, device="tpu:1")
        with torch.accelerator.device_index(1):
            in_context = torch.ones(1, device="tpu").device.index
        after_context = torch.accelerator.current_device_index()
        torch.accelerator.set_device_index(1)
        after_set = (torch.accelerator.current_device_index(), torch.zeros(1, device="tpu").device.index)
        torch.accelerator.set_device_index(0)
        try:
            torch.zeros(1, device="tpu:2")
            out_of_range = None
        except RuntimeError as err:
            out_of_range = str(err)
        torch.save({"base": resized, "view": resized[2:4]}, "checkpoint.pt")
        loaded = torch.load("checkpoint.pt")
        remapped = torch.load("checkpoint.pt", map_location={"tpu:1": "tpu:0"})
        # memory statistics per device
        before = [torch.accelerator.memory_allocated(index) for index in range(2)]
        block = torch.empty(1024, dtype=torch.float32, device="tpu:1")
        during = [torch.accelerator.memory_allocated(index) for index in range(2)]
        del block
        memory = {"before": before, "during": during, "after": torch.accelerator.memory_allocated(1),
                  "peak": torch.accelerator.max_memory_allocated(1)}
        # each device has its generator
        torch.tpu.manual_seed_all(3)
        states = [torch.accelerator.random.get_rng_state(0), torch.accelerator.random.get_rng_state("tpu:1")]
        torch.randn(4, device="tpu:1")
        emit({
            "second": str(on_second.device), "back": on_second.cpu().tolist(), "expected": x.tolist(),
            "storages": [str(on_second.untyped_storage().device), str(resized.untyped_storage().device)],
            "in_context": in_context, "after_context": after_context, "after_set": after_set,
            "count": torch.accelerator.device_count(),
            "other_count": other_count, "out_of_range": out_of_range,
            "loaded": [str(tensor.device) for tensor in loaded.values()],
            "remapped": [str(tensor.device) for tensor in remapped.values()],
            "generators": len(torch.tpu.default_generators), "memory": memory,
            "states_kept": [torch.equal(state, torch.accelerator.random.get_rng_state(index))
                            for index, state in enumerate(states)],
        })
        """,
        env={"TPU_STANDIN_DEVICES": "2"},
    )
    assert result["second"] == "tpu:1" and result["back"] == result["expected"]
    assert result["storages"] == ["tpu:1", "tpu:1"]
    assert (result["in_context"], result["after_context"], result["after_set"]) == (1, 0, [1, 1])
    assert result["count"] == 2
    assert "installed with 2 devices" in result["other_count"]
    assert "out of range" in result["out_of_range"]
    assert result["loaded"] == ["tpu:1", "tpu:1"] and result["remapped"] == ["tpu:0", "tpu:0"]
    assert result["generators"] == 2 and result["states_kept"] == [True, False]
    memory = result["memory"]
    assert memory["during"] == [memory["before"][0], memory["before"][1] + 4096]
    assert memory["after"] == memory["before"][1] and memory["peak"] >= memory["before"][1] + 4096


# the functions of torch.tpu that torch.accelerator replaces, and their replacements
_INTERNAL_APIS = {
    "device_count": "torch.accelerator.device_count",
    "is_available": "torch.accelerator.is_available",
    "current_device": "torch.accelerator.current_device_index",
    "set_device": "torch.accelerator.set_device_index",
    "device": "torch.accelerator.device_index",
    "synchronize": "torch.accelerator.synchronize",
    "initial_seed": "torch.accelerator.random.initial_seed",
    "get_rng_state": "torch.accelerator.random.get_rng_state",
}
_CALL_INTERNAL_APIS = """
import warnings

calls = {
    "device_count": lambda: torch.tpu.device_count(),
    "is_available": lambda: torch.tpu.is_available(),
    "current_device": lambda: torch.tpu.current_device(),
    "set_device": lambda: torch.tpu.set_device(0),
    "device": lambda: torch.tpu.device(0).__enter__(),
    "synchronize": lambda: torch.tpu.synchronize(),
    "initial_seed": lambda: torch.tpu.initial_seed(),
    "get_rng_state": lambda: torch.tpu.get_rng_state().tolist(),
}
outcomes = {}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for name, call in calls.items():
        try:
            outcomes[name] = ["returned", call()]
        except RuntimeError as err:
            outcomes[name] = ["raised", str(err)]
"""


def test_the_device_apis_that_torch_accelerator_replaces_are_internal(tmp_path):
    """As TorchTPU's from torch 2.11 on (2.13 for the seed and generator state): called from outside torch, the
    functions of ``torch.tpu`` that ``torch.accelerator`` replaces raise and name the replacement; torch's own
    callers (``torch.accelerator``, ``torch.load``'s device check, DDP) still reach them."""
    result = run_scenario(
        tmp_path,
        "install()\n"
        + _CALL_INTERNAL_APIS
        + textwrap.dedent(
            """
            torch.save(torch.ones(1, device="tpu"), "tensor.pt")
            emit({
                "outcomes": outcomes,
                "accelerator": [torch.accelerator.is_available(), torch.accelerator.device_count()],
                "loaded": str(torch.load("tensor.pt", map_location="tpu").device),
            })
            """
        ),
    )
    for name, prefer in _INTERNAL_APIS.items():
        outcome, message = result["outcomes"][name]
        assert outcome == "raised" and f"Use {prefer} instead" in message, name
    assert result["accelerator"][0] and result["accelerator"][1] >= 1
    assert result["loaded"] == "tpu:0"


def test_allowing_the_legacy_device_apis_makes_them_work(tmp_path):
    """``TORCH_TPU_ALLOW_LEGACY_DEVICE_APIS=1``, TorchTPU's escape hatch, turns the errors into warnings."""
    result = run_scenario(
        tmp_path,
        "install()\n"
        + _CALL_INTERNAL_APIS
        + textwrap.dedent(
            """
            emit({
                "outcomes": outcomes, "state": torch.accelerator.random.get_rng_state().tolist(),
                "warnings": [str(warning.message) for warning in caught],
            })
            """
        ),
        env={"TORCH_TPU_ALLOW_LEGACY_DEVICE_APIS": "1"},
    )
    outcomes = {name: outcome for name, (outcome, _) in result["outcomes"].items()}
    assert outcomes == dict.fromkeys(_INTERNAL_APIS, "returned")
    values = {name: value for name, (_, value) in result["outcomes"].items()}
    assert values["device_count"] >= 1 and values["is_available"] and values["current_device"] == 0
    assert values["get_rng_state"] == result["state"]
    if not REAL_TPU:
        assert len(result["warnings"]) == len(_INTERNAL_APIS)
        assert all("is internal to TorchTPU" in warning for warning in result["warnings"])


@standin_only
def test_install_refuses_another_privateuse1_backend(tmp_path):
    result = run_scenario(
        tmp_path,
        """
        torch.utils.rename_privateuse1_backend("other")
        try:
            install()
            error = None
        except RuntimeError as err:
            error = str(err)
        emit({"error": error, "tpu": hasattr(torch, "tpu")})
        """,
    )
    assert "already renamed 'other'" in result["error"]
    assert not result["tpu"]


@standin_only
@pytest.mark.skipif(find_spec("torch_tpu") is None, reason="torch-tpu is not installed")
def test_install_refuses_the_autoloaded_torch_tpu(tmp_path):
    """Without ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``, ``import torch`` loads the real torch-tpu, which creates
    ``torch.tpu`` (with no device on a machine without a chip): the stand-in says what to do instead."""
    result = run_scenario(
        tmp_path,
        """
        try:
            install()
            error = None
        except RuntimeError as err:
            error = str(err)
        emit({"error": error})
        """,
        env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "1"},
    )
    assert "torch.tpu already exists" in result["error"]
    assert "TORCH_DEVICE_BACKEND_AUTOLOAD=0" in result["error"]


def test_views_share_the_device_memory(tmp_path):
    """In-place operators on views of every kind reach the base tensor's memory, as on the CPU."""
    result = run_scenario(
        tmp_path,
        """
        install()


        def edit(base):
            base[1].fill_(1)  # select
            base[:, 2].add_(2)  # strided slice
            base.view(24)[23] = 7  # view
            base.t()[5, 0] = 5  # transpose
            base.reshape(6, 4)[0, 1] = 3  # reshape of a contiguous tensor
            base.unfold(1, 2, 2)[3, 0, 1] = 9  # unfold
            base.as_strided((2,), (7,), 2).mul_(-1)  # as_strided with an offset
            base.narrow(0, 2, 1).squeeze(0).unsqueeze(1).expand(6, 3)[:, 0].sub_(0.5)
            return base


        on_device = edit(torch.zeros(4, 6, device="tpu"))
        view = on_device.t()
        complex_values = torch.zeros(3, dtype=torch.complex64, device="tpu")
        torch.view_as_real(complex_values)[1, 1] = 4
        emit({
            "device": edit(torch.zeros(4, 6)).tolist(), "tpu": on_device.cpu().tolist(),
            "view_base": view._base is on_device, "view_device": str(view.device),
            "shares_memory": view.untyped_storage().data_ptr() == on_device.untyped_storage().data_ptr(),
            "imag": complex_values.imag.cpu().tolist(),
        })
        """,
    )
    assert result["tpu"] == result["device"] == [
        [0, 3, -2, 0, 0, 5],
        [1, 1, 3, -1, 1, 1],
        [-0.5, -0.5, 1.5, -0.5, -0.5, -0.5],
        [0, 9, 2, 0, 0, 7],
    ]
    assert result["view_base"] and result["shares_memory"] and result["view_device"] == "tpu:0"
    assert result["imag"] == [0, 4, 0]


def test_a_training_step_on_the_device_matches_the_cpu(tmp_path):
    result = run_scenario(
        tmp_path,
        """
        import copy

        import torch.nn.functional as F

        torch.manual_seed(0)
        cpu_model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
        initial = [p.detach().clone() for p in cpu_model.parameters()]
        install()
        tpu_model = copy.deepcopy(cpu_model).to("tpu")
        x, target = torch.randn(5, 8), torch.randint(0, 4, (5,))


        def train(model, device):
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
            losses = []
            for _ in range(3):
                optimizer.zero_grad()
                loss = F.cross_entropy(model(x.to(device)), target.to(device))
                loss.backward()
                optimizer.step()
                losses.append(loss.item())
            buffers = [optimizer.state[p]["momentum_buffer"] for p in model.parameters()]
            return losses, list(model.parameters()), buffers


        cpu_losses, cpu_params, _ = train(cpu_model, "cpu")
        tpu_losses, tpu_params, tpu_buffers = train(tpu_model, "tpu")
        emit({
            "losses": [cpu_losses, tpu_losses],
            "weights_diff": max((c - t.cpu()).abs().max().item() for c, t in zip(cpu_params, tpu_params)),
            "grads_diff": max((c.grad - t.grad.cpu()).abs().max().item() for c, t in zip(cpu_params, tpu_params)),
            "moved": min((c - i).abs().max().item() for c, i in zip(cpu_params, initial)),
            "devices": sorted({str(t.device) for t in tpu_params + [p.grad for p in tpu_params] + tpu_buffers}),
        })
        """,
    )
    # the stand-in runs the CPU's kernels; a TPU multiplies float32 matrices in bfloat16 passes by default
    tolerance = 1e-2 if REAL_TPU else 1e-6
    cpu_losses, tpu_losses = result["losses"]
    assert tpu_losses == pytest.approx(cpu_losses, rel=tolerance, abs=tolerance)
    assert result["weights_diff"] < tolerance and result["grads_diff"] < tolerance
    assert result["moved"] > 1e-3  # the steps changed every parameter
    assert result["devices"] == ["tpu:0"]


def test_the_device_has_random_generators_of_its_own(tmp_path):
    result = run_scenario(
        tmp_path,
        """
        import io

        import torch.nn.functional as F

        install()
        random_ops = {
            "randn": lambda: torch.randn(8, device="tpu"),
            "rand": lambda: torch.rand(8, device="tpu"),
            "normal_": lambda: torch.empty(8, device="tpu").normal_(),
            "uniform_": lambda: torch.empty(8, device="tpu").uniform_(),
            "bernoulli_": lambda: torch.empty(32, device="tpu").bernoulli_(0.5),
            "random_": lambda: torch.empty(8, device="tpu").random_(0, 1000),
            "randint": lambda: torch.randint(0, 1000, (8,), device="tpu"),
            "randperm": lambda: torch.randperm(16, device="tpu"),
            "dropout": lambda: F.dropout(torch.ones(32, device="tpu"), 0.5, training=True),
            "multinomial": lambda: torch.multinomial(torch.ones(16, device="tpu"), 8),
        }
        ops = {}
        for name, op in random_ops.items():
            torch.tpu.manual_seed(0)
            cpu_state, device_state = torch.get_rng_state(), torch.accelerator.random.get_rng_state()
            first = op().cpu()
            cpu_untouched = torch.equal(torch.get_rng_state(), cpu_state)
            device_advanced = not torch.equal(torch.accelerator.random.get_rng_state(), device_state)
            torch.tpu.manual_seed(0)
            torch.randn(100)  # CPU draws in between change nothing on the device
            again = op().cpu()
            torch.tpu.manual_seed(1)
            other = op().cpu()
            ops[name] = {
                "reproducible": torch.equal(first, again), "cpu_untouched": cpu_untouched,
                "device_advanced": device_advanced, "seed_matters": not torch.equal(first, other),
            }

        # a resumed run: the state saved with a checkpoint gives the same draws after other draws
        torch.tpu.manual_seed(42)
        torch.randn(10, device="tpu")
        saved = io.BytesIO()
        torch.save(torch.accelerator.random.get_rng_state(), saved)
        expected = torch.randn(5, device="tpu").cpu()
        torch.randn(7, device="tpu")
        saved.seek(0)
        torch.tpu.set_rng_state(torch.load(saved))
        resumed = torch.randn(5, device="tpu").cpu()

        # torch.manual_seed seeds the device too (through torch.tpu.manual_seed_all, as for every device module)
        torch.manual_seed(5)
        seeded = torch.accelerator.random.initial_seed()
        by_torch = torch.randn(4, device="tpu").cpu()
        torch.tpu.manual_seed(5)
        by_tpu = torch.randn(4, device="tpu").cpu()

        generator = torch.Generator(device="tpu").manual_seed(11)
        default_before = torch.accelerator.random.get_rng_state()
        with_generator = torch.randn(4, device="tpu", generator=generator).cpu()
        default_untouched = torch.equal(default_before, torch.accelerator.random.get_rng_state())
        generator.manual_seed(11)
        try:
            torch.randn(4, device="tpu", generator=torch.Generator())
            cpu_generator = None
        except RuntimeError as err:
            cpu_generator = str(err)
        emit({
            "ops": ops, "resumed": torch.equal(expected, resumed),
            "seeded": seeded, "torch_seed": torch.equal(by_torch, by_tpu), "generator_device": str(generator.device),
            "generator": torch.equal(with_generator, torch.randn(4, device="tpu", generator=generator).cpu()),
            "default_untouched": default_untouched, "cpu_generator": cpu_generator,
        })
        """,
    )
    expected = {"reproducible": True, "cpu_untouched": True, "device_advanced": True, "seed_matters": True}
    for name, checks in result["ops"].items():
        assert checks == expected, name
    assert result["resumed"]
    assert result["seeded"] == 5 and result["torch_seed"]
    assert result["generator_device"] == "tpu:0" and result["generator"] and result["default_untouched"]
    assert result["cpu_generator"] is not None
    if not REAL_TPU:
        assert "expected a generator of the 'tpu' device, got one of 'cpu'" in result["cpu_generator"]


def test_autocast_runs_matrix_products_in_bfloat16(tmp_path):
    result = run_scenario(
        tmp_path,
        """
        import torch.nn.functional as F

        install()
        a, b = torch.randn(4, 5, device="tpu"), torch.randn(5, 3, device="tpu")
        bias, labels = torch.randn(3, device="tpu"), torch.tensor([0, 1, 2, 0], device="tpu")
        linear = torch.nn.Linear(5, 3).to("tpu")
        with torch.autocast("tpu", dtype=torch.bfloat16):
            logits = linear(a)
            dtypes = {
                "mm": torch.mm(a, b), "addmm": torch.addmm(bias, a, b), "matmul": a @ b,
                "bmm": torch.bmm(a[None], b[None]), "linear": logits,
                "softmax": torch.softmax(logits, dim=-1), "log_softmax": F.log_softmax(logits, dim=-1),
                "cross_entropy": F.cross_entropy(logits, labels),
                "mse_loss": F.mse_loss(logits, torch.zeros_like(bias)),
                "sum": logits.sum(), "cpu_mm": torch.mm(a.cpu(), b.cpu()),
            }
        exact = torch.mm(a, b)
        emit({
            "dtypes": {name: str(tensor.dtype) for name, tensor in dtypes.items()},
            "outside": str(torch.mm(a, b).dtype),
            "close": torch.allclose(dtypes["mm"].float(), exact, rtol=2e-2, atol=5e-2),
            "rounded": not torch.equal(dtypes["mm"].float(), exact),
        })
        """,
    )
    dtypes = result["dtypes"]
    for name in ("mm", "addmm", "matmul", "bmm", "linear"):
        assert dtypes[name] == "torch.bfloat16", name
    for name in ("softmax", "log_softmax", "cross_entropy", "mse_loss", "sum"):
        assert dtypes[name] == "torch.float32", name
    assert dtypes["cpu_mm"] == "torch.float32"  # autocast("tpu") leaves the CPU alone
    assert result["outside"] == "torch.float32"
    assert result["close"] and result["rounded"]


def test_checkpoints_map_to_and_from_the_device(tmp_path):
    result = run_scenario(
        tmp_path,
        """
        install()
        base = torch.arange(6.0, device="tpu")
        torch.save({"base": base, "view": base[2:4], "host": torch.ones(2)}, "checkpoint.pt")


        def describe(checkpoint):
            checkpoint["view"].add_(100)  # still a view of base after loading
            return {name: [str(tensor.device), tensor.cpu().tolist()] for name, tensor in checkpoint.items()}


        emit({
            "as_saved": describe(torch.load("checkpoint.pt")),
            "cpu": describe(torch.load("checkpoint.pt", map_location="cpu")),
            "tpu": describe(torch.load("checkpoint.pt", map_location="tpu")),
            "device_object": describe(torch.load("checkpoint.pt", map_location=torch.device("tpu", 0))),
            "remapped": describe(torch.load("checkpoint.pt", map_location={"tpu:0": "cpu"})),
        })
        """,
    )
    values = {"base": [0, 1, 102, 103, 4, 5], "view": [102, 103], "host": [1, 1]}

    def expect(base_device: str, host_device: str) -> Dict[str, list]:
        return {"base": [base_device, values["base"]], "view": [base_device, values["view"]],
                "host": [host_device, values["host"]]}

    assert result["as_saved"] == expect("tpu:0", "cpu")
    assert result["cpu"] == result["remapped"] == expect("cpu", "cpu")
    assert result["tpu"] == result["device_object"] == expect("tpu:0", "tpu:0")


_SPAWN = """
import datetime
import os
import time

import torch.distributed as dist
import torch.multiprocessing as mp

WORLD_SIZE = 2
#: a bound on the ranks' run; each collective has the group's timeout
JOIN_TIMEOUT = 240


def spawn(worker):
    \"\"\"Run ``worker(rank, init_file)`` in WORLD_SIZE processes started with spawn; return what each returned.\"\"\"
    init_file = os.path.abspath("rendezvous")
    context = mp.start_processes(
        _run, args=(worker, init_file), nprocs=WORLD_SIZE, start_method="spawn", join=False
    )
    deadline = time.monotonic() + JOIN_TIMEOUT
    while not context.join(timeout=5):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            raise TimeoutError(f"the ranks did not finish in {JOIN_TIMEOUT} s")
    results = []
    for rank in range(WORLD_SIZE):
        with open(f"rank{rank}.json") as file:
            results.append(json.load(file))
    return results


def _run(rank, worker, init_file):
    install()
    dist.init_process_group(
        "tpu", init_method=f"file://{init_file}", rank=rank, world_size=WORLD_SIZE,
        timeout=datetime.timedelta(seconds=60),
    )
    try:
        result = worker(rank)
    finally:
        dist.destroy_process_group()
    with open(f"rank{rank}.json", "w") as file:
        json.dump(result, file)

"""


@standin_only
def test_ddp_over_the_tpu_backend_averages_the_gradients(tmp_path):
    """Two processes, started with spawn, train a DDP model on the device over the ``"tpu"`` backend: DDP
    broadcasts rank 0's weights, both ranks get the mean of their local gradients, and stay equal after a step."""
    result = run_scenario(
        tmp_path,
        _SPAWN
        + textwrap.dedent(
            """
        import copy

        import torch.nn.functional as F


        def params(module):
            return [p.detach().cpu().flatten().tolist() for p in module.parameters()]


        def train(rank):
            torch.manual_seed(rank)  # different weights on each rank: DDP broadcasts rank 0's
            model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)).to("tpu")
            own = params(model)
            ddp = torch.nn.parallel.DistributedDataParallel(model)
            local = copy.deepcopy(model)
            x, y = torch.randn(6, 4, device="tpu"), torch.randn(6, 2, device="tpu")
            F.mse_loss(ddp(x), y).backward()
            F.mse_loss(local(x), y).backward()
            initial = params(model)
            torch.optim.SGD(ddp.parameters(), lr=0.5).step()
            return {
                "own": own, "initial": initial, "stepped": params(model),
                "ddp_grads": [p.grad.cpu().flatten().tolist() for p in model.parameters()],
                "local_grads": [p.grad.cpu().flatten().tolist() for p in local.parameters()],
                "backend": dist.get_backend(), "devices": sorted({str(p.device) for p in model.parameters()}),
            }


        if __name__ == "__main__":
            emit(spawn(train))
        """
        ),
    )
    rank0, rank1 = result
    assert rank0["backend"] == rank1["backend"] == "tpu"
    assert rank0["devices"] == rank1["devices"] == ["tpu:0"]
    assert rank0["own"] != rank1["own"]
    assert rank0["initial"] == rank1["initial"] == rank0["own"]
    assert rank0["local_grads"] != rank1["local_grads"]
    assert rank0["ddp_grads"] == rank1["ddp_grads"]
    for ddp, local0, local1, initial, stepped in zip(
        rank0["ddp_grads"], rank0["local_grads"], rank1["local_grads"], rank0["initial"], rank0["stepped"]
    ):
        mean = [(a + b) / 2 for a, b in zip(local0, local1)]
        assert ddp == pytest.approx(mean, rel=1e-5, abs=1e-7)
        assert stepped == pytest.approx([w - 0.5 * g for w, g in zip(initial, mean)], rel=1e-5, abs=1e-6)
    assert rank0["stepped"] == rank1["stepped"]


@standin_only
def test_collectives_of_the_tpu_backend(tmp_path):
    result = run_scenario(
        tmp_path,
        _SPAWN
        + textwrap.dedent(
            """
        def collectives(rank):
            value = float(rank + 1)
            results = {}
            for op in ("SUM", "AVG", "MAX", "MIN"):
                tensor = torch.tensor([value, 10 * value], device="tpu")
                dist.all_reduce(tensor, op=getattr(dist.ReduceOp, op))
                results[op] = tensor.cpu().tolist()
            gathered = [torch.empty(1, device="tpu") for _ in range(WORLD_SIZE)]
            dist.all_gather(gathered, torch.tensor([value], device="tpu"))
            results["all_gather"] = [tensor.item() for tensor in gathered]
            flat = torch.empty(2 * WORLD_SIZE, device="tpu")
            dist.all_gather_into_tensor(flat, torch.tensor([value, -value], device="tpu"))
            results["all_gather_into_tensor"] = flat.cpu().tolist()
            scattered = torch.empty(1, device="tpu")
            dist.reduce_scatter_tensor(scattered, torch.tensor([value, 10 * value], device="tpu"))
            results["reduce_scatter_tensor"] = scattered.item()
            tensor = torch.tensor([value], device="tpu")
            dist.broadcast(tensor, src=1)
            results["broadcast"] = tensor.item()
            tensor = torch.tensor([value], device="tpu")
            dist.reduce(tensor, dst=0)
            results["reduce"] = tensor.item()
            objects = [{"from": rank} if rank == 1 else None]
            dist.broadcast_object_list(objects, src=1)
            results["broadcast_object_list"] = objects
            dist.barrier()
            try:
                dist.all_reduce(torch.ones(1))
                results["cpu_tensor"] = None
            except RuntimeError as err:
                results["cpu_tensor"] = str(err)
            return results


        if __name__ == "__main__":
            emit(spawn(collectives))
        """
        ),
    )
    for rank, results in enumerate(result):
        assert results["SUM"] == [3, 30] and results["AVG"] == [1.5, 15]
        assert results["MAX"] == [2, 20] and results["MIN"] == [1, 10]
        assert results["all_gather"] == [1, 2]
        assert results["all_gather_into_tensor"] == [1, -1, 2, -2]
        assert results["reduce_scatter_tensor"] == [3, 30][rank]
        assert results["broadcast"] == 2
        assert results["broadcast_object_list"] == [{"from": 1}]
        # registered for the "tpu" device only, as TorchTPU's backend
        assert "No backend type associated with device type cpu" in results["cpu_tensor"]
    assert result[0]["reduce"] == 3
