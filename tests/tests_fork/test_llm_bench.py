"""The LLM benchmark (``make bench-llm``): the fork's Trainer and pytorch/xla's FSDPv2 recipe train the same
Llama-style decoder, each in its own process on 4 XLA:CPU devices, to the same losses; the compiled program's memory
is read from XLA's buffer assignment; the result files are stamped. Times are measured, never asserted."""
import json

import pytest

from helpers.runif import RunIf

BUFFER_ASSIGNMENT = """BufferAssignment:
allocation 0: size 24576, parameter 12, shape |f32[96,64]| at ShapeIndex {}, maybe-live-out:
 value: <3520 param.1 @0> (size=24576,offset=0): f32[96,64]{1,0}
allocation 7: size 1000, preallocated-temp:
allocation 9: size 500, preallocated-temp:
Total bytes used: 4113130 (3.92MiB)
"""


def test_the_largest_program_s_memory_is_read_from_its_buffer_assignment(tmp_path):
    from bench.llm_bench import compiled_memory

    (tmp_path / "module_0002.SyncTensorsGraph.2716.cpu_after_optimizations-buffer-assignment.txt").write_text(
        BUFFER_ASSIGNMENT)
    (tmp_path / "module_0003.SyncTensorsGraph.11.cpu_after_optimizations-buffer-assignment.txt").write_text(
        "BufferAssignment:\nallocation 0: size 8, preallocated-temp:\nTotal bytes used: 8 (8B)\n")
    assert compiled_memory(tmp_path) == {"program": "module_0002.SyncTensorsGraph", "total_bytes": 4113130,
                                         "temp_bytes": 1500}
    assert compiled_memory(tmp_path / "missing") is None


@RunIf(xla=True)
@pytest.mark.slow
def test_the_fork_and_the_recipe_train_to_the_same_losses(tmp_path, monkeypatch):
    from bench import llm_bench

    monkeypatch.setattr(llm_bench, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(llm_bench, "CONFIGS", (("32", False),))
    monkeypatch.setenv("PJRT_DEVICE", "CPU")
    llm_bench.main(["--rounds", "1", "--steps", "5", "--warmup", "3", "--rows", "fork,recipe", "--devices", "4"])
    data = json.loads((tmp_path / "results" / "llm.json").read_text())
    assert data["stamp"]["fork"].startswith("1.8.6+xla.") and data["stamp"]["digest"]
    entry = data["summary"]["32"]
    fork, recipe = entry["fork"], entry["recipe"]
    assert len(fork["losses"]) == len(recipe["losses"]) == 5
    # the same model, weights, data and Adam: the same losses, and it learns
    assert entry["fork_recipe_loss_difference"] <= 1e-5
    assert fork["losses"][-1] < fork["losses"][0] - 1.0
    # each row's compiled step, read from its dump: a program bigger than its temporary buffer
    for row in (fork, recipe):
        assert 0 < row["memory"]["temp_bytes"] < row["memory"]["total_bytes"]
    assert entry["hf"]["losses"] is None and entry["hf"]["step_s"] is None
    page = (tmp_path / "results" / "llm.md").read_text()
    assert "| 32 | fork |" in page and "| 32 | recipe |" in page and "| 32 | hf | not run |" in page
