/* N malloc(64)/free pairs from one stack: the per-allocation cost of the hooks, for
 * bench/host_leak_sampling.py. `alloc_loop N`. One byte is written into every block so the
 * compiler cannot elide the pair. */
#include <stdio.h>
#include <stdlib.h>

void *volatile g_sink;

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 0;
    for (long i = 0; i < n; i++) {
        char *p = malloc(64);
        p[0] = (char)i;
        g_sink = p;
        free(p);
    }
    printf("alloc_loop %ld\n", n);
    return 0;
}
