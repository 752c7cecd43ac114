"""The complete-fit tier (`bench pair`): whole short training runs, baseline and candidate alternating.

``make_plan`` checks the options and builds the plan; ``trial_factory`` (named in the plan) runs each trial
in a fresh worker process (``experiments.fit.worker``) on the real Ultralytics trainer
(``experiments.fit.ultralytics_fit``) or the embedded workload (``experiments.fit.embedded``);
``experiments.fit.report`` writes the tier's report section and the claim.
"""

from experiments.fit.plan import FitSettings, PlannedStop, make_plan, stop_after, trial_factory

__all__ = ["FitSettings", "PlannedStop", "make_plan", "stop_after", "trial_factory"]
