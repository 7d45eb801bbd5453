// ATen ops: a global RecordFunction callback (scope FUNCTION) keeps each thread's running ops
// (the op that allocates a block, the op an OOM row names) and writes ATEN_START/ATEN_END; with
// access events it reads the inputs and outputs and the op's schema (alias annotations). The
// same callback puts our PROFILER_STATE entry on threads that do not have it yet.

#include <ATen/record_function.h>
#include <ATen/core/function_schema.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/List.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "capture.h"

namespace msmemscope::capture {
namespace {

at::CallbackHandle g_callback = 0;

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

}  // namespace

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
void set_current_module(Text module) { tl_ops.module = module; }

namespace {


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

// The op callback exists while something needs ops: their rows, their accesses, the OOM row's
// op name, or the thread entries it puts on threads. Without it an op costs PyTorch nothing of
// ours. Registered again when what it needs changes (inputs and outputs for accesses).
bool g_callback_access = false;

}  // namespace

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

}  // namespace msmemscope::capture
