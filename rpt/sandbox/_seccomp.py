"""A seccomp filter for the sandbox (given to bubblewrap with ``--seccomp FD``): refuse, with
``EPERM``, the system calls that make shared memory outside every size cap.

Files a sandboxed program writes land in size-capped tmpfs mounts, and its mappings count
against its address-space limit, but two kinds of shared memory escape both: a ``memfd_create``
file written with ``write`` (never mapped; only the per-file size limit applies, times the number
of open files) and System V segments (``shmget``; they outlive ``shmdt``, so a program can fill,
detach and repeat). Both show up as host ``Shmem``. Python programs do not need either.

Classic BPF, built by hand (a dependency such as libseccomp's bindings is not on PyPI as a
wheel): load the architecture; anything but the native one (32-bit compatibility calls on
x86-64, where the numbers differ) is refused; the x32 ABI (numbers with bit 30 set) too; then the
listed numbers are refused and everything else allowed.
"""

from __future__ import annotations

import errno
import platform
import struct

_LD_ABS_W = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_RET = 0x06  # BPF_RET | BPF_K
_ALLOW = 0x7FFF0000  # SECCOMP_RET_ALLOW
_DENY = 0x00050000 | errno.EPERM  # SECCOMP_RET_ERRNO | EPERM
_X32 = 0x40000000  # __X32_SYSCALL_BIT

# machine -> (AUDIT_ARCH_*, {name: number}) from the kernel's syscall tables
ARCHES = {
    "x86_64": (0xC000003E, {"shmget": 29, "memfd_create": 319, "memfd_secret": 447}),
    "aarch64": (0xC00000B7, {"shmget": 194, "memfd_create": 279, "memfd_secret": 447}),
}


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def deny_filter(machine: str | None = None) -> bytes | None:
    """The filter program (``struct sock_filter[]`` bytes), or None for an architecture this
    module has no table for (the caller then runs without it)."""
    machine = machine or platform.machine()
    if machine not in ARCHES:
        return None
    arch, numbers = ARCHES[machine]
    calls = sorted(numbers.values())
    ops = [_op(_LD_ABS_W, 4),  # seccomp_data.arch
           _op(_JEQ, arch, jt=1),  # native: skip the refusal below
           _op(_RET, _DENY),
           _op(_LD_ABS_W, 0)]  # seccomp_data.nr
    tail = len(calls) + 1  # instructions between a check and the final "refuse"
    if machine == "x86_64":
        ops.append(_op(_JGE, _X32, jt=tail))  # x32: refused
    for i, nr in enumerate(calls):
        ops.append(_op(_JEQ, nr, jt=len(calls) - i))  # jump over the rest and "allow"
    ops += [_op(_RET, _ALLOW), _op(_RET, _DENY)]
    return b"".join(ops)
