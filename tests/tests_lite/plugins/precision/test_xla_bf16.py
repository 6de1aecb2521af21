"""``precision="bf16"`` in Lite on XLA computes in bfloat16 in any process (fix `xla-bf16-converts-the-module`).

The old plugin set ``XLA_USE_BF16``, which torch_xla reads once, at the first XLA tensor of the process. The plugin
converts the module instead; its state dict, and so what ``save`` writes, stays in the module's own dtypes.
"""
import os

import torch

from helpers.runif import RunIf

FIXED_BY = "0013-xla-bf16-converts-the-module.patch"


@RunIf(xla=True)
def test_lite_bf16_computes_in_bfloat16_and_learns():
    import torch_xla

    from lightning_lite import LightningLite

    class Lite(LightningLite):
        def run(self):
            torch.manual_seed(0)
            net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
            model, opt = self.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
            g = torch.Generator().manual_seed(1)
            losses, hlo = [], None
            for _ in range(40):
                x = torch.randn(16, 8, generator=g)
                y = x.sum(dim=1, keepdim=True) * 0.3
                x, y = x.to(self.device), y.to(self.device)
                opt.zero_grad()
                loss = torch.nn.functional.mse_loss(model(x), y.to(torch.bfloat16))
                hlo = hlo or torch_xla._XLAC._get_xla_tensors_hlo([loss])
                self.backward(loss)
                opt.step()
                losses.append(float(loss.detach()))
            return hlo, losses, {p.dtype for p in net.parameters()}

    hlo, losses, dtypes = Lite(accelerator="tpu", devices=1, precision="bf16").run()
    assert "bf16" in hlo
    assert dtypes == {torch.bfloat16}
    assert "XLA_USE_BF16" not in os.environ
    assert sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5, losses


@RunIf(xla=True)
def test_lite_bf16_state_dict_and_teardown_give_the_original_dtypes(tmp_path):
    """While the module computes in bf16, its ``state_dict()`` (and the file ``save`` writes from it) holds each
    tensor in its original dtype, float32 or int64 (BatchNorm's ``num_batches_tracked``), as a copy of the bf16 value;
    ``keep_vars=True`` still gives the module's own tensors. The plugin's ``teardown`` converts the module back."""
    from lightning_lite import LightningLite

    original = {"0.weight": torch.float32, "0.bias": torch.float32, "1.weight": torch.float32,
                "1.bias": torch.float32, "1.running_mean": torch.float32, "1.running_var": torch.float32,
                "1.num_batches_tracked": torch.int64, "3.weight": torch.float32, "3.bias": torch.float32}
    computing = {k: torch.int64 if v == torch.int64 else torch.bfloat16 for k, v in original.items()}

    class Lite(LightningLite):
        def run(self):
            torch.manual_seed(0)
            self.net = torch.nn.Sequential(
                torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.Tanh(), torch.nn.Linear(16, 1)
            )
            model, opt = self.setup(self.net, torch.optim.SGD(self.net.parameters(), lr=0.1))
            for _ in range(3):
                x = torch.randn(16, 8).to(self.device)
                opt.zero_grad()
                loss = model(x).square().mean()
                self.backward(loss)
                opt.step()
            live = {k: v.dtype for k, v in model.state_dict(keep_vars=True).items()}
            state = model.state_dict()
            self.save(state, tmp_path / "model.pt")
            values = {k: (v.cpu(), self.net.state_dict(keep_vars=True)[k].cpu()) for k, v in state.items()}
            return live, {k: v.dtype for k, v in state.items()}, values

    lite = Lite(accelerator="tpu", devices=1, precision="bf16")
    live, state, values = lite.run()
    assert live == computing
    assert state == original
    for key, (saved, module_value) in values.items():
        assert torch.equal(saved, module_value.to(saved.dtype)), key
    loaded = torch.load(tmp_path / "model.pt", weights_only=False)
    assert {k: v.dtype for k, v in loaded.items()} == original
    assert {k: v.dtype for k, v in lite.net.state_dict(keep_vars=True).items()} == computing
    lite._strategy.teardown()
    assert {k: v.dtype for k, v in lite.net.state_dict(keep_vars=True).items()} == original
