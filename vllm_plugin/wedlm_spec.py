"""WeDLM-drafted lossless speculation on vLLM: no extra forward, the verify pass carries the mask slots.

Each request keeps a `common.wedlm_spec.WeDLMSpecDecoder`. A step schedules `[seed, drafts, mask x W]`; vLLM's
rejection sampler verifies the drafts and the mask slots alike, a mask slot's proposal being a point mass on the
mask token, so the slot that follows the last accepted draft yields the bonus (greedy: the argmax; sampled: the
residual of a point mass, which is the target distribution itself). The mask rows past the bonus's slot become
the decoder's next drafts, with their proposal probabilities for the sampler. Where the config adapts (the
default), a width planner caps each request's drafts and mask slots before its window is scheduled
(`common.width_planner.cap_widths`); a step it caps at 0 is a plain AR step, which the decoder, paused, does not
follow until the planner gives it a width again (`FollowingProposer.wake`).
"""

from typing import Any

import torch

from parallel_decoding.common.wedlm_spec import WeDLMSpecDecoder
from parallel_decoding.common.width_planner import cap_widths
from parallel_decoding.vllm_plugin.following import FollowedRequest, FollowingProposer


class WeDLMSpecProposer(FollowingProposer):
    decoder_class = WeDLMSpecDecoder
    follows_plain_steps = True

    def capped(self, runner: Any, scheduler_output: Any, sampled_token_ids: list[list[int]], drafts: list[list[int]],
               states: list[FollowedRequest | None], iterated: list[bool]) -> list[list[int]]:
        """Each decoder's window after the planner has capped it (its drafts and its mask slots; its decoder tells
        the planner how its verification went, `verified`)."""
        if self.planner is None:
            return drafts
        rows = [row for row, state in enumerate(states) if state is not None and not state.decoder.finished]
        cap_widths(self.planner, [runner.input_batch.req_ids[row] for row in rows],
                   [states[row].decoder for row in rows])
        for row in rows:
            state = states[row]
            drafting = self.drafts_again(runner, row, state, state.decoder.draft_cap)
            drafts[row] = self.drafts_of(state.decoder) if drafting else []
        return drafts

    def before_sample(self, runner: Any, logits: torch.Tensor, metadata: Any) -> None:
        """Each verified request's mask rows past the bonus's slot (none in a step where no request drafted)."""
        if metadata is None or not metadata.max_spec_len:
            return
        ends = metadata.cu_num_sampled_tokens.tolist()
        start = 0
        for row, req_id in enumerate(runner.input_batch.req_ids):
            state = self.requests.get(req_id)
            if state is not None and metadata.num_draft_tokens[row]:
                state.seen = logits[start + state.decoder.drafts.numel() + 2 : ends[row]]
            start = ends[row]

    def follow(self, decoder: WeDLMSpecDecoder, committed: list[int], seen: torch.Tensor | list[int]) -> None:
        """After a plain AR step (`seen` is its committed token) there are no mask rows: no next drafts."""
        decoder.follow(committed, seen.float().cpu() if isinstance(seen, torch.Tensor) else torch.zeros(0))

    def drafts_of(self, decoder: WeDLMSpecDecoder) -> list[int]:
        return decoder.window_tokens

    def proposals(self, runner: Any, drafts: list[list[int]], states: list[FollowedRequest | None]
                  ) -> torch.Tensor | None:
        """The drafts' own probabilities, then a point mass on the mask token for each mask slot."""
        if all(s is None or s.decoder.sampling.greedy for s in states):
            return None
        k = max(len(tokens) for tokens in drafts)
        vocab = runner.model_config.get_vocab_size()
        probs = torch.zeros(len(drafts), k, vocab)
        for row, (tokens, state) in enumerate(zip(drafts, states, strict=True)):
            if state is None or not tokens:
                continue
            decoder = state.decoder
            m = decoder.drafts.numel()
            if decoder.draft_probs is not None:
                probs[row, :m, : decoder.draft_probs.shape[-1]] = decoder.draft_probs
            probs[row, torch.arange(m, len(tokens)), decoder.config.mask_token_id] = 1.0
        return probs.to(runner.device)
