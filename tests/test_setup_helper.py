"""ACC030: the torchvision references' set-up helper (`init_distributed_mode(args)`) is its launched path;
the rank helpers guarded by `dist.is_initialized()` answer from Accelerate's state (ACC034); a helper of another
module of the project is inlined in the script and stays in its module; a rank or a gather where no Accelerator can be
reached uses the Accelerator's state (`PartialState`, `accelerate.utils.gather`); the `--device` option
is followed into the function the parsed options are handed to; a DDP wrapper of a model nothing trains
is a refusal, not left behind."""
from __future__ import annotations

from textwrap import dedent

from conftest import convert

HELPERS = dedent('''\
    import os

    import torch
    import torch.distributed as dist


    def is_dist_avail_and_initialized():
        if not dist.is_available():
            return False
        if not dist.is_initialized():
            return False
        return True


    def get_rank():
        if not is_dist_avail_and_initialized():
            return 0
        return dist.get_rank()


    def init_distributed_mode(args):
        if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
            args.rank = int(os.environ["RANK"])
            args.world_size = int(os.environ["WORLD_SIZE"])
            args.gpu = int(os.environ["LOCAL_RANK"])
        elif "SLURM_PROCID" in os.environ:
            args.rank = int(os.environ["SLURM_PROCID"])
            args.gpu = args.rank % torch.cuda.device_count()
        else:
            print("Not using distributed mode")
            return

        torch.cuda.set_device(args.gpu)
        args.dist_backend = "nccl"
        print("| distributed init (rank {})".format(args.rank), flush=True)
        dist.init_process_group(backend=args.dist_backend, init_method=args.dist_url,
                                world_size=args.world_size, rank=args.rank)
        dist.barrier()


    def main(args):
        init_distributed_mode(args)
        model = torch.nn.Linear(4, 2).cuda(args.gpu)
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[args.gpu])
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(args.steps // args.world_size):
            loss = model(torch.randn(8, 4).cuda(args.gpu)).sum()
            loss.backward()
            optimizer.step()
        if get_rank() == 0 and args.rank == 0:
            torch.save(model.module.state_dict(), "model.pt")
''')


def test_the_helper_is_its_launched_path():
    result = convert(HELPERS, "train.py")
    out = result.output
    assert "init_distributed_mode" not in out and "init_process_group" not in out and "SLURM" not in out
    assert "args.gpu" not in out and "set_device" not in out and "barrier" not in out
    assert "range(args.steps // accelerator.num_processes)" in out
    assert "if get_rank() == 0 and accelerator.is_main_process:" in out
    # the guarded helpers answer from Accelerate's state (ACC034): the same numbers, no torch.distributed left
    assert "def get_rank():\n    return PartialState().process_index\n" in out and "dist." not in out
    assert [c.line for c in result.changes if c.code == "ACC030"] == [42]  # the call, on the file's lines


def test_converting_again_changes_nothing():
    out = convert(HELPERS, "train.py").output
    assert convert(out, "train.py").output == out


def test_a_gpu_read_elsewhere_leaves_the_helper():
    source = HELPERS.replace("    optimizer = torch.optim.SGD(", "    print(args.gpu)\n    optimizer = torch.optim.SGD(")
    result = convert(source, "train.py")
    assert result.output == source and result.findings


def test_a_helper_that_does_more_leaves_the_file():
    source = HELPERS.replace("    torch.cuda.set_device(args.gpu)\n", "    os.environ['NCCL_DEBUG'] = 'INFO'\n"
                             "    torch.cuda.set_device(args.gpu)\n")
    assert convert(source, "train.py").output == source


def test_a_flag_the_helper_sets_goes_unless_read_elsewhere():
    source = HELPERS.replace("    torch.cuda.set_device(args.gpu)\n", "    args.distributed = True\n"
                             "    torch.cuda.set_device(args.gpu)\n")
    assert "args.distributed" not in convert(source, "train.py").output
    read = source.replace("    optimizer = torch.optim.SGD(", "    print(args.distributed)\n    optimizer = torch.optim.SGD(")
    out = convert(read, "train.py").output
    assert "    args.distributed = True\n" in out and "def init_distributed_mode" not in out


def test_a_helper_called_twice_is_left():
    source = HELPERS.replace("    init_distributed_mode(args)\n", "    init_distributed_mode(args)\n    init_distributed_mode(args)\n")
    assert "def init_distributed_mode" in convert(source, "train.py").output


IN_MODEL = dedent('''\
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, TensorDataset


    class GatherLayer(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            output = [torch.zeros_like(x) for _ in range(dist.get_world_size())]
            dist.all_gather(output, x)
            return tuple(output)

        @staticmethod
        def backward(ctx, *grads):
            all_gradients = torch.stack(grads)
            dist.all_reduce(all_gradients)
            return all_gradients[dist.get_rank()]


    def main():
        dist.init_process_group("nccl")
        rank = dist.get_rank()
        model = torch.nn.Linear(4, 2).cuda(rank)
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank])
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = DataLoader(TensorDataset(torch.randn(64, 4)), batch_size=8)
        for (x,) in loader:
            out = model(x.cuda(rank))
            loss = torch.cat(GatherLayer.apply(out)).var()
            loss.backward()
            optimizer.step()
''')


def test_collectives_where_no_accelerator_is_reached_use_its_state():
    out = convert(IN_MODEL, "train.py").output
    assert "output = list(gather(x[None]))" in out
    assert 'all_gradients = reduce(all_gradients, reduction="sum")' in out
    assert "return all_gradients[PartialState().process_index]" in out
    assert "from accelerate import Accelerator, PartialState" in out and "from accelerate.utils import gather, reduce" in out
    runtime = convert(IN_MODEL, "train.py", target="runtime").output
    assert "from accelify.runtime import Accelerator, PartialState, gather, reduce" in runtime


def test_a_name_of_the_file_called_gather_is_not_shadowed():
    source = IN_MODEL.replace("import torch\n", "import torch\nfrom somewhere import gather\n", 1)
    result = convert(source, "train.py")
    assert result.output == source and "ACC126" in [f.code for f in result.findings]


def test_the_device_option_is_followed_into_the_function_it_is_handed_to():
    source = dedent('''\
        import argparse

        import torch


        def main(args):
            device = torch.device(args.device)
            model = torch.nn.Linear(4, 2).to(device)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for x in torch.randn(8, 4).split(2):
                loss = model(x.to(device)).sum()
                loss.backward()
                optimizer.step()


        if __name__ == "__main__":
            parser = argparse.ArgumentParser()
            parser.add_argument("--device", default="cuda")
            main(parser.parse_args())
    ''')
    out = convert(source, "train.py").output
    assert 'accelerator = Accelerator(cpu=args.device == "cpu")' in out and ".to(device)" not in out
    named = source.replace("    main(parser.parse_args())", "    args = parser.parse_args()\n    main(args)")
    assert 'Accelerator(cpu=args.device == "cpu")' in convert(named, "train.py").output


def test_a_ddp_wrapper_of_a_model_nothing_trains_is_a_refusal():
    """Left, a DDP wrapper would need the process group the conversion removes."""
    source = HELPERS.replace(
        "    optimizer = torch.optim.SGD(",
        "    teacher = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2).cuda(args.gpu))\n"
        "    optimizer = torch.optim.SGD(")
    result = convert(source, "train.py")
    assert result.output == source
    assert any(f.code == "ACC126" and "no optimizer it recognises trains it" in f.message for f in result.findings)


def test_dinos_teacher_wrapped_for_its_batch_norm_is_prepared_as_a_model():
    """`teacher = DDP(teacher, device_ids=[args.gpu])` (no optimizer trains it): `accelerator.prepare_model(teacher)`,
    a DDP wrapper under a launcher and the model itself in one process; its `.module` is unwrapped."""
    source = HELPERS.replace(
        "    optimizer = torch.optim.SGD(",
        "    teacher = torch.nn.Linear(4, 2).cuda(args.gpu)\n"
        "    teacher = torch.nn.parallel.DistributedDataParallel(teacher, device_ids=[args.gpu])\n"
        "    teacher.module.load_state_dict(model.module.state_dict())\n"
        "    for p in teacher.parameters():\n"
        "        p.requires_grad = False\n"
        "    optimizer = torch.optim.SGD(")
    out = convert(source, "train.py").output
    assert "    teacher = accelerator.prepare_model(teacher)\n" in out
    assert "accelerator.unwrap_model(teacher).load_state_dict(accelerator.unwrap_model(model).state_dict())" in out
    assert "teacher = torch.nn.Linear(4, 2).to(accelerator.device)" in out


MOCO_V3 = dedent('''\
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.tensorboard import SummaryWriter


    @torch.no_grad()
    def concat_all_gather(tensor):
        tensors_gather = [torch.ones_like(tensor) for _ in range(torch.distributed.get_world_size())]
        torch.distributed.all_gather(tensors_gather, tensor, async_op=False)
        return torch.cat(tensors_gather, dim=0)


    class Contrast(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = torch.nn.Linear(4, 4)

        def forward(self, x):
            q = self.encoder(x)
            k = concat_all_gather(q.detach())
            logits = q @ k.T
            labels = (torch.arange(len(q)) + len(q) * torch.distributed.get_rank()).cuda()
            return torch.nn.functional.cross_entropy(logits, labels)


    def main():
        dist.init_process_group("nccl")
        rank = dist.get_rank()
        model = Contrast().cuda(rank)
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank])
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        writer = SummaryWriter() if rank == 0 else None
        loader = DataLoader(TensorDataset(torch.randn(64, 4)), batch_size=8)
        for step, (x,) in enumerate(loader):
            loss = model(x.cuda(rank))
            loss.backward()
            optimizer.step()
            if rank == 0:
                writer.add_scalar("loss", loss.item(), step)
''')


def test_moco_v3s_model_collectives_and_placement_use_the_accelerators_state():
    result = convert(MOCO_V3, "train.py")
    out = result.output
    assert "tensors_gather = list(gather(tensor[None]))" in out  # `async_op=False`: all_gather blocks anyway
    assert "labels = (torch.arange(len(q)) + len(q) * PartialState().process_index).to(PartialState().device)" in out
    assert "writer = SummaryWriter() if accelerator.is_main_process else None" in out
    assert "ACC127" not in [f.code for f in result.findings]  # the writer is the main process's: no finding


def test_a_placement_in_a_constructor_is_still_refused():
    """`__init__` may run before the Accelerator exists: there `PartialState()` would set the state up first."""
    source = MOCO_V3.replace("        self.encoder = torch.nn.Linear(4, 4)\n",
                             "        self.encoder = torch.nn.Linear(4, 4)\n        self.scale = torch.ones(1).cuda()\n")
    result = convert(source, "train.py")
    assert result.output == source and "ACC109" in [f.code for f in result.findings]


BATCHES = dedent('''\
    import torch
    import torch.distributed as dist
    from torch.utils.data import BatchSampler, DataLoader, TensorDataset
    from torch.utils.data.distributed import DistributedSampler


    def main(batch_size):
        dist.init_process_group("nccl")
        rank = dist.get_rank()
        model = torch.nn.Linear(4, 2).cuda(rank)
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank])
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        data = TensorDataset(torch.randn(64, 4))
        sampler = DistributedSampler(data)
        batches = BatchSampler(sampler, batch_size, drop_last=True)
        loader = DataLoader(data, batch_sampler=batches, num_workers=0)
        for epoch in range(2):
            sampler.set_epoch(epoch)
            for (x,) in loader:
                loss = model(x.cuda(rank)).sum()
                loss.backward()
                optimizer.step()
''')


def test_a_batch_sampler_over_a_distributed_sampler_becomes_the_loaders_batching():
    out = convert(BATCHES, "train.py").output
    assert "loader = DataLoader(data, batch_size=batch_size, shuffle=True, drop_last=True, num_workers=0)" in out
    assert "BatchSampler" not in out and "DistributedSampler" not in out and "set_epoch" not in out


def test_a_batch_sampler_read_elsewhere_is_still_refused():
    source = BATCHES.replace("    for epoch in range(2):", "    print(len(batches))\n    for epoch in range(2):")
    assert source != BATCHES
    result = convert(source, "train.py")
    assert result.output == source and "ACC126" in [f.code for f in result.findings]


def test_an_import_only_the_helper_read_goes_and_one_left_unused_by_the_author_stays():
    source = HELPERS.replace("import os\n", "import os\nimport sys\n", 1)
    out = convert(source, "train.py").output
    assert "import os\n" not in out  # only `init_distributed_mode` read `os.environ`
    assert "import sys\n" in out  # unused in the original too: not the conversion's to remove


def test_a_wrapped_model_whose_gradients_stay_on_is_refused_not_prepared_as_a_teacher():
    """modded-nanogpt trains its DDP model through optimizers over its parts, which accelify does not recognise:
    without the evidence that nothing trains it (gradients turned off), the wrapper is a refusal."""
    source = HELPERS.replace(
        "    optimizer = torch.optim.SGD(",
        "    teacher = torch.nn.Linear(4, 2).cuda(args.gpu)\n"
        "    teacher = torch.nn.parallel.DistributedDataParallel(teacher, device_ids=[args.gpu])\n"
        "    optimizer = torch.optim.SGD(")
    result = convert(source, "train.py")
    assert result.output == source
    assert any("no optimizer it recognises trains it" in f.message for f in result.findings)
