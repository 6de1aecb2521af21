"""A Llama-style decoder trained with the Trainer on every XLA device of the host: what a TPU user starts from.

The model is written here: RMSNorm, rotary position embeddings, grouped-query attention and a SiLU-gated MLP, with
untied input and output embeddings (Llama 3's layout). It trains on a real text file, read through the byte-level
tokenizer below (the UTF-8 bytes: no vocabulary file, no download) or, with ``--tokenizer NAME``, any tokenizer that
``transformers``' ``AutoTokenizer`` loads (Llama 3's on a TPU VM), with:

- ``strategy="xla_spmd_fsdp"``: FSDPv2, every parameter and the Adam state sharded over all the devices, each
  ``DecoderLayer`` wrapped (its weights gathered for its own forward and backward only), the batch sharded too;
- ``precision="bf16-mixed"``: the matmuls in bfloat16 under ``torch.autocast("xla")``, float32 master weights;
- ``activation_checkpointing_policy={DecoderLayer}``: each layer keeps only its input for the backward and
  recomputes the rest (``--no-activation-checkpointing`` keeps everything);
- sharded checkpoints (``state_dict_type="sharded"``) at a path or an fsspec URL (``gs://bucket/run``), resumed with
  ``--resume``;
- the progress bar, with the loss on it.

    PJRT_DEVICE=CPU CPU_NUM_DEVICES=4 python examples/llama_xla.py --size tiny --text README.md \\
        --checkpoints /tmp/llama-run --steps 20
    python examples/llama_xla.py --size llama3-8b --tokenizer meta-llama/Meta-Llama-3-8B --text corpus.txt \\
        --checkpoints gs://my-bucket/llama3-8b --global-batch 8          # on a TPU VM (v5p-8, v6e-8)

``--size tiny`` is what ``make test`` trains on 4 XLA:CPU devices; ``--size llama3-8b`` is Llama 3 8B's shape (8.03
billion parameters, sequence 8192) for a TPU VM, where the memory it needs per device is in docs/llama.md
(``memory_per_device`` below computes it). The model is built on the host in float32 before it is sharded: 32 GB of
host memory for the 8B shape. The attention is the plain (eager) one, which keeps its score matrix for the backward:
see docs/llama.md for what that costs at long sequences.

At the end it prints one JSON line: the loss of each step and where the last checkpoint is.
"""
import argparse
import functools
import json
import math
import os
import sys
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class LlamaConfig:
    """The shape of the decoder. ``kv_heads`` < ``heads`` is grouped-query attention: each key/value head serves
    ``heads // kv_heads`` query heads."""

    vocab_size: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    sequence: int
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def __post_init__(self) -> None:
        if self.hidden % self.heads or self.heads % self.kv_heads:
            raise ValueError(f"{self}: `hidden` must be a multiple of `heads`, and `heads` of `kv_heads`")


SIZES: Dict[str, LlamaConfig] = {
    # what `make test` trains on 4 XLA:CPU devices (the 256 byte values)
    "tiny": LlamaConfig(vocab_size=256, hidden=64, layers=2, heads=4, kv_heads=2, intermediate=192, sequence=64),
    # what `make bench-llm` times: the shape of pytorch/xla's decoder-only example scaled down
    "bench": LlamaConfig(vocab_size=3200, hidden=256, layers=2, heads=4, kv_heads=2, intermediate=1024, sequence=256),
    # Llama 3 8B
    "llama3-8b": LlamaConfig(vocab_size=128256, hidden=4096, layers=32, heads=32, kv_heads=8, intermediate=14336,
                             sequence=8192, rope_theta=500000.0),
}


class RMSNorm(nn.Module):
    """Scales each vector to unit root mean square, then by a learned gain; computed in float32."""

    def __init__(self, hidden: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float()
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rotary_tables(config: LlamaConfig) -> Tuple[torch.Tensor, torch.Tensor]:
    """The cosines and sines of the rotary embedding: one rotation frequency per pair of a head's dimensions."""
    inverse = 1.0 / config.rope_theta ** (torch.arange(0, config.head_dim, 2, dtype=torch.float32) / config.head_dim)
    angles = torch.outer(torch.arange(config.sequence, dtype=torch.float32), inverse)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotates each pair (x[i], x[i + d/2]) of the last dimension by its position's angle."""
    half = x.shape[-1] // 2
    turned = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + turned * sin


class Attention(nn.Module):
    """Causal self-attention with grouped-query key/value heads and rotary embeddings on the queries and keys."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        d = config.head_dim
        self.q_proj = nn.Linear(config.hidden, config.heads * d, bias=False)
        self.k_proj = nn.Linear(config.hidden, config.kv_heads * d, bias=False)
        self.v_proj = nn.Linear(config.hidden, config.kv_heads * d, bias=False)
        self.o_proj = nn.Linear(config.heads * d, config.hidden, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        c = self.config
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, c.heads, c.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, c.kv_heads, c.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, c.kv_heads, c.head_dim).transpose(1, 2)
        q, k = rotate(q, cos[:s], sin[:s]), rotate(k, cos[:s], sin[:s])
        group = c.heads // c.kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(c.head_dim)
        causal = torch.ones(s, s, dtype=torch.bool, device=x.device).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
        # softmax in float32 (autocast does so too); the product with the values in the matmul dtype
        weights = scores.float().softmax(dim=-1).to(v.dtype)
        out = (weights @ v).transpose(1, 2).reshape(b, s, c.heads * c.head_dim)
        return self.o_proj(out)


class MLP(nn.Module):
    """The SiLU-gated feed-forward block: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden, config.intermediate, bias=False)
        self.up_proj = nn.Linear(config.hidden, config.intermediate, bias=False)
        self.down_proj = nn.Linear(config.intermediate, config.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm residual block: attention, then the MLP."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.input_norm = RMSNorm(config.hidden, config.norm_eps)
        self.attention = Attention(config)
        self.post_attention_norm = RMSNorm(config.hidden, config.norm_eps)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.input_norm(x), cos, sin)
        return x + self.mlp(self.post_attention_norm(x))


class Llama(nn.Module):
    """Token embedding, ``config.layers`` decoder layers, a final norm and the output projection to the vocabulary."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.layers))
        self.norm = RMSNorm(config.hidden, config.norm_eps)
        self.lm_head = nn.Linear(config.hidden, config.vocab_size, bias=False)
        cos, sin = rotary_tables(config)
        # computed, not learned: kept out of the state dict
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(tokens)
        for layer in self.layers:
            x = layer(x, self.rope_cos, self.rope_sin)
        return self.lm_head(self.norm(x))


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of each position's prediction of the next token, in float32."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1))


def parameter_count(config: LlamaConfig) -> int:
    """The model's parameters, on paper (what ``sum(p.numel() for p in Llama(config).parameters())`` counts)."""
    h, kv = config.hidden, config.kv_heads * config.head_dim
    layer = 2 * h * h + 2 * h * kv + 3 * h * config.intermediate + 2 * h
    return config.layers * layer + 2 * config.vocab_size * h + h


# --- memory per device, on paper (docs/llama.md) -------------------------------------------------------------------

def activation_bytes_per_token(config: LlamaConfig, checkpointing: bool, scores: bool = True) -> Dict[str, int]:
    """Bytes the forward keeps for the backward, per token of a sequence, under ``precision="bf16-mixed"``: what
    autograd saves with this module's eager attention (``tests/tests_pytorch/test_xla_llama_example.py`` counts the
    saved tensors with ``torch.autograd.graph.saved_tensors_hooks``, eager on the CPU under bf16 autocast, and
    compares). The compiler of a TPU program may
    keep less (it fuses) or more (it prefetches): this is the number on paper.

    ``layers``: every decoder layer's saved tensors; with checkpointing, each layer's float32 input only.
    ``recomputed_layer``: with checkpointing, one layer's saved tensors while its backward runs.
    ``head``: the token ids, the final norm, the output projection's input, the float32 log-probabilities and labels.
    ``scores=False`` leaves out the attention's score matrices (``sequence`` elements per token and head, float32
    softmax and its bfloat16 copy), which a flash-attention kernel does not keep: a lower bound for one.
    """
    h, q, i, v = config.hidden, config.heads * config.head_dim, config.intermediate, config.vocab_size
    norm = 4 * h + 4 + 4 * h        # an RMSNorm's float32 input, reciprocal RMS and normalised input
    layer = (
        norm + 3 * 2 * h            # input norm; q, k and v projections each keep their own bfloat16 cast of it
        + 2 * q + 2 * q             # rotated queries and the keys repeated to every query head, for the scores
        + 2 * q + 2 * q             # values repeated to every head and the attention output, for o_proj
        + norm + 2 * 2 * h          # post-attention norm; gate and up projections each keep a bfloat16 cast
        + 4 * 2 * i                 # gate and up outputs, silu(gate), their product (for down_proj)
    )
    if scores:
        layer += 6 * config.heads * config.sequence  # float32 softmax and its bfloat16 copy, per head
    head = 8 + norm + 2 * h + 4 * v + 8  # token ids, final norm, lm_head's input, log-softmax, labels
    if checkpointing:
        return {"layers": config.layers * 4 * h, "recomputed_layer": layer, "head": head}
    return {"layers": config.layers * layer, "recomputed_layer": 0, "head": head}


def memory_per_device(config: LlamaConfig, devices: int, sequences_per_device: int, checkpointing: bool,
                      scores: bool = True) -> Dict[str, float]:
    """Bytes per device under ``xla_spmd_fsdp`` with Adam and ``precision="bf16-mixed"``, on paper: parameters,
    gradients and Adam's two moments in float32, sharded over ``devices``, and autocast's bfloat16 copies of the
    weights (kept for the backward, sharded like them); one decoder layer's weights gathered whole while it runs (the
    FSDPv2 wrap); the activations of the device's own sequences (:func:`activation_bytes_per_token`)."""
    params = parameter_count(config)
    layer_params = (params - 2 * config.vocab_size * config.hidden - config.hidden) // config.layers
    tokens = sequences_per_device * config.sequence
    return {
        "parameters": 4 * params / devices,
        "gradients": 4 * params / devices,
        "adam": 8 * params / devices,
        "bf16_weights": 2 * params / devices,
        "gathered_layer": 4 * layer_params,
        "activations": tokens * sum(activation_bytes_per_token(config, checkpointing, scores).values()),
    }


# --- data ----------------------------------------------------------------------------------------------------------

class ByteTokenizer:
    """The UTF-8 bytes of a text as its token ids (0 to 255): every text has a tokenization, and nothing is
    downloaded. Called as ``transformers``' tokenizers are (``tokenizer(text)["input_ids"]``, ``len(tokenizer)``)."""

    def __call__(self, text: str, add_special_tokens: bool = False) -> Dict[str, List[int]]:
        return {"input_ids": list(text.encode("utf-8"))}

    def __len__(self) -> int:
        return 256


def load_tokenizer(name: str) -> Any:
    """``bytes``: :class:`ByteTokenizer`; anything else: a name or path for ``transformers``' ``AutoTokenizer``."""
    if name == "bytes":
        return ByteTokenizer()
    try:
        from transformers import AutoTokenizer
    except ImportError as err:
        raise ImportError(f"--tokenizer {name!r} loads through `transformers`: `pip install transformers`, or use"
                          " --tokenizer bytes") from err
    return AutoTokenizer.from_pretrained(name)


class TextWindows(torch.utils.data.Dataset):
    """The tokens of a text file cut into windows of ``sequence + 1`` tokens: the inputs and the next-token labels."""

    def __init__(self, path: str, tokenizer: Any, config: LlamaConfig) -> None:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        ids = torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.long)
        if len(tokenizer) > config.vocab_size:
            raise ValueError(f"the tokenizer has {len(tokenizer)} ids and the model's vocabulary {config.vocab_size}:"
                             " choose a tokenizer that fits the size, or a size whose vocabulary holds the tokenizer's")
        self.windows = len(ids) // (config.sequence + 1)
        if self.windows == 0:
            raise ValueError(f"{path} holds {len(ids)} tokens, fewer than one window of {config.sequence + 1}:"
                             " give a longer text file")
        self.ids = ids[: self.windows * (config.sequence + 1)].view(self.windows, config.sequence + 1)

    def __len__(self) -> int:
        return self.windows

    def __getitem__(self, index: int) -> Dict[str, torch.Tensor]:
        window = self.ids[index]
        return {"input_ids": window[:-1], "labels": window[1:]}


# --- training with the Trainer -------------------------------------------------------------------------------------

def lightning_module(config: LlamaConfig, learning_rate: float) -> Any:
    import pytorch_lightning as pl

    class LlamaLM(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = Llama(config)

        def training_step(self, batch: Dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
            loss = causal_lm_loss(self.model(batch["input_ids"]), batch["labels"])
            self.log("train_loss", loss, prog_bar=True)
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.Adam(self.parameters(), lr=learning_rate)

    return LlamaLM()


def loss_recorder() -> Any:
    """A callback that keeps the loss of every step, read once the run is over (reading it during the run would end
    the step's graph)."""
    import pytorch_lightning as pl

    class LossRecorder(pl.Callback):
        def __init__(self) -> None:
            self.losses: List[torch.Tensor] = []

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            self.losses.append(outputs["loss"].detach())

    return LossRecorder()


def train(args: argparse.Namespace) -> Dict[str, Any]:
    import pytorch_lightning as pl
    from pytorch_lightning.callbacks import ModelCheckpoint
    from pytorch_lightning.strategies import XLASPMDFSDPStrategy
    from torch_xla.distributed.fsdp.wrap import transformer_auto_wrap_policy

    config = SIZES[args.size]
    pl.seed_everything(args.seed)
    data = TextWindows(args.text, load_tokenizer(args.tokenizer), config)
    if len(data) < args.global_batch:
        raise ValueError(f"{args.text} gives {len(data)} windows of {config.sequence + 1} tokens, fewer than one batch of"
                         f" {args.global_batch}: give a longer text file or a smaller --global-batch")
    loader = torch.utils.data.DataLoader(data, batch_size=args.global_batch, shuffle=True, drop_last=True)
    strategy = XLASPMDFSDPStrategy(
        auto_wrap_policy=functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={DecoderLayer}),
        activation_checkpointing_policy={DecoderLayer} if args.activation_checkpointing else None,
        state_dict_type="sharded",
    )
    checkpoints = ModelCheckpoint(dirpath=args.checkpoints, every_n_train_steps=args.checkpoint_every, save_last=True,
                                  save_top_k=0)
    losses = loss_recorder()
    trainer = pl.Trainer(accelerator="tpu", strategy=strategy, precision="bf16-mixed", max_steps=args.steps,
                         max_epochs=-1, callbacks=[checkpoints, losses], logger=False, enable_progress_bar=True,
                         enable_model_summary=False, default_root_dir=args.checkpoints)
    module = lightning_module(config, args.learning_rate)
    resume = f"{args.checkpoints.rstrip('/')}/last.ckpt" if args.resume else None
    trainer.fit(module, loader, ckpt_path=resume)
    return {
        "size": args.size,
        "config": asdict(config),
        "parameters": sum(p.numel() for p in module.parameters()),
        "global_step": trainer.global_step,
        "losses": [float(loss) for loss in losses.losses],
        "last_checkpoint": checkpoints.last_model_path,
    }


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny", help="the model's shape (default: tiny)")
    parser.add_argument("--text", required=True, help="a UTF-8 text file to train on")
    parser.add_argument("--tokenizer", default="bytes",
                        help="'bytes' (the UTF-8 bytes; default) or a name/path for transformers' AutoTokenizer")
    parser.add_argument("--checkpoints", required=True,
                        help="where the sharded checkpoints go: a directory or an fsspec URL such as gs://bucket/run")
    parser.add_argument("--resume", action="store_true", help="resume from last.ckpt under --checkpoints")
    parser.add_argument("--steps", type=int, default=20, help="train until this global step")
    parser.add_argument("--checkpoint-every", type=int, default=10, help="save every N steps (and last.ckpt)")
    parser.add_argument("--global-batch", type=int, default=8,
                        help="sequences per step over all devices (a multiple of the number of devices)")
    parser.add_argument("--learning-rate", type=float, default=3e-3)
    parser.add_argument("--no-activation-checkpointing", dest="activation_checkpointing", action="store_false")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> None:
    args = parse_args(argv)
    # a TPU VM's chips, else XLA on the CPU (with CPU_NUM_DEVICES devices)
    os.environ.setdefault("PJRT_DEVICE", "TPU" if os.path.exists("/dev/accel0") or os.path.exists("/dev/vfio/0") else "CPU")
    # XLA's own C++ warnings off (set before torch_xla is imported): each compilation of a sharded program logs, once
    # per device, that GSPMD will be replaced by Shardy, which nothing in this script can change. Your warnings, and
    # XLA's errors, still show; TF_CPP_MIN_LOG_LEVEL=1 (torch_xla's default) shows XLA's warnings again
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    result = train(args)
    print(json.dumps(result), file=sys.stdout, flush=True)


if __name__ == "__main__":
    main()
