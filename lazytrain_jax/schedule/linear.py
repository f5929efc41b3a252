"""Linear expressions and a held model for the planner's MILP, without a solver behind them.

``milp.build`` writes its model with python-mip's arithmetic (``x + y - 1``, ``3 * x``,
``xsum(...)``) but hands its rows to HiGHS as arrays (``milp._highs_arrays``) on every model large
enough for the time to matter. A python-mip variable is made in CBC (a call through cffi for each
one) and hashes through a Python method, so a third of a 64-layer build went to python-mip itself.
The classes here keep the same arithmetic, each coefficient computed in the same order as
python-mip computes it (so that the arrays are the same bits), with variables that hash by identity
and live only here. :meth:`Model.mip_model` writes the model into python-mip's CBC where CBC or
CLP solves it (small models, or where asked for).

Not python-mip's whole interface: comparisons (``>=``, ``<=``) make rows from expressions and
variables, but ``==`` keeps Python's identity meaning on variables (they are dictionary keys);
``milp._eq`` writes equality rows.
"""

from __future__ import annotations

import functools
import gc
import numbers

import mip

INF = float("inf")
EPS = mip.EPS
CONTINUOUS, BINARY, INTEGER = mip.CONTINUOUS, mip.BINARY, mip.INTEGER
_NUMBER = (int, float)


def _real(value) -> bool:
    return isinstance(value, _NUMBER) or isinstance(value, numbers.Real)


@functools.cache
def bind_cbc() -> bool:
    """Looks up every function of python-mip's CBC library once, before the first CBC model.

    cffi finds a library's functions on first use, under a lock it does not let the same thread
    take twice. A garbage collection that starts inside such a lookup and frees a python-mip model
    runs its finaliser, whose ``Cbc_deleteModel`` is looked up under that same lock when no model
    was freed before: the thread waits for itself for ever (a test process here hung in
    ``Cbc_setAllowableFractionGap``'s lookup, in CBC's first in-process solve). With every
    function looked up already, no lookup takes the lock again (220 functions, 2 ms). Runs once:
    whether the library was there."""
    collecting = gc.isenabled()
    gc.disable()  # (a model made before, by other code, could be freed inside these lookups too)
    try:
        try:
            from mip import cbc
            lib = cbc.cbclib
            names = dir(lib)
        except Exception:  # noqa: BLE001  (no CBC here: python-mip says so when a model is made)
            return False
        for name in names:
            try:
                getattr(lib, name)
            except (AttributeError, OSError):  # declared, not in this build of the library
                pass
        return True
    finally:
        if collecting:
            gc.enable()


class _Term:
    """What variables and expressions share: division by a number is multiplication by its
    inverse, and ``>=`` / ``<=`` make rows (each kind's ``_row``, as python-mip writes them)."""

    __slots__ = ()

    def __truediv__(self, other):
        if not _real(other):
            return NotImplemented
        if abs(other) < EPS:
            raise ZeroDivisionError(f"{type(self).__name__} divided by zero")
        return self.__mul__(1.0 / other)

    def __ge__(self, other):
        return self._row(other, ">")

    def __le__(self, other):
        return self._row(other, "<")


class Var(_Term):
    """A variable of a :class:`Model`: its column ``idx``, bounds and type (mip's "C", "B" or "I").
    Hashes by identity; its arithmetic makes :class:`LinExpr` as python-mip's does."""

    __slots__ = ("idx", "lb", "ub", "var_type", "model")

    def __init__(self, idx: int, lb: float, ub: float, var_type: str, model: "Model | None" = None):
        self.idx = idx
        self.lb = lb
        self.ub = ub
        self.var_type = var_type
        self.model = model

    def __repr__(self):
        return f"Var({self.idx})"

    @property
    def x(self):
        """The value in the last CBC or CLP solve of its model (:meth:`Model.mip_model`); None
        before one, or where it found none."""
        written = self.model._mip if self.model is not None else None
        return None if written is None else written[0].vars[self.idx].x

    def __add__(self, other):
        if isinstance(other, Var):
            return LinExpr.of({self: 1, other: 1} if other is not self else {self: 1})
        if isinstance(other, LinExpr):
            return other.__add__(self)
        if _real(other):
            if abs(other) < EPS:
                return self
            return LinExpr.of({self: 1}, other)
        return NotImplemented

    __radd__ = __add__

    def __sub__(self, other):
        if isinstance(other, Var):
            return LinExpr.of({self: 1, other: -1} if other is not self else {self: -1})
        if isinstance(other, LinExpr):
            return (-other).__add__(self)
        if _real(other):
            if abs(other) < EPS:
                return self
            return LinExpr.of({self: 1}, -other)
        return NotImplemented

    def __rsub__(self, other):
        if isinstance(other, LinExpr):
            return other.__sub__(self)
        if _real(other):
            return LinExpr.of({self: -1}, other)
        return NotImplemented

    def __mul__(self, other):
        if not _real(other):
            return NotImplemented
        return LinExpr.of({self: other})

    __rmul__ = __mul__

    def __neg__(self):
        return LinExpr.of({self: -1.0})

    def _row(self, other, sense: str) -> "LinExpr":
        if isinstance(other, Var):
            return LinExpr.of({self: 1, other: -1} if other is not self else {self: -1}, 0.0, sense)
        if isinstance(other, LinExpr):
            return LinExpr.of({self: 1})._row(other, sense)
        if _real(other):
            return LinExpr.of({self: 1}, -1 * other, sense)
        return NotImplemented


class LinExpr(_Term):
    """``Σ expr[var] · var + const``, and as a row its ``sense`` (">": ≥ 0, "<": ≤ 0, "=": = 0,
    "": none), as python-mip's ``LinExpr``."""

    __slots__ = ("expr", "const", "sense")

    def __init__(self, const=0.0, sense: str = ""):
        self.expr = {}
        self.const = const
        self.sense = sense

    @classmethod
    def of(cls, expr: dict, const=0.0, sense: str = "") -> "LinExpr":
        """An expression owning ``expr`` (not copied)."""
        out = cls.__new__(cls)
        out.expr = expr
        out.const = const
        out.sense = sense
        return out

    def copy(self) -> "LinExpr":
        return LinExpr.of(dict(self.expr), self.const, self.sense)

    def add_var(self, var: Var, coeff=1):
        self.expr[var] = self.expr.get(var, 0) + coeff

    def add_expr(self, other: "LinExpr", coeff=1):
        self.const += other.const * coeff
        expr, get = self.expr, self.expr.get
        for var, c in other.expr.items():
            expr[var] = get(var, 0) + c * coeff

    def __add__(self, other):
        if _real(other):
            if abs(other) < EPS:
                return self
            return LinExpr.of(dict(self.expr), self.const + other, self.sense)
        out = self.copy()
        if isinstance(other, Var):
            out.add_var(other, 1)
        elif isinstance(other, LinExpr):
            out.add_expr(other)
        else:
            return NotImplemented
        return out

    __radd__ = __add__

    def __sub__(self, other):
        if _real(other):
            return LinExpr.of(dict(self.expr), self.const + -other, self.sense)
        out = self.copy()
        if isinstance(other, Var):
            out.add_var(other, -1)
        elif isinstance(other, LinExpr):
            out.add_expr(other, -1)
        else:
            return NotImplemented
        return out

    def __rsub__(self, other):
        return (-self).__add__(other)

    def __mul__(self, other):
        if not _real(other):
            return NotImplemented
        if abs(other - 1) < EPS:
            return self
        return LinExpr.of({var: c * other for var, c in self.expr.items()}, self.const * other, self.sense)

    __rmul__ = __mul__

    def __neg__(self):
        return self.__mul__(-1)

    def _row(self, other, sense: str) -> "LinExpr":
        out = self - other   # (a new expression: subtraction always copies)
        out.sense = sense
        return out

    def __len__(self):
        return len(self.expr)

    def __repr__(self):
        terms = " + ".join(f"{c}*x{v.idx}" for v, c in self.expr.items())
        return f"LinExpr({terms} + {self.const}{' ' + self.sense + ' 0' if self.sense else ''})"


def xsum(terms) -> LinExpr:
    """The sum of ``terms`` (variables, expressions, numbers), as ``mip.xsum`` adds them."""
    expr, const = {}, 0.0
    get = expr.get
    for term in terms:
        kind = type(term)
        if kind is Var:
            expr[term] = get(term, 0) + 1
        elif kind is LinExpr:
            const += term.const * 1
            for var, c in term.expr.items():
                expr[var] = get(var, 0) + c * 1
        elif _real(term):
            const += term * 1
        else:
            raise TypeError(f"cannot sum a {kind.__name__}")
    return LinExpr.of(expr, const)


def minimize(objective) -> LinExpr:
    if isinstance(objective, Var):
        objective = LinExpr.of({objective: 1.0})
    objective.sense = mip.MINIMIZE
    return objective


class Model:
    """A minimisation held here: its variables (in column order), rows (expressions with a sense),
    objective, and what CBC is to start from (``start``: (variable, value) pairs) and cut off at
    (``cutoff``).

    HiGHS reads it as arrays; :meth:`mip_model` writes it into python-mip's CBC for the solves
    CBC or CLP makes, with the bounds as they are now."""

    def __init__(self, verbose: bool = False):
        self.vars = []
        self.rows = []
        self.objective = LinExpr()
        self.verbose = 1 if verbose else 0
        self._mip = None  # (python-mip model, rows written there, the last of them)
        self._start, self._cutoff = None, INF
        self._changed = set()  # "start", "cutoff": set here since CBC's model last took them

    @property
    def start(self):
        """CBC's warm start, (variable, value) pairs (None: none given)."""
        return self._start

    @start.setter
    def start(self, pairs):
        self._start = pairs
        self._changed.add("start")

    @property
    def cutoff(self) -> float:
        """CBC's cutoff: only plans below it."""
        return self._cutoff

    @cutoff.setter
    def cutoff(self, value: float):
        self._cutoff = value
        self._changed.add("cutoff")

    def add_var(self, lb=0.0, ub=INF, var_type: str = CONTINUOUS) -> Var:
        """A new column; a binary's upper bound is 1 where none is given (as python-mip's)."""
        if var_type == BINARY:
            if ub == INF:
                ub = 1.0
            if not (-EPS <= lb <= 1.0 + EPS and -EPS <= ub <= 1.0 + EPS):
                raise ValueError(f"a binary variable's bounds must lie in [0, 1], not [{lb}, {ub}]")
        elif var_type not in (CONTINUOUS, INTEGER):
            raise ValueError(f"var_type={var_type!r}: expected {CONTINUOUS!r}, {BINARY!r} or {INTEGER!r}")
        var = Var(len(self.vars), lb, ub, var_type, self)
        self.vars.append(var)
        return var

    def add_constr(self, row: LinExpr) -> LinExpr:
        if not isinstance(row, LinExpr) or row.sense not in (">", "<", "="):
            raise TypeError(f"{row!r} is not a row (an expression with a sense: >=, <= or ==)")
        self.rows.append(row)
        return row

    def __iadd__(self, row: LinExpr) -> "Model":
        self.add_constr(row)
        return self

    def pop_row(self) -> LinExpr:
        """Removes the last row (and from python-mip's model, where it was written there)."""
        row = self.rows.pop()
        if self._mip is not None:
            model, written, last = self._mip
            if written == len(self.rows) + 1 and last is row:
                model.remove(model.constrs[written - 1])
                self._mip = (model, written - 1, self.rows[-1] if self.rows else None)
        return row

    @property
    def num_cols(self) -> int:
        return len(self.vars)

    @property
    def num_rows(self) -> int:
        return len(self.rows)

    @property
    def num_nz(self) -> int:
        return sum(len(row.expr) for row in self.rows)

    def mip_model(self) -> mip.Model:
        """This model in python-mip's CBC: written once (later rows added as they come; written
        again where rows were removed or replaced other than by :meth:`pop_row`), its bounds,
        objective, start and cutoff set to this model's each time."""
        kept = self._mip
        if kept is not None:
            model, written, last = kept
            if written > len(self.rows) or (written and self.rows[written - 1] is not last):
                kept = None  # rows were removed or replaced: write it again
        fresh = kept is None
        if fresh:
            bind_cbc()
            model = mip.Model(sense=mip.MINIMIZE, solver_name="CBC")
            model.threads = 1
            cols = [model.add_var(lb=v.lb, ub=v.ub, var_type=v.var_type) for v in self.vars]
            written = 0
        else:
            cols = model.vars
            for var in self.vars:
                col = cols[var.idx]
                col.lb, col.ub = var.lb, var.ub
        for row in self.rows[written:]:
            expr = mip.LinExpr(const=row.const, sense=row.sense)
            expr.set_expr({cols[v.idx]: c for v, c in row.expr.items()})
            model.add_constr(expr)
        self._mip = (model, len(self.rows), self.rows[-1] if self.rows else None)
        objective = mip.LinExpr(const=self.objective.const)
        objective.set_expr({cols[v.idx]: c for v, c in self.objective.expr.items()})
        model.objective = mip.minimize(objective)
        model.verbose = self.verbose
        # the start and cutoff go to CBC as python-mip's setters would have sent them, only once
        # given (or, in a model written afresh, where they differ from its defaults): setting an
        # empty start changes which of two equally fast plans CBC returns
        send_start = self._start is not None if fresh else "start" in self._changed
        send_cutoff = self._cutoff != INF if fresh else "cutoff" in self._changed
        if send_start:
            model.start = None if self._start is None else [(cols[v.idx], value) for v, value in self._start]
        if send_cutoff:
            model.cutoff = self._cutoff
        self._changed.clear()
        return model
