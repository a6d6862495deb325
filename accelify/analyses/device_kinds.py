"""What kind of device an expression picks (automatic, CPU, per process, other): the device
facts the placement codemods and the device analysis share; per-process devices need the
plan's distributed facts."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

import libcst as cst
import libcst.matchers as m

from accelify.queries.devices import AUTO_DEVICE_STRINGS, CPU_STRINGS, CURRENT_ACCELERATOR, TORCH_DEVICE
from accelify.queries.names import has_qname, string_value
from accelify.queries.refs import bound_once, ref_of

# --------------------------------------------------------------------------
# devices


@dataclass(frozen=True)
class DeviceKind:
    """What a device expression means for a migration.

    ``auto``: the accelerator if there is one, else the CPU: exactly what
    ``Accelerator()`` picks.  ``cpu``: the CPU only.  ``other``: anything else
    (a flag, a rank, an index): accelify leaves it to a human.
    """

    kind: str  # "auto" | "cpu" | "other"
    detail: str = ""


def classify_device(visitor: cst.MetadataDependent, expr: cst.BaseExpression) -> Optional[DeviceKind]:
    """Classify an expression that *looks like* a device; ``None`` if it does not."""
    if per_process_device(visitor, expr) or is_option_device(visitor, expr):
        return DeviceKind("auto")
    if chosen_index(visitor, expr) is not None:
        return DeviceKind("auto", "chosen index")
    # `device_str = "cuda"`, bound once, read in `torch.device(device_str if ... else "cpu")` (resnet1d)
    constant = bound_once(visitor, expr) if isinstance(expr, cst.Name) else expr
    text = string_value(constant) if constant is not None else None
    if text is not None:
        if text in AUTO_DEVICE_STRINGS:
            return DeviceKind("auto")
        if text in CPU_STRINGS:
            return DeviceKind("cpu")
        if re.fullmatch(r"(cuda|xpu|npu|mps)(:\d+)?", text):
            return DeviceKind("other", f"fixed device {text!r}")
        return None
    if isinstance(expr, cst.Call):
        if has_qname(visitor, expr.func, TORCH_DEVICE):
            if not expr.args:
                return None
            first = expr.args[0]
            if first.keyword is not None and first.keyword.value != "type":
                return None
            inner = classify_device(visitor, first.value)
            if len(expr.args) > 1:
                index = expr.args[1].value
                if isinstance(index, cst.Integer) and index.value == "0" and inner and inner.kind == "auto":
                    return inner
                return DeviceKind("other", "device with an explicit index")
            if inner is None:
                return DeviceKind("other", "device built from a runtime value")
            return inner
        if has_qname(visitor, expr.func, CURRENT_ACCELERATOR):
            return DeviceKind("auto")
        return None
    if isinstance(expr, cst.Attribute) and expr.attr.value == "type" and isinstance(expr.value, cst.Call):
        if has_qname(visitor, expr.value.func, CURRENT_ACCELERATOR):
            return DeviceKind("auto")
        return None
    if isinstance(expr, cst.IfExp):
        body = classify_device(visitor, expr.body)
        orelse = classify_device(visitor, expr.orelse)
        if body is None and orelse is None:
            return None
        if body is None or orelse is None:
            return DeviceKind("other", "conditional device")
        if body.kind == "auto" and orelse.kind in ("auto", "cpu"):
            # An availability check, or a flag (`use_cuda`), that becomes `Accelerator(cpu=not flag)`.
            return DeviceKind("auto")
        return DeviceKind("other", "device chosen by a condition accelify cannot map")
    return None


#: option and configuration attributes that hold the index of the one GPU a script trains on
GPU_INDEX_NAMES = frozenset({"gpu", "gpu_id", "gpuid", "gpu_index", "gpu_idx", "gpu_no", "gpu_num", "device_id",
                             "cuda_id", "cuda_device", "which_gpu", "gpu_device"})


def gpu_index_option(visitor: cst.MetadataDependent, expr: cst.BaseExpression) -> Optional[cst.Attribute]:
    """``args.gpu_id`` (``opt.gpu``, ``cfg.device_id``): an option or configuration attribute named as a
    GPU index, directly or through a name bound to it once (``gpu = args.gpu``); the attribute."""
    if isinstance(expr, cst.Name):
        bound = bound_once(visitor, expr)
        if bound is None:
            return None
        expr = bound
    if isinstance(expr, cst.Attribute) and expr.attr.value in GPU_INDEX_NAMES and isinstance(expr.value, cst.Name) \
            and expr.value.value not in ("self", "torch", "cuda"):
        return expr
    return None


def chosen_index(visitor: cst.MetadataDependent, expr: cst.BaseExpression) -> Optional[cst.Attribute]:
    """``f"cuda:{args.gpu_id}"``, ``"cuda:{}".format(args.gpu)``, ``"cuda:%d" % opt.gpu``,
    ``"cuda:" + str(args.gpu)``, ``torch.device("cuda", args.gpu)``: the accelerator at an index the user
    chose (the attribute), which a launcher chooses under Accelerate, one per process."""
    index: Optional[cst.BaseExpression] = None
    if isinstance(expr, cst.Call) and len(expr.args) == 2 and has_qname(visitor, expr.func, TORCH_DEVICE) and (
            expr.args[0].keyword is None or expr.args[0].keyword.value == "type"):
        inner = classify_device(visitor, expr.args[0].value)
        if inner is not None and inner.kind == "auto":
            index = expr.args[1].value
    elif isinstance(expr, cst.FormattedString) and len(expr.parts) == 2:
        text, value = expr.parts
        if isinstance(text, cst.FormattedStringText) and text.value in _INDEXED and isinstance(
                value, cst.FormattedStringExpression) and value.format_spec is None:
            index = value.expression
    elif isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and expr.func.attr.value == "format" \
            and string_value(expr.func.value) in {f"{t}{{}}" for t in _INDEXED} and len(expr.args) == 1:
        index = expr.args[0].value
    elif isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.Modulo) \
            and string_value(expr.left) in {f"{t}%d" for t in _INDEXED} | {f"{t}%s" for t in _INDEXED}:
        index = expr.right
    elif isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.Add) \
            and string_value(expr.left) in _INDEXED and isinstance(expr.right, cst.Call) \
            and m.matches(expr.right.func, m.Name("str")) and len(expr.right.args) == 1:
        index = expr.right.args[0].value
    return gpu_index_option(visitor, index) if index is not None else None


_INDEXED = frozenset({"cuda:", "xpu:", "npu:"})


def is_option_device(visitor: cst.MetadataDependent, expr: cst.BaseExpression) -> bool:
    """``args.device``: the ``--device`` option of ``plan.option_device``, read on its namespace
    (:mod:`accelify.analyses.option_devices`): the training device the user chose."""
    plan = getattr(visitor, "plan", None)
    option = getattr(plan, "option_device", None)
    return (option is not None and isinstance(expr, cst.Attribute) and expr.attr.value == option[1]
            and isinstance(expr.value, cst.Name) and ref_of(visitor, expr.value) in plan.option_namespaces)  # type: ignore[union-attr]


def _formatted_device(expr: cst.BaseExpression) -> Optional[cst.BaseExpression]:
    """``"cuda:{}".format(x)``: ``x``; None for anything else."""
    if isinstance(expr, cst.Call) and len(expr.args) == 1 and expr.args[0].keyword is None and isinstance(
        expr.func, cst.Attribute
    ) and expr.func.attr.value == "format" and string_value(expr.func.value) in ("cuda:{}", "xpu:{}", "npu:{}"):
        return expr.args[0].value
    return None


def per_process_device(visitor: cst.MetadataDependent, expr: cst.BaseExpression) -> bool:
    """``f"cuda:{local_rank}"``, ``torch.device("cuda", local_rank)``, ``torch.device(f"cuda:{rank}")``
    in a script that managed its own processes: each process's own accelerator, ``accelerator.device``."""
    plan = getattr(visitor, "plan", None)
    if plan is None or getattr(plan, "distributed", None) is None:
        return False
    from accelify.analyses.ranks import MAIN_TESTS, rank_attribute

    def rank(e: cst.BaseExpression) -> bool:
        return rank_attribute(visitor, e, plan) in MAIN_TESTS

    if isinstance(expr, cst.FormattedString) and len(expr.parts) == 2:
        text, value = expr.parts
        return (isinstance(text, cst.FormattedStringText) and text.value in ("cuda:", "xpu:", "npu:")
                and isinstance(value, cst.FormattedStringExpression) and value.format_spec is None
                and rank(value.expression))
    if (index := _formatted_device(expr)) is not None:  # "cuda:{}".format(gpu)
        return rank(index)
    if isinstance(expr, cst.Call) and has_qname(visitor, expr.func, TORCH_DEVICE) and expr.args:
        if len(expr.args) == 1:
            return per_process_device(visitor, expr.args[0].value)
        if len(expr.args) == 2 and string_value(expr.args[0].value) in ("cuda", "xpu", "npu"):
            return rank(expr.args[1].value)
    return False
