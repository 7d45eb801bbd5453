/* msmemscope runtime C ABI: what a producer (the Python extension, a framework plugin, a test)
 * calls in libmsmemscope_runtime.so, which msmemscope preloads into the program. The layouts
 * mirror crates/core/src/events/abi/; check msmemscope_abi_version() == MSMEMSCOPE_ABI_VERSION
 * before emitting. */
#ifndef MSMEMSCOPE_RUNTIME_H
#define MSMEMSCOPE_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MSMEMSCOPE_ABI_VERSION 4u

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

/* msmemscope_block_record.flags: want_c_stack's bit, and which Attr members the row has. */
#define MSMEMSCOPE_WANT_C_STACK 1u
#define MSMEMSCOPE_BLOCK_USED 4u
#define MSMEMSCOPE_BLOCK_TOTAL 8u
#define MSMEMSCOPE_BLOCK_OWNER 16u /* owner "PTA[@category][@labels]" and the site members */

/* A MALLOC or FREE row as numbers and texts: the runtime renders its Attr column,
 * {"allocation_id":..,"addr":"0x..","size":..[,"used":..][,"total":..][,"owner":..][,"site":..]
 * [,"frame":..][,"op":..][,"module":..]}, off the calling thread. category, labels, site, frame, op and module must
 * stay valid and unchanged until the process exits (interned), JSON-escaped already; empty
 * ones are left out. python_stack lives for the call. */
typedef struct {
    uint32_t event;          /* MSMEMSCOPE_MALLOC or MSMEMSCOPE_FREE */
    uint32_t event_type;
    uint32_t device_kind;
    uint32_t device_index;
    uint64_t ptr;
    uint64_t allocation_id;
    uint64_t size;
    uint32_t flags;
    uint32_t reserved;
    uint64_t used;           /* with MSMEMSCOPE_BLOCK_USED */
    uint64_t total;          /* with MSMEMSCOPE_BLOCK_TOTAL */
    msmemscope_str category;
    msmemscope_str labels;
    msmemscope_str site;     /* the user's line that allocated */
    msmemscope_str frame;    /* the innermost frame, when it is another */
    msmemscope_str op;
    msmemscope_str module;   /* the module whose forward was running */
    msmemscope_str python_stack;
} msmemscope_block_record;

uint32_t msmemscope_abi_version(void);
/* 0 recorded, 1 filtered out or not tracing, <0 error. */
int32_t msmemscope_emit(const msmemscope_event_record *record);
int32_t msmemscope_emit_block(const msmemscope_block_record *record);
/* An OP_LAUNCH row of event_type MSMEMSCOPE_ATEN_START or MSMEMSCOPE_ATEN_END for the operator
 * `name` (len bytes, under 64 KiB), which must stay valid and unchanged until the process exits
 * (interned): the row keeps its address, not a copy. */
int32_t msmemscope_emit_op(uint32_t event_type, const char *name, size_t len);
int32_t msmemscope_tracing(void);
int32_t msmemscope_start(void);  /* Python's msmemscope.start() */
int32_t msmemscope_stop(void);
int32_t msmemscope_step(void);

#ifdef __cplusplus
}
#endif
#endif
