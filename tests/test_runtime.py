"""accelify.runtime: the single-process stand-in for accelerate's Accelerator, tested directly
(``accelify.runtime.single_process``, whatever is installed), against hand-written loops and, where
accelerate is installed, against accelerate's own Accelerator in one process; and how
``accelify.runtime`` resolves its names with and without accelerate (subprocesses, accelerate
blocked by tests/e2e.py's ``without_accelerate``)."""
from __future__ import annotations

import random
import subprocess
import sys
from collections import namedtuple
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from e2e import REPO, script_env, without_accelerate  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from accelify.runtime import single_process  # noqa: E402
from accelify.runtime.single_process import Accelerator, DistributedDataParallelKwargs, set_seed  # noqa: E402
from accelify.runtime.wrappers import DeviceLoader, GatedOptimizer, GradientState  # noqa: E402


@pytest.fixture(autouse=True)
def _no_launcher(monkeypatch):
    """Whatever started pytest, these tests run as one process."""
    for var in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def accelerate_state():
    """accelerate's Accelerator in this process (skipped without accelerate); its process-wide
    singletons are reset afterwards."""
    accelerate = pytest.importorskip("accelerate")
    from accelerate.state import AcceleratorState, GradientState as AccelerateGradientState

    yield accelerate
    AcceleratorState._reset_state(True)
    AccelerateGradientState._reset_state()


def _expected_device() -> str:
    if torch.cuda.is_available():
        return "cuda"
    if torch.backends.mps.is_available():
        return "mps"
    return "cpu"


def _data(n: int = 10, seed: int = 0) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(n, 3, generator=g), torch.randn(n, 1, generator=g))


def _model(seed: int = 1) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))


# ---------------------------------------------------------------- device and prepare


def test_device_is_the_accelerator_else_cpu_and_cpu_forces_cpu():
    assert Accelerator().device.type == _expected_device()
    assert Accelerator(cpu=True).device == torch.device("cpu")
    assert Accelerator(cpu=True).state.device == torch.device("cpu")


def test_prepare_returns_objects_in_order_and_one_object_unwrapped():
    accelerator = Accelerator(cpu=True)
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1)
    loader = DataLoader(_data(), batch_size=4)
    other = object()
    out = accelerator.prepare(model, other, loader, optimizer, scheduler)
    assert len(out) == 5
    assert out[0] is model and out[1] is other and out[3] is optimizer and out[4] is scheduler
    assert isinstance(out[2], DeviceLoader) and out[2].base_dataloader is loader
    single = torch.nn.Linear(1, 1)
    assert Accelerator(cpu=True).prepare(single) is single


def test_prepared_loader_passes_attributes_through_and_yields_the_same_batches():
    loader = DataLoader(_data(), batch_size=4, shuffle=True)
    prepared = Accelerator(cpu=True).prepare(loader)
    assert len(prepared) == len(loader) == 3
    assert prepared.dataset is loader.dataset
    assert prepared.batch_size == 4
    assert prepared.sampler is loader.sampler
    assert prepared.num_workers == loader.num_workers  # any other attribute, too
    torch.manual_seed(5)
    expected = [x for x, _ in loader]
    torch.manual_seed(5)
    got = [x for x, _ in prepared]
    assert len(got) == 3 and all(torch.equal(a, b) for a, b in zip(got, expected))


def test_batches_land_on_the_device_nested():
    """On a device other than the CPU ("meta": no storage, any machine), every tensor of a nested
    batch moves; strings and numbers stay as they are."""
    Pair = namedtuple("Pair", "left right")
    batch = {"x": torch.ones(2), "parts": [torch.zeros(1), (torch.ones(1), "text")], "pair": Pair(torch.ones(1), 3)}
    loader = DeviceLoader([batch], torch.device("meta"), GradientState())
    (moved,) = list(loader)
    assert moved["x"].device.type == "meta"
    assert moved["parts"][0].device.type == "meta" and moved["parts"][1][0].device.type == "meta"
    assert moved["parts"][1][1] == "text" and isinstance(moved["parts"][1], tuple)
    assert isinstance(moved["pair"], Pair) and moved["pair"].left.device.type == "meta" and moved["pair"].right == 3
    accelerator = Accelerator(cpu=True)
    accelerator._device = torch.device("meta")
    model = accelerator.prepare(torch.nn.Linear(2, 2))
    assert model.weight.device.type == "meta"


def test_loader_knows_its_last_batch_and_unregisters_when_left_early():
    state = GradientState()
    loader = DeviceLoader(DataLoader(_data(10), batch_size=4), None, state)
    ends = []
    for _ in loader:
        ends.append((state.end_of_dataloader, state.remainder))
    assert ends == [(False, 2), (False, 2), (True, 2)]
    assert not state.in_dataloader
    for _ in loader:
        break
    assert not state.in_dataloader  # a loop left early does not stay registered


# ---------------------------------------------------------------- accumulation


def _hand_written(epochs: int, steps: int, loader_seed: int) -> tuple[torch.nn.Module, int, list]:
    """The accumulation loop accelify converts: divide, step every `steps` batches and at the end."""
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1 + s))
    loader = DataLoader(_data(10), batch_size=2, shuffle=True, generator=torch.Generator().manual_seed(loader_seed))
    stepped, lrs = 0, []
    for _ in range(epochs):
        for i, (x, y) in enumerate(loader):
            loss = torch.nn.functional.mse_loss(model(x), y) / steps
            loss.backward()
            if (i + 1) % steps == 0 or (i + 1) == len(loader):
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
                stepped += 1
        lrs.append(scheduler.get_last_lr())
    return model, stepped, lrs


def _accumulated(accelerator, epochs: int, loader_seed: int) -> tuple[torch.nn.Module, int, list]:
    """The converted loop: accumulate(), backward(), step and zero_grad on every batch."""
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1 + s))
    loader = DataLoader(_data(10), batch_size=2, shuffle=True, generator=torch.Generator().manual_seed(loader_seed))
    steps = []
    optimizer.register_step_post_hook(lambda *_: steps.append(1))
    loader, model, optimizer, scheduler = accelerator.prepare(loader, model, optimizer, scheduler)
    lrs = []
    for _ in range(epochs):
        for x, y in loader:
            with accelerator.accumulate(model):
                loss = torch.nn.functional.mse_loss(model(x), y)
                accelerator.backward(loss)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
        lrs.append(scheduler.get_last_lr())
    return model, len(steps), lrs


def test_accumulation_matches_the_hand_written_loop():
    """5 batches an epoch, 2 accumulated: steps after batches 2, 4 and 5 (the end of the loader),
    the loss divided by 2, the scheduler stepped with the optimizer only."""
    expected, expected_steps, expected_lrs = _hand_written(epochs=2, steps=2, loader_seed=7)
    model, steps, lrs = _accumulated(Accelerator(cpu=True, gradient_accumulation_steps=2), epochs=2, loader_seed=7)
    assert expected_steps == steps == 6
    assert lrs == expected_lrs
    for a, b in zip(model.parameters(), expected.parameters()):
        assert torch.allclose(a, b, rtol=0, atol=1e-7), (a, b)
    # and not what an ungated optimizer would do (the comparison can fail)
    ungated, _, _ = _hand_written(epochs=2, steps=1, loader_seed=7)
    assert not all(torch.allclose(a, b) for a, b in zip(model.parameters(), ungated.parameters()))


def test_accumulation_matches_accelerate(accelerate_state):
    ours = _accumulated(Accelerator(cpu=True, gradient_accumulation_steps=2), epochs=2, loader_seed=3)
    theirs = _accumulated(accelerate_state.Accelerator(cpu=True, gradient_accumulation_steps=2), epochs=2, loader_seed=3)
    assert ours[1:] == theirs[1:]
    for a, b in zip(ours[0].parameters(), theirs[0].parameters()):
        assert torch.equal(a, b)


def test_backward_divides_the_loss_by_the_accumulation_steps():
    x = torch.randn(4, 3)
    model, reference = _model(), _model()
    Accelerator(cpu=True, gradient_accumulation_steps=4).backward(model(x).sum())
    (reference(x).sum() / 4).backward()
    for a, b in zip(model.parameters(), reference.parameters()):
        assert torch.equal(a.grad, b.grad)


def test_optimizer_is_gated_only_when_accumulating():
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    assert Accelerator(cpu=True).prepare(optimizer) is optimizer
    gated = Accelerator(cpu=True, gradient_accumulation_steps=3).prepare(optimizer)
    assert isinstance(gated, GatedOptimizer) and isinstance(gated, torch.optim.Optimizer)
    assert gated.param_groups is optimizer.param_groups


def test_scaler_skips_the_step_and_the_scheduler_on_overflow():
    """fp16's GradScaler path (CUDA only in use; exercised here with a CPU GradScaler)."""
    accelerator = Accelerator(cpu=True)
    accelerator.scaler = torch.amp.GradScaler("cpu")
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.5)
    optimizer, scheduler = accelerator.prepare(optimizer, scheduler)
    before = model.weight.detach().clone()
    accelerator.backward(model(torch.ones(1, 2)).sum() * float("inf"))
    optimizer.step()
    scheduler.step()
    assert optimizer.step_was_skipped and accelerator.optimizer_step_was_skipped
    assert torch.equal(model.weight, before) and scheduler.get_last_lr() == [0.1]
    optimizer.zero_grad()
    accelerator.backward(model(torch.ones(1, 2)).sum())
    optimizer.step()
    scheduler.step()
    assert not optimizer.step_was_skipped
    assert not torch.equal(model.weight, before) and scheduler.get_last_lr() == [0.05]


# ---------------------------------------------------------------- mixed precision


def test_fp16_on_the_cpu_does_nothing_as_in_accelerate():
    accelerator = Accelerator(cpu=True, mixed_precision="fp16")
    assert accelerator.scaler is None and not accelerator.native_amp
    with accelerator.autocast():
        assert not torch.is_autocast_enabled("cpu")


def test_bf16_model_output_matches_accelerate(accelerate_state):
    x = torch.randn(5, 3)
    ours = Accelerator(cpu=True, mixed_precision="bf16").prepare(_model())
    theirs = accelerate_state.Accelerator(cpu=True, mixed_precision="bf16").prepare(_model())
    out = ours(x)
    assert out.dtype == torch.float32
    assert not torch.equal(out, _model()(x))  # computed in bfloat16 (the comparison can fail)
    assert torch.equal(out, theirs(x))


# ---------------------------------------------------------------- collectives


def test_gather_and_reduce_return_the_same_structure():
    accelerator = Accelerator(cpu=True)
    data = {"a": torch.arange(3), "b": [torch.ones(2), (torch.zeros(1),)]}
    assert accelerator.gather(data) is data
    assert accelerator.gather_for_metrics(data) is data  # not in a loader
    assert accelerator.pad_across_processes(data["a"]) is data["a"]
    for reduction in ("sum", "mean", "none"):
        reduced = accelerator.reduce(data, reduction=reduction)
        assert type(reduced["b"]) is list and type(reduced["b"][1]) is tuple
        assert torch.equal(reduced["a"], data["a"]) and reduced["a"] is not data["a"]
    with pytest.raises(TypeError):
        accelerator.reduce({"a": 1})


def test_gather_for_metrics_cuts_the_last_batch_as_accelerate(accelerate_state):
    """One process: on the last batch of 10 samples in 4s, tensors are cut to 2 rows (a no-op on
    batch-sized tensors, as Accelerate does), objects too; other batches come back whole."""
    def gathered(accelerator):
        loader = accelerator.prepare(DataLoader(_data(10), batch_size=4))
        return [(accelerator.gather_for_metrics(torch.arange(4)).tolist(), accelerator.gather_for_metrics(["a"] * 3))
                for _ in loader]

    ours = gathered(Accelerator(cpu=True))
    assert ours == [([0, 1, 2, 3], ["a"] * 3)] * 2 + [([0, 1], ["a"] * 2)]
    assert ours == gathered(accelerate_state.Accelerator(cpu=True))


def test_single_process_facts_and_no_op_contexts(capsys):
    accelerator = Accelerator(cpu=True)
    assert accelerator.is_main_process and accelerator.is_local_main_process
    assert (accelerator.process_index, accelerator.local_process_index, accelerator.num_processes) == (0, 0, 1)
    assert accelerator.use_distributed is False and accelerator.state.num_processes == 1
    accelerator.wait_for_everyone()
    accelerator.end_training()
    with accelerator.main_process_first(), accelerator.local_main_process_first(), accelerator.no_sync(None):
        pass
    with accelerator.split_between_processes([1, 2, 3]) as part:
        assert part == [1, 2, 3]
    accelerator.print("hello", 1)
    assert capsys.readouterr().out == "hello 1\n"
    assert not accelerator.check_trigger()
    accelerator.set_trigger()
    assert accelerator.check_trigger() and not accelerator.check_trigger()
    assert single_process.gather_object([1, 2]) == [1, 2]
    data = torch.arange(3)
    assert single_process.broadcast(data, from_process=0) is data


# ---------------------------------------------------------------- models and files


def test_unwrap_model_as_accelerate(accelerate_state):
    model = torch.nn.Linear(2, 2)
    accelerator = Accelerator(cpu=True)
    assert accelerator.unwrap_model(torch.nn.DataParallel(model)) is model
    compiled = torch.compile(torch.nn.DataParallel(model))
    kept = accelerator.unwrap_model(compiled)
    assert kept is compiled and kept._orig_mod is model  # compiled stays compiled, around the model
    assert Accelerator(cpu=True).unwrap_model(torch.compile(torch.nn.DataParallel(model)), keep_torch_compile=False) is model
    theirs = accelerate_state.Accelerator(cpu=True)
    assert theirs.unwrap_model(torch.compile(torch.nn.DataParallel(model)), keep_torch_compile=False) is model


def test_save_writes_with_torch_save(tmp_path):
    Accelerator(cpu=True).save({"w": torch.ones(2)}, tmp_path / "x.pt")
    assert torch.equal(torch.load(tmp_path / "x.pt")["w"], torch.ones(2))


# ---------------------------------------------------------------- construction


def test_constructor_takes_what_accelify_emits_and_refuses_the_rest():
    handler = DistributedDataParallelKwargs(find_unused_parameters=True)
    accelerator = Accelerator(cpu=True, mixed_precision="no", gradient_accumulation_steps=2, kwargs_handlers=[handler])
    assert accelerator.gradient_accumulation_steps == 2 and accelerator.mixed_precision == "no"
    assert handler.to_kwargs() == {"find_unused_parameters": True}
    with pytest.raises(TypeError, match="split_batches"):
        Accelerator(split_batches=True)
    with pytest.raises(TypeError, match="DistributedDataParallelKwargs"):
        Accelerator(kwargs_handlers=[object()])
    with pytest.raises(ValueError, match="mixed_precision"):
        Accelerator(mixed_precision="fp8")
    with pytest.raises(ValueError, match="gradient_accumulation_steps"):
        Accelerator(gradient_accumulation_steps=0)


def test_under_a_multi_process_launcher_it_asks_for_accelerate(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    with pytest.raises(RuntimeError, match=r"accelerate is not installed.*pip install accelerate"):
        Accelerator()
    monkeypatch.setenv("WORLD_SIZE", "1")
    Accelerator()  # one process under a launcher is fine


def test_set_seed_makes_every_generator_reproducible():
    np = pytest.importorskip("numpy")

    def draw():
        return random.random(), float(np.random.rand()), torch.rand(3).tolist()

    set_seed(3)
    first = draw()
    set_seed(3)
    assert draw() == first
    set_seed(4)
    assert draw() != first


# ---------------------------------------------------------------- accelify.runtime's names


def test_runtime_names_are_accelerates_when_it_is_installed():
    accelerate = pytest.importorskip("accelerate")
    import accelerate.utils

    import accelify.runtime as runtime

    assert runtime.Accelerator is accelerate.Accelerator
    assert runtime.set_seed is accelerate.utils.set_seed
    assert runtime.DistributedDataParallelKwargs is accelerate.DistributedDataParallelKwargs
    assert runtime.gather_object is accelerate.utils.gather_object
    assert runtime.uses_accelerate()
    with pytest.raises(AttributeError):
        runtime.Nothing


def _python(code: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=240)


def test_runtime_names_are_the_stand_ins_without_accelerate(tmp_path):
    code = (
        "import accelify.runtime as r, accelify.runtime.single_process as s\n"
        "from accelify.runtime import Accelerator, set_seed, DistributedDataParallelKwargs\n"
        "assert Accelerator is s.Accelerator and set_seed is s.set_seed\n"
        "assert DistributedDataParallelKwargs is s.DistributedDataParallelKwargs\n"
        "assert not r.uses_accelerate()\n"
        "try:\n    import accelerate\nexcept ImportError:\n    print('blocked')\n"
        "print(r.__file__)\n"
    )
    proc = _python(code, without_accelerate(script_env(), tmp_path / "blocker"))
    assert proc.returncode == 0, proc.stderr
    blocked, path = proc.stdout.split()
    assert blocked == "blocked"
    assert Path(path).resolve() == (REPO / "runtime" / "__init__.py").resolve()


def test_importing_the_runtime_imports_nothing_heavy(tmp_path):
    code = (
        "import sys\n"
        "import accelify.runtime\n"
        "print(sorted(m for m in ('torch', 'libcst', 'rich', 'typer', 'accelerate', 'numpy') if m in sys.modules))\n"
    )
    proc = _python(code, script_env())
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
