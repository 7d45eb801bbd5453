/* msmemscope runtime C ABI: what a producer (the Python extension, a framework plugin, a test)
 * calls in libmsmemscope_runtime.so, which msmemscope preloads into the program. The layouts
 * mirror crates/core/src/events/abi.rs; check msmemscope_abi_version() == MSMEMSCOPE_ABI_VERSION
 * before emitting. */
#ifndef MSMEMSCOPE_RUNTIME_H
#define MSMEMSCOPE_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MSMEMSCOPE_ABI_VERSION 1u

/* The Event column. */
enum msmemscope_event {
    MSMEMSCOPE_MALLOC = 1, MSMEMSCOPE_FREE = 2, MSMEMSCOPE_ACCESS = 3, MSMEMSCOPE_OP_LAUNCH = 4,
    MSMEMSCOPE_KERNEL_LAUNCH = 5, MSMEMSCOPE_MSTX = 6, MSMEMSCOPE_SYSTEM = 7,
    MSMEMSCOPE_SNAPSHOT = 8, MSMEMSCOPE_OOM_DETAIL = 9
};

/* The Event Type column. */
enum msmemscope_event_type {
    MSMEMSCOPE_HAL = 1, MSMEMSCOPE_PTA = 2, MSMEMSCOPE_HOST = 3, MSMEMSCOPE_READ = 4,
    MSMEMSCOPE_WRITE = 5, MSMEMSCOPE_UNKNOWN = 6, MSMEMSCOPE_ATEN_START = 7,
    MSMEMSCOPE_ATEN_END = 8, MSMEMSCOPE_TYPE_KERNEL_LAUNCH = 9, MSMEMSCOPE_MARK = 10,
    MSMEMSCOPE_RANGE_START = 11, MSMEMSCOPE_RANGE_END = 12, MSMEMSCOPE_START_TRACE = 13,
    MSMEMSCOPE_STOP_TRACE = 14, MSMEMSCOPE_STEP = 15, MSMEMSCOPE_TYPE_SNAPSHOT = 16,
    MSMEMSCOPE_OOM_TRIGGER = 17, MSMEMSCOPE_OOM_RECENT_ALLOC = 18, MSMEMSCOPE_OOM_TOP_ALLOC = 19
};

enum msmemscope_device_kind { MSMEMSCOPE_DEVICE_NONE = 0, MSMEMSCOPE_DEVICE_CPU = 1, MSMEMSCOPE_DEVICE_CUDA = 2 };

/* A UTF-8 string that lives for the duration of the call (ptr may be NULL when len is 0). */
typedef struct { const char *ptr; size_t len; } msmemscope_str;

typedef struct {
    uint32_t event;          /* enum msmemscope_event */
    uint32_t event_type;     /* enum msmemscope_event_type */
    msmemscope_str name;
    uint32_t device_kind;    /* enum msmemscope_device_kind */
    uint32_t device_index;   /* the CUDA index for MSMEMSCOPE_DEVICE_CUDA */
    uint32_t has_ptr;
    uint64_t ptr;
    msmemscope_str attrs_json;   /* the Attr column: a JSON object, or empty */
    msmemscope_str python_stack; /* "file(line): func" lines, innermost first */
    uint32_t want_c_stack;       /* nonzero: the runtime adds the C stack (with --call-stack c) */
} msmemscope_event_record;

uint32_t msmemscope_abi_version(void);
/* 0 recorded, 1 filtered out or not tracing, <0 error. */
int32_t msmemscope_emit(const msmemscope_event_record *record);
int32_t msmemscope_tracing(void);
int32_t msmemscope_start(void);  /* Python's msmemscope.start() */
int32_t msmemscope_stop(void);
int32_t msmemscope_step(void);

#ifdef __cplusplus
}
#endif
#endif
