"""Linear layers that can multiply against a prepacked CPU weight (oneDNN's blocked layout).

On CPU, a float32 `F.linear` runs MKL's sgemm, which first copies the whole weight into its
blocked layout, on every call. For a step of a few dozen rows (a prefix hit's suffix, a
batch of verification windows) that copy costs about as much as the product itself.
`Linear.prepack()` keeps the weight a second time in oneDNN's layout
(`torch.ops.mkldnn._reorder_linear_weight`, the prepacking torch's own compiler does for
frozen CPU graphs), and `forward` multiplies against it (`torch.ops.mkldnn._linear_pointwise`)
when all of these hold, else it is `F.linear` as before:

* the input has at least `PACKED_MIN_ROWS` rows (decode steps of a few sequences keep
  MKL: with 1-2 rows it is as fast, and a 4-sequence decode step of 8 rows measured no
  gain from the pack);
* autograd is off (the packed op has no backward; the tiny draft is trained with `F.linear`);
* the weight is the tensor that was packed, unchanged since (`_version`): a reloaded or
  trained weight falls back to `F.linear` until `prepack()` runs again.

Both paths compute in the weight's dtype with float32 accumulation; they differ only in
summation order (a few float32 ulps). `prepack_linears(module)` prepacks every `Linear`
inside a module on CPU, where oneDNN is built in; elsewhere it does nothing. The model runner
calls it for the target's decoder layers and the draft (docs/model.md, "Prepacked weights").
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

PACKED_MIN_ROWS = 16


def packing_available(device: torch.device) -> bool:
    """oneDNN's linear prepacking exists in this torch build and applies to `device`."""
    if device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    try:
        torch.ops.mkldnn._reorder_linear_weight  # noqa: B018 (an attribute probe)
        torch.ops.mkldnn._linear_pointwise  # noqa: B018
    except (AttributeError, RuntimeError):
        return False
    return True


class Linear(nn.Linear):
    """`nn.Linear` (same parameters, same state dict) with an optional prepacked weight."""

    packed: torch.Tensor | None = None
    packed_version: int = -1
    packed_source: int = 0

    def prepack(self) -> None:
        weight = self.weight.detach()
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)
        self.packed_version = weight._version
        self.packed_source = weight.data_ptr()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        packed = self.packed
        if (
            packed is not None
            and x.dim() == 2
            and x.shape[0] >= PACKED_MIN_ROWS
            and not torch.is_grad_enabled()
            and self.weight._version == self.packed_version
            and self.weight.data_ptr() == self.packed_source
            and x.dtype == self.weight.dtype
        ):
            bias = None if self.bias is None else self.bias.detach()
            return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)


def prepack_linears(module: nn.Module) -> int:
    """Prepack every `Linear` in `module` if its device supports it; returns how many."""
    layers = [m for m in module.modules() if isinstance(m, Linear)]
    if not layers or not packing_available(layers[0].weight.device):
        return 0
    for layer in layers:
        layer.prepack()
    return len(layers)
