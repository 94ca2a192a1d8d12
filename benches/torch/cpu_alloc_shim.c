/* Exact live and peak bytes of PyTorch's CPU tensors, like
 * torch.cuda.memory_allocated / max_memory_allocated on a GPU.
 *
 * PyTorch allocates CPU tensor storage with posix_memalign (c10's
 * alloc_cpu) and frees it with free; CPython's own objects use malloc and
 * its arenas. Loaded with LD_PRELOAD, this shim counts the bytes requested
 * through posix_memalign and released by free of those pointers, and
 * exports tapir_shim_live / tapir_shim_peak / tapir_shim_reset_peak for
 * ctypes. Build: cc -O2 -shared -fPIC -o cpu_alloc_shim.so cpu_alloc_shim.c -ldl -lpthread
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define SLOTS (1u << 20) /* open addressing; a step holds far fewer blocks */

static int (*real_memalign)(void **, size_t, size_t);
static void (*real_free)(void *);
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static void *keys[SLOTS];
static size_t sizes[SLOTS];
static long long live_bytes, peak_bytes;

static void init(void) {
    if (!real_memalign) {
        real_memalign = (int (*)(void **, size_t, size_t))dlsym(RTLD_NEXT, "posix_memalign");
        real_free = (void (*)(void *))dlsym(RTLD_NEXT, "free");
    }
}

static size_t slot(void *p) { return (size_t)(((uintptr_t)p >> 4) * 0x9E3779B97F4A7C15ull >> 44) & (SLOTS - 1); }

int posix_memalign(void **out, size_t align, size_t n) {
    init();
    int r = real_memalign(out, align, n);
    if (r == 0 && *out) {
        pthread_mutex_lock(&lock);
        size_t i = slot(*out);
        while (keys[i] && keys[i] != (void *)1) i = (i + 1) & (SLOTS - 1);
        keys[i] = *out;
        sizes[i] = n;
        live_bytes += (long long)n;
        if (live_bytes > peak_bytes) peak_bytes = live_bytes;
        pthread_mutex_unlock(&lock);
    }
    return r;
}

void free(void *p) {
    init();
    if (p) {
        pthread_mutex_lock(&lock);
        size_t i = slot(p);
        while (keys[i]) {
            if (keys[i] == p) {
                live_bytes -= (long long)sizes[i];
                keys[i] = (void *)1; /* tombstone */
                break;
            }
            i = (i + 1) & (SLOTS - 1);
        }
        pthread_mutex_unlock(&lock);
    }
    real_free(p);
}

long long tapir_shim_live(void) { return live_bytes; }
long long tapir_shim_peak(void) { return peak_bytes; }
void tapir_shim_reset_peak(void) {
    pthread_mutex_lock(&lock);
    peak_bytes = live_bytes;
    pthread_mutex_unlock(&lock);
}
