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

template <typename T>
__device__ void sgd(i64 n, T* p, const T* g, typename Acc<T>::type* buf, double lr_, double mu_, double wd_,
                    int nesterov, int first) {
    typedef typename Acc<T>::type A;
    A lr = (A)lr_, mu = (A)mu_, wd = (A)wd_;
    for (i64 i = global_id(); i < n; i += global_stride()) {
        A pi = to_acc(p[i]), gi = to_acc(g[i]);
        A d = r_add(gi, r_mul(wd, pi));
        if (buf != 0 && mu != A(0)) {
            A b = first ? d : r_add(r_mul(mu, buf[i]), d);
            buf[i] = b;
            d = nesterov ? r_add(d, r_mul(mu, b)) : b;
        }
        p[i] = from_acc<T>(r_sub(pi, r_mul(lr, d)));
    }
}

template <typename T>
__device__ void adam(i64 n, T* p, typename Acc<T>::type* m, typename Acc<T>::type* v, const T* g, double lr_,
                     double wd_, double b1_, double b2_, double step_, double ibc_, double eps_, int decoupled) {
    typedef typename Acc<T>::type A;
    A lr = (A)lr_, wd = (A)wd_, b1 = (A)b1_, b2 = (A)b2_, step = (A)step_, ibc = (A)ibc_, eps = (A)eps_;
    A one = A(1);
    for (i64 i = global_id(); i < n; i += global_stride()) {
        A pi = to_acc(p[i]), gi = to_acc(g[i]);
        if (decoupled) {
            pi = r_sub(pi, r_mul(r_mul(lr, wd), pi));
        } else {
            gi = r_add(gi, r_mul(wd, pi));
        }
        A mi = r_add(r_mul(b1, m[i]), r_mul(r_sub(one, b1), gi));
        A vi = r_add(r_mul(b2, v[i]), r_mul(r_mul(r_sub(one, b2), gi), gi));
        m[i] = mi;
        v[i] = vi;
        pi = r_sub(pi, r_div(r_mul(step, mi), r_add(r_mul(r_sqrt(vi), ibc), eps)));
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
