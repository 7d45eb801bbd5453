// Allocator events. PyTorch hands every allocator event of a thread to the PROFILER_STATE entry
// of that thread's c10::ThreadLocalDebugInfo when its memoryProfilingEnabled() is true (the CPU
// allocator's profiled reporter, the CUDA caching allocator). Our entry derives from
// ProfilerStateBase with a disabled config, because PyTorch reads any PROFILER_STATE entry as
// one (profilerEnabled(), profilerType()): to PyTorch it is "no profiler running", and a user's
// own torch.profiler still starts on top of it. CPU blocks come from a wrapper of the CPU
// allocator instead, which sees every free on whatever thread it happens.

#include "capture.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/ThreadLocalDebugInfo.h>
#include <torch/csrc/profiler/orchestration/observer.h>

#include <cstdio>
#include <memory>
#include <mutex>
#include <string>

#include "blocks.h"

namespace msmemscope::capture {
namespace {

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

std::shared_ptr<Reporter> g_reporter;

}  // namespace

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

void install_allocator_hooks() {
  if (!g_reporter) g_reporter = std::make_shared<Reporter>();
  wrap_cpu_allocator();
}

bool leave_this_thread() {
  auto* top = c10::ThreadLocalDebugInfo::get(c10::DebugInfoKind::PROFILER_STATE);
  if (top == nullptr || top != g_reporter.get()) return false;
  c10::ThreadLocalDebugInfo::_pop(c10::DebugInfoKind::PROFILER_STATE);
  return true;
}

}  // namespace msmemscope::capture
