"""The zygote: the process every job is forked from, and the job child's own code (reply included).

The fork server (:mod:`populora_env.sandbox._worker`) confines itself with ``ctypes`` (prctl, mount, seccomp). A
process that has imported ``_ctypes`` keeps its classes for good (``object.__subclasses__()`` lists them), and any
of them reads and writes raw memory: a job forked from such a process could rewrite the reply its harness is
about to send. So jobs are not forked from the fork server but from this zygote: a fresh interpreter the fork
server executes once per worker (``python -S -s -c <this source> <config json>``), after it has put the zygote
under the job's seccomp filter, Landlock ruleset and capabilities. The zygote never imports ``ctypes``, and the
job child refuses to (audit hook), so a job's process holds no way to native code but a bug of CPython itself.

Threat model (``docs/sandbox.md`` section 7): once the job's code has started, the job controls every object of its
process that Python can reach, **builtin types' dictionaries included** (comparing ``T.__dict__``, a mappingproxy,
with an object of the job's hands that object the real, writable dict; a descriptor written there runs the job's
code wherever CPython looks the attribute up). So nothing the verdict depends on may be looked up after the job
started. Rules this file keeps:

* **Standard library only, and no classes.** ``object.__subclasses__()`` reaches every live class, and through
  a method's ``__globals__`` the module that defined it; a function is reachable only through a frame or the
  garbage collector, both refused to jobs (:func:`_audit`). So job code cannot reach any function here, nor the
  objects they keep as default arguments (the marks of :data:`_MARKS`, the snapshot of :data:`_TYPES`).
* **After the job's code started, the harness reads only its own locals** (:data:`POST_CALL`): every builtin,
  method, getter and constant it uses was bound before, as a default argument bound when the zygote started, or
  passed from :func:`_setup`; no attribute, global or method is looked up, so no type dictionary, module or
  builtin the job rebound is consulted. What it does with them are calls of those bound objects (C functions
  and method descriptors: ``tp_call``, never the type's dict) and operations on exact builtin values whose
  slots are C functions (a write to a type's dict does not change its slots).
  ``tests/sandbox/test_verdicts.py`` disassembles these functions and fails on any lookup.
* **Job code runs after the call only where its text is its own word**, after the status, the value's text, the
  randomness check and the seal's inputs are fixed: a value's own ``__repr__`` (not plain data: a claim),
  flushing its output, and the text of its exception (CPython's own printer, :func:`_error_text`). Frames are
  refused to every thread at all times; nothing it does then can change a local of the harness.
* **The reply is sealed with a per-job secret** (``token``: 16 random bytes from the fork server, kept only in
  the locals of the frames that run the job): it starts with HMAC-SHA256(token, frame). The fork server accepts
  no other reply, so a job that writes its own "reply" to the reply pipe (it holds the descriptor) writes one
  that is refused, and bytes a thread of the job slips into the harness's reply break the seal. Frames, the
  garbage collector's object walks, ``/proc/self/mem`` (Landlock), trace and profile functions, Python signal
  handlers (seccomp: ``rt_sigaction`` is refused to jobs) and ``ctypes`` are the ways to a local; each is refused.
* **The value is checked and printed by the harness after the call has returned, from copies**: the garbage
  collector stopped, no other thread counted alive. :func:`_plain_repr` copies each container as it reaches it
  (one call into C), checks that every item is of an exact builtin type (``type(x) is int`` with the real
  ``type``) and takes its C ``repr``: a thread the count missed (one started as the call returned) may still
  change the value, never put anything but exact builtin values in the text.
* **Tampering is recorded where the job cannot clear it** (``docs/sandbox.md`` section 7.2): each refusal of the
  audit hook sets its class in :data:`_MARKS` (read into the sealed reply) and at once tells the fork server, by a
  system call the seccomp filter hands to it (``kill(-(_MARK_BASE + class), 0)``), before the refused operation
  returns to the job; the type dictionaries are compared with their start-up snapshot before the reply.
* **Randomness is recorded too**: the harness seeds the interpreter's global generator (``random``) with a seed
  of the fork server and draws its first 64 bits; after the call it draws again: a different draw means the job
  moved the generator (``entropy`` in the reply). Reads of the OS's entropy are the fork server's to see; reads
  of the clock through ``time`` and ``datetime`` go through wrappers that tell it (:func:`_wrap_clocks`).

:func:`_job` is split at the process boundary's own seams (set-up, the call, the reply); each helper takes what
it needs as arguments or default arguments, never from a global.
"""

from __future__ import annotations

import _random
import _sha256
import _thread
import functools
import gc
import io
import json
import operator
import os
import resource
import socket
import sys
import types

_ZSOCK_FD = 3  # the zygote's end of the fork server's socket (SOCK_SEQPACKET: one message per send)
_REQ_FD = 4  # the fork server's request pipe: each job child reads its own job frame from it
_REPLY_FD = 3  # in the job child: the write end of its reply pipe
_MAX_ERROR_CHARS = 4000
_PLAIN_LIMIT = 200_000  # exact-type checks of a value's items: more (or a cycle) is not plain data
# Reply status codes (the host maps them back to names).
_OK, _ERROR, _MEMORY, _OUTPUT, _NOT_PLAIN, _SETUP = 0, 1, 2, 3, 4, 5
_NO_REPLY = 75  # the harness could not write its reply (exit status; the job's own exits are "exit" tampering)
#: Tampering classes, by code (index + 1): the host and the fork server use the same table.
TAMPER_CLASSES = ("introspection", "native", "type_dict", "signal", "process", "reply_forgery", "exit")
_INTROSPECTION, _NATIVE, _TYPE_DICT = 1, 2, 3
#: ``kill(-(_MARK_BASE + class), 0)``: a mark the fork server records (no such process group exists); class 0 is
#: not tampering but a read of the clock (the run is not a function of its input).
_MARK_BASE = 1 << 30
# Modules a job may not import: native memory access (ctypes), C-level test hooks, subinterpreters (a new
# interpreter has no audit hook).
_REFUSED_MODULES = frozenset({"ctypes", "_ctypes", "_testcapi", "_testinternalcapi", "_testbuffer",
                              "_testmultiphase", "_testimportmultiple", "_testclinic", "_xxsubinterpreters",
                              "_xxinterpchannels", "_xxtestfuzz", "_ctypes_test"})
# Modules libraries import on the off chance (numpy's ``try: import ctypes``): refused, but marked only when no
# other module is being imported at the time (see :func:`_importing`).
_TRIED_BY_LIBRARIES = frozenset({"ctypes", "_ctypes"})
_FRAME_ATTRS = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame"})
# Refused audit events: (tampering class, the exception the job gets, its message).
_REFUSED_EVENTS = {
    "sys._getframe": (_INTROSPECTION, ValueError, "frame access is refused in the sandbox"),
    **{e: (_INTROSPECTION, RuntimeError, e + " is refused in the sandbox") for e in (
        "sys._current_frames", "sys._current_exceptions", "gc.get_objects", "gc.get_referrers",
        "gc.get_referents", "sys.settrace", "sys.setprofile", "sys.addaudithook", "sys._getframemodulename",
        # Python 3.12+: a monitoring callback would run job code in the harness's thread
        "sys.monitoring.register_callback")},
    "code.__new__": (_NATIVE, RuntimeError, "code.__new__ is refused in the sandbox"),
    # ImportError: what the import system takes as "compile the source instead"
    "marshal.loads": (_NATIVE, ImportError, "marshal is refused in the sandbox"),
    "marshal.load": (_NATIVE, ImportError, "marshal is refused in the sandbox"),
}
_NONE_TYPE = type(None)
#: Which tampering classes the job tripped (index: class code), set by :func:`_mark`, read by :func:`_finish`.
_MARKS = bytearray(len(TAMPER_CLASSES) + 1)
#: [imports of ctypes allowed] (``Sandbox(_native_jobs=True)``: tests of the kernel layers only).
_NATIVE_JOBS = [False]
#: (the real dict, its length, its values) of the watched types when the zygote started (:func:`main`).
_TYPES: list = []
#: Non-empty once the job read the clock through a wrapper of :func:`_wrap_clocks` (which the job can reach: it
#: may empty it, not the fork server's record).
_CLOCK_SEEN: list = []
# The clock wrappers, compiled in a namespace of their own: a job reaches them (``time.time``), and through their
# ``__globals__`` only what is here, never this module.
_CLOCK_WRAPPER = """
def wrap(real, optional=None, method=False):
    def clock(*args, **kwargs):
        at = optional if optional is None or not method else optional + 1
        if at is None or len(args) <= at and not kwargs or len(args) > at and args[at] is None:
            if not seen:
                seen.append(1)
                try:
                    kill(mark, 0)
                except BaseException:
                    pass
        if method:
            return real.__get__(None, args[0])(*args[1:], **kwargs)
        return real(*args, **kwargs)
    clock.__name__ = clock.__qualname__ = getattr(real, "__name__", "clock")
    clock.__doc__ = getattr(real, "__doc__", None)
    return clock
"""
_XOR36 = bytes(b ^ 0x36 for b in range(256))  # HMAC's inner and outer pads, as translation tables
_XOR5C = bytes(b ^ 0x5C for b in range(256))
_DIGEST = type(_sha256.sha256()).digest  # the hash object's method, bound before any job exists
_CODES = tuple(range(1, len(TAMPER_CLASSES) + 1))


def _mark(code, _marks=_MARKS, _kill=os.kill, _base=_MARK_BASE, _BaseExc=BaseException) -> None:
    """Record tampering class ``code``: in :data:`_MARKS` (for the reply) and, the first time, with the fork
    server (a ``kill`` its seccomp filter hands to it, answered before this returns; no signal is sent)."""
    if not _marks[code]:
        _marks[code] = 1
        try:
            _kill(-(_base + code), 0)
        except _BaseExc:
            pass


def _importing(modules=sys.modules, values=dict.values, tuple=tuple, getattr=getattr) -> bool:  # noqa: A002
    """Whether a module is being imported now (its spec ``_initializing``): an import of ``ctypes`` then comes
    from a library's own ``try: import ctypes`` (numpy's), not from the job's code. It reads the modules' own
    attributes (the job may fake them: that only hides its mark; the import is refused either way)."""
    for module in tuple(values(modules)):
        if getattr(getattr(module, "__spec__", None), "_initializing", False) is True:
            return True
    return False


def _audit(event, args, _frames=_FRAME_ATTRS, _refused=_REFUSED_EVENTS, _mods=_REFUSED_MODULES,
           _tried=_TRIED_BY_LIBRARIES, _importing=_importing, _native=_NATIVE_JOBS, _mark=_mark, _get=dict.get,
           _partition=str.partition, _str=str, _type=type,
           _INTROSPECTION=_INTROSPECTION, _NATIVE=_NATIVE, _AttributeError=AttributeError,
           _ImportError=ImportError, _RuntimeError=RuntimeError) -> None:
    """The job child's audit hook (PEP 578: once added, it cannot be removed): refuses the introspection and
    native routes to the harness's locals, and marks each refusal (:func:`_mark`) before the job sees it.
    ``sys._getframe`` raises ``ValueError`` (what the standard library's callers already catch), frame attributes
    ``AttributeError``, imports and ``marshal`` ``ImportError`` (which the import system also takes as "compile
    the source instead of loading its bytecode": ``marshal.loads`` builds code objects, so crafted bytecode, from
    data); the rest ``RuntimeError`` (for ``sys.addaudithook`` CPython then skips the new hook silently).

    It looks nothing up (a job may rewrite ``str.partition`` in the type's own dict: the ``import`` check would
    then run the job's code, and let ``ctypes`` in)."""
    if event == "object.__getattr__":
        if args[1] in _frames:
            _mark(_INTROSPECTION)
            raise _AttributeError("frame access is refused in the sandbox")
        return
    refused = _get(_refused, event)
    if refused is not None:
        _mark(refused[0])
        raise refused[1](refused[2])
    if event == "import":
        name = args[0]
        if _type(name) is _str and _partition(name, ".")[0] in _mods and not _native[0]:
            if not (_partition(name, ".")[0] in _tried and _importing()):
                _mark(_NATIVE)
            raise _ImportError("import of " + name + " is refused in the sandbox")
        return
    if event == "object.__setattr__" and args[1] == "__code__":
        _mark(_NATIVE)
        raise _RuntimeError("setting __code__ is refused in the sandbox")


def _short(text, limit=_MAX_ERROR_CHARS, len=len, str=str) -> str:  # noqa: A002 - bound names
    if len(text) <= limit:
        return text
    return text[: limit // 2] + "... [" + str(len(text) - limit) + " chars cut] ..." + text[-limit // 2:]


def _error_text(exc, stage, sysdict=sys.__dict__, excepthook=sys.__excepthook__, StringIO=io.StringIO,
                getvalue=io.StringIO.getvalue, traceback_of=BaseException.__traceback__.__get__, type=type,  # noqa: A002
                str=str, BaseException=BaseException) -> str:  # noqa: A002
    """``Type: message`` of a job's exception (a SyntaxError's location lines after it), then the job's own
    frames (file ``<job>``/``<call>``, line, function): the job's own word, made after everything the verdict
    depends on is fixed.

    The text is CPython's own (``sys.__excepthook__``, written into a buffer put in place of ``sys.stderr``): its
    traceback printer reads the frames in C, so no frame object is ever handed to Python code, and frames stay
    refused to every thread. The exception's ``__str__``, ``__notes__`` and the buffer's ``write`` may run the
    job's code (they are looked up as usual): that code may write the text, nothing else the reply holds.
    """
    try:
        buf = StringIO()
        old = sysdict.get("stderr")
        sysdict["stderr"] = buf
        try:
            excepthook(type(exc), exc, traceback_of(exc))
        finally:
            sysdict["stderr"] = old
        text = _job_frames_first(getvalue(buf))
    except BaseException:
        text = "an exception that cannot be printed"
    if type(text) is not str:
        text = "an exception that cannot be printed"
    if stage != "code":
        text = "[during " + stage + "] " + text
    return _short(text)


def _job_frames_first(printed: str) -> str:
    """CPython's printed exception (its last chained block) as ``Type: message`` lines, then up to five of the
    job's own frames (``<job>``/``<call>``); the harness's and library frames, with their source lines, are left
    out."""
    block = printed.rstrip().split("\nDuring handling of the above exception, another exception occurred:\n")[-1]
    block = block.split("\nThe above exception was the direct cause of the following exception:\n")[-1]
    frames: list[str] = []
    only: list[str] = []
    skipping = False
    for line in block.splitlines():
        if not line.strip() or line.startswith("Traceback (most recent call last):"):
            continue
        if line.startswith('  File "') and ", in " in line:
            skipping = not line.startswith(('  File "<job>"', '  File "<call>"'))
            if not skipping:
                frames.append(line)
            continue
        if skipping and line.startswith("    "):
            continue  # a library frame's source and caret lines
        skipping = False
        only.append(line)
    text = "\n".join([only[-1], *only[:-1]]) if only else "an exception that cannot be printed"
    if frames:
        text += "\nTraceback (most recent call last, job frames only):\n" + "\n".join(frames[-5:])
    return text


def _plain_repr(value, limit: int, cap: int, depth_limit: int, type=type, repr=repr,  # noqa: A002
                tuple=tuple, len=len, range=range, items=dict.items, join="".join, pop=list.pop,  # noqa: A002
                append=list.append, t_int=int, t_str=str, t_float=float, t_bool=bool, t_none=_NONE_TYPE,
                t_bytes=bytes, t_complex=complex, t_list=list, t_tuple=tuple, t_set=set, t_frozenset=frozenset,
                t_dict=dict):
    """The ``repr`` of ``value`` if it is plain data, made so that nothing but exact builtin values can be in it.

    Returns ``(text, None)`` for plain data (built only from exact builtin types: ``type(x) is int`` ..., no
    subclass); ``(None, None)`` for plain data whose ``repr`` is longer than ``cap``; ``(None, why)`` otherwise,
    ``why`` being the first offending type, or a reason (more than ``limit`` items, a cycle, or nesting deeper
    than ``depth_limit``, where the builtin ``repr`` would raise ``RecursionError``). The text is the builtin
    ``repr``'s, character for character (``tests/sandbox/test_plain_repr.py`` checks it against ``repr``).

    The value is never read twice: each container is copied when it is reached (``tuple(x)``, one call into C,
    during which no other thread runs and no job code is called), each leaf's exact type is checked and its C
    ``repr`` taken from that copy, and the text is made of these pieces only. Another thread can still change the
    value meanwhile; it cannot put anything in the text but the ``repr`` of exact builtin values. Every name is
    bound when the zygote starts (defaults), list methods included: nothing here is looked up.
    """
    parts: list = []
    size = count = 0
    todo = [(value, 0)]  # (a value to print, its depth) or (a piece of text, -1)
    while todo:
        item, depth = pop(todo)
        if depth < 0:
            if size <= cap:
                append(parts, item)
                size += len(item)
            continue
        count += 1
        if count > limit:
            return None, "value too large or cyclic"
        k = type(item)
        if k is t_int or k is t_str or k is t_float or k is t_bool or k is t_none or k is t_bytes \
                or k is t_complex:
            if size <= cap:
                text = repr(item)
                append(parts, text)
                size += len(text)
            continue
        if k is t_dict:
            pairs = tuple(items(item))
            if depth >= depth_limit:
                return None, "value nested too deeply or cyclic"
            append(todo, ("}", -1))
            for i in range(len(pairs) - 1, -1, -1):
                append(todo, (pairs[i][1], depth + 1))
                append(todo, (": ", -1))
                append(todo, (pairs[i][0], depth + 1))
                if i:
                    append(todo, (", ", -1))
            append(todo, ("{", -1))
            continue
        if k is t_list:
            copy, opening, closing = tuple(item), "[", "]"
        elif k is t_tuple:
            copy, opening, closing = item, "(", ",)" if len(item) == 1 else ")"
        elif k is t_set or k is t_frozenset:
            copy = tuple(item)
            if not copy:
                append(todo, ("set()" if k is t_set else "frozenset()", -1))
                continue
            opening, closing = ("{", "}") if k is t_set else ("frozenset({", "})")
        else:
            return None, k
        if depth >= depth_limit:
            return None, "value nested too deeply or cyclic"
        append(todo, (closing, -1))
        for i in range(len(copy) - 1, -1, -1):
            append(todo, (copy[i], depth + 1))
            if i:
                append(todo, (", ", -1))
        append(todo, (opening, -1))
    if size > cap:
        return None, None
    return join(parts), None


def _types_changed(types=_TYPES, len=len, all=all, map=map, is_=operator.is_, values=dict.values) -> bool:  # noqa: A002
    """Whether a watched builtin type's dictionary (:data:`WATCHED_TYPES`) differs from its start-up snapshot:
    another length, or another object for any entry (compared by identity: nothing of the job's is called)."""
    for entry in types:
        d, n, snap = entry
        if len(d) != n or not all(map(is_, values(d), snap)):
            return True
    return False


def _rng_drawn(inst, first, bits=_random.Random.getrandbits, BaseException=BaseException) -> bool:  # noqa: A002
    """Whether the global generator ``inst`` moved since the harness seeded it: its next 64 bits are not
    ``first``, the draw the harness made from the same seed (a generator it cannot read is taken as moved)."""
    if inst is None:
        return False
    try:
        return bits(inst, 64) != first
    except BaseException:
        return True


def _send(token, status, plain, marks, drawn, text, note, encode=str.encode, to_bytes=int.to_bytes,
          t_bytes=bytes, join=b"".join, len=len, translate=bytes.translate, sha256=_sha256.sha256,  # noqa: A002
          digest=_DIGEST, write=os.write, mview=memoryview, exit_=os._exit,
          xor36=_XOR36, xor5c=_XOR5C, fd=_REPLY_FD, NO_REPLY=_NO_REPLY,
          BaseException=BaseException) -> None:  # noqa: A002
    """Write the sealed reply and exit: ``HMAC-SHA256(token, frame) + frame``, the frame being a 4-byte length,
    then status, plain flag, tampering marks (a bit per class code), entropy flag (one byte each), the value's
    text and the note (4-byte length and UTF-8 each). An exit without a reply is status ``_NO_REPLY``."""
    try:
        value_bytes = b"" if text is None else encode(text, "utf-8", "surrogatepass")
        note_bytes = b"" if note is None else encode(note, "utf-8", "surrogatepass")
        body = join([t_bytes([status, plain, marks, drawn]), to_bytes(len(value_bytes), 4, "big"), value_bytes,
                     to_bytes(len(note_bytes), 4, "big"), note_bytes])
        frame = join([to_bytes(len(body), 4, "big"), body])
        key = join([token, t_bytes(64 - len(token))])
        inner = digest(sha256(join([translate(key, xor36), frame])))
        view = mview(join([digest(sha256(join([translate(key, xor5c), inner]))), frame]))
        while view:
            view = view[write(fd, view):]
    except BaseException:
        exit_(NO_REPLY)
    exit_(0)


def _lifeline(fd: int, started, read=os.read, exit_=os._exit,
              release=_thread.LockType.release) -> None:  # pragma: no cover - a job child's thread
    """Plain mode (no pid namespace): end the job child when its zygote dies. The zygote holds the only write end
    of this pipe, so the read returns (end of file) exactly then; closing or replacing the descriptor does not
    wake a read already waiting on it. ``started`` is released once this thread runs (and so is counted)."""
    release(started)
    try:
        read(fd, 1)
    finally:
        exit_(137)


def _read_exact(fd: int, need: int) -> bytes | None:
    """``need`` bytes from ``fd`` (read at most 1 MiB at a time), or ``None`` at EOF. (The fork server has its
    own copy: this file may not import ``_worker.py``, which imports ``ctypes``.)"""
    chunks = []
    while need:
        chunk = os.read(fd, min(need, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        need -= len(chunk)
    return b"".join(chunks)


def _read_frame(fd: int) -> object:
    """One frame (4-byte big-endian length, UTF-8 JSON) from ``fd``; ``None`` at EOF."""
    head = _read_exact(fd, 4)
    body = None if head is None else _read_exact(fd, int.from_bytes(head, "big"))
    return None if body is None else json.loads(body.decode("utf-8", "surrogatepass"))


def _confine(req: dict, w_rep: int, w_out: int) -> dict:
    """The job child's set-up before any job text: standard streams, the reply pipe on fd 3, its own job frame,
    every other descriptor closed, the job's uid, its area as cwd, the lifeline (plain mode), rlimits."""
    devnull = os.open("/dev/null", os.O_RDWR | os.O_CLOEXEC)
    os.dup2(devnull, 0)
    os.dup2(w_out, 1)
    os.dup2(devnull, 2)
    os.dup2(w_rep, _REPLY_FD)  # over the zygote's socket (fd 3), which the child must not keep
    job = _read_frame(_REQ_FD)  # fd 4 (the request pipe) is still open: _REPLY_FD is 3
    if not isinstance(job, dict) or not isinstance(job.get("code"), str):
        raise RuntimeError("no job frame")
    lifeline = req.get("lifeline")
    low = _REPLY_FD + 1  # close the request pipe, the originals of the pipes, the rest, but the runtime's
    for fd in sorted({int(k) for k in req.get("keep_fds", ())} | ({lifeline[0]} if lifeline else set())):
        os.closerange(low, fd)  # O_PATH directories (plain root mode) and the lifeline's read end
        low = fd + 1
    os.closerange(low, 1 << 16)
    if req.get("uid") is not None:  # a root zygote: real, effective and saved ids all the job's
        os.setgroups([])
        os.setgid(int(req["gid"]))
        os.setuid(int(req["uid"]))
    os.chdir(req["jobdir"])
    if lifeline:  # no pid namespace: nothing else would end this child if its zygote died (started after
        started = _thread.allocate_lock()  # the uid switch: glibc signals other threads for it)
        started.acquire()
        _thread.start_new_thread(_lifeline, (lifeline[0], started))
        started.acquire()  # it runs: the interpreter counts it (the count the reply checks)
    for res, value in ((resource.RLIMIT_AS, req["as_bytes"]), (resource.RLIMIT_CPU, req["cpu"]),
                       (resource.RLIMIT_NPROC, req["nproc"]), (resource.RLIMIT_FSIZE, req["fsize"]),
                       (resource.RLIMIT_NOFILE, req["nofile"]), (resource.RLIMIT_CORE, [0, 0])):
        resource.setrlimit(res, (int(value[0]), int(value[1])))
    return job


def _seed_randomness(seed: int) -> tuple:
    """Seed the global generators with the fork server's ``seed`` (no read of the OS's entropy, which the fork
    server counts as the job's); return the ``random`` generator and the first 64 bits it will draw."""
    np_random = sys.modules.get("numpy.random")
    if np_random is not None:
        try:
            np_random.seed(seed & 0xFFFFFFFF)
        except Exception:
            pass
    inst = getattr(sys.modules.get("random"), "_inst", None)
    if not isinstance(inst, _random.Random):
        return None, 0
    _random.Random.seed(inst, seed)
    first = _random.Random.getrandbits(inst, 64)
    _random.Random.seed(inst, seed)  # the job sees the generator as the seed left it
    inst.gauss_next = None
    return inst, first


def _setup(req: dict, w_rep: int, w_out: int, token: bytes) -> tuple:  # pragma: no cover - in the job child
    """Set the job child up (:func:`_confine`, fresh randomness, a fresh ``__main__``, the audit hook) and return
    what the call and the reply need; a failure in any step answers "sandbox setup failed" (with the token: the
    harness's answer) and the job never runs."""
    step = "set-up"
    try:
        job = _confine(req, w_rep, w_out)
        step = "preparing the interpreter"
        inst, first = _seed_randomness(int(req["seed"], 16))
        sys.argv = ["<job>"]
        main = type(sys)("__main__")
        main.__dict__.update({"__builtins__": sys.modules["builtins"], "__doc__": None, "__package__": None,
                              "__spec__": None, "__loader__": None})
        sys.modules["__main__"] = main
        _NATIVE_JOBS[0] = bool(req.get("native"))  # tests of the kernel layers only (Sandbox(_native_jobs=True))
        context = (token, int(req["max_output_chars"]), job.get("plain") is True, 1 if req.get("lifeline") else 0,
                   inst, first)
        step = "installing the audit hook"
        sys.addaudithook(_audit)
    except BaseException as exc:  # never run the job half set up
        os.dup2(w_rep, _REPLY_FD)
        _send(token, _SETUP, 0, 0, 0, None, f"sandbox setup failed ({step}): {type(exc).__name__}: {exc}")
    return job["code"], job.get("call"), main.__dict__, context


def _run(source, call_source, ns, compile_=compile, exec_=exec, eval_=eval, OK=_OK, ERROR=_ERROR,
         MEMORY=_MEMORY, MemoryError=MemoryError, BaseException=BaseException) -> tuple:  # noqa: A002
    """The job: its code, then its call. Returns ``(status, exception, stage, has value, value)``."""
    stage = "code"
    try:
        exec_(compile_(source, "<job>", "exec"), ns)
        if call_source is None:
            return OK, None, stage, False, None
        stage = "call"
        return OK, None, stage, True, eval_(compile_(call_source, "<call>", "eval"), ns)
    except MemoryError as exc:
        return MEMORY, exc, stage, False, None
    except BaseException as exc:
        return ERROR, exc, stage, False, None


def _value_reply(result, cap, need_plain, own_threads, threads=_thread._count, depth_limit=sys.getrecursionlimit,
                 plain_repr=_plain_repr, repr=repr, type=type, len=len, str=str,  # noqa: A002
                 type_name=type.__dict__["__name__"].__get__, plain_limit=_PLAIN_LIMIT, OK=_OK, ERROR=_ERROR,
                 OUTPUT=_OUTPUT, NOT_PLAIN=_NOT_PLAIN) -> tuple:
    """``(status, text, plain, note)`` for a call's value: plain data printed by :func:`_plain_repr` with no
    other thread alive; else for a ``plain`` job an error naming why; else the value's own ``repr`` (job code:
    a claim, ``plain`` 0)."""
    alone = threads() == own_threads  # no other thread runs job code or can start one (a thread started as the
    # call returned and not counted yet may still: _plain_repr is made for that)
    text, kind = plain_repr(result, plain_limit, cap, depth_limit())
    if kind is None and alone:
        if text is None:
            return OUTPUT, None, 0, f"repr of the value is longer than max_output_chars={cap}"
        return OK, text, 1, None  # exact builtins only, printed from copies by C code
    if need_plain and not alone:
        return ERROR, None, 0, "threads were still running when the call returned"
    if need_plain:
        if type(kind) is str:
            return NOT_PLAIN, None, 0, kind
        name = type_name(kind)  # a class's name (the job's own text), read with type's own getter
        return NOT_PLAIN, None, 0, name if type(name) is str else "?"
    text = repr(result)  # the job's own __repr__ (or a value other threads could change): a claim
    if type(text) is not str:
        return ERROR, None, 0, "__repr__ returned a non-string"
    if len(text) > cap:
        return OUTPUT, None, 0, f"repr of the value is longer than max_output_chars={cap}"
    return OK, text, 0, None


def _finish(outcome, context, gc_disable=gc.disable, hold_gil=sys.setswitchinterval, flush=sys.stdout.flush,
            rng_drawn=_rng_drawn, value_reply=_value_reply, error_text=_error_text, types_changed=_types_changed,
            mark=_mark, send=_send, marks=_MARKS, clock_seen=_CLOCK_SEEN, codes=_CODES, OK=_OK,
            ERROR=_ERROR, MEMORY=_MEMORY, TYPE_DICT=_TYPE_DICT, BaseException=BaseException) -> None:  # noqa: A002
    """The reply (only bound locals from here): randomness, the value's text, then what may run the job's code
    (a claim's ``repr``, the output's flush, the exception's text), the type dictionaries, the seal."""
    status, exc, stage, has_value, result = outcome
    token, cap, need_plain, own_threads, inst, first = context
    text, plain, note = None, 0, None
    try:
        gc_disable()  # from here no collection runs a finalizer (dropping the job's last reference still may)
        hold_gil(1e6)  # other threads rarely get the interpreter from here: only one already waiting for it with a
        # shorter interval does (what the value's text is made of does not depend on it: _plain_repr)
        drawn = 1 if clock_seen or rng_drawn(inst, first) else 0
        if status == OK and has_value:
            status, text, plain, note = value_reply(result, cap, need_plain, own_threads)
    except BaseException as err:  # our own failure (memory, recursion limit the job set): no value
        status, text, plain, exc, stage, drawn = ERROR, None, 0, err, "repr", 1
    try:  # the job's output, before the reply (the fork server reads it up to the reply): after the value's
        flush()  # text is made, so nothing a flush might run (a stream the job wrapped) can change it
    except BaseException:
        pass
    if exc is not None:
        note = f"MemoryError during {stage}" if status == MEMORY else error_text(exc, stage)
    try:
        if types_changed():
            mark(TYPE_DICT)
    except BaseException:
        mark(TYPE_DICT)
    bits = 0
    for code in codes:
        if marks[code]:
            bits = bits | (1 << (code - 1))
    send(token, status, plain, bits, drawn, text, note)


def _job(req: dict, w_rep: int, w_out: int, token: bytes, setup=_setup, run=_run,
         finish=_finish) -> None:  # pragma: no cover - runs in the job child
    """The job child: set up, run the job's code and call, reply, exit."""
    source, call_source, ns, context = setup(req, w_rep, w_out, token)
    finish(run(source, call_source, ns), context)


#: The functions that run after the job's code started, and read only their locals (checked by
#: ``tests/sandbox/test_verdicts.py``); :func:`_error_text` (the exception's text, the job's word) is not one.
POST_CALL = ("_mark", "_audit", "_plain_repr", "_types_changed", "_rng_drawn", "_send", "_lifeline", "_run",
             "_value_reply", "_finish", "_job")


def _serve(zsock: socket.socket, lifeline: list | None) -> None:
    """Fork one job child per request of the fork server; report its pid, then how it ended."""
    while True:
        msg, fds, _flags, _addr = socket.recv_fds(zsock, 1 << 16, 2)
        if not msg:
            return
        req = json.loads(msg)
        req["lifeline"] = lifeline
        token = bytes.fromhex(req["token"])
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the job child
            try:
                _job(req, fds[0], fds[1], token)
            finally:
                os._exit(71)
        for fd in fds:
            os.close(fd)
        zsock.send(json.dumps({"pid": pid}).encode())
        _, wstatus, rusage = os.wait4(pid, 0)
        zsock.send(json.dumps({"wstatus": wstatus, "cpu": rusage.ru_utime + rusage.ru_stime}).encode())


def _remap_paths(path_fds: dict) -> None:
    """``sys.path`` and the ``__path__`` of every loaded package through ``/proc/self/fd/N`` (the O_PATH
    descriptors the fork server opened while root): path checks then start at that directory, so a job under
    another uid reaches the runtime's files without traversing their ancestors (e.g. ``/root/.pyenv``)."""
    remap = sorted(((old.rstrip("/") + "/", f"/proc/self/fd/{fd}/") for old, fd in path_fds.items()),
                   key=lambda pair: -len(pair[0]))
    sys.path[:] = [f"/proc/self/fd/{fd}" for fd in path_fds.values()]
    sys.path_importer_cache.clear()
    for module in list(sys.modules.values()):  # submodules of preloaded packages (encodings.idna, ...)
        path = getattr(module, "__path__", None)
        if isinstance(path, list):
            for i, entry in enumerate(path):
                for old, new in remap:
                    if entry.startswith(old):
                        path[i] = new + entry[len(old):]
                        break


def _quiet_frame_askers() -> None:
    """The preloaded functions that ask for their caller's frame on their own (``collections.namedtuple``,
    ``typing._caller`` behind ``TypeVar``/``NamedTuple``/``NewType``, ``enum``'s functional API: the module name of
    what they build) are rebuilt on a copy of their module's globals whose ``sys`` has a ``_getframe`` that fails
    without asking the audit hook, as the real one fails for them: what they build is the same as before, and no
    ordinary program is marked for it. ``sys._getframe`` itself, reached any other way, is refused and marked."""
    quiet = types.ModuleType("sys")
    quiet.__dict__.update(sys.__dict__)
    quiet._getframe = functools.partial(int, "frame access is refused in the sandbox")  # raises ValueError
    owners = [(sys.modules.get("collections"), "namedtuple", "_sys"), (sys.modules.get("typing"), "_caller", "sys"),
              (getattr(sys.modules.get("enum"), "EnumType", None), "_create_", "sys")]
    for owner, name, sys_name in owners:
        fn = getattr(owner, name, None)
        if not isinstance(fn, types.FunctionType) or fn.__globals__.get(sys_name) is not sys:
            continue
        rebuilt = types.FunctionType(fn.__code__, {**fn.__globals__, sys_name: quiet}, fn.__name__, fn.__defaults__,
                                     fn.__closure__)
        for attr in ("__kwdefaults__", "__qualname__", "__doc__", "__module__", "__annotations__"):
            setattr(rebuilt, attr, getattr(fn, attr))
        rebuilt.__dict__.update(fn.__dict__)
        setattr(owner, name, rebuilt)


def _wrap_clocks() -> None:
    """Reads of the clock and of CPU time through ``time``, ``datetime``, ``os.times`` and
    ``resource.getrusage`` (the ``time`` functions that take an optional time read the clock only without it) tell
    the fork server before they return: such a run is not a function of its input. ``datetime``'s classmethods
    live in a builtin type's dict, written here before any job exists (the start-up snapshot of the type dicts is
    taken after)."""
    ns = {"kill": os.kill, "mark": -_MARK_BASE, "seen": _CLOCK_SEEN}
    exec(compile(_CLOCK_WRAPPER, "<populora clock>", "exec"), ns)
    wrap = ns["wrap"]
    clock_time = sys.modules.get("time")
    if clock_time is not None:
        for name in ("time", "time_ns", "monotonic", "monotonic_ns", "perf_counter", "perf_counter_ns",
                     "process_time", "process_time_ns", "thread_time", "thread_time_ns", "clock_gettime",
                     "clock_gettime_ns"):
            if hasattr(clock_time, name):
                setattr(clock_time, name, wrap(getattr(clock_time, name)))
        for name, at in (("localtime", 0), ("gmtime", 0), ("ctime", 0), ("asctime", 0), ("strftime", 1)):
            setattr(clock_time, name, wrap(getattr(clock_time, name), at))
    os.times = wrap(os.times)
    resource.getrusage = wrap(resource.getrusage)
    dt = sys.modules.get("datetime")
    for cls, name in ((getattr(dt, "date", None), "today"), (getattr(dt, "datetime", None), "now"),
                      (getattr(dt, "datetime", None), "utcnow")):
        if isinstance(cls, type) and name in cls.__dict__:
            (real_dict,) = gc.get_referents(cls.__dict__)
            clock = wrap(cls.__dict__[name], 0 if name == "now" else None, True)
            real_dict[name] = classmethod(clock)
            if getattr(getattr(cls, name), "__func__", None) is not clock:  # a lookup cached before the write
                sys._clear_type_cache()  # (not otherwise: every job would start with a cold attribute cache)


#: The types whose dicts the harness watches (``type_dict``), by ``module.qualname``: the ones the forgeries of
#: issue 44 wrote (traceback, frame, code: read while an exception was described; list, str: the value printer
#: and the audit hook), ``type`` and ``object`` (every class's last resort), ``dict``. Comparing a dict touches
#: every entry's reference count, so each watched page is copied in every job: all 255 immutable types (3,164
#: entries) cost about a quarter of a job's CPU, 20 types (486 entries) about 6 % (docs/sandbox.md section 8.3).
WATCHED_TYPES = ("builtins.traceback", "builtins.frame", "builtins.code", "builtins.list", "builtins.str",
                 "builtins.dict", "builtins.type", "builtins.object")


def _snapshot_types(names: tuple[str, ...] = WATCHED_TYPES) -> list:
    """(the real dict, its length, its values) of every watched type alive now (:data:`WATCHED_TYPES`; only the
    mappingproxy route, or the garbage collector, can write their dicts)."""
    seen, todo, out = set(), [object], []
    while todo:
        t = todo.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        try:
            todo.extend(type.__subclasses__(t))
        except TypeError:
            pass
        if t.__flags__ & (1 << 8) and f"{t.__module__}.{t.__qualname__}" in names:  # Py_TPFLAGS_IMMUTABLETYPE
            (d,) = gc.get_referents(t.__dict__)
            out.append((d, len(d), tuple(d.values())))
    return out


def main() -> None:
    """Entry point: ``python -S -s -c <this source> <config json>``, fds 3 (socket) and 4 (requests) open."""
    cfg = json.loads(sys.argv[1])
    sys.path[:] = cfg["sys_path"]
    zsock = socket.socket(fileno=_ZSOCK_FD)
    lifeline = list(os.pipe()) if cfg.get("lifeline") else None  # this process keeps the write end for good
    errors = {}
    for name in cfg["preload"]:
        try:
            __import__(name)
        except Exception as exc:  # a bad preload entry is reported, not fatal
            errors[name] = f"{type(exc).__name__}: {exc}"
    path_fds = cfg.get("path_fds") or {}
    if path_fds:  # plain root mode: jobs (another uid) import through the directories opened while root
        _remap_paths(path_fds)
    # Later imports compile their source: no bytecode cache is read (the audit hook refuses marshal, which turns
    # data into code objects, so crafted bytecode) and none is written.
    sys.dont_write_bytecode = True
    sys.pycache_prefix = "/nonexistent/populora-sandbox-no-bytecode"
    _quiet_frame_askers()
    _wrap_clocks()
    gc.collect()
    _TYPES.extend(_snapshot_types())
    gc.freeze()  # children never walk (and so never copy-on-write) the zygote's own objects
    zsock.send(json.dumps({"type": "zygote", "pid": os.getpid(), "uid": os.getuid(), "preload_errors": errors,
                           "python": sys.version.split()[0], "keep_fds": sorted(path_fds.values()),
                           "fork_entropy": 1 if "random" in sys.modules else 0}).encode())
    _serve(zsock, lifeline)


if __name__ == "__main__":
    main()
