"""examples/llama_xla.py, the Llama-style decoder a TPU user starts from: it trains on a real text file on 4 XLA:CPU
devices with ``xla_spmd_fsdp``, ``bf16-mixed``, activation checkpointing, sharded checkpoints in object storage (a
``gs://`` URL on the GCS emulator) and the progress bar, and resumes exactly; its memory figures on paper
(docs/llama.md) are what autograd keeps and what the model holds.
"""
import importlib.util
import json
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from helpers.runif import RunIf

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "llama_xla.py"
TEXT = ROOT / "README.md"


def _example():
    spec = importlib.util.spec_from_file_location("llama_xla", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("llama_xla", module)
    spec.loader.exec_module(module)
    return module


def test_parameter_count_on_paper_is_the_models():
    import torch

    example = _example()
    for size in ("tiny", "bench"):
        model = example.Llama(example.SIZES[size])
        assert sum(p.numel() for p in model.parameters()) == example.parameter_count(example.SIZES[size])
    with torch.device("meta"):
        llama3 = example.Llama(example.SIZES["llama3-8b"])
    # Llama 3 8B's published size
    assert sum(p.numel() for p in llama3.parameters()) == example.parameter_count(example.SIZES["llama3-8b"])
    assert example.parameter_count(example.SIZES["llama3-8b"]) == 8_030_261_248


def _kept_bytes(example, config, batch, checkpointing):
    """Bytes of the distinct storages autograd keeps for the backward of one forward and loss, eager on the CPU under
    bfloat16 autocast (the example's model computes its norms, softmax and loss in float32 itself, as autocast on
    XLA does)."""
    import torch
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    model = example.Llama(config)
    tokens = torch.randint(0, config.vocab_size, (batch, config.sequence))
    labels = torch.randint(0, config.vocab_size, (batch, config.sequence))
    kept = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        kept[(storage.data_ptr(), storage.nbytes())] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            x = model.embed_tokens(tokens)
            for layer in model.layers:
                if checkpointing:
                    x = checkpoint(layer, x, model.rope_cos, model.rope_sin, use_reentrant=True)
                else:
                    x = layer(x, model.rope_cos, model.rope_sin)
            example.causal_lm_loss(model.lm_head(model.norm(x)), labels)
    return sum(kept.values())


@pytest.mark.parametrize("checkpointing", [False, True], ids=["kept", "checkpointed"])
def test_activation_bytes_on_paper_are_what_autograd_keeps(checkpointing):
    example = _example()
    # dimensions that differ from each other, so that no term can stand in for another
    base = example.LlamaConfig(vocab_size=104, hidden=40, layers=1, heads=4, kv_heads=2, intermediate=56, sequence=24)
    for config in (base, replace(base, layers=3), replace(base, sequence=12, heads=2, kv_heads=1),
                   replace(base, kv_heads=4)):
        # one more sequence in the batch: what each sequence adds (the weights' bfloat16 copies do not grow)
        per_sequence = _kept_bytes(example, config, 2, checkpointing) - _kept_bytes(example, config, 1, checkpointing)
        paper = example.activation_bytes_per_token(config, checkpointing)
        # with checkpointing, the recomputed layer lives during the backward only: not in the forward's count
        counted = paper["layers"] + paper["head"] + (0 if checkpointing else paper["recomputed_layer"])
        assert per_sequence == config.sequence * counted, config
    # the score matrices are the part that grows with the sequence
    scoreless = example.activation_bytes_per_token(base, False, scores=False)
    assert example.activation_bytes_per_token(base, False)["layers"] - scoreless["layers"] == 6 * 4 * 24


def _docs_rows():
    text = (ROOT / "docs" / "llama.md").read_text()
    rows = {}
    for line in text.splitlines():
        match = re.match(r"\| (v5p-8|v6e-8) \| (\w[\w ,-]*?) \| (.*) \|$", line)
        if match:
            rows[(match.group(1), match.group(2))] = [cell.strip() for cell in match.group(3).split("|")]
    return rows


def test_docs_give_the_memory_per_device_the_example_computes():
    example = _example()
    rows = _docs_rows()
    config = example.SIZES["llama3-8b"]
    expected = {}
    for chip, devices in (("v5p-8", 4), ("v6e-8", 8)):
        for name, checkpointing, scores in (("eager, kept", False, True), ("eager, checkpointed", True, True),
                                            ("flash, kept", False, False), ("flash, checkpointed", True, False)):
            memory = example.memory_per_device(config, devices, 1, checkpointing, scores)
            cells = [memory[k] for k in ("parameters", "gradients", "adam", "bf16_weights", "gathered_layer",
                                         "activations")]
            expected[(chip, name)] = [f"{c / 1e9:.1f}" for c in cells] + [f"{sum(cells) / 1e9:.1f}"]
    assert set(rows) == set(expected)
    for key, cells in expected.items():
        assert rows[key][:len(cells)] == cells, key


def test_a_text_shorter_than_a_window_is_refused_with_what_to_do(tmp_path):
    example = _example()
    short = tmp_path / "short.txt"
    short.write_text("too short")
    with pytest.raises(ValueError, match="give a longer text file"):
        example.TextWindows(str(short), example.load_tokenizer("bytes"), example.SIZES["tiny"])


def _train(env, *args):
    from helpers.xla_subprocess import subprocess_env

    proc = subprocess.run([sys.executable, str(EXAMPLE), "--size", "tiny", "--text", str(TEXT), *args],
                          env=subprocess_env(env), capture_output=True, text=True, timeout=400, cwd=str(ROOT))
    assert proc.returncode == 0, proc.stderr[-6000:]
    # the progress bar draws on stdout, as Lightning's does; the result is the last line
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stdout + proc.stderr


@RunIf(xla=True)
def test_tiny_llama_trains_on_four_devices_and_resumes_exactly_from_object_storage(gcs_bucket, gcs_env):
    from helpers.gcs_emulator import gcs_objects

    # as a user starts it: without the XLA log level that this process's torch_xla set for itself
    env = {"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "4", "HF_HUB_OFFLINE": "1", "TF_CPP_MIN_LOG_LEVEL": None,
           **gcs_env}
    whole, whole_log = _train(env, "--checkpoints", f"{gcs_bucket}/whole", "--steps", "12", "--checkpoint-every", "6")
    first, _ = _train(env, "--checkpoints", f"{gcs_bucket}/parts", "--steps", "6", "--checkpoint-every", "6")
    resumed, resumed_log = _train(env, "--checkpoints", f"{gcs_bucket}/parts", "--steps", "12",
                                  "--checkpoint-every", "6", "--resume")

    assert whole["parameters"] == 131_392 and whole["global_step"] == 12
    # it learns the text: the byte-level loss falls from about ln(256) = 5.55
    losses = whole["losses"]
    assert len(losses) == 12 and losses[0] > 5.3 and losses[-1] < losses[0] - 1.0
    # interrupted after step 6 and resumed from its sharded last.ckpt in the bucket: the same steps, to the bit
    assert first["losses"] == losses[:6]
    assert resumed["global_step"] == 12 and resumed["losses"] == losses[6:]
    # the checkpoint is a sharded one, in the bucket the run was given
    assert resumed["last_checkpoint"] == f"{gcs_bucket}/parts/last.ckpt"
    objects = gcs_objects(f"{gcs_bucket}/parts")
    assert any(o.endswith("/COMMITTED") for o in objects) and any(o.endswith(".distcp") for o in objects)
    # the progress bar, with the loss on it
    assert re.search(r"Epoch 0: .*loss=\d", whole_log)
    # a clean step, in the first run and the resumed one: the graph report found nothing to say
    assert "XLAGraphReportWarning" not in whole_log + resumed_log
    # nothing the user cannot act on: XLA's GSPMD notice (once per compilation and device: 88 lines before) and the
    # checkpoint libraries' warnings about their own internals (4 before), in the run and its resume
    assert "GSPMD sharding propagation" not in whole_log + resumed_log
    assert "UserWarning" not in whole_log + resumed_log


@RunIf(xla=True)
def test_the_quieted_warnings_show_again_when_asked(tmp_path):
    """``TF_CPP_MIN_LOG_LEVEL=1`` (torch_xla's default) shows XLA's GSPMD notice again, ``PL_XLA_LIBRARY_WARNINGS=1``
    the checkpoint libraries' warnings."""
    env = {"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "4", "HF_HUB_OFFLINE": "1", "TF_CPP_MIN_LOG_LEVEL": "1",
           "PL_XLA_LIBRARY_WARNINGS": "1"}
    _, log = _train(env, "--checkpoints", str(tmp_path / "run"), "--steps", "2", "--checkpoint-every", "2")
    assert "GSPMD sharding propagation is going to be deprecated" in log
    assert "UserWarning: torch.distributed is disabled, unavailable or uninitialized" in log


@RunIf(xla=True)
def test_the_quieted_library_warnings_leave_the_users_own(monkeypatch):
    """The filters match the library module that raises each warning: the same words from the user's code show."""
    import warnings

    from lightning_lite.strategies import xla_spmd

    monkeypatch.setattr(xla_spmd, "_library_warnings_quiet", False)
    monkeypatch.delenv("PL_XLA_LIBRARY_WARNINGS", raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        xla_spmd._quiet_library_warnings()
        warnings.warn("TypedStorage is deprecated, says my own code")
        warnings.warn_explicit("TypedStorage is deprecated", UserWarning, "filesystem.py", 133,
                               module="torch.distributed.checkpoint.filesystem")
    assert [str(w.message) for w in caught] == ["TypedStorage is deprecated, says my own code"]
