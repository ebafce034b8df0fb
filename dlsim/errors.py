"""The exception hierarchy. The CLI turns any `DlsimError` into one line and exit code 1."""

from __future__ import annotations


class DlsimError(Exception):
    """Base class of every error dlsim reports to a user."""


class UnitError(DlsimError):
    """A quantity with a missing, unknown or invalid unit."""


class SpecError(DlsimError):
    """A model, cluster, strategy or table description that is malformed or inconsistent.

    The message names the file, the field and the reason: ``file: field: reason``.
    """

    def __init__(self, reason: str, *, path: object = None, field: str | None = None):
        self.path, self.field, self.reason = path, field, reason
        parts = [str(p) for p in (path, field) if p not in (None, "")]
        super().__init__(": ".join(parts + [reason]))


class ShapeError(SpecError):
    """Tensor shapes that do not fit together; the message names the layer."""


class InfeasibleError(DlsimError):
    """A strategy that cannot run: out of memory, sizes that do not divide. Says which limit and by how much."""


class SolverError(DlsimError):
    """An optimisation solver failed, timed out without a solution, or the problem is infeasible."""


class TableLookupError(DlsimError):
    """A measured table is missing, malformed, or has no entry that can answer a query."""



def excerpt(value: object, limit: int = 60) -> str:
    """``repr(value)`` cut to about `limit` characters, so that an error line never echoes a whole input."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 160:
        return f"<integer of about {int(value.bit_length() * 0.30103) + 1} digits>"
    if isinstance(value, (list, tuple, dict, set)) and len(value) > 20:
        return f"<{type(value).__name__} of {len(value)} items>"
    if isinstance(value, (str, bytes)) and len(value) > 4 * limit:
        shown = value[:limit]
        return repr(shown)[: limit] + f"... ({len(value)} chars)"
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001  (a repr that fails must not hide the real error)
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit] + "..."


def one_line(exc: BaseException) -> str:
    """``TypeName: the message's first line``: an exception as one line of a record or a report."""
    text = str(exc)
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"
