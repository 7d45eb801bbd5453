/* A stand-in for libmsmemscope_runtime.so that implements its C ABI (crates/core/src/events/abi/)
 * by recording every call, so the tests can check what the extension passes across it.
 * Built by tests/python/conftest.py; -DFAKE_ABI=N sets the ABI version it reports, and
 * -DONLY_VERSION builds a library that exports nothing else. */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#ifndef FAKE_ABI
#define FAKE_ABI 4
#endif

uint32_t msmemscope_abi_version(void) { return FAKE_ABI; }

#ifndef ONLY_VERSION
typedef struct {
    const uint8_t *ptr;
    size_t len;
} StrRef;

typedef struct {
    uint32_t event;
    uint32_t event_type;
    StrRef name;
    uint32_t device_kind;
    uint32_t device_index;
    uint32_t has_ptr;
    uint64_t ptr;
    StrRef attrs_json;
    StrRef python_stack;
    uint32_t want_c_stack;
} EventRecord;

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

int32_t msmemscope_emit(const EventRecord *r) {
    note("emit|%u|%u|%.*s|%u|%u|%u|%llu|%.*s|%.*s|%u\n", r->event, r->event_type, (int)r->name.len,
         (const char *)r->name.ptr, r->device_kind, r->device_index, r->has_ptr,
         (unsigned long long)r->ptr, (int)r->attrs_json.len, (const char *)r->attrs_json.ptr,
         (int)r->python_stack.len, (const char *)r->python_stack.ptr, r->want_c_stack);
    return fake_emit_rc;
}

typedef struct {
    uint32_t event;
    uint32_t event_type;
    uint32_t device_kind;
    uint32_t device_index;
    uint64_t ptr;
    uint64_t allocation_id;
    uint64_t size;
    uint32_t flags;
    uint32_t reserved;
    uint64_t used;
    uint64_t total;
    StrRef category, labels, site, frame, op, module, python_stack;
} BlockRecord;

int32_t msmemscope_emit_block(const BlockRecord *r) {
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

int32_t msmemscope_configure(StrRef json) {
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
