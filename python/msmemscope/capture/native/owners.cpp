// Who owns a block when it is made, and where it was made: the interned texts rows point at,
// the framework scope of the thread, the optimizer flag, the describer's labels, and the Python
// frames and allocation site (read by pyframes.cpp).

#include "capture.h"

#include <c10/macros/Export.h>

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

namespace msmemscope::capture {

// --- texts ------------------------------------------------------------------------------------
namespace {
std::mutex g_texts_mutex;
// Never destroyed: rows hold these texts' addresses, and the runtime's writer reads them until
// the process's last exit handler (its own, which runs after this library's static destructors).
auto& g_texts = *new std::unordered_map<std::string, std::unique_ptr<std::string>>();
}  // namespace

Text intern(const std::string& s) {
  if (s.empty()) return nullptr;
  std::lock_guard<std::mutex> l(g_texts_mutex);
  auto& slot = g_texts[s];
  if (!slot) slot = std::make_unique<std::string>(s);
  return slot.get();
}

// --- Python frames (--call-stack python:N) and allocation sites (always) ----------------------
std::vector<std::string> g_skip_prefixes;
std::vector<std::string> g_library_prefixes;

std::string python_stack(int depth) {
  if (depth <= 0) return std::string();
  return msmemscope_python_stack(depth, g_skip_prefixes);
}

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

// --- owners -----------------------------------------------------------------------------------
namespace {
thread_local std::vector<Text> tl_scopes;  // framework categories entered on this thread
}  // namespace

std::atomic<int> g_in_optimizer{0};
std::atomic<Text> g_labels{nullptr};
Text g_optimizer_state, g_temporary, g_activation;

Text category_for_new() {
  if (!tl_scopes.empty()) return tl_scopes.back();
  if (!g_cfg.decompose) return nullptr;
  if (g_in_optimizer.load(std::memory_order_relaxed) > 0) return g_optimizer_state;
  if (torch::autograd::get_current_graph_task_id() != -1) return g_temporary;
  return g_activation;
}

void scope_push(Text category) { tl_scopes.push_back(category); }

void scope_pop() {
  if (!tl_scopes.empty()) tl_scopes.pop_back();
}

}  // namespace msmemscope::capture
