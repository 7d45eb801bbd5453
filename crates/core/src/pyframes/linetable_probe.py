# Run by the linetable tests under every pyenv CPython 3.9-3.13. Compiles a varied corpus and
# prints, per code object, its line table and the line CPython itself gives every instruction
# byte offset. Output, one record per line:
#   V <major> <minor>
#   C <co_name> <co_firstlineno> <table as hex, or - when empty>
#   L <line for offset 0> <line for offset 2> ...   (- where CPython reports no line)
# Must stay valid 3.9 syntax: newer constructs live in the compiled strings only.
import sys

BASE = '''
import functools

def deco(f):
    return f

@deco
@functools.lru_cache(maxsize=None)
def decorated(a, b):
    return (a +
            b)

def loops(n):
    total = 0
    for i in range(n):

        if i % 2:
            continue
        while total < i:
            total += 1
            if total > 100:
                break


    else:
        total -= 1
    return total

def multiline(x):
    y = foo(
        x,
        x + 1,
        [
            x * 2,
            x * 3,
        ],
    )
    return (y
            if x
            else
            -y)

def handlers(x):
    try:
        x = 1 / x
    except ZeroDivisionError as e:
        x = 0
    except (TypeError, ValueError):
        raise
    else:
        x += 1
    finally:
        x -= 1
    with open(x) as f, open(x) as g:
        pass
    try:
        return x
    finally:
        print(x)

def comps(xs):
    a = [x for x in xs if x]
    b = {x: y
         for x in xs
         for y in xs}
    c = (x for x in xs)
    d = lambda q: q + 1
    e = {x
         for x in xs}
    return a, b, c, d, e

class K:
    attr = 1

    def method(self):
        return self.attr

    @property
    def prop(self):
        def inner():
            nonlocal self
            return self
        return inner

async def coro(x):
    async with x as y:
        await y
    async for z in x:
        yield z

def gen(n):
    yield from range(n)
    x = yield
    return x

only_line = lambda: 0
'''

MATCH = '''
def matcher(v):
    match v:
        case [a, b]:
            return a
        case {"k": c}:
            return c
        case int() | float() if v > 0:
            return v
        case _:
            return None
'''


def source():
    parts = [BASE]
    # Forward line jumps past one table entry's reach (> 127) and past two varint bytes.
    parts.append(
        "def gaps(a):\n    a = 1\n" + "\n" * 200 + "    a = 2\n" + "\n" * 5000 + "    return a\n"
    )
    # The call instruction goes back to the line the call opens on: a large negative jump.
    names = ["a%d" % i for i in range(150)]
    parts.append(
        "def spread(f, "
        + ", ".join(names)
        + "):\n    return f(\n"
        + "".join("        %s,\n" % n for n in names)
        + "    )\n"
    )
    # The jump back to the loop test crosses the whole body.
    parts.append(
        "def long_loop(n):\n    while n < 10**6:\n"
        + "".join("        n += %d\n" % i for i in range(140))
        + "    return n\n"
    )
    # A function of over 300 lines with nested blocks and blank lines.
    lines = ["def huge(x):"]
    for i in range(320):
        if i % 40 == 0:
            lines.append("    if x > %d:" % i)
            lines.append("        x -= %d" % i)
        elif i % 15 == 0:
            lines.append("")
        else:
            lines.append("    x = x * %d + %d" % (i, i))
    lines.append("    return x")
    parts.append("\n".join(lines) + "\n")
    # One line of more than 255 bytes of bytecode: address deltas must split.
    parts.append("def wide(f, a):\n    return f(" + ", ".join(["a"] * 200) + ")\n")
    if sys.version_info >= (3, 10):
        parts.append(MATCH)
    return "".join(parts)


def walk(co):
    yield co
    for c in co.co_consts:
        if isinstance(c, type(co)):
            for inner in walk(c):
                yield inner


def expected(co):
    n = len(co.co_code) // 2
    lines = [None] * n
    if sys.version_info >= (3, 10):
        for start, end, line in co.co_lines():
            for off in range(start, end, 2):
                if 0 <= off // 2 < n:
                    lines[off // 2] = line
    else:
        import dis

        # An offset takes the line of the last line start at or before it.
        starts = list(dis.findlinestarts(co))
        cur = None
        j = 0
        for i in range(n):
            while j < len(starts) and starts[j][0] <= 2 * i:
                cur = starts[j][1]
                j += 1
            lines[i] = cur
    return lines


def main():
    print("V %d %d" % sys.version_info[:2])
    for co in walk(compile(source(), "<probe>", "exec")):
        table = co.co_lnotab if sys.version_info < (3, 10) else co.co_linetable
        print("C %s %d %s" % (co.co_name, co.co_firstlineno, table.hex() or "-"))
        print("L " + " ".join("-" if x is None else str(x) for x in expected(co)))


main()
