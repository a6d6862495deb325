"""Shapes found by converting research scripts again after their first blocker was fixed by hand (the
twelfth session): what such a script would have become is what a user who made the same fix would get.
Each was converted wrong, or refused with a false reason; each test fails on the code before its fix."""

from __future__ import annotations

import pytest

from accelify.core.pipeline import convert_source
from conftest import assert_stable

HEAD = """\
import torch
from torch.utils.data import DataLoader, TensorDataset
"""

LOOP = """\
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""


def script(body: str, imports: str = "", after: str = "", functions: str = "") -> str:
    return HEAD + imports + functions + f"""

def main():
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    data = torch.randn(32, 4)
    loader = DataLoader(TensorDataset(data, (data[:, 0] > 0).long()), batch_size=4, shuffle=True)
{body}{LOOP}{after}

if __name__ == "__main__":
    main()
"""


MODEL = """\
    model = torch.nn.Linear(4, 2).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
"""


def test_an_optimizer_over_parameters_of_no_model_it_can_name_is_refused() -> None:
    """NeRF: `grad_vars` comes back from `create_nerf`; prepared alone, the optimizer stepped models never
    wrapped for DDP, every process training its own copy (the conversion prepared only the optimizer)."""
    body = """\
    model = torch.nn.Linear(4, 2).to(device)
    kwargs, grad_vars = create_nerf(model)
    optimizer = torch.optim.Adam(params=grad_vars, lr=1e-2)
"""
    factory = "\n\ndef create_nerf(m):\n    return {'network_fn': m}, list(m.parameters())\n"
    result = convert_source(script(body, functions=factory), "train.py")
    assert not result.changed
    [finding] = result.findings
    assert finding.code == "ACC107" and "trains `grad_vars`" in finding.message


@pytest.mark.parametrize("groups", [
    "[{'params': model.get_1x_lr_params(), 'lr': 1e-2}, {'params': model.get_10x_lr_params(), 'lr': 1e-1}]",
    "get_param_groups(model, 1e-4)",
])
def test_parameter_groups_from_the_model_or_a_helper_name_the_model(groups: str) -> None:
    """DeepLab's `model.get_1x_lr_params()`, RealNVP's `util.get_param_groups(net, wd)`: the model is the
    one those groups come from (it was no model at all: a false ACC114, then ACC128)."""
    body = f"""\
    model = torch.nn.Linear(4, 2).to(device)
    optimizer = torch.optim.SGD({groups}, lr=1e-2)
"""
    helper = "\n\ndef get_param_groups(net, wd):\n    return [{'params': list(net.parameters()), 'weight_decay': wd}]\n"
    result = convert_source(script(body, functions=helper), "train.py")
    assert result.changed, [f.message for f in result.findings]
    assert "loader, model, optimizer = accelerator.prepare(loader, model, optimizer)" in result.output


def test_the_accelerator_goes_up_to_a_main_process_writer_above_the_device_line() -> None:
    """codesearch: `SummaryWriter(...) if args.visual else None` above the device line became `... if
    args.visual and accelerator.is_main_process else None`, read before `accelerator = Accelerator()`."""
    source = HEAD + """from torch.utils.tensorboard import SummaryWriter


def main(visual=True):
    writer = SummaryWriter("runs") if visual else None
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    data = torch.randn(32, 4)
    loader = DataLoader(TensorDataset(data, (data[:, 0] > 0).long()), batch_size=4, shuffle=True)
""" + MODEL + LOOP + """        if writer is not None:
            writer.add_scalar("loss", loss.item())


if __name__ == "__main__":
    main()
"""
    result = convert_source(source, "train.py")
    assert result.changed and result.error is None
    lines = result.output.splitlines()
    created = lines.index("    accelerator = Accelerator()")
    reads = [i for i, line in enumerate(lines) if "accelerator." in line and "Accelerator()" not in line]
    assert reads and created < min(reads)
    assert_stable(result.output)


def test_a_print_to_a_file_is_not_routed_to_the_console() -> None:
    """kws: `print(row, file=csv)` had become `accelerator.print(row, file=csv)`: the main process wrote,
    while every process had opened the file with "w" (and truncated it)."""
    after = """\
    with open("preds.csv", "w") as csv:
        print("id,label", file=csv)
    print("done")
"""
    result = convert_source(script(MODEL, after=after), "train.py")
    assert result.changed
    assert 'print("id,label", file=csv)' in result.output and 'accelerator.print("done")' in result.output
    assert "accelerator.print(\"id,label\"" not in result.output


def test_a_loader_parameter_bound_again_in_the_training_function_is_refused() -> None:
    """StyleGAN: `loader = sample_data(dataset, batch, resolution)` at each new resolution, in `train(loader,
    ...)` handed the prepared loader: the new loader was never prepared and every process trained on all of it."""
    source = HEAD + """

def sample_data(dataset, batch_size):
    return DataLoader(dataset, shuffle=True, batch_size=batch_size)


def train(loader, dataset, model, optimizer, device):
    for step in range(3):
        if step == 2:
            loader = sample_data(dataset, 8)
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


def main():
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    data = torch.randn(32, 4)
    dataset = TensorDataset(data, (data[:, 0] > 0).long())
    loader = sample_data(dataset, 4)
""" + MODEL + """    train(loader, dataset, model, optimizer, device)


if __name__ == "__main__":
    main()
"""
    result = convert_source(source, "train.py")
    assert not result.changed
    [finding] = result.findings
    assert finding.code == "ACC123" and "binds it again here to `sample_data(...)`" in finding.message


ITERATOR = """\
def infiniteloop(loader):
    while True:
        for x, y in loader:
            yield x, y
"""


def _made_before(seed: str = "", read: str = "") -> str:
    return HEAD + "import numpy as np\n\n\n" + ITERATOR + f"""

def main():
{seed}    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    data = torch.randn(32, 4)
    loader = DataLoader(TensorDataset(data, (data[:, 0] > 0).long()), batch_size=4, shuffle=True)
    looper = infiniteloop(loader)
{read}""" + MODEL + """    for step in range(4):
        x, y = next(looper)
        x, y = x.to(device), y.to(device)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
"""


@pytest.mark.parametrize("seed", ["", "    rng = np.random.RandomState(0)\n", "    torch.manual_seed(0)\n"])
def test_an_iterator_made_before_prepare_is_moved_after_it(seed: str) -> None:
    """DDPM (w86763777): `datalooper = infiniteloop(dataloader)` before the model. Left there, it holds the
    loader as it was before `prepare` (unsharded, shuffled per process unless torch is seeded); moved to just
    after `prepare`, it wraps the prepared one, as an Accelerate user writes it."""
    result = convert_source(_made_before(seed), "train.py")
    assert result.changed, [f.message for f in result.findings]
    out = result.output
    prepared = out.index("loader, model, optimizer = accelerator.prepare(loader, model, optimizer)\n")
    assert out.index("    looper = infiniteloop(loader)\n") > prepared
    assert out.count("looper = infiniteloop(loader)") == 1
    assert not any(f.code in ("ACC123", "ACC124") for f in result.findings)
    assert convert_source(out, "train.py").output == out  # moved once: converting again changes nothing


@pytest.mark.parametrize("seed, refused", [("", True), ("    rng = np.random.RandomState(0)\n", True),
                                           ("    torch.manual_seed(0)\n", False)])
def test_an_iterator_read_before_prepare_is_refused_unless_torch_is_seeded(seed: str, refused: bool) -> None:
    """The iterator drawn from before the model is built (a first batch to size the model): it cannot move, and
    it holds the unprepared loader; a NumPy generator of the file's own had counted as a seed."""
    source = _made_before(seed, read="    first, _ = next(looper)\n")
    result = convert_source(source, "train.py")
    codes = [f.code for f in result.findings]
    assert (not result.changed and codes == ["ACC123"]) if refused else (result.changed and "ACC124" in codes)


def test_an_iterator_made_after_the_optimizer_wraps_the_prepared_loader() -> None:
    """ODE-Net: ACC123's own suggestion (make it after the line that builds the optimizer) was refused too."""
    source = HEAD + "\n\n" + ITERATOR + """

def main():
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    data = torch.randn(32, 4)
    loader = DataLoader(TensorDataset(data, (data[:, 0] > 0).long()), batch_size=4, shuffle=True)
""" + MODEL + """    looper = infiniteloop(loader)
    for step in range(4):
        x, y = next(looper)
        x, y = x.to(device), y.to(device)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
"""
    result = convert_source(source, "train.py")
    assert result.changed, [f.message for f in result.findings]
    out = result.output
    assert out.index("accelerator.prepare(loader, model, optimizer)") < out.index("looper = infiniteloop(loader)")
    assert not any(f.code == "ACC124" for f in result.findings)  # it draws from the prepared loader: sharded


def test_a_checkpoint_written_through_a_handle_every_process_opens_is_refused() -> None:
    """BetaVAE: `with open(path, "wb+") as f: torch.save(state, f)`: saved once, the file was still opened
    (and truncated) by every process."""
    after = """\
    with open("ckpt.pt", "wb+") as f:
        torch.save({"model": model.state_dict()}, f)
"""
    result = convert_source(script(MODEL, after=after), "train.py")
    assert not result.changed
    [finding] = result.findings
    assert finding.code == "ACC128" and "written through `f`" in finding.message


def test_a_model_handed_to_another_modules_object_is_handed_unwrapped(tmp_path) -> None:
    """dome272's conditional DDPM: `ema.step_ema(ema_model, model)` of modules.py loads `model.state_dict()`
    into the EMA copy: from the DDP wrapper, its `module.` keys would not load."""
    (tmp_path / "modules.py").write_text(
        "class EMA:\n    def __init__(self, beta):\n        self.beta = beta\n\n"
        "    def step_ema(self, ema_model, model):\n        ema_model.load_state_dict(model.state_dict())\n")
    after = """\
        ema.step_ema(ema_model, model)
"""
    body = MODEL + "    ema = EMA(0.99)\n    ema_model = copy.deepcopy(model)\n"
    source = script(body, imports="import copy\n\nfrom modules import EMA\n", after=after)
    (tmp_path / "train.py").write_text(source)
    result = convert_source(source, str(tmp_path / "train.py"))
    assert result.changed, [f.message for f in result.findings]
    assert "        ema.step_ema(ema_model, accelerator.unwrap_model(model))\n" in result.output
    # made after prepare (which goes right after the optimizer): a copy of the model itself, not of its wrapper,
    # whose `module.` names the unwrapped state `step_ema` loads would not match
    assert "    ema_model = copy.deepcopy(accelerator.unwrap_model(model))\n" in result.output
    assert_stable(result.output)


def test_a_batch_taken_to_numpy_before_the_script_places_it_is_moved_to_the_host_first() -> None:
    """PointNet: `points = points.data.numpy()` for a NumPy augmentation, then `torch.Tensor(points)` and
    `.cuda()`: after `prepare` the batch is on the device already, where `.numpy()` raises."""
    body = MODEL.replace("    optimizer", "    import numpy as np\n    optimizer")
    source = script(body).replace(
        "        x, y = x.to(device), y.to(device)\n",
        "        x = x.data.numpy()\n        x = torch.Tensor(x + np.zeros_like(x))\n        x, y = x.to(device), y.to(device)\n")
    result = convert_source(source, "train.py")
    assert result.changed
    assert "        x = x.data.cpu().numpy()\n" in result.output
    assert "x, y = x.to(accelerator.device), y.to(accelerator.device)" in result.output  # rebuilt on the host
    assert_stable(result.output)


def _handed_test(calls: int) -> str:
    """ProtoNet's shape: `test` handed the prepared loader `calls` times in `main`, and a plain one in
    `evaluate_only`, which nothing calls."""
    return HEAD + """

def test(loader, model, device):
    correct = 0
    with torch.no_grad():
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            correct += (model(x).argmax(1) == y).sum().item()
    print("accuracy", correct / len(loader.dataset))


def evaluate_only(model, device):
    data = torch.randn(16, 4)
    test(DataLoader(TensorDataset(data, (data[:, 0] > 0).long()), batch_size=4), model, device)


def main():
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    data = torch.randn(32, 4)
    loader = DataLoader(TensorDataset(data, (data[:, 0] > 0).long()), batch_size=4, shuffle=True)
""" + MODEL + LOOP + "    test(loader, model, device)\n" * calls + """

if __name__ == "__main__":
    main()
"""


def test_a_function_handed_a_prepared_loader_and_a_plain_one_is_refused() -> None:
    """ProtoNet: `test(opt, test_dataloader, model)` from `main` (prepared) and from `eval` (not): `test` was
    left as it was, and counted one shard's accuracy on every process, with no finding."""
    source = _handed_test(1)
    result = convert_source(source, "train.py")
    assert not result.changed
    [finding] = result.findings
    assert finding.code == "ACC123" and "`test` is handed the prepared DataLoader `loader` in `main`" in finding.message
    assert "here in `evaluate_only` (which nothing in this file calls)" in finding.message  # ProtoNet's `eval`
    assert finding.suggestion.startswith("remove `evaluate_only` if it is unused, or prepare")


def test_a_finding_names_the_first_of_several_call_sites_every_time() -> None:
    """ProtoNet calls `test` with the prepared loader twice in `main`: the finding named line 226 in one run
    and line 232 in the next (LibCST holds a name's references in a set). It names the first, always."""
    source = _handed_test(3)
    first = source.splitlines().index("    test(loader, model, device)") + 1
    messages = {convert_source(source, "train.py").findings[0].message for _ in range(12)}
    assert len(messages) == 1 and f"in `main` (line {first})" in messages.pop()


@pytest.mark.parametrize("shape, why", [
    # pyGAT (Gordić): the backward in a closure a factory returns
    ("""
def get_main_loop(model, optimizer, loader, device):
    def main_loop():
""" + "\n".join("    " + line for line in LOOP.splitlines()) + """
    return main_loop


def main():
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    data = torch.randn(32, 4)
    loader = DataLoader(TensorDataset(data, (data[:, 0] > 0).long()), batch_size=4, shuffle=True)
""" + MODEL + """    get_main_loop(model, optimizer, loader, device)()
""", "a function defined inside `get_main_loop` (a closure)"),
    # BYOL: the trainer constructed with `**config`
    ("""
class Trainer:
    def __init__(self, model, optimizer, device, **params):
        self.model, self.optimizer, self.device = model, optimizer, device
        self.epochs = params["epochs"]

    def train(self, loader):
        model, optimizer, device = self.model, self.optimizer, self.device
""" + LOOP.replace("    ", "        ", 1).replace("\n    ", "\n        ") + """

def main():
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    data = torch.randn(32, 4)
    loader = DataLoader(TensorDataset(data, (data[:, 0] > 0).long()), batch_size=4, shuffle=True)
""" + MODEL + """    config = {"epochs": 1}
    Trainer(model, optimizer, device, **config).train(loader)
""", "`Trainer.__init__` takes its arguments through `*args` / `**kwargs`"),
])
def test_a_backward_out_of_reach_says_why_it_is(shape: str, why: str) -> None:
    """ACC106 said only "this backward cannot reach the script's Accelerator" (byol, pyGAT): it names why."""
    source = HEAD + shape + '\n\nif __name__ == "__main__":\n    main()\n'
    compile(source, "train.py", "exec")
    result = convert_source(source, "train.py")
    assert not result.changed
    codes = [f for f in result.findings if f.code == "ACC106"]
    assert codes and why in codes[0].message, [f.message for f in result.findings]


FLAG = HEAD + """import argparse


def main(args):
    print(args.gpu)
    args = argparse.Namespace(use_cpu=True, gpu="0")
    data = torch.randn(32, 4)
    loader = DataLoader(TensorDataset(data, (data[:, 0] > 0).long()), batch_size=4, shuffle=True)
    model = torch.nn.Linear(4, 2)
    if not args.use_cpu:
        model = model.cuda()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for x, y in loader:
        x = torch.Tensor(x.numpy())
        if not args.use_cpu:
            x, y = x.cuda(), y.cuda()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
{late}

if __name__ == "__main__":
    main(argparse.Namespace(use_cpu=False, gpu="0"))
"""


def test_a_placement_flag_bound_twice_before_the_objects_is_the_accelerators_cpu_flag() -> None:
    """PointNet: `def main(args): ... args = parse_args()`, then `if not args.use_cpu: classifier.cuda()`: the
    flag was not read (a name bound twice), and `Accelerator()` trained on the GPU where `--use_cpu` kept the
    rebuilt batch on the host."""
    result = convert_source(FLAG.format(late=""), "train.py")
    assert result.changed, [f.message for f in result.findings]
    assert "accelerator = Accelerator(cpu=args.use_cpu)" in result.output
    assert_stable(result.output)


def test_a_placement_flag_the_accelerator_cannot_read_is_refused() -> None:
    """The same flag bound again after the objects: no `cpu=` the Accelerator could be given; the file stays."""
    source = FLAG.format(late="    args = None\n").replace("    args = argparse.Namespace(use_cpu=True, gpu=\"0\")\n", "")
    result = convert_source(source, "train.py")
    assert not result.changed
    assert [f.code for f in result.findings] == ["ACC102"]
    assert "placed only when `not args.use_cpu` holds" in result.findings[0].message


NERF = HEAD + """
{top}


def train():
    model = torch.nn.Linear(4, 2).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(3):
        x = torch.randn(8, 4).to(device)
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    train()
"""


def test_a_module_level_device_is_named_not_called_placing_nothing() -> None:
    """NeRF: `device = torch.device(...)` at the module's top, `.to(device)` in `train()`, hand-made rays:
    ACC121 said the script "places nothing on a device"; it places, on a device `train` does not choose. A
    choice that reads a flag of the script stays the script's: ACC108 names it."""
    top = "NO_CUDA = False\ndevice = torch.device(\"cuda\" if torch.cuda.is_available() and not NO_CUDA else \"cpu\")"
    result = convert_source(NERF.format(top=top), "train.py")
    assert not result.changed
    codes = [f.code for f in result.findings]
    assert "ACC121" not in codes and "ACC108" in codes
    finding = next(f for f in result.findings if f.code == "ACC108")
    assert "a device chosen at the module's top (line 5)" in finding.message


def test_the_automatic_device_at_the_module_top_is_each_processs_own() -> None:
    """The same script with the automatic choice at the top: converted (ACC031), the rays placed on
    `accelerator.device`, and the loop over `range` reported as not sharded (ACC124)."""
    top = "device = torch.device(\"cuda\" if torch.cuda.is_available() else \"cpu\")"
    result = convert_source(NERF.format(top=top), "train.py")
    assert result.changed, [f.render() for f in result.findings]
    assert "        x = torch.randn(8, 4).to(accelerator.device)\n" in result.output
    assert [f.code for f in result.findings] == ["ACC124"]
    assert_stable(result.output)


STYLEGAN = HEAD + """

def sample_data(dataset, batch_size):
    return DataLoader(dataset, shuffle=True, batch_size=batch_size)


def train(dataset, model, optimizer, device):
    loader = sample_data(dataset, 4)
    data_loader = iter(loader)
    for i in range(3):
        x, y = next(data_loader)
        x, y = x.to(device), y.to(device)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def main():
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    data = torch.randn(32, 4)
    dataset = TensorDataset(data, (data[:, 0] > 0).long())
    model = torch.nn.Linear(4, 2).to(device)
    running = torch.nn.Linear(4, 2).to(device)
    running.train(False)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    train(dataset, model, optimizer, device)


if __name__ == "__main__":
    main()
"""


def test_batches_drawn_with_next_from_a_loader_no_prepare_takes_are_refused_truly() -> None:
    """StyleGAN: `loader = sample_data(...)` in `train`, `next(data_loader)` in the loop. It had been refused
    for a false reason (`g_running.train(False)` taken for a call of `train`, ACC104 "not built in one
    block"); with that fixed, it converted with ACC124 ("correct, but no faster"), every process drawing
    its own shuffled batches from the unprepared loader. Now ACC123, at the draw."""
    result = convert_source(STYLEGAN, "train.py")
    assert not result.changed
    assert [f.code for f in result.findings] == ["ACC123"]
    assert "draws with `next(data_loader)` from `data_loader`" in result.findings[0].message


def test_module_train_false_is_not_a_call_of_the_training_function() -> None:
    """`running.train(False)` in the setup block: `nn.Module.train(mode)`, not the file's `train()`."""
    from accelify.queries.training import trains
    import libcst as cst

    assert not trains(cst.parse_statement("running.train(False)\n"), {"train"})
    assert trains(cst.parse_statement("train(dataset, model)\n"), {"train"})


def test_a_none_placeholder_bound_for_good_below_is_not_an_optimizer_that_can_be_none() -> None:
    """U-Net (LeeJunHyun) with `build_model` inlined into `__init__`: `self.optimizer = None` first, the Adam
    a few lines below on every path. ACC104 said the optimizer "can be None"."""
    source = HEAD + """

class Solver:
    def __init__(self, loader):
        self.unet = None
        self.optimizer = None
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.loader = loader
        self.unet = torch.nn.Linear(4, 2).to(self.device)
        self.optimizer = torch.optim.Adam(self.unet.parameters(), lr=1e-2)

    def train(self):
        for x, y in self.loader:
            x, y = x.to(self.device), y.to(self.device)
            loss = torch.nn.functional.cross_entropy(self.unet(x), y)
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()


if __name__ == "__main__":
    data = torch.randn(32, 4)
    Solver(DataLoader(TensorDataset(data, (data[:, 0] > 0).long()), batch_size=4)).train()
"""
    result = convert_source(source, "train.py")
    assert not any(f.code == "ACC104" and "can be None" in f.message for f in result.findings), \
        [f.message for f in result.findings]
    conditional = source.replace("        self.optimizer = torch.optim.Adam(", "        if loader:\n            self.optimizer = torch.optim.Adam(")
    result = convert_source(conditional, "train.py")
    assert any(f.code == "ACC104" and "can be None" in f.message for f in result.findings)


def test_the_accelerators_own_print_of_the_model_is_left_alone() -> None:
    """MAML (hand-fixed): `print(maml)` became `accelerator.print(maml)`, which a second conversion read as
    the model handed to another package's code (`accelerate`) and unwrapped: not idempotent."""
    result = convert_source(script(MODEL + "    print(model)\n"), "train.py")
    assert "    accelerator.print(model)\n" in result.output
    assert_stable(result.output)


def test_a_loader_a_class_keeps_from_another_modules_function_is_named(tmp_path) -> None:
    """BetaVAE (hand-fixed): `self.data_loader = return_data(args)` of dataset.py, which runs a download: ACC124
    said the loop "runs over `self.data_loader`, not over a DataLoader"; it is one accelify cannot vouch for."""
    (tmp_path / "dataset.py").write_text(
        "import subprocess\nimport torch\nfrom torch.utils.data import DataLoader, TensorDataset\n\n\n"
        "def return_data(n):\n    subprocess.call(['./download.sh'])\n    data = torch.randn(n, 4)\n"
        "    return DataLoader(TensorDataset(data, (data[:, 0] > 0).long()), batch_size=4, shuffle=True)\n")
    source = HEAD + """from dataset import return_data


class Solver:
    def __init__(self):
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.data_loader = return_data(32)
        self.model = torch.nn.Linear(4, 2).to(self.device)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-2)

    def train(self):
        for x, y in self.data_loader:
            x, y = x.to(self.device), y.to(self.device)
            loss = torch.nn.functional.cross_entropy(self.model(x), y)
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()


if __name__ == "__main__":
    Solver().train()
"""
    (tmp_path / "solver.py").write_text(source)
    result = convert_source(source, str(tmp_path / "solver.py"))
    assert not result.changed
    codes = [f.code for f in result.findings]
    assert "ACC124" not in codes and "ACC135" in codes, [f.message for f in result.findings]
    assert "`return_data(32)`, a function of `dataset`" in next(f for f in result.findings if f.code == "ACC135").message


def test_a_local_function_that_prints_pulls_the_accelerator_up_to_its_first_call() -> None:
    """PointNet: `def log_string(s): logger.info(s); print(s)` inside `main`, called before the training
    objects: its print became `accelerator.print`, and the first call raised NameError (the Accelerator was
    created after it). The file handler it logs to is reported: every process writes that log file."""
    source = HEAD + """import logging


def main():
    def log_string(text):
        logger.info(text)
        print(text)

    logger = logging.getLogger("train")
    logger.addHandler(logging.FileHandler("log.txt"))
    log_string("PARAMETER ...")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    data = torch.randn(32, 4)
    loader = DataLoader(TensorDataset(data, (data[:, 0] > 0).long()), batch_size=4, shuffle=True)
""" + MODEL + LOOP + """    log_string("done")


if __name__ == "__main__":
    main()
"""
    result = convert_source(source, "train.py")
    assert result.changed
    lines = result.output.splitlines()
    assert lines.index("    accelerator = Accelerator()") < lines.index('    log_string("PARAMETER ...")')
    assert "        accelerator.print(text)" in lines
    # the handler is made and attached by the main process: one process writes log.txt
    assert "    if accelerator.is_main_process:\n        logger.addHandler(logging.FileHandler(\"log.txt\"))\n" in result.output
    assert "ACC127" not in [f.code for f in result.findings]
    assert_stable(result.output)


def test_a_file_the_main_process_saves_is_waited_for_before_every_process_loads_it() -> None:
    """kws: `torch.save(state, 'ckpt.t7')` (not a model: the main process writes it) when a metric improves,
    `torch.load('ckpt.t7')` after training on every process, with no barrier: FileNotFoundError on rank 1."""
    after = """\
        if loss.item() > best:
            best = loss.item()
            torch.save({"loss": best}, "ckpt.t7")
    state = torch.load("ckpt.t7")
    print(state["loss"])
"""
    body = MODEL + "    best = 0.0\n"
    source = script(body, after="").replace(LOOP, "    for epoch in range(2):\n" + LOOP.replace("\n    ", "\n        ")
                                            .replace("    for x, y", "        for x, y", 1) + after)
    compile(source, "train.py", "exec")
    result = convert_source(source, "train.py")
    assert result.changed, [f.message for f in result.findings]
    lines = result.output.splitlines()
    load = lines.index('    state = torch.load("ckpt.t7")')
    assert lines[load - 1] == "    accelerator.wait_for_everyone()"
    assert "                torch.save({\"loss\": best}, \"ckpt.t7\")" in lines  # under the main process


def test_results_written_per_batch_by_a_training_scripts_evaluation_loop_are_refused() -> None:
    """kws: `test(..., save=path)` prints `key,label` per sample into a CSV in the loop over the prepared test
    loader; gathered predictions were zipped with the process's own keys, and the file held one shard's rows."""
    after = """\
    with open("preds.csv", "w") as csv:
        with torch.no_grad():
            for x, y in loader:
                x = x.to(device)
                pred = model(x).argmax(1)
                for i, label in enumerate(pred):
                    print(i, int(label), file=csv)
"""
    result = convert_source(script(MODEL, after=after), "train.py")
    assert not result.changed
    assert "ACC131" in [f.code for f in result.findings]


EPISODES = HEAD + """

class Episodes:
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        for start in range(0, 32, 8):
            yield list(range(start, start + 8))

    def __len__(self):
        return 4


def test(loader, model, device):
    accs = []
    with torch.no_grad():
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            output = model(x)
            accs.append((output.argmax(1) == y).float().mean().item())
    print("accuracy", sum(accs) / len(accs))


def main():
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    data = torch.randn(32, 4)
    loader = DataLoader(TensorDataset(data, (data[:, 0] > 0).long()), batch_sampler={sampler})
""" + MODEL + LOOP + """    test(loader, model, device)


if __name__ == "__main__":
    main()
"""


def test_metrics_over_batches_a_sampler_of_its_own_builds_are_not_gathered() -> None:
    """ProtoNet: `DataLoader(dataset, batch_sampler=PrototypicalBatchSampler(...))`, one few-shot episode per
    batch; the prototypical loss gathered two processes' episodes into one."""
    result = convert_source(EPISODES.replace("{sampler}", "Episodes(32)"), "train.py")
    assert not result.changed
    [finding] = result.findings
    assert finding.code == "ACC114" and "a batch sampler of its own (`Episodes(32)`)" in finding.message
    plain = EPISODES.replace("{sampler}", "torch.utils.data.BatchSampler(range(32), 8, False)")
    result = convert_source(plain, "train.py")
    assert result.changed, [f.message for f in result.findings]
    assert "accelerator.gather_for_metrics" in result.output


def test_an_early_stop_on_a_gathered_evaluation_is_not_reported_as_per_process() -> None:
    """textCNN: `dev_acc = eval(dev_iter, model, args)` gathers its metrics, then `if steps - last_step >=
    early_stop: return`: ACC119 said each process decides on its own shard (a false warning on a file
    verified on two processes). The saves under such a test keep their own, stricter rule."""
    functions = """

def evaluate(model, loader, device):
    correct = total = 0
    with torch.no_grad():
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            output = model(x)
            correct += (output.argmax(1) == y).sum().item()
            total += len(y)
    return correct / total
"""
    after = """\
        acc = evaluate(model, loader, device)
        if acc < 0.1:
            return
"""
    source = script(MODEL, functions=functions).replace(LOOP, "    for epoch in range(3):\n" + LOOP.replace(
        "\n    ", "\n        ").replace("    for x, y", "        for x, y", 1) + after)
    compile(source, "train.py", "exec")
    result = convert_source(source, "train.py")
    assert result.changed, [f.message for f in result.findings]
    assert "ACC119" not in [f.code for f in result.findings]
    assert "accelerator.gather_for_metrics" in result.output
    per_process = source.replace("        acc = evaluate(model, loader, device)\n", "        acc = loss.item()\n")
    assert "ACC119" in [f.code for f in convert_source(per_process, "train.py").findings]
