"""ACC008 beyond the Accelerator's reach: a print in a function of the script that cannot reach the Accelerator (a
`log(message)` helper, a dataset's `__init__`) ran on every process; it becomes `PartialState().print`, as in the
project's modules. Left where a `PartialState()` would be wrong: what DataLoader workers run, an
`Accelerator(cpu=...)` (a state made before it would not know `cpu=True`), a function nothing calls."""

from __future__ import annotations

from conftest import FIXTURES, convert

SOURCE = (FIXTURES / "print_helper" / "before.py").read_text()
HELPER = '    print(f"[train] {message}")\n'


def test_a_helper_s_print_is_made_by_the_main_process() -> None:
    output = convert(SOURCE).output
    assert '    PartialState().print(f"[train] {message}")\n' in output
    assert "from accelerate import Accelerator, PartialState\n" in output


def test_not_with_an_accelerator_told_to_use_the_cpu() -> None:
    source = SOURCE.replace('    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")',
                            '    parser = argparse.ArgumentParser()\n'
                            '    parser.add_argument("--no-cuda", action="store_true")\n'
                            '    args = parser.parse_args()\n'
                            '    use_cuda = not args.no_cuda and torch.cuda.is_available()\n'
                            '    device = torch.device("cuda" if use_cuda else "cpu")').replace(
        "import time\n", "import argparse\nimport time\n")
    result = convert(source)
    assert "Accelerator(cpu=not use_cuda)" in result.output, result.output
    assert HELPER in result.output and "PartialState" not in result.output


def test_not_in_what_a_dataloader_s_workers_run() -> None:
    dataset = ("class Rows(torch.utils.data.Dataset):\n    def __len__(self):\n        return 64\n\n"
               "    def __getitem__(self, i):\n        log(f\"row {i}\")\n        return torch.zeros(8), 0\n\n\n")
    source = SOURCE.replace("def main():", dataset + "def main():")
    result = convert(source)
    assert result.changed and HELPER in result.output  # `log` runs in the workers too


def test_not_in_a_function_nothing_calls() -> None:
    source = SOURCE.replace("def main():", 'def unused():\n    print("never")\n\n\ndef main():')
    output = convert(source).output
    assert '    print("never")\n' in output and "PartialState().print(f" in output


def test_not_a_print_forced_on_every_process() -> None:
    """DINO's `setup_for_distributed` replaces `print` with one that prints on the master unless `force=True`."""
    source = SOURCE.replace('{message}")\n', '{message}", force=True)\n', 1)
    output = convert(source).output
    assert '{message}", force=True)\n' in output and "PartialState().print" not in output


def test_not_beside_the_script_s_own_accelerator() -> None:
    """`accelerator = Accelerator(cpu=True)` written by the author (no `prepare` yet): its arguments are the
    author's, and a `PartialState()` made before it could contradict them."""
    source = SOURCE.replace('    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")\n',
                            "    accelerator = Accelerator(cpu=True)\n    device = accelerator.device\n").replace(
        "import torch\n", "import torch\nfrom accelerate import Accelerator\n", 1)
    result = convert(source)
    assert result.changed, result.findings
    assert HELPER in result.output and "PartialState" not in result.output
