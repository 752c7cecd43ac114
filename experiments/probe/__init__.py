"""The head-memory probe tier (``bench probe``): a head's time and memory together under a device budget.

A head can look fast alone while the learner that carries it cannot fit; this tier measures one head step
(forward, backward, optimizer step) under a stated budget, records an out-of-memory as a result, and, given
the time of a whole learner step, states how much of it the head could ever save.

* ``lm``: softcapped LM head, ``native`` (materialized logits) or ``chunked`` (streamed, recomputed) —
  ``experiments.probe.lm``.
* ``detect``: the YOLO26 detect head rebuilt from the recorded shapes — ``experiments.probe.detect``.
* ``make_plan`` (``experiments.probe.plan``), ``trial_function`` (``plan.factory``,
  ``experiments.probe.trial``) and ``write_section`` (``plan.sections``, ``experiments.probe.section``).
"""

from experiments.probe.plan import make_plan
from experiments.probe.section import write_section
from experiments.probe.trial import trial_function

__all__ = ["make_plan", "trial_function", "write_section"]
