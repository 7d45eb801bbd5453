"""Allocations labelled with msmemscope.describe in all four forms, for the decompose tests.
Prints ``KNOWN label ptr nbytes`` for each tensor and ``REFUSED kind message`` for each misuse."""

import torch

import msmemscope.describe as describe


def known(label, t):
    st = t.untyped_storage()
    print(f"KNOWN {label} {st.data_ptr()} {st.nbytes()}")


@describe.describer(owner="deco")
def decorated():
    return torch.ones(10)


known("decorated", decorated())  # 40 bytes

with describe.describer(owner="ctx"):
    t_ctx = torch.ones(20)  # 80 bytes
    with describe.describer(owner="inner"):
        t_nested = torch.ones(30)  # 120 bytes
known("ctx", t_ctx)
known("nested", t_nested)

describe.describer(owner="expl").__enter__()
t_explicit = torch.ones(40)  # 160 bytes
describe.describer(owner="expl").__exit__()
known("explicit", t_explicit)

t_tagged = torch.ones(50)  # 200 bytes
describe.describer(t_tagged, owner="tagged")
known("tagged", t_tagged)

t_plain = torch.ones(60)  # 240 bytes
known("plain", t_plain)


def refused(kind, call):
    try:
        call()
    except (ValueError, TypeError) as exc:
        print(f"REFUSED {kind} {type(exc).__name__}: {exc}")
    else:
        print(f"ACCEPTED {kind}")


with describe.describer(owner="a"), describe.describer(owner="b"), describe.describer(owner="c"):
    with describe.describer(owner="a"):  # the same label again is not a fourth
        t_repeat = torch.ones(70)  # 280 bytes
    refused("fourth", lambda: describe.describer(owner="d").__enter__())
known("repeat", t_repeat)
refused("long", lambda: describe.describer(owner="x" * 129))
refused("type", lambda: describe.describer(owner=3))
refused("at", lambda: describe.describer(owner="a@b"))
refused("not_tensor", lambda: describe.describer([1, 2], owner="x"))
refused("exit_unknown", lambda: describe.describer(owner="never").__exit__())
t_after = torch.ones(80)  # 320 bytes: no label is left active
known("after", t_after)
