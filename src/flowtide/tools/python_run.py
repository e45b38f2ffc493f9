"""Running a compiled python step in this process: `_invoke` executes the code in its
namespace and picks the result (`main(...)`, else a module-level `return`, else the
global `result`); `_execute` does it with the thread's output routed to the call's
buffer; `_run_here` runs it on the calling thread and `_run_with_timeout` on a helper
thread, which an exception injected with `PyThreadState_SetAsyncExc` interrupts when time
runs out. A user exception becomes a `ToolError`.
"""

from __future__ import annotations

import contextvars
import ctypes
import threading
import types
from collections.abc import Mapping
from typing import Any

from flowtide.errors import ToolError
from flowtide.tools.python_code import _FellThrough, _Unit, _user_error
from flowtide.tools.python_namespace import _MISSING, _call_main
from flowtide.tools.python_output import _Capture, _tls

# How long a timed-out helper thread gets to unwind after the injected exception.
_TIMEOUT_GRACE = 0.5


def _invoke(unit: _Unit, ns: dict[str, Any], inputs: Any) -> Any:
    """Run the compiled code in `ns` and pick the result (main > return > result)."""
    preset_main = ns.get("main", _MISSING)
    if unit.wrapped:
        if unit.pre_code is not None:
            exec(unit.pre_code, ns)
        body = types.FunctionType(unit.code, ns, "<module>")
        outcome = body(ns, _FellThrough)
        if not isinstance(outcome, _FellThrough):
            return outcome
        scope: Mapping[str, Any] = outcome.scope
    else:
        exec(unit.code, ns)
        scope = ns
    main = scope.get("main", ns.get("main", _MISSING))
    if main is not preset_main and callable(main):
        return _call_main(main, inputs, ns)
    if "result" in scope:
        return scope["result"]
    return ns.get("result")


def _execute(unit: _Unit, ns: dict[str, Any], inputs: Any, capture: _Capture) -> Any:
    """`_invoke` with this thread's writes routed to `capture`."""
    previous = getattr(_tls, "capture", None)
    _tls.capture = capture
    try:
        return _invoke(unit, ns, inputs)
    finally:
        _tls.capture = previous


def _run_here(unit: _Unit, ns: dict[str, Any], inputs: Any, capture: _Capture) -> Any:
    """`_execute` on this thread, a user exception turned into a ToolError. Raised outside
    the handler so the ToolError does not chain the user exception, whose frames hold the
    whole namespace."""
    error: ToolError | None = None
    try:
        return _execute(unit, ns, inputs, capture)
    except (Exception, SystemExit) as exc:
        error = _user_error(exc, unit)
    raise error


# --------------------------------------------------------------------------------------
# Timeouts
# --------------------------------------------------------------------------------------


class _PythonTimeout(BaseException):
    """Injected into a helper thread whose code ran past its timeout.

    A BaseException so that the user's `except Exception:` does not swallow it.
    """


_set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
_set_async_exc.argtypes = (ctypes.c_ulong, ctypes.py_object)
_set_async_exc.restype = ctypes.c_int


def _interrupt(thread_id: int) -> bool:
    """Schedule _PythonTimeout in thread `thread_id`; False if the thread is gone."""
    count = _set_async_exc(ctypes.c_ulong(thread_id), ctypes.py_object(_PythonTimeout))
    if count > 1:  # cannot happen for a valid id; undo rather than hit random threads
        _set_async_exc(ctypes.c_ulong(thread_id), ctypes.py_object())
        return False
    return int(count) == 1


class _Run:
    """State shared between the caller and the helper thread of a timed call."""

    __slots__ = ("lock", "done", "active", "value", "error", "interrupted")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.active = True  # still inside user code: interrupting it is safe
        self.value: Any = None
        self.error: BaseException | None = None
        self.interrupted = False


def _run_with_timeout(
    unit: _Unit,
    ns: dict[str, Any],
    inputs: Any,
    capture: _Capture,
    timeout: float,
    step: str,
) -> Any:
    run = _Run()

    def target() -> None:
        try:
            try:
                run.value = _execute(unit, ns, inputs, capture)
            except _PythonTimeout:
                pass
            except BaseException as exc:  # handed to the caller's thread, re-raised there
                run.error = exc
            finally:
                with run.lock:
                    run.active = False
        except _PythonTimeout:
            # The injected exception landed in the bookkeeping above, after user code.
            pass
        finally:
            run.done.set()

    context = contextvars.copy_context()
    thread = threading.Thread(
        target=context.run, args=(target,), name=f"flowtide-python[{step}]", daemon=True
    )
    thread.start()
    if not run.done.wait(timeout):
        with run.lock:
            # Checked under the lock: once `active` is False, the helper has left user
            # code and must not receive an exception.
            if run.active and thread.ident is not None:
                run.interrupted = _interrupt(thread.ident)
        if run.interrupted:
            unwound = run.done.wait(_TIMEOUT_GRACE)
            raise ToolError(
                f"python code timed out after {timeout:g}s"
                + ("" if unwound else " (blocked in a C call; its thread was abandoned)"),
                kind="timeout",
                retryable=True,
                code="Timeout",
                data={"timeout": timeout, "abandoned": not unwound},
            )
        run.done.wait()  # finished right at the deadline: it is only tidying up
    if run.error is not None:
        error, run.error = run.error, None
        if isinstance(error, Exception | SystemExit):
            raise _user_error(error, unit)
        raise error
    return run.value
