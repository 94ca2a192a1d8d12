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
//   a group of threads per id (`embedding_span`: a block holds one or
//   more groups), the index_select of axis 0 with no division per
//   element; any grid size is correct.
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
// - index_add_rows, gather_split, scatter_add_split: the fast paths of
//   index_add (f32, f16, bf16 rows of whole 16-byte units) and of gather
//   and scatter_add (a contiguous tensor, an index with its dims off the
//   axis); each is described above its code below.
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

// The threads that copy one id's row in the embedding kernel: the row's
// units (16-byte units, or elements when it cannot take them) rounded up
// to a power of two, at least a warp and at most the block, so a block of
// 256 threads copies 256 / span rows at once (2 rows of 1,024 bf16,
// where one left half the block idle). The host sizes the grid by the
// same rule (`embedding_span` in crates/tensor/src/cuda/index.rs).
__device__ __forceinline__ int embedding_span(i64 units) {
    const int u = (int)(units < (i64)blockDim.x ? units : (i64)blockDim.x);
    const int pow2 = u <= WARP ? WARP : 1 << (32 - __clz(u - 1));
    return pow2 < (int)blockDim.x ? pow2 : (int)blockDim.x;
}

template <typename T, typename L>
__device__ __forceinline__ void embedding(i64 rows, i64 dim, i64 n, const T* table, const L* ids, T* out, u64* bad) {
    const bool vec = runs16(dim, table, out);
    const i64 dim16 = dim * (i64)sizeof(T) / 16;
    const int span = embedding_span(vec ? dim16 : dim), per = (int)blockDim.x / span;
    const int lane = (int)threadIdx.x % span;
    for (i64 k = (i64)blockIdx.x * per + (int)threadIdx.x / span; k < n; k += (i64)gridDim.x * per) {
        i64 j = checked(ids, k, rows, lane == 0 ? bad : (u64*)0);
        T* o = out + k * dim;
        // Not unrolled: the compiler's unrolling of these loops (a 64-bit
        // division for the trip count, and a remainder loop) made more
        // instructions than the one or two units a thread copies.
        if (vec) {
            uint4* o16 = (uint4*)o;
            const uint4* src16 = (const uint4*)(table + (j < 0 ? 0 : j) * dim);
#pragma unroll 1
            for (i64 c = lane; c < dim16; c += span) o16[c] = j < 0 ? make_uint4(0u, 0u, 0u, 0u) : src16[c];
        } else if (j < 0) {
#pragma unroll 1
            for (i64 c = lane; c < dim; c += span) o[c] = zero<T>();
        } else {
            const T* src = table + j * dim;
#pragma unroll 1
            for (i64 c = lane; c < dim; c += span) o[c] = src[c];
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

// index_add's row kernel, for f32, f16 and bf16 rows whose bytes are a
// multiple of 16 on 16-byte aligned bases (the host picks it; other calls
// take the element loop above):
//   index_add_rows(outer, size, inner, n, chunk, group, g, idx, out, bad).
// A block takes `chunk` consecutive ids of one `o` and a tile of columns
// (blockDim.x threads x 16 bytes each), reads each id's row of g in
// 16-byte loads and sums it in shared memory, then adds each sum to its
// output row with one atomic a column (lanes on consecutive columns: 4
// sectors a request, no two lanes on one address). The sums are by slot:
// - group > 0 (few output rows, `group` slots): the block owns `group`
//   output rows (one group of them: blocks cover every group) for its
//   ids, skipping ids of other rows, so each output element receives one
//   atomic a block however many ids hit it (many rows into few: no
//   same-address storm); groups keep a block's sums small, so blocks of
//   256 threads fit 8 an SM;
// - group = 0 (`chunk` slots, chunk <= IA_IDS): an id's slot is the first
//   id of the chunk with the same target, so repeats within a chunk are
//   summed before their one atomic.
// f16 and bf16 add a pair of columns a lane with one packed atomic
// (`red.global.add.noftz.bf16x2` on sm_90; a 32-bit compare-and-swap
// before), where the element loop spent a compare-and-swap an element on
// a word its neighbour lane was also swapping.
#define IA_ACC 6144
#define IA_IDS 256
#define IA_SLOTS 64

__device__ __forceinline__ void flush_add(float* p, float v) { atomicAdd(p, v); }
// The packed 16-bit atomic add: each half of the word at `p` gets its half
// of `w` added, rounded once (`red.global.add.noftz.{f16x2,bf16x2}`,
// bf16x2 from sm_90, f16x2 from sm_60; the kernels use it from sm_90).
template <typename H> __device__ __forceinline__ void red_add_half2(H* p, unsigned w);
template <> __device__ __forceinline__ void red_add_half2<tapir_f16>(tapir_f16* p, unsigned w) {
    asm volatile("red.global.add.noftz.f16x2 [%0], %1;" ::"l"(p), "r"(w) : "memory");
}
template <> __device__ __forceinline__ void red_add_half2<tapir_bf16>(tapir_bf16* p, unsigned w) {
    asm volatile("red.global.add.noftz.bf16x2 [%0], %1;" ::"l"(p), "r"(w) : "memory");
}
#if __CUDA_ARCH__ >= 900
// sm_90's vector form: four packed words (eight 16-bit elements) added at
// the 16-byte aligned `p` with one `red.global.add.noftz.v4.{f16x2,bf16x2}`,
// each half rounded once an add as by the scalar form; a warp's request
// covers 512 bytes where the scalar form's covers 128.
template <typename H> __device__ __forceinline__ void red_add_half2x4(H* p, uint4 w);
template <> __device__ __forceinline__ void red_add_half2x4<tapir_f16>(tapir_f16* p, uint4 w) {
    asm volatile("red.global.add.noftz.v4.f16x2 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(w.x), "r"(w.y), "r"(w.z),
                 "r"(w.w)
                 : "memory");
}
template <> __device__ __forceinline__ void red_add_half2x4<tapir_bf16>(tapir_bf16* p, uint4 w) {
    asm volatile("red.global.add.noftz.v4.bf16x2 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(w.x), "r"(w.y), "r"(w.z),
                 "r"(w.w)
                 : "memory");
}
#endif
// Adds the pair (lo, hi) to the two 16-bit elements at `p` (4-byte
// aligned). On sm_90 one packed conversion and one packed `red`: the sums
// are rounded to the element type before the add, so an element that
// several blocks add to rounds twice an add where the compare-and-swap
// below rounds once (hardware orders the atomics at random either way).
// Older devices: a compare-and-swap loop on the word, first assuming the
// zero the host filled.
template <typename H> __device__ __forceinline__ void flush_add_pair(H* p, float lo, float hi) {
#if __CUDA_ARCH__ >= 900
    red_add_half2<H>(p, pack_half2<H>(lo, hi));
#else
    unsigned* word = (unsigned*)p;
    unsigned assumed = 0u;
    while (true) {
        float a[2];
        Pack16Half<H>::unpack_word(assumed, a);
        a[0] += lo;
        a[1] += hi;
        const unsigned old = atomicCAS(word, assumed, Pack16Half<H>::pack_word(a));
        if (old == assumed) break;
        assumed = old;
    }
#endif
}

// Adds the `w` summed columns of one slot (`a`, laid out as the threads
// hold them: float4 q of thread u at (q * nt + u)) to the output row `row`.
template <typename T> __device__ __forceinline__ void flush_row(T* row, const float* a, i64 w, int nt, int tid);
template <> __device__ __forceinline__ void flush_row<float>(float* row, const float* a, i64 w, int nt, int tid) {
    // One float4 a thread: column e is a[e] (a tile's columns fit in an int).
    for (int e = tid; e < (int)w; e += nt) flush_add(row + e, a[e]);
}
template <typename H> __device__ __forceinline__ void flush_row_half(H* row, const float* a, i64 w, int nt, int tid) {
#if __CUDA_ARCH__ >= 900
    // A thread's eight columns (its two float4, conflict-free: lanes read
    // consecutive float4) in one 16-byte vector `red`: the tile's columns
    // start at a multiple of eight elements of a row of whole 16-byte
    // units, in an output the host allocated fresh (512-byte granules).
    for (int u = tid; u < (int)(w / 8); u += nt) {
        const float4 lo = *(const float4*)(a + (u << 2)), hi = *(const float4*)(a + ((nt + u) << 2));
        const uint4 v = make_uint4(pack_half2<H>(lo.x, lo.y), pack_half2<H>(lo.z, lo.w), pack_half2<H>(hi.x, hi.y),
                                   pack_half2<H>(hi.z, hi.w));
        red_add_half2x4<H>(row + 8 * u, v);
    }
#else
    // Two float4 a thread: the pair of columns 2p, 2p + 1 is thread p / 4's,
    // in its part (2p % 8) / 4, read as one float2. A warp takes 32
    // consecutive pairs a turn (the 64 columns of 8 threads), lane l the
    // pair 4 (l % 16 / 2) + 2 (l / 16) + l % 2: the first half-warp reads
    // part 0 of the 8 threads, the second part 1, so each half-warp's
    // 8-byte reads are 128 consecutive bytes, one wavefront (lanes in
    // order put both parts, 4 KiB apart, in one half-warp's banks: 2-way
    // conflicts). The atomics still cover the warp's 128 output bytes.
    const int w2 = (int)(w / 2), lane = tid & (WARP - 1);
    const int first = tid - lane + ((lane & 15) >> 1) * 4 + (lane >> 4) * 2 + (lane & 1);
    for (int p = first; p < w2; p += nt) {
        const int u = p >> 2, r = (2 * p) & 7;
        const float2 s = *(const float2*)(a + (((r >> 2) * nt + u) << 2) + (r & 3));
        flush_add_pair(row + 2 * p, s.x, s.y);
    }
#endif
}
template <>
__device__ __forceinline__ void flush_row<tapir_f16>(tapir_f16* row, const float* a, i64 w, int nt, int tid) {
    flush_row_half(row, a, w, nt, tid);
}
template <>
__device__ __forceinline__ void flush_row<tapir_bf16>(tapir_bf16* row, const float* a, i64 w, int nt, int tid) {
    flush_row_half(row, a, w, nt, tid);
}

template <typename T, typename L>
__device__ __forceinline__ void index_add_rows(i64 outer, i64 size, i64 inner, i64 n, i64 chunk, int group,
                                               const T* g, const L* idx, T* out, u64* bad) {
    typedef Pack16<T> P;
    const int E = P::N, Q = P::N / 4;
    __shared__ __align__(16) float acc[IA_ACC];
    __shared__ i64 sid[IA_IDS];
    __shared__ int slot[IA_IDS];
    __shared__ int used[IA_SLOTS];
    float4* acc4 = (float4*)acc;
    const int tid = threadIdx.x, nt = blockDim.x;
    const bool owned = group > 0;
    const int nslots = owned ? group : (int)chunk;
    const i64 tile_w = (i64)nt * E, tiles = (inner + tile_w - 1) / tile_w, chunks = (n + chunk - 1) / chunk;
    const i64 groups = owned ? (size + group - 1) / group : 1;
    for (i64 ty = blockIdx.y; ty < tiles; ty += gridDim.y) {
        const i64 col0 = ty * tile_w, c = col0 + (i64)tid * E, w = min(tile_w, inner - col0);
        const bool mine = c < inner;
        for (i64 b = blockIdx.x; b < outer * chunks * groups; b += gridDim.x) {
            // Owned rows r0 .. r0 + group of this block (all ids, for chunks).
            const i64 r0 = (b % groups) * group, bc = b / groups;
            const i64 o = bc / chunks, k0 = (bc % chunks) * chunk, k1 = min(k0 + chunk, n);
            __syncthreads();  // the last flush has read the sums
            for (int s = tid; s < nslots * Q * nt; s += nt) acc4[s] = make_float4(0.f, 0.f, 0.f, 0.f);
            for (int s = tid; s < nslots; s += nt) used[s] = 0;
            for (i64 kb = k0; kb < k1; kb += IA_IDS) {
                const int m = (int)min((i64)IA_IDS, k1 - kb);
                __syncthreads();  // zeroed, and the last batch's ids are read
                for (int t = tid; t < m; t += nt) sid[t] = checked(idx, kb + t, size, ty == 0 ? bad : (u64*)0);
                __syncthreads();
                for (int t = tid; t < m; t += nt) {
                    const i64 j = sid[t];
                    // -1: a bad id, or (owned) a row of another group.
                    int s = owned ? (j >= r0 && j < r0 + group ? (int)(j - r0) : -1) : t;
                    if (!owned && j >= 0)
                        for (int u = 0; u < t; ++u)
                            if (sid[u] == j) {
                                s = u;
                                break;
                            }
                    slot[t] = s;
                }
                __syncthreads();
                // Each slot's flag by one thread: does an id of this batch land there?
                for (int s = tid; s < nslots; s += nt)
                    for (int t = 0; t < m && !used[s]; ++t)
                        if (sid[t] >= 0 && slot[t] == s) used[s] = 1;
                if (mine)
                    for (int t = 0; t < m; ++t) {
                        if (sid[t] < 0 || slot[t] < 0) continue;
                        const uint4 r = *(const uint4*)(g + (o * n + kb + t) * inner + c);
                        float v[P::N];
                        P::unpack(r, v);
                        for (int q = 0; q < Q; ++q) {
                            float4& a = acc4[(slot[t] * Q + q) * nt + tid];
                            a.x += v[4 * q];
                            a.y += v[4 * q + 1];
                            a.z += v[4 * q + 2];
                            a.w += v[4 * q + 3];
                        }
                    }
            }
            __syncthreads();
            for (int s = 0; s < nslots; ++s) {
                if (!used[s]) continue;
                const i64 j = owned ? r0 + s : sid[s];
                flush_row<T>(out + (o * size + j) * inner + col0, acc + (i64)s * Q * nt * 4, w, nt, tid);
            }
        }
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

// The strided kernels' `info` (3 x ndim values), copied once a block into
// shared memory: read per element from global memory, each of its values
// was a one-sector request of its own.
#define SHARED_INFO(info, ndim)                                                   \
    __shared__ i64 sinfo[3 * TAPIR_MAX_DIMS];                                     \
    for (int d = threadIdx.x; d < 3 * (ndim); d += blockDim.x) sinfo[d] = info[d]; \
    __syncthreads();

template <typename T, typename L>
__device__ __forceinline__ void gather(i64 n, int ndim, int axis, const i64* info, const T* x, const L* idx, T* out,
                                       u64* bad) {
    SHARED_INFO(info, ndim)
    for (i64 p = global_id(); p < n; p += global_stride()) {
        i64 off = axis_offset(p, ndim, axis, sinfo, sinfo + ndim, sinfo + 2 * ndim, idx, bad);
        out[p] = off < 0 ? zero<T>() : x[off];
    }
}

template <typename T, typename L>
__device__ __forceinline__ void scatter_add(i64 n, int ndim, int axis, const i64* info, const T* src, const L* idx,
                                            T* out, u64* bad) {
    SHARED_INFO(info, ndim)
    for (i64 p = global_id(); p < n; p += global_stride()) {
        i64 off = axis_offset(p, ndim, axis, sinfo, sinfo + ndim, sinfo + 2 * ndim, idx, bad);
        if (off >= 0) atomic_add(out + off, src[p]);
    }
}

// gather and scatter_add on a contiguous indexed tensor whose index has
// its dims except along the axis (the host picks these; others take the
// strided kernels above), split as (outer, size, inner) with `nax` ids
// along the axis:
//   gather_split(outer, size, inner, nax, x, idx, out, bad):
//     out[o, k, i] = x[o, idx[o, k, i], i];
//   scatter_add_split(outer, size, inner, nax, src, idx, out, bad):
//     out[o, idx[o, k, i], i] += src[o, k, i].
// gather takes V consecutive elements a thread (V = 2 or 4, so no access
// passes 16 bytes) when `inner` is a multiple of V and the bases allow:
// the ids and out in one vector access each, x too when the V ids are
// equal (a gather of whole rows), else V scalar loads.
// scatter_add adds with lanes on consecutive elements (coalesced atomics);
// f16 and bf16 take a pair of elements a lane, one packed atomic for the
// pair (sm_90's red.bf16x2, else a compare-and-swap) when both ids are
// equal (their targets share a word).
// V elements of T in one access of V x sizeof(T) bytes (4, 8 or 16).
template <int B> struct Word;
template <> struct Word<2> { typedef u16 type; };
template <> struct Word<4> { typedef unsigned type; };
template <> struct Word<8> { typedef uint2 type; };
template <> struct Word<16> { typedef uint4 type; };
template <typename T, int V> struct alignas(V * sizeof(T)) Vec {
    T e[V];
};
template <typename T, int V> __device__ __forceinline__ Vec<T, V> load_vec(const T* p) {
    typedef typename Word<V * sizeof(T)>::type W;
    Vec<T, V> r;
    *(W*)&r = *(const W*)p;
    return r;
}
template <typename T, int V> __device__ __forceinline__ void store_vec(T* p, const Vec<T, V>& r) {
    typedef typename Word<V * sizeof(T)>::type W;
    *(W*)p = *(const W*)&r;
}

// gather's elements a thread: as many as keep every access within 16
// bytes (2 for i64 indices or f64/i64 values, else 4).
template <typename T, typename L> struct GatherVec {
    enum { N = (sizeof(T) > sizeof(L) ? 16 / sizeof(T) : 16 / sizeof(L)) > 4
                   ? 4
                   : (sizeof(T) > sizeof(L) ? 16 / sizeof(T) : 16 / sizeof(L)) };
};

template <typename T, typename L>
__device__ __forceinline__ void gather_split(i64 outer, i64 size, i64 inner, i64 nax, const T* x, const L* idx, T* out,
                                             u64* bad) {
    const int V = GatherVec<T, L>::N;
    const i64 n = outer * nax * inner;
    const u64 vx = V * sizeof(T) - 1, vi = V * sizeof(L) - 1;
    if (inner % V == 0 && ((u64)x & vx) == 0 && ((u64)idx & vi) == 0 && ((u64)out & vx) == 0) {
        for (i64 q = global_id(); q < n / V; q += global_stride()) {
            const i64 p = V * q, i = p % inner, o = p / (inner * nax);
            const Vec<L, V> ids = load_vec<L, V>(idx + p);
            Vec<T, V> v;
            const i64 j0 = (i64)ids.e[0];
            bool same = j0 >= 0 && j0 < size;
            for (int u = 1; u < V; ++u) same = same && (i64)ids.e[u] == j0;
            if (same) {
                v = load_vec<T, V>(x + (o * size + j0) * inner + i);
            } else {
                for (int u = 0; u < V; ++u) {
                    const i64 j = checked(ids.e + u, 0, size, (u64*)0);
                    if (j < 0 && bad) atomicMin(bad, (u64)(p + u));
                    v.e[u] = j < 0 ? zero<T>() : x[(o * size + j) * inner + i + u];
                }
            }
            store_vec<T, V>(out + p, v);
        }
        return;
    }
    for (i64 p = global_id(); p < n; p += global_stride()) {
        const i64 i = p % inner, o = p / (inner * nax);
        const i64 j = checked(idx, p, size, bad);
        out[p] = j < 0 ? zero<T>() : x[(o * size + j) * inner + i];
    }
}

template <typename T, typename L>
__device__ __forceinline__ void scatter_add_split(i64 outer, i64 size, i64 inner, i64 nax, const T* src, const L* idx,
                                                  T* out, u64* bad) {
    const i64 n = outer * nax * inner;
    for (i64 p = global_id(); p < n; p += global_stride()) {
        const i64 i = p % inner, o = p / (inner * nax);
        const i64 j = checked(idx, p, size, bad);
        if (j >= 0) atomic_add(out + (o * size + j) * inner + i, src[p]);
    }
}

// The 16-bit scatter: a pair of elements a lane (inner even, bases 4-byte
// aligned), added to their one word with one packed atomic (sm_90) or
// compare-and-swap when their ids are equal.
template <typename H, typename L>
__device__ __forceinline__ void scatter_add_split_half(i64 outer, i64 size, i64 inner, i64 nax, const H* src,
                                                       const L* idx, H* out, u64* bad) {
    const i64 n = outer * nax * inner;
    if ((inner & 1) != 0 || ((u64)src & 3) != 0 || ((u64)out & 3) != 0 || ((u64)idx & (2 * sizeof(L) - 1)) != 0) {
        scatter_add_split<H, L>(outer, size, inner, nax, src, idx, out, bad);
        return;
    }
    for (i64 q = global_id(); q < n / 2; q += global_stride()) {
        const i64 p = 2 * q, i = p % inner, o = p / (inner * nax);
        // The pair's ids in one access.
        const Vec<L, 2> ids = load_vec<L, 2>(idx + p);
        const i64 j0 = checked(ids.e, 0, size, (u64*)0), j1 = checked(ids.e + 1, 0, size, (u64*)0);
        if (j0 < 0 && bad) atomicMin(bad, (u64)p);
        if (j1 < 0 && bad) atomicMin(bad, (u64)(p + 1));
        const unsigned pair = *(const unsigned*)(src + p);
        float v[2];
        Pack16Half<H>::unpack_word(pair, v);
        if (j0 >= 0 && j0 == j1) {
#if __CUDA_ARCH__ >= 900
            // The pair is already of H: the packed add rounds once, as the loop does.
            red_add_half2<H>(out + (o * size + j0) * inner + i, pair);
#else
            unsigned* word = (unsigned*)(out + (o * size + j0) * inner + i);
            unsigned assumed = *word;
            while (true) {
                float a[2];
                Pack16Half<H>::unpack_word(assumed, a);
                a[0] += v[0];
                a[1] += v[1];
                const unsigned old = atomicCAS(word, assumed, Pack16Half<H>::pack_word(a));
                if (old == assumed) break;
                assumed = old;
            }
#endif
        } else {
            if (j0 >= 0) atomic_add_16(out + (o * size + j0) * inner + i, v[0]);
            if (j1 >= 0) atomic_add_16(out + (o * size + j1) * inner + i + 1, v[1]);
        }
    }
}

// The 16-bit types take scatter_add_split's pair loop.
template <typename T> struct ScatterSplit {
    template <typename L>
    __device__ static __forceinline__ void run(i64 outer, i64 size, i64 inner, i64 nax, const T* src, const L* idx,
                                               T* out, u64* bad) {
        scatter_add_split<T, L>(outer, size, inner, nax, src, idx, out, bad);
    }
};
template <typename H> struct ScatterSplitHalf {
    template <typename L>
    __device__ static __forceinline__ void run(i64 outer, i64 size, i64 inner, i64 nax, const H* src, const L* idx,
                                               H* out, u64* bad) {
        scatter_add_split_half<H, L>(outer, size, inner, nax, src, idx, out, bad);
    }
};
template <> struct ScatterSplit<tapir_f16> : ScatterSplitHalf<tapir_f16> {};
template <> struct ScatterSplit<tapir_bf16> : ScatterSplitHalf<tapir_bf16> {};

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
    }                                                                                                               \
    extern "C" __global__ void gather_split_##S##_##LS(i64 outer, i64 size, i64 inner, i64 nax, const T* x,        \
                                                        const L* idx, T* out, u64* bad) {                           \
        gather_split<T, L>(outer, size, inner, nax, x, idx, out, bad);                                              \
    }                                                                                                               \
    extern "C" __global__ void scatter_add_split_##S##_##LS(i64 outer, i64 size, i64 inner, i64 nax, const T* src, \
                                                             const L* idx, T* out, u64* bad) {                      \
        ScatterSplit<T>::template run<L>(outer, size, inner, nax, src, idx, out, bad);                                        \
    }
#define INDEX_ADD_ROWS(T, S, L, LS)                                                                                 \
    extern "C" __global__ void index_add_rows_##S##_##LS(i64 outer, i64 size, i64 inner, i64 n, i64 chunk, int group, \
                                                          const T* g, const L* idx, T* out, u64* bad) {             \
        index_add_rows<T, L>(outer, size, inner, n, chunk, group, g, idx, out, bad);                                \
    }
#define INDEX_ALL(L, LS)                      \
    INDEX_KERNELS(float, f32, L, LS)          \
    INDEX_KERNELS(double, f64, L, LS)         \
    INDEX_KERNELS(tapir_f16, f16, L, LS)      \
    INDEX_KERNELS(tapir_bf16, bf16, L, LS)   \
    INDEX_KERNELS(int, i32, L, LS)           \
    INDEX_KERNELS(i64, i64, L, LS)           \
    INDEX_ADD_ROWS(float, f32, L, LS)        \
    INDEX_ADD_ROWS(tapir_f16, f16, L, LS)    \
    INDEX_ADD_ROWS(tapir_bf16, bf16, L, LS)  \
    extern "C" __global__ void check_index_##LS(i64 n, const L* idx, i64 size, u64* bad) { \
        for (i64 p = global_id(); p < n; p += global_stride()) checked(idx, p, size, bad);  \
    }

INDEX_ALL(i64, i64)
INDEX_ALL(int, i32)
