//! The mapping that contains an address, read from `/proc/self/maps` with raw system calls.
//!
//! Hooks call this (a thread's first stack capture, a stack that moved below the mapping seen
//! last, a GOT page's protection), so it must not take any lock the program may hold around
//! an allocation. glibc's `pthread_getattr_np` holds the thread's descriptor lock while it
//! `malloc`s for `fopen`, so a hook asking it for stack bounds deadlocks; `fopen`/stdio take
//! their own locks and allocate. Here: `openat`/`read`/`close` as bare `syscall` instructions
//! (no libc wrapper: no errno write, no cancellation point), one fixed buffer on the stack, and a
//! byte-at-a-time parser that never needs a whole line in memory.

/// One line of `/proc/self/maps`: `[start, end)` and its permissions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    pub readable: bool,
    pub writable: bool,
    pub executable: bool,
    /// Named `[stack]`: the main thread's stack, which grows down.
    pub main_stack: bool,
}

impl Mapping {
    /// The `PROT_*` bits these permissions stand for (what `mprotect` restores).
    pub fn prot(&self) -> i32 {
        let mut prot = libc::PROT_NONE;
        if self.readable {
            prot |= libc::PROT_READ;
        }
        if self.writable {
            prot |= libc::PROT_WRITE;
        }
        if self.executable {
            prot |= libc::PROT_EXEC;
        }
        prot
    }
}

/// Small enough for the stack of any thread that may allocate: the kernel keeps the rest of its
/// page between reads, so small reads cost little more than large ones.
const BUF: usize = 1024;

/// The mapping that contains `addr`, or `None` when none does (or the file cannot be read).
pub fn mapping_containing(addr: u64) -> Option<Mapping> {
    let fd = sys::open_readonly(c"/proc/self/maps")?;
    let mut parser = Parser::new(addr);
    let mut buf = [0u8; BUF];
    let found = loop {
        let Some(n) = sys::read(fd, &mut buf) else {
            break None;
        };
        if n == 0 {
            break parser.finish();
        }
        if let Some(result) = parser.feed(&buf[..n]) {
            break result;
        }
    };
    sys::close(fd);
    found
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Field {
    Start,
    End,
    Perms(u8),
    Rest,
}

/// Reads `start-end perms ...` lines; everything after the permissions is skipped unread.
struct Parser {
    target: u64,
    field: Field,
    line: Mapping,
    /// The line's last bytes, to recognise its name without keeping the line.
    tail: [u8; 8],
}

impl Parser {
    fn new(target: u64) -> Parser {
        Parser {
            target,
            field: Field::Start,
            line: Parser::blank(),
            tail: [0; 8],
        }
    }

    fn blank() -> Mapping {
        Mapping {
            start: 0,
            end: 0,
            readable: false,
            writable: false,
            executable: false,
            main_stack: false,
        }
    }

    /// `Some(answer)` once the answer is known: the lines are sorted by address, so a line
    /// starting above the target ends the search.
    fn feed(&mut self, bytes: &[u8]) -> Option<Option<Mapping>> {
        for &b in bytes {
            if b == b'\n' {
                if let Some(answer) = self.end_of_line() {
                    return Some(answer);
                }
                continue;
            }
            match self.field {
                Field::Start => match hex(b) {
                    Some(d) => self.line.start = self.line.start.wrapping_shl(4) | d,
                    None => self.field = Field::End,
                },
                Field::End => match hex(b) {
                    Some(d) => self.line.end = self.line.end.wrapping_shl(4) | d,
                    None => self.field = Field::Perms(0),
                },
                Field::Perms(i) => {
                    match i {
                        0 => self.line.readable = b == b'r',
                        1 => self.line.writable = b == b'w',
                        2 => self.line.executable = b == b'x',
                        _ => {}
                    }
                    self.field = if i >= 3 {
                        Field::Rest
                    } else {
                        Field::Perms(i + 1)
                    };
                }
                Field::Rest => {
                    self.tail.copy_within(1.., 0);
                    self.tail[7] = b;
                }
            }
        }
        None
    }

    fn end_of_line(&mut self) -> Option<Option<Mapping>> {
        let mut line = self.line;
        line.main_stack = self.tail.ends_with(b"[stack]");
        self.line = Parser::blank();
        self.tail = [0; 8];
        let complete = matches!(self.field, Field::Rest | Field::Perms(_));
        self.field = Field::Start;
        if !complete {
            return None;
        }
        if line.start <= self.target && self.target < line.end {
            return Some(Some(line));
        }
        (line.start > self.target).then_some(None)
    }

    /// End of file: a last line without its newline still counts.
    fn finish(&mut self) -> Option<Mapping> {
        if self.field == Field::Start {
            return None;
        }
        self.end_of_line().flatten()
    }
}

#[inline]
fn hex(b: u8) -> Option<u64> {
    match b {
        b'0'..=b'9' => Some((b - b'0') as u64),
        b'a'..=b'f' => Some((b - b'a' + 10) as u64),
        b'A'..=b'F' => Some((b - b'A' + 10) as u64),
        _ => None,
    }
}

/// System calls without libc: libc's wrappers write `errno` (which a program may read right
/// after the `malloc` we are inside) and `open`/`read` are cancellation points (a pending
/// `pthread_cancel` would unwind the program's thread out of the allocator).
pub mod sys {
    use std::ffi::CStr;

    /// # Safety
    /// `nr` and its arguments must form a valid x86-64 Linux system call whose pointer
    /// arguments are valid for what the call does with them.
    #[inline]
    unsafe fn syscall3(nr: i64, a: u64, b: u64, c: u64) -> i64 {
        let ret: i64;
        // SAFETY: the caller upholds the call's contract; `syscall` clobbers rcx and r11 only
        // and does not touch the user stack.
        unsafe {
            std::arch::asm!(
                "syscall",
                inlateout("rax") nr => ret,
                in("rdi") a,
                in("rsi") b,
                in("rdx") c,
                lateout("rcx") _,
                lateout("r11") _,
                options(nostack),
            );
        }
        ret
    }

    pub fn open_readonly(path: &CStr) -> Option<i32> {
        loop {
            // SAFETY: openat with a NUL-terminated path; the kernel only reads it.
            let fd = unsafe {
                syscall3(
                    libc::SYS_openat,
                    libc::AT_FDCWD as i64 as u64,
                    path.as_ptr() as u64,
                    (libc::O_RDONLY | libc::O_CLOEXEC) as u64,
                )
            };
            if fd == -(libc::EINTR as i64) {
                continue;
            }
            return (fd >= 0).then_some(fd as i32);
        }
    }

    /// Bytes read into `buf` (0 at end of file), `None` on error.
    pub fn read(fd: i32, buf: &mut [u8]) -> Option<usize> {
        loop {
            // SAFETY: the kernel writes at most buf.len() bytes into buf.
            let n = unsafe {
                syscall3(
                    libc::SYS_read,
                    fd as u64,
                    buf.as_mut_ptr() as u64,
                    buf.len() as u64,
                )
            };
            if n == -(libc::EINTR as i64) {
                continue;
            }
            return (n >= 0).then_some(n as usize);
        }
    }

    pub fn close(fd: i32) {
        // SAFETY: closes a descriptor this module opened and still owns.
        unsafe { syscall3(libc::SYS_close, fd as u64, 0, 0) };
    }

    /// # Safety
    /// `[addr, addr + len)` must be pages the caller may re-protect: no other code may rely on
    /// their protection while it differs.
    pub unsafe fn mprotect(addr: u64, len: u64, prot: i32) -> bool {
        // SAFETY: forwarded from the caller's contract; the kernel validates the range.
        unsafe { syscall3(libc::SYS_mprotect, addr, len, prot as u64) == 0 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str, target: u64, chunk: usize) -> Option<Mapping> {
        let mut p = Parser::new(target);
        for piece in text.as_bytes().chunks(chunk) {
            if let Some(answer) = p.feed(piece) {
                return answer;
            }
        }
        p.finish()
    }

    const MAPS: &str = "\
5555a000-5555b000 r--p 00000000 08:01 123 /usr/bin/prog\n\
7f0000000000-7f0000021000 rw-p 00000000 00:00 0 \n\
7ffd00000000-7ffe10000000 rw-p 00000000 00:00 0                          [stack]\n\
ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0 [vsyscall]";

    #[test]
    fn finds_the_line_in_any_chunking() {
        for chunk in [1, 3, 7, 64, 4096] {
            let m = parse(MAPS, 0x7ffd_0000_1234, chunk).unwrap();
            assert_eq!((m.start, m.end), (0x7ffd_0000_0000, 0x7ffe_1000_0000));
            assert!(m.readable && m.writable && !m.executable && m.main_stack);
            assert!(!parse(MAPS, 0x7f00_0000_0010, chunk).unwrap().main_stack);
            assert_eq!(m.prot(), libc::PROT_READ | libc::PROT_WRITE);
            assert!(
                parse(MAPS, 0x7ffe_1000_0000, chunk).is_none(),
                "end is exclusive"
            );
            assert!(parse(MAPS, 0x1000, chunk).is_none());
            let last = parse(MAPS, 0xffff_ffff_ff60_0010, chunk).unwrap();
            assert!(last.executable && !last.readable);
        }
    }

    #[test]
    fn finds_this_threads_stack_and_code() {
        let local = 0u64;
        let sp = &local as *const u64 as u64;
        let m = mapping_containing(sp).expect("stack mapping");
        assert!(m.start <= sp && sp < m.end && m.readable && m.writable);
        let code = finds_this_threads_stack_and_code as *const () as u64;
        assert!(mapping_containing(code).unwrap().executable);
        let t = std::thread::spawn(|| {
            let local = 0u64;
            let sp = &local as *const u64 as u64;
            mapping_containing(sp).map(|m| m.start <= sp && sp < m.end)
        });
        assert_eq!(t.join().unwrap(), Some(true));
    }
}
