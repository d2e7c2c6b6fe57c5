"""What the lowered train step hands to XLA: the operand dtypes of its dots and convolutions.

XLA:CPU upcasts half-precision dots to float32 when it compiles them (this CPU has no bf16
units), so the precision tests read the lowered program, which is what TPUs and GPUs run.
"""

import re

import jax

from phalanx._src.strategy.distribute import BatchDistributor


def matmuls(model, batch) -> list[tuple[str, tuple[str, ...]]]:
    """`(op, operand dtypes)` of every dot_general and convolution in `model`'s train step
    on the host `batch` (e.g. `(x, y)`), e.g. `("dot_general", ("bf16", "bf16"))`."""
    arrays, mask = BatchDistributor(model.strategy, pad_at_end=True).arrays(batch)
    text = jax.jit(model.engine.steps.train).lower(model.engine.state, arrays, mask).as_text()
    found = []
    for line in text.splitlines():
        match = re.search(r"stablehlo\.(dot_general|convolution).*:\s*\((.*)\)\s*->", line)
        if match:
            operands = tuple(re.findall(r"x(bf16|f16|f32|f64)>", match.group(2)))
            found.append((match.group(1), operands))
    return found
