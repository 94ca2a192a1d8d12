// Indexing (crates/tensor/src/ops/index.rs) on contiguous buffers, the
// indexed tensor split around the axis into (outer, size, inner). Values are
// any of the six dtypes (elements are moved, or added for the `_add` kernels);
// indices are i64 or i32 (`_i64` / `_i32` suffix). A negative or too large
// index is never read through: the kernel writes 0 there (or adds nothing),
// records the lowest flat position of such an index in *bad (set to ~0 by
// the host; atomicMin), and the host returns Error::IndexOutOfRange as the
// CPU does, reading the flag once.
//
// - index_select(outer, size, inner, n, x, idx, out, bad):
//     out[o, k, i] = x[o, idx[k], i] for k < n (idx 1-D).
// - embedding(rows, dim, n, table, ids, out, bad): out[k, :] = table[ids[k], :],
//   one block per id at a time (the index_select of axis 0, with no
//   division per element); any grid size is correct.
// - index_add(outer, size, inner, n, g, idx, out, bad): out[o, idx[k], i] +=
//   g[o, k, i] (the transpose of index_select and embedding; atomicAdd, on
//   an output the host zeroes first).
// - gather(n, ndim, axis, info, x, idx, out, bad): out and idx share a shape
//   of `ndim` dims (n elements, contiguous); `info` holds those dims, then
//   x's strides, then x's dims (device memory); x may be any strided view.
//   Like torch, idx may be smaller than x on the other axes:
//     out[p] = x[p with its `axis` coordinate replaced by idx[p]].
// - scatter_add(n, ndim, axis, info, src, idx, out, bad): the transpose;
//   src is contiguous over idx's shape, `info` holds idx's dims, then the
//   strides and dims of `out` (which the host fills with the base tensor
//   first):  out[p with its axis coordinate replaced by idx[p]] += src[p]
//   (atomicAdd).
// - check_index(n, idx, size, bad): only the check, for the calls whose
//   main kernel would not visit every index (an empty operand).
//
// Integer sums wrap on overflow, where the CPU's (through f64) saturate.

// atomicAdd for every storage type. f16/bf16 by compare-and-swap on the
// aligned 32-bit word holding the value, adding in float.
__device__ __forceinline__ void atomic_add(float* p, float v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_add(double* p, double v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_add(int* p, int v) { atomicAdd(p, v); }
// Two's complement: an unsigned 64-bit add is the signed one.
__device__ __forceinline__ void atomic_add(i64* p, i64 v) { atomicAdd((u64*)p, (u64)v); }
template <typename H>
__device__ __forceinline__ void atomic_add_16(H* p, float v) {
    unsigned* word = (unsigned*)((size_t)p & ~(size_t)3);
    const bool high = ((size_t)p & 2) != 0;
    unsigned old = *word, assumed;
    do {
        assumed = old;
        H h;
        h.x = (u16)(high ? (assumed >> 16) : (assumed & 0xffffu));
        H sum = from_acc<H>(to_acc(h) + v);
        unsigned next = high ? ((assumed & 0xffffu) | ((unsigned)sum.x << 16)) : ((assumed & 0xffff0000u) | sum.x);
        old = atomicCAS(word, assumed, next);
    } while (old != assumed);
}
__device__ __forceinline__ void atomic_add(tapir_f16* p, tapir_f16 v) { atomic_add_16(p, to_acc(v)); }
__device__ __forceinline__ void atomic_add(tapir_bf16* p, tapir_bf16 v) { atomic_add_16(p, to_acc(v)); }

// The zero of a storage type (all bits clear for each of them).
template <typename T> __device__ __forceinline__ T zero() {
    T z = T();
    return z;
}

// The index at flat position `pos`, or -1 (recorded in *bad) when outside 0..size.
template <typename L>
__device__ __forceinline__ i64 checked(const L* idx, i64 pos, i64 size, u64* bad) {
    i64 j = (i64)idx[pos];
    if (j < 0 || j >= size) {
        if (bad) atomicMin(bad, (u64)pos);
        return -1;
    }
    return j;
}

// index_select and embedding move whole runs of `inner` (or `dim`)
// elements, so when a run's bytes are a multiple of 16 and both bases are
// 16-byte aligned they copy 16 bytes a thread (whatever the dtype: the
// elements are only moved), a warp 512 bytes a request where 2-byte
// elements made 64. A run of another length, or a base at an odd offset
// (a narrowed table), goes element by element.
template <typename T> __device__ __forceinline__ bool runs16(i64 run, const T* a, const T* b) {
    return ((run * (i64)sizeof(T)) & 15) == 0 && aligned16(a) && aligned16(b);
}

template <typename T, typename L>
__device__ __forceinline__ void index_select(i64 outer, i64 size, i64 inner, i64 n, const T* x, const L* idx, T* out,
                                             u64* bad) {
    if (runs16(inner, x, out)) {
        // The same loop over 16-byte units of the runs: a run is inner16 units.
        const i64 inner16 = inner * (i64)sizeof(T) / 16, total16 = outer * n * inner16;
        const uint4* x16 = (const uint4*)x;
        uint4* out16 = (uint4*)out;
        for (i64 t = global_id(); t < total16; t += global_stride()) {
            i64 i = t % inner16, k = (t / inner16) % n, o = t / (inner16 * n);
            i64 j = checked(idx, k, size, bad);
            out16[t] = j < 0 ? make_uint4(0u, 0u, 0u, 0u) : x16[(o * size + j) * inner16 + i];
        }
        return;
    }
    i64 total = outer * n * inner;
    for (i64 t = global_id(); t < total; t += global_stride()) {
        i64 i = t % inner, k = (t / inner) % n, o = t / (inner * n);
        i64 j = checked(idx, k, size, bad);
        out[t] = j < 0 ? zero<T>() : x[(o * size + j) * inner + i];
    }
}

template <typename T, typename L>
__device__ __forceinline__ void embedding(i64 rows, i64 dim, i64 n, const T* table, const L* ids, T* out, u64* bad) {
    const bool vec = runs16(dim, table, out);
    const i64 dim16 = dim * (i64)sizeof(T) / 16;
    for (i64 k = blockIdx.x; k < n; k += gridDim.x) {
        i64 j = checked(ids, k, rows, threadIdx.x == 0 ? bad : (u64*)0);
        T* o = out + k * dim;
        if (vec) {
            uint4* o16 = (uint4*)o;
            const uint4* src16 = (const uint4*)(table + (j < 0 ? 0 : j) * dim);
            for (i64 c = threadIdx.x; c < dim16; c += blockDim.x)
                o16[c] = j < 0 ? make_uint4(0u, 0u, 0u, 0u) : src16[c];
        } else if (j < 0) {
            for (i64 c = threadIdx.x; c < dim; c += blockDim.x) o[c] = zero<T>();
        } else {
            const T* src = table + j * dim;
            for (i64 c = threadIdx.x; c < dim; c += blockDim.x) o[c] = src[c];
        }
    }
}

template <typename T, typename L>
__device__ __forceinline__ void index_add(i64 outer, i64 size, i64 inner, i64 n, const T* g, const L* idx, T* out,
                                          u64* bad) {
    i64 total = outer * n * inner;
    for (i64 t = global_id(); t < total; t += global_stride()) {
        i64 i = t % inner, k = (t / inner) % n, o = t / (inner * n);
        i64 j = checked(idx, k, size, bad);
        if (j >= 0) atomic_add(out + (o * size + j) * inner + i, g[t]);
    }
}

// The offset in a tensor of strides `strides` (and extents `dims` along
// `axis`) of the element at contiguous position `p` of a tensor of dims
// `idims`, with its `axis` coordinate replaced by the checked index taken
// from idx[p]. Returns -1 for a bad index.
template <typename L>
__device__ __forceinline__ i64 axis_offset(i64 p, int ndim, int axis, const i64* idims, const i64* strides,
                                           const i64* dims, const L* idx, u64* bad) {
    i64 j = checked(idx, p, dims[axis], bad);
    if (j < 0) return -1;
    i64 off = 0, rest = p;
    for (int d = ndim - 1; d >= 0; --d) {
        i64 c = rest % idims[d];
        rest /= idims[d];
        off += (d == axis ? j : c) * strides[d];
    }
    return off;
}

template <typename T, typename L>
__device__ __forceinline__ void gather(i64 n, int ndim, int axis, const i64* info, const T* x, const L* idx, T* out,
                                       u64* bad) {
    for (i64 p = global_id(); p < n; p += global_stride()) {
        i64 off = axis_offset(p, ndim, axis, info, info + ndim, info + 2 * ndim, idx, bad);
        out[p] = off < 0 ? zero<T>() : x[off];
    }
}

template <typename T, typename L>
__device__ __forceinline__ void scatter_add(i64 n, int ndim, int axis, const i64* info, const T* src, const L* idx,
                                            T* out, u64* bad) {
    for (i64 p = global_id(); p < n; p += global_stride()) {
        i64 off = axis_offset(p, ndim, axis, info, info + ndim, info + 2 * ndim, idx, bad);
        if (off >= 0) atomic_add(out + off, src[p]);
    }
}

#define INDEX_KERNELS(T, S, L, LS)                                                                                  \
    extern "C" __global__ void index_select_##S##_##LS(i64 outer, i64 size, i64 inner, i64 n, const T* x,          \
                                                        const L* idx, T* out, u64* bad) {                           \
        index_select<T, L>(outer, size, inner, n, x, idx, out, bad);                                                \
    }                                                                                                               \
    extern "C" __global__ void embedding_##S##_##LS(i64 rows, i64 dim, i64 n, const T* table, const L* ids, T* out, \
                                                     u64* bad) {                                                    \
        embedding<T, L>(rows, dim, n, table, ids, out, bad);                                                        \
    }                                                                                                               \
    extern "C" __global__ void index_add_##S##_##LS(i64 outer, i64 size, i64 inner, i64 n, const T* g, const L* idx, \
                                                     T* out, u64* bad) {                                            \
        index_add<T, L>(outer, size, inner, n, g, idx, out, bad);                                                   \
    }                                                                                                               \
    extern "C" __global__ void gather_##S##_##LS(i64 n, int ndim, int axis, const i64* info, const T* x,           \
                                                  const L* idx, T* out, u64* bad) {                                 \
        gather<T, L>(n, ndim, axis, info, x, idx, out, bad);                                                        \
    }                                                                                                               \
    extern "C" __global__ void scatter_add_##S##_##LS(i64 n, int ndim, int axis, const i64* info, const T* src,    \
                                                       const L* idx, T* out, u64* bad) {                            \
        scatter_add<T, L>(n, ndim, axis, info, src, idx, out, bad);                                                 \
    }
#define INDEX_ALL(L, LS)                      \
    INDEX_KERNELS(float, f32, L, LS)          \
    INDEX_KERNELS(double, f64, L, LS)         \
    INDEX_KERNELS(tapir_f16, f16, L, LS)      \
    INDEX_KERNELS(tapir_bf16, bf16, L, LS)   \
    INDEX_KERNELS(int, i32, L, LS)           \
    INDEX_KERNELS(i64, i64, L, LS)           \
    extern "C" __global__ void check_index_##LS(i64 n, const L* idx, i64 size, u64* bad) { \
        for (i64 p = global_id(); p < n; p += global_stride()) checked(idx, p, size, bad);  \
    }

INDEX_ALL(i64, i64)
INDEX_ALL(int, i32)
