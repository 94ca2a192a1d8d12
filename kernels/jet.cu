// tapir-nn's forward-Laplacian updates of a tanh layer (crates/nn/src/jet.rs),
// launched by crates/tensor/src/cuda/jet.rs. Every operand is contiguous; a
// null `l` is zero. Arithmetic in the accumulator type (f32 for f16/bf16).
//
// tanh_jet:      out = (1 - a^2)(l - 2 a s), `a`, `l` [n/w, w], `s` the same or
//                one row [w] (s_row).
// tanh_jet_grad: for the output's gradient g, with d = 1 - a^2 and
//                u = l - 2 a s: dl = g d, ds = -2 a dl, da = -2 g (a u + s d).
// tanh_jac:      out = j (1 - a^2) over [N, d, w], `a` [N, w] broadcast over
//                each point's d rows, `j` the same shape or one [1, d, w]
//                (j_row); also the Jacobian's gradient g (1 - a^2).
// tanh_jac_da:   da = -2 a sum_i g_i j_i over each point's d rows, [N, w].

template <typename T>
__device__ __forceinline__ void tanh_jet(i64 n, i64 w, i64 s_row, const T* a, const T* s, const T* l, T* out) {
    typedef typename Acc<T>::type A;
    for (i64 i = global_id(); i < n; i += global_stride()) {
        A av = to_acc(a[i]);
        A inner = av * to_acc(s[s_row ? i % w : i]) * A(-2);
        if (l) inner = to_acc(l[i]) + inner;
        out[i] = from_acc<T>(inner * (A(1) - av * av));
    }
}

template <typename T>
__device__ __forceinline__ void tanh_jet_grad(i64 n, i64 w, i64 s_row, const T* a, const T* s, const T* l,
                                              const T* g, T* da, T* ds, T* dl) {
    typedef typename Acc<T>::type A;
    for (i64 i = global_id(); i < n; i += global_stride()) {
        A av = to_acc(a[i]), sv = to_acc(s[s_row ? i % w : i]), gv = to_acc(g[i]);
        A d = A(1) - av * av;
        A u = av * sv * A(-2);
        if (l) u = to_acc(l[i]) + u;
        A gl = gv * d;
        dl[i] = from_acc<T>(gl);
        ds[i] = from_acc<T>(av * gl * A(-2));
        da[i] = from_acc<T>((av * u + sv * d) * gv * A(-2));
    }
}

template <typename T>
__device__ __forceinline__ void tanh_jac(i64 n, i64 d, i64 w, i64 j_row, const T* j, const T* a, T* out) {
    typedef typename Acc<T>::type A;
    const i64 per_point = d * w;
    for (i64 i = global_id(); i < n; i += global_stride()) {
        A av = to_acc(a[(i / per_point) * w + i % w]);
        out[i] = from_acc<T>(to_acc(j[j_row ? i % per_point : i]) * (A(1) - av * av));
    }
}

template <typename T>
__device__ __forceinline__ void tanh_jac_da(i64 n, i64 d, i64 w, i64 j_row, const T* j, const T* a, const T* g,
                                            T* da) {
    typedef typename Acc<T>::type A;
    for (i64 k = global_id(); k < n; k += global_stride()) {
        const i64 p = k / w, c = k % w;
        const T* gp = g + p * d * w + c;
        const T* jp = j + (j_row ? 0 : p * d * w) + c;
        A acc = A(0);
        for (i64 i = 0; i < d; i++) acc += to_acc(gp[i * w]) * to_acc(jp[i * w]);
        da[k] = from_acc<T>(to_acc(a[k]) * acc * A(-2));
    }
}

#define JET_KERNELS(T, SUFFIX)                                                                                  \
    extern "C" __global__ void tanh_jet_##SUFFIX(i64 n, i64 w, i64 s_row, const T* a, const T* s, const T* l,   \
                                                 T* out) {                                                     \
        tanh_jet<T>(n, w, s_row, a, s, l, out);                                                                 \
    }                                                                                                           \
    extern "C" __global__ void tanh_jet_grad_##SUFFIX(i64 n, i64 w, i64 s_row, const T* a, const T* s,           \
                                                      const T* l, const T* g, T* da, T* ds, T* dl) {            \
        tanh_jet_grad<T>(n, w, s_row, a, s, l, g, da, ds, dl);                                                  \
    }                                                                                                           \
    extern "C" __global__ void tanh_jac_##SUFFIX(i64 n, i64 d, i64 w, i64 j_row, const T* j, const T* a,         \
                                                 T* out) {                                                     \
        tanh_jac<T>(n, d, w, j_row, j, a, out);                                                                 \
    }                                                                                                           \
    extern "C" __global__ void tanh_jac_da_##SUFFIX(i64 n, i64 d, i64 w, i64 j_row, const T* j, const T* a,      \
                                                    const T* g, T* da) {                                       \
        tanh_jac_da<T>(n, d, w, j_row, j, a, g, da);                                                            \
    }

JET_KERNELS(float, f32)
JET_KERNELS(double, f64)
JET_KERNELS(tapir_f16, f16)
JET_KERNELS(tapir_bf16, bf16)
