/*
 * alloc_workload.c - malloc/free micro-workload for bench/host_leaks.py.
 *
 * Build: gcc -O2 -pthread -fomit-frame-pointer alloc_workload.c -o alloc_workload
 *
 * Modes:
 *   alloc_workload churn THREADS PAIRS_PER_THREAD [MAX_SIZE]
 *       THREADS threads each do PAIRS_PER_THREAD malloc/free pairs of sizes
 *       8..MAX_SIZE (default 512) through four distinct call stacks, 3 to 6
 *       noinline frames deep. One byte is written into every block so the
 *       compiler cannot elide the pair.
 *   alloc_workload live BLOCKS BLOCK_SIZE
 *       allocates BLOCKS blocks of BLOCK_SIZE bytes (through two call stacks),
 *       touches each, and keeps them all live until exit (never freed, so a
 *       leak tool reports them at exit).
 * Both modes print "alloc_workload: vmhwm_kb=N" (this process's peak RSS) on
 * stdout at the end of main.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NOINLINE __attribute__((noinline))
/* Keeps the frames real: an empty asm with a memory clobber after each call
 * stops the compiler from turning the calls into tail calls. */
#define KEEP() __asm__ volatile("" ::: "memory")
/* TAG(k) makes each function's body unique, so -O2's identical code folding
 * (-fipa-icf) cannot merge, say, d5 into a2 and blur the stacks. */
#define TAG(k) (g_tag += (k))

/* Per thread: a global written by every thread at every pair would be one cache
 * line bouncing between the cores, and a measure of that, not of the tools. Each
 * locked instruction in a tool's hook waits for the line, so it counted several
 * times over against the tool. */
static __thread volatile unsigned long g_sink;
static __thread volatile unsigned long g_tag;
static size_t g_max_size = 512;

static NOINLINE void *alloc_leaf(size_t n) {
    char *p = malloc(n);
    if (!p) { perror("malloc"); exit(2); }
    p[n - 1] = (char)n;
    KEEP();
    return p;
}

static NOINLINE void release_leaf(void *p) {
    g_sink += ((unsigned char *)p)[0];
    free(p);
    KEEP();
}

/* Stack A: 3 frames above malloc (alloc_leaf <- a2 <- a1). */
static NOINLINE void a2(size_t n) { void *p = alloc_leaf(n); KEEP(); release_leaf(p); TAG(1); KEEP(); }
static NOINLINE void a1(size_t n) { a2(n); TAG(2); KEEP(); }

/* Stack B: 4 frames. */
static NOINLINE void b3(size_t n) { void *p = alloc_leaf(n); KEEP(); release_leaf(p); TAG(3); KEEP(); }
static NOINLINE void b2(size_t n) { b3(n + 8); TAG(4); KEEP(); }
static NOINLINE void b1(size_t n) { b2(n); TAG(5); KEEP(); }

/* Stack C: 5 frames. */
static NOINLINE void c4(size_t n) { void *p = alloc_leaf(n); KEEP(); release_leaf(p); TAG(6); KEEP(); }
static NOINLINE void c3(size_t n) { c4(n); TAG(7); KEEP(); }
static NOINLINE void c2(size_t n) { c3(n * 2 > g_max_size ? n : n * 2); TAG(8); KEEP(); }
static NOINLINE void c1(size_t n) { c2(n); TAG(9); KEEP(); }

/* Stack D: 6 frames. */
static NOINLINE void d5(size_t n) { void *p = alloc_leaf(n); KEEP(); release_leaf(p); TAG(10); KEEP(); }
static NOINLINE void d4(size_t n) { d5(n); TAG(11); KEEP(); }
static NOINLINE void d3(size_t n) { d4(n); TAG(12); KEEP(); }
static NOINLINE void d2(size_t n) { d3(n); TAG(13); KEEP(); }
static NOINLINE void d1(size_t n) { d2(n); TAG(14); KEEP(); }

struct churn_arg { unsigned long pairs; unsigned seed; };

static void *churn_thread(void *vp) {
    struct churn_arg *a = vp;
    unsigned x = a->seed * 2654435761u + 1;
    size_t span = g_max_size > 8 ? g_max_size - 8 : 1;
    for (unsigned long i = 0; i < a->pairs; i++) {
        x ^= x << 13; x ^= x >> 17; x ^= x << 5; /* xorshift32 */
        size_t n = 8 + (x >> 8) % span;
        switch (x & 3) {
        case 0: a1(n); break;
        case 1: b1(n); break;
        case 2: c1(n); break;
        default: d1(n); break;
        }
    }
    return NULL;
}

static NOINLINE void *live_leaf(size_t n) {
    char *p = malloc(n);
    if (!p) { perror("malloc"); exit(2); }
    memset(p, 1, n);
    KEEP();
    return p;
}
static NOINLINE void *live_b2(size_t n) { void *p = live_leaf(n); TAG(21); KEEP(); return p; }
static NOINLINE void *live_b1(size_t n) { void *p = live_b2(n); TAG(22); KEEP(); return p; }
static NOINLINE void *live_a1(size_t n) { void *p = live_leaf(n); TAG(23); KEEP(); return p; }

static unsigned long parse(const char *s, const char *what) {
    char *end;
    unsigned long v = strtoul(s, &end, 10);
    if (*s == '\0' || *end != '\0') {
        fprintf(stderr, "alloc_workload: bad %s: %s\n", what, s);
        exit(64);
    }
    return v;
}

/* Peak RSS of this process so far (VmHWM), printed at the end of main so the
 * bench can separate the target's own memory from a tool's helper processes. */
static void print_vmhwm(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    if (!f) return;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "VmHWM:", 6) == 0) {
            printf("alloc_workload: vmhwm_kb=%lu\n", strtoul(line + 6, NULL, 10));
            break;
        }
    }
    fclose(f);
    fflush(stdout);
}

static int usage(void) {
    fprintf(stderr,
            "usage: alloc_workload churn THREADS PAIRS_PER_THREAD [MAX_SIZE]\n"
            "       alloc_workload live BLOCKS BLOCK_SIZE\n");
    return 64;
}

int main(int argc, char **argv) {
    if (argc < 2) return usage();
    if (strcmp(argv[1], "churn") == 0) {
        if (argc < 4 || argc > 5) return usage();
        unsigned long threads = parse(argv[2], "THREADS");
        unsigned long pairs = parse(argv[3], "PAIRS_PER_THREAD");
        if (argc == 5) g_max_size = parse(argv[4], "MAX_SIZE");
        if (threads < 1 || g_max_size < 9) return usage();
        pthread_t *tids = calloc(threads, sizeof *tids);
        struct churn_arg *args = calloc(threads, sizeof *args);
        for (unsigned long t = 0; t < threads; t++) {
            args[t].pairs = pairs;
            args[t].seed = (unsigned)t + 1;
            if (pthread_create(&tids[t], NULL, churn_thread, &args[t]) != 0) {
                perror("pthread_create");
                return 2;
            }
        }
        for (unsigned long t = 0; t < threads; t++) pthread_join(tids[t], NULL);
        free(tids);
        free(args);
        print_vmhwm();
        return 0;
    }
    if (strcmp(argv[1], "live") == 0) {
        if (argc != 4) return usage();
        unsigned long blocks = parse(argv[2], "BLOCKS");
        size_t size = parse(argv[3], "BLOCK_SIZE");
        if (size < 1) return usage();
        void **keep = malloc((blocks ? blocks : 1) * sizeof *keep);
        for (unsigned long i = 0; i < blocks; i++)
            keep[i] = (i & 1) ? live_b1(size) : live_a1(size);
        g_sink += (unsigned long)keep; /* keep[] itself stays reachable */
        print_vmhwm();
        return 0;
    }
    return usage();
}
