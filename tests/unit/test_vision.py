"""A vision-language model: prompts that carry generated images, the encoder cache judged against
cold B's image by image, path ``encoder_cache``'s twin caught by it, and the paths that cannot
text prompts SKIPPED with why, image prompts as ``vllm serve`` gets them. From records and files alone; the real engines are in
``tests/integration/test_vision.py``."""

from __future__ import annotations

import base64
import dataclasses
import io
import json

import jinja2
from PIL import Image

from harness.arm.engines import engine_args
from harness.arm.images import SERVED_CHAT_TEMPLATE, chat_content, engine_prompts, generated_image, image_uuid
from harness.checkpoints.read import image_token_id
from harness.judge.diff import compare_path
from harness.judge.verdict import VerdictStatus, judge, judge_sabotage
from harness.machinery.in_flight import in_flight_prompts
from harness.orchestrate.execute import unavailable_here
from harness.orchestrate.resolve import resolve_prompts
from harness.paths import PATHS
from harness.plan import PathNeeds, make_plan
from harness.records import EncoderCacheEntry, Observation
from harness.spec.checkpoint_set import CheckpointSet
from harness.spec.known_issues import KNOWN_ISSUES
from harness.spec.prompts import PROMPT_IMAGES, SHARED_PREFIX_TOKENS, image_split, with_images, without_images
from harness.spec.requirements import EngineRequirements
from harness.spec.run import JudgePolicy, PromptSpec, RunSpec
from tests.records import EXPECTED, QWEN_PACKED, A, B, arm, obs, segment

POLICY = JudgePolicy()
EMBEDDED_BY_B = (EncoderCacheEntry("img-0", "b0"), EncoderCacheEntry("img-1", "b1"))
EMBEDDED_BY_A = (EncoderCacheEntry("img-0", "a0"), EncoderCacheEntry("img-1", "a1"))


def caching(o: Observation, entries, kept: int) -> Observation:
    return dataclasses.replace(o, encoder_cache=entries, encoder_cache_kept=kept)


def comparison(warm_entries, kept: int, noise_entries=EMBEDDED_BY_B):
    steps = [caching(o, warm_entries, kept) for o in segment("p")]
    subj = arm("subject-p", "subject", caching(obs("cold_A", A), EMBEDDED_BY_A, 0), *steps, paths=("p",))
    ref = arm("reference", "reference", caching(obs("cold_B", B), EMBEDDED_BY_B, 0))
    noise = arm("noise", "noise", caching(obs("cold_B", B), noise_entries, 0))
    return compare_path("p", subj, ref, noise, "q_proj.weight", POLICY.logprob_atol, EXPECTED)


def test_embeddings_the_old_vision_tower_computed_fail_as_a_stale_encoder_cache():
    stale = judge(comparison(EMBEDDED_BY_A, kept=2), POLICY, False)
    assert stale.status is VerdictStatus.FAIL
    assert stale.reasons[0] == (
        "encoder cache stale: 2 of 2 image embedding(s) served after the refit differ from cold B's "
        "(the refit left 2 entries in it; first image img-0)"
    )
    fresh = judge(comparison(EMBEDDED_BY_B, kept=0), POLICY, False)
    assert fresh.status is VerdictStatus.PASS, fresh.reasons
    assert "encoder cache: the refit emptied it; the 2 image embedding(s) served after it equal cold B's" in fresh.notes
    # Entries kept across the refit but recomputed before being served are no failure; the note says so.
    kept = judge(comparison(EMBEDDED_BY_B, kept=2), POLICY, False)
    assert kept.status is VerdictStatus.PASS and any("the refit left 2 entries" in n for n in kept.notes)


def test_an_image_two_cold_starts_embed_differently_is_no_evidence():
    noisy = (EncoderCacheEntry("img-0", "b0-again"), EMBEDDED_BY_B[1])
    c = comparison(EMBEDDED_BY_A, kept=2, noise_entries=noisy)
    assert c.encoder_cache is not None and c.encoder_cache.compared == 1 and c.encoder_cache.stale == ("img-1",)
    assert comparison(None, kept=0).encoder_cache is None  # text prompts: nothing recorded


def test_the_twin_of_encoder_cache_is_caught_only_by_a_stale_embedding():
    left = comparison(EMBEDDED_BY_A, kept=2)
    outcome = judge_sabotage(
        left, judge(left, POLICY, False), "no reset", "encoder_cache", None, QWEN_PACKED, policy=POLICY
    )
    assert (
        outcome.caught and outcome.detail == "caught: 2 image embedding(s) served after the refit differ from cold B's"
    )
    # A stale weight instead: a FAIL, but not with what skipping the reset plants.
    weights = compare_path(
        "p",
        arm("subject-p", "subject", obs("cold_A", A), *segment("p", warm_b={**B, "norm": "a-n"}), paths=("p",)),
        arm("reference", "reference", obs("cold_B", B)),
        arm("noise", "noise", obs("cold_B", B)),
        "q_proj.weight",
        POLICY.logprob_atol,
        EXPECTED,
    )
    missed = judge_sabotage(
        weights, judge(weights, POLICY, False), "no reset", "encoder_cache", None, QWEN_PACKED, policy=POLICY
    )
    assert missed.verdict is VerdictStatus.FAIL and not missed.caught, missed


def test_a_stale_encoder_cache_is_explained_only_by_an_issue_of_it():
    (weight_update,) = [k for k in KNOWN_ISSUES if k.encoder_cache_stale]
    subject_issue = dataclasses.replace(weight_update, vllm=(), paths=())
    stale = comparison(EMBEDDED_BY_A, kept=2)
    assert judge(stale, POLICY, False, known=subject_issue).status is VerdictStatus.XFAIL
    other = dataclasses.replace(subject_issue, encoder_cache_stale=False, tokens_only=True)
    assert judge(stale, POLICY, False, known=other).status is VerdictStatus.FAIL  # no prefix-cache hits


def test_the_encoder_cache_issues_expect_nothing_of_a_text_model():
    """Both hold where prompts carry images; on a text model's PASS they must not turn it XPASS."""
    from harness.spec.known_issues import Subject

    image_issues = [k for k in KNOWN_ISSUES if k.images]
    assert len(image_issues) == 2, [k.title for k in image_issues]
    text = Subject("cpu (x86_64)", "0.32.0+cpu", "LlamaForCausalLM", "bfloat16")
    vision = dataclasses.replace(text, architecture="Idefics3ForConditionalGeneration", takes_images=True)
    for k in image_issues:
        assert all(k.applies(p, vision) and not k.applies(p, text) for p in k.paths), k.title


def vision_checkpoint(directory, image_token: int = 97, processor: bool = True):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(
        json.dumps({"image_token_id": image_token, "text_config": {"vocab_size": 512}})
    )
    if processor:
        (directory / "processor_config.json").write_text("{}")
    return directory


def test_a_checkpoint_takes_images_when_it_names_an_image_token_and_ships_a_processor(tmp_path):
    assert image_token_id(vision_checkpoint(tmp_path / "a")) == 97
    assert image_token_id(vision_checkpoint(tmp_path / "b", processor=False)) is None
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "config.json").write_text(json.dumps({"image_token_index": 5}))
    (tmp_path / "c" / "preprocessor_config.json").write_text("{}")
    assert image_token_id(tmp_path / "c") == 5  # LLaVA's key


def test_default_prompts_carry_one_image_placeholder_after_the_shared_prefix(tmp_path):
    spec = resolve_prompts(RunSpec(model=str(vision_checkpoint(tmp_path / "vlm")), paths=("reload_weights",)))
    prompts = spec.prompts
    assert prompts.images == tuple(i % PROMPT_IMAGES for i in range(len(prompts.token_ids)))
    for ids in prompts.token_ids:
        assert ids[SHARED_PREFIX_TOKENS] == 97 and ids.count(97) == 1
        assert len({p[:SHARED_PREFIX_TOKENS] for p in prompts.token_ids}) == 1  # the prefix cache still has it
    plain = vision_checkpoint(tmp_path / "text", processor=False)
    text = resolve_prompts(RunSpec(model=str(plain), paths=("reload_weights",)))
    assert text.prompts.images is None


def test_an_image_prompt_sends_the_same_pixels_under_the_same_id_from_every_arm():
    prompts = PromptSpec(token_ids=((1, 2), (3, 4), (5,)), images=(0, 1))
    sent = engine_prompts(prompts)
    assert [p.get("multi_modal_uuids") for p in sent] == [{"image": [image_uuid(0)]}, {"image": [image_uuid(1)]}, None]
    assert sent[0]["multi_modal_data"]["image"].tobytes() == generated_image(0).tobytes()
    assert generated_image(0).tobytes() != generated_image(1).tobytes()
    assert engine_prompts(PromptSpec(token_ids=((1, 2),))) == [{"prompt_token_ids": [1, 2]}]


CS = CheckpointSet(a="/a", b="/b", b_control="/c", control_tensor="norm")
NEEDS = {
    "reload_weights": PathNeeds(EngineRequirements(), ("B", "B", "B_control", "A")),
    "http_reload": PathNeeds(EngineRequirements(kind="http"), ("B", "B", "B_control", "A")),
    "encoder_cache": PathNeeds(PATHS.get("encoder_cache").requirements, ("B", "B", "B_control", "A")),
}
IMAGES = PromptSpec(token_ids=((1, 97, 2),), images=(0,))


def test_image_prompts_keep_the_tokenizer_vllms_processor_needs():
    spec = RunSpec(model="/a", paths=("reload_weights",), prompts=IMAGES)
    (planned, *_) = make_plan(spec, CS, {"reload_weights": NEEDS["reload_weights"]}, {}).arms
    args = engine_args(planned)
    assert args["skip_tokenizer_init"] is False and args["limit_mm_per_prompt"] == {"image": 1}
    text = RunSpec(model="/a", paths=("reload_weights",), prompts=PromptSpec(token_ids=((1, 2),)))
    (planned, *_) = make_plan(text, CS, {"reload_weights": NEEDS["reload_weights"]}, {}).arms
    assert engine_args(planned)["skip_tokenizer_init"] is True and "limit_mm_per_prompt" not in engine_args(planned)


def test_only_encoder_cache_without_images_is_skipped_with_why():
    classes = {name: PATHS.get(name) for name in NEEDS}
    assert unavailable_here(RunSpec(model="/a", paths=tuple(NEEDS), prompts=IMAGES), classes) == {}  # HTTP too
    text = unavailable_here(RunSpec(model="/a", paths=tuple(NEEDS), prompts=PromptSpec(token_ids=((1, 2),))), classes)
    assert set(text) == {"encoder_cache"} and "carry no image" in text["encoder_cache"]


def test_a_served_image_prompt_is_its_text_around_the_image_in_one_chat_message():
    ((ids,), _) = with_images(((5,) * SHARED_PREFIX_TOKENS + (6, 7),), image_token=97)
    before, after = image_split(ids)
    assert (before, after) == ((5,) * SHARED_PREFIX_TOKENS, (6, 7)) and before + (97,) + after == ids
    assert without_images((ids, ids)) == ((5,) * SHARED_PREFIX_TOKENS + (6, 7),) * 2
    text, image, tail = chat_content("before", 1, "after")
    assert (text["text"], image["uuid"], tail["text"]) == ("before", image_uuid(1), "after")
    png = base64.b64decode(image["image_url"]["url"].removeprefix("data:image/png;base64,"))
    assert Image.open(io.BytesIO(png)).tobytes() == generated_image(1).tobytes()  # lossless: the same pixels
    rendered = jinja2.Template(SERVED_CHAT_TEMPLATE).render(
        messages=[
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "image"}, {"type": "text", "text": "b"}],
            }
        ]
    )
    assert rendered == "a<image>b"


def test_in_flight_requests_stream_the_prompts_without_their_image():
    spec = PromptSpec(token_ids=((1,) * SHARED_PREFIX_TOKENS + (97, 2),), images=(0,))
    assert in_flight_prompts(spec) == ((1,) * SHARED_PREFIX_TOKENS + (2,),)
    assert in_flight_prompts(PromptSpec(token_ids=((1, 97, 2),))) == ((1, 97, 2),)  # no image: as they are
    assert in_flight_prompts(None) == () == in_flight_prompts(PromptSpec())
