"""``precision="bf16"`` in Lite on XLA computes in bfloat16 in any process (fix 0013).

The old plugin set ``XLA_USE_BF16``, which torch_xla reads once, at the first XLA tensor of the process.
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
