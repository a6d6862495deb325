"""ACC033: NVIDIA apex's mixed precision becomes the Accelerator's; ACC145 where apex does more than that, the
note ACC152 where part of it does not carry over. fixtures/apex_amp and fixtures/apex_unconditional are the
golden conversions, fixtures/noop/apex_state_dict the refusal."""

from __future__ import annotations

import pytest

from conftest import FIXTURES, assert_stable, convert

BEFORE = (FIXTURES / "apex_amp" / "before.py").read_text(encoding="utf-8")
BRANCH = '''        if args.fp16:
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
            torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), args.max_grad_norm)
        else:
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
'''


def test_the_switch_of_apex_switches_the_accelerators_mixed_precision() -> None:
    result = convert(BEFORE)
    assert 'Accelerator(mixed_precision="fp16" if args.fp16 else "no")' in result.output
    assert "amp." not in result.output and "apex import" not in result.output
    assert "        accelerator.backward(loss)\n        accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)\n" \
        in result.output
    assert {c.code for c in result.changes} >= {"ACC033", "ACC005", "ACC007"}
    assert not result.findings
    assert_stable(result.output)


@pytest.mark.parametrize("branch, where", [
    # the two branches differ by more than apex: which one is the plain one cannot be told
    (BRANCH.replace("            loss.backward()\n", "            (2 * loss).backward()\n"), "`if args.fp16:`"),
    (BRANCH.replace("args.max_grad_norm)\n        else", "5.0)\n        else"), "`if args.fp16:`"),
    # a branch of its own with no plain counterpart
    (BRANCH.replace("        else:\n            loss.backward()\n            torch.nn.utils.clip_grad_norm_(model.parameters(), "
                    "args.max_grad_norm)\n", ""), "`amp.master_params`"),
])
def test_a_branch_that_does_more_than_apex_leaves_the_file_unchanged(branch: str, where: str) -> None:
    source = BEFORE.replace(BRANCH, branch)
    assert source != BEFORE
    result = convert(source)
    assert result.output == source
    assert [f.code for f in result.findings] == ["ACC145"]
    assert where.strip("`").split(":")[0].split("(")[0] in result.findings[0].message


def test_apex_switched_by_a_value_the_accelerator_cannot_read_is_noted() -> None:
    """`config['fp16']` read after the device is chosen (CodeSearchNet's train.py): the launch chooses the precision."""
    source = BEFORE.replace("args.fp16", "config['fp16']").replace(
        "    model = torch.nn.Linear(8, 3).to(device)\n",
        "    model = torch.nn.Linear(8, 3).to(device)\n    config = {'fp16': args.fp16}\n")
    result = convert(source)
    assert "Accelerator()" in result.output and "amp." not in result.output
    [note] = result.findings
    assert note.code == "ACC152" and "`config['fp16']`" in note.message and "--mixed_precision fp16" in note.message


@pytest.mark.parametrize("level, noted", [('"O1"', False), ('"O2"', True), ("args.opt_level", True)])
def test_an_opt_level_other_than_o1_is_noted(level: str, noted: bool) -> None:
    result = convert(BEFORE.replace('opt_level="O1"', f"opt_level={level}"))
    assert 'mixed_precision="fp16" if args.fp16 else "no"' in result.output
    assert [f.code for f in result.findings] == (["ACC152"] if noted else [])


def test_apex_left_when_acc033_is_not_selected() -> None:
    """Without ACC033 apex would stay beside the prepared optimizer (which it cannot patch): not converted."""
    from accelify.codemods import by_code

    result = convert(BEFORE, select=frozenset(by_code()) - {"ACC033"})
    assert result.output == BEFORE
    assert [f.code for f in result.findings] == ["ACC145"]


def test_apex_beside_torch_amp_is_refused() -> None:
    source = BEFORE.replace("        optimizer.step()\n", "        optimizer.step()\n        scaler = torch.cuda.amp.GradScaler()\n")
    result = convert(source)
    assert result.output == source and "ACC145" in {f.code for f in result.findings}


def test_apex_imported_and_unused_or_its_larc_only_is_no_apex_mixed_precision() -> None:
    """An unused `from apex import amp` (yangkky's DDP tutorial) stays as the original has it; apex's LARC wraps an
    optimizer and scales nothing (SimSiam's linear classifier): neither is ACC145."""
    plain = BEFORE[:BEFORE.index("    if args.fp16:\n        try")] + BEFORE[BEFORE.index("    for step"):]
    plain = plain.replace(BRANCH, "        loss.backward()\n")
    unused = plain.replace("import torch\n", "import torch\nfrom apex import amp\n", 1)
    result = convert(unused)
    assert "from apex import amp\n" in result.output and "Accelerator()" in result.output and not result.findings
    larc = plain.replace("import torch\n", "import torch\nfrom apex.parallel.LARC import LARC\n", 1).replace(
        "lr=0.1)\n", "lr=0.1)\n    optimizer = LARC(optimizer=optimizer, trust_coefficient=0.001, clip=False)\n", 1)
    assert "ACC145" not in {f.code for f in convert(larc).findings}
