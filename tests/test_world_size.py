"""ACC028: a world size and rank the script counts for its process group are read from the group;
ACC029: an optimizer class of the script takes the closure the prepared optimizer hands `step`."""
from __future__ import annotations

from textwrap import dedent

from conftest import convert

COUNTED = dedent('''\
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.distributed import DistributedSampler


    def main(args):
        # every process of every node
        args.world_size = args.gpus * args.nodes
        mp.spawn(worker, nprocs=args.gpus, args=(args,))


    def worker(gpu, args):
        args.rank = args.nr * args.gpus + gpu
        dist.init_process_group("nccl", world_size=args.world_size, rank=args.rank)
        model = torch.nn.Linear(4, 2).cuda(gpu)
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[gpu])
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        data = TensorDataset(torch.randn(64, 4), torch.randn(64, 2))
        sampler = DistributedSampler(data, num_replicas=args.world_size, rank=args.rank)
        loader = DataLoader(data, batch_size=args.batch_size // args.world_size, sampler=sampler)
        for x, y in loader:
            loss = ((model(x.cuda(gpu)) - y.cuda(gpu)) ** 2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if args.rank == 0:
            torch.save(model.module.state_dict(), "model.pt")
''')


def test_counted_attributes_become_the_accelerators():
    result = convert(COUNTED, "train.py")
    out = result.output
    assert "args.world_size" not in out and "args.rank" not in out
    assert "batch_size=args.batch_size // accelerator.num_processes" in out
    assert "if accelerator.is_main_process:" in out
    assert "DistributedSampler" not in out and "mp.spawn" not in out
    assert "    # every process of every node\n    worker(args)" in out  # the comment stays
    assert [c.line for c in result.changes if c.code == "ACC028"] == [16]  # the set-up, on the file's lines


def test_a_local_rank_handed_to_the_group_is_read_from_it():
    source = COUNTED.replace("args.rank = args.nr", "rank = args.nr").replace("rank=args.rank", "rank=rank") \
        .replace("if args.rank == 0", "if rank == 0")
    out = convert(source, "train.py").output
    assert "rank = " not in out and "if accelerator.is_main_process:" in out


def test_a_read_where_the_group_does_not_exist_yet_leaves_the_file():
    for where in ("    mp.spawn(", "    dist.init_process_group("):  # in the spawning function, above the set-up
        source = COUNTED.replace(where, "    print(args.world_size)\n" + where, 1)
        assert source != COUNTED
        result = convert(source, "train.py")
        assert result.output == source
        assert any(f.code == "ACC126" and "args.world_size" in f.message for f in result.findings)


def test_a_count_that_cannot_be_dropped_alone_leaves_the_file():
    source = COUNTED.replace("args.world_size = args.gpus * args.nodes", "args.world_size, args.lr = 2, 0.1")
    assert convert(source, "train.py").output == source
    source = COUNTED.replace("args.gpus * args.nodes", "ask_the_cluster()")  # a call: it may do something
    assert convert(source, "train.py").output == source


def test_converting_again_changes_nothing():
    out = convert(COUNTED, "train.py").output
    assert convert(out, "train.py").output == out


def test_a_worker_named_like_a_method_is_still_the_spawned_one():
    """`model.train()` is no use of the function `train` (it was refused: "used elsewhere too")."""
    source = COUNTED.replace("worker", "train").replace("    for x, y in loader:", "    model.train()\n    for x, y in loader:")
    assert "accelerator.prepare" in convert(source, "train.py").output


OPTIMIZER = dedent('''\
    import torch


    class Plain(torch.optim.Optimizer):
        @torch.no_grad()
        def step(self):
            for group in self.param_groups:
                for p in group["params"]:
                    p.add_(p.grad, alpha=-group["lr"])


    class Warmup:
        def step(self):
            pass


    model = torch.nn.Linear(4, 2).cuda()
    optimizer = Plain(model.parameters(), {"lr": 0.1})
    for x in torch.randn(8, 4):
        loss = model(x.cuda()).sum()
        loss.backward()
        optimizer.step()
''')


def test_an_optimizer_class_takes_the_closure():
    out = convert(OPTIMIZER, "train.py").output
    assert out.count("def step(self, closure=None):") == 1  # the optimizer's, not the scheduler-like class's
    assert "class Warmup:\n    def step(self):" in out


def test_a_step_that_takes_something_already_is_left():
    source = OPTIMIZER.replace("def step(self):\n        for", "def step(self, closure=None):\n        for")
    assert "closure=None, closure" not in convert(source, "train.py").output


def test_an_optimizer_class_converted_again_changes_nothing():
    out = convert(OPTIMIZER, "train.py").output
    assert "def step(self, closure=None):" in out
    assert convert(out, "train.py").output == out
