#!/usr/bin/env python3
"""PTX against SASS, statically: how many instructions each kernel's loops
issue in the PTX the emulated device counts, and in the SASS an H100 or
H200 would run (sm_90, from NVRTC's cubin through nvdisasm).

The emulated device counts executed PTX instructions, and the H200 model
(docs/gpu-model.md) takes one PTX warp-instruction as one issue slot. ptxas
fuses some PTX (a mul.lo and mul.hi pair into one IMAD.WIDE) and expands
other (a non-ftz lg2.approx into a subnormal test, a scale, MUFU.LG2 and a
correction); this script shows by how much, per loop body, with no GPU.

    pip install nvidia-cuda-nvrtc-cu12 nvidia-cuda-nvdisasm
    python3 scripts/sass-loops.py                 # every kernel file
    python3 scripts/sass-loops.py random.cu       # one file
    python3 scripts/sass-loops.py random.cu normal_bf16 normal_f32

A loop is a backward branch: its body is the instructions from the branch's
target label to the branch, inclusive (a predicated instruction counts once,
as it issues whether or not its predicate holds). Kernels print with their
whole static size and each loop's body, innermost last as the compiler laid
them out; PTX and SASS loops need not pair one to one.
"""

import ctypes
import glob
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KERNELS = os.path.join(ROOT, "crates", "tensor", "kernels")


def find(package_dir, name):
    """A file `name` under a pip package's folder, or None."""
    try:
        import importlib

        pkg = importlib.import_module(package_dir)
    except ImportError:
        return None
    for base in list(getattr(pkg, "__path__", [])):
        for path in glob.glob(os.path.join(base, "**", name), recursive=True):
            return path
    return None


def nvrtc():
    path = os.environ.get("TAPIR_NVRTC_LIB") or find("nvidia.cuda_nvrtc", "libnvrtc.so.12")
    if not path:
        sys.exit("NVRTC not found: pip install nvidia-cuda-nvrtc-cu12 (or set TAPIR_NVRTC_LIB)")
    return ctypes.CDLL(path)


def nvdisasm():
    for path in [os.environ.get("NVDISASM"), find("nvidia", "nvdisasm")]:
        if path and os.access(path, os.X_OK):
            return path
    sys.exit("nvdisasm not found: pip install nvidia-cuda-nvdisasm (or set NVDISASM)")


def compile_file(lib, name):
    """(PTX text, cubin bytes) of kernel file `name`, compiled as tapir compiles it."""
    prelude = open(os.path.join(KERNELS, "common.cuh")).read()
    src = open(os.path.join(KERNELS, name)).read()
    full = f'{prelude}\n#line 1 "{name}"\n{src}'.encode()
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), full, name.encode(), 0, None, None):
        sys.exit(f"{name}: nvrtcCreateProgram failed")
    opts = [b"--gpu-architecture=sm_90", b"--std=c++17"]
    if lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts)):
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, log)
        sys.exit(f"{name}: {log.value.decode()}")

    def get(size_fn, get_fn):
        size = ctypes.c_size_t()
        if getattr(lib, size_fn)(prog, ctypes.byref(size)):
            sys.exit(f"{name}: {size_fn} failed")
        buf = ctypes.create_string_buffer(size.value)
        if getattr(lib, get_fn)(prog, buf):
            sys.exit(f"{name}: {get_fn} failed")
        return buf.raw

    ptx = get("nvrtcGetPTXSize", "nvrtcGetPTX").rstrip(b"\0").decode()
    cubin = get("nvrtcGetCUBINSize", "nvrtcGetCUBIN")
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return ptx, cubin


def loops(items):
    """Loop bodies of a function given as a list of ('label', name) and
    ('ins', branch_target_or_None): one size per backward branch."""
    where, n, out = {}, 0, []
    for kind, value in items:
        if kind == "label":
            where[value] = n
        else:
            n += 1
            if value is not None and value in where:
                out.append(n - where[value])
    return n, out


def ptx_functions(ptx):
    funcs, name, items = {}, None, []
    for raw in ptx.splitlines():
        line = raw.split("//")[0].strip()
        m = re.match(r"\.(?:visible\s+)?\.entry\s+(\w+)", line)
        if m:
            name, items = m.group(1), []
            funcs[name] = items
            continue
        if name is None or not line or line in "{}" or line.startswith("."):
            continue
        m = re.match(r"^(\$\w+):$", line)
        if m:
            items.append(("label", m.group(1)))
        elif line.endswith(";"):
            b = re.search(r"\bbra(?:\.uni)?\s+(\$\w+);", line)
            items.append(("ins", b.group(1) if b else None))
    return {k: loops(v) for k, v in funcs.items()}


def sass_functions(sass):
    funcs, name, items = {}, None, []
    for line in sass.splitlines():
        m = re.match(r"^\.text\.(\w+):", line.strip())
        if m:
            name, items = m.group(1), []
            funcs[name] = items
            continue
        if name is None:
            continue
        m = re.match(r"^\s*(\.L_x_\d+):", line)
        if m:
            items.append(("label", m.group(1)))
            line = line[m.end():]
        m = re.search(r"/\*[0-9a-f]{4,}\*/\s+(.*?);", line)
        if m:
            ins = m.group(1)
            if re.search(r"\bNOP\b", ins):
                continue
            b = re.search(r"\bBRA\b.*?`\((\.L_x_\d+)\)", ins)
            items.append(("ins", b.group(1) if b else None))
    # A function's trailing `BRA` to itself (the end marker) is no loop.
    out = {}
    for k, v in funcs.items():
        n, ls = loops(v)
        out[k] = (n, [x for x in ls if x > 1])
    return out


def main():
    args = sys.argv[1:]
    files = [args[0]] if args else sorted(os.path.basename(p) for p in glob.glob(os.path.join(KERNELS, "*.cu")))
    only = set(args[1:])
    lib, dis = nvrtc(), nvdisasm()
    print(f"{'kernel':<34} {'PTX':>6} {'SASS':>6}  loop bodies, PTX -> SASS")
    for name in files:
        ptx, cubin = compile_file(lib, name)
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(cubin)
            f.flush()
            sass = subprocess.run([dis, "-c", f.name], capture_output=True, text=True, check=True).stdout
        p, s = ptx_functions(ptx), sass_functions(sass)
        for k in sorted(p):
            if only and k not in only:
                continue
            (pn, pl), (sn, sl) = p[k], s.get(k, (0, []))
            print(f"{k:<34} {pn:>6} {sn:>6}  {pl} -> {sl}")


if __name__ == "__main__":
    main()
