/*
 * msmemscope MSTX API: marks and ranges that appear in msmemscope's event dump as MSTX rows
 * (Event Type Mark, Range_start, Range_end; Name = the message).
 *
 * The functions live in libmsmemscope_runtime.so, which msmemscope preloads into the program
 * it launches (`msmemscope ./prog`). Two ways to build a program that uses them:
 *
 *   1. Link against the runtime library:
 *        gcc prog.c -I<msmemscope>/crates/runtime/include -L<dir of the .so> -lmsmemscope_runtime
 *      The program then needs the library to start (LD_LIBRARY_PATH or an rpath).
 *
 *   2. Weak symbols, so the same binary runs with or without msmemscope:
 *        gcc prog.c -DMSMEMSCOPE_MSTX_WEAK -I<msmemscope>/crates/runtime/include
 *      The declarations below become weak, and the three names become macros that call the
 *      function only when it is present (the library was preloaded) and otherwise do nothing
 *      (mstxRangeStartA then gives 0). Their arguments are evaluated only when the function
 *      is present. Build the program as PIE (the default of current gcc/clang on Linux) or
 *      as a shared library: a non-PIE executable may resolve an undefined weak function to
 *      NULL at link time, and then never sees the preloaded one.
 *
 * Semantics:
 *   - message: a NUL-terminated string (UTF-8 expected; other bytes are replaced). NULL is
 *     ignored: no row, and mstxRangeStartA returns 0.
 *   - stream: any pointer identifying the stream the mark belongs to (a cudaStream_t, say), or
 *     NULL. It is recorded in the row's Attr as "stream": "0x...".
 *   - mstxRangeStartA returns the range's id: unique in the process, never 0. Pass it to
 *     mstxRangeEnd, from any thread. Ending an id that is 0, unknown or already ended does
 *     nothing. A range whose message is "step start" also starts a new step (--steps).
 *   - All three are thread-safe and never fail loudly.
 */
#ifndef MSMEMSCOPE_MSTX_H
#define MSMEMSCOPE_MSTX_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef uint64_t mstxRangeId;

/* A point event. */
void mstxMarkA(const char *message, void *stream);

/* Starts a range; returns its id (never 0), or 0 for a NULL message. */
mstxRangeId mstxRangeStartA(const char *message, void *stream);

/* Ends the range `id`. */
void mstxRangeEnd(mstxRangeId id);

#ifdef __cplusplus
}
#endif

#ifdef MSMEMSCOPE_MSTX_WEAK
#pragma weak mstxMarkA
#pragma weak mstxRangeStartA
#pragma weak mstxRangeEnd

/* Nonzero when the functions are present (the program runs under msmemscope). */
#define MSMEMSCOPE_MSTX_PRESENT() (mstxMarkA != 0 && mstxRangeStartA != 0 && mstxRangeEnd != 0)

#define mstxMarkA(message, stream) \
    (mstxMarkA != 0 ? mstxMarkA((message), (stream)) : (void)0)
#define mstxRangeStartA(message, stream) \
    (mstxRangeStartA != 0 ? mstxRangeStartA((message), (stream)) : (mstxRangeId)0)
#define mstxRangeEnd(id) \
    (mstxRangeEnd != 0 ? mstxRangeEnd((id)) : (void)0)
#endif /* MSMEMSCOPE_MSTX_WEAK */

#endif /* MSMEMSCOPE_MSTX_H */
