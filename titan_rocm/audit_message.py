"""The numerics audit's report lines in the training log, and the patterns that find them.

One owner for a contract that must not drift: the in-training audit writes these lines and the
log tools recognise a flagged audit by them. Torch-free, so the log tools import it anywhere."""

from __future__ import annotations

import re

NAME = "titan-rocm numerics audit"
VERDICTS = ("OK", "FLAGGED")


def verdict_line(verdict: str, step: int | None = None) -> str:
    """``titan-rocm numerics audit at step 4: FLAGGED`` (no step: the command line's)."""
    at = f" at step {step}" if step is not None else ""
    return f"{NAME}{at}: {verdict.upper()}"


def skipped_line(step: int, reason: str) -> str:
    """An in-training audit that did not run, and why."""
    return f"{NAME} at step {step} skipped: {reason}"


def complete_line(outcomes: list[tuple[int, str]]) -> str:
    """The end of an audit spread over steps: ``outcomes`` is each part's (step, outcome)."""
    said = [f"{o} at step(s) {joined}" for o in ("flagged", "skipped")
            if (joined := ", ".join(str(s) for s, got in outcomes if got == o))]
    return (f"{NAME} begun at step {outcomes[0][0]} ended at step {outcomes[-1][0]}: "
            f"{len(outcomes)} parts, " + ("; ".join(said) if said else "every one ok"))


def stopped_line(step: int, where: str) -> str:
    """What the stop policy raises (``numerics_audit_policy = "stop"``)."""
    return (f"{NAME} flagged step {step} ({where}) and "
            '[rocm] numerics_audit_policy = "stop"')


def quarantined_line(step: int, segment: str, why: str, before_s: float,
                     after_s: float) -> str:
    """Why (the flag's first line), and the flagged micro-batch's time compiled and with the segment
    eager."""
    return (f"{NAME} at step {step}: quarantined {segment} ({why}); step {step} redone with "
            f"it eager, and it stays eager for the rest of the run; the micro-batch's forward "
            f"and backward took {before_s:.3f} s compiled, {after_s:.3f} s with it eager")


def quarantine_cost_line(segment: str, steps: int, before_s: float, after_s: float) -> str:
    """The step time before and after the quarantine, each the mean of up to ``steps`` unaudited
    steps."""
    ratio = after_s / before_s if before_s > 0 else float("nan")
    return (f"{NAME}: quarantined {segment} costs {ratio:.2f} x the step time "
            f"({after_s:.3f} s against {before_s:.3f} s, mean of {steps} unaudited step(s) "
            "each side)")


def quarantine_failed_line(step: int, where: str, segment: str, since: int) -> str:
    """What the quarantine policy raises when a segment it made eager is flagged again."""
    return (f"{NAME} flagged step {step} ({where}) and {segment}, eager since its "
            f"quarantine at step {since}, is still wrong: "
            '[rocm] numerics_audit_policy = "quarantine" stops the run')


def unquarantinable_line(step: int, where: str, why: str) -> str:
    """What the quarantine policy raises for a flag it cannot act on."""
    return (f"{NAME} flagged step {step} ({where}) and quarantine cannot clear it ({why}): "
            '[rocm] numerics_audit_policy = "quarantine" stops the run')


VERDICT = re.compile(rf"{re.escape(NAME)} at step (?P<step>\d{{1,18}}): "
                     rf"(?P<verdict>{'|'.join(VERDICTS)})\b")
STOP = re.compile(rf"{re.escape(NAME)} flagged step (?P<step>\d{{1,18}})\b")
"""The stop policy's exception, wherever the log prints it."""
QUARANTINED = re.compile(rf"{re.escape(NAME)} at step (?P<step>\d{{1,18}}): quarantined "
                         r"(?P<segment>embedding|head|block [^\s()]{1,64}) \(")
COMPLETE = re.compile(rf"{re.escape(NAME)} begun at step (?P<begun>\d{{1,18}}) ended at step "
                      r"(?P<ended>\d{1,18}): (?P<parts>\d{1,6}) parts, (?P<said>.*)")
_STEPS = r"at step\(s\) \d{1,18}(?:, \d{1,18})*"
COMPLETE_SAID = re.compile(rf"every one ok|(?=[fs])(?P<flagged>flagged {_STEPS})?"
                           rf"(?:(?:; )?skipped {_STEPS})?")
"""The whole ``said`` as :func:`complete_line` writes it (a line cut or run into other output
does not match it)."""
AT_STEP = re.compile(rf"{re.escape(NAME)} at step (?P<step>\d{{1,18}})(?P<rest>.{{0,16}})")
AT_STEP_OUTCOME = re.compile(r": (?:OK|FLAGGED)\b| skipped: |: quarantined ")
"""A whole verdict, skip or quarantine line (anything else: the line was cut or split)."""
QUARANTINE_COST = re.compile(rf"{re.escape(NAME)}: quarantined (?P<segment>embedding|head|"
                             r"block [^\s()]{1,64}) costs (?P<ratio>\S{1,20}) x the step time")
