"""Huginn's samplers for recurrent-depth models (seed 000), per request, with their reference runner.

Every forward is a `RecurrentForward`: rows at consecutive positions after the cached prefix, each with a latent;
the prelude embeds the rows, the core runs `inner` recurrences on their latents, the coda gives logits. Samplers:

- `ar`: one token per forward, `num_steps` recurrences from a fresh latent.
- `adaptive`: one recurrence per forward until the latent's relative change falls below `exit_threshold` (at most
  `num_steps`), then the token.
- `speculative`: `lookahead_for_draft` tokens drafted one by one with `draft_steps` recurrences, verified in one
  forward with `num_steps` (greedy match, or rejection sampling against the drafts' own distributions): lossless
  against `ar` on the `full` cache, where a parallel forward and a token-by-token one see the same KV.
- `wavefront`: the diffusion-forcing sampler (Algorithm 2) as upstream's `generate_diffusion_style` runs it, under
  its keyword names: every in-flight position advances `inner_recurrence` recurrences per step with its latent
  kept across steps and its input token the previous position's latest prediction; a position enters each step
  (up to `max_wavefront`, 0: no bound); input embeddings with momentum `ema_embeds` (a new position's scaled by
  1 - `ema_embeds`, as upstream's are); state noise `state_noise_mixing` / (1 + the position's recurrences)
  (`dampened_state_mixer`, `sqrt_mixer`); a new position starts from a fresh latent or its predecessor's
  (`continuous_compute`). The positions up to the *last* one that passed `freeze_strategy`'s test freeze (no
  per-position cap): `latent-diff` (relative latent change below `exit_t`), `token-stability`, or `fixed` (the
  first position each step after num_steps // inner_recurrence steps). Their KV stays and their predictions
  are committed; the last one stays in flight with its input token frozen (upstream's rule, `frozen_token`
  `input`), or freezes with its prediction (the paper's text, `frozen_token` `prediction`). Past
  `max_diffusion_steps` steps, where upstream stops, the first position freezes every step. Refused by name:
  `headway` > 1, `full_prefill` false, the `latent-acceleration` strategies and the analysis tablets.

Initial latents are drawn per position from the request's seed, so a position starts from the same latent in
every sampler and every batch; a greedy request without a seed uses `GREEDY_LATENT_SEED`, so that temperature 0
gives the same text on every call (upstream draws fresh latents each time). The settings carry upstream
`generate()`'s keyword names.
"""

from dataclasses import dataclass, field, fields

import torch

from common import margins
from common.acceptance import verify
from common.decoder import Limits
from common.errors import ConfigError, require
from common.models.raven import Cache, KVCache, RavenConfig, RavenForCausalLM
from common.sampling import SamplingParams, choose, target_probs

SAMPLERS = ("ar", "adaptive", "speculative", "wavefront")
SAMPLER_FIELDS = {
    "ar": {"cache_lookup_strategy"},
    "adaptive": {"criterion", "exit_threshold"},
    "speculative": {"draft_steps", "lookahead_for_draft", "cache_lookup_strategy"},
    "wavefront": {"inner_recurrence", "exit_t", "freeze_strategy", "ema_embeds", "state_noise_mixing",
                  "max_wavefront", "headway", "dampened_state_mixer", "sqrt_mixer", "continuous_compute",
                  "max_diffusion_steps", "full_prefill", "return_analysis_tablets", "return_full_state_tablet",
                  "frozen_token", "cache_lookup_strategy"},
}
FREEZE_STRATEGIES = ("latent-diff", "fixed", "token-stability")
REFUSED_FREEZE_STRATEGIES = ("latent-acceleration-1", "latent-acceleration-2")
COMMON_FIELDS = {"sampler", "num_steps", "init_scale"}
LATENT_SEED_STRIDE = 1_000_003
GREEDY_LATENT_SEED = 0  # the latent (and state-noise) seed of a greedy request without one: temperature 0 reproduces


@dataclass(frozen=True)
class HuginnConfig:
    """A sampler and its settings; a setting of another sampler is refused by name."""

    sampler: str = "ar"
    num_steps: int = 32
    init_scale: float = 1.0
    cache_lookup_strategy: str = "compress-s4"
    criterion: str = "latent-diff"
    exit_threshold: float = 0.03
    draft_steps: int = 4
    lookahead_for_draft: int = 8
    inner_recurrence: int = 4
    exit_t: float = 0.03
    freeze_strategy: str = "latent-diff"
    ema_embeds: float = 0.1
    state_noise_mixing: float = 0.5
    max_wavefront: int = 128
    headway: int = 1
    dampened_state_mixer: bool = True
    sqrt_mixer: bool = False
    continuous_compute: bool = False
    max_diffusion_steps: int = 4096
    full_prefill: bool = True
    return_analysis_tablets: bool = False
    return_full_state_tablet: bool = False
    frozen_token: str = "input"

    def __post_init__(self) -> None:
        require(self.sampler in SAMPLERS, "sampler", f"one of {SAMPLERS}", self.sampler)
        for f in fields(self):
            unused = f.name not in COMMON_FIELDS | SAMPLER_FIELDS[self.sampler]
            if unused and getattr(self, f.name) != f.default:
                raise ConfigError(f"{f.name} does not apply to the {self.sampler!r} sampler")
        require(isinstance(self.num_steps, int) and self.num_steps >= 1, "num_steps", "a positive integer",
                self.num_steps)
        require(self.cache_lookup_strategy in ("compress-s4", "full"), "cache_lookup_strategy",
                "'compress-s4' or 'full'", self.cache_lookup_strategy)
        require(self.criterion == "latent-diff", "criterion", "'latent-diff'", self.criterion)
        require(self.exit_threshold >= 0 and self.exit_t >= 0, "exit_threshold", ">= 0",
                min(self.exit_threshold, self.exit_t))
        if self.sampler == "speculative":
            require(1 <= self.draft_steps < self.num_steps, "draft_steps", "in [1, num_steps)", self.draft_steps)
        require(self.lookahead_for_draft >= 1, "lookahead_for_draft", ">= 1", self.lookahead_for_draft)
        if self.sampler == "wavefront":
            require(1 <= self.inner_recurrence <= self.num_steps, "inner_recurrence", "in [1, num_steps]",
                    self.inner_recurrence)
        if self.freeze_strategy in REFUSED_FREEZE_STRATEGIES:
            raise ConfigError(f"freeze_strategy {self.freeze_strategy!r} is not served (one of {FREEZE_STRATEGIES})")
        require(self.freeze_strategy in FREEZE_STRATEGIES, "freeze_strategy", f"one of {FREEZE_STRATEGIES}",
                self.freeze_strategy)
        require(0 <= self.ema_embeds < 1, "ema_embeds", "in [0, 1)", self.ema_embeds)
        require(0 <= self.state_noise_mixing <= 1, "state_noise_mixing", "in [0, 1]", self.state_noise_mixing)
        least = 2 if self.frozen_token == "input" and self.freeze_strategy != "fixed" else 1
        require(self.max_wavefront >= least or self.max_wavefront == 0, "max_wavefront",
                f">= {least} (a wave of one whose first row is frozen never commits), or 0 for no bound",
                self.max_wavefront)
        require(self.headway == 1, "headway", "1 (one new position per step)", self.headway)
        require(self.max_diffusion_steps >= 1, "max_diffusion_steps", ">= 1", self.max_diffusion_steps)
        require(self.full_prefill is True, "full_prefill", "true (the engines prefill the prompt)", self.full_prefill)
        for name in ("return_analysis_tablets", "return_full_state_tablet"):
            require(getattr(self, name) is False, name, "false (no analysis tablets are served)", getattr(self, name))
        require(self.frozen_token in ("input", "prediction"), "frozen_token", "'input' or 'prediction'",
                self.frozen_token)


ENGINE_SAMPLERS = ("ar", "adaptive", "wavefront")


def check_engine_config(config: HuginnConfig, engine: str) -> None:
    """What the engines serve: their samplers (the speculative sampler's drafts run at positions an engine has not
    scheduled) and one KV slot per core layer."""
    if config.sampler not in ENGINE_SAMPLERS:
        raise ConfigError(f"sampler must be one of {list(ENGINE_SAMPLERS)} on {engine}, got {config.sampler!r} (the "
                          f"speculative sampler's drafts run at positions {engine} has not scheduled)")
    if config.sampler == "wavefront" and config.max_wavefront == 0:
        raise ConfigError(f"max_wavefront must be >= 1 on {engine} (its rows are the step's draft slots), got 0")
    if config.cache_lookup_strategy != "compress-s4":
        raise ConfigError(f"cache_lookup_strategy must be 'compress-s4' on {engine} (one KV slot per core layer), "
                          f"got {config.cache_lookup_strategy!r}")


@dataclass
class RecurrentForward:
    """Rows at positions start.. (after `start` cached positions): tokens, the latents the core starts from,
    `inner` recurrences numbered from `first_recurrence`, and the previous step's embeddings of the leading rows
    (mixed in with weight `ema`)."""

    token_ids: torch.Tensor
    start: int
    latents: torch.Tensor
    inner: int
    first_recurrence: int = 0
    previous_embeds: torch.Tensor | None = None
    ema: float = 0.0

    @property
    def positions(self) -> torch.Tensor:
        return torch.arange(self.start, self.start + self.token_ids.numel())


@dataclass
class RecurrentOutput:
    latents: torch.Tensor
    logits: torch.Tensor
    embeds: torch.Tensor


@dataclass
class RecurrentRows:
    """The recurrent state of the rows of one or more forwards, concatenated as an engine batches them: each row's
    starting latent, recurrence count and, where `mixed`, the previous embedding mixed in with weight `ema`."""

    latents: torch.Tensor
    inner: torch.Tensor
    previous_embeds: torch.Tensor
    mixed: torch.Tensor
    ema: float = 0.0
    first_recurrence: int = 0

    @classmethod
    def of(cls, forwards: list[RecurrentForward]) -> "RecurrentRows":
        """The rows of `forwards` in order (one `ema` and `first_recurrence` for all: one config per engine)."""
        latents = torch.cat([f.latents for f in forwards])
        previous, mixed = torch.zeros_like(latents), torch.zeros(latents.shape[0], dtype=torch.bool)
        start = 0
        for f in forwards:
            if f.previous_embeds is not None and f.ema > 0:
                previous[start : start + f.previous_embeds.shape[0]] = f.previous_embeds
                mixed[start : start + f.previous_embeds.shape[0]] = True
            start += f.token_ids.numel()
        inner = torch.cat([torch.full((f.token_ids.numel(),), f.inner) for f in forwards])
        return cls(latents, inner, previous, mixed, max((f.ema for f in forwards), default=0.0),
                   forwards[0].first_recurrence)


def unplanned_rows(model: RavenForCausalLM, positions: torch.Tensor) -> RecurrentRows:
    """What an engine's forward nobody planned runs: `mean_recurrence` recurrences from latent seed 0."""
    n = positions.shape[0]
    latents = torch.cat([initial_latents(model, 0, int(p), 1) for p in positions.tolist()]) if n else torch.zeros(
        0, model.config.n_embd)
    return RecurrentRows(latents, torch.full((n,), model.config.mean_recurrence), torch.zeros_like(latents),
                         torch.zeros(n, dtype=torch.bool))


@dataclass
class RowsOutput:
    latents: torch.Tensor
    hidden: torch.Tensor
    embeds: torch.Tensor


def run_rows(model: RavenForCausalLM, cache: Cache, token_ids: torch.Tensor, positions: torch.Tensor,
             rows: RecurrentRows) -> RowsOutput:
    """The batched forward both the reference and the engines run: prelude, each row's own number of core
    recurrences from its latent, coda; the coda's hidden states (the LM head is the caller's)."""
    e = model.embed(token_ids, positions, cache)
    if bool(rows.mixed.any()):
        # (1 - ema) e + ema e_prev, written so that an unchanged embedding stays bit for bit what it was
        e = torch.where(rows.mixed[:, None], e + rows.ema * (rows.previous_embeds.to(e) - e), e)
    z = model.recur_rows(rows.latents.to(e), e, positions, cache, rows.inner.to(e.device), rows.first_recurrence)
    return RowsOutput(z, model.hidden(z, positions, cache), e)


class StagedRaven(RavenForCausalLM):
    """The model as the engines run it: the `huginn` adapter stages the rows' recurrent state (`rows`) just before a
    forward and reads their latents and embeddings (`last`) after it; a forward nobody staged (warm-up, a prefill
    outside the method) runs `unplanned_rows`."""

    def __init__(self, config: RavenConfig) -> None:
        super().__init__(config)
        self.rows: RecurrentRows | None = None
        self.last: RowsOutput | None = None
        self.core_passes = 0  # sequential passes of the core block so far, the cost that sets a step's latency

    def run_staged(self, cache: Cache, token_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The coda's hidden states of one engine forward."""
        rows, self.rows = self.rows, None
        if rows is None:
            rows = unplanned_rows(self, positions)
        elif rows.latents.shape[0] != token_ids.shape[0]:
            raise RuntimeError(f"{rows.latents.shape[0]} rows staged for a forward of {token_ids.shape[0]} tokens")
        self.last = run_rows(self, cache, token_ids, positions, rows)
        self.core_passes += int(rows.inner.max()) if rows.inner.numel() else 0
        return self.last.hidden


def run_forward(model: RavenForCausalLM, cache: KVCache, forward: RecurrentForward) -> RecurrentOutput:
    """Execute one forward on `cache` (cropped to the rows' start first)."""
    cache.crop(forward.start)
    out = run_rows(model, cache, forward.token_ids, forward.positions, RecurrentRows.of([forward]))
    return RecurrentOutput(out.latents, model.lm_head(out.hidden).float(), out.embeds)


@dataclass
class Row:
    """An in-flight position of the wavefront."""

    token: int
    latent: torch.Tensor
    recurrences: int = 0  # as upstream counts them at the position: the prefill's, then each step's
    embed: torch.Tensor | None = None  # the last step's input embedding (zeros: a new row, scaled by 1 - ema)
    stable: int = 0  # steps whose prediction matched this row's input token (`token-stability`)


@dataclass
class HuginnDecoder(margins.DecisionMargins):
    """One request: plan the next forward, then take its output (committing tokens and keeping KV rows). Greedy
    decisions note their slack (`common.margins`): each argmax's, and each exit test's distance from its threshold."""

    prompt: list[int]
    sampling: SamplingParams
    limits: Limits
    config: HuginnConfig
    model: RavenForCausalLM
    output: list[int] = field(default_factory=list)
    cache_len: int = 0
    forwards: int = 0
    core_passes: int = 0
    rows: list[Row] = field(default_factory=list)
    drafts: list[int] = field(default_factory=list)
    draft_probs: list[torch.Tensor] = field(default_factory=list)
    picked: list[int] = field(default_factory=list)  # the last forward's logit rows its last commits were chosen from
    wave_steps: int = 0  # wavefront steps since the prefill (or a recompute)
    margins: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        seed = GREEDY_LATENT_SEED if self.sampling.seed is None and self.sampling.greedy else self.sampling.seed
        self.generator = self.sampling.generator() if seed is None else torch.Generator().manual_seed(seed)
        self.latent_seed = seed if seed is not None else int(torch.randint(2**31, (1,), generator=self.generator))

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output

    @property
    def finished(self) -> bool:
        return len(self.output) >= self.limits.max_tokens or (
            bool(self.output) and self.output[-1] in self.limits.eos_token_ids)

    def latent(self, position: int) -> torch.Tensor:
        return initial_latents(self.model, self.latent_seed, position, 1, self.config.init_scale)[0]

    def latents(self, start: int, count: int) -> torch.Tensor:
        return initial_latents(self.model, self.latent_seed, start, count, self.config.init_scale)

    def commit(self, tokens: list[int]) -> list[int]:
        kept = []
        for token in tokens:
            if self.finished:
                break
            self.output.append(token)
            kept.append(token)
        return kept

    def plan(self) -> RecurrentForward:
        config = self.config
        if not self.output:
            return RecurrentForward(torch.tensor(self.prompt), 0, self.latents(0, len(self.prompt)), config.num_steps)
        last = torch.tensor([self.tokens[-1]])
        if config.sampler == "ar":
            return RecurrentForward(last, self.cache_len, self.latents(self.cache_len, 1), config.num_steps)
        if config.sampler == "adaptive":
            if not self.rows:
                self.rows = [Row(self.tokens[-1], self.latent(self.cache_len))]
            return RecurrentForward(last, self.cache_len, self.rows[0].latent[None], 1,
                                    first_recurrence=self.rows[0].recurrences)
        if config.sampler == "speculative":
            position = self.cache_len + len(self.drafts)
            room = min(config.lookahead_for_draft, self.limits.max_tokens - len(self.output) - 1)
            if len(self.drafts) < room:
                token = self.drafts[-1] if self.drafts else self.tokens[-1]
                return RecurrentForward(torch.tensor([token]), position, self.latents(position, 1), config.draft_steps)
            ids = torch.tensor([self.tokens[-1], *self.drafts])
            return RecurrentForward(ids, self.cache_len, self.latents(self.cache_len, len(ids)), config.num_steps)
        return self.plan_wavefront()

    def plan_wavefront(self) -> RecurrentForward:
        config = self.config
        if not self.rows:  # after the prefill (or a recompute): upstream counts the prefill's recurrences there
            self.rows = [Row(self.tokens[-1], self.latent(self.cache_len), config.num_steps)]
        latents = []
        for row in self.rows:
            beta = config.state_noise_mixing / ((1 + row.recurrences) if config.dampened_state_mixer else 1)
            z = row.latent
            if beta > 0:
                noise = self.model.initial_latent(self.generator, config.init_scale)
                z = (z * max(1 - beta, 0) ** 0.5 + beta**0.5 * noise if config.sqrt_mixer
                     else (1 - beta) * z + beta * noise)
            latents.append(z)
        embeds = [row.embed for row in self.rows if row.embed is not None]
        return RecurrentForward(
            torch.tensor([row.token for row in self.rows]), self.cache_len, torch.stack(latents),
            config.inner_recurrence, previous_embeds=torch.stack(embeds) if embeds else None, ema=config.ema_embeds)

    def apply(self, forward: RecurrentForward, out: RecurrentOutput) -> list[int]:
        """Take a forward's output; return the tokens it committed."""
        self.forwards += 1
        self.core_passes += forward.inner
        config = self.config
        if not self.output:
            self.cache_len = len(self.prompt)
            return self.chosen_from(self.commit([self.choose(out.logits[-1:])[0]]), len(out.logits) - 1)
        if config.sampler == "ar":
            self.cache_len += 1
            committed = self.commit(self.choose(out.logits))
        elif config.sampler == "adaptive":
            committed = self.apply_adaptive(out)
        elif config.sampler == "speculative":
            committed = self.apply_speculative(forward, out)
        else:
            committed = self.apply_wavefront(forward, out)
        return self.chosen_from(committed, 0)

    def chosen_from(self, committed: list[int], row: int) -> list[int]:
        """Note that the tokens just committed were chosen from the forward's logit rows `row`, `row` + 1, ... (the
        distributions their logprobs are read from)."""
        self.picked = list(range(row, row + len(committed)))
        return committed

    def resume(self, logits: torch.Tensor) -> list[int]:
        """After an engine recomputed the KV of every token (a preempted request, as `ar` computes it): the next
        token from the recompute's last row, and the in-flight positions started afresh."""
        self.rows, self.drafts, self.draft_probs, self.wave_steps = [], [], [], 0
        self.cache_len = len(self.tokens)
        return self.chosen_from(self.commit(self.choose(logits[-1:])), len(logits) - 1)

    def choose(self, logits: torch.Tensor) -> list[int]:
        """A token from each row, noting the slack of greedy choices."""
        if self.sampling.greedy:
            self.note_margin(margins.top2(logits))
        return choose(logits, self.sampling, self.generator).tolist()

    def note_exits(self, changes: list[float], tests: list[bool], threshold: float) -> None:
        """Note the slack of the exit tests `change < threshold` that decided (`tests`) under greedy decoding."""
        if self.sampling.greedy and any(tests):
            slack = margins.threshold_rows(torch.tensor([changes]), torch.tensor([tests]), torch.tensor([threshold]))
            self.note_margin(float(slack[0]))

    def apply_adaptive(self, out: RecurrentOutput) -> list[int]:
        row = self.rows[0]
        change = relative_change(out.latents[0], row.latent)
        row.latent, row.recurrences = out.latents[0], row.recurrences + 1
        self.note_exits([change], [row.recurrences < self.config.num_steps], self.config.exit_threshold)
        if change >= self.config.exit_threshold and row.recurrences < self.config.num_steps:
            return []
        self.rows = []
        self.cache_len += 1
        return self.commit(self.choose(out.logits))

    def apply_speculative(self, forward: RecurrentForward, out: RecurrentOutput) -> list[int]:
        config = self.config
        room = min(config.lookahead_for_draft, self.limits.max_tokens - len(self.output) - 1)
        if len(self.drafts) < room:
            logits = out.logits[-1:]
            if self.sampling.greedy:
                self.drafts.append(self.choose(logits)[0])
            else:
                probs = target_probs(logits, self.sampling)
                self.drafts.append(int(torch.multinomial(probs, 1, generator=self.generator)))
                self.draft_probs.append(probs[0])
            return []
        drafts = torch.tensor(self.drafts, dtype=torch.long)
        probs = torch.stack(self.draft_probs) if self.draft_probs else None
        committed = verify(drafts, out.logits, self.sampling, self.generator, probs)
        if self.sampling.greedy:
            self.note_margin(margins.top2(out.logits[: len(committed)]))
        self.drafts, self.draft_probs = [], []
        self.cache_len += len(committed)
        return self.commit(committed)

    def apply_wavefront(self, forward: RecurrentForward, out: RecurrentOutput) -> list[int]:
        """One step of upstream's `generate_diffusion_style`: every row's next token is predicted and becomes the
        next row's input, a row enters at the end (up to `max_wavefront`), and the rows up to the last one that
        passed the freeze test freeze; what they commit is `frozen_token`'s (see `frozen_rows`)."""
        config = self.config
        predicted = self.choose(out.logits)
        changes = []
        for i, row in enumerate(self.rows):
            changes.append(relative_change(out.latents[i], row.latent))
            row.latent, row.embed = out.latents[i], out.embeds[i]
            row.recurrences += forward.inner
            if i:
                row.stable += predicted[i - 1] == row.token
                row.token = predicted[i - 1]
        frozen = self.frozen_rows(changes)
        # the last position that can commit: its input token (upstream's rule) or its prediction is the last token
        last_input = len(self.prompt) + self.limits.max_tokens - (1 if config.frozen_token == "input" else 2)
        if self.limits.context is not None:
            last_input = min(last_input, self.limits.context - 1)
        width = len(self.rows)
        if (config.max_wavefront == 0 or width < config.max_wavefront) and self.cache_len + width <= last_input:
            latent = out.latents[-1].clone() if config.continuous_compute else self.latent(self.cache_len + width)
            self.rows.append(Row(predicted[-1], latent, embed=torch.zeros_like(out.embeds[-1])))
        self.wave_steps += 1
        committed = self.commit(predicted[:frozen])
        self.cache_len += frozen
        self.rows = self.rows[frozen:]
        if not self.rows and not self.finished:
            self.rows = [Row(self.tokens[-1], self.latent(self.cache_len), config.num_steps)]
        return committed

    def frozen_rows(self, changes: list[float]) -> int:
        """How many leading rows freeze this step (their KV kept, their predictions committed). `latent-diff`: the
        rows up to the last whose latent changed less than `exit_t`; `token-stability`: up to the last whose input
        token the predictions matched more than num_steps // inner_recurrence times; `fixed`: the first row, from
        step num_steps // inner_recurrence + 1 on. With `frozen_token` `input` (upstream's) the last such row stays
        in flight, its input token frozen (the first row's is frozen already); with `prediction` (the paper's
        text) it freezes with its prediction. Past `max_diffusion_steps` steps, where upstream stops generating,
        the first row freezes every step (as `fixed`), so that a request still ends by its own limits."""
        config = self.config
        if config.freeze_strategy == "fixed" or self.wave_steps > config.max_diffusion_steps:
            return int(self.wave_steps > config.num_steps // config.inner_recurrence)
        if config.freeze_strategy == "latent-diff":
            passed = [change < config.exit_t for change in changes]
        else:
            passed = [row.stable > config.num_steps // config.inner_recurrence for row in self.rows]
        last = max((i for i, p in enumerate(passed) if p), default=-1)
        if config.freeze_strategy == "latent-diff":  # the tests from the last passed one on decided
            deciding = max(last, 0)
            self.note_exits(changes[deciding:], [True] * (len(changes) - deciding), config.exit_t)
        return last + 1 if config.frozen_token == "prediction" else max(last, 0)

def initial_latents(model: RavenForCausalLM, seed: int, start: int, count: int, scale: float = 1.0) -> torch.Tensor:
    """The initial latents of positions start.. of a request whose latent seed is `seed`: each position's own
    draw, so a position starts from the same latent in every sampler, engine and batch; [count, d]."""
    generators = (torch.Generator().manual_seed(seed * LATENT_SEED_STRIDE + p) for p in range(start, start + count))
    return torch.stack([model.initial_latent(g, scale) for g in generators])


def relative_change(new: torch.Tensor, old: torch.Tensor) -> float:
    """||new - old|| / ||new||, the latent-diff exit criterion."""
    return float((new - old).norm() / new.norm().clamp_min(1e-12))


@dataclass
class HuginnResult:
    """A request's tokens, each one's log-probability under the distribution the sampler chose it from (the
    coda's readout of its position's last latent), the forwards and core passes it took, and per token the slack
    of the greedy decisions taken while it was next (`HuginnDecoder.decision_margins`)."""

    token_ids: list[int]
    logprobs: list[float]
    forwards: int
    core_passes: int
    margins: list[float]

    @property
    def core_passes_per_token(self) -> float:
        return self.core_passes / max(len(self.token_ids), 1)


def generate(model: RavenForCausalLM, prompt: list[int], config: HuginnConfig,
             sampling: SamplingParams | None = None, limits: Limits | None = None) -> HuginnResult:
    """Run one request to the end on a fresh cache (the reference runner)."""
    decoder = HuginnDecoder(prompt, sampling or SamplingParams(), limits or Limits(), config, model)
    cache = KVCache(config.cache_lookup_strategy)
    logprobs: list[float] = []
    with torch.inference_mode():
        while not decoder.finished:
            forward = decoder.plan()
            out = run_forward(model, cache, forward)
            committed = decoder.apply(forward, out)
            rows = out.logits[decoder.picked].float().log_softmax(-1)
            logprobs += rows.gather(-1, torch.tensor(committed, dtype=torch.long)[:, None])[:, 0].tolist()
    return HuginnResult(decoder.output, logprobs, decoder.forwards, decoder.core_passes, decoder.decision_margins)
