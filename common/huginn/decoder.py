"""One Huginn request as a state machine: plan the next recurrent forward, then take its output (committed
tokens, frozen positions, latents kept across steps)."""

from dataclasses import dataclass, field

import torch

from parallel_decoding.common import margins
from parallel_decoding.common.acceptance import verify
from parallel_decoding.common.decoder import Limits
from parallel_decoding.common.grammar import Grammar, accepts, masked, valid_prefix
from parallel_decoding.common.huginn.config import GREEDY_LATENT_SEED, HuginnConfig
from parallel_decoding.common.huginn.forward import RecurrentForward, RecurrentOutput, initial_latents
from parallel_decoding.common.models.raven import RavenForCausalLM
from parallel_decoding.common.penalties import adjusted
from parallel_decoding.common.sampling import SamplingParams, choose, target_probs
from parallel_decoding.common.window import causal_forward


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
    grammar: Grammar | None = None  # structured output (`common.grammar`), advanced over what is committed

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
        """Append tokens up to the limits, advancing the grammar over them (every row is masked by it, so it rejects
        none: the wavefront commits only the leading guesses it accepts, `valid_prefix`)."""
        kept = []
        for token in tokens:
            if self.finished:
                break
            if self.grammar is not None and not self.grammar.is_terminated() and not accepts(self.grammar, token):
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
            return self.chosen_from(self.commit([self.choose(self.adjust(out.logits[-1:]))[0]]), len(out.logits) - 1)
        if config.sampler == "ar":
            self.cache_len += 1
            committed = self.commit(self.choose(self.adjust(out.logits)))
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
        return self.chosen_from(self.commit(self.choose(self.adjust(logits[-1:]))), len(logits) - 1)

    def adjust(self, logits: torch.Tensor, inputs: list[int] = (), rows: list[int] | None = None) -> torch.Tensor:
        """`logits`, rows of a forward whose input is the last committed token then `inputs` (in-flight or draft
        tokens), at `rows` of it (default: every one), with the request's penalties, bias, allowed tokens and minimum
        length (`common.penalties`), masked by its grammar (`common.grammar`): a row's history is the committed tokens
        and the inputs up to its own."""
        if not self.sampling.adjusts_logits and self.grammar is None:
            return logits
        tokens = [self.tokens[-1], *inputs]
        forward = causal_forward(tokens, len(self.tokens) - 1, list(range(len(tokens))) if rows is None else rows)
        if self.sampling.adjusts_logits:
            logits = adjusted(logits, self.sampling, self.prompt, self.output, forward)
        return logits if self.grammar is None else masked(logits, self.grammar, forward, len(self.tokens), None)

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
        return self.commit(self.choose(self.adjust(out.logits)))

    def apply_speculative(self, forward: RecurrentForward, out: RecurrentOutput) -> list[int]:
        config = self.config
        room = min(config.lookahead_for_draft, self.limits.max_tokens - len(self.output) - 1)
        if len(self.drafts) < room:
            logits = self.adjust(out.logits[-1:], self.drafts, [len(self.drafts)])
            if self.sampling.greedy:
                self.drafts.append(self.choose(logits)[0])
            else:
                probs = target_probs(logits, self.sampling)
                self.drafts.append(int(torch.multinomial(probs, 1, generator=self.generator)))
                self.draft_probs.append(probs[0])
            return []
        drafts = torch.tensor(self.drafts, dtype=torch.long)
        probs = torch.stack(self.draft_probs) if self.draft_probs else None
        logits = self.adjust(out.logits, self.drafts)
        committed = verify(drafts, logits, self.sampling, self.generator, probs)
        if self.sampling.greedy:
            self.note_margin(margins.top2(logits[: len(committed)]))
        self.drafts, self.draft_probs = [], []
        self.cache_len += len(committed)
        return self.commit(committed)

    def apply_wavefront(self, forward: RecurrentForward, out: RecurrentOutput) -> list[int]:
        """One step of upstream's `generate_diffusion_style`: every row's next token is predicted and becomes the
        next row's input, a row enters at the end (up to `max_wavefront`), and the rows up to the last one that
        passed the freeze test freeze; what they commit is `frozen_token`'s (see `frozen_rows`)."""
        config = self.config
        predicted = self.choose(self.adjust(out.logits, [row.token for row in self.rows[1:]]))
        changes = []
        for i, row in enumerate(self.rows):
            changes.append(relative_change(out.latents[i], row.latent))
            row.latent, row.embed = out.latents[i], out.embeds[i]
            row.recurrences += forward.inner
            if i:
                row.stable += predicted[i - 1] == row.token
                row.token = predicted[i - 1]
        frozen = self.frozen_rows(changes)
        if self.grammar is not None and frozen:  # each guess was masked after the guesses it saw, not the new ones
            frozen = valid_prefix(self.grammar, predicted[:frozen])
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

def relative_change(new: torch.Tensor, old: torch.Tensor) -> float:
    """||new - old|| / ||new||, the latent-diff exit criterion."""
    return float((new - old).norm() / new.norm().clamp_min(1e-12))
