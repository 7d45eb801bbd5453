// msmemscope's native PyTorch capture: allocator events and ATen ops, inside the process, with
// no Python on the path of an event. This file is the C ABI the Python side calls (ctypes) and
// the state that it configures; capture.h lists the other parts.
//
// - Allocations (allocators.cpp): PyTorch's allocators report to our PROFILER_STATE entry, and
//   the CPU allocator is wrapped; each block's MALLOC and FREE rows come from blocks.cpp.
// - Ops (ops.cpp): a global RecordFunction callback writes ATEN_START/ATEN_END and accesses.
// - Owners (owners.cpp): the Python side sets the per-thread framework scope, the optimizer
//   flag and the describer labels (one call per hook); the owner of a block is decided at
//   allocation.
//
// Every event goes to the runtime library's C ABI (msmemscope_emit; a block's MALLOC and FREE,
// numbers and interned texts, to msmemscope_emit_block; an op's ATEN_START and ATEN_END, its
// interned name, to msmemscope_emit_op), whose addresses the Python side hands
// to msmemscope_torch_init. Nothing here throws into PyTorch or the program: every
// entry point catches everything.

#include "capture.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "blocks.h"

namespace msmemscope::capture {

EmitFn g_emit = nullptr;
EmitBlockFn g_emit_block = nullptr;
EmitOpFn g_emit_op = nullptr;
TracingFn g_tracing = nullptr;
Codes g_codes{};
Config g_cfg{};
std::atomic<bool> g_enabled{false};

int emit(uint32_t event, uint32_t type, StrRef name, uint32_t dev_kind, uint32_t dev_index,
         bool has_ptr, uint64_t ptr, StrRef attrs, StrRef stack, bool c_stack) {
  // Every Attr text made here is one well-formed object with integer counts (ATTRS_CHECKED).
  uint32_t flags = (c_stack ? kWantCStack : 0u) | kAttrsChecked;
  EventRecord r{event, type, name, dev_kind, dev_index, has_ptr ? 1u : 0u, ptr, attrs, stack,
                flags};
  return g_emit ? g_emit(&r) : -1;
}

namespace {

// The non-empty lines of `joined` (null: none).
std::vector<std::string> split_lines(const char* joined) {
  std::vector<std::string> lines;
  std::string s = joined ? joined : "";
  size_t start = 0;
  while (start < s.size()) {
    size_t end = s.find('\n', start);
    if (end == std::string::npos) end = s.size();
    if (end > start) lines.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return lines;
}
}  // namespace
}  // namespace msmemscope::capture

using namespace msmemscope::capture;

// --- the C ABI the Python side calls (ctypes) -------------------------------------------------
#pragma GCC visibility push(default)
extern "C" {

// 0: ready; -1: the runtime's ABI version differs from this file's.
int msmemscope_torch_init(void* emit_fn, void* tracing_fn, void* emit_block_fn, void* emit_op_fn,
                          uint32_t abi_version, const uint32_t* codes, size_t ncodes) {
  try {
    if (abi_version != kAbiVersion || ncodes != sizeof(Codes) / sizeof(uint32_t)) return -1;
    g_emit = reinterpret_cast<EmitFn>(emit_fn);
    g_emit_block = reinterpret_cast<EmitBlockFn>(emit_block_fn);
    g_emit_op = reinterpret_cast<EmitOpFn>(emit_op_fn);
    g_tracing = reinterpret_cast<TracingFn>(tracing_fn);
    std::memcpy(&g_codes, codes, sizeof(Codes));
    return 0;
  } catch (...) {
    return -2;
  }
}

void msmemscope_torch_configure(int alloc, int free, int launch, int access, int decompose,
                                int python_depth, int c_stack, int oom) {
  g_cfg.oom = oom != 0;
  g_cfg.alloc = alloc != 0;
  g_cfg.free = free != 0;
  g_cfg.launch = launch != 0;
  g_cfg.access = access != 0;
  g_cfg.decompose = decompose != 0;
  g_cfg.python_depth = python_depth;
  g_cfg.c_stack = c_stack != 0;
  sync_callback();
}

// Frames whose file starts with one of these (newline-separated) are skipped at the top.
void msmemscope_torch_skip_prefixes(const char* joined) {
  try {
    g_skip_prefixes = split_lines(joined);
  } catch (...) {
  }
}

// Files under these (newline-separated) are not the user's own code (allocation sites).
void msmemscope_torch_library_prefixes(const char* joined) {
  try {
    g_library_prefixes = split_lines(joined);
  } catch (...) {
  }
}

// Starts capture on this thread and registers the op callback (once). 0 on success.
int msmemscope_torch_install() {
  try {
    if (!g_emit) return -1;
    if (g_activation == nullptr) {
      g_optimizer_state = intern("optimizer_state");
      g_temporary = intern("temporary");
      g_activation = intern("activation");
    }
    install_allocator_hooks();
    g_enabled.store(true);
    sync_callback();
    ensure_on_this_thread();
    return 0;
  } catch (...) {
    return -2;
  }
}

// Whether threads carry our entry (for CUDA's allocator events).
void msmemscope_torch_thread_entries(int on) {
  g_thread_entries.store(on != 0);
  sync_callback();
}

// Takes our entry off this thread (a user's profiler is about to start here; the next op after
// it stopped puts ours back). 1 when it was taken off.
int msmemscope_torch_leave_thread() {
  try {
    return leave_this_thread() ? 1 : 0;
  } catch (...) {
    return 0;  // another entry lies above ours: it stays
  }
}

// Stops capture everywhere: the op callback is removed; our thread entries stay, inert.
void msmemscope_torch_uninstall() {
  try {
    g_enabled.store(false);
    sync_callback();
  } catch (...) {
  }
}

void msmemscope_torch_scope_push(const char* category) {
  try {
    scope_push(intern(category ? category : ""));
  } catch (...) {
  }
}

void msmemscope_torch_scope_pop() { scope_pop(); }

void msmemscope_torch_optimizer(int delta) {
  int now = g_in_optimizer.fetch_add(delta) + delta;
  if (now < 0) g_in_optimizer.store(0);
}

// The path of an nn.Module (`model.layers.3.self_attn`), JSON-escaped and interned for good:
// the handle msmemscope_torch_set_module takes (null for an empty path).
const void* msmemscope_torch_module_text(const char* path) {
  try {
    std::string escaped;
    for (const char* p = path ? path : ""; *p; ++p) {
      unsigned char c = static_cast<unsigned char>(*p);
      if (c == '"' || c == '\\') {
        escaped.push_back('\\');
        escaped.push_back(char(c));
      } else {
        escaped.push_back(c < 0x20 ? ' ' : char(c));
      }
    }
    return intern(escaped);
  } catch (...) {
    return nullptr;
  }
}

// The innermost nn.Module running forward on this thread (a msmemscope_torch_module_text
// handle; null: none): blocks allocated here until the next call get its `module` member.
void msmemscope_torch_set_module(const void* text) {
  set_current_module(static_cast<Text>(text));
}

void msmemscope_torch_labels(const char* joined) {
  try {
    g_labels.store(intern(joined ? joined : ""));
  } catch (...) {
  }
}

// A new owner for the live block at `ptr`: `category` (or null: unchanged) and/or one more user
// `label` (or null). Returns 0 when an OWNER row was written, 1 when nothing changed, -1 when no
// live block starts at `ptr`, -2 when the block already has `max_labels` labels (they are copied
// to `labels_out`).
int msmemscope_torch_set_owner(uint64_t ptr, const char* category, const char* label,
                               int unless_framework, int max_labels, char* labels_out,
                               size_t cap) {
  try {
    std::lock_guard<SpinMutex> l(g_mutex);
    Block* found = g_live.find(ptr);
    if (found == nullptr) return -1;
    Block& b = *found;
    std::string cat = b.category ? *b.category : std::string();
    std::string labels = b.labels ? *b.labels : std::string();
    if (category != nullptr && !(unless_framework && cat.find('@') != std::string::npos)) {
      cat = category;
    }
    if (label != nullptr) {
      std::string wanted = label;
      bool present = false;
      int count = 0;
      size_t start = 0;
      while (start <= labels.size() && !labels.empty()) {
        size_t end = labels.find('@', start);
        if (end == std::string::npos) end = labels.size();
        if (labels.compare(start, end - start, wanted) == 0 && end - start == wanted.size()) {
          present = true;
        }
        ++count;
        start = end + 1;
      }
      if (!present) {
        if (count >= max_labels) {
          std::snprintf(labels_out, cap, "%s", labels.c_str());
          return -2;
        }
        labels = labels.empty() ? wanted : labels + "@" + wanted;
      }
    }
    Text new_cat = intern(cat), new_labels = intern(labels);
    if (new_cat == b.category && new_labels == b.labels) return 1;
    b.category = new_cat;
    b.labels = new_labels;
    return emit_owner_row(ptr, b) ? 0 : 1;
  } catch (...) {
    return 1;
  }
}

// The allocation id the next block gets: blocks made before now have smaller ones.
uint64_t msmemscope_torch_next_aid() {
  std::lock_guard<SpinMutex> l(g_mutex);
  return g_next_aid;
}

// Once, at the first step boundary, for the tensors made before training: of the live blocks
// still labelled `activation`, those whose address is one of the `n` sorted `data_ptrs` take
// category `data`, and the others whose allocation id is below `before` take `other`. One walk
// of the table under the lock; an OWNER row per change. Returns how many blocks changed owner.
int msmemscope_torch_relabel_activations(const uint64_t* data_ptrs, size_t n, uint64_t before,
                                         const char* data, const char* other) {
  try {
    if (g_activation == nullptr) return 0;
    Text data_cat = intern(data ? data : ""), other_cat = intern(other ? other : "");
    if (data_cat == nullptr || other_cat == nullptr) return 0;
    std::lock_guard<SpinMutex> l(g_mutex);
    std::vector<std::pair<uint64_t, Text>> moves;
    g_live.each([&](uint64_t ptr, const Block& b) {
      if (b.category != g_activation) return true;
      if (std::binary_search(data_ptrs, data_ptrs + n, ptr)) {
        moves.emplace_back(ptr, data_cat);
      } else if (b.aid < before) {
        moves.emplace_back(ptr, other_cat);
      }
      return true;
    });
    for (const auto& [ptr, cat] : moves) {
      Block* b = g_live.find(ptr);
      if (b == nullptr) continue;
      b->category = cat;
      emit_owner_row(ptr, *b);
    }
    return int(moves.size());
  } catch (...) {
    return 0;
  }
}

// A block made before tracking (the allocator never reported it) gets its MALLOC row now; the
// Python side reports its end with msmemscope_torch_release (a weak reference to its storage).
// Returns 0 when recorded, 1 when not (not tracing, or a live block already starts there).
int msmemscope_torch_adopt(uint64_t ptr, uint64_t size, uint32_t dev_kind, uint32_t dev_index,
                           const char* category) {
  try {
    if (!tracing() || size == 0) return 1;
    Text cat = category ? intern(category) : category_for_new();
    std::string stack = python_stack(g_cfg.python_depth);
    Site site = site_here();
    std::lock_guard<SpinMutex> l(g_mutex);
    if (g_live.find(ptr) != nullptr) return 1;
    record_malloc(ptr, size, dev_kind, dev_index, UINT64_MAX, -1, cat, true, stack, site);
    return 0;
  } catch (...) {
    return 1;
  }
}

void msmemscope_torch_release(uint64_t ptr) {
  try {
    std::lock_guard<SpinMutex> l(g_mutex);
    Block* b = g_live.find(ptr);
    if (b != nullptr && b->adopted) record_free(ptr, *b, UINT64_MAX, -1);
  } catch (...) {
  }
}

// The newest freed block holding `addr`: 1 and its start, size and device; 0 when none.
int msmemscope_torch_freed_block(uint64_t addr, uint64_t* start, uint64_t* size,
                                 uint32_t* dev_kind, uint32_t* dev_index) {
  try {
    std::lock_guard<SpinMutex> l(g_mutex);
    Freed it;
    if (find_freed(addr, &it)) {
      *start = it.addr;
      *size = it.size;
      *dev_kind = it.dev_kind;
      *dev_index = it.dev_index;
      return 1;
    }
  } catch (...) {
  }
  return 0;
}

// The live block holding `addr`: 1 and its start, size and device; 0 when none. A scan (the
// watcher asks once per registered address).
int msmemscope_torch_live_block(uint64_t addr, uint64_t* start, uint64_t* size,
                                uint32_t* dev_kind, uint32_t* dev_index) {
  try {
    std::lock_guard<SpinMutex> l(g_mutex);
    int found = 0;
    g_live.each([&](uint64_t ptr, const Block& b) {
      if (ptr <= addr && addr < ptr + b.size) {
        *start = ptr;
        *size = b.size;
        *dev_kind = b.dev_kind;
        *dev_index = b.dev_index;
        found = 1;
      }
      return found == 0;
    });
    if (found) return 1;
  } catch (...) {
  }
  return 0;
}

// Live tracked bytes and their peak on one device.
void msmemscope_torch_usage(uint32_t dev_kind, uint32_t dev_index, uint64_t* used,
                            uint64_t* peak) {
  std::lock_guard<SpinMutex> l(g_mutex);
  const DeviceUse& u = use_of(dev_kind, dev_index);
  *used = u.used;
  *peak = u.peak;
}

}  // extern "C"
#pragma GCC visibility pop
