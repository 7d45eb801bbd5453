//! Reading CPython frames natively, from inside the traced process. The code here only decodes
//! what has already been copied out of (or borrowed from) the interpreter's memory; it never
//! dereferences interpreter pointers itself, and it must not allocate, because it runs inside
//! the malloc hook.

pub mod linetable;
