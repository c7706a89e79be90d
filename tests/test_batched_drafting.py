"""A batch drafts together: rows whose drafters share a feature head, or a draft LM, run one forward a draft
step between them, and each row drafts exactly what it drafts alone — its tokens, its q, its γ, its stop."""

import pytest
import torch

import specdemo
from specdemo.engine.batch import generate_batch
from specdemo.engine.drafters.base import Proposal
from specdemo.engine.drafters.feature_drafter import FeatureDrafter, propose_rows
from specdemo.engine.drafters.model import ModelDrafter
from specdemo.engine.drafters.model import propose_rows as propose_lm_rows
from specdemo.engine.targets.batched import BatchedLM
from specdemo.engine.methods import get_method
from specdemo.engine.params import DecodeParams
from tests.tiny import build_tiny_pair, write_tiny_head

MAX_NEW = 32
PROMPTS = [[5, 9, 11, 12], [30, 31], [7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17], [40, 41, 42], [3]]
# Float32 head steps over several rows run other matmul kernels than one row's: q agrees to rounding.
Q_TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-12}


@pytest.fixture(scope="module")
def headed(tmp_path_factory):
    root = tmp_path_factory.mktemp("headed")
    build_tiny_pair(root)
    write_tiny_head(root / "head", root / "target")
    return specdemo.load_pair(str(root / "target"), str(root / "head"), device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def lm_drafted(tmp_path_factory):
    return build_tiny_pair(tmp_path_factory.mktemp("lm_drafted"), dtype="float32")


def alone(pair, prompt, method, **params):
    return specdemo.generate(pair, prompt, method, max_new_tokens=MAX_NEW, **params)


@pytest.mark.parametrize("drafted_by", ["headed", "lm_drafted"])
@pytest.mark.parametrize("method, params", [("sd", dict(copy_n=0)), ("sd", dict()), ("egag", dict(copy_n=0)),
                                            ("sd", dict(copy_n=0, gamma=2)), ("adaedl", dict())])
def test_greedy_rows_equal_ar_and_sd_alone(request, drafted_by, method, params):
    headed = request.getfixturevalue(drafted_by)
    rows = generate_batch(headed, PROMPTS, method, max_new_tokens=MAX_NEW, temperature=0.0, **params)
    assert [r.token_ids for r in rows] == [alone(headed, p, "ar", temperature=0.0).token_ids for p in PROMPTS]
    singles = [alone(headed, p, method, temperature=0.0, **params) for p in PROMPTS]
    assert [[(r.drafted, r.accepted) for r in row.rounds] for row in rows] == \
           [[(r.drafted, r.accepted) for r in row.rounds] for row in singles]


def test_rows_draft_in_one_head_forward_a_step(headed):
    rows = generate_batch(headed, PROMPTS, "sd", max_new_tokens=MAX_NEW, temperature=0.0, copy_n=0)
    assert all(r.rounds and r.batch_rows_drafting for r in rows)
    first = rows[0].batch_rows_drafting[0]
    assert first == len(PROMPTS) - 1  # the one-token prompt has no feature to draft from yet
    assert all(r.rounds[0].draft_seconds == rows[0].rounds[0].draft_seconds for r in rows)


def test_a_sampled_rows_q_in_a_batch_is_its_q_alone(headed):
    """The drafter's q at each draft of a row, batched with strangers, against the same row drafting alone."""
    params = DecodeParams.resolve(None, temperature=0.9, top_k=20, copy_n=0, gamma=4)
    spec = get_method("sd")

    def drafters_started(prompts):
        built = []
        with torch.inference_mode():
            for prompt in prompts:
                drafter, policy = spec.build(headed, params)
                assert isinstance(drafter, FeatureDrafter) and drafter.batch_group is not None
                states = headed.target(input_ids=torch.tensor([prompt]), output_hidden_states=True).hidden_states[-1]
                drafter.start(prompt + [prompt[-1]], states[0])
                built.append((drafter, policy))
        return built

    contexts = [p + [p[-1]] for p in PROMPTS[:4]]
    together = drafters_started(PROMPTS[:4])
    with torch.inference_mode():
        batched = propose_rows([d for d, _ in together], contexts, [p for _, p in together], [MAX_NEW] * 4,
                               params.sampling, [torch.Generator().manual_seed(i) for i in range(4)])
        for i, (drafter, policy) in enumerate(drafters_started(PROMPTS[:4])):
            single: Proposal = drafter.propose(contexts[i], policy, MAX_NEW, params.sampling,
                                               torch.Generator().manual_seed(i))
            assert torch.equal(batched[i].tokens, single.tokens)
            assert len(single.tokens) == 4
            torch.testing.assert_close(batched[i].draft_probs, single.draft_probs, rtol=0,
                                       atol=Q_TOLERANCE[torch.float32])


def test_a_drafting_row_does_not_depend_on_its_batch_mates(headed):
    prompt = [5, 9, 11, 12]
    params = dict(max_new_tokens=MAX_NEW, temperature=1.0, seed=7, copy_n=0)
    first = generate_batch(headed, [[30, 31], prompt, [7] * 11], "sd", **params)[1]
    second = generate_batch(headed, [[40, 41, 42, 43, 44, 45, 46], prompt, [8, 9]], "sd", **params)[1]
    assert first.token_ids == second.token_ids
    assert [r.accepted for r in first.rounds] == [r.accepted for r in second.rounds]


def test_a_draft_step_is_one_head_forward_for_every_row(headed, monkeypatch):
    from specdemo.engine.drafters.feature_head import FeatureHead

    steps = []
    original = FeatureHead.step_rows
    monkeypatch.setattr(FeatureHead, "step_rows", lambda self, features, *rest: steps.append(len(features))
                        or original(self, features, *rest))
    rows = generate_batch(headed, PROMPTS[:4], "sd", max_new_tokens=8, temperature=0.0, copy_n=0, gamma=4)
    assert max(steps) == 4
    per_row_steps = sum(max(len(r.drafted) - 1, 0) for row in rows for r in row.rounds)
    assert sum(steps) == per_row_steps and len(steps) < per_row_steps


def test_the_online_head_drafts_its_rows_together(headed, monkeypatch):
    from specdemo.engine.drafters.feature_head import FeatureHead
    from specdemo.engine.drafters.online import forget_online

    steps = []
    original = FeatureHead.step_rows
    monkeypatch.setattr(FeatureHead, "step_rows", lambda self, features, *rest: steps.append(len(features))
                        or original(self, features, *rest))
    forget_online(headed.draft)
    rows = generate_batch(headed, PROMPTS[:4], "osd", max_new_tokens=MAX_NEW, temperature=0.0, copy_n=0)
    assert [r.token_ids for r in rows] == [alone(headed, p, "ar", temperature=0.0).token_ids for p in PROMPTS[:4]]
    assert max(steps) == 4
    forget_online(headed.draft)


def test_a_draft_lm_step_is_one_forward_for_every_row(lm_drafted, monkeypatch):
    steps = []
    original = BatchedLM.feed
    monkeypatch.setattr(BatchedLM, "feed", lambda self, drafts: steps.append(len(drafts)) or original(self, drafts))
    rows = generate_batch(lm_drafted, PROMPTS[:4], "sd", max_new_tokens=8, temperature=0.0, copy_n=0, gamma=4)
    assert max(steps) == 4
    per_row_steps = sum(max(len(r.drafted) - 1, 0) for row in rows for r in row.rounds)
    assert sum(steps) == per_row_steps and len(steps) < per_row_steps
    # A row's forwards: its prompt's read with its first draft, then each step and round it took part in.
    assert all(row.draft_forwards == len(row.rounds) + sum(max(len(r.drafted) - 1, 0) for r in row.rounds)
               for row in rows)


def test_a_sampled_rows_draft_lm_q_in_a_batch_is_its_q_alone(lm_drafted):
    params = DecodeParams.resolve(None, temperature=0.9, top_k=20, copy_n=0, gamma=4)
    spec = get_method("sd")
    contexts = [p + [p[-1]] for p in PROMPTS]

    def drafters_started(seated: bool):
        built = [spec.build(lm_drafted, params) for _ in contexts]
        assert all(isinstance(d, ModelDrafter) and d.batch_group is not None for d, _ in built)
        if seated:
            ModelDrafter.join_batch([d for d, _ in built])
        for (drafter, _), context in zip(built, contexts):
            drafter.start(context)
        return built

    with torch.inference_mode():
        together = drafters_started(seated=True)
        batched = propose_lm_rows([d for d, _ in together], contexts, [p for _, p in together], [MAX_NEW] * 5,
                                  params.sampling, [torch.Generator().manual_seed(i) for i in range(5)])
        for i, (drafter, policy) in enumerate(drafters_started(seated=False)):
            single = drafter.propose(contexts[i], policy, MAX_NEW, params.sampling, torch.Generator().manual_seed(i))
            assert len(single.tokens) == 4 and torch.equal(batched[i].tokens, single.tokens)
            torch.testing.assert_close(batched[i].draft_probs, single.draft_probs, rtol=0,
                                       atol=Q_TOLERANCE[torch.float32])


def test_a_draft_lm_row_does_not_depend_on_its_batch_mates(lm_drafted):
    prompt = [5, 9, 11, 12]
    params = dict(max_new_tokens=MAX_NEW, temperature=1.0, seed=7, copy_n=0)
    first = generate_batch(lm_drafted, [[30, 31], prompt, [7] * 11], "sd", **params)[1]
    second = generate_batch(lm_drafted, [[40, 41, 42, 43, 44, 45, 46], prompt, [8, 9], [3]], "sd", **params)[1]
    assert first.token_ids == second.token_ids
    assert [r.accepted for r in first.rounds] == [r.accepted for r in second.rounds]


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    from tests.published_heads import write_eagle, write_eagle3, write_medusa
    from tests.test_published_drafters import tiny_target

    root = tmp_path_factory.mktemp("published_batch")
    target = tiny_target(root / "target")
    writers = {"eagle": write_eagle, "eagle3": lambda f, t: write_eagle3(f, t, draft_size=40), "medusa": write_medusa}
    return {name: specdemo.load_pair(str(target), str(write(root / name, target)), device="cpu", dtype="float64")
            for name, write in writers.items()}


@pytest.mark.parametrize("name", ["eagle", "eagle3", "medusa"])
@pytest.mark.parametrize("method, params", [("sd", dict(copy_n=0, gamma=3)), ("egag", dict(copy_n=0)),
                                            ("adaedl", dict())])
def test_a_published_heads_rows_draft_together_and_equal_ar_alone(published, name, method, params):
    pair = published[name]
    prompts = [[1, 5, 9, 13, 5, 9], [1, 20, 21, 22, 23, 24, 25, 26], [1, 7], [1, 40, 41]]
    drafters = [get_method(method).build(pair, DecodeParams.resolve(None, **params))[0] for _ in prompts]
    assert all(d.batch_group is pair.draft for d in drafters)
    rows = generate_batch(pair, prompts, method, max_new_tokens=MAX_NEW, temperature=0.0, **params)
    assert [r.token_ids for r in rows] == [alone(pair, p, "ar", temperature=0.0).token_ids for p in prompts]
    singles = [alone(pair, p, method, temperature=0.0, **params) for p in prompts]
    assert [[(r.drafted, r.accepted) for r in row.rounds] for row in rows] == \
           [[(r.drafted, r.accepted) for r in row.rounds] for row in singles]
    assert max(max(r.batch_rows_drafting) for r in rows) > 1
