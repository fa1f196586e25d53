"""Huginn's samplers on a tiny random recurrent-depth model: the wavefront against upstream's layout of the same
sampler, its freeze rules on scripted latents (up to the last converged position; `fixed`; `token-stability`), a
wavefront of one with the paper's frozen token and adaptive exit is `adaptive`, `speculative` lossless against `ar`
(greedy, and exactly distributed by enumeration), the cache against a recompute, `ar`'s logprobs against a
teacher-forced forward, greedy without a seed reproducible, the wavefront's decision slacks (argmaxes and exit tests),
the published config's shapes, and settings of another sampler (or upstream keywords not served) refused by name."""

import itertools
import random
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from parallel_decoding.common.decoder import Limits
from parallel_decoding.common.errors import ConfigError
from parallel_decoding.common.grammar import Matcher
from parallel_decoding.common.huginn.config import HuginnConfig, check_engine_config
from parallel_decoding.common.huginn.decoder import HuginnDecoder, Row
from parallel_decoding.common.huginn.forward import RecurrentForward, RecurrentOutput, run_forward
from parallel_decoding.common.huginn.reference import generate
from parallel_decoding.common.models.raven import KVCache, RavenConfig, RavenForCausalLM
from parallel_decoding.common.sampling import SamplingParams, target_probs
from scripts.make_tiny_models import build_raven
from scripts.structured_requests import Grammars
from tests.support import naive_wavefront
from tests.support.exact import P_VALUE_FLOOR, chi_square_p_value, memo_recurrent_forwards
from tests.support.huginn_configs import HUGINN_0125

R = 8
MAX_TOKENS = 16
SAMPLES = 2000


@pytest.fixture(scope="module")
def raven():
    return build_raven(64, seed=1, mean_recurrence=R)


@pytest.fixture(scope="module")
def prompts():
    rng = random.Random(0)
    return [[rng.randrange(64) for _ in range(rng.randrange(2, 9))] for _ in range(6)]


def outputs(model, prompts, config: HuginnConfig, sampling: SamplingParams) -> list[list[int]]:
    return [generate(model, p, config, sampling, Limits(MAX_TOKENS)).token_ids for p in prompts]


WAVEFRONTS = {
    "latent-diff": {"exit_t": 0.2},
    "paper's frozen token": {"exit_t": 0.2, "frozen_token": "prediction", "init_scale": 0.0},
    "fixed": {"freeze_strategy": "fixed", "inner_recurrence": 2},
    "token-stability": {"freeze_strategy": "token-stability", "inner_recurrence": 2, "max_wavefront": 4},
    "mixers": {"exit_t": 0.2, "sqrt_mixer": True, "dampened_state_mixer": False, "continuous_compute": True},
    "step budget": {"exit_t": 0.0, "max_diffusion_steps": 6},
}


@pytest.mark.parametrize("settings", WAVEFRONTS.values(), ids=WAVEFRONTS.keys())
def test_wavefront_equals_upstreams_layout(raven, prompts, settings):
    """The decoder's rows give the tokens of the sampler written as upstream lays it out (one state tensor, a
    token sequence, freezing by cache-length arithmetic), greedy, for each freeze rule and mixer."""
    config = HuginnConfig(sampler="wavefront", num_steps=R, **settings)
    for prompt in prompts:
        got = generate(raven, prompt, config, SamplingParams(), Limits(MAX_TOKENS)).token_ids
        assert got == naive_wavefront.wavefront(raven, prompt, config, MAX_TOKENS)


@pytest.mark.parametrize("settings", [WAVEFRONTS["latent-diff"], WAVEFRONTS["token-stability"]],
                         ids=["latent-diff", "token-stability"])
def test_wavefront_penalises_each_position_for_the_tokens_before_it(raven, prompts, settings):
    """Under a repetition penalty each in-flight position's prediction is penalised for the committed tokens and
    the guesses before it, as upstream's layout with the penalty written in; the penalty changes the output."""
    config = HuginnConfig(sampler="wavefront", num_steps=R, **settings)
    changed = 0
    for prompt in prompts:
        got = generate(raven, prompt, config, SamplingParams(repetition_penalty=3.0), Limits(MAX_TOKENS)).token_ids
        assert got == naive_wavefront.wavefront(raven, prompt, config, MAX_TOKENS, repetition_penalty=3.0)
        changed += got != naive_wavefront.wavefront(raven, prompt, config, MAX_TOKENS)
    assert changed


@pytest.mark.parametrize("sampler", ["ar", "adaptive", "speculative"])
def test_samplers_apply_bias_penalties_and_allowed_tokens(raven, prompts, sampler):
    """A bias banning each output's most frequent token removes it, and a penalty changes the outputs
    (`speculative`: still AR's tokens under the same adjustments, lossless)."""
    config = HuginnConfig(sampler=sampler, num_steps=R, **({"exit_threshold": 0.05} if sampler == "adaptive" else {}))
    plain = outputs(raven, prompts, config, SamplingParams())
    for prompt, tokens in zip(prompts, plain, strict=True):
        banned = max(set(tokens), key=tokens.count)
        got = outputs(raven, [prompt], config, SamplingParams(logit_bias=((banned, -100.0),)))[0]
        assert banned not in got
        allowed = tuple(sorted(set(tokens) - {banned})) or (banned ^ 1,)
        assert set(outputs(raven, [prompt], config, SamplingParams(allowed_token_ids=allowed))[0]) <= set(allowed)
    penalised = outputs(raven, prompts, config, SamplingParams(repetition_penalty=3.0, frequency_penalty=1.0))
    assert penalised != plain
    if sampler == "speculative":
        ar = HuginnConfig(sampler="ar", num_steps=R)
        assert penalised == outputs(raven, prompts, ar, SamplingParams(repetition_penalty=3.0, frequency_penalty=1.0))


TRAINED = Path(__file__).resolve().parents[2] / "scripts" / "trained" / "raven"
CONSTRAINTS = [{"regex": "[a-z_]+\\(self(, [a-z_]+)*\\)"},
               {"json": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}}]


@pytest.mark.parametrize("settings", [pytest.param({"sampler": "ar"}, marks=pytest.mark.sweep, id="ar"),
                                      pytest.param({"sampler": "wavefront", "inner_recurrence": 4}, id="wavefront"),
                                      pytest.param({"sampler": "speculative"}, marks=pytest.mark.sweep,
                                                   id="speculative")])
def test_a_grammar_constrains_what_every_sampler_commits(settings):
    """On the trained Raven (r = 32), a regex and a JSON schema: every output is valid under its grammar (the
    wavefront masks each in-flight position after the guesses before it and commits the leading guesses the grammar
    accepts), `speculative` equals `ar` under it; without the grammar the outputs break it."""
    from transformers import AutoTokenizer

    model = RavenForCausalLM.from_pretrained(TRAINED)
    grammars = Grammars(TRAINED, model.config.vocab_size)
    tokenizer = AutoTokenizer.from_pretrained(TRAINED)
    prompts = [tokenizer.encode(text) for text in ("def __init__(self, name", "    return self._data[")]
    config = HuginnConfig(num_steps=32, **settings)
    limits = Limits(MAX_TOKENS, eos_token_ids=(tokenizer.eos_token_id,))  # the grammar's stop token ends a request
    broken = 0
    for prompt, constraint in itertools.product(prompts, CONSTRAINTS):
        got = generate(model, prompt, config, limits=limits, grammar=Matcher(grammars.matcher(constraint))).token_ids
        assert grammars.walk(constraint, got)[0], (settings, constraint, got)
        if settings["sampler"] == "speculative":
            assert got == generate(model, prompt, HuginnConfig(num_steps=32), limits=limits,
                                   grammar=Matcher(grammars.matcher(constraint))).token_ids
        broken += not grammars.walk(constraint, generate(model, prompt, config, limits=limits).token_ids)[0]
    assert broken


def scripted_step(raven, config: HuginnConfig, changes: list[float], decoder: HuginnDecoder | None = None
                  ) -> tuple[HuginnDecoder, list[int]]:
    """One wavefront step whose rows' latents change by `changes` (relative) and whose predictions are 20, 21, ...
    after a 2-token prompt and one committed token (rows' input tokens 10, 11, ... on a fresh decoder)."""
    d = raven.config.n_embd
    if decoder is None:
        decoder = HuginnDecoder([1, 2], SamplingParams(), Limits(MAX_TOKENS), config, raven, output=[3], cache_len=2)
        decoder.rows = [Row(10 + i, torch.ones(d)) for i in range(len(changes))]
    n = len(decoder.rows)
    grow = torch.tensor([c / (1 - c) for c in changes])[:, None]
    latents = torch.stack([row.latent for row in decoder.rows]) * (1 + grow)
    logits = torch.full((n, 64), -1.0).scatter(1, torch.arange(20, 20 + n)[:, None], 1.0)
    forward = RecurrentForward(torch.tensor([row.token for row in decoder.rows]), decoder.cache_len,
                               latents, config.inner_recurrence)
    return decoder, decoder.apply(forward, RecurrentOutput(latents, logits, torch.zeros(n, d)))


def test_wavefront_freezes_up_to_the_last_converged_row(raven):
    """Latent changes 0.5, 0.01, 0.2, 0.02, 0.3 against exit_t 0.03: the last row below it is row 3 (the first is
    not), so rows 0-2 freeze and commit their predictions 20-22; row 3 stays in flight with its input token 22
    frozen (upstream's rule), or freezes too and commits 23 (the paper's, `frozen_token` `prediction`)."""
    config = HuginnConfig(sampler="wavefront", num_steps=R, exit_t=0.03)
    decoder, committed = scripted_step(raven, config, [0.5, 0.01, 0.2, 0.02, 0.3])
    assert committed == [20, 21, 22] and decoder.cache_len == 5
    assert [row.token for row in decoder.rows] == [22, 23, 24]  # row 3, row 4, the new position
    assert torch.allclose(decoder.rows[0].latent, torch.ones(raven.config.n_embd) / 0.98)  # row 3's state kept
    paper = replace(config, frozen_token="prediction")
    decoder, committed = scripted_step(raven, paper, [0.5, 0.01, 0.2, 0.02, 0.3])
    assert committed == [20, 21, 22, 23] and decoder.cache_len == 6
    assert [row.token for row in decoder.rows] == [23, 24]
    _, committed = scripted_step(raven, config, [0.5, 0.2, 0.3])
    assert committed == []


def test_fixed_and_token_stability_freeze_by_count(raven):
    """`fixed` freezes the first row every step from step num_steps // inner_recurrence + 1 on; `token-stability`
    up to the last row whose input token the predictions matched more than num_steps // inner_recurrence times."""
    fixed = HuginnConfig(sampler="wavefront", num_steps=R, inner_recurrence=4, freeze_strategy="fixed")
    decoder, commits = None, []
    for _ in range(4):
        decoder, committed = scripted_step(raven, fixed, [0.5] * (len(decoder.rows) if decoder else 2), decoder)
        commits.append(committed)
    assert commits == [[], [], [], [20]]
    stability = HuginnConfig(sampler="wavefront", num_steps=R, inner_recurrence=4, max_wavefront=2,
                             freeze_strategy="token-stability")
    decoder, commits = None, []
    for _ in range(4):  # row 1's input 11 becomes 20, predicted again at each later step: 1, 2, 3 > 8 // 4 times
        decoder, committed = scripted_step(raven, stability, [0.5, 0.5], decoder)
        commits.append(committed)
    assert commits == [[], [], [], [20]]


def test_wavefront_of_one_with_adaptive_exit_is_adaptive(raven, prompts):
    sampling = SamplingParams(seed=5)
    adaptive = HuginnConfig(sampler="adaptive", num_steps=R, exit_threshold=0.3)
    results = [generate(raven, p, adaptive, sampling, Limits(MAX_TOKENS)) for p in prompts]
    assert 1 < sum(r.core_passes_per_token for r in results) / len(results) < R - 1  # exits really vary
    wave = HuginnConfig(sampler="wavefront", num_steps=R, inner_recurrence=1, exit_t=0.3, max_wavefront=1,
                        frozen_token="prediction", state_noise_mixing=0.0)
    assert outputs(raven, prompts, wave, sampling) == [r.token_ids for r in results]


def test_wavefront_advances_many_positions_at_once(raven, prompts):
    """With r' < r the wave holds several positions; its sequential core passes per token fall below r."""
    wave = HuginnConfig(sampler="wavefront", num_steps=R, inner_recurrence=2, freeze_strategy="fixed")
    result = generate(raven, prompts[0], wave, SamplingParams(seed=5), Limits(MAX_TOKENS))
    assert len(result.token_ids) == MAX_TOKENS
    assert result.core_passes_per_token < R / 2


def test_greedy_without_a_seed_reproduces(raven, prompts):
    """Temperature 0 without a seed draws its latents from seed 0, so every call gives the same text."""
    wave = HuginnConfig(sampler="wavefront", num_steps=R, inner_recurrence=2)
    unseeded = HuginnDecoder(prompts[0], SamplingParams(), Limits(MAX_TOKENS), wave, raven)
    seeded = HuginnDecoder(prompts[0], SamplingParams(seed=0), Limits(MAX_TOKENS), wave, raven)
    assert torch.equal(unseeded.latents(0, 4), seeded.latents(0, 4))
    assert outputs(raven, prompts, wave, SamplingParams()) == outputs(raven, prompts, wave, SamplingParams(seed=0))


def test_wavefront_notes_its_decisions_slack(raven, prompts, monkeypatch):
    """Per token, the slack of the argmaxes and exit tests taken while it was next: an exit threshold set to a
    latent change the wavefront measured is a tie (slack 0) at that token, which a tie-aware comparison cuts at."""
    import parallel_decoding.common.huginn.decoder as huginn

    wave = HuginnConfig(sampler="wavefront", num_steps=R, inner_recurrence=2)
    result = generate(raven, prompts[0], wave, SamplingParams(seed=5), Limits(MAX_TOKENS))
    decided = [m for m in result.margins if m < float("inf")]  # inf: committed in the step its predecessor was
    assert len(result.margins) == MAX_TOKENS and len(decided) > MAX_TOKENS // 2 and all(m > 0 for m in decided)
    changes = []
    measure = huginn.relative_change
    monkeypatch.setattr(huginn, "relative_change", lambda new, old: changes.append(measure(new, old)) or changes[-1])
    generate(raven, prompts[0], wave, SamplingParams(seed=5), Limits(MAX_TOKENS))
    monkeypatch.undo()
    first_wave_step = changes[0]  # the first in-flight position's, after the prefill committed one token
    tied = generate(raven, prompts[0], replace(wave, exit_t=first_wave_step), SamplingParams(seed=5),
                    Limits(MAX_TOKENS))
    assert tied.margins[1] == 0 and min(tied.margins[2:] + [1.0]) > 0, tied.margins


def test_speculative_greedy_equals_ar(raven, prompts):
    sampling = SamplingParams(seed=5)
    ar = outputs(raven, prompts, HuginnConfig(num_steps=R, cache_lookup_strategy="full"), sampling)
    for k in (1, 3, 6):
        spec = HuginnConfig(sampler="speculative", num_steps=R, draft_steps=2, lookahead_for_draft=k,
                            cache_lookup_strategy="full")
        assert outputs(raven, prompts, spec, sampling) == ar


def ar_joint(model, prompt: list[int], length: int, sampling: SamplingParams) -> dict[tuple[int, ...], float]:
    """The exact distribution of `ar`'s first `length` tokens (zero initial latents), by enumeration."""
    vocab = model.config.vocab_size
    joint = {}
    for seq in itertools.product(range(vocab), repeat=length):
        ids = torch.tensor(prompt + list(seq[:-1]))
        forward = RecurrentForward(ids, 0, torch.zeros(len(ids), model.config.n_embd), model.config.mean_recurrence)
        with torch.inference_mode():
            logits = run_forward(model, KVCache("full"), forward).logits[len(prompt) - 1:]
        probs = target_probs(logits, sampling)
        joint[seq] = float(torch.prod(probs[torch.arange(length), torch.tensor(seq)]))
    return joint


def speculative_p_value(model, joint: dict, prompt: list[int], length: int) -> float:
    spec = HuginnConfig(sampler="speculative", num_steps=3, draft_steps=1, lookahead_for_draft=2, init_scale=0.0,
                        cache_lookup_strategy="full")
    counts: dict[tuple[int, ...], int] = {}
    for seed in range(SAMPLES):
        got = tuple(generate(model, prompt, spec, SamplingParams(temperature=1.0, seed=seed), Limits(length)).token_ids)
        counts[got] = counts.get(got, 0) + 1
    return chi_square_p_value(counts, joint)


def test_speculative_sampling_follows_ar_distribution(monkeypatch):
    """On a vocabulary of 4, 3 tokens sampled by `speculative` (r = 3, drafts with 1 recurrence, rejection sampling,
    zero initial latents) follow `ar`'s exact joint (chi-square); drafts accepted unconditionally fail it."""
    import parallel_decoding.common.huginn.decoder
    import parallel_decoding.common.huginn.reference as reference

    monkeypatch.setattr(reference, "run_forward", memo_recurrent_forwards(run_forward))
    model = build_raven(4, seed=2, hidden_size=32, mean_recurrence=3)
    prompt, length = [1, 2], 3
    joint = ar_joint(model, prompt, length, SamplingParams(temperature=1.0))
    assert speculative_p_value(model, joint, prompt, length) > P_VALUE_FLOOR
    monkeypatch.setattr(parallel_decoding.common.huginn.decoder, "verify",
                        lambda drafts, logits, params, generator, probs=None: [
                            *drafts.tolist(),
                            int(torch.multinomial(target_probs(logits[-1:], params)[0], 1, generator=generator))])
    assert speculative_p_value(model, joint, prompt, length) < P_VALUE_FLOOR


@pytest.mark.parametrize("layout,steps", [("full", R), ("compress-s4", 1)])
def test_cached_ar_equals_recompute(raven, prompts, layout, steps):
    """`ar` on the cache equals recomputing the whole sequence each step (a parallel forward), exactly where the two
    see the same keys: always with `full`, with one recurrence under `compress-s4`."""
    sampling = SamplingParams(seed=5)
    config = HuginnConfig(num_steps=steps, cache_lookup_strategy=layout)
    for prompt, got in zip(prompts, outputs(raven, prompts, config, sampling), strict=True):
        decoder = HuginnDecoder(prompt, sampling, Limits(MAX_TOKENS), config, raven)
        tokens = list(prompt)
        for _ in range(MAX_TOKENS):
            forward = RecurrentForward(torch.tensor(tokens), 0, decoder.latents(0, len(tokens)), steps)
            with torch.inference_mode():
                tokens.append(int(run_forward(raven, KVCache(layout), forward).logits[-1].argmax()))
        assert got == tokens[len(prompt):]


@pytest.mark.parametrize("sampling", [SamplingParams(seed=5), SamplingParams(temperature=1.0, seed=7)],
                         ids=["greedy", "sampled"])
def test_ar_logprobs_are_the_teacher_forced_distribution(raven, prompts, sampling):
    """`ar`'s logprobs: each token's log-softmax in one parallel forward over the prompt and the output (the `full`
    cache, where the two see the same keys)."""
    config = HuginnConfig(num_steps=R, cache_lookup_strategy="full")
    for prompt in prompts:
        result = generate(raven, prompt, config, sampling, Limits(MAX_TOKENS))
        tokens = prompt + result.token_ids
        decoder = HuginnDecoder(prompt, sampling, Limits(MAX_TOKENS), config, raven)
        forward = RecurrentForward(torch.tensor(tokens[:-1]), 0, decoder.latents(0, len(tokens) - 1), R)
        with torch.inference_mode():
            rows = run_forward(raven, KVCache("full"), forward).logits[len(prompt) - 1 :].log_softmax(-1)
        want = rows.gather(-1, torch.tensor(result.token_ids)[:, None])[:, 0]
        assert torch.allclose(torch.tensor(result.logprobs), want, atol=1e-5)


def test_published_config_instantiates():
    config = RavenConfig.from_dict(HUGINN_0125)
    with torch.device("meta"):
        model = RavenForCausalLM(config)
    params = sum(p.numel() for p in model.parameters())
    assert 3.4e9 < params < 3.7e9, params
    assert model.lm_head.weight is model.transformer["wte"].weight
    assert config.head_dim == 96


def test_checkpoint_round_trip(raven, tmp_path, prompts):
    raven.save_pretrained(tmp_path)
    loaded = RavenForCausalLM.from_pretrained(tmp_path)
    sampling = SamplingParams(seed=5)
    assert outputs(loaded, prompts, HuginnConfig(num_steps=R), sampling) == outputs(
        raven, prompts, HuginnConfig(num_steps=R), sampling)


@pytest.mark.parametrize("settings,field", [
    ({"sampler": "ar", "draft_steps": 2}, "draft_steps"),
    ({"sampler": "wavefront", "exit_threshold": 0.1}, "exit_threshold"),
    ({"sampler": "adaptive", "cache_lookup_strategy": "full"}, "cache_lookup_strategy"),
    ({"sampler": "wavefront", "headway": 2}, "headway"),
    ({"sampler": "wavefront", "freeze_strategy": "latent-acceleration-1"}, "latent-acceleration-1"),
    ({"sampler": "wavefront", "full_prefill": False}, "full_prefill"),
    ({"sampler": "wavefront", "return_analysis_tablets": True}, "return_analysis_tablets"),
    ({"sampler": "wavefront", "max_wavefront": 1}, "max_wavefront"),
    ({"sampler": "wavefront", "frozen_token": "output"}, "frozen_token"),
    ({"sampler": "beam"}, "sampler"),
    ({"sampler": "speculative", "draft_steps": 40}, "draft_steps"),
])
def test_bad_settings_refused_by_name(settings, field):
    with pytest.raises(ConfigError, match=field):
        HuginnConfig(**settings)


def test_engines_refuse_an_unbounded_wavefront():
    """An engine's draft slots are `max_wavefront`'s rows: upstream's 0 (no bound) is the reference's alone."""
    with pytest.raises(ConfigError, match="max_wavefront"):
        check_engine_config(HuginnConfig(sampler="wavefront", max_wavefront=0), "vLLM")


def test_batched_training_forward_equals_cached_rows(raven, prompts):
    """The cache-free batched forward (training) gives the logits of a `full`-cache forward of each sequence."""
    ids = torch.tensor([p[:2] for p in prompts])
    positions = torch.arange(2)
    latents = torch.randn(len(prompts), 2, raven.config.n_embd, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        e = raven.embed(ids, positions, None)
        z = latents
        for t in range(3):
            z = raven.recur(z, e, positions, None, t)
        batched = raven.decode(z, positions, None)
        for b in range(len(prompts)):
            one = run_forward(raven, KVCache("full"), RecurrentForward(ids[b], 0, latents[b], 3)).logits
            torch.testing.assert_close(batched[b], one, rtol=1e-5, atol=1e-5)
