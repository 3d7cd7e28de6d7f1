"""Linear layers whose weights are reordered once for oneDNN: CPU inference (decoding, §6.1).

PyTorch's float32 CPU matrix products go through MKL, which on AMD processors (this project's
machine) runs about 100 GFLOP/s on the decoder's shapes; oneDNN with the weight reordered once
into its blocked layout (what ``torch.compile``'s CPU freezing does) runs about 230 GFLOP/s on
the same shapes, in float32 (bfloat16: 10 to 20% faster than unpacked). Decoding multiplies the
same weights by a few hundred rows at every step, so the one-off reorder pays at once. Packed
weights carry no gradient: inference only, on a copy of the model.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import MultiHeadAttention
from .layers import FeedForward


def packing_available(dtype: torch.dtype = torch.float32) -> bool:
    """oneDNN and its packed linear operators are in this PyTorch build (CPU builds and most CUDA
    ones) and can pack ``dtype`` weights: bfloat16 needs AVX-512 (BW, VL, DQ) or AVX-NE-CONVERT."""
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")):
        return False
    if dtype != torch.bfloat16:
        return True
    supported = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return supported is not None and bool(supported())


# oneDNN post-operations PackedLinear can fuse, by the function of ``layers.ACTIVATIONS`` they
# replace: (oneDNN's name, algorithm). An activation missing here is applied unfused.
FUSABLE_ACTIVATIONS = {F.relu: ("relu", ""), F.gelu: ("gelu", "none")}  # gelu "none": the exact erf form


class PackedLinear(nn.Module):
    """y = act(x W^T + b) with W reordered once for oneDNN; x (..., in) on CPU, W's dtype.

    ``activation`` (``F.relu``, ``F.gelu`` or None) is applied by oneDNN on the product's
    output while it is still in cache, rather than by a second pass over it.
    """

    def __init__(self, weight: Tensor, bias: Tensor | None, activation: Callable[[Tensor], Tensor] | None = None
                 ) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.weight = torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), None)
        self.bias = None if bias is None else bias.detach().contiguous()
        self.post_op, self.algorithm = ("none", "") if activation is None else FUSABLE_ACTIVATIONS[activation]

    def forward(self, x: Tensor) -> Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, self.post_op, [], self.algorithm)


def pack_linears(model: nn.Module) -> nn.Module:
    """Replace every ``nn.Linear`` of ``model`` (on CPU, in eval mode) by a ``PackedLinear``, give
    each ``MultiHeadAttention`` packed W^QKV, W^Q and W^KV projections, and fuse each
    ``FeedForward``'s activation into its first layer. In place; returns ``model`` (left as it is,
    in eval mode, where ``packing_available`` says its weights' dtype cannot be packed)."""
    model.eval()
    if not packing_available(next(model.parameters()).dtype):
        return model
    for module in list(model.modules()):
        if isinstance(module, FeedForward) and module.activation in FUSABLE_ACTIVATIONS:
            first = module.linear1
            module.linear1 = PackedLinear(first.weight, first.bias, activation=module.activation)
            module.activation = nn.Identity()
        if isinstance(module, MultiHeadAttention):
            d, w, b = module.d_model, module.in_proj.weight, module.in_proj.bias
            module.packed_projections = {"qkv": PackedLinear(w, b), "q": PackedLinear(w[:d], b[:d]),
                                         "kv": PackedLinear(w[d:], b[d:])}
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear) and not (isinstance(module, MultiHeadAttention) and name == "in_proj"):
                setattr(module, name, PackedLinear(child.weight, child.bias))
    return model
