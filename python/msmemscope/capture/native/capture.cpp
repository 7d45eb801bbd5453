// msmemscope's native PyTorch capture: allocator events and ATen ops, inside the process, with
// no Python on the path of an event.
//
// - Allocations: PyTorch hands every allocator event of a thread to the PROFILER_STATE entry of
//   that thread's c10::ThreadLocalDebugInfo when its memoryProfilingEnabled() is true (the CPU
//   allocator's profiled reporter, the CUDA caching allocator). Our entry derives from
//   ProfilerStateBase with a disabled config, because PyTorch reads any PROFILER_STATE entry as
//   one (profilerEnabled(), profilerType()): to PyTorch it is "no profiler running", and a user's
//   own torch.profiler still starts on top of it.
// - Ops: a global RecordFunction callback (scope FUNCTION) writes ATEN_START/ATEN_END; with
//   access events it reads the inputs and outputs and the op's schema (alias annotations).
//   The same callback puts our entry on threads that do not have it yet (threads that existed
//   before tracking, threads PyTorch or the program starts later).
// - Owners: the Python side sets the per-thread framework scope, the optimizer flag and the
//   describer labels (one call per hook); the owner of a block is decided here at allocation.
//
// Every event goes to the runtime library's C ABI (msmemscope_emit; a block's MALLOC and FREE,
// numbers and interned texts, to msmemscope_emit_block; an op's ATEN_START and ATEN_END, its
// interned name, to msmemscope_emit_op), whose addresses the Python side hands
// to msmemscope_torch_init. Nothing here throws into PyTorch or the program: every
// entry point catches everything.

#include <ATen/record_function.h>
#include <ATen/core/function_schema.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/List.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/ThreadLocalDebugInfo.h>
#include <torch/csrc/profiler/orchestration/observer.h>

#include <sched.h>
#include <sys/mman.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

// pyframes.cpp: this thread's Python frames, innermost first.
std::string msmemscope_python_stack(int depth, const std::vector<std::string>& skip);
// pyframes.cpp: this thread's allocation site (innermost frame, innermost frame of user code).
void msmemscope_python_site(const std::vector<std::string>& own,
                            const std::vector<std::string>& library, const std::string** inner,
                            const std::string** user);

namespace torch::autograd {
// Declared here rather than through graph_task.h (which pulls in the whole autograd engine).
TORCH_API int get_current_graph_task_id();
}  // namespace torch::autograd

namespace {

// --- the runtime's C ABI (crates/core/src/events/abi/, ABI_VERSION 3) ------------------------
constexpr uint32_t kAbiVersion = 4;
constexpr uint32_t kDeviceNone = 0;
constexpr uint32_t kDeviceCpu = 1;
constexpr uint32_t kDeviceCuda = 2;
constexpr uint32_t kWantCStack = 1;
constexpr uint32_t kAttrsChecked = 2;
constexpr uint32_t kBlockUsed = 4;
constexpr uint32_t kBlockTotal = 8;
constexpr uint32_t kBlockOwner = 16;

struct StrRef {
  const char* ptr;
  size_t len;
};

struct EventRecord {
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
};

// A block row: numbers and interned texts (they live until the process exits); the runtime's
// writer renders its Attr column, off the program's thread.
struct BlockRecord {
  uint32_t event;
  uint32_t event_type;
  uint32_t device_kind;
  uint32_t device_index;
  uint64_t ptr;
  uint64_t allocation_id;
  uint64_t size;
  uint32_t flags;  // kWantCStack, kBlock*
  uint32_t reserved;
  uint64_t used;
  uint64_t total;
  StrRef category;
  StrRef labels;
  StrRef site;
  StrRef frame;
  StrRef op;
  StrRef module;        // the nn.Module whose forward runs
  StrRef python_stack;  // for the call only
};

using EmitFn = int (*)(const EventRecord*);
using EmitBlockFn = int (*)(const BlockRecord*);
// An op row: its event type and its interned name (kept by address).
using EmitOpFn = int (*)(uint32_t, const char*, size_t);
using TracingFn = int (*)();

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

EmitFn g_emit = nullptr;
EmitBlockFn g_emit_block = nullptr;
EmitOpFn g_emit_op = nullptr;
TracingFn g_tracing = nullptr;
Codes g_codes{};
Config g_cfg{};
std::atomic<bool> g_enabled{false};
at::CallbackHandle g_callback = 0;

StrRef str(const std::string& s) { return StrRef{s.data(), s.size()}; }
StrRef str(const char* s) { return StrRef{s, s ? std::strlen(s) : 0}; }

void device_of(c10::Device d, uint32_t* kind, uint32_t* index) {
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

bool tracing() { return g_enabled.load(std::memory_order_relaxed) && g_tracing && g_tracing(); }

int emit(uint32_t event, uint32_t type, StrRef name, uint32_t dev_kind, uint32_t dev_index,
         bool has_ptr, uint64_t ptr, StrRef attrs, StrRef stack, bool c_stack) {
  // Every Attr text made here is one well-formed object with integer counts (ATTRS_CHECKED).
  uint32_t flags = (c_stack ? kWantCStack : 0u) | kAttrsChecked;
  EventRecord r{event, type, name, dev_kind, dev_index, has_ptr ? 1u : 0u, ptr, attrs, stack,
                flags};
  return g_emit ? g_emit(&r) : -1;
}

// --- Python frames (--call-stack python:N) ----------------------------------------------------
std::vector<std::string> g_skip_prefixes;

std::string python_stack(int depth) {
  if (depth <= 0) return std::string();
  return msmemscope_python_stack(depth, g_skip_prefixes);
}

// --- allocation sites (always, whatever --call-stack says) ------------------------------------
// Files of the standard library, site-packages and the like: not the user's own code.
std::vector<std::string> g_library_prefixes;

struct Site {
  const std::string* inner = nullptr;  // innermost frame outside torch/msmemscope
  const std::string* user = nullptr;   // innermost frame of the user's own code
  StrRef op{nullptr, 0};               // the innermost op running on this thread (interned)
  // The innermost nn.Module whose forward runs on this thread: its path, JSON-escaped,
  // interned (msmemscope_torch_set_module); null outside any forward.
  const std::string* module = nullptr;
};

StrRef current_op();
const std::string* current_module();

// `,"site":"…"` for an OOM trigger row: the user's line of the failed allocation ("" if none).
std::string site_member() {
  const std::string *inner = nullptr, *user = nullptr;
  msmemscope_python_site(g_skip_prefixes, g_library_prefixes, &inner, &user);
  return user != nullptr ? ",\"site\":\"" + *user + "\"" : std::string();
}

Site site_here() {
  Site s;
  if (!g_cfg.alloc) return s;
  msmemscope_python_site(g_skip_prefixes, g_library_prefixes, &s.inner, &s.user);
  s.op = current_op();
  s.module = current_module();
  return s;
}

// --- texts ------------------------------------------------------------------------------------
// Categories and label sets are few and long-lived: each distinct one is kept once, forever,
// and blocks point at it (no string is built or copied per allocation).
using Text = const std::string*;  // nullptr: none

std::mutex g_texts_mutex;
// Never destroyed: rows hold these texts' addresses, and the runtime's writer reads them until
// the process's last exit handler (its own, which runs after this library's static destructors).
auto& g_texts = *new std::unordered_map<std::string, std::unique_ptr<std::string>>();

Text intern(const std::string& s) {
  if (s.empty()) return nullptr;
  std::lock_guard<std::mutex> l(g_texts_mutex);
  auto& slot = g_texts[s];
  if (!slot) slot = std::make_unique<std::string>(s);
  return slot.get();
}

// The overload of the op a RecordFunction stands for ("Tensor" of aten::add.Tensor). PyTorch
// 2.7 and later keep it on the RecordFunction; older ones only hand out a copy of the
// operator's name, whose overload text is interned here so that the pointer stays valid.
template <typename Fn>
const char* overload_of(const Fn& fn) {
  if constexpr (requires { fn.overload_name(); }) {
    return fn.overload_name();
  } else {
    auto op = fn.operator_name();
    if (!op.has_value()) return "";
    Text t = intern(op->overload_name);
    return t != nullptr ? t->c_str() : "";
  }
}

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

// --- owners -----------------------------------------------------------------------------------
thread_local std::vector<Text> tl_scopes;  // framework categories entered on this thread
std::atomic<int> g_in_optimizer{0};
std::atomic<Text> g_labels{nullptr};  // the describer's active labels, "a@b", outermost first
Text g_optimizer_state, g_temporary, g_activation;

Text category_for_new() {
  if (!tl_scopes.empty()) return tl_scopes.back();
  if (!g_cfg.decompose) return nullptr;
  if (g_in_optimizer.load(std::memory_order_relaxed) > 0) return g_optimizer_state;
  if (torch::autograd::get_current_graph_task_id() != -1) return g_temporary;
  return g_activation;
}

// --- the live blocks --------------------------------------------------------------------------
struct Block {
  uint64_t aid;
  uint64_t size;
  uint32_t dev_kind, dev_index;
  bool adopted;  // made before tracking; its FREE comes from the Python side
  Text category;
  Text labels;  // this block's user labels, "a@b"
};

struct Freed {
  uint64_t addr, size;
  uint32_t dev_kind, dev_index;
};

constexpr size_t kFreedKept = 4096;

// The live blocks by address: an open-addressed table (linear probing, removal by shifting
// back, no tombstones) in memory mapped for it. Tracking a block so costs the program's thread
// no malloc and no free (std::unordered_map made a node per block), and puts nothing of ours
// in the program's heap.
class LiveTable {
 public:
  // The live block at `key`, or null.
  Block* find(uint64_t key) {
    if (slots_ == nullptr || key == 0) return nullptr;
    for (size_t i = home(key);; i = (i + 1) & mask()) {
      if (slots_[i].key == key) return &slots_[i].block;
      if (slots_[i].key == 0) return nullptr;
    }
  }

  // Sets the block at `key`; false when no memory could be had for it (it goes untracked).
  bool put(uint64_t key, const Block& b) {
    if (key == 0) return false;
    if ((size_ + 1) * 10 > cap_ * 7 && !grow()) return false;
    size_t i = home(key);
    while (slots_[i].key != 0 && slots_[i].key != key) i = (i + 1) & mask();
    if (slots_[i].key == 0) ++size_;
    slots_[i] = Slot{key, b};
    return true;
  }

  void erase(uint64_t key) {
    if (slots_ == nullptr || key == 0) return;
    size_t i = home(key);
    while (slots_[i].key != key) {
      if (slots_[i].key == 0) return;
      i = (i + 1) & mask();
    }
    // Later entries of the run move back into the hole unless they sit at or after their own
    // home position, counted cyclically from the hole.
    for (size_t j = (i + 1) & mask(); slots_[j].key != 0; j = (j + 1) & mask()) {
      size_t h = home(slots_[j].key);
      bool stays = i <= j ? (i < h && h <= j) : (i < h || h <= j);
      if (!stays) {
        slots_[i] = slots_[j];
        i = j;
      }
    }
    slots_[i].key = 0;
    --size_;
  }

  template <typename F>
  void each(F f) const {
    for (size_t i = 0; i < cap_; ++i) {
      if (slots_[i].key != 0) {
        if (!f(slots_[i].key, slots_[i].block)) return;
      }
    }
  }

 private:
  struct Slot {
    uint64_t key;  // the block's address; 0: empty
    Block block;
  };

  size_t mask() const { return cap_ - 1; }
  size_t home(uint64_t key) const {
    return size_t((key * 0x9E3779B97F4A7C15ull) >> (64 - bits_));
  }

  bool grow() {
    int bits = slots_ == nullptr ? 8 : bits_ + 1;
    size_t cap = size_t(1) << bits;
    void* mem = mmap(nullptr, cap * sizeof(Slot), PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) return false;
    Slot* old = slots_;
    size_t old_cap = cap_;
    slots_ = static_cast<Slot*>(mem);  // zero-filled: every slot empty
    cap_ = cap;
    bits_ = bits;
    size_ = 0;
    for (size_t i = 0; i < old_cap; ++i) {
      if (old[i].key != 0) put(old[i].key, old[i].block);
    }
    if (old != nullptr) munmap(old, old_cap * sizeof(Slot));
    return true;
  }

  Slot* slots_ = nullptr;
  size_t cap_ = 0, size_ = 0;
  int bits_ = 0;
};

// A lock left with a release store. std::mutex leaves with an atomic exchange (it must learn
// whether a waiter sleeps), and each locked instruction is a full fence that makes the
// program's thread wait for its pending stores: two of them per block event cost more than the
// rest of the event. Nobody sleeps on this one: a waiter spins a little, then yields its core,
// then naps; holders keep it for one table update (the API's walks over every live block are
// rare).
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

class SpinMutex {
 public:
  void lock() {
    if (!locked_.exchange(true, std::memory_order_acquire)) return;
    for (unsigned tries = 0;; ++tries) {
      if (!locked_.load(std::memory_order_relaxed) &&
          !locked_.exchange(true, std::memory_order_acquire)) {
        return;
      }
      if (tries < 128) {
        cpu_relax();
      } else if (tries < 192) {
        sched_yield();
      } else {
        struct timespec nap = {0, 50000};
        nanosleep(&nap, nullptr);
      }
    }
  }
  void unlock() { locked_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> locked_{false};
};

// One lock for the table, the counters and the writing of the rows, so that the rows of one
// address are written in the order the allocator reported them, whatever the thread.
SpinMutex g_mutex;
LiveTable g_live;
Freed g_freed[kFreedKept];  // a ring: the newest freed blocks
size_t g_freed_next = 0, g_freed_count = 0;
uint64_t g_next_aid = 1;
struct DeviceUse {
  uint64_t used = 0, peak = 0;
};
DeviceUse g_cpu_use;
std::unordered_map<uint64_t, DeviceUse> g_use;  // other devices: (kind << 32 | index) -> bytes

DeviceUse& use_of(uint32_t kind, uint32_t index) {
  if (kind == kDeviceCpu) return g_cpu_use;
  return g_use[(uint64_t(kind) << 32) | index];
}

// `PTA[@category][@labels]`.
void owner_of(Out& o, const Block& b) {
  o.lit("PTA");
  if (b.category != nullptr) {
    o.lit("@");
    o.text(b.category);
  }
  if (b.labels != nullptr) {
    o.lit("@");
    o.text(b.labels);
  }
}

// The Attr text of a block row; `with_owner` adds the owner (`PTA[@category][@labels]`).
size_t block_attrs(char* buf, size_t cap, const Block& b, uint64_t ptr, uint64_t used,
                   long long total, bool with_owner) {
  Out o{buf, buf + cap - 1};
  o.lit("{\"allocation_id\":");
  o.u64(b.aid);
  o.lit(",\"addr\":\"0x");
  o.hex16(ptr);
  o.lit("\",\"size\":");
  o.u64(b.size);
  if (used != UINT64_MAX) {
    o.lit(",\"used\":");
    o.u64(used);
  }
  if (total >= 0) {
    o.lit(",\"total\":");
    o.u64(uint64_t(total));
  }
  if (with_owner) {
    o.lit(",\"owner\":\"");
    owner_of(o, b);
    o.lit("\"");
  }
  o.lit("}");
  return size_t(o.p - buf);
}

// A MALLOC or FREE row of block `b` at `ptr` (`with_owner`: the owner and site members).
void emit_block(uint32_t event, const Block& b, uint64_t ptr, uint64_t used, long long total,
                bool with_owner, StrRef site, StrRef frame, StrRef op, StrRef module,
                StrRef stack, bool c_stack) {
  if (g_emit_block == nullptr) return;
  uint32_t flags = (c_stack ? kWantCStack : 0u) | (with_owner ? kBlockOwner : 0u);
  if (used != UINT64_MAX) flags |= kBlockUsed;
  if (total >= 0) flags |= kBlockTotal;
  StrRef none{nullptr, 0};
  BlockRecord r{event,
                g_codes.ty_pta,
                b.dev_kind,
                b.dev_index,
                ptr,
                b.aid,
                b.size,
                flags,
                0,
                used,
                total >= 0 ? uint64_t(total) : 0,
                with_owner && b.category != nullptr ? str(*b.category) : none,
                with_owner && b.labels != nullptr ? str(*b.labels) : none,
                site,
                frame,
                op,
                module,
                stack};
  g_emit_block(&r);
}

// Called with g_mutex held.
void record_malloc(uint64_t ptr, uint64_t size, uint32_t dev_kind, uint32_t dev_index,
                   uint64_t used, long long total, Text category, bool adopted,
                   const std::string& stack, const Site& site) {
  Block b{g_next_aid++, size, dev_kind, dev_index, adopted, category,
          g_labels.load(std::memory_order_relaxed)};
  DeviceUse& u = use_of(dev_kind, dev_index);
  u.used += size;
  if (u.used > u.peak) u.peak = u.used;
  if (used == UINT64_MAX) used = u.used;
  if (g_cfg.alloc) {
    // The site members: `site` the user's line; `frame` the innermost frame when it is
    // another; `op` the op that allocated.
    StrRef frame = site.inner != nullptr && site.inner != site.user ? str(*site.inner)
                                                                     : StrRef{nullptr, 0};
    StrRef user = site.user != nullptr ? str(*site.user) : StrRef{nullptr, 0};
    // A block made before tracking was not allocated by the module running now.
    StrRef module = site.module != nullptr && !adopted ? str(*site.module) : StrRef{nullptr, 0};
    emit_block(g_codes.ev_malloc, b, ptr, used, total, true, user, frame, site.op, module,
               str(stack), g_cfg.c_stack);
  }
  g_live.put(ptr, b);
}

// Called with g_mutex held; `b` is the live block at `ptr`, removed here.
void record_free(uint64_t ptr, const Block& b, uint64_t used, long long total) {
  DeviceUse& u = use_of(b.dev_kind, b.dev_index);
  u.used = u.used >= b.size ? u.used - b.size : 0;
  if (used == UINT64_MAX) used = u.used;
  g_freed[g_freed_next] = Freed{ptr, b.size, b.dev_kind, b.dev_index};
  g_freed_next = (g_freed_next + 1) % kFreedKept;
  if (g_freed_count < kFreedKept) ++g_freed_count;
  if (g_cfg.free) {
    StrRef none{nullptr, 0};
    emit_block(g_codes.ev_free, b, ptr, used, total, false, none, none, none, none, none,
               false);
  }
  g_live.erase(ptr);
}

// --- ops ---------------------------------------------------------------------------------------
// `aten::addmm.default`, as the dump names ops.
size_t op_name(char* buf, size_t cap, const char* name, const char* overload) {
  Out o{buf, buf + cap - 1};
  o.str(name);
  o.lit(".");
  o.str(overload != nullptr && *overload ? overload : "default");
  *o.p = '\0';
  return size_t(o.p - buf);
}

// Whether a FUNCTION-scope RecordFunction is a dispatcher op (`namespace::name`): PyTorch also
// opens FUNCTION-scope records named in prose ("autograd::engine::evaluate_function: ...",
// "detach"), which are not ops and which the dump does not list.
bool is_op_name(const char* name) {
  const char* sep = std::strstr(name, "::");
  if (sep == nullptr || sep == name || sep[2] == '\0') return false;
  for (const char* p = name; *p; ++p) {
    char c = *p;
    bool word = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                c == '_' || c == '.';
    if (!word && !(p >= sep && p < sep + 2)) return false;
  }
  return true;
}

// A text kept for comparing with texts in memory: `len` bytes at `chars` (which live for the
// process), and, when short enough, the same as NUL-ended, zero-padded 8-byte words, so that
// the comparison goes a word at a time (an op's name at each op start: strncmp's calls cost
// more than the op's row).
template <int W>
struct Words {
  uint64_t w[W] = {};
  const char* chars = nullptr;
  size_t len = 0;
  bool held = false;  // the words hold the text (false: it is compared byte by byte)

  static Words of(const char* chars, size_t len) {
    Words out;
    out.chars = chars;
    out.len = len;
    if (len < size_t(8 * W)) {
      std::memcpy(out.w, chars, len);  // the rest stays zero: the NUL and the padding
      out.held = true;
    }
    return out;
  }

  // Whether the NUL-ended text at `s` is this one. Whole words of `s` are read only where
  // they stay inside its page; bytes past its NUL are masked off, so they never decide.
  bool match(const char* s) const {
    static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "masks take the low bytes first");
    uintptr_t a = reinterpret_cast<uintptr_t>(s);
    if (!held || (a & 4095) > size_t(4096 - 8 * W)) {
      return std::strncmp(s, chars, len) == 0 && s[len] == '\0';
    }
    size_t bytes = len + 1;  // with the NUL
    uint64_t diff = 0;
    for (int i = 0; i < W && size_t(8 * i) < bytes; ++i) {
      uint64_t word;
      std::memcpy(&word, s + 8 * i, 8);
      size_t left = bytes - size_t(8 * i);
      uint64_t mask = left >= 8 ? ~0ull : (1ull << (8 * left)) - 1;
      diff |= (word ^ w[i]) & mask;
    }
    return diff == 0;
  }
};

// An op's name as the dump writes it, made once: a dispatcher op's name and overload texts
// live as long as the op, so a thread remembers the written name by their addresses (and
// checks the texts still match: an op defined in Python can go, and its memory be reused).
struct OpText {
  const char* name = nullptr;  // the RecordFunction's texts this entry stands for
  const char* overload = nullptr;
  Text text = nullptr;         // `name.overload`, interned
  Words<4> name_words;         // the two texts as they were, in `text`, to check them against
  Words<2> overload_words;
};

constexpr int kOpDepth = 64;
constexpr size_t kOpTexts = 1024;  // a direct-mapped cache: a model's ops are a few hundred

// This thread's op state, in one thread-local object (each thread-local of a library loaded at
// run time costs a lookup call).
struct ThreadOps {
  const char* name[kOpDepth];  // the ops running on this thread, innermost last
  Text text[kOpDepth];
  StrRef op[kOpDepth];  // their names alone, interned
  int depth = 0;
  OpText texts[kOpTexts];
  // The innermost nn.Module running forward (msmemscope_torch_set_module).
  Text module = nullptr;
};

thread_local ThreadOps tl_ops;

// Whether the entry's texts are still the ones it was made for (a reused text may be shorter
// or longer than the entry's).
bool same_op(const OpText& e, const char* name, const char* overload) {
  return e.name_words.match(name) && (overload == nullptr || e.overload_words.match(overload));
}

// The names of the op a RecordFunction stands for, both interned.
struct OpNames {
  Text text = nullptr;    // as the dump names ops (`name.overload`); null: no op
  StrRef op{nullptr, 0};  // the op's name alone
};

// The written name of the op a RecordFunction stands for; null when it is no op.
OpNames op_text(ThreadOps& ops, const char* name, const char* overload) {
  // The texts' addresses, mixed (heap addresses share their low and high bits).
  uint64_t key = reinterpret_cast<uintptr_t>(name) * 0x9E3779B97F4A7C15ull ^
                 reinterpret_cast<uintptr_t>(overload) * 0xC2B2AE3D27D4EB4Full;
  size_t slot = size_t(key >> 54) % kOpTexts;
  OpText& e = ops.texts[slot];
  if (e.name == name && e.overload == overload && e.text != nullptr &&
      same_op(e, name, overload)) {
    return OpNames{e.text, StrRef{e.name_words.chars, e.name_words.len}};
  }
  if (!is_op_name(name)) return OpNames{};  // not kept: prose names can be made per call
  char buf[256];
  op_name(buf, sizeof buf, name, overload);
  Text t = intern(buf);
  if (t == nullptr) return OpNames{};
  size_t name_len = std::strlen(name);
  // The default overload is written `default`; a text cut at the buffer's end is written as
  // cut and not kept (its row names another op's text).
  size_t overload_len = overload != nullptr ? std::strlen(overload) : 0;
  bool whole_text = overload_len == 0
                        ? t->size() == name_len + 1 + std::strlen("default")
                        : t->size() == name_len + 1 + overload_len;
  if (whole_text && (*t)[name_len] == '.') {
    const char* overload_chars = overload_len == 0 ? "" : t->c_str() + name_len + 1;
    e = OpText{name, overload, t, Words<4>::of(t->c_str(), name_len),
               Words<2>::of(overload_chars, overload_len)};
    return OpNames{t, StrRef{t->data(), name_len}};
  }
  Text whole = intern(name);
  return OpNames{t, whole != nullptr ? str(*whole) : StrRef{nullptr, 0}};
}

const std::string* current_module() { return tl_ops.module; }

StrRef current_op() {
  const ThreadOps& ops = tl_ops;
  int depth = ops.depth;
  return depth > 0 && depth <= kOpDepth ? ops.op[depth - 1] : StrRef{nullptr, 0};
}

// The innermost op's written name, into `buf` ("" when none).
void current_op_text(char* buf, size_t cap) {
  const ThreadOps& ops = tl_ops;
  int depth = ops.depth < kOpDepth ? ops.depth : kOpDepth;
  Out o{buf, buf + cap - 1};
  if (depth > 0) o.text(ops.text[depth - 1]);
  *o.p = '\0';
}

struct OpSchema {
  std::vector<bool> written;  // per argument: the schema marks it written (Tensor(a!))
  std::vector<bool> fresh;    // per return: a new tensor (no alias annotation)
};

std::mutex g_schema_mutex;
std::unordered_map<std::string, std::shared_ptr<const OpSchema>> g_schemas;

std::shared_ptr<const OpSchema> schema_of(const at::RecordFunction& fn, const std::string& key) {
  {
    std::lock_guard<std::mutex> l(g_schema_mutex);
    auto it = g_schemas.find(key);
    if (it != g_schemas.end()) return it->second;
  }
  auto s = std::make_shared<OpSchema>();
  auto schema = fn.operator_schema();
  if (schema) {
    for (const auto& a : schema->arguments()) {
      s->written.push_back(a.alias_info() != nullptr && a.alias_info()->isWrite());
    }
    for (const auto& r : schema->returns()) s->fresh.push_back(r.alias_info() == nullptr);
  }
  std::lock_guard<std::mutex> l(g_schema_mutex);
  return g_schemas.emplace(key, std::move(s)).first->second;
}

const char* dtype_name(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Float: return "float32";
    case c10::ScalarType::Double: return "float64";
    case c10::ScalarType::Half: return "float16";
    case c10::ScalarType::BFloat16: return "bfloat16";
    case c10::ScalarType::Long: return "int64";
    case c10::ScalarType::Int: return "int32";
    case c10::ScalarType::Short: return "int16";
    case c10::ScalarType::Char: return "int8";
    case c10::ScalarType::Byte: return "uint8";
    case c10::ScalarType::Bool: return "bool";
    case c10::ScalarType::ComplexFloat: return "complex64";
    case c10::ScalarType::ComplexDouble: return "complex128";
    case c10::ScalarType::ComplexHalf: return "complex32";
    default: return c10::toString(t);
  }
}

void access_row(const char* name, const at::Tensor& t, bool write) {
  if (!t.defined() || !t.has_storage()) return;
  uint32_t kind, index;
  device_of(t.device(), &kind, &index);
  if (kind == kDeviceNone) return;
  std::string attrs = "{\"dtype\":\"";
  attrs += dtype_name(t.scalar_type());
  attrs += "\",\"shape\":[";
  bool first = true;
  for (auto d : t.sizes()) {
    if (!first) attrs.push_back(',');
    first = false;
    attrs += std::to_string(d);
  }
  attrs += "]}";
  uint64_t ptr = reinterpret_cast<uint64_t>(t.storage().data_ptr().get());
  emit(g_codes.ev_access, write ? g_codes.ty_write : g_codes.ty_read, str(name), kind, index,
       true, ptr, str(attrs), StrRef{nullptr, 0}, false);
}

void access_value(const char* name, const c10::IValue& v, bool write) {
  if (v.isTensor()) {
    access_row(name, v.toTensor(), write);
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList()) access_row(name, t, write);
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) {
      if (e.isTensor()) access_row(name, e.toTensor(), write);
    }
  }
}

class Reporter;
std::shared_ptr<Reporter> g_reporter;

// Puts our entry on this thread when no PROFILER_STATE entry is there (a user's profiler has
// its own: its session sees this thread's allocations until it ends).
void ensure_on_this_thread();

std::unique_ptr<at::ObserverContext> on_op_start(const at::RecordFunction& fn) {
  try {
    ensure_on_this_thread();
    ThreadOps& ops = tl_ops;
    const char* fn_name = fn.name();
    OpNames names = op_text(ops, fn_name, overload_of(fn));
    Text text = names.text;
    if (text == nullptr) return nullptr;
    if (ops.depth < kOpDepth) {
      ops.name[ops.depth] = fn_name;
      ops.text[ops.depth] = text;
      ops.op[ops.depth] = names.op;
    }
    ++ops.depth;
    if (!tracing()) return nullptr;
    if (g_cfg.launch && g_emit_op) g_emit_op(g_codes.ty_aten_start, text->data(), text->size());
    if (g_cfg.access && fn.needsInputs()) {
      auto schema = schema_of(fn, *text);
      auto inputs = fn.inputs();
      for (size_t i = 0; i < inputs.size(); ++i) {
        bool write = i < schema->written.size() && schema->written[i];
        access_value(text->c_str(), inputs[i], write);
      }
    }
  } catch (...) {
  }
  return nullptr;
}

void on_op_end(const at::RecordFunction& fn, at::ObserverContext*) {
  try {
    ThreadOps& ops = tl_ops;
    const char* fn_name = fn.name();
    // Ops end in the order they started on a thread: the innermost one's name, checked when
    // it started, is this one's while its text is the same (the op lives while it runs).
    int depth = ops.depth;
    Text text = depth > 0 && depth <= kOpDepth && ops.name[depth - 1] == fn_name
                    ? ops.text[depth - 1]
                    : op_text(ops, fn_name, overload_of(fn)).text;
    if (text == nullptr) return;
    if (ops.depth > 0) --ops.depth;
    if (!tracing()) return;
    if (g_cfg.access && fn.needsOutputs()) {
      auto schema = schema_of(fn, *text);
      const auto& outputs = fn.outputs();
      for (size_t i = 0; i < outputs.size(); ++i) {
        if (i < schema->fresh.size() && schema->fresh[i]) {
          access_value(text->c_str(), outputs[i], true);
        }
      }
    }
    if (g_cfg.launch && g_emit_op) g_emit_op(g_codes.ty_aten_end, text->data(), text->size());
  } catch (...) {
  }
}

// --- the CPU allocator ------------------------------------------------------------------------
// PyTorch's CPU allocator tells the thread's reporter about a free only when the freeing thread
// has one, and a block is often freed elsewhere (a collective's worker thread drops the last
// reference, a DataLoader thread...): a reporter would miss those frees and call the blocks
// leaked. Wrapping the allocator puts our deleter on every block it hands out, so each free is
// seen on whatever thread it happens. The block, its context and its device are unchanged.
c10::Allocator* g_cpu_inner = nullptr;
c10::DeleterFnPtr g_cpu_inner_deleter = nullptr;
bool g_cpu_wrapped = false;

void cpu_delete(void* p) {
  try {
    uint64_t addr = reinterpret_cast<uint64_t>(p);
    std::lock_guard<SpinMutex> l(g_mutex);
    Block* b = g_live.find(addr);
    if (b != nullptr && !b->adopted) {
      record_free(addr, *b, UINT64_MAX, -1);
    }
  } catch (...) {
  }
  g_cpu_inner_deleter(p);  // after the ledger let go of the address
}

void cpu_oom(size_t n, const c10::Error& e) {
  try {
    if (!tracing()) return;
    char op[256];
    current_op_text(op, sizeof op);
    std::string message = e.what_without_backtrace();
    size_t nl = message.find('\n');
    if (nl != std::string::npos) message.resize(nl);
    std::string escaped;
    for (char c : message) {
      if (c == '"' || c == '\\') escaped.push_back('\\');
      if (static_cast<unsigned char>(c) >= 0x20) escaped.push_back(c);
    }
    std::string attrs = "{\"func\":\"" + std::string(op) + "\",\"req_size\":" + std::to_string(n) +
                        ",\"error\":\"" + escaped + "\"" + site_member() + "}";
    std::string stack = python_stack(g_cfg.python_depth);
    emit(g_codes.ev_oom, g_codes.ty_oom_trigger, str(op), kDeviceCpu, 0, false, 0, str(attrs),
         str(stack), true);
  } catch (...) {
  }
}

class CpuAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr d;
    try {
      d = g_cpu_inner->allocate(n);
    } catch (const c10::Error& e) {
      cpu_oom(n, e);
      throw;
    }
    void* p = d.get();
    if (!g_enabled.load(std::memory_order_relaxed) || p == nullptr || d.get_context() != p ||
        d.get_deleter() != g_cpu_inner_deleter || !tracing()) {
      return d;  // not traced now, or not the plain shape this wrapper knows
    }
    try {
      std::string stack = python_stack(g_cfg.python_depth);
      Site site = site_here();
      Text category = category_for_new();
      std::lock_guard<SpinMutex> l(g_mutex);
      if (!d.compare_exchange_deleter(g_cpu_inner_deleter, &cpu_delete)) return d;
      record_malloc(reinterpret_cast<uint64_t>(p), n, kDeviceCpu, 0, UINT64_MAX, -1, category,
                    false, stack, site);
      return d;
    } catch (...) {
      return d;
    }
  }

  c10::DeleterFnPtr raw_deleter() const override {
    c10::DeleterFnPtr inner = g_cpu_inner->raw_deleter();
    return inner == g_cpu_inner_deleter ? &cpu_delete : inner;
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    g_cpu_inner->copy_data(dest, src, count);
  }
};

CpuAllocator g_cpu_allocator;

// Installs the wrapper over the current CPU allocator, once; false when that allocator does not
// hand out plain blocks (its own context) or another allocator of higher priority stays.
bool wrap_cpu_allocator() {
  if (g_cpu_wrapped) return true;
  c10::Allocator* current = c10::GetCPUAllocator();
  if (current == nullptr || current == &g_cpu_allocator || current->raw_deleter() == nullptr) {
    return false;
  }
  g_cpu_inner = current;
  g_cpu_inner_deleter = current->raw_deleter();
  c10::SetCPUAllocator(&g_cpu_allocator, 0);
  g_cpu_wrapped = c10::GetCPUAllocator() == &g_cpu_allocator;
  return g_cpu_wrapped;
}

class Reporter final : public torch::profiler::impl::ProfilerStateBase {
 public:
  Reporter()
      : ProfilerStateBase(
            torch::profiler::impl::ProfilerConfig(torch::profiler::impl::ProfilerState::Disabled)) {}

  // Only the CPU allocator's profiled reporter asks; other allocators (CUDA's caching
  // allocator, the file-mapping one) report regardless. CPU blocks come from our wrapper of the
  // CPU allocator (below) unless it could not be installed.
  bool memoryProfilingEnabled() const override {
    return g_enabled.load(std::memory_order_relaxed) && !g_cpu_wrapped;
  }

  torch::profiler::impl::ActiveProfilerType profilerType() override {
    return torch::profiler::impl::ActiveProfilerType::NONE;
  }

  void reportMemoryUsage(void* ptr, int64_t alloc_size, size_t total_allocated,
                         size_t total_reserved, c10::Device device) override {
    try {
      if (alloc_size == 0 || !g_enabled.load(std::memory_order_relaxed)) return;
      uint32_t kind, index;
      device_of(device, &kind, &index);
      if (kind == kDeviceNone) return;
      uint64_t addr = reinterpret_cast<uint64_t>(ptr);
      long long total = kind == kDeviceCpu ? -1 : static_cast<long long>(total_reserved);
      if (alloc_size > 0) {
        if (!tracing()) return;
        std::string stack = python_stack(g_cfg.python_depth);
        Site site = site_here();
        Text category = category_for_new();
        // The CPU allocator's running total counts every block since capture began, traced or
        // not, so on CPU `used` is the sum of the blocks the rows list; on CUDA it is the
        // caching allocator's own allocated bytes.
        uint64_t used = kind == kDeviceCpu ? UINT64_MAX : uint64_t(total_allocated);
        std::lock_guard<SpinMutex> l(g_mutex);
        record_malloc(addr, uint64_t(alloc_size), kind, index, used, total, category, false,
                      stack, site);
      } else {
        std::lock_guard<SpinMutex> l(g_mutex);
        Block* b = g_live.find(addr);
        if (b == nullptr || b->adopted) return;  // allocated before tracking
        record_free(addr, *b, kind == kDeviceCpu ? UINT64_MAX : uint64_t(total_allocated),
                    total);
      }
    } catch (...) {
    }
  }

  void reportOutOfMemory(int64_t alloc_size, size_t total_allocated, size_t total_reserved,
                         c10::Device device) override {
    try {
      if (!tracing()) return;
      uint32_t kind, index;
      device_of(device, &kind, &index);
      if (kind == kDeviceCpu && g_cpu_wrapped) return;  // the wrapper reports it, with the text
      char op[256];
      current_op_text(op, sizeof op);
      const char* what = kind == kDeviceCpu
                             ? "can't allocate memory: the CPU allocator failed a request"
                             : "out of memory: the CUDA caching allocator failed a request";
      char attrs[512];
      int n = std::snprintf(attrs, sizeof attrs,
                            "{\"func\":\"%s\",\"req_size\":%lld,\"error\":\"%s of %lld bytes "
                            "(allocated %zu, reserved %zu)\"",
                            op, static_cast<long long>(alloc_size), what,
                            static_cast<long long>(alloc_size), total_allocated, total_reserved);
      std::string text(attrs, n > 0 && size_t(n) < sizeof attrs ? size_t(n) : 0);
      text += site_member();
      text += "}";
      std::string stack = python_stack(g_cfg.python_depth > 0 ? g_cfg.python_depth : 0);
      emit(g_codes.ev_oom, g_codes.ty_oom_trigger, str(op), kind, index, false, 0, str(text),
           str(stack), true);
    } catch (...) {
    }
  }
};

// Whether threads get our entry at all: it is for allocators other than the CPU one (CUDA's),
// and PyTorch refuses to start a profiler on a thread that has one, so a run without CUDA
// goes without.
std::atomic<bool> g_thread_entries{false};

void ensure_on_this_thread() {
  if (!g_thread_entries.load(std::memory_order_relaxed)) return;
  if (!g_enabled.load(std::memory_order_relaxed) || !g_reporter) return;
  if (c10::ThreadLocalDebugInfo::get(c10::DebugInfoKind::PROFILER_STATE) != nullptr) return;
  c10::ThreadLocalDebugInfo::_push(c10::DebugInfoKind::PROFILER_STATE, g_reporter);
}

// The op callback exists while something needs ops: their rows, their accesses, the OOM row's
// op name, or the thread entries it puts on threads. Without it an op costs PyTorch nothing of
// ours. Registered again when what it needs changes (inputs and outputs for accesses).
bool g_callback_access = false;

void sync_callback() {
  try {
    bool wanted = g_enabled.load() && (g_cfg.launch || g_cfg.access || g_cfg.oom ||
                                       g_thread_entries.load());
    if (g_callback != 0 && (!wanted || g_callback_access != g_cfg.access)) {
      at::removeCallback(g_callback);
      g_callback = 0;
    }
    if (wanted && g_callback == 0) {
      g_callback_access = g_cfg.access;
      g_callback = at::addGlobalCallback(at::RecordFunctionCallback(on_op_start, on_op_end)
                                             .needsInputs(g_callback_access)
                                             .needsOutputs(g_callback_access)
                                             .scopes({at::RecordScope::FUNCTION}));
    }
  } catch (...) {
  }
}

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

// The SYSTEM/OWNER row that moves the live block `b` at `ptr` to its current owner; false when
// rows of blocks are not recorded. Called with g_mutex held.
bool emit_owner_row(uint64_t ptr, const Block& b) {
  if (!g_cfg.alloc) return false;
  char attrs[512];
  size_t n = block_attrs(attrs, sizeof attrs, b, ptr, UINT64_MAX, -1, true);
  char owner[384];
  Out o{owner, owner + sizeof owner};
  owner_of(o, b);
  emit(g_codes.ev_system, g_codes.ty_owner, StrRef{owner, size_t(o.p - owner)}, b.dev_kind,
       b.dev_index, true, ptr, StrRef{attrs, n}, StrRef{nullptr, 0}, false);
  return true;
}

}  // namespace

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
    if (!g_reporter) g_reporter = std::make_shared<Reporter>();
    if (g_activation == nullptr) {
      g_optimizer_state = intern("optimizer_state");
      g_temporary = intern("temporary");
      g_activation = intern("activation");
    }
    wrap_cpu_allocator();
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
    auto* top = c10::ThreadLocalDebugInfo::get(c10::DebugInfoKind::PROFILER_STATE);
    if (top == nullptr || top != g_reporter.get()) return 0;
    c10::ThreadLocalDebugInfo::_pop(c10::DebugInfoKind::PROFILER_STATE);
    return 1;
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
    tl_scopes.push_back(intern(category ? category : ""));
  } catch (...) {
  }
}

void msmemscope_torch_scope_pop() {
  if (!tl_scopes.empty()) tl_scopes.pop_back();
}

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
  tl_ops.module = static_cast<Text>(text);
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
    for (size_t i = 0; i < g_freed_count; ++i) {
      const Freed* it = &g_freed[(g_freed_next + kFreedKept - 1 - i) % kFreedKept];
      if (it->addr <= addr && addr < it->addr + it->size) {
        *start = it->addr;
        *size = it->size;
        *dev_kind = it->dev_kind;
        *dev_index = it->dev_index;
        return 1;
      }
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
