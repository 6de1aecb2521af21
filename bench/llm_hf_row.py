"""The "HF Trainer" row of the LLM benchmark: the same small Llama-style decoder (``examples/llama_xla.py``) trained
with ``transformers.Trainer`` under PyTorch/XLA SPMD FSDPv2 (``fsdp_config={"xla": True, "xla_fsdp_v2": True}``),
as a user of the HF Trainer would on a TPU VM.

The model is ``transformers``' own ``LlamaForCausalLM`` (eager attention) of the same shape, loaded with the example
model's initial weights. The caller must have called ``torch_xla.runtime.use_spmd()`` before any XLA tensor exists
(the Trainer does not; it sets the global ``("fsdp", "tensor")`` mesh itself, trainer.py:653). Under SPMD
``per_device_train_batch_size`` is the global batch.

Two workarounds for transformers 5.25.0 (line numbers in ``transformers/trainer.py``), in a ``Trainer`` subclass:

1. Optimizer never created under FSDP-XLA: ``_prepare_for_training`` delays the optimizer's creation for FSDP-XLA
   (l. 1732), skips ``create_optimizer`` (l. 1747), and, since the FSDPv2-wrapped model is not ``self.model``
   (l. 1764), goes to ``self.optimizer = self.accelerator.prepare(self.optimizer)`` with ``None`` (l. 1790) and
   ``create_scheduler`` (l. 1793): ``LambdaLR(None)`` -> ``'NoneType' object has no attribute 'param_groups'``.
   ``create_scheduler`` is overridden to create and prepare the optimizer first, after the wrap.
2. ``bf16=True`` does nothing on this path: ``autocast_smart_context_manager`` returns ``nullcontext`` (l. 2273),
   relying on ``accelerator.prepare(model)`` to patch the forward with autocast, which FSDP-XLA never calls
   (l. 1764, 1790). It is overridden to return ``torch.autocast("xla", dtype=torch.bfloat16)`` for "bf16-mixed".

The loss is the example's (labels already shifted, mean cross-entropy over every position in float32):
``compute_loss`` is overridden, since ``LlamaForCausalLM``'s own loss would shift the labels again.
"""
import shutil
import tempfile
import time
from typing import Any, Dict, List, Optional

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

import accelerate
import torch_xla.core.xla_model as xm
import transformers
from transformers import Trainer, TrainerCallback, TrainingArguments


def _hf_name(name: str) -> str:
    """The ``LlamaForCausalLM`` name of an ``examples/llama_xla.py`` ``Llama`` parameter."""
    if name.startswith("lm_head."):
        return name
    for ours, theirs in ((".input_norm.", ".input_layernorm."), (".post_attention_norm.", ".post_attention_layernorm."),
                         (".attention.", ".self_attn.")):
        name = name.replace(ours, theirs)
    return "model." + name


def _hf_model(config: Any, init_state: Dict[str, torch.Tensor]) -> "transformers.LlamaForCausalLM":
    """``LlamaForCausalLM`` of ``config``'s shape holding ``init_state`` (strict: every weight, nothing else; the
    rotary ``inv_freq`` buffers are non-persistent)."""
    hf_config = transformers.LlamaConfig(
        vocab_size=config.vocab_size, hidden_size=config.hidden, num_hidden_layers=config.layers,
        num_attention_heads=config.heads, num_key_value_heads=config.kv_heads, intermediate_size=config.intermediate,
        max_position_embeddings=config.sequence, rope_theta=config.rope_theta, rms_norm_eps=config.norm_eps,
        attn_implementation="eager", tie_word_embeddings=False, attention_bias=False, mlp_bias=False, use_cache=False)
    model = transformers.LlamaForCausalLM(hf_config)
    model.load_state_dict({_hf_name(k): v for k, v in init_state.items()}, strict=True)
    return model


class _Rows(Dataset):
    """The rows of ``batches``, in order: with a sequential sampler, batch ``i`` of the loader is ``batches[i]``."""

    def __init__(self, batches: List[Dict[str, torch.Tensor]]) -> None:
        self.batches, self.rows = batches, batches[0]["input_ids"].shape[0]

    def __len__(self) -> int:
        return len(self.batches) * self.rows

    def __getitem__(self, index: int) -> Dict[str, torch.Tensor]:
        batch = self.batches[index // self.rows]
        return {key: batch[key][index % self.rows] for key in ("input_ids", "labels")}


class _FsdpV2Trainer(Trainer):
    """``Trainer`` with the two FSDPv2 workarounds (module docstring) and the example's loss."""

    loss_is_scaled_for_ga = False  # compute_loss returns a per-batch mean

    def __init__(self, *args: Any, bf16_autocast: bool, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.bf16_autocast = bf16_autocast
        # the loss below takes no `num_items_in_batch`: do not count the labels for it every step
        self.model_accepts_loss_kwargs = False

    def create_scheduler(self, num_training_steps: int, optimizer: Optional[torch.optim.Optimizer] = None) -> Any:
        if optimizer is None and self.optimizer is None and self.is_fsdp_xla_enabled:
            self.create_optimizer()  # of self.model: the module FSDPv2 sharded in place, so its sharded parameters
            self.optimizer = self.accelerator.prepare(self.optimizer)
        return super().create_scheduler(num_training_steps, optimizer)

    def autocast_smart_context_manager(self, cache_enabled: Optional[bool] = True) -> Any:
        if self.bf16_autocast:
            return torch.autocast("xla", dtype=torch.bfloat16, cache_enabled=cache_enabled)
        return super().autocast_smart_context_manager(cache_enabled)

    def compute_loss(self, model: torch.nn.Module, inputs: Dict[str, torch.Tensor], return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> Any:
        outputs = model(input_ids=inputs["input_ids"], use_cache=False)  # no labels: HF computes no (shifting) loss
        logits = outputs.logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), inputs["labels"].reshape(-1))
        return (loss, outputs) if return_outputs else loss


class _Recorder(TrainerCallback):
    """Each step's logged loss, and the clock after step ``warmup`` and after the last step."""

    def __init__(self, warmup: int) -> None:
        self.warmup, self.losses = warmup, []
        self.t0: Optional[float] = None
        self.t1: Optional[float] = None

    def _clock(self) -> float:
        xm.wait_device_ops()
        return time.perf_counter()

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.warmup == 0:
            self.t0 = self._clock()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == self.warmup:
            # on_step_end comes BEFORE HF's logging (trainer.py:1994-1995), whose xm.mark_step() (l. 2289) cuts the
            # step's graph: here the step is still only traced, and wait_device_ops() alone would not run it. Cut it
            # now: the same graph HF's mark_step would cut a moment later (nothing runs in between), then wait.
            xm.mark_step()
            self.t0 = self._clock()

    def on_log(self, args: Any, state: Any, control: Any, logs: Optional[Dict[str, float]] = None,
               **kwargs: Any) -> None:
        if logs and "loss" in logs:  # logging_steps=1: the loss of step state.global_step alone
            self.losses.append(float(logs["loss"]))

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.t1 = self._clock()  # after the last step's log (mark_step + loss.item()) and HF's final mark_step


def run(batches: List[Dict[str, torch.Tensor]], init_state: Dict[str, torch.Tensor], config: Any, precision: str,
        checkpointing: bool, learning_rate: float, warmup: int) -> Dict[str, Any]:
    """Trains ``_hf_model(config, init_state)`` on ``batches`` (in order, one per step; labels already shifted) with
    the HF Trainer under FSDPv2 and Adam (``adamw_torch``, no weight decay, constant ``learning_rate``, no clipping).
    ``precision``: "32" or "bf16-mixed"; ``checkpointing``: activation checkpointing of each decoder layer.
    Returns the losses, ``t0``/``t1`` (``perf_counter`` after step ``warmup`` and after the last step, the device
    idle), ``steady_steps``, the workarounds applied (``notes``) and the library ``versions``."""
    if precision not in ("32", "bf16-mixed"):
        raise ValueError(f"precision {precision!r}: '32' or 'bf16-mixed'")
    bf16 = precision == "bf16-mixed"
    notes = [
        "optimizer: transformers 5.25.0 delays its creation under FSDP-XLA and never creates it (trainer.py:1732,"
        " 1764, 1790) -> LambdaLR(None) crash; create_scheduler overridden to create_optimizer() +"
        " accelerator.prepare() first, after the FSDPv2 wrap",
        "loss: labels are already shifted and LlamaForCausalLM's loss would shift them again; compute_loss overridden"
        " to F.cross_entropy(logits.float(), labels) over all positions, model_accepts_loss_kwargs=False",
        "order: train_sampling_strategy='sequential' (the default 'random' shuffles the rows)",
        "fsdp=True rather than the deprecated string 'full_shard': on the XLA path the string only sets"
        " fsdp_config['reshard_after_forward'], which FSDPv2 ignores",
        "timing: t0 at on_step_end of step `warmup` after xm.mark_step() + wait_device_ops(): HF cuts the step's"
        " graph only in its logging, after on_step_end",
        "xm.optimizer_step: HF's wrap_model_xla_fsdp replaces it process-wide; restored after the run",
    ]
    if bf16:
        notes.insert(1, "bf16: args.bf16 is a no-op on the FSDP-XLA path (autocast_smart_context_manager returns"
                        " nullcontext, trainer.py:2273, and accelerator.prepare(model) is never called);"
                        " overridden to return torch.autocast('xla', dtype=torch.bfloat16)")
    output_dir = tempfile.mkdtemp(prefix="llm_hf_row_")
    optimizer_step = xm.optimizer_step
    try:
        args = TrainingArguments(
            output_dir=output_dir, per_device_train_batch_size=batches[0]["input_ids"].shape[0],
            max_steps=len(batches), learning_rate=learning_rate, optim="adamw_torch", weight_decay=0.0,
            adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, lr_scheduler_type="constant", warmup_steps=0,
            max_grad_norm=0.0, logging_steps=1, report_to=[], save_strategy="no", dataloader_drop_last=True,
            train_sampling_strategy="sequential", seed=0, bf16=bf16, disable_tqdm=True, fsdp=True,
            fsdp_config={"xla": True, "xla_fsdp_v2": True, "xla_fsdp_grad_ckpt": checkpointing,
                         "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]})
        recorder = _Recorder(warmup)
        trainer = _FsdpV2Trainer(model=_hf_model(config, init_state), args=args, train_dataset=_Rows(batches),
                                 callbacks=[recorder], bf16_autocast=bf16)
        trainer.train()
    finally:
        xm.optimizer_step = optimizer_step
        shutil.rmtree(output_dir, ignore_errors=True)
    if len(recorder.losses) != len(batches):
        raise RuntimeError(f"{len(recorder.losses)} losses logged for {len(batches)} steps")
    return {"losses": recorder.losses, "t0": recorder.t0, "t1": recorder.t1, "steady_steps": len(batches) - warmup,
            "notes": notes, "versions": {"transformers": transformers.__version__,
                                         "accelerate": accelerate.__version__}}
