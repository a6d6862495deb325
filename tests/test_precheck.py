"""precheck.may_train: a sharp but strict over-approximation of "the analysis would do something".

A False must mean that the full pipeline leaves the file as it is with nothing to say: the
tests below run the pipeline with the pre-check bypassed on every sample said False.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

import accelify.core.pipeline as pipeline
from accelify.core import precheck
from accelify.core.precheck import may_train, needs_analysis, syntax_error

HEAD = """\
import torch
from torch import nn

model = nn.Linear(4, 1)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 4)), batch_size=2)
"""
LOOP = """
for (x,) in loader:
    optimizer.zero_grad()
    loss = model(x).sum()
    optimizer.step()
"""


def script(*lines: str) -> str:
    """A training script without `.backward()`: only its optimizer can make it interesting."""
    return HEAD + "\n".join(lines) + "\n" + LOOP


def dedent(source: str) -> str:
    return textwrap.dedent(source).lstrip("\n")


# Each spelling of an optimizer (or a backward) the analysis can act on.
MUST_ANALYSE = {
    "a hang in code on Accelerate already": dedent("""
        import torch
        from accelerate import Accelerator

        acc = Accelerator()
        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model, optimizer = acc.prepare(model, optimizer)
        if acc.is_main_process:
            acc.wait_for_everyone()
            acc.save(acc.unwrap_model(model).state_dict(), "model.pt")
        """),
    "prepare of another Accelerator": script("from mylib import Accelerator", "accelerator = Accelerator()",
                                             "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)",
                                             "model, optimizer = accelerator.prepare(model, optimizer)"),
    "prepare of an Accelerator spelled otherwise": script(
        "from accelerate import Accelerator", "\uff41ccelerator = Accelerator()",
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)",
        "model, optimizer = accelerator.prepare(model, optimizer)"),
    "a wrapper's backward called in the file": dedent("""
        import torch

        class Wrapper:
            def backward(self, loss):
                loss.backward()

        def train(model, loader, update):
            wrapper = Wrapper()
            for x, y in loader:
                wrapper.backward(((model(x) - y) ** 2).mean())
                update()
        """),
    "torch.optim": script("optimizer = torch.optim.SGD(model.parameters(), lr=0.1)"),
    "import torch.optim as": script("import torch.optim as opt_mod", "optimizer = opt_mod.AdamW(model.parameters())"),
    "from torch import optim": script("from torch import optim", "optimizer = optim.Adam(model.parameters())"),
    "from torch import optim as": script("from torch import optim as o", "optimizer = o.Adam(model.parameters())"),
    "from torch.optim import as": script("from torch.optim import AdamW as A", "optimizer = A(model.parameters())"),
    "from torch.optim.sgd import": script("from torch.optim.sgd import SGD", "optimizer = SGD(model.parameters())"),
    "name outside the pattern": script("from torch.optim import LBFGS as L", "optimizer = L(model.parameters())"),
    "torch.optim without parameters()": script("weights = [model.weight]",
                                               "optimizer = torch.optim.Rprop(weights)"),
    "named like an optimizer": script("from lion_pytorch import Lion", "optimizer = Lion(model.parameters())"),
    "imported as a plain name": script("from mylib import Adafactor as Opt", "optimizer = Opt(model.parameters())"),
    "aliased to an optimizer name": script("from mylib import make as Sophia", "optimizer = Sophia(model.parameters())"),
    "parameters through a name": script("from lion_pytorch import Lion",
                                        "params = [p for p in model.parameters() if p.requires_grad]",
                                        "optimizer = Lion(params)"),
    "named_parameters": script("from mylib import MyLamb", "optimizer = MyLamb(model.named_parameters())"),
    "attribute of a framework": script("import bitsandbytes as bnb", "optimizer = bnb.optim.Adam8bit(model.parameters())"),
    "optimizer class in an attribute": script("config = load_config()",
                                              "optimizer = config.optimizer_class(model.parameters())"),
    "subscripted table": script("optimizer = torch.optim.__dict__['SGD'](model.parameters())"),
    "partial": script("from functools import partial",
                      "optimizer = partial(torch.optim.SGD, lr=0.1)(model.parameters())"),
    "if-else": script("optimizer = torch.optim.SGD(model.parameters()) if train else None"),
    "nested if-else": script("optimizer = None if frozen else (Lion(model.parameters()) if lion else None)"),
    "annotated": script("optimizer: torch.optim.Optimizer = torch.optim.SGD(model.parameters())"),
    "walrus": script("(optimizer := torch.optim.SGD(model.parameters()))"),
    # no `optim`, no `parameters(` in the text
    "parameters ( spaced": "from lion_pytorch import Lion\nnet = make()\nopt = Lion(net.parameters ())\n",
    "class method": dedent("""
        import torch

        class Trainer:
            def __init__(self, model):
                self.model = model

            def fit(self, loader):
                self.optimizer = torch.optim.Adam(self.model.parameters())
                for x in loader:
                    self.optimizer.step()
        """),
    "imported in a function": dedent("""
        def main(model):
            from torch.optim import AdamW as Opt
            optimizer = Opt(model.parameters())
            return optimizer
        """),
    "backward": "import torch\nloss = model(x).sum()\nloss.backward()\n",
    "backward of an expression": "import torch\n(a + b).backward()\n",
    "scaled backward": "scaler.scale(loss).backward()\n",
    "backward, no optimizer word": dedent("""
        import torch
        w = torch.randn(3, requires_grad=True)
        for x, y in data:
            loss = ((x @ w - y) ** 2).mean()
            loss.backward()
            with torch.no_grad():
                w -= 0.01 * w.grad
                w.grad.zero_()
        """),
    # `Accelerator` in a string, and NFKC-equal to it only (LibCST's Name is the fullwidth spelling)
    "backward, Accelerator in a string": "import torch\nname = 'Accelerator'\nloss.backward()\n",
    "backward, fullwidth Accelerator": "import torch\nfrom lib import \uff21ccelerator\n\uff21ccelerator.run()\n"
                                       "loss.backward()\n",
    "syntax error": "optimizer = torch.optim.SGD(model.parameters(\n",
    "null byte": "optimizer = 1\0\n",
}

# What the analysis does nothing with, although the text test lets it through.
MUST_SKIP = {
    "docstring example": dedent('''
        """Helpers.

        Example::

            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            loss.backward()
            optimizer.step()
        """

        def helper(x):
            """Works with any optimizer = torch.optim.Adam(...)."""
            return x  # loss.backward() is the caller's
        '''),
    "models only": dedent("""
        import torch
        from torch import nn


        class Net(nn.Module):
            \"\"\"A model; train it with torch.optim.SGD(model.parameters()).\"\"\"

            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 1)

            def forward(self, x):
                return self.fc(x)

            def num_parameters(self):
                total = sum(p.numel() for p in self.parameters())
                return total


        def freeze(model):
            for p in model.parameters():
                p.requires_grad_(False)
        """),
    "scheduler only": dedent("""
        import torch
        from torch.optim.lr_scheduler import StepLR
        from torch.optim import lr_scheduler as sched


        def schedulers(optimizer, model):
            step = StepLR(optimizer, step_size=1)
            cosine = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, 10)
            plateau = sched.ReduceLROnPlateau(optimizer)
            swa = torch.optim.swa_utils.AveragedModel(model)
            return step, cosine, plateau, swa
        """),
    "optimizer taken as an argument": dedent("""
        def train_step(model, optimizer, batch):
            optimizer.zero_grad()
            out = model(batch)
            optimizer.step()
            return out
        """),
    "optimizer-named call without parameters": dedent("""
        def build(args):
            optimizer_config = get_optimizer_config(args)
            lamb = args.lamb_weight
            return optimizer_config, lamb
        """),
    "optimizer class definition": dedent("""
        from torch.optim.optimizer import Optimizer


        class MySGD(Optimizer):
            def __init__(self, params, lr=0.1):
                defaults = dict(lr=lr)
                super().__init__(params, defaults)

            def step(self):
                for group in self.param_groups:
                    for p in group["params"]:
                        p.data.add_(p.grad, alpha=-group["lr"])
        """),
    "counting parameters": dedent("""
        # optimizer-free utilities
        def size(model):
            n = sum(p.numel() for p in model.parameters())
            names = dict(model.named_parameters())
            return n, names
        """),
    "optimizer-named call of arguments": dedent("""
        def save(model, optimizer):
            state = FSDP.optim_state_dict(model, optimizer)
            n = sum(p.numel() for p in model.parameters())
            return state, n
        """),
    "Accelerate's own class": dedent("""
        class Accelerator:
            def backward(self, loss, **kwargs):
                loss.backward(**kwargs)
        """),
    "already an Accelerate script": dedent("""
        from accelerate import Accelerator

        accelerator = Accelerator()
        model, optimizer, loader = accelerator.prepare(*build())
        for batch in loader:
            loss = model(batch).sum()
            loss.backward()
            optimizer.step()
        """),
    "imports Accelerator": dedent("""
        import accelerate
        from accelerate import Accelerator as Acc

        def step(loss):
            loss.backward()
        """),
    "no keyword at all": "print('hello')\n",
    "prepared with its own Accelerator": HEAD.replace("import torch\n", "import torch\nfrom accelerate import Accelerator\n")
    + dedent("""
        accelerator = Accelerator()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model, optimizer = accelerator.prepare(model, optimizer)  # the loader left as its author chose
        for (x,) in loader:
            loss = model(x).sum()
            loss.backward()
            optimizer.step()
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            accelerator.save(accelerator.unwrap_model(model).state_dict(), "model.pt")
        """),
    "prepared with an aliased Accelerator in a class": dedent("""
        import torch
        from accelerate import Accelerator as Acc

        class Trainer:
            def __init__(self, model):
                self.accelerator = Acc(mixed_precision="bf16")
                self.optimizer = torch.optim.AdamW(model.parameters())
                self.model, self.optimizer = self.accelerator.prepare(model, self.optimizer)

            def step(self, loss):
                self.accelerator.backward(loss)
                self.optimizer.step()
        """),
    "a wrapper's backward method (DeepSpeed's)": dedent("""
        import torch

        class EngineWrapper:
            def __init__(self, engine):
                self.engine = engine

            def backward(self, loss, **kwargs):
                self.engine.backward(loss, **kwargs)
                self.engine.step()
        """),
}


@pytest.mark.parametrize("name", sorted(MUST_ANALYSE))
def test_must_analyse(name: str) -> None:
    assert may_train(MUST_ANALYSE[name])


@pytest.mark.parametrize("name", sorted(MUST_SKIP))
def test_must_skip(name: str) -> None:
    source = MUST_SKIP[name]
    assert source.strip() and not may_train(source)
    assert not needs_analysis(source)


def test_old_text_test_still_filters_first() -> None:
    # nothing to parse: not even a syntax error makes it True without a keyword
    assert not may_train("def f(:\n")


def test_optimizer_name_pattern_is_plans() -> None:
    """precheck keeps a copy of plan's pattern (plan imports LibCST): they must stay equal."""
    from accelify.analyses import plan

    assert precheck._OPTIMIZER_NAME.pattern == plan._OPTIMIZER_NAME.pattern
    assert precheck._OPTIMIZER_NAME.flags == plan._OPTIMIZER_NAME.flags


def test_the_precheck_s_copy_of_the_collectives_stays_equal():
    from accelify.analyses import hazards

    assert precheck._COLLECTIVES == hazards.COLLECTIVES


def test_the_precheck_s_copies_of_the_evaluation_analysis_stay_equal():
    """precheck must not import LibCST, so it keeps its own copies of what an evaluation's model is
    and what runs it; a copy narrower than the analysis would skip an evaluation script silently."""
    from accelify.analyses import evaluation

    assert precheck._MODULE_METHODS == evaluation.MODULE_METHODS
    assert precheck._RUNS == evaluation._RUNS
    # the analysis's list calls by qualified name, the precheck's by their last part (generous)
    assert {name.rpartition(".")[2] for name in evaluation._LIST_CALLS} <= precheck._LIST_CALLS


def _bypassed(monkeypatch: pytest.MonkeyPatch, source: str):
    monkeypatch.setattr(pipeline, "without_analysis", lambda _source, _path: None)
    return pipeline.convert_source(source, "sample.py")


@pytest.mark.parametrize("name", sorted(MUST_SKIP))
def test_a_skipped_file_would_not_change(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """The full analysis on what may_train says False: unchanged, nothing found, no error."""
    source = MUST_SKIP[name]
    result = _bypassed(monkeypatch, source)
    assert result.error is None
    assert result.findings == []
    assert result.output == source and not result.changes


# True by generosity only: spellings the analysis does not take for an optimizer (today).
GENEROUS = {"aliased to an optimizer name", "annotated", "nested if-else", "partial", "walrus"}


@pytest.mark.parametrize("name", sorted(set(MUST_ANALYSE) - GENEROUS))
def test_the_spellings_are_ones_the_analysis_acts_on(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """The True samples are not just generosity: the analysis converts or reports these."""
    source = MUST_ANALYSE[name]
    result = _bypassed(monkeypatch, source)
    assert result.output != source or result.findings or result.error


def test_syntax_error_reuses_the_parse() -> None:
    source = script("optimizer = torch.optim.SGD(model.parameters())")
    assert may_train(source)
    assert syntax_error(source, "a.py") is None
    broken = "optimizer = (\n"
    assert may_train(broken)
    assert syntax_error(broken, "b.py") is not None


def test_no_libcst_import() -> None:
    code = (
        "import sys\nfrom accelify.core import precheck\n"
        "assert precheck.may_train('import torch\\nopt = torch.optim.SGD(m.parameters())\\n')\n"
        "assert not precheck.may_train('x = 1  # optimizer\\n')\n"
        "assert 'libcst' not in sys.modules, 'libcst imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_text_asked_twice_is_parsed_once(monkeypatch) -> None:
    """The runner asks, then the pipeline asks of the same text: one parse."""
    import accelify.core.precheck as precheck

    parses = []
    real = precheck._may_train
    monkeypatch.setattr(precheck, "_may_train", lambda tree, source: parses.append(tree) or real(tree, source))
    text = "import torch\nopt = torch.optim.SGD(model.parameters())\n"
    assert precheck.may_train(text) and precheck.may_train(text)
    assert len(parses) == 1
    other = "import torch\nx = 1  # optim\n"
    assert not precheck.may_train(other) and len(parses) == 2


def test_another_frameworks_script_is_not_pytorch() -> None:
    """A script of PaddlePaddle or TensorFlow has `.backward()`/optimizers of its own: without a
    torch import it is not analysed (the pipeline then leaves it as it is, silently)."""
    paddle = dedent("""
        import paddle

        model = paddle.nn.Linear(8, 2)
        optimizer = paddle.optimizer.SGD(parameters=model.parameters())
        loss = model(x).sum()
        loss.backward()
        optimizer.step()
        """)
    assert not may_train(paddle)
    assert not may_train(paddle.replace("import paddle", "from paddle import nn, optimizer as opt\nimport paddle"))
    assert may_train("import torch\n" + paddle)  # both: a PyTorch script too
    assert may_train("from torch import nn\n" + paddle.replace("import paddle", "import tensorflow as tf\nimport paddle"))
    assert may_train(paddle.replace("import paddle", "import paddlex"))  # not a framework named here
