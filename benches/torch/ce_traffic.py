"""The DRAM traffic of PyTorch's sparse cross-entropy, from its op sequence.

Records the ATen ops that `F.cross_entropy(x, y)` and its backward dispatch
(on the meta device: shapes and dtypes only, nothing is allocated, so the
H200 bench shape runs anywhere) and counts each op's compulsory traffic: the
bytes it must read and write at least once, whatever its kernel does inside.
On a GPU each of these ops is at least one kernel launch, so the sum is a
lower bound on what PyTorch moves through HBM for the loss.

Rules, op by op (everything else: every tensor input read once, every
output written once):
  - nll_loss_forward reads one logit per row (a 32-byte sector each) and
    the labels, and writes the scalar;
  - nll_loss_backward writes the whole gradient (zeros, then the -1 / N at
    each label: one full write) and reads the labels;
  - detach, ones_like of a scalar and new_empty_strided move nothing worth
    counting (a view, 2 bytes, an allocation);
  - copy_ into the freshly allocated `.grad` is listed apart: on CUDA,
    AccumulateGrad takes over the incoming gradient's buffer when nothing
    else holds it, so that copy does not happen there; on the meta device
    the dispatcher shows it because meta tensors carry no buffer to steal.

Usage: python3 benches/torch/ce_traffic.py [--rows N] [--cols V] [--dtype bf16]
Prints a table and one JSON line (`{"ops": [...], "total_bytes": ...}`).
"""
import argparse
import json

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
SECTOR = 32


class Recorder(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops.append((func.__name__ if hasattr(func, "__name__") else str(func), str(func), args, out))
        return out


def nbytes(t):
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0


def tensors(x):
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (tuple, list)):
        return [t for t in x if isinstance(t, torch.Tensor)]
    return []


def traffic(name, args, out):
    """(reads, writes, note) in bytes for one op."""
    ins = [a for a in args if isinstance(a, torch.Tensor)]
    outs = tensors(out)
    if name.startswith("aten.nll_loss_forward"):
        x, y = ins[0], ins[1]
        return y.numel() * (SECTOR + y.element_size()), sum(map(nbytes, outs)), "one sector per row"
    if name.startswith("aten.nll_loss_backward"):
        y = ins[2]
        return nbytes(y), sum(map(nbytes, outs)), "full gradient written"
    if name.startswith("aten.copy_"):
        return nbytes(ins[1]), nbytes(ins[0]), ""
    if name.startswith(("aten.detach", "aten.new_empty_strided")):
        return 0, 0, "no traffic"
    if name.startswith("aten.ones_like") and all(t.numel() <= 1 for t in ins):
        return 0, 0, "a scalar"
    return sum(map(nbytes, ins)), sum(map(nbytes, outs)), ""


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=32768)
    p.add_argument("--cols", type=int, default=32000)
    p.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    a = p.parse_args()
    x = torch.empty(a.rows, a.cols, dtype=DTYPES[a.dtype], device="meta", requires_grad=True)
    y = torch.empty(a.rows, dtype=torch.long, device="meta")
    rec = Recorder()
    with rec:
        F.cross_entropy(x, y).backward()
    rows, total, copy = [], 0, 0
    print(f"F.cross_entropy on [{a.rows}, {a.cols}] {a.dtype}, torch {torch.__version__}: compulsory traffic per op")
    print(f"{'op':42} {'read MiB':>10} {'write MiB':>10}  note")
    for _, name, args, out in rec.ops:
        r, w, note = traffic(name, args, out)
        if name.startswith("aten.copy_"):
            note, copy = "the .grad copy (not on CUDA, see the docstring)", r + w
        else:
            total += r + w
        rows.append({"op": name, "read": r, "write": w, "note": note})
        if r or w or note:
            print(f"{name:42} {r / 2**20:10.1f} {w / 2**20:10.1f}  {note}")
    elems = a.rows * a.cols
    print(f"total without the .grad copy: {total / 2**20:.1f} MiB ({total / elems:.2f} bytes per logit)")
    print(f"with it: {(total + copy) / 2**20:.1f} MiB ({(total + copy) / elems:.2f} bytes per logit)")
    print(json.dumps({"rows": a.rows, "cols": a.cols, "dtype": a.dtype, "ops": rows,
                      "total_bytes": total, "grad_copy_bytes": copy}))


if __name__ == "__main__":
    main()
