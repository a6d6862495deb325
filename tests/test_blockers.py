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
