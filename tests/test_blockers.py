"""A file left unchanged is reported with every construct that blocks it, not the first one the
analysis met; and an analysis that reads what a refused one would have decided does not run
(its finding would be about a setup accelify never found)."""

from __future__ import annotations

import accelify.core.pipeline as pipeline

LOOP = """\
loader = DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 2)), batch_size=2)
for x, y in loader:
    x, y = x.to(device), y.to(device)
    loss = ((model(x) - y) ** 2).mean()
    loss.backward()
    opt.step()
"""

HEAD = """\
import torch
from torch.utils.data import DataLoader, TensorDataset
"""


def codes(source: str) -> list[tuple[int, str]]:
    result = pipeline.convert_source(source, "train.py")
    assert result.output == source and result.error is None
    return [(f.line, f.code) for f in result.findings]


def test_the_accelerator_name_taken_and_a_device_assigned_twice_are_both_reported() -> None:
    source = HEAD + (
        'accelerator = "gpu"\n'
        'device = torch.device("cuda")\n'
        "model = torch.nn.Linear(4, 2).to(device)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    ) + LOOP + 'device = torch.device("cpu")\n'
    assert codes(source) == [(3, "ACC100"), (4, "ACC103")]


def test_each_blocker_is_also_reported_alone() -> None:
    """The two blockers above, one at a time: each is a reason on its own."""
    body = (
        'device = torch.device("cuda")\n'
        "model = torch.nn.Linear(4, 2).to(device)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    ) + LOOP
    assert codes(HEAD + 'accelerator = "gpu"\n' + body) == [(3, "ACC100")]
    assert codes(HEAD + body + 'device = torch.device("cpu")\n') == [(3, "ACC103")]
    assert pipeline.convert_source(HEAD + body, "train.py").changed


def test_a_collective_and_optimizers_in_two_functions_are_both_reported() -> None:
    source = HEAD + (
        "import torch.distributed as dist\n\n\n"
        "def train():\n"
        '    dist.init_process_group("gloo")\n'
        "    model = torch.nn.Linear(4, 2)\n"
        "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    for x in range(3):\n"
        "        loss = model(torch.randn(2, 4)).sum()\n"
        "        loss.backward()\n"
        "        opt.step()\n"
        "        dist.all_gather_into_tensor(torch.zeros(2), loss.detach().reshape(1))\n\n\n"
        "def finetune():\n"
        "    model = torch.nn.Linear(4, 2)\n"
        "    opt = torch.optim.Adam(model.parameters())\n"
        "    model(torch.randn(2, 4)).sum().backward()\n"
        "    opt.step()\n"
    )
    found = {code for _, code in codes(source)}
    assert found == {"ACC126", "ACC107"}


def test_no_finding_from_an_analysis_that_depends_on_the_refused_one() -> None:
    """The optimizer comes from a model method (minGPT's `configure_optimizers`) called twice, so not
    taken as the caller's (tests/test_model_methods.py has the one call that is): the setup scope does
    not reach the training loop (ACC107). The data analysis would then look at that method and say
    the script "places nothing on a device", which is false: it is not asked."""
    source = HEAD + (
        "\n\nclass Net(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.fc = torch.nn.Linear(4, 2)\n\n"
        "    def forward(self, x):\n"
        "        return self.fc(x)\n\n"
        "    def configure_optimizers(self):\n"
        "        optimizer = torch.optim.AdamW(self.parameters(), lr=1e-3)\n"
        "        return optimizer\n\n\n"
        "def run(model):\n"
        '    device = "cuda" if torch.cuda.is_available() else "cpu"\n'
        "    model = model.to(device)\n"
        "    optimizer = model.configure_optimizers()\n"
        "    spare = model.configure_optimizers()\n"
        "    loader = DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 2)), batch_size=2)\n"
        "    for x, y in loader:\n"
        "        x, y = x.to(device), y.to(device)\n"
        "        loss = ((model(x) - y) ** 2).mean()\n"
        "        loss.backward()\n"
        "        optimizer.step()\n\n\n"
        "run(Net())\n"
    )
    found = codes(source)
    assert ("ACC107" in {code for _, code in found}) and "ACC121" not in {code for _, code in found}


SAVED_BY_A_CALLBACK = """\


class EarlyStopping:
    def __init__(self, path="checkpoint.pt"):
        self.path = path

    def __call__(self, model):
        torch.save(model.state_dict(), self.path)


def clip(model):
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)


def main():
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    loader = DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 2)), batch_size=2)
    model = torch.nn.Linear(4, 2).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    stop = EarlyStopping()
{amp}    for x, y in loader:
        x, y = x.to(device), y.to(device)
        loss = ((model(x) - y) ** 2).mean()
        optimizer.zero_grad()
{backward}
        clip(model)
        optimizer.step()
    stop(model)


main()
"""
APEX = (  # two losses scaled apart: more than the Accelerator's mixed precision replaces (ACC033)
    "    model, optimizer = amp.initialize(model, optimizer, opt_level='O1', num_losses=2)\n",
    "        with amp.scale_loss(loss, optimizer) as scaled:\n            scaled.backward()",
)


def test_what_the_conversion_would_refuse_is_named_beside_a_check_that_refused() -> None:
    """apex (ACC145) is a check of the analysis that builds nothing: the plan is whole, so the codemods
    are still asked, and the state dict saved by a callback handed the model (ACC128) and the clipping
    in a helper out of the Accelerator's reach (ACC110) are named too. Before, only ACC145 was."""
    source = HEAD + "from apex import amp\n" + SAVED_BY_A_CALLBACK.format(amp=APEX[0], backward=APEX[1])
    found = codes(source)
    assert {code for _, code in found} == {"ACC145", "ACC128", "ACC110"}
    lines = source.splitlines()
    for line, code in found:  # each at the construct it names
        expected = {"ACC145": "amp.initialize", "ACC128": "torch.save", "ACC110": "clip_grad_norm_"}[code]
        assert expected in lines[line - 1], (code, lines[line - 1])


def test_every_codemod_that_refuses_is_named_not_only_the_first() -> None:
    """Without apex the analysis passes, and two codemods refuse: both are named (before, the findings
    stopped at the first codemod that refused, in the codemods' order)."""
    source = HEAD + SAVED_BY_A_CALLBACK.format(amp="", backward="        loss.backward()")
    assert {code for _, code in codes(source)} == {"ACC128", "ACC110"}
    clip_helper = "def clip(model):\n    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n\n\n"
    without_clip = source.replace(clip_helper, "").replace("        clip(model)\n", "")
    assert {code for _, code in codes(without_clip)} == {"ACC128"}
    callback = source[source.index("class EarlyStopping"):source.index(clip_helper)]
    without_callback = source.replace(callback, "").replace("    stop = EarlyStopping()\n", "").replace(
        "    stop(model)\n", "")
    assert {code for _, code in codes(without_callback)} == {"ACC110"}


def test_two_checks_that_build_nothing_are_both_named() -> None:
    """A sampler read back (ACC130) and apex (ACC145): each check runs whatever the other found (before,
    the sampler check ended the analysis and apex was not named)."""
    source = (
        "import torch\nfrom apex import amp\nfrom torch.utils.data import DataLoader, SubsetRandomSampler\n\n"
        "sampler = SubsetRandomSampler(list(range(80)), generator=torch.Generator().manual_seed(0))\n"
        "loader = DataLoader(dataset, batch_size=8, sampler=sampler)\n"
        "model = Net()\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "model, optimizer = amp.initialize(model, optimizer, num_losses=2)\n"
        "total = 0.0\n"
        "for x, y in loader:\n"
        "    loss = criterion(model(x), y)\n"
        "    optimizer.zero_grad()\n"
        "    with amp.scale_loss(loss, optimizer) as scaled:\n"
        "        scaled.backward()\n"
        "    optimizer.step()\n"
        "    total += loss.item() * x.size(0)\n"
        "print(total / len(loader.sampler))\n"
    )
    assert codes(source) == [(9, "ACC145"), (18, "ACC130")]


EMA_EVALUATED = """\
import copy
import os

import torch
from torch.utils.data import DataLoader, TensorDataset


def evaluate(loader, net):
    correct = 0
    for x, y in loader:
        out = net(x)
        correct += (out.argmax(1) == y).sum().item()
    return correct


model = torch.nn.Linear(4, 3)
ema = copy.deepcopy(model)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
train_loader = DataLoader(TensorDataset(torch.randn(8, 4), torch.randint(0, 3, (8,))), batch_size=2)
test_loader = DataLoader(TensorDataset(torch.randn(8, 4), torch.randint(0, 3, (8,))), batch_size=2)
for x, y in train_loader:
    loss = torch.nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    with torch.no_grad():
        for e, p in zip(ema.parameters(), model.parameters()):
            e.mul_(0.9).add_(p, alpha=0.1)
print(evaluate(test_loader, ema))
"""


def test_an_evaluation_of_a_model_accelify_does_not_follow_names_the_call() -> None:
    """FixMatch evaluates its EMA copy (`test(args, test_loader, ema_model.ema, epoch)`): the loop has an
    `outputs = model(inputs)` line, of a model accelify does not follow. The finding said there was no such
    line, which was false; it names the call now."""
    result = pipeline.convert_source(EMA_EVALUATED, "train.py")
    assert result.output == EMA_EVALUATED
    [finding] = result.findings
    assert (finding.line, finding.code) == (10, "ACC114")
    assert "the outputs of `net(x)`, which accelify does not follow to a prepared model" in finding.message


def test_an_evaluation_on_the_main_process_only_is_named_even_when_no_gather_could_be_made() -> None:
    """FixMatch runs `test(...)` under `if args.local_rank in [-1, 0]:`: on the main process only, over a
    loader `prepare` would shard. That is the blocker to name (once for the loop, not once more for the
    gather the codemod could not make there)."""
    source = EMA_EVALUATED.replace("print(evaluate(test_loader, ema))\n",
                                   "if dist.get_rank() == 0:\n    print(evaluate(test_loader, ema))\n").replace(
        "import torch\n", "import torch\nimport torch.distributed as dist\n").replace(
        "model = torch.nn.Linear(4, 3)\n", 'dist.init_process_group("gloo")\nmodel = torch.nn.Linear(4, 3)\n')
    result = pipeline.convert_source(source, "train.py")
    assert result.output == source
    [finding] = result.findings
    assert (finding.line, finding.code) == (11, "ACC114")
    assert finding.message.startswith("this evaluation runs on the main process only")


BYOL_SHAPE = """\
import torch
from torch.utils.data import DataLoader, TensorDataset


class Trainer:
    def __init__(self, model, optimizer, device, **params):
        self.model = model
        self.optimizer = optimizer
        self.device = device
        self.batch_size = params["batch_size"]

    def train(self, dataset):
        loader = DataLoader(dataset, batch_size=self.batch_size, shuffle=True)
        for x, y in loader:
            x, y = x.to(self.device), y.to(self.device)
            loss = torch.nn.functional.mse_loss(self.model(x), y)
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()


def main():
    config = {"batch_size": 4}
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = torch.nn.Linear(4, 2).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = Trainer(model=model, optimizer=optimizer, device=device, **config)
    trainer.train(TensorDataset(torch.randn(8, 4), torch.randn(8, 2)))


if __name__ == "__main__":
    main()
"""


def test_a_trainer_class_handed_the_optimizer_is_no_optimizer_wrapper() -> None:
    """BYOL's `BYOLTrainer(online_network=..., optimizer=optimizer, ...)`: it trains, it does not wrap the
    optimizer's step. ACC118 said it was an optimizer wrapper, which was false; the true blockers stay."""
    result = pipeline.convert_source(BYOL_SHAPE, "train.py")
    assert result.output == BYOL_SHAPE
    assert result.findings and "ACC118" not in {f.code for f in result.findings}, result.findings


def test_the_unfollowed_call_is_found_through_what_is_computed_from_it_and_no_library_call_is_named() -> None:
    """PointNet: `pred, _ = classifier(points)`, `pred_choice = pred.data.max(1)[1]`, then the metric reads
    `pred_choice`; a loss computed on the way (`torch.nn.functional...`) is no model."""
    source = EMA_EVALUATED.replace(
        "        out = net(x)\n        correct += (out.argmax(1) == y).sum().item()\n",
        "        out, _ = net(x)\n        probs = torch.softmax(out, 1)\n"
        "        choice = probs.max(1)[1]\n        correct += (choice == y).sum().item()\n")
    [finding] = pipeline.convert_source(source, "train.py").findings
    assert "the outputs of `net(x)`" in finding.message, finding.message


TWO_UNKNOWN_COLLECTIVES = """\
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main():
    dist.init_process_group(backend=dist.get_default_backend_for_device(torch.device("cpu")))
    group = dist.new_group([0, 1])
    model = DDP(torch.nn.Linear(4, 2))
    data = TensorDataset(torch.randn(8, 4), torch.randn(8, 2))
    loader = DataLoader(data, batch_size=2, sampler=DistributedSampler(data))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        loss = ((model(x) - y) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"backend={dist.get_backend(group)}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
"""


def test_every_call_of_the_process_group_that_is_not_understood_is_named() -> None:
    """PyTorch's DDP example met `get_default_backend_for_device` named alone and `dist.get_backend()` on the next
    run (both understood now): a process subgroup and the backend of one are both named."""
    assert codes(TWO_UNKNOWN_COLLECTIVES) == [(10, "ACC126"), (20, "ACC126")]


DDP_WITH_A_DEVICE_CHAIN = """\
import os

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main(args):
    if args.accel:
        torch.cuda.set_device(args.gpu)
        device = torch.device("cuda")
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl")
    data = TensorDataset(torch.randn(8, 4), torch.randn(8, 2))
    loader = DataLoader(data, batch_size=2, sampler=DistributedSampler(data{sampler}))
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2).to(device))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        loss = ((model(x) - y) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""


def test_a_device_blocker_is_named_beside_a_refused_process_group_whose_ranks_were_read() -> None:
    """The ImageNet example's shape: its validation sampler's ``drop_last=True`` (ACC126) hid the device chain whose
    branch also sets the GPU (ACC103), which a user who fixed the first found next."""
    both = codes(DDP_WITH_A_DEVICE_CHAIN.format(sampler=", drop_last=True"))
    assert {code for _, code in both} == {"ACC126", "ACC103"}
    alone = codes(DDP_WITH_A_DEVICE_CHAIN.format(sampler=""))
    assert {code for _, code in alone} == {"ACC103"}  # the same finding once the sampler is fixed
    assert [line for line, code in both if code == "ACC103"] == [line for line, _ in alone]
