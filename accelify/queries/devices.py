"""Device spellings: the qualified names and strings that name or test for an accelerator."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from accelify.queries.names import code_of, has_qname

TORCH_DEVICE = frozenset({"torch.device"})
AVAILABILITY_CHECKS = frozenset(
    {
        "torch.cuda.is_available",
        "torch.backends.mps.is_available",
        "torch.accelerator.is_available",
        "torch.xpu.is_available",
        "torch.npu.is_available",
        "torch.mps.is_available",
    }
)
CURRENT_ACCELERATOR = frozenset({"torch.accelerator.current_accelerator"})
# Accelerator device types a single-process script would pick "automatically".
AUTO_DEVICE_STRINGS = frozenset({"cuda", "cuda:0", "mps", "xpu", "xpu:0", "npu", "npu:0"})
CPU_STRINGS = frozenset({"cpu"})


def is_availability_check(visitor: cst.MetadataDependent, test: cst.BaseExpression) -> bool:
    """``torch.cuda.is_available()`` and friends, possibly combined with ``and``."""
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
        return is_availability_check(visitor, test.left) and is_availability_check(visitor, test.right)
    if isinstance(test, cst.Call) and not test.args:
        return has_qname(visitor, test.func, AVAILABILITY_CHECKS)
    if m.matches(test, m.Call(func=m.Name("hasattr"), args=[m.Arg(), m.Arg(value=m.SimpleString())])):
        # `hasattr(torch.backends, "mps") and torch.backends.mps.is_available()`: a feature check of torch's
        return code_of(test.args[0].value).startswith("torch.")  # type: ignore[attr-defined]
    if isinstance(test, cst.Comparison) and isinstance(test.left, cst.Call):
        # torch.cuda.device_count() > 0
        return has_qname(visitor, test.left.func, frozenset({"torch.cuda.device_count"})) and m.matches(
            test, m.Comparison(comparisons=[m.ComparisonTarget(operator=m.GreaterThan(), comparator=m.Integer("0"))])
        )
    return False
