"""PyTorch DistributedDataParallel mirror of `tapir gpt --devices cuda:0,..`:
the `tapir gpt` default model (gpt_step.py's Gpt: vocab 13, d 64, 2 layers,
4 heads, sequences of 9 tokens), AdamW as tapir sets it, gradient clipping
at norm 1, each rank with its own --batch rows (the global batch is world x
batch, as tapir's), one process per GPU over NCCL (torch.multiprocessing,
a rendezvous on 127.0.0.1).

For every world size of --worlds, --steps steps after --warmup untimed
ones; prints one JSON line per world size and writes them all to --json:
steps per second and tokens per second of the slowest rank (the step is
synchronous, so every rank reports about the same), and the world's
speed-up over world 1 when both ran.

Usage: python3 benches/torch/gpt_ddp.py [--worlds 1,2] [--batch 64] [--steps 200] [--json out.json]
On the CPU (`--backend gloo --device cpu`) it runs anywhere, for a check of
the script itself; the figures that matter are CUDA's.
"""
import argparse
import json
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(__file__))
from gpt_step import T, VOCAB, Gpt, adamw  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_main(rank, world, args, port, results):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group(args.backend, rank=rank, world_size=world)
    if args.device == "cuda":
        torch.cuda.set_device(rank)
        dev = torch.device("cuda", rank)
    else:
        dev = torch.device("cpu")
        # CPU ranks share the machine's cores, as `mpirun -np N tapir` ranks do.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    torch.manual_seed(0)  # the same initial parameters on every rank (DDP broadcasts rank 0's anyway)
    model = Gpt().to(dev)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank] if dev.type == "cuda" else None)
    opt = adamw(model)
    g = torch.Generator().manual_seed(1 + rank)  # each rank its own rows
    x = torch.randint(0, VOCAB, (args.batch, T), generator=g).to(dev)
    y = torch.randint(0, VOCAB, (args.batch, T), generator=g).to(dev)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = ddp(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        dist.barrier()

    for _ in range(args.warmup):
        step()
    sync()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    sync()
    seconds = time.perf_counter() - t0
    # The slowest rank's time is the job's.
    slowest = torch.tensor([seconds], dtype=torch.float64, device=dev if args.backend == "nccl" else "cpu")
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    if rank == 0:
        s = slowest.item()
        results.put(
            {
                "id": "gpt_ddp",
                "world": world,
                "batch_per_rank": args.batch,
                "tokens_per_step": world * args.batch * T,
                "steps": args.steps,
                "seconds": s,
                "steps_per_s": args.steps / s,
                "tokens_per_s": args.steps * world * args.batch * T / s,
                "last_loss": float(loss.item()),
                "device": str(dev.type),
                "torch": torch.__version__,
            }
        )
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worlds", default="")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--backend", default="")
    ap.add_argument("--json")
    args = ap.parse_args()
    args.backend = args.backend or ("nccl" if args.device == "cuda" else "gloo")
    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"torch {torch.__version__} has no CUDA device", file=sys.stderr)
        sys.exit(3)
    available = torch.cuda.device_count() if args.device == "cuda" else os.cpu_count()
    worlds = [int(w) for w in args.worlds.split(",") if w] or sorted({1, available})
    if max(worlds) > available:
        print(f"--worlds {args.worlds}: this machine has {available} {args.device} devices", file=sys.stderr)
        sys.exit(2)
    ctx = mp.get_context("spawn")
    rows = []
    for world in worlds:
        results = ctx.Queue()
        mp.start_processes(rank_main, args=(world, args, free_port(), results), nprocs=world, join=True,
                           start_method="spawn")
        row = results.get(timeout=60)
        one = next((r for r in rows if r["world"] == 1), None)
        if one:
            row["speedup_over_1"] = row["tokens_per_s"] / one["tokens_per_s"]
        print(json.dumps(row), flush=True)
        rows.append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
