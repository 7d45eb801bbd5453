// What the parts of the native PyTorch capture share: the runtime's C ABI, the configuration
// the Python side sets, and each part's entry points. Only this library includes it.
//
// The parts, one translation unit each:
// - capture.cpp: the C ABI the Python side calls (ctypes), and the state it configures;
// - owners.cpp: interned texts, the owner and the Python site of a new block;
// - blocks.cpp: the live blocks, the freed ones, the bytes in use, and their rows;
// - ops.cpp: op names, the op callback (RecordFunction) and the rows of ops and accesses;
// - allocators.cpp: allocator events (the PROFILER_STATE entry, the CPU allocator's wrapper);
// - pyframes.cpp: a thread's Python frames (built against the interpreter's internal headers).

#pragma once

#include <c10/core/Device.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <msmemscope/runtime.h>

// Nothing declared here leaves the library: without this, declarations of variables defined in
// another part would be reached through the GOT, as if another library could define them.
#pragma GCC visibility push(hidden)

namespace msmemscope::capture {

// --- the runtime's C ABI: msmemscope/runtime.h, generated from the Rust (crates/core/src/events/
// abi/); the k* names and aliases keep the parts' spelling of it.
constexpr uint32_t kAbiVersion = MSMEMSCOPE_ABI_VERSION;
constexpr uint32_t kDeviceNone = MSMEMSCOPE_DEVICE_NONE;
constexpr uint32_t kDeviceCpu = MSMEMSCOPE_DEVICE_CPU;
constexpr uint32_t kDeviceCuda = MSMEMSCOPE_DEVICE_CUDA;
constexpr uint32_t kWantCStack = MSMEMSCOPE_WANT_C_STACK;
constexpr uint32_t kAttrsChecked = MSMEMSCOPE_ATTRS_CHECKED;
constexpr uint32_t kBlockUsed = MSMEMSCOPE_BLOCK_USED;
constexpr uint32_t kBlockTotal = MSMEMSCOPE_BLOCK_TOTAL;
constexpr uint32_t kBlockOwner = MSMEMSCOPE_BLOCK_OWNER;

using StrRef = msmemscope_str;
using EventRecord = msmemscope_event_record;
// A block row: numbers and interned texts (they live until the process exits); the runtime's
// writer renders its Attr column, off the program's thread.
using BlockRecord = msmemscope_block_record;

// The runtime's functions, reached through the addresses the Python side hands over.
using EmitFn = decltype(&msmemscope_emit);
using EmitBlockFn = decltype(&msmemscope_emit_block);
// An op row: its event type and its interned name (kept by address).
using EmitOpFn = decltype(&msmemscope_emit_op);
using TracingFn = decltype(&msmemscope_tracing);

// --- what the Python side sets (capture.cpp) ---------------------------------------------------
// Event and type codes, handed in by the Python side (the runtime's numbering).
struct Codes {
  uint32_t ev_malloc, ev_free, ev_access, ev_op_launch, ev_system, ev_oom;
  uint32_t ty_pta, ty_read, ty_write, ty_aten_start, ty_aten_end, ty_owner, ty_oom_trigger;
};

struct Config {
  bool alloc = true, free = true, launch = true, access = false, decompose = false;
  bool oom = false;  // the OOM analysis: its rows name the op that failed
  bool c_stack = false;
  int python_depth = 0;
};

extern EmitFn g_emit;
extern EmitBlockFn g_emit_block;
extern EmitOpFn g_emit_op;
extern TracingFn g_tracing;
extern Codes g_codes;
extern Config g_cfg;
extern std::atomic<bool> g_enabled;

inline StrRef str(const std::string& s) { return StrRef{s.data(), s.size()}; }
inline StrRef str(const char* s) { return StrRef{s, s ? std::strlen(s) : 0}; }

inline bool tracing() {
  return g_enabled.load(std::memory_order_relaxed) && g_tracing && g_tracing();
}

inline void device_of(c10::Device d, uint32_t* kind, uint32_t* index) {
  if (d.is_cpu()) {
    *kind = kDeviceCpu;
    *index = 0;
  } else if (d.is_cuda()) {
    *kind = kDeviceCuda;
    *index = d.has_index() ? static_cast<uint32_t>(d.index()) : 0;
  } else {
    *kind = kDeviceNone;
    *index = 0;
  }
}

// One row through msmemscope_emit (capture.cpp).
int emit(uint32_t event, uint32_t type, StrRef name, uint32_t dev_kind, uint32_t dev_index,
         bool has_ptr, uint64_t ptr, StrRef attrs, StrRef stack, bool c_stack);

// --- texts (owners.cpp) -------------------------------------------------------------------------
// Categories and label sets are few and long-lived: each distinct one is kept once, forever,
// and blocks point at it (no string is built or copied per allocation).
using Text = const std::string*;  // nullptr: none

Text intern(const std::string& s);

// Appends to a fixed buffer, cutting at its end (the rows' attributes are short).
struct Out {
  char* p;
  char* end;
  // A literal: its length is known when compiled.
  template <size_t N>
  void lit(const char (&s)[N]) {
    size_t n = N - 1;
    if (size_t(end - p) < n) n = size_t(end - p);
    std::memcpy(p, s, n);
    p += n;
  }
  void str(const char* s) {
    while (*s && p < end) *p++ = *s++;
  }
  void text(Text t) {
    if (t != nullptr) {
      size_t n = t->size();
      if (size_t(end - p) < n) n = size_t(end - p);
      std::memcpy(p, t->data(), n);
      p += n;
    }
  }
  void u64(uint64_t v) {
    char digits[20];
    int n = 0;
    do {
      digits[n++] = char('0' + v % 10);
      v /= 10;
    } while (v != 0);
    while (n > 0 && p < end) *p++ = digits[--n];
  }
  // A JSON string member `,"key":"text"` (text already escaped), whole or not at all.
  void member(const char* key, const char* text, size_t len) {
    size_t need = std::strlen(key) + len + 6;
    if (size_t(end - p) < need + 2) return;  // room kept for the closing brace
    lit(",\"");
    str(key);
    lit("\":\"");
    std::memcpy(p, text, len);
    p += len;
    lit("\"");
  }
  void hex16(uint64_t v) {
    static const char kHex[] = "0123456789abcdef";
    for (int shift = 60; shift >= 0 && p < end; shift -= 4) *p++ = kHex[(v >> shift) & 0xf];
  }
};

// --- owners and sites of new blocks (owners.cpp) ------------------------------------------------
// Frames of these files are skipped at the top of a Python stack (--call-stack python:N).
extern std::vector<std::string> g_skip_prefixes;
// Files of the standard library, site-packages and the like: not the user's own code.
extern std::vector<std::string> g_library_prefixes;

extern std::atomic<int> g_in_optimizer;
extern std::atomic<Text> g_labels;  // the describer's active labels, "a@b", outermost first
extern Text g_optimizer_state, g_temporary, g_activation;

struct Site {
  const std::string* inner = nullptr;  // innermost frame outside torch/msmemscope
  const std::string* user = nullptr;   // innermost frame of the user's own code
  StrRef op{nullptr, 0};               // the innermost op running on this thread (interned)
  // The innermost nn.Module whose forward runs on this thread: its path, JSON-escaped,
  // interned (msmemscope_torch_set_module); null outside any forward.
  const std::string* module = nullptr;
};

std::string python_stack(int depth);
// `,"site":"…"` for an OOM trigger row: the user's line of the failed allocation ("" if none).
std::string site_member();
Site site_here();
// The category of a block allocated now on this thread (null: none).
Text category_for_new();
// This thread's framework scopes (msmemscope_torch_scope_push/pop).
void scope_push(Text category);
void scope_pop();

// --- ops (ops.cpp) ------------------------------------------------------------------------------
StrRef current_op();
// The innermost op's written name, into `buf` ("" when none).
void current_op_text(char* buf, size_t cap);
const std::string* current_module();
void set_current_module(Text module);
// Registers or removes the op callback after what it must do changed.
void sync_callback();

// --- allocator events (allocators.cpp) ----------------------------------------------------------
// Whether threads get our PROFILER_STATE entry (for allocators other than the CPU one).
extern std::atomic<bool> g_thread_entries;
// Puts our entry on this thread when no PROFILER_STATE entry is there (a user's profiler has
// its own: its session sees this thread's allocations until it ends).
void ensure_on_this_thread();
// Makes the entry and wraps the CPU allocator (once each).
void install_allocator_hooks();
// Takes our entry off this thread; true when it was there, on top.
bool leave_this_thread();

}  // namespace msmemscope::capture

#pragma GCC visibility pop
