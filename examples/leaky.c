/* The quick-start demo: about 3 seconds of a program with two real leaks, a lookup table built
 * once, a bounded ring of recent requests, and many short-lived temporaries. Run it under
 * `msmemscope --analysis=host-leaks`: the leaks lead the TOP N, the table and the ring are listed
 * as resident baselines. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct request { char *payload; size_t len; };

/* Leak 1: every request's payload copy is kept by mistake. */
__attribute__((noinline)) static char *copy_payload(const char *text) {
    size_t n = strlen(text) + 1;
    char *copy = malloc(256);
    memcpy(copy, text, n < 256 ? n : 256);
    return copy;
}

/* Leak 2: a worker thread allocates a scratch buffer per batch and never frees it. */
__attribute__((noinline)) static void *worker(void *arg) {
    (void)arg;
    for (int batch = 0; batch < 60; batch++) {
        double *scratch = calloc(512, sizeof(double));
        scratch[batch] = batch;
        usleep(50 * 1000);
    }
    return NULL;
}

/* Not a leak: the last 64 requests are kept for diagnostics; older ones are dropped. */
static char *recent[64];
__attribute__((noinline)) static void remember(const char *text, int i) {
    free(recent[i % 64]);
    recent[i % 64] = strdup(text);
}

/* Not a leak: a lookup table built once at start and kept for the whole run. */
static int *lookup_table;
__attribute__((noinline)) static void build_table(void) {
    lookup_table = malloc(64 * 1024 * sizeof(int));
    for (int i = 0; i < 64 * 1024; i++) lookup_table[i] = i * i;
}

/* Not a leak: temporaries freed right away. */
__attribute__((noinline)) static size_t handle(struct request *r) {
    char *tmp = malloc(r->len + 1);
    memcpy(tmp, r->payload, r->len);
    tmp[r->len] = 0;
    size_t n = strlen(tmp);
    free(tmp);
    return n;
}

int main(void) {
    setvbuf(stdout, NULL, _IONBF, 0);
    build_table();
    pthread_t thread;
    pthread_create(&thread, NULL, worker, NULL);
    size_t total = 0;
    for (int i = 0; i < 3000; i++) {
        char text[64];
        snprintf(text, sizeof text, "request %d", i);
        struct request r = { copy_payload(text), strlen(text) };
        total += handle(&r);
        remember(text, i);
        if (i % 20 != 0) free(r.payload); /* every 20th request leaks its payload */
        usleep(1000);
    }
    pthread_join(thread, NULL);
    printf("handled 3000 requests, %zu bytes, table[7]=%d\n", total, lookup_table[7]);
    return 0;
}
