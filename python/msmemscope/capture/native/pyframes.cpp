// The calling thread's Python frames, read from the interpreter's own frame records.
//
// PyTorch releases the GIL around every op, so an allocation event arrives on a thread that
// runs Python code but may not hold the GIL, when no Python API may be called. The thread's
// frame chain, though, is its own: it does not change while the thread is in C++, and reading
// it takes no lock and allocates nothing. Built against the running interpreter's headers
// (internal ones for the frame layout), so the layout is that interpreter's.

#include <Python.h>
#if PY_VERSION_HEX >= 0x030B0000
// 3.11 moved the frame records into the interpreter's internal headers.
#define Py_BUILD_CORE 1
#include <internal/pycore_frame.h>
#else
#include <frameobject.h>
#endif

#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

// A str's UTF-8 text without creating anything: compact ASCII strings hold it inline, others
// only when their UTF-8 form was already cached.
const char* text_of(PyObject* s) {
  if (s == nullptr || !PyUnicode_Check(s)) return nullptr;
  if (PyUnicode_IS_COMPACT_ASCII(s)) return static_cast<const char*>(PyUnicode_DATA(s));
  if (PyUnicode_IS_COMPACT(s)) return reinterpret_cast<PyCompactUnicodeObject*>(s)->utf8;
  return nullptr;
}

#if PY_VERSION_HEX >= 0x030E0000
// 3.14 changed the frame records (stack references); frames are not read there yet.
_PyInterpreterFrame* newest_frame(PyThreadState*) { return nullptr; }
PyCodeObject* code_of(_PyInterpreterFrame*) { return nullptr; }
#elif PY_VERSION_HEX >= 0x030D0000
_PyInterpreterFrame* newest_frame(PyThreadState* t) { return t->current_frame; }
PyCodeObject* code_of(_PyInterpreterFrame* f) {
  PyObject* e = f->f_executable;
  return e != nullptr && PyCode_Check(e) ? reinterpret_cast<PyCodeObject*>(e) : nullptr;
}
#elif PY_VERSION_HEX >= 0x030B0000
_PyInterpreterFrame* newest_frame(PyThreadState* t) {
  return t->cframe != nullptr ? t->cframe->current_frame : nullptr;
}
PyCodeObject* code_of(_PyInterpreterFrame* f) { return f->f_code; }
#else
// Up to 3.10 every Python frame is a frame object, chained by f_back.
using Frame = PyFrameObject;
Frame* newest_frame(PyThreadState* t) { return t->frame; }
Frame* older(Frame* f) { return f->f_back; }
PyCodeObject* code_of(Frame* f) { return f->f_code; }
#endif
#if PY_VERSION_HEX >= 0x030B0000
using Frame = _PyInterpreterFrame;
Frame* older(Frame* f) { return f->previous; }
#endif

// The code offset, in bytes, of the instruction a frame is at.
int byte_offset(Frame* f) {
#if PY_VERSION_HEX >= 0x030B0000
  return _PyInterpreterFrame_LASTI(f) * int(sizeof(_Py_CODEUNIT));
#elif PY_VERSION_HEX >= 0x030A0000
  return f->f_lasti * int(sizeof(_Py_CODEUNIT));  // 3.10 counts instructions
#else
  return f->f_lasti;  // 3.9 counts bytes
#endif
}

bool is_real(Frame* f) {
#if PY_VERSION_HEX >= 0x030C0000
  if (f->owner == FRAME_OWNED_BY_CSTACK) return false;
#endif
#if PY_VERSION_HEX >= 0x030B0000
  return code_of(f) != nullptr && !_PyFrame_IsIncomplete(f);
#else
  return code_of(f) != nullptr;
#endif
}

}  // namespace

// Innermost first, `file(line): function` a line, at most `depth` frames, after skipping the
// innermost frames whose file starts with one of `skip`. Empty on a thread without Python.
std::string msmemscope_python_stack(int depth, const std::vector<std::string>& skip) {
  std::string out;
  if (depth <= 0 || !Py_IsInitialized()) return out;
  PyThreadState* t = PyGILState_GetThisThreadState();
  if (t == nullptr) return out;
  bool top = true;
  int taken = 0;
  for (Frame* f = newest_frame(t); f != nullptr && taken < depth; f = older(f)) {
    if (!is_real(f)) continue;
    PyCodeObject* code = code_of(f);
    const char* file = text_of(code->co_filename);
    const char* func = text_of(code->co_name);
    if (file == nullptr) file = "<non-ascii file name>";
    if (func == nullptr) func = "<non-ascii name>";
    if (top) {
      bool skipped = false;
      for (const auto& p : skip) {
        if (std::strncmp(file, p.c_str(), p.size()) == 0) skipped = true;
      }
      if (skipped) continue;
      top = false;
    }
    int line = PyCode_Addr2Line(code, byte_offset(f));
    if (!out.empty()) out.push_back('\n');
    out += file;
    out += '(';
    out += std::to_string(line);
    out += "): ";
    out += func;
    ++taken;
  }
  return out;
}

// --- allocation sites -------------------------------------------------------------------------
// Every tensor block is tagged with two frames: the innermost one outside torch and msmemscope
// (often a library's line, e.g. transformers') and the innermost one of the user's own code
// (outside the standard library, site-packages, torch and msmemscope). Both are texts
// `file:line (function)`, JSON-escaped, made once per (code object, instruction) and interned
// for good; an allocation costs a walk of the frame chain and a few cache probes, no string.
namespace {

std::mutex g_site_mutex;
// Never destroyed: the runtime's writer reads these texts until the process's last exit
// handler (its own, which runs after this library's static destructors).
auto& g_site_texts = *new std::unordered_map<std::string, std::unique_ptr<std::string>>();

const std::string* intern_site(const std::string& s) {
  std::lock_guard<std::mutex> l(g_site_mutex);
  auto& slot = g_site_texts[s];
  if (!slot) slot = std::make_unique<std::string>(s);
  return slot.get();
}

void escape_into(std::string& out, const char* s) {
  for (; *s; ++s) {
    unsigned char c = static_cast<unsigned char>(*s);
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(char(c));
    } else if (c < 0x20) {
      out.push_back(' ');
    } else {
      out.push_back(char(c));
    }
  }
}

bool starts_with_any(const char* file, const std::vector<std::string>& prefixes) {
  for (const auto& p : prefixes) {
    if (std::strncmp(file, p.c_str(), p.size()) == 0) return true;
  }
  return false;
}

// Direct-mapped per-thread caches keyed by the code object's address (and its file name's, so
// that a code object freed and another made at its address is not taken for the old one).
struct KindSlot {
  PyCodeObject* code = nullptr;
  PyObject* file = nullptr;
  uint8_t kind = 0;  // bit 0: outside torch/msmemscope; bit 1: the user's own code
};
struct TextSlot {
  PyCodeObject* code = nullptr;
  PyObject* file = nullptr;
  int offset = -1;
  const std::string* text = nullptr;
};
constexpr size_t kKindSlots = 512, kTextSlots = 2048;
thread_local KindSlot tl_kinds[kKindSlots];
thread_local TextSlot tl_texts[kTextSlots];

size_t slot_of(const void* p, size_t n) { return (reinterpret_cast<uintptr_t>(p) >> 4) % n; }

uint8_t kind_of(PyCodeObject* code, const std::vector<std::string>& own,
                const std::vector<std::string>& library) {
  KindSlot& s = tl_kinds[slot_of(code, kKindSlots)];
  if (s.code == code && s.file == code->co_filename) return s.kind;
  const char* file = text_of(code->co_filename);
  uint8_t kind = 0;
  if (file != nullptr && !starts_with_any(file, own)) {
    kind |= 1;
    if (file[0] != '<' && !starts_with_any(file, library)) kind |= 2;
  }
  s = KindSlot{code, code->co_filename, kind};
  return kind;
}

const std::string* text_at(Frame* f) {
  PyCodeObject* code = code_of(f);
  int offset = byte_offset(f);
  size_t h = (reinterpret_cast<uintptr_t>(code) >> 4) * 31u + size_t(offset);
  TextSlot& s = tl_texts[h % kTextSlots];
  if (s.code == code && s.file == code->co_filename && s.offset == offset) return s.text;
  const char* file = text_of(code->co_filename);
  const char* func = text_of(code->co_name);
  std::string t;
  escape_into(t, file != nullptr ? file : "<non-ascii file name>");
  t.push_back(':');
  t += std::to_string(PyCode_Addr2Line(code, offset));
  t += " (";
  escape_into(t, func != nullptr ? func : "<non-ascii name>");
  t.push_back(')');
  const std::string* text = intern_site(t);
  s = TextSlot{code, code->co_filename, offset, text};
  return text;
}

}  // namespace

// The calling thread's allocation site: `*inner` the innermost frame outside `own`, `*user` the
// innermost one outside `own`, `library` and the `<...>` pseudo-files; null where there is none.
void msmemscope_python_site(const std::vector<std::string>& own,
                            const std::vector<std::string>& library, const std::string** inner,
                            const std::string** user) {
  *inner = *user = nullptr;
  if (!Py_IsInitialized()) return;
  PyThreadState* t = PyGILState_GetThisThreadState();
  if (t == nullptr) return;
  // A bound on the walk: a site deeper than this many frames below the innermost is not sought.
  int budget = 256;
  for (Frame* f = newest_frame(t); f != nullptr && budget > 0; f = older(f), --budget) {
    if (!is_real(f)) continue;
    uint8_t kind = kind_of(code_of(f), own, library);
    if ((kind & 1) == 0) continue;
    if (*inner == nullptr) *inner = text_at(f);
    if (kind & 2) {
      *user = text_at(f);
      return;
    }
  }
}
