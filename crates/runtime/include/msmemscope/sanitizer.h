/*
 * msmemscope stream-race sanitizer: custom operators report the memory they read and write
 * with one MSTX mark (msmemscope/mstx.h) on the stream they run on:
 *
 *   sanitizer-op: name=<operator>;read=<alias:addr:size>,...;write=<alias:addr:size>,...
 *
 * (addresses and sizes decimal or 0x-hexadecimal, so "%p" and "%zu" fit; aliases shorter than
 * 32 bytes; at most 1024 bytes in all; a range in both lists is read and written in place).
 * msmemscope checks every such mark against the earlier ones with vector clocks over streams
 * and reports, at exit, accesses of overlapping memory from different streams that no
 * synchronization orders.
 *
 * Under CUDA the runtime sees the stream and event calls itself. Programs that synchronize
 * through another API report the synchronization here, with the same handles they pass as
 * the marks' stream:
 *
 *   msmemscope_sanitizer_sync(MSMEMSCOPE_SYNC_EVENT_RECORD, event, stream);
 *   msmemscope_sanitizer_sync(MSMEMSCOPE_SYNC_STREAM_WAIT_EVENT, stream, event);
 *   msmemscope_sanitizer_sync(MSMEMSCOPE_SYNC_EVENT_SYNCHRONIZE, event, 0);
 *   msmemscope_sanitizer_sync(MSMEMSCOPE_SYNC_STREAM_SYNCHRONIZE, stream, 0);
 *   msmemscope_sanitizer_sync(MSMEMSCOPE_SYNC_DEVICE_SYNCHRONIZE, 0, 0);
 *
 * It returns 0, or -1 for an unknown kind. With -DMSMEMSCOPE_MSTX_WEAK the declarations are weak
 * and MSMEMSCOPE_SANITIZER_SYNC(...) calls it only when the runtime is present.
 *
 * The checker starts with the first sanitizer-op mark, or with msmemscope_sanitizer_enable
 * (which also counts the synchronizations made before the first mark). Its report is written
 * at exit to sanitizer/race_report_{timestamp}.txt in the run directory and printed;
 * msmemscope_sanitizer_report copies the report so far (without stacks) into buf and returns
 * its full length (call again with a larger buffer when that exceeds cap).
 */
#ifndef MSMEMSCOPE_SANITIZER_H
#define MSMEMSCOPE_SANITIZER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
    MSMEMSCOPE_SYNC_EVENT_RECORD = 1,
    MSMEMSCOPE_SYNC_STREAM_WAIT_EVENT = 2,
    MSMEMSCOPE_SYNC_EVENT_SYNCHRONIZE = 3,
    MSMEMSCOPE_SYNC_STREAM_SYNCHRONIZE = 4,
    MSMEMSCOPE_SYNC_DEVICE_SYNCHRONIZE = 5
};

int msmemscope_sanitizer_sync(uint32_t kind, uint64_t a, uint64_t b);

/* Turns the checker on; `forward`, when not NULL, also receives every well-formed mark (the
 * message and its stream) on the marking thread. Returns 0. */
int msmemscope_sanitizer_enable(void (*forward)(const char *message, uint64_t stream));

int64_t msmemscope_sanitizer_report(char *buf, size_t cap);

#ifdef __cplusplus
}
#endif

#ifdef MSMEMSCOPE_MSTX_WEAK
#pragma weak msmemscope_sanitizer_sync
#pragma weak msmemscope_sanitizer_enable
#pragma weak msmemscope_sanitizer_report
#define MSMEMSCOPE_SANITIZER_SYNC(kind, a, b) \
    (msmemscope_sanitizer_sync ? msmemscope_sanitizer_sync((kind), (a), (b)) : 0)
#else
#define MSMEMSCOPE_SANITIZER_SYNC(kind, a, b) msmemscope_sanitizer_sync((kind), (a), (b))
#endif

#endif
