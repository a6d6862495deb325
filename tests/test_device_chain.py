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
    "old, new, why",
    [
        # a flag beside an availability check: no single `cpu=` says the same
        ("elif use_mps:", "elif torch.backends.mps.is_available():", "mixes a flag with an availability check"),
        # the last branch is not the CPU
        ('    else:\n        device = torch.device("cpu")', '    else:\n        device = torch.device("cuda:1")',
         "not accelerators first and the CPU last"),
        # a branch does more than choose the device
        ('        device = torch.device("mps")\n', '        device = torch.device("mps")\n        print("mps")\n',
         "do more than set `device`"),
        # no CPU fallback
        ('    else:\n        device = torch.device("cpu")\n', "", "no `else:`"),
    ],
)
def test_other_chains_are_refused_with_their_reason(old: str, new: str, why: str) -> None:
    assert old in SOURCE
    source = SOURCE.replace(old, new)
    result = convert(source)
    assert result.output == source
    assert [f.code for f in result.findings] == ["ACC103"]
    assert why in result.findings[0].message
