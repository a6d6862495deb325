"""``device = get_device()`` (issue 28: devices passed across functions and modules): a function of the script or
of a module beside it that takes nothing and only returns the automatic choice is that choice; the assignment
goes as ``device = torch.device(...)`` does. One that reads a flag or does more stays ACC108."""

from __future__ import annotations

from pathlib import Path

import pytest

from accelify.core.pipeline import convert_source

MAIN = """\
import torch
from torch.utils.data import DataLoader, TensorDataset
{imports}

def main():
    device = get_device()
    loader = DataLoader(TensorDataset(torch.randn(16, 4), torch.randn(16, 1)), batch_size=4)
    model = torch.nn.Linear(4, 1).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        loss = ((model(x) - y) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
"""

CHOICE = 'def get_device():\n    """The GPU when there is one."""\n    return torch.device("cuda" if torch.cuda.is_available() else "cpu")\n'


def convert(tmp_path: Path, imports: str, utils: str = ""):
    if utils:
        (tmp_path / "utils.py").write_text("import torch\n\n" + utils)
    source = MAIN.format(imports=imports)
    main = tmp_path / "main.py"
    main.write_text(source)
    return convert_source(source, str(main))


def test_a_device_function_of_the_script_is_the_choice_it_returns(tmp_path: Path) -> None:
    result = convert(tmp_path, "\n\n" + CHOICE)
    assert result.changed and not result.findings, result.findings
    assert "    accelerator = Accelerator()\n    loader = " in result.output
    assert "get_device()" not in result.output.split("def main")[1] and ".to(device)" not in result.output


def test_a_device_function_of_a_module_beside_it_too_and_its_import_goes(tmp_path: Path) -> None:
    result = convert(tmp_path, "\nfrom utils import get_device\n", CHOICE)
    assert result.changed and not result.findings, result.findings
    assert "get_device" not in result.output and "    accelerator = Accelerator()\n" in result.output
    assert not result.companions  # the module is read, not changed


@pytest.mark.parametrize("utils", [
    CHOICE.replace("torch.cuda.is_available()", "torch.cuda.is_available() and not NO_CUDA"),  # a flag: cpu= lost
    CHOICE.replace('    return torch', '    print("device chosen")\n    return torch'),  # it does more
    CHOICE.replace("def get_device():", "def get_device(index=0):"),  # it takes an argument
])
def test_a_device_function_that_reads_a_flag_or_does_more_stays_acc108(tmp_path: Path, utils: str) -> None:
    result = convert(tmp_path, "\nfrom utils import get_device\n", "NO_CUDA = False\n\n\n" + utils)
    assert not result.changed
    assert [f.code for f in result.findings] == ["ACC108"]


def test_a_device_function_that_forces_the_cpu_says_so(tmp_path: Path) -> None:
    result = convert(tmp_path, "\nfrom utils import get_device\n", 'def get_device():\n    return torch.device("cpu")\n')
    assert not result.changed
    assert [f.code for f in result.findings] == ["ACC102"] and "forces the CPU" in result.findings[0].message
