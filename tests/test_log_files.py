"""A ``logging.FileHandler`` is made and attached by the main process (one process writes the log file), where
every use of it is a statement of its own; anything else keeps ACC127 (codemods/main_process_files.py)."""

from __future__ import annotations

from conftest import assert_stable, convert

SCRIPT = """\
import logging
import torch
from torch.utils.data import DataLoader, TensorDataset


def main():
    logger = logging.getLogger("Model")
    logger.setLevel(logging.INFO)
    formatter = logging.Formatter("%(asctime)s - %(message)s")
    file_handler = logging.FileHandler("train.log")
    file_handler.setLevel(logging.INFO)
    file_handler.setFormatter(formatter)
    logger.addHandler(file_handler)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    loader = DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=8)
    model = torch.nn.Linear(4, 1).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        logger.info("loss %f", loss.item())


if __name__ == "__main__":
    main()
"""

GUARDED = """\
    accelerator = Accelerator()
    if accelerator.is_main_process:
        file_handler = logging.FileHandler("train.log")
        file_handler.setLevel(logging.INFO)
        file_handler.setFormatter(formatter)
        logger.addHandler(file_handler)
"""


def test_a_file_handler_is_made_and_attached_by_the_main_process() -> None:
    result = convert(SCRIPT)
    assert GUARDED in result.output
    assert "ACC127" not in [f.code for f in result.findings]
    assert '        logger.info("loss %f", loss.item())\n' in result.output  # every process logs; one has the file
    assert_stable(result.output)


def test_a_handler_read_another_way_keeps_the_finding() -> None:
    source = SCRIPT.replace("    logger.addHandler(file_handler)\n",
                            "    logger.addHandler(file_handler)\n    print(file_handler.baseFilename)\n")
    result = convert(source)
    assert "ACC127" in [f.code for f in result.findings]
    assert '    file_handler = logging.FileHandler("train.log")\n' in result.output  # left as it is


def test_a_handler_made_in_a_helper_without_the_accelerator_keeps_the_finding() -> None:
    source = SCRIPT.replace('''    file_handler = logging.FileHandler("train.log")
    file_handler.setLevel(logging.INFO)
    file_handler.setFormatter(formatter)
    logger.addHandler(file_handler)
''', "    attach(logger)\n").replace("def main():", '''def attach(logger):
    handler = logging.FileHandler("train.log")
    logger.addHandler(handler)


def main():''')
    result = convert(source)
    assert "ACC127" in [f.code for f in result.findings]
    assert '    handler = logging.FileHandler("train.log")\n    logger.addHandler(handler)\n' in result.output


def test_the_accelerator_exists_before_a_module_function_that_reads_it_is_called() -> None:
    """ODE-Net: `get_logger(...)` at the top of the `__main__` block opens the log file; the main process opens
    it now, so the Accelerator must exist before that call (it used to be created at the model: a NameError)."""
    source = '''\
import logging
import torch
from torch.utils.data import DataLoader, TensorDataset


def get_logger(path):
    logger = logging.getLogger()
    handler = logging.FileHandler(path, mode="a")
    logger.addHandler(handler)
    return logger


if __name__ == "__main__":
    logger = get_logger("train.log")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    loader = DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=8)
    model = torch.nn.Linear(4, 1).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        logger.info("loss %f", loss.item())
'''
    result = convert(source)
    lines = result.output.splitlines()
    assert "    if accelerator.is_main_process:" in lines
    assert lines.index("    accelerator = Accelerator()") < lines.index('    logger = get_logger("train.log")')
    assert_stable(result.output)
