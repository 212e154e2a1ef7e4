"""The zygote: the process every job is forked from, and the job child's own code (reply included).

The fork server (:mod:`populora_env.sandbox._worker`) confines itself with ``ctypes`` (prctl, mount, seccomp). A
process that has imported ``_ctypes`` keeps its classes for good (``object.__subclasses__()`` lists them), and any
of them reads and writes raw memory: a job forked from such a process could rewrite the reply its harness is
about to send. So jobs are not forked from the fork server but from this zygote: a fresh interpreter the fork
server executes once per worker (``python -S -s -c <this source> <config json>``), after it has put the zygote
under the job's seccomp filter, Landlock ruleset and capabilities. The zygote never imports ``ctypes``, and the
job child refuses to (audit hook), so a job's process holds no way to native code but a bug of CPython itself.

Rules this file keeps (each one closes a route by which job code could change what the harness reports):

* **Standard library only, and no classes.** ``object.__subclasses__()`` reaches every live class, and through
  a method's ``__globals__`` the module that defined it; a function is reachable only through a frame or the
  garbage collector, both refused to jobs (:func:`_audit`). So job code cannot reach any function here.
* **Nothing the reply's status, value or seal depends on is looked up after the job's code ran.** Every
  builtin, method and constant they need is bound before job code runs: to a local of :func:`_job`, or as a
  default argument of the functions it calls (:func:`_plain_repr`, :func:`_describe`, bound when the zygote
  starts); job code may rebind ``builtins``, ``json``, ``sys`` or ``os`` attributes at will, the harness no
  longer looks them up. (The error text, the job's own word, is made with :mod:`traceback`, which it may have
  rebound.)
* **The reply is sealed with a per-job secret** (``token``: 16 random bytes from the fork server, kept only in
  the locals of the frames that run the job): it starts with HMAC-SHA256(token, frame). The fork server accepts
  no other reply, so a job that writes its own "reply" to the reply pipe (it holds the descriptor) writes one
  that is refused, and bytes a thread of the job slips into the harness's reply break the seal.
  Frames, the garbage collector's object walks, ``/proc/self/mem`` (Landlock), trace and profile functions,
  Python signal handlers (seccomp: ``rt_sigaction`` is refused to jobs) and ``ctypes`` are the ways to a
  local; each is refused.
* **The value is checked and printed by the harness after the call has returned, from copies**: the garbage
  collector stopped (no finalizers), no other thread counted alive (the interpreter's own count), no Python
  signal handler but the interpreter's built-in one. Then :func:`_plain_repr` copies each container as it
  reaches it (one call into C), checks that every item is of an exact builtin type (``type(x) is int`` with the
  real ``type``) and takes its C ``repr``: a thread the count missed (one started as the call returned) may
  still change the value, never put anything but exact builtin values in the text. The job's stdout is flushed
  after that text exists.
* **Job code never runs in the harness's thread while frames are allowed to it** (:func:`_describe` reads the
  traceback with ``BaseException``'s own getter and touches only builtin objects). Where job code does run in
  that thread after the call (a value's own ``__repr__`` when it is not plain data, an exception's message),
  the status is fixed already and frames are refused; trace and profile functions and, on Python 3.12+,
  ``sys.monitoring`` callbacks, which would run job code at any line of the harness, are refused.

:func:`_job` is one long function on purpose (exempt from the project's 80-line rule): the names it binds
before the job's code runs must be locals of the very frame that later builds the reply, since a helper
function's globals or closure would be a place job code could reach or a lookup it could redirect; the helpers
it calls after the job's code take what they need as default arguments bound when the zygote starts.
"""

from __future__ import annotations

import _sha256
import _thread
import gc
import json
import os
import random
import resource
import socket
import sys
import traceback

_ZSOCK_FD = 3  # the zygote's end of the fork server's socket (SOCK_SEQPACKET: one message per send)
_REQ_FD = 4  # the fork server's request pipe: each job child reads its own job frame from it
_REPLY_FD = 3  # in the job child: the write end of its reply pipe
_MAX_ERROR_CHARS = 4000
_PLAIN_LIMIT = 200_000  # exact-type checks of a value's items: more (or a cycle) is not plain data
# Reply status codes (the host maps them back to names).
_OK, _ERROR, _MEMORY, _OUTPUT, _NOT_PLAIN, _SETUP = 0, 1, 2, 3, 4, 5
# Modules a job may not import: native memory access (ctypes), C-level test hooks, subinterpreters (a new
# interpreter has no audit hook).
_REFUSED_MODULES = frozenset({"ctypes", "_ctypes", "_testcapi", "_testinternalcapi", "_testbuffer",
                              "_testmultiphase", "_testimportmultiple", "_testclinic", "_xxsubinterpreters",
                              "_xxinterpchannels", "_xxtestfuzz", "_ctypes_test"})
_FRAME_ATTRS = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame"})
_REFUSED_EVENTS = frozenset({"sys._current_frames", "sys._current_exceptions", "gc.get_objects",
                             "gc.get_referrers", "gc.get_referents", "sys.settrace", "sys.setprofile",
                             "sys.addaudithook", "code.__new__", "sys._getframemodulename",
                             # Python 3.12+: a monitoring callback would run job code in the harness's thread
                             "sys.monitoring.register_callback"})
_FUNC_ATTRS = frozenset({"__code__"})
_NONE_TYPE = type(None)


def _audit(event, args, _refused=_REFUSED_EVENTS, _frames=_FRAME_ATTRS, _mods=_REFUSED_MODULES,
           _func_attrs=_FUNC_ATTRS, _state=[False, False, None],  # noqa: B006 - see below
           _str=str, _type=type, _ident=_thread.get_ident, _AttributeError=AttributeError,
           _ValueError=ValueError, _RuntimeError=RuntimeError, _ImportError=ImportError):
    """The job child's audit hook (PEP 578: once added, it cannot be removed): refuses the introspection and
    native routes to the harness's locals. ``sys._getframe`` raises ``ValueError`` (what the standard library's
    callers, ``namedtuple``, ``typing``, ``enum``, ``logging``, already catch), frame attributes
    ``AttributeError``, imports ``ImportError`` (which the import system also takes as "compile the source
    instead of loading its bytecode": ``marshal.loads`` builds code objects, so crafted bytecode, from data);
    the rest ``RuntimeError`` (for ``sys.addaudithook`` CPython then skips the new hook silently).

    ``_state``: [the harness is reading a traceback's frames, ctypes allowed (native-jobs tests), the ident of
    the harness's thread]: frame reads are allowed only to the harness's own thread while it reads (a job's
    thread still running then is refused)."""
    if event == "object.__getattr__":
        if args[1] in _frames and not (_state[0] and _ident() == _state[2]):
            raise _AttributeError("frame access is refused in the sandbox")
        return
    if event == "sys._getframe":
        raise _ValueError("frame access is refused in the sandbox")
    if event in _refused:
        raise _RuntimeError(f"{event} is refused in the sandbox")
    if event == "import":
        name = args[0]
        if _type(name) is _str and name.partition(".")[0] in _mods and not _state[1]:
            raise _ImportError(f"import of {name} is refused in the sandbox")
        return
    if event == "marshal.loads" or event == "marshal.load":
        raise _ImportError("marshal is refused in the sandbox")
    if event == "object.__setattr__" and args[1] in _func_attrs:
        raise _RuntimeError(f"setting {args[1]} is refused in the sandbox")


def _short(text: str, limit: int = _MAX_ERROR_CHARS) -> str:
    if len(text) <= limit:
        return text
    return text[: limit // 2] + f"... [{len(text) - limit} chars cut] ..." + text[-limit // 2:]


def _describe(exc: BaseException, stage: str, _state: list, type=type, str=str, len=len,  # noqa: A002
              BaseException=BaseException, traceback_of=BaseException.__traceback__.__get__) -> str:
    """``Type: message`` of a job's exception (a SyntaxError's location lines after it), then the job's own
    frames (file ``<job>``/``<call>``, line, function).

    The traceback is walked here, not with :mod:`traceback`, while the audit hook lets the harness's thread read
    frames (``_state[0]``), and nothing in the walk may run job code, since job code run *in this thread* then
    could read frames too, up to the harness's locals: the traceback is read with ``BaseException``'s own
    getter (an exception class of the job may override ``__traceback__`` with a property), and from it only
    builtin objects are touched (tracebacks, frames and code objects, whose types the job cannot change; a
    file name or function name that is not an exact ``str`` is skipped, so no ``__eq__`` or ``__format__`` of
    the job's runs). The message (``str(exc)``, through ``traceback.format_exception_only``) may run job code,
    or code the job rebound: it is made after the walk, with frames refused again. The text is the job's own
    word either way; only the status, fixed before, is trusted.
    """
    frames: list = []
    _state[0] = True
    try:
        tb = traceback_of(exc)
        while tb is not None and len(frames) < 1000:
            code = tb.tb_frame.f_code
            file, name = code.co_filename, code.co_name
            if type(file) is str and type(name) is str and (file == "<job>" or file == "<call>"):
                frames.append('  File "' + file + '", line ' + str(tb.tb_lineno) + ", in " + name)
            tb = tb.tb_next
    except BaseException:
        frames = []
    finally:
        _state[0] = False
    try:
        only = "".join(traceback.format_exception_only(type(exc), exc)).rstrip().splitlines()
        # "Type: message" first; a SyntaxError's location and caret lines follow it
        text = "\n".join([only[-1], *only[:-1]]) if only else type(exc).__name__
    except BaseException:
        try:
            text = f"{type(exc).__name__}: {exc}"
        except BaseException:
            text = "an exception that cannot be printed"
    if type(text) is not str:
        text = "an exception that cannot be printed"
    if frames:
        text += "\nTraceback (most recent call last, job frames only):\n" + "\n".join(frames[-5:])
    if stage != "code":
        text = f"[during {stage}] {text}"
    return _short(text)


def _plain_repr(value, limit: int, cap: int, depth_limit: int, type=type, repr=repr,
                tuple=tuple, len=len, range=range, items=dict.items, join="".join,
                t_int=int, t_str=str, t_float=float, t_bool=bool, t_none=_NONE_TYPE, t_bytes=bytes,
                t_complex=complex, t_list=list, t_tuple=tuple, t_set=set, t_frozenset=frozenset, t_dict=dict):
    """The ``repr`` of ``value`` if it is plain data, made so that nothing but exact builtin values can be in it.

    Returns ``(text, None)`` for plain data (built only from exact builtin types: ``type(x) is int`` ..., no
    subclass); ``(None, None)`` for plain data whose ``repr`` is longer than ``cap``; ``(None, why)`` otherwise,
    ``why`` being the first offending type, or a reason (more than ``limit`` items, a cycle, or nesting deeper
    than ``depth_limit``, where the builtin ``repr`` would raise ``RecursionError``). The text is the builtin
    ``repr``'s, character for character (``tests/sandbox/test_plain_repr.py`` checks it against ``repr``).

    Why not ``repr(value)`` after a check of the types: other threads of the job may still run (one started
    as the call returned, which the harness cannot count yet, gets the interpreter as soon as its wait for it
    times out), and one could put an object whose ``__repr__`` lies into a list the check had passed, before
    the ``repr``. So the value is never read twice: each container is copied when it is reached (``tuple(x)``,
    one call into C, during which no other thread runs and no job code is called), each leaf's exact type is
    checked and its C ``repr`` taken from that copy, and the text is made of these pieces only. Another thread
    can still change the value meanwhile, as it could have before the call returned; it cannot put anything
    in the text but the ``repr`` of exact builtin values. Every name is bound when the zygote starts (defaults):
    job code may rebind builtins and module attributes, nothing here looks them up.
    """
    parts: list = []
    size = count = 0
    todo = [(value, 0)]  # (a value to print, its depth) or (a piece of text, -1)
    while todo:
        item, depth = todo.pop()
        if depth < 0:
            if size <= cap:
                parts.append(item)
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
                parts.append(text)
                size += len(text)
            continue
        if k is t_dict:
            pairs = tuple(items(item))
            if depth >= depth_limit:
                return None, "value nested too deeply or cyclic"
            todo.append(("}", -1))
            for i in range(len(pairs) - 1, -1, -1):
                todo.append((pairs[i][1], depth + 1))
                todo.append((": ", -1))
                todo.append((pairs[i][0], depth + 1))
                if i:
                    todo.append((", ", -1))
            todo.append(("{", -1))
            continue
        if k is t_list:
            copy, opening, closing = tuple(item), "[", "]"
        elif k is t_tuple:
            copy, opening, closing = item, "(", ",)" if len(item) == 1 else ")"
        elif k is t_set or k is t_frozenset:
            copy = tuple(item)
            if not copy:
                todo.append(("set()" if k is t_set else "frozenset()", -1))
                continue
            opening, closing = ("{", "}") if k is t_set else ("frozenset({", "})")
        else:
            return None, k
        if depth >= depth_limit:
            return None, "value nested too deeply or cyclic"
        todo.append((closing, -1))
        for i in range(len(copy) - 1, -1, -1):
            todo.append((copy[i], depth + 1))
            if i:
                todo.append((", ", -1))
        todo.append((opening, -1))
    if size > cap:
        return None, None
    return join(parts), None


def _seal(token: bytes, frame: bytes) -> bytes:
    """``HMAC-SHA256(token, frame) + frame``: the harness's seal of its reply (before any job text runs; the
    reply after the job's code computes the same with names it bound)."""
    key = token + bytes(64 - len(token))
    inner = _sha256.sha256(bytes(b ^ 0x36 for b in key) + frame).digest()
    return _sha256.sha256(bytes(b ^ 0x5C for b in key) + inner).digest() + frame


def _lifeline(fd: int, started, read=os.read, exit_=os._exit) -> None:  # pragma: no cover - a job child's thread
    """Plain mode (no pid namespace): end the job child when its zygote dies. The zygote holds the only write end
    of this pipe, so the read returns (end of file) exactly then; closing or replacing the descriptor does not
    wake a read already waiting on it. ``started`` is released once this thread runs (and so is counted)."""
    started.release()
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


def _job(req: dict, w_rep: int, w_out: int, token: bytes) -> None:  # pragma: no cover - runs in the job child
    """The job child: set up, run the job's code and call, check and print the value, reply, exit."""
    # ---------------------------------------------------------------- set-up (no job text has run yet)
    step, out_fd = "set-up", w_rep
    try:
        devnull = os.open("/dev/null", os.O_RDWR | os.O_CLOEXEC)
        os.dup2(devnull, 0)
        os.dup2(w_out, 1)
        os.dup2(devnull, 2)
        os.dup2(w_rep, _REPLY_FD)  # over the zygote's socket (fd 3), which the child must not keep
        out_fd = _REPLY_FD
        step = "reading the job"
        job = _read_frame(_REQ_FD)  # fd 4 (the request pipe) is still open: _REPLY_FD is 3
        if not isinstance(job, dict) or not isinstance(job.get("code"), str):
            raise RuntimeError("no job frame")
        lifeline = req.get("lifeline")
        low = _REPLY_FD + 1  # close the request pipe, the originals of the pipes, the rest, but the runtime's
        for fd in sorted({int(k) for k in req.get("keep_fds", ())} | ({lifeline[0]} if lifeline else set())):
            os.closerange(low, fd)  # O_PATH directories (plain root mode) and the lifeline's read end
            low = fd + 1
        os.closerange(low, 1 << 16)
        step = "dropping to the job's uid"
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
        step = "setting limits"
        for res, value in ((resource.RLIMIT_AS, req["as_bytes"]), (resource.RLIMIT_CPU, req["cpu"]),
                           (resource.RLIMIT_NPROC, req["nproc"]), (resource.RLIMIT_FSIZE, req["fsize"]),
                           (resource.RLIMIT_NOFILE, req["nofile"]), (resource.RLIMIT_CORE, [0, 0])):
            resource.setrlimit(res, (int(value[0]), int(value[1])))
        step = "preparing the interpreter"
        random.seed()  # each job sees fresh randomness (a fork would repeat the zygote's state)
        np_random = sys.modules.get("numpy.random")
        if np_random is not None:
            try:
                np_random.seed()
            except Exception:
                pass
        sys.argv = ["<job>"]
        main = type(sys)("__main__")
        main.__dict__.update({"__builtins__": sys.modules["builtins"], "__doc__": None, "__package__": None,
                              "__spec__": None, "__loader__": None})
        sys.modules["__main__"] = main
        ns = main.__dict__
        source, call_source = job["code"], job.get("call")
        need_plain = job.get("plain") is True
        cap = int(req["max_output_chars"])
        # Everything the reply needs, bound now: job code may rebind any builtin or module attribute.
        write, exit_, compile_, exec_, eval_ = os.write, os._exit, compile, exec, eval
        typ, rep, ln, mview, join = type, repr, len, memoryview, b"".join
        encode, to_bytes, t_str, t_bytes = str.encode, int.to_bytes, str, bytes
        plain_repr, depth_limit = _plain_repr, sys.getrecursionlimit
        BaseExc, MemErr, SysExit = BaseException, MemoryError, SystemExit
        threads, gc_disable, flush = _thread._count, gc.disable, sys.stdout.flush
        own_threads = 1 if lifeline else 0
        describe, audit_state = _describe, _audit.__defaults__[4]
        audit_state[2] = _thread.get_ident()
        sha256, hold_gil = _sha256.sha256, sys.setswitchinterval
        key = token + bytes(64 - len(token))  # HMAC-SHA256 with the token as its key
        inner, outer = bytes(b ^ 0x36 for b in key), bytes(b ^ 0x5C for b in key)
        c_ok, c_error, c_memory, c_output, c_not_plain = _OK, _ERROR, _MEMORY, _OUTPUT, _NOT_PLAIN
        reply_fd, plain_limit = _REPLY_FD, _PLAIN_LIMIT
        audit_state[1] = bool(req.get("native"))  # tests of the kernel layers only (Sandbox(_native_jobs=True))
        step = "installing the audit hook"
        sys.addaudithook(_audit)
    except BaseException as exc:  # never run the job half set up
        try:
            text = f"sandbox setup failed ({step}): {type(exc).__name__}: {exc}".encode("utf-8", "replace")
            body = bytes([_SETUP, 0]) + (0).to_bytes(4, "big") + len(text).to_bytes(4, "big") + text
            os.write(out_fd, _seal(token, len(body).to_bytes(4, "big") + body))
        finally:
            os._exit(70)

    # ---------------------------------------------------------------- the job (its code, then its call)
    status, error_exc, stage, have_value, result = c_ok, None, "code", False, None
    try:
        exec_(compile_(source, "<job>", "exec"), ns)
        if call_source is not None:
            stage = "call"
            result = eval_(compile_(call_source, "<call>", "eval"), ns)
            have_value = True
    except MemErr as exc:
        status, error_exc = c_memory, exc
    except SysExit as exc:
        status, error_exc = c_error, exc
    except BaseExc as exc:
        status, error_exc = c_error, exc

    # ---------------------------------------------------------------- the reply (only bound locals from here)
    text, plain, note = None, 0, None
    try:
        gc_disable()  # from here no finalizer runs: no collection, and nothing here drops a job object
        hold_gil(1e6)  # other threads rarely get the interpreter from here: only one already waiting for it with a
        # shorter interval does (what the value's text is made of does not depend on it: _plain_repr)
        if status == c_ok and have_value:
            alone = threads() == own_threads  # no other thread runs job code or can start one (a thread started
            # as the call returned and not counted yet may still: _plain_repr is made for that)
            text, kind = plain_repr(result, plain_limit, cap, depth_limit())
            if kind is None and alone:
                if text is None:
                    status, note = c_output, f"repr of the value is longer than max_output_chars={cap}"
                else:
                    plain = 1  # exact builtins only, printed from copies by C code
            elif need_plain and not alone:
                text, status, note = None, c_error, "threads were still running when the call returned"
            elif need_plain:
                text, status = None, c_not_plain
                if typ(kind) is t_str:
                    note = kind
                else:
                    name = kind.__name__  # a class's name (the job's own text)
                    note = name if typ(name) is t_str else "?"
            else:
                text = rep(result)  # the job's own __repr__ (or a value other threads could change): a claim
                if typ(text) is not t_str:
                    text, status, note = None, c_error, "__repr__ returned a non-string"
                elif ln(text) > cap:
                    status, text = c_output, None
                    note = f"repr of the value is longer than max_output_chars={cap}"
    except BaseExc as exc:  # our own failure (memory, recursion limit the job set, an interrupt): no value
        status, text, plain, error_exc, stage = c_error, None, 0, exc, "repr"
    try:  # the job's output, before the reply (the fork server reads it up to the reply): after the value's
        flush()  # text is made, so nothing a flush might run (a stream the job wrapped) can change it
    except BaseExc:
        pass
    if error_exc is not None:
        if status == c_memory:
            note = f"MemoryError during {stage}"
        else:
            try:
                note = describe(error_exc, stage, audit_state)
            except BaseExc:
                note = "the job's exception could not be described"
    try:
        value_bytes = b"" if text is None else encode(text, "utf-8", "surrogatepass")
        note_bytes = b"" if note is None else encode(note, "utf-8", "surrogatepass")
        body = join([to_bytes(0, 4, "big"), t_bytes([status, plain]), to_bytes(ln(value_bytes), 4, "big"),
                     value_bytes, to_bytes(ln(note_bytes), 4, "big"), note_bytes])
        body = join([to_bytes(ln(body) - 4, 4, "big"), body[4:]])  # its length, then the fields
        # sealed with the token (HMAC-SHA256): bytes another thread of the job slipped into it (a write to the
        # pipe while this one blocks) break the seal, and a job without the token cannot make one
        mac = sha256(join([outer, sha256(join([inner, body])).digest()])).digest()
        view = mview(join([mac, body]))
        while view:
            view = view[write(reply_fd, view):]
    finally:
        exit_(0)


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
    gc.collect()
    gc.freeze()  # children never walk (and so never copy-on-write) the zygote's own objects
    zsock.send(json.dumps({"type": "zygote", "pid": os.getpid(), "uid": os.getuid(), "preload_errors": errors,
                           "python": sys.version.split()[0], "keep_fds": sorted(path_fds.values())}).encode())
    _serve(zsock, lifeline)


if __name__ == "__main__":
    main()
