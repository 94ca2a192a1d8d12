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

// Each kernel runs 16 bytes a thread (Pack16: 4 f32, 2 f64, 8 f16/bf16)
// when every operand is 16-byte aligned and a row of `w` is whole packs (so
// a pack never straddles a row of the broadcast operand), else element by
// element; the last n % N elements go element by element. The arithmetic
// is the element loop's, in the same order, so both paths give the same
// bits.

template <typename T>
__device__ __forceinline__ typename Acc<T>::type jet_at(typename Acc<T>::type av, typename Acc<T>::type sv,
                                                        const T* l, i64 i) {
    typedef typename Acc<T>::type A;
    A inner = av * sv * A(-2);
    if (l) inner = to_acc(l[i]) + inner;
    return inner * (A(1) - av * av);
}

template <typename T>
__device__ __forceinline__ void tanh_jet(i64 n, i64 w, i64 s_row, const T* a, const T* s, const T* l, T* out) {
    typedef typename Acc<T>::type A;
    const int N = Pack16<T>::N;
    i64 from = 0;
    if (aligned16(a) && aligned16(s) && aligned16(out) && (!l || aligned16(l)) && (!s_row || w % N == 0)) {
        const i64 packs = n / N, row_packs = w / N;
        for (i64 k = global_id(); k < packs; k += global_stride()) {
            A av[N], sv[N], lv[N];
            Pack16<T>::unpack(((const uint4*)a)[k], av);
            Pack16<T>::unpack(((const uint4*)s)[s_row ? k % row_packs : k], sv);
            if (l) Pack16<T>::unpack(((const uint4*)l)[k], lv);
#pragma unroll
            for (int e = 0; e < N; ++e) {
                A inner = av[e] * sv[e] * A(-2);
                if (l) inner = lv[e] + inner;
                av[e] = inner * (A(1) - av[e] * av[e]);
            }
            ((uint4*)out)[k] = Pack16<T>::pack(av);
        }
        from = packs * N;
    }
    for (i64 i = from + global_id(); i < n; i += global_stride()) {
        out[i] = from_acc<T>(jet_at<T>(to_acc(a[i]), to_acc(s[s_row ? i % w : i]), l, i));
    }
}

// One element of tanh_jet's gradients: dl = g d, ds = -2 a dl,
// da = -2 g (a u + s d), with d = 1 - a^2 and u = l - 2 a s.
template <typename A>
__device__ __forceinline__ void jet_grad_at(A av, A sv, A lv, bool has_l, A gv, A& da, A& ds, A& dl) {
    A d = A(1) - av * av;
    A u = av * sv * A(-2);
    if (has_l) u = lv + u;
    A gl = gv * d;
    dl = gl;
    ds = av * gl * A(-2);
    da = (av * u + sv * d) * gv * A(-2);
}

template <typename T>
__device__ __forceinline__ void tanh_jet_grad(i64 n, i64 w, i64 s_row, const T* a, const T* s, const T* l,
                                              const T* g, T* da, T* ds, T* dl) {
    typedef typename Acc<T>::type A;
    const int N = Pack16<T>::N;
    i64 from = 0;
    if (aligned16(a) && aligned16(s) && aligned16(g) && aligned16(da) && aligned16(ds) && aligned16(dl) &&
        (!l || aligned16(l)) && (!s_row || w % N == 0)) {
        const i64 packs = n / N, row_packs = w / N;
        for (i64 k = global_id(); k < packs; k += global_stride()) {
            A av[N], sv[N], lv[N], gv[N], oa[N], os[N], ol[N];
            Pack16<T>::unpack(((const uint4*)a)[k], av);
            Pack16<T>::unpack(((const uint4*)s)[s_row ? k % row_packs : k], sv);
            Pack16<T>::unpack(((const uint4*)g)[k], gv);
            if (l) Pack16<T>::unpack(((const uint4*)l)[k], lv);
#pragma unroll
            for (int e = 0; e < N; ++e) jet_grad_at<A>(av[e], sv[e], l ? lv[e] : A(0), l, gv[e], oa[e], os[e], ol[e]);
            ((uint4*)da)[k] = Pack16<T>::pack(oa);
            ((uint4*)ds)[k] = Pack16<T>::pack(os);
            ((uint4*)dl)[k] = Pack16<T>::pack(ol);
        }
        from = packs * N;
    }
    for (i64 i = from + global_id(); i < n; i += global_stride()) {
        A oa, os, ol;
        jet_grad_at<A>(to_acc(a[i]), to_acc(s[s_row ? i % w : i]), l ? to_acc(l[i]) : A(0), l, to_acc(g[i]), oa, os,
                       ol);
        dl[i] = from_acc<T>(ol);
        ds[i] = from_acc<T>(os);
        da[i] = from_acc<T>(oa);
    }
}

template <typename T>
__device__ __forceinline__ void tanh_jac(i64 n, i64 d, i64 w, i64 j_row, const T* j, const T* a, T* out) {
    typedef typename Acc<T>::type A;
    const int N = Pack16<T>::N;
    const i64 per_point = d * w;
    i64 from = 0;
    if (aligned16(j) && aligned16(a) && aligned16(out) && w % N == 0) {
        // A pack lies inside one row of w: one point, consecutive columns.
        const i64 packs = n / N, point_packs = per_point / N, row_packs = w / N;
        for (i64 k = global_id(); k < packs; k += global_stride()) {
            const i64 p = k / point_packs, r = k - p * point_packs;
            A jv[N], av[N];
            Pack16<T>::unpack(((const uint4*)j)[j_row ? r : k], jv);
            Pack16<T>::unpack(((const uint4*)a)[p * row_packs + r % row_packs], av);
#pragma unroll
            for (int e = 0; e < N; ++e) jv[e] = jv[e] * (A(1) - av[e] * av[e]);
            ((uint4*)out)[k] = Pack16<T>::pack(jv);
        }
        from = packs * N;
    }
    for (i64 i = from + global_id(); i < n; i += global_stride()) {
        A av = to_acc(a[(i / per_point) * w + i % w]);
        out[i] = from_acc<T>(to_acc(j[j_row ? i % per_point : i]) * (A(1) - av * av));
    }
}

template <typename T>
__device__ __forceinline__ void tanh_jac_da(i64 n, i64 d, i64 w, i64 j_row, const T* j, const T* a, const T* g,
                                            T* da) {
    typedef typename Acc<T>::type A;
    const int N = Pack16<T>::N;
    i64 from = 0;
    if (aligned16(j) && aligned16(a) && aligned16(g) && aligned16(da) && w % N == 0) {
        // N consecutive columns of one point, each summed over the d rows
        // in order, as the element loop sums one.
        const i64 packs = n / N, row_packs = w / N;
        for (i64 k = global_id(); k < packs; k += global_stride()) {
            const i64 p = k / row_packs, c = k - p * row_packs;
            const uint4* gp = (const uint4*)g + p * d * row_packs + c;
            const uint4* jp = (const uint4*)j + (j_row ? 0 : p * d * row_packs) + c;
            A acc[N], gv[N], jv[N], av[N];
#pragma unroll
            for (int e = 0; e < N; ++e) acc[e] = A(0);
            for (i64 i = 0; i < d; i++) {
                Pack16<T>::unpack(gp[i * row_packs], gv);
                Pack16<T>::unpack(jp[i * row_packs], jv);
#pragma unroll
                for (int e = 0; e < N; ++e) acc[e] += gv[e] * jv[e];
            }
            Pack16<T>::unpack(((const uint4*)a)[k], av);
#pragma unroll
            for (int e = 0; e < N; ++e) acc[e] = av[e] * acc[e] * A(-2);
            ((uint4*)da)[k] = Pack16<T>::pack(acc);
        }
        from = packs * N;
    }
    for (i64 k = from + global_id(); k < n; k += global_stride()) {
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
