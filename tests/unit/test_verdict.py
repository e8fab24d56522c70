from harness.judge.diff import compare_path
from harness.judge.verdict import VerdictStatus, judge, rebound_fails
from harness.spec.known_issues import KnownIssue, Subject
from harness.spec.run import JudgePolicy
from tests.records import EXPECTED, A, B, arm, obs, output, subject, tensor

POLICY = JudgePolicy()


def verdict(subj, ref_obs=None, noise_obs=None, fail_on_rebound=False, policy=POLICY):
    ref = arm("reference", "reference", ref_obs or obs("cold_B", B))
    noise = arm("noise", "noise", noise_obs or obs("cold_B", B))
    return judge(
        compare_path("p", subj, ref, noise, "q_proj.weight", policy.logprob_atol, EXPECTED), policy, fail_on_rebound
    )


def test_perfect_refit_passes():
    v = verdict(subject())
    assert v.status is VerdictStatus.PASS and v.control_detected


def test_stale_tensor_fails_and_is_named_first():
    v = verdict(subject(warm_b={**B, "norm": A["norm"]}, warm_b_again={**B, "norm": A["norm"]}))
    assert v.status is VerdictStatus.FAIL
    assert v.first_divergent_tensor == "norm (STALE, refit)"


def test_nan_in_warm_engine_fails():
    warm = [tensor(n, d, nan_count=1 if n == "w" else 0) for n, d in B.items()]
    v = verdict(subject(warm_b=warm, warm_b_again=warm))
    assert v.status is VerdictStatus.FAIL and "CORRUPT" in v.first_divergent_tensor


def test_missed_positive_control_is_inconclusive_not_pass():
    v = verdict(subject(control=B))  # B' observed identical to B: the planted change was not seen
    assert v.status is VerdictStatus.INCONCLUSIVE
    assert any("positive control not detected" in r for r in v.reasons)


def test_control_invisible_to_tokens_is_inconclusive():
    v = verdict(subject(outputs_control=[output(0, (1, 2, 3), -1.0)]))
    assert v.status is VerdictStatus.INCONCLUSIVE
    assert any("invisible to the token check" in r for r in v.reasons)


def test_real_failure_beats_missed_control():
    v = verdict(subject(warm_b={**B, "w": "garbage"}, control=B))
    assert v.status is VerdictStatus.FAIL


def test_token_divergence_is_judged_against_a_noisy_floor():
    diverge_at_2 = [output(0, (1, 2, 9))]
    # The two cold starts themselves diverge at token 1: a divergence at 2 is within noise.
    noisy = obs("cold_B", B, [output(0, (1, 7, 7))])
    assert verdict(subject(outputs_b=diverge_at_2), noise_obs=noisy).status is VerdictStatus.PASS
    # With a quiet floor, the same divergence fails.
    quiet = verdict(subject(outputs_b=diverge_at_2))
    assert quiet.status is VerdictStatus.FAIL
    assert any("diverges at token 2" in r and "noise floor: identical" in r for r in quiet.reasons)


def test_logprob_drift_beyond_tolerance_fails():
    v = verdict(subject(outputs_b=[output(0, (1, 2, 3), -1.01)]))
    assert v.status is VerdictStatus.FAIL and any("logprobs differ" in r for r in v.reasons)


def test_noisy_tensor_is_reported_not_judged():
    noisy_ref = obs("cold_B", {**B, "w": "other"})
    v = verdict(subject(warm_b={**B, "w": "third"}, warm_b_again={**B, "w": "third"}), noise_obs=noisy_ref)
    assert v.status is VerdictStatus.PASS
    assert any("noise floor: 1 tensor" in r for r in v.notes)


def test_rebound_policy():
    moved = [tensor(n, d, address=2000) for n, d in B.items()]
    subj = subject(warm_b=moved, warm_b_again=moved)
    assert verdict(subj, fail_on_rebound=True).status is VerdictStatus.FAIL
    warned = verdict(subj, fail_on_rebound=False)
    assert warned.status is VerdictStatus.PASS and any("REBOUND, not failing" in r for r in warned.notes)
    assert rebound_fails(JudgePolicy(rebound="auto"), "compiled", "NVIDIA H100")
    assert not rebound_fails(JudgePolicy(rebound="auto"), "eager", "NVIDIA H100")
    assert not rebound_fails(JudgePolicy(rebound="auto"), "compiled", "cpu (x86_64)")
    assert rebound_fails(JudgePolicy(rebound="fail"), "eager", "cpu")


def test_arm_error_is_error_verdict():
    broken = arm("subject-p", "subject", obs("cold_A", A), paths=("p",), error="engine died")
    v = verdict(broken)
    assert v.status is VerdictStatus.ERROR and any("engine died" in r for r in v.reasons)


KNOWN_STALE_KERNELS = KnownIssue(device="cpu", reason="kernels keep old weights", tensor_kinds=("kernel",))


def with_kinds(digests: dict[str, str]) -> list:
    return [tensor(n, d, kind="kernel" if "<kernel-output>" in n else "parameter") for n, d in digests.items()]


def known_verdict(subj, known):
    ref = arm("reference", "reference", obs("cold_B", with_kinds(B)))
    noise = arm("noise", "noise", obs("cold_B", with_kinds(B)))
    return judge(
        compare_path("p", subj, ref, noise, "q_proj.weight", POLICY.logprob_atol, EXPECTED), POLICY, False, known=known
    )


def stale(**overrides):
    warm = with_kinds({**B, **overrides})
    return subject(warm_b=warm, warm_b_again=warm, outputs_b=[output(0, (1, 2, 9))])


def test_failure_inside_a_known_issue_is_xfail_and_does_not_fail_the_run():
    v = known_verdict(stale(**{"qkv_proj.<kernel-output>": A["qkv_proj.<kernel-output>"]}), KNOWN_STALE_KERNELS)
    assert v.status is VerdictStatus.XFAIL
    assert v.reasons[0] == "known issue on cpu: kernels keep old weights"
    assert v.first_divergent_tensor == "qkv_proj.<kernel-output> (STALE, refit)"


def test_failure_beyond_the_known_issue_stays_fail():
    v = known_verdict(
        stale(**{"qkv_proj.<kernel-output>": A["qkv_proj.<kernel-output>"], "norm": A["norm"]}), KNOWN_STALE_KERNELS
    )
    assert v.status is VerdictStatus.FAIL
    assert "beyond this path's known issue" in v.reasons[-1]


def test_a_failure_two_known_issues_explain_together_is_xfail_naming_both():
    """Measured: Qwen3-MoE's kernel-format reload in fp32 has CORRUPT experts (the MoE issue)
    and stale oneDNN kernels (the path's own issue); neither explains the cell alone."""
    experts = KnownIssue(device="cpu", reason="experts corrupted", tensor_kinds=("parameter",), tensor_pattern="norm")
    both = stale(**{"qkv_proj.<kernel-output>": A["qkv_proj.<kernel-output>"], "norm": A["norm"]})
    assert known_verdict(both, KNOWN_STALE_KERNELS).status is VerdictStatus.FAIL
    assert known_verdict(both, experts).status is VerdictStatus.FAIL
    v = known_verdict(both, (experts, KNOWN_STALE_KERNELS))
    assert v.status is VerdictStatus.XFAIL
    assert v.reasons[:2] == ("known issue on cpu: experts corrupted", "known issue on cpu: kernels keep old weights")
    # Only what one of them names: a stale tensor neither covers keeps the FAIL.
    other = stale(**{"qkv_proj.<kernel-output>": A["qkv_proj.<kernel-output>"], "norm": A["norm"], "w": A["w"]})
    assert known_verdict(other, (experts, KNOWN_STALE_KERNELS)).status is VerdictStatus.FAIL


def test_token_divergence_alone_is_not_explained_by_a_tensor_scoped_issue():
    v = known_verdict(stale(), KNOWN_STALE_KERNELS)
    assert v.status is VerdictStatus.FAIL


def test_known_issue_that_no_longer_reproduces_is_xpass():
    v = known_verdict(subject(), KNOWN_STALE_KERNELS)
    assert v.status is VerdictStatus.XPASS and "did not reproduce" in v.reasons[0]


def test_known_error_is_xfail_and_any_other_error_stays_error():
    known = KnownIssue(device="cpu", reason="the saver drops empty parameters", error_contains="Missing keys")
    died = arm("subject-p", "subject", obs("cold_A", A), paths=("p",), error="ValueError: Missing keys ('w',)")
    assert known_verdict(died, known).status is VerdictStatus.XFAIL
    other = arm("subject-p", "subject", obs("cold_A", A), paths=("p",), error="engine died")
    assert known_verdict(other, known).status is VerdictStatus.ERROR


def test_known_issue_is_picked_by_the_recorded_device():
    from harness.paths import PATHS

    kernel_format = PATHS.get("reload_kernel_format")
    assert kernel_format.known_issue(Subject("cpu (x86_64)", dtype="float32")).tensor_kinds == ("kernel",)
    assert kernel_format.known_issue(Subject("NVIDIA H100 80GB HBM3")) is None
    assert PATHS.get("reload_weights").known_issue(Subject("cpu (x86_64)")) is None


def test_a_name_scoped_known_issue_explains_only_tensors_matching_its_pattern():
    experts = KnownIssue(
        device="cpu", reason="expert weights corrupted", tensor_kinds=("parameter",), tensor_pattern=r"^w$"
    )  # "w" stands for an expert weight here
    inside = known_verdict(stale(w="corrupt"), experts)
    assert inside.status is VerdictStatus.XFAIL, inside.reasons
    beyond = known_verdict(stale(w="corrupt", norm=A["norm"]), experts)  # a parameter outside the pattern
    assert beyond.status is VerdictStatus.FAIL and "beyond this path's known issue" in beyond.reasons[-1]
