"""The draft adapter's trainer labels each drafted slot with what verification accepts: on the base's own greedy
text the base's argmax is the text's token (the two targets give the same loss), on other text it is not."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from scripts.train_draft_adapter import DraftRecipe, RowLoRA, draft_loss

VOCAB, MASK, LENGTH = 64, 63, 24


def tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = LlamaForCausalLM(config).eval()
    for param in model.parameters():
        param.requires_grad_(False)
    return model


def loss(model, ids: torch.Tensor, target: str) -> float:
    recipe = DraftRecipe(block_size=4, rank=4, alpha=8, target=target)
    lora = RowLoRA(model, recipe, torch.Generator().manual_seed(1))
    answer = torch.ones_like(ids, dtype=torch.bool)
    answer[:, :2] = False
    try:
        return float(draft_loss(model, lora, ids, answer, MASK, recipe, torch.Generator().manual_seed(2)))
    finally:
        lora.remove()


def test_the_base_argmax_is_the_label_and_equals_the_text_on_greedy_text():
    model = tiny_llama()
    prompt = torch.tensor([[5, 9]])
    greedy = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=LENGTH - 2,
                            do_sample=False, pad_token_id=0)
    assert loss(model, greedy, "base") == loss(model, greedy, "text")
    other = torch.randint(0, MASK, (1, LENGTH), generator=torch.Generator().manual_seed(3))
    assert loss(model, other, "base") != loss(model, other, "text")
