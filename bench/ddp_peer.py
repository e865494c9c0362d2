#!/usr/bin/python3
"""PyTorch DistributedDataParallel peer for the pipeline benchmark (bench/pipeline_bench.sh).

Runs MODEL (tools/torch_models.py) with DDP over gloo: WORLD processes x 1 thread each, the
same per-process minibatch, SGD lr 0.01 momentum 0.9, synthetic Fashion-MNIST-shaped data.
Times STEPS training steps after WARMUP and prints one JSON line with samples_per_s (all
processes together). Usage: /usr/bin/python3 bench/ddp_peer.py MODEL WORLD MINIBATCH STEPS

Launched alone, it spawns WORLD processes on this machine (rendezvous on 127.0.0.1). Launched
as WORLD processes by mpirun (OMPI_COMM_WORLD_RANK/SIZE set) or by torchrun (RANK/WORLD_SIZE
set), each process is one rank and meets the others at MASTER_ADDR:MASTER_PORT; across hosts
gloo also needs GLOO_SOCKET_IFNAME. tools/cluster.sh run-torch sets all three (docs/reference/cluster-sh.md):
  tools/cluster.sh run-torch 2 /usr/bin/python3 bench/ddp_peer.py vgg16 2 64 50
"""
import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import json
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import torch_models  # noqa: E402


def worker(rank, world, name, batch, steps, warmup, addr, port, q=None):
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = addr
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(1)
    model = getattr(torch_models, name)()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator().manual_seed(rank)
    x = torch.rand(batch, 1, 28, 28, generator=g)
    y = torch.randint(0, 10, (batch,), generator=g)
    loss_fn = torch.nn.CrossEntropyLoss()
    times = []
    for i in range(warmup + steps):
        dist.barrier()
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = loss_fn(ddp(x), y)
        loss.backward()
        opt.step()
        t = time.perf_counter() - t0
        if i >= warmup:
            times.append(t)
    tt = torch.tensor([sum(times)])
    dist.all_reduce(tt, op=dist.ReduceOp.MAX)
    sps = world * batch * steps / tt.item()
    if rank == 0 and q is not None:
        q.put(sps)
    dist.destroy_process_group()
    return sps


def launched_rank():
    """(rank, size) when a launcher started this process as one rank, else None."""
    for r, n in (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("RANK", "WORLD_SIZE")):
        if r in os.environ and n in os.environ:
            return int(os.environ[r]), int(os.environ[n])
    return None


def main():
    name, world, batch, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    launched = launched_rank()
    if launched:
        rank, size = launched
        if size != world:
            sys.exit(f"ddp_peer.py: WORLD is {world} but the launcher started {size} processes")
        sps = worker(rank, world, name, batch, steps, 3, os.environ.get("MASTER_ADDR", "127.0.0.1"),
                     int(os.environ.get("MASTER_PORT", "29500")))
        if rank != 0:
            return
    else:
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        port = 29500 + os.getpid() % 1000
        procs = [ctx.Process(target=worker, args=(r, world, name, batch, steps, 3, "127.0.0.1", port, q))
                 for r in range(world)]
        for p in procs:
            p.start()
        sps = q.get()
        for p in procs:
            p.join()
    print(json.dumps({"peer": "pytorch-ddp-gloo", "model": name, "world": world, "minibatch_per_process": batch,
                      "threads_per_process": 1, "samples_per_s": round(sps, 1), "torch": torch.__version__}))


if __name__ == "__main__":
    main()
