"""Huginn's samplers for recurrent-depth models (seed 000), per request, with their reference runner.

Every forward is a `RecurrentForward`: rows at consecutive positions after the cached prefix, each with a latent;
the prelude embeds the rows, the core runs `inner` recurrences on their latents, the coda gives logits. Samplers:

- `ar`: one token per forward, `num_steps` recurrences from a fresh latent.
- `adaptive`: one recurrence per forward until the latent's relative change falls below `exit_threshold` (at most
  `num_steps`), then the token.
- `speculative`: `lookahead_for_draft` tokens drafted one by one with `draft_steps` recurrences, verified in one
  forward with `num_steps` (greedy match, or rejection sampling against the drafts' own distributions): lossless
  against `ar` on the `full` cache, where a parallel forward and a token-by-token one see the same KV.
- `wavefront`: the diffusion-forcing sampler (Algorithms 1 and 2): every in-flight position advances
  `inner_recurrence` recurrences per step with its latent kept across steps, a new position enters each step
  (up to `max_wavefront` in flight), input embeddings with momentum `ema_embeds`, optional state noise
  `state_noise_mixing` / (1 + recurrences done); the leading positions whose latent changed less than `exit_t` (or
  that reached `num_steps`; `freeze_strategy` `fixed`: only that) freeze: their KV stays, their next-token
  predictions are committed, the others are recomputed next step. With `fixed` and `inner_recurrence` =
  `num_steps` it is `ar`; with `max_wavefront` 1 and `inner_recurrence` 1 it is `adaptive`. (Upstream's code
  freezes a converged position's input token but re-runs the position; we freeze the position and its prediction,
  as the paper's text does.)

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
                  "max_wavefront", "headway"},
}
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
    state_noise_mixing: float = 0.0
    max_wavefront: int = 128
    headway: int = 1

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
        require(self.freeze_strategy in ("latent-diff", "fixed"), "freeze_strategy", "'latent-diff' or 'fixed'",
                self.freeze_strategy)
        require(0 <= self.ema_embeds < 1, "ema_embeds", "in [0, 1)", self.ema_embeds)
        require(0 <= self.state_noise_mixing <= 1, "state_noise_mixing", "in [0, 1]", self.state_noise_mixing)
        require(self.max_wavefront >= 1, "max_wavefront", ">= 1", self.max_wavefront)
        require(self.headway == 1, "headway", "1 (one new position per step)", self.headway)


ENGINE_SAMPLERS = ("ar", "adaptive", "wavefront")


def check_engine_config(config: HuginnConfig, engine: str) -> None:
    """What the engines serve: their samplers (the speculative sampler's drafts run at positions an engine has not
    scheduled) and one KV slot per core layer."""
    if config.sampler not in ENGINE_SAMPLERS:
        raise ConfigError(f"sampler must be one of {list(ENGINE_SAMPLERS)} on {engine}, got {config.sampler!r} (the "
                          f"speculative sampler's drafts run at positions {engine} has not scheduled)")
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
    recurrences: int = 0
    embed: torch.Tensor | None = None


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
        if not self.rows:
            self.rows = [Row(self.tokens[-1], self.latent(self.cache_len))]
        latents = []
        for row in self.rows:
            beta = config.state_noise_mixing / (1 + row.recurrences)
            z = row.latent
            if beta > 0:
                z = (1 - beta) * z + beta * self.model.initial_latent(self.generator, config.init_scale)
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
        self.rows, self.drafts, self.draft_probs = [], [], []
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
        config = self.config
        predicted = self.choose(out.logits)
        exits, changes, tests = [], [], []
        for i, row in enumerate(self.rows):
            change = relative_change(out.latents[i], row.latent)
            row.latent, row.embed = out.latents[i], out.embeds[i]
            row.recurrences += forward.inner
            converged = config.freeze_strategy == "latent-diff" and change < config.exit_t
            exits.append(converged or row.recurrences >= config.num_steps)
            changes.append(change)
            tests.append(config.freeze_strategy == "latent-diff" and row.recurrences < config.num_steps)
        deciding = next((i + 1 for i, e in enumerate(exits) if not e), len(exits))  # past the first that stays: moot
        self.note_exits(changes[:deciding], tests[:deciding], config.exit_t)
        for i in range(1, len(self.rows)):
            self.rows[i].token = predicted[i - 1]
        last_input = len(self.prompt) + self.limits.max_tokens - 2  # the last position whose prediction is kept
        if self.limits.context is not None:
            last_input = min(last_input, self.limits.context - 1)
        if len(self.rows) < config.max_wavefront and self.cache_len + len(self.rows) <= last_input:
            self.rows.append(Row(predicted[-1], self.latent(self.cache_len + len(self.rows))))
        frozen = 0
        while frozen < len(exits) and exits[frozen]:
            frozen += 1
        committed = self.commit(predicted[:frozen])
        self.cache_len += frozen
        self.rows = self.rows[frozen:]
        if not self.rows and not self.finished:
            self.rows = [Row(self.tokens[-1], self.latent(self.cache_len))]
        return committed


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
