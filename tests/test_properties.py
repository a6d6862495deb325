"""Property-based tests of the pipeline's guarantees (hypothesis, hypothesmith).

Inputs:

* PyTorch training scripts composed from the pieces accelify converts (imports and their
  aliases, device construction or ``.cuda()``, a model class / Sequential / Linear, an
  optimizer, an optional scheduler, DataLoaders over TensorDatasets, a training loop with
  placement, clipping, accumulation or AMP, an evaluation loop, saving, printing or logging,
  helpers, ``main()`` with or without its guard), drawn with varied names, statement orders,
  comments, blank lines, whitespace, indentation, quotes, line endings and final newline;
* generic Python from hypothesmith (from the grammar and from LibCST's node types): alone,
  in front of a look-alike script of another framework, or after a training script.

Properties: (a) converting never raises and valid input gets no error (internal or other);
(b) the output compiles; (c) a second pass changes nothing; (d) a file that does not use torch
comes out byte for byte; a converted file imports and creates an Accelerator; the line endings
and the final newline are kept.

Every test is derandomized: the same examples on every run. ACCELIFY_PROPERTY_SCALE=10 runs
ten times as many. Bugs found are pinned at the bottom as strict xfails with a minimal source.
"""

from __future__ import annotations

import contextlib

import os
import warnings
from dataclasses import dataclass
from typing import Optional, Union

import hypothesmith
import libcst as cst
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from libcst.metadata import MetadataWrapper, ScopeProvider

from accelify.core.pipeline import convert_source

# the pipeline compiles what it is given: hypothesmith's programs make CPython warn
pytestmark = pytest.mark.filterwarnings("ignore::SyntaxWarning")

SETTINGS = dict(
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)


def convert(source: str, path: str = "script.py"):
    """Property (a): never raises, and valid input never gives an error (internal or other)."""
    result = convert_source(source, path)
    assert result.error is None, result.error
    assert result.source == source
    return result


def assert_compiles(output: str) -> None:
    """Property (b)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)
        compile(output, "<output>", "exec", dont_inherit=True)


def assert_idempotent(output: str) -> None:
    """Property (c): converting the output changes nothing."""
    again = convert(output, "again.py")
    assert again.output == output
    assert not again.changes


def module_bindings(source: str, name: str) -> int:
    """How many statements bind ``name`` in the module's own scope (assignments, defs, imports)."""
    wrapper = MetadataWrapper(cst.parse_module(source))
    scope = wrapper.resolve(ScopeProvider)[wrapper.module]
    return len(scope.assignments[name])


def compiles(source: str) -> bool:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)
            compile(source, "<generated>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return False
    return True


# ---------------------------------------------------------------------------------------------
# A script: nested statements, rendered with drawn layout


@dataclass
class Block:
    header: str
    body: list["Item"]


Item = Union[str, Block]  # a statement (one logical line) or a compound statement


def block(header: str, *body: Item) -> Block:
    return Block(header, [item for item in body if item is not None])


COMMENTS = [
    "# setup",
    "#TODO: tune this",
    "# Move everything to the GPU.",
    "# entraînement du modèle",
    "#   indented comment",
    "# noqa",
    "# type: ignore",
    "#",
    "# ---- training ----",
    "# 训练",
]


@dataclass(frozen=True)
class Layout:
    indent: str
    newline: str
    final_newline: bool
    comments: bool  # scatter comments: own lines, trailing, inside brackets
    blanks: bool  # scatter blank lines inside blocks
    whitespace: bool  # trailing whitespace, and blank lines holding the indentation
    header: tuple[str, ...]  # shebang, coding line, licence: comments before anything else
    footer: Optional[str]  # a comment after the last statement


@st.composite
def layouts(draw) -> Layout:
    header = draw(st.lists(st.sampled_from(HEADERS), max_size=2, unique=True))
    return Layout(
        indent=draw(st.sampled_from(["    ", "  ", "\t", "        "])),
        newline=draw(st.sampled_from(["\n", "\r\n"])),
        final_newline=draw(st.integers(0, 3)) > 0,
        comments=draw(st.booleans()),
        blanks=draw(st.booleans()),
        whitespace=draw(st.integers(0, 3)) == 0,
        header=tuple(sorted(header, key=HEADERS.index)),
        footer=draw(st.sampled_from([None, None, None, "# end", "# EOF  "])),
    )


HEADERS = ["#!/usr/bin/env python", "# -*- coding: utf-8 -*-", "# Copyright (c) the authors. Licensed under MIT."]


def render(draw, layout: Layout, top: list[Item]) -> str:
    """The text of ``top``. A statement may span lines (split at ``"\\n"``): its continuation lines
    (inside brackets, or after a backslash) are indented one more level, a closing bracket is not."""
    lines: list[str] = list(layout.header)

    def blank(pad: str) -> str:
        return pad if layout.whitespace and draw(st.booleans()) else ""

    def decorate(depth: int, first: bool) -> None:
        pad = layout.indent * depth
        if layout.blanks and not first and draw(st.integers(0, 5)) == 0:
            lines.append(blank(pad))
        if layout.comments and draw(st.integers(0, 4)) == 0:
            lines.append(pad + draw(st.sampled_from(COMMENTS)))

    def trailing(line: str) -> str:
        if line.endswith("\\"):
            return line
        if layout.comments and draw(st.integers(0, 6)) == 0:
            line += draw(st.sampled_from(["  ", " ", "\t"])) + draw(st.sampled_from(COMMENTS))
        if layout.whitespace and draw(st.integers(0, 4)) == 0:
            line += draw(st.sampled_from([" ", "  ", "\t"]))
        return line

    def emit(items: list[Item], depth: int) -> None:
        pad = layout.indent * depth
        for index, item in enumerate(items):
            if depth == 0 and index and isinstance(item, Block) and item.header.startswith(("def ", "class ")):
                lines.extend(blank("") for _ in range(draw(st.integers(0, 2))))
            elif depth == 0 and index and isinstance(items[index - 1], Block):
                lines.extend(blank("") for _ in range(draw(st.integers(0, 2))))
            decorate(depth, index == 0)
            if isinstance(item, Block):
                lines.append(trailing(pad + item.header))
                emit(item.body, depth + 1)
                continue
            first, *rest = item.split("\n")
            lines.append(trailing(pad + first))
            for part in rest:
                lines.append(trailing(pad + ("" if part.startswith((")", "]")) else layout.indent) + part))

    emit(top, 0)
    if layout.footer:
        lines.append(layout.footer)
    text = layout.newline.join(lines)
    return text + layout.newline if layout.final_newline else text


# ---------------------------------------------------------------------------------------------
# Training scripts

MODEL = ["model", "net", "network", "clf"]
OPTIMIZER = ["optimizer", "opt", "optimiser"]
LOADER = ["loader", "train_loader", "train_dataloader", "dl"]
EVAL_LOADER = ["eval_loader", "test_loader", "val_loader", "eval_dataloader"]
DATASET = ["dataset", "train_set", "ds"]
DEVICE = ["device", "dev", "DEVICE"]
BATCH = [("x", "y"), ("inputs", "targets"), ("data", "target"), ("images", "labels"), ("xb", "yb")]
LOSS = ["loss", "batch_loss", "l"]
EPOCH = ["epoch", "ep", "e"]
SCHEDULER = ["scheduler", "sched", "lr_sched"]
CRITERION = ["criterion", "loss_fn"]
CLASS = ["Net", "Model", "MLP", "Classifier"]
# names a helper gives its parameters (disjoint per role, and from every name above of another role)
P_MODEL = ["model", "m", "module"]
P_LOADER = ["loader", "data_loader", "batches"]
P_OPTIMIZER = ["optimizer", "optim_", "o"]
P_DEVICE = ["device", "dev", "target_device"]
P_CRITERION = ["criterion", "crit"]


@dataclass(frozen=True)
class Script:
    source: str
    layout: Layout
    #: False where a refusal is by design: helpers that need the Accelerator, in a file without
    #: a `__main__` block (their signatures are not accelify's to change, ACC106/ACC114)
    expect_conversion: bool = True


class Imports:
    """The lines a script's imports are made of, and how the code then spells each name."""

    def __init__(self, draw, torch: str) -> None:
        self.lines: list[str] = []
        alias = draw(st.sampled_from([torch, torch, "T", "th"]))
        self.lines.append(f"import {torch}" if alias == torch else f"import {torch} as {alias}")
        self.T = alias

        nn = draw(st.sampled_from(["from", "alias", "attr"]))
        if nn == "from":
            self.lines.append(f"from {torch} import nn")
            self.nn = "nn"
        elif nn == "alias":
            self.lines.append(f"import {torch}.nn as nn")
            self.nn = "nn"
        else:
            self.nn = f"{alias}.nn"

        optim = draw(st.sampled_from(["from", "alias", "attr", "class"]))
        if optim == "from":
            self.lines.append(f"from {torch} import optim")
            self.optim = "optim"
        elif optim == "alias":
            self.lines.append(f"import {torch}.optim as optim")
            self.optim = "optim"
        elif optim == "attr":
            self.optim = f"{alias}.optim"
        else:
            self.optim = None  # `from torch.optim import SGD`, added once the optimizer is drawn
        self.torch_module = torch

        functional = draw(st.sampled_from(["alias", "from", "attr", "func"]))
        if functional == "alias":
            self.lines.append(f"import {torch}.nn.functional as F")
            self.cross_entropy = "F.cross_entropy"
        elif functional == "from":
            self.lines.append(f"from {torch}.nn import functional as F")
            self.cross_entropy = "F.cross_entropy"
        elif functional == "attr":
            self.cross_entropy = f"{self.nn}.functional.cross_entropy"
        else:
            self.lines.append(f"from {torch}.nn.functional import cross_entropy")
            self.cross_entropy = "cross_entropy"

        data = draw(st.sampled_from(["from", "from_alias", "module"]))
        names = "DataLoader, TensorDataset" if data == "from" else "DataLoader as DL, TensorDataset"
        if data != "module":
            if draw(st.integers(0, 3)) == 0:  # parenthesized, one name a line
                names = "(\n" + ",\n".join(names.split(", ")) + draw(st.sampled_from([",\n)", "\n)"]))
            self.lines.append(f"from {torch}.utils.data import {names}")
            self.DataLoader, self.TensorDataset = "DataLoader" if data == "from" else "DL", "TensorDataset"
        else:
            self.lines.append(f"from {torch}.utils import data as tud")
            self.DataLoader, self.TensorDataset = "tud.DataLoader", "tud.TensorDataset"

    def optimizer_class(self, name: str) -> str:
        if self.optim is None:
            self.lines.append(f"from {self.torch_module}.optim import {name}")
            return name
        return f"{self.optim}.{name}"

    def step_lr(self, draw) -> str:
        if self.optim is not None and draw(st.booleans()):
            return f"{self.optim}.lr_scheduler.StepLR"
        self.lines.append(f"from {self.torch_module}.optim.lr_scheduler import StepLR")
        return "StepLR"


def ordered(draw, items: dict[str, tuple[list[Item], set[str]]]) -> list[Item]:
    """The statements of ``items`` (name -> (statements, names it must follow)) in a drawn
    order that respects the dependencies: a random topological order."""
    done: list[str] = []
    out: list[Item] = []
    pending = dict(items)
    while pending:
        ready = sorted(name for name, (_, after) in pending.items() if after <= set(done) | (after - set(items)))
        name = ready[draw(st.integers(0, len(ready) - 1))]
        out.extend(pending.pop(name)[0])
        done.append(name)
    return out


@st.composite
def training_scripts(draw, torch: str = "torch") -> Script:
    layout = draw(layouts())
    q = draw(st.sampled_from(['"', "'"]))
    imp = Imports(draw, torch)
    T, nn = imp.T, imp.nn

    model = draw(st.sampled_from(MODEL))
    opt = draw(st.sampled_from(OPTIMIZER))
    loader = draw(st.sampled_from(LOADER))
    eval_loader = draw(st.sampled_from(EVAL_LOADER))
    dataset = draw(st.sampled_from(DATASET))
    device = draw(st.sampled_from(DEVICE))
    x, y = draw(st.sampled_from(BATCH))
    loss = draw(st.sampled_from(LOSS))
    epoch = draw(st.sampled_from(EPOCH))
    sched = draw(st.sampled_from(SCHEDULER))

    use_device = draw(st.integers(0, 4)) > 0
    cuda_calls = use_device and draw(st.integers(0, 4)) == 0  # `.cuda()` rather than a device variable
    with_tqdm = draw(st.integers(0, 3)) == 0
    with_scheduler = draw(st.booleans())
    with_eval = draw(st.booleans())
    with_save = draw(st.booleans())
    with_seed = draw(st.booleans())
    with_args = draw(st.booleans())
    logging_kind = draw(st.sampled_from(["none", "print", "print", "logging", "logger"]))
    structure = draw(st.sampled_from(["flat", "main", "main_unguarded", "guard_block"]))
    train_helper = draw(st.booleans())
    extra = draw(st.sampled_from(["plain", "plain", "plain", "clip", "accumulate"] + ([] if train_helper else ["amp"])))
    eval_helper = with_eval and draw(st.booleans())
    model_kind = draw(st.sampled_from(["class", "sequential", "linear"]))
    loss_kind = draw(st.sampled_from(["functional", "criterion"]))
    criterion = draw(st.sampled_from(CRITERION))

    extra_imports: list[str] = []
    if with_args:
        extra_imports.append("import argparse")
    if logging_kind in ("logging", "logger"):
        extra_imports.append("import logging")
    if draw(st.booleans()):
        extra_imports.append("import os")
    if with_tqdm:
        extra_imports.append("from tqdm import tqdm")
    module_level: list[Item] = []  # constants, class, helpers
    if extra == "accumulate":
        module_level.append("ACCUM_STEPS = 2")

    def moved(expr: str, dev: Optional[str], non_blocking: bool = False) -> str:
        if cuda_calls:
            return f"{expr}.cuda(non_blocking=True)" if non_blocking else f"{expr}.cuda()"
        return f"{expr}.to({dev}, non_blocking=True)" if non_blocking else f"{expr}.to({dev})"

    # the model
    if model_kind == "class":
        cls = draw(st.sampled_from(CLASS))
        module_level.append(
            block(
                f"class {cls}({nn}.Module):",
                block(
                    "def __init__(self):",
                    "super().__init__()",
                    f"self.fc1 = {nn}.Linear(8, 16)",
                    f"self.fc2 = {nn}.Linear(16, 2)",
                ),
                block("def forward(self, x):", f"return self.fc2({T}.relu(self.fc1(x)))"),
            )
        )
        build_model = f"{cls}()"
    elif model_kind == "sequential":
        build_model = f"{nn}.Sequential({nn}.Linear(8, 16), {nn}.ReLU(), {nn}.Linear(16, 2))"
    else:
        build_model = f"{nn}.Linear(8, 2)"

    # setup statements, each with the statements it must follow
    setup: dict[str, tuple[list[Item], set[str]]] = {}
    if with_seed:
        setup["seed"] = ([f"{T}.manual_seed(0)"], set())
    if with_args:
        setup["args"] = (
            [
                "parser = argparse.ArgumentParser()",
                f"parser.add_argument({q}--epochs{q}, type=int, default=2)",
                "args = parser.parse_args()",
            ],
            set(),
        )
        epochs = "args.epochs"
    else:
        epochs = str(draw(st.integers(1, 3)))
    if logging_kind == "logging":
        setup["logging"] = (["logging.basicConfig(level=logging.INFO)"], set())
    elif logging_kind == "logger":
        module_level.insert(0, "logger = logging.getLogger(__name__)")
        setup["logging"] = (["logging.basicConfig(level=logging.INFO)"], set())

    if use_device and not cuda_calls:
        cuda = f"{q}cuda{q} if {T}.cuda.is_available() else {q}cpu{q}"
        device_kind = draw(st.sampled_from(["torch.device", "string", "cuda0", "flag", "from_import"]))
        if device_kind == "torch.device":
            setup["device"] = ([f"{device} = {T}.device({cuda})"], set())
        elif device_kind == "string":
            setup["device"] = ([f"{device} = {cuda}"], set())
        elif device_kind == "cuda0":
            setup["device"] = ([f"{device} = {T}.device({q}cuda:0{q} if {T}.cuda.is_available() else {q}cpu{q})"], set())
        elif device_kind == "flag":
            setup["device"] = (
                [
                    f"use_cuda = {T}.cuda.is_available()",
                    f"{device} = {T}.device({q}cuda{q} if use_cuda else {q}cpu{q})",
                ],
                set(),
            )
        else:
            imp.lines.append(f"from {torch} import device as Device")
            setup["device"] = ([f"{device} = Device({cuda})"], set())

    n_train, n_eval = draw(st.sampled_from([64, 32])), draw(st.sampled_from([40, 70]))
    data = [
        f"{dataset} = {imp.TensorDataset}({T}.randn({n_train}, 8), {T}.randint(0, 2, ({n_train},)))",
        draw(
            st.sampled_from(
                [
                    f"{loader} = {imp.DataLoader}({dataset}, batch_size=8, shuffle=True)",
                    f"{loader} = {imp.DataLoader}(\n{dataset},\nbatch_size=8,\nshuffle=True,\n)",
                    f"{loader} = {imp.DataLoader}({dataset},\nbatch_size=8, shuffle=True)",
                    f"{loader} = \\\n{imp.DataLoader}({dataset}, batch_size=8, shuffle=True)",
                ]
            )
        ),
    ]
    setup["data"] = (data, set())
    if with_eval:
        setup["eval_data"] = (
            [
                f"{eval_loader} = {imp.DataLoader}({imp.TensorDataset}({T}.randn({n_eval}, 8), "
                f"{T}.randint(0, 2, ({n_eval},))), batch_size=16)"
            ],
            set(),
        )

    placement = draw(st.sampled_from(["inline", "stmt", "rebind", "stmt_after_optimizer"])) if use_device else None
    needs_device = set() if cuda_calls else {"device"}
    if placement == "inline":
        setup["model"] = ([f"{model} = {moved(build_model, device)}"], needs_device)
    elif placement in ("stmt", "rebind"):
        move = moved(model, device) if placement == "stmt" else f"{model} = {moved(model, device)}"
        setup["model"] = ([f"{model} = {build_model}", move], needs_device)
    else:
        setup["model"] = ([f"{model} = {build_model}"], set())
        if placement == "stmt_after_optimizer":
            setup["place"] = ([moved(model, device)], needs_device | {"optimizer"})
    if extra == "amp":
        setup["scaler"] = ([f"scaler = {T}.cuda.amp.GradScaler()"], set())
        autocast = draw(st.sampled_from([f"with {T}.autocast(device_type={q}cuda{q}):", f"with {T}.cuda.amp.autocast():"]))
    optimizer_name = draw(st.sampled_from(["SGD", "Adam", "AdamW"]))
    lr = draw(st.sampled_from(["0.1", "1e-3", "lr=0.01"]))
    lr = lr if lr.startswith("lr=") else f"lr={lr}"
    optimizer_class = imp.optimizer_class(optimizer_name)
    build_optimizer = draw(
        st.sampled_from(
            [
                f"{opt} = {optimizer_class}({model}.parameters(), {lr})",
                f"{opt} = {optimizer_class}(\n{model}.parameters(), {lr}\n)",
                f"{opt} = {optimizer_class}(params={model}.parameters(), {lr})",
            ]
        )
    )
    if torch != "torch":
        # a look-alike framework: the optimizer is set up with the model (Chainer's way), not built
        # over `model.parameters()`, which accelify takes for a torch optimizer whatever its module
        # (see test_a_paddle_script_is_not_converted below)
        build_optimizer = f"{opt} = {optimizer_class}({lr})\n{opt}.setup({model})"
    setup["optimizer"] = (build_optimizer.split("\n") if torch != "torch" else [build_optimizer], {"model"})
    if with_scheduler:
        setup["scheduler"] = ([f"{sched} = {imp.step_lr(draw)}({opt}, step_size=1, gamma=0.5)"], {"optimizer"})
    if loss_kind == "criterion":
        setup["criterion"] = ([f"{criterion} = {nn}.CrossEntropyLoss()"], set())

    def inner_loop(m: str, ldr: str, o: str, dev: Optional[str], crit: str) -> Block:
        """One pass over the training batches (``dev``: the device batches go to, if any)."""
        batch_placement = draw(st.sampled_from(["tuple", "separate", "inline", "semicolon"])) if dev else None
        non_blocking = draw(st.integers(0, 3)) == 0
        enumerate_it = draw(st.booleans()) or extra == "accumulate"
        zero_grad = draw(st.sampled_from(["before", "after", "first"]))
        batches = f"tqdm({ldr})" if with_tqdm else ldr
        header = f"for step, ({x}, {y}) in enumerate({batches}):" if enumerate_it else f"for {x}, {y} in {batches}:"
        body: list[Item] = []
        if zero_grad == "first" and extra != "accumulate":
            body.append(f"{o}.zero_grad()")
        xs, ys = x, y
        if batch_placement == "tuple":
            body.append(f"{x}, {y} = {moved(x, dev, non_blocking)}, {moved(y, dev, non_blocking)}")
        elif batch_placement == "separate":
            body += [f"{x} = {moved(x, dev, non_blocking)}", f"{y} = {moved(y, dev, non_blocking)}"]
        elif batch_placement == "semicolon":
            body.append(f"{x} = {moved(x, dev, non_blocking)}; {y} = {moved(y, dev, non_blocking)}")
        elif batch_placement == "inline":
            xs, ys = moved(x, dev, non_blocking), moved(y, dev, non_blocking)
        if zero_grad == "before" and extra != "accumulate":
            body.append(f"{o}.zero_grad()")
        forward: list[Item] = []
        if draw(st.booleans()):
            forward.append(f"output = {m}({xs})")
            logits = "output"
        else:
            logits = f"{m}({xs})"
        compute = f"{crit}({logits}, {ys})" if loss_kind == "criterion" else f"{imp.cross_entropy}({logits}, {ys})"
        forward.append(draw(st.sampled_from([f"{loss} = {compute}", f"{loss} = \\\n{compute}"])))
        if extra == "amp":
            body.append(block(autocast, *forward))
            body += [f"scaler.scale({loss}).backward()", f"scaler.step({o})", "scaler.update()"]
        elif extra == "accumulate":
            body += forward + [f"{loss} = {loss} / ACCUM_STEPS", f"{loss}.backward()"]
            body.append(block("if (step + 1) % ACCUM_STEPS == 0:", f"{o}.step()", f"{o}.zero_grad()"))
        else:
            body += forward + [f"{loss}.backward()"]
            if extra == "clip":
                body.append(f"{nn}.utils.clip_grad_norm_({m}.parameters(), 1.0)")
            body.append(f"{o}.step()")
        if zero_grad == "after" and extra != "accumulate":
            body.append(f"{o}.zero_grad()")
        if enumerate_it and logging_kind != "none" and draw(st.booleans()):
            body.append(block("if step % 2 == 0:", log(f"step {{step}} loss {{{loss}.item():.4f}}")))
        return block(header, *body)

    def log(message: str) -> str:
        if logging_kind in ("print", "none"):
            return f"print(f{q}{message}{q})"
        target = "logging" if logging_kind == "logging" else "logger"
        return f"{target}.info(f{q}{message}{q})"

    def eval_loop(m: str, ldr: str, dev: Optional[str]) -> list[Item]:
        xs, ys = (moved(x, dev), moved(y, dev)) if dev else (x, y)
        return [
            f"{m}.eval()",
            "correct, total = 0, 0",
            block(
                f"with {T}.no_grad():",
                block(
                    f"for {x}, {y} in {ldr}:",
                    f"pred = {m}({xs}).argmax(dim=1)",
                    f"correct += (pred == {ys}).sum().item()",
                    f"total += {y}.size(0)",
                ),
            ),
        ]

    # helpers
    dev_arg = device if use_device else None  # (`moved` ignores it under cuda_calls)
    if train_helper:
        pm, pl, po = draw(st.sampled_from(P_MODEL)), draw(st.sampled_from(P_LOADER)), draw(st.sampled_from(P_OPTIMIZER))
        pd = draw(st.sampled_from(P_DEVICE)) if use_device and not cuda_calls else None
        pc = draw(st.sampled_from(P_CRITERION)) if loss_kind == "criterion" else None
        params = [(pm, model), (pl, loader), (po, opt)] + ([(pd, device)] if pd else [])
        params += [(pc, criterion)] if pc else []
        params = draw(st.permutations(params))
        returns = draw(st.booleans())
        helper = draw(st.sampled_from(["train", "train_one_epoch", "fit_epoch"]))
        annotations = {pm: f": {nn}.Module", po: ": object", pd: ": str"} if draw(st.integers(0, 3)) == 0 else {}
        signature = ", ".join(p + annotations.get(p, "") for p, _ in params)
        module_level.append(
            block(
                f"def {helper}({signature})" + (" -> float:" if annotations and returns else ":"),
                f'"""Train for one epoch."""' if draw(st.booleans()) else None,
                f"{pm}.train()",
                inner_loop(pm, pl, po, pd or ("<cuda>" if cuda_calls else None), pc),
                f"return {loss}.item()" if returns else None,
            )
        )
        by_keyword = draw(st.integers(0, 3)) == 0
        call = f"{helper}({', '.join(f'{p}={a}' if by_keyword else a for p, a in params)})"
        epoch_body: list[Item] = [f"last = {call}" if returns else call]
        last = "last" if returns else None
    else:
        epoch_body = [f"{model}.train()"] if draw(st.booleans()) else []
        epoch_body.append(inner_loop(model, loader, opt, dev_arg, criterion))
        last = f"{loss}.item()"
    if with_scheduler:
        epoch_body.append(f"{sched}.step()")
    if logging_kind != "none" and last:
        epoch_body.append(log(f"epoch {{{epoch}}}: loss {{{last}:.4f}}"))

    after_training: list[Item] = []
    if with_eval:
        if eval_helper:
            with_device = use_device and not cuda_calls
            params = [("model", model), ("loader", eval_loader)] + ([("device", device)] if with_device else [])
            module_level.append(
                block(
                    f"def evaluate({', '.join(p for p, _ in params)}):",
                    *eval_loop("model", "loader", "device" if with_device else "<cuda>" if cuda_calls else None),
                    "return correct / total",
                )
            )
            evaluation: list[Item] = [f"accuracy = evaluate({', '.join(a for _, a in params)})"]
        else:
            evaluation = eval_loop(model, eval_loader, dev_arg) + ["accuracy = correct / total"]
        if logging_kind != "none":
            evaluation.append(log("accuracy {accuracy:.3f}"))
        if draw(st.booleans()):
            epoch_body += evaluation  # evaluate every epoch
        else:
            after_training += evaluation
    if with_save:
        after_training.append(f"{T}.save({model}.state_dict(), {q}model.pt{q})")

    body = ordered(draw, setup) + [block(f"for {epoch} in range({epochs}):", *epoch_body)] + after_training

    # the file
    top: list[Item] = []
    if draw(st.booleans()):
        top.append(f'"""A small training script."""' if q == '"' else "'''A small training script.'''")
    if draw(st.integers(0, 3)) == 0:
        top.append("from __future__ import annotations")
    imports = extra_imports + imp.lines
    top += draw(st.permutations(imports))
    top += module_level
    guard = f"if __name__ == {q}__main__{q}:"
    if structure == "flat":
        top += body
    elif structure == "guard_block":
        top.append(block(guard, *body))
    else:
        top.append(block("def main():", *body))
        top.append(block(guard, "main()") if structure == "main" else "main()")
    source = render(draw, layout, top)
    helpers = train_helper or eval_helper
    expect = torch == "torch" and not (structure == "main_unguarded" and helpers)
    return Script(source, layout, expect_conversion=expect)


# ---------------------------------------------------------------------------------------------
# Properties of training scripts

#: ACCELIFY_PROPERTY_SCALE=10 runs ten times the examples (a longer hunt than CI's).
SCALE = float(os.environ.get("ACCELIFY_PROPERTY_SCALE", "1"))


def examples(n: int) -> dict:
    return dict(SETTINGS, max_examples=max(1, round(n * SCALE)))


@settings(**examples(10))
@given(training_scripts())
def test_training_script_converts_to_valid_stable_code(script: Script) -> None:
    assert compiles(script.source), "the generator made invalid Python"
    result = convert(script.source)  # (a)
    assert_compiles(result.output)  # (b)
    assert_idempotent(result.output)  # (c)
    if result.changed:
        assert "accelerator" in result.output
        assert "from accelerate import Accelerator" in result.output
        assert result.changes
        # the names the conversion adds are bound once, by the conversion
        assert module_bindings(result.output, "Accelerator") == 1
        assert module_bindings(result.output, "accelerator") <= 1
    else:
        assert result.output == script.source
    if script.expect_conversion:
        # every piece the generator draws is one accelify converts: a refusal is a regression
        assert result.changed, [f"{f.code} {f.message}" for f in result.findings]


def line_endings(text: str) -> tuple[set[str], str]:
    """The line terminators a text uses, and how it ends ("\\r\\n", "\\n", or "" for no newline)."""
    lines = text.splitlines(keepends=True)
    ends = {line[len(line.rstrip("\r\n")):] for line in lines}
    return ends - {""}, lines[-1][len(lines[-1].rstrip("\r\n")):] if lines else ""


@settings(**examples(6))
@given(training_scripts())
def test_line_endings_and_final_newline_are_kept(script: Script) -> None:
    result = convert(script.source)
    ends, last = line_endings(result.output)
    assert ends == {script.layout.newline}  # with CRLF, every line of the output ends with CRLF
    assert last == (script.layout.newline if script.layout.final_newline else "")


# ---------------------------------------------------------------------------------------------
# Generic Python, and files that do not use torch

generic_python = st.one_of(hypothesmith.from_grammar(), hypothesmith.from_node())


@settings(**examples(40))
@given(generic_python, st.booleans())
def test_generic_python_is_left_alone(source: str, analysed: bool) -> None:
    """(a), (b), (d) on arbitrary code, half of it through the whole analysis rather than only the
    syntax check the pre-check (precheck.may_train) gives a file that cannot train."""
    from unittest import mock

    assume(compiles(source))  # the grammar admits a few programs CPython rejects (`return` at top level)
    with mock.patch("accelify.core.pipeline.without_analysis",
                    lambda text, path: None) if analysed else contextlib.nullcontext():
        result = convert(source)
    assert_compiles(result.output)
    assert result.output == source and not result.changes


@settings(**examples(12))
@given(generic_python, st.sampled_from(["", "\n", "\n\n"]), training_scripts(torch="fakeml"))
def test_a_torch_free_training_script_is_left_alone(prefix: str, gap: str, script: Script) -> None:
    """The same scripts importing a look-alike library instead of torch (and arbitrary code
    before them): nothing to convert, byte for byte."""
    if prefix and not prefix.endswith(("\n", "\r")):
        prefix += "\n"
    source = prefix + gap + script.source
    if not compiles(source):
        source = script.source
    result = convert(source)
    assert result.output == source
    assert not result.changes


@settings(**examples(4))
@given(training_scripts(), generic_python)
def test_training_script_followed_by_arbitrary_code(script: Script, tail: str) -> None:
    """Whatever follows a training script, converting it still gives valid, stable code."""
    head = script.source if script.source.endswith(("\n", "\r")) else script.source + script.layout.newline
    source = head + tail
    assume(compiles(source))
    result = convert(source)
    assert_compiles(result.output)
    assert_idempotent(result.output)


# ---------------------------------------------------------------------------------------------
# Bugs found by the generators (and by hand, from their pieces), minimised. Strict xfails: each
# one fails today; when a fix makes it pass, the xfail turns red and this marker goes.

TRAIN_LOOP = """\
model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    loss = model(x, y)
    loss.backward()
    optimizer.step()
"""


@pytest.mark.parametrize("binding", ["def accelerator():\n    pass\n", "from settings import accelerator\n"])
def test_a_function_or_import_named_accelerator_is_not_shadowed(binding: str) -> None:
    """(Found by this file: the inserted `accelerator = Accelerator()` took the place of the user's
    definition or import.) Left alone with ACC100, as for `accelerator = ...`."""
    source = f"import torch\n\n{binding}\n{TRAIN_LOOP}"
    result = convert(source)
    assert module_bindings(result.output, "accelerator") == 1
    assert not result.changed and [f.code for f in result.findings] == ["ACC100"]


def test_an_imported_name_accelerator_is_not_taken_for_accelerates() -> None:
    """(Found by this file: `from mylib import Accelerator` and the added accelerate import clashed.)"""
    source = f"import torch\nfrom mylib import Accelerator\n\n{TRAIN_LOOP}"
    result = convert(source)
    assert module_bindings(result.output, "Accelerator") == 1
    assert not result.changed and [f.code for f in result.findings] == ["ACC100"]


def test_a_helper_returning_the_loss_is_no_optimizer_wrapper() -> None:
    """(Found by this file: a function of the file that trains, handed the optimizer, was taken for an
    optimizer wrapper, ACC118.)"""
    source = """\
import torch


def train(optimizer, model, loader):
    for x, y in loader:
        loss = model(x, y)
        loss.backward()
        optimizer.step()
    return loss.item()


model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
last = train(optimizer, model, loader)
"""
    result = convert(source)
    assert result.changed
    assert "ACC118" not in {f.code for f in result.findings}


def test_placement_joined_by_semicolon_leaves_no_self_assignment() -> None:
    source = """\
import torch
from torch.utils.data import DataLoader

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
loader = DataLoader(dataset)
model = Net().to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    x = x.to(device); y = y.to(device)
    loss = model(x, y)
    loss.backward()
    optimizer.step()
"""
    result = convert(source)
    assert result.changed
    assert "x = x" not in result.output and "y = y" not in result.output
    assert "    loss = model(x, y)\n" in result.output
    # what the line also holds is kept, a self-assignment written so included; no `;` is left dangling
    mixed = convert(source.replace("x = x.to(device); y = y.to(device)", "x = x.to(device); n = n; k = x.sum()"))
    assert "    n = n; k = x.sum()\n" in mixed.output and "x = x" not in mixed.output
    last = convert(source.replace("x = x.to(device); y = y.to(device)", "k = x.sum(); x = x.to(device)"))
    assert "    k = x.sum()\n" in last.output


def test_a_paddle_script_is_not_converted() -> None:
    source = """\
import paddle

model = paddle.nn.Linear(8, 2)
optimizer = paddle.optimizer.SGD(parameters=model.parameters())
for x, y in loader:
    loss = model(x, y)
    loss.backward()
    optimizer.step()
"""
    result = convert(source)
    assert result.output == source
    assert not result.changes and not result.findings
    # the same with torch imported too: a PyTorch script after all, analysed
    both = convert("import torch\n" + source)
    assert both.changed or both.findings
