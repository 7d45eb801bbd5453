/* A stand-in for libmsmemscope_runtime.so that implements its C ABI (msmemscope/runtime.h,
 * generated from the Rust) by recording every call, so the tests can check what the extension
 * passes across it. Its definitions are checked against the header's declarations, so it cannot
 * drift from the real one. Built by tests/python/conftest.py; -DFAKE_ABI=N sets the ABI version
 * it reports, and -DONLY_VERSION builds a library that exports nothing else. */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <msmemscope/runtime.h>

#ifndef FAKE_ABI
#define FAKE_ABI MSMEMSCOPE_ABI_VERSION
#endif

uint32_t msmemscope_abi_version(void) { return FAKE_ABI; }

#ifndef ONLY_VERSION

/* Settable from Python with ctypes (c_int.in_dll). */
int fake_emit_rc = 0;
int fake_configure_rc = 0;
int fake_start_rc = 0;
int fake_hooks_active = 0;
int fake_tracing = 0;

/* Every call, one line each, appended. */
static char journal[1 << 16];
static size_t journal_len;
static char config[1 << 16];
static size_t config_len;
static uint64_t next_range = 1;

static void note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void note(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(journal + journal_len, sizeof journal - journal_len, fmt, ap);
    va_end(ap);
    if (n > 0 && (size_t)n < sizeof journal - journal_len) journal_len += (size_t)n;
}

const char *fake_journal(void) {
    journal[journal_len] = 0;
    return journal;
}

int32_t msmemscope_emit(const msmemscope_event_record *r) {
    note("emit|%u|%u|%.*s|%u|%u|%u|%llu|%.*s|%.*s|%u\n", r->event, r->event_type, (int)r->name.len,
         (const char *)r->name.ptr, r->device_kind, r->device_index, r->has_ptr,
         (unsigned long long)r->ptr, (int)r->attrs_json.len, (const char *)r->attrs_json.ptr,
         (int)r->python_stack.len, (const char *)r->python_stack.ptr, r->want_c_stack);
    return fake_emit_rc;
}

int32_t msmemscope_emit_block(const msmemscope_block_record *r) {
    note("emit_block|%u|%u|%llu|%llu|%llu|%u\n", r->event, r->device_kind,
         (unsigned long long)r->ptr, (unsigned long long)r->allocation_id,
         (unsigned long long)r->size, r->flags);
    return fake_emit_rc;
}

int32_t msmemscope_emit_op(uint32_t event_type, const char *name, size_t len) {
    note("emit_op|%u|%.*s\n", event_type, (int)len, name);
    return fake_emit_rc;
}

int32_t msmemscope_tracing(void) { return fake_tracing; }

int32_t msmemscope_configure(msmemscope_str json) {
    note("configure\n");
    if (fake_configure_rc != 0) return fake_configure_rc;
    if (json.len >= sizeof config) return -1;
    memcpy(config, json.ptr, json.len);
    config_len = json.len;
    return 0;
}

int64_t msmemscope_current_config(uint8_t *buf, size_t cap) {
    /* Answers in two calls when the buffer is small, as the real one may. */
    if (config_len <= cap) memcpy(buf, config, config_len);
    return (int64_t)config_len;
}

int32_t msmemscope_start(void) {
    note("start\n");
    return fake_start_rc;
}
int32_t msmemscope_stop(void) {
    note("stop\n");
    return 0;
}
int32_t msmemscope_step(void) {
    note("step\n");
    return 0;
}
int32_t msmemscope_host_hooks_active(void) { return fake_hooks_active; }

void mstxMarkA(const char *message, void *stream) { note("mark|%s|%p\n", message, stream); }
uint64_t mstxRangeStartA(const char *message, void *stream) {
    note("range_start|%s|%p\n", message, stream);
    return next_range++;
}
void mstxRangeEnd(uint64_t id) { note("range_end|%llu\n", (unsigned long long)id); }
#endif
