"""ACC002: an if/elif/else device choice maps to one Accelerator, or is refused."""

from __future__ import annotations

import pytest

from conftest import FIXTURES, assert_stable, convert

SOURCE = (FIXTURES / "device_if_elif_else" / "before.py").read_text()


def test_availability_checks_only_mean_the_automatic_choice() -> None:
    source = SOURCE.replace("if use_cuda:", "if torch.cuda.is_available():").replace(
        "elif use_mps:", "elif torch.backends.mps.is_available():"
    )
    result = convert(source)
    assert "    accelerator = Accelerator()\n" in result.output
    assert "device" not in result.output.split("accelerator = Accelerator()")[1].split("loader =")[0]
    assert_stable(result.output)


@pytest.mark.parametrize(
    "old, new",
    [
        # a flag beside an availability check: no single `cpu=` says the same
        ("elif use_mps:", "elif torch.backends.mps.is_available():"),
        # the last branch is not the CPU
        ('    else:\n        device = torch.device("cpu")', '    else:\n        device = torch.device("cuda:1")'),
        # a branch does more than choose the device
        ('        device = torch.device("mps")\n', '        device = torch.device("mps")\n        print("mps")\n'),
    ],
)
def test_other_chains_are_refused(old: str, new: str) -> None:
    source = SOURCE.replace(old, new)
    assert source != SOURCE
    result = convert(source)
    assert result.output == source
    assert result.findings and result.findings[0].code in {"ACC102", "ACC103"}
