"""What each arm ran, as the plan records it: the opening sentence, and which arms' verdicts are withheld.

Also the default arms on a device where the candidate would run the baseline's code.
"""

from __future__ import annotations

from experiments.arms import arm_code
from harness import options
from harness.codepaths import WITHHELD, all_same_code, same_code_arms, verdict_shown, what_ran
from harness.plan import Plan
from harness.protocol_options import ProtocolOptions
from harness.schedule import Arm, Case


def plan_with(specs: list[str], device: str = "cpu", control: bool = False, record: bool = True) -> Plan:
    if control:
        arms = (Arm(specs[0], "baseline", specs[0]), Arm(f"{specs[0]}-control", "candidate", specs[0]))
    else:
        arms = tuple(Arm(s, "baseline" if i == 0 else "candidate", s) for i, s in enumerate(specs))
    cases = [Case("only", {}, arms)]
    return Plan(
        tier="pair",
        protocol=ProtocolOptions(arms, device=device, control=control),
        cases=cases,
        unit="s",
        metric="whole-fit wall time",
        arm_code=arm_code(cases, device) if record else {},
    )


def test_two_computations_are_named_and_nothing_is_withheld() -> None:
    plan = plan_with(["baseline", "candidate-cpu"])
    line = what_ran(plan)
    assert line.startswith(
        "On cpu: baseline ran the per-parameter MuSGD (optimizers.musgd.MuSGD); candidate-cpu ran"
    )
    assert "CPU tensors routed through it" in line
    assert same_code_arms(plan) == {} and not all_same_code(plan)
    assert verdict_shown(plan, "candidate-cpu", "clears") == "clears"


def test_the_candidate_on_the_cpu_is_an_aa_in_effect_and_its_verdict_withheld() -> None:
    plan = plan_with(["baseline", "candidate"])
    assert what_ran(plan).startswith("An A/A in effect on cpu: every compared arm ran the baseline's code")
    assert all_same_code(plan) and list(same_code_arms(plan)) == ["candidate"]
    assert verdict_shown(plan, "candidate", "clears") == WITHHELD
    cuda = plan_with(["baseline", "candidate"], device="cuda")  # the record of a GPU run's plan
    assert what_ran(cuda).startswith("On cuda: ") and "batched Newton-Schulz" in what_ran(cuda)


def test_a_run_only_partly_of_the_same_code_says_which_arms() -> None:
    plan = plan_with(["baseline", "candidate", "candidate-cpu"])
    line = what_ran(plan)
    assert line.startswith("Partly an A/A in effect on cpu: candidate ran the baseline's code")
    assert "candidate-cpu ran the batched path" in line
    assert verdict_shown(plan, "candidate", "fails") == WITHHELD
    assert verdict_shown(plan, "candidate-cpu", "fails") == "fails"


def test_an_aa_control_is_one_by_design_and_keeps_its_verdict() -> None:
    plan = plan_with(["candidate"], control=True)
    assert what_ran(plan).startswith("A/A control on cpu: candidate ran the per-parameter step")
    assert same_code_arms(plan) == {} and verdict_shown(plan, "candidate-control", "within") == "within"


def test_a_plan_without_a_record_says_nothing() -> None:
    plan = plan_with(["baseline", "candidate"], record=False)
    assert what_ran(plan) is None and same_code_arms(plan) == {}
    assert Plan.from_json(plan.to_json()).arm_code == {}
    recorded = plan_with(["baseline", "candidate"])
    assert Plan.from_json(recorded.to_json()).arm_code == recorded.arm_code  # it travels in plan.json


def test_arms_not_given_take_the_devices_default_and_say_so() -> None:
    from experiments.arms import default_arms

    said: list[str] = []
    parsed = options.protocol_options(
        arms=None, device="cpu", announce=said.append, default_arms=default_arms
    )
    assert [a.spec for a in parsed.arms] == ["baseline", "candidate-cpu"]
    assert any(line.startswith("arms: baseline,candidate-cpu (the default on cpu:") for line in said)
    given = options.protocol_options(arms="baseline,candidate", device="cpu", default_arms=default_arms)
    assert [a.spec for a in given.arms] == ["baseline", "candidate"]  # what the user names, always
    assert [a.spec for a in options.protocol_options(arms=None, device="cpu").arms] == [
        "baseline",
        "candidate",
    ]
