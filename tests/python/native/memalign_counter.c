/* An LD_PRELOAD counter of c10's CPU allocations, independent of msmemscope: every
 * posix_memalign(p, 64, n) whose caller lies in libc10.so is counted (c10's alloc_cpu asks for
 * 64-byte alignment). The program reads and resets the counts through ctypes. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

static int (*real_posix_memalign)(void **, size_t, size_t);
static volatile long counted_calls;
static volatile long long counted_bytes;
static volatile int counting;

static int from_c10(void *caller) {
    Dl_info info;
    if (!dladdr(caller, &info) || info.dli_fname == NULL) return 0;
    return strstr(info.dli_fname, "libc10.so") != NULL;
}

int posix_memalign(void **out, size_t alignment, size_t size) {
    if (real_posix_memalign == NULL)
        real_posix_memalign = (int (*)(void **, size_t, size_t))dlsym(RTLD_NEXT, "posix_memalign");
    int rc = real_posix_memalign(out, alignment, size);
    if (counting && rc == 0 && alignment == 64 && from_c10(__builtin_return_address(0))) {
        __atomic_add_fetch(&counted_calls, 1, __ATOMIC_RELAXED);
        __atomic_add_fetch(&counted_bytes, (long long)size, __ATOMIC_RELAXED);
    }
    return rc;
}

void counter_start(void) {
    counted_calls = 0;
    counted_bytes = 0;
    counting = 1;
}

long counter_stop(void) {
    counting = 0;
    return counted_calls;
}

long long counter_bytes(void) { return counted_bytes; }
