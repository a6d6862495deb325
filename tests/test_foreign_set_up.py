"""DINO's layout: the set-up helper lives in the project's ``utils.py`` (``utils.init_distributed_mode(args)``), with
the torchvision references' rank helpers beside it. The call becomes the helper's launched path in the script
(ACC030), the helper stays in its module (other scripts call it), and the rank helpers the script calls there
(``utils.get_world_size()``, ``utils.is_main_process()``, ``utils.setup_for_distributed``) are no process
management of its own (no ACC135). Golden and two-process run: fixtures/projects/setup_helper_module."""

from __future__ import annotations

from pathlib import Path

from accelify.core.pipeline import convert_source
from conftest import FIXTURES, assert_stable

PROJECT = FIXTURES / "projects" / "setup_helper_module" / "before"


def _project(tmp_path: Path, utils: str = "", train: str = "") -> Path:
    (tmp_path / "utils.py").write_text(utils or (PROJECT / "utils.py").read_text())
    script = tmp_path / "train.py"
    script.write_text(train or (PROJECT / "train.py").read_text())
    return script


def test_the_modules_helper_is_its_launched_path_in_the_script_and_stays_in_its_module(tmp_path: Path) -> None:
    script = _project(tmp_path)
    result = convert_source(script.read_text(), str(script))
    assert result.error is None and not result.findings, result.findings
    out = result.output.split('"""', 2)[2]  # the code, not the docstring that describes the original
    assert "init_distributed_mode" not in out and "init_process_group" not in out and "RANK" not in out
    assert "utils.setup_for_distributed(accelerator.is_main_process)" in out
    assert "DistributedSampler" not in out and "DistributedDataParallel" not in out and "import torch.distributed" not in out
    assert [c.code for c in result.changes].count("ACC030") == 1
    assert "its module keeps it" in next(c.message for c in result.changes if c.code == "ACC030")
    utils = next(c for c in result.companions if c.path.endswith("utils.py"))
    assert "def init_distributed_mode(args):" in utils.output and "dist.init_process_group(" in utils.output
    assert_stable(out)


def test_from_import_of_the_helper_takes_the_imports_its_path_needs(tmp_path: Path) -> None:
    train = (PROJECT / "train.py").read_text().replace("import utils\n", "import utils\nfrom utils import init_distributed_mode\n") \
        .replace("    utils.init_distributed_mode(args)\n", "    init_distributed_mode(args)\n")
    script = _project(tmp_path, train=train)
    result = convert_source(train, str(script))
    # `setup_for_distributed` of the module is reachable only as `utils.x` through `import utils`, not through
    # the name the script imported: the path is not written, the file is left with the reason
    assert not result.changed and [f.code for f in result.findings] == ["ACC135"], result.findings


def test_a_path_reading_a_name_the_script_cannot_reach_leaves_the_file(tmp_path: Path) -> None:
    utils = (PROJECT / "utils.py").read_text().replace(
        'dist.init_process_group(backend="gloo"', "dist.init_process_group(backend=BACKEND").replace(
        "def free_port():", 'BACKEND = "gloo"\n\n\ndef free_port():')
    script = _project(tmp_path, utils=utils)
    assert "utils.BACKEND" not in convert_source(script.read_text(), str(script)).output  # a global: not reached
    result = convert_source(script.read_text(), str(script))
    assert not result.changed and [f.code for f in result.findings] == ["ACC135"]


def test_a_modules_rank_helper_that_is_not_the_decision_still_blocks(tmp_path: Path) -> None:
    """``get_world_size()`` of a module that answers from a global of its own is no rank helper: under
    ``accelerate launch`` nothing would set it, so the script's use of it is still its own process management."""
    utils = (PROJECT / "utils.py").read_text().replace(
        "def get_world_size():\n    if not is_dist_avail_and_initialized():\n        return 1\n    return dist.get_world_size()",
        "WORLD = [1]\n\n\ndef get_world_size():\n    return WORLD[0]")
    script = _project(tmp_path, utils=utils)
    result = convert_source(script.read_text(), str(script))
    assert not result.changed and "ACC135" in [f.code for f in result.findings]
    assert any("get_world_size" in f.message for f in result.findings)
