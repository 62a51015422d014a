"""The verdict of a validation and its report: :class:`Validation` (what was found, and
what it was judged by), :class:`Verdict` (the tally a validation keeps as it judges input
set after input set, and its one way of refusing), :class:`ValidationError`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["SOURCE_REFERENCES", "Validation", "ValidationError", "Verdict"]


class ValidationError(AssertionError):
    """The optimised program's outputs disagree with the source's."""


@dataclass
class Validation:
    """The outcome: the worst errors of the source and the new program, how many input
    sets were checked, and why it failed if it did. Against a float64 ``reference``:
    elementwise relative errors; against the source run in its working dtype (or under
    the same seed, for a program that draws random numbers), the source's error is 0 and
    the new program's is its largest normwise difference from the source, what such a
    judgement reads (at a cancelling element two correct programs differ by 200%).

    >>> str(Validation(True, 1e-7, 2e-7, 4))[:82]
    'validation passed: max elementwise relative error vs float64 reference 1e-07 (orig'
    >>> str(Validation(True, 0.0, 3e-6, 4, reference="working-dtype original"))[18:]
    ' largest normwise difference from the working-dtype original 3e-06 on 4 input sets'
    """

    ok: bool
    error_before: float
    error_after: float
    trials: int
    reason: str = ""
    reference: str = "float64"
    strided: tuple[int, ...] = ()  # flat outputs the source returned contiguous, ours not

    def __str__(self) -> str:
        verdict = "passed" if self.ok else f"FAILED ({self.reason})"
        if self.reference in SOURCE_REFERENCES:
            return (f"validation {verdict}: largest normwise difference from the "
                    f"{self.reference} {self.error_after:.3g} on {self.trials} input sets")
        return (f"validation {verdict}: max elementwise relative error vs {self.reference} "
                f"reference {self.error_before:.3g} (original) -> {self.error_after:.3g} "
                f"(optimised) on {self.trials} input sets")


SOURCE_REFERENCES = ("working-dtype original", "same-seed original")
"""The references a :class:`Validation` judged by that are the source itself (in its
working dtype; under the same seed): normwise differences from it."""


@dataclass
class Verdict:
    """What a validation has found so far, judging against ``reference`` (the
    :attr:`Validation.reference` it reports) on ``trials`` input sets: the worst errors of
    the source and of the new program, the sets checked (a set the source cannot take is
    not), the flat outputs the new program returns strided where the source's are
    contiguous. :meth:`refuse` is the one way a validation fails; :meth:`result` the
    verdict once every set is judged.

    >>> verdict = Verdict("float64", trials=3)
    >>> verdict.error_before, verdict.error_after = 1e-7, 2e-7
    >>> str(verdict.refuse("the output structure changed"))[:61]
    'validation FAILED (the output structure changed): max element'
    >>> verdict.refuse("worse", error_after=1e-3).error_after
    0.001
    >>> verdict.checked = 3
    >>> verdict.result().ok
    True
    """

    reference: str
    trials: int
    error_before: float = 0.0
    error_after: float = 0.0
    checked: int = 0
    strided: set[int] = field(default_factory=set)

    def refuse(self, reason: str, error_after: float = math.inf,
               error_before: float | None = None) -> Validation:
        """The failed validation for ``reason``: the new program's error ``error_after``
        (infinite where no value was judged), the source's worst so far unless
        ``error_before`` is given."""
        before = self.error_before if error_before is None else error_before
        return Validation(False, before, error_after, self.trials, reason,
                          reference=self.reference)

    def result(self) -> Validation:
        """The validation once every input set is judged: passed, unless the source
        itself could take none of them."""
        if not self.checked:
            return Validation(False, 0.0, math.inf, 0, "the source program raises on every "
                              "generated input set; pass real example inputs",
                              reference=self.reference)
        return Validation(True, self.error_before, self.error_after, self.checked,
                          reference=self.reference, strided=tuple(sorted(self.strided)))
