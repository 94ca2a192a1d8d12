// Optimizer updates, one launch per parameter tensor (crates/nn/src/optim.rs
// and its CPU kernels in crates/nn/src/cpu/optim.rs). Every operand is
// contiguous with `n` elements; the parameter is updated in place and its
// state (momentum buffer, Adam's moments) is kept in the accumulation type:
// f64 for f64 parameters, f32 for every other.
//
// The arithmetic is written with the round-to-nearest intrinsics, one
// rounding per operation in the CPU's order, because NVRTC would otherwise
// contract `a * b + c` into a fused multiply-add and the update would no
// longer match the CPU's bit for bit. The scalar constants arrive as f64
// and are rounded to the accumulation type here, as the CPU rounds them.
//
// sgd_<dtype>(n, p, g, buf, lr, momentum, weight_decay, nesterov, first):
//   `buf` is null without momentum; `first` makes the buffer the gradient.
// adam_<dtype>(n, p, m, v, g, lr, weight_decay, beta1, beta2, step,
//   inv_bc2_sqrt, eps, decoupled): `step` is lr / (1 - beta1^t) and
//   `inv_bc2_sqrt` is 1 / sqrt(1 - beta2^t), both computed in f64.

__device__ __forceinline__ float r_add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double r_add(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ float r_sub(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ double r_sub(double a, double b) { return __dsub_rn(a, b); }
__device__ __forceinline__ float r_mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double r_mul(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float r_div(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ double r_div(double a, double b) { return __ddiv_rn(a, b); }
__device__ __forceinline__ float r_sqrt(float a) { return __fsqrt_rn(a); }
__device__ __forceinline__ double r_sqrt(double a) { return __dsqrt_rn(a); }

// Each thread updates the elements of one 16-byte unit of the state at a
// time when every operand is aligned for it: 4 f32 or 2 f64 elements, the
// parameter, the gradient and each state tensor in one 16-byte access;
// for f16 and bf16 parameters, whose state is f32, 4 elements, the
// parameter and gradient in 8-byte accesses (taking 8 of them would read
// the state in two 16-byte halves a thread, each warp-instruction then
// touching 32 sectors for 16 bytes each). The update reads each byte once,
// so the kernel is bound by HBM, and 2- or 4-byte lanes issue 4 to 8 times
// the memory instructions for the same bytes, too few bytes in flight to
// reach the roofline. The last n % N elements, and operands at other
// alignments (a gradient that is a view at an odd offset), go element by
// element. Both paths call the same per-element update below, so they
// agree bit for bit.
template <typename T> struct Lanes {
    // f32 and f64: Pack16 itself.
    typedef uint4 V;
    enum { N = Pack16<T>::N };
    __device__ static __forceinline__ void unpack(V r, T* o) { Pack16<T>::unpack(r, o); }
    __device__ static __forceinline__ V pack(const T* v) { return Pack16<T>::pack(v); }
};
template <typename H> struct LanesHalf {
    typedef uint2 V;
    enum { N = 4 };
    __device__ static __forceinline__ void unpack(V r, float* o) {
        Pack16Half<H>::unpack_word(r.x, o);
        Pack16Half<H>::unpack_word(r.y, o + 2);
    }
    __device__ static __forceinline__ V pack(const float* v) {
        return make_uint2(Pack16Half<H>::pack_word(v), Pack16Half<H>::pack_word(v + 2));
    }
};
template <> struct Lanes<tapir_f16> : LanesHalf<tapir_f16> {};
template <> struct Lanes<tapir_bf16> : LanesHalf<tapir_bf16> {};

// Whether `p` may be read and written as Lanes<T>::V.
template <typename T> __device__ __forceinline__ bool lanes_aligned(const void* p) {
    return ((u64)p & (sizeof(typename Lanes<T>::V) - 1)) == 0;
}

// One SGD step's constants, rounded to the accumulation type.
template <typename A> struct SgdK {
    A lr, mu, wd;
    int nesterov, first;
    bool momentum;  // a buffer is kept (not null, mu != 0)
};

// The SGD update of one element: returns the new parameter; *b is the
// momentum buffer's element, read unless this is the first step and
// written when there is momentum.
template <typename A> __device__ __forceinline__ A sgd_one(const SgdK<A>& k, A pi, A gi, A* b) {
    A d = r_add(gi, r_mul(k.wd, pi));
    if (k.momentum) {
        A nb = k.first ? d : r_add(r_mul(k.mu, *b), d);
        *b = nb;
        d = k.nesterov ? r_add(d, r_mul(k.mu, nb)) : nb;
    }
    return r_sub(pi, r_mul(k.lr, d));
}

template <typename T>
__device__ void sgd(i64 n, T* p, const T* g, typename Acc<T>::type* buf, double lr_, double mu_, double wd_,
                    int nesterov, int first) {
    typedef typename Acc<T>::type A;
    typedef Lanes<T> P;
    const int N = P::N;
    SgdK<A> k;
    k.lr = (A)lr_;
    k.mu = (A)mu_;
    k.wd = (A)wd_;
    k.nesterov = nesterov;
    k.first = first;
    k.momentum = buf != 0 && k.mu != A(0);
    // The first step writes the buffer without reading it.
    const bool read_buf = k.momentum && !first;
    i64 done = 0;
    if (lanes_aligned<T>(p) && lanes_aligned<T>(g) && (!k.momentum || aligned16(buf))) {
        const i64 packs = n / N;
        for (i64 q = global_id(); q < packs; q += global_stride()) {
            A pv[N], gv[N], bv[N];
            P::unpack(((const typename P::V*)p)[q], pv);
            P::unpack(((const typename P::V*)g)[q], gv);
            if (read_buf) Pack16<A>::unpack(((const uint4*)buf)[q], bv);
#pragma unroll
            for (int i = 0; i < N; ++i) pv[i] = sgd_one(k, pv[i], gv[i], &bv[i]);
            if (k.momentum) ((uint4*)buf)[q] = Pack16<A>::pack(bv);
            ((typename P::V*)p)[q] = P::pack(pv);
        }
        done = packs * N;
    }
    for (i64 i = done + global_id(); i < n; i += global_stride()) {
        A b = read_buf ? buf[i] : A(0);
        A pi = sgd_one(k, to_acc(p[i]), to_acc(g[i]), &b);
        if (k.momentum) buf[i] = b;
        p[i] = from_acc<T>(pi);
    }
}

// One Adam step's constants, rounded to the accumulation type.
template <typename A> struct AdamK {
    A lr, wd, b1, b2, step, ibc, eps;
    int decoupled;
};

// The Adam update of one element: returns the new parameter and updates
// the moments *m and *v.
template <typename A> __device__ __forceinline__ A adam_one(const AdamK<A>& k, A pi, A gi, A* m, A* v) {
    const A one = A(1);
    if (k.decoupled) {
        pi = r_sub(pi, r_mul(r_mul(k.lr, k.wd), pi));
    } else {
        gi = r_add(gi, r_mul(k.wd, pi));
    }
    A mi = r_add(r_mul(k.b1, *m), r_mul(r_sub(one, k.b1), gi));
    A vi = r_add(r_mul(k.b2, *v), r_mul(r_mul(r_sub(one, k.b2), gi), gi));
    *m = mi;
    *v = vi;
    return r_sub(pi, r_div(r_mul(k.step, mi), r_add(r_mul(r_sqrt(vi), k.ibc), k.eps)));
}

template <typename T>
__device__ void adam(i64 n, T* p, typename Acc<T>::type* m, typename Acc<T>::type* v, const T* g, double lr_,
                     double wd_, double b1_, double b2_, double step_, double ibc_, double eps_, int decoupled) {
    typedef typename Acc<T>::type A;
    typedef Lanes<T> P;
    const int N = P::N;
    AdamK<A> k;
    k.lr = (A)lr_;
    k.wd = (A)wd_;
    k.b1 = (A)b1_;
    k.b2 = (A)b2_;
    k.step = (A)step_;
    k.ibc = (A)ibc_;
    k.eps = (A)eps_;
    k.decoupled = decoupled;
    i64 done = 0;
    if (lanes_aligned<T>(p) && lanes_aligned<T>(g) && aligned16(m) && aligned16(v)) {
        const i64 packs = n / N;
        for (i64 q = global_id(); q < packs; q += global_stride()) {
            A pv[N], gv[N], mv[N], vv[N];
            P::unpack(((const typename P::V*)p)[q], pv);
            P::unpack(((const typename P::V*)g)[q], gv);
            Pack16<A>::unpack(((const uint4*)m)[q], mv);
            Pack16<A>::unpack(((const uint4*)v)[q], vv);
#pragma unroll
            for (int i = 0; i < N; ++i) pv[i] = adam_one(k, pv[i], gv[i], &mv[i], &vv[i]);
            ((uint4*)m)[q] = Pack16<A>::pack(mv);
            ((uint4*)v)[q] = Pack16<A>::pack(vv);
            ((typename P::V*)p)[q] = P::pack(pv);
        }
        done = packs * N;
    }
    for (i64 i = done + global_id(); i < n; i += global_stride()) {
        A mi = m[i], vi = v[i];
        A pi = adam_one(k, to_acc(p[i]), to_acc(g[i]), &mi, &vi);
        m[i] = mi;
        v[i] = vi;
        p[i] = from_acc<T>(pi);
    }
}

#define OPTIM_KERNELS(SUF, T)                                                                             \
    extern "C" __global__ void sgd_##SUF(i64 n, T* p, const T* g, Acc<T>::type* buf, double lr, double mu,   \
                                         double wd, int nesterov, int first) {                            \
        sgd<T>(n, p, g, buf, lr, mu, wd, nesterov, first);                                                \
    }                                                                                                     \
    extern "C" __global__ void adam_##SUF(i64 n, T* p, Acc<T>::type* m, Acc<T>::type* v, const T* g,         \
                                          double lr, double wd, double b1, double b2, double step,         \
                                          double ibc, double eps, int decoupled) {                         \
        adam<T>(n, p, m, v, g, lr, wd, b1, b2, step, ibc, eps, decoupled);                                 \
    }

OPTIM_KERNELS(f32, float)
OPTIM_KERNELS(f64, double)
OPTIM_KERNELS(f16, tapir_f16)
OPTIM_KERNELS(bf16, tapir_bf16)
