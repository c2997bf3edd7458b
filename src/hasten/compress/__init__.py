"""Compression after (or during) training: pruning and quantization, and the artifacts and
reports of `hasten compress`.

    import hasten.compress as hc
    hc.global_magnitude_prune(model, 0.5)            # unstructured, on torch.nn.utils.prune
    small, changes = hc.prune_structured(model, 0.3, inputs=batch)   # a smaller model of the same class
    hc.make_permanent(model)                         # masks folded into the weights
    hc.quantize_linear(model, "int8")                # torchao int8 (dynamic activations) for Linear layers
    qmodel = hc.quantize_static(model, [batch])      # torchao PT2E int8 for convs on x86

Here: structured (channels, MLP units, heads), quantize (torchao), artifact (the file
format), measure (CPU inference cost), outputs (the files a compression writes), pipeline
(`hasten compress` / `hasten eval`). Magnitude pruning (global or per layer) and gradual
pruning (an Algorithm with a cubic sparsity schedule) are methods like any other, in
hasten.algorithms.magnitude_pruning and hasten.algorithms.gradual_pruning; this face
re-exports their functional forms for compression after training. Cards: docs/methods/magnitude_pruning.md,
structured_pruning.md, gradual_pruning.md, quantization.md; guide: docs/compression.md.
"""
from .artifact import read_artifact, save_artifact
from ..algorithms.gradual_pruning import GradualPruning, cubic_sparsity
from .measure import inference_cost
from ..algorithms.magnitude_pruning import (count_parameters, global_magnitude_prune, is_pruned, layer_magnitude_prune,
                                           layer_sparsity, make_permanent, masks, prunable_weights)
from .quantize import MODES, int8_hardware, quantize_linear, quantize_static
from .structured import prune_structured, structured_plan

__all__ = ["GradualPruning", "MODES", "count_parameters", "cubic_sparsity", "global_magnitude_prune", "inference_cost",
           "int8_hardware", "is_pruned", "layer_magnitude_prune", "layer_sparsity", "make_permanent", "masks",
           "prunable_weights", "prune_structured", "quantize_linear", "quantize_static", "read_artifact",
           "save_artifact", "structured_plan"]
