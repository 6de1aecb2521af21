"""``is_param_in_hook_signature`` reads a function's parameters once, and answers as before."""
import functools
import inspect

import pytest
from pytorch_lightning.utilities.signature_utils import is_param_in_hook_signature

from helpers.python_calls import calls_of

FIXED_BY = "0034-hook-signature-read-once-per-function.patch"


def _getfullargspec_calls(fn) -> int:
    return calls_of(inspect.getfullargspec.__code__, fn)


class Module:
    def training_step(self, batch, batch_idx):
        pass

    def step_varargs(self, batch, *args):
        pass

    def step_iter(self, dataloader_iter):
        pass


def test_a_method_is_inspected_once():
    module = Module()
    assert is_param_in_hook_signature(module.training_step, "batch_idx", min_args=2)

    def every_batch():
        for _ in range(5):
            assert is_param_in_hook_signature(module.training_step, "batch_idx", min_args=2)
            assert not is_param_in_hook_signature(module.training_step, "dataloader_iter", explicit=True)

    assert _getfullargspec_calls(every_batch) == 0


@pytest.mark.guard  # unchanged behaviour, right before the fix too
def test_answers_are_unchanged():
    module = Module()
    assert not is_param_in_hook_signature(module.step_varargs, "batch_idx", explicit=True)
    assert is_param_in_hook_signature(module.step_varargs, "batch_idx")  # *args may take it
    assert is_param_in_hook_signature(module.step_iter, "dataloader_iter", explicit=True)
    assert not is_param_in_hook_signature(module.step_iter, "batch_idx", min_args=2)
    assert is_param_in_hook_signature(Module.training_step, "batch_idx")  # the plain function: `self` is args[0]

    def plain(batch, batch_idx):
        pass

    # a partial and a function with a __signature__ are read every time, as getfullargspec reads them
    partial = functools.partial(plain, 1)
    assert not is_param_in_hook_signature(partial, "batch_idx")  # args ["batch_idx"][1:]

    def with_signature(self, batch):
        pass

    assert not is_param_in_hook_signature(with_signature, "batch_idx")
    with_signature.__signature__ = inspect.signature(Module.training_step)
    assert is_param_in_hook_signature(with_signature, "batch_idx")

    # a function given another code object answers for its new parameters
    def swapped(self, batch):
        pass

    assert not is_param_in_hook_signature(swapped, "batch_idx")
    swapped.__code__ = Module.training_step.__code__
    assert is_param_in_hook_signature(swapped, "batch_idx")
