"""What each mode drafts on SGLang, from `common/`: diffusion self-speculation's extra bidirectional forward,
Jacobi's own predictions from the last verify, WeDLM-drafted speculation's mask slots riding the verify. The
worker verifies and commits; drafters only propose."""

from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

from parallel_decoding.common.decoder import Decoder, Limits
from parallel_decoding.common.diffusion_self import draft_width, draft_window, propose
from parallel_decoding.common.jacobi import JacobiDecoder
from parallel_decoding.common.lora import LoRA
from parallel_decoding.common.sampling import choose
from parallel_decoding.common.wedlm_spec import WeDLMSpecDecoder
from parallel_decoding.common.width_planner import Capped
from parallel_decoding.common.window import rectangular
from parallel_decoding.sglang_plugin.drafts import Drafts, RequestState
from parallel_decoding.sglang_plugin.worker import catch_up


def allowed(req: Any) -> int:
    """Tokens the request may still emit after its seed (already counted in its output)."""
    return req.sampling_params.max_new_tokens - len(req.output_ids)


class Drafter:
    """What the verify worker asks of a mode: each request's most drafts this step (`limits`), then its drafts up to
    the planned widths (`draft`), and the rows of its own forward in the last `draft` (`forwarded_rows`)."""

    forwarded_rows = 0
    paused_request_steps = 0  # a request's steps that its paused decoder did not follow
    pauses = False  # whether its requests' decoders pause through their plain steps (`FollowingDrafter`)

    def __init__(self, config: Any, worker: Any) -> None:
        self.config, self.worker = config, worker


class DiffusionSelfDrafter(Drafter):
    """`common.diffusion_self`'s draft window `[seed, mask x w]` forwarded bidirectionally over the prefix (KV
    overwritten by the verify), with the draft adapter (`draft_adapter`, NLD's LoRA) on for that forward only;
    drafts from the window's logit rows (greedy ones from one batched argmax without the mask). No forward when no
    request drafts (a plain AR step)."""

    def __init__(self, config: Any, worker: Any) -> None:
        super().__init__(config, worker)
        self.lora: LoRA | None = None

    def limits(self, reqs: list, states: list[RequestState]) -> list[int]:
        return [draft_width(self.config.num_speculative_tokens, allowed(req) + 1) for req in reqs]

    def adapter(self) -> AbstractContextManager:
        """The draft adapter switched on (loaded onto the served model's modules once), or nothing."""
        if not self.config.draft_adapter:
            return nullcontext()
        if self.lora is None:
            self.lora = LoRA(self.worker.model_runner.model, self.config.draft_adapter)
        return self.lora.enabled()

    def draft(self, batch: Any, reqs: list, states: list[RequestState], seeds: list[int], widths: list[int]
              ) -> list[Drafts]:
        self.forwarded_rows = 0
        if not any(widths):
            return [Drafts([]) for _ in reqs]
        # each request's window as common/ lays it (SGLang places the rows from the request's own length)
        windows = [draft_window(seed, 0, w, self.config) for seed, w in zip(seeds, widths, strict=True)]
        tokens, visible = rectangular(windows, self.config.mask_token_id)
        with self.adapter():
            logits = self.worker.run_window(batch, tokens, visible)
        self.forwarded_rows = tokens.numel()
        best = logits.index_fill(-1, torch.tensor([self.config.mask_token_id], device=logits.device),
                                 float("-inf")).argmax(-1).cpu()
        drafts = []
        for row, (state, w, window) in enumerate(zip(states, widths, windows, strict=True)):
            rows = window.logit_rows
            if w == 0 or state.sampling.greedy:
                drafts.append(Drafts(best[row, rows].tolist()))
                continue
            chosen, q = propose(logits[row, rows.to(logits.device)].float().cpu(), self.config.mask_token_id,
                                state.sampling, state.generator)
            drafts.append(Drafts(chosen.tolist(), q))
        return drafts

    def after_verify(self, reqs: list, states: list, logits: torch.Tensor, predicted: torch.Tensor, drafts: list,
                     committed: list) -> None:
        """Nothing carries over: each step drafts afresh."""


class FollowingDrafter(Drafter):
    """A `common/` decoder per request (`decoder_class`) whose drafts are verified, which then follows the
    committed run and what the verify forward showed it; resumed from the request's tokens when it has none or
    lost track of them (a retraction).

    A greedy request's plain AR step (no draft planned) shows its decoder nothing but its token, so the decoder
    pauses instead of following it (`Decoder.pause`): while the planner holds the request at no draft its steps
    cost no per-request work here, and the decoder catches up on the request's tokens when it drafts again."""

    decoder_class: type[Decoder]
    pauses = True

    def decoder(self, req: Any, state: RequestState) -> Any:
        if state.paused:
            catch_up(state.decoder, req)
            state.paused = False
        if state.decoder is None or state.decoder.num_tokens != len(req.origin_input_ids) + len(req.output_ids):
            tokens = list(req.origin_input_ids) + list(req.output_ids)
            state.decoder = self.decoder_class.resume(tokens, state.sampling, Limits(max_tokens=allowed(req) + 1),
                                                      self.config, state.generator)
        return state.decoder

    def limits(self, reqs: list, states: list[RequestState]) -> list[int]:
        """Each request's most drafts: a paused decoder's configured most, without waking it."""
        return [min(state.decoder.most_drafts, allowed(req)) if state.paused
                else self.limit(req, self.decoder(req, state)) for req, state in zip(reqs, states, strict=True)]

    def limit(self, req: Any, decoder: Any) -> int:
        """A following decoder's most drafts this step."""
        raise NotImplementedError

    def follows(self, states: list[RequestState], drafts: list[Drafts]) -> list[int]:
        """The rows whose decoders follow this step; a greedy request's plain step pauses its decoder instead."""
        rows = []
        for row, (state, d) in enumerate(zip(states, drafts, strict=True)):
            if not state.paused and (d.tokens or not state.sampling.greedy):
                rows.append(row)
                continue
            if not state.paused:
                state.decoder.pause()
                state.paused = True
            self.paused_request_steps += 1
        return rows


class JacobiDrafter(FollowingDrafter):
    """Jacobi's `main_drafts()`; the decoder follows the verify forward's own per-position predictions."""

    decoder_class = JacobiDecoder

    def limit(self, req: Any, decoder: Any) -> int:
        return min(len(decoder.main_drafts()), allowed(req))

    def draft(self, batch: Any, reqs: list, states: list[RequestState], seeds: list[int], widths: list[int]
              ) -> list[Drafts]:
        """The leading `widths` of each decoder's drafts: the decoder follows whatever prefix was verified."""
        return [Drafts(self.decoder(req, state).main_drafts()[:w] if w else [])
                for req, state, w in zip(reqs, states, widths, strict=True)]

    def after_verify(self, reqs: list, states: list, logits: torch.Tensor, predicted: torch.Tensor, drafts: list,
                     committed: list) -> None:
        """The decoder follows the committed run and, from each verified row, the greedy argmax (`predicted`
        [bs, W]) or a sample."""
        rows = predicted.tolist()
        for row in self.follows(states, drafts):
            state, d, run = states[row], drafts[row], committed[row]
            n = len(d.tokens) + 1
            if state.sampling.greedy:
                followed = rows[row][:n]
            else:
                followed = choose(logits[row, :n].float().cpu(), state.sampling, state.generator).tolist()
            state.decoder.follow(followed, run)


class WeDLMSpecDrafter(FollowingDrafter):
    """Its drafts and mask slots are verified as one chain (a mask slot's proposal is a point mass on the mask
    token, so the slot after the last accepted draft yields the bonus); the decoder follows the committed run and
    takes its next drafts from the mask rows past the bonus."""

    decoder_class = WeDLMSpecDecoder

    def limit(self, req: Any, decoder: Any) -> int:
        """Its most drafts (its window's mask slots follow them)."""
        return 0 if decoder.finished else decoder.most_drafts

    def draft(self, batch: Any, reqs: list, states: list[RequestState], seeds: list[int], widths: list[int]
              ) -> list[Drafts]:
        """Its window capped at the planned width (`WeDLMSpecDecoder.cap`: its drafts and mask slots; the whole
        window where the mode does not adapt), the mask slots not counted as drafts."""
        drafts = []
        for req, state, width in zip(reqs, states, widths, strict=True):
            if state.paused and not width:
                drafts.append(Drafts([], verifies=0))
                continue
            decoder: Capped = self.decoder(req, state)
            if self.config.adapts:
                decoder.cap(width)
            tokens = decoder.window_tokens if not decoder.finished else []
            probs = None  # none drafted yet: every slot a point mass, as `common.acceptance.verify` reads None
            if tokens and decoder.draft_probs is not None:
                m = decoder.drafts.numel()
                probs = torch.zeros(len(tokens), decoder.draft_probs.shape[-1])
                probs[:m] = decoder.draft_probs
                probs[m:, self.config.mask_token_id] = 1.0
            drafts.append(Drafts(tokens, probs, verifies=decoder.drafts.numel() if tokens else 0))
        return drafts

    def after_verify(self, reqs: list, states: list, logits: torch.Tensor, predicted: torch.Tensor, drafts: list,
                     committed: list) -> None:
        for row in self.follows(states, drafts):
            state, d, run = states[row], drafts[row], committed[row]
            slots = logits[row, state.decoder.drafts.numel() + 2 : len(d.tokens) + 1]
            state.decoder.follow(run, slots.float().cpu())


def make_drafter(mode: str, config: Any, worker: Any) -> Any:
    return {"diffusion_self": DiffusionSelfDrafter, "jacobi": JacobiDrafter,
            "wedlm_spec": WeDLMSpecDrafter}[mode](config, worker)
