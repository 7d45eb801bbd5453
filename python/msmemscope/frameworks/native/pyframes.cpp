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

#include <cstring>
#include <string>
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
